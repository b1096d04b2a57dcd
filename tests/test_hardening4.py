"""Issue 51 (hardening, round 4): one syntax for key=value settings, and the audit's meaningless values.

Each case was found against the old code; each test fails there and passes now."""

from __future__ import annotations

import pytest

from securevfl.cli import _build_config, make_parser
from securevfl.errors import UserError


def config(*argv: str):
    return _build_config(make_parser().parse_args(["train", *argv]))


@pytest.mark.parametrize("flag,field", [("--audit", "audit"), ("--he-param", "he_params"),
                                        ("--method-param", "method_params")])
def test_key_values_take_commas_and_repeats_alike(flag, field) -> None:
    """``--audit canaries=200,mode=gradient`` was one key with the value '200,mode=gradient'."""
    one = getattr(config(flag, "a=200,b=gradient"), field)
    two = getattr(config(flag, "a=200", flag, "b=gradient"), field)
    assert one == two == {"a": 200, "b": "gradient"}
    assert getattr(config(flag, "c=[1,2],d=x"), field) == {"c": [1, 2], "d": "x"}  # a comma inside a value


@pytest.mark.parametrize("argv", [["--he-param", "key_bits=2048", "--he-param", "key_bits=3072"],
                                  ["--audit", "canaries=50", "--audit", "canaries=400"],
                                  ["--audit", "canaries=50,canaries=400"]])
def test_a_repeated_key_names_both_values(argv) -> None:
    with pytest.raises(UserError, match="given twice") as e:
        config(*argv)
    assert all(v in str(e.value) for v in ("50", "400")) or all(v in str(e.value) for v in ("2048", "3072"))


@pytest.mark.parametrize("given,what", [({"canaries": 50, "confidence": 1e-300}, "confidence"),
                                        ({"canaries": 50, "confidence": 0.3}, "confidence"),
                                        ({"canaries": 50, "guesses": 0}, "guesses"),
                                        ({"canaries": 50, "guesses": 1}, "guesses"),
                                        ({"canaries": 50, "guesses": 51}, "guesses")])
def test_meaningless_audit_values_are_refused_with_their_range(given, what) -> None:
    from securevfl.lab.audit import audit_config

    with pytest.raises(UserError, match=f"--audit {what} must be in"):
        audit_config(given)


def test_the_audit_control_values_are_taken() -> None:
    from securevfl.lab.audit import audit_config

    assert audit_config({"canaries": 50})["guesses"] == 0  # unset: the schedule
    assert audit_config({"canaries": 50, "guesses": 10, "confidence": 0.5})["guesses"] == 10


def test_the_party_he_param_takes_the_same_syntax() -> None:
    from securevfl.cli import party_settings

    args = make_parser().parse_args(["party", "--role", "passive1", "--listen", "127.0.0.1:0", "--party-file", "x",
                                     "--insecure", "--he-param", "mask_bits=40,packing=true"])
    assert party_settings(args).he_params == {"mask_bits": 40, "packing": True}
    args.he_param = ["mask_bits=40", "mask_bits=41"]
    with pytest.raises(UserError, match="given twice"):
        party_settings(args)


@pytest.mark.parametrize("kind", ["activation", "ssl_representation"])
def test_a_peer_sending_non_finite_values_is_named(monkeypatch, tmp_path_factory, kind) -> None:
    """A passive party that sends NaN activations (or FedHSSL representations) was reported as "training
    diverged ... lower the learning rate": now the active party names the party and the message kind."""
    pytest.importorskip("grpc")
    import torch

    from securevfl.channel import MessageKind
    from securevfl.channel.base import Endpoint
    from securevfl.party_settings import PartySettings
    from tests.test_grpc import Passive, deploy, small_cfg
    from tests.test_grpc import files as make_files

    files = make_files.__wrapped__(tmp_path_factory) if hasattr(make_files, "__wrapped__") else None
    if files is None:
        pytest.skip("the grpc files fixture cannot be built here")
    real = Endpoint.send_tensor

    def send_tensor(self, dst, k, t):
        if self.party == "passive1" and k == kind:
            t = torch.full_like(t, float("nan"))
        return real(self, dst, k, t)

    monkeypatch.setattr(Endpoint, "send_tensor", send_tensor)
    method = "splitnn" if kind == MessageKind.ACTIVATION else "fedhssl"
    cfg = small_cfg(files, "guest", method=method, method_params={"ssl_epochs": 1} if method == "fedhssl" else {})
    p = Passive(files, own=PartySettings(seed=1))
    with pytest.raises(UserError, match=f"passive1 sent a {kind} message with non-finite values") as e:
        deploy(files, cfg, [p])
    p.close()
    assert "diverged" not in str(e.value) and "learning rate" not in str(e.value)


def test_vflhlp_on_fully_aligned_files_runs_and_says_what_it_used(tmp_path) -> None:
    """Two party files whose IDs all match: VFLHLP was refused naming a partition key the csv path does not
    take; it now runs (its local pre-training on all the active party's labeled rows, here the aligned
    ones) and says so."""
    import numpy as np
    import pandas as pd
    from sklearn.datasets import load_breast_cancer

    from securevfl.config import RunConfig
    from securevfl.lab.compose import execute

    X, y = load_breast_cancer(return_X_y=True)
    ids = np.arange(len(y))
    pd.DataFrame(X[:, :10], columns=[f"a{i}" for i in range(10)]).assign(id=ids, y=y).to_csv(tmp_path / "g.csv",
                                                                                             index=False)
    pd.DataFrame(X[:, 10:], columns=[f"b{i}" for i in range(20)]).assign(id=ids).to_csv(tmp_path / "h.csv",
                                                                                        index=False)
    cfg = RunConfig()
    cfg.dataset, cfg.method = "csv", "vflhlp"
    cfg.data.party_files, cfg.data.label_column = [str(tmp_path / "g.csv"), str(tmp_path / "h.csv")], "y"
    cfg.train.epochs, cfg.method_params = 1, {"pretrain_epochs": 1, "ssl_epochs": 1}
    r = execute(cfg, progress=False).to_json()
    assert r["utility"]["test"] > 0.5
    assert any("every labeled row of the active party is aligned" in w for w in r["warnings"])


@pytest.mark.slow
def test_an_interrupted_sweep_stops_within_seconds(tmp_path) -> None:
    """``kill -INT`` of a sweep waited for its cells in flight (591 s); now its workers stop with it, the
    finished cells stay in the store, and it says how to resume."""
    import signal
    import subprocess
    import sys
    import time

    sweep = tmp_path / "s.yaml"
    sweep.write_text("name: slow\ndataset: digits\nmethods: [splitnn]\ndefenses: [none]\nseeds: [0, 1, 2, 3]\n"
                     "train: {epochs: 400}\n")
    proc = subprocess.Popen([sys.executable, "-m", "securevfl", "sweep", str(sweep), "--workers", "2", "--store",
                             str(tmp_path / "s.sqlite")], stderr=subprocess.PIPE, text=True)
    time.sleep(15)  # the workers are well into their first cells
    assert proc.poll() is None
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert time.monotonic() - t0 < 20, err
    assert proc.returncode == 130 and "rerun the same command to resume" in err


def test_the_pick_is_marked_in_its_plot(tmp_path, monkeypatch) -> None:
    """The first screen's pick is starred on both panels of its trade-off plot (issue 51); no pick, no star."""
    import matplotlib.axes
    import pandas as pd

    from securevfl.lab.report.figures import tradeoff_figure
    from securevfl.lab.report.text import recommendation
    from tests.test_lab import _cells, _marked

    labels: list[str] = []
    real = matplotlib.axes.Axes.scatter

    def scatter(self, *a, **kw):
        labels.append(str(kw.get("label")))
        return real(self, *a, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "scatter", scatter)
    summary = _marked(_cells({"none": (0.60, 0.01), "iso:5": (0.58, 0.04), "iso:25": (0.45, 0.02)}), local=0.5)
    picked: dict = {}
    _, attack = recommendation(summary, pd.DataFrame(), "d", picked)
    assert picked["defense"] == "iso:25" and attack == "mc"
    tradeoff_figure(summary, "d", "mc", tmp_path / "a.png", picked=picked)
    assert labels.count("the pick (first screen)") == 2
    labels.clear()
    tradeoff_figure(summary, "d", "mc", tmp_path / "b.png")
    assert "the pick (first screen)" not in labels


@pytest.mark.parametrize("damage", ["flip-payload", "truncate-payload", "flip-index", "swap-index", "not-json",
                                    "row-of-wrong-type", "meta-a-list"])
def test_a_damaged_view_is_one_line(tmp_path, damage) -> None:
    """A recorded view that was bit-flipped, truncated, swapped with another view's part or malformed is
    refused with one line (a traceback, or a silently different transcript, before); the control reads."""
    import json

    from securevfl.channel.base import Message
    from securevfl.storage.view import read_view, write_view

    def view(folder, payloads: list[bytes]):
        return write_view(folder, "active", [Message(i, "passive1", "active", "activation", p, len(p))
                                             for i, p in enumerate(payloads)], {})

    a, b = view(tmp_path / "a", [b"x" * 100, b"y" * 50]), view(tmp_path / "b", [b"z" * 150])
    assert [m.payload for m in read_view(a)[1]] == [b"x" * 100, b"y" * 50]  # the control
    if damage == "flip-payload":
        raw = bytearray((a / "payloads.bin").read_bytes())
        raw[10] ^= 1
        (a / "payloads.bin").write_bytes(bytes(raw))
    elif damage == "truncate-payload":
        (a / "payloads.bin").write_bytes((a / "payloads.bin").read_bytes()[:120])
    elif damage == "flip-index":
        (a / "index.jsonl").write_text((a / "index.jsonl").read_text().replace('"nbytes": 50', '"nbytes": 40'))
    elif damage == "swap-index":
        (a / "index.jsonl").write_bytes((b / "index.jsonl").read_bytes())
    elif damage == "not-json":
        (a / "view.json").write_text("{not json")
    elif damage == "row-of-wrong-type":
        meta = json.loads((a / "view.json").read_text())
        meta.pop("sha256")  # an old view, without hashes: its rows are still checked
        (a / "view.json").write_text(json.dumps(meta))
        (a / "index.jsonl").write_text('{"seq": 0, "src": "p", "dst": "a", "kind": "k", "offset": "x", "nbytes": 1}\n')
    else:
        (a / "view.json").write_text("[1, 2]")
    with pytest.raises(UserError):
        read_view(a)


def test_a_checkpoint_folder_that_cannot_be_made_fails_before_listening(tmp_path) -> None:
    """``--checkpoint`` on a place that cannot hold a folder failed at the first epoch's end; now at once."""
    from securevfl.cli import main

    (tmp_path / "f").write_text("")
    party = tmp_path / "p.csv"
    party.write_text("id,a\n1,2\n")
    code = main(["party", "--role", "passive1", "--listen", "127.0.0.1:0", "--party-file", str(party), "--insecure",
                 "--checkpoint", str(tmp_path / "f" / "ck")])
    assert code == 2
