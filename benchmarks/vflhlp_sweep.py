"""VFLHLP vs splitnn vs local (and the ablations) with the aligned count swept (paper
Tables 2–3 and Fig. 5). The active party holds labels for all its local rows; fine-tuning uses SGD
with the learning rate chosen from {0.005, 0.01, 0.03} on a validation split. The grid is a sweep
file, run as ``securevfl sweep`` runs it (into its store: a rerun resumes, and several invocations
on one store, e.g. in parallel, share the work); this script only formats the rows.

    python benchmarks/vflhlp_sweep.py sweeps/vflhlp-credit.yaml
    python benchmarks/vflhlp_sweep.py sweeps/vflhlp-criteo.yaml
"""

from __future__ import annotations

from runlog import mean_std, sweep_from_command_line


def main() -> None:
    cells = sweep_from_command_line("methods × seeds with dataset.aligned_fraction a list")
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
