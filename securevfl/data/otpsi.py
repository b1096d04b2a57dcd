"""OT-based PSI engines (RR22, KKRT) beside the X25519 PSI (securevfl/data/psi.py), each party's choice
(``--psi rr22`` on ``train --peer``, ``predict --peer`` and ``securevfl party``; both must name the same).

Why an external engine: the X25519 PSI is bound by its scalar multiplications (≈ 14k IDs per CPU-second
on the machines here, issue 64); OT-extension PSI is an order of magnitude faster. We do not write OT
extension by hand: SecretFlow's ``spu`` runs it (Raghuraman & Rindal CCS 2022 RR22, Kolesnikov et al. CCS
2016 KKRT, Apache-2.0). ``spu`` pins ``numpy<2``, its own ``jax`` and Python < 3.12, so it lives in an
environment of its own (``securevfl psi-engine install``, one command) and runs as a separate process
(securevfl/data/otpsi_worker.py) that the party starts, fed a file and read back.

The result contract is the X25519 PSI's: both parties hold the intersection (the engine's
``broadcast_result``), the active party then announces the aligned IDs and each passive party checks
them against its own result (securevfl/serve.py), with the same refusals and progress; the seconds count
in ``cost.network.alignment``. What goes to the engine is not the IDs but a keyed 128-bit digest of each
(BLAKE2b keyed with a hash of both parties' fresh nonces, over the same canonical bytes the X25519 PSI
hashes, :func:`securevfl.ecdh.id_bytes`): fixed-width keys for the engine's CSV, no quoting of user IDs,
and equality preserved (a false match needs a 128-bit collision). The result's digests map back to this
party's own IDs; no ID leaves the party outside the protocol.

The engine's link: brpc between the two worker processes, with mutual TLS against the deployment's CA
(the parties' ``securevfl certs`` folders; brpc checks the chain, not the party name as the gRPC channel
does). Each worker listens on a free port that its party announces through the channel (kind
``alignment``); the peer connects to the host it already talks to. Bytes the engine moves are its own
link's, outside the channel's counters (``cost.network`` counts the announcements only)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from securevfl.channel import Endpoint, MessageKind
from securevfl.channel.base import Contact
from securevfl.ecdh import id_bytes
from securevfl.errors import UserError
from securevfl.ids import sorted_copy

ENGINES = {"rr22": "PROTOCOL_RR22", "kkrt": "PROTOCOL_KKRT"}
"""OT-based engines by ``--psi`` name, and the ``spu`` protocol each runs."""
PSI_CHOICES = ("x25519", *ENGINES)
SPU_REQUIREMENT = "spu==0.9.5"
ENGINE_ENV = "SECUREVFL_PSI_ENGINE"
"""The engine environment's Python (default: the one ``securevfl psi-engine install`` made)."""
WORKER = Path(__file__).with_name("otpsi_worker.py")
NAME = "ot-psi/1"
CHUNK = 1 << 20
"""IDs digested and written per chunk."""


def default_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "securevfl" / "psi-engine"


def engine_python() -> Path:
    """The engine environment's Python.

    Raises:
        UserError: the engine is not installed, naming the one command that installs it."""
    given = os.environ.get(ENGINE_ENV)
    path = Path(given) if given else default_dir() / "bin" / "python"
    if not path.is_file():
        where = f"{ENGINE_ENV}={given} names no file" if given else f"no engine at {path.parent.parent}"
        raise UserError(f"--psi rr22/kkrt needs the OT PSI engine ({where}): install it with `securevfl psi-engine "
                        f"install` (a Python environment of its own with SecretFlow's {SPU_REQUIREMENT}, about 1 GB), "
                        "or use --psi x25519 (the default, nothing to install)")
    return path


def install(folder: Path | None = None) -> Path:
    """Make the engine's environment (a venv with ``spu``) in ``folder``; returns its Python.

    Raises:
        UserError: no Python below 3.12 to build it with, or pip failed (its last line)."""
    folder = folder or default_dir()
    python = _python_below_312()
    if not (folder / "bin" / "python").is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        _run([python, "-m", "venv", str(folder)], "making the environment")
    _run([str(folder / "bin" / "python"), "-m", "pip", "install", "--quiet", SPU_REQUIREMENT],
         f"pip install {SPU_REQUIREMENT}")
    _run([str(folder / "bin" / "python"), "-c", "import spu.psi"], "checking spu")
    return folder / "bin" / "python"


def _python_below_312() -> str:
    if sys.version_info < (3, 12):
        return sys.executable
    for name in ("python3.11", "python3.10"):
        if found := shutil.which(name):
            return found
    raise UserError(f"the OT PSI engine ({SPU_REQUIREMENT}) needs Python 3.10 or 3.11, and none is on PATH")


def _run(cmd: list[str], what: str) -> None:
    print(f"psi-engine: {what} ...", file=sys.stderr, flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise UserError(f"psi-engine: {what} failed: {last[:300]}")


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _addr(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def digests(ids: np.ndarray, key: bytes) -> np.ndarray:
    """Keyed 128-bit digests of ``ids`` (their canonical bytes), as a fixed-width bytes array."""
    out = np.empty(len(ids), dtype="S16")
    for i, b in enumerate(id_bytes(ids)):
        out[i] = hashlib.blake2b(b, key=key, digest_size=16).digest()
    return out


def ot_psi(endpoint: Endpoint, peer: str, own_ids: np.ndarray, contact: Contact) -> np.ndarray:
    """This party's side of an OT-based PSI with ``peer`` (in another process): the intersection, as
    this party's own IDs (sorted).

    Raises:
        UserError: the engine is missing, the peer runs another engine, or the engine failed."""
    python = engine_python()
    nonce = os.urandom(16)
    with tempfile.TemporaryDirectory(prefix="securevfl-psi-") as tmp:  # 0700: mkdtemp's
        d = Path(tmp)
        port = _free_port(contact.listen_host)
        mine = {"protocol": NAME, "engine": contact.engine, "nonce": nonce.hex(), "port": port}
        if endpoint.party < peer:  # ("active" first, as the X25519 PSI)
            endpoint.send_json(peer, MessageKind.ALIGNMENT, mine)
            theirs = endpoint.recv_json(peer, MessageKind.ALIGNMENT)
        else:
            theirs = endpoint.recv_json(peer, MessageKind.ALIGNMENT)
            endpoint.send_json(peer, MessageKind.ALIGNMENT, mine)
        if not isinstance(theirs, dict) or theirs.get("protocol") != NAME or theirs.get("engine") != contact.engine:
            got = theirs.get("engine") if isinstance(theirs, dict) else None
            raise UserError(f"PSI: {peer} runs engine {got!r}, this party {contact.engine!r} (--psi); both must name "
                            "the same")
        try:
            their_port, their_nonce = int(theirs["port"]), bytes.fromhex(str(theirs["nonce"]))
        except (KeyError, TypeError, ValueError):
            raise UserError(f"PSI: malformed engine announcement from {peer}") from None
        if not (0 < their_port < 65536 and len(their_nonce) == 16):
            raise UserError(f"PSI: malformed engine announcement from {peer}")
        first, second = (nonce, their_nonce) if endpoint.party < peer else (their_nonce, nonce)
        key = hashlib.sha256(b"securevfl-ot-psi" + first + second).digest()
        ids = np.asarray(own_ids)
        own = np.empty(len(ids), dtype="S16")
        keys_in, keys_out = d / "keys.csv", d / "intersection.csv"
        with open(keys_in, "w") as f:  # a million at a time: no Python object per ID outlives its chunk
            f.write("key\n")
            for start in range(0, len(ids), CHUNK):
                part = digests(ids[start:start + CHUNK], key)
                own[start:start + CHUNK] = part
                hexed = part.tobytes().hex()  # 16 bytes a key (tolist() drops a digest's trailing zero bytes)
                f.write("".join(f"{hexed[i:i + 32]}\n" for i in range(0, len(hexed), 32)))
        rank = 0 if endpoint.party < peer else 1
        me = (endpoint.party, _addr(contact.listen_host, port))
        them = (peer, _addr(contact.peer_host, their_port))
        cfg: dict[str, Any] = {"run": f"securevfl-{key[:6].hex()}", "rank": rank,
                               "parties": [me, them] if rank == 0 else [them, me],
                               "protocol": ENGINES[contact.engine], "input": str(keys_in), "output": str(keys_out),
                               "timeout_s": contact.timeout}
        if contact.tls is not None:
            cfg["tls"] = {}
            for name, data in (("ca", contact.tls.ca), ("key", contact.tls.key), ("cert", contact.tls.cert)):
                path = d / f"{name}.pem"
                path.write_bytes(data)
                path.chmod(0o600)
                cfg["tls"][name] = str(path)
        _run_worker(python, cfg, peer, contact.timeout)
        found = _read_keys(keys_out)
    order = np.argsort(own)
    pos = np.searchsorted(own[order], found)
    pos = np.minimum(pos, len(own) - 1)
    hit = own[order][pos] == found if len(own) else np.zeros(0, dtype=bool)
    if not hit.all():
        raise UserError(f"PSI: the engine returned {int((~hit).sum())} keys this party does not hold")
    return sorted_copy(np.asarray(own_ids)[order[pos]])


def _run_worker(python: Path, cfg: dict, peer: str, timeout: float) -> None:
    # the engine's logs go to a file: its stderr is verbose; the last line names a failure
    log = Path(cfg["input"]).with_name("engine.log")
    with open(log, "w") as err:
        try:
            done = subprocess.run([str(python), str(WORKER), json.dumps(cfg)], stdout=subprocess.PIPE, stderr=err,
                                  text=True, timeout=timeout + 3600, check=False)  # the worker's own link times out
        except subprocess.TimeoutExpired:
            raise UserError(f"PSI: the OT engine with {peer} did not finish") from None
    finished = '"intersection"' in (done.stdout or "")  # the worker says so once its result is written
    if done.returncode != 0 and not finished:
        if os.environ.get("SECUREVFL_PSI_ENGINE_LOG"):  # keep the engine's log to look at
            Path(os.environ["SECUREVFL_PSI_ENGINE_LOG"]).write_text(log.read_text(errors="replace"))
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        # the engine's exception: "RuntimeError: what:" and its message on the next line, then a stack trace
        at = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].endswith("what:")), None)
        why = lines[at + 1] if at is not None and at + 1 < len(lines) else next(
            (ln for ln in reversed(lines) if "Error" in ln), lines[-1] if lines else "")
        raise UserError(f"PSI: the OT engine with {peer} failed (exit {done.returncode}): {why.strip()[:300]}")


def _read_keys(path: Path) -> np.ndarray:
    """The intersection's keys the engine wrote (a header line, then one hex key a line, maybe quoted),
    read a chunk of lines at a time."""
    parts = []
    try:
        with open(path) as f:
            f.readline()
            while lines := f.readlines(CHUNK * 34):
                parts.append(np.array([bytes.fromhex(ln.strip().strip('"')) for ln in lines if ln.strip()],
                                      dtype="S16"))
    except ValueError:
        raise UserError("PSI: the OT engine's result is malformed") from None
    return np.concatenate(parts) if parts else np.empty(0, dtype="S16")
