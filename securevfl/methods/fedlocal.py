"""FedLocalSSL: every party pre-trains its bottom model on all its local rows with
one SSL objective, alone; then split-learning fine-tuning on the labeled aligned rows.
``fedlocal-simsiam`` is FedHSSL's "FedSimSiam" baseline."""

from __future__ import annotations

from typing import ClassVar

from securevfl.federation import STREAM_LOCAL_SSL, Federation, seed_for
from securevfl.methods.base import Method, labeled_aligned_ids, register_method
from securevfl.methods.ssl_common import SSL_PARAMS, pretrain_party_locally, ssl_config


class FedLocalSSL(Method):
    objective: ClassVar[str]
    passive_features_outside_loop = True  # local SSL pre-training on raw features
    default_params = dict(SSL_PARAMS)

    def fit(self, fed: Federation) -> None:
        cfg = ssl_config(self.params, self.objective)
        losses = {}
        for k, party in enumerate(fed.parties):
            losses[party.name] = pretrain_party_locally(party, cfg, seed_for(self.ctx.seed, k) + STREAM_LOCAL_SSL)
        self.reset_optimizers(fed)
        fed.meta["pretrain_final_loss"] = {n: (v[-1] if v else None) for n, v in losses.items()}
        self.trainer = self.finetune(fed, labeled_aligned_ids(fed))


for _obj, _label in (("simsiam", "SimSiam"), ("byol", "BYOL"), ("moco", "MoCo"), ("scarf", "SCARF")):
    register_method(type(f"FedLocal_{_obj}", (FedLocalSSL,), {
        "name": f"fedlocal-{_obj}", "objective": _obj,
        "summary": f"each party pre-trains alone with {_label} on all its rows, then split-learning fine-tuning",
    }))
