import copy
import json

import numpy as np
import pandas as pd
import pytest
import torch

from attacks import parse_attack
from attacks.model_completion.mc import MaliciousSGD, balanced_draw, malicious_ratio, reset_parameters
from attacks.model_completion.mixmatch import mixup, sharpen
from securevfl.cli import main
from securevfl.config import RunConfig
from securevfl.errors import UserError
from securevfl.lab.compose import execute
from tests.golden_runs import pinned_threads


def test_sharpen_and_mixup():
    p = torch.tensor([[0.6, 0.4], [0.5, 0.5]])
    s = sharpen(p, 0.5)
    assert torch.allclose(s.sum(1), torch.ones(2)) and s[0, 0] > 0.6 and torch.allclose(s[1], p[1])
    x, y = torch.eye(4), torch.eye(4)
    xm, ym = mixup(x, y, 0.75, np.random.default_rng(0), torch.Generator().manual_seed(0))
    assert torch.allclose(xm, ym) and (xm.max(1).values >= 0.5).all()  # λ' = max(λ, 1−λ) keeps the anchor


def test_balanced_aux_draw():
    ids, y = np.arange(100), np.r_[np.zeros(90, int), np.ones(10, int)]
    aux = balanced_draw(ids, y, 10, 2, np.random.default_rng(0))
    assert len(aux) == 10 and (y[aux] == 1).sum() == 5


def test_malicious_sgd_is_momentum_sgd_scaled_per_element():
    assert torch.allclose(malicious_ratio(torch.tensor([2.0, -1.0, 100.0, 0.5]), torch.ones(4), 1.0),
                          torch.tensor([3.0, 1.0, 5.0, 1.5]))  # clamp(1 + γ d_t / d_{t−1}, 1, 5)
    p = torch.nn.Parameter(torch.zeros(4))
    opt = MaliciousSGD(lambda: 0.1, momentum=0.5, gamma=1.0)
    p.grad = torch.ones(4)
    opt([p])
    assert torch.allclose(p.detach(), torch.full((4,), -0.1))  # first step: plain SGD (no history)
    p.grad = torch.tensor([1.0, -3.0, 1.0, 100.0])
    opt([p])
    buf = 0.5 * torch.ones(4) + p.grad  # momentum direction, then the malicious ratio against step 1
    step = buf * torch.clamp(1 + buf / 1.0, 1, 5)
    assert torch.allclose(p.detach(), -0.1 - 0.1 * step) and opt.calls == 2
    saved = opt.state_dict()  # a learning-rate search snapshots and restores it with the party
    p.grad = torch.ones(4)
    opt([p])
    opt.load_state_dict(saved)
    assert opt.calls == 3 and torch.equal(opt.buf[id(p)], buf) and torch.equal(opt.prev[id(p)], step)


def test_control_is_the_same_architecture_untrained():
    torch.manual_seed(0)
    trained = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    with torch.no_grad():
        for q in trained.parameters():
            q.add_(5.0)
        trained[1].running_mean.add_(3.0)
    fresh = reset_parameters(copy.deepcopy(trained))
    assert [q.shape for q in fresh.parameters()] == [q.shape for q in trained.parameters()]
    assert all((a - b).abs().min() > 1.0 for a, b in zip(fresh.parameters(), trained.parameters(), strict=True))
    assert torch.equal(fresh[1].running_mean, torch.zeros(8))

    class Odd(torch.nn.Module):  # a parameter no reset_parameters() reaches: refused, not left trained
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(3))

    with pytest.raises(TypeError, match="reset_parameters"):
        reset_parameters(torch.nn.Sequential(Odd()))


def digits_run(seed: int, attacks: list, optimizer: str = "adam", defense: str = "none") -> dict:
    cfg = RunConfig(dataset="digits", method="splitnn", defense=defense, attacks=attacks, seed=seed)
    cfg.train.epochs = 10
    cfg.optim.optimizer, cfg.optim.lr = optimizer, 1e-3 if optimizer == "adam" else 1e-2
    with pinned_threads():  # one thread: the same floats whatever the machine's load (margins below are small)
        return execute(cfg).to_json()["attacks"]


SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def passive():
    """Undefended splitnn on digits halves, 3 seeds, under adam and sgd: passive MC variants."""
    return {opt: [digits_run(s, ["mc:baseline=false", "mc-full:baseline=false"], opt) for s in SEEDS]
            for opt in ("adam", "sgd")}


def test_default_mc_sees_the_encoder_the_federation_trained(passive):
    """Issue 17's table as a test: the default MC on the federation's encoder beats the same attack on
    the same architecture at random init by ≥ 0.05 (3 seeds). Control: the full fine-tune (``mc-full``,
    the old default) reaches about the same value from either start, so this check can fail."""
    gap = [r["mc"]["value"] - r["mc"]["control"] for r in passive["adam"]]
    assert np.mean(gap) >= 0.05 and min(gap) > 0.02, gap
    for r in passive["adam"]:
        assert r["mc"]["leakage"] == pytest.approx(r["mc"]["value"] - r["mc"]["control"])
        assert r["mc"]["finetunes"] == "head (bottom frozen)" and r["mc-full"]["finetunes"] == "bottom and head"
    # the full fine-tune gains much less from the trained encoder (it re-learns the bottom from either
    # start). Since the label-free split of issue 25 its gap is 0.028/0.099/0.029 on seeds 0-2 (0.052 on
    # average, one thread) against the frozen-encoder MC's 0.112/0.084/0.138, so the control compares
    # the two gaps rather than holding mc-full under a fixed 0.05.
    blind = [r["mc-full"]["value"] - r["mc-full"]["control"] for r in passive["adam"]]
    assert np.mean(blind) < np.mean(gap) - 0.03, (blind, gap)


@pytest.mark.parametrize("optimizer,margin", [("adam", 0.02), ("sgd", 0.08)])
def test_mc_active_raises_mc_over_the_passive_attack_under_either_optimizer(passive, optimizer, margin):
    """The adversary's own MaliciousSGD replaces its optimizer step whatever the federation uses, and
    the encoder it ends up with gives a higher MC value than the passive adversary's (same seeds).
    Under Adam the gain is small: 0.038/0.016/0.033 on an AVX2 machine before issue 25 (the old 0.03 was
    set on AVX512), 0.001/0.040/0.038 with the label-free split (one thread); so ≥ 0.02 on average and
    never a loss beyond 0.01. SGD: 0.147/0.155/0.153."""
    active = [digits_run(s, ["mc-active:baseline=false"], optimizer)["mc-active"] for s in SEEDS]
    gain = [a["value"] - p["mc"]["value"] for a, p in zip(active, passive[optimizer], strict=True)]
    assert np.mean(gain) >= margin and min(gain) > -0.01, gain
    assert all(a["malicious_updates"] > 0 and a["malicious_training"] == ["mc-active"] for a in active)


@pytest.fixture(scope="module")
def digits_mc():
    return {defense: digits_run(0, ["mc", "mc-plain"], defense=defense) for defense in ("none", "iso:25")}


def test_mc_far_above_prior_with_control_and_baseline(digits_mc):
    for name in ("mc", "mc-plain"):
        a = digits_mc["none"][name]
        assert a["metric"] == "accuracy" and a["prior"] < 0.15
        assert a["value"] > 4 * a["prior"] and a["test"] > 4 * a["prior"]
        assert a["control"] > a["prior"] and a["baseline"] > a["prior"]
        assert a["leakage"] == pytest.approx(a["value"] - max(a["control"], a["baseline"]))
        assert a["n_aux"] == 40 and a["baseline_ssl"]["epochs"] == 10  # splitnn has no SSL stage to match


def test_iso_25_lowers_mc(digits_mc):
    for name in ("mc", "mc-plain"):
        assert digits_mc["iso:25"][name]["value"] < digits_mc["none"][name]["value"] - 0.02
        # the control does not see the federation's encoder, so the defense cannot move it
        assert digits_mc["iso:25"][name]["control"] == digits_mc["none"][name]["control"]


def test_attack_specs_are_typed_and_validated():
    cls, params = parse_attack("mc:n_aux=20,steps=600,baseline=false,lr=0.01")
    assert cls.name == "mc" and params == {"n_aux": 20, "steps": 600, "baseline": False, "lr": 0.01}
    assert parse_attack({"mc-active": {"gamma": 2}})[1] == {"gamma": 2.0}
    for spec, needle in [("mc:nosuch=1", "no parameter 'nosuch'"), ("mc:steps=abc", "steps='abc' is not a int"),
                         ("mc:steps=0", "steps must be ≥ 1"), ("mc:T=2", "T ≤ 1"), ("mc:40", "key=value"),
                         ({"mc": {"baseline": "maybe"}}, "baseline"), ("nope:x=1", "unknown attack 'nope'"),
                         ("mc-active:momentum=1", "momentum must be in"), ("mc-active:gamma=-1", "gamma must be ≥ 0")]:
        with pytest.raises(UserError, match=needle):
            parse_attack(spec)


def test_attack_params_from_cli_and_config(tmp_path, capsys):
    assert main(["train", "--dataset", "digits", "--epochs", "1", "--json",
                 "--attack", "mc-plain:n_aux=20,steps=5,baseline=false,control=false"]) == 0
    a = json.loads(capsys.readouterr().out)["attacks"]["mc-plain"]
    assert a["n_aux"] == 20 and a["params"]["steps"] == 5 and "control" not in a and "baseline" not in a
    cfg = tmp_path / "c.yaml"
    cfg.write_text("dataset: digits\ntrain: {epochs: 1}\nattacks:\n  - {mc-plain: {n_aux: 30, steps: 5, "
                   "baseline: false}}\n")
    assert main(["train", "--config", str(cfg), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["attacks"]["mc-plain"]["n_aux"] == 30
    for args, needle in [(["--attack", "mc:n_aux=x"], "n_aux='x' is not a int"),
                         (["--attack", "mc:stepz=1"], "no parameter 'stepz'"),
                         (["--attack", "mc", "--attack", "mc:n_aux=20"], "listed twice")]:
        assert main(["train", "--dataset", "digits", "--epochs", "1", *args]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("error:") and needle in err


def imbalanced_files(tmp_path, n=3000, pos=0.05):
    rng = np.random.default_rng(0)
    y = (rng.random(n) < pos).astype(int)
    z = rng.normal(size=(n, 6)) + y[:, None] * 1.5
    ids = np.arange(n)
    pd.DataFrame({"id": ids, **{f"a{j}": z[:, j] for j in range(3)}, "label": y}).to_csv(tmp_path / "a.csv",
                                                                                       index=False)
    pd.DataFrame({"id": ids, **{f"b{j}": z[:, 3 + j] for j in range(3)}}).to_csv(tmp_path / "b.csv", index=False)
    return [str(tmp_path / "a.csv"), str(tmp_path / "b.csv")]


def gradient_attack_run(files: list[str], epochs: int, defense: str = "none", he: str = "off",
                        mixing: str = "auto") -> dict:
    cfg = RunConfig(dataset="csv", method="splitnn", defense=defense, he=he, attacks=["norm", "direction"])
    cfg.model.interactive_mixing = mixing
    cfg.data.party_files = files
    cfg.partition.alignment = "plain"
    cfg.train.epochs = epochs
    if he != "off":
        cfg.he_params = {"seeded_shares": True}  # same W_P(0) as HE off: the same training step for step
    return execute(cfg).to_json()["attacks"]


def test_norm_attack_on_imbalanced_binary_and_dp(tmp_path):
    files = imbalanced_files(tmp_path)
    res = {defense: gradient_attack_run(files, 3, defense) for defense in ("none", "dp:clip=0.05,noise=2")}
    assert res["none"]["norm"]["value"] > 0.9 and res["none"]["norm"]["batches"] > 10
    for name in ("norm", "direction"):  # control: the same scores against labels shuffled within batches
        a = res["none"][name]
        assert abs(a["control"] - 0.5) < 0.05 and a["leakage"] == pytest.approx(a["value"] - a["control"])
    assert res["none"]["direction"]["value"] > 0.9
    assert res["dp:clip=0.05,noise=2"]["norm"]["value"] < 0.7
    assert res["dp:clip=0.05,noise=2"]["direction"]["value"] < 0.7


@pytest.mark.parametrize("args,needle", [
    (["--method", "local", "--attack", "mc"], "needs a passive party with a bottom model"),
    (["--attack", "norm"], "needs a binary task"),
    (["--attack", "nosuch"], "unknown attack 'nosuch'"),
])
def test_attack_requirements_checked_before_training(args, needle, capsys):
    assert main(["train", "--dataset", "digits", "--epochs", "1", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error:") and needle in err


def test_mc_active_installs_malicious_updates_and_attacks_fedhssl_encoder():
    cfg = RunConfig(dataset="digits", method="fedhssl", attacks=["mc-active"], seed=0)
    cfg.partition.aligned_fraction, cfg.partition.n_labeled = 0.5, 300
    cfg.train.epochs, cfg.model.bottom = 3, "mlp"
    cfg.method_params = {"ssl_epochs": 1, "ssl_batch_size": 256}
    out = execute(cfg)
    a = out.to_json()["attacks"]["mc-active"]
    assert a["malicious_updates"] == out.federation.passives[0].step > 0
    assert a["encoder"] == "½(f_c + f_l)" and a["malicious_training"] == ["mc-active"]
    assert a["value"] > a["prior"]


@pytest.mark.slow
def test_default_mc_sees_the_encoder_on_fashion_mnist_halves():
    """The same check on Fashion-MNIST halves at the main job's size (10,000 images, 20 % aligned,
    200 labels, Adam, 50 epochs, MLP bottoms): value − control ≥ 0.05 over 3 seeds for ``mc``;
    ``mc-full`` (control of the check) sees much less of the encoder."""
    from securevfl.data import dataset_status

    if not dict((n, ok) for n, ok, _ in dataset_status())["fashion-mnist"]:
        pytest.skip("fashion-mnist not installed (apt-get install dataset-fashion-mnist)")
    gaps = {"mc": [], "mc-full": []}
    for seed in SEEDS:
        cfg = RunConfig(dataset="fashion-mnist", method="splitnn", seed=seed,
                        attacks=["mc:baseline=false", "mc-full:baseline=false"])
        cfg.data.max_rows = 10000
        cfg.partition.aligned_fraction, cfg.partition.n_labeled = 0.2, 200
        cfg.train.epochs, cfg.train.batch_size, cfg.model.bottom = 50, 64, "mlp"
        res = execute(cfg).to_json()["attacks"]
        for name in gaps:
            gaps[name].append(res[name]["value"] - res[name]["control"])
    assert np.mean(gaps["mc"]) >= 0.05 and min(gaps["mc"]) > 0, gaps
    assert np.mean(gaps["mc-full"]) < np.mean(gaps["mc"]) - 0.03, gaps


def test_norm_and_direction_under_he_read_what_the_passive_party_decrypts(tmp_path):
    """HE does not protect labels from the passive party: under CKKS it decrypts ∂L/∂t, the same rows
    it receives with HE off (the same layer: HE's default mixing, asked for with HE off too), and the
    label attacks score them with the same result."""
    files = imbalanced_files(tmp_path, n=1500)
    res = {he: gradient_attack_run(files, 2, he=he, mixing="on") for he in ("off", "ckks")}
    for name in ("norm", "direction"):
        off, on = res["off"][name], res["ckks"][name]
        assert on["batches"] == off["batches"] > 10
        assert on["value"] == pytest.approx(off["value"], abs=0.01) and on["value"] > 0.8
