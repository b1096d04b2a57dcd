"""Privacy accounting for label-DP, as pure functions over a ledger (the math; the defenses keep
only history).

Why no amplification by subsampling: the active party announces every batch's IDs to every passive
party, so a passive adversary knows which steps used a given example. Against that view the
Poisson/shuffling amplification of DP-SGD accountants does not apply; what holds is the composition
of one Gaussian mechanism per step that *contains* the example. With shuffled epochs an example is
in exactly one step per epoch, so a training run of E epochs charges every labeled example E
participations. A ledger entry records, per training run, that count (``participations``) with the
noise multiplier z; ε over the whole ledger is the RDP composition Σ_runs participations · α/(2z²)
converted to (ε, δ). Pure ε-DP events (randomized response, a private model selection) enter the
same RDP sum with the bound ε-DP ⇒ (α, min(ε, αε²/2))-RDP (Bun & Steinke 2016).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

ORDERS = [1.0 + x / 10.0 for x in range(1, 100)] + list(range(11, 64)) + [80, 128, 256, 512, 1024]


MAX_DELTA = 0.01
"""Largest δ a DP defense accepts: (ε, δ)-DP allows a total failure with probability δ, so δ must be
far below 1/n (a δ of 0.99 bounds nothing); 1 % is already generous for any dataset we run."""


def check_delta(name: str, delta: float) -> None:
    """A user error unless 0 < δ ≤ :data:`MAX_DELTA`."""
    if not 0 < delta <= MAX_DELTA:
        from securevfl.errors import UserError

        raise UserError(f"{name} delta must be in (0, {MAX_DELTA}] (δ is the probability that the guarantee fails; "
                        f"it should be far below 1/rows), got {delta}")


def ledger_rdp(ledger: list[dict], orders: list[float] = ORDERS) -> np.ndarray:
    """RDP of the whole ledger at each order. Entries: ``{"kind": "gaussian", "noise_multiplier": z,
    "participations": k}`` or ``{"kind": "pure", "epsilon": e}``."""
    rdp = np.zeros(len(orders))
    for e in ledger:
        if e["kind"] == "gaussian":
            if e["participations"] == 0:
                continue
            # no noise, or so little that 1/z² overflows (z = 1e-300): RDP α/(2z²) is unbounded
            if e["noise_multiplier"] <= 0 or e["noise_multiplier"] ** 2 < 1e-300:
                return np.full(len(orders), math.inf)
            rdp += np.asarray(compute_rdp(q=1.0, noise_multiplier=e["noise_multiplier"], steps=e["participations"],
                                          orders=orders))
        elif e["kind"] == "pure":
            eps = e["epsilon"]
            rdp += np.minimum(eps, np.asarray(orders) * eps * eps / 2.0)
        else:
            raise ValueError(f"unknown ledger entry kind {e['kind']!r}")
    return rdp


ACCOUNTANTS = ("rdp", "gdp")
"""``rdp``: Rényi DP composition (any ledger); ``gdp``: the exact composition of Gaussian steps."""


def ledger_mu(ledger: list[dict]) -> float:
    """μ of a ledger of Gaussian entries: without subsampling each participation is a Gaussian
    mechanism of μ = 1/z (sensitivity Δ, noise z·Δ) and adaptive composition of μ_i-GDP is exactly
    √(Σ μ_i²)-GDP (Dong, Roth & Su 2022, Corollary 3.3), so this is the mechanism's whole privacy curve.

    Raises:
        ValueError: an entry that is not Gaussian (a pure-ε event has no exact GDP form)."""
    total = 0.0
    for e in ledger:
        if e["kind"] != "gaussian":
            raise ValueError(f"the gdp accountant composes Gaussian steps only, not a {e['kind']!r} entry")
        if e["participations"] == 0:
            continue
        if e["noise_multiplier"] <= 0 or e["noise_multiplier"] ** 2 < 1e-300:
            return math.inf
        total += e["participations"] / e["noise_multiplier"] ** 2
    return math.sqrt(total)


def epsilon(ledger: list[dict], delta: float, accountant: str = "rdp") -> float:
    """(ε, δ) of everything in the ledger; 0 for an empty ledger, inf without noise. ``accountant``:
    ``rdp`` (an upper bound for any ledger) or ``gdp`` (exact, Gaussian entries only)."""
    if accountant == "gdp":
        mu = ledger_mu(ledger)
        return math.inf if math.isinf(mu) else gdp_epsilon(mu, delta)
    rdp = ledger_rdp(ledger)
    if not rdp.any():
        return 0.0
    if not np.isfinite(rdp).all():
        return math.inf
    with warnings.catch_warnings():  # opacus warns when the best order is the largest; ORDERS go to 1024
        warnings.simplefilter("ignore", UserWarning)
        eps, _ = get_privacy_spent(orders=ORDERS, rdp=rdp, delta=delta)
    return float(eps)


def noise_for_target(target: float, delta: float, participations: int, extra: list[dict] | None = None,
                     accountant: str = "rdp") -> float:
    """The smallest noise multiplier z (to 0.1 %) whose plan of ``participations`` Gaussian steps,
    composed with the ``extra`` ledger entries, has ε ≤ ``target`` under ``accountant``."""
    extra = extra or []

    def eps_at(z: float) -> float:
        return epsilon([*extra, {"kind": "gaussian", "noise_multiplier": z, "participations": participations}], delta,
                       accountant)

    if epsilon(extra, delta, accountant) >= target:
        raise ValueError("the fixed part of the plan alone exceeds the target ε")
    lo, hi = 1e-3, 1.0
    while eps_at(hi) > target:
        lo, hi = hi, hi * 2
        if hi > 1e6:
            raise ValueError("no noise multiplier reaches the target ε")
    while (hi - lo) / hi > 1e-3:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if eps_at(mid) > target else (lo, mid)
    return hi


def exponential_mechanism(scores: list[float], sensitivity: float, eps: float, rng: np.random.Generator) -> int:
    """ε-DP choice of an index with probability ∝ exp(ε·score / (2·sensitivity)) (McSherry & Talwar 2007)."""
    s = np.asarray(scores, dtype=float)
    s = np.where(np.isfinite(s), s, s[np.isfinite(s)].min() - 1.0 if np.isfinite(s).any() else 0.0)
    logits = eps * s / (2.0 * sensitivity)
    p = np.exp(logits - logits.max())
    return int(rng.choice(len(s), p=p / p.sum()))


# ---------------------------------------------------------------- μ-GDP (Dong, Roth & Su 2022)
def gdp_delta(mu: float, epsilon: float) -> float:
    """δ(ε) of μ-GDP (Dong, Roth & Su 2022, Corollary 2.13)."""
    from scipy.stats import norm  # (slow to import: only where a GDP figure is asked for)

    return float(norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * norm.cdf(-epsilon / mu - mu / 2))


def gdp_epsilon(mu: float, delta: float) -> float:
    """The smallest ε at which μ-GDP is (ε, ``delta``)-DP (0 when δ(0) ≤ δ already)."""
    if mu <= 0 or gdp_delta(mu, 0.0) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while gdp_delta(mu, hi) > delta:
        lo, hi = hi, 2.0 * hi
    while hi - lo > 1e-9 * max(1.0, hi):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if gdp_delta(mu, mid) > delta else (lo, mid)
    return hi


def gdp_mu(epsilon: float, delta: float) -> float:
    """The μ of the Gaussian mechanism that is exactly (``epsilon``, ``delta``)-DP (the largest μ
    whose δ(ε) is at most ``delta``)."""
    if not 0 < delta < 1:
        raise ValueError(f"the f-DP audit needs δ in (0, 1), got {delta}")
    lo, hi = 1e-9, 1.0
    while gdp_delta(hi, epsilon) < delta:
        lo, hi = hi, 2.0 * hi
    while hi - lo > 1e-9 * hi:
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if gdp_delta(mid, epsilon) < delta else (lo, mid)
    return lo
