"""``marvell``: optimal class-dependent Gaussian perturbation of the returned gradients (Li et al.,
"Label Leakage and Protection in Two-party Split Learning", ICLR 2022, §4).

Per training batch, at the active party (it knows the batch's labels): with the positive rows'
gradients g⁽¹⁾ ~ (ḡ₁, v·I) and the negative rows' g⁽⁰⁾ ~ (ḡ₀, u·I) (u, v: mean per-coordinate
variances), Δ = ḡ₁ − ḡ₀, g = ‖Δ‖², p the positive fraction and d the row size, add to every row of
class k the noise N(0, Σ_k) that minimises the symmetrised KL divergence between the two perturbed
class distributions under the power constraint p·tr Σ₁ + (1 − p)·tr Σ₀ ≤ P, P = s · g (the paper's
strength ``s``). The optimal Σ_k = λ_k1 Δ̂Δ̂ᵀ + λ_k2 (I − Δ̂Δ̂ᵀ), so the problem has the paper's four
variables (λ01, λ02, λ11, λ12):

    min (d−1)[(λ02+u)/(λ12+v) + (λ12+v)/(λ02+u)] + (λ01+u+g)/(λ11+v) + (λ11+v+g)/(λ01+u)
    s.t. (1−p)(λ01 + (d−1)λ02) + p(λ11 + (d−1)λ12) ≤ P,  λ ≥ 0.

Solved here exactly (to solver tolerance) by its structure rather than VFLAIR's alternating scheme:
the orthogonal term depends only on the ratio (λ02+u)/(λ12+v), which is best at 1, so the optimum
adds orthogonal noise only to the class with the smaller variance (up to equal variances); for a
fixed split of the power between the orthogonal and the Δ direction, the Δ-direction problem is a
convex 1-d problem on the line (1−p)λ01 + pλ11 = D (Brent, bounded); the split itself is a 1-d
search (a grid, then Brent around the best grid point).

Reading where the paper leaves it open: a batch with one class only (Δ undefined) is sent
unperturbed. Binary tasks only (the objective is two-class); other tasks are refused. No formal
DP guarantee: ε = n/a (the paper bounds the leak AUC through the KL, not an ε).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.optimize import minimize_scalar

from defenses.base import DEFENSES, Defense, _finite
from securevfl.channel import MessageKind
from securevfl.devices import noise_like
from securevfl.errors import UserError
from securevfl.hooks import HookContext, MessageTransform
from securevfl.roles import ACTIVE


def _ratio_term(a: float, b: float) -> float:
    """a/b + b/a for variances a, b ≥ 0 (2 when equal, including both zero)."""
    if a == b:
        return 2.0
    if a <= 0 or b <= 0:
        return math.inf
    return a / b + b / a


def _along_term(x0: float, x1: float, u: float, v: float, g: float) -> float:
    a, b = x0 + u, x1 + v
    if a <= 0 or b <= 0:
        return math.inf
    return (a + g) / b + (b + g) / a


def _best_along(u: float, v: float, g: float, p: float, D: float) -> tuple[float, float, float]:
    """min over (1−p)x0 + p·x1 = D, x ≥ 0 of the Δ-direction term (convex in x0 on that line)."""
    if D <= 0:
        return 0.0, 0.0, _along_term(0.0, 0.0, u, v, g)
    hi = D / (1 - p)

    def f(x0: float) -> float:
        return _along_term(x0, max(D - (1 - p) * x0, 0.0) / p, u, v, g)

    res = minimize_scalar(f, bounds=(0.0, hi), method="bounded", options={"xatol": 1e-10 * hi})
    cands = [(float(res.x), f(float(res.x))), (0.0, f(0.0)), (hi, f(hi))]
    x0, val = min(cands, key=lambda c: c[1])
    return x0, max(D - (1 - p) * x0, 0.0) / p, val


def marvell_covariances(u: float, v: float, d: int, g: float, p: float, P: float
                        ) -> tuple[float, float, float, float, float]:
    """The optimal (λ01, λ02, λ11, λ12) and the minimal symmetrised KL (sum of both directions).

    Args:
        u, v: the negative / positive class's mean per-coordinate gradient variance.
        d: the gradient row size.
        g: ‖ḡ₁ − ḡ₀‖².
        p: the positive fraction of the batch, in (0, 1).
        P: the power constraint.
    """
    # the orthogonal noise goes to the class with the smaller variance, up to equal variances
    lo_is_neg = u <= v
    s_lo, s_hi = (u, v) if lo_is_neg else (v, u)
    p_lo = (1 - p) if lo_is_neg else p
    q_max = min(P, p_lo * (d - 1) * (s_hi - s_lo)) if d > 1 else 0.0

    def total(q: float) -> tuple[float, tuple[float, float, float]]:
        y = q / (p_lo * (d - 1)) if q > 0 else 0.0
        x0, x1, along = _best_along(u, v, g, p, P - q)
        return (d - 1) * _ratio_term(s_lo + y, s_hi) + along, (x0, x1, y)

    if q_max > 0:
        grid = np.linspace(0.0, q_max, 17)
        vals = [total(float(q))[0] for q in grid]
        i = int(np.argmin(vals))
        lo, hi = float(grid[max(i - 1, 0)]), float(grid[min(i + 1, len(grid) - 1)])
        res = minimize_scalar(lambda q: total(q)[0], bounds=(lo, hi), method="bounded",
                              options={"xatol": 1e-10 * q_max})
        q_best = float(res.x) if res.fun < vals[i] else float(grid[i])
    else:
        q_best = 0.0
    objective, (x0, x1, y) = total(q_best)
    lam02, lam12 = (y, 0.0) if lo_is_neg else (0.0, y)
    return x0, lam02, x1, lam12, objective / 2 - d


def symmetric_kl(lam: tuple[float, float, float, float], u: float, v: float, d: int, g: float) -> float:
    """KL(N₁‖N₀) + KL(N₀‖N₁) of the perturbed class distributions for given (λ01, λ02, λ11, λ12)."""
    x0, y0, x1, y1 = lam
    return ((d - 1) * _ratio_term(y0 + u, y1 + v) + _along_term(x0, x1, u, v, g)) / 2 - d


@DEFENSES.register
class Marvell(Defense, MessageTransform):
    name = "marvell"
    primary = "s"
    defaults = {"s": 4.0}
    ranges = {"s": "≥ 0, power constraint P = s·‖ḡ₁ − ḡ₀‖² (0: off)"}
    acts_on = frozenset({MessageKind.GRADIENT})
    runs_at = frozenset({ACTIVE})  # it needs the batch's labels: only the label owner can run it
    observes = frozenset({"messages", "labels"})
    needs_aligned_batches = True  # one labeled example per returned row
    targets = ("norm", "direction")
    he = ("composes: the active party perturbs the plaintext gradient g = ∂L/∂a_P before the encrypted "
          "backward, so the passive party decrypts ∂L/∂t of the perturbed g")
    heads_note = "binary tasks (the objective is two-class)"

    def validate(self) -> None:
        _finite("marvell s", self.config["s"])
        self.last: dict[str, float] = {}

    def __call__(self, tensor: torch.Tensor, ctx: HookContext) -> torch.Tensor:
        s = self.config["s"]
        if s == 0 or not ctx.training:
            return tensor
        y = ctx.labels
        if y is None or (y < 0).any():
            raise UserError("marvell needs the label of every row it returns a gradient for; this method "
                            "returns gradients for unlabeled rows")
        if (y > 1).any():
            raise UserError("marvell is defined for binary tasks (its KL objective is two-class); this task has "
                            "more classes")
        flat = tensor.detach().flatten(1).cpu().double()  # float64 with the CPU noise (securevfl/devices.py)
        pos, neg = torch.from_numpy(y == 1), torch.from_numpy(y == 0)
        if not pos.any() or not neg.any():
            return tensor  # one class only: Δ is undefined, nothing separates the classes in this batch
        m1, m0 = flat[pos].mean(0), flat[neg].mean(0)
        v = float(((flat[pos] - m1) ** 2).mean(0).mean())
        u = float(((flat[neg] - m0) ** 2).mean(0).mean())
        delta = m1 - m0
        g = float(delta.pow(2).sum())
        if g == 0:
            return tensor
        d, p = flat.shape[1], float(pos.double().mean())
        lam01, lam02, lam11, lam12, kl = marvell_covariances(u, v, d, g, p, s * g)
        self.last = {"u": u, "v": v, "g": g, "p": p, "P": s * g, "sum_kl": kl,
                     "sum_kl_before": symmetric_kl((0.0, 0.0, 0.0, 0.0), u, v, d, g)}
        unit = delta / math.sqrt(g)
        z = torch.randn(flat.shape, generator=self.generator, dtype=torch.float64)
        along = (z @ unit)[:, None] * unit[None, :]
        sd_along = torch.where(pos, math.sqrt(lam11), math.sqrt(lam01)).double()[:, None]
        sd_orth = torch.where(pos, math.sqrt(lam12), math.sqrt(lam02)).double()[:, None]
        noise = sd_along * along + sd_orth * (z - along)
        return noise_like((flat + noise).to(tensor.dtype).view_as(tensor), tensor)

    def privacy(self) -> dict:
        return {"epsilon": None, "delta": None, "mechanism": "marvell", "formal_guarantee": False,
                "note": "MARVELL bounds the two-class KL of one batch's gradients, not an ε", "s": self.config["s"]}
