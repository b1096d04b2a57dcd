"""In-memory dataset representation shared by every loader."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Dataset:
    """A labelled dataset before it is split across parties.

    ``X`` is ``(n, H, W)`` for images (parties get column strips of ``W``) or ``(n, F)`` for
    tabular data (parties get feature subsets). ``test_mask`` marks a predefined test split
    (e.g. Fashion-MNIST's 10k test images); ``None`` means the partition draws one per seed.
    """

    name: str
    X: np.ndarray
    y: np.ndarray
    ids: np.ndarray
    n_classes: int
    kind: str  # "image" | "tabular"
    feature_names: tuple[str, ...] = ()
    test_mask: np.ndarray | None = None
    # True when X still needs per-party standardisation on training rows (continuous tabular data).
    standardize: bool = False

    @property
    def n_columns(self) -> int:
        """Number of splittable columns: image width or tabular feature count."""
        return int(self.X.shape[-1])

    @property
    def task(self) -> str:
        return "binary" if self.n_classes == 2 else "multiclass"
