"""One validation layer for every entry point (CLI flags, config files, sweep cells, the Python
API): :func:`validate_config` checks a resolved :class:`~securevfl.config.RunConfig` before anything
is read or trained, and raises a one-line :class:`~securevfl.errors.UserError` naming the key, the
value and what is allowed.

Two passes over the config's dataclass fields: (1) the *type* of every value against the field's
annotation — list elements included, booleans never taken for numbers, floats finite; (2) the
*range* rules of :data:`RULES` (bounds, allowed values). Names (dataset, method, defense, attack, HE
scheme) are checked by their registries, method and scheme parameters by their owners.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing

from securevfl.errors import UserError

FLAGS = {"train.epochs": "--epochs", "train.batch_size": "--batch-size", "optim.lr": "--lr", "seed": "--seed",
         "mechanism_seed": "--mechanism-seed",
         "model.cut_dim": "--cut-dim", "data.max_rows": "--max-rows", "data.sample": "--sample",
         "partition.n_parties": "--parties", "partition.aligned_fraction": "--aligned-fraction",
         "partition.aligned_count": "--aligned-count", "partition.n_labeled": "--labeled",
         "partition.test_aligned_fraction": "--test-aligned-fraction", "optim.optimizer": "--optimizer",
         "model.bottom": "--bottom", "partition.alignment": "--alignment", "partition.unaligned": "--unaligned"}
"""The CLI flag of a config key, named beside it in errors."""

# key: (low, high, low inclusive, high inclusive) for numbers, or a tuple of allowed strings
RULES: dict[str, tuple] = {
    "seed": (0, 2**31 - 1, True, True),
    "mechanism_seed": (0, 2**31 - 1, True, True),
    "train.epochs": (1, math.inf, True, True),
    "train.batch_size": (1, math.inf, True, True),
    "train.eval_batch_size": (1, math.inf, True, True),
    "train.lr_grid": (0, math.inf, False, True),
    "optim.lr": (0, math.inf, False, True),
    "optim.weight_decay": (0, math.inf, True, True),
    "optim.interactive_lr": (0, math.inf, False, True),
    "optim.optimizer": ("adam", "sgd"),
    "model.cut_dim": (1, math.inf, True, True),
    "model.hidden": (1, math.inf, True, True),
    "model.cnn_channels": (1, math.inf, True, True),
    "model.head_hidden": (1, math.inf, True, True),
    "model.emb_dim": (1, math.inf, True, True),
    "model.bottom": ("auto", "mlp", "cnn"),
    "data.max_rows": (1, math.inf, True, True),
    "data.sample": (0, 1, False, True),
    "data.sample_seed": (0, 2**31 - 1, True, True),
    "data.min_freq": (1, math.inf, True, True),
    "data.hash_buckets": (0, math.inf, True, True),
    "partition.n_parties": (2, math.inf, True, True),
    "partition.aligned_fraction": (0, 1, True, True),
    "partition.aligned_count": (0, math.inf, True, True),
    "partition.n_labeled": (1, math.inf, True, True),
    "partition.test_fraction": (0, 1, False, False),
    "partition.test_aligned_fraction": (0, 1, False, True),
    "partition.unaligned_label_fraction": (0, 1, True, True),
    "partition.unaligned": ("disjoint", "all", "active"),
    "partition.alignment": ("given", "psi", "plain"),
}


def _name(key: str) -> str:
    return f"{FLAGS[key]} ({key})" if key in FLAGS else key


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


def _check_range(key: str, value: object) -> None:
    rule = RULES.get(key)
    if rule is None or value is None:
        return
    if isinstance(rule[0], str):
        if value not in rule:
            raise UserError(f"{_name(key)} must be one of {', '.join(rule)}, got {value!r}")
        return
    lo, hi, lo_in, hi_in = rule
    for v in (value if isinstance(value, list | tuple) else [value]):
        if isinstance(v, str):  # a keyword a numeric field also accepts (test_aligned_fraction: "train")
            continue
        ok = (v >= lo if lo_in else v > lo) and (v <= hi if hi_in else v < hi)
        if not ok:
            if math.isinf(hi):
                allowed = f"{'≥' if lo_in else '>'} {lo:g}"
            else:
                allowed = f"in {'[' if lo_in else '('}{lo:g}, {hi:.10g}{']' if hi_in else ')'}"
            raise UserError(f"{_name(key)} must be {allowed}, got {v!r}")


def _walk(obj: object, prefix: str) -> None:
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        key, value = prefix + f.name, getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            _walk(value, key + ".")
            continue
        typ = hints.get(f.name, typing.Any)
        if key == "partition.test_aligned_fraction" and value == "train":
            continue
        if not _type_ok(value, typ):
            raise UserError(f"{_name(key)}: {value!r} is not a valid {_describe(typ)}"
                            + (" (numbers must be finite)" if isinstance(value, float) else ""))
        _check_range(key, value)


def validate_config(cfg: object) -> None:
    """Raise a one-line UserError for the first value of ``cfg`` that is of the wrong type or range."""
    _walk(cfg, "")


def whole_number(owner: str, key: str, value: object) -> int:
    """``value`` as an int if it is a whole number (an int, or a float/str with no fractional part);
    a one-line UserError otherwise — never a silent truncation."""
    try:
        f = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        f = math.nan
    if not math.isfinite(f) or f != int(f):
        raise UserError(f"{owner}: {key} must be a whole number, got {value!r}")
    return int(f)
