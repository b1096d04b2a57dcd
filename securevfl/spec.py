"""``NAME``, ``NAME:VALUE`` and ``NAME:key=value,key=value`` specs: the one parser behind defenses
(``--defense dp:clip=1,noise=1``) and attacks (``--attack mc:n_aux=40,steps=600``), and the typed
parameter check behind the same keys written as YAML mappings in config and sweep files."""

from __future__ import annotations

from collections.abc import Mapping

from securevfl.errors import UserError

_TRUE, _FALSE = {"true", "yes", "on", "1"}, {"false", "no", "off", "0"}


def split_name(text: str) -> tuple[str, str]:
    """``"mc:n_aux=40"`` → ``("mc", "n_aux=40")``."""
    name, _, arg = str(text).strip().partition(":")
    return name.strip(), arg


def coerce_param(kind: str, name: str, key: str, value: object, typ: type) -> object:
    """``value`` (a string from a spec, or a YAML scalar) as ``typ``; a UserError names the key."""
    def bad() -> UserError:
        return UserError(f"{kind} {name}: {key}={value!r} is not a {typ.__name__}")

    if isinstance(value, str):
        text = value.strip()
        if typ is bool:
            if text.lower() not in _TRUE | _FALSE:
                raise bad()
            return text.lower() in _TRUE
        if typ is str:
            return text
        try:
            return typ(text)
        except ValueError:
            raise bad() from None
    if typ is bool:
        if not isinstance(value, bool):
            raise bad()
        return value
    if typ in (int, float):
        if isinstance(value, bool) or not isinstance(value, int | float) or (typ is int and value != int(value)):
            raise bad()
        return typ(value)
    if not isinstance(value, typ):
        raise bad()
    return value


def check_params(kind: str, name: str, given: Mapping[str, object], types: Mapping[str, type]) -> dict[str, object]:
    """Typed copy of ``given``; unknown keys and wrong types are one-line user errors naming the key."""
    out = {}
    for key, value in given.items():
        typ = types.get(str(key))
        if typ is None:
            raise UserError(f"{kind} {name} has no parameter {str(key)!r}; accepted: {', '.join(types) or 'none'}")
        out[str(key)] = coerce_param(kind, name, str(key), value, typ)
    return out


def parse_args(kind: str, name: str, text: str, arg: str, types: Mapping[str, type],
               primary: str | None = None) -> dict[str, object]:
    """The ``key=value,...`` part of a spec (or a bare value for the ``primary`` parameter), typed."""
    given: dict[str, object] = {}
    if arg.strip():
        items = arg.split(",")
        for item in items:
            key, eq, value = item.partition("=")
            if not eq:
                if primary is None or len(items) > 1:
                    raise UserError(f"{kind} {text!r}: write parameters as key=value")
                key, value = primary, item
            given[key.strip()] = value
    return check_params(kind, name, given, types)
