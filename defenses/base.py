"""Defense contract and registry.

A defense is a :class:`securevfl.hooks.TensorHook`: it declares the message kinds it acts on,
validates its parameters at construction, keeps shapes and dtypes, and may account for privacy.
Defenses are written on the command line as ``NAME``, ``NAME:VALUE`` (the defense's primary
parameter) or ``NAME:key=value,key=value``; several compose left to right with ``+``.
"""

from __future__ import annotations

from typing import ClassVar

from securevfl.errors import UserError
from securevfl.hooks import TensorHook

DEFENSES: dict[str, type[Defense]] = {}


class Defense(TensorHook):
    primary: ClassVar[str | None] = None
    """Parameter that ``NAME:VALUE`` sets."""
    params: ClassVar[dict[str, type]] = {}
    """Accepted parameters and their types."""

    def __init__(self, **kwargs: object) -> None:
        unknown = set(kwargs) - set(self.params)
        if unknown:
            raise UserError(f"defense {self.name} has no parameter {sorted(unknown)[0]!r}; "
                            f"accepted: {', '.join(self.params) or 'none'}")
        self.config = dict(kwargs)

    def describe(self) -> dict:
        return {"name": self.name, **self.config}

    @property
    def strength(self) -> float | None:
        return None if self.primary is None else self.config.get(self.primary)


def register_defense(cls: type[Defense]) -> type[Defense]:
    DEFENSES[cls.name] = cls
    return cls


def defense_names() -> list[str]:
    return ["none", *sorted(DEFENSES)]


def _parse_one(text: str) -> Defense:
    name, _, arg = text.strip().partition(":")
    if name not in DEFENSES:
        raise UserError(f"unknown defense {name!r}; available: {', '.join(defense_names())}")
    cls = DEFENSES[name]
    kwargs: dict[str, object] = {}
    if arg:
        items = arg.split(",")
        for item in items:
            key, eq, value = item.partition("=")
            if not eq:
                if cls.primary is None or len(items) > 1:
                    raise UserError(f"defense {text!r}: write parameters as key=value")
                key, value = cls.primary, item
            key = key.strip()
            typ = cls.params.get(key)
            if typ is None:
                raise UserError(f"defense {name} has no parameter {key!r}; accepted: {', '.join(cls.params)}")
            try:
                kwargs[key] = typ(value)
            except ValueError:
                raise UserError(f"defense {name}: {key}={value!r} is not a {typ.__name__}") from None
    return cls(**kwargs)


def parse_defense(text: str | None) -> list[Defense]:
    """``none`` / ``iso:5`` / ``dp:clip=1,noise=1.1`` / ``a+b`` → defenses in application order."""
    if text is None or text.strip() in ("", "none"):
        return []
    return [_parse_one(part) for part in text.split("+")]
