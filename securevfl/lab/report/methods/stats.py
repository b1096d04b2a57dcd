"""The methods report's paired statistics: seed-paired differences, their intervals and the verdicts."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from securevfl.lab.report.methods.claims import (
    POWER,
    ROWS_KEY,
    _fmt,
)


def paired(a: pd.Series, b: pd.Series) -> dict[str, float]:
    """Mean of a − b over the seeds both have, its sd and 95 % t-interval, and how many seeds a wins."""
    both = pd.concat([a.rename("a"), b.rename("b")], axis=1).dropna()
    d = (both.a - both.b).to_numpy(dtype=float)
    n = len(d)
    if n == 0:
        return {"n": 0, "mean": math.nan, "sd": math.nan, "low": math.nan, "high": math.nan, "wins": 0,
                "detectable": math.nan}
    mean, sd = float(d.mean()), float(d.std(ddof=1)) if n > 1 else math.nan
    half = float(stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)) if n > 1 else math.nan
    return {"n": n, "mean": mean, "sd": sd, "low": mean - half, "high": mean + half, "wins": int((d > 0).sum()),
            "detectable": detectable(sd, n)}


def detectable(sd: float, n: int, power: float = POWER) -> float:
    """The smallest true mean difference that ``n`` paired seeds with this sd find (two-sided 5 % t-test)
    with probability ``power``: (t₀.₉₇₅ + t_power) · sd / √n, with n − 1 degrees of freedom."""
    if n < 2 or not math.isfinite(sd):
        return math.nan
    return float((stats.t.ppf(0.975, n - 1) + stats.t.ppf(power, n - 1)) * sd / math.sqrt(n))


REPRODUCED, LARGER, SMALLER, NO_EFFECT, OPPOSITE, AN_EFFECT, UNRESOLVED, TOO_FEW = (
    "reproduced", "larger than the paper's", "a smaller effect", "no effect", "the opposite", "an effect",
    "unresolved", "too few seeds")
REPRODUCES = frozenset({REPRODUCED, LARGER, AN_EFFECT})
"""Comparison verdicts that carry the paper's effect (its size where it gives one)."""


def verdict(p: dict[str, float], paper: float | None = None) -> str:
    """How much of the paper's effect our seed-paired 95 % interval [low, high] shows, read in the
    direction of the paper's difference P (positive when it gives none):

    - ``reproduced``: the interval holds P and excludes 0; ``larger than the paper's``: it lies above P;
    - ``a smaller effect``: above 0 but below P (an effect, not the paper's size);
    - ``no effect``: it holds 0 and excludes P; ``the opposite``: it lies below 0;
    - ``unresolved``: it holds both 0 and P (our seeds cannot tell);
    - without a paper value: ``an effect`` (above 0), ``the opposite`` or ``unresolved``."""
    if p["n"] < 2 or math.isnan(p["low"]):
        return TOO_FEW
    given = isinstance(paper, int | float) and math.isfinite(float(paper)) and float(paper) != 0
    sign = -1.0 if given and float(paper) < 0 else 1.0  # type: ignore[arg-type]
    low, high = sorted((sign * p["low"], sign * p["high"]))
    if high < 0:
        return OPPOSITE
    if not given:
        return AN_EFFECT if low > 0 else UNRESOLVED
    size = abs(float(paper))  # type: ignore[arg-type]
    if low > size:
        return LARGER
    if low > 0:
        return REPRODUCED if high >= size else SMALLER
    return UNRESOLVED if high >= size else NO_EFFECT


def claim_runs(frame: pd.DataFrame, claim: dict) -> pd.DataFrame:
    """The regime map's runs: the claim's sweep, plus its ``more_seeds`` sweep (further seeds at the
    paper's setting only: its runs count at the headline's regime value)."""
    sub = frame[frame.sweep == claim["sweep"]]
    if claim.get("more_seeds"):
        more = frame[frame.sweep == claim["more_seeds"]].copy()
        if claim.get("regime") and "headline" in claim:
            more[f"swept_{claim['regime']}"] = claim["headline"]
        sub = pd.concat([sub, more], ignore_index=True)
    return sub


def rows_runs(frame: pd.DataFrame, claim: dict) -> pd.DataFrame:
    """The rows axis's runs at the paper's setting: the ``rows`` sweep's (``train_rows`` swept) and the
    claim's own headline runs, which count at all their training rows."""
    if not claim.get("rows"):
        return frame.iloc[:0]
    own = claim_runs(frame, claim)
    key = f"swept_{claim['regime']}" if claim.get("regime") else None
    if key and key in own and "headline" in claim:
        own = own[np.isclose(own[key].astype(float), float(claim["headline"]))]
    own = own.assign(**{ROWS_KEY: own.train_total})
    fewer = frame[frame.sweep == claim["rows"]]
    return pd.concat([fewer, own], ignore_index=True)


def references(claim: dict) -> dict[str, str]:
    """Our arm → the authors' arm of the same method (``reference``: one name is the method's)."""
    ref = claim.get("reference")
    return {claim["method"]: ref} if isinstance(ref, str) else dict(ref or {})


def pairs(claim: dict) -> list[tuple[str, dict]]:
    """(arm, comparison) pairs: the method against each baseline; with the authors' code (``reference``),
    their method against each baseline (their own baseline where they have one), and each of our arms
    against the authors' arm of the same method."""
    out = [(claim["method"], c) for c in claim["comparisons"]]
    refs = references(claim)
    if refs:
        out += [(refs[claim["method"]], {**c, "baseline": refs.get(c["baseline"], c["baseline"])})
                for c in claim["comparisons"]]
        out += [(ours_arm, {"baseline": theirs_arm}) for ours_arm, theirs_arm in refs.items()]
    return out


def comparison_table(frame: pd.DataFrame, claim: dict) -> pd.DataFrame:
    """One row per (arm, comparison, regime value): the paired difference of the arm against the baseline."""
    key = f"swept_{claim['regime']}" if claim.get("regime") else None
    return _paired_table(claim_runs(frame, claim), claim, key, lambda v: _is_headline(claim, v))


def rows_table(frame: pd.DataFrame, claim: dict) -> pd.DataFrame:
    """The comparisons at the paper's setting against the number of training rows (the largest: all)."""
    sub = rows_runs(frame, claim)
    if sub.empty or ROWS_KEY not in sub or sub[ROWS_KEY].isna().all():
        return pd.DataFrame()
    most = float(sub[ROWS_KEY].max())
    # no paper's difference here: the papers measured at far more rows than any point of this axis
    return _paired_table(sub, claim, ROWS_KEY, lambda v: v is not None and float(v) == most, papers=False)


def _paired_table(sub: pd.DataFrame, claim: dict, key: str | None, is_headline: Any,
                  papers: bool = True) -> pd.DataFrame:
    values = sorted(sub[key].dropna().unique()) if key and key in sub else [None]
    column = {"unaligned": "utility_unaligned", "aligned": "utility_aligned"}
    rows = []
    for arm_name, comp in pairs(claim):
        col = column.get(comp.get("subset", claim.get("subset", "")), "utility")
        start = comp.get("from")
        for v in values:
            if start is not None and (v is None or _same(v, start)):
                continue  # across the regime: each other value against the starting one
            at = sub if v is None else sub[sub[key] == v]
            then = at if start is None else sub[[_same(x, start) for x in sub[key]]]
            arm = at[at.method == arm_name].groupby("seed")[col].first()
            base = then[then.method == comp["baseline"]].groupby("seed")[col].first()
            p = paired(arm, base)
            shared = arm.index.intersection(base.index)  # the means beside the difference: over its seeds only
            arm, base = arm.loc[shared].dropna(), base.loc[shared].dropna()
            head = is_headline(v)
            paper = comp.get("paper") if head and papers else None
            named = comp["baseline"] + ("" if start is None else f" at {_fmt(start)}")
            theirs_set = set(references(claim).values())
            mixed = bool(theirs_set) and ((arm_name in theirs_set) != (comp["baseline"] in theirs_set))
            rows.append({"arm": arm_name, "baseline": named, "mixed": mixed,
                         "rows": comp.get("subset", claim.get("subset", "all")),
                         "regime": v, "headline": head, "paper": paper,
                         "method_mean": float(arm.mean()) if len(arm) else math.nan,
                         "baseline_mean": float(base.mean()) if len(base) else math.nan, **p,
                         "verdict": verdict(p, paper)})
    return pd.DataFrame(rows)


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(np.isclose(float(a), float(b)))
    except (TypeError, ValueError):
        return False


def ours(table: pd.DataFrame, claim: dict) -> pd.DataFrame:
    """The method's own comparisons (not the reference arm's, nor the method against the reference)."""
    return table[(table.arm == claim["method"]) & ~table.baseline.isin(list(references(claim).values()))]


def theirs(table: pd.DataFrame, claim: dict) -> pd.DataFrame:
    """The reference arm's comparisons against the baselines (empty without one)."""
    main = references(claim).get(claim["method"])
    if not main:
        return table.iloc[:0]
    # their method against their own baselines only: against ours it mixes their party split and model with ours
    return table[(table.arm == main) & ~table.get("mixed", pd.Series(False, index=table.index)).astype(bool)]


def _authors_rows(table: pd.DataFrame, claim: dict) -> pd.DataFrame:
    """The comparisons at the paper's setting that involve the authors' code (and have runs)."""
    return table[table.headline & (table.n > 0) & ~((table.arm == claim["method"]) & ~table.baseline.isin(
        list(references(claim).values())))] if references(claim) else table.iloc[:0]


def claim_verdict(table: pd.DataFrame, claim: dict) -> str:
    """The method's verdict; with the authors' code as an arm, whether theirs agrees, comparison by
    comparison at the paper's setting (their method against their baseline where they have one):
    ``no effect, with the authors' code too`` when both agree, else both verdicts side by side."""
    mine = method_verdict(ours(table, claim), claim)
    ref = theirs(table, claim)
    if ref.empty or ref.n.max() == 0:
        return mine
    other = method_verdict(ref, claim)
    refs, head = references(claim), table[table.headline & (table.n > 0)]
    each = []
    for comp in claim["comparisons"]:
        rows = comp.get("subset", claim.get("subset", "all"))
        o = head[(head.arm == claim["method"]) & (head.baseline == comp["baseline"]) & (head.rows == rows)]
        t = head[(head.arm == refs[claim["method"]]) & (head.baseline == refs.get(comp["baseline"], comp["baseline"]))
                 & (head.rows == rows)]
        t = t[~t.mixed.astype(bool)] if "mixed" in t else t  # like for like only: their arm against theirs
        if len(o) and len(t):
            on = "" if rows == "all" else f" on {rows} test rows"
            each.append((f"vs {comp['baseline'].split('{')[0]}{on}", o.verdict.iloc[0], t.verdict.iloc[0]))
    if not each:  # no like-for-like comparison of theirs at the paper's setting
        return mine
    if len(each) == len(claim["comparisons"]) and mine == other and all(vo == vt for _, vo, vt in each):
        return f"{mine}, with the authors' code too"
    if len(claim["comparisons"]) < 2:
        return f"{mine} (the authors' code: {other})"
    # several comparisons: theirs beside the one each matches (one their code cannot make like for like,
    # e.g. their FedHSSL against our splitnn, carries none)
    return mine + "; at the paper's setting " + "; ".join(
        f"{vs}: {vo}" + (", with the authors' code too" if vo == vt else f" (the authors' code: {vt})")
        for vs, vo, vt in each)


def _is_headline(claim: dict, value: Any) -> bool:
    if value is None or "headline" not in claim:
        return True
    return bool(np.isclose(float(value), float(claim["headline"])))


_SAID = {REPRODUCED: "the paper's effect reproduced", LARGER: "a larger effect than the paper's",
         SMALLER: "a smaller effect than the paper's", NO_EFFECT: "no effect", OPPOSITE: "the opposite",
         AN_EFFECT: "an effect (the paper gives no size)", UNRESOLVED: "unresolved (within seed noise)"}


def method_verdict(table: pd.DataFrame, claim: dict) -> str:
    """One arm's verdict at the paper's setting (:func:`ours` or :func:`theirs`): the comparisons'
    common verdict (:func:`verdict`, said in words), or each comparison's when they differ; where the
    paper's effect is not reproduced at its setting, the swept values at which every comparison
    reproduces it, if any."""
    head = table[table.headline]
    if (head.verdict == TOO_FEW).any() or head.empty:
        return "too few seeds to tell"
    each = []
    for (base, rows), g in head.groupby(["baseline", "rows"], sort=False):
        on = "" if rows == "all" else f" on {rows} test rows"
        each.append((f"vs {base}{on}", str(g.verdict.iloc[0])))
    kinds = {v for _, v in each}
    said = _SAID[kinds.pop()] if len(kinds) == 1 else "; ".join(f"{vs}: {v}" for vs, v in each)
    if set(head.verdict) <= REPRODUCES:
        return said
    key = claim.get("regime", "")
    good = [v for v, g in table.groupby("regime") if set(g.verdict) <= REPRODUCES] if key else []
    if good:
        said += f"; reproduced in regime {key} ∈ {{{', '.join(_fmt(v) for v in good)}}}"
    return said
