"""``packing=rotations`` (securevfl/crypto/ckks_rotations.py; CKKS, and BFV with one value a slot): the
layout computes E·W, and what the key owner decrypts shows it nothing beyond the outputs — its best
linear reconstruction of the active party's plaintext from every other slot (imaginary parts, partial
sums) fails, and succeeds in the control with the flood and the slot masks switched off."""

from __future__ import annotations

import numpy as np
import pytest

from securevfl.crypto import ckks_rotations as rot
from securevfl.crypto.ckks import CKKSBackend, CKKSBase
from securevfl.crypto.protocol import fixed
from securevfl.interactive import Drbg

F = 20


@pytest.mark.parametrize("m,n,p", [(256, 16, 32), (16, 256, 32), (16, 32, 256), (300, 16, 10), (10, 300, 16),
                                   (7, 3, 5), (33, 5, 100), (256, 17, 31), (5000, 4, 8),
                                   (4, 64, 4), (2, 512, 8), (3, 100, 3), (16, 256, 1),
                                   (30, 64, 10), (100, 7, 3)])
def test_layout_computes_the_product(m, n, p):
    """Tall and wide diagonals, odd widths (complex pairs with a zero partner), several ciphertexts."""
    rng = np.random.default_rng(m * n + p)
    e, w = rng.normal(size=(m, n)), rng.normal(size=(n, p))
    z = rot.gather((m, n), p, rot.slot_vectors(e, w, 8192), 8192)
    assert np.abs(z.real - e @ w).max() < 1e-10
    if n <= 256:  # one value a slot (BFV's layout): rows twice as wide
        z = rot.gather((m, n), p, rot.slot_vectors(e, w, 8192, pairs=False), 8192, pairs=False)
        assert np.abs(z.real - e @ w).max() < 1e-10
        assert rot.rotations(rot.Plan(rot.layout(m, n, 8192, False), p)) <= set(rot.galois_steps(8192))
    # every rotation the product makes has a published key (a power of two)
    assert rot.rotations(rot.Plan(rot.layout(m, n, 8192), p)) <= set(rot.galois_steps(8192))


def backend_class(library: str) -> type[CKKSBase]:
    if library == "openfhe":
        pytest.importorskip("openfhe")  # the optional extra (CPython 3.10)
        from securevfl.crypto.openfhe_ckks import OpenFHECKKSBackend

        return OpenFHECKKSBackend
    return CKKSBackend


@pytest.fixture(scope="module", params=["tenseal", "openfhe"])
def pair(request):
    cls = backend_class(request.param)
    owner = cls({"packing": "rotations"})
    return owner, cls.from_public(owner.public_bytes(), owner.params)


def decoded(owner: CKKSBase, buf: bytes) -> list[np.ndarray]:
    """The key owner's view of a product: every slot of every ciphertext, complex, with its secret key."""
    from securevfl.crypto.backend import unpack_blobs

    return owner.slots_complex(unpack_blobs(buf)[1])


def reconstruct(e: np.ndarray, shape: tuple[int, int], seen: list[np.ndarray], outputs: np.ndarray) -> np.ndarray:
    """The key owner's best linear estimate of the plaintext W (``shape``) from every slot but the real parts
    of the outputs: it knows E and the circuit (slot = a linear function of W, ckks_rotations.slot_vectors)."""
    basis = []
    for idx in range(shape[0] * shape[1]):
        unit = np.zeros(shape)
        unit.flat[idx] = 1.0
        basis.append(np.concatenate(rot.slot_vectors(e, unit, 8192)))
    design = np.stack(basis, axis=1)
    y = np.concatenate(seen)
    rows = np.concatenate([np.flatnonzero(~outputs), np.arange(len(y)) + len(y)])  # Re(non-outputs), all Im
    a = np.concatenate([design.real, design.imag])[rows]
    b = np.concatenate([y.real, y.imag])[rows]
    return np.linalg.lstsq(a, b, rcond=None)[0].reshape(shape)


def r2(est: np.ndarray, truth: np.ndarray) -> float:
    return float(1 - ((est - truth) ** 2).sum() / ((truth - truth.mean()) ** 2).sum())


@pytest.mark.parametrize("product", ["g_Rt", "gT_t"])
@pytest.mark.parametrize("protected", [True, False], ids=["masked", "control"])
def test_key_owner_reads_nothing_but_the_outputs(pair, product, protected, monkeypatch):
    """``g_Rt``: [[g Rᵀ + g Vᵀ]] (tall; P holds R, not V): the imaginary parts are Σ (R₂g₁ − R₁g₂), linear in
    the gradient g with coefficients P knows. ``gT_t``: [[gᵀt + M]] (wide: partial sums of gᵀt in the slots
    beside each output). Without the flood and the slot masks P recovers g exactly (R² ≈ 1); with them,
    R² ≤ 0.05."""
    owner, other = pair
    monkeypatch.setattr(CKKSBase, "flood", protected)
    monkeypatch.setattr(CKKSBase, "garbage_masks", protected)
    rng = np.random.default_rng(7)
    b_rows, d, h = 32, 4, 4  # shapes where those slots determine g (full rank): the control can succeed
    g = rng.uniform(-1, 1, (b_rows, h))
    if product == "g_Rt":
        r = rng.uniform(-2 ** 10, 2 ** 10, (d, h))  # P's share, κ bits above |W|
        v = rng.uniform(-2 ** 10, 2 ** 10, (d, h))  # A's share: unknown to P
        ex = other.loads(owner.dumps(owner.encrypt(fixed(r.T, F), frozenset({"left"}))))
        res, _ = other.left(fixed(g, F), ex, fixed(g @ v.T, 2 * F), F + 14 + F, False, Drbg())
        e, w, p_out = r, g.T, b_rows  # Z = E·W_m with E = R (d×h), W_m = gᵀ
    else:
        t = rng.uniform(-1, 1, (b_rows, d))
        ex = other.loads(owner.dumps(owner.encrypt(fixed(t, F), frozenset({"left"}))))
        m_mask = rng.uniform(-2 ** 20, 2 ** 20, (h, d))  # M: carries A's fresh U_b
        res, _ = other.left(fixed(g.T, F), ex, fixed(m_mask, 2 * F), 2 * F, False, Drbg())
        e, w, p_out = t.T, g, h  # E = tᵀ (d×B), W_m = g
    buf = other.dumps(res)
    seen = decoded(owner, buf)
    lay = rot.layout(*e.shape, 8192)
    plan = rot.Plan(lay, p_out)
    outputs = np.zeros(8192 * len(seen), dtype=bool)
    for i, (ci, o) in enumerate((ci, o) for ci in range(lay.n_cts) for o in range(plan.outs_per_ct)):
        outputs[i * 8192 + rot.output_index(plan, ci, o)[0]] = True
    est = reconstruct(e, w.shape, seen, outputs)
    # R² of the estimate, and its squared correlation with g (the best any rescaling of it could do;
    # chance ≈ 1/128 here, 0.1 is 3.6 standard deviations above it)
    score, corr2 = r2(est, w), float(np.corrcoef(est.ravel(), w.ravel())[0, 1] ** 2)
    if protected:
        assert score <= 0.05 and corr2 <= 0.1, (score, corr2)
    else:
        assert score >= 0.99 and corr2 >= 0.99, (score, corr2)


def test_public_context_carries_galois_keys_and_no_secret(pair):
    import tenseal as ts

    from securevfl.crypto.backend import unpack_blobs

    owner, other = pair
    if owner.library == "openfhe":
        from tests.he_keys import key_bytes

        head, (_, _, keys) = unpack_blobs(owner.public_bytes())
        assert head == {"library": "openfhe", "galois": True} and len(keys) > 1e6
        assert key_bytes(owner, owner.secret) not in owner.public_bytes() and not other.has_secret()
        return
    head, (ctx, keys) = unpack_blobs(owner.public_bytes())
    assert head == {"galois": True} and len(keys) > 1e6
    assert not ts.context_from(ctx).is_private() and not other.has_secret() and other.galois is not None


def test_a_product_beyond_the_decoding_budget_is_refused(pair):
    from securevfl.errors import UserError

    owner, other = pair
    ex = other.loads(owner.dumps(owner.encrypt(fixed(np.zeros((4, 256)), F), frozenset({"right"}))))
    with pytest.raises(UserError, match="packing=rotations"):  # 256 terms of a share-sized product
        other.right(ex, fixed(np.zeros((256, 4)), F), np.zeros((4, 4), dtype=object), 2 * F + 13, True, Drbg())


def test_default_digits_run_under_rotations(capsys):
    """The CLI's defaults (cut width 64, a last batch of 30 rows: tiles that are not a power of two long)."""
    import json

    from securevfl.cli import main

    assert main(["train", "--dataset", "digits", "--method", "splitnn", "--he", "ckks", "--he-param",
                 "packing=rotations", "--epochs", "1", "--json"]) == 0
    he = json.loads(capsys.readouterr().out)["cost"]["he"]
    assert he["hiding_bits"] == 9 and he["params"]["packing"].startswith("rotations")
    assert he["bytes"] < 70e6  # ≈ 21 MB of Galois keys once, then ≈ 3.4 MB a step (terms: ≈ 225 MB in all)


# ------------------------------------------------------------------------------------------ BFV
@pytest.fixture(scope="module", params=["tenseal", "openfhe"])
def bfv_pair(request):
    if request.param == "openfhe":
        pytest.importorskip("openfhe")
        from securevfl.crypto.openfhe_bfv import OpenFHEBFVBackend as cls
    else:
        from securevfl.crypto.bfv import BFVBackend as cls
    owner = cls({"packing": "rotations"}, slot_bits=142)
    return owner, cls.from_public(owner.public_bytes(), owner.params, slot_bits=142)


@pytest.mark.parametrize("protected", [True, False], ids=["masked", "control"])
def test_bfv_key_owner_reads_nothing_but_the_outputs(bfv_pair, protected, monkeypatch):
    """[[gᵀt + M]] under BFV (wide: partial sums of gᵀt beside each output). P decrypts every slot of the
    first plaintext modulus, centred, and solves for g by least squares from the slots that are not
    outputs (it knows t and the circuit): without the slot masks it recovers g exactly (the control);
    with them those slots are uniform mod t and R² ≤ 0.05."""
    from securevfl.crypto.backend import unpack_blobs
    from securevfl.crypto.bfv import CRTBFV

    owner, other = bfv_pair
    monkeypatch.setattr(CRTBFV, "garbage_masks", protected)
    rng = np.random.default_rng(7)
    b_rows, d, h = 32, 4, 4  # small integers: the partial sums stay far below t/2, so the control is exact
    t, g = rng.integers(-100, 100, (b_rows, d)), rng.integers(-100, 100, (b_rows, h))
    ex = other.loads(owner.dumps(owner.encrypt(t.astype(object), frozenset({"left"}))))
    res, _ = other.left(g.T.astype(object), ex, np.zeros((h, d), dtype=object), 20, False, Drbg(), addend_bits=20)
    _, blobs = unpack_blobs(other.dumps(res))
    q, row = owner.plain[0], owner.row
    seen = []
    for blob in blobs[:: res.moduli]:  # the first modulus of each output ciphertext
        v = owner._decrypt_slots(0, blob)[:row].astype(np.int64)
        seen.append(np.where(v > q // 2, v - q, v).astype(np.float64))
    e = t.T.astype(np.float64)  # E = tᵀ, W_m = g
    lay = rot.layout(d, b_rows, row, pairs=False)
    plan = rot.Plan(lay, h)
    outputs = np.zeros(row * len(seen), dtype=bool)
    for i, (ci, o) in enumerate((ci, o) for ci in range(lay.n_cts) for o in range(plan.outs_per_ct)):
        outputs[i * row + rot.output_index(plan, ci, o)[0]] = True
    basis = []
    for idx in range(g.size):
        unit = np.zeros(g.shape)
        unit.flat[idx] = 1.0
        basis.append(np.concatenate(rot.slot_vectors(e, unit, row, pairs=False)).real)
    design, y = np.stack(basis, axis=1)[~outputs], np.concatenate(seen)[~outputs]
    est = np.linalg.lstsq(design, y, rcond=None)[0].reshape(g.shape)
    score = r2(est, g.astype(np.float64))
    if protected:
        assert score <= 0.05, score
    else:
        assert np.array_equal(np.rint(est), g), score


def test_bfv_product_beyond_its_flood_bound_is_refused(bfv_pair):
    """``flooding_bits`` counts ≤ 256 summed products a slot: a product with more diagonals is refused."""
    from securevfl.errors import UserError

    owner, other = bfv_pair
    ex = other.loads(owner.dumps(owner.encrypt(np.zeros((1, 2048), dtype=object), frozenset({"right"}))))
    with pytest.raises(UserError, match="512 diagonals, above the 256"):
        other.right(ex, np.ones((2048, 1000), dtype=object), np.zeros((1, 1000), dtype=object), 40, False, Drbg(),
                    addend_bits=20)


def test_bfv_zero_plaintext_products_are_exact(bfv_pair):
    """A plaintext whose diagonals (or terms) are all zero (SEAL refuses to make the zero product): the
    product is the addend, exactly."""
    owner, other = bfv_pair
    x = np.arange(12, dtype=object).reshape(3, 4)
    add = np.arange(6, dtype=object).reshape(3, 2) - 3
    ex = other.loads(owner.dumps(owner.encrypt(x, frozenset({"right"}))))
    res, mask = other.right(ex, np.zeros((4, 2), dtype=object), add, 40, False, Drbg(), addend_bits=20)
    assert np.array_equal(owner.decrypt(owner.loads(other.dumps(res))), add)
