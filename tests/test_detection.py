"""gradient-guard (defenses/detection/gradient_subspace.py): a passive party's detector of gradients no
honest head could return. Honest runs raise no alarm; a full-rank steered gradient (what FSHA returns)
and the sign probe do; controls show each alarm comes from the statistic it names."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import defenses  # noqa: F401  (the registry)
from attacks.feature.steer import Steering, steer
from defenses.detection.gradient_subspace import GradientGuard, batch_residual, numerical_rank
from securevfl.config import RunConfig
from securevfl.errors import UserError
from securevfl.lab.compose import execute


def run(defense: str, dataset: str = "breast-cancer", epochs: int = 2, attacks: list[str] | None = None,
        **model: object):
    cfg = RunConfig(dataset=dataset, method="splitnn", seed=3, defense=defense)
    cfg.train.epochs = epochs
    for k, v in model.items():
        setattr(cfg.model, k, v)
    cfg.attacks = attacks or []
    return execute(cfg, progress=False)


def guard(res) -> GradientGuard:
    return next(h for h in res.federation.party("passive1").hooks if isinstance(h, GradientGuard))


def steered(res, steps: int, full_rank: bool) -> None:
    """A malicious active party's program after training (FSHA's shape, without its discriminator): with
    ``full_rank`` it sets its plaintext W_P = I before each step, as FSHA does, so the passive party gets
    the B×d gradient it chose (random here); otherwise the gradient is chosen at the head's width and
    reaches the passive party through W_P (rank ≤ h: what an honest head could send)."""
    rows = np.asarray(res.federation.active.aligned_ids)[:64]
    gen = torch.Generator().manual_seed(0)

    def program(s: Steering) -> None:
        end = s.active.cut_ends[s.target]
        for _ in range(steps):
            if full_rank:
                d = end.W.shape[0]
                end.W, end.b = np.eye(d), np.zeros((d, d))
            s.step(rows, lambda r: 1e-2 * torch.randn(r.shape, generator=gen, dtype=r.dtype))

    steer(res.federation, "passive1", program)


# ----------------------------------------------------------------------------------- the statistic
def test_the_statistic_separates_exact_rank_from_full_rank() -> None:
    rng = np.random.default_rng(0)
    low = rng.normal(size=(128, 2)) @ rng.normal(size=(2, 64))
    assert batch_residual(low, 2) < 1e-12
    assert 0.9 < batch_residual(rng.normal(size=(128, 64)), 2) < 1.0  # ≈ (d − h)/d
    assert numerical_rank(low, 1e-3) == 2
    smooth = rng.normal(size=(128, 64)) * np.geomspace(1, 1e-3, 64)  # no cliff: a wide head's spectrum
    assert numerical_rank(smooth, 1e-3) == 64


def test_parameters_are_checked() -> None:
    with pytest.raises(UserError, match="action"):
        GradientGuard(action="warn")
    with pytest.raises(UserError, match="threshold"):
        GradientGuard(threshold=0)
    with pytest.raises(UserError, match="sends no cut-layer messages"):
        execute(RunConfig(dataset="breast-cancer", method="local", defense="gradient-guard"), progress=False)


# ----------------------------------------------------------------------------------- honest runs
@pytest.mark.parametrize(("dataset", "h"), [("breast-cancer", 2), ("digits", 10)])
def test_an_honest_run_raises_no_alarm(dataset: str, h: int) -> None:
    res = run(f"gradient-guard:{h}", dataset)
    report = res.to_json()["privacy"]["features"]["passive1"]
    steps = res.to_json()["cost"]["train_steps"]
    assert report["applicable"] and report["batches_checked"] == steps > 0
    assert report["alarms"] == [] and report["first_alarm_step"] is None, report
    assert report["max_statistic"]["rank"] < 1e-10  # exact rank ≤ h, up to float rounding


def test_a_wide_head_says_it_cannot_apply() -> None:
    """h ≥ d: every gradient fits, so the report says so rather than passing silently."""
    report = guard(run("gradient-guard:64", head_hidden=(64,))).privacy()
    assert not report["applicable"] and "cannot apply" in report["reason"] and report["batches_checked"] == 0
    narrow = guard(run("gradient-guard:2", hidden=(), cut_dim=1)).privacy()  # the sign probe's own setting
    assert not narrow["applicable"] and "d=1" in narrow["reason"]


def test_a_wrong_rank_is_loud_not_silent() -> None:
    """A rank below the head's width (rank 2 with a hidden head layer): every batch alarms."""
    g = guard(run("gradient-guard:2", head_hidden=(64,)))
    assert g.alarm_count == g.checked > 0


# ----------------------------------------------------------------------------------- steered runs
def test_full_rank_steering_raises_an_alarm_at_its_first_step_and_its_control_does_not() -> None:
    res = run("gradient-guard:rank=2,drift=0")
    trained = res.federation.party("passive1").step
    steered(res, 3, full_rank=True)
    g = guard(res)
    assert g.alarm_count == 3 and g.alarms[0] == {"step": trained, "test": "rank",
                                                    "statistic": pytest.approx(g.alarms[0]["statistic"])}
    assert g.alarms[0]["statistic"] > 0.5
    # control: the same program, the gradient chosen at the head's width (rank ≤ h): no rank alarm
    res = run("gradient-guard:rank=2,drift=0")
    steered(res, 3, full_rank=False)
    assert guard(res).alarm_count == 0 and guard(res).checked == res.federation.party("passive1").step


def test_stop_ends_the_steered_program_at_the_passive_party() -> None:
    res = run("gradient-guard:rank=2,action=stop")
    with pytest.raises(UserError, match="passive1: gradient-guard: .* step 8 "):
        steered(res, 3, full_rank=True)


def test_the_sign_probe_raises_a_drift_alarm_and_without_the_drift_test_it_does_not() -> None:
    """The probe's gradient goes through W_P (rank ≤ h), but along one head column, which leaves the
    subspace honest binary training used; with the drift test off (the control) nothing fires."""
    res = run("gradient-guard:rank=2", epochs=1, attacks=["sign-probe:probes=30"])
    g, trained = guard(res), res.to_json()["cost"]["train_steps"]
    assert g.alarm_count > 0 and g.alarms[0]["step"] == trained and g.alarms[0]["test"] == "drift"
    assert g.max_stat["rank"] < 1e-10  # the rank test alone cannot see it
    off = guard(run("gradient-guard:rank=2,drift=0", epochs=1, attacks=["sign-probe:probes=30"]))
    assert off.alarm_count == 0 and off.checked > trained
    stopped = run("gradient-guard:rank=2,action=stop", epochs=1, attacks=["sign-probe:probes=30"])
    probe = stopped.to_json()["attacks"]["sign-probe"]
    assert "gradient-guard" in probe["refused"] and probe["crossings"] == 0  # stopped at its first step


def test_the_state_survives_a_checkpoint() -> None:
    res = run("gradient-guard:rank=2,drift=0")
    steered(res, 1, full_rank=True)
    g = guard(res)
    twin = GradientGuard(rank=2, drift=0)
    twin.load_state_dict(g.state_dict())
    assert twin.privacy() == g.privacy()


def test_an_honest_he_run_raises_no_alarm() -> None:
    cfg = RunConfig(dataset="breast-cancer", method="splitnn", seed=3, defense="gradient-guard:2", he="ckks")
    cfg.train.epochs = 1
    report = execute(cfg, progress=False).to_json()["privacy"]["features"]["passive1"]
    assert report["applicable"] and report["batches_checked"] > 0 and report["alarms"] == []
    assert report["max_statistic"]["rank"] < 1e-5  # CKKS noise, far below the threshold


# ----------------------------------------------------------------------------------- FSHA
def test_fsha_adds_to_its_control_and_the_guard_alarms_at_every_hijacked_step() -> None:
    """FSHA with paired aux rows on digits: above the best decoder of the same aux rows on the honest
    outputs (its control); every one of its steps leaves the head's subspace (W_P = I: full rank)."""
    res = run("gradient-guard:10", "digits", attacks=["fsha:steps=300"])
    a = res.to_json()["attacks"]["fsha"]
    assert a["value"] > a["control"] + 0.05 and a["control"] >= a["control_same_decoder_r2"], a
    assert a["detector_alarms"] == {"passive1": 300}
    # control: the same run without the attack raises no alarm
    assert guard(run("gradient-guard:10", "digits")).alarm_count == 0


@pytest.mark.parametrize("gan", ["gan", "wgan-gp"])
def test_the_papers_unpaired_fsha_is_caught_too(gan: str) -> None:
    a = run("gradient-guard:2", attacks=[f"fsha:gan={gan},pair=0,share=0,steps=20,limits=true"]).to_json()
    assert a["attacks"]["fsha"]["detector_alarms"] == {"passive1": 20}
    assert "refused" not in a["attacks"]["fsha"]  # a deployed party's limits do not stop it: only detection


def test_fsha_parameters_are_checked() -> None:
    with pytest.raises(UserError, match="gan=none"):
        run("gradient-guard:2", attacks=["fsha:pair=0"])
    with pytest.raises(UserError, match="gan must be"):
        run("gradient-guard:2", attacks=["fsha:gan=lsgan"])
