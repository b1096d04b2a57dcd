"""Homomorphic encryption for the cut layer: a scheme-agnostic protocol
(:mod:`securevfl.crypto.protocol`) over CKKS (:mod:`securevfl.crypto.ckks`, TenSEAL), BFV
(:mod:`securevfl.crypto.bfv`, SEAL through TenSEAL's sealapi) and Paillier
(:mod:`securevfl.crypto.paillier`, phe + gmpy2) backends. ``--he ckks``, ``--he bfv`` and ``--he paillier``
are the layers below, named in :data:`securevfl.cutlayer.CUT_LAYERS`; a scheme's library is imported only
when its layer is built."""

from __future__ import annotations

import importlib

from securevfl.crypto.backend import BackendClass
from securevfl.crypto.protocol import HECutLayer
from securevfl.errors import UserError


class SchemeCutLayer(HECutLayer):
    """The interactive layer over the scheme whose backend class ``backend_path`` names
    (``module:Class``), imported on first use."""

    backend_path: str

    @classmethod
    def backend(cls) -> BackendClass:
        module, name = cls.backend_path.split(":")
        return getattr(importlib.import_module(module), name)

    @classmethod
    def validate(cls, params: dict) -> dict:  # the scheme's own check
        return cls.backend().validate(params)

    @property
    def backend_cls(self) -> BackendClass:
        return self.backend()


class CKKSCutLayer(SchemeCutLayer):
    """``--he ckks``: over CKKS (TenSEAL); ``packing: rotations`` reduces inside the ciphertext."""

    name = "ckks"
    backend_path = "securevfl.crypto.ckks:CKKSBackend"


def openfhe_bfv_backend() -> BackendClass:
    """The OpenFHE BFV backend, or one line naming the extra it needs."""
    import sys

    try:
        from securevfl.crypto.openfhe_bfv import OpenFHEBFVBackend
    except ImportError as e:
        raise UserError("--he bfv: backend=openfhe needs the optional extra: pip install 'securevfl[openfhe]' "
                        f"(its wheel holds a CPython 3.10 extension only; this is Python {sys.version_info.major}."
                        f"{sys.version_info.minor}): {e}") from e
    return OpenFHEBFVBackend


class BFVCutLayer(SchemeCutLayer):
    """``--he bfv``: over BFV with exact slots (CRT over several plaintext moduli), so its masks hide
    κ = ``mask_bits`` ≥ 40 bits as under Paillier. ``backend``: the library, SEAL through TenSEAL (the
    default) or OpenFHE (an optional extra, :mod:`securevfl.crypto.openfhe_bfv`)."""

    name = "bfv"
    backend_path = "securevfl.crypto.bfv:BFVBackend"

    @classmethod
    def validate(cls, params: dict) -> dict:
        p = cls.backend().validate(params)
        if p["backend"] == "openfhe":
            openfhe_bfv_backend()  # refuse now, at configuration time, where the extra is missing
        return p

    @property
    def backend_cls(self) -> BackendClass:
        return openfhe_bfv_backend() if self.scheme_params["backend"] == "openfhe" else self.backend()


class PaillierCutLayer(SchemeCutLayer):
    """``--he paillier``: over packed Paillier; ``packing: false`` is the textbook
    one-value-per-ciphertext baseline."""

    name = "paillier"
    backend_path = "securevfl.crypto.paillier:PaillierBackend"

    @property
    def backend_cls(self) -> BackendClass:
        from securevfl.crypto import paillier

        return paillier.PaillierBackend if self.scheme_params["packing"] else paillier.NaivePaillierBackend
