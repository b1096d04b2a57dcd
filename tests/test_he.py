"""HE-protected cut layer (SPEC §5): backends, the three invariants on recorded transcripts, HE-on
vs HE-off equivalence, cost reporting and user errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tenseal as ts

from securevfl.channel import MessageKind
from securevfl.channel.codec import decode_tensor
from securevfl.cli import main
from securevfl.config import RunConfig
from securevfl.crypto.backend import unpack_blobs
from securevfl.crypto.ckks import CKKSBackend
from securevfl.crypto.paillier import NaivePaillierBackend, PaillierBackend
from securevfl.crypto.protocol import HEActiveEnd, HEPassiveEnd
from securevfl.data import dataset_status
from securevfl.lab.compose import execute
from securevfl.run import run_training

HAVE_FMNIST = dict((n, ok) for n, ok, _ in dataset_status())["fashion-mnist"]
FAST = {"ckks": {}, "paillier": {"key_bits": 2048}}


def small_cfg(he: str = "off", **kw) -> RunConfig:
    cfg = RunConfig(dataset="digits", method="splitnn", seed=0, he=he, he_params=dict(FAST.get(he, {})))
    cfg.train.epochs, cfg.train.batch_size = 1, 64
    cfg.optim.optimizer, cfg.optim.lr = "sgd", 0.05
    cfg.model.cut_dim = 8
    if he == "paillier":  # Paillier is slow: fewer rows
        cfg.partition.n_labeled = 192
    for k, v in kw.items():
        obj, _, attr = k.rpartition("__")
        setattr(getattr(cfg, obj) if obj else cfg, attr, v)
    return cfg


def noise_fn(seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    return lambda shape: rng.uniform(-scale, scale, size=shape)


# ---------------------------------------------------------------------------------------- backends
@pytest.mark.parametrize("make", [
    lambda: CKKSBackend({}),
    lambda: PaillierBackend({"key_bits": 2048}),
    lambda: NaivePaillierBackend({"key_bits": 2048}),
], ids=["ckks", "paillier", "paillier-naive"])
def test_backend_products_match_numpy(make):
    owner = make()
    other = type(owner).from_public(owner.public_bytes(), owner.params)
    assert owner.has_secret() and not other.has_secret()
    rng = np.random.default_rng(1)
    naive = isinstance(owner, NaivePaillierBackend)
    m, n, p = (6, 3, 4) if naive else (300, 16, 10)  # 300·16 > 4096 slots: several CKKS chunks
    x, w_r, w_l = rng.normal(size=(m, n)), rng.normal(size=(n, p)), rng.normal(size=(p, m))
    ex = other.loads(owner.dumps(owner.encrypt(x, frozenset({"right", "left"}))))
    for res, mask, want in [(*other.right(ex, w_r, noise_fn()), x @ w_r), (*other.left(w_l, ex, noise_fn(2)), w_l @ x)]:
        got = owner.decrypt(owner.loads(other.dumps(res)))
        assert got.shape == want.shape
        assert np.abs(got - mask - want).max() < 1e-4
        assert np.abs(mask).max() <= 1.0  # one mask draw per output, not a sum over terms
        assert np.abs(got - want).mean() > 0.2  # what the key owner decrypts is blinded


# ------------------------------------------------------------------------------------- invariants
class Spy:
    """Records each party's plaintext secrets during training, to compare with what others saw."""

    def __init__(self, monkeypatch):
        self.z, self.r, self.g, self.G, self.W = [], [], [], [], []
        spy = self
        orig_fwd, orig_bwd = HEPassiveEnd.send_forward, HEActiveEnd.send_backward

        def send_forward(end, z, ctx):
            orig_fwd(end, z, ctx)
            spy.z.append(end._z.copy())
            spy.r.append(end.R.copy())

        def send_backward(end, grad, ctx):
            g = grad.double().numpy()
            spy.g.append(g)
            spy.G.append(spy.z[-1].T @ g)
            orig_bwd(end, grad, ctx)

        monkeypatch.setattr(HEPassiveEnd, "send_forward", send_forward)
        monkeypatch.setattr(HEActiveEnd, "send_backward", send_backward)


def far(a: np.ndarray, secrets: list[np.ndarray]) -> bool:
    """``a`` is not (close to) any recorded secret of the same shape."""
    return all(a.shape != s.shape or not np.allclose(a, s, atol=1e-3) for s in secrets)


@pytest.mark.parametrize("he", ["ckks", "paillier"])
def test_invariants_on_transcript(he, monkeypatch):
    spy = Spy(monkeypatch)
    cfg = small_cfg(he, record=True)
    out = run_training(cfg, progress=False)
    fed, ch = out.federation, out.federation.channel
    p, a = fed.passives[0], fed.active
    assert ch.pending() == 0 and len(spy.g) == out.result["cost"]["train_steps"] >= 3
    w_p = [a_end.V + p.cut_end.R for a_end in a.cut_ends.values()]

    # 1a. the active party: no activation/gradient traffic in plaintext; only ciphertexts and blinded sums
    to_a = ch.received_by(a.name)
    kinds = {m.kind for m in to_a}
    assert MessageKind.ACTIVATION not in kinds and MessageKind.HE_CIPHERTEXT in kinds
    assert kinds <= {MessageKind.HE_CONTEXT, MessageKind.HE_CIPHERTEXT, MessageKind.HE_MASKED, MessageKind.PSI}
    secrets_p = spy.z + spy.r + [r.T for r in spy.r] + [z @ r for z, r in zip(spy.z, spy.r, strict=False)] + w_p
    for m in to_a:
        if m.kind == MessageKind.HE_MASKED:
            assert far(decode_tensor(m.payload).numpy(), secrets_p)
        for z in spy.z:  # no plaintext activation bytes inside any message
            assert z.astype("<f8").tobytes()[:64] not in m.payload
            assert z.astype("<f4").tobytes()[:32] not in m.payload
    # ... and what it holds: a public context, V (≠ W_P after training), no R, no z
    a_end = next(iter(a.cut_ends.values()))
    assert not a_end.backend.has_secret()
    held = [v for v in vars(a_end).values() if isinstance(v, np.ndarray)]
    assert held and all(far(v, secrets_p) for v in held)

    # 1b. the passive party: decrypting everything it received gives only blinded values
    be = p.cut_end.backend
    to_p = ch.received_by(p.name)
    assert {m.kind for m in to_p} <= {MessageKind.CONTROL, MessageKind.BATCH_IDS, MessageKind.PSI,
                                      MessageKind.HE_CIPHERTEXT, MessageKind.HE_MASKED}
    secrets_a = spy.g + spy.G + [G.T for G in spy.G]
    decrypted = [be.decrypt(be.loads(m.payload)) for m in to_p if m.kind == MessageKind.HE_CIPHERTEXT]
    assert len(decrypted) == 3 * len(spy.g) + 1  # per step: zV+E, G+M, gRᵀ+N; plus the test batch
    plain = [decode_tensor(m.payload).numpy() for m in to_p if m.kind == MessageKind.HE_MASKED]
    for v in decrypted + plain:
        assert far(v, secrets_a) and far(v.T, secrets_a)
    g_masked = decrypted[1].T  # step 0: G + M
    assert np.abs(g_masked - spy.G[0]).mean() > 10 * np.abs(spy.G[0]).mean()
    labels = a.data.labels(a.data.label_ids)
    for m in to_p:  # labels never travel
        if m.kind != MessageKind.HE_CIPHERTEXT:
            assert labels.astype("<i8").tobytes()[:64] not in m.payload
    held_p = [v for v in vars(p.cut_end).values() if isinstance(v, np.ndarray)]
    assert all(far(v, spy.g + spy.G) for v in held_p)

    # 2. the serialized context / public key that left the key owner has no secret key
    ctx_msgs = [m for m in to_a if m.kind == MessageKind.HE_CONTEXT]
    assert len(ctx_msgs) == 1
    if he == "ckks":
        ctx = ts.context_from(ctx_msgs[0].payload)
        assert not ctx.is_private() and not ctx.has_secret_key()
    else:
        head, blobs = unpack_blobs(ctx_msgs[0].payload)
        assert set(head) == {"n", "h"} and not blobs
        sk = be.private_key
        for prime in (sk.p, sk.q):
            assert format(prime, "x") not in ctx_msgs[0].payload.decode()


# ------------------------------------------------------------------------------------ equivalence
def losses_and_utility(cfg: RunConfig) -> tuple[np.ndarray, float, dict]:
    out = run_training(cfg, progress=False)
    return np.array(out.method.trainer.losses), out.result["utility"]["test"], out.result


@pytest.mark.parametrize("he,kw", [
    ("ckks", {"train__epochs": 2}),
    ("ckks", {"model__head_hidden": (32,), "model__cut_dim": 16}),  # the benchmark's h = 32, d = 16
    ("ckks", {"partition__n_parties": 3}),  # column offsets of two passive parties
    ("paillier", {"partition__n_labeled": 320, "train__batch_size": 32, "optim__lr": 0.1}),  # slow: fewer rows
], ids=["ckks", "ckks-h32", "ckks-3parties", "paillier"])
def test_he_matches_plaintext_same_seed(he, kw):
    off, u_off, _ = losses_and_utility(small_cfg("off", **kw))
    on, u_on, res = losses_and_utility(small_cfg(he, **kw))
    assert len(on) == len(off) >= 3
    assert np.max(np.abs(on - off) / np.abs(off)) < 1e-3
    assert abs(u_on - u_off) <= 0.005
    assert off[-3:].mean() < off[:3].mean()  # it trained
    he_cost = res["cost"]["he"]
    assert he_cost["scheme"] == he and he_cost["bytes"] > 0 and he_cost["seconds"] > 0


def test_he_lr_search_restores_shares():
    kw = {"train__lr_grid": [0.02, 0.08]}
    off, u_off, r_off = losses_and_utility(small_cfg("off", **kw))
    on, u_on, r_on = losses_and_utility(small_cfg("ckks", **kw))
    assert r_on["method_info"]["lr_search"]["chosen"] == r_off["method_info"]["lr_search"]["chosen"]
    assert np.max(np.abs(on - off) / np.abs(off)) < 1e-3 and abs(u_on - u_off) <= 0.005


def test_adam_runs_with_momentum_sgd_on_shares():
    cfg = small_cfg("ckks", optim__optimizer="adam", optim__lr=1e-3)
    losses, _, res = losses_and_utility(cfg)
    assert np.isfinite(losses).all() and "momentum SGD" in res["cost"]["he"]["protocol"]


@pytest.mark.parametrize("defense", ["iso:5", "dp:clip=0.1,noise=0.5"])
def test_defenses_act_on_the_gradient_under_he(defense):
    base = np.array(run_training(small_cfg("ckks"), progress=False).method.trainer.losses)
    out = execute(small_cfg("ckks", defense=defense), progress=False)
    losses = np.array(out.method.trainer.losses)
    assert losses.shape == base.shape and not np.allclose(losses[1:], base[1:], rtol=1e-4)
    if defense.startswith("dp"):
        assert out.result["privacy"]["epsilon"] is not None


@pytest.mark.parametrize("method,params", [
    ("fedlocal-simsiam", {"ssl_epochs": 1}),
    ("vflhlp", {"pretrain_epochs": 1, "ssl_epochs": 1}),  # re-initialises the head's passive columns
    ("fedhssl", {"ssl_epochs": 1}),
])
def test_other_activation_methods_run_under_he(method, params):
    kw = {"method": method, "method_params": params, "partition__aligned_fraction": 0.5}
    off, u_off, _ = losses_and_utility(small_cfg("off", **kw))
    on, u_on, _ = losses_and_utility(small_cfg("ckks", **kw))
    assert np.max(np.abs(on - off) / np.abs(off)) < 1e-3 and abs(u_on - u_off) <= 0.005


# ------------------------------------------------------------------------------------ CLI and cost
def test_cli_json_cost_carries_he(capsys):
    code = main(["train", "--dataset", "digits", "--epochs", "1", "--cut-dim", "8", "--he", "ckks",
                 "--he-param", "poly_modulus_degree=8192", "--json"])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    he = json.loads(cap.out)["cost"]["he"]
    assert he["scheme"] == "ckks" and he["params"]["poly_modulus_degree"] == 8192
    assert he["params"]["security_bits"] == 128 and he["seconds"] > 0
    assert he["seconds"] >= sum(he["seconds_by_op"].values()) - 1e-3 and "encrypt" in he["seconds_by_op"]
    assert he["bytes"] == sum(he["bytes_by_kind"].values()) > 0 and "he_context" in he["bytes_by_kind"]
    assert "does not protect labels" in he["threat_model"] or "not labels" in he["threat_model"]


@pytest.mark.parametrize("args,needle", [
    (["--he", "foo"], "available: ckks, off, paillier"),
    (["--he", "ckks", "--he-param", "poly_modulus_degree=2048"], "128-bit security"),
    (["--he", "ckks", "--he-param", "coeff_mod_bit_sizes=[60,40,40,40,40,40,60]",
      "--he-param", "poly_modulus_degree=4096"], "128-bit security"),
    (["--he", "ckks", "--he-param", "ring=4"], "no parameter 'ring'"),
    (["--he", "paillier", "--he-param", "key_bits=1024"], "insecure"),
    (["--he", "ckks", "--he-param", "mask_scale=-1"], "mask_scale"),
    (["--he-param", "key_bits=2048"], "needs --he"),
    (["--he", "ckks", "--method", "local"], "nothing to encrypt"),
])
def test_he_user_errors_are_one_line(args, needle, capsys):
    code = main(["train", "--dataset", "digits", "--epochs", "1", *args])
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error:"), cap.err
    assert needle in lines[0]


# ------------------------------------------------------------------------------------------- slow
@pytest.mark.slow
def test_paillier_matches_plaintext_two_epochs_full_digits():
    kw = {"train__epochs": 2, "train__batch_size": 128, "partition__n_labeled": None}
    off, u_off, _ = losses_and_utility(small_cfg("off", **kw))
    on, u_on, _ = losses_and_utility(small_cfg("paillier", **kw))
    assert np.max(np.abs(on - off) / np.abs(off)) < 1e-3 and abs(u_on - u_off) <= 0.005


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_FMNIST, reason="fashion-mnist not installed (apt-get install dataset-fashion-mnist)")
def test_ckks_matches_plaintext_on_fashion_mnist():
    def cfg(he):
        return small_cfg(he, dataset="fashion-mnist", train__epochs=2, train__batch_size=128, model__cut_dim=16,
                         model__head_hidden=(32,), model__bottom="mlp", partition__n_labeled=2000)
    off, u_off, _ = losses_and_utility(cfg("off"))
    on, u_on, _ = losses_and_utility(cfg("ckks"))
    assert np.max(np.abs(on - off) / np.abs(off)) < 1e-3 and abs(u_on - u_off) <= 0.005
    assert u_off > 0.2  # learning, well above chance (0.1), in the 32 steps kept below the divergence horizon
