"""``rr``: label-DP by randomized response at the source (Ghazi et al., NeurIPS 2021, "Deep
Learning with Label Differential Privacy", RR). The active party randomises every training label it
holds once, before training, with K-ary randomized response at ε; it keeps no copy of the true
training labels for training, model selection or anything else, so every message and the trained
model are post-processing and ε is exact (replace-one-label neighbours, pure ε-DP, δ = 0).
Test labels are untouched (they are never trained on).

``prior=1`` is RR-with-prior in two stages (Ghazi et al.'s multi-stage scheme with two stages): a
random half of the labels goes through plain RR; the active party fits a prior model on its *own
features* of that half with those randomized labels (multinomial logistic regression — post-
processing of RR output); the other half goes through RRWithPrior with that model's class
probabilities as priors. Every label is randomised exactly once at ε, so the whole is ε-label-DP.
Reading where the paper is silent for VFL: the prior model uses the active party's features only
(the passive parties' features never reach it), and two stages rather than the paper's schedule.
"""

from __future__ import annotations

import numpy as np
import torch

from defenses.base import DEFENSES, Defense, _finite
from defenses.functional import randomized_response, rr_with_prior
from securevfl.channel import MessageKind
from securevfl.errors import UserError
from securevfl.hooks import LabelTransform


@DEFENSES.register
class RandomizedResponse(Defense, LabelTransform):
    name = "rr"
    primary = "epsilon"
    defaults = {"prior": 0}
    optional = {"epsilon": float}
    targets = ("norm", "direction", "mc", "mc-full", "mc-plain")
    ranges = {"prior": "0 or 1", "epsilon": "> 0 (required)"}
    he = "composes: the labels are randomised at the source, before anything is encrypted"
    # changes the labels behind every gradient; listed so methods that return gradients accept it
    acts_on = frozenset({MessageKind.GRADIENT})
    carries_epsilon = True

    def validate(self) -> None:
        if "epsilon" not in self.config:
            raise UserError("rr needs epsilon=E (e.g. rr:2)")
        _finite("rr epsilon", self.config["epsilon"], 0.0, lo_inclusive=False)
        if self.config["prior"] not in (0, 1):
            raise UserError(f"rr prior must be 0 (plain RR) or 1 (RR-with-prior), got {self.config['prior']}")
        self.flipped: int | None = None
        self.n_labels: int | None = None

    def transform_labels(self, labels: np.ndarray, n_classes: int, features: np.ndarray | None = None
                         ) -> np.ndarray:
        rng = np.random.default_rng(int(torch.randint(0, 2**62, (1,), generator=self.generator)))
        eps = self.config["epsilon"]
        if not self.config["prior"] or features is None or len(labels) < 4:
            out = randomized_response(labels, n_classes, eps, rng)
        else:
            out = np.empty_like(labels)
            first = np.zeros(len(labels), dtype=bool)
            first[rng.permutation(len(labels))[: len(labels) // 2]] = True
            out[first] = randomized_response(labels[first], n_classes, eps, rng)
            priors = prior_from_features(features[first], out[first], features[~first], n_classes)
            out[~first] = rr_with_prior(labels[~first], priors, eps, rng)
        self.flipped, self.n_labels = int((out != labels).sum()), int(len(labels))
        return out

    def privacy(self) -> dict:
        eps = self.config["epsilon"]
        return {"epsilon": eps, "delta": 0.0, "mechanism": "randomized-response", "formal_guarantee": True,
                "neighbouring": "replace-one-label",
                "protects": "the active party's training labels, against every other party and the trained model",
                "sampling": "none (each label is randomised once)", "labels_randomized": self.n_labels,
                "labels_changed": self.flipped, "variant": "rr-with-prior" if self.config["prior"] else "rr",
                "ledger": [{"run": "labels", "kind": "pure", "epsilon": eps}]}


def prior_from_features(x: np.ndarray, y: np.ndarray, x_new: np.ndarray, n_classes: int) -> np.ndarray:
    """Class probabilities for ``x_new`` from a logistic regression on (``x``, randomized ``y``);
    classes absent from ``y`` get a small floor so every class stays possible."""
    from sklearn.linear_model import LogisticRegression

    flat, flat_new = x.reshape(len(x), -1), x_new.reshape(len(x_new), -1)
    prior = np.full((len(x_new), n_classes), 1.0 / n_classes)
    if len(np.unique(y)) < 2:
        return prior
    model = LogisticRegression(max_iter=200).fit(flat, y)
    prior[:, model.classes_] = model.predict_proba(flat_new)
    prior = np.maximum(prior, 1e-6)
    return prior / prior.sum(1, keepdims=True)
