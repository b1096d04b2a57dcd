"""Large per-row arrays on disk: what keeps a party's anonymous memory flat as its file grows (issue 53).

A party with millions of rows holds a few arrays of one value per row: its encoded features, its
IDs, labels, row positions, an epoch's batch order. :func:`empty` gives such an array in memory
while it is small and, from ``SECUREVFL_SPILL_MIN_MB`` (default 1 MiB) on, as a memory-mapped file in
a private folder under ``SECUREVFL_SPILL_DIR`` (default: the system's temporary folder). The file is
unlinked as soon as it is mapped, so its pages are file-backed (the kernel writes them out and drops
them under pressure instead of counting them as anonymous memory) and disappear with the last mapping,
even when the process is killed. The folder must be on a disk, not a tmpfs (whose pages are RAM).

:class:`Column` collects an array block by block (a file read in blocks) without knowing its length.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import numpy.typing as npt

from securevfl.configuration.limits import env_limit
from securevfl.errors import UserError, os_cause

_DIR: Path | None = None
PIECE = 1 << 20
"""Rows per piece when a large array is filled or scanned: the transient memory is a piece, not the array."""


def min_bytes() -> int:
    """Arrays of this many bytes and more are spilled (``SECUREVFL_SPILL_MIN_MB``; 0 spills every array)."""
    raw = os.environ.get("SECUREVFL_SPILL_MIN_MB")
    if raw is not None and raw.strip() == "0":
        return 0
    return env_limit("SECUREVFL_SPILL_MIN_MB", 1) << 20


def base() -> str:
    """The folder spill folders are made in (``SECUREVFL_SPILL_DIR``, else the system's temporary one)."""
    return os.environ.get("SECUREVFL_SPILL_DIR") or tempfile.gettempdir()


def spill_error(e: OSError) -> UserError:
    """A spill folder that cannot be made or written: one line naming it and the cause."""
    return UserError(f"spill folder {base()} (SECUREVFL_SPILL_DIR): {os_cause(e)}; it must be an existing, writable "
                     "folder on a local disk with free space (securevfl doctor checks it)")


def folder() -> Path:
    """This process's private spill folder (created on first use, removed at exit)."""
    global _DIR
    if _DIR is None or not _DIR.is_dir():
        try:
            _DIR = Path(tempfile.mkdtemp(prefix="securevfl-spill-", dir=base()))
        except OSError as e:
            raise spill_error(e) from None
        atexit.register(shutil.rmtree, _DIR, True)
    return _DIR


def spills(nbytes: int) -> bool:
    return nbytes >= min_bytes() and nbytes > 0


def _mapped(shape: tuple[int, ...], dtype: npt.DTypeLike) -> np.ndarray:
    where = folder()
    try:
        fd, name = tempfile.mkstemp(dir=where, suffix=".bin")
    except OSError as e:
        raise spill_error(e) from None
    try:
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if nbytes and hasattr(os, "posix_fallocate"):
            # the blocks now: a full disk is an error here, not a SIGBUS when a page is first written
            os.posix_fallocate(fd, 0, nbytes)
        return np.memmap(name, dtype=dtype, mode="w+", shape=shape)
    except OSError as e:
        raise spill_error(e) from None
    finally:
        os.close(fd)
        os.unlink(name)  # the mapping keeps the pages; nothing is left behind after a crash


def empty(shape: int | tuple[int, ...], dtype: npt.DTypeLike) -> np.ndarray:
    """An uninitialised array, memory-mapped from disk when it is large (see the module)."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if np.dtype(dtype).hasobject:  # Python objects (string IDs) cannot live in a file
        return np.empty(shape, dtype=dtype)
    return _mapped(shape, dtype) if spills(nbytes) else np.empty(shape, dtype=dtype)


def full(shape: int | tuple[int, ...], value: object, dtype: npt.DTypeLike) -> np.ndarray:
    out = empty(shape, dtype)
    out[...] = value
    return out


def arange(n: int, dtype: npt.DTypeLike = np.int64) -> np.ndarray:
    out = empty(n, dtype)
    step = PIECE
    for i in range(0, n, step):  # in pieces: no transient of the whole length
        out[i:i + step] = np.arange(i, min(i + step, n), dtype=dtype)
    return out


def permutation(rng: np.random.Generator, n: int) -> np.ndarray:
    """``rng.permutation(n)``, the same draws, spilled when large (shuffled in place)."""
    out = arange(n)
    rng.shuffle(out)
    return out


def take(a: np.ndarray, index: np.ndarray) -> np.ndarray:
    """``a[index]`` for a 1-D ``index``, written into a spilled array when large (piece by piece)."""
    out = empty((len(index), *a.shape[1:]), a.dtype)
    step = PIECE
    for i in range(0, len(index), step):
        out[i:i + step] = a[index[i:i + step]]
    return out


def where(mask: np.ndarray) -> np.ndarray:
    """``np.flatnonzero(mask)`` without a transient of the whole length (positions as int64)."""
    n = int(np.count_nonzero(mask))
    out = empty(n, np.int64)
    step, k = PIECE, 0
    for i in range(0, len(mask), step):
        pos = np.flatnonzero(mask[i:i + step]) + i
        out[k:k + len(pos)] = pos
        k += len(pos)
    return out


class Column:
    """One value per row, appended block by block to a file; :meth:`finish` maps it (or reads it into
    memory when small). The file is unlinked at once: only this process's open handle keeps it."""

    def __init__(self, dtype: npt.DTypeLike) -> None:
        self.dtype = np.dtype(dtype)
        try:
            fd, name = tempfile.mkstemp(dir=folder(), suffix=".col")
        except OSError as e:
            raise spill_error(e) from None
        os.unlink(name)
        self.file = os.fdopen(fd, "w+b")
        self.n = 0

    def append(self, values: np.ndarray) -> None:
        try:
            self.file.write(np.ascontiguousarray(values, dtype=self.dtype).tobytes())
        except OSError as e:
            raise spill_error(e) from None
        self.n += len(values)

    def finish(self) -> np.ndarray:
        try:
            self.file.flush()
        except OSError as e:
            raise spill_error(e) from None
        try:
            if not spills(self.n * self.dtype.itemsize) or self.n == 0:
                self.file.seek(0)
                return np.fromfile(self.file, dtype=self.dtype, count=self.n)
            return np.memmap(self.file, dtype=self.dtype, mode="r+", shape=(self.n,))
        finally:
            self.file.close()  # a memory map keeps its own reference to the file

    def discard(self) -> None:
        self.file.close()
