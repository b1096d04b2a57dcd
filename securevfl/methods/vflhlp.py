"""VFLHLP (Li et al., VFLHLP; docs/methods.md) and its ablations ``vflhlp-a`` / ``vflhlp-p``.

1. The active party trains its encoder h^1 and a local head f (same architecture as the federated
   head's first layer block, input r^1 only) on **all** its labeled local rows → Θ^1, Θ^0.
2. Each passive party pre-trains its encoder with SCARF (InfoNCE between a row and its corrupted
   view, Eq. 5–6) on its local rows → Θ^k. The paper gives no τ or corruption rate; we use the
   SCARF paper's τ = 1.0 and 60 % corruption.
3. Downstream VFL on the labeled aligned rows with passive encoders initialised from Θ^k and
   L = L_vfl + β·L_cons, L_cons = ½(‖θ^1 − Θ^1‖² + ‖θ_s^0 − Θ^0‖²), θ_s^0 = the federated head's
   first-layer columns that read r^1 (r^1 comes first in the concatenation) and its bias. β is not
   given in the paper; default 10 (with SGD at the paper's learning rates ≤ 0.03, lr·β stays
   well below 2, so the quadratic penalty is stable).

Initialisation of the active side: Algorithm 1 can be read as starting θ^1 afresh (§4.2.3 says
every party *but* the active one starts from its pre-trained weights) or from Θ^1. Our default,
``init_active: true``, starts at the pre-trained point — encoder Θ^1, head slice Θ^0 and zero
weights on the passive columns, so federated training begins at the local model's function and
L_cons starts at 0; ``init_active: false`` is the other reading. On UCI credit with 1 % aligned
(SGD, lr 0.01, 20 epochs) the two gave AUC 0.766 and 0.757. With Adam the constraint barely
holds — its per-parameter normalised steps move every weight by ~lr per step whatever the
gradient size — and we measured 0.70; use SGD for this method. ``vflhlp-a`` keeps only the active
constraint, ``vflhlp-p`` only the passive initialisation.
"""

from __future__ import annotations

import copy
from typing import ClassVar, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from securevfl.errors import UserError
from securevfl.federation import STREAM_VFLHLP_ACTIVE, STREAM_VFLHLP_PASSIVE, Federation, seed_for
from securevfl.methods.base import METHODS, Method, labeled_aligned_ids
from securevfl.methods.ssl_common import SSL_PARAMS, pretrain_party_locally, ssl_config
from securevfl.models import build_head, reset_parameters
from securevfl.parties import ActiveParty, Party
from securevfl.progress import phase
from securevfl.runtime import handles

OP_SCARF = "vflhlp.scarf"


def first_linear_in(module: nn.Module) -> nn.Linear:
    """The first ``nn.Linear`` among ``module``'s submodules, wherever it sits (the Θ^0 / θ_s^0 layer)."""
    return next(m for m in module.modules() if isinstance(m, nn.Linear))


def consistency_loss(encoder: nn.Module, head: nn.Module, theta1: list[torch.Tensor], theta0: nn.Linear,
                     own_dim: int) -> torch.Tensor:
    """L_cons = ½(‖θ^1 − Θ^1‖² + ‖θ_s^0 − Θ^0‖²) with θ_s^0 = (W[:, :own_dim], b) of the head's first layer."""
    enc = sum(((w - w0) ** 2).sum() for w, w0 in zip(encoder.parameters(), theta1, strict=True))
    layer = first_linear_in(head)
    sub = ((layer.weight[:, :own_dim] - theta0.weight) ** 2).sum() + ((layer.bias - theta0.bias) ** 2).sum()
    return 0.5 * (enc + sub)


def active_pretrain(active: ActiveParty, model_cfg, n_classes: int, epochs: int, batch_size: int, lr: float,
                    seed: int, record: dict | None = None) -> tuple[list[torch.Tensor], nn.Linear, nn.Module]:
    """Step 1 at the active party alone: encoder + local head on all its labeled rows. Returns the
    frozen Θ^1 (encoder parameters), Θ^0 (the local head's first layer) and the trained encoder.

    The paper trains "on full local data" without saying for how long. Because L_cons later pins
    the federated model to Θ, an over-fitted Θ is costly (on a Criteo-format file, 10 epochs of
    embedding training gave AUC 0.66 downstream against 0.73 after one epoch), so the party keeps
    the epoch with the lowest loss on 10 % of its labeled rows held out for that purpose."""
    torch.manual_seed(seed)
    encoder = reset_parameters(copy.deepcopy(active.bottom), include_root=False)
    # bottom encoders set an int out_dim; built on the CPU from the seed, then on the party's device
    local_head = build_head(cast(int, encoder.out_dim), n_classes, model_cfg).to(active.device)
    opt = torch.optim.Adam([*encoder.parameters(), *local_head.parameters()], lr=lr)
    rng = np.random.default_rng(seed)
    assert active.data.label_ids is not None  # the active party's data always carries its labels
    ids = rng.permutation(active.data.label_ids)
    n_val = max(1, len(ids) // 10)
    val, ids = ids[:n_val], ids[n_val:]
    y, y_val = (torch.from_numpy(active.data.labels(i)).to(active.device) for i in (ids, val))
    X, X_val = active.features(ids, "train"), active.features(val, "train")
    best, best_state, val_losses = float("inf"), None, []
    for _ in range(epochs):
        encoder.train()
        local_head.train()
        order = rng.permutation(len(ids))
        for s in range(0, len(order), batch_size):
            b = order[s:s + batch_size]
            loss = F.cross_entropy(local_head(encoder(X[b])), y[b])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        encoder.eval()
        local_head.eval()
        with torch.no_grad():
            val_loss = float(F.cross_entropy(local_head(encoder(X_val)), y_val))
        val_losses.append(round(val_loss, 6))
        if val_loss < best:
            best, best_state = val_loss, (copy.deepcopy(encoder.state_dict()), copy.deepcopy(local_head.state_dict()))
    # None only when no epoch ran or no validation loss was finite: there is no model to keep
    assert best_state is not None, "VFL-HLP pre-training gave no finite validation loss"
    if record is not None:  # the step's counters (issue 42): rows it trained on, the epoch it kept
        record.update(rows=int(len(ids)), validation_rows=int(n_val), validation_loss=val_losses,
                      kept_epoch=int(val_losses.index(round(best, 6))))
    encoder.load_state_dict(best_state[0])
    local_head.load_state_dict(best_state[1])
    theta1 = [w.detach().clone() for w in encoder.parameters()]
    theta0 = copy.deepcopy(first_linear_in(local_head)).requires_grad_(False)
    return theta1, theta0, encoder


@METHODS.register
class VFLHLP(Method):
    name = "vflhlp"
    supports_regression = False  # class labels outside the shared loop (Method.supports_regression)
    heads = frozenset({"split"})
    head_refusal = "constrains the head's first linear layer to the active party's pre-trained head (L_cons)"
    summary = "active supervised pre-training as a constraint + passive SCARF initialisation (VFLHLP)"
    passive_features_outside_loop = True  # passive SCARF pre-training on raw features
    use_active: ClassVar[bool] = True
    use_passive: ClassVar[bool] = True
    partition_defaults = {"active_labels_unaligned": True}
    defaults = {**SSL_PARAMS, "corruption": 0.6, "temperature": 1.0, "beta": 10.0, "init_active": True,
                      "pretrain_epochs": 10, "pretrain_batch_size": 256, "pretrain_lr": 1e-3}

    def privacy_plan(self, fed: Federation) -> tuple[int, int]:
        if self.use_active:
            raise UserError(f"dp: {self.name}'s active pre-training trains on raw labels outside DP-SGD, so no ε "
                            "would bound it; use vflhlp-p, or rr for label privacy")
        return super().privacy_plan(fed)

    per_role = True
    # a resumed run skips the passive parties' SCARF (it only set their encoders, which the checkpoints
    # hold) and re-runs the active party's pre-training: alone, from its own seed, so Θ^1 and Θ^0 of
    # the consistency term come out as before; the checkpoint then loads the trained models
    resumable = True

    def passive_scarf(self, party: Party, req: dict) -> dict:
        """Step 2 at a passive party: SCARF pre-training of its encoder on its own rows (Θ^k); it reports
        its rows and its InfoNCE loss at the first and last step."""
        cfg = ssl_config(self.params, "scarf")
        losses = pretrain_party_locally(party, cfg, party.own_seed + STREAM_VFLHLP_PASSIVE)
        per = len(losses) // cfg.epochs if cfg.epochs and losses else 0  # steps per epoch (the same rows each)
        # the first and last epoch's mean InfoNCE: a last step of a few rows is no measure (ln(batch) at chance)
        means = [float(np.mean(losses[i:i + per])) for i in (0, len(losses) - per)] if per else [None, None]
        return {"rows": int(len(party.data.train_ids)), "loss_first_step": losses[0] if losses else None,
                "loss_last_step": losses[-1] if losses else None, "loss_first_epoch_mean": means[0],
                "loss_last_epoch_mean": means[1]}

    def passive_ops(self) -> dict:
        return {OP_SCARF: self.passive_scarf}

    def fit(self, fed: Federation) -> None:
        a, params = fed.active, self.params
        terms = []
        if self.use_active and self.ctx.optim.optimizer == "adam":
            fed.meta.setdefault("warnings", []).append(
                f"{self.name} with adam: Adam's normalised steps defeat the β·L_cons constraint to the pre-trained "
                "model; use --optimizer sgd")
        if self.use_active:
            assert a.data.label_ids is not None  # the active party's data always carries its labels
            if len(a.data.label_ids) <= len(labeled_aligned_ids(fed)):
                # fully aligned (e.g. two party files whose IDs all match): the paper's local pre-training
                # uses all the active party's labeled rows, which are then the aligned ones
                fed.meta.setdefault("warnings", []).append(
                    f"{self.name}: every labeled row of the active party is aligned, so its local pre-training "
                    f"uses those {len(a.data.label_ids)} rows and nothing beyond what the federation trains on; "
                    "its gain comes from labeled rows the passive parties lack (with files: rows of the active "
                    "party's file that the passive parties' files do not hold; simulated: "
                    "partition.active_labels_unaligned: true)")
            record: dict = {}
            epochs = int(params["pretrain_epochs"])
            with phase(f"{self.name} local pre-training ({epochs} epochs)", self.ctx.progress):
                theta1, theta0, encoder = active_pretrain(
                    a, self.ctx.model, fed.n_classes, epochs, int(params["pretrain_batch_size"]),
                    float(params["pretrain_lr"]), seed_for(self.ctx.seed, 0) + STREAM_VFLHLP_ACTIVE, record)
            fed.meta.setdefault("vflhlp", {})["active_pretraining"] = record
            if params["init_active"]:
                # start at the pre-trained point: encoder Θ^1, head slice Θ^0, and zero weights on the
                # passive parties' columns, so federated training starts from the local model's function
                a.bottom.load_state_dict(encoder.state_dict())
                with torch.no_grad():
                    layer = first_linear_in(a.head)
                    layer.weight[:, : encoder.out_dim] = theta0.weight
                    layer.weight[:, encoder.out_dim:] = 0.0
                    layer.bias.copy_(theta0.bias)
            beta, own_dim = float(params["beta"]), cast(int, a.bottom.out_dim)  # bottom encoders set an int out_dim
            terms.append(lambda: beta * consistency_loss(a.bottom, a.head, theta1, theta0, own_dim))
        if self.use_passive and not self.resuming(fed):  # each passive party's SCARF losses (its own report)
            fed.meta.setdefault("vflhlp", {})["passive_pretraining"] = {
                p.name: p.call(OP_SCARF, reply=True) for p in handles(fed)}
        self.reset_optimizers(fed)
        self.trainer = self.finetune(fed, labeled_aligned_ids(fed), loss_terms=terms)


@METHODS.register
class VFLHLPActive(VFLHLP):
    name = "vflhlp-a"
    summary = "VFLHLP ablation: only the active party's pre-trained constraint"
    passive_features_outside_loop = False  # no passive pre-training
    use_passive = False


@METHODS.register
class VFLHLPPassive(VFLHLP):
    name = "vflhlp-p"
    summary = "VFLHLP ablation: only the passive parties' SCARF initialisation"
    use_active = False
