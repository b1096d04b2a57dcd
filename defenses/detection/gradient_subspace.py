"""``gradient-guard``: a passive party's detector of steered gradients (feature-space hijacking, Pasquini
et al., CCS 2021; the sign probe of issue 60).

Why it can work: with the interactive layer the passive party receives ∂L/∂t = g·W_Pᵀ, g the B×h gradient
of the head's first layer (h its width: the number of classes for the default one-layer head) and W_P
d×h. Every honest batch therefore has rank ≤ h, and W_P moves little per step, so batches stay close to
one slowly drifting h-dimensional subspace. Defenses on the gradient act on g, before W_Pᵀ, so they keep
the bound; HE and its secret mixing too (the party checks ∂L/∂t' = g'·W̃ᵀ before its own unmixing).
An active party that returns gradients of its own choosing (a discriminator's, as FSHA does) returns
rows of full rank, or (holding W_P in plaintext) a subspace that jumps between steps.

Two statistics per received batch G (B×d), both the fraction of ‖G‖² left outside an h-dimensional
subspace, both in [0, 1]:

- ``rank``: outside G's own top-h singular directions (needs B > h): ≈ 1e-15 honest, ≈ (d − h)/d for
  full-rank rows. Alarm above ``threshold``.
- ``drift``: outside the reference subspace, the top-h eigenvectors of an exponentially weighted mean
  of the earlier batches' normalised GᵀG (only batches that raised no alarm update it). Alarm above
  ``drift`` (0: off).

It cannot apply when h ≥ d (a head with hidden layers is wide; a cut layer narrower than the head):
every gradient fits, so it says so in its report instead of passing silently. ``rank=0`` infers h as
the numerical rank of the first ``warmup`` batches, which trusts them (an active party that steers from
the first step makes the inferred rank full, and then the report says it cannot apply).

Party: passive. Changes nothing it sends. Reads the gradient at hook point (e) (``GradientCheck``),
which the passive cut-layer ends call on every gradient they receive, in training and in any program the
active party drives after training (:mod:`attacks.feature.steer`).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, cast

import numpy as np
import torch

from defenses.base import DEFENSES, Defense, _finite
from securevfl.channel import MessageKind
from securevfl.errors import UserError
from securevfl.hooks import GradientCheck, HookContext
from securevfl.roles import PASSIVE

ACTIONS = ("report", "stop")
STATE = ("rank", "inferred", "width", "gram", "accepted", "received", "checked", "skipped", "alarm_count", "alarms",
         "max_stat")
"""What a checkpoint keeps (the alarms so far and the reference subspace)."""
GAP = 1e-3
"""How sharply the residual must drop at an inferred rank (``rank=0``)."""
MAX_LISTED = 50
"""Alarms listed one by one in the report (all are counted)."""
MAX_HISTORY = 100_000
"""Statistics kept per batch (``history``, for calibration)."""


def outside_top(gram_eigs: np.ndarray, k: int) -> float:
    """Fraction of the energy (sum of ``gram_eigs``, eigenvalues of GᵀG) outside the top ``k``."""
    e = np.sort(np.clip(gram_eigs, 0.0, None))[::-1]
    total = float(e.sum())
    return float(e[k:].sum() / total) if total > 0 else 0.0


def batch_residual(g: np.ndarray, k: int) -> float:
    """The ``rank`` statistic: ‖G‖² outside G's own top-k singular directions, as a fraction."""
    s = np.linalg.svd(g, compute_uv=False)
    return outside_top(s * s, k)


def numerical_rank(g: np.ndarray, tol: float) -> int:
    """The smallest k whose residual fraction is ≤ ``tol`` and drops there by ``GAP`` or more: an exact
    rank bound shows as a cliff (≈ 1e-15 after it, ≈ 1e-7 under CKKS); a head with hidden layers
    gives a smooth decay, no cliff, hence the full width (the guard then cannot apply)."""
    s = np.linalg.svd(g, compute_uv=False)
    e = s * s
    tail = np.cumsum(e[::-1])[::-1] / max(float(e.sum()), 1e-300)  # tail[k] = fraction outside the top k
    return next((k for k in range(1, len(e)) if tail[k] <= tol and tail[k] <= GAP * tail[k - 1]), g.shape[1])


@DEFENSES.register
class GradientGuard(Defense, GradientCheck):
    """A passive party's detector of gradients no honest head of width ``rank`` could return
    (module docstring). ``gradient-guard:RANK``."""

    name = "gradient-guard"
    primary = "rank"
    defaults: ClassVar[dict[str, object]] = {"rank": 0, "threshold": 1e-3, "drift": 0.25, "memory": 0.9,
                                             "warmup": 3, "action": "report"}
    ranges: ClassVar[dict[str, str]] = {
        "rank": "≥ 0 (the head's first-layer width h; 0: inferred from the first batches)",
        "threshold": "(0, 1) (rank alarm)", "drift": "[0, 1) (drift alarm; 0: off)", "memory": "[0, 1)",
        "warmup": "≥ 1", "action": "report or stop"}
    targets: ClassVar[tuple[str, ...]] = ("fsha", "sign-probe")
    runs_at = frozenset({PASSIVE})
    # it changes nothing, but it needs gradients to read: a method that returns none refuses it
    acts_on = frozenset({MessageKind.GRADIENT})
    observes: ClassVar[frozenset[str]] = frozenset({"received_gradients"})
    he = "composes: it reads the decrypted gradient, before the party's own unmixing (rank ≤ h there too)"
    heads_note = "the rank bound is the first head layer's width: a head with hidden layers leaves it vacuous"

    def validate(self) -> None:
        c = self.config
        if c["rank"] < 0:
            raise UserError(f"gradient-guard rank must be ≥ 0, got {c['rank']}")
        if not 0 < _finite("gradient-guard threshold", c["threshold"]) < 1:
            raise UserError(f"gradient-guard threshold must be in (0, 1), got {c['threshold']}")
        if _finite("gradient-guard drift", c["drift"]) >= 1:
            raise UserError(f"gradient-guard drift must be in [0, 1), got {c['drift']}")
        if _finite("gradient-guard memory", c["memory"]) >= 1:
            raise UserError(f"gradient-guard memory must be in [0, 1), got {c['memory']}")
        if c["warmup"] < 1:
            raise UserError(f"gradient-guard warmup must be ≥ 1, got {c['warmup']}")
        if c["action"] not in ACTIONS:
            raise UserError(f"gradient-guard action must be one of {', '.join(ACTIONS)}, got {c['action']!r}")
        self.party = PASSIVE  # the installing party's name, once for_party made its copy
        self._reset()

    def _reset(self) -> None:
        self.rank: int | None = int(self.config["rank"]) or None  # None: not inferred yet
        self.inferred = 0  # rank=0: the largest numerical rank of the warm-up batches
        self.width: int | None = None  # d, from the first gradient
        self.gram: np.ndarray | None = None  # the reference: EW mean of normalised GᵀG
        self.accepted = 0  # batches that updated the reference
        self.received = 0
        self.checked = 0
        self.skipped = 0  # zero (a non-target party's, in a steered step) or non-finite: nothing to test
        self.alarm_count = 0
        self.alarms: list[dict[str, Any]] = []
        self.max_stat = {"rank": 0.0, "drift": 0.0}
        # (step, rank stat, drift stat; nan: not tested), for calibration; not checkpointed
        self.history: list[tuple[int, float, float]] = []

    def for_party(self, party: str) -> Defense:
        twin = cast(GradientGuard, super().for_party(party))
        twin.party = party
        return twin

    # ------------------------------------------------------------------ hook point (e)
    def check(self, grad: torch.Tensor, ctx: HookContext) -> None:
        g = grad.detach().double().cpu().numpy().reshape(len(grad), -1)
        self.received += 1
        energy = float(np.sum(g * g))
        if not math.isfinite(energy) or energy == 0.0:
            self.skipped += 1
            return
        self.width = g.shape[1]
        c = self.config
        if self.rank is None:  # rank=0: the first batches say what h is (trusting them)
            self.inferred = max(self.inferred, numerical_rank(g, c["threshold"]))
            self._warm(g, energy)
            if self.accepted >= c["warmup"]:
                # +1: a softmax head's rows sum to zero, so its gradients have rank h − 1, not h
                self.rank = self.inferred + 1
            return
        h = self.rank
        if h >= self.width:  # any d-wide gradient has rank ≤ h: nothing to test
            return
        self.checked += 1
        s_rank = batch_residual(g, h) if len(g) > h else math.nan
        s_drift = math.nan
        if c["drift"] > 0 and self.gram is not None and self.accepted >= c["warmup"]:
            u = np.linalg.eigh(self.gram)[1][:, -h:]  # the reference subspace (top h)
            proj = g @ u
            s_drift = max(0.0, 1.0 - float(np.sum(proj * proj)) / energy)
        if len(self.history) < MAX_HISTORY:
            self.history.append((int(ctx.step), s_rank, s_drift))
        fired = [(name, s, thr) for name, s, thr in (("rank", s_rank, c["threshold"]), ("drift", s_drift, c["drift"]))
                 if not math.isnan(s) and s > thr]
        for name, s, _ in (("rank", s_rank, 0), ("drift", s_drift, 0)):
            if not math.isnan(s):
                self.max_stat[name] = max(self.max_stat[name], s)
        if all(f[0] != "rank" for f in fired):
            # a batch of rank ≤ h moves the reference even when it jumped (one alarm per honest jump, not
            # a storm); a full-rank one never does
            self._warm(g, energy)
        if not fired:
            return
        name, s, thr = max(fired, key=lambda f: f[1] / f[2])
        self.alarm_count += 1
        if len(self.alarms) < MAX_LISTED:
            self.alarms.append({"step": int(ctx.step), "test": name, "statistic": s})
        if c["action"] == "stop":
            raise UserError(f"{self.party}: gradient-guard: the gradient received at step {ctx.step} is not one a "
                            f"head of width {h} returns ({name} statistic {s:.3g} > {thr:g}); stopped")

    def _warm(self, g: np.ndarray, energy: float) -> None:
        """Fold an accepted batch into the reference subspace."""
        beta = self.config["memory"]
        cov = g.T @ g / energy
        self.gram = cov if self.gram is None or self.gram.shape != cov.shape else beta * self.gram + (1 - beta) * cov
        self.accepted += 1

    # ------------------------------------------------------------------ report
    def applicable(self) -> tuple[bool, str]:
        h, d = self.rank, self.width
        if d is None:
            return False, "no gradient received"
        if h is None:
            return False, f"rank not inferred yet (fewer than {self.config['warmup']} batches)"
        if h >= d:
            how = "inferred from the first batches" if not self.config["rank"] else "given"
            return False, (f"cannot apply: the rank bound h={h} ({how}) is ≥ the gradient's width d={d}, so every "
                           "gradient fits (a head with hidden layers, or a cut layer no wider than the head)")
        return True, ""

    def privacy(self) -> dict:
        ok, why = self.applicable()
        c = self.config
        out: dict[str, Any] = {
            "epsilon": None, "delta": None, "mechanism": "gradient-guard", "formal_guarantee": False,
            "protects": "detects gradients no honest head of width h returns (feature-space hijacking)",
            "applicable": ok, "rank": self.rank, "rank_source": "given" if c["rank"] else "inferred",
            "width": self.width, "threshold": c["threshold"], "drift": c["drift"], "action": c["action"],
            "batches_received": self.received, "batches_checked": self.checked if ok else 0,
            "batches_skipped": self.skipped, "alarm_count": self.alarm_count, "alarms": list(self.alarms),
            "first_alarm_step": self.alarms[0]["step"] if self.alarms else None,
            "max_statistic": dict(self.max_stat)}
        if not ok:
            out["reason"] = why
        return out

    def state_dict(self) -> dict:
        return {**super().state_dict(), **{k: getattr(self, k) for k in STATE}}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        for k in STATE:
            setattr(self, k, state[k])
