"""Utility and label-leak AUC (``norm`` / ``direction`` scoring, each beside its control) per
defense over seeds, as a markdown table; the grid is a sweep file (run into its store, so a rerun
resumes).

    OMP_NUM_THREADS=1 python benchmarks/defense_leakage.py sweeps/defenses-grad-breast.yaml
    OMP_NUM_THREADS=1 python benchmarks/defense_leakage.py sweeps/defenses-grad-credit.yaml
"""

from __future__ import annotations

from runlog import mean_std, sweep_from_command_line


def main() -> None:
    cells = sweep_from_command_line("splitnn × defenses × seeds, attacks norm and direction")
    groups: dict[str, list[dict]] = {}
    for cell, row in cells:
        groups.setdefault(cell.defense, []).append(row)
    seeds = sorted({cell.seed for cell, _ in cells})
    print(f"| defense | test metric (seeds {seeds}) | norm AUC | (control) | direction AUC | (control) |")
    print("|---|---|---|---|---|---|")
    for d, rows in groups.items():
        failed = [r["error"] for r in rows if r["status"] != "ok"]
        if failed:
            print(f"| {d} | failed: {failed[0]} | | | | |", flush=True)
            continue
        res = [r["result"] for r in rows]
        cols = [f"{res[-1]['utility']['metric']} {mean_std([r['utility']['test'] for r in res], 3)}"]
        for name in ("norm", "direction"):
            cols += [mean_std([r["attacks"][name]["value"] for r in res], 3),
                     mean_std([r["attacks"][name]["control"] for r in res], 3)]
        print(f"| {d} | " + " | ".join(cols) + " |", flush=True)


if __name__ == "__main__":
    main()
