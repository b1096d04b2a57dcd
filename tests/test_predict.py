"""Saved federations (train --save), securevfl predict, regression tasks, --version and quiet output
(issue 34, SPEC §12). Data is made on the fly: per-party CSVs from scikit-learn's breast cancer."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from sklearn.datasets import load_breast_cancer, make_regression

from securevfl.cli import main
from securevfl.config import RunConfig
from securevfl.lab.compose import execute
from securevfl.lab.engine import run_sweep
from securevfl.lab.predict import predict
from securevfl.lab.store import Store
from securevfl.lab.sweep import parse_sweep
from securevfl.operations.provenance import git_commit, version


def breast_files(tmp_path, n=240):
    """FATE-style guest (id, label y, 10 features) and host (id, 20 features) files; one categorical column."""
    X, y = load_breast_cancer(return_X_y=True)
    X, y = X[:n], y[:n]
    ids = [f"e{i:04d}" for i in range(n)]
    guest = pd.DataFrame(X[:, :10], columns=[f"x{i}" for i in range(10)])
    guest.insert(0, "id", ids)
    guest.insert(1, "y", y)
    guest["band"] = np.where(X[:, 0] > np.median(X[:, 0]), "wide", "narrow")
    host = pd.DataFrame(X[:, 10:30], columns=[f"x{i}" for i in range(10, 30)])
    host.insert(0, "id", ids)
    host = host.iloc[::-1]  # another row order: predict aligns by ID
    fg, fh = tmp_path / "guest.csv", tmp_path / "host.csv"
    guest.to_csv(fg, index=False)
    host.to_csv(fh, index=False)
    return fg, fh, guest, host


def csv_cfg(fg, fh, **train) -> RunConfig:
    cfg = RunConfig(dataset="csv", method="splitnn")
    cfg.data.party_files = [str(fg), str(fh)]
    cfg.data.label_column = "y"
    cfg.train.epochs = train.get("epochs", 3)
    cfg.train.batch_size = 32
    return cfg


def test_save_predict_round_trip_and_party_folders(tmp_path, capsys):
    fg, fh, guest, host = breast_files(tmp_path)
    res = execute(csv_cfg(fg, fh), progress=False, save=tmp_path / "model")
    test_ids = res.partition.active.test_ids
    expected = res.method.trainer.predict_proba(test_ids, "test")  # the end of training's scores
    out = tmp_path / "pred.csv"
    summary = predict(tmp_path / "model", [str(fg), str(fh)], out)
    assert summary["rows_scored"] == len(guest)
    pred = pd.read_csv(out, dtype={"id": str}).set_index("id")
    assert list(pred.index) == list(guest["id"])  # the active file's order, with the ID column
    got = pred.loc[test_ids, ["proba_0", "proba_1"]].to_numpy()
    assert np.allclose(got, expected, atol=1e-6)
    from sklearn.metrics import roc_auc_score  # same rows → same score as the run reported
    y = guest.set_index("id").loc[test_ids, "y"].to_numpy()
    assert roc_auc_score(y, got[:, 1]) == pytest.approx(res.utility["test"], abs=1e-6)
    assert set(pred["prediction"]) <= {0, 1}

    # each folder: its own part only
    active, passive = tmp_path / "model" / "active", tmp_path / "model" / "passive1"
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == ["active", "passive1"]
    ma, mp = (json.loads((d / "manifest.json").read_text()) for d in (active, passive))
    assert ma["versions"]["securevfl"] == version()
    assert set(ma["sha256"]) == {"model.pt", "preprocessing.json", "manifest.json"}  # the manifest's own too
    assert [c["name"] for c in mp["columns"]] == ["id", *[f"x{i}" for i in range(10, 30)]]
    assert {"name": "band", "dtype": "category"} in ma["columns"]
    assert ma["config"]["data"]["party_files"] == [str(fg)] and mp["config"]["data"]["party_files"] == [str(fh)]
    # the passive folder holds no label: no classes, scaler of labels, head or label values
    assert not {"classes", "label_scale", "task", "n_classes"} & set(mp)
    assert not {"label_column", "task"} & set(mp["config"]["data"]) and ma["run_id"] == mp["run_id"]
    sp = torch.load(passive / "model.pt", weights_only=True)
    assert set(sp["modules"]) == {"bottom"}
    prep = json.loads((passive / "preprocessing.json").read_text())
    assert "y" not in prep["numeric_columns"] + prep["categorical_columns"] + prep["ignored_columns"]
    # the active folder holds no passive weights
    sa = torch.load(active / "model.pt", weights_only=True)
    assert set(sa["modules"]) == {"bottom", "head"}
    passive_weights = [t for t in sp["modules"]["bottom"].values() if t.numel() > 1]
    active_tensors = [t for sd in sa["modules"].values() for t in sd.values()]
    assert not any(t.shape == w.shape and torch.equal(t, w) for w in passive_weights for t in active_tensors)
    assert "x10" not in (active / "preprocessing.json").read_text()
    # a second save into the same folder is refused, not mixed
    assert main(["train", "--dataset", "csv", "--party-file", str(fg), "--party-file", str(fh), "--label-column", "y",
                 "--epochs", "1", "--save", str(tmp_path / "model"), "--json"]) == 2
    assert "already holds a saved model" in capsys.readouterr().err


def test_predict_refuses_mismatched_files(tmp_path, capsys):
    fg, fh, guest, host = breast_files(tmp_path, n=120)
    execute(csv_cfg(fg, fh, epochs=1), progress=False, save=tmp_path / "m")
    capsys.readouterr()
    bad = tmp_path / "host_bad.csv"
    host.drop(columns=["x12"]).assign(extra=1).to_csv(bad, index=False)
    args = ["predict", "--model", str(tmp_path / "m"), "--party-file", str(fg), "--out", str(tmp_path / "p.csv")]
    assert main([*args, "--party-file", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "missing 'x12'" in err[0] and "'extra'" in err[0]
    assert main(args) == 2  # one file for two parties
    assert "holds 2 parties" in capsys.readouterr().err
    text = host.astype({"x11": object})
    text.loc[text.index[3], "x11"] = "oops"
    text.to_csv(bad, index=False)
    assert main([*args, "--party-file", str(bad)]) == 2
    assert "'x11'" in capsys.readouterr().err
    model = tmp_path / "m" / "passive1" / "model.pt"  # an altered file fails its manifest's hash
    model.write_bytes(model.read_bytes() + b"\0")
    assert main([*args, "--party-file", str(fh)]) == 2
    assert "does not match its manifest's hash" in capsys.readouterr().err


def regression_files(tmp_path, n=300):
    X, y = make_regression(n_samples=n, n_features=6, n_informative=6, noise=5.0, random_state=0)
    ids = np.arange(n)
    g = pd.DataFrame(X[:, :3], columns=["a", "b", "c"]).assign(id=ids, target=y + 100.0)
    h = pd.DataFrame(X[:, 3:], columns=["d", "e", "f"]).assign(id=ids)
    fg, fh = tmp_path / "g.csv", tmp_path / "h.csv"
    g.to_csv(fg, index=False)
    h.to_csv(fh, index=False)
    return fg, fh


def test_regression_trains_saves_and_refuses_label_attacks(tmp_path, capsys):
    fg, fh = regression_files(tmp_path)
    base = ["train", "--dataset", "csv", "--party-file", str(fg), "--party-file", str(fh), "--label-column", "target",
            "--epochs", "12", "--batch-size", "32", "--json"]
    assert main([*base, "--save", str(tmp_path / "m")]) == 0
    cap = capsys.readouterr()
    r = json.loads(cap.out)
    assert "training a regression" in cap.err  # inferred from the fractional label, and said so
    u = r["utility"]
    assert u["metric"] == "r2" and u["test"] > 0.5 and {"mse", "mae"} <= set(u)
    assert r["versions"]["securevfl"] == version() and r["versions"]["commit"] == git_commit()
    assert main(["predict", "--model", str(tmp_path / "m"), "--party-file", str(fg), "--party-file", str(fh),
                 "--out", str(tmp_path / "p.parquet"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows_scored"] == 300
    pred = pd.read_parquet(tmp_path / "p.parquet")
    assert list(pred.columns) == ["id", "prediction", "scored_by"]
    assert abs(pred["prediction"].mean() - 100) < 20  # label scale
    for extra, needle in ((["--attack", "norm"], "attack norm infers class labels"),
                          (["--defense", "rr:1"], "defense rr re-draws class labels"),
                          (["--method", "fedud"], "method fedud trains on class labels")):
        assert main([*base, "--task", "regression", *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("error:") and needle in err[-1]
    assert main(["train", "--dataset", "digits", "--task", "regression", "--epochs", "1"]) == 2
    assert "has class labels" in capsys.readouterr().err


def test_version_and_quiet_json(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip().startswith(f"securevfl {version()}")
    fg, fh, *_ = breast_files(tmp_path, n=120)
    assert main(["train", "--dataset", "csv", "--party-file", str(fg), "--party-file", str(fh), "--label-column", "y",
                 "--epochs", "1", "--json", "--progress", "--quiet"]) == 0
    cap = capsys.readouterr()
    assert len(cap.out.strip().splitlines()) == 1 and json.loads(cap.out)["versions"]["securevfl"] == version()
    assert "warning" not in cap.err  # --quiet: no progress and no warnings, even with --progress


@pytest.mark.slow
def test_he_save_predict_keeps_shares_apart_and_no_keys(tmp_path):
    """Under CKKS each party saves its own weight share (never a key); predict makes fresh keys and
    the shares still give the end of training's scores (up to CKKS noise)."""
    fg, fh, guest, host = breast_files(tmp_path, n=160)
    cfg = csv_cfg(fg, fh, epochs=1)
    cfg.he = "ckks"
    res = execute(cfg, progress=False, save=tmp_path / "m")
    test_ids = res.partition.active.test_ids
    expected = res.method.trainer.predict_proba(test_ids, "test")
    predict(tmp_path / "m", [str(fg), str(fh)], tmp_path / "p.csv")
    got = pd.read_csv(tmp_path / "p.csv", dtype={"id": str}).set_index("id").loc[test_ids, ["proba_0", "proba_1"]]
    assert np.allclose(got.to_numpy(), expected, atol=1e-3)
    sa = torch.load(tmp_path / "m" / "active" / "model.pt", weights_only=True)
    sp = torch.load(tmp_path / "m" / "passive1" / "model.pt", weights_only=True)
    # each side its own share (V or R), its own optimizer state and its own secret mixing (HE's default);
    # the active party also its public |W_P| running bound; a rescale exponent where one happened
    assert [{"V", "b", "mix"} <= set(e) <= {"V", "b", "mix", "bound", "scale_exp"} for e in sa["cut_ends"]] == [True]
    assert [{"R", "b", "mix"} <= set(e) <= {"R", "b", "mix", "scale_exp"} for e in sp["cut_ends"]] == [True]
    for folder in ("active", "passive1"):
        text = "".join((tmp_path / "m" / folder / f).read_text() for f in ("manifest.json", "preprocessing.json"))
        assert "secret" not in text.lower() and "key" not in text.lower()


def test_sweep_save_key_saves_the_chosen_cells(tmp_path):
    fg, fh, *_ = breast_files(tmp_path, n=120)
    data = {"name": "s", "dataset": {"name": "csv", "party_files": [[str(fg), str(fh)]], "label_column": "y"},
            "methods": ["splitnn", "local"], "train": {"epochs": 1}, "save": {"dir": str(tmp_path / "models"),
                                                                              "methods": ["splitnn"]}}
    cells = parse_sweep(data).cells
    assert [c.save is not None for c in cells] == [True, False]  # only the chosen cells save
    assert cells[0].run_id == parse_sweep({**data, "save": None}).cells[0].run_id  # saving is no new run
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump(data))
    counts = run_sweep(str(sweep), str(tmp_path / "s.sqlite"), 1, "local", progress=False)
    assert counts["ok"] == 2
    saved = tmp_path / "models" / cells[0].run_id
    assert sorted(p.name for p in saved.iterdir()) == ["active", "passive1"]
    rows = Store(tmp_path / "s.sqlite").rows()
    assert {r["version"] for r in rows} == {version()}  # the version is a store column
