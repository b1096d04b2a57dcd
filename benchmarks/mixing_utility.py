"""Test utility with the interactive layer's secret mixing off and on (issue 32: the mixing is HE's
default). HE off, where the mixing runs the same arithmetic in plaintext: HE-on = HE-off step for step
for the same setting (tests/test_he.py), so these are the numbers HE gives, without its cost.

    OMP_NUM_THREADS=1 python benchmarks/mixing_utility.py [--seeds 3]
"""

from __future__ import annotations

import argparse

import numpy as np

from securevfl.config import RunConfig
from securevfl.lab.compose import execute

CASES = [  # (dataset, model fields, optimizer (name, lr) or None for the default)
    ("digits", {}, None),
    ("digits", {"head_hidden": (32,)}, None),
    ("breast-cancer", {}, None),
    ("digits", {"cut_dim": 16}, ("sgd", 0.1)),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    print("| dataset | setting | mixing off | mixing on |\n|---|---|---|---|")
    for ds, model, opt in CASES:
        means = {}
        for mix in ("off", "on"):
            us = []
            for seed in range(args.seeds):
                cfg = RunConfig(dataset=ds, method="splitnn", seed=seed)
                for k, v in model.items():
                    setattr(cfg.model, k, v)
                if opt:
                    cfg.optim.optimizer, cfg.optim.lr = opt
                cfg.model.interactive_mixing = mix
                us.append(execute(cfg, progress=False).to_json()["utility"]["test"])
            means[mix] = f"{np.mean(us):.4f} {np.round(us, 4).tolist()}"
        parts = [f"{k} {v}" for k, v in model.items()] + ([f"{opt[0]} lr {opt[1]}"] if opt else [])
        setting = ", ".join(parts) or "defaults"
        print(f"| {ds} | {setting} | {means['off']} | {means['on']} |", flush=True)


if __name__ == "__main__":
    main()
