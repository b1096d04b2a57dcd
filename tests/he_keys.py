"""A slice of an HE key's serialised bytes, for tests that look for key material in what crossed the
channel: SEAL's (TenSEAL) or OpenFHE's (``SECUREVFL_BFV_BACKEND=openfhe``), after the headers both share."""

from __future__ import annotations


def key_bytes(backend, key) -> bytes:
    if getattr(backend, "library", "tenseal") == "openfhe":
        import openfhe as ofhe

        return ofhe.Serialize(key, ofhe.BINARY)[-4096:-2048]
    from securevfl.crypto.ckks import seal_dumps

    return seal_dumps(key)[64:128]
