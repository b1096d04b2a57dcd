"""``securevfl doctor`` (issue 53): each check, with the case it must catch and a control it passes."""

from __future__ import annotations

import datetime as dt
import shutil
import socket
import threading
from pathlib import Path

import pytest

pytest.importorskip("grpc")

from securevfl.channel.grpc import GrpcChannel, NetConfig, TLSFiles  # noqa: E402
from securevfl.cli import main  # noqa: E402
from securevfl.deploy import serve  # noqa: E402
from securevfl.operations import doctor  # noqa: E402
from securevfl.party_settings import PartySettings  # noqa: E402
from tests.test_grpc import files as grpc_files  # noqa: E402

files = grpc_files  # per-party files and two federations' certificates (a module fixture)


def test_tls_checks_each_way_a_certificate_is_wrong(files, tmp_path) -> None:
    certs, foreign = files["certs"], files["foreign"]
    assert doctor.check_tls(certs / "passive1", "passive1").ok  # the control
    mixed = tmp_path / "mixed"
    shutil.copytree(certs / "passive1", mixed)
    shutil.copy(foreign / "passive1" / "passive1.pem", mixed / "passive1.pem")
    shutil.copy(foreign / "passive1" / "passive1.key", mixed / "passive1.key")
    assert "not signed by the CA" in doctor.check_tls(mixed, "passive1").detail  # another federation's
    swapped = tmp_path / "swapped"
    shutil.copytree(certs / "passive1", swapped)
    shutil.copy(foreign / "passive1" / "passive1.key", swapped / "passive1.key")
    assert "does not belong" in doctor.check_tls(swapped, "passive1").detail
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    shutil.copy(certs / "passive2" / "ca.pem", renamed / "ca.pem")
    shutil.copy(certs / "passive2" / "passive2.pem", renamed / "passive1.pem")
    shutil.copy(certs / "passive2" / "passive2.key", renamed / "passive1.key")
    assert "names passive2, not passive1" in doctor.check_tls(renamed, "passive1").detail
    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=400)
    assert "expired" in doctor.check_tls(certs / "passive1", "passive1", now=later).detail
    earlier = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=1)
    assert "valid only from" in doctor.check_tls(certs / "passive1", "passive1", now=earlier).detail
    soon = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=360)
    c = doctor.check_tls(certs / "passive1", "passive1", now=soon)
    assert c.ok and c.warning
    assert not doctor.check_tls(tmp_path / "nothing", "passive1").ok


@pytest.mark.parametrize("body,active,what", [
    ("id,y,a\n1,0,2\n1,1,3\n", True, "duplicate ID"),
    ("id,y,a\n1,0,2\n,1,3\n", True, "missing ID"),
    ("key,y,a\n1,0,2\n", True, "no ID column"),
    ("id,a\n1,2\n", True, "no label column"),
    ("id,y,a\n1,0,2\n", False, "holds the label column"),
])
def test_file_checks(tmp_path, body, active, what) -> None:
    f = tmp_path / "p.csv"
    f.write_text(body)
    c = doctor.check_party_file(f, "id", "y", active)
    assert not c.ok and what in c.detail
    f.write_text("id,y,a\n1,0,2\n2,1,3\n" if active else "id,a\n1,2\n2,3\n")  # the control
    assert doctor.check_party_file(f, "id", "y", active).ok


def test_memory_disk_and_listen_checks(tmp_path) -> None:
    f = tmp_path / "p.csv"
    f.write_text("id,a\n" + "".join(f"{i},{i}\n" for i in range(1000)))
    low = doctor.check_resources(f, [str(tmp_path / "ck")], available=lambda: 10)
    assert not low[0].ok and low[1].ok and low[2].ok  # memory short, disk fine (the spill folder, ck)
    assert doctor.check_resources(f, [], available=lambda: 2 ** 40)[0].ok
    assert "the file's columns need about 0.00 GiB" in low[1].detail
    # the spill folder's need follows the file's cells: 20 bytes each (8 parsed, 8 hashed, 4 encoded)
    assert abs(doctor._cells(f) - 2000) < 50
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        assert not doctor.check_listen(f"127.0.0.1:{taken}").ok
    assert doctor.check_listen("127.0.0.1:0").ok


def _serving(files, own: PartySettings | None = None) -> tuple[GrpcChannel, threading.Thread]:
    from securevfl.operations.doctor import passive_verdict

    ch = GrpcChannel("passive1", NetConfig(TLSFiles.load(files["certs"] / "passive1", "passive1"), timeout=20),
                     listen="127.0.0.1:0", client="active")
    ch.doctor = lambda d: passive_verdict(d, own or PartySettings(), str(files["host"]), "id")
    t = threading.Thread(target=lambda: serve(ch, str(files["host"]), "id", own=own), daemon=True)
    t.start()
    return ch, t


def _doctor_train(files, ch: GrpcChannel, *extra: str, certs: Path | None = None) -> int:
    return main(["doctor", "train", "--dataset", "csv", "--party-file", str(files["guest"]), "--label-column", "y",
                 "--peer", f"passive1=127.0.0.1:{ch.port}", "--tls", str((certs or files["certs"]) / "active"),
                 "--timeout", "5", *extra])


def test_the_peers_checks(files, capsys) -> None:
    """Reach (mutual TLS), version, clock and the passive party's policy on this run, each with its failure."""
    ch, _ = _serving(files)
    try:
        assert _doctor_train(files, ch) == 0  # the control
        out = capsys.readouterr().out
        assert all(f"ok   {c} passive1" in out for c in ("reach", "version", "clock", "policy"))
        assert _doctor_train(files, ch, "--alignment", "plain") == 2
        assert "FAIL policy passive1" in capsys.readouterr().out
        assert _doctor_train(files, ch, certs=files["foreign"]) == 2  # another federation's certificate
        assert "FAIL reach passive1" in capsys.readouterr().out
        honest = ch.doctor
        assert honest is not None
        ch.doctor = lambda d: {**honest(d), "time": honest(d)["time"] + 1000}  # the peer's clock is 1000 s ahead
        assert _doctor_train(files, ch) == 2
        assert "FAIL clock passive1" in capsys.readouterr().out
        ch.doctor = lambda d: {**honest(d), "version": "0.0.1"}  # an older securevfl at the peer
        assert _doctor_train(files, ch) == 2
        assert "FAIL version passive1" in capsys.readouterr().out
    finally:
        ch.close()


def test_doctor_party_and_its_usage(files, capsys) -> None:
    base = ["doctor", "party", "--role", "passive1", "--listen", "127.0.0.1:0", "--tls",
            str(files["certs"] / "passive1")]
    assert main([*base, "--party-file", str(files["host"])]) == 0
    assert main([*base, "--party-file", str(files["guest"])]) == 0  # a passive party does not know the label's name
    assert main(["doctor"]) == 2 and "doctor checks the command" in capsys.readouterr().err
    assert main(["doctor", "train", "--dataset", "digits"]) == 2


def test_the_settings_digest_pins_a_run(files, capsys) -> None:
    """``doctor train`` prints the run's settings digest; a party started with ``--expect-settings`` of
    that digest accepts the run and refuses any other (another number of epochs here), before data moves."""
    import re

    from securevfl.party_settings import settings_digest

    probe, _ = _serving(files)
    try:
        assert _doctor_train(files, probe) == 0
        digest = re.search(r"ok   settings: digest ([0-9a-f]{16})", capsys.readouterr().out).group(1)
    finally:
        probe.close()
    ch, _ = _serving(files, PartySettings(expect_settings=digest))
    try:
        assert _doctor_train(files, ch) == 0  # the control: the agreed run
        assert "ok   policy passive1" in capsys.readouterr().out
        train = ["train", "--dataset", "csv", "--party-file", str(files["guest"]), "--label-column", "y", "--peer",
                 f"passive1=127.0.0.1:{ch.port}", "--tls", str(files["certs"] / "active"), "--timeout", "20"]
        assert main(train) == 0  # the run itself sends the description the doctor digested
        assert _doctor_train(files, ch, "--epochs", "3") == 2
        out = capsys.readouterr().out
        assert "FAIL policy passive1" in out and f"this party agreed to {digest}" in out
    finally:
        ch.close()
    hello = {"seed": 1, "party": "passive1", "index": 1, "method": "splitnn"}
    same = settings_digest(hello)
    assert settings_digest({**hello, "party": "passive2", "index": 2, "resume_epoch": 3}) == same
    assert settings_digest({**hello, "seed": 2}) != same
    base = ["doctor", "party", "--role", "passive1", "--listen", "127.0.0.1:0", "--tls",
            str(files["certs"] / "passive1"), "--party-file", str(files["host"])]
    assert main([*base, "--expect-settings", "not-hex"]) == 2
    assert "--expect-settings 'not-hex': expected the 16 hex digits" in capsys.readouterr().err


def test_a_wrong_port_and_a_passive_label_column_fail_in_seconds(files, tmp_path, capsys) -> None:
    """Issue 63: ``doctor train`` against a port nothing listens on waited its whole ``--timeout`` (2 min)
    in silence; it now says at once that the peer refuses connections and fails within seconds, naming
    what to check. A passive file holding the run's label column passed every check; the passive party's
    answer now fails it, as the real run would (the control: its own file passes, test_the_peers_checks)."""
    import time

    import pandas as pd

    from securevfl.operations.doctor import passive_verdict

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    assert main(["doctor", "train", "--dataset", "csv", "--party-file", str(files["guest"]), "--label-column", "y",
                 "--peer", f"passive1=127.0.0.1:{port}", "--tls", str(files["certs"] / "active"),
                 "--timeout", "120"]) == 2
    assert time.monotonic() - t0 < 15
    got = capsys.readouterr()
    assert "FAIL reach passive1" in got.out and "connection refused" in got.out and "--listen" in got.out
    assert "refuses connections" in got.err
    host = pd.read_csv(files["host"])
    host["y"] = 0
    bad = tmp_path / "host_with_label.csv"
    host.to_csv(bad, index=False)
    ch, _ = _serving(files)
    try:
        ch.doctor = lambda d: passive_verdict(d, PartySettings(), str(bad), "id")
        assert _doctor_train(files, ch) == 2
        assert "FAIL policy passive1" in (out := capsys.readouterr().out) and "label column 'y'" in out
    finally:
        ch.close()
