"""Utility metrics (scikit-learn): accuracy for multi-class tasks, AUC for binary ones."""

from __future__ import annotations

import numpy as np
from sklearn.metrics import accuracy_score, log_loss, roc_auc_score


def headline_score(probs: np.ndarray, y: np.ndarray, n_classes: int) -> float:
    """AUC for binary tasks (nan when ``y`` holds one class), top-1 accuracy otherwise."""
    if n_classes == 2:
        return float(roc_auc_score(y, probs[:, 1])) if len(np.unique(y)) == 2 else float("nan")
    return float(accuracy_score(y, probs.argmax(1)))


def utility(probs: np.ndarray, y: np.ndarray, n_classes: int) -> dict:
    pred = probs.argmax(1)
    out: dict[str, float | str] = {"accuracy": float(accuracy_score(y, pred))}
    if n_classes == 2:
        out["auc"] = headline_score(probs, y, 2)
        out["logloss"] = float(log_loss(y, probs, labels=[0, 1]))
        out["metric"], out["test"] = "auc", out["auc"]
        out["prior"] = 0.5
    else:
        out["metric"], out["test"] = "accuracy", out["accuracy"]
        # what guessing the majority class scores: the report marks cells within noise of it
        out["prior"] = float(np.bincount(np.asarray(y, dtype=int)).max() / max(len(y), 1))
    return out
