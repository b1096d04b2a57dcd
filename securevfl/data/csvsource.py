"""The ``csv`` source: the data a real user brings — one CSV or Parquet file per party, each with
an entity-ID column; labels only in the active party's file (the first file).

Each party's ID set comes from its own file. The aligned set is computed by ECDH PSI
(openmined-psi) between the active party and every passive party through a setup channel whose
bytes are reported (``partition.psi_bytes``); ``--alignment plain`` intersects in the clear. Test
rows are a seeded ``test_fraction`` draw from the aligned, labeled entities; the rest of the
aligned set is for training. The spec's ``aligned_fraction``/``unaligned`` do not apply: the files
define who holds what. Feature columns are every column but the ID (and the label): numeric
columns are standardised, text columns are categorical, both fitted per party on training rows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from securevfl.channel import InMemoryChannel
from securevfl.data import psi
from securevfl.data.dataset import DataConfig
from securevfl.data.partition import Partition, PartitionSpec, PartyData, party_names
from securevfl.data.registry import DatasetEntry, register_dataset
from securevfl.data.tabular import encode_party, hash_values
from securevfl.errors import UserError


def _read_table(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise UserError(f"party file {path}: no such file")
    try:
        if path.suffix.lower() in (".parquet", ".pq"):
            return pd.read_parquet(path)
        return pd.read_csv(path, dtype=str, keep_default_na=False)
    except Exception as e:  # noqa: BLE001 - any reader failure is the user's file
        raise UserError(f"party file {path}: cannot read ({str(e).splitlines()[0]})") from None


def _ids(df: pd.DataFrame, path: Path, column: str) -> np.ndarray:
    if column not in df.columns:
        raise UserError(f"party file {path}: no ID column {column!r} (use --id-column)")
    raw = df[column]
    empty = raw.isna() | (raw.astype(str).str.strip() == "")
    if empty.any():
        i = int(np.flatnonzero(empty.to_numpy())[0])
        raise UserError(f"party file {path}: line {i + 2}: missing ID")
    ids = raw.astype(str).str.strip().to_numpy(dtype=object)
    as_int = pd.to_numeric(pd.Series(ids), errors="coerce")
    if as_int.notna().all() and (as_int == as_int.round()).all():
        ids = as_int.to_numpy().astype(np.int64)
    dup = pd.Series(ids).duplicated(keep=False).to_numpy()
    if dup.any():
        first = ids[dup][0]
        lines = (np.flatnonzero(pd.Series(ids).to_numpy() == first) + 2)[:3].tolist()
        raise UserError(f"party file {path}: duplicate ID {str(first)!r} on lines {lines} "
                        f"({int(dup.sum())} rows have duplicated IDs)")
    return ids


def _features(df: pd.DataFrame, drop: list[str]) -> tuple[np.ndarray, np.ndarray, list[str], list[str]]:
    num_cols, cat_cols = [], []
    for c in df.columns:
        if c in drop:
            continue
        numeric = pd.to_numeric(df[c].replace("", np.nan), errors="coerce")
        if numeric.notna().sum() == (df[c].astype(str) != "").sum():
            num_cols.append(c)
        else:
            cat_cols.append(c)
    num = np.column_stack([pd.to_numeric(df[c].replace("", np.nan), errors="coerce").to_numpy(np.float64)
                           for c in num_cols]) if num_cols else np.zeros((len(df), 0))
    cat = np.column_stack([hash_values(df[c].astype(str).to_numpy()) for c in cat_cols]) if cat_cols \
        else np.zeros((len(df), 0), dtype=np.int64)
    return num, cat, num_cols, cat_cols


def _locate(cfg: DataConfig) -> str:
    if not cfg.party_files:
        raise UserError("the csv source needs --party-file FILE for every party (active party first)")
    return ", ".join(cfg.party_files)


def _align(id_sets: list[np.ndarray], mode: str) -> tuple[np.ndarray, int]:
    ch = InMemoryChannel()
    names = party_names(len(id_sets))
    active = ch.endpoint(names[0])
    if mode == "plain":
        return psi.plain_intersection(id_sets), 0
    per_party = []
    for name, ids in zip(names[1:], id_sets[1:], strict=True):
        client = psi.psi_client_start(active, name, id_sets[0])
        psi.psi_server_round(ch.endpoint(name), names[0], ids)
        per_party.append(psi.psi_client_finish(active, name, client, id_sets[0]))
    return psi.plain_intersection([id_sets[0], *per_party]), ch.stats.total_bytes


def csv_partition(cfg: DataConfig, spec: PartitionSpec, seed: int) -> Partition:
    _locate(cfg)
    if len(cfg.party_files) < 2:
        raise UserError("the csv source needs at least two --party-file files (active party first)")
    if spec.columns is not None:
        raise UserError("the csv source takes each party's columns from its file; drop --fields/columns")
    paths = [Path(p) for p in cfg.party_files]
    frames = [_read_table(p) for p in paths]
    if cfg.label_column not in frames[0].columns:
        raise UserError(f"party file {paths[0]} (active party): no label column {cfg.label_column!r}")
    for p, df in zip(paths[1:], frames[1:], strict=True):
        if cfg.label_column in df.columns:
            raise UserError(f"party file {p} (passive party) has the label column {cfg.label_column!r}; "
                            "labels belong to the active party only")
    ids = [_ids(df, p, cfg.id_column) for df, p in zip(frames, paths, strict=True)]
    if len({a.dtype.kind for a in ids}) > 1:
        ids = [a.astype(str).astype(object) for a in ids]
    aligned, psi_bytes = _align(ids, "plain" if spec.alignment == "plain" else "psi")
    if len(aligned) == 0:
        raise UserError(f"the party files share no IDs (column {cfg.id_column!r})")

    y_raw = pd.to_numeric(frames[0][cfg.label_column].replace("", np.nan), errors="coerce").to_numpy()
    has_label = ~np.isnan(y_raw)
    classes = np.unique(y_raw[has_label])
    if len(classes) < 2:
        raise UserError(f"party file {paths[0]}: label column {cfg.label_column!r} needs at least two classes")
    y_all = np.searchsorted(classes, np.where(has_label, y_raw, classes[0])).astype(np.int64)
    active_pos = pd.Index(ids[0])
    aligned_labeled = aligned[has_label[active_pos.get_indexer(aligned)]]
    rng = np.random.default_rng(seed)
    perm = rng.permutation(aligned_labeled)
    n_test = int(round(spec.test_fraction * len(perm)))
    if n_test < 1 or n_test >= len(perm):
        raise UserError(f"only {len(perm)} aligned labeled rows: too few for a test split")
    test_ids = np.sort(perm[:n_test])
    train_aligned = aligned[~np.isin(aligned, test_ids)]
    candidates = perm[n_test:]
    n_labeled = len(candidates) if spec.n_labeled is None else spec.n_labeled
    if n_labeled > len(candidates):
        raise UserError(f"--labeled {n_labeled} exceeds the {len(candidates)} aligned labeled training rows")
    labeled_ids = candidates[:n_labeled]

    parties = []
    names = party_names(len(paths))
    for k, (df, own) in enumerate(zip(frames, ids, strict=True)):
        index = pd.Index(own)
        train_ids = own[~np.isin(own, test_ids)]
        tr, te = index.get_indexer(train_ids), index.get_indexer(test_ids)
        drop = [cfg.id_column, cfg.label_column]
        num, cat, num_cols, cat_cols = _features(df, drop)
        if num.shape[1] + cat.shape[1] == 0:
            raise UserError(f"party file {paths[k]}: no feature columns besides the ID")
        X_tr, X_te, card = encode_party(num[tr], num[te], cat[tr], cat[te], log=False, min_freq=cfg.min_freq,
                                        hash_buckets=cfg.hash_buckets)
        labels = {}
        if k == 0:
            if spec.active_labels_unaligned:
                lab = np.concatenate([labeled_ids, np.setdiff1d(train_ids[has_label[tr]], train_aligned)])
            else:
                lab = labeled_ids
            labels = {"label_ids": lab, "y_labels": y_all[index.get_indexer(lab)], "y_test": y_all[te]}
        parties.append(PartyData(names[k], np.arange(X_tr.shape[1]), train_ids, X_tr, test_ids, X_te, **labels,
                                 n_numeric=len(num_cols), cardinalities=card,
                                 column_names=tuple(num_cols + cat_cols)))
    part = Partition("csv", spec, seed, len(classes), "tabular", parties, train_aligned, labeled_ids,
                     truth_ids=ids[0][has_label], truth_y=y_all[has_label])
    part.meta = {"aligned_by": "plain" if spec.alignment == "plain" else "psi", "psi_bytes": psi_bytes,
                 "files": [str(p) for p in paths], "classes": classes.tolist()}
    return part


register_dataset(DatasetEntry("csv", "your own data: one CSV/Parquet file per party (--party-file), PSI-aligned",
                              None, _locate, partition=csv_partition))
