"""Model-completion leakage vs utility under ISO (FedHSSL Fig. 4 / Table 6 setting): Fashion-MNIST,
2 parties, 200 labeled aligned rows, 20 % aligned, 40 auxiliary labels for the adversary. Every MC
result comes with its control (the same attack on the same architecture at random init) and the
local-SSL baseline; leakage = value − max(control, baseline).

    python benchmarks/mc_tradeoff.py sweeps/mc-iso-fmnist.yaml

The grid is a sweep file, run as ``securevfl sweep`` runs it (into its store: a rerun resumes, and
parallel invocations on one store share the cells); this script only formats the rows, mean ± std
over seeds. A cell whose training diverged is shown as such. Fine-tuning as in
benchmarks/ssl_table2.py (SGD, lr from {0.005, 0.01, 0.03} on a validation split). Several MC
variants in ``attacks`` run on the same trained federation (they share one local-SSL pre-training).
"""

from __future__ import annotations

import statistics
from functools import partial

from runlog import mean_std, sweep_from_command_line

fmt = partial(mean_std, digits=3)
FIELDS = ("value", "control", "baseline", "leakage", "test")


def main() -> None:
    cells = sweep_from_command_line("methods × ISO strengths × seeds with MC attacks")
    groups: dict[tuple[str, float], list[dict]] = {}
    for cell, row in cells:
        groups.setdefault((cell.method, cell.strength or 0.0), []).append(row)
    names = sorted({n for rows in groups.values() for r in rows if r["result"] for n in r["result"]["attacks"]})
    print("\n| method | ISO λ | utility (test acc) | attack | value (adversary's train rows) | control (random init) | "
          "local-SSL baseline | leakage | value on test rows | prior |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (method, lam), rows in groups.items():
        diverged = sum(r["status"] == "failed" and r["error"].startswith("TrainingDiverged") for r in rows)
        failed = [r["error"] for r in rows if r["status"] != "ok" and not r["error"].startswith("TrainingDiverged")]
        if failed:
            print(f"| {method} | {lam:g} | failed: {failed[0]} | | | | | | | |")
        res = [r["result"] for r in rows if r["result"]]
        if diverged:
            print(f"| {method} | {lam:g} | diverged in {diverged} of {diverged + len(res)} seeds | | | | | | | |")
        for name in names:
            got = [r["attacks"][name] for r in res if name in r["attacks"]]
            if not got:
                continue
            cells = " | ".join(fmt([a.get(k) for a in got]) for k in FIELDS)
            print(f"| {method} | {lam:g} | {fmt([r['utility']['test'] for r in res])} | {name} | {cells} | "
                  f"{statistics.mean(a['prior'] for a in got):.3f} |")


if __name__ == "__main__":
    main()
