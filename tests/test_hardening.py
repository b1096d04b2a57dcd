"""Hostile and careless input, foreign stores, dying workers, orphaned key holders (issue 31).

Every test here failed on main before the fix it names. docs/limits.md lists which test checks which
guarantee."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
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
from securevfl.lab.store import APPLICATION_ID, SCHEMA_VERSION, Store

ROOT = Path(__file__).resolve().parents[1]
TINY = {"name": "t", "dataset": {"name": "digits", "max_rows": 300}, "methods": ["splitnn"], "seeds": [0],
        "train": {"epochs": 1}}


def one_line_error(capsys, needle: str = "") -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and len(err.splitlines()) == 1 and needle in err, err
    return err


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


# ------------------------------------------------------------------------------------ 1. YAML limits
BOMB = "name: x\na: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefg", "bcdefgh", strict=False))


@pytest.mark.parametrize("text, needle", [
    (BOMB, "alias bomb"),
    ("name: x\ndataset: {name: digits, columns: &c [*c]}\n", "recursive alias"),
    ("name: x\nhe: {paillier: &p {key_bits: *p}}\n", "recursive alias"),
    ("name: x\nmethods: [{fedud: &m {alpha: [*m]}}]\n", "recursive alias"),
    ("name: x\ndataset: " + "[" * 5000 + "]" * 5000 + "\n", "nesting deeper"),
    ("name: x\nname: y\n", "duplicate key 'name'"),
    ("name: x\ndataset: {name: digits, name: mnist}\n", "duplicate key"),
])
@pytest.mark.parametrize("command", ["sweep", "train"])
def test_hostile_yaml_is_one_line_error(tmp_path, capsys, text, needle, command):
    f = tmp_path / "f.yaml"
    f.write_text(text)
    argv = ["sweep", str(f), "--quiet"] if command == "sweep" else ["train", "--config", str(f)]
    assert main(argv) == 2
    one_line_error(capsys, needle)


def test_endless_or_huge_files_are_refused_after_the_limit(tmp_path, capsys, monkeypatch):
    t0 = time.perf_counter()
    assert main(["sweep", "/dev/zero"]) == 2
    one_line_error(capsys, "SECUREVFL_MAX_CONFIG_BYTES")
    assert time.perf_counter() - t0 < 5
    monkeypatch.setenv("SECUREVFL_MAX_CONFIG_BYTES", "40")
    f = tmp_path / "f.yaml"
    f.write_text(yaml.safe_dump(TINY))
    assert main(["sweep", str(f)]) == 2
    one_line_error(capsys, "larger than 40 bytes")


def test_an_error_never_echoes_a_huge_value(tmp_path, capsys):
    f = tmp_path / "f.yaml"
    f.write_text(yaml.safe_dump({"seed": "x" * 900_000}))
    assert main(["train", "--config", str(f)]) == 2
    assert len(one_line_error(capsys, "seed")) < 500


def test_nul_byte_in_a_sweep_name(tmp_path, capsys):
    f = tmp_path / "f.yaml"
    f.write_text('name: "a\\0b"\ndataset: digits\n')
    assert main(["sweep", str(f)]) == 2
    one_line_error(capsys, "'name'")


# ------------------------------------------------------------------------------------ 2. the store
def _foreign(tmp_path: Path, kind: str) -> Path:
    p = tmp_path / "app.db"
    if kind == "garbage":
        p.write_bytes(b"not a database" * 100)
        return p
    db = sqlite3.connect(p)
    if kind == "other_app":
        db.execute("CREATE TABLE users (id, name)")
        db.execute("INSERT INTO users VALUES (1, 'a')")
    elif kind == "runs_of_another_shape":
        db.execute("CREATE TABLE runs (id, x)")
    elif kind == "other_application_id":
        db.execute("PRAGMA application_id = 42")
        db.execute("CREATE TABLE t (x)")
    db.commit()
    db.close()
    return p


@pytest.mark.parametrize("kind", ["garbage", "other_app", "runs_of_another_shape", "other_application_id"])
def test_a_foreign_file_is_refused_byte_for_byte_untouched(tmp_path, capsys, kind):
    p = _foreign(tmp_path, kind)
    before, listing = sha(p), sorted(os.listdir(tmp_path))
    with pytest.raises(UserError, match="not a securevfl SQLite store"):
        Store(p)
    assert main(["report", str(p), "--out", str(tmp_path / "rep")]) == 2
    one_line_error(capsys, "not a securevfl SQLite store")
    assert sha(p) == before and sorted(os.listdir(tmp_path)) == listing  # no -wal/-shm, no report folder


def test_the_store_marks_itself_and_migrates_a_marker_less_one(tmp_path):
    s = Store(tmp_path / "new.sqlite")
    s.put({"run_id": "a", "status": "ok"})
    s.close()
    header = (tmp_path / "new.sqlite").read_bytes()[:100]
    assert int.from_bytes(header[68:72], "big") == APPLICATION_ID
    assert int.from_bytes(header[60:64], "big") == SCHEMA_VERSION
    old = tmp_path / "old.sqlite"  # a store written before the marker: fewer columns, no application_id
    db = sqlite3.connect(old)
    db.execute("CREATE TABLE runs (run_id TEXT PRIMARY KEY, status, config_json, result_json)")
    db.execute("CREATE TABLE leases (run_id TEXT PRIMARY KEY, pid, host, claimed_at)")
    db.execute("INSERT INTO runs VALUES ('b', 'ok', '{}', '{}')")
    db.commit()
    db.close()
    s = Store(old)
    assert s.completed() == {"b"} and s.db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    assert "finished_at" in {r[1] for r in s.db.execute("PRAGMA table_info(runs)")}
    s.close()


def test_a_store_from_a_newer_version_is_refused(tmp_path, capsys):
    s = Store(tmp_path / "s.sqlite")
    s.db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    s.close()
    with pytest.raises(UserError, match="newer"):
        Store(tmp_path / "s.sqlite")


def test_a_write_that_fails_is_one_line(tmp_path):
    Store(tmp_path / "s.sqlite").close()
    ro = Store.open_existing(tmp_path / "s.sqlite")  # the same failure as a read-only file or a full disk
    with pytest.raises(UserError, match="cannot write"):
        ro.put({"run_id": "a", "status": "ok"})
    with pytest.raises(UserError, match="cannot write"):
        ro.claim("a")


def test_a_lease_of_a_reused_pid_is_taken_over_and_the_override(tmp_path):
    import socket

    s = Store(tmp_path / "s.sqlite")
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        from securevfl.lab.store import process_identity

        if process_identity(holder.pid) is None:
            pytest.skip("no /proc process identity on this platform")
        host = socket.gethostname()
        s.db.execute("INSERT INTO leases VALUES ('mine', ?, ?, ?, ?)",
                     (holder.pid, host, time.time(), process_identity(holder.pid)))
        # the same pid, but another process (an earlier boot or container): the claim is stale
        s.db.execute("INSERT INTO leases VALUES ('reused', ?, ?, ?, ?)", (holder.pid, host, time.time(), "x:1"))
        assert not s.claim("mine")  # the live owner's claim is respected (the control)
        assert s.claim("reused")
        s.take_over_leases = True
        assert s.claim("mine")
    finally:
        holder.kill()
        holder.wait()
        s.close()


# ------------------------------------------------------------------------------------ 3. report robustness
@pytest.fixture(scope="module")
def real_store(tmp_path_factory) -> Path:
    """One real run (breast-cancer, 1 epoch, the norm attack: a binary task), in a store."""
    d = tmp_path_factory.mktemp("store")
    f = d / "s.yaml"
    f.write_text(yaml.safe_dump({**TINY, "dataset": "breast-cancer", "attacks": ["norm"]}))
    assert main(["sweep", str(f), "--store", str(d / "s.sqlite"), "--quiet"]) == 0
    with sqlite3.connect(d / "s.sqlite") as db:
        assert db.execute("SELECT status, error FROM runs").fetchall() == [("ok", None)]
    return d / "s.sqlite"


def test_sweep_prints_its_time(tmp_path, capsys):
    """The sweep's last line says how long it took (issue 33: the main job prints its time)."""
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({**TINY, "dataset": "breast-cancer"}))
    assert main(["sweep", str(f), "--store", str(tmp_path / "s.sqlite"), "--quiet"]) == 0
    assert re.search(r"1 ran ok, 0 failed, 0 already done → .*s\.sqlite in \d+ s$", capsys.readouterr().out.strip())


DAMAGED = [{"result_json": "garbage{"}, {"result_json": "5", "swept_json": "[["}, {"utility": None},
           {"result_json": '{"attacks": {"norm": 3}}'}, {"result_json": '{"attacks": {"norm": {"value": null}}}'}]


def test_report_reads_an_older_schema_and_damaged_rows_without_writing(real_store, tmp_path, capsys):
    src = sqlite3.connect(real_store)
    row = dict(zip([c[0] for c in src.execute("SELECT * FROM runs").description],
                   src.execute("SELECT * FROM runs").fetchone(), strict=True))
    src.close()
    cols = ["run_id", "sweep", "dataset", "method", "defense", "strength", "seed", "status", "error", "config_json",
            "result_json", "utility", "epsilon", "seconds", "bytes_sent", "swept_json"]  # no finished_at, he, ...
    old = tmp_path / "old.sqlite"
    db = sqlite3.connect(old)
    db.execute(f"CREATE TABLE runs ({', '.join(cols)})")
    for i, changes in enumerate([{}, *DAMAGED]):
        new = {**row, "run_id": f"r{i}", **changes}
        db.execute(f"INSERT INTO runs VALUES ({', '.join('?' * len(cols))})", [new[c] for c in cols])
    db.commit()
    db.close()
    before = sha(old)
    assert main(["report", str(old), "--out", str(tmp_path / "rep")]) == 0, capsys.readouterr().err
    assert sha(old) == before
    assert "6 runs ok" in (tmp_path / "rep" / "report.md").read_text()


def test_report_on_a_missing_store_creates_nothing(tmp_path, capsys):
    assert main(["report", str(tmp_path / "none.sqlite"), "--out", str(tmp_path / "rep")]) == 2
    one_line_error(capsys, "not found")
    assert not (tmp_path / "rep").exists()


# ------------------------------------------------------------------------------------ 4. report injection
def test_report_escapes_names_and_sanitises_figure_paths(real_store, tmp_path):
    evil = "x' onmouseover='alert(1)/../../<b>"
    p = tmp_path / "evil.sqlite"
    p.write_bytes(real_store.read_bytes())
    with sqlite3.connect(p) as db:
        db.execute("UPDATE runs SET dataset = ?", (evil,))
    out = tmp_path / "rep"
    assert main(["report", str(p), "--out", str(out)]) == 0
    html = (out / "report.html").read_text()
    assert "onmouseover='alert" not in html and "/../../<b>" not in html and "/../../&lt;b&gt;" in html
    assert "x&#x27; onmouseover" in html or "x&#39; onmouseover" in html  # shown, escaped
    figures = [f for f in os.listdir(out) if f.endswith(".png")]
    assert figures and all("'" not in f and " " not in f for f in figures)
    assert not list(tmp_path.glob("*.png")) and not list(tmp_path.parent.glob("*.png"))  # nothing left out/


def test_report_does_not_follow_symlinks(real_store, tmp_path, capsys):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    assert main(["report", str(real_store), "--out", str(tmp_path / "link")]) == 2
    one_line_error(capsys, "symbolic link")
    out = tmp_path / "rep"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    (out / "report.md").symlink_to(victim)
    assert main(["report", str(real_store), "--out", str(out)]) == 2
    one_line_error(capsys, "symbolic link")
    assert victim.read_text() == "keep" and not list(target.iterdir())


# ------------------------------------------------------------------------------------ 5/6. plain input
TRAIN = ["train", "--dataset", "digits", "--max-rows", "200", "--epochs", "1", "--json"]


@pytest.mark.parametrize("extra, needle", [
    (["--dataset", "csv", "--party-file", "a.csv", "--party-file", "b.csv", "--max-rows", "5"], "--max-rows"),
    (["--party-file", "x.csv"], "--party-file"),
    (["--data-path", "x.csv"], "--data-path"),
    (["--id-column", "k"], "--id-column"),
    (["--drop-columns", "k"], "--drop-columns"),
    (["--aligned-fraction", "0.5", "--aligned-count", "40"], "aligned_count"),
    (["--defense", "iso:1", "--defense", "iso:2"], "more than once"),
    (["--defense", "dp:clip=1,noise=1,delta=0.99"], "delta"),
    (["--cut-dim", "100000"], "SECUREVFL_MAX_MODEL_BYTES"),
])
def test_input_once_ignored_or_crashing_is_a_one_line_error(capsys, extra, needle):
    argv = list(TRAIN)
    if extra[:2] == ["--dataset", "csv"]:
        argv = ["train", "--epochs", "1"]
    assert main(argv + extra) == 2
    one_line_error(capsys, needle)


def test_extreme_mechanism_parameters_are_no_traceback():
    from defenses.accounting import epsilon
    from defenses.functional import randomized_response, rr_with_prior_probs

    y = np.arange(10) % 3
    assert np.array_equal(randomized_response(y, 3, 710.0, np.random.default_rng(0)), y)  # e^710 overflowed
    assert rr_with_prior_probs(np.full(3, 1 / 3), 1, 1e4)[1] == 1.0
    assert epsilon([{"kind": "gaussian", "noise_multiplier": 1e-300, "participations": 3}], 1e-5) == math.inf
    assert math.isfinite(epsilon([{"kind": "gaussian", "noise_multiplier": 1.0, "participations": 3}], 1e-5))


def test_undefined_test_auc_warns():
    from types import SimpleNamespace

    from securevfl.lab.compose import run_warnings

    fed = SimpleNamespace(meta={}, active=SimpleNamespace(step=1000))
    assert run_warnings(fed, False, {"metric": "auc", "test": float("nan")})[0].startswith("test auc is undefined")
    assert run_warnings(fed, False, {"metric": "auc", "test": 0.7}) == []


def test_max_rows_5_with_one_class_test_rows_says_undefined(capsys):
    # 5 rows: one test row, so the test AUC (and the norm attack's) is undefined; it used to crash the summary
    assert main(["train", "--dataset", "breast-cancer", "--attack", "norm", "--epochs", "1", "--max-rows", "5"]) == 0
    out = capsys.readouterr()
    assert "test auc = undefined" in out.out and "auc = undefined" in out.out.split("attack norm")[1]
    assert "test auc is undefined" in out.err


def test_runtime_warnings_are_not_printed_beside_an_error(capsys, monkeypatch):
    import warnings

    from securevfl import cli

    def noisy(args):
        warnings.warn("overflow encountered in exp", RuntimeWarning, stacklevel=1)
        raise UserError("bad value")

    monkeypatch.setitem(cli.COMMANDS, "methods", noisy)
    assert main(["methods"]) == 2
    assert capsys.readouterr().err.strip() == "error: bad value"


def test_sweep_refuses_unknown_datasets_first_and_runs_duplicates_once(tmp_path, capsys):
    f = tmp_path / "f.yaml"
    f.write_text(yaml.safe_dump({**TINY, "dataset": {"name": ["digits", "no-such-data"], "max_rows": 300}}))
    store = tmp_path / "s.sqlite"
    assert main(["sweep", str(f), "--store", str(store), "--quiet"]) == 2
    one_line_error(capsys, "no-such-data")
    assert not store.exists()  # refused before any cell ran
    f.write_text(yaml.safe_dump({**TINY, "methods": ["splitnn", "splitnn"]}))
    assert main(["sweep", str(f), "--store", str(store), "--quiet"]) == 0
    out = capsys.readouterr()
    assert "1 cells: 1 ran ok" in out.out and "computed once" in out.err
    bad = tmp_path / "bad.sqlite"  # refused after the warning, before any worker starts
    bad.write_bytes(b"x" * 200)
    assert main(["sweep", str(f), "--store", str(bad), "--quiet", "--workers", "512"]) == 2
    assert "warning: --workers 512" in capsys.readouterr().err


def test_a_party_files_pair_in_a_sweep_is_no_axis():
    from securevfl.lab.sweep import parse_sweep

    for files in (["g.csv", "h.csv"], [["g.csv", "h.csv"]]):
        sw = parse_sweep({"name": "c", "dataset": {"name": "csv", "party_files": files}, "methods": ["splitnn"]})
        assert len(sw.cells) == 1 and sw.swept_keys == []
        assert sw.cells[0].config["data"]["party_files"] == ["g.csv", "h.csv"]
    sw = parse_sweep({"name": "c", "dataset": {"name": "csv", "party_files": [["a", "b"], ["c", "d"]]},
                      "methods": ["splitnn"]})
    assert len(sw.cells) == 2 and sw.swept_keys == ["party_files"]  # a list of pairs still sweeps


# ------------------------------------------------------------------------------------ 9. CSV files
def _csv(tmp_path: Path, n: int = 120) -> tuple[pd.DataFrame, Path]:
    rng = np.random.default_rng(0)
    act = pd.DataFrame({"id": np.arange(n), "a1": rng.normal(size=n), "label": np.arange(n) % 2})
    pas = pd.DataFrame({"id": np.arange(n), "b1": rng.normal(size=n)})
    pas.to_csv(tmp_path / "p.csv", index=False)
    return act, tmp_path / "p.csv"


def _partition(files: list[Path]):
    from securevfl.config import RunConfig
    from securevfl.lab.compose import build_partition

    cfg = RunConfig(dataset="csv")
    cfg.data.party_files = [str(f) for f in files]
    return build_partition(cfg)


def test_csv_with_an_unnamed_index_column_is_read_as_pandas_does(tmp_path, capsys):
    act, p = _csv(tmp_path)
    f = tmp_path / "a.csv"
    act.set_index("id").rename_axis(None).to_csv(f)  # pandas' own convention: header without the index name
    f.write_text(f.read_text().split("\n", 1)[1].join(["a1,label\n", ""]))
    assert pd.read_csv(f).index[0] == 0  # the premise: pandas makes the first column the index
    part = _partition([f, p])
    assert part.active.feature_shape == (1,)  # a1 only: the index is the ID, not a feature
    assert "reading the first column as the index" in capsys.readouterr().err


def test_csv_non_finite_values_and_huge_label_codes(tmp_path, capsys):
    act, p = _csv(tmp_path)
    f = tmp_path / "a.csv"
    bad = act.astype({"a1": object})
    bad.loc[3, "a1"] = "1e999"
    bad.to_csv(f, index=False)
    with pytest.raises(UserError, match="not a finite number"):
        _partition([f, p])
    act.assign(label=np.where(act.label == 1, "9223372036854775808", "1")).to_csv(f, index=False)
    part = _partition([f, p])
    assert part.n_classes == 2 and sorted(part.meta["classes"]) == ["1", "9223372036854775808"]


def test_csv_size_and_column_limits(tmp_path, monkeypatch):
    act, p = _csv(tmp_path)
    f = tmp_path / "a.csv"
    act.to_csv(f, index=False)
    monkeypatch.setenv("SECUREVFL_MAX_CSV_COLUMNS", "2")
    with pytest.raises(UserError, match="more than 2 columns"):
        _partition([f, p])
    monkeypatch.setenv("SECUREVFL_MAX_CSV_COLUMNS", "3")
    monkeypatch.setenv("SECUREVFL_MAX_CSV_BYTES", "100")
    with pytest.raises(UserError, match="larger than 100 bytes"):
        _partition([f, p])


# ------------------------------------------------------------------------------------ 7. a worker dies
@pytest.mark.parametrize("fn", ["die_once", "die_always"])
def test_a_killed_worker_costs_at_most_its_cell(tmp_path, monkeypatch, fn):
    from securevfl.lab.engine import LocalEngine
    from tests import _faulty

    monkeypatch.setenv("HARDEN_MARKER", str(tmp_path / "marker"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cells = [_faulty.FakeCell(seed) for seed in range(4)]
    engine = LocalEngine(2)
    engine.cell_fn = getattr(_faulty, fn)  # type: ignore[assignment]
    engine.worker_init = _faulty.init  # type: ignore[assignment]
    rows: list[dict] = []
    t0 = time.perf_counter()
    engine.run(iter(cells), "t", rows.append)  # type: ignore[arg-type]
    assert time.perf_counter() - t0 < 60
    assert sorted(r["run_id"] for r in rows) == sorted(c.run_id for c in cells)  # every cell: one row
    status = {r["seed"]: r["status"] for r in rows}
    if fn == "die_once":
        assert set(status.values()) == {"ok"}  # the killed cell and its sibling were retried
    else:  # the cell that kills its worker each time is recorded failed; its sibling in flight is not
        assert status[0] == "failed" and {status[s] for s in (1, 2, 3)} == {"ok"}
        assert "worker process died" in next(r["error"] for r in rows if r["seed"] == 0)


# ------------------------------------------------------------------------------------ 8. key holders
HOLDER = """
import json, os, sys, time
from securevfl.crypto.backend import set_he_threads
from securevfl.crypto.seal_wire import _scratch
from securevfl.crypto.paillier import PaillierBackend
set_he_threads(2)
b = PaillierBackend({"key_bits": 2048})
cts = [int(b.public_key.raw_encrypt(i)) for i in range(8)]
assert b._map("decrypt", cts) == list(range(8))
print(json.dumps({"workers": [p.pid for p in b._pool._processes.values()],
                  "scratch": os.path.dirname(_scratch())}), flush=True)
time.sleep(120)
"""


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


LIGHT_HOLDER = """
import json, os, subprocess, sys, tempfile, time
from securevfl.procs import remove_when_gone
d = tempfile.mkdtemp(prefix="securevfl-test-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
remove_when_gone(d)
child = subprocess.Popen([sys.executable, "-c", "import time; from securevfl.procs import watch_parent; "
                          f"watch_parent({os.getpid()}, 0.1); time.sleep(120)"])
time.sleep(0.5)
print(json.dumps({"workers": [child.pid], "scratch": d}), flush=True)
time.sleep(120)
"""


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="Linux /proc")
@pytest.mark.parametrize("holder", [LIGHT_HOLDER, pytest.param(HOLDER, marks=pytest.mark.slow)])
def test_key_holders_and_scratch_die_with_a_killed_parent(tmp_path, holder):
    # LIGHT_HOLDER: the two mechanisms on a bare process; HOLDER: a real Paillier pool and CKKS scratch
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True, env=env)
    try:
        info = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
        assert info["workers"] and all(not _gone(p) for p in info["workers"]) and os.path.isdir(info["scratch"])
    finally:
        proc.kill()
        proc.wait()
    deadline = time.time() + 10
    while time.time() < deadline and not (all(_gone(p) for p in info["workers"])
                                          and not os.path.exists(info["scratch"])):
        time.sleep(0.1)
    assert all(_gone(p) for p in info["workers"]), "a Paillier worker (holding p, q) outlived its parent"
    assert not os.path.exists(info["scratch"]), "CKKS scratch survived kill -9"
