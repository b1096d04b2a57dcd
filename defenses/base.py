"""Defense contract and registry.

A defense is one file: a :class:`Defense` that also implements one or more hook points of
:mod:`securevfl.hooks` (the contract's reference: a message transform, a party's step rule, a label
transform, a model wrap or an extra loss term) and declares which party runs it, what it observes
and whether it carries an ε. It validates its parameters at construction, draws noise only from its
own private generator (one per party), is a bit-for-bit no-op at zero strength, and may account
for privacy.

Mechanism randomness is private (issue 25): the DP adversary knows the code, the configuration and
the public ``--seed``, so noise, flips and private choices never derive from that seed. By default
every generator is seeded from the OS CSPRNG (:func:`private_seed`) and the seed is never written
anywhere. ``mechanism_seed`` (``--mechanism-seed``) is the explicit debugging opt-in that makes the
noise reproducible; such a run is marked "not private (mechanism seed fixed)".

On the command line a defense is ``NAME``, ``NAME:VALUE`` (its primary parameter) or
``NAME:key=value,key=value``; ``a+b`` composes them, applied in the order written.
"""

from __future__ import annotations

import hashlib
import math
import re
import secrets
from typing import Any, ClassVar, cast

import numpy as np
import torch

from securevfl.configuration.spec import check_params, parse_args, split_name
from securevfl.errors import UserError
from securevfl.hooks import (
    ActiveStep,
    ExtraLoss,
    LabelTransform,
    MessageTransform,
    ModelWrap,
    PartyHook,
    PassiveStep,
)
from securevfl.registry import Registry


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
    (:func:`securevfl.configuration.spec.check_params`)."""
    optional: ClassVar[dict[str, type]] = {}
    """Parameters without a default (absent from :attr:`config` unless given) and their types."""
    ranges: ClassVar[dict[str, str]] = {}
    """Each parameter's valid range, as the listing prints it (:meth:`validate` enforces it)."""
    targets: ClassVar[tuple[str, ...]] = ()
    """The attacks (registered names) this defense is meant to lower."""
    he: ClassVar[str] = "composes: the hook runs on the plaintext tensor at its sender, before the HE layer"
    """How it composes with ``--he`` (a refusal says why, in one line, at check time)."""
    heads_note: ClassVar[str] = "it sees only the cut-layer messages, not the head"
    """How it composes with the active party's head (the heads it applies to are :attr:`heads`)."""

    def __init__(self, seed: int | None = None, **kwargs: object) -> None:
        """Args:
            seed: ``None`` (the default): the noise comes from the OS CSPRNG, unpredictable to every
                party. An int fixes it (the ``mechanism_seed`` opt-in: reproducible, not private).
                Reseeded per party by :meth:`for_party`.
            kwargs: parameters as the user wrote them (spec strings or typed values).
        Raises:
            UserError: one line naming an unknown or bad parameter (:meth:`validate`).
        """
        given = check_params(f"defense {self.name}", self.defaults, kwargs, self.optional)
        self.config: dict[str, Any] = {**self.defaults, **given}
        self.seed = seed
        self.generator = torch.Generator().manual_seed(private_seed() if seed is None else seed)
        self.validate()

    def mechanism_rng(self, stream: int) -> np.random.Generator:
        """A numpy generator for one of this defense's own draws (e.g. a private selection): from the
        OS CSPRNG, or derived from the fixed mechanism seed."""
        return np.random.default_rng(private_seed() if self.seed is None else self.seed + stream)

    def validate(self) -> None:
        """Range checks on ``self.config`` (called at construction); raise a one-line UserError
        naming the bad parameter."""

    def for_party(self, party: str) -> Defense:
        twin = cast(Defense, super().for_party(party))  # PartyHook.for_party deep-copies self
        if self.seed is None:  # each party's copy draws its own fresh, unpredictable stream
            twin.generator = torch.Generator().manual_seed(private_seed())
        else:
            digest = int.from_bytes(hashlib.sha256(f"{self.seed}/{party}".encode()).digest()[:8], "little")
            twin.generator = torch.Generator().manual_seed(digest)
        twin.reseed_streams()
        return twin

    def reseed_streams(self) -> None:  # noqa: B027 - optional: defenses with numpy streams redraw them
        """Redraw any stream besides :attr:`generator` (called on each party's copy)."""

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


HOOK_POINTS = {MessageTransform: "message (a)", ActiveStep: "active step (b)", PassiveStep: "passive step (b)",
               LabelTransform: "labels (c)", ModelWrap: "model wrap (d)", ExtraLoss: "extra loss (d)"}


def listing(cls: type[Defense]) -> dict[str, Any]:
    """What ``securevfl defenses`` prints for one defense: parameters with defaults and ranges, the
    party that runs it, its hook points, its targets, its ε status and how it composes."""
    params = {k: {"default": v, "range": cls.ranges.get(k, "")} for k, v in cls.defaults.items()}
    params |= {k: {"default": None, "range": cls.ranges.get(k, t.__name__)} for k, t in cls.optional.items()}
    methods = f"those that send {', '.join(sorted(cls.acts_on)) or 'nothing'} messages"
    if cls.needs_aligned_batches:
        methods += " on aligned batches"
    if cls.bounds_features:
        methods += " and use passive features only inside the supervised loop"
    return {"name": cls.name, "primary": cls.primary, "params": params, "party": sorted(cls.runs_at),
            "hooks": [label for point, label in HOOK_POINTS.items() if issubclass(cls, point)],
            "targets": list(cls.targets), "epsilon": "accounted" if cls.carries_epsilon else "none",
            "he": cls.he, "methods": methods, "heads": f"{', '.join(sorted(cls.heads))}: {cls.heads_note}"}


DEFENSES: Registry[type[Defense]] = Registry("defense", unknown="unknown defense {name!r}; available: none, {names}")
"""Every defense by name (``none`` is the absence of one); a defense module registers its class with
``@DEFENSES.register``."""


def defense_names() -> list[str]:
    return ["none", *DEFENSES.names()]


def private_seed() -> int:
    """64 bits from the OS CSPRNG: seeds a mechanism's generator; never recorded."""
    return secrets.randbits(64)


def _parse_one(text: str, seed: int | None) -> Defense:
    name, arg = split_name(text)
    cls = DEFENSES.get(name)
    return cls(seed=seed, **parse_args("defense", text, arg, cls.primary))


def parse_defense(text: str | None, mechanism_seed: int | None = None) -> list[Defense]:
    """``none`` / ``iso:5`` / ``dp:clip=1,noise=1.1`` / ``a+b`` → defenses in application order.

    Args:
        text: the defense spec.
        mechanism_seed: ``None``: private noise (OS CSPRNG). An int: reproducible noise (debugging and
            exact tests only; the run is marked not private). Never the public run seed."""
    if text is not None and not text.strip():
        raise UserError("--defense is empty: name a defense, or 'none' for no defense")
    if text is None or text.strip() == "none":
        return []
    if any(not part.strip() for part in text.split("+")):
        raise UserError(f"defense {text!r}: an empty part between '+' (compose as a+b)")
    if re.search(r"\de\+\d", text):  # '+' composes defenses, so 1e+06 would split into 1e and 06
        raise UserError(f"defense {text!r}: write large numbers without an exponent '+' (e.g. 1000000 for 1e+06); "
                        "'+' composes defenses")
    return [_parse_one(part, None if mechanism_seed is None else mechanism_seed * 7919 + i)
            for i, part in enumerate(text.split("+"))]
