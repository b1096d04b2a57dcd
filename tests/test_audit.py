"""One-run privacy auditing (Steinke, Nasr & Jagielski 2023): the bound against numbers derived by
hand from the paper's statements, the canaries, and the audit on the label mechanisms.

A privacy claim is an attack that fails with a control that shows it can fail: the audit on a
deliberately broken mechanism (RR that randomises nothing, DP-SGD with its noise off, both still
claiming their ε) must exceed the claimed ε; on the correct mechanisms it must stay below it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import binom

from defenses.functional import clip_per_example, dp_sgd_release
from defenses.perturbation.embedding import EmbeddingDP
from defenses.perturbation.label_dp import LabelDP
from defenses.perturbation.rr import RandomizedResponse
from securevfl.cli import main
from securevfl.config import RunConfig
from securevfl.errors import UserError
from securevfl.lab.audit import audit_config, audit_result, guess_counts, insert_canaries, insert_feature_canaries
from securevfl.lab.audit_bound import epsilon_lower_bound, p_value
from securevfl.lab.compose import build_partition, execute


# ------------------------------------------------------------------------------------------ the bound
@pytest.mark.parametrize("r", [1, 10, 100, 1000])
def test_all_correct_pure_dp_matches_closed_form(r):
    # Theorem 3.1, δ = 0, v = r: P[Binomial(r, q) ≥ r] = q^r = β  ⇒  q = β^{1/r}, ε = ln(q / (1 − q))
    q = 0.05 ** (1 / r)
    expected = max(0.0, math.log(q / (1 - q)))
    assert epsilon_lower_bound(10 * r, r, r, 0.0, 0.95) == pytest.approx(expected, abs=1e-5)


def test_pure_dp_bound_is_the_binomial_tail():
    # 70 of 100 right: the bound ε* has P[Bin(100, q(ε*)) ≥ 70] = 0.05 (by hand with the binomial tail)
    eps = epsilon_lower_bound(1000, 100, 70, 0.0, 0.95)
    q = 1 / (1 + math.exp(-eps))
    assert binom.sf(69, 100, q) == pytest.approx(0.05, abs=1e-4)
    assert eps == pytest.approx(0.4717, abs=1e-3)
    assert epsilon_lower_bound(1000, 100, 50, 0.0, 0.95) == 0.0  # chance accuracy proves nothing
    # more correct guesses or lower confidence: a larger bound
    assert epsilon_lower_bound(1000, 100, 80, 0.0, 0.95) > eps > epsilon_lower_bound(1000, 100, 70, 0.0, 0.99)


def test_approximate_dp_term():
    # Theorem 5.2 / Algorithm 2 with r = v = 2: tail q²; windows P[1 ≤ B < 2] / 1 = 2q(1 − q) and
    # P[0 ≤ B < 2] / 2 = (1 − q²) / 2; p = q² + 2mδ · max of the two
    m, delta, eps = 50, 1e-3, 1.3
    q = 1 / (1 + math.exp(-eps))
    by_hand = q * q + 2 * m * delta * max(2 * q * (1 - q), (1 - q * q) / 2)
    assert p_value(m, 2, 2, eps, delta) == pytest.approx(by_hand, rel=1e-12)
    # δ only ever weakens the bound, more so with more canaries
    assert (epsilon_lower_bound(200, 100, 95, 1e-4) < epsilon_lower_bound(200, 100, 95, 0.0))
    assert epsilon_lower_bound(20000, 100, 95, 1e-4) < epsilon_lower_bound(200, 100, 95, 1e-4)
    with pytest.raises(ValueError):
        p_value(10, 5, 6, 1.0)


# ------------------------------------------------------------------------------------------ canaries
def test_canaries_flip_labels_with_private_coins():
    cfg = RunConfig(dataset="breast-cancer", method="splitnn", seed=3)
    part = build_partition(cfg)
    before = part.true_labels(part.labeled_ids)
    plan = insert_canaries(part, 100, cfg.seed, mechanism_seed=None)
    after = part.active.labels(plan.canaries)
    assert np.array_equal(after == plan.true_labels, plan.included)
    assert np.array_equal(part.true_labels(plan.canaries), after)  # the ground truth follows training labels
    rest = np.setdiff1d(part.labeled_ids, plan.canaries)
    was = dict(zip(part.labeled_ids.tolist(), before.tolist(), strict=True))
    assert part.true_labels(rest).tolist() == [was[e] for e in rest.tolist()]
    assert 25 < plan.included.sum() < 75
    # the canaries are public (run seed); the coins are not (a second draw differs)
    again = insert_canaries(build_partition(cfg), 100, cfg.seed, mechanism_seed=None)
    assert np.array_equal(again.canaries, plan.canaries) and not np.array_equal(again.included, plan.included)


def test_feature_canaries_take_the_donor_row():
    part = build_partition(RunConfig(dataset="breast-cancer", method="splitnn", seed=1))
    before = part.parties[1].X_train.copy()
    plan = insert_feature_canaries(part, 60, 1, mechanism_seed=None)
    victim = part.parties[1]
    donor_row = victim.rows(np.asarray([plan.donor]))[0]
    assert plan.donor not in plan.canaries.tolist()
    out, kept = plan.canaries[~plan.included], plan.canaries[plan.included]
    assert (victim.rows(out) == donor_row).all()
    pos = {e: i for i, e in enumerate(victim.train_ids.tolist())}
    assert np.array_equal(victim.rows(kept), before[[pos[e] for e in kept.tolist()]])
    assert part.active.X_train is not None and 10 < plan.included.sum() < 50


def test_guesses_and_refusals():
    assert guess_counts(200, 0) == [10, 20, 40, 100, 200] and guess_counts(200, 51) == [50]
    plan_scores = np.arange(10.0)
    from securevfl.lab.audit import AuditPlan
    plan = AuditPlan(np.arange(10), plan_scores >= 5)
    res = audit_result(plan, {"good": plan_scores}, 0.0, 0.95, 10)  # a perfect scorer
    assert res["correct"] == 10 and res["guesses"] == 10 and res["attack"] == "good"
    res = audit_result(plan, {"bad": -plan_scores}, 0.0, 0.95, 10)  # an anti-scorer gains nothing
    assert res["correct"] == 0 and res["epsilon_lower"] == 0.0
    both = audit_result(plan, {"bad": -plan_scores, "good": plan_scores}, 0.0, 0.95, 10)
    assert both["attack"] == "good" and both["per_guess_confidence"] == pytest.approx(0.975)
    # trying two scorers costs confidence: a smaller bound than the good scorer alone
    assert 0 < both["epsilon_lower"] < res_good(plan, plan_scores)
    for bad in ({"canaries": 1}, {"confidence": 1.0}, {"canaries": 10, "guesses": 11}, {"canary": 5},
                {"canaries": 10, "side": "both"}):
        with pytest.raises(UserError):
            audit_config(bad)
    digits = build_partition(RunConfig(dataset="digits", method="splitnn"))
    truth = digits.true_labels(digits.labeled_ids)
    plan = insert_canaries(digits, 300, 0, None)  # multi-class: a public alternative label per canary
    assert plan.alternative is not None and plan.true_labels is not None
    assert (plan.alternative != plan.true_labels).all() and len(set(plan.alternative.tolist())) == 10
    now = digits.true_labels(plan.canaries)
    assert (now == np.where(plan.included, plan.true_labels, plan.alternative)).all()
    assert len(truth) > 300
    with pytest.raises(UserError, match="labeled aligned"):
        insert_canaries(build_partition(RunConfig(dataset="breast-cancer", method="splitnn")), 10**5, 0, None)


def res_good(plan, scores):
    return audit_result(plan, {"good": scores}, 0.0, 0.95, 10)["epsilon_lower"]


def test_cli_bad_audit_is_a_one_line_error(capsys):
    assert main(["train", "--dataset", "breast-cancer", "--audit", "canaries=nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "canaries" in err
    assert main(["train", "--dataset", "breast-cancer", "--audit", "canaries=10", "--audit", "attack=dli",
                 "--epochs", "1"]) == 2  # dli reads logit gradients: agg head only
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "agg head" in err


# ------------------------------------------------------------------------------------------ the audit
class LabelsUntouchedRR(RandomizedResponse):
    """Broken on purpose: claims ε but passes every label through."""

    def transform_labels(self, labels, n_classes, features=None):
        self.flipped, self.n_labels = 0, len(labels)
        return labels


class NoiselessDP(LabelDP):
    """Broken on purpose: accounts for noise multiplier z but adds none (clipping only)."""

    def release(self, summed, rows, batch_size, ids=None):
        super().release(summed, rows, batch_size, ids)  # the ledger as usual
        return dp_sgd_release(summed, rows, self.config["clip"], 0.0, batch_size, self.generator)


def audit_cfg(seed: int = 0, epochs: int = 2, canaries: int = 200, mechanism_seed: int | None = 0,
              **audit) -> RunConfig:
    cfg = RunConfig(dataset="breast-cancer", method="splitnn", seed=seed, mechanism_seed=mechanism_seed,
                    audit={"canaries": canaries, **audit})
    cfg.train.epochs, cfg.train.batch_size = epochs, 32
    return cfg


@pytest.mark.parametrize("broken, claimed", [(LabelsUntouchedRR, 1.0), (NoiselessDP, 2.0)])
def test_audit_catches_a_broken_mechanism(broken, claimed):
    params = {"epsilon": claimed} if broken is LabelsUntouchedRR else {"epsilon": claimed, "delta": 1e-5}
    hook = broken(seed=0, **params)  # fixed noise: the fast tests are deterministic
    run = execute(audit_cfg(), hooks=[hook], progress=False)
    assert run.privacy["epsilon"] == pytest.approx(claimed, rel=0.05)  # it claims its ε ...
    audit = run.privacy["audit"]
    assert audit["epsilon_lower"] > claimed + 0.5, audit  # ... and the audit, at 95 %, refutes it
    assert audit["canaries"] == 200 and audit["attacks_tried"] == ["aux-axis", "direction", "norm", "prototype"]
    assert audit["correct"] <= audit["guesses"]


def test_audit_of_the_correct_mechanism_fast():
    cfg = audit_cfg(confidence=0.99)  # the canary coins and the RR flips fixed (mechanism seed 0): deterministic
    run = execute(cfg, hooks=[RandomizedResponse(seed=0, epsilon=1.0)], progress=False)
    assert run.privacy["audit"]["epsilon_lower"] <= 1.0
    assert run.to_json()["privacy"]["audit"]["canaries"] == 200


@pytest.mark.parametrize("hook, refuted", [(LabelsUntouchedRR, True), (RandomizedResponse, False)])
def test_multiclass_audit(hook, refuted):
    """Digits (10 classes): each canary keeps its label or takes a public alternative; the prototype
    scorer refutes RR that randomises nothing and stays below the claim of the real RR."""
    cfg = audit_cfg(canaries=300, confidence=0.99)
    cfg.dataset, cfg.train.epochs = "digits", 3
    run = execute(cfg, hooks=[hook(seed=0, epsilon=1.0)], progress=False)
    audit = run.privacy["audit"]
    assert audit["attacks_tried"] == ["prototype"]  # the binary-axis scorers do not apply
    if refuted:
        assert audit["epsilon_lower"] > 1.5, audit
    else:
        assert audit["epsilon_lower"] <= 1.0, audit


def test_dli_scorer_under_the_agg_head():
    """Under the agg head the dli scorer reads each canary's label off its logit gradients: against
    the broken RR it refutes ε 1, and it is skipped under the split head."""
    cfg = audit_cfg(confidence=0.99)
    cfg.model.head = "agg"
    audit = execute(cfg, hooks=[LabelsUntouchedRR(seed=0, epsilon=1.0)], progress=False).privacy["audit"]
    assert "dli" in audit["attacks_tried"] and audit["epsilon_lower"] > 1.5, audit


class NoiselessEmbeddingDP(EmbeddingDP):
    """Broken on purpose: clips and counts every released row as usual but adds no noise."""

    def __call__(self, tensor, ctx):
        self._count(ctx.batch_ids)
        return clip_per_example(tensor, self.config["clip"])


@pytest.mark.parametrize("mechanism", [NoiselessEmbeddingDP, EmbeddingDP])
def test_feature_audit(mechanism):
    cfg = audit_cfg(side="features")
    run = execute(cfg, hooks=[mechanism(seed=0, noise=5.0)], progress=False)
    claimed = run.privacy["features"]["passive1"]["epsilon"]  # the queries of the audit are charged too
    audit = run.privacy["audit"]
    assert audit["side"] == "features" and audit["delta"] == 1e-5 and claimed < 2.0
    if mechanism is NoiselessEmbeddingDP:  # the donor's row comes back bit for bit: the claim is refuted
        assert audit["epsilon_lower"] > claimed + 0.5, audit
    else:
        assert audit["epsilon_lower"] <= claimed


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("defense, claimed", [("rr:1", 1.0), ("rr:3", 3.0), ("dp:epsilon=4", 4.0)])
def test_audit_stays_below_the_claim(seed, defense, claimed):
    cfg = audit_cfg(seed=seed, epochs=5, mechanism_seed=None, confidence=0.99)  # private noise, as in use
    cfg.defense = defense
    run = execute(cfg, progress=False)
    assert run.privacy["epsilon"] <= claimed + 1e-9
    assert run.privacy["audit"]["epsilon_lower"] <= claimed


def test_store_and_report_carry_the_audit(tmp_path):
    import yaml

    from securevfl.lab.engine import run_sweep
    from securevfl.lab.report import write_report

    sweep = {"name": "audit-tiny", "dataset": {"name": "breast-cancer", "parties": 2}, "methods": ["splitnn"],
             "defenses": [{"rr": [2]}], "audit": {"canaries": 50}, "mechanism_seed": 0, "seeds": [0],
             "train": {"epochs": 1, "batch_size": 64}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(sweep))
    run_sweep(tmp_path / "s.yaml", tmp_path / "s.sqlite", 1, "local", progress=False)
    import sqlite3
    (eps, audited), = sqlite3.connect(tmp_path / "s.sqlite").execute("SELECT epsilon, epsilon_audit FROM runs")
    assert eps == 2.0 and audited is not None and 0 <= audited <= 2.0
    paths = write_report(tmp_path / "s.sqlite", tmp_path / "report")
    text = (tmp_path / "report" / "report.md").read_text()
    assert "audited ε ≥" in text and any(p.name == "epsilon_audit.png" for p in paths)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_feature_audit_stays_below_the_claim(seed):
    cfg = audit_cfg(seed=seed, epochs=5, mechanism_seed=None, confidence=0.99, side="features")
    cfg.defense = "embedding-dp:noise=2"
    run = execute(cfg, progress=False)
    assert run.privacy["audit"]["epsilon_lower"] <= run.privacy["features"]["passive1"]["epsilon"]


# ------------------------------------------------------------------ white-box audit and the f-DP bound
def test_fdp_bound_holds_for_a_gaussian_mechanism_and_refutes_a_looser_one():
    """The f-DP analysis on the exact statistic of a μ-GDP mechanism: at 95 % the bound exceeds the
    mechanism's ε in at most a few of 30 draws; a mechanism with 3× the μ (a third of the noise)
    claiming the same ε is refuted in most draws (the control: the test can fail)."""
    from securevfl.lab.audit import fdp_guess_counts
    from securevfl.lab.audit_bound import epsilon_lower_bound_fdp, gdp_mu

    eps, delta = 2.0, 1e-5
    mu = gdp_mu(eps, delta)
    rng = np.random.default_rng(7)

    def bound(true_mu: float, m: int) -> float:
        s_plus = rng.random(m) < 0.5
        scores = np.where(s_plus, true_mu / 2, -true_mu / 2) + rng.standard_normal(m)
        order = np.argsort(scores)
        counts = fdp_guess_counts(m, 0)
        level = 1 - 0.05 / len(counts)
        return max(epsilon_lower_bound_fdp(m, r, int(s_plus[order[m - r:]].sum()), delta, level) for r in counts)

    honest = [bound(mu, 150) for _ in range(30)]
    assert sum(b > eps for b in honest) <= 3, honest
    loose = [bound(3 * mu, 1000) for _ in range(10)]  # more canaries: the one-run bound is capped by m
    assert sum(b > eps for b in loose) >= 7, loose


def test_fdp_bound_is_monotone_and_beats_the_binomial_bound_on_gaussian_evidence():
    from securevfl.lab.audit_bound import epsilon_lower_bound, epsilon_lower_bound_fdp

    bounds = [epsilon_lower_bound_fdp(1000, 100, v, 1e-5, 0.99) for v in (60, 80, 95)]
    assert bounds[0] <= bounds[1] <= bounds[2] and bounds[2] > 0
    assert epsilon_lower_bound_fdp(1000, 100, 50, 1e-5, 0.99) == 0.0  # chance-level guesses refute nothing
    assert bounds[2] > epsilon_lower_bound(1000, 100, 95, 1e-5, 0.99)  # a Gaussian claim is a tighter curve


def test_gradient_canaries_replace_the_canary_examples_gradients():
    from securevfl.per_example import GradientCanaries, canary_direction, plant_gradient_canaries

    per, rows = [torch.ones(4, 3, 2)], [torch.ones(4, 5)]
    c = GradientCanaries(np.array([11, 13]), np.array([1.0, -1.0]), 2.0)
    plant_gradient_canaries(per, rows, np.array([10, 11, 12, 13]), c)
    u = torch.as_tensor(canary_direction(5), dtype=torch.float32)
    assert torch.all(per[0][[1, 3]] == 0) and torch.all(per[0][[0, 2]] == 1)
    assert torch.allclose(rows[0][1], 2.0 * u) and torch.allclose(rows[0][3], -2.0 * u)
    assert torch.all(rows[0][[0, 2]] == 1)


@pytest.mark.parametrize("analysis", ["binomial", "fdp"])
def test_white_box_audit_refutes_noiseless_dp_and_passes_the_real_one(analysis):
    """Gradient canaries in DP-SGD's release: the audit refutes ε 2 claimed with no noise, and the
    correct mechanism at ε 2 stays below its claim (same canaries and coins: mechanism seed 0)."""
    broken = execute(audit_cfg(mode="gradient", analysis=analysis),
                     hooks=[NoiselessDP(seed=0, epsilon=2.0, delta=1e-5)], progress=False).privacy
    assert broken["epsilon"] == pytest.approx(2.0, rel=0.05)
    assert broken["audit"]["epsilon_lower"] > 2.5, broken["audit"]
    assert broken["audit"]["attacks_tried"] == ["dirac"] and broken["audit"]["mode"] == "gradient"
    honest = execute(audit_cfg(mode="gradient", analysis=analysis),
                     hooks=[LabelDP(seed=0, epsilon=2.0, delta=1e-5)], progress=False).privacy["audit"]
    assert honest["epsilon_lower"] <= 2.0, honest


def test_white_box_audit_refusals(capsys):
    from securevfl.cli import main

    base = ["train", "--dataset", "breast-cancer", "--epochs", "1", "--audit", "canaries=10"]
    for extra, says in ((["--audit", "mode=gradient"], "defense dp"),
                        (["--audit", "analysis=fdp", "--defense", "rr:epsilon=1"], "defense dp"),
                        (["--audit", "mode=gradient", "--audit", "side=features"], "side=labels only"),
                        (["--audit", "mode=gradient", "--defense", "dp:epsilon=2", "--he", "ckks"], "--he"),
                        (["--audit", "mode=sideways"], "natural or gradient")):
        assert main(base + extra) == 2, extra
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and says in err, err
