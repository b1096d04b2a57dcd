"""Utility metrics (scikit-learn): accuracy for multi-class tasks, AUC for binary ones, R² (with MSE
and MAE) for regression — a model with one output (``n_classes`` 1) is a regression's."""

from __future__ import annotations

import numpy as np
from sklearn.metrics import accuracy_score, log_loss, mean_absolute_error, mean_squared_error, r2_score, roc_auc_score


def headline_score(probs: np.ndarray, y: np.ndarray, n_classes: int) -> float:
    """AUC for binary tasks (nan when ``y`` holds one class), R² for regression (one output column),
    top-1 accuracy otherwise."""
    if n_classes == 1:
        return float(r2_score(y, probs[:, 0])) if len(y) > 1 else float("nan")
    if n_classes == 2:
        return float(roc_auc_score(y, probs[:, 1])) if len(np.unique(y)) == 2 else float("nan")
    return float(accuracy_score(y, probs.argmax(1)))


def utility(probs: np.ndarray, y: np.ndarray, n_classes: int) -> dict:
    if n_classes == 1:  # regression: ``probs`` holds the predictions, one column
        return regression_utility(probs[:, 0], y)
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


def regression_utility(pred: np.ndarray, y: np.ndarray) -> dict:
    """MSE, MAE and R² of predictions on the label's own scale; R² is the headline (higher is better,
    like the classification metrics the reports compare)."""
    r2 = headline_score(pred[:, None], y, 1)
    return {"mse": float(mean_squared_error(y, pred)), "mae": float(mean_absolute_error(y, pred)), "r2": r2,
            "metric": "r2", "test": r2}
