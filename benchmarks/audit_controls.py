"""The one-run audit's controls (issue 35): the audited ε lower bound of a deliberately broken label
mechanism that still claims its ε (RR that passes labels through; DP-SGD with its noise off), beside
the correct mechanism at the same claim, on breast-cancer, 200 canaries, private noise, several seeds.

    python benchmarks/audit_controls.py [--seeds 0 1 2] [--epochs 5]

Prints one JSON line per run: mechanism, seed, claimed ε, audited ε lower bound, correct / guesses,
the scorer that gave it, and the test AUC.
"""

from __future__ import annotations

import argparse
import json

from defenses.perturbation.label_dp import LabelDP
from defenses.perturbation.rr import RandomizedResponse
from securevfl.lab.compose import execute
from tests.test_audit import LabelsUntouchedRR, NoiselessDP, audit_cfg

MECHANISMS = {"rr (correct)": (RandomizedResponse, {"epsilon": 1.0}),
              "rr, labels untouched (broken)": (LabelsUntouchedRR, {"epsilon": 1.0}),
              "dp (correct)": (LabelDP, {"epsilon": 2.0}),
              "dp, noise off (broken)": (NoiselessDP, {"epsilon": 2.0})}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, default=5)
    args = ap.parse_args()
    for label, (cls, params) in MECHANISMS.items():
        for seed in args.seeds:
            run = execute(audit_cfg(seed=seed, epochs=args.epochs, mechanism_seed=None),
                          hooks=[cls(**params)], progress=False)
            a = run.privacy["audit"]
            print(json.dumps({"mechanism": label, "seed": seed, "claimed": round(run.privacy["epsilon"], 3),
                              "audited": round(a["epsilon_lower"], 3), "correct": a["correct"],
                              "guesses": a["guesses"], "attack": a["attack"],
                              "auc": round(run.utility["test"], 3)}), flush=True)


if __name__ == "__main__":
    main()
