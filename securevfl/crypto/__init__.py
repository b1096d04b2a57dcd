"""Homomorphic encryption for the cut layer: a scheme-agnostic protocol
(:mod:`securevfl.crypto.protocol`) over CKKS (:mod:`securevfl.crypto.ckks`, TenSEAL) and Paillier
(:mod:`securevfl.crypto.paillier`, phe + gmpy2) backends. Registers ``--he ckks`` and
``--he paillier``; the scheme libraries are imported only when a layer is built."""

from __future__ import annotations

from securevfl.crypto.protocol import HECutLayer
from securevfl.cutlayer import CutLayer, register_cut_layer


def make_ckks(**params: object) -> CutLayer:
    from securevfl.crypto import ckks

    cls = type("CKKSCutLayer", (HECutLayer,), {"name": "ckks", "backend_cls": ckks.CKKSBackend,
                                                "validate": staticmethod(ckks.validate_params)})
    return cls(**params)


def make_paillier(**params: object) -> CutLayer:
    from securevfl.crypto import paillier

    checked = paillier.validate_params({k: v for k, v in params.items() if k != "seeded_shares"})
    backend = paillier.PaillierBackend if checked["packing"] else paillier.NaivePaillierBackend
    cls = type("PaillierCutLayer", (HECutLayer,), {"name": "paillier", "backend_cls": backend,
                                                    "validate": staticmethod(paillier.validate_params)})
    return cls(**params)


register_cut_layer("ckks", make_ckks)
register_cut_layer("paillier", make_paillier)
