"""BFV backend (Microsoft SEAL through ``tenseal.sealapi``): exact integer slots, so every mask is a
uniform draw as under Paillier — κ = ``mask_bits`` ≥ 40 bits of statistical hiding (issue 32's target,
which CKKS's double-precision decoding caps at 12) — at a lattice scheme's SIMD speed.

**Exact values beyond one plaintext modulus.** A BFV slot holds an integer mod t (t ≤ 2^60); the
protocol's fixed-point results need ≈ 2^142 (``slot_bits``: a κ-bit mask above a κ-bit share above
|W_P|). So a value lives in Z_P, P = t_1·…·t_k, with k plaintext moduli (59-bit primes ≡ 1 mod 2N,
SEAL's batching primes; the coefficient primes have 60 bits, so they never coincide), one SEAL context
each with the same ring: inputs are encrypted in each context, and the key owner recombines a
product's residues by CRT. k is the least number of primes whose product holds ``slot_bits`` + sign: 3
at the defaults; a product computes in the fewest of them its own public bound needs (``addend_bits``
from the protocol): 3 for the masked forward product, 2 for the backward ones and the set-up.

**Layout** ``terms`` (tiles.py), as CKKS's default: one term per slot, the reduction after decryption.
Every slot that reaches the key owner carries a mask uniform mod t_i in every context — uniform mod P,
so a term is perfectly hidden; per output the masks sum (mod P) to the output's mask: with ``hide`` a
uniform integer κ bits above the output bound (the protocol's statistical mask, as with Paillier),
without, 0 (the key owner learns the exact sum, never a term).

**Circuit privacy.** The key owner P holds the secret key and every input ciphertext it sent, so a raw
product [[x]]·w gives A's plaintext w away twice: c1 = c1_in·w (P divides by its own c1_in in R_q and
reads w exactly: the control attack of tests/test_he_circuit.py) and the phase noise e·w − (t mod q)·k
(P knows its own e). Before a product leaves the active party it
1. switches the modulus from the 5 data primes to :data:`SEND_PRIMES` (dividing the product's noise,
   ≤ N·t·(2^5 + 2t) ≈ 2^133, by ≈ 2^120, plus the switch's rounding ≤ (1 + N)/2),
2. adds a fresh public-key encryption of zero: c1 gains u·pk1 + e2 for A's fresh ternary u, a ring-LWE
   sample, so c1 is pseudorandom to P even with the secret key, and the phase gains ≤ 6σ(2N + 1),
3. adds a flood (u_F, 0) with u_F uniform on [−2^100, 2^100) per coefficient (built as a raw SEAL
   ciphertext: TenSEAL has no call that adds to the noise alone), so the phase noise that P can compute
   with its secret key is within statistical distance N·B/2^100 of the flood alone, B the public
   bound of steps 1–2: κ_f = ``flooding_bits`` (66 at the defaults) bits for the whole ciphertext.
Decryption stays exact: B + 2^100 is far below Δ/2 = q/(2t) ≈ 2^120 at three primes (checked when a
backend is built).

Parameters: ``poly_modulus_degree`` 16384 (coefficient modulus 6 × 60 bits = 360 ≤ the 438 the
HomomorphicEncryption.org standard allows for 128-bit security; 32768 doubles the slots),
``mask_bits`` κ 40 (40..128). SEAL's calls hold Python's lock, so BFV runs on one core.

Over 600 lines (699) in one file because CRT-BFV's slots, layouts, masks and the SEAL calls that carry them
are one scheme; SEAL's wire format is in seal_wire.py, the rotation layouts in ckks_rotations.py,
OpenFHE's backend in openfhe_bfv.py.
"""

from __future__ import annotations

import math
import os
from abc import abstractmethod
from dataclasses import dataclass, field

import numpy as np
import tenseal.sealapi as sealapi

from securevfl.crypto import ckks_rotations as rot
from securevfl.crypto import tiles
from securevfl.crypto.backend import Encrypted, HEBackend, HETimer, bits_of, pack_blobs, unpack_blobs
from securevfl.crypto.ckks import SIGMA
from securevfl.crypto.seal_wire import raw_ciphertext, seal_dumps, seal_load, seal_loads
from securevfl.errors import UserError

COEFF_BITS = (60,) * 6  # 5 data primes and the special prime
SEND_PRIMES = 3  # data primes a product keeps when it leaves the active party
PLAIN_BITS = 59
FLOOD_HI, FLOOD_SHIFT = 62, 38  # u_F = hi·2^38 + lo, hi uniform on [−2^62, 2^62), lo on [0, 2^38)
SECURE_N = {16384: 438, 32768: 881}  # max log2 q for 128-bit security (ternary secret); SEAL checks it too
HALF = 1 << 30  # the decrypted reduction runs on 30-bit halves of each slot, in int64


PACKINGS = ("terms", "rotations")
BACKENDS = ("tenseal", "openfhe")
"""The libraries ``--he bfv`` runs on (``--he-param backend=...``); TenSEAL (SEAL) is the default, or
the one the ``SECUREVFL_BFV_BACKEND`` environment variable names (an operator who installed the
extra; every party reads its own, and a run's parties must agree: the public context says which)."""


def bfv_ranges(p: dict) -> dict:
    if p["backend"] not in BACKENDS:
        raise UserError(f"--he bfv: backend must be one of {', '.join(BACKENDS)}, got {p['backend']!r}")
    if p["poly_modulus_degree"] not in SECURE_N:
        raise UserError(f"--he bfv: poly_modulus_degree must be one of {sorted(SECURE_N)}, "
                        f"got {p['poly_modulus_degree']}")
    if not 40 <= p["mask_bits"] <= 128:
        raise UserError(f"--he bfv: mask_bits must be in 40..128 (statistical hiding), got {p['mask_bits']}")
    if p["packing"] not in PACKINGS:
        raise UserError(f"--he bfv: packing must be one of {', '.join(PACKINGS)}, got {p['packing']!r}")
    return p


ROTATION_NOISE = 2.0 ** 70
"""``packing=rotations``: a bound on what a product's rotations add to its phase noise before the switch
(a key switch adds ≈ N·σ·q_digit/q_special ≪ 2^70 for SEAL's 60-bit special prime and OpenFHE's
hybrid key switching); the ≤ 2^8 plaintext products a slot sums are counted in :func:`noise_bound`."""


def noise_bound(n: int, t: int, dropped: int, products: int = 1) -> float:
    """Public bound on the phase noise of a product before the flood: [[x]]·w with masks added (BFV
    plaintext-product growth N·t·(fresh + t) plus the mask's rounding t; ``products`` of them summed,
    with :data:`ROTATION_NOISE` when there are rotations), divided by the ``dropped`` primes' product on
    the modulus switch, plus the switch's rounding (1 + N)/2 and a fresh public-key encryption of zero,
    6σ(2N + 1)."""
    product = products * n * t * (2 ** 5 + 2 * t) + t + (ROTATION_NOISE if products > 1 else 0)
    return product / dropped + (1 + n) / 2 + 6 * SIGMA * (2 * n + 1)


def flooding_bits(n: int, t: int, dropped: int, products: int = 1) -> int:
    """κ_f: −log2 of the statistical distance, over a whole ciphertext (N coefficients), between the
    flooded noise and the flood alone."""
    return math.floor(FLOOD_HI + FLOOD_SHIFT - math.log2(n * noise_bound(n, t, dropped, products)))


MAX_PRODUCTS = 256  # packing=rotations: plaintext products a slot sums at most (diagonals, cut widths ≤ 256)


def crt(residues: list[np.ndarray], moduli: list[int]) -> np.ndarray:
    """The integers in (−P/2, P/2] with the given residues (object arrays), P = Π moduli."""
    big = math.prod(moduli)
    acc = np.zeros(residues[0].shape, dtype=object)
    for r, t in zip(residues, moduli, strict=True):
        part = big // t
        acc = acc + np.asarray(r, dtype=object) * (part * pow(part, -1, t))
    acc = acc % big
    return np.where(acc > big // 2, acc - big, acc)


@dataclass
class BFVMatrix(Encrypted):
    """X (m×n) in tiles.py's layout: per row chunk, one ciphertext per plaintext modulus (seeded bytes)."""

    blobs: list[list[bytes]]
    shape: tuple[int, int]
    rows: int
    tiles: int
    cts: dict = field(default_factory=dict)  # (chunk, modulus) → loaded Ciphertext (the product side)


@dataclass
class BFVProducts(Encrypted):
    """Masked terms of a product: [chunk][group][modulus] ciphertexts (sender) or their bytes (receiver)."""

    cts: list
    shape: tuple[int, int]
    side: str
    x_shape: tuple[int, int]
    rows: int
    tiles: int
    moduli: int  # the CRT's size for this product (the first ``moduli`` plaintext moduli)


@dataclass
class BFVRotMatrix(Encrypted):
    """``packing=rotations``: per product side, E (X for ``right``, Xᵀ for ``left``) in ckks_rotations'
    one-value-a-slot layout in the first row of slots: [ciphertext][modulus] bytes."""

    parts: dict[str, list[list[bytes]]]
    shape: tuple[int, int]
    cts: dict = field(default_factory=dict)  # (side, ciphertext, modulus) → loaded (the product side)


@dataclass
class BFVRotProducts(Encrypted):
    """``packing=rotations``: Z = E·W_m + addend + masks, one slot an output: [output ct][modulus]."""

    cts: list
    shape: tuple[int, int]  # the product's shape (Zᵀ for ``left``)
    side: str
    e_shape: tuple[int, int]
    p: int
    moduli: int


def index_vectors(shape: tuple[int, int], lay: rot.Layout) -> list[np.ndarray]:
    """Where each slot of E's packed ciphertexts reads E (1 + its row-major index; 0: empty): the layout
    runs on indices, so values of any size (Python integers) follow it exactly."""
    idx = np.arange(1, shape[0] * shape[1] + 1, dtype=np.float64).reshape(shape)
    return [v.real.astype(np.int64) for v in rot.pack_input(idx, lay)]


def take(values: np.ndarray, idx: np.ndarray, q: int) -> np.ndarray:
    """``values`` (any integers) mod q at the indices ``idx`` of :func:`index_vectors` (0 → 0), int64."""
    flat = np.concatenate([[0], np.mod(np.asarray(values, dtype=object).ravel(), q).astype(np.int64)])
    return flat[idx]


class CRTBFV(HEBackend):
    """BFV over a CRT of plaintext moduli in the ``terms`` layout, independent of the library: the layout,
    the masks that cancel per output, the CRT and the wire format. A library backend supplies the
    per-modulus calls (encrypt, multiply-and-add, leave, decrypt) and its public context."""

    scheme = "bfv"
    defaults = {"poly_modulus_degree": 16384, "mask_bits": 40, "backend": "tenseal", "packing": "terms"}
    check_ranges = staticmethod(bfv_ranges)
    exact = True
    protect = True  # modulus switch, re-randomisation and flood (the attack test's control turns it off)
    garbage_masks = True  # packing=rotations: uniform masks on the slots that are not outputs (likewise)
    plain_bits: int = PLAIN_BITS
    """Bits of each plaintext modulus (a batching prime ≡ 1 mod 2N)."""
    library: str = ""
    params: dict
    plain: list[int]
    slots: int
    flooding_bits: int

    @classmethod
    def validate(cls, params: dict) -> dict:
        return super().validate({"backend": os.environ.get("SECUREVFL_BFV_BACKEND", "tenseal"), **params})

    secret: list | None = None

    def __init__(self, params: dict, timer: HETimer | None, slot_bits: int) -> None:
        super().__init__(timer)
        self.params = self.validate(params)
        self.kappa = self.params["mask_bits"]
        self.slots = self.params["poly_modulus_degree"]
        self.rotations = self.params["packing"] == "rotations"
        self.row = self.slots // 2  # packing=rotations: a rotation turns each of the two rows of slots
        self.crt_primes = self.crt_size(slot_bits)

    @classmethod
    def from_public(cls, blob: bytes, params: dict, timer: HETimer | None = None, **kw) -> CRTBFV:
        """The other party's backend from the key owner's public bytes (its library must be this one)."""
        head, parts = unpack_blobs(blob)
        if head.get("library", "tenseal") != cls.library:
            raise ValueError(f"the BFV public context was made by another library than this run's ({cls.library})")
        be = cls(params, parts, timer, **kw)  # type: ignore[call-arg, arg-type]  # each library's constructor
        if [int(t) for t in head.get("plain", [])] != be.plain or head.get("n") != be.slots:
            raise ValueError("the BFV public context does not match this run's parameters")
        return be

    def has_secret(self) -> bool:
        return self.secret is not None

    def crt_size(self, slot_bits: int) -> int:
        """CRT primes: room for the largest masked result and its sign."""
        return -(-(slot_bits + 2) // self.plain_bits)

    # ------------------------------------------------------------------ the library's part
    @abstractmethod
    def _encrypt_slots(self, i: int, vals: np.ndarray) -> bytes:
        """Slots (integers mod t_i) encrypted under the key owner's key in context i, as bytes."""

    @abstractmethod
    def _decrypt_slots(self, i: int, blob: bytes) -> np.ndarray:
        """A product ciphertext's slots in [0, t_i) (uint64)."""

    @abstractmethod
    def _load(self, i: int, blob: bytes):
        """A ciphertext of context i from its bytes."""

    @abstractmethod
    def _mul_plain(self, i: int, ct, vals: np.ndarray):
        """ct ⊙ vals (slots mod t_i, int64) in context i."""

    @abstractmethod
    def _finish(self, i: int, ct, u: np.ndarray, rng) -> bytes:
        """ct + u (slots mod t_i) made ready to leave: switched, re-randomised and flooded (``protect``),
        or u added as a plaintext (the control), as bytes."""

    def _add(self, i: int, a, b):
        raise NotImplementedError  # packing=rotations (each library's)

    def _rotate(self, i: int, ct, step: int):
        raise NotImplementedError

    def _babies(self, i: int, ct, step: int, count: int) -> list:
        """rot(ct, step·b) for b < count, each row of slots turning on its own."""
        raise NotImplementedError

    def _input(self, ex: BFVMatrix, ci: int, i: int):
        if (ci, i) not in ex.cts:
            ex.cts[ci, i] = self._load(i, ex.blobs[ci][i])
        return ex.cts[ci, i]

    def _multiply(self, ex: BFVMatrix, ci: int, i: int, mult: np.ndarray, u: np.ndarray, rng) -> bytes:
        """[[x_chunk]]·mult + u in context i, made ready to leave."""
        return self._finish(i, self._mul_plain(i, self._input(ex, ci, i), mult), u, rng)

    # ------------------------------------------------------------------ key owner
    def encrypt(self, x: np.ndarray, ops: frozenset[str]) -> Encrypted:
        assert self.has_secret()
        if self.rotations:
            return self._encrypt_rot(np.asarray(x, dtype=object), ops)
        x = np.asarray(x, dtype=object)
        m, n = x.shape
        r, t = tiles.layout(m, n, self.slots, "bfv")
        with self.timer.time("encrypt"):
            blobs = [[self._encrypt_slots(i, vec) for i in range(len(self.plain))]
                     for vec in tiles.chunk_vectors(x, r, t)]
        return BFVMatrix(blobs, x.shape, r, t)

    def _full(self, row: np.ndarray) -> np.ndarray:
        """A slot vector whose first row is ``row`` and second row zero."""
        return np.concatenate([row, np.zeros(self.slots - len(row), dtype=np.int64)])

    def _encrypt_rot(self, x: np.ndarray, ops: frozenset[str]) -> BFVRotMatrix:
        parts: dict[str, list[list[bytes]]] = {}
        with self.timer.time("encrypt"):
            for side in sorted(ops):
                e = x if side == "right" else x.T
                lay = rot.layout(e.shape[0], e.shape[1], self.row, pairs=False)
                parts[side] = [[self._encrypt_slots(i, self._full(take(e, idx, t))) for i, t in enumerate(self.plain)]
                               for idx in index_vectors(e.shape, lay)]
        return BFVRotMatrix(parts, x.shape)

    def _decrypt_rot(self, e: BFVRotProducts) -> np.ndarray:
        moduli = self.plain[:e.moduli]
        with self.timer.time("decrypt"):
            per_mod = [rot.gather(e.e_shape, e.p, [self._decrypt_slots(i, cts[i])[: self.row] for cts in e.cts],
                                  self.row, pairs=False).astype(object) for i in range(len(moduli))]
            z = crt(per_mod, moduli)
        return z if e.side == "right" else z.T

    def decrypt(self, e: Encrypted) -> np.ndarray:
        if isinstance(e, BFVRotProducts):
            assert self.has_secret()
            return self._decrypt_rot(e)
        assert isinstance(e, BFVProducts) and self.has_secret()
        m, n = e.x_shape
        r, t = e.rows, e.tiles
        p = e.shape[1] if e.side == "right" else e.shape[0]
        # the reduction in int64 on 30-bit halves of each slot (exact for < 2^33 terms an output)
        moduli = self.plain[:e.moduli]
        halves = [(np.zeros(e.shape, dtype=np.int64), np.zeros(e.shape, dtype=np.int64)) for _ in moduli]
        with self.timer.time("decrypt"):
            for ci, row in enumerate(e.cts):
                lo = ci * r
                valid = min(r, m - lo)
                for group, ks in zip(row, tiles.groups(p, t), strict=True):
                    for i, blob in enumerate(group):
                        v = self._decrypt_slots(i, blob)[: t * r * n].reshape(t, r, n)
                        for acc, part in zip(halves[i], (v & np.uint64(HALF - 1), v >> np.uint64(30)), strict=True):
                            tiles.reduce_terms(acc, part.astype(np.int64), e.side, lo, valid, ks)
            per_mod = [(lo_.astype(object) + hi_.astype(object) * HALF) % q
                       for (lo_, hi_), q in zip(halves, moduli, strict=True)]
            return crt(per_mod, moduli)

    # ------------------------------------------------------------------ the other party
    def _uniform_mod(self, rng, shape: tuple[int, ...], q: int) -> np.ndarray:
        """Uniform on [0, q) (q < 2^60, a batching prime just below a power of two): 64-bit draws cut
        to q's bits, rejection."""
        size, bits = math.prod(shape), q.bit_length()
        out = np.frombuffer(rng.bytes(8 * size), dtype="<u8") >> np.uint64(64 - bits)
        while (bad := out >= q).any():
            out = np.where(bad, np.frombuffer(rng.bytes(8 * size), dtype="<u8") >> np.uint64(64 - bits), out)
        return out.astype(np.int64).reshape(shape)

    def flood_residues(self, rng, moduli: list[int]) -> np.ndarray:
        """u_F = hi·2^FLOOD_SHIFT + lo uniform on [−2^100, 2^100) per coefficient, as its residues mod each
        q (uint64, one row per modulus), exact (the shift in steps that stay below 2^64)."""
        n = self.slots
        hi = np.frombuffer(rng.bytes(8 * n), dtype="<i8") >> np.int64(64 - FLOOD_HI - 1)
        lo = np.frombuffer(rng.bytes(8 * n), dtype="<u8") >> np.uint64(64 - FLOOD_SHIFT)
        res = []
        for q in moduli:  # q < 2^60: r < q shifted by ≤ 4 bits stays below 2^64
            qq, r, left = np.uint64(q), np.mod(hi, np.int64(q)).astype(np.uint64), FLOOD_SHIFT
            while left:
                k = min(4, left)
                r, left = (r << np.uint64(k)) % qq, left - k
            res.append((r + lo) % qq)
        return np.stack(res)

    def _moduli(self, term_bits: int, reduced: int, hide: bool, addend_bits: int | None) -> list[int]:
        """The CRT a product needs, from public bounds only (the number of ciphertexts is visible):
        |X W + addend + mask| < 3 · 2^(the largest of their bounds)."""
        if addend_bits is None:
            return self.plain
        return self.plain[:self.moduli_for(max(term_bits + bits_of(reduced), self.kappa + term_bits + bits_of(reduced)
                                               + 1 if hide else 0, addend_bits) + 2)]

    def moduli_for(self, bits: int) -> int:
        """The fewest plaintext moduli whose product P holds every integer of |v| < 2^bits in (−P/2, P/2]."""
        for k in range(1, len(self.plain) + 1):
            if math.prod(self.plain[:k]) > 1 << (bits + 1):
                return k
        raise AssertionError(f"a {bits}-bit result does not fit the CRT ({len(self.plain)} moduli)")

    def _product(self, ex: BFVMatrix, w: np.ndarray, side: str, addend: np.ndarray, term_bits: int, hide: bool,
                 rng, addend_bits: int | None) -> tuple[BFVProducts, np.ndarray]:
        m, n = ex.shape
        r, t = ex.rows, ex.tiles
        w = np.asarray(w, dtype=object)
        p = w.shape[1] if side == "right" else w.shape[0]
        out_shape = (m, p) if side == "right" else (p, n)
        reduced = n if side == "right" else m  # terms per output
        mask = (rng.ints(out_shape, self.kappa + term_bits + bits_of(reduced) + 1) if hide
                else np.zeros(out_shape, dtype=object))
        target = np.asarray(addend, dtype=object) + mask  # what each output's masks must sum to
        moduli = self._moduli(term_bits, reduced, hide, addend_bits)
        w_mod = [np.mod(w, q).astype(np.int64) for q in moduli]  # A's plaintext, reduced once per modulus
        chunks = list(range(0, m, r))
        sums = [np.zeros(out_shape, dtype=object) for _ in moduli]  # left: mask sums of earlier chunks
        out = []
        with self.timer.time("matmul"):
            for ci, lo in enumerate(chunks):
                valid = min(r, m - lo)
                row = []
                for ks in tiles.groups(p, t):
                    group = []
                    for i, q in enumerate(moduli):
                        mult = tiles.multipliers(w_mod[i], side, lo, valid, r, n, t, ks)
                        u = self._uniform_mod(rng, (t, r, n), q)  # int64 in [0, q); sums in Python integers
                        if side == "right":  # output (row, k): its terms lie in this chunk; fix the last
                            head = u[: len(ks), :valid, :-1].astype(object).sum(2).T
                            want = target[lo:lo + valid, ks.start:ks.stop] - head
                            u[: len(ks), :valid, -1] = (want % q).T.astype(np.int64)
                        elif ci < len(chunks) - 1:  # output (k, col) sums over rows of every chunk
                            sums[i][ks.start:ks.stop] += u[: len(ks), :valid].astype(object).sum(1)
                        else:
                            head = sums[i][ks.start:ks.stop] + u[: len(ks), : valid - 1].astype(object).sum(1)
                            u[: len(ks), valid - 1] = ((target[ks.start:ks.stop] - head) % q).astype(np.int64)
                        group.append(self._multiply(ex, ci, i, mult.ravel(), u.ravel(), rng))
                    row.append(group)
                out.append(row)
        return BFVProducts(out, out_shape, side, (m, n), r, t, len(moduli)), mask

    def _product_rot(self, ex: BFVRotMatrix, w: np.ndarray, side: str, addend: np.ndarray, term_bits: int,
                     hide: bool, rng, addend_bits: int | None) -> tuple[BFVRotProducts, np.ndarray]:
        """Z = E·W_m + addend + mask with E = X, W_m = W (``right``) or E = Xᵀ, W_m = Wᵀ (``left``, whose
        product W·X is Zᵀ), in ckks_rotations' diagonals with one value a slot. Each output is one slot:
        it gets the addend and (``hide``) a mask κ bits above its bound; every other slot (partial sums,
        the second row) a mask uniform mod t_i, so uniform mod P over the CRT: perfectly hidden."""
        if side not in ex.parts:
            raise ValueError(f"the matrix was not encrypted for {side} products")
        e_shape = ex.shape if side == "right" else ex.shape[::-1]
        wm = np.asarray(w, dtype=object) if side == "right" else np.asarray(w, dtype=object).T
        add = np.asarray(addend, dtype=object) if side == "right" else np.asarray(addend, dtype=object).T
        lay = rot.layout(e_shape[0], e_shape[1], self.row, pairs=False)
        plan = rot.Plan(lay, wm.shape[1])
        if plan.n_diag > MAX_PRODUCTS:  # flooding_bits bounds the noise of ≤ MAX_PRODUCTS summed products
            raise UserError(f"--he bfv packing=rotations: a {e_shape[0]}×{e_shape[1]} by {e_shape[1]}×{wm.shape[1]} "
                            f"product needs {plan.n_diag} diagonals, above the {MAX_PRODUCTS} its flood is sized for; "
                            "use packing=terms or a smaller batch")
        reduced = e_shape[1]
        mask = (rng.ints(add.shape, self.kappa + term_bits + bits_of(reduced) + 1) if hide
                else np.zeros(add.shape, dtype=object))
        target = add + mask
        moduli = self._moduli(term_bits, reduced, hide, addend_bits)
        w_idx = np.arange(1, wm.size + 1, dtype=np.float64).reshape(wm.shape).astype(complex)
        diags = [rot.diagonals(plan, w_idx, o).real.astype(np.int64) for o in range(plan.outs_per_ct)]
        outs = [rot.output_index(plan, ci, o) for ci in range(lay.n_cts) for o in range(plan.outs_per_ct)]
        g_size = min(plan.baby, plan.n_diag)
        out: list[list[bytes]] = [[] for _ in outs]
        with self.timer.time("matmul"):
            for i, q in enumerate(moduli):
                w_q = [take(wm, d, q) for d in diags]
                for ci in range(lay.n_cts):
                    if (side, ci, i) not in ex.cts:
                        ex.cts[side, ci, i] = self._load(i, ex.parts[side][ci][i])
                    babies = self._babies(i, ex.cts[side, ci, i], plan.step, g_size)
                    for o in range(plan.outs_per_ct):
                        acc = None
                        for g in reversed(range(0, plan.n_diag, g_size)):  # Horner over the giant steps
                            inner = None
                            for b, baby in enumerate(babies[: min(g_size, plan.n_diag - g)]):
                                term = self._mul_plain(i, baby, self._full(np.roll(w_q[o][g + b], g * plan.step)))
                                inner = term if inner is None else self._add(i, inner, term)
                            acc = (inner if acc is None
                                   else self._add(i, self._rotate(i, acc, g_size * plan.step), inner))
                        for step in plan.sum_steps:
                            acc = self._add(i, acc, self._rotate(i, acc, step))
                        k = ci * plan.outs_per_ct + o
                        slot, row, col = outs[k]
                        u = (self._uniform_mod(rng, (self.slots,), q) if self.garbage_masks
                             else np.zeros(self.slots, dtype=np.int64))
                        u[slot] = take(target[row, col], np.arange(1, len(slot) + 1), q)
                        out[k].append(self._finish(i, acc, u, rng))
        out_shape = add.shape if side == "right" else add.shape[::-1]
        return (BFVRotProducts(out, out_shape, side, e_shape, plan.p, len(moduli)),
                mask if side == "right" else mask.T)

    def right(self, ex, w, addend, term_bits, hide, rng, addend_bits=None):
        if isinstance(ex, BFVRotMatrix):
            return self._product_rot(ex, w, "right", addend, term_bits, hide, rng, addend_bits)
        return self._product(ex, w, "right", addend, term_bits, hide, rng, addend_bits)

    def left(self, w, ex, addend, term_bits, hide, rng, addend_bits=None):
        if isinstance(ex, BFVRotMatrix):
            return self._product_rot(ex, w, "left", addend, term_bits, hide, rng, addend_bits)
        return self._product(ex, w, "left", addend, term_bits, hide, rng, addend_bits)

    # ------------------------------------------------------------------ wire format
    def dumps(self, e: Encrypted) -> bytes:
        with self.timer.time("serialize"):
            if isinstance(e, BFVRotMatrix):
                sides = sorted(e.parts)
                return pack_blobs({"type": "rmatrix", "shape": e.shape, "sides": sides,
                                   "n": [len(e.parts[k]) for k in sides]},
                                  [b for k in sides for ct in e.parts[k] for b in ct])
            if isinstance(e, BFVRotProducts):
                return pack_blobs({"type": "rproducts", "shape": e.shape, "side": e.side, "e_shape": e.e_shape,
                                   "p": e.p, "moduli": e.moduli}, [b for ct in e.cts for b in ct])
            if isinstance(e, BFVMatrix):
                return pack_blobs({"type": "matrix", "shape": e.shape, "rows": e.rows, "tiles": e.tiles,
                                   "n": len(e.blobs)}, [b for chunk in e.blobs for b in chunk])
            assert isinstance(e, BFVProducts)
            return pack_blobs({"type": "products", "shape": e.shape, "side": e.side, "x_shape": e.x_shape,
                               "rows": e.rows, "tiles": e.tiles, "groups": [len(row) for row in e.cts],
                               "moduli": e.moduli},
                              [b for row in e.cts for group in row for b in group])

    def loads(self, buf: bytes) -> Encrypted:
        with self.timer.time("deserialize"):
            head, blobs = unpack_blobs(buf)
            k = len(self.plain)
            if head["type"] == "rmatrix":
                if len(blobs) != sum(head["n"]) * k:
                    raise ValueError("malformed BFV ciphertext message")
                parts, i = {}, 0
                for side, c in zip(head["sides"], head["n"], strict=True):
                    parts[side] = [blobs[i + j * k:i + (j + 1) * k] for j in range(c)]
                    i += c * k
                return BFVRotMatrix(parts, tuple(head["shape"]))
            if head["type"] == "rproducts":
                k = int(head["moduli"])
                if not 1 <= k <= len(self.plain) or len(blobs) % k:
                    raise ValueError("malformed BFV ciphertext message")
                return BFVRotProducts([blobs[j:j + k] for j in range(0, len(blobs), k)], tuple(head["shape"]),
                                      head["side"], tuple(head["e_shape"]), int(head["p"]), k)
            if head["type"] == "matrix":
                if len(blobs) != head["n"] * k:
                    raise ValueError("malformed BFV ciphertext message")
                return BFVMatrix([blobs[c * k:(c + 1) * k] for c in range(head["n"])], tuple(head["shape"]),
                                 head["rows"], head["tiles"])
            k = int(head["moduli"])
            if not 1 <= k <= len(self.plain) or len(blobs) != sum(head["groups"]) * k:
                raise ValueError("malformed BFV ciphertext message")
            rows, i = [], 0
            for g in head["groups"]:
                rows.append([blobs[i + j * k:i + (j + 1) * k] for j in range(g)])
                i += g * k
            return BFVProducts(rows, tuple(head["shape"]), head["side"], tuple(head["x_shape"]), head["rows"],
                               head["tiles"], k)

    def describe(self) -> dict:
        return {**self.params, "slots": self.slots, "security_bits": 128, "mult_depth": 1, "exact": True,
                "library": self.library, "plain_moduli": len(self.plain), "plain_modulus_bits": self.plain_bits,
                "noise_flooding": "whole phase, after a modulus switch and a fresh encryption of zero"
                if self.protect else False, "flooding_bits": self.flooding_bits if self.protect else 0,
                "packing": ("rotations: one value a slot, doubled rows, baby-step giant-step diagonals; one slot "
                            "per output, power-of-two Galois keys; CRT over the moduli" if self.rotations else
                            "row-major tiles, one ciphertext per row chunk and plaintext modulus; reduction after "
                            "decryption, CRT over the moduli")}


class BFVBackend(CRTBFV):
    """BFV on Microsoft SEAL (TenSEAL's ``sealapi``), the default library."""

    library = "tenseal"

    def __init__(self, params: dict, public: list[bytes] | None = None, timer: HETimer | None = None,
                 slot_bits: int = 120, **_) -> None:
        super().__init__(params, timer, slot_bits)
        n = self.slots
        self.plain = [m.value() for m in sealapi.PlainModulus.Batching(n, [PLAIN_BITS] * self.crt_primes)]
        coeff = sealapi.CoeffModulus.Create(n, list(COEFF_BITS))
        self.ctxs = []
        for t in self.plain:
            parms = sealapi.EncryptionParameters(sealapi.SCHEME_TYPE.BFV)
            parms.set_poly_modulus_degree(n)
            parms.set_coeff_modulus(coeff)
            parms.set_plain_modulus(t)
            self.ctxs.append(sealapi.SEALContext(parms, True, sealapi.SEC_LEVEL_TYPE.TC128))
        self.encoders = [sealapi.BatchEncoder(c) for c in self.ctxs]
        self.evaluators = [sealapi.Evaluator(c) for c in self.ctxs]
        self._galois_bytes: list[bytes] = []
        self.galois: list = []
        if public is None:  # key owner: one key pair per context
            with self.timer.time("keygen"):
                gens = [sealapi.KeyGenerator(c) for c in self.ctxs]
                self.secret = [g.secret_key() for g in gens]
                self.public = []
                for g in gens:
                    pk = sealapi.PublicKey()
                    g.create_public_key(pk)
                    self.public.append(pk)
                if self.rotations:  # row rotations by powers of two, published once (seeded)
                    elts = [pow(3, step, 2 * n) for step in rot.galois_steps(self.row)]
                    self._galois_bytes = [seal_dumps(g.create_galois_keys(elts)) for g in gens]
            self.sym = [sealapi.Encryptor(c, s) for c, s in zip(self.ctxs, self.secret, strict=True)]
            self.decryptors = [sealapi.Decryptor(c, s) for c, s in zip(self.ctxs, self.secret, strict=True)]
        else:
            k = len(self.ctxs)
            if len(public) != k * (2 if self.rotations else 1):
                raise ValueError("the BFV public context does not match this run's packing")
            self.public = [seal_load(sealapi.PublicKey(), c, b) for c, b in zip(self.ctxs, public[:k], strict=True)]
            if self.rotations:
                self.galois = [seal_load(sealapi.GaloisKeys(), c, b)
                               for c, b in zip(self.ctxs, public[k:], strict=True)]
        self.encryptors = [sealapi.Encryptor(c, pk) for c, pk in zip(self.ctxs, self.public, strict=True)]
        # the level products leave at, and what the switch to it divides by
        self.low = []  # per context (a parms_id hashes the plaintext modulus too)
        for c in self.ctxs:
            data = c.first_context_data()
            while len(data.parms().coeff_modulus()) > SEND_PRIMES:
                data = data.next_context_data()
            self.low.append(data.parms_id())
        self.low_q = [m.value() for m in data.parms().coeff_modulus()]
        dropped = math.prod(m.value() for m in self.ctxs[0].first_context_data().parms().coeff_modulus()[SEND_PRIMES:])
        products = MAX_PRODUCTS if self.rotations else 1
        self.flooding_bits = min(flooding_bits(n, t, dropped, products) for t in self.plain)
        delta = min(math.prod(self.low_q) // t for t in self.plain)
        if noise_bound(n, max(self.plain), dropped, products) + 2 ** (FLOOD_HI + FLOOD_SHIFT) >= delta // 2:
            raise AssertionError("BFV parameters leave no room for the flood")  # a constant above is wrong
        self._header = seal_dumps(self.public[0])[:5]  # SEAL's magic, header size and version

    def public_bytes(self) -> bytes:
        head = {"n": self.slots, "plain": [str(t) for t in self.plain], **({"galois": True} if self.rotations else {})}
        return pack_blobs(head, [seal_dumps(pk) for pk in self.public] + self._galois_bytes)

    def _encode(self, i: int, vals: np.ndarray) -> sealapi.Plaintext:
        """Slots mod t_i (integers of any size; int64 arrays already in [0, t_i) pass straight through)."""
        vals = np.asarray(vals)
        if vals.dtype != np.int64:
            vals = np.mod(vals.astype(object), self.plain[i]).astype(np.int64)
        pt = sealapi.Plaintext()
        self.encoders[i].encode(vals.tolist(), pt)
        return pt

    def _encrypt_slots(self, i: int, vals: np.ndarray) -> bytes:
        """With the secret key, saved seeded (half a ciphertext): the key owner only sends inputs."""
        assert self.secret is not None
        return seal_dumps(self.sym[i].encrypt_symmetric(self._encode(i, vals)))

    def _decrypt_slots(self, i: int, blob: bytes) -> np.ndarray:
        pt = sealapi.Plaintext()
        self.decryptors[i].decrypt(seal_loads(self.ctxs[i], blob), pt)
        return np.array(self.encoders[i].decode_uint64(pt), dtype=np.uint64)

    def _flood(self, i: int, rng) -> sealapi.Ciphertext:
        """(u_F, 0): noise only, message 0, built as a raw SEAL ciphertext at the products' level."""
        polys = np.zeros((2, len(self.low_q), self.slots), dtype="<u8")
        polys[0] = self.flood_residues(rng, self.low_q)
        return raw_ciphertext(self.ctxs[i], self.low[i], polys, ntt=False, header=self._header)

    def _finish(self, i: int, prod: sealapi.Ciphertext, u: np.ndarray, rng) -> bytes:
        """Add u; switch down, re-randomise, flood; the bytes the key owner receives."""
        if prod is None:  # a zero product (_mul_plain): a fresh encryption of u in its place
            prod = sealapi.Ciphertext(self.ctxs[i])
            self.encryptors[i].encrypt(self._encode(i, u), prod)
        else:
            self.evaluators[i].add_plain_inplace(self._coefficients(i, prod), self._encode(i, u))
        if self.protect:
            ev = self.evaluators[i]
            ev.mod_switch_to_inplace(prod, self.low[i])
            zero = sealapi.Ciphertext(self.ctxs[i])
            self.encryptors[i].encrypt_zero(self.low[i], zero)
            ev.add_inplace(prod, zero)
            ev.add_inplace(prod, self._flood(i, rng))
        return seal_dumps(prod)

    def _load(self, i: int, blob: bytes) -> sealapi.Ciphertext:
        return seal_loads(self.ctxs[i], blob)

    # packing=rotations multiplies each baby by many plaintexts: the babies go to NTT form once, so a
    # product is an NTT of the plaintext and a pointwise multiply (SEAL otherwise transforms the
    # ciphertext both ways at every multiply_plain); rotations and the way out need coefficient form.
    # Only fresh products and rotations are transformed in place, never an input or a baby.
    def _mul_plain(self, i: int, ct, vals: np.ndarray):
        if not np.any(vals):  # the product is 0, which SEAL refuses to make (a transparent ciphertext)
            return None  # _add and _rotate pass it over; _finish then encrypts u afresh
        pt = self._encode(i, vals)
        if ct.is_ntt_form():
            self.evaluators[i].transform_to_ntt_inplace(pt, ct.parms_id())
        prod = sealapi.Ciphertext(self.ctxs[i])
        self.evaluators[i].multiply_plain(ct, pt, prod)
        return prod

    def _coefficients(self, i: int, ct):
        if ct.is_ntt_form():
            self.evaluators[i].transform_from_ntt_inplace(ct)
        return ct

    def _add(self, i: int, a, b):
        if a is None or b is None:
            return b if a is None else a
        if a.is_ntt_form() != b.is_ntt_form():
            a, b = self._coefficients(i, a), self._coefficients(i, b)
        self.evaluators[i].add_inplace(a, b)
        return a

    def _rotate(self, i: int, ct, step: int):
        if ct is None:
            return None
        moved = sealapi.Ciphertext(self.ctxs[i])
        self.evaluators[i].rotate_rows(self._coefficients(i, ct), step, self.galois[i], moved)
        return moved

    def _babies(self, i: int, ct, step: int, count: int) -> list:
        babies = [ct]
        for _ in range(1, count):  # each from the last by one published power-of-two key
            babies.append(self._rotate(i, babies[-1], step))
        out = []
        for b in babies:
            d = sealapi.Ciphertext(self.ctxs[i])
            self.evaluators[i].transform_to_ntt(b, d)
            out.append(d)
        return out

    def describe(self) -> dict:
        return {**super().describe(), "coeff_mod_bit_sizes": list(COEFF_BITS), "send_primes": SEND_PRIMES}
