"""One validation layer for every entry point (CLI flags, config files, sweep cells, the Python
API): :func:`validate_config` checks a resolved :class:`~securevfl.config.RunConfig` before anything
is read or trained, and raises a one-line :class:`~securevfl.errors.UserError` naming the key, the
value and what is allowed.

Two checks of every setting (each a field declared with :func:`securevfl.configuration.settings.setting`): (1) the
*type* of its value against the field's annotation — list elements included, booleans never taken
for numbers, floats finite; (2) the bounds and allowed values the field declares. Names (dataset,
method, defense, attack, HE scheme) are checked by their registries, method and scheme parameters by
their owners.
"""

from __future__ import annotations

import math
import types
import typing

from securevfl.configuration import settings
from securevfl.errors import UserError


def _type_ok(value: object, typ: object) -> bool:
    origin = typing.get_origin(typ)
    if typ is typing.Any or typ is object:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in typing.get_args(typ))
    if typ is type(None):
        return value is None
    if origin in (list, tuple):
        args = [a for a in typing.get_args(typ) if a is not Ellipsis]
        return isinstance(value, list | tuple) and all(_type_ok(v, args[0]) for v in value) if args else \
            isinstance(value, list | tuple)
    if origin is dict or typ is dict:
        return isinstance(value, dict)
    if typ is bool:
        return isinstance(value, bool)
    if typ is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if typ is float:
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if isinstance(typ, type):
        return isinstance(value, typ)
    return True


def _describe(typ: object) -> str:
    return str(typ).replace("typing.", "").replace("<class '", "").replace("'>", "")


def validate_config(cfg: object, data_options: bool = True) -> None:
    """Raise a one-line UserError for the first value of ``cfg`` that is of the wrong type or range
    (``data_options``: also the dataset's own options, which needs the data layer)."""
    for entry in settings.walk(type(cfg)):
        owner = cfg
        for part in entry.key.split(".")[:-1]:
            owner = getattr(owner, part)
        value = getattr(owner, entry.field.name)
        if not _type_ok(value, entry.hint):
            raise UserError(f"{entry.label}: {value!r} is not a valid {_describe(entry.hint)}"
                            + (" (numbers must be finite)" if isinstance(value, float) else ""))
        settings.check(entry, value)
    if data_options and hasattr(cfg, "dataset") and hasattr(cfg, "data") and hasattr(cfg, "partition"):
        from securevfl.data.registry import check_data_options

        check_data_options(cfg.dataset, cfg.data, cfg.partition)


def whole_number(owner: str, key: str, value: typing.Any) -> int:
    """``value`` as an int if it is a whole number (an int, or a float/str with no fractional part);
    a one-line UserError otherwise — never a silent truncation."""
    try:
        f = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        f = math.nan
    if not math.isfinite(f) or f != int(f):
        raise UserError(f"{owner}: {key} must be a whole number, got {value!r}")
    return int(f)


def number(what: str, value: typing.Any, *, integer: bool = False, ge: float | None = None,
           gt: float | None = None, le: float | None = None) -> float | int:
    """The one check of a numeric flag or parameter outside the settings dataclasses (network flags,
    ports, spec values): ``value`` (text or a number) must be a finite number — NaN and ±inf are
    refused, which ``x <= 0`` alone lets through — whole where ``integer``, and within the bounds.
    Returns it as an int or a float; a one-line UserError names ``what`` otherwise."""
    text = value.strip() if isinstance(value, str) else value
    try:
        f = float(text) if not isinstance(text, bool) else math.nan
    except (TypeError, ValueError):
        raise UserError(f"{what} must be a number, got {value!r}") from None
    if not math.isfinite(f):
        raise UserError(f"{what} must be a finite number, got {value!r}")
    if integer and f != int(f):
        raise UserError(f"{what} must be a whole number, got {value!r}")
    bounds = [(ge, f >= ge if ge is not None else True, "≥"), (gt, f > gt if gt is not None else True, ">"),
              (le, f <= le if le is not None else True, "≤")]
    for bound, ok, sign in bounds:
        if not ok:
            raise UserError(f"{what} must be {sign} {bound:g}, got {value!r}")
    return int(f) if integer else f


def port(what: str, text: str) -> int:
    """A TCP port, 0..65535 (0: any free port, where listening)."""
    return int(number(what, text, integer=True, ge=0, le=65535))


def host_port(what: str, text: str) -> tuple[str, int]:
    """``HOST:PORT`` (an IPv6 host in brackets), the port checked by :func:`port`."""
    host, sep, p = str(text).rpartition(":")
    if not sep or not host:
        raise UserError(f"{what} {text}: expected HOST:PORT (e.g. 127.0.0.1:50051)")
    return host, port(f"{what} {text}: the port", p)


TEST_FIXTURE_PARAMS = ("seeded_shares",)
"""HE parameters only a test may set (through the Python API): ``seeded_shares`` derives the passive
party's secret share of W_P and its masks from the public seed, so the active party can too and HE
protects nothing. Step-for-step HE-on = HE-off comparisons need it; a user never does."""


def refuse_test_fixtures(params: dict, where: str) -> None:
    """A one-line refusal of a test-fixture HE parameter given by a user (CLI, config or sweep file)."""
    for key in params:
        if str(key).replace("-", "_") in TEST_FIXTURE_PARAMS:
            raise UserError(f"{where}: {key} is a test fixture (it derives the passive party's secret share "
                            "from the public seed, so HE would protect nothing) and cannot be set here")
