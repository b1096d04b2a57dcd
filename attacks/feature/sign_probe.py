"""The sign probe: a malicious active party steers a passive party's training and reads every passive
feature back exactly (issue 60; the feature-space-hijacking class of Pasquini et al., CCS 2021).

The adversary controls the gradient it returns and the passive party's state operations. Against a
bottom that is one linear layer z = w·x + b trained by Adam, it repeats: restore the fresh state (the
weights and Adam's moments), one training step on two aligned rows i, i' with the chosen gradient
∂L/∂z = (1, −c), then an inference batch over every aligned row. Adam's first step moves each weight
by −lr·g/(|g| + ε) ≈ −lr·sign(x_if − c·x_i'f), so the released z_j of every row j jumps by 2·lr·x_jf
exactly where c crosses x_if / x_i'f. Bisecting c over (−∞, ∞) isolates each crossing; the jump there
is feature f of every row, up to its sign. No auxiliary row is needed.

This module is the adversary's arithmetic on an oracle ``probe(c) -> z`` (the released rows after a
step with that c): the deployed test drives it over the project's own transport
(tests/test_malicious_active.py), the lab from a malicious active party's program."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

Probe = Callable[[float], np.ndarray]
"""c → the released pre-activations z (one value per aligned row) after one steered step."""


def recover(probe: Probe, grid: int = 48, tol: float = 1e-6, width: float = 1e-7,
            max_probes: int = 20_000) -> tuple[list[np.ndarray], int]:
    """Every jump of ``probe`` over c ∈ ℝ (c = tan θ, θ on a grid over (−π/2, π/2), then bisection).

    Args:
        probe: the oracle (each call is one restore, one steered step and one inference batch).
        grid: starting points of θ.
        tol: two outputs differ when their largest difference exceeds this (the oracle is
            deterministic, so equal weights give equal bytes).
        width: an interval of θ narrower than this holds one crossing.
        max_probes: the adversary's budget.

    Returns:
        (the jump vectors, one per crossing found; the number of probes made)."""
    cache: dict[float, np.ndarray] = {}

    def at(theta: float) -> np.ndarray:
        if theta not in cache:
            if len(cache) >= max_probes:
                raise RuntimeError("sign probe: out of probes")
            cache[theta] = np.asarray(probe(math.tan(theta)), dtype=np.float64).ravel()
        return cache[theta]

    def differ(a: np.ndarray, b: np.ndarray) -> bool:
        return float(np.max(np.abs(a - b))) > tol

    edge = math.pi / 2 - 1e-6
    thetas = np.linspace(-edge, edge, grid)
    jumps: list[np.ndarray] = []
    stack = [(float(a), float(b)) for a, b in zip(thetas[:-1], thetas[1:], strict=True)]
    while stack:
        a, b = stack.pop()
        za, zb = at(a), at(b)
        if not differ(za, zb):
            continue
        if b - a < width:
            jumps.append(zb - za)
            continue
        m = (a + b) / 2
        stack += [(a, m), (m, b)]
    return jumps, len(cache)


def best_r2(jumps: list[np.ndarray], truth: np.ndarray) -> np.ndarray:
    """Per true feature (column of ``truth``, rows as the probe's), the R² of the best affine fit from
    any one recovered jump (a jump is the feature up to sign and scale)."""
    out = np.zeros(truth.shape[1])
    for f in range(truth.shape[1]):
        y = truth[:, f] - truth[:, f].mean()
        if not np.any(y):
            out[f] = 1.0
            continue
        for j in jumps:
            x = j - j.mean()
            if np.any(x):
                out[f] = max(out[f], float(np.dot(x, y) ** 2 / (np.dot(x, x) * np.dot(y, y))))
    return out
