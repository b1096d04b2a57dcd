"""Every method serves after training (issue 63): ``train --save`` then ``predict`` for each method, and the
predictions on the training run's own test rows reproduce the utility it reported; every row of the
active party's file is scored, each marked with the path that scored it (securevfl/scoring.py).

Data is made on the fly: scikit-learn's breast cancer, split FATE-style into a guest (the active party,
every row, the label) and a host that holds 200 of the 300 rows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.datasets import load_breast_cancer

from securevfl.config import RunConfig
from securevfl.lab.compose import execute
from securevfl.lab.predict import predict
from securevfl.metrics import utility

N, HOST_ROWS = 300, 200


@pytest.fixture(scope="module")
def frames() -> tuple[pd.DataFrame, pd.DataFrame]:
    X, y = load_breast_cancer(return_X_y=True)
    X, y = X[:N], y[:N]
    ids = [f"c{i:04d}" for i in range(N)]
    guest = pd.DataFrame(X[:, :10], columns=[f"x{i}" for i in range(10)])
    guest.insert(0, "id", ids)
    guest.insert(1, "y", y)
    host = pd.DataFrame(X[:, 10:30], columns=[f"x{i}" for i in range(10, 30)])
    host.insert(0, "id", ids)
    return guest, host.iloc[:HOST_ROWS].iloc[::-1]  # the host lacks 100 rows, and lists its own in another order


def _write(tmp_path, guest: pd.DataFrame, host: pd.DataFrame, tag: str) -> tuple[str, str]:
    fg, fh = tmp_path / f"guest-{tag}.csv", tmp_path / f"host-{tag}.csv"
    guest.to_csv(fg, index=False)
    host.to_csv(fh, index=False)
    return str(fg), str(fh)


def _cfg(files: tuple[str, str], method: str, **params) -> RunConfig:
    cfg = RunConfig(dataset="csv", method=method)
    cfg.data.party_files = list(files)
    cfg.data.label_column = "y"
    cfg.train.epochs = 2
    cfg.train.batch_size = 32
    cfg.method_params = dict(params)
    if method.startswith("fed") and method != "fedud":  # short pre-training
        cfg.method_params.setdefault("ssl_epochs", 1)
    return cfg


def _reproduces(tmp_path, frames, method: str, **params) -> tuple[object, pd.DataFrame]:
    """Train with --save, score the training run's test rows (written as new files), and check the
    predictions give the reported test utility; returns the run and the predictions."""
    guest, host = frames
    files = _write(tmp_path, guest, host, "train")
    res = execute(_cfg(files, method, **params), progress=False, save=tmp_path / "model")
    test_ids = np.asarray(res.partition.active.test_ids)
    new = _write(tmp_path, guest[guest["id"].isin(test_ids)], host[host["id"].isin(test_ids)], "new")
    summary = predict(tmp_path / "model", list(new) if method != "local" else [new[0]], tmp_path / "pred.csv")
    pred = pd.read_csv(tmp_path / "pred.csv", dtype={"id": str}).set_index("id")
    assert summary["rows_scored"] == len(test_ids) == len(pred)
    probs = pred.loc[test_ids, ["proba_0", "proba_1"]].to_numpy()
    y = guest.set_index("id").loc[test_ids, "y"].to_numpy()
    got = utility(probs, y, 2)
    assert got["auc"] == pytest.approx(res.utility["auc"], abs=1e-6), method
    assert got["accuracy"] == pytest.approx(res.utility["accuracy"], abs=1e-9), method
    return res, pred


@pytest.mark.parametrize("method", ["fedhssl", "fedgssl", "risa", "local-vfl", "entity-aug", "local", "splitnn"])
def test_saved_model_reproduces_the_reported_utility(tmp_path, frames, method) -> None:
    res, pred = _reproduces(tmp_path, frames, method)
    held = set(frames[1]["id"])
    if method == "local":
        assert set(pred["scored_by"]) == {"active-only"}
    else:  # these methods test on aligned rows: every test row is scored through the federation
        assert set(pred["scored_by"]) == {"federated"} and set(pred.index) <= held


def test_fedud_scores_the_hosts_rows_by_rep_as_its_evaluation_did(tmp_path, frames) -> None:
    """FedUD's saved host scores the rows no guest holds by its paper's host-only path, Rep(h_H) standing in
    for the guest: the very scores the trained run's evaluation path for unaligned rows gives them
    (``SplitTrainer.predict_proba_alone`` with Rep); with the guest's part absent instead (zeros) they
    differ, so the check can fail. (A file-based run tests on aligned rows: _reproduces checks those.)"""
    from securevfl.training import SplitTrainer

    _reproduces(tmp_path, frames, "fedud")
    guest, host = frames
    files = _write(tmp_path, guest, host, "all")
    res = execute(_cfg(files, "fedud"), progress=False, save=tmp_path / "all")
    summary = predict(tmp_path / "all", list(files), tmp_path / "p.csv")
    assert summary["scored_by"] == {"federated": HOST_ROWS, "fedud-rep": N - HOST_ROWS}
    pred = pd.read_csv(tmp_path / "p.csv", dtype={"id": str}).set_index("id")
    missing = np.asarray(pred.index[pred["scored_by"] == "fedud-rep"])
    assert set(missing).isdisjoint(set(host["id"]))
    got = pred.loc[missing, ["proba_0", "proba_1"]].to_numpy()
    by_rep = res.method.trainer.predict_proba_alone(missing, "train")  # the host's own rows (its training split)
    absent = SplitTrainer(res.federation, res.config.train, 0).predict_proba_alone(missing, "train")
    assert np.allclose(got, by_rep, atol=1e-6) and not np.allclose(got, absent, atol=1e-3)


def test_every_customer_is_scored_and_marked(tmp_path, frames, capsys) -> None:
    """The whole files: the host lacks 100 customers; the RISA family scores them by its imputation path, splitnn by
    the active party's part alone; --federated-only leaves them out (and says so)."""
    guest, host = frames
    files = _write(tmp_path, guest, host, "all")
    # local-vfl: the imputation path through the interactive layer (RISA's evidential heads read plain blocks)
    for method, path in (("risa", "risa-imputation"), ("local-vfl", "risa-imputation"), ("splitnn", "active-only")):
        execute(_cfg(files, method), progress=False, save=tmp_path / method)
        summary = predict(tmp_path / method, list(files), tmp_path / f"{method}.csv")
        assert summary["scored_by"] == {"federated": HOST_ROWS, path: N - HOST_ROWS}
        pred = pd.read_csv(tmp_path / f"{method}.csv", dtype={"id": str})
        assert list(pred["id"]) == list(guest["id"])  # the active file's order
        alone = pred[pred["scored_by"] == path]
        assert set(alone["id"]) == set(guest["id"]) - set(host["id"])
        assert np.allclose(alone[["proba_0", "proba_1"]].sum(axis=1), 1.0, atol=1e-5)
        assert path in capsys.readouterr().err
        only = predict(tmp_path / method, list(files), tmp_path / f"{method}-fed.csv", federated_only=True)
        assert only["scored_by"] == {"federated": HOST_ROWS}
        assert "were not scored (--federated-only)" in capsys.readouterr().err


def test_risa_stand_in_is_the_hosts_output_on_its_mean_row(tmp_path, frames) -> None:
    """A row the host lacks scores as the paper's imputed sample [x_k, μ_j]: recomputed from the trained
    federation (the host's kept mean row through its bottom model, the guest's own block, RISA's fused
    opinion), it equals the saved model's score; with the host's block absent (zeros) it does not, so
    the check can fail."""
    import torch

    guest, host = frames
    files = _write(tmp_path, guest, host, "all")
    res = execute(_cfg(files, "risa"), progress=False, save=tmp_path / "risa")
    predict(tmp_path / "risa", list(files), tmp_path / "p.csv")
    pred = pd.read_csv(tmp_path / "p.csv", dtype={"id": str}).set_index("id")
    missing = np.asarray(pred.index[pred["scored_by"] == "risa-imputation"])
    a, h = res.federation.active, res.federation.passives[0]
    mu = h.extra_modules["imputation"].row
    assert len(missing) == N - HOST_ROWS and float(mu.abs().sum()) > 0
    with torch.no_grad():
        a.bottom.eval()
        a.head.eval()
        own = a.bottom(a.features(missing, "train"))  # the guest's own rows (its labeled rows outside the overlap)
        for stand_in in (h.bottom.eval()(mu[None]), torch.zeros(1, a.passive_widths[0])):
            probs = res.method.trainer.proba(a.head(torch.cat([own, stand_in.expand(len(missing), -1)], 1))).numpy()
            same = np.allclose(probs, pred.loc[missing, ["proba_0", "proba_1"]].to_numpy(), atol=1e-5)
            assert same == (float(stand_in.abs().sum()) > 0)


def test_label_only_host_saves_and_scores(tmp_path, frames) -> None:
    """Entity Augmentation with its paper's label-only host: the host's folder keeps the head alone, the
    guest's test rows reproduce the run's utility, and a row no guest holds is marked ``no-features``."""
    guest, host = frames
    files = _write(tmp_path, guest, host, "all")
    cfg = _cfg(files, "entity-aug")
    cfg.partition.active_features = False
    res = execute(cfg, progress=False, save=tmp_path / "model")
    test_ids = np.asarray(res.partition.active.test_ids)
    new = _write(tmp_path, guest[guest["id"].isin(test_ids)], host[host["id"].isin(test_ids)], "new")
    predict(tmp_path / "model", list(new), tmp_path / "pred.csv")
    pred = pd.read_csv(tmp_path / "pred.csv", dtype={"id": str}).set_index("id")
    y = guest.set_index("id").loc[test_ids, "y"].to_numpy()
    assert utility(pred.loc[test_ids, ["proba_0", "proba_1"]].to_numpy(), y, 2)["auc"] == pytest.approx(
        res.utility["auc"], abs=1e-6)
    summary = predict(tmp_path / "model", list(files), tmp_path / "all.csv")
    assert summary["scored_by"] == {"federated": HOST_ROWS, "no-features": N - HOST_ROWS}


@pytest.mark.parametrize("method", ["fedud", "risa", "fedhssl", "entity-aug"])
def test_deployed_save_and_predict_per_method(method, tmp_path) -> None:
    """Across processes (gRPC, mutual TLS; the passive party in a thread here): train --peer --save, then
    predict --peer while the passive party serves its own saved part (party --model), laying out its models
    as the method's training ended them and answering the method's scoring operations only (RISA's stand-in).
    The predictions equal the in-process predict of the same folders, byte for byte, path column included."""
    import shutil

    pytest.importorskip("grpc")
    from securevfl.deploy import train_deployed
    from securevfl.lab.predict import predict_deployed
    from securevfl.party_settings import PERMISSIONS, PartySettings
    from securevfl.roles import seed_for
    from tests.test_roles import agreed, cfg_for, one_passive
    from tests.test_roles import files as roles_files

    files = roles_files.__wrapped__(_Factory(tmp_path))  # the roles fixture's files (guest rows the host lacks)
    cfg = cfg_for(files, method, "guest")
    own = PartySettings(seed=seed_for(5, 1), model=agreed(cfg), allow=frozenset(PERMISSIONS))
    status: list = []
    with one_passive(files, status, save=str(tmp_path / "passive-side"), own=own) as (active, peers):
        train_deployed(cfg, active, peers, progress=False, save=str(tmp_path / "active-side"))
    together = tmp_path / "model"
    shutil.copytree(tmp_path / "active-side" / "active", together / "active")
    shutil.copytree(tmp_path / "passive-side" / "passive1", together / "passive1")
    local = predict(together, [str(files["guest"]), str(files["host"])], tmp_path / "local.csv")
    with one_passive(files, status, model=str(tmp_path / "passive-side"), own=own) as (active, peers):
        remote = predict_deployed(tmp_path / "active-side", str(files["guest"]), tmp_path / "remote.csv", active, peers)
    assert status == [0, 0]
    assert remote["scored_by"] == local["scored_by"] and len(local["scored_by"]) == 2  # rows the host lacks too
    assert (tmp_path / "remote.csv").read_text() == (tmp_path / "local.csv").read_text()


class _Factory:
    """tmp_path_factory's one method the roles fixture calls."""

    def __init__(self, root) -> None:
        self.root = root

    def mktemp(self, name: str):
        path = self.root / name
        path.mkdir()
        return path
