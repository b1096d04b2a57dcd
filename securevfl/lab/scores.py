"""Defense scores: VFLAIR's DCS / T-DCS / C-DCS, a control-normalised variant, the worst-case
attacker over a parameter search, and the honesty marks of a cell (at chance, worse than the
active party alone). Pure functions over numbers and the report's tidy frames; the store is read
by :mod:`securevfl.lab.report.frame` only.

VFLAIR (``src/metrics/data_process.py``, ``Metrics & Benchmark.md``):

- DCS = 1 / (1 + sqrt((1 − β)·d_AP² + β·d_MP²)), β = 0.5, with the one-sided distances
  d_AP = max(AP − AP*, 0) and d_MP = max(MP* − MP, 0); AP* = 0 (an ideal defense leaks nothing),
  MP* = the main-task utility of the undefended, unattacked run. AP < 0 is read as 0.
- T-DCS of an attack type = the mean of the DCS of its attacks; C-DCS = the weighted mean of the
  T-DCS of the types that were tested (equal weights by default).

Two readings of ours, both stated in the docs: the attack value of an attack is its worst case
over a bounded parameter search (the try with the largest mean AP over seeds), and within a type
the worst attack counts (``within_type="worst"``: min DCS), as SPEC §10 asks; ``"mean"`` is
VFLAIR's average over the type's attacks.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import cast

import numpy as np
import pandas as pd

from securevfl.configuration.spec import check_nonnegative, check_params, parse_args
from securevfl.errors import UserError

BETA = 0.5
"""VFLAIR's weight of the utility distance against the attack distance."""

ATTACK_TYPES = ("label_inference", "feature_reconstruction", "backdoor", "untargeted")
"""VFLAIR's four attack types (T-DCS_LI, T-DCS_FR, T-DCS_TB, T-DCS_NTB)."""

TYPE_SHORT = {"label_inference": "LI", "feature_reconstruction": "FR", "backdoor": "TB", "untargeted": "NTB"}

# attack name → type, for stores whose results carry no ``kind`` and attacks not registered here
_BY_NAME = {"mc": "label_inference", "mc-full": "label_inference", "mc-plain": "label_inference",
            "mc-active": "label_inference", "norm": "label_inference", "direction": "label_inference",
            "fr": "feature_reconstruction", "fr-grn": "feature_reconstruction"}
# the stored metric name → type, the last resort (``accuracy`` is ambiguous: fr scores categorical fields by it)
_BY_METRIC = {"auc": "label_inference", "asr": "backdoor", "attack_success_rate": "backdoor",
              "utility_drop": "untargeted", "mse": "feature_reconstruction", "r2": "feature_reconstruction"}
_KIND_ALIASES = {"targeted_backdoor": "backdoor", "untargeted_backdoor": "untargeted"}


def attack_type(name: str, metric: str | None, kind: str | None = None) -> str | None:
    """An attack's VFLAIR type: its declared ``kind`` if any, else by name, else by stored metric."""
    if isinstance(kind, str) and kind:  # a frame's missing kind is NaN, which is truthy
        return _KIND_ALIASES.get(kind, kind)
    if name in _BY_NAME:
        return _BY_NAME[name]
    return _BY_METRIC.get((metric or "").lower())


def _finite(x: object) -> bool:
    return x is not None and isinstance(x, int | float) and math.isfinite(float(x))


def attack_performance(metric: str | None, value: float | None) -> float:
    """AP: an attack's stored value in "higher leaks more" form, ≥ 0 (VFLAIR clips AP at 0).

    - ``auc``: max(AUC, 1 − AUC) — a flipped score is as informative (VFLAIR: max(acc, 1 − acc) for
      norm scoring);
    - ``mse``: 1 − MSE (VFLAIR's feature-reconstruction AP);
    - ``r2``: R² = 1 − MSE / Var, the MSE on a per-feature variance scale (our fr attacks report it);
    - accuracy, attack success rate, utility drop: the value itself.
    NaN when there is no value."""
    if not _finite(value):
        return float("nan")
    v = float(value)  # type: ignore[arg-type]
    m = (metric or "").lower()
    if m == "auc":
        v = max(v, 1.0 - v)
    elif m == "mse":
        v = 1.0 - v
    return max(v, 0.0)


def inverted(metric: str | None, value: float | None) -> bool:
    """A binary score below chance: read as 1 − AUC (flagged in the report, never negative leakage)."""
    return (metric or "").lower() == "auc" and _finite(value) and float(value) < 0.5  # type: ignore[arg-type]


def normalised_performance(metric: str | None, value: float | None, refs: Iterable[float | None]) -> float:
    """AP over its control: AP(value) − max AP(ref), at least 0, so an attack that never beat its
    control (or the adversary's local baseline) counts as no leak. NaN without a reference."""
    ref = [attack_performance(metric, r) for r in refs if _finite(r)]
    ap = attack_performance(metric, value)
    if not ref or math.isnan(ap):
        return float("nan")
    return max(ap - max(ref), 0.0)


def dcs(ap: float, mp: float, mp_star: float, ap_star: float = 0.0, beta: float = BETA) -> float:
    """VFLAIR's Defense Capability Score of one (defense, attack): 1 / (1 + distance to the ideal
    (AP*, MP*)), with one-sided distances: leaking less than AP* or beating MP* is not penalised."""
    d_ap = max(ap - ap_star, 0.0)
    d_mp = max(mp_star - mp, 0.0)
    return 1.0 / (1.0 + math.sqrt((1.0 - beta) * d_ap ** 2 + beta * d_mp ** 2))


def t_dcs(scores: Iterable[float], within_type: str = "worst") -> float:
    """T-DCS of one attack type from its attacks' DCS: the worst (min) or VFLAIR's mean; NaN if none."""
    s = [x for x in scores if not math.isnan(x)]
    if not s:
        return float("nan")
    return min(s) if within_type == "worst" else sum(s) / len(s)


def parse_weights(text: str) -> dict[str, float]:
    """``LI=2,FR=1`` (short or long type names, ``securevfl report --weights``) as C-DCS weights by
    type; types left out weigh 0. Raises UserError naming a bad entry (the shared parameter checks)."""
    owner = "--weights"
    short_of = {**{s.lower(): s for s in TYPE_SHORT.values()}, **{k: s for k, s in TYPE_SHORT.items()}}
    given = {short_of.get(k.lower(), k): v for k, v in parse_args(owner, text, text).items()}
    typed = cast(dict[str, float], check_params(owner, {s: 0.0 for s in TYPE_SHORT.values()}, given))
    check_nonnegative(owner, typed)
    if sum(typed.values()) <= 0:
        raise UserError(f"{owner}: give at least one type a weight above 0, e.g. LI=2,FR=1")
    long_of = {s: k for k, s in TYPE_SHORT.items()}
    return {long_of[s]: w for s, w in typed.items()}


def c_dcs(t: Mapping[str, float], weights: Mapping[str, float] | None = None) -> float:
    """C-DCS: the weighted mean of the T-DCS of the types tested (weights renormalised over them,
    as VFLAIR leaves untested types out); NaN if no type was tested."""
    tested = {k: v for k, v in t.items() if not math.isnan(v)}
    w = {k: (1.0 if weights is None else float(weights.get(k, 0.0))) for k in tested}
    total = sum(w.values())
    if not tested or total <= 0:
        return float("nan")
    return sum(w[k] * tested[k] for k in tested) / total


# ------------------------------------------------------------------------------------ over frames
CELL = ["dataset", "method", "defense", "family", "strength", "he", "swept"]
"""The columns naming a cell (one point of the grid; seeds and search tries vary inside it)."""


def with_performance(attacks: pd.DataFrame) -> pd.DataFrame:
    """The attacks frame with ``type``, ``ap`` (AP) and ``ap_norm`` (AP over its control) per row."""
    if attacks.empty:
        return attacks.assign(type=[], ap=[], ap_norm=[])
    kinds = attacks["kind"] if "kind" in attacks else pd.Series([None] * len(attacks), index=attacks.index)
    return attacks.assign(
        type=[attack_type(n, m, k) for n, m, k in zip(attacks.attack, attacks.attack_metric, kinds, strict=True)],
        ap=[attack_performance(m, v) for m, v in zip(attacks.attack_metric, attacks.value, strict=True)],
        ap_norm=[normalised_performance(m, v, (c, b)) for m, v, c, b in
                 zip(attacks.attack_metric, attacks.value, attacks.control, attacks.baseline, strict=True)])


def worst_case(attacks: pd.DataFrame, by: str = "ap") -> pd.DataFrame:
    """Per (cell, attack), the searched parameter point whose mean ``by`` over seeds is largest: one
    row each with its ``params``, the first ``try`` that ran it, the mean ``ap``/``ap_norm``/``utility``
    over its runs, and how many distinct points were tried. The attacker picks parameters, not a
    seed; tries that repeat an attack's parameters (the search varied another attack) are pooled, so
    the max is never taken over noise alone."""
    a = with_performance(attacks) if "ap" not in attacks else attacks
    if a.empty:
        return pd.DataFrame(columns=[*CELL, "attack", "type", "try", "params", "ap", "ap_norm", "utility", "tries"])
    a = a.assign(search_try=a["search_try"] if "search_try" in a else 0,
                 point=a["set_params"] if "set_params" in a else a["params"])
    per_point = a.groupby([*CELL, "attack", "point"], dropna=False).agg(
        type=("type", "first"), search_try=("search_try", "min"), ap=("ap", "mean"), ap_norm=("ap_norm", "mean"),
        utility=("utility", "mean"), seeds=("seed", "nunique")).reset_index()
    rows = []
    for _, g in per_point.groupby([*CELL, "attack"], dropna=False):
        score = g[by].astype(float).fillna(-np.inf)
        best = g.loc[score.idxmax()]
        rows.append({**{k: best[k] for k in [*CELL, "attack", "type", "ap", "ap_norm", "utility", "seeds"]},
                     "params": best.point, "try": int(best.search_try), "tries": len(g)})
    return pd.DataFrame(rows)


def reference_utility(summary: pd.DataFrame) -> pd.Series:
    """MP* per cell: the utility of the same method's undefended cell (same dataset, swept values and
    HE mode; without HE where that cell is missing)."""
    out = []
    for _, r in summary.iterrows():
        same = summary[(summary.dataset == r.dataset) & (summary.method == r.method) & (summary.swept == r.swept)
                       & (summary.defense == "none")]
        ref = same[same.he == r.he] if (same.he == r.he).any() else same[same.he == "off"]
        out.append(float(ref.utility.iloc[0]) if len(ref) else float("nan"))
    return pd.Series(out, index=summary.index, dtype=float)


def score_table(summary: pd.DataFrame, attacks: pd.DataFrame, weights: Mapping[str, float] | None = None,
                within_type: str = "worst") -> pd.DataFrame:
    """One row per attacked cell: DCS of each attack (worst case over its search), T-DCS per type,
    C-DCS, and the same three from the control-normalised AP (``n`` prefix); the winning try and
    parameters per attack (``<attack> won``). MP* is the undefended cell's utility; MP the utility
    of the runs of the winning try (a backdoor trains its own federation)."""
    if attacks.empty or summary.empty:
        return pd.DataFrame()
    mp_star = reference_utility(summary)
    ref = summary.assign(mp_star=mp_star)[[*CELL, "mp_star"]]
    raw, norm = worst_case(attacks, "ap"), worst_case(attacks, "ap_norm")
    rows = []
    for key, g in raw.groupby(CELL, dropna=False):
        star = ref.merge(pd.DataFrame([dict(zip(CELL, key, strict=True))]), on=CELL)
        if star.empty:
            continue
        ms = float(star.mp_star.iloc[0])
        gn = norm.merge(pd.DataFrame([dict(zip(CELL, key, strict=True))]), on=CELL)
        row: dict = dict(zip(CELL, key, strict=True))
        row["MP*"] = ms
        by_type: dict[str, list[float]] = {}
        by_type_n: dict[str, list[float]] = {}
        for _, w in g.iterrows():
            row[f"DCS {w.attack}"] = d = dcs(w.ap, w.utility, ms)
            row[f"AP {w.attack}"] = w.ap
            row[f"{w.attack} won"] = _won(w)
            short = TYPE_SHORT.get(w.type, w.type or "other")
            if d < row.get(f"_worst {short}", (math.inf, ""))[0]:  # the attack that sets the type's worst case
                row[f"_worst {short}"] = (d, w.attack)
            by_type.setdefault(w.type or "other", []).append(d)
        for _, w in gn.iterrows():
            dn = float("nan") if math.isnan(w.ap_norm) else dcs(w.ap_norm, w.utility, ms)
            row[f"nDCS {w.attack}"] = dn
            by_type_n.setdefault(w.type or "other", []).append(dn)
        for k in [k for k in row if k.startswith("_worst ")]:
            row[f"worst {k[len('_worst '):]} attack"] = row.pop(k)[1]
        t = {k: t_dcs(v, within_type) for k, v in by_type.items()}
        tn = {k: t_dcs(v, within_type) for k, v in by_type_n.items()}
        for k in t:
            row[f"T-DCS {TYPE_SHORT.get(k, k)}"] = t[k]
        row["C-DCS"] = c_dcs(t, weights)
        row["normalised C-DCS"] = c_dcs(tn, weights)
        rows.append(row)
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    marked = _marked(out, summary)
    out["marked"] = marked.map({True: "not eligible", False: ""})
    for col, rank in (("C-DCS", "rank C-DCS"), ("normalised C-DCS", "rank normalised")):
        # a cell worse than not federating, or at chance, ranks below every cell that is not (its
        # "privacy" is a model no one should deploy), whatever its score
        key = out[col].where(~marked, out[col] - 1e6)
        out[rank] = key.groupby(out["dataset"]).rank(ascending=False, method="min")
    return out


def _marked(table: pd.DataFrame, summary: pd.DataFrame) -> pd.Series:
    """Per row of ``table``: the cell is at chance or worse than ``local`` (False where unmarked)."""
    if "chance" not in summary or "beats_local" not in summary:
        return pd.Series(False, index=table.index)
    marks = summary[[*CELL, "chance", "beats_local"]].drop_duplicates(subset=CELL)
    m = table[CELL].merge(marks, on=CELL, how="left")
    bad = m.chance.fillna(False).astype(bool) | (m.beats_local == False)  # noqa: E712 - None: no local ran
    return pd.Series(bad.to_numpy(dtype=bool), index=table.index)


def _won(w: pd.Series) -> str:
    """The winning try in words: its index among the tries and the parameters it set."""
    params = json.loads(w.params) if isinstance(w.params, str) and w.params else {}
    text = ", ".join(f"{k}={v}" for k, v in sorted(params.items())) or "defaults"
    return f"try {w['try']}/{w.tries}: {text}" if w.tries > 1 else text


def disagreements(scores: pd.DataFrame) -> list[str]:
    """Where the raw and control-normalised rankings of one dataset's cells differ, in words."""
    out = []
    for ds, g in scores.groupby("dataset"):
        g = g.dropna(subset=["C-DCS", "normalised C-DCS"])
        if len(g) < 2:
            continue
        moved = g[g["rank C-DCS"] != g["rank normalised"]]
        if moved.empty:
            continue
        top_raw = g.loc[g["C-DCS"].idxmax()]
        top_n = g.loc[g["normalised C-DCS"].idxmax()]
        names = ", ".join(f"{cell_name(r)} ({int(r['rank C-DCS'])} → {int(r['rank normalised'])})"
                          for _, r in moved.head(6).iterrows())
        lead = (f"the raw C-DCS ranks {cell_name(top_raw)} first, the normalised one {cell_name(top_n)}; "
                if cell_name(top_raw) != cell_name(top_n) else "")
        out.append(f"**{ds}: the raw and control-normalised rankings disagree**: {lead}{len(moved)} cells "
                   f"change rank (raw → normalised): {names}{' …' if len(moved) > 6 else ''}. The normalised "
                   "score does not credit a defense for an attack that never beat its control.")
    return out


def cell_name(r: pd.Series) -> str:
    he = "" if r.get("he", "off") == "off" else f", HE {r['he']}"
    defense = "none" if r.defense == "none" else str(r.defense).replace(":", " ")
    sw = ", ".join(f"{k} {v}" for k, v in json.loads(r.swept).items()) if isinstance(r.get("swept"), str) else ""
    return f"{r.method} / {defense}{he}{' (' + sw + ')' if sw else ''}"


# ---------------------------------------------------------------------------------- honesty marks
def chance_noise(prior: float, n_test: float, metric: str) -> float:
    """The standard error of a chance-level test score on ``n_test`` rows: binomial for accuracy at
    the majority-class rate; for AUC, Hanley–McNeil at AUC 0.5 with balanced classes (≈ 1/√(3n))."""
    if not _finite(n_test) or n_test <= 0:
        return 0.0
    if metric == "auc":
        return math.sqrt((n_test + 1) / (3 * n_test ** 2))
    return math.sqrt(max(prior * (1 - prior), 0.0) / n_test)


def at_chance(utility: float, utility_std: float, prior: float, n_test: float, metric: str) -> bool:
    """True when the cell's utility is within noise of guessing: at most 2 × max(seed std, the
    chance score's standard error) above the prior (majority-class rate; AUC 0.5)."""
    if not (_finite(utility) and _finite(prior)):
        return False
    std = utility_std if _finite(utility_std) else 0.0
    return utility - prior <= 2 * max(std, chance_noise(prior, n_test, metric))


def mark_cells(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary with ``chance`` (utility within noise of the prior) and ``local_utility`` /
    ``beats_local`` (utility above the active party alone on the same data; None without a
    ``local`` run). Needs ``utility_prior`` and ``test_rows`` columns (NaN where unknown)."""
    if summary.empty:
        return summary.assign(chance=[], local_utility=[], beats_local=[])
    chance, local, beats = [], [], []
    for _, r in summary.iterrows():
        chance.append(at_chance(r.utility, r.utility_std, r.get("utility_prior", np.nan), r.get("test_rows", np.nan),
                                r.metric))
        data_axes = json.dumps({k: v for k, v in json.loads(r.swept).items() if ":" not in k}, sort_keys=True)
        ref = summary[(summary.dataset == r.dataset) & (summary.method == "local") & (summary.swept == data_axes)]
        lu = float(ref.utility.mean()) if len(ref) else float("nan")
        local.append(lu)
        beats.append(None if r.method == "local" or math.isnan(lu) else bool(r.utility > lu))
    return summary.assign(chance=chance, local_utility=local, beats_local=pd.Series(beats, index=summary.index,
                                                                                   dtype=object))


def eligible(summary: pd.DataFrame) -> pd.DataFrame:
    """The cells a "best trade-off" may pick: not at chance, and above ``local`` where it ran."""
    if summary.empty or "chance" not in summary:
        return summary
    return summary[~summary.chance.astype(bool) & (summary.beats_local.isna() | (summary.beats_local == True))]  # noqa: E712
