"""``max-norm``: the heuristic of Li et al. 2022 ("Label Leakage and Protection in Two-party Split
Learning", §4): every returned gradient row g_j is perturbed along its own direction,
g̃_j = g_j · (1 + σ_j ξ_j), ξ_j ~ N(0, 1), with σ_j² = ‖g_max‖² / ‖g_j‖² − 1, so that every row's
expected squared norm equals the batch's largest, and the norm no longer tells the classes apart.

``strength`` (our addition, for sweeps) moves the target squared norm from the row's own (0: off)
to the batch maximum (1: the paper's): σ_j² = strength · (‖g_max‖² / ‖g_j‖² − 1). It needs no
labels. No formal DP guarantee: ε = n/a.
"""

from __future__ import annotations

import torch

from defenses.base import DEFENSES, Defense
from defenses.functional import per_example_norms
from securevfl.channel import MessageKind
from securevfl.devices import noise_like
from securevfl.errors import UserError
from securevfl.hooks import HookContext, MessageTransform
from securevfl.roles import ACTIVE


@DEFENSES.register
class MaxNorm(Defense, MessageTransform):
    name = "max-norm"
    primary = "strength"
    defaults = {"strength": 1.0}
    ranges = {"strength": "[0, 1] (0: off, 1: the paper's max-norm)"}
    acts_on = frozenset({MessageKind.GRADIENT})
    runs_at = frozenset({ACTIVE})  # the gradients the active party returns
    targets = ("norm",)
    he = ("composes: the active party perturbs the plaintext gradient g = ∂L/∂a_P before the encrypted "
          "backward")

    def validate(self) -> None:
        if not 0 <= self.config["strength"] <= 1:
            raise UserError(f"max-norm strength must be in [0, 1], got {self.config['strength']}")

    def __call__(self, tensor: torch.Tensor, ctx: HookContext) -> torch.Tensor:
        if self.config["strength"] == 0 or not ctx.training or not len(tensor):
            return tensor
        sq = per_example_norms(tensor.detach()).cpu().double().pow(2)  # float64 with the CPU noise (devices.py)
        # a zero row has no direction to perturb along; it stays zero (as in SecretFlow's reading)
        ratio = torch.where(sq > 0, sq.max() / sq.clamp_min(1e-300) - 1, torch.zeros_like(sq))
        sigma = (self.config["strength"] * ratio).sqrt()
        xi = torch.randn(len(tensor), generator=self.generator, dtype=torch.float64)
        factor = (1 + sigma * xi).to(tensor.dtype)
        return tensor * noise_like(factor, tensor).view(-1, *([1] * (tensor.dim() - 1)))

    def privacy(self) -> dict:
        return {"epsilon": None, "delta": None, "mechanism": "max-norm", "formal_guarantee": False,
                "strength": self.config["strength"]}
