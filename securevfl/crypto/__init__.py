"""Homomorphic encryption for the cut layer: a scheme-agnostic protocol
(:mod:`securevfl.crypto.protocol`) over CKKS (:mod:`securevfl.crypto.ckks`, TenSEAL), BFV
(:mod:`securevfl.crypto.bfv`, SEAL through TenSEAL's sealapi) and Paillier
(:mod:`securevfl.crypto.paillier`, phe + gmpy2) backends. ``--he ckks``, ``--he bfv`` and ``--he paillier``
are the layers below, named in :data:`securevfl.cutlayer.CUT_LAYERS`; a scheme's library is imported only
when its layer is built."""

from __future__ import annotations

from securevfl.crypto.backend import BackendClass
from securevfl.crypto.protocol import HECutLayer


class CKKSCutLayer(HECutLayer):
    """``--he ckks``: the HE-protected interactive layer over CKKS (TenSEAL)."""

    name = "ckks"

    @staticmethod
    def validate(params: dict) -> dict:
        from securevfl.crypto.ckks import CKKSBackend

        return CKKSBackend.validate(params)

    @property
    def backend_cls(self) -> BackendClass:
        from securevfl.crypto.ckks import CKKSBackend

        return CKKSBackend


class PaillierCutLayer(HECutLayer):
    """``--he paillier``: the same layer over packed Paillier; ``packing: false`` is the textbook
    one-value-per-ciphertext baseline."""

    name = "paillier"

    @staticmethod
    def validate(params: dict) -> dict:
        from securevfl.crypto.paillier import PaillierBackend

        return PaillierBackend.validate(params)

    @property
    def backend_cls(self) -> BackendClass:
        from securevfl.crypto import paillier

        return paillier.PaillierBackend if self.scheme_params["packing"] else paillier.NaivePaillierBackend


class BFVCutLayer(HECutLayer):
    """``--he bfv``: the same layer over BFV with exact slots (CRT over several plaintext moduli), so its
    masks hide κ = ``mask_bits`` ≥ 40 bits as under Paillier."""

    name = "bfv"

    @staticmethod
    def validate(params: dict) -> dict:
        from securevfl.crypto.bfv import BFVBackend

        return BFVBackend.validate(params)

    @property
    def backend_cls(self) -> BackendClass:
        from securevfl.crypto.bfv import BFVBackend

        return BFVBackend
