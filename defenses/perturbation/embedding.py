"""Feature-side defenses at the passive party (activation hooks): what the active party receives
about a passive party's features.

``noise:SIGMA`` adds N(0, σ²) to every released bottom-output row z. No formal guarantee (the scale
is not tied to a sensitivity bound): ε is never printed for it.

``embedding-dp:clip=C,noise=Z`` is feature-level DP for one passive party's rows, neighbouring
relation: *replace one entity's feature row at that passive party* (labels and other parties fixed).
Two kinds of release carry information about a row x_i, and both are privatized:
1. Every time z_i is sent (training and inference), it is clipped to L2 norm C and N(0, (Z·2C)²)
   is added per coordinate (replacing x_i moves the clipped row by ≤ 2C).
2. The bottom model — which shapes every later release of every row — is trained by DP-SGD: per
   example, the gradient of ⟨z_i, g_i⟩ (g_i: the returned gradient row) with respect to the bottom
   parameters is clipped to ``grad_clip`` and the sum gets N(0, (Z·2·grad_clip)²), so the model is
   a DP function of the features. The returned gradient is taken at the released row (straight-
   through the clip).
Accounting: each release of either kind that involves x_i is one Gaussian mechanism with noise
multiplier Z; the charge is the largest number of such releases of any one entity over the run
(counted from the batch IDs), composed by RDP (``defenses/accounting.py``). This bounds everything
the active party sees from this passive party — with HE too, where it sees even less (a_P = z·W_P).
It does not bound what methods learn from features outside the supervised loop (passive
pre-training, imputation, cross-party SSL): those methods refuse ``embedding-dp``.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import torch

from defenses.accounting import check_delta, epsilon
from defenses.base import DEFENSES, Defense, _finite
from defenses.functional import clip_per_example, dp_sgd_release, gaussian
from securevfl.channel import MessageKind
from securevfl.hooks import HookContext, MessageTransform
from securevfl.per_example import PerExamplePassiveStep
from securevfl.roles import PASSIVE


@DEFENSES.register
class ActivationNoise(Defense, MessageTransform):
    name = "noise"
    primary = "sigma"
    defaults = {"sigma": 1.0}
    targets = ("fr", "fr-grn")
    ranges = {"sigma": "≥ 0 (0: off)"}
    acts_on = frozenset({MessageKind.ACTIVATION})
    runs_at = frozenset({PASSIVE})

    def validate(self) -> None:
        _finite("noise sigma", self.config["sigma"])

    def __call__(self, tensor: torch.Tensor, ctx: HookContext) -> torch.Tensor:
        s = self.config["sigma"]
        return tensor if s == 0 else tensor + gaussian(tensor, s, self.generator)

    def privacy(self) -> dict:
        return {"epsilon": None, "delta": None, "mechanism": "activation-noise", "formal_guarantee": False,
                "protects": "passive features (heuristic)", "sigma": self.config["sigma"]}


@DEFENSES.register
class EmbeddingDP(Defense, MessageTransform, PerExamplePassiveStep):
    """Two hook points: the released rows (a message transform) and the bottom model's update (a
    per-example passive step rule)."""

    name = "embedding-dp"
    primary = "noise"
    defaults = {"clip": 1.0, "noise": 1.0, "grad_clip": 1.0, "delta": 1e-5}
    targets = ("fr", "fr-grn")
    ranges = {"clip": "> 0", "noise": "≥ 0", "grad_clip": "> 0", "delta": "(0, 1)"}
    acts_on = frozenset({MessageKind.ACTIVATION})
    runs_at = frozenset({PASSIVE})
    observes = frozenset({"messages", "per_example_gradients"})
    carries_epsilon = True
    needs_aligned_batches = True
    bounds_features = True  # methods that use passive features outside the supervised loop refuse it

    def validate(self) -> None:
        c = self.config
        _finite("embedding-dp clip", c["clip"], 0.0, lo_inclusive=False)
        _finite("embedding-dp grad_clip", c["grad_clip"], 0.0, lo_inclusive=False)
        _finite("embedding-dp noise", c["noise"])
        check_delta("embedding-dp", c["delta"])
        self.releases: Counter = Counter()

    def _count(self, ids: np.ndarray | None) -> None:
        if ids is None:
            raise RuntimeError("embedding-dp needs the batch IDs of every release to account for them")
        self.releases.update(np.asarray(ids).tolist())

    def __call__(self, tensor: torch.Tensor, ctx: HookContext) -> torch.Tensor:
        c = self.config
        self._count(ctx.batch_ids)
        out = clip_per_example(tensor, c["clip"])
        return out + gaussian(out, c["noise"] * 2.0 * c["clip"], self.generator) if c["noise"] > 0 else out

    def update(self, per_example: list[torch.Tensor], batch_size: int, ids: np.ndarray) -> list[torch.Tensor]:
        c = self.config
        self._count(ids)
        summed, _ = dp_sgd_release(per_example, [], c["grad_clip"], c["noise"] * 2.0 * c["grad_clip"], batch_size,
                                   self.generator)
        return summed

    def privacy(self) -> dict:
        z, delta = self.config["noise"], self.config["delta"]
        k = max(self.releases.values(), default=0)
        eps = math.inf if z == 0 and k else epsilon([{"kind": "gaussian", "noise_multiplier": z,
                                                       "participations": k}], delta)
        finite = math.isfinite(eps)
        return {"epsilon": eps if finite else None, "delta": delta, "mechanism": "embedding-dp",
                "formal_guarantee": finite, "noise_multiplier": z, "clip": self.config["clip"],
                "grad_clip": self.config["grad_clip"], "neighbouring": "replace one entity's feature row at this "
                "passive party", "protects": "this passive party's features, against the active party's whole view",
                "max_releases_per_entity": k,
                "ledger": [{"run": "all releases", "kind": "gaussian", "noise_multiplier": z, "participations": k}]}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "releases": dict(self.releases)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.releases = Counter(state["releases"])
