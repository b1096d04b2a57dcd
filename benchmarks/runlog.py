"""Shared pieces of the resumable benchmark scripts: a JSON-lines run log keyed by the grid
coordinates, the paper-style fine-tuning settings, and mean ± std formatting."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from securevfl.config import RunConfig

PAPER_LR_GRID = [0.005, 0.01, 0.03]  # FedHSSL appendix: fine-tuning learning rates


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


def paper_finetuning(cfg: RunConfig, epochs: int, batch_size: int | None = None) -> RunConfig:
    """SGD with the learning rate chosen from the paper's grid on a validation split."""
    cfg.train.epochs = epochs
    if batch_size is not None:
        cfg.train.batch_size = batch_size
    cfg.train.lr_grid = list(PAPER_LR_GRID)
    cfg.optim.optimizer = "sgd"
    return cfg


def mean_std(vals: list[float], digits: int = 4) -> str:
    if not vals:
        return "–"
    sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return f"{statistics.mean(vals):.{digits}f} ± {sd:.{digits}f}"
