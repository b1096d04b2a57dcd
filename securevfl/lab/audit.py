"""One-run privacy auditing of the label side (Steinke, Nasr & Jagielski, NeurIPS 2023): an
empirical ε lower bound beside the claimed ε, from the same training run.

Reading for label DP (replace-one-label neighbours; the paper's "include with probability ½"):
``canaries`` rows are drawn (with the public run seed: the adversary may know which rows they are,
their true labels, and the alternative label each may take) from the active party's labeled aligned
training rows. For each canary, independently with probability ½ and from private randomness,
S_i = +1 keeps its true label and S_i = −1 replaces it with its alternative label (the other class
of a binary task; with more classes, one of the others drawn with the public seed); the two
datasets differ in one label, exactly the pair the mechanism's ε speaks about. The run then
trains as configured, mechanism included (``rr`` randomises the canary labels like any other;
``dp`` clips and noises their gradients).

After training the adversary, the passive party ``passive1`` from its own view (the gradients it
received), scores each canary with each of its scorers (:data:`attacks.AUDIT_SCORERS`; by default
every one that applies to the task and head, the strongest one counting, paid for in the confidence
split below); a scorer's per-class scores become a score for S_i = +1: its score for the true label
minus its score for the alternative. It guesses +1 on the k highest, −1
on the k lowest, and abstains on the rest. k is not tuned on the answers: a fixed schedule of
guess counts r = 2k is tried for every scorer and the confidence is split over all those
(scorer, r) pairs (Bonferroni), so reporting the best is still a valid bound (the paper sweeps k; we
pay for the sweep instead of ignoring it).
The correct guesses become ε_lower with :func:`securevfl.lab.audit_bound.epsilon_lower_bound` at
the claimed δ (0 for pure ε and for runs that claim nothing).
"""

from __future__ import annotations

import dataclasses
import math
import secrets
from typing import Any

import numpy as np

from securevfl.configuration.spec import check_params
from securevfl.data.partition import IdIndex, Partition
from securevfl.errors import UserError
from securevfl.ids import intersect
from securevfl.lab.audit_bound import epsilon_lower_bound, epsilon_lower_bound_fdp

DEFAULTS: dict[str, object] = {"canaries": 0, "side": "labels", "attack": "all", "confidence": 0.95, "guesses": 0,
                               "mode": "natural", "analysis": "binomial"}
"""``--audit`` keys: ``canaries`` (0 = no audit), ``side`` (``labels``: the active party's labels
against ``passive1``; ``features``: ``passive1``'s feature rows against the active party), the label
scorer (``all``: every registered scorer, the confidence split over them), the confidence 1 − β, the
number of guesses r (0: the Bonferroni schedule :data:`GUESS_FRACTIONS`), the canaries' ``mode``
(``natural``: rows whose label may be swapped; ``gradient``: white-box gradient canaries planted in
DP-SGD's per-example release, :func:`insert_gradient_canaries`) and the ``analysis`` of the guesses
(``binomial``: Steinke et al.'s bound for (ε, δ)-DP of any shape; ``fdp``: Mahloujifar et al.'s
f-DP bound for a Gaussian mechanism's claim, :func:`securevfl.lab.audit_bound.epsilon_lower_bound_fdp`)."""

GUESS_FRACTIONS = (0.05, 0.1, 0.2, 0.5, 1.0)
"""Guess counts tried, as shares of the canaries (the paper's sweep over k, at a split confidence)."""
FDP_GUESS_FRACTIONS = (0.02, 0.05, 0.1, 0.2, 0.5)
"""The f-DP analysis's one-sided guesses (S_i = +1 on the r highest scores), as shares of the canaries."""


@dataclasses.dataclass(frozen=True)
class AuditPlan:
    canaries: np.ndarray
    included: np.ndarray
    """S_i: True where the canary kept its true label (feature side: its own feature row)."""
    true_labels: np.ndarray | None = None
    alternative: np.ndarray | None = None
    """Label side: the label each canary trains with when S_i = −1."""
    donor: int | None = None
    """Feature side: the row whose features the excluded canaries take."""


def audit_config(given: dict) -> dict:
    """The checked ``--audit`` mapping merged over :data:`DEFAULTS`.

    Raises:
        UserError: an unknown key, a wrong type or a value out of range."""
    cfg: dict[str, Any] = {**DEFAULTS, **check_params("--audit", DEFAULTS, given)}
    if cfg["canaries"] != 0 and cfg["canaries"] < 2:
        raise UserError(f"--audit canaries must be 0 (off) or ≥ 2, got {cfg['canaries']}")
    if not 0.5 <= cfg["confidence"] <= 0.9999:  # below ½ a "bound" is more likely wrong than right
        raise UserError(f"--audit confidence must be in [0.5, 0.9999], got {cfg['confidence']}")
    if cfg["side"] not in ("labels", "features"):
        raise UserError(f"--audit side must be labels or features, got {cfg['side']!r}")
    if "guesses" in given and not 2 <= cfg["guesses"] <= cfg["canaries"]:  # unset (0): the schedule
        raise UserError(f"--audit guesses must be in [2, canaries] (leave it unset for the schedule of guess "
                        f"counts), got {cfg['guesses']}")
    if cfg["mode"] not in ("natural", "gradient"):
        raise UserError(f"--audit mode must be natural or gradient, got {cfg['mode']!r}")
    if cfg["analysis"] not in ("binomial", "fdp"):
        raise UserError(f"--audit analysis must be binomial or fdp, got {cfg['analysis']!r}")
    if cfg["mode"] == "gradient" and cfg["side"] != "labels":
        raise UserError("--audit mode=gradient plants canaries in the active party's DP-SGD release: side=labels only")
    if cfg["mode"] == "gradient" and cfg["attack"] not in ("all", GRADIENT_SCORER):
        raise UserError(f"--audit mode=gradient is scored by {GRADIENT_SCORER} (the canary's known direction), "
                        f"not {cfg['attack']!r}")
    return cfg


GRADIENT_SCORER = "dirac"
"""The white-box audit's one scorer: a canary's received rows projected on its public direction."""


def insert_gradient_canaries(partition: Partition, count: int, seed: int, mechanism_seed: int | None) -> AuditPlan:
    """White-box label audit: ``count`` labeled aligned training rows (public seed) become gradient
    canaries; each one's sign S_i = ±1 is a private coin. The data is unchanged: the canaries act
    in the step rule (:class:`securevfl.per_example.GradientCanaries`), where every step each canary's
    per-example gradient is replaced by S_i · C · u (C the clip norm, u public) on its row to
    ``passive1``. The two values of S_i differ by 2C in one example's clipped contribution: the
    sensitivity DP-SGD's ε is computed for, so the audit tests the mechanism's own accounting (as
    the white-box setting of Steinke, Nasr & Jagielski 2023) rather than how much natural rows leak.

    Raises:
        UserError: fewer labeled aligned rows than canaries."""
    assert partition.active.label_ids is not None  # the active party holds labels
    pool = intersect(partition.labeled_ids, partition.active.label_ids)
    if count > len(pool):
        raise UserError(f"--audit canaries={count}: only {len(pool)} labeled aligned training rows")
    canaries = np.sort(np.random.default_rng([seed, 0xA0D3]).choice(pool, size=count, replace=False))
    private = np.random.default_rng(secrets.randbits(64) if mechanism_seed is None else [mechanism_seed, 0xA0D3])
    return AuditPlan(canaries, private.random(count) < 0.5)


def insert_canaries(partition: Partition, count: int, seed: int, mechanism_seed: int | None) -> AuditPlan:
    """Choose ``count`` labeled aligned rows as canaries and replace each one's label by its
    alternative with probability ½ (private randomness unless the mechanism seed is fixed). The
    partition is changed in place: the active party trains on the canary labels, and the simulator's
    ground truth follows them.

    Raises:
        UserError: a regression task, or fewer labeled aligned rows than canaries."""
    if partition.regression:
        raise UserError("--audit: the label audit needs a classification task (its canaries swap one label)")
    act = partition.active
    assert act.label_ids is not None and act.y_labels is not None  # the active party holds labels
    pool = intersect(partition.labeled_ids, act.label_ids)
    if count > len(pool):
        raise UserError(f"--audit canaries={count}: only {len(pool)} labeled aligned training rows")
    canaries = np.sort(np.random.default_rng([seed, 0xA0D1]).choice(pool, size=count, replace=False))
    private = np.random.default_rng(secrets.randbits(64) if mechanism_seed is None else [mechanism_seed, 0xA0D1])
    included = private.random(count) < 0.5
    truth = partition.true_labels(canaries)
    k = partition.n_classes  # a public draw, so the binary audit's draws are as they were
    alternative = (truth + 1 + np.random.default_rng([seed, 0xA0D2]).integers(0, k - 1, size=count)) % k
    flipped = np.where(included, truth, alternative)
    y = act.y_labels.copy()
    y[IdIndex(act.label_ids).positions(canaries)] = flipped
    partition.parties[0] = dataclasses.replace(act, y_labels=y)  # PartyData indexes its fields at init
    if partition.truth_ids is not None and partition.truth_y is not None:
        ty = partition.truth_y.copy()
        pos = IdIndex(partition.truth_ids).positions(canaries)
        ty[pos[pos >= 0]] = flipped[pos >= 0]
        partition.truth_y = ty
    return AuditPlan(canaries, included, true_labels=truth, alternative=alternative)


def insert_feature_canaries(partition: Partition, count: int, seed: int, mechanism_seed: int | None) -> AuditPlan:
    """Feature side (replace-one-row at ``passive1``): ``count`` of ``passive1``'s labeled aligned
    training rows are canaries and one other row is the donor (both public); each canary keeps its own
    feature row (S_i = +1) or, with probability ½ from private coins, takes the donor's (S_i = −1).

    Raises:
        UserError: no passive party, or fewer rows than canaries plus the donor."""
    if len(partition.parties) < 2:
        raise UserError("--audit side=features needs a passive party")
    victim = partition.parties[1]
    pool = intersect(partition.labeled_ids, victim.train_ids)
    if count + 1 > len(pool):
        raise UserError(f"--audit canaries={count}: passive1 has only {len(pool)} labeled aligned training rows "
                        "(one more is the donor)")
    chosen = np.random.default_rng([seed, 0xFEA7]).choice(pool, size=count + 1, replace=False)
    donor, canaries = chosen[0], np.sort(chosen[1:])
    private = np.random.default_rng(secrets.randbits(64) if mechanism_seed is None else [mechanism_seed, 0xFEA7])
    included = private.random(count) < 0.5
    x = victim.X_train.copy()
    index = IdIndex(victim.train_ids)
    x[index.positions(canaries[~included])] = x[index.positions(np.asarray([donor]))[0]]
    partition.parties[1] = dataclasses.replace(victim, X_train=x)
    return AuditPlan(canaries, included, donor=donor.item())


def inclusion_scores(plan: AuditPlan, class_scores: np.ndarray) -> np.ndarray:
    """A label scorer's per-class scores (canaries × classes) as scores for S_i = +1 (true label
    kept): the score for the true label minus the score for the alternative."""
    assert plan.true_labels is not None and plan.alternative is not None  # a label-side plan
    rows = np.arange(len(plan.canaries))
    return class_scores[rows, plan.true_labels] - class_scores[rows, plan.alternative]


def guess_counts(m: int, guesses: int) -> list[int]:
    """The guess counts r (even: k = r / 2 on each side) the audit tries."""
    if guesses:
        return [max(2, guesses - guesses % 2)]
    return sorted({max(2, int(round(f * m / 2)) * 2) for f in GUESS_FRACTIONS if int(round(f * m / 2)) * 2 <= m}
                  | ({m - m % 2} if m >= 2 else set()))


def fdp_guess_counts(m: int, guesses: int) -> list[int]:
    """The one-sided guess counts r the f-DP analysis tries."""
    if guesses:
        return [guesses]
    return sorted({max(1, int(round(f * m))) for f in FDP_GUESS_FRACTIONS})


def audit_result(plan: AuditPlan, scores: dict[str, np.ndarray], delta: float, confidence: float,
                 guesses: int, side: str = "labels", analysis: str = "binomial", mode: str = "natural") -> dict:
    """Guesses from each scorer's scores (name → one score per canary for S_i = +1), and the bound
    they support: the best over scorers and the guess schedule, each at confidence
    1 − β / (scorers × schedule). ``analysis="fdp"`` guesses one-sided (+1 on the r highest) and
    bounds with the f-DP analysis; it needs δ > 0 (a Gaussian mechanism's claim)."""
    m = len(plan.canaries)
    fdp = analysis == "fdp"
    counts = fdp_guess_counts(m, guesses) if fdp else guess_counts(m, guesses)
    level = 1.0 - (1.0 - confidence) / (len(counts) * len(scores))
    best: dict = {"epsilon_lower": 0.0, "guesses": counts[0], "correct": 0, "attack": next(iter(scores))}
    for name, s in scores.items():
        order = np.argsort(s, kind="stable")
        for r in counts:
            if fdp:
                correct = int(plan.included[order[m - r:]].sum())
                eps = epsilon_lower_bound_fdp(m, r, correct, delta, level)
                if eps > best["epsilon_lower"] or (eps == best["epsilon_lower"] and correct > best["correct"]):
                    best = {"epsilon_lower": eps, "guesses": r, "correct": correct, "attack": name}
                continue
            k = r // 2
            correct = int((~plan.included[order[:k]]).sum() + plan.included[order[m - k:]].sum())
            eps = epsilon_lower_bound(m, r, correct, delta, level)
            if eps > best["epsilon_lower"] or (eps == best["epsilon_lower"] and correct > best["correct"]):
                best = {"epsilon_lower": eps, "guesses": r, "correct": correct, "attack": name}
    if math.isinf(best["epsilon_lower"]):
        best["epsilon_lower"] = None
    reading = ("gradient canary (white-box): each canary's per-example gradient is +C·u or −C·u with probability "
               "1/2 in every step, before clipping and noise; passive1 guesses the sign from the rows it received"
               ) if mode == "gradient" else ("canary label kept or flipped with probability 1/2 (replace-one-label); "
               "passive1 guesses which from the gradients it received") if side == "labels" else (
               "canary feature row at passive1 kept or replaced by a donor row's with probability 1/2 "
               "(replace-one-row); the active party guesses which from the rows it receives")
    return {**best, "confidence": confidence, "delta": delta, "canaries": m, "attacks_tried": list(scores),
            "side": side, "mode": mode, "analysis": analysis,
            "adversary": "passive1" if side == "labels" else "active", "guess_schedule": counts,
            "per_guess_confidence": level, "included": int(plan.included.sum()), "reading": reading}
