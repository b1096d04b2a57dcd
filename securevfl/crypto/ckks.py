"""CKKS backend: the library-free part (:class:`CKKSBase`: κ, layouts, masks, flood, wire heads) and SEAL
through TenSEAL (:class:`CKKSBackend`, the default); OpenFHE's is :mod:`securevfl.crypto.openfhe_ckks`.
Numbers below are SEAL's.

Over 600 lines (662) in one file because :class:`CKKSBase` (the library-free scheme maths) and its SEAL
backend share the layouts slot for slot; SEAL's wire format is in seal_wire.py, OpenFHE's backend in
openfhe_ckks.py.

Parameters (defaults): ``poly_modulus_degree`` N = 16384, ``coeff_mod_bit_sizes`` [60, 60, 60, 60],
``global_scale_bits`` 60: 240 bits, below the 438 the HomomorphicEncryption.org standard allows at
N = 16384 for 128-bit classical security (ternary secret). Every HE product of the protocol is one
plaintext × ciphertext multiplication followed by additions (depth 1); after its rescale 120 bits
of modulus remain, 60 above the scale.

What limits hiding here is precision, measured (OMP_NUM_THREADS=1, this backend, N 16384): a slot
of magnitude 2^m decrypts with error ≈ 2^(m − scale + 10) (SEAL decodes through double-precision
FFTs, and the noise of a product grows with the plaintext multiplier). The protocol needs results
to ≈ 2^-20, so a slot may hold at most 2^(scale − 30): with masks κ bits above a share that is itself
κ bits above |W_P| ≤ 2^weight_bits, κ = ⌊(scale − 12 − frac_bits − weight_bits)/2⌋ = 12 bits of
statistical hiding at the defaults (:attr:`kappa`, reported in ``cost.he``). The old default
(N 8192, scale 2^40) would give 2 bits and is refused. ``benchmarks/he_ckks_kappa.py`` measures the
bound per parameter set: the error grows ∝ the slot magnitude (slope 1.0), so κ is 12 at N 16384 with
4 or 7 primes alike and 10 at N 32768 (a larger fresh-noise floor); N 8192 reaches the 2^-21 target at
no magnitude (scale ≤ 2^50). Splitting a value over two slots cannot help either (the high slot's
error is scaled back up on recombination). κ ≥ 40 would need a decoder beyond double precision
(and a scale above SEAL's 60-bit primes); use Paillier (κ ≥ 40) where that matters.

Circuit privacy (noise flooding). The key owner P can compute its own encryption error ε of a
ciphertext it sent; a decrypted product slot carries ε·w (+ the rescale and encoding errors) for the
active party's plaintext multiplier w, in its real AND imaginary parts. The real part of every slot
is covered by the term masks (κ bits above the term bound, which dominates |ε·w|); the imaginary
part carries no value anyone needs, so the active party floods it: before a product leaves, it adds
(through ``tenseal.sealapi``, since TenSEAL encodes only real vectors) a complex plaintext whose real
part is the term masks and whose imaginary part is a fresh uniform draw of half-width
S = 2^(2κ + weight_bits) (the size of the largest term mask, so the double-precision decoding budget
above is unchanged). Its hiding is κ_f = ⌊log2(S / B)⌋ bits per slot (:func:`flooding_bits`,
``cost.he.flooding_bits``), B a public bound on the imaginary noise of a product slot:
B = B_clean·M + M·N/2/Δ + B_scale, with B_clean = (8√2 σ N + 6 σ √N + 16 σ √(hN) + N/2)/Δ the
fresh-encryption bound of Cheon–Kim–Kim–Song 2017 (Lemma 1, plus the encoding rounding N/2; σ 3.2,
h = N the worst-case Hamming weight of the ternary secret), B_scale = √(N/3)(3 + 8√h)/Δ their
rescaling bound (Lemma 2), and M = 2^(κ + weight_bits) the public bound on |w| and on the encrypted
values (t, shares). Measured ε (N 16384, 2^60): max |Im ε| ≈ 2^-45.8 against B_clean ≈ 2^-39.6.
The flooded ciphertexts travel as SEAL ciphertexts (TenSEAL cannot wrap a modified one in memory; the key
owner decrypts them as one TenSEAL vector per chunk, built from their bytes).
What remains: the *sum* of an output's slots is not masked where the protocol does not mask it (the
passive party's own ∂L/∂t = g W_Pᵀ): it reads g (W_P + ε)ᵀ, ε its own error, with W_P unknown to it.

Packing ``terms`` (the default; ``packing=rotations`` reduces inside the ciphertext instead, with 3 bits
less κ: ckks_rotations.py) ("row-major tiles, reduction after decryption"): a matrix X (m×n) is cut into row chunks
of r = min(m, slots // n) rows; each chunk is flattened row-major and tiled t = slots // (r·n)
times to fill one ciphertext. A product with a plaintext matrix multiplies the ciphertext slot-wise
by a plaintext laid out so that tile τ holds the terms of output column (``X @ W``) or output row
(``W @ X``) number g·t + τ; no rotation is needed. Each slot holds one term, so every term is blinded
with its own fresh uniform mask κ bits above the term bound: with ``hide`` the output mask is the
sum of its terms' masks; without, the term masks cancel in each output (the key owner learns the
exact sum, never a term).

"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import tenseal as ts
import tenseal.sealapi as sealapi

from securevfl.configuration.validate import whole_number
from securevfl.crypto import ckks_rotations as rot
from securevfl.crypto import tiles
from securevfl.crypto.backend import Encrypted, HEBackend, HETimer, he_threads, pack_blobs, unpack_blobs
from securevfl.crypto.ckks_rotations import KAPPA_COST_BITS
from securevfl.crypto.seal_wire import proto_blobs, seal_dumps, seal_load, seal_loads, vector_proto
from securevfl.errors import UserError

# HomomorphicEncryption.org security standard, 128-bit classical, ternary secret: max log2(q) per N
MAX_COEFF_BITS_128 = {1024: 27, 2048: 54, 4096: 109, 8192: 218, 16384: 438, 32768: 881}
MIN_KAPPA = 8
PACKINGS = ("terms", "rotations")  # ckks_rotations.py: the reduction inside the ciphertext
BACKENDS = ("tenseal", "openfhe")
"""The libraries ``--he ckks`` runs on (``--he-param backend=...``); TenSEAL (SEAL) is the default, or the
one the ``SECUREVFL_CKKS_BACKEND`` environment variable names (as bfv.py's ``SECUREVFL_BFV_BACKEND``)."""


def ckks_ranges(p: dict) -> dict:
    """CKKS parameters within 128-bit security and one rescaling level (``p`` typed by the shared check)."""
    n, bits, scale = p["poly_modulus_degree"], p["coeff_mod_bit_sizes"], p["global_scale_bits"]
    if isinstance(bits, str):
        bits = [b for b in bits.replace("[", "").replace("]", "").split(",") if b.strip()]
    if not isinstance(bits, list | tuple):
        raise UserError(f"--he ckks: coeff_mod_bit_sizes must be a list of integers, got {bits!r}")
    bits = [whole_number("--he ckks", "coeff_mod_bit_sizes", b) for b in bits]
    if n not in MAX_COEFF_BITS_128:
        raise UserError(f"--he ckks: poly_modulus_degree must be one of {sorted(MAX_COEFF_BITS_128)}, got {n}")
    if sum(bits) > MAX_COEFF_BITS_128[n]:
        raise UserError(f"--he ckks: coeff_mod_bit_sizes sum to {sum(bits)} bits, above the "
                        f"{MAX_COEFF_BITS_128[n]} bits that give 128-bit security at poly_modulus_degree {n}")
    if len(bits) < 3 or any(not 20 <= b <= 60 for b in bits):
        raise UserError("--he ckks: coeff_mod_bit_sizes needs ≥ 3 primes of 20..60 bits (one rescaling level)")
    if not 20 <= scale <= min(bits[1:-1]) or sum(bits[:-2]) - scale < 40:
        raise UserError(f"--he ckks: global_scale_bits {scale} must be ≤ the middle primes and ≥ 40 bits below "
                        "the primes left after one rescale (integer headroom)")
    if p.get("packing", "terms") not in PACKINGS:
        raise UserError(f"--he ckks: packing must be one of {', '.join(PACKINGS)}, got {p['packing']!r}")
    if p.get("backend", "tenseal") not in BACKENDS:
        raise UserError(f"--he ckks: backend must be one of {', '.join(BACKENDS)}, got {p['backend']!r}")
    return {"poly_modulus_degree": n, "coeff_mod_bit_sizes": bits, "global_scale_bits": scale,
            "packing": p.get("packing", "terms"), "backend": p.get("backend", "tenseal")}


@dataclass
class CKKSMatrix(Encrypted):
    """X (m×n): chunk c holds rows [c·r, c·r + r) flattened and tiled t times."""

    cts: list
    shape: tuple[int, int]
    rows: int
    tiles: int
    blobs: list | None = None  # per chunk: its SEAL ciphertext bytes (on the receiving side)


@dataclass
class CKKSProducts(Encrypted):
    """Masked terms of a product, one ciphertext per (chunk, output group); reduced after decryption."""

    cts: list  # [chunk][group]: flooded sealapi Ciphertexts (sender) or their bytes (receiver)
    shape: tuple[int, int]  # the product's shape
    side: str  # "right" (X @ W) or "left" (W @ X)
    x_shape: tuple[int, int]
    rows: int
    tiles: int
    scale: float = 0.0  # the products' CKKS scale after rescaling


@dataclass
class RotMatrix(Encrypted):
    """``packing=rotations``: X's ciphertexts per product side (seeded bytes; loaded on first use)."""

    parts: dict  # "right" (E = X) / "left" (E = Xᵀ) → ciphertext bytes in ckks_rotations' layout
    shape: tuple[int, int]
    cts: dict | None = None


@dataclass
class RotProducts(Encrypted):
    """``packing=rotations``: Z = E·W_m (+ addend, masks), one ciphertext per (input ct, output ct)."""

    cts: list  # sealapi Ciphertexts (sender) or their bytes (receiver)
    shape: tuple[int, int]  # the product's shape (Zᵀ for ``left``)
    side: str
    e_shape: tuple[int, int]
    p: int
    scale: float = 0.0


DECODE_MARGIN_BITS = 12  # SEAL: a slot of 2^(scale − 12 − f) decodes to 2^-(f+2) (module docstring)


def ckks_kappa(scale_bits: int, frac_bits: int, weight_bits: int, packing: str = "terms",
               margin_bits: int = DECODE_MARGIN_BITS) -> int:
    """Bits of statistical hiding the precision budget leaves (module docstring; ``rotations`` pays
    :data:`~securevfl.crypto.ckks_rotations.KAPPA_COST_BITS` for whole sums in a slot; ``margin_bits``:
    what the library's decoder loses below the scale)."""
    return ((scale_bits - margin_bits - frac_bits - weight_bits) // 2
            - (KAPPA_COST_BITS if packing == "rotations" else 0))


SIGMA = 3.2  # SEAL's error standard deviation (3.19), clipped at 6σ


def fresh_noise_bound(n: int, scale_bits: int) -> float:
    """Public high-probability bound on |ε| of a fresh public-key encryption, per slot, in value units."""
    h = n  # worst-case Hamming weight of the ternary secret
    b_clean = 8 * math.sqrt(2) * SIGMA * n + 6 * SIGMA * math.sqrt(n) + 16 * SIGMA * math.sqrt(h * n)
    return (b_clean + n / 2) / 2.0 ** scale_bits


def product_noise_bound(n: int, scale_bits: int, value_bits: int) -> float:
    """Bound on the noise of one product slot (x + ε)(w + ρ_w) after rescaling, |x|, |w| ≤ 2^value_bits."""
    m = 2.0 ** value_bits
    rescale = math.sqrt(n / 3) * (3 + 8 * math.sqrt(n)) / 2.0 ** scale_bits
    return fresh_noise_bound(n, scale_bits) * m + m * (n / 2) / 2.0 ** scale_bits + rescale


def flood_width_bits(kappa: int, weight_bits: int) -> int:
    """Half-width of the imaginary flood: the largest term mask (2^(2κ + weight_bits))."""
    return 2 * kappa + weight_bits


def flooding_bits(n: int, scale_bits: int, kappa: int, weight_bits: int) -> int:
    """κ_f: bits by which the imaginary flood exceeds the public bound on a slot's noise."""
    return math.floor(flood_width_bits(kappa, weight_bits)
                      - math.log2(product_noise_bound(n, scale_bits, kappa + weight_bits)))


class CKKSBase(HEBackend):
    """CKKS in both packings, independent of the library: κ and the flood's size, the layouts, every mask
    and flood draw, the reduction after decryption and the wire format's heads. A library backend
    (:class:`CKKSBackend` on SEAL, :class:`securevfl.crypto.openfhe_ckks.OpenFHECKKSBackend`) supplies
    keys, encryption, a handful of ciphertext operations and decryption (the methods below the line)."""

    scheme = "ckks"
    defaults = {"poly_modulus_degree": 16384, "coeff_mod_bit_sizes": [60, 60, 60, 60], "global_scale_bits": 60,
                "packing": "terms", "backend": "tenseal"}
    check_ranges = staticmethod(ckks_ranges)
    exact = False
    flood = True  # the imaginary flooding (tests switch it off for their control)
    garbage_masks = True  # packing=rotations: masks on the slots that are not outputs (likewise)
    library: str = ""
    margin_bits = DECODE_MARGIN_BITS
    max_scale_bits = 60

    @classmethod
    def validate(cls, params: dict) -> dict:
        return super().validate({"backend": os.environ.get("SECUREVFL_CKKS_BACKEND", "tenseal"), **params})

    @classmethod
    def scale_bits_of(cls, params: dict) -> int:
        """The scale this library runs at (``global_scale_bits``, capped at its largest prime)."""
        return min(int(params["global_scale_bits"]), cls.max_scale_bits)

    @classmethod
    def kappa_for(cls, params: dict, frac_bits: int, weight_bits: int) -> int:
        return ckks_kappa(cls.scale_bits_of(params), frac_bits, weight_bits, str(params.get("packing", "terms")),
                          cls.margin_bits)

    def __init__(self, params: dict, timer: HETimer | None, frac_bits: int, weight_bits: int) -> None:
        super().__init__(timer)
        self.params = {**self.validate(params), "backend": self.library}
        self.f = frac_bits
        self.weight_bits = weight_bits
        self.rotations = self.params["packing"] == "rotations"
        self.scale_bits = self.scale_bits_of(self.params)
        self.kappa = self.kappa_for(self.params, frac_bits, weight_bits)
        if self.kappa < MIN_KAPPA:
            raise UserError(f"--he ckks: global_scale_bits {self.scale_bits} on {self.library} leaves {self.kappa} "
                            f"bits of mask hiding (< {MIN_KAPPA}); use the default 60 with coeff_mod_bit_sizes "
                            "[60,60,60,60] at poly_modulus_degree 16384"
                            + (" and packing=terms" if self.rotations else ""))
        self.slots = self.params["poly_modulus_degree"] // 2
        self.flooding_bits = (self.kappa if self.rotations else  # sized against the garbage: ckks_rotations
                              flooding_bits(self.params["poly_modulus_degree"], self.scale_bits, self.kappa,
                                            weight_bits))

    # ------------------------------------------------------------------ the library's part
    def _encrypt_chunks(self, vecs: Iterable[np.ndarray]) -> list:
        """``terms``: public-key encryptions of real slot vectors (the input's own objects)."""
        raise NotImplementedError

    def _encrypt_packed(self, vec: np.ndarray) -> bytes:
        """``rotations``: the key owner's encryption of a complex slot vector, as bytes."""
        raise NotImplementedError

    def _terms_products(self, ex: CKKSMatrix, ci: int, mult: np.ndarray, noise: np.ndarray) -> list:
        """Chunk ``ci`` of [[X]] times each row of ``mult`` (real, groups × slots), rescaled, plus the
        same row of ``noise`` (complex): one product ciphertext per group."""
        raise NotImplementedError

    def _load_packed(self, blob: bytes):
        raise NotImplementedError

    def _babies(self, ct, step: int, count: int) -> list:
        """rot(ct, step·b) for b < count (b = 0: ct itself)."""
        raise NotImplementedError

    def _mul_plain(self, ct, vec: np.ndarray):
        """ct ⊙ vec (complex), not rescaled."""
        raise NotImplementedError

    def _add(self, a, b):
        raise NotImplementedError

    def _rotate(self, ct, step: int):
        raise NotImplementedError

    def _rescale(self, ct):
        raise NotImplementedError

    def _add_plain(self, ct, vec: np.ndarray):
        """ct + vec (complex), at ct's level and scale."""
        raise NotImplementedError

    def _decrypt_blobs(self, blobs: list[bytes], scale: float) -> np.ndarray:
        """Real parts of every slot of each ciphertext (len(blobs) × slots)."""
        raise NotImplementedError

    def slots_complex(self, blobs: list[bytes]) -> list[np.ndarray]:
        """Every slot of each ciphertext, complex: the key owner's whole view of what it decrypts."""
        raise NotImplementedError

    def _ct_bytes(self, ct) -> bytes:
        raise NotImplementedError

    def _ct_scale(self, ct) -> float:
        return 0.0

    def _input_blobs(self, ex: CKKSMatrix) -> list[bytes]:
        raise NotImplementedError

    def _inputs_from(self, blobs: list[bytes], shape: tuple[int, int], rows: int, t: int) -> CKKSMatrix:
        raise NotImplementedError

    # ------------------------------------------------------------------ layout
    def _real(self, x: np.ndarray, scale_bits: int) -> np.ndarray:
        return np.asarray(x, dtype=object).astype(np.float64) / 2.0 ** scale_bits

    def encrypt(self, x: np.ndarray, ops: frozenset[str]) -> Encrypted:
        if self.rotations:
            return self._encrypt_rot(x, ops)
        x = self._real(x, self.f)
        m, n = x.shape
        r, t = tiles.layout(m, n, self.slots, "ckks")
        with self.timer.time("encrypt"):
            cts = self._encrypt_chunks(tiles.chunk_vectors(x, r, t))
        return CKKSMatrix(cts, (m, n), r, t)

    def _product(self, ex: CKKSMatrix, w: np.ndarray, side: str, addend: np.ndarray, term_bits: int, hide: bool,
                 rng) -> tuple[CKKSProducts, np.ndarray]:
        m, n = ex.shape
        r, t = ex.rows, ex.tiles
        w = self._real(w, self.f)
        add = self._real(addend, 2 * self.f)
        p = w.shape[1] if side == "right" else w.shape[0]
        out_shape = (m, p) if side == "right" else (p, n)
        mask = np.zeros(out_shape)
        s = 2.0 ** (self.kappa + term_bits - 2 * self.f)  # term masks: κ bits above the term bound
        flood = 2.0 ** flood_width_bits(self.kappa, self.weight_bits) if self.flood else 0.0
        out = []
        with self.timer.time("matmul"):
            for ci in range(len(ex.cts)):
                lo = ci * r
                valid = min(r, m - lo)
                groups = tiles.groups(p, t)
                mult = np.stack([tiles.multipliers(w, side, lo, valid, r, n, t, ks) for ks in groups])
                terms = np.zeros((len(groups), self.slots), dtype=complex)
                for gi, ks in enumerate(groups):
                    g = ks.start
                    u = rng.uniform((len(ks), valid, n), -s, s)
                    if side == "right":
                        if not hide:
                            u -= u.mean(2, keepdims=True)
                        u += add[lo:lo + valid, g:g + len(ks)].T[:, :, None] / n
                        mask[lo:lo + valid, g:g + len(ks)] = u.sum(2).T - add[lo:lo + valid, g:g + len(ks)]
                    else:
                        if not hide:
                            u -= u.mean(1, keepdims=True)
                        if ci == 0:
                            u += add[g:g + len(ks)][:, None, :] / valid
                        mask[g:g + len(ks)] += u.sum(1) - (add[g:g + len(ks)] if ci == 0 else 0)
                    block = np.zeros((t, r, n))
                    block[: len(ks), :valid] = u
                    terms[gi, : block.size] = block.ravel()
                # real part: the term masks; imaginary part: the flood (every slot, padding included)
                terms.imag = rng.uniform(terms.shape, -flood, flood)
                full = np.zeros((len(groups), self.slots))
                full[:, : t * r * n] = mult.reshape(len(groups), -1)
                out.append(self._terms_products(ex, ci, full, terms))
        mask_int = np.rint(mask * 2.0 ** (2 * self.f)).astype(object) if hide else np.zeros(out_shape, dtype=object)
        return CKKSProducts(out, out_shape, side, (m, n), r, t), mask_int

    def right(self, ex, w, addend, term_bits, hide, rng, addend_bits=None):
        if isinstance(ex, RotMatrix):
            return self._product_rot(ex, w, "right", addend, term_bits, hide, rng)
        return self._product(ex, w, "right", addend, term_bits, hide, rng)

    def left(self, w, ex, addend, term_bits, hide, rng, addend_bits=None):
        if isinstance(ex, RotMatrix):
            return self._product_rot(ex, w, "left", addend, term_bits, hide, rng)
        return self._product(ex, w, "left", addend, term_bits, hide, rng)

    # ------------------------------------------------------------------ packing=rotations
    def _encrypt_rot(self, x: np.ndarray, ops: frozenset[str]) -> RotMatrix:
        """E = X for ``right`` and Xᵀ for ``left``, each in ckks_rotations' layout: the key owner only ever
        sends its inputs."""
        x = self._real(x, self.f)
        parts: dict[str, list] = {}
        with self.timer.time("encrypt"):
            for side in sorted(ops):
                e = x if side == "right" else x.T
                lay = rot.layout(e.shape[0], e.shape[1], self.slots)
                parts[side] = [self._encrypt_packed(vec) for vec in rot.pack_input(e, lay)]
        return RotMatrix(parts, x.shape)

    def _product_rot(self, ex: RotMatrix, w: np.ndarray, side: str, addend: np.ndarray, term_bits: int,
                     hide: bool, rng) -> tuple[RotProducts, np.ndarray]:
        """Z = E·W_m + addend (+ masks) with E = X, W_m = W (``right``) or E = Xᵀ, W_m = Wᵀ (``left``,
        whose product W·X is Zᵀ). Module ckks_rotations describes the layout and the masks."""
        if side not in ex.parts:
            raise ValueError(f"the matrix was not encrypted for {side} products")
        e_shape = ex.shape if side == "right" else ex.shape[::-1]
        wm = self._real(w if side == "right" else np.asarray(w, dtype=object).T, self.f)
        add = self._real(addend if side == "right" else np.asarray(addend, dtype=object).T, 2 * self.f)
        lay = rot.layout(e_shape[0], e_shape[1], self.slots)
        plan = rot.Plan(lay, wm.shape[1])
        bound = rot.bound_bits(term_bits, lay.n, self.f)
        top = self.scale_bits - self.margin_bits - self.f  # the decoding budget (module docstring)
        add_bits = math.ceil(math.log2(float(np.abs(add).max()) + 1.0)) if add.size else 0
        if max(self.kappa + bound, add_bits) > top:
            raise UserError(f"--he ckks packing=rotations: a product over {lay.n} terms needs slots of "
                            f"2^{max(self.kappa + bound, add_bits)}, above the 2^{top} that decode to 2^-{self.f}; "
                            "use packing=terms or a smaller cut width")
        s = 2.0 ** (self.kappa + bound)
        wc = rot.complex_pairs(wm.T, conj=True).T
        mask = np.zeros(add.shape)
        out = []
        with self.timer.time("matmul"):
            if ex.cts is None:
                ex.cts = {k: [self._load_packed(b) for b in v] for k, v in ex.parts.items()}
            for ci, ct in enumerate(ex.cts[side]):
                babies = self._babies(ct, plan.step, min(plan.baby, plan.n_diag))
                g_size = len(babies)
                for o in range(plan.outs_per_ct):
                    d = rot.diagonals(plan, wc, o)
                    acc = None
                    for g in reversed(range(0, plan.n_diag, g_size)):  # Horner over the giant steps
                        inner = None
                        for b, baby in enumerate(babies[: min(g_size, plan.n_diag - g)]):
                            term = self._mul_plain(baby, np.roll(d[g + b], g * plan.step))
                            inner = term if inner is None else self._add(inner, term)
                        acc = inner if acc is None else self._add(self._rotate(acc, g_size * plan.step), inner)
                    assert acc is not None  # n_diag ≥ 1: at least one giant step
                    acc = self._rescale(acc)
                    for step in plan.sum_steps:
                        acc = self._add(acc, self._rotate(acc, step))
                    slot, row, col = rot.output_index(plan, ci, o)
                    # every slot: a fresh uniform real mask (outputs: the addend, plus a mask with ``hide``)
                    # and a fresh uniform imaginary flood, κ bits above the bound on what they cover
                    noise = (rng.uniform((self.slots,), -s, s) * self.garbage_masks
                             + 1j * rng.uniform((self.slots,), -s, s) * self.flood)
                    out_mask = rng.uniform((len(slot),), -s, s) if hide else np.zeros(len(slot))
                    noise.real[slot] = add[row, col] + out_mask
                    mask[row, col] = out_mask
                    out.append(self._add_plain(acc, noise))
        out_shape = add.shape if side == "right" else add.shape[::-1]
        mask_int = (np.rint((mask if side == "right" else mask.T) * 2.0 ** (2 * self.f)).astype(object)
                    if hide else np.zeros(out_shape, dtype=object))
        return RotProducts(out, out_shape, side, e_shape, plan.p), mask_int

    # ------------------------------------------------------------------ decryption
    def decrypt_real(self, e: Encrypted) -> np.ndarray:
        if isinstance(e, RotProducts):
            with self.timer.time("decrypt"):
                z = rot.gather(e.e_shape, e.p, list(self._decrypt_blobs(e.cts, e.scale)), self.slots)
            return z if e.side == "right" else z.T
        assert isinstance(e, CKKSProducts)
        m, n = e.x_shape
        r, t = e.rows, e.tiles
        y = np.zeros(e.shape)
        p = e.shape[1] if e.side == "right" else e.shape[0]
        with self.timer.time("decrypt"):
            for ci, row in enumerate(e.cts):
                lo = ci * r
                valid = min(r, m - lo)
                vals = self._decrypt_blobs(row, e.scale)
                for v, ks in zip(vals, tiles.groups(p, t), strict=True):
                    tiles.reduce_terms(y, v[: t * r * n].reshape(t, r, n), e.side, lo, valid, ks)
        return y

    def decrypt(self, e: Encrypted) -> np.ndarray:
        """Integers at 2^(2f), still carrying the CKKS noise; the protocol rounds what crosses back."""
        assert isinstance(e, CKKSProducts | RotProducts)  # the key owner decrypts products, never its own inputs
        return np.array([int(v) for v in np.rint(self.decrypt_real(e) * 2.0 ** (2 * self.f)).ravel()] + [0],
                        dtype=object)[:-1].reshape(e.shape)

    # ------------------------------------------------------------------ wire format
    def dumps(self, e: Encrypted) -> bytes:
        with self.timer.time("serialize"):
            if isinstance(e, RotMatrix):  # already bytes, from encrypt
                sides = sorted(e.parts)
                return pack_blobs({"type": "rmatrix", "shape": e.shape, "sides": sides,
                                   "n": [len(e.parts[k]) for k in sides]}, [b for k in sides for b in e.parts[k]])
            if isinstance(e, RotProducts):
                return pack_blobs({"type": "rproducts", "shape": e.shape, "side": e.side, "e_shape": e.e_shape,
                                   "p": e.p, "scale": self._ct_scale(e.cts[0])}, [self._ct_bytes(ct) for ct in e.cts])
            if isinstance(e, CKKSMatrix):
                head = {"type": "matrix", "shape": e.shape, "rows": e.rows, "tiles": e.tiles, "n": len(e.cts)}
                blobs = self._input_blobs(e)
            else:
                assert isinstance(e, CKKSProducts)  # the only other Encrypted this backend makes
                head = {"type": "products", "shape": e.shape, "side": e.side, "x_shape": e.x_shape, "rows": e.rows,
                        "tiles": e.tiles, "n": [len(row) for row in e.cts], "scale": self._ct_scale(e.cts[0][0])}
                blobs = [self._ct_bytes(ct) for row in e.cts for ct in row]
            return pack_blobs(head, blobs)

    def loads(self, buf: bytes) -> Encrypted:
        with self.timer.time("deserialize"):
            head, blobs = unpack_blobs(buf)
            if head["type"] == "rmatrix":
                parts, i = {}, 0
                for side, k in zip(head["sides"], head["n"], strict=True):
                    parts[side], i = blobs[i:i + k], i + k
                return RotMatrix(parts, tuple(head["shape"]))
            if head["type"] == "rproducts":
                return RotProducts(blobs, tuple(head["shape"]), head["side"], tuple(head["e_shape"]), head["p"],
                                   head["scale"])
            if head["type"] == "matrix":
                return self._inputs_from(blobs, tuple(head["shape"]), head["rows"], head["tiles"])
            rows, i = [], 0
            for k in head["n"]:  # bytes, decrypted as they are
                rows.append(blobs[i:i + k])
                i += k
            return CKKSProducts(rows, tuple(head["shape"]), head["side"], tuple(head["x_shape"]), head["rows"],
                                head["tiles"], head["scale"])

    def describe(self) -> dict:
        return {**self.params, "global_scale_bits": self.scale_bits, "library": self.library,
                "slots": self.slots, "security_bits": 128, "mult_depth": 1, "mask_bits": self.kappa,
                "exact": False, "noise_flooding": "imaginary parts" if self.flood else False,
                "flooding_bits": self.flooding_bits if self.flood else 0,
                "packing": ("rotations: complex pairs, doubled rows, baby-step giant-step diagonals; one slot per "
                            "output, power-of-two Galois keys" if self.rotations else
                            "row-major tiles, one ciphertext per row chunk; reduction after decryption")}


class CKKSBackend(CKKSBase):
    """CKKS on Microsoft SEAL through TenSEAL (the default library)."""

    library = "tenseal"

    def __init__(self, params: dict, context: ts.Context | None = None, timer: HETimer | None = None,
                 frac_bits: int = 20, weight_bits: int = 4, **_) -> None:
        super().__init__(params, timer, frac_bits, weight_bits)
        if context is None:  # key owner
            with self.timer.time("keygen"):
                context = ts.context(ts.SCHEME_TYPE.CKKS, self.params["poly_modulus_degree"],
                                     coeff_mod_bit_sizes=self.params["coeff_mod_bit_sizes"], n_threads=he_threads())
                context.global_scale = 2.0 ** self.params["global_scale_bits"]
        self.ctx = context
        self.galois: sealapi.GaloisKeys | None = None
        self._galois_bytes = b""
        self._sym: sealapi.Encryptor | None = None
        self.seal_ctx = context.seal_context().data
        self.encoder = sealapi.CKKSEncoder(self.seal_ctx)
        self.evaluator = sealapi.Evaluator(self.seal_ctx)
        if self.rotations and context.is_private():  # left rotations by powers of two, published once
            with self.timer.time("keygen"):
                n2 = 2 * self.params["poly_modulus_degree"]
                keys = sealapi.KeyGenerator(self.seal_ctx, context.secret_key().data).create_galois_keys(
                    [pow(3, step, n2) for step in rot.galois_steps(self.slots)])
                self._galois_bytes = seal_dumps(keys)  # seeded: half the size of the keys themselves

    @classmethod
    def from_public(cls, blob: bytes, params: dict, timer: HETimer | None = None, **kw) -> CKKSBackend:
        head, parts = unpack_blobs(blob)
        if head.get("library", "tenseal") != cls.library:
            raise ValueError(f"the CKKS public context was made by another library than this run's ({cls.library})")
        if head.get("galois") and len(parts) != 2 or not head.get("galois") and len(parts) != 1:
            raise ValueError("malformed CKKS public context")
        be = cls(params, ts.context_from(parts[0], n_threads=he_threads()), timer, **kw)
        if be.rotations:
            if not head.get("galois"):
                raise ValueError("packing=rotations needs the key owner's Galois keys")
            be.galois = seal_load(sealapi.GaloisKeys(), be.seal_ctx, parts[1])
        return be

    def has_secret(self) -> bool:
        return self.ctx.is_private()

    def public_bytes(self) -> bytes:
        ctx = self.ctx.serialize(save_public_key=True, save_secret_key=False, save_galois_keys=False,
                                 save_relin_keys=False)
        return pack_blobs({"galois": self.rotations}, [ctx, self._galois_bytes] if self.rotations else [ctx])

    # ------------------------------------------------------------------ terms
    def _encrypt_chunks(self, vecs: Iterable[np.ndarray]) -> list:
        return [ts.ckks_vector(self.ctx, vec.tolist()) for vec in vecs]

    def _repeat(self, ex: CKKSMatrix, ci: int, k: int) -> ts.CKKSVector:
        """Chunk ``ci`` of [[X]] repeated k times as one TenSEAL vector (from its SEAL bytes)."""
        if ex.blobs is None:
            ex.blobs = [proto_blobs(c.serialize())[0][0] for c in ex.cts]
        return ts.ckks_vector_from(self.ctx, vector_proto([ex.blobs[ci]] * k, self.slots,
                                                          ex.cts[ci].ciphertext()[0].scale))

    def _terms_products(self, ex: CKKSMatrix, ci: int, mult: np.ndarray, noise: np.ndarray) -> list:
        if he_threads() > 1:  # the chunk repeated per group as one vector: TenSEAL's threads share it
            prods = (self._repeat(ex, ci, len(mult)) * mult.ravel()).ciphertext()  # split at full ciphertexts
        else:  # ≈ 10 % less CPU on one core than the repeated vector
            used = ex.rows * ex.tiles * ex.shape[1]
            prods = [(ex.cts[ci] * mv[:used]).ciphertext()[0] for mv in mult]
        for prod, row in zip(prods, noise, strict=True):
            pt = sealapi.Plaintext()
            self.encoder.encode(row.tolist(), prod.parms_id(), prod.scale, pt)
            self.evaluator.add_plain_inplace(prod, pt)
        return prods

    # ------------------------------------------------------------------ rotations
    def _encrypt_packed(self, vec: np.ndarray) -> bytes:
        """With the secret key, saved seeded (half a fresh ciphertext's bytes)."""
        if self._sym is None:
            self._sym = sealapi.Encryptor(self.seal_ctx, self.ctx.secret_key().data)
        pt = sealapi.Plaintext()
        self.encoder.encode(vec.tolist(), self.ctx.global_scale, pt)
        return seal_dumps(self._sym.encrypt_symmetric(pt))

    def _load_packed(self, blob: bytes):
        return seal_loads(self.seal_ctx, blob)

    def _babies(self, ct, step: int, count: int) -> list:
        babies = [ct]
        for _ in range(1, count):  # each from the last by one published power-of-two key
            nxt = sealapi.Ciphertext(self.seal_ctx)
            self.evaluator.rotate_vector(babies[-1], step, self.galois, nxt)
            babies.append(nxt)
        return babies

    def _mul_plain(self, ct, vec: np.ndarray):
        pt = sealapi.Plaintext()
        self.encoder.encode(vec.tolist(), ct.parms_id(), self.ctx.global_scale, pt)
        term = sealapi.Ciphertext(self.seal_ctx)
        self.evaluator.multiply_plain(ct, pt, term)
        return term

    def _add(self, a, b):
        self.evaluator.add_inplace(a, b)
        return a

    def _rotate(self, ct, step: int):
        moved = sealapi.Ciphertext(self.seal_ctx)
        self.evaluator.rotate_vector(ct, step, self.galois, moved)
        return moved

    def _rescale(self, ct):
        self.evaluator.rescale_to_next_inplace(ct)
        return ct

    def _add_plain(self, ct, vec: np.ndarray):
        pt = sealapi.Plaintext()
        self.encoder.encode(vec.tolist(), ct.parms_id(), ct.scale, pt)
        self.evaluator.add_plain_inplace(ct, pt)
        return ct

    # ------------------------------------------------------------------ decryption and bytes
    def _decrypt_blobs(self, blobs: list[bytes], scale: float) -> np.ndarray:
        # the ciphertexts as one TenSEAL vector: decrypted on the context's n_threads
        vec = ts.ckks_vector_from(self.ctx, vector_proto(blobs, self.slots, scale))
        return np.asarray(vec.decrypt()).reshape(len(blobs), self.slots)

    def slots_complex(self, blobs: list[bytes]) -> list[np.ndarray]:
        dec = sealapi.Decryptor(self.seal_ctx, self.ctx.secret_key().data)
        out = []
        for b in blobs:
            pt = sealapi.Plaintext()
            dec.decrypt(seal_loads(self.seal_ctx, b), pt)
            out.append(np.asarray(self.encoder.decode_complex(pt)))
        return out

    def _ct_bytes(self, ct) -> bytes:
        return seal_dumps(ct)

    def _ct_scale(self, ct) -> float:
        return ct.scale

    def _input_blobs(self, ex: CKKSMatrix) -> list[bytes]:
        return [ct.serialize() for ct in ex.cts]

    def _inputs_from(self, blobs: list[bytes], shape: tuple[int, int], rows: int, t: int) -> CKKSMatrix:
        cts = [ts.ckks_vector_from(self.ctx, b) for b in blobs]
        return CKKSMatrix(cts, shape, rows, t, [proto_blobs(b)[0][0] for b in blobs])
