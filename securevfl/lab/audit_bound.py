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
from scipy.stats import binom, norm

from defenses.accounting import gdp_delta, gdp_epsilon, gdp_mu  # noqa: F401  (the accountants' GDP maths)


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


# ---- f-DP analysis (Mahloujifar, Melis & Chaudhuri, "Auditing f-Differential Privacy in One Run", ICML 2025)
#
# The binomial bound above treats the mechanism as (ε, δ)-DP, the loosest shape with that ε: for a
# Gaussian mechanism (DP-SGD) it leaves most of the evidence unused. The f-DP analysis instead tests
# the claim "the mechanism is μ-GDP" (trade-off f(x) = Φ(Φ⁻¹(1 − x) − μ)), with μ the Gaussian that
# is exactly (ε, δ)-DP: the claim DP-SGD's accounting makes. We implement the paper's recursive bound
# on the guessing game (its "audit_rh_with_cap"; our reading checked against DeepMind's jax_privacy
# auditing library) for one-sided guesses: r guesses "S_i = +1", v of them right.


def gdp_refutes(mu: float, m: int, r: int, v: int, beta: float) -> bool:
    """Whether ``v`` right of ``r`` one-sided guesses on ``m`` canaries refutes μ-GDP at level β: the
    paper's recursion bounds the mass of right (``right``) and wrong (``wrong``) guesses an f-DP
    mechanism can produce on the event of ≥ v right; their sum above r/m cannot happen."""
    _check(m, r, v, 0.0)
    if r == 0:
        return False
    right, wrong = beta * v / m, beta * (r - v) / m
    for i in range(v - 1, -1, -1):
        # f-DP: wrong guesses are at least the inverse trade-off of the right ones
        grown = max(wrong, float(norm.cdf(norm.ppf(min(right, 1.0)) - mu)))
        if grown == wrong:
            break  # fixed point: neither changes again
        right = min(right + i / (r - i) * (grown - wrong), 1.0)
        wrong = grown
    return right + wrong > r / m


def epsilon_lower_bound_fdp(m: int, r: int, v: int, delta: float, confidence: float = 0.95,
                            tol: float = 1e-4) -> float:
    """The largest ε whose Gaussian (the μ-GDP curve that is exactly (ε, ``delta``)-DP) these guesses
    refute at level β = 1 − ``confidence``; 0 when none is refuted. Valid for mechanisms whose
    privacy curve is Gaussian (DP-SGD); for others (randomized response) use
    :func:`epsilon_lower_bound`, whose claim is (ε, δ)-DP of any shape."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    beta = 1.0 - confidence

    def refuted(eps: float) -> bool:
        return gdp_refutes(gdp_mu(eps, delta), m, r, v, beta)

    if not refuted(tol):
        return 0.0
    lo, hi = tol, 1.0
    while refuted(hi):
        lo, hi = hi, 2.0 * hi
        if hi > 200:
            return math.inf
    while hi - lo > tol:
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if refuted(mid) else (lo, mid)
    return lo


def ideal_fdp_bound(mu: float, m: int, delta: float, confidence: float = 0.95, draws: int = 5,
                    fractions: tuple[float, ...] = (0.02, 0.05, 0.1, 0.2, 0.5), seed: int = 0) -> float:
    """What the f-DP analysis gives an auditor who observes the exact likelihood-ratio statistic of a
    μ-GDP mechanism (N(±μ/2, 1) per canary) with ``m`` canaries: the median over ``draws`` simulated
    audits, with the same guess schedule and Bonferroni split as the lab's audit. The ceiling a
    white-box audit of that mechanism can expect at this m (the papers' "idealized setting")."""
    rng = np.random.default_rng(seed)
    counts = sorted({max(1, int(round(f * m))) for f in fractions})
    level = 1.0 - (1.0 - confidence) / len(counts)
    out = []
    for _ in range(draws):
        plus = rng.random(m) < 0.5
        order = np.argsort(np.where(plus, mu / 2, -mu / 2) + rng.standard_normal(m))
        out.append(max(epsilon_lower_bound_fdp(m, r, int(plus[order[m - r:]].sum()), delta, level) for r in counts))
    return float(np.median(out))
