"""Scoring new rows with a saved federation: the active party's program, one for ``securevfl predict``
in one process (the passive parties in threads) and across processes (``predict --peer``).

Every row of the active party's file is scored, each by one path, which the predictions mark
(column ``scored_by``):

- ``federated``: every passive party holds the row; the split model scores it through the cut layer,
  as evaluation at the end of training does.
- the method's own path for rows the passive parties lack, where its paper has one: ``fedud-rep``
  (FedUD's host-only path, Rep(h_H) standing in for the guests), ``risa-imputation`` (RISA's imputed
  sample [x_k, μ_j]: each passive party's output on its own mean row).
- ``active-only``: the active party's part alone, the passive inputs absent (zeros), as
  :meth:`~securevfl.training.SplitTrainer.evaluate` scores unaligned test rows of a plain split model;
  for ``local`` every row (its model is the active party's alone). ``no-features``: a label-only
  active party (Entity Augmentation's host) has no part: such a row gets the head's output on no input.

A user who wants federated scores only asks for them (``--federated-only``); the other rows are then
left out of the file and counted."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from securevfl.config import RunConfig
from securevfl.federation import Federation
from securevfl.ids import member
from securevfl.methods.base import METHODS, Method, MethodContext

FEDERATED = "federated"


def method_for(cfg: RunConfig) -> Method:
    """The saved run's method, as training configured it (its parameters checked again)."""
    return METHODS.get(cfg.method)(MethodContext(train=cfg.train, model=cfg.model, optim=cfg.optim, seed=cfg.seed,
                                                 params=cfg.method_params, progress=False))


def score_rows(method: Method, fed: Federation, ids: np.ndarray, aligned: np.ndarray,
               federated_only: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The active party's program: score ``ids`` (its rows, in its file's order) over ``fed`` (its own
    party and a handle on each passive party), ``aligned`` being the IDs every passive party holds.

    Returns:
        (the scored IDs, their scores, the path that scored each), in ``ids``' order; without
        ``federated_only`` every row is scored."""
    trainer = method.scoring_trainer(fed)
    mask = member(ids, aligned) if fed.passives else np.zeros(len(ids), dtype=bool)
    scores = np.zeros((len(ids), max(fed.n_classes, 1)), dtype=np.float32)
    paths = np.full(len(ids), FEDERATED, dtype=object)
    if mask.any():
        scores[mask] = trainer.predict_proba(ids[mask], "test")
    rest = ~mask
    if rest.any() and not federated_only:
        if fed.passives:
            paths[rest] = method.unaligned_path(fed, trainer)
            scores[rest] = trainer.predict_proba_alone(ids[rest], "test")
        else:  # a single-party model (local): its own path is the whole model
            paths[rest] = "active-only"
            scores[rest] = trainer.predict_proba(ids[rest], "test")
    keep = mask | (not federated_only)
    return ids[keep], scores[keep], paths[keep]


def path_counts(paths: Sequence[str] | np.ndarray) -> dict[str, int]:
    """Rows per scoring path, for the summary."""
    names, counts = np.unique(np.asarray(paths, dtype=str), return_counts=True)
    return {str(n): int(c) for n, c in zip(names, counts, strict=True)}


class ScoringOps:
    """What a passive party serves in a scoring run besides inference batches: the method's scoring
    operations only (never a training one)."""

    def __init__(self, method: Method) -> None:
        self.method = method

    def passive_ops(self) -> dict:
        return self.method.scoring_ops()
