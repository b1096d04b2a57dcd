"""A party file read once, in blocks, into one array per column (issue 53).

Each block of ``SECUREVFL_BLOCK_ROWS`` rows (default 100,000) is parsed and gone before the next is
read: every feature column becomes its parsed numbers (float64, NaN where missing or not a number) and,
where it may be categorical, the 64-bit hashes of its raw cells; the ID and label columns are checked
as they stream past. Each column grows on disk (:class:`securevfl.storage.spill.Column`) and is memory-mapped
once large, so a file of 10 million rows costs as much anonymous memory as one of a million.

The rules are those of the whole-file reader they replace, with the same messages and line numbers
(line = row + 2: the header is line 1): a column is numeric when every present cell is a number,
categorical when more than half of its present cells are text, and an error in between; a column
that shows its first text only after the first block is hashed from the start in a second pass over
that column alone. IDs are held in memory as Python strings unless ``numeric_ids`` makes them int64
(then spilled like the columns): the bounded-memory path wants numeric IDs.

Over 600 lines (666) in one file because reading, checking and spilling a party file share one pass over
each block; the feature encoders are in tabular.py.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from securevfl.configuration.limits import brief, env_limit
from securevfl.data.tabular import hash_values
from securevfl.errors import UserError
from securevfl.storage import spill

MISSING = {"", "na", "n/a", "nan", "null", "none", "?"}
MAX_CLASSES = 100
_DISTINCT_CAP = 10_000  # distinct label values counted exactly up to here (a larger label is refused anyway)


def block_rows() -> int:
    return env_limit("SECUREVFL_BLOCK_ROWS", 100_000)


# ------------------------------------------------------------------------------------- the file
def check_file(path: Path) -> list[str]:
    """The file's column names as written, after refusing what no reader should try (too many columns,
    repeated names, nested Parquet types)."""
    if not path.is_file():
        if path.exists():  # a FIFO, a device or a folder: nothing a block reader can measure and re-read
            raise UserError(f"party file {path}: not a regular file (a folder, a named pipe or a device); give a "
                            "file on disk")
        raise UserError(f"party file {path}: no such file")
    # the memory is bounded by the block; the disk the columns spill to is not (≈ 20 bytes a cell)
    max_bytes = env_limit("SECUREVFL_MAX_CSV_BYTES", 1 << 40)
    if path.stat().st_size > max_bytes:
        raise UserError(f"party file {path}: larger than {max_bytes} bytes (SECUREVFL_MAX_CSV_BYTES)")
    max_columns = env_limit("SECUREVFL_MAX_CSV_COLUMNS", 10_000)
    try:
        with open(path, "rb") as f:
            head = f.readline(1 << 20)  # the header line (a first megabyte of it at most)
    except OSError as e:
        raise UserError(f"party file {path}: cannot read ({e.strerror or e})") from None
    parquet = is_parquet(path)
    if not parquet and head.count(b",") + 1 > max_columns:
        raise UserError(f"party file {path}: more than {max_columns} columns (SECUREVFL_MAX_CSV_COLUMNS)")
    try:
        names = _parquet_schema(path) if parquet else _csv_header(head)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - any reader failure is the user's file
        raise UserError(f"party file {path}: cannot read ({_cause(e)})") from None
    _refuse_duplicate_names(path, names)
    return names


def is_parquet(path: Path) -> bool:
    return path.suffix.lower() in (".parquet", ".pq")


def read_table(path: Path) -> pd.DataFrame:
    """The whole file as one frame (CSV cells as text; Parquet as stored): for scoring new rows
    (``predict``); training reads in blocks (:func:`read_party`)."""
    check_file(path)
    try:
        if is_parquet(path):
            return pd.read_parquet(path)
        with io.BufferedReader(LineCapped(path, max_line_bytes()), 1 << 20) as f:
            return pd.read_csv(f, dtype=str, keep_default_na=False)
    except UserError:
        raise
    except MemoryError:
        raise UserError(f"party file {path}: out of memory while reading it (SECUREVFL_MAX_LINE_BYTES caps a line)"
                        ) from None
    except Exception as e:  # noqa: BLE001 - any reader failure is the user's file
        raise UserError(f"party file {path}: cannot read ({_cause(e)})") from None


def max_line_bytes() -> int:
    """The longest line a CSV party file may hold (``SECUREVFL_MAX_LINE_BYTES``, default 64 MiB): a
    longer one is refused as it streams past, before it is held in memory."""
    return env_limit("SECUREVFL_MAX_LINE_BYTES", 64 << 20)


class LineCapped(io.RawIOBase):
    """A file read in chunks that refuses a line longer than ``cap`` bytes as it passes (a 2 GB line
    would otherwise be held whole by the CSV parser: a MemoryError, or the machine's memory)."""

    def __init__(self, path: Path, cap: int) -> None:
        self.path, self.cap, self.run, self.line = path, cap, 0, 1
        self.raw = open(path, "rb", buffering=0)  # noqa: SIM115 -- closed with this object

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        n = self.raw.readinto(buf)
        if not n:
            return 0
        chunk = bytes(memoryview(buf)[:n])
        last = chunk.rfind(b"\n")
        if last < 0:
            self.run += n
        else:
            self.line += chunk.count(b"\n")
            self.run = n - last - 1
        if self.run > self.cap:
            raise UserError(f"party file {self.path}: line {self.line} is longer than {self.cap} bytes "
                            "(SECUREVFL_MAX_LINE_BYTES); refused before it was held in memory")
        return n

    def close(self) -> None:
        self.raw.close()
        super().close()


def _cause(e: BaseException) -> str:
    """An exception's first line, or its type where it has no text (``str(MemoryError())`` is empty)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _blocks(path: Path, columns: list[str] | None = None) -> Iterator[pd.DataFrame]:
    """The file's rows in blocks (``columns``: those only)."""
    n = block_rows()
    try:
        if is_parquet(path):
            import pyarrow.parquet as pq

            for batch in pq.ParquetFile(path).iter_batches(batch_size=n, columns=columns):
                yield batch.to_pandas()
        else:
            kw = {"usecols": columns} if columns is not None else {}
            with io.BufferedReader(LineCapped(path, max_line_bytes()), 1 << 20) as f, \
                    pd.read_csv(f, dtype=str, keep_default_na=False, chunksize=n, **kw) as reader:
                yield from reader
    except UserError:
        raise
    except MemoryError:
        raise UserError(f"party file {path}: out of memory while reading it (a line or a cell larger than this "
                        "machine's free memory; SECUREVFL_MAX_LINE_BYTES caps a line)") from None
    except Exception as e:  # noqa: BLE001 - any reader failure is the user's file
        raise UserError(f"party file {path}: cannot read ({_cause(e)})") from None


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


def index_as_column(df: pd.DataFrame, path: Path, id_col: str, say: bool = True) -> pd.DataFrame:
    """A header one name shorter than its rows (``DataFrame.to_csv`` with an unnamed index): pandas
    reads the first column as the index, and so do we. The index is the row's key, so it becomes the ID
    column when the header has none; otherwise it is dropped (row labels are no feature)."""
    if isinstance(df.index, pd.RangeIndex):
        return df
    if df.index.nlevels > 1:
        raise UserError(f"party file {path}: the header has {df.index.nlevels} names fewer than the rows")
    use = id_col not in df.columns
    if say:
        print(f"party file {path}: the header has one name fewer than the rows: reading the first column as the "
              f"index, as pandas does{f', used as the ID column {id_col!r}' if use else ' (not a feature)'}",
              file=sys.stderr)
    if use:
        df = df.rename_axis(id_col).reset_index()
    return df.reset_index(drop=True)


# ------------------------------------------------------------------------------------- cells
def missing(values: pd.Series) -> np.ndarray:
    # a typed null (Parquet's NaN/None) stays null under pandas ≥ 3's astype(str): test it too
    return (values.isna() | values.astype(str).str.strip().str.lower().isin(MISSING)).to_numpy(dtype=bool)


def numbers(values: pd.Series, miss: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A column's cells as float64 (NaN where missing or not a number) and where a present cell is not a number."""
    miss = missing(values) if miss is None else miss
    parsed = pd.to_numeric(values.where(~miss), errors="coerce")
    return parsed.to_numpy(np.float64), ~miss & parsed.isna().to_numpy()


def category_codes(values: pd.Series, miss: np.ndarray | None = None) -> np.ndarray:
    """The raw-value hashes of a categorical column (a missing cell hashes as "")."""
    miss = missing(values) if miss is None else miss
    return hash_values(np.where(miss, "", values.astype(str).to_numpy()))


def looks_like_row_counter(values: np.ndarray) -> bool:
    """Unique consecutive integers (checked in pieces: the whole-column test runs only when they pass)."""
    n, lo, hi, step = 0, np.inf, -np.inf, spill.PIECE
    for i in range(0, len(values), step):
        v = np.asarray(values[i:i + step])
        v = v[~np.isnan(v)]
        if len(v) and not (v == np.round(v)).all():
            return False
        if len(v):
            n, lo, hi = n + len(v), min(lo, float(v.min())), max(hi, float(v.max()))
    if n <= 10 or hi - lo + 1 != n:
        return False
    v = np.asarray(values)
    return len(np.unique(v[~np.isnan(v)])) == n


# ------------------------------------------------------------------------------------- labels
@dataclasses.dataclass
class Labels:
    """The active party's label column as read: class index per row (−1 unlabeled) or the float target
    (NaN unlabeled) of a regression, which rows have one, and the class values (none: regression)."""

    y: np.ndarray
    has_label: np.ndarray
    classes: list


class LabelReader:
    """Reads a label column block by block, with the whole-column reader's rules and messages: numbers
    or text, not both; a number that is not finite refused; classes (integer codes or names) or, with
    ``task: regression`` or a fractional label under ``task: auto``, a continuous target."""

    def __init__(self, path: Path, column: str, task: str) -> None:
        self.path, self.column, self.task = path, column, task
        self.parsed = spill.Column(np.float64)  # NaN: missing, or text
        self.codes = spill.Column(np.int32)  # the cell's text among ``texts`` (−1: missing)
        self.has_label = spill.Column(np.bool_)
        self.texts: dict[str, int] = {}
        self.numbers: set[float] = set()
        self.first_inf: tuple[int, str] | None = None
        self.first_text: tuple[int, str] | None = None
        self.first_fraction: float | None = None
        self.n_num = self.n_present = self.n = 0
        self.huge = False  # a number ≥ 2⁵³: codes are read as text (2⁶³ would wrap as int64)
        self.first_present: float | None = None

    def add(self, raw: pd.Series) -> None:
        miss = missing(raw)
        values = raw.astype(str).str.strip().where(~miss, "")
        parsed = pd.to_numeric(values.where(~miss), errors="coerce").to_numpy(np.float64)
        present = ~miss
        is_num = present & ~np.isnan(parsed)
        inf = np.flatnonzero(is_num & ~np.isfinite(parsed))
        if len(inf) and self.first_inf is None:
            self.first_inf = (self.n + int(inf[0]), values.iloc[int(inf[0])])
        text = np.flatnonzero(present & np.isnan(parsed))
        if len(text) and self.first_text is None:
            self.first_text = (self.n + int(text[0]), values.iloc[int(text[0])])
        nums = parsed[is_num & np.isfinite(parsed)]
        if len(nums):
            if self.first_present is None:
                self.first_present = float(nums[0])
            self.huge |= bool((np.abs(nums) >= 2.0 ** 53).any())
            frac = nums[nums != np.round(nums)]
            if len(frac) and self.first_fraction is None:
                self.first_fraction = float(frac[0])
            if len(self.numbers) <= _DISTINCT_CAP:
                self.numbers.update(np.unique(nums).tolist())
        codes = np.full(len(raw), -1, dtype=np.int32)
        if present.any():
            uniques_codes, uniques = pd.factorize(values[present])
            table = np.array([self._text_code(str(u)) for u in uniques], dtype=np.int32)
            codes[present] = table[uniques_codes]
        self.n_num += int(is_num.sum())
        self.n_present += int(present.sum())
        self.parsed.append(np.where(is_num, parsed, np.nan))
        self.codes.append(codes)
        self.has_label.append(present)
        self.n += len(raw)

    def _text_code(self, value: str) -> int:
        code = self.texts.get(value)
        if code is None:
            if len(self.texts) > _DISTINCT_CAP:
                return -2  # past the count this reader keeps: the label is refused below
            code = self.texts[value] = len(self.texts)
        return code

    def _distinct(self, n: int) -> str:
        return f"more than {_DISTINCT_CAP}" if n > _DISTINCT_CAP else str(n)

    def finish(self) -> Labels:
        path, column = self.path, self.column
        if self.first_inf is not None:
            i, v = self.first_inf
            raise UserError(f"party file {path}: label column {column!r}: line {i + 2}: value {v!r} is not a "
                            "finite number; fix the cell or leave it empty (unlabeled)")
        if self.n_num and self.first_text is not None:
            i, v = self.first_text
            raise UserError(f"party file {path}: label column {column!r}: line {i + 2}: value {v!r} is text among "
                            f"numbers ({self.n_num} of {self.n_present} labels are numbers); fix the cell or leave it "
                            "empty (unlabeled)")
        numeric = self.first_text is None
        if self.task == "regression" and not numeric:
            assert self.first_text is not None
            raise UserError(f"party file {path}: label column {column!r}: value {self.first_text[1]!r} is not a number "
                            "(--task regression)")
        parsed, codes, has_label = self.parsed.finish(), self.codes.finish(), self.has_label.finish()
        if numeric and (self.task == "regression" or not self.huge):
            fractional = self.first_fraction is not None
            if self.task == "auto" and fractional:
                print(f"note: label column {column!r} has fractional values: training a regression (MSE; R² as "
                      "utility); --task classification refuses such a label, --task regression makes this explicit",
                      file=sys.stderr)
            if self.task == "regression" or (self.task == "auto" and fractional):
                if len(self.numbers) < 2:  # R² is undefined and nothing can be learnt
                    raise UserError(f"party file {path}: label column {column!r} has one value "
                                    f"({self.first_present or 0.0:g}) on every labeled row: a regression needs a "
                                    "target that varies")
                return Labels(parsed, has_label, [])
            if fractional:
                raise UserError(f"party file {path}: label column {column!r} has fractional values (e.g. "
                                f"{self.first_fraction:g}): it looks continuous; use --task regression, or bin it "
                                "into classes")
            classes: list = sorted(int(v) for v in self.numbers)
            self._check_classes(len(self.numbers))
            y = spill.empty(len(parsed), np.int64)
            keys = np.array(classes, dtype=np.float64)
            for i in range(0, len(parsed), spill.PIECE):
                p = parsed[i:i + spill.PIECE]
                y[i:i + len(p)] = np.where(np.isnan(p), -1, np.searchsorted(keys, np.nan_to_num(p)))
            return Labels(y, has_label, classes)
        self._check_classes(len(self.texts))
        classes = sorted(self.texts)
        rank = np.empty(len(self.texts) + 1, dtype=np.int64)  # text code → class index; the last: −1
        for i, c in enumerate(classes):
            rank[self.texts[c]] = i
        rank[-1] = -1
        y = spill.empty(len(codes), np.int64)
        for i in range(0, len(codes), spill.PIECE):
            y[i:i + spill.PIECE] = rank[codes[i:i + spill.PIECE]]
        return Labels(y, has_label, classes)

    def _check_classes(self, n: int) -> None:
        if n > MAX_CLASSES:
            raise UserError(f"party file {self.path}: label column {self.column!r} has {self._distinct(n)} distinct "
                            f"values (more than {MAX_CLASSES}): it looks continuous or like an ID; --task regression "
                            "if it is a target")
        if n < 2:
            raise UserError(f"party file {self.path}: label column {self.column!r} needs at least two classes")


def read_labels(raw: pd.Series, path: Path, column: str, task: str = "classification") -> tuple[np.ndarray,
                                                                                               np.ndarray, list]:
    """A whole label column (see :class:`LabelReader`): (class index or target per row, labeled, classes)."""
    r = LabelReader(path, column, task)
    r.add(raw)
    out = r.finish()
    return out.y, out.has_label, out.classes


# ------------------------------------------------------------------------------------- IDs
ID_HASH_KEY = "securevfl-ids/01"
"""The key of ``--hashed-ids``' 64-bit hash (pandas' SipHash-2-4, 16 bytes): fixed, so every party hashes an ID
alike. No secret: the hashes cross the channel only for IDs both parties hold (the PSI hashes them again)."""


def hash_ids(ids: np.ndarray) -> np.ndarray:
    """String IDs as their 64-bit hashes, int64 (``--hashed-ids``)."""
    return pd.util.hash_array(np.asarray(ids, dtype=object), hash_key=ID_HASH_KEY,
                              categorize=False).view(np.int64)


class IdReader:
    """The ID column, block by block: no cell empty; with ``numeric`` every ID an integer (int64); with
    ``hashed`` every (string) ID its 64-bit hash (int64, :func:`hash_ids`), so that no Python object per
    ID outlives its block; then no ID twice (:meth:`finish`)."""

    def __init__(self, path: Path, column: str, numeric: bool, hashed: bool = False) -> None:
        self.path, self.column, self.numeric, self.hashed = path, column, numeric, hashed and not numeric
        self.col = spill.Column(np.int64) if numeric or self.hashed else None
        self.text: list[np.ndarray] = []
        self.n = 0

    def add(self, raw: pd.Series) -> None:
        empty = raw.isna() | (raw.astype(str).str.strip() == "")
        if empty.any():
            i = int(np.flatnonzero(empty.to_numpy())[0])
            raise UserError(f"party file {self.path}: line {self.n + i + 2}: missing ID")
        ids = raw.astype(str).str.strip().to_numpy(dtype=object)
        if self.hashed:
            assert self.col is not None  # a hashed reader keeps its column
            self.col.append(hash_ids(ids))
        elif self.col is not None:
            as_num = pd.to_numeric(pd.Series(ids), errors="coerce")
            bad = (as_num.isna() | (as_num != as_num.round())).to_numpy()
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise UserError(f"party file {self.path}: line {self.n + i + 2}: ID {ids[i]!r} is not an integer "
                                "(numeric_ids)")
            self.col.append(as_num.to_numpy().astype(np.int64))
        else:
            self.text.append(ids)
        self.n += len(raw)

    def finish(self) -> np.ndarray:
        if self.col is not None:
            ids = self.col.finish()
            first = _first_repeat(ids)
        else:
            ids = np.concatenate(self.text) if self.text else np.empty(0, dtype=object)
            dup = pd.Series(ids).duplicated(keep=False).to_numpy()
            first = ids[dup][0] if dup.any() else None
        if first is not None:
            rows = _rows_of(ids, first)
            n_dup = _rows_repeated(ids)
            what = "an ID (or two IDs with the same 64-bit hash, --hashed-ids)" if self.hashed else f"ID {str(first)!r}"
            raise UserError(f"party file {self.path}: duplicate {what} on lines {(rows + 2)[:3].tolist()} "
                            f"({n_dup} rows have duplicated IDs)")
        return ids


def _first_repeat(ids: np.ndarray) -> int | None:
    """The first ID (in file order) that appears again, for int64 IDs, through a sorted copy (spilled
    when large) rather than a hash table of every ID."""
    s = spill.empty(len(ids), np.int64)
    s[:] = ids
    s.sort()
    step, repeated = spill.PIECE, []
    for i in range(0, max(len(s) - 1, 0), step):
        a = s[i:i + step + 1]
        repeated.append(a[1:][a[1:] == a[:-1]])
    rep = np.unique(np.concatenate(repeated)) if repeated else np.empty(0, np.int64)
    if not len(rep):
        return None
    for i in range(0, len(ids), step):  # the first in file order
        hit = np.flatnonzero(np.isin(ids[i:i + step], rep))
        if len(hit):
            return int(ids[i + int(hit[0])])
    return None


def _rows_of(ids: np.ndarray, value: object) -> np.ndarray:
    if ids.dtype == object:
        return np.flatnonzero(ids == value)
    step = spill.PIECE
    return np.concatenate([np.flatnonzero(ids[i:i + step] == value) + i for i in range(0, len(ids), step)])


def _rows_repeated(ids: np.ndarray) -> int:
    return int(pd.Series(np.asarray(ids)).duplicated(keep=False).sum())  # on the error path only


# ------------------------------------------------------------------------------------- features
@dataclasses.dataclass
class _Feature:
    """One candidate feature column while the file streams past."""

    name: str
    numbers: spill.Column
    codes: spill.Column | None = None
    hashed_from: int = 0  # the first row hashed (> 0: the rows before come from a second pass)
    missing: int = 0
    present: int = 0
    not_num: int = 0
    first_not_num: tuple[int, object] | None = None
    first_inf: tuple[int, object] | None = None


@dataclasses.dataclass
class PartyTable:
    """A party file as training uses it: its IDs, its label column (the active party's), and its feature
    columns by kind (1-D arrays, memory-mapped when large), with what the reader counted."""

    path: Path
    columns: list[str]
    n_rows: int
    ids: np.ndarray
    labels: Labels | None
    num_cols: list[str]
    cat_cols: list[str]
    num: list[np.ndarray]
    cat: list[np.ndarray]
    missing: dict[str, int]

    @property
    def spilled(self) -> bool:
        """Whether the columns live on disk: then encoding runs in pieces (securevfl.data.tabular)."""
        return any(isinstance(a, np.memmap) for a in (*self.num, *self.cat))


def read_party(path: Path, id_col: str, *, label_col: str | None, features: bool, drop: list[str],
               categorical: list[str], numeric: list[str], numeric_ids: bool, task: str = "classification",
               forbid: str | None = None, hashed_ids: bool = False) -> PartyTable:
    """Read one party's file in blocks (see the module). ``label_col``: the active party's label column
    (must be present); ``forbid``: a column that must not be in the file (a passive party's label);
    ``features`` False: a label-only party, every other column ignored; ``drop``: never features."""
    names = check_file(path)
    id_reader = IdReader(path, id_col, numeric_ids, hashed_ids)
    labels = LabelReader(path, label_col, task) if label_col is not None else None
    feats: dict[str, _Feature] = {}
    columns: list[str] | None = None
    offset = 0
    try:
        for block in _blocks(path):
            block = index_as_column(block, path, id_col, say=offset == 0)
            if columns is None:
                columns = [str(c) for c in block.columns]
                _check_columns(path, columns, id_col, label_col, forbid)
                if features:
                    feats = {c: _Feature(c, spill.Column(np.float64)) for c in columns
                             if c not in drop and c != id_col and c != label_col}
            id_reader.add(block[id_col])
            if labels is not None:
                labels.add(block[label_col])
            for c, f in feats.items():
                _add_feature(f, block[c], offset, c in categorical, c in numeric)
            offset += len(block)
        if columns is None:  # a header and no rows
            columns = names
            _check_columns(path, columns, id_col, label_col, forbid)
        ids = id_reader.finish()
        lab = labels.finish() if labels is not None else None
        num_cols, cat_cols, miss = _kinds(path, feats, categorical, numeric)
        _rehash(path, [feats[c] for c in cat_cols if feats[c].hashed_from > 0])
        num = [feats[c].numbers.finish() for c in num_cols]
        cat = [_finish_codes(feats[c]) for c in cat_cols]
    finally:
        for f in feats.values():
            for col in (f.numbers, f.codes):
                if col is not None and not col.file.closed:
                    col.discard()
    for c in num_cols:
        if looks_like_row_counter(num[num_cols.index(c)]):
            print(f"warning: party file {path}: column {c!r} looks like a row counter (unique consecutive integers); "
                  f"it is used as a feature — pass --drop-columns {c} if it is not one", file=sys.stderr)
    return PartyTable(path, columns, offset, ids, lab, num_cols, cat_cols, num, cat, miss)


def _check_columns(path: Path, columns: list[str], id_col: str, label_col: str | None, forbid: str | None) -> None:
    if id_col not in columns:
        raise UserError(f"party file {path}: no ID column {id_col!r} (columns: {', '.join(columns)}; "
                        "use --id-column, once per party file if they differ)")
    if label_col is not None and label_col not in columns:
        raise UserError(f"party file {path} (active party): no label column {label_col!r} (columns: "
                        f"{', '.join(columns)}; use --label-column)")
    if forbid is not None and forbid in columns:
        raise UserError(f"party file {path} (passive party) has the label column {forbid!r}; "
                        "labels belong to the active party only")


def _add_feature(f: _Feature, s: pd.Series, offset: int, categorical: bool, numeric: bool) -> None:
    # each distinct cell is parsed and hashed once (a text column repeats its values; parsing text cell
    # by cell was 30 s of a million rows): the same values, cell by cell, as the whole-column functions
    codes, uniques = pd.factorize(s, use_na_sentinel=False)
    u = pd.Series(np.asarray(uniques, dtype=object) if s.dtype == object else uniques)
    miss_u = missing(u)
    parsed_u, not_num_u = numbers(u, miss_u)
    miss, parsed, not_num = miss_u[codes], parsed_u[codes], not_num_u[codes]
    f.missing += int(miss.sum())
    f.present += len(s) - int(miss.sum())
    f.not_num += int(not_num.sum())
    if f.first_not_num is None and not_num.any():
        i = int(np.flatnonzero(not_num)[0])
        f.first_not_num = (offset + i, s.iloc[i])
    inf = np.flatnonzero(np.isinf(parsed))
    if f.first_inf is None and len(inf):
        f.first_inf = (offset + int(inf[0]), s.iloc[int(inf[0])])
    f.numbers.append(parsed)
    if f.codes is None and (categorical or (not numeric and f.not_num > 0)):
        f.codes, f.hashed_from = spill.Column(np.int64), offset
    if f.codes is not None:
        f.codes.append(category_codes(u, miss_u)[codes])


def _kinds(path: Path, feats: dict[str, _Feature], categorical: list[str], numeric: list[str]
           ) -> tuple[list[str], list[str], dict[str, int]]:
    """Each column's kind, by the whole-column rules (see the module), and its missing cells."""
    num_cols, cat_cols, miss = [], [], {}
    for c, f in feats.items():
        if f.missing:
            miss[c] = f.missing
        if c in categorical:
            cat_cols.append(c)
        elif c in numeric or f.not_num == 0:
            if f.first_inf is not None:  # 1e999, inf: no model can take it (a missing value is written empty or nan)
                i, v = f.first_inf
                raise UserError(f"party file {path}: column {c!r}: line {i + 2}: value {brief(v)} is not a finite "
                                "number (non-finite input); fix the file or leave the cell empty")
            num_cols.append(c)
        elif f.not_num <= f.present / 2:
            assert f.first_not_num is not None
            i, v = f.first_not_num
            raise UserError(f"party file {path}: column {c!r}: line {i + 2}: value {v!r} is not a number "
                            f"({f.present - f.not_num} of {f.present} cells are); fix the file, or pass "
                            f"--categorical {c} or --numeric {c} (non-numbers become missing)")
        else:
            cat_cols.append(c)
    return num_cols, cat_cols, miss


def _rehash(path: Path, late: list[_Feature]) -> None:
    """Columns whose first text came after the first block: hash their earlier rows in a second pass."""
    if not late:
        return
    fresh = {f.name: spill.Column(np.int64) for f in late}
    until = {f.name: f.hashed_from for f in late}
    offset = 0
    for block in _blocks(path):
        block = index_as_column(block, path, "", say=False)
        for name, col in fresh.items():
            take = max(0, min(len(block), until[name] - offset))
            if take:
                col.append(category_codes(block[name].iloc[:take]))
        offset += len(block)
        if offset >= max(until.values()):
            break
    for f in late:
        assert f.codes is not None
        rest = f.codes.finish()
        col = fresh[f.name]
        for i in range(0, len(rest), spill.PIECE):
            col.append(np.asarray(rest[i:i + spill.PIECE]))
        f.codes, f.hashed_from = col, 0


def _finish_codes(f: _Feature) -> np.ndarray:
    f.numbers.discard()
    assert f.codes is not None
    return f.codes.finish()
