"""The methods report (issue 42): paired differences, verdicts, counters, and the command."""

import math

import pandas as pd
import pytest
import yaml

from securevfl.cli import main
from securevfl.lab.engine import run_sweep
from securevfl.lab.report.methods import (
    comparison_table,
    counters,
    fill,
    method_frame,
    method_verdict,
    paired,
    verdict,
)


def test_paired_difference_and_its_interval():
    a = pd.Series([0.70, 0.72, 0.74], index=[0, 1, 2])
    b = pd.Series([0.60, 0.63, 0.66, 0.9], index=[0, 1, 2, 3])  # seed 3 has no partner: left out
    p = paired(a, b)
    assert p["n"] == 3 and p["mean"] == pytest.approx(0.09) and p["wins"] == 3
    # sd of (0.10, 0.09, 0.08) = 0.01; t(0.975, 2) = 4.303
    assert p["high"] - p["mean"] == pytest.approx(4.303 * 0.01 / math.sqrt(3), rel=1e-3)
    assert verdict(p) == "an effect"  # no paper value: the direction only
    assert verdict(paired(b.iloc[:3], a)) == "the opposite"
    lo = pd.Series([0.60, 0.64, 0.62], index=[0, 1, 2])
    assert verdict(paired(lo, b.iloc[:3])) == "unresolved"
    assert verdict(paired(a, a)) == "unresolved"  # control: an arm against itself shows no effect either way
    assert verdict(paired(a.iloc[:1], b)) == "too few seeds"


@pytest.mark.parametrize(("paper", "expected"), [
    (0.09, "reproduced"),  # the interval (≈ 0.065, 0.115) holds the paper's difference
    (0.5, "a smaller effect"),  # above zero but excludes the paper's size: never "holds" for a fifth of it
    (0.02, "larger than the paper's"),
    (-0.09, "the opposite"),  # the paper says the method loses; ours wins
])
def test_verdicts_say_how_much_of_the_papers_effect(paper, expected):
    a = pd.Series([0.70, 0.72, 0.74], index=[0, 1, 2])
    b = pd.Series([0.60, 0.63, 0.66], index=[0, 1, 2])
    assert verdict(paired(a, b), paper=paper) == expected


def test_no_effect_excludes_the_paper_and_unresolved_does_not():
    wide = pd.Series([0.60, 0.64, 0.62], index=[0, 1, 2])
    b = pd.Series([0.60, 0.63, 0.66], index=[0, 1, 2])  # differences 0, +0.01, −0.04: the interval holds 0
    assert verdict(paired(wide, b), paper=0.2) == "no effect"  # the paper's +0.2 is excluded
    assert verdict(paired(wide, b), paper=0.02) == "unresolved"  # control: +0.02 is inside, so is 0


def test_counters_flatten_method_info_and_sum_risa_checks():
    info = {"lr_search": {"chosen": 0.01}, "risa": {"self_training": {"pseudo_labeled": 5},
                                                    "drops": [{"dropped": 2, "tau": 0.75,
                                                               "u_droppable_q10_50_90": [0.1, 0.2, 0.3]},
                                                              {"dropped": 3, "tau": 0.5}]}}
    c = counters(info, {"pseudo_label_accuracy": 0.8})
    assert c["risa.self_training.pseudo_labeled"] == 5 and c["risa.dropped_total"] == 5
    assert c["risa.last_check.tau"] == 0.5 and c["against_truth.pseudo_label_accuracy"] == 0.8
    ssl = counters({"pretrain_history": [{"cross": -0.1, "local": {"active": -0.2}},
                                         {"cross": -0.9, "local": {"active": -1.0}}]})
    assert ssl == {"ssl_loss.first_epoch.cross": -0.1, "ssl_loss.first_epoch.local.active": -0.2,
                   "ssl_loss.last_epoch.cross": -0.9, "ssl_loss.last_epoch.local.active": -1.0}
    assert not any(k.startswith("lr_search") for k in c)
    own = {"loss_first_step": 6.1, "loss_last_step": 1.05, "loss_first_epoch_mean": 6.0, "loss_last_epoch_mean": 5.3}
    scarf = {"vflhlp": {"passive_pretraining": {"passive1": own}}}
    got = counters(scarf)  # the epoch means stand for one step's loss (a last step of 4 rows measures nothing)
    assert set(got) == {"vflhlp.passive_pretraining.passive1.loss_first_epoch_mean",
                        "vflhlp.passive_pretraining.passive1.loss_last_epoch_mean"}
    del scarf["vflhlp"]["passive_pretraining"]["passive1"]["loss_first_epoch_mean"]  # control: an older run's
    assert "vflhlp.passive_pretraining.passive1.loss_last_step" in counters(scarf)
    assert fill("dropped {risa.dropped_total:.0f}, {nope}", c) == "dropped 5, {nope: not measured}"
    # a direction the numbers choose, never a template's: each of the three words, and an unmeasured side
    said = "{?a|b|leads|trails|ties with}"
    assert [fill(said, {"a": x, "b": 0.5}) for x in (0.6, 0.4, 0.5001)] == ["leads", "trails", "ties with"]
    assert fill(said, {"a": 0.6}) == "{b: not measured}"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("methods")
    sweep = {"name": "m", "dataset": {"name": "breast-cancer", "aligned_fraction": [0.2, 1.0],
                                      "active_labels_unaligned": True},
             "methods": ["local", "splitnn", {"splitnn": {}}], "seeds": [0, 1, 2],
             "train": {"epochs": 2, "batch_size": 64}}
    (d / "m.yaml").write_text(yaml.safe_dump(sweep))
    assert run_sweep(str(d / "m.yaml"), str(d / "s.sqlite"), progress=False)["failed"] == 0
    # a second sweep whose cells the first already ran: stored once, a member of both
    shared = {**sweep, "name": "m2", "methods": ["local"], "dataset": {**sweep["dataset"], "aligned_fraction": 1.0}}
    (d / "m2.yaml").write_text(yaml.safe_dump(shared))
    assert run_sweep(str(d / "m2.yaml"), str(d / "s.sqlite"), progress=False)["skipped"] == 3
    claims = [{"method": "splitnn", "title": "Split vs local", "paper": "a made-up paper", "sweep": "m",
               "regime": "aligned_fraction", "headline": 1.0,
               "comparisons": [{"baseline": "local", "paper": 0.01}, {"baseline": "splitnn"}],
               "why": "it ran {seconds_never_measured}.", "source": "scikit-learn's copy"}]
    (d / "claims.yaml").write_text(yaml.safe_dump(claims))
    return d


def test_report_pairs_by_seed_across_the_regime(store):
    frame = method_frame(store / "s.sqlite")
    claim = yaml.safe_load((store / "claims.yaml").read_text())[0]
    table = comparison_table(frame, claim)
    assert len(frame[frame.sweep == "m2"]) == 3  # the shared cells count for the sweep that did not run them
    assert len(table) == 4 and set(table.regime) == {0.2, 1.0} and (table.n == 3).all()
    self_vs_self = table[table.baseline == "splitnn"]
    assert (self_vs_self["mean"] == 0).all() and (self_vs_self.verdict == "unresolved").all()
    assert table[table.headline & (table.baseline == "local")].paper.iloc[0] == 0.01
    assert table[~table.headline].paper.isna().all()  # the paper's number belongs to its own setting
    v = method_verdict(table, claim)  # the arm-vs-itself comparison never reproduces, so neither does the claim
    assert not v.startswith("the paper's effect reproduced") and "vs splitnn: unresolved" in v
    # control: the comparisons alone that do reproduce read so
    only = {**claim, "comparisons": [claim["comparisons"][0]]}
    t1 = comparison_table(frame, only)
    from securevfl.lab.report.methods.stats import _SAID

    assert method_verdict(t1, only).split(";")[0] == _SAID[t1[t1.headline].verdict.iloc[0]]


def test_report_command_writes_the_methods_report(store, capsys):
    out = store / "rep"
    assert main(["report", str(store / "s.sqlite"), "--out", str(out), "--claims", str(store / "claims.yaml")]) == 0
    md = (out / "report.md").read_text()
    assert md.startswith("# securevfl methods report")
    assert "**Split vs local:" in md and "(paper +0.01)" in md and "3 seeds, paired" in md
    answer = md.split("## The answer")[1].split("## ")[0]  # the first screen: one row per claim
    assert "| Split vs local " in answer and "aligned_fraction 1 " in answer and "+0.010 vs local" in answer
    assert "{seconds_never_measured: not measured}" in md  # a counter the runs lack is said, not invented
    assert "| breast-cancer, " in answer and " training rows (scikit-learn's copy) |" in answer  # its sample, source
    assert "1 of 1 verdicts rest on one sample only" in md
    from securevfl.lab.report.methods import one_sample_sentence  # control: two samples say so

    two = one_sample_sentence(["criteo: a.txt + criteo: b.txt"])
    assert two == "Each verdict rests on more than one sample."
    assert "Sweep **m** from" in md and (out / "methods_m.png").exists()
    bad = store / "bad.yaml"
    bad.write_text("- {method: splitnn}\n")
    assert main(["report", str(store / "s.sqlite"), "--out", str(out), "--claims", str(bad)]) == 2
    assert "error: --claims" in capsys.readouterr().err


@pytest.fixture(scope="module")
def axes_store(tmp_path_factory):
    """A claim with every axis: its sweep (seeds 0-2), more seeds at the paper's setting (3-5), the
    setting on fewer training rows, and a reference arm stored as the authors'-code runner stores it."""
    from securevfl.lab.report.methods import REFERENCE_SUFFIX
    from securevfl.lab.store import Store

    d = tmp_path_factory.mktemp("axes")
    base = {"dataset": {"name": "breast-cancer", "aligned_fraction": [0.2, 1.0]}, "methods": ["local", "splitnn"],
            "train": {"epochs": 2, "batch_size": 64}}
    files = {"m": {**base, "seeds": [0, 1, 2]},
             "m-seeds": {**base, "dataset": {**base["dataset"], "aligned_fraction": 1.0}, "seeds": [3, 4, 5]},
             "m-rows": {**base, "dataset": {**base["dataset"], "aligned_fraction": 1.0, "train_rows": [100, 200]},
                        "seeds": [0, 1, 2]}}
    for name, sweep in files.items():
        (d / f"{name}.yaml").write_text(yaml.safe_dump({"name": name, **sweep}))
        assert run_sweep(str(d / f"{name}.yaml"), str(d / "s.sqlite"), progress=False)["failed"] == 0
    store = Store(d / "s.sqlite")
    try:  # the authors' code: splitnn's runs at the paper's setting, 0.2 lower, under the suffixed run id
        for r in store.rows():
            swept = yaml.safe_load(r["swept_json"] or "{}") or {}
            if r["method"] == "splitnn" and swept.get("aligned_fraction", 1.0) == 1.0 and "train_rows" not in swept:
                store.put({**r, "run_id": r["run_id"] + REFERENCE_SUFFIX, "method": "splitnn-authors",
                           "utility": r["utility"] - 0.2})
    finally:
        store.close()
    claim = {"method": "local", "title": "Local vs split", "paper": "p", "sweep": "m", "more_seeds": "m-seeds",
             "rows": "m-rows", "reference": "splitnn-authors", "regime": "aligned_fraction", "headline": 1.0,
             "comparisons": [{"baseline": "splitnn", "paper": 0.5}]}
    (d / "claims.yaml").write_text(yaml.safe_dump([claim]))
    return d, claim


def test_more_seeds_rows_axis_and_the_authors_arm(axes_store):
    from securevfl.lab.report.methods import claim_verdict, detectable, rows_sentence, rows_table

    d, claim = axes_store
    frame = method_frame(d / "s.sqlite")
    table = comparison_table(frame, claim)
    mine = table[(table.arm == "local") & (table.baseline == "splitnn")].set_index("regime")
    assert mine.loc[1.0, "n"] == 6 and mine.loc[0.2, "n"] == 3  # more seeds count at the paper's setting only
    ref = table[table.arm == "splitnn-authors"]
    assert ref[ref.regime == 1.0].n.iloc[0] == 6 and ref[ref.regime == 0.2].n.iloc[0] == 0
    gap = ref[ref.regime == 1.0].iloc[0]
    assert gap["mean"] == pytest.approx(-0.2) and gap.wins == 0  # theirs − the baseline, paired by seed
    assert len(table[(table.arm == "local") & (table.baseline == "splitnn-authors") & (table.n == 6)]) == 1
    # their method against our baseline mixes their party split and model with ours: marked, and no verdict
    # of "theirs" rests on it (the claim's verdict is ours alone)
    assert table[(table.arm == "splitnn-authors") & (table.baseline == "splitnn")].mixed.all()
    mine = table[(table.arm == "local") & (table.baseline == "splitnn") & table.headline].verdict.iloc[0]
    assert mine in ("the opposite", "no effect")
    assert claim_verdict(table, claim) == mine
    # like for like: their method against their own baseline (both arms theirs); the same paired gaps as ours
    both = pd.concat([frame, frame[frame.method == "local"].assign(method="local-authors",
                                                                   utility=lambda f: f.utility - 0.2)])
    like = {**claim, "reference": {"local": "local-authors", "splitnn": "splitnn-authors"}}
    t2 = comparison_table(both, like)
    assert not t2[(t2.arm == "local-authors") & (t2.baseline == "splitnn-authors")].mixed.any()
    assert claim_verdict(t2, like) == f"{mine}, with the authors' code too"
    # control: an authors' arm that does reach the paper's difference changes the wording
    lifted = both.assign(utility=both.utility + ((both.method == "local-authors") * 0.9))
    assert claim_verdict(comparison_table(lifted, like), like).startswith(f"{mine} (the authors' code: ")
    two = {**like, "comparisons": [*like["comparisons"], {"baseline": "splitnn", "subset": "all"}]}
    assert claim_verdict(comparison_table(lifted, two), two).startswith(
        f"{mine}; at the paper's setting vs splitnn: {mine} (the authors' code: ")
    # two comparisons, theirs like for like in one only: their verdict stands beside that one, never beside
    # the other (control: the verdict of theirs is there, and the mixed comparison's differs from it)
    from securevfl.lab.report.methods.stats import NO_EFFECT, REPRODUCED

    syn = pd.DataFrame([
        {"arm": a, "baseline": b, "rows": "all", "headline": True, "n": 5, "verdict": v, "mixed": m, "regime": 1.0}
        for a, b, v, m in [("m", "b1", NO_EFFECT, False), ("m", "b2", REPRODUCED, False),
                           ("m-authors", "b1-authors", NO_EFFECT, False), ("m-authors", "b2", NO_EFFECT, True)]])
    syn_claim = {"method": "m", "reference": {"m": "m-authors", "b1": "b1-authors"}, "regime": "aligned_fraction",
                 "headline": 1.0, "comparisons": [{"baseline": "b1"}, {"baseline": "b2"}]}
    said = claim_verdict(syn, syn_claim)
    assert said.endswith("at the paper's setting vs b1: no effect, with the authors' code too"), said
    assert "vs b2: reproduced" in said and "(the authors' code" not in said
    rows = rows_table(frame, claim)
    at = rows[(rows.arm == "local") & (rows.baseline == "splitnn")]
    assert sorted(at.regime) == [100, 200, 455] and at[at.regime == 455].n.iloc[0] == 6  # 455 = all train rows
    assert rows.headline.sum() == len(rows) / 3  # the largest row count is the full setting
    assert "at 100 rows" in rows_sentence(rows, claim) and "at 455" in rows_sentence(rows, claim)
    # the detectable effect: with sd 0.01 and 20 seeds, (t.975 + t.8) · 0.01 / √20 ≈ 0.0065
    assert detectable(0.01, 20) == pytest.approx((2.093 + 0.861) * 0.01 / math.sqrt(20), rel=1e-3)
    assert math.isnan(detectable(0.01, 1))


def test_the_report_shows_the_rows_axis_and_the_authors_arm(axes_store):
    d, _ = axes_store
    out = d / "rep"
    assert main(["report", str(d / "s.sqlite"), "--out", str(out), "--claims", str(d / "claims.yaml")]) == 0
    md = (out / "report.md").read_text()
    answer = md.split("## The answer")[1].split("## ")[0]
    assert "vs splitnn-authors" in answer and "mixes the authors' party split" in md
    assert "(6 seeds)" in answer and "our seeds detect" in answer
    assert "The rows axis" in md and (out / "methods-rows_m.png").exists()


def test_the_authors_arm_is_compared_with_the_authors_baseline_where_they_have_one(tmp_path):
    from securevfl.errors import UserError
    from securevfl.lab.report.methods import load_claims, pairs

    claim = {"method": "m", "comparisons": [{"baseline": "b", "paper": 0.1}, {"baseline": "c"}],
             "reference": {"m": "m-authors", "b": "b-authors"}}
    got = [(a, c["baseline"], c.get("paper")) for a, c in pairs(claim)]
    assert got == [("m", "b", 0.1), ("m", "c", None), ("m-authors", "b-authors", 0.1), ("m-authors", "c", None),
                   ("m", "m-authors", None), ("b", "b-authors", None)]
    bad = tmp_path / "c.yaml"  # a mapping without the claim's own method
    bad.write_text(yaml.safe_dump([{**claim, "title": "t", "paper": "p", "sweep": "s", "reference": {"b": "b-x"}}]))
    with pytest.raises(UserError, match="reference: expected"):
        load_claims(bad)


def test_the_authors_arm_holds_out_our_arms_validation_rows(monkeypatch):
    """Issue 65: the authors'-code runner split the labeled rows in the partition's order, our arms in sorted
    order, so the two tuned their learning rate on different rows. Now the runner's rows are the very rows our
    fedhssl arm held out in a run (recorded from the run itself); the control, the partition's order, differs."""
    import importlib.util
    from pathlib import Path

    import numpy as np

    import securevfl.training as training
    from securevfl.config import RunConfig
    from securevfl.lab.compose import execute

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "reference" / "fedhssl_authors.py"
    spec = importlib.util.spec_from_file_location("fedhssl_authors", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    held: list[np.ndarray] = []
    real = training.validation_split
    monkeypatch.setattr(training, "validation_split",
                        lambda ids, y, seed: held.append(out := real(ids, y, seed)) or out)
    cfg = RunConfig(dataset="breast-cancer", method="fedhssl", seed=4)
    cfg.partition.n_labeled = 80
    cfg.partition.aligned_fraction = 0.5
    cfg.train.epochs, cfg.train.lr_grid = 1, [0.01, 0.03]
    cfg.method_params = {"ssl_epochs": 1}
    res = execute(cfg, progress=False)
    ours = held[-1]  # the fine-tuning stage's search
    active = res.partition.active
    theirs = mod.validation_rows(np.asarray(active.label_ids), np.asarray(active.y_labels), cfg.seed)
    assert isinstance(ours, np.ndarray) and np.array_equal(np.sort(theirs), np.sort(ours))
    before = real(np.asarray(active.label_ids), np.asarray(active.y_labels), cfg.seed)  # the old runner's call
    assert len(set(before.tolist()) & set(ours.tolist())) < len(ours)


def test_a_claim_about_the_swept_value_compares_the_method_with_itself(store):
    """Issue 65: "more aligned rows help" was checked with the FedHSSL-vs-baselines pairs, so the report
    printed FedHSSL's verdict twice. A ``from`` comparison pairs the method at the paper's value with itself
    at the starting value, seed by seed; the control, the same arms at one value, differ by exactly 0."""
    frame = method_frame(store / "s.sqlite")
    claim = {"method": "splitnn", "title": "more aligned rows", "paper": "p", "sweep": "m",
             "regime": "aligned_fraction", "headline": 1.0,
             "comparisons": [{"baseline": "splitnn", "from": 0.2, "paper": 0.01}]}
    table = comparison_table(frame, claim)
    assert len(table) == 1 and table.regime.iloc[0] == 1.0 and table.baseline.iloc[0] == "splitnn at 0.2"
    runs = frame[(frame.sweep == "m") & (frame.method == "splitnn")].groupby(["swept_aligned_fraction", "seed"])
    gain = runs.utility.first().unstack(0)
    assert table["mean"].iloc[0] == pytest.approx(float((gain[1.0] - gain[0.2]).mean()))
    assert table.n.iloc[0] == 3 and table.paper.iloc[0] == 0.01
    same = comparison_table(frame, {**claim, "comparisons": [{"baseline": "splitnn"}]})
    assert (same["mean"] == 0).all()  # control: without `from`, the method against itself at each value
    bad = store / "from.yaml"
    bad.write_text(yaml.safe_dump([{**claim, "comparisons": [{"baseline": "splitnn", "from": "low"}]}]))
    from securevfl.errors import UserError
    from securevfl.lab.report.methods import load_claims

    with pytest.raises(UserError, match="from: expected the regime value"):
        load_claims(bad)


def test_means_beside_a_difference_are_over_its_seeds_and_no_empty_rows(store, axes_store):
    """Issue 65: an arm's mean beside a paired difference came from its own seeds (10 authors' seeds against
    20 of ours); now both means are over the seeds the difference pairs. A seed only one arm ran moves
    neither mean (the control: the arm's mean over all its seeds does move). Rows without runs are not printed."""
    from securevfl.lab.report.methods import _shown

    frame = method_frame(store / "s.sqlite")
    claim = yaml.safe_load((store / "claims.yaml").read_text())[0]
    extra = frame[(frame.method == "splitnn") & (frame.sweep == "m")].iloc[[0]].assign(seed=99, utility=0.0)
    more = pd.concat([frame, extra], ignore_index=True)
    before = comparison_table(frame, claim).set_index(["baseline", "regime"]).loc["local"]
    after = comparison_table(more, claim).set_index(["baseline", "regime"]).loc["local"]  # local lacks seed 99
    assert after.method_mean.equals(before.method_mean) and after.n.equals(before.n)
    assert more[more.method == "splitnn"].utility.mean() != frame[frame.method == "splitnn"].utility.mean()
    d, axes_claim = axes_store
    table = comparison_table(method_frame(d / "s.sqlite"), axes_claim)
    assert (table.n == 0).any() and len(_shown(table)) == int((table.n > 0).sum())
