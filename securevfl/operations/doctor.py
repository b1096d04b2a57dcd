"""``securevfl doctor``: a deployment checked before it starts (issue 53), one line per check.

Each party runs it with the flags of the command it is about to run: ``securevfl doctor train
--peer ... --tls ... --party-file ...`` (the active party) or ``securevfl doctor party --role ...
--listen ... --party-file ...`` (a passive party). What it checks, in order:

- ``tls``: its own certificate and key, as ``securevfl certs`` wrote them: readable, the key matching
  the certificate, signed by the federation's CA (``ca.pem``), naming this party, valid now and for the
  next :data:`EXPIRY_WARNING_DAYS` days (a warning line before that);
- ``file``: its party file readable, the ID column present with no empty and no repeated ID, the label
  column present at the active party and absent at a passive party;
- ``memory``/``disk``: enough free memory for a party (:data:`MEMORY_NEED`: the file is read in
  blocks), free disk in the spill folder for the file's columns (:data:`SPILL_BYTES_PER_CELL` a cell)
  and for its ``--checkpoint`` / ``--record-view`` folders;
- ``listen`` (passive): the address can be bound;
- per peer (active): ``reach`` (the mutual-TLS handshake, both names checked), ``version`` (the
  peer's securevfl version and protocol equal to its own), ``clock`` (within :data:`MAX_SKEW_S` of its
  own), ``policy`` (the passive party's own settings and policy accept this run's description: the
  same verdict it would give at the run's start, without any data moving).

A failed check is one ``error: doctor: <check>: ...`` line and exit status 2. ``train --peer`` and
``party`` run the ``tls`` check themselves when they start (the file is read, and checked, by the run
itself; reading a large file twice at every start is left to the doctor).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from securevfl.errors import UserError, os_cause

EXPIRY_WARNING_DAYS = 14
MAX_SKEW_S = 120.0
"""Clock difference between two parties that the doctor accepts: certificates are checked against
each party's own clock, so a larger skew makes a fresh certificate "not yet valid" on the other side."""
MEMORY_NEED = 1 << 30
"""Free memory a party needs whatever its file's size: the file is read in blocks and its large arrays
live on disk (securevfl/storage/spill.py), so this is the process (torch, a block, the models), measured at
0.4–0.6 GB for 1M and 10M rows (benchmarks/RESULTS.md, "A million rows across processes")."""
SPILL_BYTES_PER_CELL = 20
"""Disk a party's columns take in its spill folder per cell of its file (8 parsed, 8 hashed, 4 encoded)."""


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    warning: bool = False

    def line(self) -> str:
        mark = "ok  " if self.ok and not self.warning else "warn" if self.ok else "FAIL"
        return f"{mark} {self.name}: {self.detail}"


# ------------------------------------------------------------------------------- local checks
def check_tls(folder: str | Path, party: str, now: dt.datetime | None = None) -> Check:
    """The party's certificate and key in ``folder`` (``securevfl certs``' layout)."""
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    d = Path(folder)
    now = now or dt.datetime.now(dt.timezone.utc)
    try:
        ca = x509.load_pem_x509_certificate((d / "ca.pem").read_bytes())
        cert = x509.load_pem_x509_certificate((d / f"{party}.pem").read_bytes())
        key = serialization.load_pem_private_key((d / f"{party}.key").read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as e:
        return Check("tls", False, f"{d}: cannot read ca.pem, {party}.pem and {party}.key ({e})")
    pub = cert.public_key()
    if key.public_key().public_numbers() != pub.public_numbers():  # type: ignore[union-attr]
        return Check("tls", False, f"{d}/{party}.key does not belong to {party}.pem")
    try:
        ca_key = ca.public_key()
        if not isinstance(ca_key, ec.EllipticCurvePublicKey) or cert.signature_hash_algorithm is None:
            return Check("tls", False, f"{d}/ca.pem: not an ECDSA CA of securevfl certs")
        ca_key.verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm))
    except InvalidSignature:
        return Check("tls", False, f"{d}/{party}.pem is not signed by the CA in ca.pem (another federation's?)")
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName)
    except x509.ExtensionNotFound:
        names = []
    if party not in names:
        return Check("tls", False, f"{d}/{party}.pem names {', '.join(names) or 'no party'}, not {party}")
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    if now < start:
        return Check("tls", False, f"{party}.pem is valid only from {start:%Y-%m-%d %H:%M} UTC (this clock: "
                                   f"{now:%Y-%m-%d %H:%M})")
    if now > end:
        return Check("tls", False, f"{party}.pem expired on {end:%Y-%m-%d} (make new ones: securevfl certs)")
    days = (end - now).days
    return Check("tls", True, f"{party}.pem from the federation's CA, names {party}, valid until {end:%Y-%m-%d}",
                 warning=days < EXPIRY_WARNING_DAYS)


def check_party_file(path: str | Path, id_column: str, label_column: str | None, active: bool,
                     numeric_ids: bool = False) -> Check:
    """The party file: readable, a unique non-empty ID column (the run's own reader and its messages), the
    label column only at the active party."""
    from securevfl.data.blocks import read_party

    p = Path(path)
    try:  # the IDs and the label only: the features are checked when the run reads them
        table = read_party(p, id_column, label_col=None, features=False, drop=[], categorical=[], numeric=[],
                           numeric_ids=numeric_ids)
    except UserError as e:
        return Check("file", False, str(e))
    if active and label_column is not None and label_column not in table.columns:
        return Check("file", False, f"{p}: no label column {label_column!r} (the active party holds the labels; "
                                    "--label-column names it)")
    if not active and label_column is not None and label_column in table.columns:
        return Check("file", False, f"{p}: holds the label column {label_column!r}; labels belong to the active "
                                    "party only")
    return Check("file", True, f"{p}: {len(table.ids):,} rows, {len(table.columns) - 1} columns besides the ID, "
                               "IDs unique")


def _available_memory() -> int | None:
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def _cells(path: Path) -> int:
    """About how many cells the file holds: its size over the bytes of its first rows, times its columns."""
    with open(path, "rb") as f:
        head = f.read(1 << 20)
    lines = head.splitlines()[1:-1] or head.splitlines()
    if not lines:
        return 0
    per_row = max(1.0, sum(len(x) + 1 for x in lines) / len(lines))
    return int(path.stat().st_size / per_row * (lines[0].count(b",") + 1))


def check_resources(party_file: str | Path, folders: list[str | None],
                    available: Callable[[], int | None] = _available_memory,
                    spill_dir: str | None = None) -> list[Check]:
    """Free memory for the process, free disk for the file's spilled columns (``SECUREVFL_SPILL_DIR``) and
    for the folders this party will write."""
    from securevfl.data.blocks import is_parquet

    path = Path(party_file)
    size = path.stat().st_size if path.is_file() else 0
    out = []
    free = available()
    if free is None:
        out.append(Check("memory", True, "free memory unknown on this system", warning=True))
    else:
        out.append(Check("memory", free >= MEMORY_NEED, f"{free / 2**30:.1f} GiB free, a party needs about "
                                                        f"{MEMORY_NEED / 2**30:.0f} GiB (its file is read in blocks)"))
    spill_dir = spill_dir or os.environ.get("SECUREVFL_SPILL_DIR") or tempfile.gettempdir()
    # a Parquet file's cells are not countable from its bytes: a generous 4 × its size
    need = 4 * size if is_parquet(path) or not path.is_file() else SPILL_BYTES_PER_CELL * _cells(path)
    writable = check_writable(spill_dir, "SECUREVFL_SPILL_DIR")
    if writable is not None:
        out.append(writable)
    else:
        disk = shutil.disk_usage(spill_dir).free
        out.append(Check("disk", disk >= need, f"{spill_dir} (SECUREVFL_SPILL_DIR): {disk / 2**30:.1f} GiB free, "
                                               f"the file's columns need about {need / 2**30:.2f} GiB there"))
    for folder in filter(None, folders):
        where = Path(folder)
        while not where.exists() and where != where.parent:
            where = where.parent
        try:
            disk = shutil.disk_usage(where).free
        except OSError as e:
            out.append(Check("disk", False, f"{folder}: {os_cause(e)}"))
            continue
        out.append(Check("disk", disk >= size, f"{folder}: {disk / 2**30:.1f} GiB free"))
    return out


def check_writable(folder: str, what: str) -> Check | None:
    """A FAIL when ``folder`` is missing or a file cannot be made and written in it (what the run will
    do there), else None."""
    where = Path(folder)
    if not where.is_dir():
        return Check("disk", False, f"{folder} ({what}): {'not a folder' if where.exists() else 'does not exist'}; "
                                    "make it, or point the setting at an existing folder")
    try:
        with tempfile.NamedTemporaryFile(dir=where, prefix=".securevfl-doctor-") as f:
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        return Check("disk", False, f"{folder} ({what}): cannot write a file there ({os_cause(e)})")
    return None


def check_listen(address: str) -> Check:
    """The passive party's ``--listen`` address can be bound (port 0: any free port)."""
    from securevfl.configuration.validate import host_port

    host, port = host_port("--listen", address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host.strip("[]"), port))
        except OSError as e:
            return Check("listen", False, f"{address}: cannot bind ({e.strerror or e}; another process there?)")
    return Check("listen", True, f"{address} can be bound")


# ------------------------------------------------------------------------------- the peers
def about_me() -> dict:
    """What a party says of itself to a peer's doctor."""
    from securevfl import __version__
    from securevfl.runtime import PROTOCOL

    return {"version": __version__, "protocol": PROTOCOL, "time": time.time()}


REFUSED_WAIT_S = 5.0
"""How long the doctor waits on a peer that refuses connections (a party still starting) before it
says nothing listens there (issue 63: a wrong port took the whole timeout, 2 minutes)."""


def passive_verdict(description: dict, own: object, party_file: str, id_column: str) -> dict:
    """A passive party's answer to the active party's doctor: its facts and whether its own settings
    and policy accept ``description`` (the refusal it would give at the run's start), reading no data."""
    from securevfl.data.blocks import check_file
    from securevfl.federation import OptimConfig
    from securevfl.party_settings import PartySettings, admit, reconcile
    from securevfl.serve import _method, _model_config

    settings = own if isinstance(own, PartySettings) else PartySettings()
    verdict: dict = {**about_me()}
    try:
        hello, notes = reconcile(description, settings)
        method = _method(hello, _model_config(hello["model"]), OptimConfig(**hello["optim"]), int(hello["seed"]))
        notes += admit(hello, settings, method)
        label = (hello.get("data") or {}).get("label_column")
        if label and label in check_file(Path(party_file)):  # the real run refuses it when it reads the file
            raise UserError(f"party file {party_file}: holds the run's label column {label!r}; labels belong to the "
                            "active party only (drop that column from this party's file)")
        verdict.update(accepted=True, notes=notes)
    except UserError as e:
        verdict.update(accepted=False, reason=str(e))
    except (KeyError, TypeError, ValueError) as e:
        verdict.update(accepted=False, reason=f"malformed run description ({type(e).__name__}: {e})")
    return verdict


def check_peers(channel: object, peers: dict[str, str], descriptions: dict[str, dict]) -> list[Check]:
    """Per peer: reach it (mutual TLS), then compare versions, clocks and its verdict on its description."""
    from securevfl.channel.grpc import DOCTOR_PING

    me = about_me()
    out = []
    for name, addr in peers.items():
        try:
            channel.wait_ready_peer(name, refused_for=REFUSED_WAIT_S)  # type: ignore[attr-defined]
        except UserError as e:
            out.append(Check(f"reach {name}", False, str(e)))
            continue
        out.append(Check(f"reach {name}", True, f"{addr}: mutual TLS handshake done, the peer is {name}"
                         if channel.net.tls is not None else f"{addr}: reached (INSECURE, --insecure)"))  # type: ignore[attr-defined]
        t0 = time.time()
        try:
            raw = channel.ping(name, DOCTOR_PING + json.dumps(descriptions[name]).encode())  # type: ignore[attr-defined]
            theirs = json.loads(raw.decode())
        except (UserError, ValueError) as e:
            out.append(Check(f"version {name}", False, f"{name} did not answer the doctor ({e}); is it an older "
                                                      "securevfl?"))
            continue
        t1 = time.time()
        same = theirs.get("version") == me["version"] and theirs.get("protocol") == me["protocol"]
        out.append(Check(f"version {name}", same, f"securevfl {theirs.get('version')} protocol {theirs.get('protocol')}"
                         f" (this party: {me['version']}, protocol {me['protocol']})"))
        skew = abs(float(theirs.get("time", 0.0)) - (t0 + t1) / 2)
        out.append(Check(f"clock {name}", skew <= MAX_SKEW_S + (t1 - t0) / 2,
                         f"{skew:.1f} s apart (at most {MAX_SKEW_S:g} s)"))
        if theirs.get("accepted"):
            notes = theirs.get("notes") or []
            out.append(Check(f"policy {name}", True, "accepts this run" + (f" ({'; '.join(notes)})" if notes else "")))
        else:
            out.append(Check(f"policy {name}", False, str(theirs.get("reason"))))
    return out


def report(checks: list[Check], print_line: Callable[[str], None] = print) -> int:
    """Print one line per check; a failure is an ``error:`` line naming it (exit status 2)."""
    for c in checks:
        print_line(c.line())
    failed = [c for c in checks if not c.ok]
    if failed:
        raise UserError(f"doctor: {failed[0].name}: {failed[0].detail}")
    return 0
