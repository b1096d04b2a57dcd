"""Issue 61 (hardening, round 5): hostile and odd inputs as an organisation meets them deployed.

Each case was found against the old code; each test fails there and passes now, beside a control that
shows what still runs."""

from __future__ import annotations

import numpy as np
import pytest

from securevfl.errors import UserError

grpc = pytest.importorskip("grpc")

from securevfl.operations.provenance import versions  # noqa: E402
from securevfl.party_settings import PartySettings  # noqa: E402
from tests.test_grpc import Passive, small_cfg  # noqa: E402
from tests.test_grpc import deploy as deploy_run  # noqa: E402
from tests.test_grpc import files as grpc_files  # noqa: E402

files = grpc_files


@pytest.mark.parametrize("value,refused", [(1e30, True), (0.5, False)])
def test_activations_outside_tanh_are_the_senders_fault(files, monkeypatch, value, refused) -> None:
    """A hostile passive party's activations of 1e30 were blamed on the learning rate ("training
    diverged ... lower the learning rate"); t = tanh(z) lies in [−1, 1], so the active party now names
    that party's message. The control: values inside the range train as usual."""
    import torch

    from securevfl.channel import MessageKind
    from securevfl.channel.base import Endpoint

    real = Endpoint.send_tensor

    def send_tensor(self, dst, kind, t):
        if self.party == "passive1" and kind == MessageKind.ACTIVATION:
            t = torch.full_like(t, value)
        return real(self, dst, kind, t)

    monkeypatch.setattr(Endpoint, "send_tensor", send_tensor)
    p = Passive(files, own=PartySettings(seed=1))
    if refused:
        with pytest.raises(UserError, match=r"passive1 sent a activation message with values outside \[-1, 1\]") as e:
            deploy_run(files, small_cfg(files, "guest"), [p])
        assert "diverged" not in str(e.value)
    else:
        r = deploy_run(files, small_cfg(files, "guest"), [p])
        assert np.isfinite(r["utility"]["accuracy"])
        # the record of a deployed run: every phase has its seconds, and the commit is there as in the
        # simulator's (one builder of versions for both)
        assert all(r["cost"]["network"][ph]["seconds"] > 0 for ph in ("alignment", "train", "evaluate"))
        assert r["versions"] == versions() and "commit" in r["versions"]
    p.close()


@pytest.mark.parametrize("column,refused", [("nosuch_col", True), ("x12", False)])
def test_a_column_no_party_holds_is_refused_deployed(files, column, refused) -> None:
    """A deployed ``--drop-columns nosuch_col`` ran to the end on both sides (the simulator refuses the
    same name): each party now reports which named columns it holds, and the active party refuses a name
    no party holds. The control: a passive party's own column (both configured to drop it) runs."""
    from securevfl.configuration.options import DataConfig
    from securevfl.data.csvsource import named_held

    assert named_held(DataConfig(drop_columns=["x3", "zz"], numeric=["x1"]), ["id", "x1", "x3"]) == ["x1", "x3"]
    cfg = small_cfg(files, "guest")
    cfg.data.drop_columns = [column]
    p = Passive(files, own=PartySettings(seed=1))  # configured as the run's (its own drop_columns alike)
    if refused:
        with pytest.raises(UserError, match="column 'nosuch_col' .* is in no party file"):
            deploy_run(files, cfg, [p])
    else:
        assert deploy_run(files, cfg, [p])["utility"]
    p.close()
    assert p.status == (2 if refused else 0)


def test_a_label_only_active_file_points_at_active_features(tmp_path, capsys) -> None:
    """An active party file with the ID and the label only was refused with "no feature columns besides the
    ID" and no hint; the message now names ``partition.active_features: false``, and with it set (the
    control) the same file trains as Entity Augmentation's label-only host."""
    import pandas as pd

    from securevfl.cli import main

    rng = np.random.default_rng(0)
    ids = np.arange(120)
    x = rng.normal(size=(120, 3))
    pd.DataFrame({"id": ids, "y": (x[:, 0] > 0).astype(int)}).to_csv(tmp_path / "g.csv", index=False)
    pd.DataFrame({"id": ids, "a": x[:, 0], "b": x[:, 1], "c": x[:, 2]}).to_csv(tmp_path / "h.csv", index=False)
    argv = ["train", "--dataset", "csv", "--party-file", str(tmp_path / "g.csv"), "--party-file",
            str(tmp_path / "h.csv"), "--label-column", "y", "--epochs", "1", "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "partition.active_features: false" in err and "Traceback" not in err
    (tmp_path / "c.yaml").write_text("partition:\n  active_features: false\n")
    assert main([*argv, "--method", "entity-aug", "--config", str(tmp_path / "c.yaml")]) == 0


def test_the_authors_clone_must_be_the_pinned_commit_and_clean(tmp_path, monkeypatch) -> None:
    """``benchmarks/reference/fedhssl_authors.py`` took an empty folder whose ``.git/HEAD`` named the
    pinned commit, and a clone with edited files: a result of other code would be stored as the authors'.
    Now the commit object must exist and the tracked files match it. The control: a clean checkout of
    the (here: a stand-in) pinned commit passes."""
    import importlib.util
    import subprocess
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "reference" / "fedhssl_authors.py"
    spec = importlib.util.spec_from_file_location("fedhssl_authors", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fake = tmp_path / "fake"
    (fake / ".git").mkdir(parents=True)
    (fake / ".git" / "HEAD").write_text(mod.COMMIT + "\n")
    with pytest.raises(SystemExit, match="holds no commit|not a clean clone"):
        mod.check_clone(fake)
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *a],
                              capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    (repo / "main.py").write_text("print(1)\n")
    git("add", "main.py")
    git("commit", "-qm", "x")
    with pytest.raises(SystemExit, match="not a clean clone"):  # another commit than the pinned one
        mod.check_clone(repo)
    monkeypatch.setattr(mod, "COMMIT", git("rev-parse", "HEAD"))
    assert mod.check_clone(repo) == mod.COMMIT  # the control: clean, at the commit
    (repo / "main.py").write_text("print(2)\n")
    with pytest.raises(SystemExit, match="tracked files differ"):
        mod.check_clone(repo)


def test_the_html_reports_contents_are_links() -> None:
    """The HTML report's table of contents rendered as literal Markdown links ``[t](#t)``; now they are
    anchors (the Markdown report keeps its Markdown)."""
    from pathlib import Path

    from securevfl.lab.report.render import _render_html, _render_md

    sections = [("At a glance", [("ul", ["[Digits](#digits)", "**bold** a<b"])]), ("Digits", [("p", "x")])]
    page = _render_html("", sections)
    assert "<a href='#digits'>Digits</a>" in page and "](#" not in page and "id='digits'" in page
    assert "a&lt;b" in page  # still escaped
    assert "[Digits](#digits)" in _render_md("", sections, Path("."))


def _string_ids(n: int, start: int = 0) -> np.ndarray:
    return np.array([f"CUST-{i:012d}" for i in range(start, start + n)], dtype=object)


def test_the_passive_partys_id_checks_are_linear_on_string_ids() -> None:
    """At 200k string IDs the passive party's set-up sat in ``np.isin`` (every pair compared: ≈ 10 min of
    CPU here) before training: its checks (announced IDs within its PSI result, the test split, the rows
    it serves) now take well under a second each. The control: the same answers as numpy's on a sample."""
    import time

    from securevfl.ids import difference, intersect, member
    from securevfl.policy import ServedRows
    from securevfl.serve import _within

    own = _string_ids(200_000)
    aligned = own[::2]
    test = aligned[::5]
    t0 = time.perf_counter()
    _within(aligned, own, "aligned IDs")
    _within(test, aligned, "test IDs")
    train = aligned[~member(aligned, test)]
    served = ServedRows(train, test, 4096)
    served.add_train(train[:1000])
    served.check(train[:4096], "train")
    both = intersect(own, aligned)
    rest = difference(own, aligned)
    assert time.perf_counter() - t0 < 10.0  # quadratic: minutes
    assert len(train) == len(aligned) - len(test) and len(both) == len(aligned) and len(rest) == 100_000
    with pytest.raises(UserError, match="outside this party's own PSI result"):
        _within(_string_ids(3, 10_000_000), own, "aligned IDs")
    sample, pool = own[:2000], aligned[:1500]
    assert (member(sample, pool) == np.isin(sample, pool)).all()
    assert (intersect(sample, pool) == np.intersect1d(sample, pool)).all()


def test_a_deployed_run_on_200k_string_ids_completes(files, tmp_path) -> None:
    """The 200k-row deployed run with string IDs ``CUST-…`` never started training (the active party gave
    up after 120 s: "passive1 sent no control message"). It completes now on the default timeout, and its
    JSON gives the alignment's seconds (≈ 6 s in all on 2 cores)."""
    import pandas as pd

    from securevfl.channel.grpc import DEFAULT_TIMEOUT

    rng = np.random.default_rng(0)
    n = 200_000
    ids = _string_ids(n)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    pd.DataFrame({"id": ids, "y": (x[:, 0] + x[:, 2] > 0).astype(int), "a0": x[:, 0], "a1": x[:, 1]}).to_csv(
        tmp_path / "g.csv", index=False)
    pd.DataFrame({"id": ids[::-1], "b0": x[::-1, 2], "b1": x[::-1, 3]}).to_csv(tmp_path / "h.csv", index=False)
    big = {**files, "guest": tmp_path / "g.csv", "host": tmp_path / "h.csv"}
    cfg = small_cfg(big, "guest", partition__alignment="plain")
    cfg.train.batch_size = 4096
    p = Passive(big, own=PartySettings(seed=1, allow=frozenset({"plain-alignment"})), timeout=DEFAULT_TIMEOUT)
    r = deploy_run(big, cfg, [p], timeout=DEFAULT_TIMEOUT)
    p.close()
    assert p.status == 0 and r["utility"]["accuracy"] > 0.6
    assert r["partition"]["aligned"] + r["partition"]["test_rows"] == n
    assert r["cost"]["network"]["alignment"]["seconds"] < 60  # the passive party's set-up within it


@pytest.mark.parametrize("heartbeat", [True, False])
def test_a_busy_peer_says_so_and_is_waited_for(files, monkeypatch, heartbeat) -> None:
    """A passive party busy longer than the timeout (here: its set-up takes 3 s, the timeout is 1.5 s) made
    the active party give up with "passive1 sent no control message within …", blaming a stalled peer or
    the network. The busy party now sends heartbeats and is waited for; the control (no heartbeat)
    times out as before."""
    import contextlib
    import time

    from securevfl import serve as serve_mod
    from securevfl.channel.grpc import GrpcChannel

    real = serve_mod.party_data

    def slow(name, *a, **kw):  # the passive party's set-up
        time.sleep(3.0)
        return real(name, *a, **kw)

    monkeypatch.setattr(serve_mod, "party_data", slow)
    if not heartbeat:
        monkeypatch.setattr(GrpcChannel, "busy", lambda self, party, what: contextlib.nullcontext())
    p = Passive(files, own=PartySettings(seed=1), timeout=1.5)
    if heartbeat:
        r = deploy_run(files, small_cfg(files, "guest"), [p], timeout=1.5)
        assert r["cost"]["network"]["alignment"]["seconds"] > 3.0
    else:
        with pytest.raises(UserError, match="passive1 .*sent no control message within 1.5 s"):
            deploy_run(files, small_cfg(files, "guest"), [p], timeout=1.5)
    p.close()


def test_a_checkpoint_that_cannot_be_written_is_one_line_on_both_sides(files, tmp_path, monkeypatch) -> None:
    """A passive party's checkpoint on a full disk ended in ``OSError`` with a traceback, and the active
    party was told its peer "went away … restart it with the same flags". Now the passive party prints
    one line naming its folder and the cause, the active party gets that line as the abort reason,
    and a ``--serve-forever`` party serves the next run (the control: with space again, it completes)."""
    import errno
    import threading

    from securevfl.channel.grpc import GrpcChannel, NetConfig, TLSFiles
    from securevfl.deploy import serve, train_deployed
    from securevfl.passive_own import from_run
    from securevfl.storage import checkpoint as ck_mod

    cfg = small_cfg(files, "guest")
    real, full = ck_mod.open_new, [True]

    def open_new(path, *a, **kw):
        if full[0] and "ckp" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, *a, **kw)

    monkeypatch.setattr(ck_mod, "open_new", open_new)
    certs = files["certs"]
    ch = GrpcChannel("passive1", NetConfig(TLSFiles.load(certs / "passive1", "passive1"), timeout=30),
                     listen="127.0.0.1:0", client="active")
    own = PartySettings(seed=1, model=from_run(cfg.model, cfg.optim, cfg.train.lr_grid, cfg.data))
    status: list = []
    t = threading.Thread(target=lambda: status.append(serve(ch, str(files["host"]), "id", serve_forever=True, own=own,
                                                            checkpoint=str(tmp_path / "ckp"))), daemon=True)
    t.start()
    peers = {"passive1": f"127.0.0.1:{ch.port}"}
    try:
        for attempt in ("full", "space"):
            full[0] = attempt == "full"
            active = GrpcChannel("active", NetConfig(TLSFiles.load(certs / "active", "active"), timeout=30),
                                 peers=peers)
            try:
                if attempt == "full":
                    with pytest.raises(UserError) as e:
                        train_deployed(cfg, active, peers, progress=False, checkpoint=str(tmp_path / f"cka-{attempt}"))
                    msg = str(e.value)
                    assert "passive1" in msg and "No space left on device" in msg and "--checkpoint" in msg, msg
                    assert "went away" not in msg
                else:
                    r = train_deployed(cfg, active, peers, progress=False, checkpoint=str(tmp_path / f"cka-{attempt}"))
                    assert r["utility"]
            finally:
                active.close()
        assert t.is_alive() and not status  # still serving
    finally:
        ch.close()


def test_a_spill_folder_that_cannot_be_used_is_one_line(tmp_path, monkeypatch, capsys) -> None:
    """A missing spill folder (or one on a full disk) ended in ``FileNotFoundError``/``OSError`` tracebacks
    from ``train`` and crashed ``doctor party``, which also said ``ok`` for a folder it could not write.
    Now both name the folder and the cause; the control: an existing folder."""
    import pandas as pd

    from securevfl.cli import main
    from securevfl.operations import doctor
    from securevfl.storage import spill

    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 3))
    pd.DataFrame({"id": range(200), "y": (x[:, 0] > 0).astype(int), "a": x[:, 0]}).to_csv(tmp_path / "g.csv",
                                                                                         index=False)
    pd.DataFrame({"id": range(200), "b": x[:, 1], "c": x[:, 2]}).to_csv(tmp_path / "h.csv", index=False)
    argv = ["train", "--dataset", "csv", "--party-file", str(tmp_path / "g.csv"), "--party-file",
            str(tmp_path / "h.csv"), "--label-column", "y", "--epochs", "1", "--no-progress"]
    monkeypatch.setattr(spill, "_DIR", None)
    monkeypatch.setenv("SECUREVFL_SPILL_DIR", str(tmp_path / "nosuch"))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: spill folder") and str(tmp_path / "nosuch") in err and "Traceback" not in err
    checks = doctor.check_resources(tmp_path / "h.csv", [], available=lambda: 2 ** 40)
    assert any(not c.ok and "does not exist" in c.detail for c in checks)
    (tmp_path / "spill").mkdir()
    monkeypatch.setenv("SECUREVFL_SPILL_DIR", str(tmp_path / "spill"))
    assert all(c.ok for c in doctor.check_resources(tmp_path / "h.csv", [], available=lambda: 2 ** 40))
    monkeypatch.setattr(spill, "_DIR", None)
    assert main(argv) == 0


def test_a_huge_line_and_a_fifo_are_one_accurate_line(tmp_path, monkeypatch) -> None:
    """A 2 GB line in a party file raised ``MemoryError`` and then ``IndexError`` while formatting the
    message (``str(MemoryError())`` is empty); a FIFO or device as party file was "no such file". Now a
    line over ``SECUREVFL_MAX_LINE_BYTES`` is refused as it streams past (here 3 MB against a 1 MiB cap),
    and a FIFO is named as what it is. The controls: the same file under a larger cap, a regular file."""
    import os

    from securevfl.data.blocks import _blocks, check_file

    path = tmp_path / "p.csv"
    path.write_text("id,a\n1,2\n3," + "9" * 3_000_000 + "\n4,5\n")
    monkeypatch.setenv("SECUREVFL_MAX_LINE_BYTES", str(1 << 20))
    with pytest.raises(UserError, match=r"line 3 is longer than 1048576 bytes \(SECUREVFL_MAX_LINE_BYTES\)"):
        list(_blocks(path))
    monkeypatch.setenv("SECUREVFL_MAX_LINE_BYTES", str(8 << 20))
    assert sum(len(b) for b in _blocks(path)) == 3
    fifo = tmp_path / "f.csv"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match="not a regular file"):
        check_file(fifo)
    with pytest.raises(UserError, match="no such file"):
        check_file(tmp_path / "nosuch.csv")
    assert check_file(path) == ["id", "a"]


@pytest.mark.parametrize("ours", [True, False])
def test_worker_pools_do_not_run_a_script_without_a_main_guard(tmp_path, ours) -> None:
    """A script that wraps the library without ``if __name__ == "__main__":`` hung: every spawned worker
    (PSI, Paillier, a sweep) re-imported it, started its own party and waited for a handshake. Our pools
    start their workers with a stand-in main module: the script runs once. The control: a plain spawn
    pool runs it again in its workers."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    mark = tmp_path / "imports.txt"
    make = ("from securevfl.procs import spawn_pool\npool = spawn_pool(2)" if ours else
            "from concurrent.futures import ProcessPoolExecutor\nfrom multiprocessing import get_context\n"
            "pool = ProcessPoolExecutor(2, mp_context=get_context('spawn'))")
    script = tmp_path / "wrapper.py"
    script.write_text(f"import operator, os, sys\nsys.path.insert(0, {str(root)!r})\n"
                      f"open({str(mark)!r}, 'a').write(f'{{os.getpid()}}\\n')\n{make}\n"
                      "print(sum(pool.map(operator.neg, [1, 2, 3])))\npool.shutdown()\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    runs = len(mark.read_text().split())
    if ours:
        assert out.returncode == 0 and out.stdout.strip() == "-6" and runs == 1, out.stderr
    else:
        assert runs > 1  # each worker imported the script


def test_ctrl_c_of_a_deployed_active_party_says_what_was_kept(files, tmp_path, capfd) -> None:
    """Ctrl-C of a deployed active party with ``--checkpoint`` said only ``error: interrupted``, and the
    passive party that its peer "closed the connection". Now the active party says which epoch's
    checkpoints are kept and what to run, and the passive party is told the operator interrupted."""
    import os
    import signal
    import subprocess
    import sys
    import threading
    import time
    from pathlib import Path

    from securevfl.channel.grpc import GrpcChannel, NetConfig, TLSFiles
    from securevfl.deploy import serve

    certs = files["certs"]
    ch = GrpcChannel("passive1", NetConfig(TLSFiles.load(certs / "passive1", "passive1"), timeout=30),
                     listen="127.0.0.1:0", client="active")
    own = PartySettings(seed=1)  # both sides on the default model
    status: list = []
    t = threading.Thread(target=lambda: status.append(serve(ch, str(files["host"]), "id", own=own,
                                                            checkpoint=str(tmp_path / "ckp"))), daemon=True)
    t.start()
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "securevfl", "train", "--dataset", "csv", "--party-file", str(files["guest"]),
           "--peer", f"passive1=127.0.0.1:{ch.port}", "--tls", str(certs / "active"), "--label-column", "y",
           "--epochs", "100000", "--seed", "3", "--checkpoint", str(tmp_path / "cka"), "--no-progress"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not list((tmp_path / "cka").glob("*/epoch-*.pt")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    t.join(timeout=30)
    ch.close()
    assert proc.returncode == 130
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: interrupted; the checkpoints of epoch ") and "--resume" in line, err
    assert status == [2]
    assert "the active party's operator interrupted the run" in capfd.readouterr().err


@pytest.mark.parametrize("folder", ["foreign", "certs"])
def test_certificates_of_two_certs_runs_are_named_as_such(files, folder) -> None:
    """Certificates from two ``securevfl certs`` runs gave raw gRPC text (``BAD_SIGNATURE … OK — the TLS
    handshake failed …``) cut short. Now one line says both folders must come from one ``securevfl
    certs --out`` folder (the doctor's reach check gives the same line). The control: one folder."""
    from securevfl.channel.grpc import GrpcChannel, NetConfig, TLSFiles

    p = GrpcChannel("passive1", NetConfig(TLSFiles.load(files["certs"] / "passive1", "passive1"), timeout=5),
                    listen="127.0.0.1:0", client="active")
    a = GrpcChannel("active", NetConfig(TLSFiles.load(files[folder] / "active", "active"), timeout=5),
                    peers={"passive1": f"127.0.0.1:{p.port}"})
    try:
        if folder == "foreign":
            with pytest.raises(UserError) as e:
                a.wait_ready()
            msg = str(e.value)
            assert "must come from one `securevfl certs --out` folder" in msg and "another CA" in msg, msg
            assert "SSL_ERROR" not in msg and len(msg) < 300
        else:
            a.wait_ready()
    finally:
        a.close()
        p.close()


@pytest.mark.parametrize("std,words", [(0.116, "within ±0.232"), (float("nan"), "one seed per cell")])
def test_not_moved_says_the_interval_it_judged_by(std, words) -> None:
    """The first screen said "not moved beyond seed noise" for 0.264 → 0.083 (below the prior) with no
    word of why: one seed's std was 0.116. It now gives the interval it judged by, and with one seed
    says that one seed cannot judge."""
    import pandas as pd

    from securevfl.lab.report.text import _judged_by

    d = pd.DataFrame({"method": ["splitnn", "splitnn"], "defense": ["none", "dp"], "he": ["off", "off"],
                      "swept": ["", ""], "family": ["none", "gradient"], "mc_value": [0.264, 0.083],
                      "mc_value_std": [0.02, std], "utility": [0.9, 0.85]})
    if std != std:
        d["mc_value_std"] = float("nan")
    text = _judged_by(d, d.iloc[1], "mc")
    assert words in text, text
    if std == std:
        assert "-0.181" in text or "−0.181" in text


def test_pre_training_and_a_busy_passive_party_say_what_they_do(monkeypatch, capfd) -> None:
    """Pre-training printed nothing, even in one process, and a passive party busy with requests other
    than supervised steps reported "step 0" for a minute. Now FedHSSL's pre-training has its own line
    per epoch, and the passive party's line counts the requests it answered and names the last."""
    from securevfl.cli import main

    monkeypatch.setenv("SECUREVFL_PROGRESS_SECONDS", "0")  # a line at every update
    assert main(["train", "--dataset", "breast-cancer", "--method", "fedhssl", "--epochs", "1",
                 "--method-param", "ssl_epochs=2"]) == 0
    err = capfd.readouterr().err
    assert "fedhssl pre-training: epoch 2/2 (100%)" in err and "cross_loss=" in err, err[-2000:]


def test_a_passive_party_busy_with_requests_says_so(files, monkeypatch, capfd) -> None:
    """A deployed passive party in FedHSSL's pre-training reported "step 0" for as long as it lasted; its
    line now counts the requests it answered and names the last (here a line every 0.1 s)."""
    import time

    from securevfl import runtime

    monkeypatch.setenv("SECUREVFL_PROGRESS_SECONDS", "0.1")
    real = runtime.decode_json

    def slow(msg):  # each request takes a while, as on a real network: the ticker's lines fall among them
        time.sleep(0.03)
        return real(msg)

    monkeypatch.setattr(runtime, "decode_json", slow)
    cfg = small_cfg(files, "guest", method="fedhssl", method_params={"ssl_epochs": 3})
    p = Passive(files, own=PartySettings(seed=1))
    deploy_run(files, cfg, [p])
    p.close()
    lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("passive1 serving")]
    assert any("requests=" in line and "last=" in line for line in lines), lines[-5:]
