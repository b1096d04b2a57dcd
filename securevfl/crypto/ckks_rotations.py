"""CKKS packing ``rotations``: the reduction happens inside the ciphertext, one slot holds one output.

The ``terms`` packing (ckks.py) puts one term X_ij·W_jk in each slot and reduces after decryption, so
a product of B·n·p terms returns B·n·p / slots ciphertexts (16 per product at B 256, d 16, h 32: 27 MB
per training step). Here a product returns ≈ 2·m·p / slots of them (1–2), at the price of rotations,
which need Galois keys that the key owner publishes once (left rotations by powers of two).

The layout (the math is pure numpy in this module; ckks.py runs it on SEAL ciphertexts):

- **Complex pairs.** E (m×n, encrypted) is packed as E_c[r, c] = E[r, 2c] + i·E[r, 2c+1] and the plaintext
  W (n×p) as W_c[c, k] = W[2c, k] − i·W[2c+1, k], so Re(E_c W_c) = E W: each slot carries two terms of a
  reduction and a product needs half the multiplications. Im(E_c W_c) = Σ (E_2c+1 W_2c − E_2c W_2c+1) is
  garbage that would leak W to the key owner: it is flooded (below).
- **Doubled rows.** Row r of E_c sits at slots r·2w + q, q < 2w, holding E_c[r, q mod w] (w = nc rounded up
  to a power of two), so a left rotation by l < w reads E_c[r, (q + l) mod w] at every q < w without
  crossing rows. The rows fill ``rows`` = min(m, slots / 2w) per ciphertext, copied ``tiles`` times.
- **Diagonals** (Halevi–Shoup, with Gazelle's hybrid forms for non-square W): Z = Σ_l rot(ct, l) ⊙ D_l.
  Tall (p' ≥ w, p' = p rounded up to a power of two): w diagonals per block of w output columns, one block
  per tile. Wide (p' < w): p' diagonals, then a rotate-and-sum over the w/p' blocks of a row.
  Baby-step giant-step: the baby rotations rot(ct, b), b < G, are shared by every output ciphertext, the
  giant steps by G are Horner steps on the partial sums, so every rotation is by a power of two.
- **Masks.** Every slot that is not an output carries a partial sum (wide) or noise; its real part gets a
  fresh uniform mask and every slot's imaginary part a fresh uniform flood, each κ bits above the public
  bound on what it hides (the terms' bound times the reduction length). Output slots get the addend and,
  with ``hide``, a fresh uniform mask κ bits above the same bound (as Paillier's outputs).

Precision: an output slot holds a whole sum, so the largest slot magnitude is the reduction length times
larger than a term's; κ is 3 bits lower than with ``terms`` (9 at the defaults,
:func:`rotations_kappa`) and each product checks that its largest slot stays within the decoding
budget (2^(scale − 12 − frac_bits)), refusing with one line otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from securevfl.crypto.backend import bits_of
from securevfl.errors import UserError

KAPPA_COST_BITS = 3  # rotations' κ below ckks_kappa: an output slot is a sum of up to 2^6 terms (cut widths ≤ 64)


def pow2(n: int) -> int:
    """The smallest power of two ≥ n (n ≥ 1)."""
    return 1 << max(0, int(n) - 1).bit_length()


def galois_steps(slots: int) -> list[int]:
    """The left rotations the key owner publishes keys for: every power of two below ``slots``."""
    return [1 << s for s in range(slots.bit_length() - 1)]


@dataclass(frozen=True)
class Layout:
    """E (m×n) in complex pairs, doubled rows of width 2w, ``rows`` per ciphertext, ``tiles`` copies.
    ``pairs`` False: one value per slot (BFV's integer slots, bfv.py's ``rotations`` packing)."""

    m: int
    n: int
    slots: int
    pairs: bool = True

    @property
    def nc(self) -> int:  # complex columns (columns, without pairs)
        return (self.n + 1) // 2 if self.pairs else self.n

    @property
    def width(self) -> int:
        return pow2(self.nc)

    @property
    def stride(self) -> int:
        return 2 * self.width

    @property
    def rows(self) -> int:
        return min(self.m, self.slots // self.stride)

    @property
    def tile_stride(self) -> int:  # a power of two, so that folding tiles is a rotation with a key
        return pow2(self.rows * self.stride)

    @property
    def tiles(self) -> int:
        return self.slots // self.tile_stride

    @property
    def n_cts(self) -> int:
        return -(-self.m // self.rows)

    def check(self, what: str) -> None:
        if self.stride > self.slots:
            raise UserError(f"--he packing=rotations: {what} has rows of {self.n} values, more than "
                            f"{self.slots} slots hold in doubled rows; raise poly_modulus_degree")


def layout(m: int, n: int, slots: int, pairs: bool = True) -> Layout:
    out = Layout(int(m), int(n), int(slots), pairs)
    out.check("a matrix")
    return out


def complex_pairs(a: np.ndarray, conj: bool = False) -> np.ndarray:
    """Columns (2c, 2c+1) of ``a`` as one complex column (``conj``: a[2c] − i·a[2c+1])."""
    a = np.asarray(a, dtype=np.float64)
    if a.shape[1] % 2:
        a = np.concatenate([a, np.zeros((a.shape[0], 1))], axis=1)
    return a[:, 0::2] + (-1j if conj else 1j) * a[:, 1::2]


def pack_input(e: np.ndarray, lay: Layout) -> list[np.ndarray]:
    """The slot vectors (complex) of E's ciphertexts."""
    ec = complex_pairs(e) if lay.pairs else np.asarray(e, dtype=complex)
    out = []
    for ci in range(lay.n_cts):
        block = np.zeros((lay.rows, lay.width), dtype=complex)
        part = ec[ci * lay.rows:(ci + 1) * lay.rows]
        block[: len(part), : lay.nc] = part
        # doubled (rotations by l < w stay in the row); tile τ starts τ columns in, so that a wide product
        # can give each tile its own share of the diagonals (Plan.step)
        cols = (np.arange(lay.stride)[None, :] + np.arange(lay.tiles)[:, None]) % lay.width
        tiled = np.zeros((lay.tiles, lay.tile_stride), dtype=complex)
        tiled[:, : lay.rows * lay.stride] = block[:, cols].transpose(1, 0, 2).reshape(lay.tiles, -1)
        vec = tiled.ravel()
        out.append(vec)
    return out


@dataclass(frozen=True)
class Plan:
    """How E (``lay``) times a plaintext W (n×p) runs: diagonals, baby-step size, outputs per input ct."""

    lay: Layout
    p: int

    @property
    def tall(self) -> bool:
        return pow2(self.p) >= self.lay.width

    @property
    def step(self) -> int:
        """Tiles per output block, which share its diagonals: tile τ (its rows τ columns in) takes the
        rotations step·u, so it reads columns step·u + τ (mod w), every residue exactly once over the
        block's tiles. Tall: the copies left over once every block has one (1 when blocks outnumber
        tiles); wide (one block): all copies, up to p'."""
        lay = self.lay
        if self.tall:
            nb2 = pow2(self.blocks)
            return min(lay.tiles // nb2, lay.width) if nb2 <= lay.tiles else 1
        return min(lay.tiles, pow2(self.p))

    @property
    def n_diag(self) -> int:
        return (self.lay.width if self.tall else pow2(self.p)) // self.step

    @property
    def blocks_per_ct(self) -> int:
        return self.lay.tiles // self.step

    def block(self, o: int, tau: int) -> int:
        """The output block tile τ of output ciphertext ``o`` computes (≥ ``blocks``: none)."""
        return o * self.blocks_per_ct + tau // self.step

    @property
    def baby(self) -> int:  # G: a power of two near √L
        return 1 << ((self.n_diag.bit_length() - 1 + 1) // 2)

    @property
    def blocks(self) -> int:  # tall: groups of w output columns
        return -(-self.p // self.lay.width) if self.tall else 1

    @property
    def outs_per_ct(self) -> int:
        return -(-self.blocks // self.blocks_per_ct)

    @property
    def sum_steps(self) -> list[int]:
        """Wide: rotate-and-sum over the w/p' blocks of a row; then over the tiles that shared a block's
        diagonals (into each block's first tile)."""
        p2, tile = pow2(self.p), self.lay.tile_stride
        folds = [tile << s for s in range(self.step.bit_length() - 1)]
        if self.tall:
            return folds
        return [p2 << s for s in range((self.lay.width // p2).bit_length() - 1)] + folds


def rotations(plan: Plan) -> set[int]:
    """Every left rotation the product makes (each must be one of :func:`galois_steps`)."""
    g = min(plan.baby, plan.n_diag)
    used = {plan.step} if g > 1 else set()
    if plan.n_diag > g:
        used.add(g * plan.step)
    return used | set(plan.sum_steps)


def diagonals(plan: Plan, wc: np.ndarray, o: int) -> np.ndarray:
    """D_u (L × slots, complex), multiplying rot(ct, step·u), for output ciphertext ``o`` of an input
    ciphertext; ``wc`` = W_c (nc×p)."""
    lay, w = plan.lay, plan.lay.width
    big = np.zeros((w, max(plan.p, 1) + w * (plan.blocks + 1)), dtype=complex)
    big[: lay.nc, : plan.p] = wc
    q, ls = np.arange(w), plan.step * np.arange(plan.n_diag)[:, None]
    tile = np.zeros((plan.n_diag, lay.tiles, lay.stride), dtype=complex)
    for tau in range(lay.tiles if plan.tall else plan.step):
        j = (q[None, :] + ls + tau) % w  # the input column tile τ's slot q reads after the rotation
        if plan.tall:
            b = plan.block(o, tau)
            if b < plan.blocks:
                tile[:, tau, :w] = big[j, b * w + q[None, :]]
        else:
            tile[:, tau, :w] = big[j, (q % pow2(plan.p))[None, :]]
    out = np.zeros((plan.n_diag, lay.tiles, lay.tile_stride), dtype=complex)
    out[:, :, : lay.rows * lay.stride] = np.broadcast_to(
        tile[:, :, None, :], (plan.n_diag, lay.tiles, lay.rows, lay.stride)).reshape(plan.n_diag, lay.tiles, -1)
    return out.reshape(plan.n_diag, lay.slots)


def output_index(plan: Plan, ci: int, o: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For output ciphertext ``o`` of input ciphertext ``ci``: its output slots and their (row, column) in Z."""
    lay, w = plan.lay, plan.lay.width
    slot, row, col = [], [], []
    r = np.arange(lay.rows)
    valid = r[ci * lay.rows + r < lay.m]
    for tau in range(0, lay.tiles, plan.step) if plan.tall else [0]:  # each block's first tile
        b = plan.block(o, tau) if plan.tall else 0
        cols = np.arange(w if plan.tall else pow2(plan.p))
        k = b * w + cols if plan.tall else cols
        keep = k < plan.p
        base = tau * lay.tile_stride + valid[:, None] * lay.stride
        slot.append((base + cols[None, keep]).ravel())
        row.append(np.repeat(ci * lay.rows + valid, keep.sum()))
        col.append(np.tile(k[keep], len(valid)))
    return np.concatenate(slot), np.concatenate(row), np.concatenate(col)


def bound_bits(term_bits: int, n: int, f: int) -> int:
    """Bits (value units) of the largest real or imaginary part a product slot carries before masks: n
    terms in the real part, (n+1)/2 pairs of two in the imaginary part (|x₂w₁ − x₁w₂| ≤ 2 terms)."""
    return term_bits - 2 * f + bits_of(2 * ((max(n, 1) + 1) // 2))


def slot_vectors(e: np.ndarray, w: np.ndarray, slots: int, pairs: bool = True) -> list[np.ndarray]:
    """What each output ciphertext of E·W holds before masks and flood, slot by slot (complex; in the order
    the product returns them): the noise-free model of the circuit, for tests and for the key owner's
    attacks on what its decryptions show."""
    lay = layout(e.shape[0], e.shape[1], slots, pairs)
    plan = Plan(lay, w.shape[1])
    wc = complex_pairs(np.asarray(w, dtype=np.float64).T, conj=True).T if pairs else np.asarray(w, dtype=complex)
    out = []
    for vec in pack_input(e, lay):
        for o in range(plan.outs_per_ct):
            d = diagonals(plan, wc, o)
            acc = sum(np.roll(vec, -plan.step * u) * d[u] for u in range(plan.n_diag))
            for s in plan.sum_steps:
                acc = acc + np.roll(acc, -s)
            out.append(acc)
    return out


def gather(e_shape: tuple[int, int], p: int, vals: list[np.ndarray], slots: int, pairs: bool = True) -> np.ndarray:
    """Z (m×p) from the output ciphertexts' slot values (in the order the product returns them)."""
    lay = layout(e_shape[0], e_shape[1], slots, pairs)
    plan = Plan(lay, p)
    z = np.zeros((lay.m, p), dtype=np.asarray(vals[0]).dtype)
    i = 0
    for ci in range(lay.n_cts):
        for o in range(plan.outs_per_ct):
            slot, row, col = output_index(plan, ci, o)
            z[row, col] = np.asarray(vals[i])[slot]
            i += 1
    return z
