"""CKKS backend (TenSEAL).

Parameters (defaults): ``poly_modulus_degree`` N = 8192, ``coeff_mod_bit_sizes`` [60, 40, 60],
``global_scale_bits`` 40. The total modulus (160 bits) is below the 218 bits the HomomorphicEncryption.org
standard allows at N = 8192 for 128-bit classical security (ternary secret), and one 40-bit rescaling
prime is the single level the protocol needs: every HE product in SPEC §5 is one plaintext ×
ciphertext multiplication followed by additions. After the rescale the 60-bit prime leaves 19 bits
of integer headroom (|value| < 2^19), above any single product
of two operands |x|, |w| < 2^9 (checked) plus its mask. Only the encryption key leaves
the owner: no Galois or relinearisation keys are generated because the protocol never rotates or
multiplies two ciphertexts, which keeps the public context small.

Packing ("row-major tiles, reduction after decryption"): a real matrix X (m×n) is cut into row
chunks of r = min(m, slots // n) rows; each chunk is flattened row-major and tiled t = slots // (r·n)
times to fill one ciphertext. A product with a plaintext matrix multiplies the ciphertext slot-wise
by a plaintext laid out so that tile τ holds the terms of output column (``X @ W``) or output row
(``W @ X``) number g·t + τ; no rotation is needed. The ciphertext of products is blinded slot by slot
with fresh random reals that sum to the output's mask over the terms the key owner adds up after
decryption, so it sees every individual term only masked (at the mask scale) and each output masked
by one draw of the mask distribution. For the
benchmark shape (B = 256, d = 16, h = 32; 4096 slots) z is one ciphertext and each of the three
products is 32 ciphertexts. Limitation: no noise flooding, so (as in FATE) circuit privacy against
the key owner rests on the masks of the plaintext values, not on the CKKS noise distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tenseal as ts

from securevfl.crypto.backend import Encrypted, HEBackend, HETimer, Noise, pack_blobs, unpack_blobs
from securevfl.errors import TrainingDiverged, UserError

# HomomorphicEncryption.org security standard, 128-bit classical, ternary secret: max log2(q) per N
MAX_COEFF_BITS_128 = {1024: 27, 2048: 54, 4096: 109, 8192: 218, 16384: 438, 32768: 881}
MAX_ABS = 2.0 ** 9  # per-operand bound, see CKKSBackend._check
DEFAULTS = {"poly_modulus_degree": 8192, "coeff_mod_bit_sizes": [60, 40, 60], "global_scale_bits": 40}


def validate_params(params: dict) -> dict:
    unknown = set(params) - set(DEFAULTS) - {"mask_scale"}
    if unknown:
        raise UserError(f"--he ckks has no parameter {sorted(unknown)[0]!r}; known: {', '.join(sorted(DEFAULTS))}, "
                        "mask_scale")
    p = {**DEFAULTS, **{k: v for k, v in params.items() if k in DEFAULTS}}
    n, bits, scale = p["poly_modulus_degree"], p["coeff_mod_bit_sizes"], p["global_scale_bits"]
    if isinstance(bits, str):
        bits = [int(b) for b in bits.replace("[", "").replace("]", "").split(",") if b.strip()]
    try:
        n, bits, scale = int(n), [int(b) for b in bits], int(scale)
    except (TypeError, ValueError):
        raise UserError("--he ckks: poly_modulus_degree, coeff_mod_bit_sizes and global_scale_bits must be "
                        "integers") from None
    if n not in MAX_COEFF_BITS_128:
        raise UserError(f"--he ckks: poly_modulus_degree must be one of {sorted(MAX_COEFF_BITS_128)}, got {n}")
    if sum(bits) > MAX_COEFF_BITS_128[n]:
        raise UserError(f"--he ckks: coeff_mod_bit_sizes sum to {sum(bits)} bits, above the "
                        f"{MAX_COEFF_BITS_128[n]} bits that give 128-bit security at poly_modulus_degree {n}")
    if len(bits) < 3 or any(not 20 <= b <= 60 for b in bits):
        raise UserError("--he ckks: coeff_mod_bit_sizes needs ≥ 3 primes of 20..60 bits (one rescaling level)")
    if not 20 <= scale <= min(bits[1:-1]) or bits[0] - scale < 10:
        raise UserError(f"--he ckks: global_scale_bits {scale} must be ≤ the middle primes and ≥ 10 bits below "
                        "the first prime (integer headroom)")
    return {"poly_modulus_degree": n, "coeff_mod_bit_sizes": bits, "global_scale_bits": scale}


@dataclass
class CKKSMatrix(Encrypted):
    """X (m×n): chunk c holds rows [c·r, c·r + r) flattened and tiled t times."""

    cts: list
    shape: tuple[int, int]
    rows: int
    tiles: int


@dataclass
class CKKSProducts(Encrypted):
    """Masked terms of a product, one ciphertext per (chunk, output group); reduced after decryption."""

    cts: list  # [chunk][group]
    shape: tuple[int, int]  # the product's shape
    side: str  # "right" (X @ W) or "left" (W @ X)
    x_shape: tuple[int, int]
    rows: int
    tiles: int


class CKKSBackend(HEBackend):
    scheme = "ckks"

    def __init__(self, params: dict, context: ts.Context | None = None, timer: HETimer | None = None) -> None:
        super().__init__(timer)
        self.params = validate_params(params)
        if context is None:  # key owner
            with self.timer.time("keygen"):
                context = ts.context(ts.SCHEME_TYPE.CKKS, self.params["poly_modulus_degree"],
                                     coeff_mod_bit_sizes=self.params["coeff_mod_bit_sizes"])
                context.global_scale = 2.0 ** self.params["global_scale_bits"]
        self.ctx = context
        self.slots = self.params["poly_modulus_degree"] // 2

    @classmethod
    def from_public(cls, blob: bytes, params: dict, timer: HETimer | None = None) -> CKKSBackend:
        ctx = ts.context_from(blob)
        return cls(params, ctx, timer)

    def has_secret(self) -> bool:
        return self.ctx.is_private()

    def public_bytes(self) -> bytes:
        return self.ctx.serialize(save_public_key=True, save_secret_key=False, save_galois_keys=False,
                                  save_relin_keys=False)

    # ------------------------------------------------------------------ layout
    def _layout(self, m: int, n: int) -> tuple[int, int]:
        if n > self.slots:
            raise UserError(f"--he ckks: a row of {n} values does not fit {self.slots} slots; raise "
                            "poly_modulus_degree")
        r = min(m, self.slots // n)
        return r, self.slots // (r * n)

    def _check(self, x: np.ndarray, what: str) -> None:
        # each slot holds one product (reduction happens after decryption): |x|,|w| < 2^9 keeps
        # |x·w + mask| inside the 2^19 headroom left after the rescale
        if not np.isfinite(x).all():
            raise TrainingDiverged(f"training diverged: non-finite {what}; lower the learning rate or the defense "
                                   "strength")
        if x.size and np.abs(x).max() >= MAX_ABS:
            raise TrainingDiverged(f"--he ckks: {what} reaches |{np.abs(x).max():.3g}| ≥ {MAX_ABS:g}, beyond the CKKS "
                                   "headroom; lower the learning rate or mask_scale, or normalise the bottom output")

    def encrypt(self, x: np.ndarray, ops: frozenset[str]) -> CKKSMatrix:
        self._check(x, "value to encrypt")
        m, n = x.shape
        r, t = self._layout(m, n)
        cts = []
        with self.timer.time("encrypt"):
            for c in range(0, m, r):
                block = np.zeros((r, n))
                block[: min(r, m - c)] = x[c:c + r]
                cts.append(ts.ckks_vector(self.ctx, np.tile(block.ravel(), t).tolist()))
        return CKKSMatrix(cts, (m, n), r, t)

    def _product(self, ex: CKKSMatrix, w: np.ndarray, side: str, noise: Noise) -> tuple[CKKSProducts, np.ndarray]:
        m, n = ex.shape
        r, t = ex.rows, ex.tiles
        p = w.shape[1] if side == "right" else w.shape[0]
        out_shape = (m, p) if side == "right" else (p, n)
        mask = np.zeros(out_shape)
        out = []
        with self.timer.time("matmul"):
            for ci, ct in enumerate(ex.cts):
                lo = ci * r
                valid = min(r, m - lo)
                row_out = []
                for g in range(0, p, t):
                    ks = list(range(g, min(g + t, p)))
                    mult = np.zeros((t, r, n))
                    terms = np.zeros((t, r, n))
                    for tau, k in enumerate(ks):
                        if side == "right":  # term (i, j) = X[i, j] W[j, k]; reduce over j
                            mult[tau, :valid] = w[:, k][None, :]
                        else:  # term (i, j) = W[k, i] X[i, j]; reduce over i (and chunks)
                            mult[tau, :valid] = w[k, lo:lo + valid][:, None]
                    # term masks sum to zero over what the key owner adds up, plus the output mask e
                    # spread evenly: each term is blinded at the mask scale and so is each output
                    # (iid term masks would give outputs a √terms larger mask that V, R then accumulate)
                    u = noise((len(ks), valid, n))
                    if side == "right":
                        e = noise((len(ks), valid))
                        u += (e[:, :, None] - u.sum(2, keepdims=True)) / n
                        mask[lo:lo + valid, g:g + len(ks)] = e.T
                    else:  # reduced over rows of every chunk: chunk 0 carries the output mask
                        e = noise((len(ks), n)) if ci == 0 else np.zeros((len(ks), n))
                        u += (e[:, None, :] - u.sum(1, keepdims=True)) / valid
                        mask[g:g + len(ks)] += e
                    terms[: len(ks), :valid] = u
                    prod = ct * mult.ravel()  # numpy in, in-place mask add: ≈ 0.4 ms less per ciphertext
                    prod.add_(terms.ravel())
                    row_out.append(prod)
                out.append(row_out)
        return CKKSProducts(out, out_shape, side, (m, n), r, t), mask

    def right(self, ex, w, noise):
        self._check(w, "plaintext weight")
        return self._product(ex, np.asarray(w, dtype=np.float64), "right", noise)

    def left(self, w, ex, noise):
        self._check(w, "plaintext weight")
        return self._product(ex, np.asarray(w, dtype=np.float64), "left", noise)

    def decrypt(self, e: CKKSProducts) -> np.ndarray:
        m, n = e.x_shape
        r, t = e.rows, e.tiles
        y = np.zeros(e.shape)
        p = e.shape[1] if e.side == "right" else e.shape[0]
        with self.timer.time("decrypt"):
            for ci, row in enumerate(e.cts):
                lo = ci * r
                valid = min(r, m - lo)
                for gi, ct in enumerate(row):
                    g = gi * t
                    nk = min(t, p - g)
                    v = np.asarray(ct.decrypt())[: t * r * n].reshape(t, r, n)[:nk, :valid]
                    if e.side == "right":
                        y[lo:lo + valid, g:g + nk] = v.sum(2).T
                    else:
                        y[g:g + nk] += v.sum(1)
        return y

    # ------------------------------------------------------------------ wire format
    def dumps(self, e: Encrypted) -> bytes:
        with self.timer.time("serialize"):
            if isinstance(e, CKKSMatrix):
                head = {"type": "matrix", "shape": e.shape, "rows": e.rows, "tiles": e.tiles, "n": len(e.cts)}
                blobs = [ct.serialize() for ct in e.cts]
            else:
                head = {"type": "products", "shape": e.shape, "side": e.side, "x_shape": e.x_shape, "rows": e.rows,
                        "tiles": e.tiles, "n": [len(row) for row in e.cts]}
                blobs = [ct.serialize() for row in e.cts for ct in row]
            return pack_blobs(head, blobs)

    def loads(self, buf: bytes) -> Encrypted:
        with self.timer.time("deserialize"):
            head, blobs = unpack_blobs(buf)
            cts = [ts.ckks_vector_from(self.ctx, b) for b in blobs]
            if head["type"] == "matrix":
                return CKKSMatrix(cts, tuple(head["shape"]), head["rows"], head["tiles"])
            rows, i = [], 0
            for k in head["n"]:
                rows.append(cts[i:i + k])
                i += k
            return CKKSProducts(rows, tuple(head["shape"]), head["side"], tuple(head["x_shape"]), head["rows"],
                                head["tiles"])

    def describe(self) -> dict:
        return {**self.params, "slots": self.slots, "security_bits": 128, "mult_depth": 1, "max_abs_operand": MAX_ABS,
                "packing": "row-major tiles, one ciphertext per row chunk; reduction after decryption"}

