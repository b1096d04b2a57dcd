import math

import numpy as np
import pytest
import torch

from defenses import parse_defense
from defenses.functional import clip_per_example, iso_sigma, per_example_norms
from securevfl.channel import MessageKind
from securevfl.errors import UserError
from securevfl.hooks import HookContext

CTX = HookContext(MessageKind.GRADIENT, "active", "passive1", 0, True, None, 1000, 0.064, 100)


def one(text, seed=0):
    [d] = parse_defense(text, seed)
    return d


def test_iso_noise_has_the_stated_sigma():
    g = torch.randn(64, 32) * torch.linspace(0.1, 3, 64).unsqueeze(1)
    iso = one("iso:5")
    sigma = 5 * per_example_norms(g).max().item() / math.sqrt(32)
    assert iso_sigma(g, 5) == pytest.approx(sigma, rel=1e-6)
    noise = torch.cat([(iso(g, CTX) - g).flatten() for _ in range(200)])
    assert noise.std().item() == pytest.approx(sigma, rel=0.05)
    assert abs(noise.mean().item()) < 0.05 * sigma


def test_dp_clips_every_example_before_noise():
    # rows are gradients of the batch-mean loss: B × row is the per-example-loss gradient that is clipped
    B = 50
    g = torch.randn(B, 16) * 10 / B
    g[:5] *= 0.0001  # rows already inside the ball stay untouched
    clipped = one("dp:clip=1.5,noise=0")(g, CTX)
    assert (per_example_norms(clipped * B) <= 1.5 + 1e-5).all()
    assert torch.allclose(clipped[:5], g[:5], rtol=1e-6, atol=0)
    assert torch.allclose(clipped[5:] / per_example_norms(clipped[5:]).unsqueeze(1),
                          g[5:] / per_example_norms(g[5:]).unsqueeze(1), atol=1e-6)  # direction kept
    dp = one("dp:clip=1.5,noise=2")
    noise = torch.cat([(dp(g, CTX) * B - clip_per_example(g * B, 1.5)).flatten() for _ in range(200)])
    assert noise.std().item() == pytest.approx(2 * 2 * 1.5, rel=0.05)  # z · Δ, Δ = 2C, before the 1/B
    assert dp.privacy()["steps"] == 200


@pytest.mark.parametrize("text", ["iso:0", "sparsify:100"])
def test_zero_strength_is_bitwise_noop(text):
    g = torch.randn(32, 8)
    assert torch.equal(one(text)(g, CTX), g)


def test_zero_strength_training_run_is_bitwise_identical(digits_cfg):
    from securevfl.lab.compose import execute

    digits_cfg.train.epochs = 1
    base = execute(digits_cfg)
    digits_cfg.defense = "iso:0"
    zero = execute(digits_cfg)
    assert base.result["utility"] == zero.result["utility"]
    for a, b in zip(base.federation.passives[0].bottom.parameters(), zero.federation.passives[0].bottom.parameters(),
                    strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("text", ["iso:3", "iso:lam=1,lam_p=2", "dp:clip=1,noise=1", "sparsify:25",
                                  "iso:1+sparsify:50"])
@pytest.mark.parametrize("shape,dtype", [((16, 8), torch.float32), ((4, 3, 5), torch.float64)])
def test_defenses_keep_shape_and_dtype(text, shape, dtype):
    t = torch.randn(shape, dtype=dtype)
    for kind in (MessageKind.GRADIENT, MessageKind.SSL_REPRESENTATION):
        ctx = HookContext(kind, "a", "b", 0, True, None, 1000, 0.016, 10)
        for d in parse_defense(text):
            if kind in d.acts_on:
                out = d(t, ctx)
                assert out.shape == t.shape and out.dtype == t.dtype


def test_sparsify_keeps_top_entries_per_example():
    g = torch.tensor([[1.0, -5.0, 2.0, 0.5], [0.1, 0.2, -0.3, 4.0]])
    out = one("sparsify:50")(g, CTX)
    assert torch.equal(out, torch.tensor([[0.0, -5.0, 2.0, 0.0], [0.0, 0.0, -0.3, 4.0]]))


def test_noise_is_seeded_and_differs_per_party():
    g = torch.randn(8, 4)
    a1, a2 = one("iso:1", seed=3).for_party("passive1"), one("iso:1", seed=3).for_party("passive1")
    b = one("iso:1", seed=3).for_party("passive2")
    x1, x2, y = a1(g, CTX), a2(g, CTX), b(g, CTX)
    assert torch.equal(x1, x2) and not torch.equal(x1, y)


def test_state_dict_resumes_noise_and_accounting():
    g = torch.randn(8, 4)
    d = one("dp:clip=1,noise=1")
    d(g, CTX)
    state = d.state_dict()
    nxt = d(g, CTX)
    e = one("dp:clip=1,noise=1")
    e.load_state_dict(state)
    assert torch.equal(e(g, CTX), nxt)
    assert e.privacy()["steps"] == d.privacy()["steps"] == 2


@pytest.mark.parametrize("text,needle", [
    ("dp:clip=1", "exactly one of"),
    ("dp:clip=1,noise=1,epsilon=2", "exactly one of"),
    ("dp:clip=0,noise=1", "clip"),
    ("dp:noise=1,delta=2", "delta"),
    ("dp:noise=1,accountant=gdp", "accountant"),
    ("iso:-1", "lam"),
    ("iso:nan", "lam"),
    ("sparsify:0", "keep"),
    ("iso:foo=1", "no parameter 'foo'"),
    ("iso:abc", "not a float"),
    ("nosuch", "unknown defense"),
])
def test_bad_defense_specs(text, needle):
    with pytest.raises(UserError, match=needle):
        parse_defense(text)


def test_defense_on_method_without_cut_layer_is_one_line_error(capsys):
    from securevfl.cli import main

    assert main(["train", "--dataset", "digits", "--method", "local", "--defense", "iso:1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "local" in err and len(err.splitlines()) == 1
    # ISO's λ_p acts only on cross-party SSL representations, which splitnn never sends
    assert main(["train", "--dataset", "digits", "--defense", "iso:lam=0,lam_p=1"]) == 2
    assert "ssl_representation" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ ε accounting
@pytest.fixture(scope="module")
def dp_run():
    from securevfl.config import RunConfig
    from securevfl.lab.compose import execute

    cfg = RunConfig(dataset="digits", method="splitnn", seed=0, defense="dp:clip=1,noise=1.1")
    cfg.train.epochs = 2
    return execute(cfg).result


def test_dp_json_carries_what_recomputation_needs(dp_run):
    p = dp_run["privacy"]
    for key in ("epsilon", "delta", "noise_multiplier", "sample_rate", "steps", "accountant"):
        assert p[key] is not None
    assert p["steps"] == dp_run["cost"]["train_steps"]  # one release per batch (one passive party)
    assert p["sample_rate"] == pytest.approx(128 / dp_run["partition"]["labeled"])
    assert 0 < p["epsilon"] < 100


def test_epsilon_matches_opacus_analysis_called_directly(dp_run):
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

    p = dp_run["privacy"]
    orders = RDPAccountant.DEFAULT_ALPHAS
    rdp = compute_rdp(q=p["sample_rate"], noise_multiplier=p["noise_multiplier"], steps=p["steps"], orders=orders)
    eps, _ = get_privacy_spent(orders=orders, rdp=rdp, delta=p["delta"])
    assert p["epsilon"] == pytest.approx(eps, rel=0.10)


def test_epsilon_matches_an_independent_accountant(dp_run):
    """Google's dp-accounting is a separate implementation of the RDP accountant."""
    import dp_accounting as dpa

    p = dp_run["privacy"]
    acc = dpa.rdp.RdpAccountant()
    acc.compose(dpa.PoissonSampledDpEvent(p["sample_rate"], dpa.GaussianDpEvent(p["noise_multiplier"])), p["steps"])
    assert p["epsilon"] == pytest.approx(acc.get_epsilon(p["delta"]), rel=0.10)


def test_prv_accountant_option_matches_pld(digits_cfg):
    import dp_accounting as dpa

    from securevfl.lab.compose import execute

    digits_cfg.train.epochs = 1
    digits_cfg.defense = "dp:clip=1,noise=1,accountant=prv"
    p = execute(digits_cfg).result["privacy"]
    assert p["accountant"] == "prv"
    acc = dpa.pld.PLDAccountant()
    acc.compose(dpa.PoissonSampledDpEvent(p["sample_rate"], dpa.GaussianDpEvent(p["noise_multiplier"])), p["steps"])
    assert p["epsilon"] == pytest.approx(acc.get_epsilon(p["delta"]), rel=0.10)


def test_target_epsilon_calibrates_noise(digits_cfg):
    from securevfl.lab.compose import execute

    digits_cfg.train.epochs = 2
    digits_cfg.defense = "dp:clip=1,epsilon=2"
    p = execute(digits_cfg).result["privacy"]
    assert p["epsilon"] == pytest.approx(2.0, rel=0.05) and p["epsilon"] <= 2.0 + 1e-6
    assert p["noise_multiplier"] > 1.0


def test_epsilon_decreases_with_noise_and_iso_reports_none():
    from opacus.accountants import RDPAccountant

    eps = []
    for z in (0.5, 1.0, 2.0):
        a = RDPAccountant()
        a.step(noise_multiplier=z, sample_rate=0.01)
        eps.append(a.get_epsilon(1e-5))
    assert eps[0] > eps[1] > eps[2]
    assert one("iso:5").privacy()["epsilon"] is None  # ISO never reports a number


def test_dp_zero_noise_reports_no_epsilon():
    d = one("dp:clip=1,noise=0")
    d(torch.randn(4, 2), CTX)
    assert d.privacy()["epsilon"] is None and d.privacy()["formal_guarantee"] is False
    assert np.isfinite(one("dp:clip=1,noise=1").privacy()["epsilon"])
