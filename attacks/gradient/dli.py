"""``dli`` — direct label inference (Fu et al. 2022, "Label Inference Attacks Against Vertical
Federated Learning", §4.3; Li et al.'s observation that the returned gradient carries the label;
VFLAIR's ``DirectLabelScoring``).

Threat model: an honest-but-curious passive party (``adversary``) under the ``agg`` head with
softmax cross-entropy. There the active party sums the parties' logits, so the gradient it returns
for the adversary's logits z is ∂L/∂z = (softmax(Σ_k z^k) − onehot(y)) / B: every row has exactly
one negative entry, at the label. The adversary reads the gradients it received (its channel
transcript) and labels every row of every training batch by the index of its most negative entry;
a row with no negative entry (a defense zeroed or flipped it) gets a uniformly random guess, as in
VFLAIR. A row seen in several batches (epochs, learning-rate candidates) takes its majority label.

Under the ``split`` head the returned gradient is ∂L/∂(the adversary's cut-layer output) through a
trainable top model: it has no sign pattern tied to the label, so this attack refuses ``split``
(the gradient-based attacks that do apply there are ``norm``/``direction`` for binary tasks and
``bli``, which fits a dummy top model).

Scored against the adversary's training rows with known labels: ``value`` is the accuracy of the
per-row labels; ``batch_accuracy`` the accuracy per received row. ``prior``: the majority-class
share of those rows. Control: the same scoring on a random (standard normal) gradient of the same
shape per batch — what the rule reads from a gradient that carries no label, i.e. chance.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import numpy as np

from attacks.base import ATTACKS, Attack, AttackResult, AttackTarget
from attacks.gradient.scoring import received_gradient_batches
from securevfl.errors import UserError

if TYPE_CHECKING:
    from securevfl.federation import Federation


def sign_labels(g: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The label each gradient row reveals: the index of its most negative entry (softmax − onehot has
    one, at the label); a random class for a row with none."""
    out = g.argmin(axis=1)
    none = g.min(axis=1) >= 0
    out[none] = rng.integers(0, g.shape[1], size=int(none.sum()))
    return out


def vote(ids: list[np.ndarray], labels: list[np.ndarray], n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(unique row ids, each row's majority label) over every batch it appeared in."""
    all_ids, all_labels = np.concatenate(ids), np.concatenate(labels)
    rows, index = np.unique(all_ids, return_inverse=True)
    counts = np.zeros((len(rows), n_classes), dtype=np.int64)
    np.add.at(counts, (index, all_labels), 1)
    return rows, counts.argmax(axis=1)


@ATTACKS.register
class DirectLabelInference(Attack):
    """Labels every training row from the sign of the gradient it received (agg head)."""

    name = "dli"
    kind = "label_inference"
    summary = "direct label inference: the one negative entry of each returned logit gradient is the label"
    requires = frozenset({"transcript", "received_gradients"})
    heads = frozenset({"agg"})
    head_refusal = ("under the split head the returned gradient passes through a trainable top model and has no "
                    "sign pattern tied to the label (use --head agg, or bli)")
    defaults = {"control": True}

    def run(self, target: AttackTarget) -> AttackResult:
        fed = cast("Federation", target.federation)  # the harness hands the trained federation
        n_classes = fed.n_classes
        pairs = received_gradient_batches(target)
        if not pairs:
            raise UserError(f"attack {self.name}: {target.adversary} received no training gradients")
        if pairs[0][1].shape[1] != n_classes:
            raise UserError(f"attack {self.name}: the gradients {target.adversary} received are "
                            f"{pairs[0][1].shape[1]} wide, not one per class ({n_classes})")
        rng = np.random.default_rng(self.seed + 41)
        ids = [i for i, _ in pairs]
        guesses = [sign_labels(g, rng) for _, g in pairs]
        rows, labels = vote(ids, guesses, n_classes)
        y = target.truth(rows)
        known = y >= 0
        value = float((labels[known] == y[known]).mean())
        y_seen = target.truth(np.concatenate(ids))
        seen = np.concatenate(guesses)
        prior = float(np.bincount(y[known], minlength=n_classes).max() / known.sum())
        details: dict = {"batch_accuracy": float((seen[y_seen >= 0] == y_seen[y_seen >= 0]).mean()),
                         "rows": int(known.sum()), "batches": len(pairs), "adversary": target.adversary,
                         "no_negative_entry": float(np.mean([(g.min(1) >= 0).mean() for _, g in pairs]))}
        control = None
        if self.config["control"]:
            noise = np.random.default_rng(self.seed + 43)
            random_guesses = [sign_labels(noise.standard_normal(g.shape), noise) for _, g in pairs]
            _, c_labels = vote(ids, random_guesses, n_classes)
            control = float((c_labels[known] == y[known]).mean())
            details["control_kind"] = "the same rule on a random normal gradient of the same shape"
        return AttackResult("accuracy", value, prior, None, control, details)
