"""FedUD vs local, splitnn, fedlocal-simsiam and fedhssl (paper Table 2): test AUC and
LogLoss on all test rows, on the aligned ones (the guest holds them) and on the unaligned ones
(host only). Partition: the host (active party) holds every training row with labels, the guest
only the aligned ones (``unaligned: active``); the test rows are aligned in the same proportion as
the training rows (``test_aligned_fraction: train``). Every method predicts unaligned test rows
without the guest: FedUD with Rep, the other VFL methods with a zero guest input, ``local`` alone.
Fine-tuning: SGD with the learning rate chosen from {0.005, 0.01, 0.03} on a validation split.
The grid is a sweep file, run as ``securevfl sweep`` runs it (into its store, so a rerun resumes);
this script only formats the rows.

    python benchmarks/fedud_table2.py sweeps/fedud-credit.yaml
    python benchmarks/fedud_table2.py sweeps/fedud-criteo.yaml
"""

from __future__ import annotations

from runlog import mean_std, sweep_from_command_line

COLS = [("test", "auc"), ("test", "logloss"), ("aligned", "auc"), ("aligned", "logloss"),
        ("unaligned", "auc"), ("unaligned", "logloss")]


def main() -> None:
    cells = sweep_from_command_line("methods × seeds on one partition")
    by_method: dict[str, list[dict]] = {}
    for cell, row in cells:
        by_method.setdefault(cell.method, [])
        if row["result"]:
            by_method[cell.method].append(row["result"]["utility"])
    utilities = [u for us in by_method.values() for u in us]
    rows = {k: utilities[0][k]["rows"] for k in ("aligned", "unaligned")} if utilities else {}
    cfg = cells[0][0].config
    print(f"\n{cfg['dataset']}, {cfg['partition']['aligned_fraction'] * 100:g} % aligned, test rows {rows}; "
          f"mean ± std over seeds {sorted({c.seed for c, _ in cells})}\n")
    print("| method | overall AUC | overall LogLoss | aligned AUC | aligned LogLoss | unaligned AUC | "
          "unaligned LogLoss |")
    print("|---|" + "---|" * len(COLS))
    for method, us in by_method.items():
        cols = [mean_std([u[m] if part == "test" else u[part][m] for u in us]) for part, m in COLS]
        print(f"| {method} | " + " | ".join(cols) + " |")


if __name__ == "__main__":
    main()
