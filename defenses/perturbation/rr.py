"""``rr``: label-DP by randomized response at the source (Ghazi et al., NeurIPS 2021, "Deep
Learning with Label Differential Privacy", RR). The active party randomises every training label it
holds once, before training, with K-ary randomized response at ε; it keeps no copy of the true
training labels for training, model selection or anything else, so every message and the trained
model are post-processing and ε is exact (replace-one-label neighbours, pure ε-DP, δ = 0).
Test labels are untouched (they are never trained on). RR-with-prior (Ghazi et al.'s multi-stage
variant) is not implemented.
"""

from __future__ import annotations

import numpy as np
import torch

from defenses.base import Defense, _finite, register_defense
from defenses.functional import randomized_response
from securevfl.channel import MessageKind
from securevfl.errors import UserError
from securevfl.hooks import HookContext, LabelRandomizer


@register_defense
class RandomizedResponse(Defense, LabelRandomizer):
    name = "rr"
    primary = "epsilon"
    params = {"epsilon": float}
    # acts on the labels behind every gradient; listed so methods that return gradients accept it
    acts_on = frozenset({MessageKind.GRADIENT})

    def validate(self) -> None:
        if "epsilon" not in self.config:
            raise UserError("rr needs epsilon=E (e.g. rr:2)")
        _finite("rr epsilon", self.config["epsilon"], 0.0, lo_inclusive=False)
        self.flipped: int | None = None
        self.n_labels: int | None = None

    def randomize(self, labels: np.ndarray, n_classes: int) -> np.ndarray:
        rng = np.random.default_rng(int(torch.randint(0, 2**62, (1,), generator=self.generator)))
        out = randomized_response(labels, n_classes, self.config["epsilon"], rng)
        self.flipped, self.n_labels = int((out != labels).sum()), int(len(labels))
        return out

    def __call__(self, tensor: torch.Tensor, ctx: HookContext) -> torch.Tensor:
        return tensor

    def privacy(self) -> dict:
        eps = self.config["epsilon"]
        return {"epsilon": eps, "delta": 0.0, "mechanism": "randomized-response", "formal_guarantee": True,
                "neighbouring": "replace-one-label",
                "protects": "the active party's training labels, against every other party and the trained model",
                "sampling": "none (each label is randomised once)", "labels_randomized": self.n_labels,
                "labels_changed": self.flipped, "ledger": [{"run": "labels", "kind": "pure", "epsilon": eps}]}
