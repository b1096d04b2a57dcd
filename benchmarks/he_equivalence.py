"""How long HE-on training tracks HE-off step for step, and why it stops (issue 9).

Runs ``splitnn`` on Fashion-MNIST (MLP bottom, d = 16, h = 32, sgd lr 0.05, batch 128) three
times from the same seed: plaintext, plaintext with a 1e-7 relative perturbation of every
activation (a stand-in for rounding), and ``--he ckks``. Prints the final utilities and, for each
perturbed run, the first step whose loss differs from the plaintext loss by more than a relative
1e-5 / 1e-4 / 1e-3 / 1e-2.

    OMP_NUM_THREADS=1 python benchmarks/he_equivalence.py --epochs 3
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from securevfl.channel import MessageKind
from securevfl.config import RunConfig
from securevfl.hooks import TensorHook
from securevfl.lab.compose import execute


class Rounding(TensorHook):
    """Multiplies each activation by (1 + 1e-7·N(0, 1)): float32-rounding-sized noise."""

    acts_on = frozenset({MessageKind.ACTIVATION})
    name = "rounding"

    def __call__(self, t: torch.Tensor, ctx) -> torch.Tensor:
        return t * (1 + 1e-7 * torch.randn_like(t))


def config(he: str, epochs: int) -> RunConfig:
    # seeded shares (benchmark-only): W_P(0) is then the HE-off initialisation, so the runs compare step by step
    cfg = RunConfig(dataset="fashion-mnist", method="splitnn", seed=0, he=he,
                    he_params={"seeded_shares": True} if he != "off" else {})
    cfg.train.epochs, cfg.train.batch_size = epochs, 128
    cfg.optim.optimizer, cfg.optim.lr = "sgd", 0.05
    cfg.model.cut_dim, cfg.model.head_hidden, cfg.model.bottom = 16, (32,), "mlp"
    return cfg


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3)
    args = ap.parse_args()
    runs = {}
    for label, he, hooks in [("off", "off", None), ("off + 1e-7 noise", "off", [Rounding()]),
                             ("ckks", "ckks", None)]:
        out = execute(config(he, args.epochs), hooks=hooks, progress=False)
        runs[label] = (np.array(out.method.trainer.losses), out.to_json()["utility"]["test"])
    base, u_base = runs["off"]
    print(f"steps {len(base)}; utility off {u_base:.4f}")
    for label in ("off + 1e-7 noise", "ckks"):
        losses, u = runs[label]
        rel = np.abs(losses - base) / np.abs(base)
        first = {t: (int(np.argmax(rel > t)) if (rel > t).any() else None) for t in (1e-5, 1e-4, 1e-3, 1e-2)}
        print(f"{label:18s} utility {u:.4f} (Δ {u - u_base:+.4f}); max rel loss diff over the first 50 steps "
              f"{rel[:50].max():.1e}; first step above " + ", ".join(f"{t:g}: {s}" for t, s in first.items()))


if __name__ == "__main__":
    main()
