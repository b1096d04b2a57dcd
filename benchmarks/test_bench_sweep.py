"""One sweep cell end to end (train + attack, as a worker runs it): the unit a sweep's wall time is
made of. The ``--workers 2`` speed-up needs cells of ≥ 10 s and minutes of wall time, so it is
measured by ``benchmarks/bench_sweep_workers.py`` (RESULTS), not here."""

from __future__ import annotations

import yaml
from conftest import timed

from securevfl.lab.engine import run_cell
from securevfl.lab.sweep import load_sweep


def test_sweep_cell(benchmark, targets, tmp_path):
    f = tmp_path / "grid.yaml"
    f.write_text(yaml.safe_dump({"name": "bench-cell", "dataset": {"name": "digits"}, "model": {"bottom": "mlp"},
                                 "methods": ["splitnn"], "defenses": [{"iso": [1]}], "attacks": ["mc-plain"],
                                 "seeds": [0], "train": {"epochs": 5}}))
    cell = load_sweep(str(f)).cells[0]
    mine: list[float] = []
    row = benchmark.pedantic(timed(run_cell, mine), args=(cell, "bench-cell"), rounds=3, iterations=1)
    assert row["status"] == "ok", row.get("error")
    benchmark.extra_info.update(cell_seconds_reported=row["seconds"], utility=row["utility"])
    targets.check(benchmark, "cell seconds", sorted(mine)[len(mine) // 2], None, unit=" s")
