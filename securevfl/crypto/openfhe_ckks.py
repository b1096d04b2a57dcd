"""CKKS on OpenFHE (``--he ckks --he-param backend=openfhe``; the optional ``openfhe`` extra): the same
protocol, layouts, masks and flood as :mod:`securevfl.crypto.ckks` (its :class:`CKKSBase`), with OpenFHE's
calls for the ciphertext work, and the baby steps of ``packing=rotations`` hoisted.

**Parameters.** Ring dimension N = ``poly_modulus_degree``; a first tower of 60 bits and
``len(coeff_mod_bit_sizes) − 2`` (at least 2) towers at the scale; the scale is ``global_scale_bits``
capped at 59 bits, the largest this wheel's 64-bit towers allow (``describe()`` reports the scale it
ran at). Depth 2 at the defaults: after a product's rescale 119 bits remain, 60 above the scale (at
depth 1 a slot above 1 wraps without an error, measured). Complex slots (``COMPLEX`` data type), or the
imaginary flood would be dropped on encoding. OpenFHE checks the HomomorphicEncryption.org 128-bit table
itself, including its key-switching modulus.

**Precision, so κ.** OpenFHE's decoder at scale 2^59 loses 2 bits more than SEAL's at 2^60: a terms
slot of magnitude 2^26 decodes with max error 2^-21.9 here against 2^-22.1 for SEAL at 2^28 (N 16384,
x·w + a complex plaintext of magnitude 2^M, max over 8192 slots; the backend checks it when it is built,
and ``tests/test_openfhe.py::test_ckks_decodes_within_its_budget`` with a control). So the decoding budget is
2^(scale − 13 − f) (:attr:`margin_bits` 13) and κ = ⌊(59 − 13 − 20 − 4)/2⌋ = 11 for ``terms``, 8 for
``rotations`` (SEAL: 12 and 9).

**Hoisted rotations.** The key owner publishes keys for the left rotations by powers of two (as on
SEAL). A product's baby steps rot(ct, step·b), b < G, are computed from one digit decomposition per
source ciphertext (``EvalFastRotationPrecompute`` + ``EvalFastRotation``): every b that is a power of two
from the input itself, and b = r + 2^j (2^j > r) from baby r, so each rotation uses a published key.
The giant steps (Horner) and the rotate-and-sums rotate a different ciphertext each time and are not
hoisted.

**Threads.** OpenFHE's OpenMP loops take ``OMP_NUM_THREADS`` when the library is imported; the
project's ``--he-threads`` cannot change them afterwards.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import openfhe as ofhe  # the optional extra: the layer imports this module only when it is chosen

from securevfl.crypto import ckks_rotations as rot
from securevfl.crypto.backend import HETimer, pack_blobs, unpack_blobs
from securevfl.crypto.ckks import CKKSBase, CKKSMatrix
from securevfl.crypto.openfhe_bfv import VERSION, hoisted_babies, towers

FIRST_MOD_BITS = 60
MAX_SCALE_BITS = 59  # OpenFHE's scaling towers on this (64-bit) wheel
MARGIN_BITS = 13  # bits the decoder loses below the scale (module docstring: measured against SEAL's 12)


def make_context(n: int, scale_bits: int, depth: int):
    p = ofhe.CCParamsCKKSRNS()
    p.SetSecurityLevel(ofhe.HEStd_128_classic)
    p.SetRingDim(n)
    p.SetMultiplicativeDepth(depth)
    p.SetScalingModSize(scale_bits)
    p.SetFirstModSize(FIRST_MOD_BITS)
    p.SetScalingTechnique(ofhe.FIXEDMANUAL)
    p.SetBatchSize(n // 2)
    p.SetCKKSDataType(ofhe.COMPLEX)  # REAL would drop the imaginary flood on encoding, silently
    cc = ofhe.GenCryptoContext(p)
    for feature in (ofhe.PKE, ofhe.KEYSWITCH, ofhe.LEVELEDSHE):
        cc.Enable(feature)
    return cc


class OpenFHECKKSBackend(CKKSBase):
    """CKKS on OpenFHE: the key owner's key pair (and power-of-two rotation keys for ``rotations``)."""

    library = "openfhe"
    margin_bits = MARGIN_BITS
    max_scale_bits = MAX_SCALE_BITS

    def __init__(self, params: dict, public: list[bytes] | None = None, timer: HETimer | None = None,
                 frac_bits: int = 20, weight_bits: int = 4, **_) -> None:
        super().__init__(params, timer, frac_bits, weight_bits)
        self.depth = max(2, len(self.params["coeff_mod_bit_sizes"]) - 2)
        self.secret = None
        if public is None:  # key owner
            with self.timer.time("keygen"):
                self.cc = make_context(self.params["poly_modulus_degree"], self.scale_bits, self.depth)
                pair = self.cc.KeyGen()
                self.secret, self.public = pair.secretKey, pair.publicKey
                if self.rotations:
                    self.cc.EvalRotateKeyGen(self.secret, rot.galois_steps(self.slots))
            self._self_test()
        else:
            self.cc = ofhe.DeserializeCryptoContextString(public[0], ofhe.BINARY)
            self.public = ofhe.DeserializePublicKeyString(public[1], ofhe.BINARY)
            if self.rotations:
                ofhe.DeserializeEvalAutomorphismKeyString(public[2], ofhe.BINARY)  # into OpenFHE's key cache

    @classmethod
    def from_public(cls, blob: bytes, params: dict, timer: HETimer | None = None, **kw) -> OpenFHECKKSBackend:
        head, parts = unpack_blobs(blob)
        if head.get("library") != cls.library:
            raise ValueError(f"the CKKS public context was made by another library than this run's ({cls.library})")
        be = cls(params, parts, timer, **kw)
        if bool(head.get("galois")) != be.rotations or len(parts) != 2 + be.rotations:
            raise ValueError("the CKKS public context does not match this run's packing")
        return be

    def has_secret(self) -> bool:
        return self.secret is not None

    def public_bytes(self) -> bytes:
        blobs = [ofhe.Serialize(self.cc, ofhe.BINARY), ofhe.Serialize(self.public, ofhe.BINARY)]
        if self.rotations:
            assert self.secret is not None  # only the key owner publishes
            blobs.append(ofhe.SerializeEvalAutomorphismKeyString(ofhe.BINARY, self.secret.GetKeyTag()))
        return pack_blobs({"library": self.library, "galois": self.rotations}, blobs)

    # ------------------------------------------------------------------ encoding
    def _pt(self, vec: np.ndarray, level: int = 0):
        """A complex plaintext at the scale, for a ciphertext ``level`` rescales down."""
        return self.cc.MakeCKKSPackedPlaintext(np.asarray(vec, dtype=np.complex128), 1, level)

    def _encrypt_chunks(self, vecs: Iterable[np.ndarray]) -> list:
        return [self.cc.Encrypt(self.public, self._pt(v)) for v in vecs]

    def _encrypt_packed(self, vec: np.ndarray) -> bytes:
        assert self.secret is not None
        return ofhe.Serialize(self.cc.Encrypt(self.secret, self._pt(vec)), ofhe.BINARY)

    def _terms_products(self, ex: CKKSMatrix, ci: int, mult: np.ndarray, noise: np.ndarray) -> list:
        cc, ct = self.cc, ex.cts[ci]
        out = []
        for mv, row in zip(mult, noise, strict=True):
            prod = cc.Rescale(cc.EvalMult(ct, self._pt(mv)))
            out.append(cc.EvalAdd(prod, self._pt(row, prod.GetLevel())))
        return out

    # ------------------------------------------------------------------ rotations
    def _load_packed(self, blob: bytes):
        return ofhe.DeserializeCiphertextString(blob, ofhe.BINARY)

    def _babies(self, ct, step: int, count: int) -> list:
        return hoisted_babies(self.cc, ct, step, count)

    def _mul_plain(self, ct, vec: np.ndarray):
        return self.cc.EvalMult(ct, self._pt(vec, ct.GetLevel()))

    def _add(self, a, b):
        return self.cc.EvalAdd(a, b)

    def _rotate(self, ct, step: int):
        return self.cc.EvalRotate(ct, step)

    def _rescale(self, ct):
        return self.cc.Rescale(ct)

    def _add_plain(self, ct, vec: np.ndarray):
        return self.cc.EvalAdd(ct, self._pt(vec, ct.GetLevel()))

    # ------------------------------------------------------------------ decryption and bytes
    def slots_complex(self, blobs: list[bytes]) -> list[np.ndarray]:
        assert self.secret is not None
        out = []
        for b in blobs:
            pt = self.cc.Decrypt(self.secret, ofhe.DeserializeCiphertextString(b, ofhe.BINARY))
            pt.SetLength(self.slots)
            out.append(np.asarray(pt.GetCKKSPackedValueArray(), dtype=np.complex128))
        return out

    def _decrypt_blobs(self, blobs: list[bytes], scale: float) -> np.ndarray:
        return np.stack([v.real for v in self.slots_complex(blobs)])

    def _ct_bytes(self, ct) -> bytes:
        return ofhe.Serialize(ct, ofhe.BINARY)

    def _input_blobs(self, ex: CKKSMatrix) -> list[bytes]:
        return [self._ct_bytes(ct) for ct in ex.cts]

    def _inputs_from(self, blobs: list[bytes], shape: tuple[int, int], rows: int, t: int) -> CKKSMatrix:
        return CKKSMatrix([self._load_packed(b) for b in blobs], shape, rows, t)

    def _self_test(self) -> None:
        """A product at the protocol's largest slot magnitude decodes within the budget κ assumes."""
        rng = np.random.default_rng(0)
        n, top = self.slots, self.scale_bits - self.margin_bits - self.f
        x, w = rng.uniform(-1, 1, n), rng.uniform(-2.0 ** self.weight_bits, 2.0 ** self.weight_bits, n)
        big = rng.uniform(-1, 1, n) * 2.0 ** top
        ct = self.cc.Encrypt(self.public, self._pt(x))
        got = self._decrypt_blobs([self._ct_bytes(self._add_plain(self._rescale(self._mul_plain(ct, w)), big))], 0)
        err = float(np.abs(got[0] - (x * w + big)).max())
        if not err < 2.0 ** -(self.f + 1):
            raise RuntimeError(f"OpenFHE CKKS self-test: a slot of 2^{top} decodes with error 2^{np.log2(err):.1f}, "
                               f"above the 2^-{self.f + 1} κ {self.kappa} assumes (want openfhe=={VERSION})")

    def describe(self) -> dict:
        return {**super().describe(), "coeff_mod_bit_sizes": [q.bit_length() for q, _ in towers(self.cc)],
                "openfhe": VERSION}
