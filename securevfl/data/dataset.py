"""In-memory dataset representation shared by every loader, and the loader options."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from securevfl.settings import setting


@dataclass
class DataConfig:
    dir: str | None = setting(None, flag="--data-dir", doc="""
        Folder searched first for file-based datasets (before ``$SECUREVFL_DATA`` and Debian's path).""")
    path: str | None = setting(None, flag="--data-path", doc="""
        The data file itself, for single-file datasets (Criteo ``train.txt``, the Avazu CSV, UCI credit).""")
    max_rows: int | None = setting(None, flag="--max-rows", metavar="N", ge=1, doc="""
        Read at most this many data rows (after sampling).""")
    sample: float = setting(1.0, flag="--sample", metavar="F", gt=0, le=1, doc="""
        Keep each row with this probability while streaming (seeded by ``sample_seed``).""")
    sample_seed: int = setting(0, ge=0, le=2**31 - 1, doc="""
        Seed of the row sampler; fixed per dataset so a run's seed does not change the data read.""")
    column_cache: str | None = setting(None, doc="""
        Criteo / Avazu: a folder for the parsed columns as memory-mapped ``.npy`` files, so a file
        larger than memory is read with bounded RSS (pages are file-backed and reclaimable).""")
    min_freq: int = setting(2, ge=1, doc="""
        Categorical values seen fewer times in a party's training rows map to the reserved unknown id 0.""")
    hash_buckets: int = setting(0, ge=0, doc="""
        If > 0, categorical values are hashed into this many buckets instead of a vocabulary.""")
    party_files: list[str] = setting(factory=list, flag="--party-file", cli="append", doc="""
        ``csv`` source: one CSV/Parquet file per party, active party first (the flag once per file).""")
    id_column: str = setting("id", doc="""
        ``csv`` source: the entity-ID column present in every party file (``--id-column`` given once).""")
    id_columns: list[str] = setting(factory=list, doc="""
        ``csv`` source: one ID column per party file (in file order), when the files name it differently;
        overrides ``id_column`` (``--id-column`` given once per file).""")
    numeric_ids: bool = setting(False, flag="--numeric-ids", doc="""
        ``csv`` source: match IDs as numbers ("00133" = "133"); by default IDs are compared as exact strings.""")
    label_column: str = setting("label", flag="--label-column", doc="""
        ``csv`` source: the label column, present only in the active party's file.""")
    drop_columns: list[str] = setting(factory=list, flag="--drop-columns", cli="comma", doc="""
        ``csv`` source: columns to ignore in every party file that has them (e.g. a row counter); on the
        command line comma-separated.""")
    categorical: list[str] = setting(factory=list, flag="--categorical", cli="comma", doc="""
        ``csv`` source: columns to treat as categorical even if their cells are numbers; on the command
        line comma-separated.""")
    numeric: list[str] = setting(factory=list, flag="--numeric", cli="comma", doc="""
        ``csv`` source: columns to treat as numeric; cells that are not numbers become missing values; on
        the command line comma-separated.""")
    task: str = setting("auto", flag="--task", choices=("auto", "classification", "regression"), doc="""
        ``csv`` source: what the label is. ``regression``: a continuous target (MSE loss; MSE, MAE and R²
        as utility); ``classification``: classes; ``auto``: regression when the label has fractional
        values (said on stderr), classes otherwise.""")


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
