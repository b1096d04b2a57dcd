"""Test utility (and ε where defined) per method × defense over seeds, as a markdown table.

    python benchmarks/utility.py --dataset fashion-mnist --methods splitnn local --seeds 0 1 2 --epochs 5
    python benchmarks/utility.py --dataset fashion-mnist --methods splitnn --seeds 0 1 --epochs 5 --max-rows 10000 \
        --defenses none iso:5 dp:noise=0.5 dp:noise=1 dp:noise=2 rr:1 rr:2 rr:4
"""

from __future__ import annotations

import argparse
import statistics

from securevfl.config import RunConfig
from securevfl.lab.compose import execute


def fmt(vals: list[float], digits: int = 4) -> str:
    sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return f"{statistics.mean(vals):.{digits}f} ± {sd:.{digits}f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="fashion-mnist")
    ap.add_argument("--methods", nargs="+", default=["splitnn", "local"])
    ap.add_argument("--defenses", nargs="+", default=["none"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--parties", type=int, default=2)
    ap.add_argument("--data-path")
    ap.add_argument("--fields", help="field-to-party preset")
    ap.add_argument("--max-rows", type=int, help="a seeded subset of the dataset")
    ap.add_argument("--optimizer", default="adam")
    ap.add_argument("--lr", type=float)
    args = ap.parse_args()
    print(f"| method | defense | test metric (mean ± std, seeds {args.seeds}) | ε (δ) | s/run | MB sent |")
    print("|---|---|---|---|---|---|")
    for m in args.methods:
        for d in args.defenses:
            vals, secs, mb, eps = [], [], [], []
            for s in args.seeds:
                cfg = RunConfig(dataset=args.dataset, method=m, seed=s, defense=d)
                cfg.train.epochs = args.epochs
                cfg.partition.n_parties = args.parties
                cfg.partition.columns = args.fields
                cfg.data.path = args.data_path
                cfg.data.max_rows = args.max_rows
                cfg.optim.optimizer = args.optimizer
                if args.lr is not None:
                    cfg.optim.lr = args.lr
                r = execute(cfg, progress=False).to_json()
                vals.append(r["utility"]["test"])
                secs.append(r["cost"]["seconds"])
                mb.append(r["cost"]["bytes_sent"] / 1e6)
                eps.append(r["privacy"]["epsilon"])
                metric, delta = r["utility"]["metric"], r["privacy"]["delta"]
            e = "n/a" if eps[0] is None else f"{statistics.mean(eps):.3g} ({delta:g})"
            print(f"| {m} | {d} | {metric} {fmt(vals)} | {e} | {statistics.mean(secs):.1f} | "
                  f"{statistics.mean(mb):.1f} |", flush=True)


if __name__ == "__main__":
    main()
