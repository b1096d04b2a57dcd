"""Feature leakage per method, with and without HE: the active party's ``fr`` (and ``fr-grn``)
reconstruction of passive1's features, beside its control and the mean predictor, as a markdown table.

    python benchmarks/feature_leakage.py --dataset digits --he off ckks paillier --seeds 0 1
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from securevfl.config import RunConfig
from securevfl.errors import UserError
from securevfl.lab.compose import execute
from securevfl.methods import get_method, method_names

sys.path.insert(0, str(Path(__file__).parent))
from utility import fmt as fmt_digits  # noqa: E402  (benchmarks/utility.py: the shared mean ± std format)


def fmt(vals: list[float]) -> str:
    return fmt_digits(vals, 3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--methods", nargs="+", help="default: every method that runs under HE")
    ap.add_argument("--he", nargs="+", default=["off", "ckks"])
    ap.add_argument("--attacks", nargs="+", default=["fr", "fr-grn"])
    ap.add_argument("--defense", default="none")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--max-rows", type=int)
    ap.add_argument("--aligned-fraction", type=float)
    args = ap.parse_args()
    methods = args.methods or [m for m in method_names() if get_method(m).supports_he and m != "local"]
    heads = " | ".join(f"{a} R² (control, mean pred.)" for a in args.attacks)
    print(f"| method | HE | utility | {heads} | s/step |")
    print("|---|---|---|" + "---|" * len(args.attacks) + "---|")
    for m in methods:
        for he in args.he:
            util, vals, secs = [], {a: ([], [], []) for a in args.attacks}, []
            try:
                for s in args.seeds:
                    cfg = RunConfig(dataset=args.dataset, method=m, seed=s, he=he, defense=args.defense,
                                    attacks=list(args.attacks))
                    cfg.train.epochs = args.epochs
                    cfg.data.max_rows = args.max_rows
                    if args.aligned_fraction is not None:
                        cfg.partition.aligned_fraction = args.aligned_fraction
                    r = execute(cfg, progress=False).to_json()
                    util.append(r["utility"]["test"])
                    secs.append(r["cost"]["seconds"] / max(r["cost"]["train_steps"], 1))
                    for a in args.attacks:
                        for store, key in zip(vals[a], ("value", "control", "prior"), strict=True):
                            store.append(r["attacks"][a][key])
            except UserError as e:
                print(f"| {m} | {he} | refused: {e} |" + " |" * len(args.attacks), flush=True)
                continue
            cells = " | ".join(f"{fmt(v)} ({statistics.mean(c):.3f}, {statistics.mean(p):.3f})"
                               for v, c, p in vals.values())
            print(f"| {m} | {he} | {fmt(util)} | {cells} | {statistics.mean(secs):.3f} |", flush=True)


if __name__ == "__main__":
    main()
