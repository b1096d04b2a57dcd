"""gradient-guard (defenses/detection/gradient_subspace.py): false alarms over honest runs of every method
and detection against the malicious active party's attacks of issue 60, in the simulator
(benchmarks/RESULTS.md, "A passive-side detector").

- ``honest GUARD``: every method × seeds 0–3 on breast-cancer and digits (10 epochs; fedud at 30 %
  aligned with the host's unaligned labels, its setting; defaults otherwise) under
  ``--defense GUARD``; per method: runs with any alarm, alarmed batches / checked batches, the largest
  rank and drift statistics, and whether the guard could apply.
- ``attacks GUARD``: seeds 0–3: FSHA (digits and breast-cancer, defaults) and the sign probe (breast-cancer,
  linear bottom as in benchmarks/malicious_active.py, and the default bottom); per attack: runs in which
  the guard alarmed during the attack, and alarmed steps / steered steps.

Usage: ``python benchmarks/detection.py honest|attacks [GUARD]`` (GUARD default ``gradient-guard``);
one line per method or attack."""

from __future__ import annotations

import sys
import time

from defenses.detection.gradient_subspace import GradientGuard
from securevfl.config import RunConfig
from securevfl.errors import UserError
from securevfl.lab.compose import execute

METHODS = ("splitnn", "fedhssl", "vflhlp", "fedud", "risa", "entity-aug", "local-vfl")
SEEDS = (0, 1, 2, 3)


def run(method: str, seed: int, guard: str, dataset: str = "breast-cancer", attacks: tuple[str, ...] = (),
        linear: bool = False, epochs: int = 2):
    cfg = RunConfig(dataset=dataset, method=method, seed=seed, defense=guard)
    cfg.train.epochs = epochs
    if method == "fedud":  # its setting: the host labels unaligned rows (the README's advice)
        cfg.partition.aligned_fraction, cfg.partition.active_labels_unaligned = 0.3, True
    if linear:
        cfg.model.hidden, cfg.model.cut_dim = (), 1
    cfg.attacks = list(attacks)
    return execute(cfg, progress=False)


def honest(guard: str) -> None:
    for dataset, method in ((d, m) for d in ("breast-cancer", "digits") for m in METHODS):
        t0, alarmed, checked, bad, rank, drift, na = time.perf_counter(), 0, 0, 0, 0.0, 0.0, []
        for seed in SEEDS:
            try:
                res = run(method, seed, guard, dataset, epochs=10)
            except UserError as e:
                print(f"{method}: refused: {e}", flush=True)
                break
            for p in res.federation.passives:
                for g in (h for h in p.hooks if isinstance(h, GradientGuard)):
                    ok, why = g.applicable()
                    if not ok:
                        na.append(why)
                    alarmed, checked = alarmed + g.alarm_count, checked + g.checked
                    bad += g.alarm_count > 0
                    rank, drift = max(rank, g.max_stat["rank"]), max(drift, g.max_stat["drift"])
        else:
            print(f"{dataset} {method}: {bad}/{len(SEEDS)} runs with an alarm, {alarmed}/{checked} batches alarmed, "
                  f"max rank stat {rank:.2e}, max drift stat {drift:.3f}"
                  f"{', not applicable: ' + na[0] if na else ''} ({time.perf_counter() - t0:.0f} s)", flush=True)


ATTACKS = (("fsha digits", "digits", "fsha", False), ("fsha breast-cancer", "breast-cancer", "fsha", False),
           ("sign-probe linear", "breast-cancer", "sign-probe:probes=300", True),
           ("sign-probe default", "breast-cancer", "sign-probe:probes=300", False))


def attacks(guard: str) -> None:
    for label, dataset, spec, linear in ATTACKS:
        t0, hit, alarms, steps, vals = time.perf_counter(), 0, 0, 0, []
        for seed in SEEDS:
            res = run("splitnn", seed, guard, dataset, (spec,), linear)
            a = next(iter(res.to_json()["attacks"].values()))
            during = a["detector_alarms"]["passive1"]
            hit += during > 0
            alarms, steps = alarms + during, steps + a["detector_checked"]["passive1"]
            vals.append((a["value"], a["control"]))
        r2 = ", ".join(f"{v:.2f}/{c:.2f}" for v, c in vals)
        print(f"{label}: detected in {hit}/{len(SEEDS)} runs, {alarms}/{steps} steered steps alarmed; "
              f"R²/control per seed {r2} ({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    what, guard = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "gradient-guard"
    {"honest": honest, "attacks": attacks}[what](guard)
