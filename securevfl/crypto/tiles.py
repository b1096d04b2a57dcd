"""The ``terms`` layout shared by the SIMD schemes (CKKS ``packing=terms``, BFV): row-major tiles, one
term of a matrix product per slot, the reduction after decryption.

A matrix X (m×n) is cut into row chunks of r = min(m, slots // n) rows; each chunk is flattened
row-major and tiled t = slots // (r·n) times to fill one ciphertext. A product with a plaintext matrix
multiplies a chunk slot-wise by a plaintext laid out so that tile τ holds the terms of output column
(``X @ W``) or output row (``W @ X``) number g + τ of the group starting at g; no rotation is needed.
The schemes differ only in the number type and in how they blind the terms (ckks.py, bfv.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from securevfl.errors import UserError


def layout(m: int, n: int, slots: int, scheme: str) -> tuple[int, int]:
    """(rows per chunk r, tiles per ciphertext t) for an m×n input."""
    if n > slots:
        raise UserError(f"--he {scheme}: a row of {n} values does not fit {slots} slots; raise poly_modulus_degree")
    r = min(m, slots // n)
    return r, slots // (r * n)


def chunk_vectors(x: np.ndarray, r: int, t: int) -> Iterator[np.ndarray]:
    """X's row chunks, each flattened and tiled t times (zero rows pad the last chunk)."""
    m, n = x.shape
    for c in range(0, m, r):
        block = np.zeros((r, n), dtype=x.dtype)
        block[: min(r, m - c)] = x[c:c + r]
        yield np.tile(block.ravel(), t)


def groups(p: int, t: int) -> list[range]:
    """The output columns (rows) each ciphertext of a product covers: t per ciphertext."""
    return [range(g, min(g + t, p)) for g in range(0, p, t)]


def multipliers(w: np.ndarray, side: str, lo: int, valid: int, r: int, n: int, t: int,
                ks: range) -> np.ndarray:
    """The plaintext (t, r, n) that turns chunk rows [lo, lo + valid) into the terms of outputs ``ks``:
    ``right`` term (i, j) = X[i, j]·W[j, k] (reduced over j); ``left`` term (i, j) = W[k, i]·X[i, j]
    (reduced over i, across chunks)."""
    mult = np.zeros((t, r, n), dtype=w.dtype)
    for tau, k in enumerate(ks):
        mult[tau, :valid] = w[:, k][None, :] if side == "right" else w[k, lo:lo + valid][:, None]
    return mult


def reduce_terms(y: np.ndarray, v: np.ndarray, side: str, lo: int, valid: int, ks: range) -> None:
    """Add one decrypted ciphertext's terms (slots reshaped to (t, r, n)) into the product ``y``."""
    v = v[: len(ks), :valid]
    if side == "right":
        y[lo:lo + valid, ks.start:ks.stop] = v.sum(2).T
    else:
        y[ks.start:ks.stop] += v.sum(1)
