"""The OpenFHE backends (``--he bfv|ckks --he-param backend=openfhe``, the optional extra; skipped where
``import openfhe`` fails, i.e. on every Python but 3.10): what the key owner can read off a product
beyond its slots, as tests/test_he_circuit.py and tests/test_he_attacks.py ask of the SEAL backends.

The whole HE suite runs on them with ``SECUREVFL_BFV_BACKEND=openfhe`` and ``SECUREVFL_CKKS_BACKEND=openfhe``
(every ``--he bfv`` / ``--he ckks`` run then uses OpenFHE; docs/openfhe.md); the backends' products against
numpy are in tests/test_he.py, the rotations packing's key-owner view in tests/test_he_rotations.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

ofhe = pytest.importorskip("openfhe")

from securevfl.crypto import openfhe_bfv, tiles  # noqa: E402  (after the skip)
from securevfl.crypto.openfhe_bfv import OpenFHEBFVBackend  # noqa: E402
from securevfl.crypto.protocol import fixed, real  # noqa: E402
from securevfl.interactive import Drbg  # noqa: E402
from tests.he_keys import key_bytes  # noqa: E402

F = 20
SLOT_BITS = 142  # the protocol's at κ 40


def c1_tower0(blob: bytes) -> np.ndarray:
    """A ciphertext's second component mod its first tower (evaluation form), read through its JSON twin."""
    ct = ofhe.DeserializeCiphertextString(blob, ofhe.BINARY)
    elements = json.loads(ofhe.Serialize(ct, ofhe.JSON))["value0"]["ptr_wrapper"]["data"]["v"]
    return np.array(elements[1]["v"][0]["v"]["ptr_wrapper"]["data"]["v"], dtype=object)


def view(protect: bool, patch=lambda: None):
    owner = OpenFHEBFVBackend({}, slot_bits=SLOT_BITS)
    patch()  # after the key owner's build-time self-test
    other = OpenFHEBFVBackend.from_public(owner.public_bytes(), owner.params, slot_bits=SLOT_BITS)
    other.protect = protect
    x = fixed(np.random.default_rng(0).uniform(-1, 1, (64, 8)), F)  # P's [[t]]
    v = Drbg().ints((8, 32), 64)  # A's share
    sent = owner.dumps(owner.encrypt(x, frozenset({"right"})))
    res, mask = other.right(other.loads(sent), v, np.zeros((64, 32), dtype=object), F + 64, True, Drbg())
    return owner, sent, owner.loads(other.dumps(res)), x, v, mask


@pytest.mark.parametrize("protect", [False, True], ids=["control", "protected"])
def test_key_owner_divides_c1_and_reads_the_multiplier_only_without_protection(protect):
    """P divides the product's c1 by its own input's c1 (evaluation form, first tower). Without the
    protection that is A's plaintext multiplier exactly (the judge: P's input times A's multiplier, as
    OpenFHE multiplies a plaintext, slot by slot in evaluation form); with it, nothing."""
    owner, sent, got, _, v, _ = view(protect)
    mine = owner.loads(sent)
    q0 = owner.towers[0][0][0]
    inv = np.array([pow(int(c), -1, q0) for c in c1_tower0(mine.blobs[0][0])], dtype=object)
    w_hat = (c1_tower0(got.cts[0][0][0]) * inv) % q0  # P's attack on the first product ciphertext
    r, t = mine.rows, mine.tiles
    mult = tiles.multipliers(np.mod(v, owner.plain[0]).astype(np.int64), "right", 0, 64, r, 8, t,
                             tiles.groups(32, t)[0])
    cc, ct_in = owner.ccs[0], ofhe.DeserializeCiphertextString(mine.blobs[0][0], ofhe.BINARY)
    judge = ofhe.Serialize(cc.EvalMult(ct_in, owner._plaintext(0, mult.ravel())), ofhe.BINARY)
    truth = (c1_tower0(judge) * inv) % q0
    hits = int((w_hat == truth).sum())
    if protect:
        assert hits / len(truth) < 1e-3
    else:
        assert hits == len(truth)  # the control: every evaluation of A's plaintext, exactly


def test_the_flood_is_in_the_ciphertext_at_its_size(monkeypatch):
    """Decryption is exact with the 2^100 flood; the same flood scaled by 2^32 (past Δ/2 ≈ 2^129 at three
    towers) breaks it, so the flood really sits in the phase the key owner decrypts (the key owner's
    build-time self-test refuses such a flood too)."""
    owner, _, got, x, v, mask = view(True)
    assert np.array_equal(owner.decrypt(got), x.astype(object).dot(v) + mask)
    real_flood = OpenFHEBFVBackend.flood_residues

    def scaled(self, rng, moduli):
        res = real_flood(self, rng, moduli)
        return np.stack([(res[k].astype(object) << 32) % q for k, q in enumerate(moduli)]).astype(np.uint64)

    owner, _, got, x, v, mask = view(True, lambda: monkeypatch.setattr(OpenFHEBFVBackend, "flood_residues", scaled))
    assert not np.array_equal(owner.decrypt(got), x.astype(object).dot(v) + mask)


def test_public_context_carries_no_secret_and_names_its_library():
    owner = OpenFHEBFVBackend({}, slot_bits=SLOT_BITS)
    public = owner.public_bytes()
    for sk in owner.secret:
        assert key_bytes(owner, sk) not in public
    assert not OpenFHEBFVBackend.from_public(public, owner.params, slot_bits=SLOT_BITS).has_secret()
    from securevfl.crypto.bfv import BFVBackend

    with pytest.raises(ValueError, match="another library"):
        OpenFHEBFVBackend.from_public(BFVBackend({}, slot_bits=SLOT_BITS).public_bytes(), owner.params,
                                      slot_bits=SLOT_BITS)
    assert owner.describe()["library"] == "openfhe" and owner.flooding_bits >= 60
    assert openfhe_bfv.PLAIN_BITS == 50 and max(owner.plain) < 2 ** 50  # above 50 bits the wheel decrypts wrong


# ------------------------------------------------------------------------------------------ CKKS
@pytest.fixture(scope="module")
def ckks():
    from securevfl.crypto.openfhe_ckks import OpenFHECKKSBackend

    owner = OpenFHECKKSBackend({})
    return owner, OpenFHECKKSBackend.from_public(owner.public_bytes(), owner.params)


def ckks_product(ckks, seed: int = 0):
    """P's [[t]] (64×8) times A's share V (8×32), masked: what P sent and what it gets back."""
    owner, other = ckks
    x = fixed(np.random.default_rng(seed).uniform(-1, 1, (64, 8)), F)
    v = Drbg().ints((8, 32), owner.kappa + 4 + F)
    enc = owner.encrypt(x, frozenset({"right"}))
    res, _ = other.right(other.loads(owner.dumps(enc)), v, np.zeros((64, 32), dtype=object), F + owner.kappa + 4 + F,
                         True, Drbg())
    return enc, owner.loads(other.dumps(res)), v


def test_ckks_decodes_within_its_budget(ckks):
    """κ's premise (module openfhe_ckks): a product slot of 2^(scale − 13 − f) decodes to 2^-(f+1); the
    control, 2^4 times larger, does not (the check can fail)."""
    owner, _ = ckks
    top = owner.scale_bits - owner.margin_bits - owner.f
    rng = np.random.default_rng(1)
    x, w = rng.uniform(-1, 1, owner.slots), rng.uniform(-16, 16, owner.slots)

    def err(bits: int) -> float:
        big = rng.uniform(-1, 1, owner.slots) * 2.0 ** bits
        ct = owner._add_plain(owner._rescale(owner._mul_plain(owner.cc.Encrypt(owner.public, owner._pt(x)), w)), big)
        return float(np.abs(owner._decrypt_blobs([owner._ct_bytes(ct)], 0)[0] - (x * w + big)).max())

    assert owner.kappa == 11 and err(top) < 2.0 ** -(owner.f + 1)
    assert err(top + 4) > 2.0 ** -(owner.f + 1)


def test_ckks_key_owner_division_attack_fails_after_the_rescale(ckks):
    """P divides c1 of a product by c1 of its own input (first tower, evaluation form), undoing the
    rescale's division by the dropped tower: before the rescale that gives A's plaintext multiplier
    exactly (the control), after it nothing (as tests/test_he_circuit.py on SEAL)."""
    owner, _ = ckks
    enc, got, v = ckks_product(ckks)
    qs = [q for q, _ in openfhe_bfv.towers(owner.cc)][:owner.depth + 1]
    q0, dropped = qs[0], qs[-1]
    blob_in = owner._ct_bytes(enc.cts[0])
    inv = np.array([pow(int(c), -1, q0) for c in c1_tower0(blob_in)], dtype=object)
    mult = tiles.multipliers(real(v, F), "right", 0, 64, enc.rows, 8, enc.tiles, tiles.groups(32, enc.tiles)[0])
    full = np.zeros(owner.slots)
    full[: mult.size] = mult.ravel()
    judge = owner._ct_bytes(owner._mul_plain(enc.cts[0], full))  # the control: the product before the rescale
    truth = (c1_tower0(judge) * inv) % q0
    w_hat = (c1_tower0(got.cts[0][0]) * dropped * inv) % q0
    assert int((w_hat == truth).sum()) == 0
    centred = [np.where(a > q0 // 2, a - q0, a).astype(float) for a in (w_hat, truth)]
    assert np.corrcoef(*centred)[0, 1] ** 2 < 1e-2


def test_ckks_imaginary_flood_at_its_width_and_fresh(ckks, monkeypatch):
    """Every product slot's imaginary part (where P's encryption error times A's multiplier would show) is
    uniform on ±2^(2κ + weight_bits), fresh per product; the control without the flood shows none."""
    from securevfl.crypto.ckks import CKKSBase, flood_width_bits

    owner, _ = ckks
    width = 2.0 ** flood_width_bits(owner.kappa, owner.weight_bits)
    im = [owner.slots_complex([ckks_product(ckks, seed)[1].cts[0][0]])[0].imag for seed in (0, 1)]
    assert all(abs(x.std() / (width / np.sqrt(3)) - 1) < 0.05 for x in im), [x.std() for x in im]
    assert np.corrcoef(*im)[0, 1] ** 2 < 1e-2
    monkeypatch.setattr(CKKSBase, "flood", False)
    assert owner.slots_complex([ckks_product(ckks)[1].cts[0][0]])[0].imag.std() < width * 1e-6
