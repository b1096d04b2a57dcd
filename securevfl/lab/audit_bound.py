"""The ε lower bound of one-run privacy auditing (Steinke, Nasr & Jagielski, "Privacy Auditing with
One (1) Training Run", NeurIPS 2023), as pure math.

Setting: m canaries, each included (S_i = +1) or not (S_i = −1) independently with probability ½;
the adversary makes r guesses about the S_i (abstaining on the other m − r) and v of them are right.

- δ = 0 (Theorem 3.1 of the paper): if the mechanism is ε-DP, the number of correct guesses is
  stochastically dominated by Binomial(r, q) with q = e^ε / (1 + e^ε). So
  p(ε) = P[Binomial(r, q) ≥ v] is a p-value for "the mechanism is ε-DP".
- δ > 0 (Theorem 5.2 with the paper's Algorithm 2): the p-value grows by 2·m·δ·α, where
  α = max_{1 ≤ i ≤ v} P[v − i ≤ Binomial(r, q) < v] / i.

The audited lower bound at confidence 1 − β is the largest ε that this p-value rejects at level β
(found by bisection: the p-value is increasing in ε). Everything here is deterministic.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import binom


def _check(m: int, r: int, v: int, delta: float) -> None:
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 ≤ correct ≤ guesses ≤ canaries, got v={v}, r={r}, m={m}")
    if not 0 <= delta <= 1:
        raise ValueError(f"delta must be in [0, 1], got {delta}")


def p_value(m: int, r: int, v: int, epsilon: float, delta: float = 0.0) -> float:
    """P-value of observing ≥ ``v`` correct out of ``r`` guesses on ``m`` canaries if the mechanism
    were (``epsilon``, ``delta``)-DP (an upper bound on that probability, capped at 1)."""
    _check(m, r, v, delta)
    q = 1.0 / (1.0 + math.exp(-epsilon))  # the accuracy of ε-DP randomized response on one bit
    tail = float(binom.sf(v - 1, r, q))  # P[Binomial(r, q) ≥ v]
    if delta == 0 or v == 0:
        return min(tail, 1.0)
    i = np.arange(1, v + 1)
    windows = np.cumsum(binom.pmf(v - i, r, q))  # windows[i − 1] = P[v − i ≤ Binomial(r, q) < v]
    alpha = float(np.max(windows / i))
    return min(tail + 2.0 * m * delta * alpha, 1.0)


def epsilon_lower_bound(m: int, r: int, v: int, delta: float = 0.0, confidence: float = 0.95,
                        tol: float = 1e-6) -> float:
    """The largest ε rejected at level β = 1 − ``confidence``: with probability ≥ ``confidence`` over
    the canaries' inclusion, an (ε, ``delta``)-DP mechanism would not have produced this many correct
    guesses for any ε below it. 0 when nothing is rejected (too few correct guesses)."""
    _check(m, r, v, delta)
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    beta = 1.0 - confidence
    if r == 0 or p_value(m, r, v, 0.0, delta) >= beta:
        return 0.0
    lo, hi = 0.0, 1.0  # invariant: p_value(lo) < β ≤ p_value(hi)
    while p_value(m, r, v, hi, delta) < beta:
        lo, hi = hi, 2.0 * hi
        if hi > 1e4:  # all guesses right with δ = 0 is finite for any finite r; guard anyway
            return math.inf
    while hi - lo > tol:
        mid = (lo + hi) / 2.0
        if p_value(m, r, v, mid, delta) < beta:
            lo = mid
        else:
            hi = mid
    return lo
