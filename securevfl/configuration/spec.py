"""``NAME``, ``NAME:VALUE`` and ``NAME:key=value,key=value`` specs: the one parser behind defenses
(``--defense dp:clip=1,noise=1``) and attacks (``--attack mc:n_aux=40,steps=600``), and the one
parameter convention of every extension point (methods, attacks, defenses, HE schemes): class-level
``defaults`` whose types are the parameters' types, checked by :func:`check_params` whether the values
come from a spec string or a YAML mapping."""

from __future__ import annotations

import math
from collections.abc import Mapping

from securevfl.errors import UserError

_TRUE, _FALSE = {"true", "yes", "on", "1"}, {"false", "no", "off", "0"}


def split_name(text: str) -> tuple[str, str]:
    """``"mc:n_aux=40"`` → ``("mc", "n_aux=40")``."""
    name, _, arg = str(text).strip().partition(":")
    return name.strip(), arg


_WANT: dict[type | None, str] = {bool: "true or false", int: "a whole number", float: "a finite number",
                                  str: "a string"}


def param_type(default: object) -> type | None:
    """A parameter's type is its default's when that is a bool, int, float or str; a default of None
    takes a number (kept as given: an int stays an int); any other default (a list…) takes any value,
    which its owner's own check reads. Returns the type, or None for "a number"."""
    if isinstance(default, bool | int | float | str):
        return type(default)
    return None if default is None else object


def coerce_param(owner: str, key: str, value: object, typ: type | None, parse_strings: bool = True) -> object:
    """``value`` (a string from a ``key=value`` spec, or a YAML scalar) as ``typ`` (see
    :func:`param_type`); a one-line UserError names the owner and the key. Without ``parse_strings`` a
    string is only a string (values that always arrive typed)."""
    def bad() -> UserError:
        want = _WANT.get(typ, "a number")
        return UserError(f"{owner}: {key}={value!r} is not a {getattr(typ, '__name__', 'number')} (must be {want})")

    if typ is object:
        return value
    if isinstance(value, str) and not parse_strings and typ is not str:
        raise bad()
    if typ is None:  # a number (no default), or None
        if isinstance(value, str):
            text = value.strip()
            for conv in (int, float):
                try:
                    return conv(text)
                except ValueError:
                    pass
            raise bad()
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise bad()
        return value
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


def check_params(owner: str, defaults: Mapping[str, object], given: Mapping[str, object],
                 optional: Mapping[str, type] | None = None, parse_strings: bool = True) -> dict[str, object]:
    """The one parameter check of every extension point (methods, attacks, defenses, HE schemes): its
    class-level ``defaults`` name the accepted parameters, each default's type is the parameter's type
    (:func:`param_type`), and ``optional`` adds parameters that have no default, with their types.

    Args:
        owner: who owns the parameters, as errors name it (``"attack mc"``, ``"--he ckks"``).
        defaults: parameter → default.
        given: parameter → value as the user wrote it (spec strings are parsed).
        optional: parameter → type, for parameters absent unless given.
        parse_strings: parse a string given for a number or flag (spec text); False where values
            always arrive typed (method parameters: YAML), so ``"yes"`` for a flag is an error.
    Returns:
        The given parameters, typed (the caller merges them over ``defaults``).
    Raises:
        UserError: one line for an unknown key or a value of the wrong type.
    """
    types = {**{k: param_type(v) for k, v in defaults.items()}, **(optional or {})}
    out = {}
    for key, value in given.items():
        key = str(key)
        if key not in types:
            raise UserError(f"{owner} has no parameter {key!r}; accepted: {', '.join(types) or 'none'}")
        out[key] = coerce_param(owner, key, value, types[key], parse_strings)
    return out


def check_nonnegative(owner: str, config: Mapping[str, object]) -> None:
    """The range rule shared by method and attack parameters: every number is finite and ≥ 0 (epochs,
    sizes, rates, weights, thresholds are all non-negative); None (unset) passes."""
    for key, value in config.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            if value != value or value < 0:
                raise UserError(f"{owner}: {key} must be ≥ 0, got {value}")
            if value == math.inf:
                raise UserError(f"{owner}: {key} must be finite, got {value}")


def parse_args(kind: str, text: str, arg: str, primary: str | None = None) -> dict[str, str]:
    """The ``key=value,...`` part of a spec (or a bare value for the ``primary`` parameter), as
    strings: the owner's :func:`check_params` types them."""
    given: dict[str, str] = {}
    if arg.strip():
        items = arg.split(",")
        for item in items:
            key, eq, value = item.partition("=")
            if not eq:
                if primary is None or len(items) > 1:
                    raise UserError(f"{kind} {text!r}: write parameters as key=value")
                key, value = primary, item
            if key.strip() in given:  # keeping the last would be silent
                raise UserError(f"{kind} {text!r}: parameter {key.strip()!r} given more than once")
            given[key.strip()] = value
    return given
