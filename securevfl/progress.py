"""Progress for long work, wherever stderr goes.

On a terminal, a tqdm bar. Elsewhere (CI, ``nohup``, a notebook's captured stderr, a deployed party
under a process manager) a bar's carriage returns make an unreadable log, and a silent job looks
hung; so there a plain line is printed at most every ``SECUREVFL_PROGRESS_SECONDS`` (30 s by default)
while the work lasts — ``train: step 120/400 (30%), 31 s elapsed, ETA 72 s, epoch=2, loss=0.43`` —
and a last one when work that printed any ends. Work shorter than the interval prints nothing.
``enabled``: True forces the bar, False silences both, None (the default) picks by stderr."""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, TextIO

from tqdm.auto import tqdm

from securevfl.errors import UserError

# Parties in one process (the tests, the in-process runtime) share stderr: one lock and one write per
# line, or two threads' lines interleave mid-line (print writes the text and the newline separately).
_LINE_LOCK = threading.Lock()


def interval() -> float:
    raw = os.environ.get("SECUREVFL_PROGRESS_SECONDS")
    if not raw:
        return 30.0
    try:
        every = float(raw)
    except ValueError:
        every = math.nan
    if not math.isfinite(every) or every < 0:
        raise UserError(f"SECUREVFL_PROGRESS_SECONDS must be a finite number ≥ 0, got {raw!r}")
    return every


class PlainProgress:
    """tqdm's small interface (``update``, ``set_postfix``, ``write``, a context manager) as plain lines,
    printed by a timer thread so that even one long step (an HE product, a sweep's cell) cannot make
    the log go quiet for longer than the interval; interval 0 prints at every update (tests)."""

    def __init__(self, total: int | float | None, desc: str, unit: str = "step", file: TextIO | None = None,
                 every: float | None = None, initial: int | float = 0) -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.file = file or sys.stderr
        self.every = interval() if every is None else every
        self.n = initial
        self.initial = initial  # done before this process started (a resumed sweep): not in the rate
        self.start = time.monotonic()
        self.postfix: dict[str, Any] = {}
        self.printed = False
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if self.every > 0:
            self._ticker = threading.Thread(target=self._tick, name=f"progress {desc}", daemon=True)
            self._ticker.start()

    def _tick(self) -> None:
        while not self._stop.wait(self.every):
            self._line()

    def update(self, n: int | float = 1) -> None:
        self.n += n
        if self.every == 0:
            self._line()

    def set_postfix(self, ordered_dict: dict | None = None, refresh: bool = True, **kw: Any) -> None:
        self.postfix = {**(ordered_dict or {}), **kw}

    def write(self, s: str, file: TextIO | None = None) -> None:
        print(s, file=file or self.file, flush=True)

    def _line(self) -> None:
        elapsed = time.monotonic() - self.start
        n, total = self.n, self.total
        head = (f"{self.desc}: {self.unit} {n:g}" + (f"/{total:g} ({100 * n / total:.0f}%)" if total else "")
                if self.unit else self.desc)  # a phase (:func:`phase`) has no count
        parts = [head, f"{elapsed:.0f} s elapsed"]
        done_here = n - self.initial
        if total and done_here > 0:  # the rate of this process's own work (issue 51: a resume's skipped cells)
            parts.append(f"ETA {elapsed * max(total - n, 0) / done_here:.0f} s")
        parts += [f"{k}={v}" for k, v in dict(self.postfix).items()]
        with _LINE_LOCK:
            self.file.write(", ".join(parts) + "\n")
            self.file.flush()
        self.printed = True

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
        if self.printed and self.every > 0:  # long work that reported ends with its final count
            self._line()
            self.printed = False

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress_bar(total: int | float | None, desc: str, enabled: bool | None = None, unit: str = "step",
                 **tqdm_kw: Any) -> Any:
    """A tqdm bar on a terminal, plain lines elsewhere, nothing when ``enabled`` is False."""
    if enabled is False:
        return tqdm(total=total, disable=True)
    if enabled or sys.stderr.isatty():
        return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, **tqdm_kw)
    return PlainProgress(total, desc, unit, initial=tqdm_kw.get("initial", 0))


@contextlib.contextmanager
def phase(desc: str, enabled: bool | None = None) -> Iterator[None]:
    """A stretch of work with no count of its own (HE set-up, the final evaluation, the attacks): off a
    terminal, a line every interval while it lasts (``HE set-up, 30 s elapsed``), so a log never goes
    quiet for longer (issue 51); on a terminal or when disabled, nothing (tqdm's bars speak there)."""
    if enabled is False or sys.stderr.isatty():
        yield
        return
    ticker = PlainProgress(None, desc, unit="")
    try:
        yield
    finally:
        ticker.close()
