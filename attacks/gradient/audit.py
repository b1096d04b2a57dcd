"""The adversaries of the one-run privacy audit (:mod:`securevfl.lab.audit`): label scorers on the
passive party's own view, the gradients it received (its channel transcript, read with
:func:`attacks.gradient.scoring.received_gradient_batches`).

A scorer maps each canary to a real score, higher meaning "trained with label 1" (binary tasks).
The audit turns the scores into guesses and the guesses into an ε lower bound. Scorers are
pluggable (:data:`AUDIT_SCORERS`): a stronger label-inference attack registers its own and the audit
names it with ``--audit attack=NAME``.

- ``direction`` (default, the strongest here): on a binary task the gradient of the loss with
  respect to a cut-layer row is J^T (p − e_y), and p − e_y points one way for y = 1 and the opposite
  way for y = 0; so within a batch the rows of the two classes lie on one axis with opposite signs.
  Per batch: the axis is the top right singular vector of the received rows, oriented by the
  adversary's own labeled auxiliary rows in the batch (or, with none there, by the previous batch's
  axis); a canary's score is the sum over the batches that hold it of its row's cosine with that axis.
- ``aux-axis``: under heavy noise one batch's axis is mostly noise; this scorer pools the whole run
  instead: the axis is Σ (2y − 1)·g over every gradient row of the adversary's own labeled rows,
  and a canary's score is the sum of its rows' projections on it (with isotropic Gaussian noise the
  projection, not the cosine, is the statistic that averages the noise out). It assumes the head's
  Jacobian drifts little over training.
- ``norm`` (Li et al. 2022): the minority class gets larger gradients; a canary's score is its
  summed row norm, signed toward the minority class known from the auxiliary rows.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar

import numpy as np

from attacks.base import AttackTarget
from attacks.gradient.scoring import received_gradient_batches
from attacks.model_completion.mc import balanced_draw
from securevfl.registry import Registry


class CanaryScorer(ABC):
    """An audit adversary: subclass, set :attr:`name`, implement :meth:`scores`, register it."""

    name: ClassVar[str]

    @classmethod
    @abstractmethod
    def scores(cls, target: AttackTarget, canaries: np.ndarray, seed: int) -> np.ndarray:
        """One score per canary (in ``canaries``' order): higher = more likely trained with label 1."""


AUDIT_SCORERS: Registry[type[CanaryScorer]] = Registry("audit attack")

N_AUX = 40
"""Labeled rows of its own the adversary knows (as the gradient-scoring attacks' ``n_aux``)."""


def _aux_labels(target: AttackTarget, canaries: np.ndarray, seed: int) -> dict:
    """The adversary's auxiliary labeled rows (never a canary: the audit's secret is their labels)."""
    own = np.setdiff1d(target.party.data.train_ids, canaries)
    y = target.truth(own)
    known = y >= 0
    aux = balanced_draw(own[known], y[known], N_AUX, 2, np.random.default_rng(seed + 41))
    return dict(zip(aux.tolist(), target.truth(aux).tolist(), strict=True))


def _accumulate(target: AttackTarget, canaries: np.ndarray,
                batch_scores: Callable[[np.ndarray, np.ndarray], np.ndarray],
                pairs: list[tuple[np.ndarray, np.ndarray]] | None = None) -> np.ndarray:
    """Sum ``batch_scores(ids, rows)`` over every received training batch, per canary."""
    index = {c: i for i, c in enumerate(canaries.tolist())}
    total = np.zeros(len(canaries))
    for ids, g in received_gradient_batches(target) if pairs is None else pairs:
        s = batch_scores(ids, g)
        for row, e in enumerate(ids.tolist()):
            if e in index:
                total[index[e]] += s[row]
    return total


@AUDIT_SCORERS.register
class DirectionScorer(CanaryScorer):
    name = "direction"

    @classmethod
    def scores(cls, target: AttackTarget, canaries: np.ndarray, seed: int) -> np.ndarray:
        return _direction_scores(target, canaries, seed)


def _direction_scores(target: AttackTarget, canaries: np.ndarray, seed: int) -> np.ndarray:
    aux = _aux_labels(target, canaries, seed)
    previous: list[np.ndarray] = []

    def per_batch(ids: np.ndarray, g: np.ndarray) -> np.ndarray:
        norms = np.linalg.norm(g, axis=1) + 1e-12
        axis = np.linalg.svd(g, full_matrices=False)[2][0]
        cos = g @ axis / norms
        sign = sum((2 * aux[e] - 1) * cos[i] for i, e in enumerate(ids.tolist()) if e in aux)
        if sign == 0 and previous:  # no labeled row of its own here: keep the last batch's orientation
            sign = float(axis @ previous[-1])
        if sign < 0:
            axis, cos = -axis, -cos
        previous[:] = [axis]
        return cos

    return _accumulate(target, canaries, per_batch)


@AUDIT_SCORERS.register
class AuxAxisScorer(CanaryScorer):
    name = "aux-axis"

    @classmethod
    def scores(cls, target: AttackTarget, canaries: np.ndarray, seed: int) -> np.ndarray:
        aux = _aux_labels(target, canaries, seed)
        pairs = received_gradient_batches(target)
        axis = np.zeros(pairs[0][1].shape[1] if pairs else 0)
        for ids, g in pairs:
            for i, e in enumerate(ids.tolist()):
                if e in aux:
                    axis += (2 * aux[e] - 1) * g[i]
        return _accumulate(target, canaries, lambda ids, g: g @ axis, pairs)


@AUDIT_SCORERS.register
class NormScorer(CanaryScorer):
    name = "norm"

    @classmethod
    def scores(cls, target: AttackTarget, canaries: np.ndarray, seed: int) -> np.ndarray:
        aux = _aux_labels(target, canaries, seed)
        minority = int(np.argmin(np.bincount(np.asarray(list(aux.values()), dtype=np.int64), minlength=2)))
        sign = 1.0 if minority == 1 else -1.0
        return _accumulate(target, canaries, lambda ids, g: sign * np.linalg.norm(g, axis=1))
