"""The arithmetic of the Diffie–Hellman PSI (:mod:`securevfl.data.psi`): hashing IDs onto Curve25519 and
raising points to a party's secret exponent with X25519 (RFC 7748, from ``cryptography``), as pure
functions over concatenated 32-byte points.

This module sits at the top of the package, outside :mod:`securevfl.crypto` and :mod:`securevfl.data`, so
the PSI's worker processes import it with ``cryptography`` and numpy alone (those packages import torch:
4 s per worker).

The group: an ID's point is the u-coordinate ``SHA-512(domain ‖ run nonce ‖ ID)[:32]``, as SecretFlow's
ECDH-PSI does on Curve25519. X25519 is twist-secure and clamps its scalars to multiples of the cofactor,
so ``X25519(a, X25519(b, u)) = X25519(b, X25519(a, u))`` lands in a prime-order subgroup (of the curve
or of its twist) where the decisional Diffie–Hellman assumption holds; that is the assumption the
protocol's privacy rests on, as with openmined-psi's P-256."""

from __future__ import annotations

import hashlib
import math
import os

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

DOMAIN = b"securevfl/psi/x25519/v1"
POINT = 32
DIGEST = 16
"""Bytes kept of a doubly blinded point: two sets of 10^8 IDs collide by chance with probability < 2^-74."""
FAIL_LOG2 = 40
"""A bucket holds more IDs than its padded size with probability < 2^-FAIL_LOG2 (Chernoff bound)."""


class BadPoint(ValueError):
    """A peer's point is of small order (X25519 would output zero): never an honest party's."""


def new_key() -> bytes:
    return os.urandom(32)


def id_bytes(ids: np.ndarray) -> list[bytes]:
    """The bytes an ID is hashed from: its text, so 7 (int) and "7" (a CSV column read as text) agree."""
    return [str(i).encode() for i in np.asarray(ids).tolist()]


def _raise(key: bytes, points: list[bytes]) -> list[bytes]:
    k = X25519PrivateKey.from_private_bytes(key)
    try:
        return [k.exchange(X25519PublicKey.from_public_bytes(p)) for p in points]
    except ValueError as e:  # cryptography: the shared key is all zeros
        raise BadPoint(str(e)) from e


def blind_ids(key: bytes, nonce: bytes, ids: np.ndarray) -> bytes:
    """``H(id)^key`` for each ID, concatenated (32 bytes each)."""
    prefix = DOMAIN + nonce
    return b"".join(_raise(key, [hashlib.sha512(prefix + b).digest()[:POINT] for b in id_bytes(ids)]))


def blind_random(key: bytes, count: int) -> bytes:
    """Padding: ``r^key`` for fresh random points r, indistinguishable from blinded IDs under DDH."""
    return b"".join(_raise(key, [os.urandom(POINT) for _ in range(count)]))


def reblind(key: bytes, points: bytes, keep: int = POINT) -> bytes:
    """Each 32-byte point of ``points`` raised to ``key``, its first ``keep`` bytes kept."""
    if len(points) % POINT:
        raise BadPoint(f"{len(points)} bytes is not a whole number of {POINT}-byte points")
    out = _raise(key, [points[i:i + POINT] for i in range(0, len(points), POINT)])
    return b"".join(p[:keep] for p in out)


def buckets_of(nonce: bytes, n_buckets: int, ids: np.ndarray) -> np.ndarray:
    """Each ID's bucket: a keyed BLAKE2b of its bytes modulo ``n_buckets`` (both parties compute the same)."""
    if n_buckets == 1:
        return np.zeros(len(ids), dtype=np.uint32)
    key = nonce[:64]
    h = [int.from_bytes(hashlib.blake2b(b, digest_size=8, key=key).digest(), "little") % n_buckets
         for b in id_bytes(ids)]
    return np.asarray(h, dtype=np.uint32)


def buckets_bytes(nonce: bytes, n_buckets: int, ids: np.ndarray) -> bytes:
    """:func:`buckets_of` as bytes (a worker process's answer)."""
    return buckets_of(nonce, n_buckets, ids).tobytes()


def bucket_count(n_a: int, n_b: int, target: int) -> int:
    """How many buckets both parties split their sets into: about ``target`` IDs each."""
    return max(1, math.ceil(max(n_a, n_b) / target))


def padded_size(n: int, n_buckets: int) -> int:
    """The size every bucket of a set of ``n`` IDs is padded to, from ``n`` and the bucket count alone, so
    a bucket's length says nothing of which IDs the set holds: the mean plus a Chernoff margin t with
    ``exp(-t² / (2μ + 2t/3)) ≤ 2^-FAIL_LOG2``."""
    if n_buckets == 1:
        return n
    mu = n / n_buckets
    big_l = FAIL_LOG2 * math.log(2)
    t = big_l / 3 + math.sqrt(big_l**2 / 9 + 2 * big_l * mu)
    return math.ceil(mu + t)
