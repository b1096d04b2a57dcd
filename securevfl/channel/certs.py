"""``securevfl certs``: a small CA and one key + certificate per party, for mutual TLS.

Layout of ``--out DIR``: ``DIR/<party>/`` holds ``ca.pem`` (the CA certificate, public),
``<party>.key`` (0600) and ``<party>.pem``; copy each party's folder to that party's machine and
nothing else. The CA key stays in ``DIR/ca/ca.key`` (0600) on the machine that made the folders:
whoever holds it can mint party certificates, so it goes nowhere. A party's certificate names the
party in its SAN (DNS name) and CN; each side checks the peer's name against the one it expects.
ECDSA P-256 keys, one year of validity.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from securevfl.errors import UserError
from securevfl.storage.files import PRIVATE_FILE, PUBLIC_FILE, make_private_dir, open_new

VALID_DAYS = 365
_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")


def _key_bytes(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(path: Path, data: bytes, perms: int) -> None:
    """Create ``path`` new with ``perms`` from the start (never through a planted link, never over a file)."""
    with open_new(path, "wb", perms) as f:
        f.write(data)


def _cert(subject: str, public: ec.EllipticCurvePublicKey, issuer: x509.Name, signer: ec.EllipticCurvePrivateKey,
          ca: bool) -> x509.Certificate:
    now = dt.datetime.now(dt.timezone.utc)
    b = (x509.CertificateBuilder()
         .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
         .issuer_name(issuer).public_key(public).serial_number(x509.random_serial_number())
         .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=VALID_DAYS))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True))
    if not ca:  # a party is both a TLS server (passive) and client (active) under the same name
        b = (b.add_extension(x509.SubjectAlternativeName([x509.DNSName(subject)]), critical=False)
             .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                   ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
    return b.sign(signer, hashes.SHA256())


def make_certs(parties: list[str], out: str | Path) -> dict[str, Path]:
    """Write the CA and every party's folder under ``out``; returns each party's folder.

    Raises:
        UserError: a bad party list, or an ``out`` that already holds a CA (never overwritten)."""
    names = [p.strip() for p in parties if p.strip()]
    if len(names) < 2 or len(set(names)) != len(names):
        raise UserError("--parties needs at least two distinct party names (e.g. active,passive1)")
    bad = [n for n in names if not _NAME.match(n)]
    if bad:
        raise UserError(f"--parties: {bad[0]!r} is not a party name (lower-case letters, digits, - and _)")
    root = Path(out)
    if root.exists() and not root.is_dir() or root.is_symlink():
        raise UserError(f"--out {out}: exists and is not a directory (it names the new certificates' folder)")
    if (root / "ca" / "ca.key").exists():
        raise UserError(f"--out {out} already holds a CA; choose a new folder (certificates are never overwritten)")
    taken = [n for n in ["ca", *names] if os.path.lexists(root / n)]
    if taken:
        raise UserError(f"--out {out}: {root / taken[0]} already exists; choose a new folder (certificates are never "
                        "overwritten)")
    make_private_dir(root)
    make_private_dir(root / "ca")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "securevfl CA")])
    ca_cert = _cert("securevfl CA", ca_key.public_key(), ca_name, ca_key, ca=True)
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    _write(root / "ca" / "ca.key", _key_bytes(ca_key), PRIVATE_FILE)
    _write(root / "ca" / "ca.pem", ca_pem, PUBLIC_FILE)
    folders = {}
    for name in names:
        d = make_private_dir(root / name)
        key = ec.generate_private_key(ec.SECP256R1())
        _write(d / f"{name}.key", _key_bytes(key), PRIVATE_FILE)
        _write(d / f"{name}.pem", _cert(name, key.public_key(), ca_name, ca_key, ca=False)
               .public_bytes(serialization.Encoding.PEM), PUBLIC_FILE)
        _write(d / "ca.pem", ca_pem, PUBLIC_FILE)
        folders[name] = d
    return folders
