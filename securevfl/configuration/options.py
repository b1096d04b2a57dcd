"""The run's settings sections as dataclasses, one field per setting (:func:`securevfl.configuration.settings.setting`),
in a module that imports neither torch nor the data layer: ``securevfl train``'s flags are generated,
parsed and checked from here before any heavy import, so a mistake is answered at once (issue 51).
Each class is re-exported from its old home (``securevfl.data``, ``securevfl.models``,
``securevfl.training``, ``securevfl.federation``), which is where the code that uses it lives."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from securevfl.configuration.settings import setting
from securevfl.errors import UserError


class Dataset(Protocol):
    """What :meth:`PartitionSpec.resolve_columns` reads of a dataset (securevfl.data.dataset.Dataset)."""

    @property
    def name(self) -> str: ...

    @property
    def n_columns(self) -> int: ...

    @property
    def column_names(self) -> Sequence[str]: ...

    @property
    def presets(self) -> dict: ...

DEVICES = ("auto", "cpu", "cuda", "mps")
"""The values of ``--device`` (securevfl/devices.py)."""


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
    hashed_ids: bool = setting(False, flag="--hashed-ids", doc="""
        ``csv`` source: hold each string ID as its 64-bit hash (int64, about 8 bytes an ID instead of a Python
        string's ≈ 330): for files of millions of string IDs. IDs still match exactly as strings, up to a hash
        collision (about 5 in a million runs of 10M × 10M IDs); predictions name the original IDs. Every party
        follows the active party's choice.""")
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


HEADS = ("split", "agg")
"""The head kinds (``--head``); components declare which they apply to (``heads`` class attributes)."""


@dataclass
class ModelConfig:
    bottom: str = setting("auto", flag="--bottom", choices=("auto", "mlp", "cnn"), doc="""
        Bottom model family: ``mlp``, ``cnn`` (image slices), or ``auto`` (cnn for images ≥ 16 px
        tall, mlp otherwise).""")
    cut_dim: int = setting(64, flag="--cut-dim", ge=1, doc="Width of each party's bottom output r^k (the cut layer).")
    head: str = setting("split", flag="--head", choices=HEADS, doc="""
        The active party's head: ``split`` (a trainable top model on the parties' concatenated cut-layer
        outputs) or ``agg`` (aggVFL: every bottom model outputs class logits and the active party sums
        them; no trainable top model, no interactive layer).""")
    hidden: tuple[int, ...] = setting((256, 128), ge=1, doc="Hidden widths of the MLP bottom model.")
    cnn_channels: tuple[int, ...] = setting((16, 32), ge=1, doc="""
        Channels of the CNN bottom model's conv blocks (conv3×3 → ReLU → maxpool2 each).""")
    head_hidden: tuple[int, ...] = setting(factory=tuple, ge=1, doc="""
        Hidden widths of the head; empty = one linear layer on the concatenation (FedHSSL's g).""")
    interactive_mixing: str = setting("auto", flag="--interactive-mixing", choices=("auto", "off", "on"), doc="""
        The interactive layer's secret mixing (issue 32, the gauge leak): ``on`` re-parameterises W_P as
        ρ·X_m·W̃·Z_m with X_m the passive party's and Z_m the active party's secret, so over a whole run
        the active party learns t only up to an unknown linear map and the passive party g only up to
        one (plain SGD on W_P leaves both up to a rotation). ``auto``: on under HE, off without it (the
        active party reads the activations in plaintext there). Same in both HE modes
        (securevfl/interactive.py, docs/he-protocol.md).""")
    emb_dim: int = setting(8, ge=1, doc="Embedding width per categorical field (tabular data; VFLHLP uses 8).")
    cut: int | None = setting(None, flag="--cut", ge=1, doc="""
        Cut-layer position: how many of the MLP bottom model's layers stay at each party (its output
        layer included); the other ``hidden`` layers move to the head, before ``head_hidden``, so the
        total depth is fixed. ``None`` = all of them (``len(hidden) + 1``, the default architecture).
        Swept like a defense's strength (a deeper head leaves less of the model at the passive party).""")
    preset: str | None = setting(None, flag="--model-preset", doc="""
        A paper's architecture (:data:`MODEL_PRESETS`: ``vflhlp-avazu``, ``vflhlp-criteo``, ``fedud``): it
        sets the fields it names, overriding them.""")


@dataclass
class TrainConfig:
    epochs: int = setting(5, flag="--epochs", ge=1, doc="Passes over the training IDs.")
    batch_size: int = setting(128, flag="--batch-size", ge=1, doc="Mini-batch size (entities per step).")
    eval_batch_size: int = setting(2048, ge=1, doc="Batch size for inference on test rows.")
    lr_grid: list[float] = setting(factory=list, gt=0, doc="""
        If set, every supervised stage (each stage of a multi-stage method, and every baseline) picks
        its learning rate from this list by validation on a stratified 20 % of its rows with a true
        label (held out by the active party), then retrains on all of them (FedHSSL's fine-tuning
        searches {0.005, 0.01, 0.03}); with fewer than 10 validation rows or one class it trains at
        the list's middle rate and says so. Empty = use ``optim.lr``.""")


@dataclass
class OptimConfig:
    optimizer: str = setting("adam", flag="--optimizer", choices=("adam", "sgd"), doc="""
        Every party's optimizer: ``adam`` or ``sgd`` (momentum 0.9).""")
    lr: float | None = setting(None, flag="--lr", gt=0, doc="""
        Learning rate of every party's optimizer; unset = the optimizer's default (:data:`DEFAULT_LR`:
        0.001 with adam, 0.05 with sgd — Adam's rate leaves momentum SGD at chance on small data).""")
    weight_decay: float = setting(0.0, ge=0, doc="L2 weight decay.")
    interactive_lr: float | None = setting(None, gt=0, doc="""
        Learning rate of the interactive layer W_P (momentum SGD in both HE modes): unset = ``lr`` under
        ``sgd``, 0.1 under ``adam`` (see securevfl/interactive.py).""")


DEFAULT_LR = {"adam": 1e-3, "sgd": 0.05}
"""Default learning rate per optimizer (sgd 0.05: digits splitnn 0.85 at 5 epochs, 0.63 at 0.01)."""


@dataclass
class PartitionSpec:
    n_parties: int = setting(2, flag="--parties", metavar="K", ge=2, doc="""
        Number of parties K ≥ 2; party 0 is active (labels + head), the rest passive.""")
    aligned_fraction: float = setting(1.0, flag="--aligned-fraction", ge=0, le=1, doc="""
        Fraction of training entities held by every party (ignored if ``aligned_count`` is set).""")
    aligned_count: int | None = setting(None, flag="--aligned-count", ge=0, doc="""
        Exact number of aligned training entities (overrides ``aligned_fraction``).""")
    unaligned: str = setting("disjoint", flag="--unaligned", choices=("disjoint", "all", "active"), doc="""
        How the unaligned remainder is spread: ``disjoint`` (each entity at exactly one party),
        ``all`` (every party keeps all its rows) or ``active`` (only the active party has rows beyond
        the aligned ones — FedUD's host and guest).""")
    n_labeled: int | None = setting(None, flag="--labeled", metavar="N", ge=1, doc="""
        Aligned entities labeled for supervised VFL; unset = all aligned entities.""")
    active_labels_unaligned: bool | None = setting(None, doc="""
        Whether the active party also has labels for its unaligned rows (VFLHLP, FedUD: yes;
        FedHSSL: no). Unset = the method's default.""")
    train_rows: int | None = setting(None, ge=1, doc="""
        Train on only this many of the training rows: the first N of the seed's shuffle of them, so a
        smaller N is a subset of a larger one for the same seed and every later draw (aligned rows,
        labeled rows) is made as before; the test rows are unchanged. Unset = all. The rows axis of
        the methods report (``sweeps/methods/*-rows.yaml``); single-table datasets only (party files
        are used whole).""")
    test_fraction: float = setting(0.2, gt=0, lt=1, doc="""
        Test share drawn per seed when the dataset has no predefined test split.""")
    test_aligned_fraction: float | str | None = setting(
        None, flag="--test-aligned-fraction", gt=0, le=1, keywords=("train",), doc="""
        Share of test entities every party holds; the rest exist only at the active party (FedUD's
        unaligned test rows: passive parties never see them). ``train`` = the training aligned
        share; unset = the method's default (1.0, or ``train`` for methods that predict unaligned
        rows).""")
    active_labels_all: bool | None = setting(None, doc="""
        Whether the active party also holds labels for the unaligned rows only passive parties hold
        (Entity Augmentation: the host knows every entity's label). Unset = the method's default
        (off).""")
    unaligned_label_fraction: float = setting(1.0, ge=0, le=1, doc="""
        With ``active_labels_unaligned``: the share of the active party's unaligned rows that are
        labeled (a seeded draw); the others are unlabeled rows at the active party (RISA Fig. 1).""")
    active_features: bool = setting(True, doc="""
        ``false``: the active party is a label-only host (Entity Augmentation) with no feature
        columns; ``columns`` then lists the passive parties' blocks only, and the unaligned remainder
        is spread over the passive parties.""")
    columns: list[list[int | str]] | str | None = setting(None, flag="--fields", metavar="PRESET", doc="""
        Columns per party, as indices or names (image columns, tabular fields), or the name of a
        dataset preset (e.g. ``vflhlp``, ``fedud``, ``fate``; the flag takes a preset name); unset =
        equal contiguous blocks (2 parties on images: left/right halves).""")
    alignment: str = setting("given", flag="--alignment", choices=("given", "psi", "plain"), doc="""
        How the aligned set is established: ``given`` (the simulator knows it), ``psi`` (a
        mutual Diffie–Hellman PSI over X25519 through the channel) or ``plain`` (plain intersection;
        explicit fallback only).""")

    def validate(self, n_columns: int) -> None:
        if self.n_parties < 2:
            raise UserError(f"--parties must be at least 2, got {self.n_parties}")
        if not 0.0 <= self.aligned_fraction <= 1.0:
            raise UserError(f"--aligned-fraction must be in [0, 1], got {self.aligned_fraction}")
        if self.aligned_count is not None and self.aligned_count < 0:
            raise UserError(f"aligned_count must be ≥ 0, got {self.aligned_count}")
        if self.unaligned not in ("disjoint", "all", "active"):
            raise UserError(f"unaligned must be 'disjoint', 'all' or 'active', got {self.unaligned!r}")
        if self.n_labeled is not None and self.n_labeled < 1:
            raise UserError(f"--labeled must be ≥ 1, got {self.n_labeled}")
        if not 0.0 < self.test_fraction < 1.0:
            raise UserError(f"test_fraction must be in (0, 1), got {self.test_fraction}")
        taf = self.test_aligned_fraction
        if taf is not None and taf != "train" and not (isinstance(taf, int | float) and 0.0 < taf <= 1.0):
            raise UserError(f"test_aligned_fraction must be in (0, 1] or 'train', got {taf!r}")
        if self.alignment not in ("given", "psi", "plain"):
            raise UserError(f"alignment must be given, psi or plain, got {self.alignment!r}")
        if not 0.0 <= self.unaligned_label_fraction <= 1.0:
            raise UserError(f"unaligned_label_fraction must be in [0, 1], got {self.unaligned_label_fraction}")
        if self.n_feature_parties > n_columns:
            raise UserError(f"{self.n_feature_parties} feature-holding parties but only {n_columns} columns to split")

    @property
    def n_feature_parties(self) -> int:
        """Parties that hold feature columns (all of them, or the passive ones behind a label-only host)."""
        return self.n_parties if self.active_features else self.n_parties - 1

    def resolve_columns(self, ds: Dataset) -> list[np.ndarray]:
        """Per-party column indices (validated); a label-only active party gets none."""
        out = self._resolve_feature_columns(ds)
        return out if self.active_features else [np.zeros(0, dtype=np.int64), *out]

    def _resolve_feature_columns(self, ds: Dataset) -> list[np.ndarray]:
        cols: Sequence[Sequence[int | str]] | str | None = self.columns  # a preset replaces it below
        if cols is None:
            return [np.asarray(c, dtype=np.int64) for c in default_columns(ds.n_columns, self.n_feature_parties)]
        if isinstance(cols, str):
            if cols not in ds.presets:
                avail = ", ".join(ds.presets) or "none"
                raise UserError(f"dataset {ds.name} has no field preset {cols!r}; available: {avail}")
            cols = ds.presets[cols]
        if len(cols) != self.n_feature_parties:
            if self.active_features:
                raise UserError(f"the field assignment lists {len(cols)} parties but --parties is {self.n_parties}")
            raise UserError(f"the field assignment lists {len(cols)} parties but there are {self.n_feature_parties} "
                            "feature-holding parties (the active party is label-only)")
        names = {n: i for i, n in enumerate(ds.column_names)}
        out = []
        for block in cols:
            idx = []
            for c in block:
                if isinstance(c, str) and not c.lstrip("-").isdigit():
                    if c not in names:
                        raise UserError(f"dataset {ds.name} has no column {c!r}")
                    idx.append(names[c])
                else:
                    idx.append(int(c))
            if not idx or any(not 0 <= i < ds.n_columns for i in idx):
                raise UserError(f"columns must be non-empty lists of indices in [0, {ds.n_columns}) or names")
            out.append(np.asarray(idx, dtype=np.int64))
        flat = np.concatenate(out)
        if len(set(flat.tolist())) != len(flat):
            raise UserError("the field assignment gives the same column to two parties")
        return out


def default_columns(n_columns: int, n_parties: int) -> list[list[int]]:
    """Equal contiguous blocks of columns, one per party."""
    return [list(map(int, block)) for block in np.array_split(np.arange(n_columns), n_parties)]
