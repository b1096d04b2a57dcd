"""The ``csv`` source: the data a real user brings — one CSV or Parquet file per party, each with
an entity-ID column; labels only in the active party's file (the first file).

Each party's ID set comes from its own file. The aligned set is computed by the mutual
Diffie–Hellman PSI (:mod:`securevfl.data.psi`) between the active party and every passive party
through a setup channel whose bytes are reported (``partition.psi_bytes``); ``--alignment plain``
intersects in the clear. Test rows are a seeded ``test_fraction`` draw from the aligned, labeled
entities; the rest of the aligned set is for training. The spec's ``aligned_fraction``/``unaligned``
do not apply: the files define who holds what.

Each file is read in blocks (:mod:`securevfl.data.blocks`), and a large party's arrays live on disk
(:mod:`securevfl.storage.spill`): a party's memory does not grow with its rows (numeric IDs; docs/deployment.md).

What the reader decides, and tells (``partition.ingest`` in the run JSON, and a summary on stderr):
- IDs are exact strings (whitespace stripped) unless ``numeric_ids`` asks for numeric matching, so
  "00133" and "133" are different entities. Each party's rows read, matched (in the aligned set)
  and unmatched are reported.
- Feature columns are every column but the ID, the label and ``drop_columns``. Cells "", "NA",
  "N/A", "NaN", "null", "None" and "?" are missing values (counted per column; numeric ones are
  imputed with the training mean). A column whose cells are numbers is numeric; a column of text is
  categorical; a column that is mostly numbers with some text is an error naming the file, column,
  line and value (``categorical`` / ``numeric`` override that). Numeric columns are standardised,
  categorical ones encoded, both fitted per party on training rows.
- The label is classes (integer codes or text class names) or, with ``task: regression`` or a
  fractional label under ``task: auto`` (said on stderr), a continuous target, standardised on the
  active party's training labels. A many-valued (more than ``MAX_CLASSES`` distinct values) integer
  label is refused unless ``task: regression`` says so.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from securevfl.channel import InMemoryChannel, MessageKind
from securevfl.configuration.limits import brief
from securevfl.data import psi
from securevfl.data.blocks import (  # noqa: F401
    MAX_CLASSES,
    MISSING,
    IdReader,
    PartyTable,
    category_codes,
    numbers,
    read_labels,
    read_party,
    read_table,
)
from securevfl.data.dataset import DataConfig
from securevfl.data.partition import IdIndex, Partition, PartitionSpec, PartyData, party_names
from securevfl.data.registry import DATASETS, DatasetEntry
from securevfl.data.tabular import encode_columns, encode_party, encode_rows
from securevfl.errors import UserError
from securevfl.ids import difference, member, sorted_copy
from securevfl.storage import spill


def _locate(cfg: DataConfig) -> str:
    if not cfg.party_files:
        raise UserError("the csv source needs --party-file FILE for every party (active party first)")
    return ", ".join(cfg.party_files)


def align_ids(id_sets: list[np.ndarray], mode: str) -> tuple[np.ndarray, int]:
    ch = InMemoryChannel()
    names = party_names(len(id_sets))
    active = ch.endpoint(names[0])
    if mode == "plain":  # ID lists in the clear, through the same counted setup channel
        for name, ids in zip(names[1:], id_sets[1:], strict=True):
            ch.endpoint(name).send_ids(names[0], MessageKind.ALIGNMENT, ids)
        received = [active.recv_ids(name, MessageKind.ALIGNMENT) for name in names[1:]]
        return psi.plain_intersection([id_sets[0], *received]), ch.stats.total_bytes
    per_party = [psi.mutual_psi_local(active, ch.endpoint(name), id_sets[0], ids)[0]
                 for name, ids in zip(names[1:], id_sets[1:], strict=True)]
    return psi.plain_intersection([id_sets[0], *per_party]), ch.stats.total_bytes


@dataclasses.dataclass(frozen=True)
class Split:
    """Which aligned entities are for testing, training, and training with a label."""

    test_ids: np.ndarray
    train_aligned: np.ndarray
    labeled_ids: np.ndarray  # the aligned labeled training rows used with their label


@dataclasses.dataclass(frozen=True)
class ActiveLabels:
    """The active party's label column: class index per row (−1 unlabeled), which rows have one, and
    whether its labels on rows outside the aligned set are used (``active_labels_unaligned``)."""

    y: np.ndarray
    has_label: np.ndarray
    on_unaligned: bool | None  # None: the spec left it unset (read as false)


def read_file(cfg: DataConfig, path: Path, id_col: str, active: bool, features: bool = True) -> PartyTable:
    """One party's file in blocks (:func:`securevfl.data.blocks.read_party`): the active party's with its
    label column, a passive party's refused if it has one."""
    return read_party(path, id_col, label_col=cfg.label_column if active else None, features=features,
                      drop=[cfg.label_column, *cfg.drop_columns], categorical=list(cfg.categorical),
                      numeric=list(cfg.numeric), numeric_ids=cfg.numeric_ids, hashed_ids=cfg.hashed_ids, task=cfg.task,
                      forbid=None if active else cfg.label_column)


def csv_partition(cfg: DataConfig, spec: PartitionSpec, seed: int) -> Partition:
    """Read one file per party, align their IDs (PSI unless ``alignment: plain``), split the aligned
    labeled rows into train/test and encode every party's features on its own training rows."""
    _check_request(cfg, spec)
    check_flags(cfg)
    paths = [Path(p) for p in cfg.party_files]
    id_cols = _id_columns(cfg, len(paths))
    tables = [read_file(cfg, p, col, k == 0, features=k > 0 or spec.active_features)
              for k, (p, col) in enumerate(zip(paths, id_cols, strict=True))]
    check_named(cfg, [t.columns for t in tables])
    ids = [t.ids for t in tables]
    aligned, psi_bytes = align_ids(ids, "plain" if spec.alignment == "plain" else "psi")
    if len(aligned) == 0:
        raise UserError(f"the party files share no IDs (columns {', '.join(dict.fromkeys(id_cols))}); IDs are "
                        "compared as exact strings unless numeric_ids is set")
    lab = tables[0].labels
    assert lab is not None  # the active party's table is read with its label column
    y_all, has_label, classes = lab.y, lab.has_label, lab.classes
    regression = not classes
    split = split_rows(aligned, ids[0], has_label, spec, seed)
    names = party_names(len(paths))
    parties, ingest = [], []
    for k, table in enumerate(tables):
        labels = ActiveLabels(y_all, has_label, spec.active_labels_unaligned) if k == 0 else None
        party, info = party_data(names[k], table, id_cols[k], aligned, split, cfg, labels,
                                 features=k > 0 or spec.active_features)
        parties.append(party)
        ingest.append(info)
    labeled_rows = spill.where(has_label)
    # the files are aligned here whatever the spec says ("given" means nothing for files): record what ran
    spec = dataclasses.replace(spec, alignment="plain" if spec.alignment == "plain" else "psi")
    part = Partition("csv", spec, seed, 1 if regression else len(classes), "tabular", parties, split.train_aligned,
                     split.labeled_ids, truth_ids=spill.take(ids[0], labeled_rows),
                     truth_y=spill.take(y_all, labeled_rows), regression=regression)
    _print_ingest(names, ingest)  # tell the user what was read, before training starts
    part.meta = {"aligned_by": spec.alignment, "psi_bytes": psi_bytes,
                 "files": [str(p) for p in paths], "classes": [str(c) for c in classes], "ingest": ingest}
    if regression:
        part.meta["task"] = "regression"
    return part


def _check_request(cfg: DataConfig, spec: PartitionSpec) -> None:
    _locate(cfg)
    if len(cfg.party_files) < 2:
        raise UserError("the csv source needs at least two --party-file files (active party first)")
    if spec.columns is not None:
        raise UserError("the csv source takes each party's columns from its file; drop --fields/columns")


def _id_columns(cfg: DataConfig, n_files: int) -> list[str]:
    """The ID column of each file: ``--id-column`` once for all files or once per file."""
    if cfg.id_columns and len(cfg.id_columns) != n_files:
        raise UserError(f"--id-column given {len(cfg.id_columns)} times for {n_files} party files: give it once "
                        "(the same name in every file) or once per file, in file order")
    return list(cfg.id_columns) or [cfg.id_column] * n_files


def check_flags(cfg: DataConfig) -> None:
    """The label column is no feature: no flag may name it so; IDs are numbers or hashed strings, not both."""
    if cfg.hashed_ids and cfg.numeric_ids:
        raise UserError("--hashed-ids is for string IDs; with --numeric-ids the IDs are integers already (give one)")
    if cfg.label_column in cfg.drop_columns:
        raise UserError(f"--drop-columns names the label column {cfg.label_column!r}: the label is never a feature; "
                        "to train on another label, use --label-column")
    for flag, cols in (("--categorical", cfg.categorical), ("--numeric", cfg.numeric)):
        if cfg.label_column in cols:
            raise UserError(f"{flag} names the label column {cfg.label_column!r}, which is not a feature")


def named_held(cfg: DataConfig, columns: list[str]) -> list[str]:
    """The columns named by ``drop_columns``, ``categorical`` or ``numeric`` that ``columns`` (one
    party's file) holds: what a deployed party reports, so that a name no party holds is refused."""
    have = {str(c) for c in columns}
    return sorted(c for c in {*cfg.drop_columns, *cfg.categorical, *cfg.numeric} if c in have)


def check_named(cfg: DataConfig, columns: list[list[str]]) -> None:
    """Every column named on the command line is in some party file (``columns``: each file's)."""
    named = set(cfg.drop_columns) | set(cfg.categorical) | set(cfg.numeric)
    unknown = named - {str(c) for cols in columns for c in cols}
    if unknown:
        raise UserError(f"column {sorted(unknown)[0]!r} (--drop-columns/--categorical/--numeric) is in no party file")


def split_rows(aligned: np.ndarray, active_ids: np.ndarray, has_label: np.ndarray, spec: PartitionSpec,
           seed: int) -> Split:
    """A seeded ``test_fraction`` of the aligned labeled entities is the test set; the first
    ``n_labeled`` of the rest (all by default) are the labeled training rows."""
    if spec.train_rows is not None:
        raise UserError("train_rows subsamples one table's training rows; party files are used whole")
    labeled = has_label[_positions(active_ids, aligned)]
    aligned_labeled = spill.take(aligned, spill.where(labeled))
    rng = np.random.default_rng(seed)
    perm = spill.take(aligned_labeled, spill.arange(len(aligned_labeled)))  # rng.permutation's copy, shuffled
    rng.shuffle(perm)  # in place (on disk when large): the draws of rng.permutation(aligned_labeled)
    n_test = int(round(spec.test_fraction * len(perm)))
    if n_test < 1 or n_test >= len(perm):
        raise UserError(f"only {len(perm)} aligned labeled rows: too few for a test split")
    test_ids = sorted_copy(perm[:n_test])
    candidates = perm[n_test:]
    n_labeled = len(candidates) if spec.n_labeled is None else spec.n_labeled
    if n_labeled > len(candidates):
        raise UserError(f"--labeled {n_labeled} exceeds the {len(candidates)} aligned labeled training rows")
    train_aligned = spill.take(aligned, spill.where(~member(aligned, test_ids)))
    return Split(test_ids, train_aligned, candidates[:n_labeled])


def party_data(name: str, table: PartyTable, id_col: str, aligned: np.ndarray, split: Split, cfg: DataConfig,
               labels: ActiveLabels | None, features: bool = True) -> tuple[PartyData, dict]:
    """One party's encoded rows (with ``labels``: the active party's, labeled) and what was read;
    ``features`` False: a label-only active party (``partition.active_features: false``), whose file
    needs the ID and label columns only (any other column is read as ignored). A table on disk
    (:attr:`PartyTable.spilled`) is encoded piece by piece into arrays on disk."""
    own, path = table.ids, table.path
    tr = spill.where(~member(own, split.test_ids))  # training rows in file order
    train_ids = spill.take(own, tr)
    te = _positions(own, split.test_ids)
    drop = [id_col, cfg.label_column, *cfg.drop_columns]
    if not features:
        drop += [c for c in table.columns if c not in drop]
    if features and not table.num_cols + table.cat_cols:
        hint = ("; for a label-only active party (Entity Augmentation's host) set partition.active_features: false "
                "in a --config file (docs/configuration.md)") if labels is not None else ""
        raise UserError(f"party file {path}: no feature columns besides the ID{' and the label' if hint else ''}{hint}")
    matched = int(member(own, aligned).sum())
    info = {"file": str(path), "id_column": id_col, "rows_read": table.n_rows,
            "rows_matched": matched, "rows_unmatched": table.n_rows - matched,
            "numeric_columns": list(table.num_cols), "categorical_columns": list(table.cat_cols),
            "dropped_columns": [c for c in cfg.drop_columns if c in table.columns],
            "missing_cells": table.missing}
    if labels is not None:
        info["unlabeled_rows"] = int(len(labels.has_label) - np.count_nonzero(labels.has_label))
    fitted: dict = {}
    if table.spilled:
        X_tr, X_te, card = encode_columns(table.num, table.cat, tr, te, log=False, min_freq=cfg.min_freq,
                                          hash_buckets=cfg.hash_buckets, fitted=fitted,
                                          empty=lambda shape: spill.empty(shape, np.float32))
    else:  # one block, as the whole-file reader encoded it (the same bits)
        num = np.column_stack(table.num) if table.num else np.zeros((table.n_rows, 0))
        cat = np.column_stack(table.cat) if table.cat else np.zeros((table.n_rows, 0), dtype=np.int64)
        X_tr, X_te, card = encode_party(num[tr], num[te], cat[tr], cat[te], log=False, min_freq=cfg.min_freq,
                                        hash_buckets=cfg.hash_buckets, fitted=fitted)
    prep = {"id_column": id_col, "numeric_columns": list(table.num_cols),
            "categorical_columns": list(table.cat_cols),
            "ignored_columns": [str(c) for c in drop[1:] if c in table.columns], **fitted}
    label_fields: dict[str, Any] = {}
    if labels is not None:
        lab = split.labeled_ids
        if labels.on_unaligned:
            lab = np.concatenate([lab, difference(train_ids[labels.has_label[tr]], split.train_aligned)])
        y_lab = spill.take(labels.y, _positions(own, lab))
        label_fields = {"label_ids": lab, "y_labels": y_lab, "y_test": spill.take(labels.y, te)}
        if labels.y.dtype.kind == "f":  # regression: the active party's label scaler, on its training labels
            y_lab = y_lab.astype(np.float32)
            label_fields.update(y_labels=y_lab, y_test=labels.y[te].astype(np.float32),
                                label_scale=(float(y_lab.mean()), float(y_lab.std()) or 1.0))
    party = PartyData(name, np.arange(X_tr.shape[1]), train_ids, X_tr, split.test_ids, X_te, **label_fields,
                      n_numeric=len(table.num_cols), cardinalities=card,
                      column_names=tuple(table.num_cols + table.cat_cols), preprocessing=prep)
    return party, info


def _positions(own: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Where each of ``ids`` is among ``own`` (all are there), piece by piece into a spilled array."""
    index = IdIndex(own)
    out = spill.empty(len(ids), np.int64)
    for i in range(0, len(ids), spill.PIECE):
        out[i:i + spill.PIECE] = index.positions(np.asarray(ids[i:i + spill.PIECE]))
    return out


def _print_ingest(names: list[str], ingest: list[dict]) -> None:
    for k, info in enumerate(ingest):
        miss = sum(info["missing_cells"].values())
        extra = f", {info['unlabeled_rows']} unlabeled" if k == 0 else ""
        print(f"{names[k]}: {info['file']}: {info['rows_read']} rows read, {info['rows_matched']} matched, "
              f"{info['rows_unmatched']} unmatched{extra}; {len(info['numeric_columns'])} numeric + "
              f"{len(info['categorical_columns'])} categorical columns; {miss} missing cells", file=sys.stderr)


def read_party_file(path: str | Path) -> pd.DataFrame:
    """One party's file, read as training reads it (CSV cells as text; Parquet as stored)."""
    return read_table(Path(path))


def encode_file_rows(df: pd.DataFrame, path: str | Path, prep: dict, numeric_ids: bool = False,
                     hashed_ids: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """A party's new rows (a frame of its file) through the preprocessing it fitted in training
    (``PartyData.preprocessing``): (IDs, X). The file must hold exactly the columns training used
    (extra columns training ignored, e.g. the label, may stay).

    Raises:
        UserError: missing or unexpected columns, or text in a numeric column (one line)."""
    path = Path(path)
    need = [prep["id_column"], *prep["numeric_columns"], *prep["categorical_columns"]]
    have = [str(c) for c in df.columns]
    missing = [c for c in need if c not in have]
    extra = [c for c in have if c not in need and c not in prep["ignored_columns"]]
    if missing or extra:
        what = "; ".join(s for s in (f"missing {', '.join(map(repr, missing))}" if missing else "",
                                     f"unexpected {', '.join(map(repr, extra))}" if extra else "") if s)
        raise UserError(f"party file {path}: columns do not match the saved model's manifest ({what})")
    reader = IdReader(path, prep["id_column"], numeric_ids, hashed_ids)
    reader.add(df[prep["id_column"]])
    ids = reader.finish()
    num_values = []
    for c in prep["numeric_columns"]:
        parsed, bad = numbers(df[c])
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise UserError(f"party file {path}: column {c!r}: line {i + 2}: value {df[c].iloc[i]!r} is not a number "
                            "(the saved model reads this column as numeric)")
        inf = np.flatnonzero(np.isinf(parsed))
        if len(inf):  # refused as training refuses it: no model output on such a row means anything
            i = int(inf[0])
            raise UserError(f"party file {path}: column {c!r}: line {i + 2}: value {brief(df[c].iloc[i])} is not a "
                            "finite number (non-finite input); fix the file or leave the cell empty")
        num_values.append(parsed)
    num = np.column_stack(num_values) if num_values else np.zeros((len(df), 0))
    cat = [category_codes(df[c]) for c in prep["categorical_columns"]]
    return ids, encode_rows(num, np.column_stack(cat) if cat else np.zeros((len(df), 0), dtype=np.int64), prep)


DATASETS.register(DatasetEntry("csv", "your own data: one CSV/Parquet file per party (--party-file), PSI-aligned",
                               None, _locate, partition=csv_partition))
