"""Sweep wall time with --workers 1 vs --workers 2 on the same grid (issue 10 acceptance).

    python benchmarks/bench_sweep_workers.py [--dataset fashion-mnist --max-rows 5000] [--epochs 10] [--repeats 1]

Runs the same 12-cell grid (splitnn × no defense / ISO 1, 5 × 4 seeds, `mc-plain`; MLP bottoms) through
the CLI into fresh stores, in alternating order, and prints the wall times and their ratio. Each
run is a separate process, so the workers-2 time includes spawning the worker processes.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--max-rows", type=int)
    args = ap.parse_args()
    ds = {"name": args.dataset, "aligned_fraction": 0.5, **({"max_rows": args.max_rows} if args.max_rows else {})}
    grid = {"name": "bench-workers", "dataset": ds, "model": {"bottom": "mlp"},
            "methods": ["splitnn"], "defenses": ["none", {"iso": [1, 5]}], "attacks": ["mc-plain"],
            "seeds": [0, 1, 2, 3], "train": {"epochs": args.epochs}}
    times: dict[int, list[float]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "grid.yaml"
        f.write_text(yaml.safe_dump(grid))
        for rep in range(args.repeats):
            for workers in ([1, 2] if rep % 2 == 0 else [2, 1]):
                store = Path(tmp) / f"w{workers}_{rep}.sqlite"
                t0 = time.perf_counter()
                subprocess.run([sys.executable, "-m", "securevfl", "sweep", str(f), "--store", str(store),
                                "--workers", str(workers), "--quiet"], check=True, capture_output=True)
                times[workers].append(time.perf_counter() - t0)
                print(f"workers {workers}: {times[workers][-1]:.1f} s", flush=True)
    m1, m2 = statistics.mean(times[1]), statistics.mean(times[2])
    print(f"\n12 cells: workers 1 {m1:.1f} s, workers 2 {m2:.1f} s, speed-up {m1 / m2:.2f}×")


if __name__ == "__main__":
    main()
