"""The VFL data model: vertical feature blocks over per-party entity-ID sets.

:func:`make_partition` is a pure function of (dataset, spec, seed). Steps, all driven by one
``numpy.random.default_rng(seed)``:

1. test split: the dataset's predefined one, else a seeded ``test_fraction`` draw of rows that never
   reads the labels (a passive party sees which IDs are train and test, so a label-stratified
   split would be a channel from the labels to it that no ε accounts for); ``train_rows`` keeps
   the first N of the shuffled training rows (the rows axis: nested in N, test rows unchanged);
2. aligned set: ``aligned_fraction`` (or ``aligned_count``) of the shuffled training entities;
3. the unaligned remainder: ``disjoint`` splits it evenly, each entity to exactly one party;
   ``all`` gives every party all of it;
4. labels: ``n_labeled`` aligned entities (default: all aligned) are labeled at the active party,
   plus the active party's unaligned rows when ``active_labels_unaligned`` is set (all of them, or
   an ``unaligned_label_fraction`` share: the rest are unlabeled rows at the active party), plus
   the rows only passive parties hold when ``active_labels_all`` is set (Entity Augmentation's host
   knows every entity's label, although it holds features only for its own rows).
5. aligned test entities: a ``test_aligned_fraction`` draw of the test entities (default all);
   the others exist only at the active party.

``active_features: false`` makes the active party a label-only host (Entity Augmentation): it
holds no feature columns; the columns and the unaligned remainder are spread over the passive
parties only, and its ID set is every training entity it has a label for.

Aligned test entities are held by every party. Tabular features are preprocessed
per party on that party's own training rows (:mod:`securevfl.data.tabular`): numeric fields are
imputed and standardised, categorical fields get per-field vocabularies (or hash buckets).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from securevfl.configuration.options import PartitionSpec, default_columns  # noqa: F401  (their home: the light settings module)
from securevfl.data.dataset import DataConfig, Dataset
from securevfl.data.tabular import Gather, encode_party
from securevfl.errors import UserError
from securevfl.ids import difference
from securevfl.roles import party_names
from securevfl.storage import spill


class IdIndex:
    """Entity ID → row position. Dense array lookup for compact integer IDs (hot path: one lookup
    per party per step), pandas hash index otherwise (string IDs, sparse integers)."""

    def __init__(self, ids: np.ndarray) -> None:
        ids = np.asarray(ids)
        self._dense: np.ndarray | None = None
        if ids.dtype.kind in "iu" and len(ids) and ids.min() >= 0 and ids.max() < 4 * len(ids) + 1024:
            self._dense = spill.full(int(ids.max()) + 1, -1, np.int64)  # on disk when large (securevfl.storage.spill)
            for i in range(0, len(ids), spill.PIECE):
                self._dense[ids[i:i + spill.PIECE]] = np.arange(i, min(i + spill.PIECE, len(ids)))
        else:
            self._index = pd.Index(ids)

    def positions(self, ids: np.ndarray) -> np.ndarray:
        """Row positions of ``ids``; -1 where an ID is not held."""
        if self._dense is None:
            return self._index.get_indexer(ids)
        ids = np.asarray(ids)
        if ids.dtype.kind not in "iu":
            return np.full(len(ids), -1, dtype=np.int64)  # e.g. string IDs: none held
        if len(ids) and ids.min() >= 0 and ids.max() < len(self._dense):  # the per-step case: one gather
            return self._dense[ids]
        inside = (ids >= 0) & (ids < len(self._dense))
        out = np.full(len(ids), -1, dtype=np.int64)
        out[inside] = self._dense[ids[inside]]
        return out


@dataclass
class PartyData:
    """One party's local data: its own entity IDs and its own feature block. Nothing else."""

    name: str
    columns: np.ndarray
    train_ids: np.ndarray
    X_train: np.ndarray
    test_ids: np.ndarray
    X_test: np.ndarray
    # Active party only: labels it holds (ids ⊆ train_ids, except with ``active_labels_all``) and the test labels.
    label_ids: np.ndarray | None = None
    y_labels: np.ndarray | None = None
    y_test: np.ndarray | None = None
    # Tabular layout of X: n_numeric standardised columns, then one encoded id per categorical field.
    n_numeric: int = 0
    cardinalities: tuple[int, ...] = ()
    column_names: tuple[str, ...] = ()
    # Active party of a regression task: (mean, std) of its training labels; the head learns the
    # standardised target and predictions are mapped back (its own preprocessing state, like a scaler).
    label_scale: tuple[float, float] | None = None
    # File-based parties: how this party turns its file's rows into X (columns, fitted scaler and
    # vocabularies; :func:`securevfl.data.csvsource.encode_file_rows`), kept to score new rows later.
    preprocessing: dict | None = None
    _train_index: IdIndex = field(init=False, repr=False)
    _test_index: IdIndex = field(init=False, repr=False)
    _label_index: IdIndex | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._train_index = IdIndex(self.train_ids)
        self._test_index = IdIndex(self.test_ids)
        self._label_index = None if self.label_ids is None else IdIndex(self.label_ids)

    @property
    def feature_shape(self) -> tuple[int, ...]:
        return tuple(self.X_train.shape[1:])

    def rows(self, ids: np.ndarray, split: str = "train") -> np.ndarray:
        """Feature rows for ``ids`` (vectorised lookup; unknown IDs are a protocol error)."""
        index, X = (self._train_index, self.X_train) if split == "train" else (self._test_index, self.X_test)
        pos = index.positions(ids)
        if (pos < 0).any():
            missing = np.asarray(ids)[pos < 0][:3]
            raise KeyError(f"{self.name} holds no {split} rows for ids {list(missing)}")
        return X[pos]

    def test_labels(self, ids: np.ndarray) -> np.ndarray:
        assert self.y_test is not None  # asked of the active party only, whose data carries y_test
        return self.y_test[self._test_index.positions(ids)]

    def labels(self, ids: np.ndarray) -> np.ndarray:
        if self.label_ids is None:
            raise KeyError(f"{self.name} holds no labels")
        # label_ids, y_labels and _label_index are set together (__post_init__)
        assert self._label_index is not None and self.y_labels is not None
        pos = self._label_index.positions(ids)
        if (pos < 0).any():
            raise KeyError(f"{self.name} holds no labels for some requested ids")
        return self.y_labels[pos]


@dataclass
class Partition:
    dataset: str
    spec: PartitionSpec
    seed: int
    n_classes: int
    kind: str
    parties: list[PartyData]
    aligned_ids: np.ndarray
    labeled_ids: np.ndarray
    """Aligned entities labeled for supervised VFL."""
    test_aligned_ids: np.ndarray | None = None
    """Test entities every party holds (``None`` = all test entities)."""
    meta: dict = field(default_factory=dict)
    """Source-specific facts worth reporting (e.g. PSI bytes of a file-based source)."""
    truth_ids: np.ndarray | None = None
    truth_y: np.ndarray | None = None
    """Ground-truth labels of training entities, for the simulator only (attack evaluation and
    auxiliary-label draws); never handed to a party."""
    regression: bool = False
    """A continuous label (``n_classes`` is then 1: the head's one output)."""

    def true_labels(self, ids: np.ndarray) -> np.ndarray:
        """Ground truth for ``ids`` (training or test entities); -1 where unknown."""
        out = np.full(len(ids), -1, dtype=np.int64)
        act = self.active
        # the active party's data always carries its test labels and its labels; truth_y goes with truth_ids
        assert act.y_test is not None and act.label_ids is not None and act.y_labels is not None
        sources: list[tuple[np.ndarray, np.ndarray]] = [(act.test_ids, act.y_test)]
        if self.truth_ids is not None:
            assert self.truth_y is not None
            sources.append((self.truth_ids, self.truth_y))
        sources.append((act.label_ids, act.y_labels))
        for src_ids, src_y in sources:
            pos = IdIndex(src_ids).positions(ids)
            hit = (pos >= 0) & (out < 0)
            out[hit] = src_y[pos[hit]]
        return out

    @property
    def active(self) -> PartyData:
        return self.parties[0]

    @property
    def passives(self) -> list[PartyData]:
        return self.parties[1:]

    @property
    def task(self) -> str:
        if self.regression:
            return "regression"
        return "binary" if self.n_classes == 2 else "multiclass"

    def fingerprint(self) -> str:
        """Hash of every party's IDs, columns, features and labels: equal iff the split is equal."""
        h = hashlib.sha256()
        for p in self.parties:
            for a in (p.columns, p.train_ids, p.test_ids, p.X_train, p.X_test, p.label_ids, p.y_labels):
                if a is not None and a.dtype == object:  # string IDs: hash their text, not object pointers
                    h.update("\x00".join(map(str, a)).encode())
                elif a is not None:  # in pieces: the same bytes, no copy of a million-row block
                    for i in range(0, max(len(a), 1), spill.PIECE):
                        h.update(np.ascontiguousarray(a[i:i + spill.PIECE]).tobytes())
        return h.hexdigest()[:16]

    def summary(self) -> dict:
        return {
            "parties": len(self.parties),
            "aligned": int(len(self.aligned_ids)),
            "labeled": int(len(self.labeled_ids)),
            "train_rows": {p.name: int(len(p.train_ids)) for p in self.parties},
            "test_rows": int(len(self.active.test_ids)),
            "test_aligned_rows": int(len(self.active.test_ids if self.test_aligned_ids is None
                                         else self.test_aligned_ids)),
            "columns": {p.name: int(len(p.columns)) for p in self.parties},
            "spec": asdict(self.spec),
            "fingerprint": self.fingerprint(),
            **self.meta,
        }


def label_free_test_split(n_rows: int, frac: float, rng: np.random.Generator) -> np.ndarray:
    """Test mask: ``round(frac · n)`` rows drawn uniformly, whatever their labels (not stratified: the
    split is part of every passive party's view, so it must not depend on the labels)."""
    mask = np.zeros(n_rows, dtype=bool)
    mask[rng.permutation(n_rows)[: int(round(frac * n_rows))]] = True
    return mask


def make_partition(ds: Dataset, spec: PartitionSpec, seed: int, data: DataConfig | None = None) -> Partition:
    """The partition of ``ds`` under ``spec``: the stages of the module docstring, in that order, every
    draw from one ``default_rng(seed)`` (the order of the stages fixes every recorded split)."""
    spec.validate(ds.n_columns)
    data = data or DataConfig()
    columns = spec.resolve_columns(ds)
    rng = np.random.default_rng(seed)
    train_pos, test_pos = _split_test(ds, spec, rng)
    aligned_pos, rest = _split_aligned(ds, spec, train_pos)
    own_unaligned = _spread_unaligned(spec, rest)
    labeled_pos = _draw_labeled(spec, aligned_pos, rng)
    test_aligned_pos = _draw_test_aligned(spec, len(aligned_pos) / len(train_pos), test_pos, rng)
    parties = []
    for k, name in enumerate(party_names(spec.n_parties)):
        # a label-only host's ID set is every training entity it has a label for
        pos_k = np.concatenate([aligned_pos, rest if k == 0 and not spec.active_features else own_unaligned[k]])
        te_k = test_pos if k == 0 else test_aligned_pos
        X_tr, X_te, layout = _party_features(ds, columns[k], pos_k, te_k, data)
        labels = _active_labels(ds, spec, seed, labeled_pos, own_unaligned[0], rest, test_pos) if k == 0 else {}
        parties.append(PartyData(name, columns[k], ds.ids[pos_k], X_tr.astype(np.float32, copy=False), ds.ids[te_k],
                                 X_te.astype(np.float32, copy=False), **labels, **layout))
    return Partition(ds.name, spec, seed, ds.n_classes, ds.kind, parties, ds.ids[aligned_pos], ds.ids[labeled_pos],
                     test_aligned_ids=None if len(test_aligned_pos) == len(test_pos) else ds.ids[test_aligned_pos],
                     truth_ids=ds.ids[train_pos], truth_y=ds.y[train_pos])


# Stages of make_partition. Positions are row indices into the dataset; ``rng`` is the one stream.
def _split_test(ds: Dataset, spec: PartitionSpec, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Step 1: (shuffled training rows, test rows) — the dataset's own test split, else a label-free draw."""
    test_mask = ds.test_mask if ds.test_mask is not None else label_free_test_split(len(ds.y), spec.test_fraction, rng)
    train = rng.permutation(np.flatnonzero(~test_mask))
    if spec.train_rows is not None:  # a prefix of the shuffle: nested in N, and no draw is added
        if spec.train_rows > len(train):
            raise UserError(f"train_rows {spec.train_rows} exceeds the {len(train)} training rows of {ds.name}")
        train = train[: spec.train_rows]
    return train, np.flatnonzero(test_mask)


def _split_aligned(ds: Dataset, spec: PartitionSpec, train_pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Step 2: (aligned rows, unaligned remainder): the first ``aligned_count`` / ``aligned_fraction``
    of the shuffled training rows are held by every party."""
    n_train = len(train_pos)
    n_aligned = spec.aligned_count if spec.aligned_count is not None else int(round(spec.aligned_fraction * n_train))
    if n_aligned > n_train:
        raise UserError(f"aligned count {n_aligned} exceeds the {n_train} training rows of {ds.name}")
    if n_aligned < 1:
        raise UserError("the partition has no aligned rows; raise --aligned-fraction")
    return train_pos[:n_aligned], train_pos[n_aligned:]


def _spread_unaligned(spec: PartitionSpec, rest: np.ndarray) -> list[np.ndarray]:
    """Step 3: each party's own unaligned rows (``disjoint``, ``all`` or ``active``)."""
    K = spec.n_parties
    if not spec.active_features:  # label-only host: the guests share the unaligned rows; the host knows every ID
        guests = np.array_split(rest, K - 1) if spec.unaligned == "disjoint" else [rest] * (K - 1)
        return [rest[:0], *guests]
    if spec.unaligned == "disjoint":
        return np.array_split(rest, K)
    if spec.unaligned == "all":
        return [rest] * K
    return [rest] + [rest[:0]] * (K - 1)


def _draw_labeled(spec: PartitionSpec, aligned_pos: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Step 4a: the aligned rows labeled for supervised VFL (``n_labeled``, a seeded draw)."""
    n_aligned = len(aligned_pos)
    n_labeled = n_aligned if spec.n_labeled is None else spec.n_labeled
    if n_labeled > n_aligned:
        raise UserError(f"--labeled {n_labeled} exceeds the {n_aligned} aligned rows")
    return aligned_pos[rng.permutation(n_aligned)[:n_labeled]]


def _draw_test_aligned(spec: PartitionSpec, train_aligned_share: float, test_pos: np.ndarray,
                       rng: np.random.Generator) -> np.ndarray:
    """Step 5: the aligned test rows (a seeded draw, sorted): passive parties hold only those."""
    taf = spec.test_aligned_fraction
    taf = train_aligned_share if taf == "train" else (1.0 if taf is None else float(taf))
    return np.sort(rng.permutation(test_pos)[: max(1, int(round(taf * len(test_pos))))])


def _party_features(ds: Dataset, cols: np.ndarray, pos: np.ndarray, test_pos: np.ndarray,
                    data: DataConfig) -> tuple[np.ndarray, np.ndarray, dict]:
    """One party's feature block on its training and test rows, and its tabular layout (PartyData fields)."""
    layout: dict = {"column_names": tuple(ds.column_names[c] for c in cols)}
    if len(cols) == 0:  # label-only host: zero-width feature block
        X_tr, X_te = (np.zeros((len(p), *ds.X.shape[1:-1], 0), dtype=np.float32) for p in (pos, test_pos))
    elif ds.kind == "image":
        X_tr, X_te = ds.X[pos][..., cols], ds.X[test_pos][..., cols]
    else:  # party-local preprocessing fitted on its own training rows only
        num, cat = cols[cols < ds.n_numeric], cols[cols >= ds.n_numeric] - ds.n_numeric
        C = ds.categorical if ds.categorical is not None else np.zeros((len(ds.y), 0), dtype=np.int64)
        # gathered one column at a time (rows-then-columns copied every column of the table first:
        # ≈ 2 GB per party on a 10M-row Criteo file)
        X_tr, X_te, card = encode_party(Gather(ds.X, pos, num), Gather(ds.X, test_pos, num),
                                        Gather(C, pos, cat), Gather(C, test_pos, cat), log=ds.log_transform,
                                        min_freq=data.min_freq, hash_buckets=data.hash_buckets)
        layout.update(n_numeric=len(num), cardinalities=card,
                      column_names=tuple(ds.column_names[c] for c in [*num, *(cat + ds.n_numeric)]))
    return X_tr, X_te, layout


def _active_labels(ds: Dataset, spec: PartitionSpec, seed: int, labeled_pos: np.ndarray, own_unaligned: np.ndarray,
                   rest: np.ndarray, test_pos: np.ndarray) -> dict:
    """Step 4b: the active party's labels (PartyData fields): the labeled aligned rows, its own unaligned
    rows with ``active_labels_unaligned``, the passive-only rows with ``active_labels_all``."""
    parts = [labeled_pos]
    if spec.active_labels_unaligned:
        own = own_unaligned
        if spec.unaligned_label_fraction < 1.0:  # own generator: leaves every other draw unchanged
            keep = np.random.default_rng([seed, 17]).permutation(len(own))
            own = own[np.sort(keep[: int(round(spec.unaligned_label_fraction * len(own)))])]
        parts.append(own)
    if spec.active_labels_all:
        parts.append(difference(rest, own_unaligned))
    lab_pos = np.concatenate(parts)
    return {"label_ids": ds.ids[lab_pos], "y_labels": ds.y[lab_pos], "y_test": ds.y[test_pos]}
