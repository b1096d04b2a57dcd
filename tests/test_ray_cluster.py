"""A sweep across Ray nodes (issue 53): a head and a worker node (two ``ray start`` processes with their
own CPUs on this machine stand in for two machines, on loopback), each cell's node recorded in the store
and named in the report; the worker node lost mid-sweep loses no finished cell and its cells run again
on the head. Slow: a Ray cluster takes seconds to start."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


RAY_ENV = {**os.environ, "RAY_AUTH_MODE": "disabled"}
"""A test cluster on loopback: no token (a real cluster keeps Ray's token authentication; docs/lab.md)."""


def _ray(*args: str) -> subprocess.Popen:
    exe = Path(sys.executable).parent / "ray"
    return subprocess.Popen([str(exe), *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, env=RAY_ENV)


def _wait_for_nodes(port: int, n: int, timeout: float = 120.0) -> None:
    """Until the cluster at ``port`` has ``n`` live nodes (``ray status``)."""
    exe = Path(sys.executable).parent / "ray"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run([str(exe), "status", "--address", f"127.0.0.1:{port}"], capture_output=True, text=True,
                             env=RAY_ENV)
        active = out.stdout.split("Active:")[-1].split("Pending:")[0] if "Active:" in out.stdout else ""
        if active.count("node_") >= n:
            return
        time.sleep(1.0)
    pytest.fail(f"the Ray cluster did not reach {n} node(s) within {timeout:g} s")


@pytest.fixture()
def cluster():
    port = _free_port()
    head = _ray("start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port), "--num-cpus", "1",
                "--include-dashboard=false", "--disable-usage-stats", "--block")
    _wait_for_nodes(port, 1)
    worker = _ray("start", "--address", f"127.0.0.1:{port}", "--node-ip-address", "127.0.0.1", "--num-cpus", "1",
                  "--disable-usage-stats", "--block")
    _wait_for_nodes(port, 2)
    try:
        yield f"127.0.0.1:{port}", worker
    finally:
        for proc in (worker, head):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_sweep_across_two_ray_nodes_survives_losing_one(cluster, tmp_path) -> None:
    address, worker = cluster
    sweep = tmp_path / "s.yaml"
    sweep.write_text("name: nodes\ndataset: digits\nmethods: [splitnn]\ndefenses: [none]\nseeds: [0, 1, 2, 3, 4, 5]\n"
                     "train: {epochs: 8}\n")
    store = tmp_path / "s.sqlite"
    env = {**RAY_ENV, "RAY_ADDRESS": address, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    log = tmp_path / "sweep.log"
    with open(log, "w") as err_file:
        run = subprocess.Popen([sys.executable, "-m", "securevfl", "sweep", str(sweep), "--engine", "ray", "--workers",
                                "2", "--store", str(store), "--quiet"], env=env, stderr=err_file,
                               stdout=subprocess.DEVNULL)

    def nodes_done() -> list[tuple]:
        if not store.exists():
            return []
        try:
            with sqlite3.connect(store) as db:
                return db.execute("SELECT seed, status, node FROM runs").fetchall()
        except sqlite3.OperationalError:  # the table is not there yet
            return []

    deadline = time.monotonic() + 240
    while len({n for _, _, n in nodes_done()}) < 2 and time.monotonic() < deadline:  # both nodes have run a cell
        assert run.poll() is None, log.read_text()
        time.sleep(0.5)
    before = nodes_done()
    assert len({n for _, _, n in before}) == 2, (before, log.read_text())
    os.killpg(worker.pid, signal.SIGKILL)  # the worker node is lost mid-sweep
    run.wait(timeout=600)
    assert run.returncode == 0, log.read_text()
    after = nodes_done()
    assert len(after) == 6 and all(status == "ok" for _, status, _ in after), after
    assert set(before) <= set(after)  # no finished cell lost
    from securevfl.lab.report import write_report

    out = tmp_path / "report"
    write_report(store, out)
    text = (out / "report.md").read_text()
    assert "Runs per node:" in text and all(f"`{n}`" in text for _, _, n in after)
