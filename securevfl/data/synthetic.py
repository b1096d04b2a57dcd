"""Synthetic files in the Criteo and Avazu layouts, with a learnable signal split across field
groups. For tests, benchmarks and demos when the real click logs are not at hand — never a
stand-in for reporting real-data results."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from securevfl.data.ctr import AVAZU_FIELDS


def _latent(n: int, rng: np.random.Generator, rho: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # a drives categorical fields, b numeric ones; rho = corr(a, b), i.e. how much one party's
    # features tell about the other's (what FedUD's representation transfer relies on)
    a, b = rng.normal(size=n), rng.normal(size=n)
    if rho:
        b = rho * a + np.sqrt(1 - rho**2) * b
    y = (rng.random(n) < 1 / (1 + np.exp(-(1.5 * a + 1.5 * b - 1.2)))).astype(int)
    return a, b, y


def _hex(values: np.ndarray, salt: int) -> np.ndarray:
    # format each distinct value once (the buckets are few): same strings as formatting every row
    uniq, inv = np.unique(values, return_inverse=True)
    table = np.array([f"{(int(v) * 2654435761 + salt * 97) % (1 << 32):08x}" for v in uniq])
    return table[inv.reshape(-1)]


CHUNK_ROWS = 250_000
"""Files longer than this are generated and written in chunks of this many rows, each from its own
generator ``default_rng([seed, chunk])`` (memory stays bounded; a 10M-row file is practical). Up to
this size the single-generator output of earlier versions is reproduced exactly."""


def _write_chunked(path: str | Path, n: int, seed: int, rows_fn, sep: str, header: str | None = None) -> Path:
    path = Path(path)
    with open(path, "w") as f:
        if header is not None:
            f.write(header)
        chunks: Iterable[tuple[np.random.Generator, int]]
        if n <= CHUNK_ROWS:
            chunks = [(np.random.default_rng(seed), n)]
        else:
            chunks = ((np.random.default_rng([seed, c]), min(CHUNK_ROWS, n - s))
                      for c, s in enumerate(range(0, n, CHUNK_ROWS)))
        for rng, m in chunks:
            f.flush()
            _write_columns(f, rows_fn(rng, m), sep)
    return path


def _write_columns(f, cols: list[np.ndarray], sep: str) -> None:
    """Rows of string columns, ``sep``-joined, no quoting (pyarrow's CSV writer: far faster than
    joining Python strings, same bytes)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    table = pa.table({f"f{i}": pa.array(c) for i, c in enumerate(cols)})
    pacsv.write_csv(table, f.buffer if hasattr(f, "buffer") else f,
                    write_options=pacsv.WriteOptions(include_header=False, delimiter=sep, quoting_style="none"))


def write_criteo(path: str | Path, n: int, seed: int = 0, missing: float = 0.1, rho: float = 0.0) -> Path:
    """Kaggle ``train.txt`` layout: label, I1..I13, C1..C26, tab-separated, empty = missing."""

    def rows(rng: np.random.Generator, n: int) -> list[np.ndarray]:
        a, b, y = _latent(n, rng, rho)
        cols = [y.astype(str)]
        for k in range(13):
            v = np.floor(np.exp(1.0 + 0.8 * b + 0.3 * rng.normal(size=n)) * (k + 1)).astype(int).astype(str)
            cols.append(np.where(rng.random(n) < missing, "", v))
        for j in range(26):
            informative = j % 2 == 0
            bucket = np.floor(a * 3 + rng.normal(scale=0.5, size=n)) if informative else rng.integers(0, 50, n)
            v = _hex(bucket + 1000, j)
            cols.append(np.where(rng.random(n) < missing / 2, "", v))
        return cols

    return _write_chunked(path, n, seed, rows, "\t")


def write_avazu(path: str | Path, n: int, seed: int = 0) -> Path:
    """Kaggle Avazu CSV with header ``id,click,hour,C1,...``."""

    def rows(rng: np.random.Generator, n: int) -> list[np.ndarray]:
        a, b, y = _latent(n, rng)
        ids = rng.integers(10**15, 10**16, n)
        hour = 14102100 + rng.integers(0, 24, n) + 100 * rng.integers(0, 9, n)
        cols = [ids.astype(str), y.astype(str), hour.astype(str)]
        for j, _ in enumerate(AVAZU_FIELDS[1:]):
            signal = a if j % 2 == 0 else b
            bucket = np.floor(signal * 3 + rng.normal(scale=0.5, size=n)) if j % 3 != 2 else rng.integers(0, 30, n)
            cols.append(_hex(bucket + 500, j))
        return cols

    return _write_chunked(path, n, seed, rows, ",", header="id,click,hour," + ",".join(AVAZU_FIELDS[1:]) + "\n")


def write_uci_credit(path: str | Path, n: int, seed: int = 0) -> Path:
    """The UCI default-of-credit-card-clients CSV layout (``ID``, 23 features, label), with the label
    driven by PAY_0 / LIMIT_BAL (active side) and the bill amounts (passive side)."""
    from securevfl.data.credit import CATEGORICAL, LABEL, NUMERIC

    rng = np.random.default_rng(seed)
    a, b, y = _latent(n, rng)
    cols: dict[str, np.ndarray] = {"ID": np.arange(1, n + 1)}
    for c in NUMERIC:
        if c.startswith("PAY_") and not c.startswith("PAY_AMT"):
            cols[c] = np.clip(np.round(a + rng.normal(scale=0.7, size=n)), -2, 8).astype(int)
        elif c == "AGE":
            cols[c] = rng.integers(21, 75, n)
        else:  # amounts: heavy-tailed, the bills carry b
            scale = 1.0 + 0.8 * (b if c.startswith("BILL") else -a)
            cols[c] = np.floor(np.exp(9 + scale + 0.5 * rng.normal(size=n))).astype(int)
    for c, k in zip(CATEGORICAL, (2, 6, 3), strict=True):
        cols[c] = rng.integers(1, k + 1, n)
    cols[LABEL] = y
    order = ["ID", "LIMIT_BAL", *CATEGORICAL, *[c for c in NUMERIC if c != "LIMIT_BAL"], LABEL]
    rows = np.column_stack([cols[c].astype(str) for c in order])
    path = Path(path)
    with open(path, "w") as f:
        f.write(",".join(order) + "\n")
        for r in rows:
            f.write(",".join(r) + "\n")
    return path
