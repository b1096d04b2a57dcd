"""The interface every HE scheme implements for the interactive layer.

The protocol (:mod:`securevfl.crypto.protocol`) only ever needs three things from a scheme:
encrypt a real matrix under the key owner's key, multiply an encrypted matrix by a *plaintext*
matrix on either side (``X @ W`` or ``W @ X``) and blind the result with a random mask, and decrypt.
Every HE product is one plaintext × ciphertext multiplication followed by additions, so a scheme
needs multiplicative depth 1. How values are packed into ciphertexts is the scheme's business; the
protocol sees opaque :class:`Encrypted` objects and their bytes.

One backend object per party end: the key owner's has the secret key (``has_secret``); the other
party's is built from the public bytes (:meth:`HEBackend.public_bytes`) and can only encrypt-free
operations (products, masks) and serialisation.
"""

from __future__ import annotations

import json
import os
import struct
import time
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import numpy as np

from securevfl.configuration.spec import check_params

# ----------------------------------------------------------------------------------- threads
_HE_THREADS: list[int] = []


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def set_he_threads(n: int | None) -> None:
    """How many cores HE operations may use (CKKS: TenSEAL's thread pool, set on contexts built after this
    call; Paillier: worker processes for independent ciphertexts). ``None``: back to the default, the
    ``SECUREVFL_HE_THREADS`` environment variable or 1. A thread policy picks it per process from the
    cores and the work size; HE code never hard-codes it."""
    _HE_THREADS.clear()
    if n is not None:
        if int(n) < 1:
            raise ValueError(f"HE threads must be ≥ 1, got {n}")
        _HE_THREADS.append(int(n))


def he_threads() -> int:
    if _HE_THREADS:
        return _HE_THREADS[0]
    return max(1, int(os.environ.get("SECUREVFL_HE_THREADS", "1") or 1))


class Encrypted(ABC):
    """An encrypted matrix (or product), with the layout the scheme needs to decode it."""

    shape: tuple[int, ...]


@dataclass
class HETimer:
    """Seconds spent in HE operations, by operation (for ``cost.he`` and the benchmark profile)."""

    seconds: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)

    @contextmanager
    def time(self, op: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[op] = self.seconds.get(op, 0.0) + time.perf_counter() - t0
            self.calls[op] = self.calls.get(op, 0) + 1

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    def as_dict(self) -> dict:
        return {"total": round(self.total, 4), "by_op": {k: round(v, 4) for k, v in sorted(self.seconds.items())},
                "calls": dict(sorted(self.calls.items()))}


class HEBackend(ABC):
    """One party's handle on a scheme instance (keys + codec)."""

    scheme: str
    defaults: ClassVar[dict[str, object]] = {}
    """The scheme's parameters (``--he-param key=value``) and their defaults; a default's type is the
    parameter's type (:func:`securevfl.configuration.spec.check_params`)."""

    def __init__(self, timer: HETimer | None = None) -> None:
        self.timer = timer or HETimer()

    @classmethod
    def validate(cls, params: dict) -> dict:
        """The scheme's parameters, typed and checked.

        Args:
            params: parameter → value as the user wrote it (the layer's own ``seeded_shares`` excluded).
        Returns:
            :attr:`defaults` updated with ``params``, normalised by :meth:`check_ranges`.
        Raises:
            UserError: one line naming an unknown key or a bad value.
        """
        return cls.check_ranges({**cls.defaults, **check_params(f"--he {cls.scheme}", cls.defaults, params)})

    @classmethod
    def check_ranges(cls, p: dict) -> dict:
        """The scheme's own rules on its merged parameters (bounds, security level); returns them,
        normalised."""
        return p

    # ---- keys
    @abstractmethod
    def has_secret(self) -> bool: ...

    @abstractmethod
    def public_bytes(self) -> bytes:
        """What leaves the key owner: the public context / key, never the secret key."""

    exact: bool = True
    """Whether decryption returns the exact integers (Paillier) or carries scheme noise (CKKS)."""
    kappa: int = 0
    """Statistical hiding of every mask this backend draws or is sized for (bits)."""

    # ---- key owner
    @abstractmethod
    def encrypt(self, x: np.ndarray, ops: frozenset[str]) -> Encrypted:
        """Encrypt an integer matrix (fixed point at 2^frac_bits; object array of Python ints) for the
        products named in ``ops`` (``right``: X @ W, ``left``: W @ X)."""

    @abstractmethod
    def decrypt(self, e: Encrypted) -> np.ndarray:
        """The product as integers at 2^(2·frac_bits) (object array)."""

    # ---- other party (plaintext-side products), integers throughout
    @abstractmethod
    def right(self, ex: Encrypted, w: np.ndarray, addend: np.ndarray, term_bits: int, hide: bool,
              rng, addend_bits: int | None = None) -> tuple[Encrypted, np.ndarray]:
        """[[X @ W + addend + mask]] and the mask. ``term_bits`` bounds |X_ij W_jk|; with ``hide`` each
        output gets a fresh uniform mask ``kappa`` bits above its bound (drawn from ``rng``), without,
        the mask is 0 — a scheme whose slots hold single terms (CKKS) still blinds every term with
        masks that cancel in each output. ``addend_bits``: a public bound on |addend| (BFV sizes its
        CRT by it; None: the largest size)."""

    @abstractmethod
    def left(self, w: np.ndarray, ex: Encrypted, addend: np.ndarray, term_bits: int, hide: bool,
             rng, addend_bits: int | None = None) -> tuple[Encrypted, np.ndarray]:
        """[[W @ X + addend + mask]] and the mask (as :meth:`right`)."""

    # ---- wire format
    @abstractmethod
    def dumps(self, e: Encrypted) -> bytes: ...

    @abstractmethod
    def loads(self, buf: bytes) -> Encrypted: ...

    @abstractmethod
    def describe(self) -> dict:
        """Scheme parameters and security level, for reports."""


class BackendClass(Protocol):
    """A scheme's backend class as the protocol builds it: the key owner's backend from the scheme
    parameters, or the other party's from the key owner's :meth:`HEBackend.public_bytes`. The keyword
    sizes are the protocol's public bounds (each scheme reads the ones it needs)."""

    def __call__(self, params: dict, *, timer: HETimer | None = ..., slot_bits: int = ..., frac_bits: int = ...,
                 weight_bits: int = ...) -> HEBackend: ...

    def from_public(self, blob: bytes, params: dict, *, timer: HETimer | None = ..., slot_bits: int = ...,
                    frac_bits: int = ..., weight_bits: int = ...) -> HEBackend: ...

    def validate(self, params: dict) -> dict: ...


def pack_blobs(head: dict, blobs: list[bytes]) -> bytes:
    """A JSON header and length-prefixed binary blobs (ciphertexts) in one message."""
    h = json.dumps(head).encode()
    parts = [struct.pack("<I", len(h)), h]
    for b in blobs:
        parts += [struct.pack("<Q", len(b)), b]
    return b"".join(parts)


def unpack_blobs(buf: bytes) -> tuple[dict, list[bytes]]:
    (hl,) = struct.unpack_from("<I", buf, 0)
    head = json.loads(buf[4:4 + hl])
    off, blobs = 4 + hl, []
    while off < len(buf):
        (bl,) = struct.unpack_from("<Q", buf, off)
        blobs.append(buf[off + 8:off + 8 + bl])
        off += 8 + bl
    return head, blobs


def dump_ints(a: np.ndarray, **meta: int) -> bytes:
    """An integer matrix (any size) as fixed-width signed little-endian integers (``meta``: small
    integers carried in the header, e.g. the HE layer's rescale; read with :func:`load_ints_meta`)."""
    flat = [int(v) for v in np.asarray(a, dtype=object).ravel()]
    nb = max([(abs(v).bit_length() + 8) // 8 for v in flat] + [1])
    return pack_blobs({"shape": list(np.shape(a)), "nbytes": nb, **meta},
                      [b"".join(v.to_bytes(nb, "little", signed=True) for v in flat)])


def load_ints_meta(buf: bytes) -> tuple[np.ndarray, dict]:
    head, (blob,) = unpack_blobs(buf)
    nb, n = head["nbytes"], len(blob) // head["nbytes"]
    vals = [int.from_bytes(blob[i * nb:(i + 1) * nb], "little", signed=True) for i in range(n)]
    meta = {k: v for k, v in head.items() if k not in ("shape", "nbytes")}
    return np.array(vals + [0], dtype=object)[:n].reshape(head["shape"]), meta


def load_ints(buf: bytes) -> np.ndarray:
    return load_ints_meta(buf)[0]


def bits_of(n: int) -> int:
    """ceil(log2 n) for n ≥ 1: the bits a sum of n bounded terms adds."""
    return max(0, (int(n) - 1).bit_length())
