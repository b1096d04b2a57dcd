"""RISA's imputation, party-local (securevfl/methods/risa.py): each party's view of its own rows with
its imputation vector for entities it does not hold, the vector itself, and — after training — that
vector kept with the party's saved models so a scoring run can stand in for a missing block."""

from __future__ import annotations

from typing import cast

import numpy as np
import torch
from torch import nn

from securevfl.channel import MessageKind
from securevfl.data.partition import IdIndex, PartyData
from securevfl.hooks import HookContext
from securevfl.parties import Party, PassiveParty
from securevfl.policy import ServedRows
from securevfl.roles import ACTIVE


class ImputingView:
    """A party's own training rows as RISA sees them: the real row for IDs it holds, ``imputed_row``
    (its imputation vector) for IDs it does not; ``alias`` maps request keys to its own IDs (the active
    party's side of ``random-match``). Everything else is the wrapped :class:`PartyData`."""

    def __init__(self, data: PartyData, imputed_row: np.ndarray | None,
                 alias: tuple[np.ndarray, np.ndarray] | None = None, served: ServedRows | None = None) -> None:
        self._data, self.imputed_row = data, imputed_row
        self._served = served  # a deployed party's rows it serves: the others are imputed, held or not
        self._alias = None if alias is None else (IdIndex(alias[0]), np.asarray(alias[1]))

    def __getattr__(self, name: str):
        return getattr(self._data, name)

    @property
    def base(self) -> PartyData:
        return self._data

    def rows(self, ids: np.ndarray, split: str = "train") -> np.ndarray:
        if split != "train":  # test rows are aligned: no imputation
            return self._data.rows(ids, split)
        ids = np.asarray(ids)
        if self._alias is not None and len(self._alias[1]):  # no alias when every row is aligned
            index, targets = self._alias
            pos = index.positions(ids)
            ids = np.where(pos >= 0, targets[np.maximum(pos, 0)], ids)
        pos = self._data._train_index.positions(ids)
        X = self._data.X_train
        out = np.empty((len(ids), *X.shape[1:]), dtype=X.dtype)
        held = pos >= 0
        if self._served is not None:
            held &= self._served.inside(ids, "train")
        out[held] = X[pos[held]]
        if not held.all():
            if self.imputed_row is None:
                raise KeyError(f"{self._data.name} holds no train rows for ids {list(ids[~held][:3])}")
            out[~held] = self.imputed_row
        return out


def imputation_vector(data: PartyData, ids: np.ndarray, mode: str) -> np.ndarray:
    """Party-local: the mean attribute vector of the party's rows ``ids`` (its aligned rows);
    categorical fields take their most frequent value. ``mode='zero'``: all zeros (Local+VFL)."""
    X = data.rows(ids, "train")
    if mode == "zero":
        return np.zeros(X.shape[1:], dtype=X.dtype)
    vector = X.mean(axis=0)
    if data.cardinalities:  # tabular layout: numeric columns first, then one vocabulary id per field
        for j in range(data.n_numeric, X.shape[1]):
            values, counts = np.unique(X[:, j], return_counts=True)
            vector[j] = values[counts.argmax()]
    return vector.astype(X.dtype)


def use_view(party: Party, view: ImputingView | None) -> None:
    """Install (or, with ``None``, remove) a party's imputing view of its own rows."""
    base = party.data.base if isinstance(party.data, ImputingView) else party.data
    # an ImputingView stands in for the PartyData it wraps (everything else delegates to it)
    party.use_data(cast(PartyData, base if view is None else view))




class ImputedRow(nn.Module):
    """A party's imputation vector μ_j kept after training (a buffer, saved with its models): what it
    feeds its bottom model for an entity it does not hold, when the saved model scores new rows."""

    row: torch.Tensor

    def __init__(self, width: int) -> None:
        super().__init__()
        self.register_buffer("row", torch.zeros(width))


def end_imputation(party: Party) -> None:
    """Training is over: the party goes back to its plain rows and keeps its imputation vector."""
    if isinstance(party.data, ImputingView) and party.data.imputed_row is not None:
        kept = ImputedRow(int(party.data.imputed_row.size))
        kept.row.copy_(torch.from_numpy(np.asarray(party.data.imputed_row, dtype=np.float32).ravel()))
        party.install(modules={"imputation": kept})
    use_view(party, None)


def send_imputed_output(party: Party, req: dict) -> None:
    """Score-time stand-in: this party's output on its imputation vector, one row, sent through its own
    cut-layer end (its hooks apply as to any output). The active party learns no row of it beyond
    what training sent for each of its own unaligned rows, and this party learns no ID."""
    assert isinstance(party, PassiveParty)  # the active party asks passive parties only
    row = cast(ImputedRow, party.extra_modules["imputation"]).row
    party.bottom.eval()
    with torch.no_grad():
        z = party.bottom(row.reshape(1, *party.data.feature_shape).to(party.device))
    party.cut_end.send_forward(z, HookContext(MessageKind.ACTIVATION, party.name, ACTIVE, party.step, False,
                                              np.zeros(1, dtype=np.int64)))
