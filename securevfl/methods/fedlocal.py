"""FedLocalSSL: every party pre-trains its bottom model on all its local rows with
one SSL objective, alone; then split-learning fine-tuning on the labeled aligned rows.
``fedlocal-simsiam`` is FedHSSL's "FedSimSiam" baseline."""

from __future__ import annotations

from typing import ClassVar, cast

from securevfl.federation import STREAM_LOCAL_SSL, Federation
from securevfl.methods.base import METHODS, Method, labeled_aligned_ids
from securevfl.methods.ssl_common import SSL_PARAMS, pretrain_party_locally, ssl_config
from securevfl.parties import Party
from securevfl.runtime import handles


class FedLocalSSL(Method):
    objective: ClassVar[str]
    passive_features_outside_loop = True  # local SSL pre-training on raw features
    defaults = dict(SSL_PARAMS)

    per_role = True
    stream: ClassVar[int] = STREAM_LOCAL_SSL

    def pretrain(self, party: Party, req: dict | None = None) -> list[float]:
        """One party's local SSL pre-training (alone, on all its rows), from its own seed stream."""
        cfg = ssl_config(self.params, self.objective)
        return pretrain_party_locally(party, cfg, party.own_seed + self.stream)

    def passive_ops(self) -> dict:
        return {"local_ssl.pretrain": self.pretrain}

    resumable = True  # pre-training only sets each party's bottom model, which the checkpoints hold

    def fit(self, fed: Federation) -> None:
        if not self.resuming(fed):  # a resumed run's pre-trained models come with its checkpoints
            losses = {fed.active.name: self.pretrain(fed.active)}
            for p in handles(fed):
                losses[p.name] = cast(list, p.call("local_ssl.pretrain", reply=True))
            fed.meta["pretrain_final_loss"] = {n: (v[-1] if v else None) for n, v in losses.items()}
        self.reset_optimizers(fed)
        self.trainer = self.finetune(fed, labeled_aligned_ids(fed))


@METHODS.register
class FedLocalSimSiam(FedLocalSSL):
    name, objective = "fedlocal-simsiam", "simsiam"
    summary = "each party pre-trains alone with SimSiam on all its rows, then split-learning fine-tuning"


@METHODS.register
class FedLocalBYOL(FedLocalSSL):
    name, objective = "fedlocal-byol", "byol"
    summary = "each party pre-trains alone with BYOL on all its rows, then split-learning fine-tuning"


@METHODS.register
class FedLocalMoCo(FedLocalSSL):
    name, objective = "fedlocal-moco", "moco"
    summary = "each party pre-trains alone with MoCo on all its rows, then split-learning fine-tuning"


@METHODS.register
class FedLocalSCARF(FedLocalSSL):
    name, objective = "fedlocal-scarf", "scarf"
    summary = "each party pre-trains alone with SCARF on all its rows, then split-learning fine-tuning"
