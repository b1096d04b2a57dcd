"""Test utility (and ε where defined) per method × defense over seeds, as a markdown table. The grid
is a sweep file, run as ``securevfl sweep`` runs it (into its store, so a rerun resumes); this script
only formats the rows.

    python benchmarks/utility.py sweeps/utility-fmnist.yaml
    python benchmarks/utility.py sweeps/defenses-fmnist.yaml
"""

from __future__ import annotations

import statistics

from runlog import mean_std, sweep_from_command_line


def main() -> None:
    cells = sweep_from_command_line("methods × defenses × seeds")
    groups: dict[tuple[str, str], list[dict]] = {}
    for cell, row in cells:
        groups.setdefault((cell.method, cell.defense), []).append(row)
    seeds = sorted({cell.seed for cell, _ in cells})
    print(f"| method | defense | test metric (mean ± std, seeds {seeds}) | ε (δ) | s/run | MB sent |")
    print("|---|---|---|---|---|---|")
    for (m, d), rows in groups.items():
        failed = [r["error"] for r in rows if r["status"] != "ok"]
        if failed:
            print(f"| {m} | {d} | failed: {failed[0]} | | | |", flush=True)
            continue
        res = [r["result"] for r in rows]
        eps = [r["privacy"]["epsilon"] for r in res]
        metric, delta = res[-1]["utility"]["metric"], res[-1]["privacy"]["delta"]
        e = "n/a" if eps[0] is None else f"{statistics.mean(eps):.3g} ({delta:g})"
        print(f"| {m} | {d} | {metric} {mean_std([r['utility']['test'] for r in res])} | {e} | "
              f"{statistics.mean(r['cost']['seconds'] for r in res):.1f} | "
              f"{statistics.mean(r['cost']['bytes_sent'] / 1e6 for r in res):.1f} |", flush=True)


if __name__ == "__main__":
    main()
