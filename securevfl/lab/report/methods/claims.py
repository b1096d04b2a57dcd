"""The methods report's claims file (``sweeps/methods/claims.yaml``): its schema and checks."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from securevfl.errors import UserError

CLAIM_KEYS = {"method", "title", "paper", "sweep", "regime", "headline", "comparisons", "why", "subset", "more_seeds",
              "rows", "reference", "source"}
REQUIRED_KEYS = ("method", "title", "paper", "sweep", "comparisons")
COMPARISON_KEYS = {"baseline", "paper", "subset", "from"}
"""``from``: the baseline at this regime value (the method against itself across the regime: a claim about the
swept value itself, e.g. FedHSSL at 40 % aligned − FedHSSL at 20 %)."""
SUBSETS = ("all", "aligned", "unaligned")
"""A claim's or a comparison's ``subset``: the test rows its utilities are taken on."""
REFERENCE_SUFFIX = "-authors"
"""A reference arm's run id is its cell's run id + this (``benchmarks/reference/``): it belongs to every
sweep that holds the cell, with that sweep's swept values."""
ROWS_KEY = "swept_train_rows"
"""The rows axis: the rows sweep's ``train_rows``; the claim's own runs count at all their training rows."""
POWER = 0.8
"""The power at which a comparison's smallest detectable effect is stated (two-sided 5 % test)."""
MAX_FORMAT_NUMBER = 100
"""The largest width or precision a ``why`` field's format spec may give (``{x:.3f}``)."""

_FIELD = re.compile(r"\{([\w.\-@]+)(?::([^}]*))?\}")
_CHOICE = re.compile(r"\{\?([\w.\-@]+)\|([\w.\-@]+)\|([^|{}]*)\|([^|{}]*)\|([^|{}]*)\}")
"""A word the numbers choose: ``{?A|B|above|below|level with}`` reads the first word when counter A's mean
is above B's (at three decimals), the second below, the third level (a ``why`` never asserts a direction)."""


def load_claims(path: str | Path) -> list[dict]:
    """The claims file's entries, each checked for its keys and the types of their values; every
    mistake is one :class:`UserError` line naming the file (read under :mod:`securevfl.configuration.limits`: not
    UTF-8, too large, too deep, recursive aliases and duplicate keys are refused there)."""
    from securevfl.configuration.limits import brief, load_yaml, read_text_limited

    p = Path(path)
    name = f"--claims {p}"
    if not p.exists() or p.is_dir():
        raise UserError(f"{name}: {'a folder, not a file' if p.is_dir() else 'no such file'}")
    try:
        claims = load_yaml(read_text_limited(p, "--claims"))
    except UserError as e:
        raise UserError(str(e) if str(e).startswith(name) else f"{name}: {e}") from None
    if claims is None:  # no YAML value at all: nothing, blanks or comments only
        raise UserError(f"{name}: the file is empty; expected a list of claims")
    if not isinstance(claims, list) or not claims:
        raise UserError(f"{name}: expected a list of claims (mappings with {', '.join(REQUIRED_KEYS)}), got "
                        f"{_kind(claims)}")
    for i, c in enumerate(claims):
        if not isinstance(c, dict):
            raise UserError(f"{name}: claim {i + 1}: expected a mapping with {', '.join(REQUIRED_KEYS)}, got "
                            f"{_kind(c)}")
        where = f"{name}: claim {i + 1} ({brief(c.get('method'))})"
        unknown = {str(k) for k in c} - CLAIM_KEYS
        missing = set(REQUIRED_KEYS) - set(c)
        if unknown or missing:
            raise UserError(f"{where}: " + "; ".join(
                ([f"unknown keys {sorted(unknown)} (expected {', '.join(sorted(CLAIM_KEYS))})"] if unknown else [])
                + ([f"missing {sorted(missing)}"] if missing else [])))
        _check_claim(c, where)
    return claims


def _kind(value: object) -> str:
    """A value's YAML kind for an error line, with a brief quote."""
    from securevfl.configuration.limits import brief

    if value is None:
        return "nothing"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "an empty list" if not value else f"a list ({brief(value)})"
    if isinstance(value, bool):
        return f"a boolean ({value})"
    if isinstance(value, int | float):
        return f"a number ({brief(value)})"
    if isinstance(value, str):
        return f"text ({brief(value)})"
    return f"{type(value).__name__} ({brief(value)})"


def _check_claim(c: dict, where: str) -> None:
    """One claim's values: text where text is read, numbers where numbers are, known subsets, each
    comparison a mapping with its baseline, and every ``why`` format spec one that formats a number."""
    ref = c.get("reference")
    if ref is not None and not (isinstance(ref, str) and ref.strip()) and not (
            isinstance(ref, dict) and ref and c["method"] in ref
            and all(isinstance(k, str) and isinstance(v, str) and v.strip() for k, v in ref.items())):
        raise UserError(f"{where}: reference: expected the authors' arm, or a mapping from our arms (the claim's "
                        f"method among them) to the authors' arms, got {_kind(ref)}")
    for key in ("method", "title", "paper", "sweep", "regime", "why", "more_seeds", "rows"):
        if key in c and (not isinstance(c[key], str) or (key in REQUIRED_KEYS and not c[key].strip())):
            raise UserError(f"{where}: {key}: expected {'non-empty ' if key in REQUIRED_KEYS else ''}text, got "
                            f"{_kind(c[key])}")
    if "headline" in c and not _is_number(c["headline"]):
        raise UserError(f"{where}: headline: expected a number (the regime value of the paper's setting), got "
                        f"{_kind(c['headline'])}")
    if "subset" in c:
        _check_subset(c["subset"], f"{where}: subset")
    comps = c["comparisons"]
    if not isinstance(comps, list) or not comps:
        raise UserError(f"{where}: comparisons: expected a list of {{baseline: ARM, paper: DIFF}} mappings, got "
                        f"{_kind(comps)}")
    for j, comp in enumerate(comps):
        at = f"{where}: comparisons[{j}]"
        if not isinstance(comp, dict):
            raise UserError(f"{at}: expected a mapping {{baseline: ARM, paper: DIFF, subset: ROWS}}, got "
                            f"{_kind(comp)}")
        unknown = {str(k) for k in comp} - COMPARISON_KEYS
        if unknown:
            raise UserError(f"{at}: unknown keys {sorted(unknown)}; expected {', '.join(sorted(COMPARISON_KEYS))}")
        if "baseline" not in comp:
            raise UserError(f"{at}: missing its baseline (the arm the method is compared with)")
        if not isinstance(comp["baseline"], str) or not comp["baseline"].strip():
            raise UserError(f"{at}: baseline: expected an arm's name, got {_kind(comp['baseline'])}")
        if "paper" in comp and comp["paper"] is not None and not _is_number(comp["paper"]):
            raise UserError(f"{at}: paper: expected the paper's difference as a number, got {_kind(comp['paper'])}")
        if "subset" in comp:
            _check_subset(comp["subset"], f"{at}: subset")
        if "from" in comp and (not _is_number(comp["from"]) or "regime" not in c):
            raise UserError(f"{at}: from: expected the regime value the baseline runs at (a number, with the claim's "
                            f"regime), got {_kind(comp['from'])}")
    if "why" in c:
        for m in _FIELD.finditer(c["why"]):
            if m.group(2):
                _check_format(m.group(1), m.group(2), f"{where}: why")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_subset(value: object, where: str) -> None:
    from securevfl.configuration.limits import brief

    if not isinstance(value, str) or value not in SUBSETS:
        raise UserError(f"{where}: {brief(value)} is not one of the test-row subsets {', '.join(SUBSETS)}")


def _check_format(field: str, spec: str, where: str) -> None:
    """A ``{field:spec}`` of ``why``, tried on a number (the counters are floats)."""
    from securevfl.configuration.limits import brief

    shown = brief("{" + field + ":" + spec + "}")
    numbers = [int(d) for d in re.findall(r"\d+", spec)]
    if len(spec) > 40 or any(n > MAX_FORMAT_NUMBER for n in numbers):
        raise UserError(f"{where}: {shown}: a width or precision above {MAX_FORMAT_NUMBER}; e.g. {{{field}:.3f}}")
    try:
        format(1234.5678, spec)
    except (ValueError, TypeError) as e:
        raise UserError(f"{where}: {shown}: not a format for a number ({e}); e.g. {{{field}:.3f}}") from None


# --- store → frame -------------------------------------------------------------------------------


def _fmt(v: Any) -> str:
    return f"{v:g}" if isinstance(v, int | float | np.integer | np.floating) else str(v)


# --- text, figure, report --------------------------------------------------------------------------

def _vs(r: pd.Series) -> str:
    return r.baseline + ("" if r.rows == "all" else f" ({r.rows} rows)")
