"""``bli`` — batch-level label inference (Zou et al. 2022, "Defending Batch-Level Label Inference and
Replacement Attacks in Vertical Federated Learning", IEEE TBD; VFLAIR ``BatchLabelReconstruction``,
SecretFlow ``BatchLevelLabelInferenceAttack``).

Threat model: an honest-but-curious passive party (``adversary``) that kept, for a few training
batches, what it sent and the gradient it got back (its channel transcript). Per batch it optimises
dummy labels ŷ (logits, softmax-ed), a dummy contribution of everyone else to the logits (the other
parties' outputs, VFLAIR's ``dummy_pred_b``) and, under the ``split`` head, a dummy top model (a
trainable linear layer on what it sent, VFLAIR's trainable-head variant; under ``agg`` the top is
the fixed sum) so that the cross-entropy gradient they induce on what it sent matches the one it
received; the labels are argmax ŷ. Adam, ``lr`` 0.05, ``steps`` 100 per batch (SecretFlow's
defaults). Reading where the papers match the gradient on the bottom model's *parameters* (Jᵀg): the
adversary holds g = ∂L/∂(what it sent) itself, which determines Jᵀg, so it matches g directly (no
stale copy of its bottom model is needed after training).

The attacked batches are the first ``batches`` training steps (VFLAIR attacks the first epoch's
state). Score: label accuracy over the rows of those batches (``prior``: their majority-class share).
Control: the same optimisation, same budget, against a random normal gradient of the same shape and
norm per batch — what the procedure reaches when the gradient carries no label.

Under ``split`` a trainable dummy top model makes the labels identifiable only up to a permutation of
the classes (permuting W's rows and ŷ's columns together leaves the gradient unchanged), so the raw
accuracy stays near chance there; ``up_to_permutation`` reports the accuracy after the best class
permutation per batch (chosen with the true labels: a scoring aid, not something the adversary has),
beside the control's. VFLAIR likewise reports the better of its fixed-sum and trainable-head variants.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment

from attacks.base import ATTACKS, Attack, AttackResult, AttackTarget
from attacks.gradient.scoring import exchanges
from securevfl.errors import UserError

if TYPE_CHECKING:
    from securevfl.federation import Federation


def reconstruct_labels(sent: torch.Tensor, grad: torch.Tensor, n_classes: int, top_model: bool, steps: int,
                       lr: float, generator: torch.Generator) -> np.ndarray:
    """Dummy labels (and the dummy rest of the model) whose cross-entropy gradient on ``sent`` matches
    ``grad``; returns their argmax per row."""
    b, width = sent.shape
    dummy_label = torch.randn(b, n_classes, generator=generator).requires_grad_(True)
    dummy_rest = torch.randn(b, n_classes, generator=generator).requires_grad_(True)
    params = [dummy_label, dummy_rest]
    weight = None
    if top_model:  # a linear top model on what was sent (VFLAIR's trainable head)
        weight = (torch.randn(n_classes, width, generator=generator) / width ** 0.5).requires_grad_(True)
        params.append(weight)
    elif width != n_classes:
        raise UserError(f"attack bli: the agg head's messages must be one logit per class, got width {width}")
    opt = torch.optim.Adam(params, lr=lr)
    x = sent.clone().requires_grad_(True)
    for _ in range(steps):
        opt.zero_grad()
        logits = (x @ weight.T if weight is not None else x) + dummy_rest
        # the active party's loss: mean cross-entropy over the batch, here against soft dummy labels
        loss = -(F.softmax(dummy_label, 1) * F.log_softmax(logits, 1)).sum(1).mean()
        (dummy_grad,) = torch.autograd.grad(loss, x, create_graph=True)
        ((dummy_grad - grad) ** 2).sum().backward()
        opt.step()
    return dummy_label.detach().argmax(1).numpy()


@ATTACKS.register
class BatchLabelInference(Attack):
    """Recovers each attacked batch's labels by matching the gradient it received (gradient inversion)."""

    name = "bli"
    summary = "batch-level label inference: dummy labels (+ dummy top model) fitted to each received gradient"
    kind = "label_inference"
    requires = frozenset({"transcript", "received_gradients"})
    defaults = {"batches": 5, "steps": 100, "lr": 0.05, "control": True}

    @classmethod
    def validate(cls, config: dict) -> None:
        super().validate(config)
        if int(config["batches"]) < 1 or int(config["steps"]) < 1 or config["lr"] <= 0:
            raise UserError(f"attack {cls.name}: batches and steps must be ≥ 1 and lr > 0")

    def run(self, target: AttackTarget) -> AttackResult:
        fed = cast("Federation", target.federation)  # the harness hands the trained federation
        n_classes, cfg = fed.n_classes, self.config
        steps = exchanges(target)[: int(cfg["batches"])]
        if not steps:
            raise UserError(f"attack {self.name}: {target.adversary} received no training gradients")
        if any(e.sent is None for e in steps):
            raise UserError(f"attack {self.name}: {target.adversary}'s messages are not plain rows (--he), so the "
                            "gradient they induce cannot be recomputed")
        # agg: the top is the sum of logits, fixed; split: a trainable top model the adversary must guess
        top_model = target.head != "agg"
        gen = torch.Generator().manual_seed(self.seed + 47)
        noise = torch.Generator().manual_seed(self.seed + 53)

        def attack(sent: np.ndarray, grad: np.ndarray) -> np.ndarray:
            return reconstruct_labels(torch.tensor(sent, dtype=torch.float32), torch.tensor(grad, dtype=torch.float32),
                                      n_classes, top_model, int(cfg["steps"]), float(cfg["lr"]), gen)

        guesses, controls, truths = [], [], []
        for e in steps:
            assert e.sent is not None  # refused above
            truths.append(target.truth(e.ids))
            guesses.append(attack(e.sent, e.grad))
            if cfg["control"]:
                fake = torch.randn(e.grad.shape, generator=noise, dtype=torch.float64).numpy()
                fake *= np.linalg.norm(e.grad) / max(np.linalg.norm(fake), 1e-12)
                controls.append(attack(e.sent, fake))
        y = np.concatenate(truths)
        known = y >= 0
        prior = float(np.bincount(y[known], minlength=n_classes).max() / known.sum())
        details: dict = {"batches": len(steps), "rows": int(known.sum()), "adversary": target.adversary,
                         "dummy_top_model": "trainable linear" if top_model else "sum (agg head)"}
        if top_model:
            details["up_to_permutation"] = permuted_accuracy(guesses, truths, n_classes)
        control = None
        if controls:
            control = float((np.concatenate(controls)[known] == y[known]).mean())
            details["control_kind"] = "the same optimisation on a random gradient of the same shape and norm"
            if top_model:
                details["control_up_to_permutation"] = permuted_accuracy(controls, truths, n_classes)
        value = float((np.concatenate(guesses)[known] == y[known]).mean())
        return AttackResult("accuracy", value, prior, None, control, details)


def permuted_accuracy(guesses: list[np.ndarray], truths: list[np.ndarray], n_classes: int) -> float:
    """Accuracy after the best one-to-one relabelling of the guessed classes, chosen per batch."""
    hits = total = 0
    for g, y in zip(guesses, truths, strict=True):
        g, y = g[y >= 0], y[y >= 0]
        agree = np.zeros((n_classes, n_classes), dtype=np.int64)
        np.add.at(agree, (g, y), 1)
        rows, cols = linear_sum_assignment(agree, maximize=True)
        hits, total = hits + int(agree[rows, cols].sum()), total + len(y)
    return hits / max(total, 1)
