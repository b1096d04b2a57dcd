"""Model-completion leakage vs utility under ISO (FedHSSL Fig. 4 / Table 6 setting): Fashion-MNIST,
2 parties, 200 labeled aligned rows, 20 % aligned, 40 auxiliary labels for the adversary.

    python benchmarks/mc_tradeoff.py --out runs/mc_tradeoff.jsonl --seeds 0 1 2

Each finished run is appended to ``--out`` and skipped on rerun (resumable); ``--read`` adds result
files of parallel runs to the final table (mean ± std over seeds). Fine-tuning as in
benchmarks/ssl_table2.py (SGD, lr from {0.005, 0.01, 0.03} on a validation split).
"""

from __future__ import annotations

import argparse
import statistics
from functools import partial

from runlog import append, load, mean_std, paper_finetuning

from securevfl.config import RunConfig
from securevfl.errors import TrainingDiverged
from securevfl.lab.compose import execute

KEY = ("method", "iso", "seed")
fmt = partial(mean_std, digits=3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="fashion-mnist")
    ap.add_argument("--methods", nargs="+", default=["splitnn", "fedlocal-simsiam", "fedhssl"])
    ap.add_argument("--iso", nargs="+", type=float, default=[0, 1, 5, 25])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--labels", type=int, default=200)
    ap.add_argument("--aligned", type=float, default=0.2)
    ap.add_argument("--ssl-epochs", type=int, default=5)
    ap.add_argument("--out", default="runs/mc_tradeoff.jsonl")
    ap.add_argument("--read", nargs="*", default=[])
    ap.add_argument("--table-only", action="store_true")
    args = ap.parse_args()
    done = load([args.out], KEY)
    if not args.table_only:
        for method in args.methods:
            for lam in args.iso:
                for seed in args.seeds:
                    if (method, lam, seed) in done:
                        continue
                    cfg = RunConfig(dataset=args.dataset, method=method, seed=seed, attacks=["mc"],
                                    defense="none" if lam == 0 else f"iso:{lam:g}")
                    cfg.partition.aligned_fraction, cfg.partition.n_labeled = args.aligned, args.labels
                    paper_finetuning(cfg, 40, 64)
                    cfg.model.bottom = "mlp"
                    if method != "splitnn":
                        cfg.method_params = {"ssl_epochs": args.ssl_epochs}
                    try:
                        r = execute(cfg, progress=False).result
                    except TrainingDiverged as e:  # recorded, shown as "diverged" in the table
                        row = {"method": method, "iso": lam, "seed": seed, "diverged": str(e)}
                    else:
                        mc = r["attacks"]["mc"]
                        row = {"method": method, "iso": lam, "seed": seed, "utility": r["utility"]["test"],
                               "mc": mc["value"], "mc_test": mc["test"], "prior": mc["prior"],
                               "baseline": mc.get("baseline"), "seconds": r["cost"]["seconds"]}
                    append(args.out, row)
                    done[(method, lam, seed)] = row
    done = load([args.out, *args.read], KEY)
    print("\n| method | ISO λ | utility (test acc) | MC accuracy (adversary's train rows) | MC on test rows | "
          "local-SSL MC baseline | prior |")
    print("|---|---|---|---|---|---|---|")
    for method in args.methods:
        for lam in args.iso:
            rows = [done[(method, lam, s)] for s in args.seeds if (method, lam, s) in done]
            diverged = sum("diverged" in r for r in rows)
            rows = [r for r in rows if "diverged" not in r]
            if diverged:
                print(f"| {method} | {lam:g} | diverged in {diverged} of {diverged + len(rows)} seeds | | | | |")
            if not rows:
                continue
            print(f"| {method} | {lam:g} | {fmt([r['utility'] for r in rows])} | {fmt([r['mc'] for r in rows])} | "
                  f"{fmt([r['mc_test'] for r in rows])} | {fmt([r['baseline'] for r in rows])} | "
                  f"{statistics.mean(r['prior'] for r in rows):.3f} |")


if __name__ == "__main__":
    main()
