"""``kdk:EPSILON``: knowledge distillation with k-anonymous soft labels (Arazzi, Nicolazzo & Nocera,
"A defense mechanism against label inference attacks in vertical federated learning",
Neurocomputing 2025; KDk).

Before training, the active party trains a *teacher* on its own features and labels. Each
training label y then becomes a soft label over the teacher's k most likely classes: the true
class gets 1 − ε and every other of those k classes ε / (k − 1). The federation trains on these
labels (a label transform: nothing downstream sees the originals), so the gradient returned for a
row no longer points at one class: k classes carry comparable mass, chosen by the teacher among the
classes the row is confusable with (the "k-anonymity"). While ε < (k − 1)/k the true class keeps the
largest share, so predictions need no decoding.

Readings where the paper (and its released code, ``kdk.py``) leaves details open, stated here:
- the teacher is an MLP on the active party's own training rows (the released code trains a model
  of the active party's bottom shape, 20 epochs with Adam at 1e-4; ours: ``teacher_epochs`` 20,
  Adam at 1e-3, batch 128, seeded from the defense's generator);
- when the true class is not among the teacher's top k, the released code gives it 1 − ε on top of
  the k shares (a row summing to more than 1); ours renormalises every row to sum to 1;
- k is capped at the number of classes (binary tasks: label smoothing towards the other class).

``kdk:0`` is the undefended run (installed at no party, bit-identical to ``--defense none``). A
label-only active party has no features for a teacher: refused. Party: active. Composes with HE
(labels never cross the cut layer), with soft-label methods (``splitnn``; others refuse), not
with a learning-rate search (candidates would be scored against soft labels), and with either head.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from defenses.base import DEFENSES, Defense, _finite
from securevfl.channel import MessageKind
from securevfl.errors import UserError
from securevfl.hooks import LabelTransform
from securevfl.roles import ACTIVE


def train_teacher(x: np.ndarray, y: np.ndarray, n_classes: int, epochs: int, generator: torch.Generator
                  ) -> nn.Module:
    """An MLP on the active party's own rows (flattened, standardised with their own statistics)."""
    flat = torch.as_tensor(x.reshape(len(x), -1), dtype=torch.float32)
    mean, std = flat.mean(0), flat.std(0).clamp_min(1e-6)
    hidden = 128
    net = nn.Sequential(nn.Linear(flat.shape[1], hidden), nn.ReLU(), nn.Linear(hidden, n_classes))
    for m in net:
        if isinstance(m, nn.Linear):
            bound = 1.0 / m.in_features ** 0.5
            nn.init.uniform_(m.weight, -bound, bound, generator=generator)
            nn.init.zeros_(m.bias)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    xs, ys = (flat - mean) / std, torch.as_tensor(y, dtype=torch.long)
    for _ in range(epochs):
        order = torch.randperm(len(xs), generator=generator)
        for i in range(0, len(xs), 128):
            idx = order[i:i + 128]
            loss = F.cross_entropy(net(xs[idx]), ys[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    net.eval()
    return nn.Sequential(_Standardise(mean, std), net).requires_grad_(False)


class _Standardise(nn.Module):
    def __init__(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        super().__init__()
        self.mean, self.std = mean, std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.reshape(len(x), -1) - self.mean) / self.std


def k_anonymous_labels(probs: np.ndarray, labels: np.ndarray, k: int, epsilon: float) -> np.ndarray:
    """KDk's soft labels: ε/(k − 1) on each of the teacher's top-k classes, 1 − ε on the true one,
    each row renormalised to sum to 1 (float32)."""
    n, n_classes = probs.shape
    k = min(k, n_classes)
    top = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    soft = np.zeros((n, n_classes), dtype=np.float64)
    np.put_along_axis(soft, top, epsilon / (k - 1), axis=1)
    soft[np.arange(n), labels] = 1.0 - epsilon
    return (soft / soft.sum(1, keepdims=True)).astype(np.float32)


@DEFENSES.register
class KDk(Defense, LabelTransform):
    name = "kdk"
    primary = "epsilon"
    defaults = {"epsilon": 0.65, "k": 3, "teacher_epochs": 20}
    ranges = {"epsilon": "[0, (k − 1)/k): 0 = off; the true class keeps the largest share",
              "k": "≥ 2 (capped at the number of classes)", "teacher_epochs": "≥ 1"}
    runs_at = frozenset({ACTIVE})
    observes = frozenset({"labels", "own_features"})
    # changes the labels behind every gradient; listed so methods that return gradients accept it
    acts_on = frozenset({MessageKind.GRADIENT})
    soft_labels = True
    targets: ClassVar[tuple[str, ...]] = ("mc", "mc-plain", "bli", "norm", "direction")
    he = "composes: the labels are softened at the source, before anything is encrypted"

    def validate(self) -> None:
        eps, k = self.config["epsilon"], self.config["k"]
        _finite("kdk epsilon", eps)
        if k < 2:
            raise UserError(f"kdk k must be ≥ 2, got {k}")
        if eps >= (k - 1) / k:
            raise UserError(f"kdk epsilon must be below (k − 1)/k = {(k - 1) / k:.3g} so the true class keeps the "
                            f"largest share, got {eps}")
        if self.config["teacher_epochs"] < 1:
            raise UserError(f"kdk teacher_epochs must be ≥ 1, got {self.config['teacher_epochs']}")
        if eps == 0:  # the undefended control: installed nowhere, bit-identical
            self.runs_at = frozenset()
        self.summary: dict = {}

    def transform_labels(self, labels: np.ndarray, n_classes: int, features: np.ndarray | None = None
                         ) -> np.ndarray:
        if features is None:
            raise UserError("kdk trains its teacher on the active party's own features; this active party holds "
                            "none for its labeled rows (a label-only host)")
        y = np.asarray(labels, dtype=np.int64)
        teacher = train_teacher(features, y, n_classes, self.config["teacher_epochs"], self.generator)
        with torch.no_grad():
            probs = torch.softmax(teacher(torch.as_tensor(features, dtype=torch.float32)), 1).numpy()
        soft = k_anonymous_labels(probs, y, self.config["k"], self.config["epsilon"])
        k = min(self.config["k"], n_classes)
        top = np.argsort(-probs, axis=1, kind="stable")[:, :k]
        self.summary = {"k": k, "teacher_accuracy": round(float((probs.argmax(1) == y).mean()), 4),
                        "true_label_in_top_k": round(float((top == y[:, None]).any(1).mean()), 4),
                        "mean_true_label_share": round(float(soft[np.arange(len(y)), y].mean()), 4)}
        return soft

    def privacy(self) -> dict:
        return {"epsilon": None, "delta": None, "mechanism": self.name, "formal_guarantee": False,
                "protects": "the active party's labels (k-anonymous soft labels from a teacher)",
                "kdk_epsilon": self.config["epsilon"], **self.summary}
