"""Streaming readers for large delimited files (Criteo's 11 GB ``train.txt``, the Avazu CSV).

Two readers, one result. :func:`read_arrow_batches` is the fast path: pyarrow's streaming CSV reader
(multi-threaded C++ parsing of large blocks), numeric columns parsed to float64 and categorical
columns dictionary-encoded so only each block's distinct values are hashed. It parses nothing it is
unsure of: any cell it cannot read exactly as the checked reader would (a wrong field count, a
non-number, ``nan`` / ``inf``, invalid UTF-8, an empty line) makes it raise :class:`FastPathRefused`,
and the caller re-reads the file with :func:`read_chunks`, which validates every line and reports
the first problem as one ``FILE: line N: problem`` user error. Line numbers are 1-based physical
lines, header included.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from securevfl.data.tabular import hash_values
from securevfl.errors import UserError
from securevfl.progress import progress_bar

ARROW_BLOCK_BYTES = 1 << 20
"""Bytes per block of the fast reader: its transient memory is a few blocks, independent of the file."""
WHOLE_READ_BYTES = 64 << 20
"""Files up to this size are parsed in one multi-threaded ``read_csv`` call (about twice as fast as the
streaming reader, which converts its blocks one after another); larger ones stream, so the transient
memory stays bounded by the blocks. The whole read's transient memory is the Arrow table, at most
about this many bytes."""


class FastPathRefused(Exception):
    """The fast reader met input it does not parse exactly like :func:`read_chunks` (the caller falls back)."""


@dataclass
class Chunk:
    frame: pd.DataFrame
    """All fields as strings ('' = missing)."""
    line_numbers: np.ndarray
    """Physical line number of each row."""


def bad_line(path: Path, line: int, problem: str) -> UserError:
    return UserError(f"{path}: line {line}: {problem}")


def read_chunks(path: Path, sep: str, names: list[str], *, header: bool, chunk_rows: int = 100_000,
                max_rows: int | None = None, sample: float = 1.0, sample_seed: int = 0,
                allow_truncated_last: bool = False, progress: bool | None = None) -> Iterator[Chunk]:
    """Yield validated chunks of at most ``chunk_rows`` rows with ``len(names)`` fields each.

    ``header``: the first line is a header and is skipped (the caller validates it).
    ``allow_truncated_last``: a last line with too few fields and no newline (an interrupted copy)
    is dropped with a warning instead of being an error.
    """
    check = _line_check(path, sep, len(names), sample, np.random.default_rng(sample_seed), allow_truncated_last)
    pending = _PendingChunk(sep, names)
    kept = 0
    # a bar on a terminal, plain lines elsewhere (securevfl/progress.py): a big file is minutes of reading
    with open(path, encoding="utf-8", errors="replace", newline="") as f, \
            progress_bar(path.stat().st_size, f"reading {path.name}", progress, unit="B", unit_scale=True,
                         leave=False) as bar:
        if header:
            bar.update(len(f.readline()))
        for no, raw, is_last in _numbered_lines(f, bar, first=2 if header else 1):
            line = check(no, raw, is_last)
            if line is None:
                continue
            pending.add(no, line)
            kept += 1
            if max_rows is not None and kept >= max_rows:
                yield pending.flush()
                return
            if len(pending.lines) >= chunk_rows:
                yield pending.flush()
        if pending.lines:
            yield pending.flush()


def _numbered_lines(f: io.TextIOBase, bar: Any, first: int) -> Iterator[tuple[int, str, bool]]:
    """``(physical line number, raw line, is it the last)``: one line is held back to know which is last."""
    prev: tuple[int, str] | None = None
    for no, raw in enumerate(f, start=first):
        bar.update(len(raw))
        if prev is not None:
            yield prev[0], prev[1], False
        prev = (no, raw)
    if prev is not None:
        yield prev[0], prev[1], True


def _line_check(path: Path, sep: str, n_fields: int, sample: float, rng: np.random.Generator,
                allow_truncated_last: bool) -> Callable[[int, str, bool], str | None]:
    """One line's validation and sampling: the check returns the line without its newline, or ``None``
    to skip it (an empty last line, a truncated last line when allowed, a row left out by sampling); a
    wrong field count is an error naming the line. It draws one uniform per valid line, in file order."""

    def check(no: int, raw: str, is_last: bool) -> str | None:
        line = raw.rstrip("\r\n")
        if line == "" and is_last:
            return None
        count = line.count(sep) + 1
        if count != n_fields:
            truncated = is_last and not raw.endswith("\n") and count < n_fields
            if truncated and allow_truncated_last:
                print(f"warning: {path}: line {no}: truncated last line skipped", file=sys.stderr)
                return None
            raise bad_line(path, no, f"expected {n_fields} fields, found {count}")
        if sample < 1.0 and rng.random() >= sample:
            return None
        return line

    return check


class _PendingChunk:
    """Accepted lines not yet parsed; :meth:`flush` parses them into a :class:`Chunk` and empties."""

    def __init__(self, sep: str, names: list[str]) -> None:
        self.sep, self.names = sep, names
        self.lines: list[str] = []
        self.numbers: list[int] = []

    def add(self, no: int, line: str) -> None:
        self.lines.append(line)
        self.numbers.append(no)

    def flush(self) -> Chunk:
        frame = pd.read_csv(io.StringIO("\n".join(self.lines)), sep=self.sep, header=None, names=self.names,
                            dtype=str, keep_default_na=False, na_filter=False, quoting=3, engine="c")
        chunk = Chunk(frame, np.asarray(self.numbers, dtype=np.int64))
        self.lines, self.numbers = [], []
        return chunk


def parse_numeric(chunk: Chunk, column: str, path: Path, *, integer: bool) -> np.ndarray:
    """Column → float64 with NaN for empty cells; a non-number is an error naming its line."""
    s = chunk.frame[column]
    values = pd.to_numeric(s, errors="coerce").to_numpy(dtype=np.float64)
    bad = np.isnan(values) & (s.to_numpy() != "")
    if integer:
        bad |= ~np.isnan(values) & (values != np.round(values))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        kind = "an integer" if integer else "a number"
        raise bad_line(path, int(chunk.line_numbers[i]), f"{column} is {s.iloc[i]!r}, expected {kind}")
    return values


def read_arrow_batches(path: Path, sep: str, names: list[str], *, header: bool, numeric: list[str],
                       categorical: list[str], max_rows: int | None = None, sample: float = 1.0,
                       sample_seed: int = 0, block_bytes: int | None = None) -> Iterator[dict[str, np.ndarray]]:
    """Yield blocks of the file as ``{column: array}``: float64 for ``numeric`` (NaN = empty cell),
    int64 hashes (:func:`securevfl.data.tabular.hash_values`) for ``categorical``; other columns
    are skipped. Same rows, sampling draws and values as :func:`read_chunks` + the per-column parsers.
    Raises :class:`FastPathRefused` where they might differ."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    types = {c: pa.float64() for c in numeric} | {c: pa.dictionary(pa.int32(), pa.string()) for c in categorical}
    options = dict(
        read_options=pacsv.ReadOptions(column_names=names, skip_rows=1 if header else 0,
                                       block_size=block_bytes or ARROW_BLOCK_BYTES),
        # no quoting (the checked reader uses QUOTE_NONE); empty lines are rows, so they fail the checks below
        parse_options=pacsv.ParseOptions(delimiter=sep, quote_char=False, ignore_empty_lines=False),
        convert_options=pacsv.ConvertOptions(column_types=types, include_columns=[*numeric, *categorical],
                                             null_values=[""], strings_can_be_null=False))
    whole = max_rows is None and Path(path).stat().st_size <= WHOLE_READ_BYTES
    try:
        if whole:  # one batch: every chunk's dictionary unified, so each distinct value is hashed once
            table = pacsv.read_csv(path, **options).unify_dictionaries().combine_chunks()
            reader = iter(table.to_batches())
        else:
            reader = iter(pacsv.open_csv(path, **options))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise FastPathRefused(str(e)) from None
    rng = np.random.default_rng(sample_seed)  # one uniform per row in file order, whatever the batches
    kept = 0
    while max_rows is None or kept < max_rows:
        try:
            batch = next(reader)
        except StopIteration:
            return
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise FastPathRefused(str(e)) from None
        keep = None
        if sample < 1.0:  # the checked reader draws one uniform per valid line, in file order: same stream
            keep = rng.random(batch.num_rows) < sample
        if max_rows is not None:
            idx = np.flatnonzero(keep) if keep is not None else np.arange(batch.num_rows)
            if len(idx) > max_rows - kept:
                keep = np.zeros(batch.num_rows, dtype=bool)
                keep[idx[:max_rows - kept]] = True
        out: dict[str, np.ndarray] = {}
        for c in numeric:
            col = batch.column(c)
            v = col.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
            if int(np.count_nonzero(np.isnan(v))) != col.null_count or np.isinf(v).any():
                raise FastPathRefused(f"{c}: a non-finite number")  # nan / inf text: the checked reader decides
            out[c] = v if keep is None else v[keep]
        cols = [batch.column(c) for c in categorical]
        if any(col.null_count for col in cols):
            raise FastPathRefused("null categorical cells")
        # one hash call for every column's distinct values (a per-call overhead of ≈ 0.3 ms made hashing
        # per column the largest cost); a dictionary holds each value once, so no categorize step
        values = [col.dictionary.to_numpy(zero_copy_only=False) for col in cols]
        if values:
            hashes = np.split(hash_values(np.concatenate(values), categorize=False),
                              np.cumsum([len(v) for v in values])[:-1])
        for c, col, h in zip(categorical, cols, hashes if values else [], strict=True):
            codes = col.indices.to_numpy()
            out[c] = h[codes if keep is None else codes[keep]]
        n = batch.num_rows if keep is None else int(keep.sum())
        kept += n
        if n:
            yield out


class ColumnSink:
    """Growable output arrays, filled block by block, so the parsed data is never held twice (the
    peak is the arrays plus one block, not the sum of per-block copies plus their concatenation).
    Capacity comes from an estimate of the row count (file size / bytes per row of the first block,
    +25 %); pages past the last row are never touched, so the slack costs address space, not memory."""

    def __init__(self, specs: dict[str, tuple[npt.DTypeLike, int]], directory: str | Path | None = None) -> None:
        self.specs = specs
        self.arrays: dict[str, np.ndarray] = {}
        self.n = 0
        self.directory = None if directory is None else Path(directory)
        self._generation = 0

    def _alloc(self, name: str, shape: tuple[int, ...], dtype: npt.DTypeLike) -> np.ndarray:
        if self.directory is None:
            return np.empty(shape, dtype=dtype)
        # a memory-mapped .npy file (sparse on disk past the rows written; np.load(mmap_mode="r") reopens it)
        self.directory.mkdir(parents=True, exist_ok=True)
        return np.lib.format.open_memmap(self.directory / f"{name}.{self._generation}.npy", mode="w+",
                                         dtype=dtype, shape=shape)

    def reserve(self, rows: int) -> None:
        rows = max(rows, 1)
        for name, (dtype, width) in self.specs.items():
            old = self.arrays.get(name)
            new = self._alloc(name, (rows, width) if width else (rows,), dtype)
            if old is not None:  # the estimate was short: one copy (rare; the transient peak is 2× here)
                new[:self.n] = old[:self.n]
                if isinstance(old, np.memmap):
                    assert old.filename is not None  # _alloc maps a file
                    Path(old.filename).unlink(missing_ok=True)  # the mapping stays valid until dropped
            self.arrays[name] = new
        self._generation += 1

    def append(self, blocks: dict[str, np.ndarray | list[np.ndarray]], rows: int, estimate: int) -> None:
        """Add ``rows`` rows (an array, or a list of its columns, per output); ``estimate`` (of the total)
        sizes the first allocation."""
        if not self.arrays:
            self.reserve(max(estimate, rows))
        cap = len(next(iter(self.arrays.values())))
        if self.n + rows > cap:
            self.reserve(max(int(cap * 1.5), self.n + rows))
        for name, block in blocks.items():
            dst = self.arrays[name][self.n:self.n + rows]
            if isinstance(block, list):  # columns, written in place (no stacked copy of the block)
                for j, col in enumerate(block):
                    dst[:, j] = col
            else:
                dst[...] = block
        self.n += rows

    def finish(self) -> dict[str, np.ndarray]:
        return {k: v[:self.n] for k, v in self.arrays.items()}
