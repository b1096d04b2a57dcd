"""The methods report (issue 42): each paper's headline comparison beside ours, from one store.

A *claims file* (``sweeps/methods/claims.yaml``) lists, per method, the paper's comparison (its
baselines and their published differences), the sweep that re-runs it, the swept key whose values
form the regime map and the value that is the paper's own setting. For each comparison we pair the
runs by seed (the same partition, initialisation and batches for both arms) and report the mean
paired difference with its 95 % t-interval. A comparison *holds* when the interval lies above zero,
*does not hold* when it lies below zero or below the paper's own difference (our seeds exclude the
effect the paper reports), and is *unresolved* otherwise. A method's verdict is ``holds`` (every
comparison holds at the paper's setting), ``holds in regime X`` (all hold at the swept values
named), ``holds in part`` (the comparisons that hold somewhere, and where), ``does not hold`` or
``unresolved``. The claims file can add
a ``why`` sentence whose ``{fields}`` are filled from the measured step counters, so the explanation
quotes the run and never a typed-in number.

Flow as in the sweep report: store → tidy frame (one row per run with its counters) → paired table
→ figure and sentences → ``report.md`` + ``report.html``.

Over 600 lines (789) in one file because the claims schema, the paired statistics and the verdict sentences
read one table shape per claim; the split the main report has (claims, frame, text, figures) is still
to do (issue 62).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import yaml  # noqa: E402
from scipy import stats  # noqa: E402

from securevfl.errors import UserError  # noqa: E402
from securevfl.lab.report import render  # noqa: E402
from securevfl.lab.report.figures import finish_line_plot  # noqa: E402
from securevfl.lab.report.frame import load_frames  # noqa: E402
from securevfl.lab.store import Store  # noqa: E402
from securevfl.lab.sweep import parse_sweep  # noqa: E402

CLAIM_KEYS = {"method", "title", "paper", "sweep", "regime", "headline", "comparisons", "why", "subset", "more_seeds",
              "rows", "reference"}
REQUIRED_KEYS = ("method", "title", "paper", "sweep", "comparisons")
COMPARISON_KEYS = {"baseline", "paper", "subset"}
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


def load_claims(path: str | Path) -> list[dict]:
    """The claims file's entries, each checked for its keys and the types of their values; every
    mistake is one :class:`UserError` line naming the file (read under :mod:`securevfl.limits`: not
    UTF-8, too large, too deep, recursive aliases and duplicate keys are refused there)."""
    from securevfl.limits import brief, load_yaml, read_text_limited

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
    from securevfl.limits import brief

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
    if "why" in c:
        for m in _FIELD.finditer(c["why"]):
            if m.group(2):
                _check_format(m.group(1), m.group(2), f"{where}: why")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_subset(value: object, where: str) -> None:
    from securevfl.limits import brief

    if not isinstance(value, str) or value not in SUBSETS:
        raise UserError(f"{where}: {brief(value)} is not one of the test-row subsets {', '.join(SUBSETS)}")


def _check_format(field: str, spec: str, where: str) -> None:
    """A ``{field:spec}`` of ``why``, tried on a number (the counters are floats)."""
    from securevfl.limits import brief

    shown = brief("{" + field + ":" + spec + "}")
    numbers = [int(d) for d in re.findall(r"\d+", spec)]
    if len(spec) > 40 or any(n > MAX_FORMAT_NUMBER for n in numbers):
        raise UserError(f"{where}: {shown}: a width or precision above {MAX_FORMAT_NUMBER}; e.g. {{{field}:.3f}}")
    try:
        format(1234.5678, spec)
    except (ValueError, TypeError) as e:
        raise UserError(f"{where}: {shown}: not a format for a number ({e}); e.g. {{{field}:.3f}}") from None


# --- store → frame -------------------------------------------------------------------------------

def _flat(prefix: str, value: Any, out: dict[str, float]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(value, bool):
        out[prefix] = float(value)
    elif isinstance(value, int | float):
        out[prefix] = float(value)
    elif prefix.endswith("_q10_50_90") and isinstance(value, list) and len(value) == 3:  # quantile triples
        for name, v in zip(("q10", "q50", "q90"), value, strict=True):
            _flat(f"{prefix.removesuffix('_q10_50_90')}_{name}", v, out)


def counters(method_info: dict, truth: dict | None = None) -> dict[str, float]:
    """The numeric step counters of one run, flattened (``risa.self_training.pseudo_labeled``), plus
    totals of the per-check lists a reader wants in one number (RISA's rows dropped over all checks,
    the last check's τ and uncertainty quantiles)."""
    out: dict[str, float] = {}
    info = {k: v for k, v in method_info.items() if k != "lr_search"}
    _flat("", info, out)
    risa = info.get("risa") if isinstance(info.get("risa"), dict) else None
    if risa and isinstance(risa.get("drops"), list) and risa["drops"]:
        drops = risa["drops"]
        out["risa.dropped_total"] = float(sum(d.get("dropped", 0) for d in drops if isinstance(d, dict)))
        if isinstance(drops[-1], dict):
            _flat("risa.last_check", {k: v for k, v in drops[-1].items() if k != "epoch"}, out)
    hist = info.get("pretrain_history")
    if isinstance(hist, list) and hist and isinstance(hist[0], dict) and isinstance(hist[-1], dict):
        _flat("ssl_loss.first_epoch", hist[0], out)  # FedHSSL: each SSL loss before and after pre-training
        _flat("ssl_loss.last_epoch", hist[-1], out)
    _flat("against_truth", truth or {}, out)
    return out


def method_frame(store_path: str | Path) -> pd.DataFrame:
    """One row per ok run: sweep, method, seed, swept keys, utility overall / on aligned / on
    unaligned test rows, and every counter (``c:`` columns)."""
    runs, _ = load_frames(store_path)
    store = Store.open_existing(store_path)
    try:
        results = {r["run_id"]: r["result_json"] for r in store.rows()}
        members = sweep_members(store.sweeps())
    finally:
        store.close()
    rows = []
    for _, r in runs[runs.status == "ok"].iterrows():
        cell = str(r.run_id).removesuffix(REFERENCE_SUFFIX)
        for sweep, swept in members.get(cell, [(r.sweep, None)]):
            rows.append(_row(r, runs, results, sweep, swept))
    return pd.DataFrame(rows)


def sweep_members(recorded: list[dict]) -> dict[str, list[tuple[str, dict]]]:
    """run id → every recorded sweep whose grid holds that cell, with the cell's swept values there.
    A cell two sweeps share is stored once, under the sweep that ran it first (the store skips done
    cells); it belongs to both, with the swept values of each."""
    out: dict[str, list[tuple[str, dict]]] = {}
    for sw in recorded:
        try:
            parsed = parse_sweep(yaml.safe_load(sw["text"]), sw.get("path") or "sweep")
        except (UserError, yaml.YAMLError, TypeError, ValueError):
            continue  # a sweep this version cannot expand: its rows keep the stored sweep name
        for cell in parsed.cells:
            entry = (parsed.name, {k: v for k, v in cell.swept.items() if k != "search:try"})
            if entry not in out.setdefault(cell.run_id, []):
                out[cell.run_id].append(entry)
    return out


def _row(r: pd.Series, runs: pd.DataFrame, results: dict, sweep: str, swept: dict | None) -> dict:
    """One run as a row of ``sweep``, with that sweep's swept values (None: as stored)."""
    try:
        res = json.loads(results.get(r.run_id) or "{}")
    except json.JSONDecodeError:
        res = {}
    u = res.get("utility") if isinstance(res.get("utility"), dict) else {}
    info = res.get("method_info") if isinstance(res.get("method_info"), dict) else {}
    truth = info.get("against_truth") if isinstance(info.get("against_truth"), dict) else None
    given = ({c: r[c] for c in runs.columns if c.startswith("swept_")} if swept is None
             else {f"swept_{k}": v for k, v in swept.items()})
    return {"sweep": sweep, "method": arm(r.method, r.config), "seed": int(r.seed), "metric": r.metric,
            "utility": r.utility, "utility_aligned": _sub(u.get("aligned")),
            "utility_unaligned": _sub(u.get("unaligned")), "seconds": r.seconds,
            "train_total": _training_rows(res.get("partition")), **given,
            **{f"c:{k}": v for k, v in counters(info, truth).items()}}


def _training_rows(part: Any) -> float:
    """Training entities of a run (every party's, counted once) from its partition summary: a label-only
    host or ``unaligned: all`` party holds them all; else the aligned rows plus each party's own."""
    if not isinstance(part, dict) or not isinstance(part.get("train_rows"), dict):
        return math.nan
    rows = [float(v) for v in part["train_rows"].values() if isinstance(v, int | float)]
    spec = part.get("spec")
    if not rows:
        return math.nan
    if isinstance(spec, dict) and (spec.get("unaligned") == "all" or spec.get("active_features") is False):
        return max(rows)
    given = part.get("aligned")
    aligned = float(given) if isinstance(given, int | float) else 0.0
    return aligned + sum(v - aligned for v in rows)


def arm(method: str, config_json: str | None) -> str:
    """The arm's name: the method, with its parameters when the sweep set any (two ``entity-aug``
    entries with ``draw: aligned`` / ``independent`` are two arms): ``entity-aug{draw=aligned}``."""
    try:
        params = json.loads(config_json or "{}").get("method_params") or {}
    except (json.JSONDecodeError, AttributeError):
        params = {}
    if not isinstance(params, dict) or not params:
        return method
    return method + "{" + ",".join(f"{k}={params[k]}" for k in sorted(params)) + "}"


def _sub(v: Any) -> float | None:
    """A subset's utility: a number, or a dict with the metric's value under ``test``/``auc``."""
    if isinstance(v, int | float) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, dict):
        for key in ("test", "auc", "accuracy"):
            if isinstance(v.get(key), int | float):
                return float(v[key])
    return None


# --- paired differences ----------------------------------------------------------------------------

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


def verdict(p: dict[str, float], paper: float | None = None) -> str:
    """``holds`` (the interval lies above 0), ``does not hold`` (it lies below 0, or below the paper's
    difference: the effect the paper reports is excluded by our seeds), else ``unresolved``."""
    if p["n"] < 2 or math.isnan(p["low"]):
        return "too few seeds"
    if p["low"] > 0:
        return "holds"
    if p["high"] < 0 or (isinstance(paper, int | float) and p["high"] < paper):
        return "does not hold"
    return "unresolved"


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
        for v in values:
            at = sub if v is None else sub[sub[key] == v]
            arm = at[at.method == arm_name].groupby("seed")[col].first()
            base = at[at.method == comp["baseline"]].groupby("seed")[col].first()
            p = paired(arm, base)
            head = is_headline(v)
            paper = comp.get("paper") if head and papers else None
            rows.append({"arm": arm_name, "baseline": comp["baseline"],
                         "rows": comp.get("subset", claim.get("subset", "all")),
                         "regime": v, "headline": head, "paper": paper,
                         "method_mean": float(arm.mean()) if len(arm) else math.nan,
                         "baseline_mean": float(base.mean()) if len(base) else math.nan, **p,
                         "verdict": verdict(p, paper)})
    return pd.DataFrame(rows)


def ours(table: pd.DataFrame, claim: dict) -> pd.DataFrame:
    """The method's own comparisons (not the reference arm's, nor the method against the reference)."""
    return table[(table.arm == claim["method"]) & ~table.baseline.isin(list(references(claim).values()))]


def theirs(table: pd.DataFrame, claim: dict) -> pd.DataFrame:
    """The reference arm's comparisons against the baselines (empty without one)."""
    main = references(claim).get(claim["method"])
    return table[table.arm == main] if main else table.iloc[:0]


def _authors_rows(table: pd.DataFrame, claim: dict) -> pd.DataFrame:
    """The comparisons at the paper's setting that involve the authors' code (and have runs)."""
    return table[table.headline & (table.n > 0) & ~((table.arm == claim["method"]) & ~table.baseline.isin(
        list(references(claim).values())))] if references(claim) else table.iloc[:0]


def claim_verdict(table: pd.DataFrame, claim: dict) -> str:
    """The method's verdict; with the authors' code as an arm, whether theirs agrees, comparison by
    comparison at the paper's setting (their method against their baseline where they have one):
    ``does not hold, with the authors' code too`` when both fail, else both verdicts side by side."""
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
        if len(o) and len(t):
            on = "" if rows == "all" else f" on {rows} test rows"
            each.append((f"vs {comp['baseline'].split('{')[0]}{on}", o.verdict.iloc[0], t.verdict.iloc[0]))
    if mine == other and all(vo == vt for _, vo, vt in each):
        return f"{mine}, with the authors' code too"
    if len(each) < 2:
        return f"{mine} (the authors' code: {other})"
    return mine + "; at the paper's setting " + "; ".join(
        f"{vs}: {vo}" + (", with the authors' code too" if vo == vt else f" (the authors' code: {vt})")
        for vs, vo, vt in each)


def _is_headline(claim: dict, value: Any) -> bool:
    if value is None or "headline" not in claim:
        return True
    return bool(np.isclose(float(value), float(claim["headline"])))


def method_verdict(table: pd.DataFrame, claim: dict) -> str:
    """``holds`` / ``holds in regime …`` / ``holds in part …`` / ``does not hold`` / ``unresolved`` for one
    arm's comparisons (:func:`ours` or :func:`theirs` of a claim with the authors' code)."""
    head = table[table.headline]
    if (head.verdict == "too few seeds").any():
        return "too few seeds to tell"
    if (head.verdict == "holds").all():
        return "holds"
    key = claim.get("regime", "")
    good = [v for v, g in table.groupby("regime") if (g.verdict == "holds").all()] if key else []
    if good:
        return f"holds in regime {key} ∈ {{{', '.join(_fmt(v) for v in good)}}}"
    parts = []
    for (base, rows), g in table.groupby(["baseline", "rows"], sort=False):
        where = [_fmt(v) for v in g[g.verdict == "holds"].regime]
        if where:
            on = "" if rows == "all" else f" on {rows} test rows"
            parts.append(f"vs {base}{on} at {key} ∈ {{{', '.join(where)}}}" if key else f"vs {base}{on}")
    if parts:
        return "holds in part: " + "; ".join(parts)
    if (head.verdict == "does not hold").any():
        return "does not hold"
    return "unresolved (within seed noise)"


def _fmt(v: Any) -> str:
    return f"{v:g}" if isinstance(v, int | float | np.integer | np.floating) else str(v)


# --- text, figure, report --------------------------------------------------------------------------

def _vs(r: pd.Series) -> str:
    return r.baseline + ("" if r.rows == "all" else f" ({r.rows} rows)")


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


_FIELD = re.compile(r"\{([\w.\-@]+)(?::([^}]*))?\}")


def fill(template: str, values: dict[str, float]) -> str:
    """``why`` with each ``{counter}`` or ``{counter:fmt}`` replaced by its measured mean; a counter the
    runs lack reads ``{name: not measured}``."""
    def one(m: re.Match) -> str:
        name, fmt = m.group(1), m.group(2) or ".3g"
        return format(values[name], fmt) if name in values else f"{{{name}: not measured}}"

    return _FIELD.sub(one, template)


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


def regime_figure(claim: dict, table: pd.DataFrame, path: Path, axis: str | None = None) -> Path:
    """Paired difference (arm − baseline) against the regime key (or ``axis``: the rows axis), 95 %
    intervals, the paper's value marked at its setting."""
    table = table[table.n > 0]  # a comparison without runs (an arm not run at that value) is no point
    many = table.assign(vs=[_label(r, claim, short=True) for _, r in table.iterrows()]).vs.nunique() > 3
    fig, ax = plt.subplots(figsize=(7, 5.2 if many else 4), dpi=110)
    numeric = bool(axis or claim.get("regime")) and table.regime.notna().all()
    vals = table.regime.astype(float) if numeric else pd.Series([0.0])
    log = numeric and vals.min() > 0 and vals.max() / vals.min() > 8
    table = table.assign(vs=[_label(r, claim, short=True) for _, r in table.iterrows()])
    n_base = table.vs.nunique()
    for i, (base, g) in enumerate(table.groupby("vs", sort=False)):
        g = g.sort_values("regime")
        x = g.regime.astype(float).to_numpy() if numeric else np.arange(len(g), dtype=float)
        off = (i - (n_base - 1) / 2) * 0.04  # side by side, so the intervals do not hide each other
        span = (x.max() - x.min()) if len(x) > 1 else 1.0
        xs = x * (1 + off) if log else x + off * span
        bars = ax.errorbar(xs, g["mean"], yerr=[g["mean"] - g["low"], g["high"] - g["mean"]], marker="o",
                           capsize=3, label=base)
        head = np.flatnonzero(g.headline.to_numpy())
        paper = g.paper.iloc[head[0]] if len(head) else None
        if isinstance(paper, int | float) and _is_number(paper):
            ax.scatter([xs[head[0]]], [float(paper)], marker="*", s=140, zorder=5,
                       color=bars.lines[0].get_color(), label=f"the paper: {base}")
    ax.axhline(0, color="black", lw=0.8)
    if numeric:
        if log:
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xticks(sorted(vals.unique()))
        ax.set_xlabel(axis or claim["regime"] + " (the paper's setting: " + _fmt(claim.get("headline", "–")) + ")")
    ax.set_ylabel(("arm" if references(claim) else claim["method"]) + " − baseline\n(paired by seed, 95 % CI)")
    ax.set_title(claim["title"] + (f" — {claim.get('regime')} {_fmt(claim.get('headline', '–'))}" if axis else ""))
    if not many:
        return finish_line_plot(fig, ax, path)
    ax.grid(alpha=0.3)  # many series: the legend goes under the axes, where it hides no point
    ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.16))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _signed(v: float | None) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:+.3f}"


def _shown(table: pd.DataFrame) -> pd.DataFrame:
    t = table.copy()
    return pd.DataFrame({
        "arm": t.arm, "vs": t.baseline, "test rows": t.rows,
        "regime": [_fmt(v) if v is not None else "–" for v in t.regime],
        "paper's setting": ["yes" if h else "" for h in t.headline],
        "utility (arm)": [f"{v:.3f}" for v in t.method_mean], "utility (vs)": [f"{v:.3f}" for v in t.baseline_mean],
        "paired diff": [_signed(v) for v in t["mean"]],
        "95 % CI": [f"[{lo:+.3f}, {hi:+.3f}]" if math.isfinite(lo) else "–" for lo, hi in zip(t.low, t.high,
                                                                                               strict=True)],
        "seeds won": [f"{w}/{n}" for w, n in zip(t.wins, t.n, strict=True)],
        "detectable": [f"{v:.3f}" if math.isfinite(v) else "–" for v in t.detectable],
        "paper's diff": [_signed(v) if isinstance(v, int | float) else "–" for v in t.paper], "verdict": t.verdict})


def write_methods_report(store_path: str | Path, out_dir: str | Path, claims_path: str | Path,
                         command: str | None = None) -> list[Path]:
    """``report.md`` + ``report.html`` + one regime figure per claim."""
    claims = load_claims(claims_path)
    frame = method_frame(store_path)
    if frame.empty:
        raise UserError(f"store {store_path} has no finished runs")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    answers, sections, figures = [], [], []
    for claim in claims:
        table = comparison_table(frame, claim)
        if table.empty or table.n.max() == 0:
            answers.append({"claim": claim["title"], "verdict": "not measured",
                            "ours (paired, 95 % CI)": f"no runs of sweep {claim['sweep']}", "the authors' code": "–",
                            "our seeds detect (80 % power)": "–", "paper": "–",
                            "paper's setting": _fmt(claim.get("headline", "–"))})
            continue
        v = claim_verdict(table, claim)
        head = ours(table, claim)
        head = head[head.headline]
        ref = _authors_rows(table, claim)
        answers.append({  # the verdict first: a wide table scrolls, and the first screen must show it
            "claim": claim["title"], "verdict": v,
            "ours (paired, 95 % CI)": "; ".join(f"{_diff(r)} vs {_vs(r)}" for _, r in head.iterrows())
                                      + f" ({int(head.n.min())} seeds)",
            "the authors' code": ("; ".join(f"{_diff(r)} {_label(r, claim, short=True)}" for _, r in ref.iterrows())
                                  + f" ({int(ref.n.min())} seeds)") if len(ref) and ref.n.max() > 0 else
                                 "not run" if claim.get("reference") else "none released",
            "our seeds detect (80 % power)": "; ".join(f"{r.detectable:.3f} vs {_vs(r)}" for _, r in head.iterrows()),
            "paper": "; ".join(f"{r.paper:+.3f} vs {_vs(r)}" for _, r in head.iterrows()
                               if isinstance(r.paper, int | float)) or "–",
            "paper's setting": f"{claim['regime']} {_fmt(claim['headline'])}" if claim.get("regime") else "–"})
        fig = regime_figure(claim, table, render._figure_path(out, "methods", claim["sweep"]))
        figures.append(fig)
        by_rows = rows_table(frame, claim)
        rows_blocks: list[tuple[str, Any]] = []
        if not by_rows.empty:
            rows_fig = regime_figure(claim, by_rows, render._figure_path(out, "methods-rows", claim["sweep"]),
                                     axis="training rows (the largest: all of the sample's)")
            figures.append(rows_fig)
            rows_blocks = [("h3", "The rows axis: the paired differences at the paper's setting on fewer training "
                                  "rows (the first N of each seed's shuffle; the same test rows)"),
                           ("p", rows_sentence(by_rows, claim)), ("img", rows_fig),
                           ("table", _shown(by_rows).rename(columns={"regime": "training rows"})
                            .drop(columns=["paper's setting", "paper's diff"]))]
        extra = claim_runs(frame, claim)  # every arm of the sweep, the claim's and any other
        key = f"swept_{claim['regime']}" if claim.get("regime") else None
        means = (extra.groupby(["method", key] if key and key in extra else ["method"]).utility
                 .agg(["mean", "std", "count"]).reset_index())
        means["utility"] = [f"{m:.3f} ± {s:.3f} ({int(c)})" for m, s, c in zip(means["mean"], means["std"],
                                                                                 means["count"], strict=True)]
        means = means.drop(columns=["mean", "std", "count"]).rename(columns={key: claim.get("regime")} if key else {})
        sections.append((claim["title"], [
            ("p", f"Paper: {claim['paper']}. Sweep `{claim['sweep']}`"
                  + (f" (and `{claim['more_seeds']}`: more seeds at the paper's setting)" if claim.get("more_seeds")
                     else "") + f"; the regime map varies `{claim.get('regime', '–')}` (the paper's setting: "
                  f"{_fmt(claim.get('headline', '–'))})" + (f"; the rows axis: `{claim['rows']}`"
                                                            if claim.get("rows") else "") + "."),
            ("p", sentence(claim, table, frame, v)), ("img", fig),
            ("h3", "Paired differences (method − baseline; a seed's runs share partition, initialisation and batches)"),
            ("table", _shown(table)), *rows_blocks,
            ("h3", "Test utility per arm (mean ± sd over seeds, seeds in brackets)"), ("table", means),
            ("h3", "What each step did: the method's counters (mean ± sd over seeds)"),
            ("table", counter_table(frame, claim))]))
    runs, _ = load_frames(store_path)
    intro = ("Each paper's headline comparison re-run with the current code on real rows. A comparison **holds** "
             "when the 95 % interval of the seed-paired difference lies above zero, **does not hold** when it lies "
             "below zero or below the paper's difference (our seeds exclude the effect the paper reports), and is "
             "**unresolved** otherwise. Every arm chooses its learning rate from the sweep's grid on the same "
             "validation rows (a stratified 20 % of the rows with a true label; each stage of a multi-stage method "
             "its own; `train.lr_grid`). *Detectable*: the smallest true difference our seeds find with 80 % power. "
             "Where the authors released code, their code is one more arm on the same rows and seeds "
             "(benchmarks/reference/).")
    all_sections = [("The answer", [("table", pd.DataFrame(answers)),
                                    ("p", "Each claim's section below gives the measured reason, the regime map and "
                                          "the step counters.")]), *sections,
                    ("Provenance", render._provenance_blocks(runs, store_path, command))]
    md = render._render_md(intro, all_sections, out).replace("# securevfl report", "# securevfl methods report", 1)
    render._write_new(out / "report.md", md)
    html = render._render_html(intro, all_sections).replace("securevfl report<", "securevfl methods report<")
    render._write_new(out / "report.html", html)
    return [out / "report.md", out / "report.html", *figures]
