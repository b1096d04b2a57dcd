"""Passive vs active model completion on digits halves (splitnn, 10 epochs, seeds 0–2), under the
federation's adam (lr 1e-3) and SGD (lr 1e-2, momentum 0.9): the MC value, its random-init control,
and, for ``mc-active``, the gain over the passive attack on the same seed. ``--specs`` adds variants
(e.g. ``mc-active:gamma=0`` to separate the malicious scaling from the adversary's own step size).

    python benchmarks/mc_active.py
"""

from __future__ import annotations

import argparse
import statistics

from securevfl.config import RunConfig
from securevfl.lab.compose import execute

LR = {"adam": 1e-3, "sgd": 1e-2}


def run(spec: str, optimizer: str, seed: int, epochs: int) -> dict:
    cfg = RunConfig(dataset="digits", method="splitnn", seed=seed, attacks=[spec])
    cfg.train.epochs = epochs
    cfg.optim.optimizer, cfg.optim.lr = optimizer, LR[optimizer]
    out = execute(cfg, progress=False).to_json()
    a = next(iter(out["attacks"].values()))
    return {"utility": out["utility"]["test"], "value": a["value"], "control": a["control"]}


def ms(vals: list[float]) -> str:
    return f"{statistics.mean(vals):.3f} ± {statistics.stdev(vals):.3f}" if len(vals) > 1 else f"{vals[0]:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--specs", nargs="+", default=["mc-active", "mc-active:gamma=0", "mc-active:mal_lr=0.1",
                                                     "mc-active:mal_lr=0.1,gamma=0", "mc-active:mal_lr=0"])
    args = ap.parse_args()
    print("| federation optimizer | attack | utility | MC value | control (random init) | gain over passive mc |")
    print("|---|---|---|---|---|---|")
    for opt in ("adam", "sgd"):
        passive = [run("mc:baseline=false", opt, s, args.epochs) for s in args.seeds]
        print(f"| {opt} | mc (passive) | {ms([r['utility'] for r in passive])} | "
              f"{ms([r['value'] for r in passive])} | {ms([r['control'] for r in passive])} | – |", flush=True)
        for spec in args.specs:
            full = spec + ("," if ":" in spec else ":") + "baseline=false"
            rows = [run(full, opt, s, args.epochs) for s in args.seeds]
            gain = [r["value"] - p["value"] for r, p in zip(rows, passive, strict=True)]
            per_seed = ", ".join(f"{g:+.3f}" for g in gain)
            print(f"| {opt} | {spec} | {ms([r['utility'] for r in rows])} | {ms([r['value'] for r in rows])} | "
                  f"{ms([r['control'] for r in rows])} | {ms(gain)} (per seed {per_seed}) |", flush=True)


if __name__ == "__main__":
    main()
