"""The OT-based PSI engines (issue 64, securevfl/data/otpsi.py): each party's choice, refused in one line
when the engine is missing or the parties name different engines, and — where the engine is installed
(``securevfl psi-engine install``, or ``SECUREVFL_PSI_ENGINE``) — a deployed run aligned by RR22 or
KKRT equals the same run aligned by the X25519 PSI, over mutual TLS. The README's test command passes
without the engine: those tests skip."""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("grpc")

from securevfl.data import otpsi  # noqa: E402
from securevfl.errors import UserError  # noqa: E402
from tests import test_grpc  # noqa: E402
from tests.test_grpc import Passive, deploy, small_cfg  # noqa: E402


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """test_grpc's small party files and certificates."""
    return test_grpc.files.__wrapped__(tmp_path_factory)

try:
    otpsi.engine_python()
    HAVE_ENGINE = True
except UserError:
    HAVE_ENGINE = False
needs_engine = pytest.mark.skipif(not HAVE_ENGINE, reason="the OT PSI engine is not installed "
                                  "(securevfl psi-engine install)")


def test_missing_engine_is_named_before_anything_connects(files, tmp_path, monkeypatch, capsys) -> None:
    from securevfl.cli import main

    monkeypatch.setenv(otpsi.ENGINE_ENV, str(tmp_path / "no-such-python"))
    code = main(["train", "--dataset", "csv", "--party-file", str(files["guest"]), "--label-column", "y",
                 "--peer", "passive1=127.0.0.1:9", "--tls", str(files["certs"] / "active"), "--psi", "rr22"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error:") and "securevfl psi-engine install" in err[0]


def test_parties_naming_different_engines_are_refused(files) -> None:
    """The passive party runs rr22, the active party x25519: refused at the handshake, before any ID
    moves (no engine needed to say so), with the two names."""
    p = Passive(files, psi="rr22")
    with pytest.raises(UserError, match="aligns with PSI engine x25519, this party with rr22"):
        deploy(files, small_cfg(files, "guest"), [p])
    p.thread.join(timeout=30)
    assert p.status == 2
    assert not any(m.kind == "alignment" for m in p.channel.transcript)


def test_keyed_digests_keep_equality_only() -> None:
    ids = np.array(["CUST-1", "CUST-2", "1"], dtype=object)
    a, b = otpsi.digests(ids, b"k" * 32), otpsi.digests(np.array([1, 2]), b"k" * 32)
    assert a[2] == b[0] and len(set(a.tolist())) == 3  # the canonical bytes of 1 and "1" agree, as X25519's
    assert (otpsi.digests(ids, b"j" * 32) != a).all()  # another run's key, other digests


@needs_engine
@pytest.mark.parametrize("engine", ["rr22", "kkrt"])
def test_ot_engine_run_equals_the_x25519_run(files, engine) -> None:
    base = deploy(files, small_cfg(files, "guest"), [Passive(files)])
    p = Passive(files, psi=engine)
    out = deploy(files, small_cfg(files, "guest"), [p], psi=engine)
    assert out["partition"]["aligned"] == base["partition"]["aligned"]
    assert out["utility"] == base["utility"]
    p.thread.join(timeout=30)
    assert p.status == 0
    def alignment(run: dict) -> list:
        return [m for m in run["_channel"].transcript if m.kind == "alignment"]

    # the channel carries the engines' announcements and the aligned IDs; the PSI runs on the engine's own link
    assert any(f'"engine": "{engine}"'.encode() in m.payload for m in alignment(out))
    assert sum(m.nbytes for m in alignment(out)) < sum(m.nbytes for m in alignment(base)) / 2


@needs_engine
def test_ot_engine_refuses_a_peer_outside_the_ca(files, tmp_path) -> None:
    """The engine's link checks the peer's certificate against this party's CA: a passive party whose engine
    presents a certificate from another CA fails the PSI, in one line (the control above, same CA, aligns)."""
    import dataclasses

    from securevfl.channel.certs import make_certs
    from securevfl.channel.grpc import TLSFiles

    make_certs(["active", "passive1"], tmp_path / "other")
    stranger = TLSFiles.load(tmp_path / "other" / "passive1", "passive1")
    p = Passive(files, psi="rr22", timeout=20)
    real = p.channel.psi_contact
    p.channel.psi_contact = lambda party, peer: dataclasses.replace(real(party, peer), tls=stranger, timeout=10)
    with pytest.raises(UserError, match="PSI"):
        deploy(files, small_cfg(files, "guest"), [p], psi="rr22", timeout=20)
    p.thread.join(timeout=60)
    assert p.status == 2


def test_engine_location_follows_the_environment(tmp_path, monkeypatch) -> None:
    fake = tmp_path / "python"
    fake.write_text("")
    monkeypatch.setenv(otpsi.ENGINE_ENV, str(fake))
    assert otpsi.engine_python() == fake
    monkeypatch.delenv(otpsi.ENGINE_ENV)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert otpsi.default_dir() == tmp_path / "securevfl" / "psi-engine"
    assert os.path.basename(str(otpsi.WORKER)) == "otpsi_worker.py" and otpsi.WORKER.is_file()
