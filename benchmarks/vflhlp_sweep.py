"""VFLHLP vs splitnn vs local (and the ablations) with the aligned count swept (paper
Tables 2–3 and Fig. 5). The active party holds labels for all its local rows; fine-tuning uses SGD
with the learning rate chosen from {0.005, 0.01, 0.03} on a validation split.

    python benchmarks/vflhlp_sweep.py --dataset uci-credit --data-path ../shared/data/uci_credit_card.csv \
        --aligned 0.005 0.02 0.08 0.16 --out runs/vflhlp_credit.jsonl

Resumable: finished runs are appended to ``--out`` and skipped on rerun; ``--read`` merges the
result files of parallel runs into the final table (mean ± std over seeds).
"""

from __future__ import annotations

import argparse

from runlog import append, load, mean_std, paper_finetuning

from securevfl.config import RunConfig
from securevfl.lab.compose import execute

KEY = ("method", "aligned", "seed")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="uci-credit")
    ap.add_argument("--data-path")
    ap.add_argument("--fields")
    ap.add_argument("--max-rows", type=int)
    ap.add_argument("--preset", help="model preset, e.g. vflhlp-criteo (paper Table 1)")
    ap.add_argument("--methods", nargs="+", default=["local", "splitnn", "vflhlp", "vflhlp-a", "vflhlp-p"])
    ap.add_argument("--aligned", nargs="+", type=float, default=[0.005, 0.02, 0.08, 0.16],
                    help="aligned fraction of training rows")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--out", default="runs/vflhlp.jsonl")
    ap.add_argument("--read", nargs="*", default=[])
    ap.add_argument("--table-only", action="store_true")
    args = ap.parse_args()
    done = load([args.out], KEY)
    for aligned in [] if args.table_only else args.aligned:
        for method in args.methods:
            for seed in args.seeds:
                if (method, aligned, seed) in done:
                    continue
                cfg = RunConfig(dataset=args.dataset, method=method, seed=seed)
                cfg.data.path, cfg.partition.columns = args.data_path, args.fields
                cfg.data.max_rows, cfg.model.preset = args.max_rows, args.preset
                cfg.partition.aligned_fraction, cfg.partition.active_labels_unaligned = aligned, True
                paper_finetuning(cfg, args.epochs)
                r = execute(cfg, progress=False).to_json()
                row = {"method": method, "aligned": aligned, "seed": seed, "aligned_rows": r["partition"]["aligned"],
                       "metric": r["utility"]["metric"], "test": r["utility"]["test"], "seconds": r["cost"]["seconds"]}
                append(args.out, row)
                done[(method, aligned, seed)] = row
    done = load([args.out, *args.read], KEY)
    rows_for = {a: next((r["aligned_rows"] for (m, al, s), r in done.items() if al == a), "?") for a in args.aligned}
    print(f"\n{args.dataset}: test metric, mean ± std over seeds {args.seeds}\n")
    print("| method | " + " | ".join(f"{a * 100:g} % aligned ({rows_for[a]} rows)" for a in args.aligned) + " |")
    print("|---|" + "---|" * len(args.aligned))
    for method in args.methods:
        cells = []
        for a in args.aligned:
            vals = [done[(method, a, s)]["test"] for s in args.seeds if (method, a, s) in done]
            cells.append(mean_std(vals))
        print(f"| {method} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
