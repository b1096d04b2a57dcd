"""Homomorphic encryption for the cut layer: a scheme-agnostic protocol
(:mod:`securevfl.crypto.protocol`) over CKKS (:mod:`securevfl.crypto.ckks`, TenSEAL), BFV
(:mod:`securevfl.crypto.bfv`, SEAL through TenSEAL's sealapi) and Paillier
(:mod:`securevfl.crypto.paillier`, phe + gmpy2) backends; CKKS and BFV also on OpenFHE
(``openfhe_ckks``, ``openfhe_bfv``: an optional extra). ``--he ckks``, ``--he bfv`` and ``--he paillier``
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


def openfhe_backend(scheme: str) -> BackendClass:
    """The OpenFHE backend of ``scheme`` (``ckks`` or ``bfv``), or one line naming the extra it needs."""
    import sys

    try:
        module = importlib.import_module(f"securevfl.crypto.openfhe_{scheme}")
    except ImportError as e:
        raise UserError(f"--he {scheme}: backend=openfhe needs the optional extra: pip install 'securevfl[openfhe]' "
                        f"(its wheel holds a CPython 3.10 extension only; this is Python {sys.version_info.major}."
                        f"{sys.version_info.minor}): {e}") from e
    return getattr(module, f"OpenFHE{scheme.upper()}Backend")


class LibraryCutLayer(SchemeCutLayer):
    """A scheme with a choice of library (``--he-param backend=tenseal|openfhe``)."""

    @classmethod
    def validate(cls, params: dict) -> dict:
        p = cls.backend().validate(params)
        if p["backend"] == "openfhe":
            openfhe_backend(cls.name)  # refuse now, at configuration time, where the extra is missing
        return p

    @property
    def backend_cls(self) -> BackendClass:
        return openfhe_backend(self.name) if self.scheme_params["backend"] == "openfhe" else self.backend()


class CKKSCutLayer(LibraryCutLayer):
    """``--he ckks``: over CKKS; ``packing: rotations`` reduces inside the ciphertext. ``backend``: the
    library, SEAL through TenSEAL (the default) or OpenFHE (an optional extra,
    :mod:`securevfl.crypto.openfhe_ckks`)."""

    name = "ckks"
    backend_path = "securevfl.crypto.ckks:CKKSBackend"


class BFVCutLayer(LibraryCutLayer):
    """``--he bfv``: over BFV with exact slots (CRT over several plaintext moduli), so its masks hide
    κ = ``mask_bits`` ≥ 40 bits as under Paillier. ``backend``: the library, SEAL through TenSEAL (the
    default) or OpenFHE (an optional extra, :mod:`securevfl.crypto.openfhe_bfv`)."""

    name = "bfv"
    backend_path = "securevfl.crypto.bfv:BFVBackend"


class PaillierCutLayer(SchemeCutLayer):
    """``--he paillier``: over packed Paillier; ``packing: false`` is the textbook
    one-value-per-ciphertext baseline."""

    name = "paillier"
    backend_path = "securevfl.crypto.paillier:PaillierBackend"

    @property
    def backend_cls(self) -> BackendClass:
        from securevfl.crypto import paillier

        return paillier.PaillierBackend if self.scheme_params["packing"] else paillier.NaivePaillierBackend
