"""Issue 32: the gauge attacks of tests/test_he_gauge.py, with their numbers, and what the leakage
function of ``--interactive-mixing on`` gives away by itself.

1. The attacks (CKKS, or ``--he paillier``): each party's gauge attack on its own recorded view of a
   whole run, mixing off (the leak) and on (the fix), against the judge's score of the documented
   leakage (t' for the active party, g' for the passive party).
2. The leakage function alone: the judge's score of t from clip(ρ·t·X_m) over 6 draws of X_m, on the
   t of a plain (HE-off) digits run, d 8 (h 32) and d 64 (linear head).

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python benchmarks/he_gauge.py [--he paillier]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from securevfl.config import RunConfig  # noqa: E402
from securevfl.cutlayer import InteractiveActiveEnd  # noqa: E402
from securevfl.interactive import MIX_SCALE, Drbg, draw_mix_p  # noqa: E402
from securevfl.lab.compose import execute  # noqa: E402
from tests import test_he_gauge as gauge  # noqa: E402


class Patch:
    """monkeypatch's setattr/undo, outside pytest."""

    def __init__(self) -> None:
        self.undo: list = []

    def setattr(self, obj, name, value) -> None:
        self.undo.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    def close(self) -> None:
        for obj, name, value in reversed(self.undo):
            setattr(obj, name, value)


def fmt(d: dict) -> str:
    return f"max R² {d['r2_max']:.4f}, mean R² {d['r2_mean']:.4f}, Gram corr² {d['gram']:.4f}"


def attacks(he: str) -> None:
    for side, shape, attack in (("active (d 8, h 32)", gauge.ACTIVE_SHAPE, gauge.active_gauge),
                                ("passive (d 32, linear head h 10)", gauge.PASSIVE_SHAPE, gauge.passive_gauge)):
        for mixing in ("off", "on"):
            patch = Patch()
            try:
                view = gauge.run(he, shape, mixing, patch)
            finally:
                patch.close()
            got, leak = attack(view)
            print(f"| {he} | {side} | {mixing} | {fmt(got)} | {fmt(leak)} |")


def leakage_alone() -> None:
    ts: list[np.ndarray] = []
    orig = InteractiveActiveEnd.finish_forward

    def finish_forward(end, training):
        out = orig(end, training)
        ts.append(end._t.copy())
        return out

    InteractiveActiveEnd.finish_forward = finish_forward  # type: ignore[method-assign]
    try:
        for d, head in ((8, (32,)), (64, ())):
            ts.clear()
            cfg = RunConfig(dataset="digits", method="splitnn", seed=0)
            cfg.train.epochs, cfg.train.batch_size, cfg.partition.n_labeled = 2, 32, 256
            cfg.optim.optimizer, cfg.optim.lr = "sgd", 0.1
            cfg.model.cut_dim, cfg.model.head_hidden = d, head
            execute(cfg, progress=False)
            scores = [gauge.score([np.clip(MIX_SCALE * t @ draw_mix_p(Drbg(f"draw{i}".encode()), d), -1, 1)
                                   for t in ts], ts) for i in range(6)]
            print(f"| d {d} | " + " | ".join(f"{min(s[k] for s in scores):.3f}–{max(s[k] for s in scores):.3f}"
                                              for k in ("r2_max", "r2_mean", "gram")) + " |")
    finally:
        InteractiveActiveEnd.finish_forward = orig  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--he", default="ckks", choices=("ckks", "paillier"))
    args = ap.parse_args()
    print("| scheme | side | mixing | attack | documented leakage (judge) |\n|---|---|---|---|---|")
    attacks(args.he)
    print("\n| shape | max R² | mean R² | Gram corr² |\n|---|---|---|---|")
    leakage_alone()


if __name__ == "__main__":
    main()
