"""VFL methods, one per file, registered by name."""

from securevfl.methods import entity_aug, fedhssl, fedlocal, fedud, local, risa, splitnn, vflhlp  # noqa: F401
from securevfl.methods.base import METHODS, Method, MethodContext, adversary_exposes

__all__ = ["METHODS", "Method", "MethodContext", "adversary_exposes"]
