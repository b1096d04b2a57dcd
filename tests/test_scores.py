"""Defense scores (DCS / T-DCS / C-DCS, control-normalised), the worst-case attack search, and the
report's honesty marks and provenance — on stores built by hand, so every number is known."""

import json
import math
import re
from pathlib import Path

import pytest

from securevfl.config import RunConfig
from securevfl.errors import UserError
from securevfl.lab import scores
from securevfl.lab.engine import sweep_provenance
from securevfl.lab.report import load_frames, summarise, write_report
from securevfl.lab.store import Store
from securevfl.lab.sweep import parse_sweep
from securevfl.operations import provenance

BASE = {"name": "t", "dataset": {"name": "digits", "aligned_fraction": 0.5}, "methods": ["splitnn"],
        "defenses": ["none"], "seeds": [0], "train": {"epochs": 1}}


# ------------------------------------------------------------------------------- pure score functions
def test_dcs_hand_computed_with_one_sided_distances():
    # AP 0.6, MP 0.8 against MP* 0.9: d_AP 0.6, d_MP 0.1
    assert scores.dcs(0.6, 0.8, 0.9) == pytest.approx(1 / (1 + math.sqrt(0.5 * 0.36 + 0.5 * 0.01)))
    # a defended model above MP* is not penalised (d_MP = max(MP* − MP, 0) = 0)
    assert scores.dcs(0.3, 0.95, 0.9) == pytest.approx(1 / (1 + math.sqrt(0.5 * 0.09)))
    # AP below AP* is not rewarded: with AP* 0.2, AP 0.1 scores like AP 0.2 does with AP* 0.2
    assert scores.dcs(0.1, 0.9, 0.9, ap_star=0.2) == 1.0
    assert scores.dcs(0.0, 0.9, 0.9) == 1.0  # the ideal defense
    assert scores.dcs(1.0, 0.0, 1.0) == pytest.approx(1 / (1 + 1.0))  # the worst: distance √(0.5 + 0.5)
    assert scores.dcs(0.6, 0.8, 0.9, beta=1.0) == pytest.approx(1 / 1.1)  # β weighs utility alone
    assert scores.t_dcs([0.5, 0.7]) == 0.5 and scores.t_dcs([0.5, 0.7], "mean") == pytest.approx(0.6)
    assert math.isnan(scores.t_dcs([]))
    assert scores.c_dcs({"label_inference": 0.4, "feature_reconstruction": 0.8}) == pytest.approx(0.6)
    assert scores.c_dcs({"label_inference": 0.4, "feature_reconstruction": 0.8, "backdoor": float("nan")},
                        {"label_inference": 3, "feature_reconstruction": 1}) == pytest.approx(0.5)


def test_attack_performance_mapping_and_inverted_auc():
    # an AUC of 0.3 is as informative as 0.7: AP 0.7, 0.2 above a control at chance, flagged inverted
    assert scores.attack_performance("auc", 0.3) == pytest.approx(0.7)
    assert scores.normalised_performance("auc", 0.3, [0.5, None]) == pytest.approx(0.2)
    assert scores.inverted("auc", 0.3) and not scores.inverted("auc", 0.7) and not scores.inverted("accuracy", 0.3)
    assert scores.attack_performance("mse", 0.25) == pytest.approx(0.75)  # VFLAIR: 1 − MSE
    assert scores.attack_performance("r2", -0.4) == 0.0  # AP < 0 reads as 0
    assert scores.normalised_performance("accuracy", 0.3, [0.4]) == 0.0  # never beat its control: no leak
    assert math.isnan(scores.normalised_performance("accuracy", 0.3, [None]))
    assert scores.attack_type("mc", "accuracy") == "label_inference"
    assert scores.attack_type("fr", "accuracy") == "feature_reconstruction"  # by name, not by the ambiguous metric
    assert scores.attack_type("new-one", "asr") == "backdoor"
    assert scores.attack_type("x", "auc", kind="untargeted") == "untargeted"


def test_chance_noise():
    assert scores.at_chance(0.11, 0.0, 0.1, 300, "accuracy")  # 2·√(0.09/300) ≈ 0.035 above the prior
    assert not scores.at_chance(0.30, 0.0, 0.1, 300, "accuracy")
    assert scores.at_chance(0.30, 0.15, 0.1, 300, "accuracy")  # within twice the seed std
    assert scores.at_chance(0.52, 0.0, 0.5, 300, "auc") and not scores.at_chance(0.7, 0.0, 0.5, 300, "auc")


# ------------------------------------------------------------------------------- stores built by hand
def _put(store: Store, method: str, defense: str, seed: int, utility: float, attacks: dict | None = None,
         swept: dict | None = None, prior: float = 0.1, n_classes_metric: str = "accuracy") -> None:
    family = defense.split(":")[0]
    strength = float(defense.split(":")[1]) if ":" in defense else None
    config = {**RunConfig(dataset="digits").to_dict(), "method": method, "defense": defense, "seed": seed,
              "attacks": [{k: v.get("_set", {})} for k, v in (attacks or {}).items()], "swept": swept or {}}
    atk = {k: {kk: vv for kk, vv in v.items() if kk != "_set"} for k, v in (attacks or {}).items()}
    result = {"utility": {"metric": n_classes_metric, "test": utility, "prior": prior},
              "attacks": atk, "partition": {"test_rows": 300}, "privacy": {}, "cost": {}}
    run_id = json.dumps(config, sort_keys=True)
    store.put({"run_id": run_id, "sweep": "t", "dataset": "digits", "method": method, "defense": defense,
               "defense_family": family, "strength": strength, "seed": seed, "he": "off", "swept_json": swept or {},
               "status": "ok", "error": None, "config_json": config, "result_json": result, "utility": utility,
               "utility_metric": n_classes_metric, "seconds": 1.0, "bytes_sent": 0,
               "versions_json": {"securevfl": "0.1.0"}})


def _mc(value: float, control: float, **set_params) -> dict:
    return {"mc": {"metric": "accuracy", "value": value, "prior": 0.1, "control": control, "_set": set_params,
                   "n_aux": 40, "finetunes": "head (bottom frozen)", "params": {"steps": 300, **set_params}}}


def test_worst_case_search_picks_the_stronger_parameter(tmp_path):
    """Try 0 is the sweep file's default (steps 5); try 1 (steps 300) is built to be stronger: the score
    uses it and the report names it."""
    store = Store(tmp_path / "s.sqlite")
    for seed in (0, 1, 2):
        for defense in ("none", "iso:5"):
            weak, strong = (0.40, 0.70) if defense == "none" else (0.30, 0.50)
            _put(store, "splitnn", defense, seed, 0.9, _mc(weak + 0.01 * seed, 0.2, steps=5),
                 {"search:try": 0})
            _put(store, "splitnn", defense, seed, 0.9, _mc(strong + 0.01 * seed, 0.2, steps=300),
                 {"search:try": 1})
    store.close()
    runs, attacks = load_frames(tmp_path / "s.sqlite")
    assert set(runs.search_try) == {0, 1} and set(runs.swept) == {"{}"}  # the tries are one cell
    won = scores.worst_case(attacks).set_index("defense")
    assert won.loc["none", "try"] == 1 and json.loads(won.loc["none", "params"]) == {"steps": 300}
    assert won.loc["none", "ap"] == pytest.approx(0.71) and won.loc["none", "tries"] == 2
    summary = summarise(runs, attacks)
    cell = summary.set_index("defense")
    assert cell.loc["none", "mc_value"] == pytest.approx(0.71) and cell.loc["none", "mc_attack_seeds"] == 3
    assert cell.loc["none", "seeds"] == 3  # utility from one try per seed
    t = scores.score_table(summary, attacks).set_index("defense")
    assert t.loc["none", "DCS mc"] == pytest.approx(scores.dcs(0.71, 0.9, 0.9))
    assert t.loc["iso:5", "normalised C-DCS"] == pytest.approx(scores.dcs(0.51 - 0.2, 0.9, 0.9))
    write_report(tmp_path / "s.sqlite", tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "try 1/2: steps=300" in md and "Worst-case attacker" in md


def test_report_honesty_marks_rankings_and_provenance(tmp_path):
    """Chance-level cells, cells worse than `local`, an inverted AUC, n = 1, rankings that disagree, and the
    provenance of the store and the report."""
    store = Store(tmp_path / "s.sqlite")
    _put(store, "local", "none", 0, 0.70)
    _put(store, "splitnn", "none", 0, 0.75, _mc(0.60, 0.20))
    # raw AP 0.30, but the attack never beat its control (0.35): normalised AP 0
    _put(store, "splitnn", "iso:5", 0, 0.72, _mc(0.30, 0.35))
    # lower raw AP (0.20) but 0.10 above its control: the raw score prefers it, the normalised one does not
    _put(store, "splitnn", "iso:25", 0, 0.72, _mc(0.20, 0.10))
    _put(store, "splitnn", "iso:50", 0, 0.69, _mc(0.15, 0.10))  # below local: worse than not federating
    _put(store, "splitnn", "iso:99", 0, 0.11, _mc(0.11, 0.10))  # at chance (prior 0.1, 300 test rows)
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("name: t\nseeds: [0]\n")
    store.record_sweep(sweep_provenance(str(sweep), "t", "securevfl sweep sweep.yaml"))
    store.close()
    write_report(tmp_path / "s.sqlite", tmp_path / "rep", command="securevfl report s.sqlite --out rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    html = (tmp_path / "rep" / "report.html").read_text()
    glance = md.split("## At a glance", 1)[1].split("\n## ", 1)[0]
    assert "**2 of 5 cells are worse than not federating**" in glance  # iso 50 and iso 99
    assert "**1 cell is at chance**" in glance and "iso 99" in glance
    assert "raw and control-normalised rankings disagree" in md
    assert "best C-DCS" in glance and "best normalised C-DCS" in glance
    # the best picks skip the chance cell and the cell below local
    picks = [line for line in md.splitlines() if line.startswith("- Best utility") or "Least leakage" in line]
    assert picks and not any("iso 99" in p or "iso 50" in p for p in picks)
    assert re.search(r"\| splitnn\s*\| iso 99 .*at chance, worse than not federating", md)
    assert "(n = 1)" in md and not re.search(r"\bnan\b", md)
    # provenance: version, commit (or the words for none), command, the sweep file's hash and text
    assert f"securevfl {provenance.version()}" in md and "securevfl report s.sqlite --out rep" in md
    assert ("git commit none" in md) if provenance.git_commit() is None else (provenance.git_commit() in md)
    assert sweep_provenance(str(sweep), "t", "")["sha256"] in md and "name: t\nseeds: [0]" in md
    assert "Provenance" in html and "C-DCS" in html and "normalised C-DCS" in html


def test_an_inverted_auc_is_leakage_not_negative(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    norm = {"norm": {"metric": "auc", "value": 0.3, "prior": 0.5, "control": 0.5}}
    _put(store, "splitnn", "none", 0, 0.9, norm, prior=0.5, n_classes_metric="auc")
    store.close()
    runs, attacks = load_frames(tmp_path / "s.sqlite")
    assert attacks.leakage.iloc[0] == pytest.approx(0.2) and bool(attacks.inverted.iloc[0])
    write_report(tmp_path / "s.sqlite", tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "+0.2 (n = 1)" in md and "inverted: read as 1 − AUC" in md and "-0.2 (n = 1)" not in md


def test_report_without_local_or_recorded_sweep_says_so(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    _put(store, "splitnn", "none", 0, 0.75, _mc(0.6, 0.2))
    store.close()
    write_report(tmp_path / "s.sqlite", tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "No `local` run" in md and "records no sweep file" in md


# ------------------------------------------------------------------------------- the search's sweep key
def test_attack_search_expands_seeded_tries():
    plain = parse_sweep({**BASE, "methods": ["splitnn", "local"], "attacks": [{"mc": {"steps": 5}}]})
    data = {**BASE, "methods": ["splitnn", "local"], "attacks": [{"mc": {"steps": 5}}],
            "attack_search": {"budget": 3, "seed": 1, "space": {"mc": {"steps": [5, 50, 100], "n_aux": [20, 40]}}}}
    sw = parse_sweep(data)
    fed = [c for c in sw.cells if c.method == "splitnn"]
    assert [c.swept["search:try"] for c in fed] == [0, 1, 2] and len(sw.cells) == 3 + 1  # local once
    assert fed[0].run_id == plain.cells[0].run_id  # try 0 is the sweep file's own attack: same stored row
    points = [c.config["attacks"][0] for c in fed[1:]]
    assert len({json.dumps(p, sort_keys=True) for p in points}) == 2 and {"mc": {"steps": 5}} not in points
    assert [c.config["attacks"] for c in parse_sweep(data).cells] == [c.config["attacks"] for c in sw.cells]
    assert "search:try" not in sw.swept_keys
    whole = parse_sweep({**data, "attack_search": {"budget": 50, "space": {"mc": {"steps": [5, 50]}}}})
    assert len([c for c in whole.cells if c.method == "splitnn"]) == 2  # the grid is smaller than the budget


@pytest.mark.parametrize("search, key", [
    ({"budget": 0, "space": {"mc": {"steps": [5]}}}, "attack_search.budget"),
    ({"budget": 2, "space": {"fr": {"n_aux": [5]}}}, "attack_search.space.fr"),
    ({"budget": 2, "space": {"mc": {"steps": [-1]}}}, "attack_search.space.mc"),
    ({"budget": 2, "spaces": {}}, "attack_search.spaces"),
    ({"budget": 2}, "attack_search.space"),
])
def test_attack_search_errors_name_the_key(search, key):
    with pytest.raises(UserError, match=re.escape(repr(key))):
        parse_sweep({**BASE, "attacks": ["mc"], "attack_search": search})


def test_provenance_module():
    assert isinstance(provenance.version(), str) and provenance.version()
    commit = provenance.git_commit()
    assert commit is None or re.fullmatch(r"[0-9a-f]{40}", commit)
    assert Path(scores.__file__).exists()


@pytest.mark.slow
def test_tiny_sweep_with_search_end_to_end(tmp_path):
    """A real sweep with a search through the CLI: every try stored, the report scores the cells,
    names the winning point and records the sweep file and both commands."""
    from securevfl.cli import main

    sweep = tmp_path / "tiny.yaml"
    sweep.write_text("name: tiny\ndataset: {name: breast-cancer, aligned_fraction: 0.5}\nmethods: [local, splitnn]\n"
                     "defenses: [none, {iso: [5]}]\nattacks: [norm]\n"
                     "attack_search: {budget: 2, seed: 0, space: {norm: {n_aux: [10, 100]}}}\n"
                     "seeds: [0]\ntrain: {epochs: 1}\n")
    store = tmp_path / "tiny.sqlite"
    assert main(["sweep", str(sweep), "--store", str(store), "--quiet"]) == 0
    runs, _ = load_frames(store)
    assert len(runs) == 1 + 2 * 2 and (runs.status == "ok").all()
    assert main(["report", str(store), "--out", str(tmp_path / "rep")]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "C-DCS" in md and "Worst-case attacker" in md and "n_aux=" in md
    assert f"securevfl sweep {sweep} --store {store} --quiet" in md and f"securevfl report {store}" in md
    assert "attack_search: {budget: 2" in md
    bad = tmp_path / "bad.yaml"
    bad.write_text(sweep.read_text().replace("budget: 2", "budget: -1"))
    assert main(["sweep", str(bad), "--store", str(store), "--quiet"]) == 2
    # C-DCS weights from the command line: stated in the report; a bad one is refused before any work
    assert main(["report", str(store), "--out", str(tmp_path / "rep2"), "--weights", "LI=2,FR=1"]) == 0
    assert "mean weighted LI 2, FR 1 (`--weights`)" in (tmp_path / "rep2" / "report.md").read_text()
    assert main(["report", str(store), "--out", str(tmp_path / "rep3"), "--weights", "LI=x"]) == 2
    assert not (tmp_path / "rep3").exists()


def test_c_dcs_weights_parse_and_weigh():
    w = scores.parse_weights("LI=3, feature_reconstruction=1")
    assert w == {"label_inference": 3.0, "feature_reconstruction": 1.0}
    t = {"label_inference": 0.4, "feature_reconstruction": 0.8, "backdoor": 0.2}
    assert scores.c_dcs(t, w) == pytest.approx(0.5)  # backdoor unnamed: weight 0
    assert scores.c_dcs(t) == pytest.approx(1.4 / 3)  # the control: equal weights
    for bad in ("XX=1", "LI", "LI=a", "LI=-1", "LI=0", "LI=inf", ""):
        with pytest.raises(UserError, match="--weights"):
            scores.parse_weights(bad)


def test_backdoor_runs_keep_their_own_utility_and_the_cell_keeps_the_clean_one(tmp_path):
    """A backdoor sweep into the same store: the cell's utility (and MP*) comes from the clean runs, the
    backdoor's DCS from the utility of the federation it poisoned (VFLAIR's MP under that attack)."""
    store = Store(tmp_path / "s.sqlite")
    _put(store, "splitnn", "none", 0, 0.90, _mc(0.6, 0.2))
    _put(store, "splitnn", "none", 0, 0.80, {"backdoor-x": {"metric": "asr", "value": 0.9, "prior": 0.1,
                                                            "malicious_training": ["backdoor-x"]}})
    store.close()
    runs, attacks = load_frames(tmp_path / "s.sqlite")
    summary = summarise(runs, attacks)
    assert summary.utility.iloc[0] == pytest.approx(0.90)
    t = scores.score_table(summary, attacks).iloc[0]
    assert t["DCS backdoor-x"] == pytest.approx(scores.dcs(0.9, 0.80, 0.90))
    assert t["T-DCS TB"] == t["DCS backdoor-x"] and t["T-DCS LI"] == pytest.approx(scores.dcs(0.6, 0.9, 0.9))
    assert t["C-DCS"] == pytest.approx((t["T-DCS TB"] + t["T-DCS LI"]) / 2)


def test_a_cell_worse_than_local_never_ranks_first_nor_rings(tmp_path):
    """Issue 43: on a credit-style sweep `splitnn / iso 5` had the best C-DCS and was ranked 1 and ringed
    as Pareto-optimal while its utility was below `local`'s. Marked cells now rank below every unmarked
    one, in the table and the report, and are not on the Pareto front."""
    from securevfl.lab.report.figures import tradeoff_figure

    store = Store(tmp_path / "s.sqlite")
    for seed in (0, 1, 2):
        _put(store, "local", "none", seed, 0.80 + 0.001 * seed)
        _put(store, "splitnn", "none", seed, 0.90 + 0.001 * seed, _mc(0.80, 0.2))
        _put(store, "splitnn", "iso:1", seed, 0.88 + 0.001 * seed, _mc(0.60, 0.2))
        _put(store, "splitnn", "iso:5", seed, 0.70 + 0.001 * seed, _mc(0.21, 0.2))  # leaks least, below local
    store.close()
    runs, attacks = load_frames(tmp_path / "s.sqlite")
    summary = summarise(runs, attacks)
    t = scores.score_table(summary, attacks).set_index("defense")
    assert t.loc["iso:5", "C-DCS"] > t.loc["iso:1", "C-DCS"]  # it would win on the score alone
    assert t.loc["iso:1", "rank C-DCS"] == 1 and t.loc["iso:5", "rank C-DCS"] == 3
    assert t.loc["iso:5", "rank normalised"] > t.loc["iso:1", "rank normalised"]
    assert t.loc["iso:5", "marked"] and not t.loc["iso:1", "marked"]
    # the plot rings no marked cell: drawn among the cells above local only
    rings = []
    import matplotlib.axes

    real = matplotlib.axes.Axes.scatter

    def spy(self, x, y, *a, **k):  # type: ignore[no-untyped-def]
        if "Pareto" in str(k.get("label", "")):
            rings.extend(zip(list(x), list(y), strict=True))
        return real(self, x, y, *a, **k)

    matplotlib.axes.Axes.scatter = spy
    try:
        tradeoff_figure(summary, "digits", "mc", tmp_path / "f.png")
    finally:
        matplotlib.axes.Axes.scatter = real
    assert rings and all(u > 0.8 for u, _ in rings)
    write_report(tmp_path / "s.sqlite", tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    table = md[md.index("|   rank |"):]
    first_row = table.splitlines()[2]
    assert "iso 1" in first_row and "iso 5" not in first_row, first_row


def test_tpe_search_asks_optuna_round_by_round_and_resumes_from_the_store(tmp_path):
    """``searcher: tpe``: try 0 is the sweep's own attack, each later try is asked of Optuna's TPE
    from the stored tries' scores (one stored cell per seed); a rerun skips everything, and a sweep
    that lost its last round asks the same points again (the searcher is rebuilt from the store)."""
    import sqlite3

    from securevfl.lab.engine import run_sweep

    sweep = tmp_path / "tpe.yaml"
    sweep.write_text("name: tpe\ndataset: {name: breast-cancer}\nmethods: [splitnn]\nattacks: [norm]\n"
                     "attack_search: {budget: 3, seed: 0, searcher: tpe, space: {norm: {n_aux: [10, 20, 40, 100]}}}\n"
                     "seeds: [0, 1]\ntrain: {epochs: 1}\n")
    store = tmp_path / "tpe.sqlite"
    counts = run_sweep(str(sweep), str(store), progress=False)
    assert counts["cells"] == 6 and counts["ok"] == 6
    rows = sqlite3.connect(store).execute("SELECT run_id, swept_json, config_json FROM runs").fetchall()
    by_try: dict[int, set] = {}
    for _, swept, config in rows:
        by_try.setdefault(json.loads(swept)["search:try"], set()).add(json.dumps(json.loads(config)["attacks"]))
    assert sorted(by_try) == [0, 1, 2] and all(len(v) == 1 for v in by_try.values())  # one point per try
    assert len(set().union(*by_try.values())) == 3  # three distinct points
    again = run_sweep(str(sweep), str(store), progress=False)
    assert again["ok"] == 0 and again["skipped"] == 6
    last = {r[0] for r in rows if json.loads(r[1])["search:try"] == 2}
    db = sqlite3.connect(store)
    db.execute(f"DELETE FROM runs WHERE run_id IN ({','.join('?' * len(last))})", sorted(last))
    db.commit()
    db.close()
    resumed = run_sweep(str(sweep), str(store), progress=False)
    assert resumed["ok"] == 2
    assert {r[0] for r in sqlite3.connect(store).execute("SELECT run_id FROM runs")} >= last  # the same try 2


def test_tpe_searcher_is_named_and_checked():
    with pytest.raises(UserError, match=re.escape("'attack_search.searcher'")):
        parse_sweep({**BASE, "attacks": ["mc"], "attack_search": {"budget": 2, "searcher": "grid",
                                                                  "space": {"mc": {"steps": [5, 50]}}}})
    sw = parse_sweep({**BASE, "attacks": ["mc"], "attack_search": {"budget": 3, "searcher": "tpe",
                                                                   "space": {"mc": {"steps": [5, 50, 100]}}}})
    assert [c.swept["search:try"] for c in sw.cells] == [0] and sw.search is not None
    assert sw.search.remaining() == 2
