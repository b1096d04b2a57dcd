"""The sweep store under faults: unusable paths, damaged stores, concurrent sweeps, killed sweeps."""

from __future__ import annotations

import hashlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from securevfl.cli import main
from securevfl.lab.engine import run_sweep
from securevfl.lab.store import Store
from tests.test_lab import write  # the same small sweep file


def one_line_error(capsys, needle: str) -> None:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and len(err.splitlines()) == 1 and needle in err, err


@pytest.mark.parametrize("kind", ["directory", "under_a_file", "corrupt"])
def test_unusable_store_paths_are_one_line_errors(tmp_path, capsys, kind):
    f = write(tmp_path)
    if kind == "directory":
        store, needle = tmp_path, "is a directory"
    elif kind == "under_a_file":
        (tmp_path / "file").write_text("x")
        store, needle = tmp_path / "file" / "s.sqlite", "cannot open for writing"
    else:
        store, needle = tmp_path / "s.sqlite", "cannot open for writing"
        store.write_bytes(b"this is not a database" * 100)
    assert main(["sweep", str(f), "--store", str(store), "--quiet"]) == 2
    one_line_error(capsys, needle)


def test_report_reads_without_writing_and_refuses_damage(tmp_path, capsys):
    store = tmp_path / "s.sqlite"
    assert run_sweep(str(write(tmp_path)), str(store), progress=False)["ok"] == 1
    digest = hashlib.sha256(store.read_bytes()).hexdigest()
    assert main(["report", str(store), "--out", str(tmp_path / "rep")]) == 0
    capsys.readouterr()
    assert hashlib.sha256(store.read_bytes()).hexdigest() == digest
    ro = Store.open_existing(store)
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        ro.db.execute("DELETE FROM runs")
    ro.close()
    (tmp_path / "file").write_text("x")
    assert main(["report", str(store), "--out", str(tmp_path / "file" / "rep")]) == 2
    one_line_error(capsys, "not a writable directory")
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"garbage" * 200)
    assert main(["report", str(bad), "--out", str(tmp_path / "rep2")]) == 2
    one_line_error(capsys, "not a securevfl SQLite store")


def test_a_claim_held_by_a_live_process_is_respected_and_a_dead_owners_is_taken(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        store.db.execute("INSERT INTO leases (run_id, pid, host, claimed_at) VALUES ('cell', ?, ?, ?)",
                         (holder.pid, __import__("socket").gethostname(), time.time()))
        assert not store.claim("cell")  # another live sweep is computing it
    finally:
        holder.kill()
        holder.wait()
    assert store.claim("cell")  # its owner is gone: taken over
    store.put({"run_id": "cell", "status": "ok"})
    assert not store.claim("cell")  # done
    assert store.db.execute("SELECT COUNT(*) FROM leases").fetchone()[0] == 0


def test_concurrent_sweeps_on_one_store_compute_each_cell_once(tmp_path):
    f = write(tmp_path, defenses=["none", {"iso": [0.5, 1, 2, 4, 8]}])
    store = tmp_path / "s.sqlite"
    Store(store).close()  # both start on an existing store
    cmd = [sys.executable, "-m", "securevfl", "sweep", str(f), "--store", str(store), "--quiet"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    ran = [int(o.split("cells: ")[1].split(" ran ok")[0]) for o, _ in outs]
    assert sum(ran) == 6, outs  # every cell computed exactly once between the two
    with sqlite3.connect(store) as db:
        assert db.execute("SELECT COUNT(*) FROM runs WHERE status = 'ok'").fetchone()[0] == 6


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        text = (task / "children").read_text().split()
        out += [int(c) for c in text]
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_workers_die_with_a_killed_sweep(tmp_path):
    f = write(tmp_path, defenses=["none", {"iso": [0.5, 1, 2, 4, 8]}], seeds=[0, 1])
    cmd = [sys.executable, "-m", "securevfl", "sweep", str(f), "--store", str(tmp_path / "s.sqlite"), "--quiet",
           "--workers", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline, workers = time.time() + 120, []
    while time.time() < deadline and len(workers) < 2:
        workers = [c for c in _children(proc.pid) if "spawn_main" in Path(f"/proc/{c}/cmdline").read_text()]
        time.sleep(0.2)
    assert len(workers) >= 2, "the sweep should have started its workers"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 15
    while time.time() < deadline and any(_alive(w) for w in workers):
        time.sleep(0.2)
    alive = [w for w in workers if _alive(w)]
    for w in alive:  # clean up before failing
        os.kill(w, signal.SIGKILL)
    assert not alive, "workers outlived the killed sweep"
