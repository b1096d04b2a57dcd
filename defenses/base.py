"""Defense contract and registry.

A defense is one file: a :class:`Defense` that also implements one or more hook points of
:mod:`securevfl.hooks` (the contract's reference: a message transform, a party's step rule, a label
transform, a model wrap or an extra loss term) and declares which party runs it, what it observes
and whether it carries an ε. It validates its parameters at construction, draws noise only from its
own seeded generator (reseeded per party), is a bit-for-bit no-op at zero strength, and may account
for privacy. On the command line a defense is ``NAME``, ``NAME:VALUE`` (its primary parameter)
or ``NAME:key=value,key=value``; ``a+b`` composes them, applied in the order written.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import ClassVar

import torch

from securevfl.errors import UserError
from securevfl.hooks import PartyHook
from securevfl.registry import Registry
from securevfl.spec import check_params, parse_args, split_name


def _finite(name: str, value: float, lo: float = 0.0, lo_inclusive: bool = True) -> float:
    ok = math.isfinite(value) and (value >= lo if lo_inclusive else value > lo)
    if not ok:
        raise UserError(f"{name} must be {'≥' if lo_inclusive else '>'} {lo:g} and finite, got {value}")
    return value


class Defense(PartyHook):
    """A protection a party applies at one or more of its hook points. To add one: subclass this and
    the hook points it implements (e.g. ``class MyDefense(Defense, MessageTransform)``), set
    :attr:`name`, :attr:`runs_at`, :attr:`acts_on`, :attr:`observes`, :attr:`carries_epsilon`,
    :attr:`defaults` (and :attr:`primary`), implement the hook points' methods and :meth:`validate`,
    draw noise only from ``self.generator``, decorate the class with ``@DEFENSES.register`` and import
    its module in ``defenses/__init__.py``. ``self.config`` holds the checked parameters."""

    primary: ClassVar[str | None] = None
    """Parameter that ``NAME:VALUE`` sets; it is the strength shown in sweeps and reports."""
    defaults: ClassVar[dict[str, object]] = {}
    """Parameters and their defaults; a default's type is the parameter's type
    (:func:`securevfl.spec.check_params`)."""
    optional: ClassVar[dict[str, type]] = {}
    """Parameters without a default (absent from :attr:`config` unless given) and their types."""

    def __init__(self, seed: int = 0, **kwargs: object) -> None:
        """Args:
            seed: seeds the defense's noise generator (reseeded per party by :meth:`for_party`).
            kwargs: parameters as the user wrote them (spec strings or typed values).
        Raises:
            UserError: one line naming an unknown or bad parameter (:meth:`validate`).
        """
        self.config = {**self.defaults, **check_params(f"defense {self.name}", self.defaults, kwargs, self.optional)}
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)
        self.validate()

    def validate(self) -> None:
        """Range checks on ``self.config`` (called at construction); raise a one-line UserError
        naming the bad parameter."""

    def for_party(self, party: str) -> Defense:
        twin = super().for_party(party)
        digest = int.from_bytes(hashlib.sha256(f"{self.seed}/{party}".encode()).digest()[:8], "little")
        twin.generator = torch.Generator().manual_seed(digest)
        return twin

    def describe(self) -> dict:
        return {"name": self.name, **self.config}

    @property
    def strength(self) -> float | None:
        return None if self.primary is None else self.config.get(self.primary)

    def state_dict(self) -> dict:
        return {"config": dict(self.config), "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.config = dict(state["config"])
        self.generator.set_state(state["generator"])


DEFENSES: Registry[type[Defense]] = Registry("defense", unknown="unknown defense {name!r}; available: none, {names}")
"""Every defense by name (``none`` is the absence of one); a defense module registers its class with
``@DEFENSES.register``."""


def defense_names() -> list[str]:
    return ["none", *DEFENSES.names()]


def _parse_one(text: str, seed: int) -> Defense:
    name, arg = split_name(text)
    cls = DEFENSES.get(name)
    return cls(seed=seed, **parse_args("defense", text, arg, cls.primary))


def parse_defense(text: str | None, seed: int = 0) -> list[Defense]:
    """``none`` / ``iso:5`` / ``dp:clip=1,noise=1.1`` / ``a+b`` → defenses in application order."""
    if text is None or text.strip() in ("", "none"):
        return []
    if re.search(r"\de\+\d", text):  # '+' composes defenses, so 1e+06 would split into 1e and 06
        raise UserError(f"defense {text!r}: write large numbers without an exponent '+' (e.g. 1000000 for 1e+06); "
                        "'+' composes defenses")
    return [_parse_one(part, seed * 7919 + i) for i, part in enumerate(text.split("+"))]
