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
    assert obj["privacy"] == {"epsilon": None, "delta": None, "mechanism": "none"}
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
    ([], "required"),
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
    import securevfl.data.builtin as b

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
