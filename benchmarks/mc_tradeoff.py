"""Model-completion leakage vs utility under ISO (FedHSSL Fig. 4 / Table 6 setting): Fashion-MNIST,
2 parties, 200 labeled aligned rows, 20 % aligned, 40 auxiliary labels for the adversary. Every MC
result comes with its control (the same attack on the same architecture at random init) and the
local-SSL baseline; leakage = value − max(control, baseline).

    python benchmarks/mc_tradeoff.py --out runs/mc_tradeoff.jsonl --seeds 0 1 2

Each finished run is appended to ``--out`` and skipped on rerun (resumable); ``--read`` adds result
files of parallel runs to the final table (mean ± std over seeds). Fine-tuning as in
benchmarks/ssl_table2.py (SGD, lr from {0.005, 0.01, 0.03} on a validation split). ``--attacks``
runs several MC variants on the same trained federation (they share one local-SSL pre-training).
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
FIELDS = ("value", "control", "baseline", "leakage", "test")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="fashion-mnist")
    ap.add_argument("--methods", nargs="+", default=["splitnn", "fedlocal-simsiam", "fedhssl"])
    ap.add_argument("--iso", nargs="+", type=float, default=[0, 1, 5, 25])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--attacks", nargs="+", default=["mc"], help="MC variants (specs), e.g. mc mc-full mc-plain")
    ap.add_argument("--labels", type=int, default=200, help="labeled aligned rows (0: all aligned rows)")
    ap.add_argument("--adam-epochs", type=int, default=0,
                    help="train with adam lr 1e-3, batch 128, for this many epochs instead of the paper's fine-tuning")
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
                    cfg = RunConfig(dataset=args.dataset, method=method, seed=seed, attacks=list(args.attacks),
                                    defense="none" if lam == 0 else f"iso:{lam:g}")
                    cfg.partition.aligned_fraction, cfg.partition.n_labeled = args.aligned, args.labels or None
                    if args.adam_epochs:
                        cfg.train.epochs = args.adam_epochs
                    else:
                        paper_finetuning(cfg, 40, 64)
                    cfg.model.bottom = "mlp"
                    if method != "splitnn":
                        cfg.method_params = {"ssl_epochs": args.ssl_epochs}
                    try:
                        r = execute(cfg, progress=False).to_json()
                    except TrainingDiverged as e:  # recorded, shown as "diverged" in the table
                        row = {"method": method, "iso": lam, "seed": seed, "diverged": str(e)}
                    else:
                        row = {"method": method, "iso": lam, "seed": seed, "utility": r["utility"]["test"],
                               "seconds": r["cost"]["seconds"], "attacks": {
                                   name: {"prior": a["prior"], **{k: a.get(k) for k in FIELDS}}
                                   for name, a in r["attacks"].items()}}
                    append(args.out, row)
                    done[(method, lam, seed)] = row
    done = load([args.out, *args.read], KEY)
    names = sorted({n for r in done.values() for n in r.get("attacks", {})})
    print("\n| method | ISO λ | utility (test acc) | attack | value (adversary's train rows) | control (random init) | "
          "local-SSL baseline | leakage | value on test rows | prior |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for method in args.methods:
        for lam in args.iso:
            rows = [done[(method, lam, s)] for s in args.seeds if (method, lam, s) in done]
            diverged = sum("diverged" in r for r in rows)
            rows = [r for r in rows if "diverged" not in r]
            if diverged:
                print(f"| {method} | {lam:g} | diverged in {diverged} of {diverged + len(rows)} seeds | | | | | | | |")
            for name in names:
                got = [r["attacks"][name] for r in rows if name in r.get("attacks", {})]
                if not got:
                    continue
                cells = " | ".join(fmt([a[k] for a in got]) for k in FIELDS)
                print(f"| {method} | {lam:g} | {fmt([r['utility'] for r in rows])} | {name} | {cells} | "
                      f"{statistics.mean(a['prior'] for a in got):.3f} |")


if __name__ == "__main__":
    main()
