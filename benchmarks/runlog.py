"""Shared pieces of the benchmark scripts: running a sweep file for the scripts whose grid is one
(they only format its rows; the paper-style fine-tuning, SGD with the learning rate chosen from
{0.005, 0.01, 0.03}, is ``train: {lr_grid: [...]}`` + ``optim: {optimizer: sgd}`` there), a JSON-lines
run log keyed by the grid coordinates for the one that is not (risa_entity_aug.py), and mean ± std
formatting."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from securevfl.lab.sweep import Cell


def load(paths: list[str | Path], key: tuple[str, ...]) -> dict:
    """Rows of every existing file, keyed by the values of ``key``."""
    done = {}
    for p in map(Path, paths):
        if p.exists():
            for line in p.read_text().splitlines():
                row = json.loads(line)
                done[tuple(row[k] for k in key)] = row
    return done


def append(path: str | Path, row: dict) -> None:
    """Record one finished run (a crash loses at most the run in flight)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with Path(path).open("a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


def mean_std(vals: list[float], digits: int = 4) -> str:
    if not vals:
        return "–"
    sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return f"{statistics.mean(vals):.{digits}f} ± {sd:.{digits}f}"


def run_sweep_file(path: str | Path, store: str | None = None, workers: int = 1) -> list[tuple[Cell, dict]]:
    """Run a sweep file as ``securevfl sweep FILE --store STORE --workers N`` does (into the same store,
    so a rerun skips the cells already done) and return every cell of the file, in grid order, with
    its stored row: ``status``, ``error`` and the run's ``result`` JSON (``None`` unless ok)."""
    from securevfl.lab.engine import run_sweep
    from securevfl.lab.store import Store
    from securevfl.lab.sweep import load_sweep

    cells = load_sweep(path).cells
    counts = run_sweep(str(path), store, workers, progress=False)
    st = Store.open_existing(counts["store"])
    rows = {r["run_id"]: r for r in st.rows()}
    st.close()
    out = []
    for cell in cells:
        r = rows.get(cell.run_id) or {"status": "missing", "error": "not in the store", "result_json": None}
        result = json.loads(r["result_json"]) if r["status"] == "ok" else None
        out.append((cell, {"status": r["status"], "error": r["error"], "result": result}))
    return out


def sweep_from_command_line(what: str) -> list[tuple[Cell, dict]]:
    """The RESULTS scripts' command line, ``SCRIPT SWEEP_FILE [--store S] [--workers N]``: run the file
    (:func:`run_sweep_file`) and return its cells with their rows. ``what`` describes the file's grid."""
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("sweep", help=f"sweep file: {what}")
    ap.add_argument("--store", help="default: runs/<sweep name>.sqlite")
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args()
    return run_sweep_file(args.sweep, args.store, args.workers)
