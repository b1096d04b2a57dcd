"""Per-party tabular preprocessing, fitted on the party's own training rows only.

Numeric fields: optional signed log transform, mean imputation of missing values, standardisation.
Categorical fields: raw values arrive as 64-bit hashes; each party builds a per-field vocabulary of
values seen at least ``min_freq`` times in its training rows (ids 1..V, the reserved id 0 = unknown
or rare, so unseen test values are handled), or hashes into ``hash_buckets`` buckets (ids 1..B).
The encoded ids are stored as float32 next to the numeric columns (exact below 2^24) so a party's
features stay one tensor; the bottom model splits them again (:class:`securevfl.models.TabularEncoder`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd


def hash_values(values: np.ndarray | pd.Series, categorize: bool = True) -> np.ndarray:
    """Stable 64-bit hashes of raw categorical values (strings or numbers), as int64. A value's hash
    does not depend on the others; ``categorize=False`` skips pandas' factorize step (faster when
    the values are already distinct, same hashes)."""
    arr = np.asarray(values, dtype=object)
    return pd.util.hash_array(arr, categorize=categorize).view(np.int64)


def signed_log(x: np.ndarray) -> np.ndarray:
    return np.sign(x) * np.log1p(np.abs(x))


def fit_numeric(X_train: np.ndarray, log: bool) -> dict:
    Xt = signed_log(X_train) if log else X_train
    with np.errstate(invalid="ignore"):
        mu = np.nanmean(Xt, axis=0) if len(Xt) else np.zeros(Xt.shape[1])
    mu = np.where(np.isnan(mu), 0.0, mu)
    filled = np.where(np.isnan(Xt), mu, Xt)
    sd = filled.std(axis=0) if len(filled) else np.ones(Xt.shape[1])
    sd = np.where(sd == 0, 1.0, sd)
    return {"log": log, "mean": mu, "std": sd}


def transform_numeric(X: np.ndarray, stats: dict) -> np.ndarray:
    Xt = signed_log(X) if stats["log"] else X
    Xt = np.where(np.isnan(Xt), stats["mean"], Xt)
    return ((Xt - stats["mean"]) / stats["std"]).astype(np.float32)


def fit_vocab(codes: np.ndarray, min_freq: int) -> np.ndarray:
    """Sorted codes seen at least ``min_freq`` times (the vocabulary of one field)."""
    values, counts = np.unique(codes, return_counts=True)
    return values[counts >= min_freq]


def encode_vocab(codes: np.ndarray, vocab: np.ndarray) -> np.ndarray:
    """Ids 1..V for vocabulary members, 0 for anything else (unknown / rare / unseen)."""
    if len(vocab) == 0:
        return np.zeros(len(codes), dtype=np.int64)
    pos = np.searchsorted(vocab, codes)
    pos_c = np.minimum(pos, len(vocab) - 1)
    return np.where(vocab[pos_c] == codes, pos_c + 1, 0)


def encode_hash(codes: np.ndarray, buckets: int) -> np.ndarray:
    return (codes.view(np.uint64) % np.uint64(buckets)).astype(np.int64) + 1


class Gather:
    """Rows ``rows`` of columns ``cols`` of ``X``, materialised one column at a time: a party's block
    of a 10M-row table is never held whole before encoding (which was the run's memory peak)."""

    def __init__(self, X: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> None:
        self.X, self.rows, self.cols = X, rows, cols
        self.shape = (len(rows), len(cols))

    def column(self, j: int) -> np.ndarray:
        return self.X[self.rows, self.cols[j]]


def _column(a: np.ndarray | Gather, j: int) -> np.ndarray:
    return a.column(j) if isinstance(a, Gather) else a[:, j]


def encode_party(num_tr: np.ndarray | Gather, num_te: np.ndarray | Gather, cat_tr: np.ndarray | Gather,
                 cat_te: np.ndarray | Gather, *, log: bool, min_freq: int, hash_buckets: int,
                 fitted: dict | None = None) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """Fit on the training rows, transform both splits; returns (X_train, X_test, cardinalities).
    Outputs are allocated once and filled in place; :class:`Gather` inputs are read column by column,
    so the transient memory is a few columns, not the party's block. ``fitted`` (array inputs only)
    receives what was fitted, for :func:`encode_rows` on new rows (a saved model's preprocessing)."""
    n_num, n_cat = num_tr.shape[1], cat_tr.shape[1]
    X_tr = np.empty((num_tr.shape[0], n_num + n_cat), dtype=np.float32)
    X_te = np.empty((num_te.shape[0], n_num + n_cat), dtype=np.float32)
    card = []
    if isinstance(num_tr, Gather):  # per column: the same sums as over a column-major block
        for j in range(n_num):
            tr = _column(num_tr, j).astype(np.float64)[:, None]
            stats = fit_numeric(tr, log)
            X_tr[:, j] = transform_numeric(tr, stats)[:, 0]
            X_te[:, j] = transform_numeric(_column(num_te, j).astype(np.float64)[:, None], stats)[:, 0]
    elif n_num:  # a given block: its own memory order decides the reductions' order (to the last bit)
        assert not isinstance(num_te, Gather)  # both splits come in the same form (arrays here)
        stats = fit_numeric(num_tr.astype(np.float64), log)
        X_tr[:, :n_num] = transform_numeric(num_tr.astype(np.float64), stats)
        X_te[:, :n_num] = transform_numeric(num_te.astype(np.float64), stats)
        if fitted is not None:
            fitted["numeric"] = stats
    if fitted is not None:
        fitted.update(hash_buckets=hash_buckets, vocab=[])
    for j in range(n_cat):
        c_tr, c_te = _column(cat_tr, j), _column(cat_te, j)
        if hash_buckets > 0:
            tr, te = encode_hash(c_tr, hash_buckets), encode_hash(c_te, hash_buckets)
            c = hash_buckets + 1
        else:
            vocab = fit_vocab(c_tr, min_freq)
            tr, te, c = encode_vocab(c_tr, vocab), encode_vocab(c_te, vocab), len(vocab) + 1
            if fitted is not None:
                fitted["vocab"].append(vocab)
        X_tr[:, n_num + j] = tr
        X_te[:, n_num + j] = te
        card.append(int(c))
    return X_tr, X_te, tuple(card)


def encode_rows(num: np.ndarray, cat: np.ndarray, fitted: dict) -> np.ndarray:
    """New rows through the preprocessing :func:`encode_party` fitted (its ``fitted`` dict): the same
    values a training or test row with these cells got."""
    X = np.empty((num.shape[0], num.shape[1] + cat.shape[1]), dtype=np.float32)
    if num.shape[1]:
        X[:, :num.shape[1]] = transform_numeric(num.astype(np.float64), fitted["numeric"])
    for j in range(cat.shape[1]):
        buckets = fitted["hash_buckets"]
        X[:, num.shape[1] + j] = encode_hash(cat[:, j], buckets) if buckets > 0 else encode_vocab(cat[:, j],
                                                                                                 fitted["vocab"][j])
    return X


PIECE = 1 << 16
"""Rows per piece when encoding spilled columns: the transient memory is a few pieces, not the file."""


def _fit_numeric_pieces(col: np.ndarray, rows: np.ndarray, log: bool) -> tuple[float, float]:
    """:func:`fit_numeric` of one column over ``rows``, summed piece by piece (two passes: the mean, then
    the spread around it; imputed cells add nothing to the spread, as in the whole-column fit)."""
    total, count = 0.0, 0
    for i in range(0, len(rows), PIECE):
        x = col[rows[i:i + PIECE]]
        x = signed_log(x) if log else x
        ok = ~np.isnan(x)
        total += float(x[ok].sum())
        count += int(ok.sum())
    mu = total / count if count else 0.0
    ss = 0.0
    for i in range(0, len(rows), PIECE):
        x = col[rows[i:i + PIECE]]
        x = signed_log(x) if log else x
        d = x[~np.isnan(x)] - mu
        ss += float((d * d).sum())
    sd = float(np.sqrt(ss / len(rows))) if len(rows) else 1.0
    return mu, (sd if sd != 0 else 1.0)


def _fit_vocab_pieces(col: np.ndarray, rows: np.ndarray, min_freq: int) -> np.ndarray:
    """:func:`fit_vocab` over ``rows``, counted piece by piece."""
    counts = pd.Series(dtype=np.int64)
    for i in range(0, len(rows), PIECE):
        v, c = np.unique(col[rows[i:i + PIECE]], return_counts=True)
        counts = counts.add(pd.Series(c, index=v), fill_value=0)
    return np.sort(counts.index[counts.to_numpy() >= min_freq].to_numpy(np.int64))


def encode_columns(num: list[np.ndarray], cat: list[np.ndarray], tr: np.ndarray, te: np.ndarray, *, log: bool,
                   min_freq: int, hash_buckets: int, fitted: dict,
                   empty: Callable[[tuple[int, int]], np.ndarray]) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """:func:`encode_party` for a party whose columns are on disk (1-D arrays; ``tr``/``te``: the training
    and test rows' positions): fitted and transformed piece by piece into ``empty``'s arrays, written row
    block by row block. The sums run in another order than the whole-block fit, so the last bits of the
    statistics may differ from :func:`encode_party`'s on the same rows (both are deterministic)."""
    stats = [_fit_numeric_pieces(c, tr, log) for c in num]
    mean = np.array([s[0] for s in stats], dtype=np.float64)
    std = np.array([s[1] for s in stats], dtype=np.float64)
    fitted.update(numeric={"log": log, "mean": mean, "std": std}, hash_buckets=hash_buckets, vocab=[])
    if hash_buckets <= 0:
        fitted["vocab"] = [_fit_vocab_pieces(c, tr, min_freq) for c in cat]
    card = tuple([hash_buckets + 1] * len(cat)) if hash_buckets > 0 else tuple(len(v) + 1 for v in fitted["vocab"])
    out = []
    for rows in (tr, te):
        X = empty((len(rows), len(num) + len(cat)))
        for i in range(0, len(rows), PIECE):
            r = rows[i:i + PIECE]
            block = np.empty((len(r), X.shape[1]), dtype=np.float32)
            if num:
                block[:, :len(num)] = transform_numeric(np.column_stack([c[r] for c in num]), fitted["numeric"])
            for j, c in enumerate(cat):
                codes = c[r]
                block[:, len(num) + j] = encode_hash(codes, hash_buckets) if hash_buckets > 0 else \
                    encode_vocab(codes, fitted["vocab"][j])
            X[i:i + len(r)] = block
        out.append(X)
    return out[0], out[1], card
