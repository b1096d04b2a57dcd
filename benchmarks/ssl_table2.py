"""FedHSSL Table 2 shape: FedVanilla (splitnn) vs FedSimSiam (fedlocal-simsiam) vs FedHSSL with
200 / 1000 labeled aligned rows and 20 % / 40 % of training rows aligned for pre-training.

    python benchmarks/ssl_table2.py --dataset fashion-mnist --out runs/table2_fmnist.jsonl
    python benchmarks/ssl_table2.py --dataset uci-credit --data-path ../shared/data/uci_credit_card.csv \
        --out runs/table2_credit.jsonl

Every finished run is appended to ``--out`` (JSON lines) and skipped when the command is rerun, so
an interrupted benchmark resumes. The table (mean ± std over seeds) is printed at the end.
Fine-tuning follows the paper's appendix: SGD, learning rate chosen from {0.005, 0.01, 0.03} on a
20 % validation split of the labeled rows (never on test data).
"""

from __future__ import annotations

import argparse

from runlog import append, load, mean_std, paper_finetuning

from securevfl.config import RunConfig
from securevfl.lab.compose import execute

KEY = ("method", "labels", "aligned", "seed")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="fashion-mnist")
    ap.add_argument("--data-path")
    ap.add_argument("--methods", nargs="+", default=["splitnn", "fedlocal-simsiam", "fedhssl"])
    ap.add_argument("--labels", nargs="+", type=int, default=[200, 1000])
    ap.add_argument("--aligned", nargs="+", type=float, default=[0.2, 0.4])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--ssl-epochs", type=int, default=10)
    ap.add_argument("--epochs", type=int, default=40, help="fine-tuning epochs")
    ap.add_argument("--batch-size", type=int, default=64, help="fine-tuning batch size")
    ap.add_argument("--bottom", default="mlp")
    ap.add_argument("--out", default="runs/ssl_table2.jsonl")
    ap.add_argument("--all-aligned", action="store_true",
                    help="also run the baselines at every aligned fraction (the paper runs them once: "
                         "'% of aligned samples applies only to FedHSSL')")
    args = ap.parse_args()

    done = load([args.out], KEY)
    for labels in args.labels:
        for aligned in args.aligned:
            for method in args.methods:
                if method != "fedhssl" and aligned != args.aligned[0] and not args.all_aligned:
                    continue
                for seed in args.seeds:
                    key = (method, labels, aligned, seed)
                    if key in done:
                        continue
                    cfg = RunConfig(dataset=args.dataset, method=method, seed=seed)
                    cfg.data.path = args.data_path
                    cfg.partition.aligned_fraction, cfg.partition.n_labeled = aligned, labels
                    paper_finetuning(cfg, args.epochs, args.batch_size)
                    cfg.model.bottom = args.bottom
                    if method != "splitnn":
                        cfg.method_params = {"ssl_epochs": args.ssl_epochs}
                    res = execute(cfg, progress=False).to_json()
                    row = {"method": method, "labels": labels, "aligned": aligned, "seed": seed,
                           "metric": res["utility"]["metric"], "test": res["utility"]["test"],
                           "seconds": res["cost"]["seconds"]}
                    done[key] = row
                    append(args.out, row)
    metric = next(iter(done.values()))["metric"]
    print(f"\n{args.dataset}: test {metric}, mean ± std over seeds {args.seeds}\n")
    print("| method | " + " | ".join(f"{lab} labels, {int(a * 100)} % aligned" for lab in args.labels
                                     for a in args.aligned) + " |")
    print("|---|" + "---|" * (len(args.labels) * len(args.aligned)))
    for method in args.methods:
        cells = []
        for lab in args.labels:
            for a in args.aligned:
                a_run = a if method == "fedhssl" or args.all_aligned else args.aligned[0]
                vals = [done[(method, lab, a_run, s)]["test"] for s in args.seeds if (method, lab, a_run, s) in done]
                cells.append(mean_std(vals))
        print(f"| {method} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
