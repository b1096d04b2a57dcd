"""Streaming reader for large delimited files (Criteo's 11 GB ``train.txt``, the Avazu CSV).

Lines are read in chunks; each chunk's field count is validated per line (pandas would silently
pad short lines), then parsed by pandas' C parser as strings. Problems are reported as one
``FILE: line N: problem`` user error. Line numbers are 1-based physical lines, header included.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from securevfl.errors import UserError


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
    n_fields = len(names)
    rng = np.random.default_rng(sample_seed)
    size = path.stat().st_size
    show = sys.stderr.isatty() if progress is None else progress
    kept = 0
    with open(path, encoding="utf-8", errors="replace", newline="") as f, \
            tqdm(total=size, unit="B", unit_scale=True, desc=f"reading {path.name}", disable=not show,
                 leave=False, file=sys.stderr) as bar:
        lineno = 0
        if header:
            bar.update(len(f.readline()))
            lineno = 1
        pending: list[str] = []
        numbers: list[int] = []
        prev: tuple[int, str] | None = None  # hold one line back to know which line is last

        def flush() -> Chunk:
            frame = pd.read_csv(io.StringIO("\n".join(pending)), sep=sep, header=None, names=names, dtype=str,
                                keep_default_na=False, na_filter=False, quoting=3, engine="c")
            chunk = Chunk(frame, np.asarray(numbers, dtype=np.int64))
            pending.clear()
            numbers.clear()
            return chunk

        def accept(no: int, raw: str, is_last: bool) -> bool:
            line = raw.rstrip("\r\n")
            if line == "" and is_last:
                return False
            count = line.count(sep) + 1
            if count != n_fields:
                truncated = is_last and not raw.endswith("\n") and count < n_fields
                if truncated and allow_truncated_last:
                    print(f"warning: {path}: line {no}: truncated last line skipped", file=sys.stderr)
                    return False
                raise bad_line(path, no, f"expected {n_fields} fields, found {count}")
            if sample < 1.0 and rng.random() >= sample:
                return False
            pending.append(line)
            numbers.append(no)
            return True

        for raw in f:
            lineno += 1
            bar.update(len(raw))
            if prev is not None:
                if accept(prev[0], prev[1], False):
                    kept += 1
                    if max_rows is not None and kept >= max_rows:
                        yield flush()
                        return
                if len(pending) >= chunk_rows:
                    yield flush()
            prev = (lineno, raw)
        if prev is not None and accept(prev[0], prev[1], True):
            kept += 1
        if pending:
            yield flush()


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
