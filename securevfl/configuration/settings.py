"""One definition per setting: a run setting is one dataclass field declared with :func:`setting`,
which carries its type (the annotation), default, docstring, validation (range, allowed values) and
command-line flag. Everything else is generated from those fields:

- the ``train`` flags and the flag → config mapping (:func:`add_flags`, :func:`apply_flags`);
- the config-file and sweep keys (:func:`securevfl.config.apply_dict` walks the same fields);
- the validation messages (:func:`check`, used by :mod:`securevfl.configuration.validate`), which name the flag
  and the key, e.g. ``--epochs (train.epochs) must be ≥ 1``;
- the reference table in ``docs/configuration.md`` (:mod:`securevfl.configuration.settings_doc`).

The docstring is metadata (``doc=``), not a string literal after the field: ``--help`` needs it at
run time, and metadata needs no source file or parsing (it also survives zipped installs and
``python -OO``, and cannot silently detach from its field when code moves).

This module imports nothing heavy: the config dataclasses live next to the code they configure
(some of it imports torch) and import :func:`setting` from here.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from securevfl.errors import UserError

CLI_KINDS = ("value", "append", "comma", "keyvalue")
"""How a flag's values map onto its field: ``value`` (one value; a bool field: a switch that sets it
true), ``append`` (repeatable; the list of values), ``comma`` (one comma-separated list),
``keyvalue`` (repeatable ``KEY=VALUE``, each value read as YAML, merged into the mapping)."""


@dataclass(frozen=True)
class Setting:
    """What a field declares beyond its type and default (stored in the field's metadata)."""

    doc: str
    flag: str | None = None
    """The ``train`` flag, or None: a config-file / sweep key only."""
    cli: str = "value"
    """One of :data:`CLI_KINDS`."""
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    keywords: tuple[str, ...] = ()
    """Words a numeric setting also accepts (``test_aligned_fraction: train``)."""


def setting(default: Any = dataclasses.MISSING, *, factory: Callable[[], Any] | None = None, doc: str,
            flag: str | None = None, cli: str = "value", metavar: str | None = None,
            choices: tuple[str, ...] | None = None, ge: float | None = None, gt: float | None = None,
            le: float | None = None, lt: float | None = None, keywords: tuple[str, ...] = ()) -> Any:
    """A dataclass field that is a run setting (or, with a dataclass ``factory``, a section of them).

    ``ge``/``gt``/``le``/``lt`` bound numbers (every element of a list); ``choices`` lists the
    allowed strings; ``flag`` names its ``train`` flag (None: config file / sweep only)."""
    if not doc.strip():
        raise ValueError("a setting needs a docstring")
    if flag is not None and not re.fullmatch(r"--[a-z][a-z0-9-]*", flag):
        raise ValueError(f"flag {flag!r} is not of the form --lower-case")
    if cli not in CLI_KINDS:
        raise ValueError(f"cli={cli!r}: expected one of {CLI_KINDS}")
    if choices and default is not None and default is not dataclasses.MISSING and default not in choices:
        raise ValueError(f"default {default!r} is not one of the choices {choices}")
    meta = {"setting": Setting(" ".join(doc.split()), flag, cli, metavar, choices, ge, gt, le, lt, keywords)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclass(frozen=True)
class Entry:
    """One setting as found under a config class: its dotted key, field, declaration and type."""

    key: str
    field: dataclasses.Field
    setting: Setting | None
    hint: Any

    @property
    def default(self) -> Any:
        if self.field.default_factory is not dataclasses.MISSING:
            return self.field.default_factory()
        return self.field.default

    @property
    def label(self) -> str:
        """How errors name it: ``--epochs (train.epochs)``, or the key alone when it has no flag."""
        return f"{self.setting.flag} ({self.key})" if self.setting and self.setting.flag else self.key


def declared(f: dataclasses.Field) -> Setting | None:
    return f.metadata.get("setting")


def walk(cls: type, prefix: str = "", sections: bool = False) -> Iterator[Entry]:
    """Every leaf setting under the config dataclass ``cls`` in declaration order, nested sections
    (fields whose default is a dataclass) flattened to dotted keys; with ``sections``, each
    section's own entry comes before its settings."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        entry = Entry(prefix + f.name, f, declared(f), hints.get(f.name, Any))
        if isinstance(entry.hint, type) and dataclasses.is_dataclass(entry.hint):
            if sections:
                yield entry
            yield from walk(entry.hint, entry.key + ".", sections)
        else:
            yield entry


def by_key(cls: type) -> dict[str, Entry]:
    return {e.key: e for e in walk(cls)}


# ---------------------------------------------------------------- validation


def allowed(s: Setting) -> str:
    """The allowed values in words, as errors and the docs state them ('' when unrestricted)."""
    if s.choices:
        return "one of " + ", ".join(s.choices)
    lo, lo_in = (s.ge, True) if s.ge is not None else (s.gt, False)
    hi, hi_in = (s.le, True) if s.le is not None else (s.lt, False)
    if lo is None and hi is None:
        return ""
    if hi is None:
        return f"{'≥' if lo_in else '>'} {lo:g}"
    if lo is None:
        return f"{'≤' if hi_in else '<'} {hi:.10g}"
    return f"in {'[' if lo_in else '('}{lo:g}, {hi:.10g}{']' if hi_in else ')'}"


def in_range(s: Setting, v: object) -> bool:
    """Whether the number ``v`` satisfies the bounds of ``s``."""
    assert isinstance(v, int | float)
    return ((s.ge is None or v >= s.ge) and (s.gt is None or v > s.gt)
            and (s.le is None or v <= s.le) and (s.lt is None or v < s.lt))


def check(entry: Entry, value: object) -> None:
    """Raise a one-line UserError if ``value`` (already of the right type) is outside the setting's
    allowed values. None is always allowed here (the type check decides whether it may be None)."""
    s = entry.setting
    if s is None or value is None:
        return
    if s.choices:
        if value not in s.choices:
            raise UserError(f"{entry.label} must be {allowed(s)}, got {value!r}")
        return
    for v in (value if isinstance(value, list | tuple) else [value]):
        if isinstance(v, str):  # a keyword a numeric field also accepts (test_aligned_fraction: "train")
            continue
        if isinstance(v, int | float) and not in_range(s, v):
            raise UserError(f"{entry.label} must be {allowed(s)}, got {v!r}")


# ---------------------------------------------------------------- command line


def _scalar(hint: Any) -> Any:
    """The one type a flag's text converts to: ``int | None`` → int; ``float | str`` → float (its
    strings are keywords); a mixed union with ``str`` → str; ``list[X]`` → X."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        for t in (bool, int, float):
            if t in args:
                return t
        return str if str in args or len(args) != 1 else _scalar(args[0])
    if origin in (list, tuple):
        args = [a for a in typing.get_args(hint) if a is not Ellipsis]
        return _scalar(args[0]) if args else str
    return hint if hint in (bool, int, float, str) else str


def _number_or_keyword(typ: type, keywords: tuple[str, ...]) -> Callable[[str], object]:
    def convert(text: str) -> object:
        if text in keywords:
            return text
        try:
            return typ(text)
        except ValueError:
            words = " or ".join(repr(k) for k in keywords)
            raise argparse.ArgumentTypeError(f"expected a number or {words}, got {text!r}") from None

    return convert


def help_text(entry: Entry) -> str:
    """The docstring as plain text (reST markup dropped) with the default when it says something."""
    assert entry.setting is not None
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", entry.setting.doc).replace("``", "")
    d = entry.default
    if d is not None and d != [] and d != {} and d != () and not isinstance(d, bool) \
            and not dataclasses.is_dataclass(d):
        text += f" (default {d})"
    return text.replace("%", "%%")  # argparse formats help with %


def metavar(entry: Entry) -> str | None:
    s = entry.setting
    assert s is not None and s.flag is not None
    if s.metavar or s.choices:
        return s.metavar
    return "KEY=VALUE[,...]" if s.cli == "keyvalue" else s.flag[2:].upper().replace("-", "_")


class _Once(argparse.Action):
    """A single-valued flag given twice is refused: argparse would keep the last one silently
    (``--defense iso:5 --defense dp:...``; compose defenses with ``+`` instead)."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        if getattr(namespace, self.dest, None) is not None:
            hint = "; compose defenses with '+' in one --defense" if option_string == "--defense" else ""
            raise UserError(f"{option_string} given more than once (the last would win silently){hint}")
        setattr(namespace, self.dest, values)


def add_flags(parser: argparse.ArgumentParser, cls: type) -> dict[str, Any]:
    """One flag per setting under ``cls`` that declares one, in an argument group per section (top-level
    settings under "run settings"); returns the groups by section key ("" for the top level). Every flag
    defaults to None (not given), so a config file's value stands unless the flag overrides it."""
    groups: dict[str, Any] = {"": parser.add_argument_group("run settings")}
    for entry in walk(cls, sections=True):
        s = entry.setting
        if isinstance(entry.hint, type) and dataclasses.is_dataclass(entry.hint):
            groups[entry.key] = parser.add_argument_group(f"{entry.key} settings", help_text(entry) if s else None)
            continue
        if s is None or s.flag is None:
            continue
        kw: dict[str, Any] = {"dest": entry.key, "default": None, "help": help_text(entry)}
        typ = _scalar(entry.hint)
        if s.cli in ("append", "keyvalue"):
            kw.update(action="append", type=typ if s.cli == "append" else str)
        elif s.cli == "comma":
            kw["type"] = str
        elif typ is bool:
            kw["action"] = "store_true"  # a switch: sets true; false is the default or the config file's
        else:
            kw["type"] = _number_or_keyword(typ, s.keywords) if s.keywords else typ
            kw["choices"] = s.choices
            kw["action"] = _Once
        if kw.get("action") != "store_true":
            kw["metavar"] = metavar(entry)
        groups[entry.key.rpartition(".")[0]].add_argument(s.flag, **kw)
    return groups


def _parse_keyvalue(flag: str, text: str) -> tuple[str, object]:
    from securevfl.configuration.limits import load_yaml  # only when a KEY=VALUE flag is given

    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise UserError(f"{flag} {text!r}: expected KEY=VALUE")
    try:
        return key.strip(), load_yaml(value)
    except UserError as e:
        raise UserError(f"{flag} {key.strip()}: {e}") from None


_NEXT_KEY = re.compile(r",(?=\s*[A-Za-z_][\w.-]*\s*=)")
"""A comma that starts another ``KEY=VALUE`` (a comma inside a value, e.g. a YAML list, does not)."""


def parse_keyvalues(flag: str, items: list[str]) -> dict[str, object]:
    """Every ``KEY=VALUE`` of a repeatable flag (``--audit``, ``--he-param``, ``--method-param``), each
    flag holding one or several separated by commas, as ``--defense NAME:K=V,K=V`` does: the one syntax
    of key=value settings. A key given twice is refused, naming both values (the last would win
    silently)."""
    out: dict[str, object] = {}
    for item in items:
        for part in _NEXT_KEY.split(item):
            key, value = _parse_keyvalue(flag, part)
            if key in out:
                raise UserError(f"{flag} {key} given twice ({out[key]!r} and {value!r}); give it once")
            out[key] = value
    return out


def apply_flags(cfg: object, args: argparse.Namespace) -> None:
    """Set each setting of ``cfg`` whose flag was given in ``args`` (as :func:`add_flags` made them)."""
    for entry in walk(type(cfg)):
        s = entry.setting
        value = getattr(args, entry.key, None) if s and s.flag else None
        if value is None:
            continue
        assert s is not None and s.flag is not None
        owner = cfg
        for part in entry.key.split(".")[:-1]:
            owner = getattr(owner, part)
        name = entry.field.name
        if s.cli == "keyvalue":
            getattr(owner, name).update(parse_keyvalues(s.flag, value))
        elif s.cli == "comma":
            setattr(owner, name, [c.strip() for c in value.split(",") if c.strip()])
        elif s.cli == "append":
            setattr(owner, name, list(value))
        else:
            setattr(owner, name, value)


def undocumented(cls: type) -> list[str]:
    """Fields under ``cls`` (sections included) declared without :func:`setting` or with an empty doc."""
    return [e.key for e in walk(cls, sections=True) if e.setting is None or not e.setting.doc.strip()]


def type_name(hint: Any) -> str:
    """A type as the docs show it: ``int | None``, ``list[str]``, ``tuple[int, ...]``."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(hint))
    if origin is not None:
        args = typing.get_args(hint)
        return f"{origin.__name__}[{', '.join('...' if a is Ellipsis else type_name(a) for a in args)}]"
    if hint is type(None):
        return "None"
    if hint is dict:
        return "mapping"
    return getattr(hint, "__name__", str(hint))
