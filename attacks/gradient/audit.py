"""The adversaries of the one-run privacy audit (:mod:`securevfl.lab.audit`): label scorers on the
passive party's own view, the gradients it received (its channel transcript, read with
:func:`attacks.gradient.scoring.received_gradient_batches`).

A scorer maps each canary to one score per class, higher meaning "trained with that label"
(:meth:`CanaryScorer.class_scores`); a binary-only scorer gives one score for label 1. The audit
compares each canary's score for its true label with its score for the alternative label it may have
been given, turns those into guesses and the guesses into an ε lower bound. Scorers are
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
- ``prototype`` (any number of classes): the multi-class form of ``aux-axis``. Pooled over the run,
  the mean received gradient row of the adversary's own labeled rows of class c is m_c (with
  p − e_y in the gradient, rows of one label cluster around their class mean); a canary's score for
  class c is Σ over its rows of g·m_c − ½‖m_c‖² (the linear discriminant of equal-covariance classes).
- ``dli`` (agg head only): the returned logit gradient (softmax − onehot(y)) / B has its one negative
  entry at the label (:mod:`attacks.gradient.dli`); a canary's score for class c is −Σ g[c] over its
  rows. Under the split head the gradient is cut-layer wide and carries no such pattern: skipped.

Binary-only scorers (``direction``, ``aux-axis``, ``norm``) are skipped on multi-class tasks; the
audit's confidence is split over the scorers that ran.
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar, cast

import numpy as np

from attacks.base import AttackTarget
from attacks.gradient.scoring import received_gradient_batches
from attacks.model_completion.mc import balanced_draw
from securevfl.registry import Registry

if TYPE_CHECKING:
    from securevfl.federation import Federation


class CanaryScorer(ABC):
    """An audit adversary: subclass, set :attr:`name`, implement :meth:`scores` (binary) or
    :meth:`class_scores` (any number of classes, then set :attr:`binary_only` False), register it."""

    name: ClassVar[str]
    binary_only: ClassVar[bool] = True

    @classmethod
    def scores(cls, target: AttackTarget, canaries: np.ndarray, seed: int) -> np.ndarray:
        """One score per canary (in ``canaries``' order): higher = more likely trained with label 1."""
        raise NotImplementedError(f"audit scorer {cls.name} scores per class only")

    @classmethod
    def refusal(cls, n_classes: int, head: str) -> str | None:
        """Why this scorer does not apply to a run with this task and head (None: it does)."""
        if cls.binary_only and n_classes != 2:
            return f"the {cls.name} scorer reads a binary task's gradient axis ({n_classes} classes here)"
        return None

    @classmethod
    def class_scores(cls, target: AttackTarget, canaries: np.ndarray, seed: int) -> np.ndarray:
        """(canaries × classes) scores: higher = more likely trained with that label."""
        s = cls.scores(target, canaries, seed)
        return np.column_stack([-s, s]) / 2  # binary: column 1 minus column 0 is the label-1 score


AUDIT_SCORERS: Registry[type[CanaryScorer]] = Registry("audit attack")

N_AUX = 40
"""Labeled rows of its own the adversary knows (as the gradient-scoring attacks' ``n_aux``)."""


def _n_classes(target: AttackTarget) -> int:
    return int(cast("Federation", target.federation).n_classes)


def _aux_labels(target: AttackTarget, canaries: np.ndarray, seed: int) -> dict:
    """The adversary's auxiliary labeled rows, N_AUX / 2 per class (never a canary: the audit's
    secret is their labels)."""
    own = np.setdiff1d(target.party.data.train_ids, canaries)
    y = target.truth(own)
    known = y >= 0
    k = _n_classes(target)
    aux = balanced_draw(own[known], y[known], N_AUX * k // 2, k, np.random.default_rng(seed + 41))
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


def _accumulate_classes(target: AttackTarget, canaries: np.ndarray,
                        row_scores: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Sum ``row_scores(rows)`` (rows × classes) over every received training batch, per canary."""
    index = {c: i for i, c in enumerate(canaries.tolist())}
    total = np.zeros((len(canaries), _n_classes(target)))
    for ids, g in received_gradient_batches(target):
        s = row_scores(g)
        for row, e in enumerate(ids.tolist()):
            if e in index:
                total[index[e]] += s[row]
    return total


@AUDIT_SCORERS.register
class PrototypeScorer(CanaryScorer):
    name = "prototype"
    binary_only = False

    @classmethod
    def class_scores(cls, target: AttackTarget, canaries: np.ndarray, seed: int) -> np.ndarray:
        aux = _aux_labels(target, canaries, seed)
        pairs = received_gradient_batches(target)
        width = pairs[0][1].shape[1] if pairs else 0
        sums, counts = np.zeros((_n_classes(target), width)), np.zeros(_n_classes(target))
        for ids, g in pairs:
            for i, e in enumerate(ids.tolist()):
                if e in aux:
                    sums[aux[e]] += g[i]
                    counts[aux[e]] += 1
        means = sums / np.maximum(counts, 1)[:, None]  # a class with no aux row scores 0 (no evidence)
        offset = 0.5 * (means ** 2).sum(axis=1)
        return _accumulate_classes(target, canaries, lambda g: g @ means.T - offset)


@AUDIT_SCORERS.register
class DliScorer(CanaryScorer):
    name = "dli"
    binary_only = False

    @classmethod
    def refusal(cls, n_classes: int, head: str) -> str | None:
        if head != "agg":
            return "the dli scorer reads logit gradients, which only the agg head returns"
        return None

    @classmethod
    def class_scores(cls, target: AttackTarget, canaries: np.ndarray, seed: int) -> np.ndarray:
        return _accumulate_classes(target, canaries, lambda g: -g)

