"""FedUD (Ouyang et al. 2024; docs/methods.md): federated learning with the host's unaligned rows.

Two roles: the host H is the active party (features and labels on all its rows, aligned and
unaligned), the guest G a passive party (features on aligned rows only).

1. On the labeled aligned rows: h_H = f_Hb(x_H), h_G = f_G(x_G), z = f_Ht([h_H; h_G]), loss1 = CE;
   the host's representation-transfer net learns h̃_G = Rep(h_H) with loss2 = MSE(h̃_G, sg(h_G)),
   total loss1 + α·loss2. Rep lives at the host and only reads what the host already received.
2. Rep frozen. loss3 = CE on aligned rows (real h_G) + β·CE on the host's unaligned rows
   (h̃_G = Rep(h_H)), continuing from step 1's weights (``reinit: true`` re-initialises them).
Inference: aligned test rows use the guest, unaligned test rows use Rep (the trainer's ``passive_stand_in``).

Readings where the paper is silent (documented choices):
- α and β are "tunable" with no values given; defaults α = 1, β = 1.
- Step 2 mixes both kinds of rows as if batches were drawn from their union: each step takes one
  aligned batch of ``batch_size`` and an equal share (≈ ``batch_size · n_u / n_a``) of the unaligned
  rows, so one epoch passes over both sets exactly once (the unaligned part is host-local and cheap;
  exactly once also lets label-DP charge every labeled row one step per epoch).
- Rep is an MLP h_H → one h̃ per guest (hidden width 2·cut_dim); with K > 2 parties each passive
  party is a guest and Rep predicts all of them.
- Step 1 and step 2 each run ``train.epochs`` epochs; the paper's layer sizes are the ``fedud``
  model preset (embeddings 10, bottoms 512→256→128, top 256→128).
Nothing new crosses the channel: the guest sees exactly what it sees in ``splitnn`` (batch IDs of
aligned rows, gradients), and unaligned rows never reach it.
"""

from __future__ import annotations

from typing import cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from securevfl.errors import UserError
from securevfl.federation import (
    STREAM_FEDUD_REINIT,
    STREAM_FEDUD_REP,
    STREAM_FEDUD_UNALIGNED,
    Federation,
    seed_for,
    seeded_build,
)
from securevfl.ids import difference
from securevfl.methods.base import METHODS, Method, labeled_aligned_ids
from securevfl.models import MLPEncoder, reset_parameters
from securevfl.parties import ActiveParty, Party
from securevfl.runtime import handles
from securevfl.training import LabelTerm, SplitTrainer

OP_OUTSIDE = "fedud.rows_outside"  # a guest's count of rows outside the aligned set (for a warning)
OP_REINIT = "fedud.reinit"  # step 2 with re-initialised weights (reinit: true)
R2_KEY = "_fedud_distillation_r2"  # step 1's per-step R², kept in the run's meta until the method reports it


class RepNet(nn.Module):
    """h_H → [h̃_G^1, ..., h̃_G^K]: the host's stand-in for each guest's representation."""

    def __init__(self, in_dim: int, out_dims: list[int], hidden: int) -> None:
        super().__init__()
        self.out_dims = out_dims
        self.net = MLPEncoder(in_dim, (hidden,), sum(out_dims))

    def forward(self, h: torch.Tensor) -> list[torch.Tensor]:
        return list(torch.split(self.net(h), self.out_dims, dim=1))


def distillation_loss(rep: RepNet, host: ActiveParty) -> torch.Tensor:
    """loss2 = mean over rows of ‖Rep(h_H) − sg(h_G)‖² (guest representations as received)."""
    pred = torch.cat(rep(host.own_output), dim=1)
    target = torch.cat([r.detach() for r in host.received], dim=1)
    return ((pred - target) ** 2).sum(dim=1).mean()


class UnalignedTerm(LabelTerm):
    """β·CE on the host's unaligned labeled rows (h̃_G = Rep(h_H)). Each epoch visits every row once,
    split evenly over the epoch's steps (its own rng), as if batches were drawn from the union."""

    def __init__(self, host: ActiveParty, rep: RepNet, ids: np.ndarray, beta: float, batch_size: int,
                 seed: int) -> None:
        self.host, self.rep, self.ids, self.beta, self.batch_size = host, rep, ids, beta, batch_size
        self.rng = np.random.default_rng(seed)
        self.chunks: list[np.ndarray] = []
        self.k = 0
        self.rows_seen = 0  # unaligned rows the term trained on, over all steps (counted once per use)

    def begin_epoch(self, steps: int) -> None:
        self.chunks, self.k = np.array_split(self.rng.permutation(self.ids), steps), 0
        self.rows_per_step = len(self.ids) / steps

    def state(self) -> dict:  # at an epoch's end: the next epoch re-shuffles from the generator
        return {"rng": self.rng.bit_generator.state, "rows_seen": self.rows_seen, "rows_per_step": self.rows_per_step}

    def load_state(self, state: dict) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.rows_seen, self.rows_per_step = int(state["rows_seen"]), float(state["rows_per_step"])

    def _losses(self) -> tuple[torch.Tensor, np.ndarray]:
        ids = self.chunks[self.k % len(self.chunks)]
        self.k += 1
        self.rows_seen += len(ids)
        logits = self.host.logits_alone(ids, "train", True, passive_stand_in=self.rep)
        y = torch.from_numpy(self.host.data.labels(ids)).to(logits.device)
        return F.cross_entropy(logits, y, reduction="none"), ids

    def __call__(self) -> torch.Tensor:
        losses, _ = self._losses()
        return self.beta * losses.mean()

    def per_example(self) -> tuple[torch.Tensor, np.ndarray]:
        losses, ids = self._losses()  # scaled so that Σ / batch_size is β · the mean over a step's rows
        return self.beta * losses * (self.batch_size / self.rows_per_step), ids


@METHODS.register
class FedUD(Method):
    name = "fedud"
    supports_regression = False  # class labels outside the shared loop (Method.supports_regression)
    heads = frozenset({"split"})
    head_refusal = "distils the guest's cut-layer representation into the host's Rep, which needs a top model"
    summary = "host's unaligned rows via a representation-transfer net distilled from the guest (FedUD)"
    partition_defaults = {"active_labels_unaligned": True, "test_aligned_fraction": "train"}
    supports_he = False  # Rep distils the guest's representation, which the HE cut layer hides from the host
    defaults = {"alpha": 1.0, "beta": 1.0, "rep_hidden": None, "reinit": False}

    def privacy_plan(self, fed: Federation) -> tuple[int, int]:
        k, s = self.finetune_plan()  # two supervised stages; step 2's unaligned rows once per epoch too
        return 2 * k, 2 * s

    @property
    def interactive_layer(self) -> bool:
        return False  # Rep imitates the guest's raw representation, which the head must read whole

    per_role = True
    # a resumed run replays step 1 (same seeds, same draws) when the checkpoint is in step 2; the
    # unaligned term's generator is in the checkpoints, and the R² record in the run's meta
    resumable = True

    supervised_stages = 2  # the guest-side stage and the final fit each search the grid
    passive_permissions = {OP_REINIT: "reinit"}  # re-initialises a passive party's weights (from its own seed)

    def permissions_needed(self) -> frozenset[str]:
        return frozenset({"reinit"}) if self.params["reinit"] else frozenset()

    def passive_ops(self) -> dict:
        return {OP_OUTSIDE: lambda party, req: int(len(difference(party.data.train_ids,
                                                                  cast(np.ndarray, party.aligned_ids)))),
                OP_REINIT: lambda party, req: self._reinit(party)}

    def _reinit(self, party: Party) -> None:
        """Re-initialise this party's models from its own seed stream (each party, in its own process)."""
        def reset() -> None:
            for m in [party.bottom, *([party.head] if isinstance(party, ActiveParty) else [])]:
                reset_parameters(m)

        seeded_build(party.own_seed + STREAM_FEDUD_REINIT, reset)

    def _rep(self, a: ActiveParty) -> RepNet:
        cut = cast(int, a.bottom.out_dim)  # bottom encoders set an int out_dim
        return RepNet(cut, a.passive_widths, int(self.params["rep_hidden"] or 2 * cut))

    def serving_layout(self, party: Party, n_classes: int) -> None:
        """The host owns Rep (the guests' models are the standard ones)."""
        if isinstance(party, ActiveParty):
            party.install(modules={"rep": self._rep(party)})

    def unaligned_path(self, fed: Federation, trainer: SplitTrainer) -> str:
        """The paper's host-only path: Rep(h_H) stands in for every guest's representation."""
        trainer.passive_stand_in = cast(RepNet, fed.active.extra_modules["rep"])
        return "fedud-rep"

    def fit(self, fed: Federation) -> None:
        a, params = fed.active, self.params
        alpha, beta = float(params["alpha"]), float(params["beta"])
        if alpha < 0 or beta < 0:
            raise UserError(f"fedud: alpha and beta must be ≥ 0, got {alpha}, {beta}")
        aligned = labeled_aligned_ids(fed)
        # fit runs after alignment; the active party's data always carries its labels
        assert a.data.label_ids is not None and a.aligned_ids is not None
        unaligned = difference(a.data.label_ids, a.aligned_ids)
        # cast: every party learnt its aligned IDs before fit (alignment)
        if any(cast(int, q.call(OP_OUTSIDE, reply=True)) for q in handles(fed)):
            fed.meta.setdefault("warnings", []).append(
                "fedud's guest holds rows outside the aligned set, which FedUD never uses; the paper's setting is "
                "--unaligned active (partition.unaligned: active)")
        if len(unaligned) == 0:
            raise UserError("fedud needs labeled rows only the host holds (partition.active_labels_unaligned: true "
                            "and aligned_fraction < 1)")
        torch.manual_seed(seed_for(self.ctx.seed, 0) + STREAM_FEDUD_REP)
        rep = self._rep(a)
        a.install(modules={"rep": rep})  # the host owns Rep from here on (and a fresh optimizer)

        # step 1: VFL on aligned rows + α·MSE distillation into Rep
        fed.meta[R2_KEY] = []  # how much of the guest's representation Rep explains, per step (issue 42);
        # in the run's meta, which a checkpoint holds (looked up at each step: a resume replaces the list)

        def distill() -> torch.Tensor:
            loss = distillation_loss(rep, a)
            with torch.no_grad():  # R² = 1 − MSE / the batch's total variance of h_G (the target moves as G trains)
                target = torch.cat([r.detach() for r in a.received], dim=1)
                spread = float(((target - target.mean(0)) ** 2).sum(1).mean())
                fed.meta[R2_KEY].append(1.0 - float(loss.detach()) / spread if spread > 0 else 0.0)
            return alpha * loss

        step1 = self.finetune(fed, aligned, stage="distill", loss_terms=[distill])

        # step 2: Rep frozen; aligned CE + β·CE on the host's unaligned rows
        rep.requires_grad_(False)
        rep.eval()
        if params["reinit"]:
            self._reinit(a)
            for q in handles(fed):
                q.call(OP_REINIT)
        self.reset_optimizers(fed)
        term = UnalignedTerm(a, rep, unaligned, beta, self.ctx.train.batch_size,
                             seed_for(self.ctx.seed, 0) + STREAM_FEDUD_UNALIGNED)
        self.trainer = self.finetune(fed, aligned, label_terms=[term], passive_stand_in=rep)
        r2 = fed.meta.pop(R2_KEY)
        fed.meta["fedud"] = {"aligned_rows": int(len(aligned)), "unaligned_rows": int(len(unaligned)),
                             "unaligned_rows_per_step": round(term.rows_per_step, 2), "alpha": alpha, "beta": beta,
                             "step1_final_loss": step1.losses[-1] if step1.losses else None,
                             "distillation_r2_first_step": round(r2[0], 4) if r2 else None,
                             "distillation_r2_last_step": round(r2[-1], 4) if r2 else None,
                             "unaligned_rows_trained": term.rows_seen}
