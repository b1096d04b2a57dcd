"""Feature leakage per method, with and without HE: the active party's ``fr`` (and ``fr-grn``)
reconstruction of passive1's features, beside its control and the mean predictor, as a markdown
table. The grid is a sweep file, run as ``securevfl sweep`` runs it (into its store, so a rerun
resumes); this script only formats the rows.

    OMP_NUM_THREADS=1 python benchmarks/feature_leakage.py sweeps/feature-leakage-digits.yaml
"""

from __future__ import annotations

import statistics
from functools import partial

from runlog import mean_std, sweep_from_command_line

fmt = partial(mean_std, digits=3)


def main() -> None:
    cells = sweep_from_command_line("methods × HE × seeds, with feature attacks")
    groups: dict[tuple[str, str], list[dict]] = {}
    for cell, row in cells:
        groups.setdefault((cell.method, cell.he), []).append(row)
    attacks = next(list(r["result"]["attacks"]) for rows in groups.values() for r in rows if r["result"])
    heads = " | ".join(f"{a} R² (control, mean pred.)" for a in attacks)
    print(f"| method | HE | utility | {heads} | s/step |")
    print("|---|---|---|" + "---|" * len(attacks) + "---|")
    for (m, he), rows in groups.items():
        failed = [r["error"] for r in rows if r["status"] != "ok"]
        if failed:
            print(f"| {m} | {he} | refused: {failed[0]} |" + " |" * len(attacks), flush=True)
            continue
        res = [r["result"] for r in rows]
        cells = " | ".join(f"{fmt([r['attacks'][a]['value'] for r in res])} "
                           f"({statistics.mean(r['attacks'][a]['control'] for r in res):.3f}, "
                           f"{statistics.mean(r['attacks'][a]['prior'] for r in res):.3f})" for a in attacks)
        secs = statistics.mean(r["cost"]["seconds"] / max(r["cost"]["train_steps"], 1) for r in res)
        print(f"| {m} | {he} | {fmt([r['utility']['test'] for r in res])} | {cells} | {secs:.3f} |", flush=True)


if __name__ == "__main__":
    main()
