"""FedHSSL Table 2 shape: FedVanilla (splitnn) vs FedSimSiam (fedlocal-simsiam) vs FedHSSL with
200 / 1000 labeled aligned rows and 20 % / 40 % of training rows aligned for pre-training.

    python benchmarks/ssl_table2.py sweeps/ssl-table2-fmnist.yaml sweeps/ssl-table2-fmnist-fedhssl.yaml
    python benchmarks/ssl_table2.py sweeps/ssl-table2-credit.yaml sweeps/ssl-table2-credit-fedhssl.yaml

The grid is sweep files, each run as ``securevfl sweep`` runs it (into its store, so a rerun
resumes); this script only formats the rows. As in the paper the aligned fraction applies only to
FedHSSL: the first file runs every method at the first fraction, the second FedHSSL at the others;
a method without runs at a fraction shows its run at the first one. Fine-tuning follows the
paper's appendix: SGD, learning rate chosen from {0.005, 0.01, 0.03} on a 20 % validation split of
the labeled rows (never on test data).
"""

from __future__ import annotations

import argparse

from runlog import mean_std, run_sweep_file


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("sweeps", nargs="+", help="sweep files: methods × dataset.labeled × seeds at one aligned fraction")
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args()
    done: dict[tuple[str, int, float], list[dict]] = {}
    seeds: set[int] = set()
    for path in args.sweeps:
        for cell, row in run_sweep_file(path, None, args.workers):
            part = cell.config["partition"]
            key = (cell.method, part["n_labeled"], part["aligned_fraction"])
            done.setdefault(key, [])
            seeds.add(cell.seed)
            if row["result"]:
                done[key].append(row["result"])
    methods = list(dict.fromkeys(m for m, _, _ in done))
    labels = sorted({lab for _, lab, _ in done})
    aligned = sorted({a for _, _, a in done})
    metric = next(r["utility"]["metric"] for rs in done.values() for r in rs)
    print(f"\ntest {metric}, mean ± std over seeds {sorted(seeds)}\n")
    print("| method | " + " | ".join(f"{lab} labels, {int(a * 100)} % aligned" for lab in labels for a in aligned)
          + " |")
    print("|---|" + "---|" * (len(labels) * len(aligned)))
    for method in methods:
        cells = []
        for lab in labels:
            for a in aligned:
                runs = done.get((method, lab, a)) or done.get((method, lab, aligned[0]), [])
                cells.append(mean_std([r["utility"]["test"] for r in runs]))
        print(f"| {method} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
