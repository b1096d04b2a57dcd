"""The methods report's sentences and tables, computed from the paired tables and the counters."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from securevfl.lab.report.methods.claims import _CHOICE, _FIELD, _fmt
from securevfl.lab.report.methods.stats import (
    _authors_rows,
    claim_runs,
    ours,
    references,
)


def _label(r: pd.Series, claim: dict, short: bool = False) -> str:
    """A comparison as a reader names it: ``vs local``, ``fedhssl-authors vs splitnn``; ``short``: arm
    names without their parameters (the answer table)."""
    def name(a: str) -> str:
        return a.split("{")[0] if short else a

    return ("" if r.arm == claim["method"] else f"{name(r.arm)} ") + "vs " + name(r.baseline) + (
        "" if r.rows == "all" else f" ({r.rows} rows)")


def _diff(p: pd.Series) -> str:
    return f"{p['mean']:+.3f} [{p['low']:+.3f}, {p['high']:+.3f}]"


def sentence(claim: dict, table: pd.DataFrame, frame: pd.DataFrame, verdict_text: str) -> str:
    """The claim's one-sentence answer at the paper's setting, with the ``why`` filled from counters."""
    head = ours(table, claim)
    head = head[head.headline]
    parts = [f"{_diff(r)} vs {r.baseline}" + (f" on {r.rows} test rows" if r.rows != "all" else "")
             + (f" (paper {r.paper:+g})" if isinstance(r.paper, int | float) else "")
             for _, r in head.iterrows()]
    n = int(head.n.min()) if len(head) else 0
    text = f"**{claim['title']}: {verdict_text}.** At the paper's setting: {'; '.join(parts)} ({n} seeds, paired)."
    ref = _authors_rows(table, claim)
    if len(ref) and ref.n.max() > 0:
        text += (" The authors' code (" + ", ".join(f"`{v}`" for v in references(claim).values())
                 + "; benchmarks/reference/) on the same rows and seeds: "
                 + "; ".join(f"{_diff(r)} {_label(r, claim)}" for _, r in ref.iterrows())
                 + f" ({int(ref.n.min())} seeds, paired).")
    if claim.get("why"):
        text += " " + fill(claim["why"], headline_counters(frame, claim))
    return text


def rows_sentence(table: pd.DataFrame, claim: dict) -> str:
    """Which way each of the method's gaps moves from the fewest training rows to all of them: it moves
    when the two ends' intervals do not overlap, else the sentence says it stays within seed noise."""
    parts = []
    for (base, rows), g in ours(table, claim).groupby(["baseline", "rows"], sort=False):
        g = g[g.n > 0].sort_values("regime")
        if len(g) < 2:
            continue
        a, b = g.iloc[0], g.iloc[-1]
        move = ("grows toward the method" if b.low > a.high else "moves against the method" if b.high < a.low
                else "stays within seed noise")
        on = "" if rows == "all" else f" (on {rows} test rows)"
        parts.append(f"vs {base}{on} {_signed(a['mean'])} at {_fmt(a.regime)} rows → {_signed(b['mean'])} at "
                     f"{_fmt(b.regime)}: {move}")
    if not parts:
        return ""
    return ("With more training rows, at the paper's setting (the papers had far more rows): " + "; ".join(parts)
            + ".")


def _key(name: str) -> str:
    """An arm's name as a template field: fedhssl{ssl_epochs=40} → fedhssl_ssl_epochs_40."""
    return re.sub(r"[{}=,]+", "_", name).strip("_")


def _family(frame: pd.DataFrame, claim: dict) -> list[str]:
    """The claim's arm and its variants in the sweep (risa and risa{tau_scale=rank}), claim's first."""
    base = claim["method"].split("{")[0]
    arms = sorted(set(claim_runs(frame, claim).method))
    return [claim["method"]] + [a for a in arms if a.split("{")[0] == base and a != claim["method"]]


def headline_counters(frame: pd.DataFrame, claim: dict) -> dict[str, float]:
    """Template values: the method's counters at the paper's setting averaged over seeds (names
    without ``c:``), a variant arm's as ``<arm>.<counter>``, and every arm's mean utility at every
    regime value as ``utility.<arm>@<value>``."""
    key = f"swept_{claim['regime']}" if claim.get("regime") else None
    values: dict[str, float] = {}
    runs = claim_runs(frame, claim)
    for i, arm_name in enumerate(_family(frame, claim)):
        sub = runs[runs.method == arm_name]
        if key and key in sub and "headline" in claim:
            sub = sub[np.isclose(sub[key].astype(float), float(claim["headline"]))]
        prefix = "" if i == 0 else _key(arm_name) + "."
        values |= {prefix + c[2:]: float(sub[c].mean()) for c in sub.columns
                   if c.startswith("c:") and sub[c].notna().any()}
    arms = runs
    groups = arms.groupby(["method", key]) if key and key in arms else arms.groupby(["method"])
    for k, g in groups:
        at = f"@{_fmt(k[1])}" if key and key in arms else ""
        values[f"utility.{_key(k[0])}{at}"] = float(g.utility.mean())
    return values




def fill(template: str, values: dict[str, float]) -> str:
    """``why`` with each ``{counter}`` or ``{counter:fmt}`` replaced by its measured mean, and each
    ``{?A|B|above|below|level}`` by the word the two means choose; a counter the runs lack reads
    ``{name: not measured}``."""
    def one(m: re.Match) -> str:
        name, fmt = m.group(1), m.group(2) or ".3g"
        return format(values[name], fmt) if name in values else f"{{{name}: not measured}}"

    def choose(m: re.Match) -> str:
        a, b, above, below, level = m.groups()
        if a not in values or b not in values:
            return f"{{{a if a not in values else b}: not measured}}"
        x, y = round(values[a], 3), round(values[b], 3)
        return above if x > y else below if x < y else level

    return _FIELD.sub(one, _CHOICE.sub(choose, template))


def counter_table(frame: pd.DataFrame, claim: dict) -> pd.DataFrame:
    """Mean ± sd over seeds of every counter of the method and its variant arms, at each regime value."""
    key = f"swept_{claim['regime']}" if claim.get("regime") else None
    family = _family(frame, claim)
    sub = claim_runs(frame, claim)
    sub = sub[sub.method.isin(family)]
    cols = [c for c in sub.columns if c.startswith("c:") and sub[c].notna().any()]
    out = {}
    for arm_name in family:
        at = sub[sub.method == arm_name]
        groups = at.groupby(key) if key and key in at else [("all", at)]
        for v, g in groups:
            label = f"{claim.get('regime', '')} {_fmt(v)}".strip()
            out[label if len(family) == 1 else f"{arm_name}, {label}"] = [
                "–" if g[c].isna().all() else
                f"{g[c].mean():.4g} ± {g[c].std():.2g}" if g[c].notna().sum() > 1 else f"{g[c].mean():.4g}"
                for c in cols]
    return pd.DataFrame({"counter": [c[2:] for c in cols], **out})


def _signed(v: float | None) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:+.3f}"


def _shown(table: pd.DataFrame) -> pd.DataFrame:
    """The paired table as the report prints it: comparisons with runs only (an arm without runs at a
    value, e.g. the authors' arm off the paper's setting, is no row)."""
    t = table[table.n > 0].copy()
    return pd.DataFrame({
        "arm": t.arm, "vs": t.baseline, "test rows": t.rows,
        "regime": [_fmt(v) if v is not None else "–" for v in t.regime],
        "paper's setting": ["yes" if h else "" for h in t.headline],
        # the means over the seeds the difference pairs (an arm's other seeds are not in them)
        "utility (arm)": [f"{v:.3f}" for v in t.method_mean], "utility (vs)": [f"{v:.3f}" for v in t.baseline_mean],
        "paired diff": [_signed(v) for v in t["mean"]],
        "95 % CI": [f"[{lo:+.3f}, {hi:+.3f}]" if math.isfinite(lo) else "–" for lo, hi in zip(t.low, t.high,
                                                                                               strict=True)],
        "seeds won": [f"{w}/{n}" for w, n in zip(t.wins, t.n, strict=True)],
        "detectable": [f"{v:.3f}" if math.isfinite(v) else "–" for v in t.detectable],
        "paper's diff": [_signed(v) if isinstance(v, int | float) else "–" for v in t.paper], "verdict": t.verdict,
        "like for like": ["no: mixes the authors' party split and model with ours" if m else "yes"
                          for m in (t.mixed if "mixed" in t else [False] * len(t))]})


