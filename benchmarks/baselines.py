"""Utility of the baselines over several seeds, as a markdown table (mean ± std).

    python benchmarks/baselines.py --dataset fashion-mnist --methods splitnn local --seeds 0 1 2 --epochs 5
"""

from __future__ import annotations

import argparse
import statistics

from securevfl.config import RunConfig
from securevfl.lab.compose import execute


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="fashion-mnist")
    ap.add_argument("--methods", nargs="+", default=["splitnn", "local"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--parties", type=int, default=2)
    args = ap.parse_args()
    print(f"| method | test metric (mean ± std over seeds {args.seeds}) | seconds per run | MB sent |")
    print("|---|---|---|---|")
    for m in args.methods:
        vals, secs, mb = [], [], []
        for s in args.seeds:
            cfg = RunConfig(dataset=args.dataset, method=m, seed=s)
            cfg.train.epochs = args.epochs
            cfg.partition.n_parties = args.parties
            r = execute(cfg, progress=False).result
            vals.append(r["utility"]["test"])
            secs.append(r["cost"]["seconds"])
            mb.append(r["cost"]["bytes_sent"] / 1e6)
            metric = r["utility"]["metric"]
        sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
        print(f"| {m} | {metric} {statistics.mean(vals):.4f} ± {sd:.4f} | {statistics.mean(secs):.1f} | "
              f"{statistics.mean(mb):.1f} |", flush=True)


if __name__ == "__main__":
    main()
