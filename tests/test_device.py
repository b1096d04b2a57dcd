"""``--device`` (issue 33): one setting, resolved once per run, recorded as ``cost.device``.

These tests run on the CPU and need no GPU: they check that naming the CPU changes nothing (utility,
the recorded transcript and every trained parameter, bit for bit, against the default), that a device
the machine lacks is a one-line error before any data is read, how ``auto`` resolves, and that the
setting reaches config and sweep files without changing existing run ids."""

from __future__ import annotations

import copy
import hashlib

import pytest
import torch

from securevfl import devices
from securevfl.cli import main
from securevfl.config import RunConfig, apply_dict
from securevfl.errors import UserError
from securevfl.lab.compose import execute
from securevfl.lab.sweep import parse_sweep, run_id


def _cfg(**top) -> RunConfig:
    cfg = RunConfig(dataset="digits", method="splitnn", seed=3, record=True)
    for key, value in top.items():
        setattr(cfg, key, value)
    cfg.train.epochs = 2
    return cfg


def fingerprint(cfg: RunConfig) -> dict:
    """What a run produced: its JSON utility and cost, every message's bytes, and every trained
    parameter of every party (SHA-256 of the raw float bytes)."""
    r = execute(cfg, progress=False)
    fed = r.federation
    transcript = hashlib.sha256(b"".join(m.payload for m in fed.channel.transcript)).hexdigest()
    params = hashlib.sha256()
    for party in fed.parties:
        for name, m in sorted(party.modules_to_snapshot().items()):
            for key, t in sorted(m.state_dict().items()):
                params.update(f"{party.name}/{name}/{key}".encode())
                params.update(t.detach().cpu().contiguous().numpy().tobytes())
    j = r.to_json()
    return {"utility": j["utility"], "bytes": j["cost"]["bytes_sent"], "transcript": transcript,
            "params": params.hexdigest(), "device": j["cost"]["device"],
            "parties_on": {str(p.device) for p in fed.parties}}


@pytest.mark.parametrize("defense", ["none", "dp:clip=1,noise=0.5"])
def test_device_cpu_equals_the_default_bit_for_bit(defense, monkeypatch):
    """The default (``cpu``), an explicit ``--device cpu`` and ``auto`` without an accelerator train the
    same models and send the same bytes; with DP-SGD the noise (drawn on the CPU generator, fixed by a
    mechanism seed) is the same too."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(devices, "_mps_available", lambda: False)
    seeded = {"mechanism_seed": 11} if defense != "none" else {}
    default = fingerprint(_cfg(defense=defense, **seeded))
    assert RunConfig().device == "cpu"
    assert fingerprint(_cfg(defense=defense, device="cpu", **seeded)) == default
    assert fingerprint(_cfg(defense=defense, device="auto", **seeded)) == default
    assert default["device"] == "cpu" and default["parties_on"] == {"cpu"}
    # control: the fingerprint is not blind — another seed changes every part of it
    other = _cfg(defense=defense, **seeded)
    other.seed = 4
    changed = fingerprint(other)
    assert changed["transcript"] != default["transcript"] and changed["params"] != default["params"]


def test_auto_resolves_to_the_cpu_without_an_accelerator_and_records_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(devices, "_mps_available", lambda: False)
    r = execute(_cfg(device="auto"), progress=False).to_json()
    assert r["cost"]["device"] == "cpu"  # what ran
    assert r["config"]["device"] == "auto"  # what was asked for


def test_auto_prefers_cuda_then_mps(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert devices.resolve_device("auto") == torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(devices, "_mps_available", lambda: True)
    assert devices.resolve_device("auto") == torch.device("mps")
    monkeypatch.setattr(devices, "_mps_available", lambda: False)
    assert devices.resolve_device("auto") == torch.device("cpu")


@pytest.mark.parametrize("args,needle", [
    (["--device", "cuda"], "--device cuda: CUDA is not available here"),
    (["--device", "mps"], "--device mps: Apple's MPS backend is not available here"),
    (["--device", "bogus"], "invalid choice: 'bogus'"),
])
def test_unavailable_device_is_one_line_exit_2(args, needle, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on this machine, whatever runs the test
    monkeypatch.setattr(devices, "_mps_available", lambda: False)
    read = []
    import securevfl.lab.compose as compose

    monkeypatch.setattr(compose, "build_partition", lambda cfg: read.append(cfg) or pytest.fail("data was read"))
    code = main(["train", "--dataset", "digits", "--epochs", "1", *args])
    cap = capsys.readouterr()
    assert code == 2, cap.err
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], cap.err
    assert "Traceback" not in cap.err and cap.out == "" and not read


def test_config_and_sweep_files_take_device_without_changing_run_ids():
    cfg = RunConfig()
    apply_dict(cfg, {"device": "auto"})
    assert cfg.device == "auto"
    with pytest.raises(UserError, match="device"):
        from securevfl.configuration.validate import validate_config

        bad = RunConfig()
        apply_dict(bad, {"device": "tpu"})
        validate_config(bad)
    base = {"name": "d", "dataset": {"name": "digits"}, "methods": ["splitnn"], "seeds": [0]}
    plain = parse_sweep(copy.deepcopy(base)).cells[0]
    on_cpu = parse_sweep({**copy.deepcopy(base), "device": "cpu"}).cells[0]
    on_auto = parse_sweep({**copy.deepcopy(base), "device": "auto"}).cells[0]
    assert on_auto.config["device"] == "auto"
    # the default is exempt from the run id (stores and derived mechanism seeds stay as they were)
    without = {k: v for k, v in plain.config.items() if k != "device"}
    assert plain.run_id == on_cpu.run_id == run_id(without)
    assert on_auto.run_id != plain.run_id  # another device may round differently: its own row


def test_attack_on_a_trained_federation_sees_cpu_models():
    """Attacks run as the adversary on the CPU; after training every party is back there (on this
    machine trivially — the check is that the run leaves them where attacks expect them)."""
    cfg = _cfg(attacks=["mc:n_aux=20,steps=20"])
    r = execute(cfg, progress=False)
    assert all(p.device.type == "cpu" for p in r.federation.parties)
    assert all(q.device.type == "cpu" for p in r.federation.parties for q in p.parameters())
    assert 0.0 <= r.attacks["mc"]["value"] <= 1.0


def test_a_party_moves_its_models_and_optimizer_state_whole():
    """``Party.use_device`` (how the run brings every party back to the CPU for attacks): the models,
    the optimizer state and what the endpoint delivers follow, and the trained federation predicts
    as before."""
    r = execute(_cfg(), progress=False)
    fed, trainer = r.federation, r.method.trainer
    probs = trainer.predict_proba(fed.active.data.test_ids)
    state = {k: v.clone() for k, v in fed.active.optimizer.state[fed.active.parameters()[0]].items()}
    for party in fed.parties:
        party.use_device(torch.device("cpu"))
        assert party.endpoint.device == party.device == torch.device("cpu")
    moved = fed.active.optimizer.state[fed.active.parameters()[0]]
    assert state.keys() == moved.keys() and all(torch.equal(state[k], moved[k]) for k in state)
    assert (trainer.predict_proba(fed.active.data.test_ids) == probs).all()


def test_a_sweep_asking_for_a_missing_device_fails_before_any_cell(tmp_path, monkeypatch):
    from securevfl.lab.engine import run_sweep

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    sweep = tmp_path / "gpu.yaml"
    sweep.write_text("name: gpu\ndataset: {name: digits}\nmethods: [splitnn]\nseeds: [0]\ndevice: cuda\n")
    with pytest.raises(UserError, match=r"cell splitnn / none / seed 0: --device cuda: CUDA is not available"):
        run_sweep(str(sweep), str(tmp_path / "s.sqlite"), progress=False)
    assert not (tmp_path / "s.sqlite").exists()  # nothing ran, no store was made
