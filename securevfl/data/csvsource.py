"""The ``csv`` source: the data a real user brings — one CSV or Parquet file per party, each with
an entity-ID column; labels only in the active party's file (the first file).

Each party's ID set comes from its own file. The aligned set is computed by the mutual
Diffie–Hellman PSI (:mod:`securevfl.data.psi`) between the active party and every passive party
through a setup channel whose bytes are reported (``partition.psi_bytes``); ``--alignment plain``
intersects in the clear. Test rows are a seeded ``test_fraction`` draw from the aligned, labeled
entities; the rest of the aligned set is for training. The spec's ``aligned_fraction``/``unaligned``
do not apply: the files define who holds what.

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

import csv
import dataclasses
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from securevfl.channel import InMemoryChannel, MessageKind
from securevfl.data import psi
from securevfl.data.dataset import DataConfig
from securevfl.data.partition import Partition, PartitionSpec, PartyData, party_names
from securevfl.data.registry import DATASETS, DatasetEntry
from securevfl.data.tabular import encode_party, encode_rows, hash_values
from securevfl.errors import UserError
from securevfl.ids import difference, member
from securevfl.limits import brief, env_limit


def read_table(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise UserError(f"party file {path}: no such file")
    # bounded before reading: a party file is read whole into memory (the streaming readers serve Criteo/Avazu)
    max_bytes = env_limit("SECUREVFL_MAX_CSV_BYTES", 4 << 30)
    if path.stat().st_size > max_bytes:
        raise UserError(f"party file {path}: larger than {max_bytes} bytes (SECUREVFL_MAX_CSV_BYTES)")
    max_columns = env_limit("SECUREVFL_MAX_CSV_COLUMNS", 10_000)
    try:
        with open(path, "rb") as f:
            head = f.readline(1 << 20)  # the header line (a first megabyte of it at most)
    except OSError as e:
        raise UserError(f"party file {path}: cannot read ({e.strerror or e})") from None
    if path.suffix.lower() not in (".parquet", ".pq") and head.count(b",") + 1 > max_columns:
        raise UserError(f"party file {path}: more than {max_columns} columns (SECUREVFL_MAX_CSV_COLUMNS)")
    parquet = path.suffix.lower() in (".parquet", ".pq")
    try:
        names = _parquet_schema(path) if parquet else _csv_header(head)
        _refuse_duplicate_names(path, names)
        if parquet:
            return pd.read_parquet(path)
        return pd.read_csv(path, dtype=str, keep_default_na=False)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - any reader failure is the user's file
        raise UserError(f"party file {path}: cannot read ({str(e).splitlines()[0]})") from None


def _csv_header(head: bytes) -> list[str]:
    """The header's names as written (pandas renames a repeated ``y`` to ``y.1``, so it is read here)."""
    line = head.decode("utf-8-sig", errors="replace").rstrip("\r\n")
    return [n.strip() for n in next(csv.reader([line]), [])]


def _parquet_schema(path: Path) -> list[str]:
    """The columns' names, after refusing types no party can encode (lists, structs, maps, bytes)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pq.read_schema(path)
    for field in schema:
        t = field.type
        if pa.types.is_nested(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t) \
                or pa.types.is_fixed_size_binary(t):
            raise UserError(f"party file {path}: column {field.name!r} has type {t}, which is not supported "
                            "(a column holds numbers, text or categories); flatten it or drop it from the file")
    return [str(n) for n in schema.names]


def _refuse_duplicate_names(path: Path, names: list[str]) -> None:
    """A repeated column name is refused: pandas would keep both under new names, so a second label or
    ID column would silently become a feature (a label leak)."""
    seen: dict[str, int] = {}
    for i, n in enumerate(names):
        if n in seen:
            raise UserError(f"party file {path}: column name {n!r} appears more than once (columns {seen[n] + 1} and "
                            f"{i + 1}); rename or remove the copy")
        seen[n] = i


def _index_as_column(df: pd.DataFrame, path: Path, id_col: str) -> pd.DataFrame:
    """A header one name shorter than its rows (``DataFrame.to_csv`` with an unnamed index): pandas
    reads the first column as the index, and so do we. The index is the row's key, so it becomes the ID
    column when the header has none; otherwise it is dropped (row labels are no feature)."""
    if isinstance(df.index, pd.RangeIndex):
        return df
    if df.index.nlevels > 1:
        raise UserError(f"party file {path}: the header has {df.index.nlevels} names fewer than the rows")
    use = id_col not in df.columns
    print(f"party file {path}: the header has one name fewer than the rows: reading the first column as the "
          f"index, as pandas does{f', used as the ID column {id_col!r}' if use else ' (not a feature)'}",
          file=sys.stderr)
    if use:
        df = df.rename_axis(id_col).reset_index()
    return df.reset_index(drop=True)


MISSING = {"", "na", "n/a", "nan", "null", "none", "?"}
MAX_CLASSES = 100


def _missing(values: pd.Series) -> np.ndarray:
    # a typed null (Parquet's NaN/None) stays null under pandas ≥ 3's astype(str): test it too
    return (values.isna() | values.astype(str).str.strip().str.lower().isin(MISSING)).to_numpy(dtype=bool)


def read_ids(df: pd.DataFrame, path: Path, column: str, numeric: bool) -> np.ndarray:
    if column not in df.columns:
        raise UserError(f"party file {path}: no ID column {column!r} (columns: {', '.join(map(str, df.columns))}; "
                        "use --id-column, once per party file if they differ)")
    raw = df[column]
    empty = raw.isna() | (raw.astype(str).str.strip() == "")
    if empty.any():
        i = int(np.flatnonzero(empty.to_numpy())[0])
        raise UserError(f"party file {path}: line {i + 2}: missing ID")
    ids = raw.astype(str).str.strip().to_numpy(dtype=object)
    if numeric:
        as_num = pd.to_numeric(pd.Series(ids), errors="coerce")
        if as_num.isna().any() or (as_num != as_num.round()).any():
            bad = int(np.flatnonzero((as_num.isna() | (as_num != as_num.round())).to_numpy())[0])
            raise UserError(f"party file {path}: line {bad + 2}: ID {ids[bad]!r} is not an integer (numeric_ids)")
        ids = as_num.to_numpy().astype(np.int64)
    dup = pd.Series(ids).duplicated(keep=False).to_numpy()
    if dup.any():
        first = ids[dup][0]
        lines = (np.flatnonzero(pd.Series(ids).to_numpy() == first) + 2)[:3].tolist()
        raise UserError(f"party file {path}: duplicate ID {str(first)!r} on lines {lines} "
                        f"({int(dup.sum())} rows have duplicated IDs)")
    return ids


def _features(df: pd.DataFrame, path: Path, drop: list[str], cfg: DataConfig
              ) -> tuple[np.ndarray, np.ndarray, list[str], list[str], dict[str, int]]:
    """Numeric block, categorical codes, their column names, and missing cells per column."""
    num_cols, cat_cols, missing = [], [], {}
    num_values = []
    for c in df.columns:
        if c in drop:
            continue
        miss = _missing(df[c])
        if miss.any():
            missing[str(c)] = int(miss.sum())
        parsed, not_num = _numbers(df[c])
        present = int((~miss).sum())
        if c in cfg.categorical:
            cat_cols.append(c)
        elif c in cfg.numeric or not not_num.any():
            inf = np.flatnonzero(np.isinf(np.asarray(parsed, dtype=np.float64)))
            if len(inf):  # 1e999, inf: no model can take it (a missing value is written empty or nan)
                i = int(inf[0])
                raise UserError(f"party file {path}: column {c!r}: line {i + 2}: value {brief(df[c].iloc[i])} is not "
                                "a finite number (non-finite input); fix the file or leave the cell empty")
            num_cols.append(c)
            num_values.append(parsed)
            if _looks_like_row_counter(num_values[-1]):
                print(f"warning: party file {path}: column {c!r} looks like a row counter (unique consecutive "
                      f"integers); it is used as a feature — pass --drop-columns {c} if it is not one", file=sys.stderr)
        elif not_num.sum() <= present / 2:
            i = int(np.flatnonzero(not_num)[0])
            raise UserError(f"party file {path}: column {c!r}: line {i + 2}: value {df[c].iloc[i]!r} is not a number "
                            f"({present - int(not_num.sum())} of {present} cells are); fix the file, or pass "
                            f"--categorical {c} or --numeric {c} (non-numbers become missing)")
        else:
            cat_cols.append(c)
    num = np.column_stack(num_values) if num_cols else np.zeros((len(df), 0))
    return num, _category_codes(df, cat_cols), num_cols, cat_cols, missing


def _numbers(values: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """A column's cells as float64 (NaN where missing or not a number) and where a present cell is not a number."""
    miss = _missing(values)
    parsed = pd.to_numeric(values.where(~miss), errors="coerce")
    return parsed.to_numpy(np.float64), ~miss & parsed.isna().to_numpy()


def _category_codes(df: pd.DataFrame, columns: list) -> np.ndarray:
    """The raw-value hashes of categorical ``columns`` (a missing cell hashes as "")."""
    if not columns:
        return np.zeros((len(df), 0), dtype=np.int64)
    return np.column_stack([hash_values(np.where(_missing(df[c]), "", df[c].astype(str).to_numpy())) for c in columns])


def _looks_like_row_counter(values: np.ndarray) -> bool:
    v = values[~np.isnan(values)]
    return len(v) > 10 and bool((v == np.round(v)).all()) and len(np.unique(v)) == len(v) \
        and v.max() - v.min() + 1 == len(v)


def read_labels(raw: pd.Series, path: Path, column: str, task: str = "classification"
            ) -> tuple[np.ndarray, np.ndarray, list]:
    """Class index per row (−1 where unlabeled), the labeled mask and the class values; for a
    regression (``task``, or ``auto`` with a fractional label) the float target (NaN where unlabeled)
    and no classes."""
    miss = _missing(raw)
    values = raw.astype(str).str.strip().where(~miss, "")
    parsed = pd.to_numeric(values.where(~miss), errors="coerce").to_numpy(np.float64)
    numeric = bool(np.isfinite(parsed[~miss]).all())
    _check_label_cells(values, miss, parsed, path, column)
    if task == "regression" and not numeric:
        bad = values[~miss][~np.isfinite(parsed[~miss])].iloc[0]
        raise UserError(f"party file {path}: label column {column!r}: value {bad!r} is not a number "
                        "(--task regression)")
    # numeric codes while exact as float64 and int64 (a code ≥ 2⁵³ is read as text: 2⁶³ would wrap),
    # or a continuous target
    if numeric and (task == "regression" or (np.abs(parsed[~miss]) < 2.0 ** 53).all()):
        present = parsed[~miss]
        fractional = bool((present != np.round(present)).any())
        if task == "auto" and fractional:
            print(f"note: label column {column!r} has fractional values: training a regression (MSE; R² as utility); "
                  "--task classification refuses such a label, --task regression makes this explicit", file=sys.stderr)
        if task == "regression" or (task == "auto" and fractional):
            if len(np.unique(present)) < 2:  # R² is undefined and nothing can be learnt
                raise UserError(f"party file {path}: label column {column!r} has one value ({present[0]:g}) on every "
                                "labeled row: a regression needs a target that varies")
            return np.where(miss, np.nan, parsed).astype(np.float64), ~miss, []
        if fractional:
            x = present[present != np.round(present)][0]
            raise UserError(f"party file {path}: label column {column!r} has fractional values (e.g. {x:g}): it looks "
                            "continuous; use --task regression, or bin it into classes")
        keys = np.where(miss, np.nan, parsed)
        classes = np.unique(present).astype(np.int64).tolist()
    else:
        # numpy's stubs take where(cond, None, y) for the one-argument form (None is an object scalar here)
        keys = np.where(miss, None, values.to_numpy(dtype=object))  # type: ignore[assignment]
        classes = sorted(set(values[~miss]))
    if len(classes) > MAX_CLASSES:
        raise UserError(f"party file {path}: label column {column!r} has {len(classes)} distinct values (more than "
                        f"{MAX_CLASSES}): it looks continuous or like an ID; --task regression if it is a target")
    if len(classes) < 2:
        raise UserError(f"party file {path}: label column {column!r} needs at least two classes")
    index = {c: i for i, c in enumerate(classes)}
    y = np.array([-1 if m else index[int(k) if isinstance(k, float) else k] for k, m in zip(keys, miss, strict=True)],
                 dtype=np.int64)
    return y, ~miss, classes


def _check_label_cells(values: pd.Series, miss: np.ndarray, parsed: np.ndarray, path: Path, column: str) -> None:
    """A label column holds numbers or text, not both, and no number that is not finite: ``inf`` or a
    stray word in a 0/1 column would otherwise become a class of its own."""
    present = ~miss
    is_num = present & ~np.isnan(parsed)
    bad_inf = np.flatnonzero(is_num & ~np.isfinite(parsed))
    if len(bad_inf):
        i = int(bad_inf[0])
        raise UserError(f"party file {path}: label column {column!r}: line {i + 2}: value {values.iloc[i]!r} is not a "
                        "finite number; fix the cell or leave it empty (unlabeled)")
    text = present & np.isnan(parsed)
    if is_num.any() and text.any():
        i = int(np.flatnonzero(text)[0])
        raise UserError(f"party file {path}: label column {column!r}: line {i + 2}: value {values.iloc[i]!r} is text "
                        f"among numbers ({int(is_num.sum())} of {int(present.sum())} labels are numbers); fix the cell "
                        "or leave it empty (unlabeled)")


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


def csv_partition(cfg: DataConfig, spec: PartitionSpec, seed: int) -> Partition:
    """Read one file per party, align their IDs (PSI unless ``alignment: plain``), split the aligned
    labeled rows into train/test and encode every party's features on its own training rows."""
    _check_request(cfg, spec)
    paths = [Path(p) for p in cfg.party_files]
    id_cols = _id_columns(cfg, len(paths))
    frames = [_index_as_column(read_table(p), p, col) for p, col in zip(paths, id_cols, strict=True)]
    _check_columns(cfg, paths, frames)
    ids = [read_ids(df, p, col, cfg.numeric_ids) for df, p, col in zip(frames, paths, id_cols, strict=True)]
    aligned, psi_bytes = align_ids(ids, "plain" if spec.alignment == "plain" else "psi")
    if len(aligned) == 0:
        raise UserError(f"the party files share no IDs (columns {', '.join(dict.fromkeys(id_cols))}); IDs are "
                        "compared as exact strings unless numeric_ids is set")
    y_all, has_label, classes = read_labels(frames[0][cfg.label_column], paths[0], cfg.label_column, cfg.task)
    regression = not classes
    split = split_rows(aligned, ids[0], has_label, spec, seed)
    names = party_names(len(paths))
    parties, ingest = [], []
    for k, (df, own) in enumerate(zip(frames, ids, strict=True)):
        labels = ActiveLabels(y_all, has_label, spec.active_labels_unaligned) if k == 0 else None
        party, info = party_data(names[k], df, paths[k], id_cols[k], own, aligned, split, cfg, labels,
                                 features=k > 0 or spec.active_features)
        parties.append(party)
        ingest.append(info)
    # the files are aligned here whatever the spec says ("given" means nothing for files): record what ran
    spec = dataclasses.replace(spec, alignment="plain" if spec.alignment == "plain" else "psi")
    part = Partition("csv", spec, seed, 1 if regression else len(classes), "tabular", parties, split.train_aligned,
                     split.labeled_ids, truth_ids=ids[0][has_label], truth_y=y_all[has_label], regression=regression)
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


def _check_columns(cfg: DataConfig, paths: list[Path], frames: list[pd.DataFrame]) -> None:
    """The label column is in the active party's file only; every column named on the command line exists."""
    if cfg.label_column not in frames[0].columns:
        raise UserError(f"party file {paths[0]} (active party): no label column {cfg.label_column!r} (columns: "
                        f"{', '.join(map(str, frames[0].columns))}; use --label-column)")
    for path, df in zip(paths[1:], frames[1:], strict=True):
        if cfg.label_column in df.columns:
            raise UserError(f"party file {path} (passive party) has the label column {cfg.label_column!r}; "
                            "labels belong to the active party only")
    if cfg.label_column in cfg.drop_columns:
        raise UserError(f"--drop-columns names the label column {cfg.label_column!r}: the label is never a feature; "
                        "to train on another label, use --label-column")
    for flag, cols in (("--categorical", cfg.categorical), ("--numeric", cfg.numeric)):
        if cfg.label_column in cols:
            raise UserError(f"{flag} names the label column {cfg.label_column!r}, which is not a feature")
    named = set(cfg.drop_columns) | set(cfg.categorical) | set(cfg.numeric)
    unknown = named - {str(c) for df in frames for c in df.columns}
    if unknown:
        raise UserError(f"column {sorted(unknown)[0]!r} (--drop-columns/--categorical/--numeric) is in no party file")


def split_rows(aligned: np.ndarray, active_ids: np.ndarray, has_label: np.ndarray, spec: PartitionSpec,
           seed: int) -> Split:
    """A seeded ``test_fraction`` of the aligned labeled entities is the test set; the first
    ``n_labeled`` of the rest (all by default) are the labeled training rows."""
    aligned_labeled = aligned[has_label[pd.Index(active_ids).get_indexer(aligned)]]
    rng = np.random.default_rng(seed)
    perm = rng.permutation(aligned_labeled)
    n_test = int(round(spec.test_fraction * len(perm)))
    if n_test < 1 or n_test >= len(perm):
        raise UserError(f"only {len(perm)} aligned labeled rows: too few for a test split")
    test_ids = np.sort(perm[:n_test])
    candidates = perm[n_test:]
    n_labeled = len(candidates) if spec.n_labeled is None else spec.n_labeled
    if n_labeled > len(candidates):
        raise UserError(f"--labeled {n_labeled} exceeds the {len(candidates)} aligned labeled training rows")
    return Split(test_ids, aligned[~member(aligned, test_ids)], candidates[:n_labeled])


def party_data(name: str, df: pd.DataFrame, path: Path, id_col: str, own: np.ndarray, aligned: np.ndarray,
                split: Split, cfg: DataConfig, labels: ActiveLabels | None,
                features: bool = True) -> tuple[PartyData, dict]:
    """One party's encoded rows (with ``labels``: the active party's, labeled) and what was read;
    ``features`` False: a label-only active party (``partition.active_features: false``), whose file
    needs the ID and label columns only (any other column is read as ignored)."""
    index = pd.Index(own)
    train_ids = own[~member(own, split.test_ids)]
    tr, te = index.get_indexer(train_ids), index.get_indexer(split.test_ids)
    drop = [id_col, cfg.label_column, *cfg.drop_columns]
    if not features:
        drop += [c for c in df.columns if c not in drop]
        num, cat = np.zeros((len(df), 0)), np.zeros((len(df), 0), dtype=np.int64)
        num_cols: list = []
        cat_cols: list = []
        missing: dict[str, int] = {}
    else:
        num, cat, num_cols, cat_cols, missing = _features(df, path, drop, cfg)
    if features and num.shape[1] + cat.shape[1] == 0:
        raise UserError(f"party file {path}: no feature columns besides the ID")
    matched = int(member(own, aligned).sum())
    info = {"file": str(path), "id_column": id_col, "rows_read": int(len(df)),
            "rows_matched": matched, "rows_unmatched": int(len(df)) - matched,
            "numeric_columns": [str(c) for c in num_cols], "categorical_columns": [str(c) for c in cat_cols],
            "dropped_columns": [c for c in cfg.drop_columns if c in df.columns],
            "missing_cells": missing}
    if labels is not None:
        info["unlabeled_rows"] = int((~labels.has_label).sum())
    fitted: dict = {}
    X_tr, X_te, card = encode_party(num[tr], num[te], cat[tr], cat[te], log=False, min_freq=cfg.min_freq,
                                    hash_buckets=cfg.hash_buckets, fitted=fitted)
    prep = {"id_column": id_col, "numeric_columns": [str(c) for c in num_cols],
            "categorical_columns": [str(c) for c in cat_cols], "ignored_columns": [str(c) for c in drop[1:]
                                                                                  if c in df.columns], **fitted}
    label_fields: dict[str, Any] = {}
    if labels is not None:
        lab = split.labeled_ids
        if labels.on_unaligned:
            lab = np.concatenate([lab, difference(train_ids[labels.has_label[tr]], split.train_aligned)])
        y_lab = labels.y[index.get_indexer(lab)]
        label_fields = {"label_ids": lab, "y_labels": y_lab, "y_test": labels.y[te]}
        if labels.y.dtype.kind == "f":  # regression: the active party's label scaler, on its training labels
            y_lab = y_lab.astype(np.float32)
            label_fields.update(y_labels=y_lab, y_test=labels.y[te].astype(np.float32),
                                label_scale=(float(y_lab.mean()), float(y_lab.std()) or 1.0))
    party = PartyData(name, np.arange(X_tr.shape[1]), train_ids, X_tr, split.test_ids, X_te, **label_fields,
                      n_numeric=len(num_cols), cardinalities=card, column_names=tuple(num_cols + cat_cols),
                      preprocessing=prep)
    return party, info


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


def encode_file_rows(df: pd.DataFrame, path: str | Path, prep: dict, numeric_ids: bool = False
                     ) -> tuple[np.ndarray, np.ndarray]:
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
    ids = read_ids(df, path, prep["id_column"], numeric_ids)
    num_values = []
    for c in prep["numeric_columns"]:
        parsed, bad = _numbers(df[c])
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
    return ids, encode_rows(num, _category_codes(df, prep["categorical_columns"]), prep)


DATASETS.register(DatasetEntry("csv", "your own data: one CSV/Parquet file per party (--party-file), PSI-aligned",
                               None, _locate, partition=csv_partition))
