"""Running sweep cells: a small engine interface, local processes by default, Ray when installed.

Workers execute :func:`run_cell` and return a finished row; the sweep process alone writes the
store, committing each row as it arrives (a kill loses only the cells in flight).
"""

from __future__ import annotations

import importlib.util
import json
import os
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from securevfl.errors import UserError
from securevfl.lab.sweep import Cell
from securevfl.lab.worker import init_worker
from securevfl.procs import spawn_pool
from securevfl.registry import Registry

OnResult = Callable[[dict], None]


def _one_line(text: str) -> str:
    return " ".join(str(text).split())[:500]


def dataset_label(config: dict) -> str:
    """How the store and the report name a cell's data: the dataset, and for one's own files (``csv``)
    the active party's file too (``csv: default_credit_guest``), so two sweeps over different files are
    told apart and a reader sees which data it was."""
    name = str(config.get("dataset"))
    files = (config.get("data") or {}).get("party_files") or []
    return f"{name}: {Path(str(files[0])).stem}" if name == "csv" and files else name


def cell_row(cell: Cell, sweep: str) -> dict:
    """The store columns a cell's row has whatever its outcome."""
    return {"run_id": cell.run_id, "sweep": sweep, "dataset": dataset_label(cell.config), "method": cell.method,
            "defense": cell.defense, "defense_family": cell.family, "strength": cell.strength, "seed": cell.seed,
            "he": cell.he, "swept_json": cell.swept, "config_json": cell.config}


def run_cell(cell: Cell, sweep: str, node: str | None = None) -> dict:
    """Run one cell and return its store row; any exception becomes a ``failed`` row. ``node``: where it
    runs (a Ray node's name; default this host's)."""
    import socket

    from securevfl.lab.compose import execute
    from securevfl.lab.sweep import config_from_dict

    row = {**cell_row(cell, sweep), "node": node or socket.gethostname()}
    try:
        r = execute(config_from_dict(cell.config), progress=False, save=cell.save).to_json()
    except UserError as e:  # includes TrainingDiverged: the configuration, not the code, failed
        return {**row, "status": "failed", "error": _one_line(f"{type(e).__name__}: {e}")}
    except Exception as e:  # noqa: BLE001  (a cell's bug must not stop the sweep; keep the trace)
        tb = traceback.format_exc(limit=-3)
        return {**row, "status": "failed", "error": _one_line(f"{type(e).__name__}: {e} | {tb}")}
    return {**row, "status": "ok", "error": None, "result_json": r, "utility": r["utility"]["test"],
            "utility_metric": r["utility"]["metric"], "epsilon": r["privacy"].get("epsilon"),
            "privacy_status": r["privacy"].get("status"),
            "epsilon_audit": (r["privacy"].get("audit") or {}).get("epsilon_lower"),
            "seconds": r["cost"]["seconds"], "bytes_sent": r["cost"]["bytes_sent"], "versions_json": r["versions"],
            "version": r["versions"]["securevfl"]}


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

    cell_fn: Callable[[Cell, str], dict] = staticmethod(run_cell)  # type: ignore[assignment]
    """What a worker runs per cell (a module-level function, so spawned workers can import it)."""

    worker_init: Callable[[int, int], None] = staticmethod(init_worker)  # type: ignore[assignment]
    """Each worker's start-up: (thread share, sweep pid)."""

    max_breaks = 2
    """A cell whose worker died this many times while it ran alone is recorded failed, not retried."""

    def run(self, cells: Iterable[Cell], sweep: str, on_result: OnResult) -> None:
        if self.workers == 1:
            for cell in cells:
                on_result(self.cell_fn(cell, sweep))
            return
        todo = iter(cells)  # pulled lazily: a cell is claimed in the store only when a worker is free
        # cells in flight when a worker died (killed, out of memory): which one it ran is unknown, so each
        # is retried alone; a death while one cell runs alone is that cell's, counted in `breaks`
        suspects: list[Cell] = []
        breaks: dict[str, int] = {}
        pool = self._pool()
        pending: dict[Future, Cell] = {}

        def fill() -> None:
            if suspects:
                if not pending:
                    cell = suspects.pop(0)
                    pending[pool.submit(self.cell_fn, cell, sweep)] = cell
                return
            while len(pending) < self.workers:
                nxt = next(todo, None)
                if nxt is None:
                    return
                pending[pool.submit(self.cell_fn, nxt, sweep)] = nxt

        try:
            fill()
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                lost: list[Cell] = []
                for f in done:
                    cell = pending.pop(f)
                    try:
                        row = f.result()
                    except BrokenProcessPool:
                        lost.append(cell)
                        continue
                    on_result(row)
                if lost:  # the pool is broken: every cell still in it is lost with it
                    lost += pending.values()
                    pending.clear()
                    pool.shutdown(wait=True, cancel_futures=True)  # its processes are gone: joins at once
                    if len(lost) == 1:
                        (cell,) = lost
                        breaks[cell.run_id] = breaks.get(cell.run_id, 0) + 1
                        if breaks[cell.run_id] >= self.max_breaks:
                            on_result({**cell_row(cell, sweep), "status": "failed",
                                       "error": f"a worker process died while running this cell ({self.max_breaks} "
                                                "times: killed, or out of memory)"})
                        else:
                            suspects.insert(0, cell)
                    else:
                        suspects[:0] = lost
                    pool = self._pool()
                fill()
        except BaseException:  # interrupted: do not wait for cells in flight
            stop_workers(pool)
            raise
        # every cell is done: let the workers exit and release their semaphores (no "leaked semaphore"
        # warning at exit)
        pool.shutdown(wait=True)

    def _pool(self) -> ProcessPoolExecutor:
        from securevfl.threads import idle_cores, share_for

        return spawn_pool(self.workers, initializer=self.worker_init,
                          initargs=(share_for(self.workers, idle=idle_cores()), os.getpid()))


def stop_workers(pool: ProcessPoolExecutor) -> None:
    """End a pool now, its cells in flight included: ``kill -INT`` reaches this process only, and the
    executor's exit would otherwise wait for every running cell (issue 51: 591 s). Their claims in the
    store die with this process, so a rerun takes them over; finished cells are already stored."""
    procs = list((getattr(pool, "_processes", None) or {}).values())  # the executor's own table of workers
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()


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
              progress: bool = True, command: str | None = None, take_over_leases: bool = False) -> dict:
    """Run a sweep file into its store, skipping rows already ``ok``. Returns counts. ``workers="auto"``:
    one per idle core, at most one per cell. ``command``: the command line to record with the sweep
    file's provenance (default: the equivalent ``securevfl sweep`` command). ``take_over_leases``:
    run cells other sweeps claim too."""
    import sys

    from securevfl.configuration.validate import validate_config
    from securevfl.devices import resolve_device
    from securevfl.lab.store import Store
    from securevfl.lab.sweep import config_from_dict, load_sweep
    from securevfl.progress import progress_bar

    sweep = load_sweep(path)
    for cell in sweep.cells:  # a bad value fails the sweep before any cell runs, naming the cell
        try:
            cfg = config_from_dict(cell.config)
            validate_config(cfg)
            if engine == "local":  # its workers are this machine's processes: a device it lacks fails here once
                resolve_device(cfg.device)
        except UserError as e:
            raise UserError(f"sweep file {path}: cell {cell.method} / {cell.defense} / seed {cell.seed}: {e}") from None
    unique = list({c.run_id: c for c in sweep.cells}.values())  # equal configurations: one row, computed once
    if len(unique) < len(sweep.cells):
        print(f"sweep {sweep.name}: {len(sweep.cells) - len(unique)} cells repeat another cell's configuration; "
              "each is computed once", file=sys.stderr)
        sweep.cells = unique
    if workers == "auto":
        from securevfl.threads import workers_auto

        workers = workers_auto(len(sweep.cells))
    elif isinstance(workers, int) and workers > (os.cpu_count() or 1):
        print(f"warning: --workers {workers} on a machine with {os.cpu_count()} cores: the cells will compete for "
              "them and memory; --workers auto picks one per idle core", file=sys.stderr)
    runner = make_engine(engine, workers)
    store = Store(store_path or f"runs/{sweep.name}.sqlite")
    store.record_sweep(sweep_provenance(path, sweep.name, command or
                                        f"securevfl sweep {path} --store {store.path} --workers {workers} "
                                        f"--engine {engine}"))
    store.take_over_leases = take_over_leases
    done = store.completed()
    todo = [c for c in sweep.cells if c.run_id not in done]
    counts: dict[str, Any] = {"cells": len(sweep.cells), "skipped": len(sweep.cells) - len(todo), "ok": 0, "failed": 0,
              "elsewhere": 0, "store": str(store.path)}

    def claimed():  # a cell another live sweep on this store is computing is left to it
        for cell in todo:
            if store.claim(cell.run_id):
                counts["started"] += 1  # handed to a worker: the line shows cells running before any ends
                bar.set_postfix(**postfix(), refresh=False)
                yield cell
            else:
                counts["elsewhere"] += 1
                bar.update(1)
    import shutil

    # a terminal that reports zero columns (some CI consoles, `stty cols 0`) would get an empty bar
    width = shutil.get_terminal_size(fallback=(80, 24)).columns
    later = sweep.search.remaining() if sweep.search is not None else 0  # a library search's later rounds
    bar = progress_bar(len(sweep.cells) + later, f"sweep {sweep.name}", None if progress else False, unit="cell",
                       initial=counts["skipped"], dynamic_ncols=width > 0, ncols=None if width > 0 else 80)

    attacked = {"attacks": 0, "attack_s": 0.0}
    counts["started"] = 0

    def postfix() -> dict:
        running = counts["started"] - counts["ok"] - counts["failed"]
        return {"running": running, "ok": counts["ok"], "failed": counts["failed"], "attacks": attacked["attacks"],
                "attack_s": f"{attacked['attack_s']:.0f}"}

    def on_result(row: dict) -> None:
        store.put(row)
        counts[row["status"]] += 1
        found = (row.get("result_json") or {}).get("attacks") if isinstance(row.get("result_json"), dict) else None
        for a in (found or {}).values():  # attacks often cost more than the training they attack: count them
            attacked["attacks"] += 1
            attacked["attack_s"] += float(a.get("seconds") or 0.0) if isinstance(a, dict) else 0.0
        bar.set_postfix(**postfix())
        bar.update(1)
        if row["status"] == "failed":
            bar.write(f"cell {row['method']} / {row['defense']} / seed {row['seed']} failed: {row['error'][:200]}",
                      file=sys.stderr)

    try:
        runner.run(claimed(), sweep.name, on_result)
        for t in range(1, sweep.search.budget if sweep.search is not None else 1):
            assert sweep.search is not None
            # the searcher is rebuilt from the store each round: a resumed sweep asks what it asked before
            results = {r["run_id"]: json.loads(r["result_json"]) for r in store.rows()
                       if r["status"] == "ok" and r["result_json"]}
            new = sweep.search.next_round(t, results)
            done = store.completed()
            todo = [c for c in new if c.run_id not in done]
            counts["cells"] += len(new)
            counts["skipped"] += len(new) - len(todo)
            bar.update(len(new) - len(todo))
            runner.run(claimed(), sweep.name, on_result)
    finally:
        bar.close()
        store.close()
    counts.pop("started")
    return counts


def sweep_provenance(path: str, name: str, command: str) -> dict:
    """What a report needs to say which file, code and command produced a sweep's rows."""
    import hashlib
    import time
    from pathlib import Path

    from securevfl.operations import provenance

    raw = Path(path).read_bytes()
    return {"name": name, "path": str(path), "sha256": hashlib.sha256(raw).hexdigest(),
            "text": raw.decode("utf-8", errors="replace"), "command": command, "version": provenance.version(),
            "git_commit": provenance.git_commit(), "started_at": time.time()}
