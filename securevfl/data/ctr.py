"""Click-log datasets used by VFLHLP and FedUD: Criteo (Kaggle Display Advertising) and Avazu.

Entity IDs are data-row numbers (0-based, after sampling: the row's position in the file's data
lines), since neither file carries a user key that survives sampling. Categorical values are hashed
to 64 bits while streaming; vocabularies are built per party on its training rows at partition time
(:mod:`securevfl.data.tabular`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from securevfl.data.dataset import DataConfig, Dataset
from securevfl.data.readers import (
    ARROW_BLOCK_BYTES,
    ColumnSink,
    FastPathRefused,
    bad_line,
    parse_numeric,
    read_arrow_batches,
    read_chunks,
)
from securevfl.data.registry import DATASETS, DatasetEntry, locate_file
from securevfl.data.tabular import hash_values
from securevfl.errors import UserError

CRITEO_INT = [f"I{i}" for i in range(1, 14)]
CRITEO_CAT = [f"C{i}" for i in range(1, 27)]

AVAZU_FIELDS = ["hour", "C1", "banner_pos", "site_id", "site_domain", "site_category", "app_id", "app_domain",
                "app_category", "device_id", "device_ip", "device_model", "device_type", "device_conn_type",
                "C14", "C15", "C16", "C17", "C18", "C19", "C20", "C21"]
AVAZU_HEADER = ["id", "click", *AVAZU_FIELDS]

# Field-to-party presets. The papers give field counts, not names; these are our readings.
CRITEO_PRESETS = {
    # VFLHLP Table 1: active = 26 categorical fields, passive = 13 numeric fields
    "vflhlp": [CRITEO_CAT, CRITEO_INT],
    # RISA §IV-A: "Party 1 has all numerical fields and Party 2 has categorical fields" (party 1 = active)
    "risa": [CRITEO_INT, CRITEO_CAT],
}
AVAZU_PRESETS = {
    # VFLHLP Table 1: 3 parties with 7 | 7 | 8 fields — ad/context | site+app (publisher) | device
    "vflhlp": [["hour", "C1", "banner_pos", "C14", "C15", "C16", "C17"],
               ["site_id", "site_domain", "site_category", "app_id", "app_domain", "app_category", "C18"],
               ["device_id", "device_ip", "device_model", "device_type", "device_conn_type", "C19", "C20", "C21"]],
    # FedHSSL §5.1: both kinds of fields divided equally, so each party holds a mixture (our reading:
    # ad/site/context with C14–C17 | app/device with C18–C21)
    "fedhssl": [["hour", "C1", "banner_pos", "site_id", "site_domain", "site_category", "app_category",
                 "C14", "C15", "C16", "C17"],
                ["app_id", "app_domain", "device_id", "device_ip", "device_model", "device_type", "device_conn_type",
                 "C18", "C19", "C20", "C21"]],
    # FedUD §4.1: host (ad platform) 10 slots, guest (media platform) 12 slots
    "fedud": [["C1", "banner_pos", "C14", "C15", "C16", "C17", "C18", "C19", "C20", "C21"],
              ["hour", "site_id", "site_domain", "site_category", "app_id", "app_domain", "app_category",
               "device_id", "device_ip", "device_model", "device_type", "device_conn_type"]],
}


def _label(chunk, column: str, path: Path) -> np.ndarray:
    y = parse_numeric(chunk, column, path, integer=True)
    bad = ~np.isin(y, (0.0, 1.0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        value = chunk.frame[column].iloc[i]
        raise bad_line(path, int(chunk.line_numbers[i]), f"{column} is {value!r}, expected 0 or 1")
    return y.astype(np.int64)


# -------------------------------------------------------------------------------------------- Criteo
def _criteo_locate(cfg: DataConfig) -> str:
    return str(locate_file(cfg, "criteo", ("train.txt", "dac_sample.txt", "criteo.txt"),
                           "pass --data-path FILE (Kaggle Display Advertising train.txt: label, 13 integer and "
                           "26 categorical fields, tab-separated)"))


def _criteo_checked(path: Path, cfg: DataConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The line-by-line validating reader: (numeric float32, categorical hashes, labels)."""
    names = ["label", *CRITEO_INT, *CRITEO_CAT]
    ys, nums, cats = [], [], []
    for chunk in read_chunks(path, "\t", names, header=False, max_rows=cfg.max_rows, sample=cfg.sample,
                             sample_seed=cfg.sample_seed):
        ys.append(_label(chunk, "label", path))
        nums.append(np.column_stack([parse_numeric(chunk, c, path, integer=True) for c in CRITEO_INT]))
        cats.append(np.column_stack([hash_values(chunk.frame[c].to_numpy()) for c in CRITEO_CAT]))
    if not ys:
        raise UserError(f"{path}: no data rows")
    return np.concatenate(nums).astype(np.float32), np.concatenate(cats), np.concatenate(ys)


def _criteo_fast(path: Path, cfg: DataConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The same arrays through pyarrow (:func:`read_arrow_batches`); FastPathRefused on anything odd."""
    names = ["label", *CRITEO_INT, *CRITEO_CAT]
    sink = ColumnSink({"X": (np.float32, len(CRITEO_INT)), "C": (np.int64, len(CRITEO_CAT)), "y": (np.int64, 0)},
                      _cache_dir(path, cfg))
    for b in read_arrow_batches(path, "\t", names, header=False, numeric=["label", *CRITEO_INT],
                                categorical=CRITEO_CAT, max_rows=cfg.max_rows, sample=cfg.sample,
                                sample_seed=cfg.sample_seed):
        y = _fast_label(b["label"])
        num = [_fast_integer(b[c]) for c in CRITEO_INT]
        sink.append({"X": num, "C": [b[c] for c in CRITEO_CAT], "y": y}, len(y),
                    _estimate_rows(path, len(y), cfg))
    if sink.n == 0:
        raise UserError(f"{path}: no data rows")
    out = sink.finish()
    return out["X"], out["C"], out["y"]


def load_criteo(cfg: DataConfig) -> Dataset:
    path = Path(_criteo_locate(cfg))
    X, cats, y = _fast_or_checked(path, cfg, _criteo_fast, _criteo_checked)
    return Dataset("criteo", X, y, np.arange(len(y), dtype=np.int64), 2,
                   "tabular", tuple(CRITEO_INT), log_transform=True,
                   categorical=cats, cat_names=tuple(CRITEO_CAT), presets=CRITEO_PRESETS)


def _fast_or_checked(path: Path, cfg: DataConfig, fast, checked):
    try:
        return fast(path, cfg)
    except FastPathRefused:  # the checked reader gives the same result, or names the bad line
        return checked(path, cfg)


def _cache_dir(path: Path, cfg: DataConfig) -> Path | None:
    """Where this read's memory-mapped columns go (``data.column_cache``), one folder per read."""
    if cfg.column_cache is None:
        return None
    import tempfile

    Path(cfg.column_cache).mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{path.stem}-", dir=cfg.column_cache))


def _fast_label(v: np.ndarray) -> np.ndarray:
    if not np.isin(v, (0.0, 1.0)).all():
        raise FastPathRefused("a label other than 0 / 1")
    return v.astype(np.int64)


def _fast_integer(v: np.ndarray) -> np.ndarray:
    if (~np.isnan(v) & (v != np.round(v))).any():
        raise FastPathRefused("a non-integer")
    return v


def _estimate_rows(path: Path, block_rows: int, cfg: DataConfig) -> int:
    """Rows the file will yield, from one block's kept rows per byte (+25 %; capped by max_rows)."""
    size = path.stat().st_size
    est = int(size * block_rows / min(size, ARROW_BLOCK_BYTES) * 1.25) + 1024
    return min(est, cfg.max_rows) if cfg.max_rows else est


# --------------------------------------------------------------------------------------------- Avazu
def _avazu_locate(cfg: DataConfig) -> str:
    return str(locate_file(cfg, "avazu", ("train.csv", "train", "avazu.csv"),
                           "pass --data-path FILE (the Kaggle Avazu CSV with header id,click,hour,C1,...)"))


def _avazu_header(path: Path) -> tuple[list[str], bool]:
    """Validate the header; returns (column names to parse with, has a leading index column)."""
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        first = f.readline().rstrip("\r\n")
        second = f.readline().rstrip("\r\n")
    cols = [c.strip().strip('"') for c in first.split(",")]
    index_col = bool(cols) and cols[0] in ("", "Unnamed: 0", "index") and cols[1:2] == ["id"]
    if cols == AVAZU_HEADER and second and second.count(",") == len(cols):
        # rows one field longer than the header: a leading row index the header does not name (pandas'
        # to_csv with index_label=False writes this); read as pandas does, the first field as the index
        print(f"{path}: the header has one name fewer than the rows: reading the first field as a row index "
              "(not a feature)", file=sys.stderr)
        return ["_index", *AVAZU_HEADER], True
    body = cols[1:] if index_col else cols
    if body != AVAZU_HEADER:
        missing = [c for c in AVAZU_HEADER if c not in body]
        what = f"missing column {missing[0]!r}" if missing else f"unexpected columns {body[:3]}..."
        raise bad_line(path, 1, f"not an Avazu header ({what}; expected {','.join(AVAZU_HEADER[:4])},...)")
    return (["_index", *AVAZU_HEADER] if index_col else AVAZU_HEADER), index_col


def _hour_of_day(chunk, path: Path) -> np.ndarray:
    """YYMMDDHH (possibly float-formatted, e.g. 14102100.0) → hour 0–23."""
    v = parse_numeric(chunk, "hour", path, integer=True)
    bad = np.isnan(v) | (v < 0) | (v % 100 > 23)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        value = chunk.frame["hour"].iloc[i]
        raise bad_line(path, int(chunk.line_numbers[i]), f"hour is {value!r}, expected YYMMDDHH")
    return (v % 100).astype(np.int64)


def _avazu_checked(path: Path, cfg: DataConfig) -> tuple[np.ndarray, np.ndarray]:
    """The line-by-line validating reader: (categorical hashes, labels)."""
    names, _ = _avazu_header(path)
    ys, cats = [], []
    for chunk in read_chunks(path, ",", names, header=True, max_rows=cfg.max_rows, sample=cfg.sample,
                             sample_seed=cfg.sample_seed, allow_truncated_last=True):
        # the ad id is dropped as a feature; it must still be a number (int or float-formatted)
        parse_numeric(chunk, "id", path, integer=False)
        ys.append(_label(chunk, "click", path))
        cols = [hash_values(_hour_of_day(chunk, path))]
        cols += [hash_values(chunk.frame[c].to_numpy()) for c in AVAZU_FIELDS[1:]]
        cats.append(np.column_stack(cols))
    if not ys:
        raise UserError(f"{path}: no data rows")
    return np.concatenate(cats), np.concatenate(ys)


def _avazu_fast(path: Path, cfg: DataConfig) -> tuple[np.ndarray, np.ndarray]:
    names, _ = _avazu_header(path)
    sink = ColumnSink({"C": (np.int64, len(AVAZU_FIELDS)), "y": (np.int64, 0)}, _cache_dir(path, cfg))
    for b in read_arrow_batches(path, ",", names, header=True, numeric=["id", "click", "hour"],
                                categorical=AVAZU_FIELDS[1:], max_rows=cfg.max_rows, sample=cfg.sample,
                                sample_seed=cfg.sample_seed):
        if np.isnan(b["id"]).any():  # the checked reader accepts an empty id only as a number-less cell
            raise FastPathRefused("an empty id")
        y = _fast_label(b["click"])
        v = _fast_integer(b["hour"])
        if (np.isnan(v) | (v < 0) | (v % 100 > 23)).any():
            raise FastPathRefused("an hour outside YYMMDDHH")
        hours = (v % 100).astype(np.int64)
        uniq, inv = np.unique(hours, return_inverse=True)  # hash the ≤ 24 distinct hours, not every row
        cols = [hash_values(uniq)[inv], *[b[c] for c in AVAZU_FIELDS[1:]]]
        sink.append({"C": cols, "y": y}, len(y), _estimate_rows(path, len(y), cfg))
    if sink.n == 0:
        raise UserError(f"{path}: no data rows")
    out = sink.finish()
    return out["C"], out["y"]


def load_avazu(cfg: DataConfig) -> Dataset:
    path = Path(_avazu_locate(cfg))
    cats, y = _fast_or_checked(path, cfg, _avazu_fast, _avazu_checked)
    return Dataset("avazu", np.zeros((len(y), 0), dtype=np.float32), y, np.arange(len(y), dtype=np.int64), 2,
                   "tabular", (), categorical=cats, cat_names=tuple(AVAZU_FIELDS),
                   presets=AVAZU_PRESETS)


DATASETS.register(DatasetEntry("criteo", "Criteo display-ads click log (Kaggle train.txt), binary", load_criteo,
                               _criteo_locate, takes_path=True))
DATASETS.register(DatasetEntry("avazu", "Avazu click log (Kaggle CSV), 22 categorical fields, binary", load_avazu,
                               _avazu_locate, takes_path=True))
