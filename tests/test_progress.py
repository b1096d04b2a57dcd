"""Long work is never silent (issues 41 and 43): with stderr not a terminal, training and sweeps print
plain progress lines (no carriage returns) at an interval; ``--quiet`` prints none."""

from __future__ import annotations

import threading
import time

from securevfl.cli import main
from securevfl.progress import PlainProgress


def test_plain_lines_when_stderr_is_not_a_terminal(capsys, monkeypatch):
    monkeypatch.setenv("SECUREVFL_PROGRESS_SECONDS", "0")  # every update, so a short run shows it
    assert main(["train", "--dataset", "digits", "--epochs", "2", "--max-rows", "400"]) == 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("train: step")]
    assert lines and "\r" not in err and lines[-1].startswith("train: step ") and "(100%)" in lines[-1]
    assert "ETA" in lines[0] and "epoch=" in lines[0]
    assert main(["train", "--dataset", "digits", "--epochs", "2", "--max-rows", "400", "--quiet"]) == 0
    assert "train: step" not in capsys.readouterr().err  # control: --quiet silences it


def test_default_interval_keeps_short_work_quiet(capsys):
    assert main(["train", "--dataset", "digits", "--epochs", "1", "--max-rows", "400"]) == 0
    assert "train: step" not in capsys.readouterr().err


def test_a_long_step_still_reports_on_time(capsys):
    """The timer thread prints while one update takes longer than the interval."""
    with PlainProgress(3, "work", every=0.2) as bar:
        time.sleep(0.7)  # one long step, no update
        bar.update(3)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) >= 3 and lines[0].startswith("work: step 0/3 (0%)") and lines[-1].startswith("work: step 3/3")


def test_lines_from_two_parties_in_one_process_never_interleave():
    """Two parties' bars in one process (the tests, the in-process runtime) share stderr: each line is
    one write under one lock, so no line holds another's text. The recording file yields the GIL at
    every write, as a busy pipe does; ``print``'s separate newline write would interleave here."""

    class Recorder:
        def __init__(self) -> None:
            self.writes: list[str] = []

        def write(self, s: str) -> int:
            time.sleep(0.0005)
            self.writes.append(s)
            return len(s)

        def flush(self) -> None:
            pass

    out = Recorder()

    def party(name: str) -> None:
        with PlainProgress(40, name, file=out, every=0) as bar:
            for _ in range(40):
                bar.set_postfix(epoch=0)
                bar.update(1)

    threads = [threading.Thread(target=party, args=(n,)) for n in ("active", "passive1")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(out.writes) == 80
    assert all(w.endswith("\n") and w.count("\n") == 1 and w.count("step") == 1 for w in out.writes)


def test_attack_time_is_recorded_per_attack(tmp_path):
    """Each attack's wall time (with its control and baseline) is in the run JSON, hence in the store, and in
    the report's attack frame."""
    import yaml

    from securevfl.lab.engine import run_sweep
    from securevfl.lab.report import load_frames

    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"name": "s", "dataset": {"name": "breast-cancer"}, "methods": ["splitnn"],
                                 "attacks": ["norm"], "train": {"epochs": 1}}))
    run_sweep(str(f), str(tmp_path / "s.sqlite"), progress=False)
    _, attacks = load_frames(tmp_path / "s.sqlite")
    assert len(attacks) == 1 and attacks.attack_seconds.iloc[0] > 0


def test_sweep_progress_counts_cells_and_attacks(tmp_path, capsys, monkeypatch):
    import yaml

    monkeypatch.setenv("SECUREVFL_PROGRESS_SECONDS", "0")
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"name": "s", "dataset": {"name": "breast-cancer"}, "methods": ["splitnn"],
                                 "attacks": ["norm"], "seeds": [0, 1], "train": {"epochs": 1}}))
    assert main(["sweep", str(f), "--store", str(tmp_path / "s.sqlite")]) == 0
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("sweep s: cell")]
    assert lines[-1].startswith("sweep s: cell 2/2 (100%)") and "attacks=2" in lines[-1], lines


def test_a_resumed_count_does_not_flatter_the_eta(monkeypatch):
    """Issue 51: resumed with 60 of 63 cells done, one cell in 100 s left 2 more: the ETA is 200 s, not the
    3 s that counting the skipped cells as this process's own work gave."""
    import io

    from securevfl import progress

    clock = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    bar = progress.PlainProgress(63, "sweep", "cell", file=out, every=0, initial=60)
    clock[0] = 100.0
    bar.update(1)
    assert "ETA 200 s" in out.getvalue()


def test_a_phase_without_a_count_still_reports_off_a_terminal(capsys, monkeypatch):
    """Issue 51: off a terminal an HE run printed nothing for its set-up, and nothing for its final
    evaluation and attacks; a phase now reports every interval while it lasts (disabled: nothing)."""
    import time

    from securevfl.progress import phase

    monkeypatch.setenv("SECUREVFL_PROGRESS_SECONDS", "0.05")
    with phase("set-up (HE keys)"):
        time.sleep(0.3)
    err = capsys.readouterr().err
    assert err.count("set-up (HE keys), ") >= 2 and "s elapsed" in err
    with phase("attacks", False):  # the control: disabled
        time.sleep(0.2)
    assert capsys.readouterr().err == ""
