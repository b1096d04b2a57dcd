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


_FAKE_ENGINE = '''#!{python}
"""A stand-in for the engine's worker (argv: worker path, its JSON config): it keeps the input it was
given for the test to read, meets its peer through files, and writes the keys both inputs hold."""
import json, shutil, sys, time
from pathlib import Path
cfg = json.loads(sys.argv[2])
seen = Path({seen!r})
(seen / f"config{{cfg['rank']}}.json").write_text(sys.argv[2])
shutil.copy(cfg["input"], seen / f"input{{cfg['rank']}}.csv")
other = seen / f"input{{1 - cfg['rank']}}.csv"
while not other.exists():
    time.sleep(0.01)
time.sleep(0.1)
mine = Path(cfg["input"]).read_text().split()[1:]
theirs = set(other.read_text().split()[1:])
Path(cfg["output"]).write_text("key\\n" + "".join(k + "\\n" for k in mine if k in theirs))
print(json.dumps({{"intersection": len(mine)}}))
'''


def test_the_engine_is_given_keyed_digests_never_ids(tmp_path, monkeypatch) -> None:
    """What the OT engine (code of another project, in another process) holds of a party's IDs: its
    input file and configuration. The engine's best try, knowing every ID that could occur and the
    code: each line against the ID's bytes, its string, and its unkeyed BLAKE2b / SHA-256 / MD5
    digests — no line matches, and the configuration holds neither nonce. Control: with the key both
    parties derive from the nonces they exchanged on the channel (which the engine never sees), every
    line is recognised. The result is the true intersection (the fake engine here is a plain PSI over
    the digests, so the contract of ``ot_psi`` is checked too). Every key is 32 hex digits (16 bytes),
    also a digest ending in zero bytes."""
    import hashlib
    import json
    import queue
    import sys
    import threading

    from securevfl.channel.base import Contact
    from securevfl.ecdh import id_bytes

    seen = tmp_path / "seen"
    seen.mkdir()
    engine = tmp_path / "python"
    engine.write_text(_FAKE_ENGINE.format(python=sys.executable, seen=str(seen)))
    engine.chmod(0o755)
    monkeypatch.setenv(otpsi.ENGINE_ENV, str(engine))
    universe = np.array([f"CUST-{i:05d}" for i in range(8000)], dtype=object)
    rng = np.random.default_rng(0)  # 5,000 keys: one ends in a zero byte but with chance (255/256)^5000 < 1e-8
    ids = {"active": rng.choice(universe, 2500, replace=False), "passive1": rng.choice(universe, 2500, replace=False)}
    boxes = {"active": queue.Queue(), "passive1": queue.Queue()}  # the channel, as each party's inbox
    sent: list[dict] = []

    class Endpoint:  # what ot_psi uses of a party's endpoint (the engine runs outside the channel's lockstep)
        def __init__(self, party: str) -> None:
            self.party = party

        def send_json(self, dst: str, kind: object, obj: dict) -> None:
            sent.append(obj)
            boxes[dst].put(json.dumps(obj))

        def recv_json(self, src: str, kind: object) -> dict:
            return json.loads(boxes[self.party].get(timeout=30))

    out: dict[str, np.ndarray] = {}

    def party(name: str, peer: str) -> None:
        contact = Contact("rr22", "127.0.0.1", "127.0.0.1", None, 30.0)
        out[name] = otpsi.ot_psi(Endpoint(name), peer, ids[name], contact)  # type: ignore[arg-type]

    threads = [threading.Thread(target=party, args=a) for a in (("active", "passive1"), ("passive1", "active"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    truth = sorted(set(ids["active"]) & set(ids["passive1"]))
    assert list(out["active"]) == truth and list(out["passive1"]) == truth

    lines = [(seen / f"input{r}.csv").read_text().split()[1:] for r in (0, 1)]
    assert all(len(k) == 32 and int(k, 16) >= 0 for part in lines for k in part)
    assert any(k.endswith("00") for part in lines for k in part)  # ≈ 1 in 256 keys: the case tolist() cut short
    candidates: set[str] = set()
    for raw, b in zip(universe, id_bytes(universe), strict=True):
        candidates |= {str(raw), b.hex(), hashlib.blake2b(b, digest_size=16).hexdigest(),
                       hashlib.sha256(b).hexdigest()[:32], hashlib.md5(b).hexdigest()}  # noqa: S324
    assert not candidates & (set(lines[0]) | set(lines[1]))
    nonces = [m["nonce"] for m in sent]  # the active party's first: it sends before it receives
    configs = [(seen / f"config{r}.json").read_text() for r in (0, 1)]
    assert len(nonces) == 2 and not any(n in c for n in nonces for c in configs)
    # control: the key from the exchanged nonces (active's first) recognises every line
    key = hashlib.sha256(b"securevfl-ot-psi" + bytes.fromhex(nonces[0]) + bytes.fromhex(nonces[1])).digest()
    keyed = {hashlib.blake2b(b, key=key, digest_size=16).hexdigest() for b in id_bytes(universe)}
    assert set(lines[0]) | set(lines[1]) <= keyed
