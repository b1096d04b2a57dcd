import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from securevfl.cli import main
from securevfl.errors import UserError
from securevfl.lab.engine import run_sweep
from securevfl.lab.report import load_frames, pareto_front, write_report
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
    f = write(tmp_path, defenses=["none", {"iso": [1, 25]}], attacks=["mc-plain"], seeds=[0, 1],
              methods=["splitnn", "local"])
    store = tmp_path / "s.sqlite"
    c = run_sweep(str(f), str(store), workers=2, progress=False)
    # local (no cut layer) runs once per seed, without defense or attack, as the utility reference
    assert c["ok"] == 8 and c["failed"] == 0
    runs, attacks = load_frames(store)
    assert set(attacks.attack) == {"mc-plain"} and len(attacks) == 6
    write_report(store, tmp_path / "rep")
    html = (tmp_path / "rep" / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 1 and "<table" in html
    first_screen = html[: html.index("<img")]
    assert "Least leakage" in first_screen and "Best utility" in first_screen and "<b>local</b>" in first_screen
    assert (tmp_path / "rep" / "tradeoff_digits_mc-plain.png").stat().st_size > 10_000


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
    f = write(tmp_path, seeds=[0, 1])
    c = run_sweep(str(f), str(tmp_path / "s.sqlite"), workers=2, engine="ray", progress=False)
    assert c["ok"] == 2


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
