"""``discrete-sgd``: quantized returned gradients (discrete SGD; VFLAIR's ``DiscreteSGD``). Every
coordinate of a returned gradient is rounded to the nearest of W = ``bins`` + 1 levels k·w,
k = −⌊W/2⌋ … ⌊W/2⌋, symmetric about 0. The bin width w = 2σ₀ / ⌊W/2⌋ is set once per passive
party from the standard deviation σ₀ of the first gradient batch returned to it, as VFLAIR does
(so the levels span ±2σ₀); values beyond the outer levels take the outer level (VFLAIR's
commented-out range; without it the levels would be unbounded). ``bins=0`` is off.
No formal guarantee: ε = n/a.
"""

from __future__ import annotations

import torch

from defenses.base import DEFENSES, Defense
from defenses.functional import level_width, quantize
from securevfl.channel import MessageKind
from securevfl.errors import UserError
from securevfl.hooks import HookContext, MessageTransform
from securevfl.roles import ACTIVE


@DEFENSES.register
class DiscreteSGD(Defense, MessageTransform):
    name = "discrete-sgd"
    primary = "bins"
    defaults = {"bins": 12}
    ranges = {"bins": "0 (off) or ≥ 2: the levels are bins + 1"}
    acts_on = frozenset({MessageKind.GRADIENT})
    runs_at = frozenset({ACTIVE})  # the gradients the active party returns
    targets = ("norm", "direction")
    he = ("composes: the active party quantizes the plaintext gradient g = ∂L/∂a_P before the encrypted "
          "backward (the passive party decrypts ∂L/∂t = g W_Pᵀ, not the levels themselves)")

    def validate(self) -> None:
        bins = self.config["bins"]
        if bins != 0 and bins < 2:
            raise UserError(f"discrete-sgd bins must be 0 (off) or ≥ 2, got {bins}")
        self.width: dict[str, float] = {}

    def __call__(self, tensor: torch.Tensor, ctx: HookContext) -> torch.Tensor:
        if self.config["bins"] == 0 or not ctx.training:
            return tensor
        half = (self.config["bins"] + 1) // 2
        if ctx.dst not in self.width:
            self.width[ctx.dst] = level_width(tensor, half)
        return quantize(tensor, self.width[ctx.dst], half)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "width": dict(self.width)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.width = dict(state["width"])

    def privacy(self) -> dict:
        return {"epsilon": None, "delta": None, "mechanism": "discrete-sgd", "formal_guarantee": False,
                "bins": self.config["bins"], "bin_width": dict(self.width)}
