"""Running sweep cells: a small engine interface, local processes by default, Ray when installed.

Workers execute :func:`run_cell` and return a finished row; the sweep process alone writes the
store, committing each row as it arrives (a kill loses only the cells in flight).
"""

from __future__ import annotations

import importlib.util
import os
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from itertools import islice
from multiprocessing import get_context
from typing import Any

from securevfl.errors import UserError
from securevfl.lab.sweep import Cell
from securevfl.lab.worker import init_worker
from securevfl.registry import Registry

OnResult = Callable[[dict], None]


def _one_line(text: str) -> str:
    return " ".join(str(text).split())[:500]


def run_cell(cell: Cell, sweep: str) -> dict:
    """Run one cell and return its store row; any exception becomes a ``failed`` row."""
    from securevfl.lab.compose import execute
    from securevfl.lab.sweep import config_from_dict

    row = {"run_id": cell.run_id, "sweep": sweep, "dataset": cell.config["dataset"], "method": cell.method,
           "defense": cell.defense, "defense_family": cell.family, "strength": cell.strength, "seed": cell.seed,
           "he": cell.he, "swept_json": cell.swept, "config_json": cell.config}
    try:
        r = execute(config_from_dict(cell.config), progress=False).to_json()
    except UserError as e:  # includes TrainingDiverged: the configuration, not the code, failed
        return {**row, "status": "failed", "error": _one_line(f"{type(e).__name__}: {e}")}
    except Exception as e:  # noqa: BLE001  (a cell's bug must not stop the sweep; keep the trace)
        tb = traceback.format_exc(limit=-3)
        return {**row, "status": "failed", "error": _one_line(f"{type(e).__name__}: {e} | {tb}")}
    return {**row, "status": "ok", "error": None, "result_json": r, "utility": r["utility"]["test"],
            "utility_metric": r["utility"]["metric"], "epsilon": r["privacy"].get("epsilon"),
            "privacy_status": r["privacy"].get("status"),
            "epsilon_audit": (r["privacy"].get("audit") or {}).get("epsilon_lower"),
            "seconds": r["cost"]["seconds"], "bytes_sent": r["cost"]["bytes_sent"], "versions_json": r["versions"]}


class Engine(ABC):
    """Runs sweep cells. To add one: subclass, set :attr:`name`, implement :meth:`run` (each cell
    through :func:`run_cell`, rows handed back to this process) and add it to :data:`ENGINES`."""

    name: str
    """The ``--engine`` name."""

    def __init__(self, workers: int | str) -> None:  # the --workers value: anything but a count ≥ 1 is refused
        if not isinstance(workers, int) or workers < 1:
            raise UserError(f"--workers must be ≥ 1, got {workers}")
        self.workers = workers

    @abstractmethod
    def run(self, cells: Iterable[Cell], sweep: str, on_result: OnResult) -> None:
        """Run every cell, calling ``on_result(row)`` in this process as each finishes.

        Args:
            cells: the cells to run, pulled lazily (a cell is claimed in the store when pulled).
            sweep: the sweep's name, stored with each row.
            on_result: receives each finished row (:func:`run_cell`'s dict); only this process
                writes the store.
        """


class LocalEngine(Engine):
    """``--workers 1``: cells run one after another in this process; ``N > 1``: a pool of N
    spawned processes that stay up for the whole sweep, each with a ``1/N`` share of the idle cores
    (:mod:`securevfl.threads`)."""

    name = "local"

    def run(self, cells: Iterable[Cell], sweep: str, on_result: OnResult) -> None:
        if self.workers == 1:
            for cell in cells:
                on_result(run_cell(cell, sweep))
            return
        from securevfl.threads import idle_cores, share_for

        pool = ProcessPoolExecutor(self.workers, mp_context=get_context("spawn"), initializer=init_worker,
                                   initargs=(share_for(self.workers, idle=idle_cores()), os.getpid()))
        todo = iter(cells)  # pulled lazily: a cell is claimed in the store only when a worker is free
        try:
            pending = {pool.submit(run_cell, c, sweep) for c in islice(todo, self.workers)}
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    on_result(f.result())
                    pending |= {pool.submit(run_cell, c, sweep) for c in islice(todo, 1)}
        finally:
            pool.shutdown(wait=False, cancel_futures=True)


ENGINES: Registry[type[Engine]] = Registry("engine")
"""Sweep engines by ``--engine`` name."""
ENGINES.register(LocalEngine)
if importlib.util.find_spec("ray") is not None:  # an optional extra, imported only when a sweep asks for it
    ENGINES.register_lazy("ray", "securevfl.lab.ray_engine:RayEngine")
else:
    ENGINES.refuse("ray", "--engine ray needs the optional extra: pip install 'securevfl[ray]'")


def make_engine(name: str, workers: int | str) -> Engine:
    """The ``--engine`` called ``name`` with ``workers`` workers (a UserError for an unknown name,
    a missing extra or a bad worker count)."""
    return ENGINES.get(name)(workers)


def run_sweep(path: str, store_path: str | None = None, workers: int | str = 1, engine: str = "local",
              progress: bool = True) -> dict:
    """Run a sweep file into its store, skipping rows already ``ok``. Returns counts. ``workers="auto"``:
    one per idle core, at most one per cell."""
    import sys

    from tqdm.auto import tqdm

    from securevfl.lab.store import Store
    from securevfl.lab.sweep import config_from_dict, load_sweep
    from securevfl.validate import validate_config

    sweep = load_sweep(path)
    for cell in sweep.cells:  # a bad value fails the sweep before any cell runs, naming the cell
        try:
            validate_config(config_from_dict(cell.config))
        except UserError as e:
            raise UserError(f"sweep file {path}: cell {cell.method} / {cell.defense} / seed {cell.seed}: {e}") from None
    if workers == "auto":
        from securevfl.threads import workers_auto

        workers = workers_auto(len(sweep.cells))
    runner = make_engine(engine, workers)
    store = Store(store_path or f"runs/{sweep.name}.sqlite")
    done = store.completed()
    todo = [c for c in sweep.cells if c.run_id not in done]
    counts: dict[str, Any] = {"cells": len(sweep.cells), "skipped": len(sweep.cells) - len(todo), "ok": 0, "failed": 0,
              "elsewhere": 0, "store": str(store.path)}

    def claimed():  # a cell another live sweep on this store is computing is left to it
        for cell in todo:
            if store.claim(cell.run_id):
                yield cell
            else:
                counts["elsewhere"] += 1
                bar.update(1)
    import shutil

    # a terminal that reports zero columns (some CI consoles, `stty cols 0`) would get an empty bar
    width = shutil.get_terminal_size(fallback=(80, 24)).columns
    bar = tqdm(total=len(sweep.cells), initial=counts["skipped"], desc=f"sweep {sweep.name}", unit="cell",
               disable=not progress, file=sys.stderr, dynamic_ncols=width > 0, ncols=None if width > 0 else 80)

    def on_result(row: dict) -> None:
        store.put(row)
        counts[row["status"]] += 1
        bar.update(1)
        bar.set_postfix(ok=counts["ok"], failed=counts["failed"])
        if row["status"] == "failed":
            bar.write(f"cell {row['method']} / {row['defense']} / seed {row['seed']} failed: {row['error'][:200]}",
                      file=sys.stderr)

    try:
        runner.run(claimed(), sweep.name, on_result)
    finally:
        bar.close()
        store.close()
    return counts
