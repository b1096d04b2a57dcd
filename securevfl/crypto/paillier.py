"""Paillier backends (``phe`` keys and decryption, ``gmpy2`` arithmetic).

Packed (default). The protocol hands over fixed-point *integers* (:mod:`securevfl.crypto.protocol`);
Paillier computes on them exactly, so nothing is rounded and decryption carries no noise. Several
values share one plaintext in slots of ``slot_bits`` w (set by the protocol from its public bounds:
room for the largest masked result, its ``mask_bits`` κ ≥ 40 of statistical hiding and a sign
offset). Paillier multiplies a whole plaintext by one scalar, so a matrix is packed along the axis
the product keeps: columns of X for ``X @ W``, rows for ``W @ X``. The packing is linear over the
integers (Σ_s v_s 2^{ws}), so inputs of any sign and size combine exactly; only a *result* must lie
in its slot, which the active party ensures by adding 2^{w-1} to every slot with its addend.

Encryption uses the Damgård–Jurik–Nielsen short-exponent obfuscator: the public key carries
h = r0^n mod n² and each encryption multiplies by h^α for a fresh 256-bit α, computed from a
precomputed fixed-base table (4-bit comb, 64 modular multiplications instead of a 3072-bit
exponentiation). Obfuscators are never reused: two ciphertexts with the same r^n reveal the
difference of their plaintexts. Security of this variant rests on DCR plus the short-exponent
assumption (as in DJN 2010 and libraries that implement it). The active party re-randomises every
result with the same public table before it leaves, so the key owner cannot relate a result
ciphertext to its own inputs.

Key length: ``key_bits`` default 3072 (128-bit security, NIST SP 800-57); 2048 is accepted
(112-bit) for tests and comparisons; shorter keys are refused.

Cores: with :func:`securevfl.crypto.backend.he_threads` k > 1 the independent ciphertext operations
(each product ciphertext's Π ct^coeff, each decryption) run on a pool of k worker processes (the GIL
holds gmpy2's arithmetic); the key owner's workers get its private key, the other party's only n and h.

Naive (``packing: false``): the textbook baseline the benchmark compares against, one
``phe.EncryptedNumber`` per value, standard ``encrypt`` (a fresh r^n each), phe's own arithmetic.
"""

from __future__ import annotations

import os
import secrets
import weakref
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import gmpy2
import numpy as np
from phe import paillier

from securevfl.crypto.backend import Encrypted, HEBackend, HETimer, bits_of, he_threads, pack_blobs, unpack_blobs
from securevfl.errors import UserError
from securevfl.procs import spawn_pool, watch_parent

DEFAULTS: dict[str, object] = {"key_bits": 3072, "packing": True, "mask_bits": 40}
SECURITY = {2048: 112, 3072: 128, 4096: 152, 7680: 192}
ALPHA_BITS = 256


KEY_SIZES = (2048, 3072, 4096)
"""The key lengths a party generates: key generation time grows steeply and unboundedly with the size
(a 2049-bit key took minutes, 10^9 bits crashed the process), so only these standard sizes are
made; a key size arrives from the other party's run description, so the check is the key owner's."""


def paillier_ranges(p: dict) -> dict:
    """A standard key size of at least 112-bit security (:data:`KEY_SIZES`) and 40..128 mask bits
    (``p`` typed by the shared check)."""
    if p["key_bits"] < 2048:
        raise UserError(f"--he paillier: key_bits {p['key_bits']} is insecure; use ≥ 2048 (112-bit) or the "
                        "default 3072 (128-bit)")
    if p["key_bits"] not in KEY_SIZES:
        raise UserError(f"--he paillier: key_bits {p['key_bits']} is not a standard size; use one of "
                        f"{', '.join(map(str, KEY_SIZES))} (key generation for other sizes is unbounded)")
    if not 40 <= p["mask_bits"] <= 128:
        raise UserError(f"--he paillier: mask_bits must be in 40..128 (statistical hiding), got {p['mask_bits']}")
    return p


def security_bits(key_bits: int) -> int:
    return max((s for k, s in SECURITY.items() if key_bits >= k), default=0)


class _Obfuscators:
    """Fresh n-th residues h^α (α of 256 bits) from a 4-bit fixed-base comb table."""

    def __init__(self, h: int, nn: int) -> None:
        self.nn = gmpy2.mpz(nn)
        self.table = []
        base = gmpy2.mpz(h)
        for _ in range(ALPHA_BITS // 4):
            row = [gmpy2.mpz(1)]
            for _ in range(15):
                row.append(row[-1] * base % self.nn)
            self.table.append(row)
            base = row[-1] * base % self.nn
        self.nibbles = ALPHA_BITS // 4

    def draw(self) -> gmpy2.mpz:
        a = secrets.randbits(ALPHA_BITS)
        acc = gmpy2.mpz(1)
        nn, table = self.nn, self.table
        for i in range(self.nibbles):
            v = (a >> (4 * i)) & 15
            if v:
                acc = acc * table[i][v] % nn
        return acc


def pack(values, w: int) -> int:
    acc = 0
    for s, v in enumerate(values):
        acc += int(v) << (w * s)
    return acc


def combine(cts: list, coeffs, addend_slots, n: gmpy2.mpz, nn: gmpy2.mpz, w: int, obf: _Obfuscators) -> gmpy2.mpz:
    """Π ct_i^{coeff_i} · Enc(addend + offset), re-randomised with a fresh obfuscator."""
    pos, neg = gmpy2.mpz(1), gmpy2.mpz(1)
    for ct, k in zip(cts, coeffs, strict=True):
        k = int(k)
        if k > 0:
            pos = pos * gmpy2.powmod(ct, k, nn) % nn
        elif k < 0:
            neg = neg * gmpy2.powmod(ct, -k, nn) % nn
    if neg != 1:
        pos = pos * gmpy2.invert(neg, nn) % nn
    off = 1 << (w - 1)
    m = pack((int(v) + off for v in addend_slots), w) % n
    return pos * ((1 + m * n) % nn) % nn * obf.draw() % nn


# ---------------------------------------------------------------------------- worker processes
_WORKER: dict = {}


def _init_worker(n: int, h: int, w: int, pq: tuple[int, int] | None, parent: int) -> None:
    watch_parent(parent)  # it holds p and q: it must not outlive the key holder (kill -9 included)
    nn = gmpy2.mpz(n) * n
    _WORKER.update(n=gmpy2.mpz(n), nn=nn, w=w, obf=_Obfuscators(h, int(nn)))
    if pq is not None:
        pk = paillier.PaillierPublicKey(n)
        _WORKER["sk"] = paillier.PaillierPrivateKey(pk, *pq)


def _combine_task(args: tuple) -> gmpy2.mpz:
    cts, coeffs, addend = args
    return combine(cts, coeffs, addend, _WORKER["n"], _WORKER["nn"], _WORKER["w"], _WORKER["obf"])


def _decrypt_task(ct: int) -> int:
    return _WORKER["sk"].raw_decrypt(ct)


@dataclass
class PackedMatrix(Encrypted):
    shape: tuple[int, int]
    cols: list | None  # cols[j][c]: X[c·S:(c+1)·S, j]   (for X @ W)
    rows: list | None  # rows[i][c]: X[i, c·S:(c+1)·S]   (for W @ X)


@dataclass
class PackedResult(Encrypted):
    shape: tuple[int, int]
    side: str
    cts: list  # right: cts[k][c] = Y[c·S:.., k]; left: cts[k][c] = Y[k, c·S:..]


class PaillierBackend(HEBackend):
    scheme = "paillier"
    defaults = DEFAULTS
    check_ranges = staticmethod(paillier_ranges)
    exact = True
    _pool: ProcessPoolExecutor  # the worker processes and their count, set by _map on first use
    _pool_k: int

    def __init__(self, params: dict, public: tuple[int, int] | None = None, timer: HETimer | None = None,
                 slot_bits: int = 160, **_) -> None:
        super().__init__(timer)
        self.params = self.validate(params)
        self.kappa = self.params["mask_bits"]
        self.private_key: paillier.PaillierPrivateKey | None = None
        if public is None:  # key owner
            with self.timer.time("keygen"):
                pk, sk = paillier.generate_paillier_keypair(n_length=self.params["key_bits"])
                n = pk.n
                r0 = secrets.randbelow(n - 2) + 2
                h = int(gmpy2.powmod(r0, n, n * n))
            self.private_key = sk
        else:
            n, h = public
            pk = paillier.PaillierPublicKey(n)
        self.public_key, self.n, self.nn, self.h = pk, gmpy2.mpz(n), gmpy2.mpz(n) * n, h
        self.w = slot_bits
        self.slots = (int(self.n).bit_length() - 2) // self.w
        if self.slots < 1:
            raise UserError("--he paillier: the key is too short for one slot; raise key_bits")
        with self.timer.time("precompute"):
            self.obf = _Obfuscators(h, int(self.nn))
        self.nbytes = (int(self.nn).bit_length() + 7) // 8

    @classmethod
    def from_public(cls, blob: bytes, params: dict, timer: HETimer | None = None, **kw) -> PaillierBackend:
        head, _ = unpack_blobs(blob)
        return cls(params, (int(head["n"], 16), int(head["h"], 16)), timer, **kw)

    def has_secret(self) -> bool:
        return self.private_key is not None

    def public_bytes(self) -> bytes:
        return pack_blobs({"n": format(int(self.n), "x"), "h": format(self.h, "x")}, [])

    # ------------------------------------------------------------------ encoding
    def _pack(self, values) -> int:
        return pack(values, self.w)

    def _map(self, op: str, tasks: list) -> list:
        """``op`` (combine | decrypt) over independent tasks: here, or on k worker processes (he_threads())."""
        k = he_threads()
        if k <= 1 or len(tasks) < 2 * k:
            local = self._combine_task if op == "combine" else self._decrypt_task
            return [local(t) for t in tasks]
        if getattr(self, "_pool", None) is None or self._pool_k != k:
            pq = (self.private_key.p, self.private_key.q) if self.private_key is not None else None
            self._pool = spawn_pool(k, initializer=_init_worker,
                                    initargs=(int(self.n), self.h, self.w, pq, os.getpid()))
            self._pool_k = k
            weakref.finalize(self, self._pool.shutdown, wait=False, cancel_futures=True)
        worker = _combine_task if op == "combine" else _decrypt_task
        return list(self._pool.map(worker, tasks, chunksize=max(1, len(tasks) // (4 * k))))

    def _combine_task(self, args: tuple[list, np.ndarray, np.ndarray]) -> gmpy2.mpz:
        return combine(*args, self.n, self.nn, self.w, self.obf)

    def _decrypt_task(self, ct: int) -> int:
        assert self.private_key is not None  # only the key owner decrypts
        return self.private_key.raw_decrypt(ct)

    def _enc_int(self, m: int) -> gmpy2.mpz:
        return (1 + (m % self.n) * self.n) % self.nn * self.obf.draw() % self.nn

    def encrypt(self, x: np.ndarray, ops: frozenset[str]) -> PackedMatrix:
        with self.timer.time("encrypt"):
            q, S = np.asarray(x, dtype=object), self.slots
            cols = rows = None
            if "right" in ops:
                cols = [[self._enc_int(self._pack(q[c:c + S, j])) for c in range(0, q.shape[0], S)]
                        for j in range(q.shape[1])]
            if "left" in ops:
                rows = [[self._enc_int(self._pack(q[i, c:c + S])) for c in range(0, q.shape[1], S)]
                        for i in range(q.shape[0])]
        return PackedMatrix(q.shape, cols, rows)

    def _mask(self, shape: tuple[int, int], addend: np.ndarray, term_bits: int, terms: int, hide: bool,
              rng) -> tuple[np.ndarray, np.ndarray]:
        out_bits = term_bits + bits_of(terms) + 1
        mask = rng.ints(shape, self.kappa + out_bits + 1) if hide else np.zeros(shape, dtype=object)
        total = np.asarray(addend, dtype=object) + mask
        if max(abs(int(v)) for v in total.ravel()) + (1 << out_bits) >= 1 << (self.w - 1):
            raise UserError(f"--he paillier: a product sums {terms} terms, more than its slots were sized for "
                            "(batch size, cut width and head width must stay ≤ 4096)")
        return total, mask

    def right(self, ex, w, addend, term_bits, hide, rng, addend_bits=None):
        m, n = ex.shape
        S, p, w = self.slots, w.shape[1], np.asarray(w, dtype=object)
        add, mask = self._mask((m, p), addend, term_bits, n, hide, rng)
        chunks = list(enumerate(range(0, m, S)))
        with self.timer.time("matmul"):
            flat = self._map("combine", [([ex.cols[j][ci] for j in range(n)], w[:, k], add[c:c + S, k])
                                         for k in range(p) for ci, c in chunks])
        cts = [flat[k * len(chunks):(k + 1) * len(chunks)] for k in range(p)]
        return PackedResult((m, p), "right", cts), mask

    def left(self, w, ex, addend, term_bits, hide, rng, addend_bits=None):
        m, n = ex.shape
        S, p, w = self.slots, w.shape[0], np.asarray(w, dtype=object)
        add, mask = self._mask((p, n), addend, term_bits, m, hide, rng)
        chunks = list(enumerate(range(0, n, S)))
        with self.timer.time("matmul"):
            flat = self._map("combine", [([ex.rows[i][ci] for i in range(m)], w[k, :], add[k, c:c + S])
                                         for k in range(p) for ci, c in chunks])
        cts = [flat[k * len(chunks):(k + 1) * len(chunks)] for k in range(p)]
        return PackedResult((p, n), "left", cts), mask

    def decrypt(self, e: Encrypted) -> np.ndarray:
        assert isinstance(e, PackedResult)  # the key owner decrypts products, never its own inputs
        y = np.zeros(e.shape, dtype=object)
        S, w, off = self.slots, self.w, 1 << (self.w - 1)
        full = (1 << w) - 1
        with self.timer.time("decrypt"):
            raws = iter(self._map("decrypt", [int(ct) for row in e.cts for ct in row]))
            for k, row in enumerate(e.cts):
                for ci in range(len(row)):
                    raw = next(raws)
                    lo = ci * S
                    cnt = min(S, (e.shape[0] if e.side == "right" else e.shape[1]) - lo)
                    vals = [((raw >> (w * s)) & full) - off for s in range(cnt)]
                    if e.side == "right":
                        y[lo:lo + cnt, k] = vals
                    else:
                        y[k, lo:lo + cnt] = vals
        return y

    # ------------------------------------------------------------------ wire format
    def _ints(self, cts: list[list]) -> tuple[list[int], list[bytes]]:
        return [len(r) for r in cts], [int(c).to_bytes(self.nbytes, "little") for r in cts for c in r]

    def _split(self, counts: list[int], blobs: list[bytes]) -> list[list]:
        out, i = [], 0
        for k in counts:
            out.append([gmpy2.mpz(int.from_bytes(b, "little")) for b in blobs[i:i + k]])
            i += k
        return out

    def dumps(self, e: Encrypted) -> bytes:
        with self.timer.time("serialize"):
            if isinstance(e, PackedMatrix):
                cc, cb = self._ints(e.cols or [])
                rc, rb = self._ints(e.rows or [])
                return pack_blobs({"type": "matrix", "shape": e.shape, "cols": cc if e.cols else None,
                                   "rows": rc if e.rows else None}, cb + rb)
            assert isinstance(e, PackedResult)  # the only other Encrypted this backend makes
            counts, blobs = self._ints(e.cts)
            return pack_blobs({"type": "result", "shape": e.shape, "side": e.side, "counts": counts}, blobs)

    def loads(self, buf: bytes) -> Encrypted:
        with self.timer.time("deserialize"):
            head, blobs = unpack_blobs(buf)
            if head["type"] == "result":
                return PackedResult(tuple(head["shape"]), head["side"], self._split(head["counts"], blobs))
            nc = sum(head["cols"] or [])
            cols = self._split(head["cols"], blobs[:nc]) if head["cols"] is not None else None
            rows = self._split(head["rows"], blobs[nc:]) if head["rows"] is not None else None
            return PackedMatrix(tuple(head["shape"]), cols, rows)

    def describe(self) -> dict:
        return {"key_bits": self.params["key_bits"], "security_bits": security_bits(self.params["key_bits"]),
                "mask_bits": self.kappa, "slot_bits": self.w, "slots": self.slots, "exact": True,
                "packing": "fixed-point slots per plaintext (columns for X@W, rows for W@X)",
                "obfuscators": f"DJN h^alpha, {ALPHA_BITS}-bit alpha, 4-bit fixed-base comb, fresh per ciphertext"}


@dataclass
class NaiveMatrix(Encrypted):
    shape: tuple[int, ...]
    values: np.ndarray  # object array of phe.EncryptedNumber


class NaivePaillierBackend(HEBackend):
    """One ``phe.EncryptedNumber`` per value; the per-value baseline of the benchmark."""

    scheme = "paillier"
    defaults = DEFAULTS
    check_ranges = staticmethod(paillier_ranges)
    exact = True

    def __init__(self, params: dict, public: int | None = None, timer: HETimer | None = None, **_) -> None:
        super().__init__(timer)
        self.params = self.validate(params)
        self.kappa = self.params["mask_bits"]
        self.private_key: paillier.PaillierPrivateKey | None = None
        if public is None:
            with self.timer.time("keygen"):
                self.public_key, self.private_key = paillier.generate_paillier_keypair(
                    n_length=self.params["key_bits"])
        else:
            self.public_key = paillier.PaillierPublicKey(public)
        self.nbytes = (self.public_key.nsquare.bit_length() + 7) // 8

    @classmethod
    def from_public(cls, blob: bytes, params: dict, timer: HETimer | None = None, **kw) -> NaivePaillierBackend:
        head, _ = unpack_blobs(blob)
        return cls(params, int(head["n"], 16), timer)

    def has_secret(self) -> bool:
        return self.private_key is not None

    def public_bytes(self) -> bytes:
        return pack_blobs({"n": format(self.public_key.n, "x")}, [])

    def encrypt(self, x: np.ndarray, ops: frozenset[str]) -> NaiveMatrix:
        with self.timer.time("encrypt"):
            enc = np.array([self.public_key.encrypt(int(v)) for v in np.asarray(x, dtype=object).ravel()], dtype=object)
        return NaiveMatrix(x.shape, enc.reshape(x.shape))

    def _add(self, y: np.ndarray, addend, term_bits: int, terms: int, hide: bool, rng) -> tuple[np.ndarray, np.ndarray]:
        mask = (rng.ints(y.shape, self.kappa + term_bits + bits_of(terms) + 2) if hide
                else np.zeros(y.shape, dtype=object))
        return y + (np.asarray(addend, dtype=object) + mask), mask

    def right(self, ex, w, addend, term_bits, hide, rng, addend_bits=None):
        with self.timer.time("matmul"):
            y, mask = self._add(np.dot(ex.values, np.asarray(w, dtype=object)), addend, term_bits, ex.shape[1], hide,
                                rng)
        return NaiveMatrix(y.shape, y), mask

    def left(self, w, ex, addend, term_bits, hide, rng, addend_bits=None):
        with self.timer.time("matmul"):
            y, mask = self._add(np.dot(np.asarray(w, dtype=object), ex.values), addend, term_bits, ex.shape[0], hide,
                                rng)
        return NaiveMatrix(y.shape, y), mask

    def decrypt(self, e: Encrypted) -> np.ndarray:
        assert isinstance(e, NaiveMatrix) and self.private_key is not None  # this backend's own, at the key owner
        with self.timer.time("decrypt"):
            vals = [int(self.private_key.decrypt(v)) for v in e.values.ravel()]
            return np.array(vals + [0], dtype=object)[:-1].reshape(e.shape)

    def dumps(self, e: Encrypted) -> bytes:
        assert isinstance(e, NaiveMatrix)  # the only Encrypted this backend makes
        with self.timer.time("serialize"):  # ciphertext(be_secure=True): phe re-randomises results here
            vals = e.values.ravel()
            return pack_blobs({"shape": list(e.shape), "exponents": [int(v.exponent) for v in vals]},
                              [v.ciphertext().to_bytes(self.nbytes, "little") for v in vals])

    def loads(self, buf: bytes) -> NaiveMatrix:
        with self.timer.time("deserialize"):
            head, blobs = unpack_blobs(buf)
            vals = [paillier.EncryptedNumber(self.public_key, int.from_bytes(b, "little"), x)
                    for b, x in zip(blobs, head["exponents"], strict=True)]
            return NaiveMatrix(tuple(head["shape"]), np.array(vals, dtype=object).reshape(head["shape"]))

    def describe(self) -> dict:
        return {"key_bits": self.params["key_bits"], "security_bits": security_bits(self.params["key_bits"]),
                "mask_bits": self.kappa, "exact": True,
                "packing": "none (one phe.EncryptedNumber per value, standard encrypt)"}
