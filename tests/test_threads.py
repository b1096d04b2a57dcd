"""The thread policy (securevfl/threads.py): shares from cores / load / workers, work-size caps,
explicit environment settings winning, and ``--workers auto``."""

import pytest
import torch

from securevfl import threads
from securevfl.cli import main


def test_share_divides_idle_cores_among_workers():
    assert threads.share_for(1, cores=2) == 2
    assert threads.share_for(2, cores=2) == 1
    assert threads.share_for(3, cores=2) == 1  # never zero
    assert threads.share_for(1, cores=2, idle=1) == 1  # another job holds a core
    assert threads.share_for(1, cores=64) == threads.MAX_THREADS  # many cores: tiny steps get few threads
    assert threads.share_for(4, cores=16) == 4


def test_work_size_caps_threads():
    assert threads.threads_for_work(1_000, share=8) == 1  # a tiny step: one thread
    assert threads.threads_for_work(2 * threads.WORK_PER_THREAD, share=8) == 2
    assert threads.threads_for_work(100 * threads.WORK_PER_THREAD, share=3) == 3  # never above the share


def test_workers_auto_counts_idle_cores_and_cells(monkeypatch):
    monkeypatch.setattr(threads, "idle_cores", lambda cores=None: 6)
    assert threads.workers_auto(20) == 6
    assert threads.workers_auto(3) == 3


def test_explicit_environment_wins(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("SECUREVFL_THREADS", "1")
        assert threads.configure(4) == 1 and torch.get_num_threads() == 1
        assert threads.fit_to_work(1e12) == 1  # a large model does not override the user's choice
        monkeypatch.delenv("SECUREVFL_THREADS")
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        monkeypatch.setattr(threads, "available_cores", lambda: 2)
        assert threads.configure(1, load_aware=False) == 2
        assert threads.fit_to_work(1_000) == 1 and torch.get_num_threads() == 1  # small work: fewer threads
        assert threads.fit_to_work(1e12) == 2  # back up to the share, never past it
        monkeypatch.setenv("SECUREVFL_THREADS", "1")  # set after configure (a test's fixture): it still wins
        assert threads.fit_to_work(1e12) == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_cli_workers_auto_and_bad_value(tmp_path, capsys, monkeypatch):
    seen = {}

    def fake_run_sweep(file, store, workers, engine, progress, **_):
        seen["workers"] = workers
        return {"cells": 0, "ok": 0, "failed": 0, "skipped": 0, "store": "x"}

    monkeypatch.setattr("securevfl.lab.engine.run_sweep", fake_run_sweep)
    assert main(["sweep", "f.yaml", "--workers", "auto", "--quiet"]) == 0 and seen["workers"] == "auto"
    assert main(["sweep", "f.yaml", "--workers", "many"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: argument --workers")


@pytest.mark.parametrize("workers", [0, "lots"])
def test_engine_refuses_bad_worker_counts(workers):
    from securevfl.errors import UserError
    from securevfl.lab.engine import make_engine

    with pytest.raises(UserError):
        make_engine("local", workers)


def test_worker_start_up_module_stays_light():
    # a spawned sweep worker imports this before arming its parent-death signal: no torch, no library
    import subprocess
    import sys

    code = ("import sys, securevfl.lab.worker; heavy = {'torch', 'numpy', 'securevfl.config'} & set(sys.modules); "
            "print(sorted(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
