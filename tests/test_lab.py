import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from securevfl.cli import main
from securevfl.errors import UserError
from securevfl.lab.engine import run_sweep
from securevfl.lab.report import he_table, headline, load_frames, pareto_front, write_report
from securevfl.lab.sweep import expand_defenses, parse_sweep

BASE = {"name": "t", "dataset": {"name": "digits", "aligned_fraction": 0.5}, "methods": ["splitnn"],
        "defenses": ["none"], "seeds": [0], "train": {"epochs": 1}}


def write(tmp_path: Path, **over) -> Path:
    p = tmp_path / "sweep.yaml"
    p.write_text(yaml.safe_dump({**BASE, **over}))
    return p


def rows(store: Path) -> list[tuple]:
    with sqlite3.connect(store) as db:
        return db.execute("SELECT run_id, status, finished_at FROM runs").fetchall()


def test_grid_expansion_strengths_and_run_ids():
    d = expand_defenses(["none", {"iso": [1, 5]}, {"dp": {"clip": 1.0, "noise": [0.5, 2]}}, "sparsify:50"])
    assert d == [("none", "none", None), ("iso:1", "iso", 1.0), ("iso:5", "iso", 5.0),
                 ("dp:clip=1,noise=0.5", "dp", 0.5), ("dp:clip=1,noise=2", "dp", 2.0),
                 ("sparsify:50", "sparsify", 50.0)]
    # a fixed parameter may be a word; the defense validates it
    words = expand_defenses([{"dp": {"epsilon": [4], "accountant": "gdp"}}])
    assert words == [("dp:accountant=gdp,epsilon=4", "dp", 4.0)]
    sw = parse_sweep({**BASE, "methods": ["splitnn", "local"], "defenses": ["none", {"iso": [1, 5]}],
                      "seeds": [0, 1], "dataset": {"name": "digits", "aligned_fraction": [0.2, 0.5], "labeled": 40}})
    assert len(sw.cells) == 2 * 4 * 2 and sw.swept_keys == ["aligned_fraction"]  # local: no defense cells
    assert len({c.run_id for c in sw.cells}) == len(sw.cells)
    c = sw.cells[0]
    assert c.config["partition"]["n_labeled"] == 40 and c.config["train"]["epochs"] == 1
    # the run id is a hash of the resolved config: the same cell from another file has the same id
    again = parse_sweep({**BASE, "name": "other", "methods": ["splitnn"], "defenses": ["none"], "seeds": [0],
                         "dataset": {"name": "digits", "aligned_fraction": 0.2, "labeled": 40}})
    assert again.cells[0].run_id == c.run_id


def test_attack_parameters_in_sweep_files_and_lists_sweep_them():
    sw = parse_sweep({**BASE, "methods": ["splitnn", "local"], "seeds": [0, 1],
                      "attacks": [{"mc": {"n_aux": [20, 40], "steps": 5}}, "mc-plain:baseline=false"]})
    fed = [c for c in sw.cells if c.method == "splitnn"]
    assert len(fed) == 2 * 2 and len(sw.cells) == 4 + 2  # local runs once per seed, without attacks
    assert sw.swept_keys == ["mc:n_aux"] and sorted({c.swept["mc:n_aux"] for c in fed}) == [20, 40]
    c = fed[0]
    assert c.config["attacks"] == [{"mc": {"n_aux": 20, "steps": 5}}, "mc-plain:baseline=false"]
    assert len({x.run_id for x in sw.cells}) == len(sw.cells)
    audited = parse_sweep({**BASE, "methods": ["splitnn", "local"], "audit": {"canaries": 50}})
    assert {c.method: c.config["audit"].get("canaries") for c in audited.cells} == {"splitnn": 50, "local": None}


@pytest.mark.parametrize("over, key", [
    ({"defenses": [{"iso": [1, "x"]}]}, "defenses[0].iso"),
    ({"methods": ["splitnn", "nope"]}, "methods[1]"),
    ({"colour": 1}, "colour"),
    ({"seeds": [0, "a"]}, "seeds[1]"),
    ({"train": {"epochz": 1}}, "train.epochz"),
    ({"dataset": {"name": "digits", "aligned_fraction": "half"}}, "aligned_fraction"),
    ({"defenses": [{"dp": {"clip": 1, "noise": [-1]}}]}, "dp"),
    ({"he": "rot13"}, "he"),
    ({"attacks": ["mc", "telepathy"]}, "attacks[1]"),
    ({"attacks": [{"mc": {"n_aux": [20, "x"]}}]}, "n_aux='x'"),
    ({"attacks": [{"mc": {"stepz": 5}}]}, "attacks[0]"),
    ({"attacks": ["mc:steps=0"]}, "steps must be ≥ 1"),
])
def test_malformed_sweep_file_is_one_error_line_naming_the_key(tmp_path, capsys, over, key):
    assert main(["sweep", str(write(tmp_path, **over)), "--store", str(tmp_path / "s.sqlite")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and key in err


def test_failing_cell_is_stored_and_the_rest_complete_then_rerun_skips(tmp_path):
    # fedud needs unaligned labeled rows; with everything aligned each of its cells raises a UserError
    f = write(tmp_path, methods=["splitnn", "fedud"], dataset={"name": "digits", "aligned_fraction": 1.0},
              seeds=[0, 1])
    store = tmp_path / "s.sqlite"
    c = run_sweep(str(f), str(store), progress=False)
    assert (c["ok"], c["failed"], c["skipped"]) == (2, 2, 0)
    with sqlite3.connect(store) as db:
        got = db.execute("SELECT method, status, error, result_json FROM runs ORDER BY method").fetchall()
    assert [(m, s) for m, s, *_ in got] == [("fedud", "failed")] * 2 + [("splitnn", "ok")] * 2
    assert "fedud needs labeled rows" in got[0][2]
    assert json.loads(got[2][3])["utility"]["test"] > 0.5
    before = {r[0]: r[2] for r in rows(store) if r[1] == "ok"}
    c2 = run_sweep(str(f), str(store), progress=False)
    assert (c2["ok"], c2["failed"], c2["skipped"]) == (0, 2, 2)  # ok rows kept, failed ones retried
    assert {r[0]: r[2] for r in rows(store) if r[1] == "ok"} == before
    # the report renders with failed rows in the store
    paths = write_report(store, tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "Failed runs (2)" in md and "Best utility: **splitnn**" in md
    assert "data:image/png;base64" not in (tmp_path / "rep" / "report.html").read_text() or paths


def test_killed_sweep_resumes_without_losing_or_duplicating_rows(tmp_path):
    f = write(tmp_path, defenses=["none", {"iso": [0.5, 1, 2, 4, 8]}], seeds=[0, 1])
    store = tmp_path / "s.sqlite"
    cmd = [sys.executable, "-m", "securevfl", "sweep", str(f), "--store", str(store), "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if store.exists() and len(rows(store)) >= 3:
                break
        except sqlite3.OperationalError:  # the sweep is still creating the table
            pass
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = rows(store)
    assert 3 <= len(before) < 12, "the sweep should have been killed mid-way"
    assert subprocess.run(cmd, capture_output=True).returncode == 0
    after = rows(store)
    assert len(after) == 12 == len({r[0] for r in after}) and all(r[1] == "ok" for r in after)
    kept = {r[0]: r[2] for r in after}
    assert all(kept[rid] == t for rid, _, t in before)  # completed rows were not redone


def test_two_workers_and_report_contents(tmp_path):
    f = write(tmp_path, defenses=["none", {"iso": [1, 25]}], seeds=[0, 1], methods=["splitnn", "local"],
              attacks=[{"mc-plain": {"n_aux": [20, 40], "steps": 50}}])
    store = tmp_path / "s.sqlite"
    c = run_sweep(str(f), str(store), workers=2, progress=False)
    # local (no cut layer) runs once per seed, without defense or attack, as the utility reference
    assert c["ok"] == 14 and c["failed"] == 0
    runs, attacks = load_frames(store)
    assert set(attacks.attack) == {"mc-plain"} and len(attacks) == 12 and set(attacks.n_aux) == {20, 40}
    assert attacks.control.notna().all() and attacks.leakage.notna().all()
    write_report(store, tmp_path / "rep")
    html = (tmp_path / "rep" / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 2 and "<table" in html  # one trade-off per n_aux
    # the first screen is the answer (a pick, or why there is none) and its trade-off plot, before definitions
    first_screen = html[: html.index("<img")]
    assert "The answer" in first_screen and ("<b>Pick " in first_screen or "moves any attack beyond seed noise"
                                             in first_screen or "does not pay" in first_screen), first_screen
    assert html.index("<img") < html.index("At a glance") < html.index("Data: <b>digits</b>")
    for needle in ("Data: <b>digits</b>", "seeds 0, 1", "Attack <b>mc-plain</b>", "labeled auxiliary rows",
                   "Best utility", "<b>local</b>", "mc-plain:n_aux = 20", "Leakage without a defense"):
        assert needle in html, needle
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "`mc-plain leakage`: what the federation itself leaks" in md and "no ε exists" in md
    for i in (0, 1):
        assert (tmp_path / "rep" / f"tradeoff_digits_mc-plain_{i}.png").stat().st_size > 10_000


def _cells(values: dict[str, tuple[float, float]]) -> pd.DataFrame:
    """A summary as ``summarise`` returns it: splitnn under the given defenses, mc mean and std."""
    rows = []
    for defense, (mean, std) in values.items():
        family, _, strength = defense.partition(":")
        rows.append({"dataset": "d", "method": "splitnn", "defense": defense, "family": family,
                     "strength": float(strength or 0), "he": "off", "swept": "{}", "utility": 0.9 - mean / 10,
                     "utility_std": 0.01, "seeds": 3, "metric": "accuracy", "mc_value": mean, "mc_value_std": std,
                     "mc_prior": 0.1, "mc_control": 0.5, "mc_control_std": 0.01, "mc_baseline": 0.5,
                     "mc_leakage": mean - 0.5, "mc_leakage_std": std, "mc_attack_seeds": 3})
    return pd.DataFrame(rows)


def test_headline_leads_with_the_caution_when_cells_are_within_noise():
    noisy = headline(_cells({"none": (0.60, 0.04), "iso:5": (0.58, 0.04), "iso:25": (0.57, 0.05)}), "d", "mc")
    assert noisy[0].startswith("**Caution") and "3 seeds" in noisy[0]
    assert not any(s.startswith("Least leakage") or "Trade-off" in s for s in noisy)
    # control: the same cells with a clear effect get the trade-off first and the picks
    clear = headline(_cells({"none": (0.60, 0.01), "iso:5": (0.58, 0.04), "iso:25": (0.45, 0.02)}), "d", "mc")
    assert clear[0].startswith("Trade-off: defense **iso 25** lowers the mc attack on **splitnn** by 0.15 ")
    assert not any("Caution" in s for s in clear) and any(s.startswith("Least leakage") for s in clear)


def test_pareto_front():
    pts = np.array([[0.9, 0.8], [0.85, 0.5], [0.8, 0.6], [0.7, 0.4], [0.9, 0.9]])
    assert sorted(pareto_front(pts).tolist()) == [0, 1, 3]


def test_report_errors(tmp_path):
    with pytest.raises(UserError, match="not found"):
        write_report(tmp_path / "missing.sqlite", tmp_path / "rep")
    bad = tmp_path / "bad.sqlite"
    bad.write_text("not a database")
    assert main(["report", str(bad), "--out", str(tmp_path / "rep")]) == 2


def test_unknown_engine_is_a_user_error(tmp_path, capsys):
    assert main(["sweep", str(write(tmp_path)), "--engine", "dask"]) == 2
    assert "engine" in capsys.readouterr().err


@pytest.mark.slow
def test_ray_engine(tmp_path):
    pytest.importorskip("ray")
    from securevfl.errors import UserError

    f = write(tmp_path, seeds=[0, 1])
    try:
        c = run_sweep(str(f), str(tmp_path / "s.sqlite"), workers=2, engine="ray", progress=False)
    except UserError as e:  # Ray's own head did not come up on this machine: not our code's failure
        if "could not start a local Ray instance" not in str(e):
            raise
        pytest.skip(str(e))
    assert c["ok"] == 2
    runs, _ = load_frames(tmp_path / "s.sqlite")
    assert sorted(runs.seed) == [0, 1] and (runs.utility > 0.2).all()  # digits: chance is 0.1


@pytest.mark.parametrize("failure", [
    RuntimeError("Timed out waiting for file /tmp/ray/session_x/gcs_server_port_y\nmore"),
    Exception("The current node timed out during startup. This could happen because ..."),  # the raylet
])
def test_a_ray_head_that_does_not_start_is_one_error_line(monkeypatch, failure):
    ray = pytest.importorskip("ray")
    from securevfl.errors import UserError
    from securevfl.lab import ray_engine

    tries = []

    def init(**kw):
        tries.append(kw)
        raise failure

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(UserError, match=r"could not start a local Ray instance \(2 tries\): \w"):
        ray_engine.start_ray(2)
    assert len(tries) == 2 and tries[0]["num_cpus"] == 2


def test_he_sweep_gets_a_cost_table(tmp_path):
    f = write(tmp_path, he=["off", "ckks"], optim={"optimizer": "sgd", "lr": 0.05},
              dataset={"name": "digits", "aligned_fraction": 0.3})
    store = tmp_path / "s.sqlite"
    assert run_sweep(str(f), str(store), progress=False)["ok"] == 2
    runs, _ = load_frames(store)
    assert set(runs.he) == {"off", "ckks"} and runs[runs.he == "ckks"].he_seconds.iloc[0] > 0
    write_report(store, tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "Encrypted activations: cost" in md and "ckks" in md and "does not" in md
    he = he_table(runs).set_index("he")
    assert he.loc["ckks", "hiding_bits"] == "12" and he.loc["ckks", "flooding_bits"] == "51"
    assert he.loc["off", "hiding_bits"] == "–"  # the control: no HE, no hiding claimed


def test_he_sweep_with_a_feature_attack_shows_what_encryption_buys_first(tmp_path):
    """A sweep that varies HE and runs ``fr``: the dataset's first block is the feature-leakage plot
    beside the label attack, each HE cell with its cost against its HE-off twin, and the image grid."""
    f = write(tmp_path, he=["off", "ckks"], attacks=["fr:epochs=50"],
              dataset={"name": "digits", "aligned_fraction": 0.3})
    store = tmp_path / "s.sqlite"
    assert run_sweep(str(f), str(store), progress=False)["ok"] == 2
    paths = write_report(store, tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    section = md.split("## digits", 1)[1]
    first = section.index("What encryption buys: fr")
    assert first < section.index("![") and first < section.index("Mean ± std over seeds")
    assert section.index("![") == section.index("![encryption_digits_fr]")  # the plot is the first figure
    line = next(x for x in section.splitlines() if "HE **ckks** moves fr R²" in x)
    assert "× s/step" in line and "MB/step" in line
    names = {p.name for p in paths}
    assert {"encryption_digits_fr.png", "reconstructions_digits_fr.png"} <= names


def test_he_modes_in_sweep_files_take_parameters():
    sw = parse_sweep({**BASE, "methods": ["splitnn", "local"], "he": ["off", {"paillier": {"key_bits": 2048}}]}, "f")
    assert [(c.method, c.he, c.config["he_params"]) for c in sw.cells] == [
        ("splitnn", "off", {}), ("splitnn", "paillier", {"key_bits": 2048}), ("local", "off", {})]
    with pytest.raises(UserError, match=r"he\[0\]"):
        parse_sweep({**BASE, "he": [{"paillier": 3}]}, "f")


def test_large_defense_strengths_expand_to_specs_the_defense_parser_reads():
    import defenses

    grid = [{"iso": [1000000, 1e-05, 2.5]}, {"dp": {"noise": [1e7], "clip": 1}}]
    specs = [spec for spec, _, _ in expand_defenses(grid)]
    assert specs == ["iso:1000000", "iso:1e-05", "iso:2.5", "dp:clip=1,noise=10000000"]
    for spec in specs:
        defenses.parse_defense(spec)
    with pytest.raises(UserError, match="without an exponent"):  # control: the exponent form is refused, named
        defenses.parse_defense(f"iso:{1e6:g}")


def test_every_shipped_sweep_file_expands():
    """The repository's sweep files (README, benchmarks/RESULTS.md) parse into cells, names unique
    (each has its own default store); a file with a typo does not (the control)."""
    from securevfl.lab.sweep import load_sweep

    files = sorted((Path(__file__).parents[1] / "sweeps").glob("*.yaml"))
    sweeps = [load_sweep(f) for f in files]
    assert len(files) >= 10 and all(s.cells for s in sweeps)
    assert len({s.name for s in sweeps}) == len(sweeps)
    bad = files[0].read_text().replace("methods:", "method:", 1)
    with pytest.raises(UserError, match="unknown key"):
        parse_sweep(yaml.safe_load(bad), "bad")


def _marked(d: pd.DataFrame, local: float | None = None) -> pd.DataFrame:
    from securevfl.lab import scores

    if local is not None:
        d = pd.concat([d, pd.DataFrame([{"dataset": "d", "method": "local", "defense": "none", "family": "none",
                                         "strength": 0.0, "he": "off", "swept": "{}", "utility": local,
                                         "utility_std": 0.01, "seeds": 3, "metric": "accuracy"}])], ignore_index=True)
    return scores.mark_cells(d.assign(utility_prior=0.1, test_rows=300))


def test_the_answer_picks_says_none_moves_or_says_federating_does_not_pay():
    """Issue 43's first screen: one sentence per dataset, from the three cases."""
    from securevfl.lab.report.text import recommendation

    clear = _marked(_cells({"none": (0.60, 0.01), "iso:5": (0.58, 0.04), "iso:25": (0.45, 0.02)}), local=0.5)
    lines, attack = recommendation(clear, pd.DataFrame(), "d")
    # issue 51: the attack in words, with its prior and its control beside the values
    assert attack == "mc" and lines[0].startswith(
        "**Pick splitnn / iso 25**: it lowers label inference by a passive party (`mc`) from 0.6 to 0.45 (its prior "
        "0.1, control 0.5) at a utility gain of 0.015 (0.84 → 0.855, accuracy)"), lines
    noisy = _marked(_cells({"none": (0.60, 0.04), "iso:5": (0.58, 0.04), "iso:25": (0.57, 0.05)}), local=0.5)
    lines, _ = recommendation(noisy, pd.DataFrame(), "d")
    assert lines[0].startswith("**No defense here moves any attack beyond seed noise**"), lines
    lines, _ = recommendation(_marked(clear[clear.method != "local"], local=0.99), pd.DataFrame(), "d")
    assert lines[0].startswith("**Federating does not pay here**") and "0.99" in lines[0], lines


def test_no_encryption_section_title_without_he(tmp_path):
    """Issue 43: a sweep with no HE (a feature-side defense and a feature attack) got a "What encryption
    buys" section and an "HE off / on" plot; it now says what it shows."""
    f = write(tmp_path, defenses=["none", {"dcor": [1]}], seeds=[0], methods=["splitnn"], attacks=["fr:epochs=5"])
    store = tmp_path / "s.sqlite"
    assert run_sweep(str(f), str(store), progress=False)["failed"] == 0
    write_report(store, tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "What encryption buys" not in md and "What feature-side defenses buy (no HE in this sweep)" in md


def test_a_csv_sweep_is_named_after_its_file():
    """Issue 43: every csv sweep was called "csv" in the store and the report."""
    from securevfl.lab.engine import dataset_label

    assert dataset_label({"dataset": "csv", "data": {"party_files": ["/x/default_credit_guest.csv", "h.csv"]}}) \
        == "csv: default_credit_guest"
    assert dataset_label({"dataset": "digits", "data": {}}) == "digits"


@pytest.mark.parametrize("key", ["data", "party_files", "aligned_fraction"])
def test_data_keys_at_the_top_of_a_sweep_say_they_go_under_dataset(key) -> None:
    """Issue 63: a sweep over one's own files written with a ``data:`` section was refused with a list of
    keys that did not say where data keys go; the line now names ``dataset:`` and the template. The
    control: the template itself (the same keys under ``dataset``) parses into its cells."""
    from securevfl.lab.sweep import load_config_file, parse_sweep

    value = {"party_files": ["a.csv", "b.csv"]} if key == "data" else ["a.csv"] if key == "party_files" else 0.5
    with pytest.raises(UserError, match="go under `dataset:`"):
        parse_sweep({"name": "x", key: value, "methods": ["splitnn"]}, "sweep file")
    template = Path(__file__).resolve().parents[1] / "sweeps" / "templates" / "compare-methods.yaml"
    sweep = parse_sweep(load_config_file(str(template), "sweep file"), str(template))
    assert {c.method for c in sweep.cells} >= {"local", "splitnn", "fedhssl", "vflhlp", "fedud", "risa"}
