"""FedUD vs local, splitnn, fedlocal-simsiam and fedhssl (paper Table 2): test AUC and
LogLoss on all test rows, on the aligned ones (the guest holds them) and on the unaligned ones
(host only). Partition: the host (active party) holds every training row with labels, the guest
only the aligned ones (``unaligned: active``); the test rows are aligned in the same proportion as
the training rows (``test_aligned_fraction: train``). Every method predicts unaligned test rows
without the guest: FedUD with Rep, the other VFL methods with a zero guest input, ``local`` alone.
Fine-tuning: SGD with the learning rate chosen from {0.005, 0.01, 0.03} on a validation split.

    python benchmarks/fedud_table2.py --dataset uci-credit --data-path ../shared/data/uci_credit_card.csv \
        --aligned 0.2 --out runs/fedud_credit.jsonl

Resumable: finished runs are appended to ``--out`` and skipped on rerun.
"""

from __future__ import annotations

import argparse

from runlog import append, load, mean_std, paper_finetuning

from securevfl.config import RunConfig
from securevfl.lab.compose import execute

KEY = ("method", "aligned", "seed")
COLS = [("test", "auc"), ("test", "logloss"), ("aligned", "auc"), ("aligned", "logloss"),
        ("unaligned", "auc"), ("unaligned", "logloss")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="uci-credit")
    ap.add_argument("--data-path")
    ap.add_argument("--fields")
    ap.add_argument("--max-rows", type=int)
    ap.add_argument("--methods", nargs="+", default=["local", "splitnn", "fedlocal-simsiam", "fedhssl", "fedud"])
    ap.add_argument("--aligned", type=float, default=0.2, help="aligned fraction of training rows")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--ssl-epochs", type=int, default=5)
    ap.add_argument("--preset", help="model preset, e.g. fedud")
    ap.add_argument("--out", default="runs/fedud.jsonl")
    args = ap.parse_args()
    done = load([args.out], KEY)
    for method in args.methods:
        for seed in args.seeds:
            if (method, args.aligned, seed) in done:
                continue
            cfg = RunConfig(dataset=args.dataset, method=method, seed=seed)
            cfg.data.path, cfg.data.max_rows, cfg.partition.columns = args.data_path, args.max_rows, args.fields
            cfg.partition.aligned_fraction, cfg.partition.unaligned = args.aligned, "active"
            cfg.partition.active_labels_unaligned, cfg.partition.test_aligned_fraction = True, "train"
            cfg.model.preset = args.preset
            if method.startswith(("fedlocal", "fedhssl")):
                cfg.method_params = {"ssl_epochs": args.ssl_epochs}
            paper_finetuning(cfg, args.epochs)
            r = execute(cfg, progress=False).to_json()
            u = r["utility"]
            row = {"method": method, "aligned": args.aligned, "seed": seed, "seconds": r["cost"]["seconds"],
                   "rows": {k: u[k]["rows"] for k in ("aligned", "unaligned")},
                   **{f"{part}_{m}": (u[m] if part == "test" else u[part][m]) for part, m in COLS}}
            append(args.out, row)
            done[(method, args.aligned, seed)] = row
    rows = next(iter(done.values()))["rows"] if done else {}
    print(f"\n{args.dataset}, {args.aligned * 100:g} % aligned, test rows {rows}; mean ± std over seeds "
          f"{args.seeds}\n")
    print("| method | overall AUC | overall LogLoss | aligned AUC | aligned LogLoss | unaligned AUC | "
          "unaligned LogLoss |")
    print("|---|" + "---|" * len(COLS))
    for method in args.methods:
        cells = [mean_std([done[(method, args.aligned, s)][f"{p}_{m}"] for s in args.seeds
                           if (method, args.aligned, s) in done]) for p, m in COLS]
        print(f"| {method} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
