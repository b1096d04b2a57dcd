"""Gradient-side label defenses of issue 28: MARVELL, max-norm, Laplace, discrete SGD, GradPerturb.
Each lowers the attack it targets on a case where that attack leaks undefended (the undefended run
is the control: the same check fails there), and each is bit-for-bit a no-op at zero strength."""


import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.optimize import minimize
from torch import nn

from defenses import DEFENSES, parse_defense
from defenses.perturbation.marvell import marvell_covariances, symmetric_kl
from securevfl.channel import MessageKind
from securevfl.cli import main
from securevfl.config import RunConfig
from securevfl.hooks import HookContext, Objective
from securevfl.lab.compose import execute
from tests.test_attacks import imbalanced_files


def breast_run(defense: str, epochs: int = 2, seed: int = 0) -> dict:
    cfg = RunConfig(dataset="breast-cancer", method="splitnn", seed=seed, defense=defense, mechanism_seed=1,
                    attacks=["norm", "direction"])
    cfg.train.epochs, cfg.train.batch_size = epochs, 64
    return execute(cfg, progress=False).to_json()


@pytest.fixture(scope="module")
def undefended() -> dict:
    return breast_run("none")


@pytest.mark.parametrize("off", ["marvell:0", "max-norm:0", "laplace:0", "discrete-sgd:0", "gradperturb:inf"])
def test_zero_strength_is_bit_identical_to_no_defense(off, undefended):
    out = breast_run(off)
    assert out["utility"] == undefended["utility"]
    for name in ("norm", "direction"):
        assert out["attacks"][name]["value"] == undefended["attacks"][name]["value"]


@pytest.mark.parametrize("defense", ["marvell:4", "laplace:0.01", "discrete-sgd:4", "gradperturb:1"])
def test_defense_lowers_direction_scoring_on_breast_cancer(defense, undefended):
    # control: undefended, direction scoring separates the classes perfectly on breast-cancer
    base = undefended["attacks"]["direction"]["value"]
    assert base > 0.95
    out = breast_run(defense)
    assert out["attacks"]["direction"]["value"] <= base - 0.1, out["attacks"]["direction"]
    assert out["utility"]["test"] > 0.8  # still a model


def test_max_norm_lowers_norm_scoring_on_imbalanced_data(tmp_path):
    files = imbalanced_files(tmp_path, n=1500)
    res = {}
    for defense in ("none", "max-norm"):
        cfg = RunConfig(dataset="csv", method="splitnn", defense=defense, mechanism_seed=1, attacks=["norm"])
        cfg.data.party_files, cfg.partition.alignment, cfg.train.epochs = files, "plain", 2
        res[defense] = execute(cfg, progress=False).to_json()["attacks"]["norm"]["value"]
    assert res["none"] > 0.85  # control: norm scoring leaks on imbalanced data undefended
    assert res["max-norm"] <= res["none"] - 0.1, res


def test_marvell_solver_matches_a_generic_solver_on_the_four_variable_problem():
    rng = np.random.default_rng(0)
    for _ in range(6):
        u, v = rng.uniform(0.01, 1, size=2)
        d, g, p = int(rng.integers(2, 30)), float(rng.uniform(0.1, 5)), float(rng.uniform(0.1, 0.9))
        P = float(rng.uniform(0.1, 4)) * g
        lam10, lam20, lam11, lam21, kl = marvell_covariances(u, v, d, g, p, P)
        lam = (lam10, lam20, lam11, lam21)
        assert min(lam) >= 0 and (1 - p) * (lam10 + (d - 1) * lam20) + p * (lam11 + (d - 1) * lam21) <= P * (1 + 1e-9)
        assert kl == pytest.approx(symmetric_kl(lam, u, v, d, g))
        assert kl < symmetric_kl((0.0, 0.0, 0.0, 0.0), u, v, d, g)  # the noise helps
        cons = {"type": "ineq", "fun": lambda x, d=d, p=p, P=P: P - (1 - p) * (x[0] + (d - 1) * x[1])
                - p * (x[2] + (d - 1) * x[3])}
        best = min(minimize(lambda x, u=u, v=v, d=d, g=g: symmetric_kl(tuple(x), u, v, d, g),
                             rng.uniform(0, P / d, 4), bounds=[(0, None)] * 4, constraints=[cons],
                             method="SLSQP").fun for _ in range(8))
        assert kl <= best + 1e-6 * max(1.0, abs(best))


def test_marvell_noise_has_the_solved_covariance_per_class():
    m = DEFENSES.get("marvell")(seed=3, s=2.0)
    y = np.r_[np.zeros(3000, int), np.ones(1000, int)]
    gen = torch.Generator().manual_seed(0)
    grads = torch.randn(len(y), 5, generator=gen) * 0.1 + torch.from_numpy(y)[:, None].float() * torch.tensor(
        [1.0, 0, 0, 0, 0])
    ctx = HookContext(MessageKind.GRADIENT, "active", "passive1", 0, True, np.arange(len(y)), y)
    out = m(grads, ctx)
    noise = (out - grads).double()
    delta = grads[y == 1].double().mean(0) - grads[y == 0].double().mean(0)
    unit = delta / delta.norm()
    along = noise @ unit
    lam = marvell_covariances(m.last["u"], m.last["v"], 5, m.last["g"], m.last["p"], m.last["P"])
    for cls, (la, lo) in ((0, lam[0:2]), (1, lam[2:4])):
        rows = noise[torch.from_numpy(y == cls)]
        a = along[torch.from_numpy(y == cls)]
        assert float(a.var()) == pytest.approx(la, rel=0.15, abs=1e-4)
        orth = rows - a[:, None] * unit[None, :]
        assert float(orth.pow(2).sum(1).mean()) / 4 == pytest.approx(lo, rel=0.15, abs=1e-4)
    assert (1 - m.last["p"]) * (lam[0] + 4 * lam[1]) + m.last["p"] * (lam[2] + 4 * lam[3]) <= m.last["P"] * 1.000001


def test_max_norm_matches_every_expected_squared_norm_to_the_batch_max():
    mn = DEFENSES.get("max-norm")(seed=0)
    g = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 1.0]]).repeat(4000, 1)  # one batch, each row many times
    ctx = HookContext(MessageKind.GRADIENT, "active", "passive1", 0, True, np.arange(len(g)))
    sq = mn(g, ctx).pow(2).sum(1).view(4000, 3).mean(0)
    assert torch.allclose(sq, torch.full((3,), 25.0), rtol=0.1)
    cos = F.cosine_similarity(mn(g, ctx), g).abs()  # noise only along each row's own direction
    assert torch.allclose(cos, torch.ones(len(g)), atol=1e-5)


def test_discrete_sgd_uses_bins_plus_one_levels():
    ds = DEFENSES.get("discrete-sgd")(bins=4)
    ctx = HookContext(MessageKind.GRADIENT, "active", "passive1", 0, True, np.arange(200))
    g = torch.randn(200, 8, generator=torch.Generator().manual_seed(0))
    out = ds(g, ctx)
    assert len(torch.unique(out)) <= 5 and float((out - g).abs().max()) > 0
    w = ds.width["passive1"]
    assert w == pytest.approx(2 * float(g.double().std()) / 2)
    assert torch.allclose(ds(g * 0.01, ctx), torch.zeros_like(g))  # the width stays the first batch's


def test_gradperturb_adds_the_laplace_mix_of_per_class_gradients():
    torch.manual_seed(0)
    gp = DEFENSES.get("gradperturb")(seed=5, epsilon=0.5).for_party("active")
    head = gp.wrap_head(nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)))
    r = torch.randn(5, 4, requires_grad=True)
    y = torch.tensor([0, 1, 2, 1, 0])
    gp.arm([head])
    logits = head(r)
    obj = Objective(mean=lambda: F.cross_entropy(logits, y), check=lambda t: t, batch_size=5)
    state = gp.generator.get_state()
    out = gp.gradients(obj, list(head.parameters()), [r])
    # the same Laplace draws, then Σ_c u_c g_c with g_c the gradient as if every label were c
    gen = torch.Generator()
    gen.set_state(state)
    w = torch.rand((5, 3), generator=gen, dtype=torch.float64) - 0.5
    u = (-(2 / 0.5) * torch.sign(w) * torch.log1p(-2 * w.abs())).float()
    want = torch.zeros(5, 4)
    for c in range(3):
        gc = torch.autograd.grad(F.cross_entropy(head[:-1](r), torch.full((5,), c)), r)[0]
        want += u[:, c:c + 1] * gc
    true = torch.autograd.grad(F.cross_entropy(head[:-1](r), y), r)[0]
    assert torch.allclose(out.rows[0], true + want, atol=1e-5)
    # the active party's own parameters get the exact gradient
    exact = torch.autograd.grad(F.cross_entropy(head[:-1](r), y), list(head.parameters()))
    assert all(torch.allclose(a, b) for a, b in zip(out.params, exact, strict=True))
    assert gp.privacy()["epsilon"] is None and gp.privacy()["per_release_epsilon"] == 0.5


@pytest.mark.parametrize("spec,needle", [
    ("max-norm:2", "max-norm strength must be in [0, 1]"),
    ("discrete-sgd:1", "bins must be 0 (off) or ≥ 2"),
    ("laplace:on=labels", "laplace on must be one of"),
    ("gradperturb:0", "gradperturb epsilon must be > 0"),
    ("marvell:-1", "marvell s must be ≥ 0"),
])
def test_bad_parameters_are_one_line_errors(spec, needle):
    from securevfl.errors import UserError

    with pytest.raises(UserError, match=None) as e:
        parse_defense(spec)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_two_step_rules_are_refused_in_one_line(capsys):
    assert main(["train", "--dataset", "breast-cancer", "--epochs", "1", "--defense", "dp:noise=1+gradperturb"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "dp and gradperturb each provide the party's ActiveStep" in err


def test_marvell_refuses_a_multiclass_task(capsys):
    assert main(["train", "--dataset", "digits", "--epochs", "1", "--defense", "marvell"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "binary tasks" in err


def test_defenses_listing(capsys):
    assert main(["defenses"]) == 0
    out = capsys.readouterr().out
    for name in DEFENSES.names():
        assert f"{name}  party: " in out
    assert "marvell  party: active  hooks: message (a)  ε: none" in out
    assert "dp  party: active  hooks: active step (b)  ε: accounted" in out
    assert all(DEFENSES.get(n).targets for n in DEFENSES.names())  # every defense names its targets
    assert "s = 4.0 (primary)" in out


@pytest.mark.slow
@pytest.mark.parametrize("defense", ["marvell:4", "gradperturb:1", "max-norm", "discrete-sgd:4", "laplace:0.01"])
def test_gradient_defenses_compose_with_he(defense):
    """Under CKKS the active party transforms the plaintext g before the encrypted backward: the rows
    the passive party decrypts are defended as with HE off (direction AUC lowered the same way)."""
    res = {}
    for he in ("off", "ckks"):
        cfg = RunConfig(dataset="breast-cancer", method="splitnn", defense=defense, he=he, attacks=["direction"])
        cfg.train.epochs, cfg.train.batch_size = 2, 64
        res[he] = execute(cfg, progress=False).to_json()["attacks"]["direction"]["value"]
    base = breast_run("none")["attacks"]["direction"]["value"]
    assert res["ckks"] <= base - 0.1 and res["off"] <= base - 0.1, res
