import json
import subprocess
import sys

import pytest

from securevfl.cli import main


def run_cli(*args):
    p = subprocess.run([sys.executable, "-m", "securevfl", *args], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def test_train_json_is_one_object():
    code, out, err = run_cli("train", "--dataset", "digits", "--method", "splitnn", "--epochs", "3", "--json")
    assert code == 0, err
    obj = json.loads(out)  # exactly one JSON document on stdout
    for key in ("dataset", "method", "seed", "utility", "attacks", "privacy", "cost"):
        assert key in obj
    assert obj["utility"]["metric"] == "accuracy" and 0 <= obj["utility"]["test"] <= 1
    assert obj["privacy"] == {"epsilon": None, "delta": None, "mechanism": "none", "features": {},
                              "randomness": "private (OS CSPRNG)"}
    assert obj["cost"]["bytes_sent"] > 0 and obj["cost"]["he"]["scheme"] == "off"


@pytest.mark.parametrize("args,needle", [
    (["train", "--dataset", "nosuch"], "unknown dataset 'nosuch'"),
    (["train", "--dataset", "digits", "--method", "nosuch"], "unknown method 'nosuch'"),
    (["train", "--dataset", "digits", "--aligned-fraction", "-0.5"], "aligned-fraction"),
    (["train", "--dataset", "fashion-mnist", "--data-dir", "/nonexistent/dir"], "/nonexistent/dir"),
    (["train", "--dataset", "digits", "--epochs", "0"], "epochs"),
    (["train", "--dataset", "digits", "--he", "nosuch"], "--he nosuch"),
    (["train", "--dataset", "digits", "--defense", "nosuch:1"], "unknown defense"),
    (["train", "--dataset", "digits", "--epochs", "two"], "invalid int"),
    (["train", "--config", "/nonexistent.yaml"], "config file"),
    (["frobnicate"], "invalid choice"),
    (["train", "--dataset", "digits", "--lr", "nan"], "--lr (optim.lr): nan is not a valid"),
    (["train", "--dataset", "digits", "--seed", "-1"], "--seed (seed) must be in [0, 2147483647], got -1"),
    (["train", "--dataset", "digits", "--cut-dim", "0"], "--cut-dim (model.cut_dim) must be ≥ 1"),
])
def test_user_errors_exit_2_with_one_line(args, needle, capsys):
    code = main(args)
    cap = capsys.readouterr()
    assert code == 2
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), cap.err
    assert needle in lines[0]
    assert "Traceback" not in cap.err and cap.out == ""


def test_missing_fashion_mnist_says_how_to_get_it(tmp_path, monkeypatch, capsys):
    import securevfl.data.registry as b

    monkeypatch.setattr(b, "DEBIAN_DATASETS", tmp_path / "none")
    monkeypatch.delenv("SECUREVFL_DATA", raising=False)
    assert main(["train", "--dataset", "fashion-mnist"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "dataset-fashion-mnist" in err and len(err.splitlines()) == 1


def test_config_file_and_bad_key(tmp_path, capsys):
    good = tmp_path / "run.yaml"
    good.write_text("dataset: digits\ntrain: {epochs: 1}\nmodel: {cut_dim: 8}\n")
    assert main(["train", "--config", str(good), "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["config"]["train"]["epochs"] == 1 and obj["config"]["model"]["cut_dim"] == 8
    bad = tmp_path / "bad.yaml"
    bad.write_text("dataset: digits\ntrain: {epoch: 1}\n")
    assert main(["train", "--config", str(bad)]) == 2
    assert "train.epoch" in capsys.readouterr().err


def test_datasets_and_methods_listing(capsys):
    assert main(["datasets"]) == 0
    out = capsys.readouterr().out
    for name in ("breast-cancer", "digits", "fashion-mnist", "mnist"):
        assert name in out
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    assert "splitnn" in out and "local" in out


def test_bare_command_prints_usage_and_exits_2(capsys):
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "usage: securevfl" in err and "train" in err and err.strip().splitlines()[-1].startswith("error:")


def test_help_states_the_defaults_the_code_uses():
    from securevfl.cli import make_parser
    from securevfl.federation import DEFAULT_LR, OptimConfig
    from securevfl.models import ModelConfig
    from securevfl.training import TrainConfig

    helptext = make_parser()._subparsers._group_actions[0].choices["train"].format_help()
    helptext = " ".join(helptext.split())
    assert f"(default {TrainConfig.epochs})" in helptext and f"(default {TrainConfig.batch_size})" in helptext
    assert f"(default {ModelConfig.cut_dim})" in helptext
    assert f"{DEFAULT_LR['adam']:g} with adam, {DEFAULT_LR['sgd']:g} with sgd" in helptext
    assert OptimConfig.optimizer == "adam" and "(default adam)" in helptext


def test_sgd_gets_its_own_default_rate_and_method_params_come_from_the_cli(capsys):
    assert main(["train", "--dataset", "digits", "--optimizer", "sgd", "--epochs", "2", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["config"]["optim"]["lr"] == 0.05 and r["utility"]["test"] > 0.5
    assert main(["train", "--dataset", "digits", "--method", "risa", "--aligned-fraction", "0.3", "--epochs", "1",
                 "--method-param", "evidential=false", "--method-param", "self_training=false", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["method_info"]["risa"]["evidential"] is False
    assert main(["train", "--dataset", "digits", "--method-param", "nosuch=1"]) == 2
    assert "no parameter 'nosuch'" in capsys.readouterr().err


def test_a_run_of_very_few_steps_warns(capsys):
    assert main(["train", "--dataset", "digits", "--labeled", "200", "--epochs", "2", "--json"]) == 0
    captured = capsys.readouterr()
    r = json.loads(captured.out)
    assert r["cost"]["train_steps"] < 50 and len(r["warnings"]) == 1
    assert "warning: training ran only" in captured.err and "--epochs" in captured.err


def test_readme_advice_is_warned(capsys):
    assert main(["train", "--dataset", "digits", "--method", "fedud", "--aligned-fraction", "0.3", "--epochs", "1",
                 "--json"]) == 0
    assert "--unaligned active" in capsys.readouterr().err
    assert main(["train", "--dataset", "digits", "--method", "fedud", "--aligned-fraction", "0.3", "--epochs", "1",
                 "--unaligned", "active", "--json"]) == 0
    assert "--unaligned active" not in capsys.readouterr().err


def test_methods_answers_fast_from_a_catalog_that_matches_the_registry():
    import time

    from securevfl.configuration.catalog import DATASETS, METHODS, render
    from securevfl.data import DATASETS as DATASET_REGISTRY
    from securevfl.methods import METHODS as METHOD_REGISTRY

    assert METHODS == {n: METHOD_REGISTRY.get(n).summary for n in METHOD_REGISTRY.names()}, render()
    assert DATASETS == tuple(DATASET_REGISTRY.names()), render()
    from attacks import ATTACKS as ATTACK_REGISTRY
    from defenses import DEFENSES as DEFENSE_REGISTRY
    from securevfl.configuration.catalog import ATTACKS, DEFENSES

    assert ATTACKS == tuple(ATTACK_REGISTRY.names()), tuple(ATTACK_REGISTRY.names())
    assert DEFENSES == tuple(DEFENSE_REGISTRY.names()), tuple(DEFENSE_REGISTRY.names())
    t0 = time.perf_counter()
    code, out, _ = run_cli("methods")
    elapsed = time.perf_counter() - t0
    assert code == 0 and all(n in out for n in METHODS)
    assert elapsed < 2.0  # a fresh interpreter; < 0.5 s on an idle machine (no torch import)


def test_human_summary_names_each_attacks_own_baseline_and_the_audit_bound(capsys):
    """Issue 43: the fr summary called the mean predictor a "local-SSL baseline"; --audit printed no bound."""
    assert main(["train", "--dataset", "digits", "--attack", "fr:epochs=5", "--epochs", "1", "--max-rows", "400",
                 "--quiet"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "attack fr" in ln)
    assert "mean predictor" in line and "local-SSL" not in line
    assert main(["train", "--dataset", "breast-cancer", "--defense", "dp:noise=1", "--audit", "canaries=20",
                 "--epochs", "1", "--quiet"]) == 0
    assert "  audit: ε ≥ " in capsys.readouterr().out
