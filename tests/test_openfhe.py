"""The OpenFHE BFV backend (``--he bfv --he-param backend=openfhe``, the optional extra; skipped where
``import openfhe`` fails, i.e. on every Python but 3.10): what the key owner can read off a product
beyond its slots, as tests/test_he_circuit.py asks of the SEAL backend.

The whole HE suite runs on it with ``SECUREVFL_BFV_BACKEND=openfhe`` (every ``--he bfv`` run then uses
OpenFHE; docs/openfhe.md); the backend's products against numpy are in tests/test_he.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

ofhe = pytest.importorskip("openfhe")

from securevfl.crypto import openfhe_bfv, tiles  # noqa: E402  (after the skip)
from securevfl.crypto.openfhe_bfv import OpenFHEBFVBackend  # noqa: E402
from securevfl.crypto.protocol import fixed  # noqa: E402
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
