"""Seed-paired differences between arms of one sweep in a store (the methods report's arithmetic), for an
authors'-code arm beside ours and the baselines before the report is rebuilt with it.

    python benchmarks/reference/compare.py runs/methods-authors.sqlite --sweep methods-fedhssl-avazu \\
        --where labeled=200 --arms "fedhssl-authors{ssl_epochs=40}" "fedhssl{ssl_epochs=40}" \\
        "fedlocal-simsiam{ssl_epochs=40}" splitnn

Prints each arm's mean test AUC over its seeds, then every arm against every later one: the mean paired
difference, its 95 % t-interval, the seeds won, and the verdict rule of ``reports/methods``.
"""

from __future__ import annotations

import argparse

from securevfl.lab.report.methods import method_frame, paired, verdict


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("store")
    ap.add_argument("--sweep", required=True)
    ap.add_argument("--where", nargs="*", default=[], help="swept KEY=VALUE filters")
    ap.add_argument("--arms", nargs="+", required=True)
    args = ap.parse_args()
    f = method_frame(args.store)
    f = f[f.sweep == args.sweep]
    for cond in args.where:
        key, _, value = cond.partition("=")
        f = f[f[f"swept_{key}"].astype(str) == value]
    by = {a: f[f.method == a].set_index("seed")["utility"] for a in args.arms}
    print("| arm | seeds | mean test AUC |")
    print("|---|---|---|")
    for a, s in by.items():
        print(f"| {a} | {len(s)} | {s.mean():.4f} |")
    print()
    print("| arm − arm | paired diff | 95 % CI | seeds won | verdict |")
    print("|---|---|---|---|---|")
    for i, a in enumerate(args.arms):
        for b in args.arms[i + 1:]:
            p = paired(by[a], by[b])
            print(f"| {a} − {b} | {p['mean']:+.3f} | [{p['low']:+.3f}, {p['high']:+.3f}] | {p['wins']}/{p['n']} | "
                  f"{verdict(p)} |")


if __name__ == "__main__":
    main()
