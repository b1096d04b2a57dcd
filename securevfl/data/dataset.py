"""In-memory dataset representation shared by every loader, and the loader options."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from securevfl.configuration.options import DataConfig  # noqa: F401  (its home: the light settings module)


@dataclass(frozen=True)
class Dataset:
    """A labelled dataset before it is split across parties.

    ``X`` is ``(n, H, W)`` for images (parties get column strips of ``W``) or ``(n, F_num)`` numeric
    features for tabular data; ``categorical`` holds ``(n, F_cat)`` raw categorical codes (64-bit
    hashes of the original values, encoded per party on its training rows). Tabular columns are
    indexed numeric first, then categorical. ``test_mask`` marks a predefined test split; ``None``
    means the partition draws one per seed. ``presets`` name field-to-party assignments.
    """

    name: str
    X: np.ndarray
    y: np.ndarray
    ids: np.ndarray
    n_classes: int
    kind: str  # "image" | "tabular"
    feature_names: tuple[str, ...] = ()
    test_mask: np.ndarray | None = None
    log_transform: bool = False
    """Apply sign(x)·log(1+|x|) to numeric features before standardising (heavy-tailed counts)."""
    categorical: np.ndarray | None = None
    cat_names: tuple[str, ...] = ()
    presets: dict[str, list[list[str]]] = field(default_factory=dict)

    @property
    def n_numeric(self) -> int:
        return 0 if self.kind == "image" else int(self.X.shape[1])

    @property
    def n_columns(self) -> int:
        """Number of splittable columns: image width, or numeric + categorical fields."""
        if self.kind == "image":
            return int(self.X.shape[-1])
        return self.n_numeric + (0 if self.categorical is None else int(self.categorical.shape[1]))

    @property
    def column_names(self) -> tuple[str, ...]:
        if self.kind == "image":
            return tuple(f"col{i}" for i in range(self.n_columns))
        return tuple(self.feature_names) + tuple(self.cat_names)

    @property
    def task(self) -> str:
        return "binary" if self.n_classes == 2 else "multiclass"
