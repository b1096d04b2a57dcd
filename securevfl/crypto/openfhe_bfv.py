"""BFV on OpenFHE (``--he bfv --he-param backend=openfhe``; the optional ``openfhe`` extra): the same
protocol, layout, CRT and masks as :mod:`securevfl.crypto.bfv` (its :class:`CRTBFV`), with OpenFHE's
calls for the ciphertext work. docs/openfhe.md has the measurements behind each choice below.

**Install.** The PyPI wheel (``openfhe==1.6.1.0.22.4``) is tagged for every Python but holds one CPython
3.10 extension (glibc ≥ 2.35); on another Python ``import openfhe`` fails and ``--he-param
backend=openfhe`` is refused with one line naming the extra.

**Plaintext moduli of 50 bits.** Batching primes t ≡ 1 mod 2N below 2^50: above 50 bits this wheel
decrypts wrong without an error (measured; docs/openfhe.md §5). So a value needs one more prime than
under SEAL's 59-bit ones at large κ (3 up to κ 43, then 4). Each backend checks a known decryption in
every context when it is built.

**Levels.** Multiplicative depth 3 gives five 60-bit towers; a product is switched down to three
(``Compress``), which divides its noise (≤ N·t·(2^5 + 2t) ≈ 2^115) by ≈ 2^120 before the flood: the
flood's distance is then governed by the switch's rounding, as under SEAL.

**Circuit privacy.** As bfv.py: switch, add a fresh public-key encryption of zero (c1 becomes a ring-LWE
sample in the active party's randomness), add a flood u_F uniform on [−2^100, 2^100) per coefficient.
OpenFHE's Python API has no access to a ciphertext's polynomials and its BFV refuses its own
noise-flooding mode, so the flood is written into the serialized fresh encryption of zero: its c0
towers are raw little-endian uint64 at fixed offsets of the BINARY bytes, in evaluation (NTT) form, so
u_F goes in as its negacyclic NTT mod each tower (bit-reversed order, the tower's 2N-th root read from
the context's JSON). The offsets are found once per context from a marked twin and checked by length
at every use; a build-time self-test decrypts a flooded product exactly.
"""

from __future__ import annotations

import json
import math

import gmpy2
import numpy as np
import openfhe as ofhe  # the optional extra: the layer imports this module only when it is chosen

from securevfl.crypto import ckks_rotations as rot
from securevfl.crypto.backend import HETimer, pack_blobs
from securevfl.crypto.bfv import CRTBFV, FLOOD_HI, FLOOD_SHIFT, MAX_PRODUCTS, flooding_bits, noise_bound

PLAIN_BITS = 50  # above 50 bits this wheel decrypts wrong, silently
ROTATION_PLAIN_BITS = 48  # with 50-bit moduli a rotation decrypts wrong, silently (49 passed; one bit spare)
DEPTH = 3  # five 60-bit towers; a product leaves at SEND_TOWERS
SEND_TOWERS = 3
VERSION = "1.6.1.0.22.4"  # the wheel the byte layout was read from (the build-time self-test checks it)

ofhe.DisablePrecomputeCRTTablesAfterDeserializaton()  # 10× faster loads; decryption unaffected (measured)


def batching_primes(n: int, bits: int, k: int) -> list[int]:
    """The k largest primes below 2^bits with t ≡ 1 mod 2N (the batching primes SEAL picks too)."""
    m, out = 2 * n, list[int]()
    q = ((1 << bits) - 1) // m * m + 1
    while len(out) < k:
        if gmpy2.is_prime(q):
            out.append(q)
        q -= m
    return out


def hoisted_babies(cc, ct, step: int, count: int) -> list:
    """rot(ct, step·b) for b < count with published power-of-two keys only, hoisted: b = r + 2^j (2^j > r)
    comes from baby r, one digit decomposition (``EvalFastRotationPrecompute``) per source ciphertext."""
    babies: list = [ct] + [None] * (count - 1)
    order = cc.GetCyclotomicOrder()
    for r in range(count):
        targets = [r + (1 << j) for j in range(count.bit_length()) if (1 << j) > r and r + (1 << j) < count]
        if targets:
            digits = cc.EvalFastRotationPrecompute(babies[r])
            for b in targets:
                babies[b] = cc.EvalFastRotation(babies[r], step * (b - r), order, digits)
    return babies


def make_context(n: int, t: int):
    p = ofhe.CCParamsBFVRNS()
    p.SetSecurityLevel(ofhe.HEStd_128_classic)  # OpenFHE refuses parameters outside the standard's table
    p.SetRingDim(n)
    p.SetMultiplicativeDepth(DEPTH)
    p.SetPlaintextModulus(t)
    p.SetBatchSize(n)
    cc = ofhe.GenCryptoContext(p)
    for feature in (ofhe.PKE, ofhe.KEYSWITCH, ofhe.LEVELEDSHE):
        cc.Enable(feature)
    return cc


def towers(cc) -> list[tuple[int, int]]:
    """(q_i, ψ_i) per tower of Q, ψ_i the 2N-th root OpenFHE's NTT uses (from the context's JSON)."""
    out: list[tuple[int, int]] = []

    def walk(d: object) -> None:
        if isinstance(d, dict):
            cm, ru = d.get("cm"), d.get("ru")
            if isinstance(cm, dict) and isinstance(ru, dict) and isinstance(cm.get("v"), int) \
                    and isinstance(ru.get("v"), int):
                out.append((cm["v"], ru["v"]))
            for v in d.values():
                walk(v)
        elif isinstance(d, list):
            for v in d:
                walk(v)

    walk(json.loads(ofhe.Serialize(cc, ofhe.JSON)))
    seen, uniq = set(), []
    for q, psi in out:  # the element parameters repeat per level: keep Q's towers in order, once
        if q not in seen:
            seen.add(q)
            uniq.append((q, psi))
    return uniq


def _bitrev(n: int) -> np.ndarray:
    bits = n.bit_length() - 1
    r = np.zeros(n, dtype=np.int64)
    for b in range(bits):
        r |= ((np.arange(n) >> b) & 1) << (bits - 1 - b)
    return r


def _powers(g: int, n: int, q: int) -> np.ndarray:
    out, v = np.empty(n, dtype=np.uint64), 1
    for i in range(n):
        out[i] = v
        v = v * g % q
    return out


def mulmod(a: np.ndarray, b: np.ndarray, q: int) -> np.ndarray:
    """a·b mod q for uint64 arrays a, b < q < 2^60, exact: the quotient from an 80-bit long double,
    the product mod 2^64 (NTL's MulMod); the remainder lands within ±2q and is corrected."""
    quo = (a.astype(np.longdouble) * b.astype(np.longdouble) / np.longdouble(q)).astype(np.uint64)
    r = (a * b - quo * np.uint64(q)).astype(np.int64)
    r = np.where(r < 0, r + np.int64(q), r)
    r = np.where(r >= np.int64(q), r - np.int64(q), r)
    return r.astype(np.uint64)


class NTT:
    """OpenFHE's negacyclic NTT of one tower (ψ-twisted, bit-reversed output) in uint64 numpy."""

    def __init__(self, q: int, psi: int, n: int) -> None:
        if np.finfo(np.longdouble).nmant < 63:
            raise RuntimeError("the OpenFHE flood needs an 80-bit long double (x86-64)")
        self.q, self.pw, self.br = q, _powers(psi, n, q), _bitrev(n)
        omega, self.stages, m = psi * psi % q, [], 1
        while m < n:
            self.stages.append(_powers(pow(omega, n // (2 * m), q), m, q))
            m *= 2

    def __call__(self, a: np.ndarray) -> np.ndarray:
        qq = np.uint64(self.q)
        x = mulmod(a % qq, self.pw, self.q)[self.br]
        m = 1
        for tw in self.stages:
            x = x.reshape(-1, 2 * m)
            u, v = x[:, :m], mulmod(x[:, m:], tw, self.q)
            s = u + v
            x = np.concatenate([np.where(s >= qq, s - qq, s), np.where(u >= v, u - v, u + qq - v)], axis=1).ravel()
            m *= 2
        return x[self.br]


def c0_offsets(cc, pk, n: int, keep: int) -> tuple[int, list[int]]:
    """(length, offset of each c0 tower) of a fresh encryption's BINARY bytes at ``keep`` towers: each tower's
    values (random residues, so found once) located in the bytes through the JSON twin."""
    z = cc.Encrypt(pk, cc.MakePackedPlaintext(np.zeros(n, dtype=np.int64), 1, DEPTH + 2 - keep))
    raw = ofhe.Serialize(z, ofhe.BINARY)
    c0 = json.loads(ofhe.Serialize(z, ofhe.JSON))["value0"]["ptr_wrapper"]["data"]["v"][0]["v"]
    offsets = []
    for tower in c0:
        pat = np.array(tower["v"]["ptr_wrapper"]["data"]["v"], dtype="<u8").tobytes()
        off = raw.find(pat)
        if len(c0) != keep or off < 0 or raw.find(pat, off + 1) >= 0:
            raise RuntimeError("OpenFHE's ciphertext bytes are not laid out as this backend reads them")
        offsets.append(off)
    return len(raw), offsets


class OpenFHEBFVBackend(CRTBFV):
    """BFV on OpenFHE: one crypto context per plaintext modulus, the key owner's key pair in each."""

    library = "openfhe"
    plain_bits = PLAIN_BITS

    def __init__(self, params: dict, public: list[bytes] | None = None, timer: HETimer | None = None,
                 slot_bits: int = 120, **_) -> None:
        if self.validate(params)["packing"] == "rotations":
            self.plain_bits = ROTATION_PLAIN_BITS
        super().__init__(params, timer, slot_bits)
        n = self.slots
        self.plain = batching_primes(n, self.plain_bits, self.crt_primes)
        self._galois_bytes: list[bytes] = []
        if public is None:  # key owner
            self.ccs = [make_context(n, t) for t in self.plain]
            with self.timer.time("keygen"):
                pairs = [cc.KeyGen() for cc in self.ccs]
                if self.rotations:  # row rotations by powers of two, published once
                    for cc, kp in zip(self.ccs, pairs, strict=True):
                        cc.EvalRotateKeyGen(kp.secretKey, rot.galois_steps(self.row))
                        self._galois_bytes.append(ofhe.SerializeEvalAutomorphismKeyString(
                            ofhe.BINARY, kp.secretKey.GetKeyTag()))
            self.secret = [kp.secretKey for kp in pairs]
            self.public = [kp.publicKey for kp in pairs]
        else:
            k = 2 * len(self.plain)
            if len(public) != k + (len(self.plain) if self.rotations else 0):
                raise ValueError("the BFV public context does not match this run's packing")
            self.ccs = [ofhe.DeserializeCryptoContextString(b, ofhe.BINARY) for b in public[0:k:2]]
            self.public = [ofhe.DeserializePublicKeyString(b, ofhe.BINARY) for b in public[1:k:2]]
            for b in public[k:]:
                ofhe.DeserializeEvalAutomorphismKeyString(b, ofhe.BINARY)  # into OpenFHE's key cache
        self.towers = [towers(cc) for cc in self.ccs]
        qs = [q for q, _ in self.towers[0]]
        if len(qs) <= SEND_TOWERS:
            raise AssertionError(f"OpenFHE BFV at depth {DEPTH} has {len(qs)} towers: no room to switch down")
        self.low_q = qs[:SEND_TOWERS]
        dropped = math.prod(qs[SEND_TOWERS:])
        products = MAX_PRODUCTS if self.rotations else 1
        self.flooding_bits = min(flooding_bits(n, t, dropped, products) for t in self.plain)
        delta = min(math.prod(self.low_q) // t for t in self.plain)
        if noise_bound(n, max(self.plain), dropped, products) + 2 ** (FLOOD_HI + FLOOD_SHIFT) >= delta // 2:
            raise AssertionError("OpenFHE BFV parameters leave no room for the flood")
        self.ntts = [[NTT(q, psi, n) for q, psi in tw[:SEND_TOWERS]] for tw in self.towers]
        self.layout = [c0_offsets(cc, pk, n, SEND_TOWERS) for cc, pk in zip(self.ccs, self.public, strict=True)]
        if self.secret is not None:
            self._self_test()

    def public_bytes(self) -> bytes:
        blobs = []
        for cc, pk in zip(self.ccs, self.public, strict=True):
            blobs += [ofhe.Serialize(cc, ofhe.BINARY), ofhe.Serialize(pk, ofhe.BINARY)]
        head = {"n": self.slots, "plain": [str(t) for t in self.plain], "library": "openfhe",
                **({"galois": True} if self.rotations else {})}
        return pack_blobs(head, blobs + self._galois_bytes)

    # ------------------------------------------------------------------ library calls
    def _plaintext(self, i: int, vals: np.ndarray, level: int = 0):
        """Slots mod t_i, centred (OpenFHE's packed encoding is signed); ``level``: towers dropped."""
        t = self.plain[i]
        v = np.asarray(vals)
        v = np.mod(v.astype(object), t).astype(np.int64) if v.dtype != np.int64 else v
        return self.ccs[i].MakePackedPlaintext(np.where(v > t // 2, v - t, v).astype(np.int64), 1, level)

    def _encrypt_slots(self, i: int, vals: np.ndarray) -> bytes:
        assert self.secret is not None
        return ofhe.Serialize(self.ccs[i].Encrypt(self.secret[i], self._plaintext(i, vals)), ofhe.BINARY)

    def _decrypt_slots(self, i: int, blob: bytes) -> np.ndarray:
        assert self.secret is not None
        pt = self.ccs[i].Decrypt(self.secret[i], ofhe.DeserializeCiphertextString(blob, ofhe.BINARY))
        pt.SetLength(self.slots)
        v = np.asarray(pt.GetPackedValueArray(), dtype=np.int64)
        return np.where(v < 0, v + self.plain[i], v).astype(np.uint64)

    def _load(self, i: int, blob: bytes):
        return ofhe.DeserializeCiphertextString(blob, ofhe.BINARY)

    def _mul_plain(self, i: int, ct, vals: np.ndarray):
        return self.ccs[i].EvalMult(ct, self._plaintext(i, vals))

    def _add(self, i: int, a, b):
        self.ccs[i].EvalAddInPlace(a, b)  # a is always a fresh product or rotation (bfv.py), never an input
        return a

    def _rotate(self, i: int, ct, step: int):
        return self.ccs[i].EvalRotate(ct, step)

    def _babies(self, i: int, ct, step: int, count: int) -> list:
        return hoisted_babies(self.ccs[i], ct, step, count)

    def _flooded_encryption(self, i: int, u: np.ndarray, rng):
        """A fresh public-key encryption of the slots ``u`` at the products' level, with u_F added to its
        c0: the mask, the re-randomisation and the flood in one ciphertext."""
        cc, n = self.ccs[i], self.slots
        z = cc.Encrypt(self.public[i], self._plaintext(i, u, len(self.towers[i]) - SEND_TOWERS))
        buf = bytearray(ofhe.Serialize(z, ofhe.BINARY))
        length, offsets = self.layout[i]
        if len(buf) != length:
            raise RuntimeError("OpenFHE's ciphertext bytes changed length: the flood cannot be placed")
        flood = self.flood_residues(rng, self.low_q)
        for k, (off, ntt) in enumerate(zip(offsets, self.ntts[i], strict=True)):
            c0 = np.frombuffer(bytes(buf[off:off + 8 * n]), dtype="<u8")
            s = c0 + ntt(flood[k])
            q = np.uint64(self.low_q[k])
            buf[off:off + 8 * n] = np.where(s >= q, s - q, s).astype("<u8").tobytes()
        return ofhe.DeserializeCiphertextString(bytes(buf), ofhe.BINARY)

    def _finish(self, i: int, prod, u: np.ndarray, rng) -> bytes:
        """The product switched down, plus a fresh flooded encryption of the masks u (protect on); the
        control (protect off) adds u as a plaintext to the raw product."""
        cc = self.ccs[i]
        if self.protect:
            prod = cc.EvalAdd(cc.Compress(prod, SEND_TOWERS), self._flooded_encryption(i, u, rng))
        else:
            prod = cc.EvalAdd(prod, self._plaintext(i, u))
        return ofhe.Serialize(prod, ofhe.BINARY)

    def _self_test(self) -> None:
        """A flooded product (rotated, under ``rotations``) decrypts exactly in every context (the 50-bit cap,
        the layout, the NTT order)."""
        rng = np.random.default_rng(0)
        n = self.slots
        x, w = rng.integers(-2**20, 2**20, n), rng.integers(-2**20, 2**20, n)
        for i, t in enumerate(self.plain):
            prod = self._mul_plain(i, self._load(i, self._encrypt_slots(i, x)), w)
            want = (x.astype(object) * w) % t
            if self.rotations:  # and a row rotation (at 50 bits one decrypts wrong, silently)
                prod = self._add(i, prod, self._rotate(i, prod, 1))
                want = (want + np.roll(want.reshape(2, -1), -1, axis=1).ravel()) % t
            got = self._decrypt_slots(i, self._finish(i, prod, np.zeros(n, dtype=np.int64), _TestRng(rng)))
            if not np.array_equal(got.astype(object), want):
                raise RuntimeError(f"OpenFHE BFV self-test failed in context {i} (t = {t}): this wheel "
                                   f"(want openfhe=={VERSION}) does not decrypt a flooded product exactly")

    def describe(self) -> dict:
        return {**super().describe(), "coeff_mod_bit_sizes": [q.bit_length() for q, _ in self.towers[0]],
                "send_towers": SEND_TOWERS, "openfhe": VERSION}


class _TestRng:
    """Random bytes for the self-test's flood (not a secret: the test product is thrown away)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def bytes(self, n: int) -> bytes:
        return self.rng.bytes(n)
