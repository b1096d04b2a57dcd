"""VFL methods, one per file, registered by name."""

from securevfl.methods import entity_aug, fedhssl, fedlocal, local, risa, splitnn, vflhlp  # noqa: F401  (registration)
from securevfl.methods.base import Method, MethodContext, get_method, method_names, register_method

__all__ = ["Method", "MethodContext", "get_method", "method_names", "register_method"]
