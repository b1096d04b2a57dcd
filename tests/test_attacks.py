import numpy as np
import pandas as pd
import pytest
import torch

from attacks.model_completion.mc import MaliciousUpdate, balanced_draw
from attacks.model_completion.mixmatch import mixup, sharpen
from securevfl.cli import main
from securevfl.config import RunConfig
from securevfl.lab.compose import execute


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


def test_malicious_update_scales_within_bounds():
    p = torch.nn.Parameter(torch.zeros(4))
    hook = MaliciousUpdate(gamma=1.0)
    p.grad = torch.tensor([1.0, 1.0, 1.0, 1.0])
    hook([p])
    assert torch.equal(p.grad, torch.ones(4))  # no history yet
    p.grad = torch.tensor([2.0, -1.0, 100.0, 0.5])
    hook([p])
    assert torch.allclose(p.grad, torch.tensor([2.0 * 3, -1.0 * 1, 100.0 * 5, 0.5 * 1.5]), rtol=1e-5)


@pytest.fixture(scope="module")
def digits_mc():
    out = {}
    for defense in ("none", "iso:25"):
        cfg = RunConfig(dataset="digits", method="splitnn", defense=defense, attacks=["mc", "mc-plain"])
        cfg.train.epochs = 10
        out[defense] = execute(cfg).result
    return out


def test_mc_far_above_prior_on_undefended_splitnn(digits_mc):
    for name in ("mc", "mc-plain"):
        a = digits_mc["none"]["attacks"][name]
        assert a["metric"] == "accuracy" and a["prior"] < 0.15
        assert a["value"] > 4 * a["prior"] and a["test"] > 4 * a["prior"]
        assert "baseline" in a and a["leakage"] == pytest.approx(a["value"] - a["baseline"])
        assert a["n_aux"] == 40


def test_iso_25_lowers_mc(digits_mc):
    for name in ("mc", "mc-plain"):
        assert digits_mc["iso:25"]["attacks"][name]["value"] < digits_mc["none"]["attacks"][name]["value"]
    iso, none = digits_mc["iso:25"]["attacks"], digits_mc["none"]["attacks"]
    assert iso["mc-plain"]["value"] < none["mc-plain"]["value"] - 0.02


def imbalanced_files(tmp_path, n=3000, pos=0.05):
    rng = np.random.default_rng(0)
    y = (rng.random(n) < pos).astype(int)
    z = rng.normal(size=(n, 6)) + y[:, None] * 1.5
    ids = np.arange(n)
    pd.DataFrame({"id": ids, **{f"a{j}": z[:, j] for j in range(3)}, "label": y}).to_csv(tmp_path / "a.csv",
                                                                                       index=False)
    pd.DataFrame({"id": ids, **{f"b{j}": z[:, 3 + j] for j in range(3)}}).to_csv(tmp_path / "b.csv", index=False)
    return [str(tmp_path / "a.csv"), str(tmp_path / "b.csv")]


def test_norm_attack_on_imbalanced_binary_and_dp(tmp_path):
    files = imbalanced_files(tmp_path)
    res = {}
    for defense in ("none", "dp:clip=0.05,noise=2"):
        cfg = RunConfig(dataset="csv", method="splitnn", defense=defense, attacks=["norm", "direction"])
        cfg.data.party_files = files
        cfg.partition.alignment = "plain"
        cfg.train.epochs = 3
        res[defense] = execute(cfg).result["attacks"]
    assert res["none"]["norm"]["value"] > 0.9 and res["none"]["norm"]["batches"] > 10
    assert res["none"]["direction"]["value"] > 0.9
    assert res["dp:clip=0.05,noise=2"]["norm"]["value"] < 0.7
    assert res["dp:clip=0.05,noise=2"]["direction"]["value"] < 0.7


@pytest.mark.parametrize("args,needle", [
    (["--method", "local", "--attack", "mc"], "needs bottom_model"),
    (["--attack", "norm"], "needs binary_task"),
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
    a = out.result["attacks"]["mc-active"]
    assert a["malicious_updates"] == out.federation.passives[0].step > 0
    assert a["encoder"] == "½(f_c + f_l)" and a["malicious_training"] == ["mc-active"]
    assert a["value"] > a["prior"]
