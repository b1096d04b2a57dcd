"""``sparsify``: gradient sparsification — keep the top ``keep`` % entries of each example's
returned gradient by magnitude, zero the rest (a known label-leakage baseline; no formal guarantee).
``keep=100`` is a no-op."""

from __future__ import annotations

import torch

from defenses.base import DEFENSES, Defense
from defenses.functional import topk_per_example
from securevfl.channel import MessageKind
from securevfl.errors import UserError
from securevfl.hooks import HookContext, MessageTransform
from securevfl.roles import ACTIVE


@DEFENSES.register
class Sparsify(Defense, MessageTransform):
    name = "sparsify"
    primary = "keep"
    defaults = {"keep": 10.0}
    targets = ("norm", "direction")
    ranges = {"keep": "(0, 100] percent (100: off)"}
    acts_on = frozenset({MessageKind.GRADIENT})
    runs_at = frozenset({ACTIVE})  # the gradients the active party returns

    def validate(self) -> None:
        if not 0 < self.config["keep"] <= 100:
            raise UserError(f"sparsify keep must be a percentage in (0, 100], got {self.config['keep']}")

    def __call__(self, tensor: torch.Tensor, ctx: HookContext) -> torch.Tensor:
        if not ctx.training or self.config["keep"] >= 100:
            return tensor
        return topk_per_example(tensor, self.config["keep"] / 100.0)

    def privacy(self) -> dict:
        return {"epsilon": None, "delta": None, "mechanism": "sparsify", "formal_guarantee": False,
                "keep_percent": self.config["keep"]}
