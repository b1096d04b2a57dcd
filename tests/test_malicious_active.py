"""Issue 60: a malicious active party steers a deployed passive party. Each attack is written as the
active party on the project's own transport (gRPC, mutual TLS, the passive party in a thread with its
own channel); each fails against the passive party's defaults now, and a control shows it works where
the passive party accepts what is asked (the old behaviour)."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("grpc")

from attacks.feature.fr import r2_per_feature  # noqa: E402
from attacks.feature.init_inversion import first_training_batch  # noqa: E402
from attacks.feature.sign_probe import best_r2, recover  # noqa: E402
from securevfl import deploy  # noqa: E402
from securevfl import serve as serve_mod  # noqa: E402
from securevfl.channel import MessageKind  # noqa: E402
from securevfl.channel.codec import encode_batch_request  # noqa: E402
from securevfl.errors import UserError  # noqa: E402
from securevfl.methods.splitnn import SplitNN  # noqa: E402
from securevfl.party_settings import PartySettings, settings_digest  # noqa: E402
from securevfl.policy import RequestLimits  # noqa: E402
from securevfl.runtime import handles  # noqa: E402
from tests.test_grpc import Passive, small_cfg  # noqa: E402
from tests.test_grpc import deploy as deploy_run  # noqa: E402
from tests.test_grpc import files as grpc_files  # noqa: E402

files = grpc_files

FR_FIGURE = 0.38
"""docs/threat-model.md: the bound on what the active party reconstructs of a passive feature."""


def _old_limits(settings, method, hello, resumes=False) -> RequestLimits:
    """The control: the passive party's limits before issue 60 (no state-operation budget, any rate,
    any batch size above zero)."""
    return RequestLimits(settings.max_requests, settings.max_rate,
                         {} if method is None else type(method).passive_permissions, settings.allow)


@pytest.fixture
def ground_truth(monkeypatch) -> dict:
    """The passive party's encoded rows, for scoring only (the adversary never reads this)."""
    captured: dict = {}
    real = serve_mod.build_passive

    def capture(data, *a, **kw):
        captured["data"] = data
        return real(data, *a, **kw)

    monkeypatch.setattr(serve_mod, "build_passive", capture)
    return captured


def _steering(monkeypatch, out: dict) -> None:
    """The active party's program becomes the sign probe (tests only: a hostile organisation's code)."""

    def steer(self, fed) -> None:
        ep, h = fed.active.endpoint, handles(fed)[0]
        rows = np.asarray(fed.active.aligned_ids)
        pair = rows[:2]
        tag = h.snapshot()

        def probe(c: float) -> np.ndarray:
            h.restore(tag)  # the fresh weights and Adam's fresh moments
            ep.send(h.name, MessageKind.CONTROL, encode_batch_request("train", True))
            ep.send_ids(h.name, MessageKind.BATCH_IDS, pair)
            t = ep.recv_tensor(h.name, MessageKind.ACTIVATION).double().numpy().ravel()
            # ∂L/∂t chosen so that ∂L/∂z = (1, −c) after the passive party's tanh backward
            grad = np.array([1.0, -c]) / np.maximum(1.0 - t ** 2, 1e-12)
            import torch

            ep.send_tensor(h.name, MessageKind.GRADIENT, torch.from_numpy(grad.reshape(2, 1)).float())
            ep.send(h.name, MessageKind.CONTROL, encode_batch_request("train", False))
            ep.send_ids(h.name, MessageKind.BATCH_IDS, rows)
            t_all = ep.recv_tensor(h.name, MessageKind.ACTIVATION).double().numpy().ravel()
            z = np.arctanh(np.clip(t_all, -1 + 1e-7, 1 - 1e-7))
            out.setdefault("outputs", []).append(z)
            return z

        out["rows"] = rows
        try:
            out["jumps"], out["probes"] = recover(probe, tol=1e-4)
        finally:
            out.setdefault("jumps", [])

    monkeypatch.setattr(SplitNN, "train", steer)
    monkeypatch.setattr(SplitNN, "evaluate", lambda self, fed: {})


def _attack_cfg():
    return dict(model__hidden=(), model__cut_dim=1, optim__lr=0.05, train__batch_size=32)


@pytest.mark.parametrize("pinned", [False, True])
@pytest.mark.parametrize("case", ["control: old limits", "defaults", "linear bottom allowed",
                                  "linear bottom allowed, 3-rate search"])
def test_gradient_steering_recovers_no_feature(files, monkeypatch, ground_truth, case, pinned) -> None:
    """The sign probe (one restore, one two-row step with a chosen gradient, one inference batch, ~300
    times): against the old limits it recovers every passive feature of every aligned row (R² ≥ 0.99,
    the control); against a passive party on its defaults the run is refused before any activation
    moves (its own bottom model is not the linear one asked for); against one that even runs that very
    bottom (``--allow linear-bottom``, its own linear model, Adam at 0.05), the first restore beyond what
    the run's settings need is refused and nothing is recovered. Pinning the run's settings digest
    (``--expect-settings``) changes nothing in either direction: the digest names what was asked, not
    how the active party then behaves."""
    out: dict = {}
    _steering(monkeypatch, out)
    cfg = small_cfg(files, "guest", **_attack_cfg())
    allow = frozenset({"linear-bottom"})
    own = PartySettings(seed=1) if case == "defaults" else PartySettings(seed=1, allow=allow)
    if case.endswith("search"):  # a learning-rate search of 3 rates: the run needs 1 snapshot and 4 restores
        cfg.train.lr_grid = [0.01, 0.05, 0.1]
    if case == "control: old limits":
        monkeypatch.setattr(serve_mod, "run_limits", _old_limits)
    if pinned:
        desc = deploy.planned_descriptions(cfg, {"passive1": "x"})["passive1"]
        own.expect_settings = settings_digest(desc)
    p = Passive(files, own=own)
    if case != "defaults":
        p.agree(cfg)  # this passive party configured the linear bottom itself
    p._own_model = True  # what it configured stays (defaults: securevfl party's own defaults)
    if case == "control: old limits":
        deploy_run(files, cfg, [p])
        p.close()
        r2 = best_r2(out["jumps"], ground_truth["data"].rows(out["rows"], "train"))
        print(f"sign probe, old limits: {out['probes']} probes, R² min {r2.min():.4f} mean {r2.mean():.4f}")
        assert r2.min() >= 0.99, r2
        assert out["probes"] < 2_000
        return
    with pytest.raises(UserError) as e:
        deploy_run(files, cfg, [p])
    p.close()
    assert p.status == 2
    if case == "defaults":
        assert "asked for model." in str(e.value) and "are its own" in str(e.value)
        assert "rows" not in out  # refused before its program ran: no activation left the party
    elif case == "linear bottom allowed":
        assert "'snapshot' 1 times" in str(e.value) and "need at most 0" in str(e.value)
        assert "outputs" not in out
    else:
        assert "'restore' 5 times" in str(e.value) and "need at most 4" in str(e.value)
        # the adversary's best try on what it received: every output and every difference of two
        outputs = out["outputs"]
        assert len(outputs) == 4
        cands = [*outputs, *(a - b for i, a in enumerate(outputs) for b in outputs[:i])]
        r2 = best_r2(cands, ground_truth["data"].rows(out["rows"], "train"))
        print("sign probe within the budget: best R² per feature", np.round(r2, 3))
        # a linear bottom the passive party allowed itself, with a rate search: the 4 probes the search
        # needs read at most a feature or two exactly (measured: 1 of 10), against all 10 without the budget
        assert int((r2 >= 0.99).sum()) <= 2, r2


def test_the_active_party_cannot_pick_the_passive_columns(files, tmp_path, ground_truth, capsys) -> None:
    """Issue 60's stock-CLI attack: ``train --peer ... --drop-columns <every passive column but one>
    --batch-size 1000`` read that column from the first activation message (R² 0.975 with the default
    model, 1.000 with ``--cut 1 --cut-dim 1``). A passive party on
    its defaults now refuses the run (its columns are its own) before any row moves; the control, a
    passive party that dropped those columns itself and allows a linear bottom, shows the leak is real:
    R² ≥ 0.97 on the kept column from the active party's own view."""
    from securevfl.cli import main

    host_cols = [f"x{i}" for i in range(10, 20)]
    dropped = ",".join(c for c in host_cols if c != "x13")
    p = Passive(files, own=PartySettings(seed=1))
    p._own_model = True  # securevfl party on its defaults
    code = main(["train", "--dataset", "csv", "--party-file", str(files["guest"]), "--label-column", "y",
                 "--peer", f"passive1={p.addr}", "--tls", str(files["certs"] / "active"), "--epochs", "1",
                 "--drop-columns", dropped, "--batch-size", "1000",
                 "--record-view", str(tmp_path / "view"), "--json"])
    p.close()
    err = capsys.readouterr().err
    assert code == 2 and p.status == 2
    assert "data.drop_columns" in err and "refused" in err
    assert not any("activation" in f.name for f in (tmp_path / "view").rglob("*"))
    # the control: the same run against a passive party that agreed to exactly this
    cfg = small_cfg(files, "guest", data__drop_columns=dropped.split(","), model__cut=1, model__cut_dim=1,
                    train__batch_size=1000)
    p = Passive(files, own=PartySettings(seed=1, allow=frozenset({"linear-bottom"})))
    r = deploy_run(files, cfg, [p])
    p.close()
    ids, t = first_training_batch(r["_channel"].transcript, "active", "passive1")
    z = np.arctanh(np.clip(t.astype(np.float64), -1 + 1e-7, 1 - 1e-7))
    truth = ground_truth["data"].rows(ids, "train")
    assert truth.shape[1] == 1  # only x13 entered its bottom model
    fit = np.c_[z, np.ones_like(z)]  # the best affine read-out of the column from the first message
    r2 = r2_per_feature(fit @ np.linalg.lstsq(fit, truth, rcond=None)[0], truth)
    print(f"one column through the data options, control: R² {r2:.4f}")
    assert r2 >= 0.97


@pytest.mark.parametrize("lr", [math.nan, math.inf, -1.0, 1e30, 0.0123])
def test_set_lr_from_the_wire_is_checked(files, monkeypatch, lr) -> None:
    """``set_lr`` with NaN, inf, a negative rate, 1e30, or a rate outside the passive party's own grid is
    refused (one line on both sides); the control is a rate of its own grid, which is taken."""
    from securevfl.parties import PassiveParty

    grid = [0.001, 0.01]
    applied: list = []
    real = PassiveParty.set_lr
    monkeypatch.setattr(PassiveParty, "set_lr", lambda self, rate: (applied.append(rate), real(self, rate))[1])

    def program(self, fed) -> None:
        h = handles(fed)[0]
        for rate in (lr, grid[1]):
            h.set_lr(rate)

    monkeypatch.setattr(SplitNN, "train", program)
    monkeypatch.setattr(SplitNN, "evaluate", lambda self, fed: {})
    cfg = small_cfg(files, "guest", train__lr_grid=grid)
    p = Passive(files, own=PartySettings(seed=1))
    with pytest.raises(UserError, match="learning rate"):
        deploy_run(files, cfg, [p])
    p.close()
    assert p.status == 2 and applied == []  # the run ended at the bad rate: nothing was applied


def test_a_rate_of_its_own_grid_is_taken(files, monkeypatch) -> None:
    """The control of the test above: the passive party takes a rate of its own grid."""
    def program(self, fed) -> None:
        handles(fed)[0].set_lr(0.01)

    monkeypatch.setattr(SplitNN, "train", program)
    monkeypatch.setattr(SplitNN, "evaluate", lambda self, fed: {})
    p = Passive(files, own=PartySettings(seed=1))
    deploy_run(files, small_cfg(files, "guest", train__lr_grid=[0.001, 0.01]), [p])
    p.close()
    assert p.status == 0


def test_limits_in_isolation() -> None:
    """The rules themselves: rates, the state-operation budget, the training-batch floor."""
    lim = RequestLimits(10, 0, state_budget={"restore": 2}, rates=[0.01], max_lr=1.0, batch_size=64,
                        min_batch_fraction=0.25)
    for bad in (math.nan, math.inf, -1, 0, 2.0, 0.02, "0.01", True):
        with pytest.raises(UserError):
            lim.learning_rate(bad)
    assert lim.learning_rate(0.01) == 0.01
    lim.operation("restore")
    lim.operation("restore")
    with pytest.raises(UserError, match="need at most 2"):
        lim.operation("restore")
    with pytest.raises(UserError, match="need at most 0"):
        lim.operation("reset_optimizer")
    # an epoch: full batches, then its short last one; the next epoch again
    for n in (64, 64, 5, 64, 64, 5):
        lim.training_batch(np.arange(n))
    with pytest.raises(UserError, match="training batch of 2 rows"):
        lim.training_batch(np.arange(2))  # a short batch after a short one (other rows)
    small = RequestLimits(10, 0, batch_size=64, min_batch_fraction=0.25)
    for _ in range(3):  # an epoch of one short batch (fewer rows than the floor), repeated: allowed
        small.training_batch(np.array([4, 2, 9]))
    open_ = RequestLimits(10, 0)  # the simulator's: nothing checked
    open_.operation("restore")
    open_.training_batch(np.arange(1))


def test_honest_runs_fit_their_budget() -> None:
    """The budget a method declares covers what an honest run of it asks, with and without a rate
    search (the counts measured in the simulator for every per-role method: one snapshot, k + 1 restores
    and k + 1 rates per searched stage)."""
    from securevfl.configuration.options import OptimConfig
    from securevfl.methods import METHODS, MethodContext
    from securevfl.models import ModelConfig
    from securevfl.training import TrainConfig

    measured = {"splitnn": {"snapshot": 1, "restore": 4, "set_lr": 4},
                "fedud": {"snapshot": 2, "restore": 8, "set_lr": 8, "reset_optimizer": 1},
                "risa": {"snapshot": 3, "restore": 9, "set_lr": 8, "reset_optimizer": 1},
                "fedhssl": {"reset_optimizer": 1, "snapshot": 1, "restore": 4, "set_lr": 4}}
    for name, counts in measured.items():
        m = METHODS.get(name)(MethodContext(train=TrainConfig(lr_grid=[0.001, 0.003, 0.01]), model=ModelConfig(),
                                            optim=OptimConfig(), seed=0, params={}, progress=False))
        budget = m.state_budget()
        for op, n in counts.items():
            assert budget[op] >= n, (name, op)
        assert budget["restore"] <= 10  # not thousands


def test_a_serving_party_refusal_reaches_the_active_party_at_once(files) -> None:
    """A ``--serve-forever`` party refuses a run: the active party hears the reason at once (not after its
    timeout), and the party goes on to serve the next run. The bound (10 s) is a third of the active
    party's wait for a peer (30 s), so a lost refusal fails this test."""
    import threading
    import time

    from securevfl.channel.grpc import GrpcChannel, NetConfig, TLSFiles
    from securevfl.deploy import serve, train_deployed
    from securevfl.passive_own import from_run

    good = small_cfg(files, "guest")
    own = PartySettings(seed=1, model=from_run(good.model, good.optim, good.train.lr_grid, good.data))
    ch = GrpcChannel("passive1", NetConfig(TLSFiles.load(files["certs"] / "passive1", "passive1"), timeout=30.0),
                     listen="127.0.0.1:0", client="active")
    statuses: list = []
    t = threading.Thread(target=lambda: statuses.append(serve(ch, str(files["host"]), "id", serve_forever=True,
                                                              own=own)), daemon=True)
    t.start()
    peers = {"passive1": f"127.0.0.1:{ch.port}"}
    try:
        for _ in range(2):  # twice: the second refusal comes from the same serving process
            active = GrpcChannel("active", NetConfig(TLSFiles.load(files["certs"] / "active", "active"), timeout=30.0),
                                 peers=peers)
            t0 = time.perf_counter()
            with pytest.raises(UserError, match="are its own"):
                train_deployed(small_cfg(files, "guest", **_attack_cfg()), active, peers, progress=False)
            assert time.perf_counter() - t0 < 10.0
            active.close()
        active = GrpcChannel("active", NetConfig(TLSFiles.load(files["certs"] / "active", "active"), timeout=30.0),
                             peers=peers)
        assert "utility" in train_deployed(good, active, peers, progress=False)  # and it still serves
        active.close()
    finally:
        ch.close()


def test_a_non_finite_gradient_is_refused(files, monkeypatch) -> None:
    """A training step whose returned gradient holds NaN (or inf) would destroy the passive model: refused,
    nothing applied. The control: the same step with a finite gradient is applied."""
    import torch

    from securevfl.parties import PassiveParty

    applied: list = []
    real = PassiveParty.backward

    def spy(self, grad):
        real(self, grad)
        applied.append(True)

    monkeypatch.setattr(PassiveParty, "backward", spy)
    for value, refused in ((float("nan"), True), (float("inf"), True), (0.5, False)):
        def program(self, fed, value=value) -> None:
            ep, h = fed.active.endpoint, handles(fed)[0]
            rows = np.asarray(fed.active.aligned_ids)[:32]
            ep.send(h.name, MessageKind.CONTROL, encode_batch_request("train", True))
            ep.send_ids(h.name, MessageKind.BATCH_IDS, rows)
            t = ep.recv_tensor(h.name, MessageKind.ACTIVATION)
            ep.send_tensor(h.name, MessageKind.GRADIENT, torch.full_like(t, value))

        monkeypatch.setattr(SplitNN, "train", program)
        monkeypatch.setattr(SplitNN, "evaluate", lambda self, fed: {})
        applied.clear()
        p = Passive(files, own=PartySettings(seed=1))
        if refused:
            with pytest.raises(UserError, match="non-finite"):
                deploy_run(files, small_cfg(files, "guest"), [p])
        else:
            deploy_run(files, small_cfg(files, "guest"), [p])
        p.close()
        assert (applied == []) == refused and p.status == (2 if refused else 0)


def test_party_config_file_and_flags(tmp_path, capsys) -> None:
    """``securevfl party --config party.yaml``: only a passive party's own keys; flags override the file; a
    linear bottom needs --allow linear-bottom (each mistake: exit 2, one line)."""
    from securevfl.cli import main

    f = tmp_path / "p.csv"
    f.write_text("id,a\n1,2\n")
    base = ["doctor", "party", "--role", "passive1", "--listen", "127.0.0.1:0", "--party-file", str(f), "--insecure"]
    cases = {"train:\n  epochs: 3\n": "train.epochs is not a passive party's own setting",
             "head: {}\n": "unknown section 'head'",
             "model:\n  hidden: []\n": "no hidden non-linearity",
             "optim:\n  lr: -1\n": "optim.lr",
             "model:\n  hidden: [32]\n  cut_dim: 8\noptim:\n  lr: 0.01\ntrain:\n  lr_grid: [0.01, 0.03]\n": None}
    for text, needle in cases.items():
        cfg = tmp_path / "party.yaml"
        cfg.write_text(text)
        code = main([*base, "--config", str(cfg)])
        err = capsys.readouterr().err
        if needle is None:
            assert "error:" not in err, err
        else:
            assert code == 2 and needle in err, (text, err)
    code = main([*base, "--hidden", "", "--allow", "linear-bottom"])
    assert "error:" not in capsys.readouterr().err
    code = main([*base, "--cut", "1"])
    assert code == 2 and "no hidden non-linearity" in capsys.readouterr().err
    from securevfl.cli import make_parser  # the flags parse into the party's own model
    from securevfl.passive_own import from_args

    cfg = tmp_path / "party.yaml"
    cfg.write_text("model:\n  hidden: [32]\n  cut_dim: 8\n")
    args = make_parser().parse_args(["party", "--role", "passive1", "--listen", "x:1", "--party-file", str(f),
                                      "--config", str(cfg), "--cut-dim", "16", "--lr-grid", "0.01,0.1",
                                      "--drop-columns", "a,b"])
    own = from_args(args)
    assert own.model.hidden == (32,) and own.model.cut_dim == 16 and own.train.lr_grid == [0.01, 0.1]
    assert own.data.drop_columns == ["a", "b"]


def test_sign_probe_in_the_lab_with_its_control() -> None:
    """``--attack sign-probe`` in the simulator: on a linear bottom it reads every passive feature back
    (R² ≥ 0.95, its chance-alignment control ≤ 0.1); with a deployed passive party's own limits in place
    (``limits=true``) it is refused at its first snapshot and recovers nothing."""
    from securevfl.config import RunConfig
    from securevfl.lab.compose import execute

    out = {}
    for limits in (False, True):
        cfg = RunConfig()
        cfg.dataset, cfg.method, cfg.seed = "breast-cancer", "splitnn", 1
        cfg.train.epochs, cfg.model.hidden, cfg.model.cut_dim = 1, (), 1
        cfg.attacks = [f"sign-probe:limits={str(limits).lower()},rows=128"]
        out[limits] = execute(cfg, progress=False).to_json()["attacks"]["sign-probe"]
    assert out[False]["value"] >= 0.95 and out[False]["control"] <= 0.1, out[False]
    assert out[True]["value"] == 0.0 and "snapshot" in out[True]["refused"]


@pytest.mark.parametrize("steered", [False, True])
def test_a_deployed_passive_partys_own_detector_stops_a_steered_gradient(files, monkeypatch, steered) -> None:
    """The passive party's own ``gradient-guard:action=stop`` (docs/defenses.md, "Detecting steered
    gradients"): the active party returns gradients of rank 2 (what a two-class head returns) for four
    steps, then, steered, one of full rank (what a discriminator returns, FSHA). The party ends the run
    at that step with one line on both sides; the control, rank 2 throughout, runs to the end."""
    import torch

    def program(self, fed) -> None:
        ep, h = fed.active.endpoint, handles(fed)[0]
        rows = np.asarray(fed.active.aligned_ids)
        gen = torch.Generator().manual_seed(0)
        basis = torch.randn(2, 8, generator=gen)  # the head's weights W_Pᵀ: a fixed 2-dim subspace
        for step in range(6):
            ep.send(h.name, MessageKind.CONTROL, encode_batch_request("train", True))
            ep.send_ids(h.name, MessageKind.BATCH_IDS, np.roll(rows, 32 * step)[:32])
            t = ep.recv_tensor(h.name, MessageKind.ACTIVATION)
            full = steered and step == 5
            grad = torch.randn(len(t), 8, generator=gen) if full else torch.randn(len(t), 2, generator=gen) @ basis
            ep.send_tensor(h.name, MessageKind.GRADIENT, 1e-3 * grad)

    monkeypatch.setattr(SplitNN, "train", program)
    monkeypatch.setattr(SplitNN, "evaluate", lambda self, fed: {})
    cfg = small_cfg(files, "guest", model__cut_dim=8)
    p = Passive(files, own=PartySettings(seed=1, defense="gradient-guard:action=stop"))
    if steered:
        with pytest.raises(UserError, match="gradient-guard"):
            deploy_run(files, cfg, [p])
    else:
        deploy_run(files, cfg, [p])
    p.close()
    assert p.status == (2 if steered else 0)
