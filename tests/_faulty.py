"""Cells and a cell function for the worker-death fault-injection test, standard library only: spawned
workers import this module, and must start in a fraction of a second."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from securevfl.procs import die_with_parent


@dataclass
class FakeCell:
    seed: int
    run_id: str = ""
    method: str = "m"
    defense: str = "none"
    family: str = "none"
    strength: float | None = None
    he: str = "off"
    config: dict = field(default_factory=lambda: {"dataset": "d"})
    swept: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.run_id = f"cell{self.seed}"


def init(share: int, parent: int) -> None:
    die_with_parent(parent)


def _row(cell: FakeCell) -> dict:
    time.sleep(0.3)
    return {"run_id": cell.run_id, "status": "ok", "error": None, "seed": cell.seed}


def die_once(cell: FakeCell, sweep: str) -> dict:
    """The first cell any worker runs kills that worker (kill -9 of itself), once per test."""
    try:
        os.close(os.open(Path(os.environ["HARDEN_MARKER"]), os.O_CREAT | os.O_EXCL))
        os.kill(os.getpid(), signal.SIGKILL)
    except FileExistsError:
        pass
    return _row(cell)


def die_always(cell: FakeCell, sweep: str) -> dict:
    """Cell 0 kills its worker every time (a cell that runs out of memory)."""
    if cell.seed == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    return _row(cell)
