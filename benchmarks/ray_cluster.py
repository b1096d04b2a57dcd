"""A sweep on a Ray cluster of two nodes against one node (issue 53): wall time, cells per node, and what
losing the worker node mid-sweep costs.

    python benchmarks/ray_cluster.py --seeds 8 --epochs 8

Three runs of the same sweep (digits, ``splitnn``, ``--seeds`` seeds, one CPU per cell,
``OMP_NUM_THREADS=1``), each on a fresh cluster of ``ray start`` processes on this machine standing in
for machines (loopback; each node with ``--num-cpus 1``):

1. one node (the head), ``--workers 1``;
2. a head and a worker node, ``--workers 2``;
3. the same two nodes, the worker node killed (SIGKILL of its raylet's process group) once it has
   finished a cell: its cell in flight runs again on the head.

Each cell's node comes from the store (column ``node``). Prints one markdown table.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
RAY = str(Path(sys.executable).parent / "ray")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([RAY, "start", *args, "--node-ip-address", "127.0.0.1", "--num-cpus", "1",
                             "--disable-usage-stats", "--block"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, env=ENV)


def _wait(port: int, n: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        out = subprocess.run([RAY, "status", "--address", f"127.0.0.1:{port}"], capture_output=True, text=True,
                             env=ENV).stdout
        if out.split("Active:")[-1].split("Pending:")[0].count("node_") >= n:
            return
        time.sleep(1.0)
    raise SystemExit(f"the cluster did not reach {n} nodes")


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


def _rows(store: Path) -> list[tuple]:
    try:
        with sqlite3.connect(store) as db:
            return db.execute("SELECT seed, status, node FROM runs").fetchall()
    except sqlite3.OperationalError:
        return []


def run(nodes: int, kill: bool, sweep: Path, folder: Path) -> dict:
    port = _port()
    procs = [_start("--head", "--port", str(port), "--include-dashboard=false")]
    try:
        _wait(port, 1)
        if nodes == 2:
            procs.append(_start("--address", f"127.0.0.1:{port}"))
            _wait(port, 2)
        store = folder / f"n{nodes}{'k' if kill else ''}.sqlite"
        t0 = time.perf_counter()
        sweep_proc = subprocess.Popen([sys.executable, "-m", "securevfl", "sweep", str(sweep), "--engine", "ray",
                                       "--workers", str(nodes), "--store", str(store), "--quiet"],
                                      env={**ENV, "RAY_ADDRESS": f"127.0.0.1:{port}"}, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True)
        killed_at = None
        if kill:
            while len({n for *_, n in _rows(store)}) < 2 and sweep_proc.poll() is None:
                time.sleep(0.2)
            killed_at = len(_rows(store))
            os.killpg(procs[1].pid, signal.SIGKILL)
        _, err = sweep_proc.communicate(timeout=3600)
        wall = time.perf_counter() - t0
        if sweep_proc.returncode:
            raise SystemExit(f"sweep failed: {err.strip().splitlines()[-1] if err.strip() else sweep_proc.returncode}")
        rows = _rows(store)
        return {"nodes": nodes, "kill": kill, "wall_s": round(wall, 1), "cells": len(rows),
                "ok": sum(s == "ok" for _, s, _ in rows), "per_node": dict(Counter(n for *_, n in rows)),
                "killed_after_cells": killed_at}
    finally:
        _stop(procs[::-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        sweep = folder / "s.yaml"
        sweep.write_text(f"name: nodes\ndataset: digits\nmethods: [splitnn]\ndefenses: [none]\n"
                         f"seeds: {list(range(args.seeds))}\ntrain: {{epochs: {args.epochs}}}\n")
        results = [run(1, False, sweep, folder), run(2, False, sweep, folder), run(2, True, sweep, folder)]
    base = results[0]["wall_s"]
    print("| cluster | cells (ok) | wall s | speed-up vs one node | cells per node |")
    print("|---|---|---|---|---|")
    for r in results:
        what = "one node" if r["nodes"] == 1 else "head + worker" + (
            f", worker killed after {r['killed_after_cells']} cells" if r["kill"] else "")
        per = ", ".join(f"`{n}`: {c}" for n, c in sorted(r["per_node"].items()))
        print(f"| {what} | {r['cells']} ({r['ok']}) | {r['wall_s']} | {base / r['wall_s']:.2f} | {per} |")


if __name__ == "__main__":
    main()
