"""SEAL's wire format, below TenSEAL: the bytes of raw SEAL objects (through a private scratch file,
the only way ``sealapi`` saves and loads), a ciphertext built from its polynomials, and the protobuf
of a TenSEAL vector. Parsing bytes of the library's own format is kept apart from the scheme maths
(:mod:`securevfl.crypto.ckks`, :mod:`securevfl.crypto.bfv`), which both use it (issue 62)."""

from __future__ import annotations

import atexit
import os
import shutil
import struct
import tempfile
import threading

import numpy as np
import tenseal.sealapi as sealapi

from securevfl.procs import remove_when_gone

_SCRATCH: list[str] = []


def _scratch() -> str:
    """A per-thread file in a private (0700) temp directory, on /dev/shm where it exists: sealapi
    saves and loads only through paths."""
    if not _SCRATCH:
        try:
            d = tempfile.mkdtemp(prefix="securevfl-he-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        except OSError:  # /dev/shm present but not writable (some containers)
            d = tempfile.mkdtemp(prefix="securevfl-he-")
        atexit.register(shutil.rmtree, d, True)
        remove_when_gone(d)  # also after kill -9, which skips atexit
        _SCRATCH.append(d)
    return os.path.join(_SCRATCH[0], f"{os.getpid()}-{threading.get_ident()}")


def seal_dumps(obj) -> bytes:
    """The bytes of a SEAL object that saves to a path (a ciphertext, or a seeded Serializable)."""
    path = _scratch()
    obj.save(path)
    with open(path, "rb") as fh:
        return fh.read()


def seal_load(obj, seal_ctx, buf: bytes):
    """``obj`` (a SEAL object that loads from a path: ciphertext, public or Galois keys) read from bytes."""
    path = _scratch()
    with open(path, "wb") as fh:
        fh.write(buf)
    obj.load(seal_ctx, path)
    return obj


def seal_loads(seal_ctx, buf: bytes) -> sealapi.Ciphertext:
    return seal_load(sealapi.Ciphertext(seal_ctx), seal_ctx, buf)


def raw_ciphertext(seal_ctx, parms_id: list[int], polys: np.ndarray, ntt: bool, scale: float = 1.0,
                   header: bytes | None = None) -> sealapi.Ciphertext:
    """A ciphertext built from its residues ``polys`` (components × primes × N, uint64), written in SEAL's
    uncompressed format (header; parms_id, NTT flag, size, N, prime count, scale, correction factor; the
    data as a nested DynArray), for what sealapi has no call for (a noise-only ciphertext, an exact
    decoding). ``header``: the first 5 bytes of any SEAL save (magic, header size, version)."""
    if header is None:
        header = seal_dumps(sealapi.Plaintext("1"))[:5]
    size, k, n = polys.shape

    def head(total: int) -> bytes:
        return header + b"\x00\x00\x00" + struct.pack("<Q", total)  # compression none, reserved, size

    data = np.ascontiguousarray(polys, dtype="<u8")
    dyn = struct.pack("<Q", data.size) + data.tobytes()
    body = (struct.pack("<4Q", *parms_id) + bytes([int(ntt)]) + struct.pack("<QQQdQ", size, n, k, scale, 1)
            + head(16 + len(dyn)) + dyn)
    return seal_loads(seal_ctx, head(16 + len(body)) + body)


# TenSEAL's CKKSVectorProto (sizes = 1, ciphertexts = 2, scale = 3), written and read here so that several
# SEAL ciphertexts travel / compute as one TenSEAL vector (its operations then run on ``n_threads``).
def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b, v = v & 0x7F, v >> 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def vector_proto(blobs: list[bytes], size: int, scale: float) -> bytes:
    sizes = b"".join(_varint(size) for _ in blobs)
    parts = [b"\x0a", _varint(len(sizes)), sizes]
    for b in blobs:
        parts += [b"\x12", _varint(len(b)), b]
    return b"".join(parts + [b"\x19", struct.pack("<d", scale)])


def proto_blobs(buf: bytes) -> tuple[list[bytes], float]:
    """The SEAL ciphertexts and the scale of a serialized CKKSVector."""
    def varint(i: int) -> tuple[int, int]:
        v = shift = 0
        while True:
            b = buf[i]
            v |= (b & 0x7F) << shift
            i, shift = i + 1, shift + 7
            if not b & 0x80:
                return v, i

    blobs, scale, i = [], 0.0, 0
    while i < len(buf):
        key, i = varint(i)
        if key & 7 == 2:
            n, i = varint(i)
            if key >> 3 == 2:
                blobs.append(buf[i:i + n])
            i += n
        elif key & 7 == 1:
            (scale,) = struct.unpack_from("<d", buf, i)
            i += 8
        else:
            _, i = varint(i)
    return blobs, scale


