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
import torch

from attacks.base import ATTACKS, Attack, AttackResult, AttackTarget
from securevfl.errors import UserError

Probe = Callable[[float], np.ndarray]
"""c → the released pre-activations z (one value per aligned row) after one steered step."""


def recover(probe: Probe, grid: int = 48, tol: float = 1e-6, width: float = 1e-7,
            max_probes: int = 20_000) -> tuple[list[np.ndarray], int]:
    """Every jump of ``probe`` over c ∈ ℝ (c = tan θ, θ on a grid over (−π/2, π/2), then bisection).

    Args:
        probe: the oracle (each call is one restore, one steered step and one inference batch).
        grid: starting points of θ.
        tol: two outputs differ when most rows moved by more than this (a crossing moves every
            row; the float32 rounding of a released row moves a few).
        width: an interval of θ narrower than this holds one crossing.
        max_probes: the adversary's budget.

    Returns:
        (the jump vectors, one per crossing isolated within the budget; the number of probes made)."""
    cache: dict[float, np.ndarray] = {}

    def at(theta: float) -> np.ndarray:
        if theta not in cache:
            if len(cache) >= max_probes:
                raise _OutOfProbes
            cache[theta] = np.asarray(probe(math.tan(theta)), dtype=np.float64).ravel()
        return cache[theta]

    def differ(a: np.ndarray, b: np.ndarray) -> bool:
        # a crossing moves every row (by 2·lr·x_jf); float32 rounding of what crossed moves a few
        return float(np.mean(np.abs(a - b) > tol)) > 0.5

    edge = math.pi / 2 - 1e-6
    thetas = np.linspace(-edge, edge, grid)
    jumps: list[np.ndarray] = []
    stack = [(float(a), float(b)) for a, b in zip(thetas[:-1], thetas[1:], strict=True)]
    while stack:
        a, b = stack.pop()
        try:
            za, zb = at(a), at(b)
        except _OutOfProbes:  # the budget is spent: what was isolated so far is the result
            break
        if not differ(za, zb):
            continue
        if b - a < width:
            jumps.append(zb - za)
            continue
        m = (a + b) / 2
        stack += [(a, m), (m, b)]
    return jumps, len(cache)


class _OutOfProbes(Exception):
    pass


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


# ------------------------------------------------------------------------------------- the lab attack


def _column(jump: np.ndarray, n: int) -> np.ndarray:
    """A jump over ``n`` rows as one value per row: its largest column (one bottom output moves per
    crossing; under HE every received column moves in proportion)."""
    j = jump.reshape(n, -1)
    return j[:, int(np.argmax(np.linalg.norm(j, axis=0)))]


@ATTACKS.register
class SignProbe(Attack):
    """The sign probe of issue 60, as a labelled attack in the simulator: after training, the active party
    resets the passive party's optimizer, snapshots it, and repeats restore → one step on two aligned
    rows with ∂L/∂(received) = (1, −c) along one output → an inference batch over ``rows`` aligned rows,
    bisecting c (:func:`recover`). Exact on a linear bottom trained by Adam; on a bottom with hidden
    layers every weight has its own crossing, so ``probes`` bounds what it finds.

    Scored as the mean over the passive party's numeric features of the best R² any recovered jump
    reaches. The **control** scores the same jumps against the same features of other rows (a random
    permutation: what a match by chance gives); the **prior** is the rows' mean (R² 0). ``limits: true``
    puts a deployed passive party's own limits in place (its defaults, securevfl/policy.py): the
    attack is refused at its first state operation and recovers nothing."""

    name = "sign-probe"
    summary = ("a malicious active party steers the passive party's training (restore, a chosen two-row "
               "gradient, an inference batch; bisected) and reads its features back: no auxiliary rows")
    threat_model = "active"
    kind = "feature_reconstruction"
    requires = frozenset({"passive_messages"})
    during_training = False
    defaults = {"probes": 2000, "rows": 256, "limits": False}

    def run(self, target: AttackTarget) -> AttackResult:
        from attacks.feature.steer import Steering, steer

        fed, adv = target.federation, target.adversary
        victim = next(p for p in target.partition.parties if p.name == adv)  # ground truth, for scoring only
        if target.partition.kind != "image" and victim.cardinalities:
            raise UserError("attack sign-probe scores numeric rows only (categorical codes are embedding indices)")
        party = fed.party(adv)
        rows = np.asarray(party.aligned_ids)[: int(self.config["rows"])]
        if len(rows) < 3:
            raise UserError("attack sign-probe needs at least 3 aligned training rows")
        pair = rows[:2]
        state: dict = {"outputs": 0}

        def program(s: Steering) -> list[np.ndarray]:
            for name in s.names:  # Adam's first step after a reset is the sign of the gradient
                next(h for h in s.view.passives if h.name == name).reset_optimizer()  # type: ignore[attr-defined]
            snap = s.snapshot()

            def probe(c: float) -> np.ndarray:
                s.restore(snap)
                alpha = torch.tensor([1.0, -c], dtype=torch.float64) / max(1.0, abs(c))

                def gradient(received: torch.Tensor) -> torch.Tensor:
                    g = torch.zeros_like(received, dtype=torch.float64)
                    g[:, 0] = alpha
                    return g

                s.step(pair, gradient)
                z = s.pre_activation(s.release(rows)[adv])
                state["outputs"] += 1
                return z

            jumps, state["probes"] = recover(probe, max_probes=int(self.config["probes"]))
            return jumps

        limits = None
        if self.config["limits"]:
            from securevfl.party_settings import PartySettings
            from securevfl.policy import RequestLimits

            own = PartySettings()
            assert target.method is not None  # the harness hands every attack the trained method
            budget = {**target.method.state_budget(), "resume": 0}

            def limits() -> RequestLimits:
                return RequestLimits(own.max_requests, own.max_rate, state_budget=budget, max_lr=own.max_lr,
                                     batch_size=target.method.ctx.train.batch_size,  # type: ignore[union-attr]
                                     min_batch_fraction=own.min_batch_fraction)
        refused = None
        try:
            jumps = steer(fed, adv, program, limits=limits)
        except (UserError, RuntimeError) as e:  # refused by the passive party's limits, or out of probes
            jumps, refused = [], str(e).splitlines()[0]
        truth = victim.rows(rows, "train").reshape(len(rows), -1).astype(np.float64)
        truth = truth[:, : int(victim.n_numeric) if victim.cardinalities else truth.shape[1]]
        cols = [_column(j, len(rows)) for j in jumps]
        value = float(best_r2(cols, truth).mean()) if cols else 0.0
        perm = np.random.default_rng(self.seed).permutation(len(rows))
        control = float(best_r2(cols, truth[perm]).mean()) if cols else 0.0
        details = {"probes": int(state.get("probes", state["outputs"])), "crossings": len(jumps),
                   "rows_scored": int(len(rows)), "limits": bool(self.config["limits"]),
                   "observes": "what it received after steps whose gradient it chose"}
        if refused is not None:
            details["refused"] = refused
        return AttackResult("r2", value, 0.0, baseline=0.0, control=control, details=details)
