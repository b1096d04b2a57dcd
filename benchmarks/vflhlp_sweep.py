"""VFLHLP vs splitnn vs local (and the ablations) with the aligned count swept (paper
Tables 2–3 and Fig. 5). The active party holds labels for all its local rows; fine-tuning uses SGD
with the learning rate chosen from {0.005, 0.01, 0.03} on a validation split. The grid is a sweep
file, run as ``securevfl sweep`` runs it (into its store: a rerun resumes, and several invocations
on one store, e.g. in parallel, share the work); this script only formats the rows.

    python benchmarks/vflhlp_sweep.py sweeps/vflhlp-credit.yaml
    python benchmarks/vflhlp_sweep.py sweeps/vflhlp-criteo.yaml
"""

from __future__ import annotations

import argparse

from runlog import mean_std, run_sweep_file


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("sweep", help="sweep file: methods × seeds with dataset.aligned_fraction a list")
    ap.add_argument("--store", help="default: runs/<sweep name>.sqlite")
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args()
    cells = run_sweep_file(args.sweep, args.store, args.workers)
    done = {(c.method, c.swept["aligned_fraction"], c.seed): r["result"] for c, r in cells if r["result"]}
    aligned = list(dict.fromkeys(c.swept["aligned_fraction"] for c, _ in cells))
    methods = list(dict.fromkeys(c.method for c, _ in cells))
    seeds = sorted({c.seed for c, _ in cells})
    rows_for = {a: next((r["partition"]["aligned"] for (_, al, _), r in done.items() if al == a), "?") for a in aligned}
    dataset = cells[0][0].config["dataset"]
    print(f"\n{dataset}: test metric, mean ± std over seeds {seeds}\n")
    print("| method | " + " | ".join(f"{a * 100:g} % aligned ({rows_for[a]} rows)" for a in aligned) + " |")
    print("|---|" + "---|" * len(aligned))
    for method in methods:
        cells_ = [mean_std([done[(method, a, s)]["utility"]["test"] for s in seeds if (method, a, s) in done])
                  for a in aligned]
        print(f"| {method} | " + " | ".join(cells_) + " |")


if __name__ == "__main__":
    main()
