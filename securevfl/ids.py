"""Set operations on entity-ID arrays by hashing (pandas), in O(n). ``np.isin`` / ``np.intersect1d``
sort or compare element-wise, which on object (string) IDs took 75 s of a 30 000-row CSV run; these
give the same results (sorted, unique where numpy's are) for integer and string IDs alike."""

from __future__ import annotations

import numpy as np
import pandas as pd


def member(ids: np.ndarray, of: np.ndarray) -> np.ndarray:
    """Boolean mask: which of ``ids`` are in ``of`` (``np.isin``)."""
    ids, of = np.asarray(ids), np.asarray(of)
    if ids.dtype == object or of.dtype == object:  # str hashes are cached: a Python set is fastest
        return np.fromiter(map(set(of.tolist()).__contains__, ids.tolist()), dtype=bool, count=len(ids))
    return pd.Index(pd.unique(of)).get_indexer(ids) >= 0


def intersect(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Sorted unique IDs in both (``np.intersect1d``)."""
    u = pd.unique(np.asarray(a))
    return np.sort(u[member(u, b)])


def difference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Sorted unique IDs of ``a`` not in ``b`` (``np.setdiff1d``)."""
    u = pd.unique(np.asarray(a))
    return np.sort(u[~member(u, b)])
