"""ISO (isotropic Gaussian noise, Li et al. 2022, as used by FedHSSL): on each returned gradient
batch, g̃ = g + N(0, σ² I) with σ = λ · max_j ‖g_j‖₂ / √d. ``lam_p`` applies the same rule to the
representations the active party sends during cross-party SSL (FedHSSL's λ_p).

ISO calibrates noise to the batch's largest gradient, not to a sensitivity bound, so it gives **no
formal differential-privacy guarantee**: its privacy report says ε = n/a.
"""

from __future__ import annotations

import torch

from defenses.base import DEFENSES, Defense, _finite
from defenses.functional import gaussian, iso_sigma
from securevfl.channel import MessageKind
from securevfl.hooks import HookContext, MessageTransform
from securevfl.roles import ACTIVE


@DEFENSES.register
class ISO(Defense, MessageTransform):
    name = "iso"
    primary = "lam"
    runs_at = frozenset({ACTIVE})  # the returned gradients, and the label owner's SSL representations
    defaults = {"lam": 1.0, "lam_p": 0.0}
    acts_on = frozenset({MessageKind.GRADIENT})  # the class default; validate() sets the instance's
    targets = ("norm", "direction")
    ranges = {"lam": "≥ 0 (0: off)", "lam_p": "≥ 0 (0: off)"}

    def validate(self) -> None:
        _finite("iso lam", self.config["lam"])
        _finite("iso lam_p", self.config["lam_p"])
        kinds = set()
        if self.config["lam"] > 0 or self.config["lam_p"] == 0:
            kinds.add(MessageKind.GRADIENT)
        if self.config["lam_p"] > 0:
            kinds.add(MessageKind.SSL_REPRESENTATION)
        self.acts_on = frozenset(kinds)

    def __call__(self, tensor: torch.Tensor, ctx: HookContext) -> torch.Tensor:
        lam = self.config["lam"] if ctx.kind == MessageKind.GRADIENT else self.config["lam_p"]
        if lam == 0 or (ctx.kind == MessageKind.GRADIENT and not ctx.training):
            return tensor
        if ctx.kind == MessageKind.SSL_REPRESENTATION and ctx.src != ACTIVE:
            return tensor  # λ_p protects what the label owner sends (FedHSSL §4.4)
        return tensor + gaussian(tensor, iso_sigma(tensor, lam), self.generator)

    def privacy(self) -> dict:
        return {"epsilon": None, "delta": None, "mechanism": "iso", "formal_guarantee": False,
                "note": "ISO gives no formal DP guarantee (noise scales with the batch's max gradient norm)",
                "lam": self.config["lam"], "lam_p": self.config["lam_p"]}
