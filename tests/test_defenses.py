import math

import pytest
import torch

from defenses import parse_defense
from defenses.functional import iso_sigma, per_example_norms
from securevfl.channel import MessageKind
from securevfl.errors import UserError
from securevfl.hooks import HookContext, MessageTransform

CTX = HookContext(MessageKind.GRADIENT, "active", "passive1", 0, True, None)


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
    assert base.to_json()["utility"] == zero.to_json()["utility"]
    for a, b in zip(base.federation.passives[0].bottom.parameters(), zero.federation.passives[0].bottom.parameters(),
                    strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("text", ["iso:3", "iso:lam=1,lam_p=2", "dp:clip=1,noise=1", "sparsify:25",
                                  "iso:1+sparsify:50"])
@pytest.mark.parametrize("shape,dtype", [((16, 8), torch.float32), ((4, 3, 5), torch.float64)])
def test_defenses_keep_shape_and_dtype(text, shape, dtype):
    t = torch.randn(shape, dtype=dtype)
    for kind in (MessageKind.GRADIENT, MessageKind.SSL_REPRESENTATION):
        ctx = HookContext(kind, "a", "b", 0, True, None)
        for d in parse_defense(text):
            if kind in d.acts_on and isinstance(d, MessageTransform):  # the message hook point
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


def test_state_dict_resumes_noise():
    g = torch.randn(8, 4)
    d = one("iso:1")
    d(g, CTX)
    state = d.state_dict()
    nxt = d(g, CTX)
    e = one("iso:1")
    e.load_state_dict(state)
    assert torch.equal(e(g, CTX), nxt)


@pytest.mark.parametrize("text,needle", [
    ("dp:clip=1", "exactly one of"),
    ("dp:clip=1,noise=1,epsilon=2", "exactly one of"),
    ("dp:clip=0,noise=1", "clip"),
    ("dp:noise=1,delta=2", "delta"),
    ("dp:noise=1,accountant=pld", "accountant must be one of"),
    ("dp:noise=1,select_epsilon=0", "select_epsilon"),
    ("rr", "rr needs epsilon"),
    ("rr:0", "rr epsilon"),
    ("rr:inf", "rr epsilon"),
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


def test_iso_reports_no_epsilon():
    assert one("iso:5").privacy() is None or one("iso:5").privacy()["epsilon"] is None  # never a number
