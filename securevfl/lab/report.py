"""Reports: store → tidy DataFrames → figures and tables → ``report.md`` + ``report.html``.

The first screen answers "which method leaks least, at what utility cost": the setup that was
measured, then a few computed sentences (led by a caution when the cells are within seed noise;
which defense settings move the attack beyond noise; best utility, least leakage) above the
privacy–utility trade-off plot. Leakage is what the federation adds: the attack value
minus the larger of its control (the same attack on the same architecture, untrained) and the
local-SSL baseline; the plot shows the raw values with prior, control and baseline beside the
leakage, one line per method across defense strengths, error bars over seeds, Pareto front ringed.
"""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from securevfl.errors import UserError  # noqa: E402
from securevfl.federation import DEFAULT_LR  # noqa: E402
from securevfl.lab.store import Store  # noqa: E402

UTILITY_BUDGET = 0.02
"""Utility loss a user would trade for privacy in the headline ("least leakage within 0.02")."""

_GROUP = ["dataset", "method", "defense", "family", "strength", "he", "swept"]
_ATTACK_STATS = ("value", "value_std", "prior", "baseline", "control", "control_std", "leakage", "leakage_std",
                 "attack_seeds")


# ------------------------------------------------------------------------------------ tidy data
def load_frames(store_path: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``runs``: one row per stored run; ``attacks``: one row per (run, attack)."""
    store = Store.open_existing(store_path)
    rows = store.rows()
    store.close()
    if not rows:
        raise UserError(f"store {store_path} has no runs")
    runs, attacks = [], []
    for r in rows:
        res = json.loads(r["result_json"]) if r["result_json"] else {}
        swept = json.loads(r["swept_json"] or "{}")
        cost = res.get("cost", {})
        he = cost.get("he") or {}
        base = {"run_id": r["run_id"], "sweep": r["sweep"], "dataset": r["dataset"], "method": r["method"],
                "defense": r["defense"], "family": r["defense_family"] or "none",
                "strength": r["strength"] if r["strength"] is not None else (0.0 if r["defense"] == "none"
                                                                             else np.nan),
                "seed": r["seed"], "he": r["he"] or "off", "swept": json.dumps(swept, sort_keys=True),
                **{f"swept_{k}": v for k, v in swept.items()}}
        runs.append({**base, "status": r["status"], "error": r["error"], "utility": r["utility"],
                     "metric": r["utility_metric"], "epsilon": r["epsilon"], "seconds": r["seconds"],
                     "bytes_sent": r["bytes_sent"], "he_seconds": he.get("seconds"),
                     "train_steps": cost.get("train_steps"),
                     "he_bytes": he.get("bytes"),
                     "he_params": json.dumps(he["params"], sort_keys=True) if he.get("params") else None,
                     "delta": (res.get("privacy") or {}).get("delta"),
                     "privacy_status": (res.get("privacy") or {}).get("status"),
                     "feature_epsilon": feature_epsilon(res),
                     "noise_multiplier": (res.get("privacy") or {}).get("noise_multiplier"),
                     "config": r["config_json"], "partition": json.dumps(res.get("partition") or {})})
        for name, a in (res.get("attacks") or {}).items():
            refs = [x for x in (a.get("control"), a.get("baseline")) if x is not None]
            leakage = a.get("leakage", a["value"] - max(refs) if refs and a.get("value") is not None else None)
            attacks.append({**base, "attack": name, "attack_metric": a.get("metric"), "value": a.get("value"),
                            "prior": a.get("prior"), "baseline": a.get("baseline"), "control": a.get("control"),
                            "leakage": leakage, "utility": r["utility"], "n_aux": a.get("n_aux"),
                            "finetunes": a.get("finetunes"), "params": json.dumps(a.get("params") or {}),
                            "control_kind": a.get("control_kind"),
                            "baseline_ssl": json.dumps(a.get("baseline_ssl") or {}),
                            "examples": json.dumps(a["examples"]) if a.get("examples") else None})
    return pd.DataFrame(runs), pd.DataFrame(attacks)


def feature_epsilon(result: dict) -> float | None:
    """The largest feature-level ε of any passive party in a run result (None without one)."""
    features = (result.get("privacy") or {}).get("features") or {}
    eps = [f["epsilon"] for f in features.values() if f.get("epsilon") is not None]
    return max(eps) if eps else None


def setting_label(defense: str) -> str:
    return "none" if defense == "none" else defense.replace(":", " ")


def summarise(runs: pd.DataFrame, attacks: pd.DataFrame) -> pd.DataFrame:
    """Mean ± std over seeds per cell (ok runs), with each attack's mean/std/prior/baseline."""
    ok = runs[runs.status == "ok"]
    if ok.empty:
        return pd.DataFrame()
    steps = pd.to_numeric(ok.get("train_steps"), errors="coerce").where(lambda x: x > 0)
    ok = ok.assign(step_s=ok.seconds / steps, mb_step=ok.bytes_sent / steps / 1e6)
    g = ok.groupby(_GROUP, dropna=False)
    out = g.agg(utility=("utility", "mean"), utility_std=("utility", "std"), seeds=("seed", "nunique"),
                metric=("metric", "first"), epsilon=("epsilon", "mean"),
                feature_epsilon=("feature_epsilon", "mean"), seconds=("seconds", "mean"),
                bytes_sent=("bytes_sent", "mean"), step_s=("step_s", "mean"), mb_step=("mb_step", "mean")).reset_index()
    if not attacks.empty:
        okat = attacks[attacks.run_id.isin(ok.run_id)]
        okat = okat.astype({c: float for c in ("value", "prior", "baseline", "control", "leakage")})
        ag = okat.groupby(_GROUP + ["attack"], dropna=False).agg(
            value=("value", "mean"), value_std=("value", "std"), prior=("prior", "mean"),
            baseline=("baseline", "mean"), control=("control", "mean"), control_std=("control", "std"),
            leakage=("leakage", "mean"), leakage_std=("leakage", "std"), attack_seeds=("seed", "nunique"),
            attack_metric=("attack_metric", "first")).reset_index()
        wide = ag.pivot_table(index=_GROUP, columns="attack", values=list(_ATTACK_STATS), dropna=False)
        wide.columns = [f"{a}_{s}" for s, a in wide.columns]
        out = out.merge(wide.reset_index(), on=_GROUP, how="left")
    return out.fillna({"utility_std": 0.0})


def pareto_front(points: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats: utility ≥ and attack ≤, one strictly."""
    keep = []
    for i, (u, a) in enumerate(points):
        dominated = np.any((points[:, 0] >= u) & (points[:, 1] <= a) & ((points[:, 0] > u) | (points[:, 1] < a)))
        if not dominated:
            keep.append(i)
    return np.asarray(keep, dtype=int)


def control_kinds(attacks: pd.DataFrame) -> dict[str, str]:
    """What each attack's control is, in words (from the stored results)."""
    if attacks.empty or "control_kind" not in attacks:
        return {}
    return {a: g.control_kind.dropna().iloc[0] for a, g in attacks.groupby("attack") if g.control_kind.notna().any()}


def attack_names(summary: pd.DataFrame) -> list[str]:
    return sorted({c[: -len("_value")] for c in summary.columns if c.endswith("_value")})


# ------------------------------------------------------------------------------------- headline
def _num(x: object) -> float:
    return float("nan") if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def defense_effects(d: pd.DataFrame, attack: str) -> pd.DataFrame:
    """Each defended cell against the same method's undefended cell (same HE and swept values):
    the change of the attack value and of utility, and whether the attack moved by more than twice
    the larger of the two cells' seed std (``clear``; never with a single seed)."""
    rows = []
    for _, r in d[d.family != "none"].iterrows():
        ref = d[(d.method == r.method) & (d.he == r.he) & (d.swept == r.swept) & (d.defense == "none")]
        if ref.empty or pd.isna(r[f"{attack}_value"]):
            continue
        ref = ref.iloc[0]
        noise = max(_num(r[f"{attack}_value_std"]), _num(ref[f"{attack}_value_std"]))
        delta = r[f"{attack}_value"] - ref[f"{attack}_value"]
        rows.append({"method": r.method, "defense": r.defense, "he": r.he, "delta": delta, "noise": noise,
                     "utility_cost": ref.utility - r.utility, "clear": bool(noise > 0 and abs(delta) > 2 * noise)})
    return pd.DataFrame(rows, columns=["method", "defense", "he", "delta", "noise", "utility_cost", "clear"])


def headline(summary: pd.DataFrame, dataset: str, attack: str, control_kind: str = "") -> list[str]:
    """Sentences for the first screen, computed from the cell means. When no setting moves the attack
    beyond seed noise the caution comes first and no "least leakage" pick is made."""
    d = summary[(summary.dataset == dataset) & summary[f"{attack}_value"].notna()]
    if d.empty:
        return [f"No finished runs with attack {attack} on {dataset}."]
    metric = d.metric.iloc[0]

    def name(r, bold: bool = True) -> str:
        he = "" if r.he == "off" else f", HE {r.he}"
        b = "**" if bold else ""
        return f"{b}{r.method}{b} with defense {b}{setting_label(r.defense)}{b}{he}"

    seeds = int(d[f"{attack}_attack_seeds"].min()) if f"{attack}_attack_seeds" in d else int(d.seeds.min())
    effects = defense_effects(d, attack)
    clear = effects[effects.clear.astype(bool)].sort_values("delta")
    value, leak = f"{attack}_value", f"{attack}_leakage"
    has_leak = leak in d and d[leak].notna().any()
    score = leak if has_leak else value
    spread = d[score].max() - d[score].min()
    noise = d[f"{score}_std"].mean()
    best = d.loc[d.utility.idxmax()]
    out = []
    if clear.empty:
        why = (f"the {'leakage' if has_leak else 'attack'} values of all cells lie within {spread:.3f} of each "
               f"other (typical std over {seeds} seeds: {noise:.3f})")
        out.append(f"**Caution: no defense setting moves the {attack} attack by more than twice its seed std**; "
                   f"{why}. No setting here leaks clearly less than another, so no least-leakage pick is made.")
        out.append(f"Best utility: {name(best, bold=False)} — {metric} {best.utility:.4f}, {attack} attack "
                   f"{best[value]:.4f}.")
    else:
        for _, e in clear.head(4).iterrows():
            verb = "lowers" if e.delta < 0 else "raises"
            cost = (f"a utility cost of {e.utility_cost:.4f}" if e.utility_cost >= 0
                    else f"a utility gain of {-e.utility_cost:.4f}")
            out.append(f"Trade-off: defense **{setting_label(e.defense)}** {verb} the {attack} attack on "
                       f"**{e.method}** by {abs(e.delta):.3f} (more than twice the seed std, {e.noise:.3f}, over "
                       f"{seeds} seeds) at {cost}.")
        if len(clear) > 4:
            out.append(f"({len(clear) - 4} more defended cells move the attack beyond noise; see the table.)")
        out.append(f"Best utility: {name(best)} — {metric} {best.utility:.4f}, {attack} attack {best[value]:.4f}.")
        least = d.loc[d[score].idxmin()]
        out.append(f"Least leakage: {name(least)} — {'leakage' if has_leak else 'attack'} {least[score]:+.4f} "
                   f"(attack {least[value]:.4f}) at utility {least.utility:.4f}, a cost of "
                   f"{best.utility - least.utility:.4f} vs the best.")
        cheap = d[d.utility >= best.utility - UTILITY_BUDGET]
        pick = cheap.loc[cheap[score].idxmin()]
        out.append(f"Least leakage within {UTILITY_BUDGET} utility of the best: {name(pick)} — "
                   f"{'leakage' if has_leak else 'attack'} {pick[score]:+.4f}, utility {pick.utility:.4f}.")
    if has_leak:
        undefended = d[d.family == "none"]
        parts = ", ".join(f"{r.method} {r[leak]:+.3f} ± {_num(r[f'{leak}_std']):.3f}" for _, r in undefended.iterrows())
        ctl = d[f"{attack}_control"].mean()
        base = d[f"{attack}_baseline"].mean() if d[f"{attack}_baseline"].notna().any() else float("nan")
        base_name = "mean predictor" if attack.startswith("fr") else "local-SSL baseline"
        refs = f"control ({control_kind or 'same attack, untrained encoder'}) {ctl:.3f}" + ("" if math.isnan(base) else
                                                                        f", {base_name} {base:.3f}")
        out.append(f"Leakage without a defense (attack − max(control, baseline), mean ± std over {seeds} seeds): "
                   f"{parts}; {refs}; prior {d[f'{attack}_prior'].mean():.3f}.")
    ref = summary[(summary.dataset == dataset) & (summary.method == "local")]
    if len(ref):
        out.append(f"The active party alone (**local**, nothing shared, nothing to attack) reaches "
                   f"{ref.utility.mean():.4f}.")
    return out


# -------------------------------------------------------------------------------------- figures
def _short(r) -> str:
    if r.defense == "none":
        return "none"
    return setting_label(r.defense) if pd.isna(r.strength) else f"{r.family} {r.strength:g}"


def _place_labels(ax, items: list[tuple[float, float, str, str]], fontsize: float = 9) -> None:
    """Strength labels beside their points without overlapping each other, the points or the
    Pareto rings: each label takes the first of a few offsets whose box is free."""
    fig = ax.figure
    fig.canvas.draw()
    px = fig.dpi / 72.0
    taken: list[tuple[float, float, float, float]] = []
    for x, y, *_ in items:  # every point, with the ring around it, is an obstacle
        cx, cy = ax.transData.transform((x, y))
        taken.append((cx - 9 * px, cy - 9 * px, cx + 9 * px, cy + 9 * px))
    offsets = [(12, 4), (12, -15), (-12, 4), (-12, -15), (12, 16), (-12, 16), (12, -27), (-12, -27)]
    frame = ax.get_window_extent()
    for x, y, text, color in items:
        cx, cy = ax.transData.transform((x, y))
        w, h = len(text) * fontsize * 0.6 * px, fontsize * 1.3 * px
        choice = offsets[0]
        for dx, dy in offsets:
            x0 = cx + dx * px - (w if dx < 0 else 0)
            box = (x0, cy + dy * px, x0 + w, cy + dy * px + h)
            inside = frame.x0 <= box[0] and box[2] <= frame.x1 and frame.y0 <= box[1] and box[3] <= frame.y1
            if inside and not any(box[0] < t[2] and t[0] < box[2] and box[1] < t[3] and t[1] < box[3] for t in taken):
                choice = (dx, dy)
                break
        dx, dy = choice
        x0 = cx + dx * px - (w if dx < 0 else 0)
        taken.append((x0, cy + dy * px, x0 + w, cy + dy * px + h))
        ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=fontsize, color=color,
                    ha="right" if dx < 0 else "left", va="bottom", zorder=7,
                    bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.85})


def _draw_lines(ax, d: pd.DataFrame, col: str) -> list[tuple[float, float, str, str]]:
    """One line per method (and HE mode) across defense strengths; returns the points to label."""
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    labels = []
    for i, (method, g) in enumerate(d.groupby("method", sort=True)):
        color = colors[i % len(colors)]
        for (family, he), gf in g.groupby(["family", "he"], dropna=False):
            pts = pd.concat([g[(g.defense == "none") & (g.he == he)], gf]) if family != "none" else gf
            pts = pts.drop_duplicates("defense").sort_values("strength", na_position="last")
            ax.errorbar(pts.utility, pts[col], xerr=pts.utility_std.fillna(0), yerr=pts[f"{col}_std"].fillna(0),
                        color=color, ls="-" if he == "off" else "--", marker="o", ms=5, capsize=2, lw=1.3,
                        alpha=0.9, zorder=3)
            labels += [(r.utility, r[col], _short(r), color) for _, r in pts.iterrows()
                       if r.defense != "none" or family == "none"]
        ax.plot([], [], color=color, marker="o", label=method)
    return list({(x, y, t): (x, y, t, c) for x, y, t, c in labels}.values())


def _reference_lines(ax, summary: pd.DataFrame, d: pd.DataFrame, dataset: str, attack: str,
                     control_kind: str) -> None:
    prior = d[f"{attack}_prior"].mean()
    ax.axhline(prior, color="black", ls="--", lw=1, label=f"prior, guessing ({prior:.3f})")
    if d[f"{attack}_control"].notna().any():
        ctl = d[f"{attack}_control"].mean()
        ax.axhline(ctl, color="tab:purple", ls=(0, (1, 1)), lw=1.6,
                   label=f"control: {control_kind or 'same attack, untrained encoder'} ({ctl:.3f})")
    if f"{attack}_baseline" in d and d[f"{attack}_baseline"].notna().any():
        base = d[f"{attack}_baseline"].mean()
        name = "mean predictor" if attack.startswith("fr") else "local-SSL baseline"
        ax.axhline(base, color="gray", ls=":", lw=1.2, label=f"{name} ({base:.3f})")
    _local_line(ax, summary, dataset)


def _local_line(ax, summary: pd.DataFrame, dataset: str) -> None:
    ref = summary[(summary.dataset == dataset) & (summary.method == "local")]
    if len(ref):  # the active party alone: the utility a federation has to beat
        ax.axvline(ref.utility.mean(), color="tab:red", ls="-.", lw=1,
                   label=f"local, active party alone ({ref.utility.mean():.3f})")


def tradeoff_figure(summary: pd.DataFrame, dataset: str, attack: str, path: Path, setting: str = "",
                    control_kind: str = "") -> Path:
    """Left: attack values down to the prior, with the control and local-SSL baseline; right: the
    leakage (value − max(control, baseline)) per cell, labelled by defense, Pareto front ringed."""
    d = summary[(summary.dataset == dataset) & summary[f"{attack}_value"].notna()].copy()
    has_leak = f"{attack}_leakage" in d and d[f"{attack}_leakage"].notna().any()
    fig, (full, zoom) = plt.subplots(1, 2, figsize=(13, 5.6), dpi=100, gridspec_kw={"width_ratios": [1, 1.4]})
    _draw_lines(full, d, f"{attack}_value")
    _reference_lines(full, summary, d, dataset, attack, control_kind)
    col = f"{attack}_leakage" if has_leak else f"{attack}_value"
    labels = _draw_lines(zoom, d, col)
    _local_line(zoom, summary, dataset)
    if has_leak:
        zoom.axhline(0, color="tab:purple", ls=(0, (1, 1)), lw=1.6,
                     label="0: no more than the control / baseline")
    pts = d[["utility", col]].to_numpy(dtype=float)
    front = pareto_front(pts)
    if len(front):
        zoom.scatter(pts[front, 0], pts[front, 1], s=220, facecolors="none", edgecolors="black", lw=1.2, zorder=4,
                     label="Pareto front (higher utility, less leakage)")
    lo = (d[col] - d[f"{col}_std"].fillna(0)).min()
    hi = (d[col] + d[f"{col}_std"].fillna(0)).max()
    if has_leak:
        lo, hi = min(lo, 0.0), max(hi, 0.0)
    pad = max(0.01, 0.12 * (hi - lo))
    zoom.set_ylim(lo - pad, hi + 2 * pad)
    metric = d.metric.iloc[0] if len(d) else "utility"
    seeds = int(d.seeds.min()) if len(d) else 0
    for ax in (full, zoom):
        ax.set_xlabel(f"utility: test {metric} (higher is better) →")
        ax.grid(alpha=0.3)
    feature = attack.startswith("fr")
    full.set_ylabel(f"{attack} attack: feature reconstruction R² by the active party" if feature
                    else f"{attack} attack: label inference {metric} on the adversary's rows")
    zoom.set_ylabel(f"{attack} leakage = attack − max(control, baseline)" if has_leak else f"{attack} attack")
    full.set_title("attack values, with prior, control and baseline", fontsize=10)
    zoom.set_title("leakage per cell (lower leaks less), labelled by defense", fontsize=10)
    full.legend(fontsize=8, loc="best")
    zoom.legend(fontsize=8, loc="best")
    where = f" ({setting})" if setting else ""
    fig.suptitle(f"{dataset}{where}: privacy–utility trade-off under the {attack} attack "
                 f"(mean ± std over {seeds} seeds)")
    fig.tight_layout()
    _place_labels(zoom, labels)  # after the layout: placement works in final display coordinates
    fig.savefig(path)
    plt.close(fig)
    return path


def size_figure(summary: pd.DataFrame, runs: pd.DataFrame, dataset: str, key: str, path: Path) -> Path | None:
    col = f"swept_{key}"
    ok = runs[(runs.status == "ok") & (runs.dataset == dataset) & (runs.defense == "none")]
    if col not in ok or ok[col].nunique() < 2:
        return None
    g = ok.groupby(["method", col]).utility.agg(["mean", "std"]).reset_index()
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for method, gm in g.groupby("method"):
        gm = gm.sort_values(col)
        ax.errorbar(gm[col], gm["mean"], yerr=gm["std"].fillna(0), marker="o", capsize=2, label=method)
    ax.set_xlabel(key)
    ax.set_ylabel(f"test {ok.metric.iloc[0]}")
    ax.set_title(f"{dataset}: utility vs {key} (no defense)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


# --------------------------------------------------------------- what encryption buys (features)
FEATURE_DEFENSES = ("embedding-dp", "noise")
"""Defense families that act on what passive parties release (their features' protection)."""
_HE_MARKERS = {"off": "o", "ckks": "s", "paillier": "^"}


def feature_attacks(attacks: pd.DataFrame) -> list[str]:
    """Attacks on the passive parties' features (scored by reconstruction R² or field accuracy)."""
    if attacks.empty:
        return []
    feat = attacks[attacks.attack.str.startswith("fr")]
    return sorted(feat.attack.unique())


def label_attacks(attacks: pd.DataFrame) -> list[str]:
    if attacks.empty:
        return []
    names = sorted(set(attacks.attack.unique()) - set(feature_attacks(attacks)))
    return sorted(names, key=lambda a: (not a.startswith("mc"), a))  # model completion first


def shows_encryption(summary: pd.DataFrame, attacks: pd.DataFrame, dataset: str) -> bool:
    """The encryption view applies when a feature attack ran and the sweep varies HE or a
    feature-side defense."""
    d = summary[summary.dataset == dataset]
    return bool(feature_attacks(attacks)) and (d.he.nunique() > 1 or d.family.isin(FEATURE_DEFENSES).any())


def he_cost_label(r, d: pd.DataFrame) -> str:
    """`ckks 9.8× s/step, 3.1 MB/step`: a cell's HE cost beside the same cell without HE."""
    if r.he == "off":
        return ""
    ref = d[(d.method == r.method) & (d.defense == r.defense) & (d.swept == r.swept) & (d.he == "off")]
    ratio = (f"{r.step_s / ref.step_s.iloc[0]:.1f}× s/step" if len(ref) and _num(ref.step_s.iloc[0]) > 0
             and not math.isnan(_num(r.step_s)) else f"{_num(r.step_s):.3f} s/step")
    return f"{r.he} {ratio}, {_num(r.mb_step):.2g} MB/step"


def _encryption_panel(ax, d: pd.DataFrame, attack: str, summary_all: pd.DataFrame, dataset: str,
                      with_cost: bool) -> list[tuple[float, float, str, str]]:
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    labels = []
    col = f"{attack}_value"
    for i, (method, g) in enumerate(d.groupby("method", sort=True)):
        color = colors[i % len(colors)]
        for he, gh in g.groupby("he"):
            pts = gh[gh.family.isin(("none", *FEATURE_DEFENSES))].sort_values("strength", na_position="last")
            pts = pts[pts[col].notna()]
            if pts.empty:
                continue
            ax.errorbar(pts.utility, pts[col], xerr=pts.utility_std.fillna(0), yerr=pts[f"{col}_std"].fillna(0),
                        color=color, ls="-" if he == "off" else "--", marker=_HE_MARKERS.get(he, "D"), ms=6,
                        capsize=2, lw=1.2, alpha=0.9, zorder=3)
            for _, r in pts.iterrows():
                text = _short(r) if r.defense != "none" else ""
                if with_cost and r.he != "off":
                    text = (text + ", " if text else "") + he_cost_label(r, summary_all[summary_all.dataset == dataset])
                if text:
                    labels.append((r.utility, r[col], text, color))
        ax.plot([], [], color=color, marker="o", ls="-", label=method)
    for he in sorted(d.he.unique()):
        ax.plot([], [], color="gray", marker=_HE_MARKERS.get(he, "D"), ls="-" if he == "off" else "--",
                label=f"HE {he}")
    return labels


def encryption_figure(summary: pd.DataFrame, dataset: str, feature: str, label: str | None, path: Path,
                      kinds: dict[str, str]) -> Path:
    """Left: how well the active party reconstructs a passive party's features (``feature``) against
    utility, one marker per HE mode, lines across feature-side defense strengths, every HE point
    labelled with its cost beside the same cell without HE. Right: the label attack on the same
    cells (HE does not protect labels from a passive party)."""
    d = summary[(summary.dataset == dataset) & summary[f"{feature}_value"].notna()]
    panels = 2 if label and f"{label}_value" in d else 1
    fig, axes = plt.subplots(1, panels, figsize=(7.2 * panels, 5.6), dpi=100, squeeze=False)
    ax = axes[0][0]
    labels = _encryption_panel(ax, d, feature, summary, dataset, True)
    prior, ctl = d[f"{feature}_prior"].mean(), d[f"{feature}_control"].mean()
    ax.axhline(prior, color="black", ls="--", lw=1, label=f"prior: mean of the aux rows ({prior:.3f})")
    ax.axhline(ctl, color="tab:purple", ls=(0, (1, 1)), lw=1.6,
               label=f"control: {kinds.get(feature, 'same attack on noise')} ({ctl:.3f})")
    metric = d.metric.iloc[0] if len(d) else "utility"
    ax.set_xlabel(f"utility: test {metric} (higher is better) →")
    ax.set_ylabel(f"{feature}: feature reconstruction R² on aligned rows (lower leaks less)")
    ax.set_title("passive features → active party: what encryption and feature-side defenses buy", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7.5, loc="best")
    if panels == 2:
        lx = axes[0][1]
        dl = summary[(summary.dataset == dataset) & summary[f"{label}_value"].notna()]
        _encryption_panel(lx, dl, label, summary, dataset, False)
        lx.axhline(dl[f"{label}_prior"].mean(), color="black", ls="--", lw=1,
                   label=f"prior, guessing ({dl[f'{label}_prior'].mean():.3f})")
        if dl[f"{label}_control"].notna().any():
            lx.axhline(dl[f"{label}_control"].mean(), color="tab:purple", ls=(0, (1, 1)), lw=1.6,
                       label=f"control: {kinds.get(label, 'same attack, untrained')} "
                             f"({dl[f'{label}_control'].mean():.3f})")
        lx.set_xlabel(f"utility: test {metric} (higher is better) →")
        lx.set_ylabel(f"{label}: label inference by passive1 (lower leaks less)")
        lx.set_title("labels → passive party, same cells (HE does not protect labels)", fontsize=10)
        lx.grid(alpha=0.3)
        lx.legend(fontsize=7.5, loc="best")
    lo, hi = (int(d.seeds.min()), int(d.seeds.max())) if len(d) else (0, 0)
    seeds = f"{lo}" if lo == hi else f"{lo}–{hi}"
    fig.suptitle(f"{dataset}: feature leakage and label leakage vs utility, HE off / on (mean ± std over "
                 f"{seeds} seeds per cell)")
    fig.tight_layout()
    _place_labels(ax, labels, fontsize=8)
    fig.savefig(path)
    plt.close(fig)
    return path


def encryption_headline(summary: pd.DataFrame, dataset: str, feature: str, label: str | None) -> list[str]:
    """What encryption buys and costs, per method, computed from the cell means."""
    d = summary[(summary.dataset == dataset) & summary[f"{feature}_value"].notna()]
    out = []
    order = d.assign(_defended=d.family != "none").sort_values(["method", "_defended", "strength", "he"])
    for _, r in order[order.he != "off"].iterrows():
        ref = d[(d.method == r.method) & (d.defense == r.defense) & (d.swept == r.swept) & (d.he == "off")]
        if ref.empty:
            continue
        ref = ref.iloc[0]
        move = r[f"{feature}_value"] - ref[f"{feature}_value"]
        noise = max(_num(r[f"{feature}_value_std"]), _num(ref[f"{feature}_value_std"]))
        beyond = "" if math.isnan(noise) or noise == 0 else (" (beyond 2× seed std)" if abs(move) > 2 * noise
                                                             else " (within 2× seed std)")
        lab = ""
        if label and f"{label}_value" in d and not pd.isna(r.get(f"{label}_value")):
            lab = (f"; {label} label attack {ref[f'{label}_value']:.3f} → {r[f'{label}_value']:.3f} "
                   "(HE does not protect labels)")
        out.append(f"**{r.method}**, defense {setting_label(r.defense)}: HE **{r.he}** moves {feature} R² "
                   f"{ref[f'{feature}_value']:.3f} → {r[f'{feature}_value']:.3f} ({move:+.3f}{beyond}; control "
                   f"{r[f'{feature}_control']:.3f}, mean predictor {r[f'{feature}_prior']:.3f}) at "
                   f"{he_cost_label(r, d)}, utility {ref.utility:.4f} → {r.utility:.4f}{lab}.")
    feat = d[d.family.isin(FEATURE_DEFENSES)]
    for (method, he), g in feat.groupby(["method", "he"]):
        strongest = g.loc[g[f"{feature}_value"].idxmin()]
        ref = d[(d.method == method) & (d.he == he) & (d.defense == "none") & (d.swept == strongest.swept)]
        if ref.empty:
            continue
        ref = ref.iloc[0]
        eps = ("" if pd.isna(strongest.feature_epsilon) else
               f" (feature-level ε {strongest.feature_epsilon:.3g} at δ 1e-5 per passive row)")
        out.append(f"**{method}**, HE {he}: **{setting_label(strongest.defense)}**{eps} brings {feature} R² "
                   f"{ref[f'{feature}_value']:.3f} → {strongest[f'{feature}_value']:.3f} (control "
                   f"{strongest[f'{feature}_control']:.3f}) at utility {ref.utility:.4f} → {strongest.utility:.4f}.")
    return out or [f"No cell pairs an HE mode or a feature-side defense with its undefended, unencrypted twin "
                   f"for {feature}."]


def image_grid(attacks: pd.DataFrame, dataset: str, attack: str, path: Path) -> Path | None:
    """Originals (top row) and each cell's reconstruction of the same rows (seed of the first run;
    every cell draws the same aux/scored split from the seed), for image datasets."""
    at = attacks[(attacks.dataset == dataset) & (attacks.attack == attack) & attacks.examples.notna()]
    if at.empty:
        return None
    at = at[at.seed == at.seed.min()].drop_duplicates(["method", "defense", "he", "swept"])
    he_order = {"off": 0, "ckks": 1, "paillier": 2}
    at = at.assign(_defended=at.family != "none", _he=at.he.map(he_order).fillna(3)).sort_values(
        ["method", "_defended", "strength", "_he"]).head(8)

    def images(ex: dict, key: str) -> np.ndarray:  # uint8 rows as the attack stored them, in [0, 1]
        return np.frombuffer(base64.b64decode(ex[key]), dtype=np.uint8).reshape(-1, *ex["shape"]) / 255.0

    first = json.loads(at.examples.iloc[0])
    truth = images(first, "truth")
    rows = [("original", truth)] + [
        (f"{r.method}, {setting_label(r.defense)}, HE {r.he}", images(json.loads(r.examples), "reconstruction"))
        for r in at.itertuples()]
    k = min(len(truth), *(len(x) for _, x in rows))
    h, w = truth.shape[1:3]
    fig, axes = plt.subplots(len(rows), k, figsize=(max(6.0, 0.9 * k * w / h + 2.2), 0.9 * len(rows) + 0.8),
                             dpi=100, squeeze=False)
    for i, (name, x) in enumerate(rows):
        for j in range(k):
            ax = axes[i][j]
            ax.imshow(x[j], cmap="gray", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
        axes[i][0].set_ylabel(name, rotation=0, ha="right", va="center", fontsize=8)
    fig.suptitle(f"{dataset}, {attack}: passive halves (top row) and the\nactive party's reconstructions "
                 f"(seed {int(at.seed.min())})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------------------- tables
def _pm(mean: float, std: float) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "–"
    return f"{mean:.4f} ± {0.0 if std is None or math.isnan(std) else std:.4f}"


def cell_table(summary: pd.DataFrame, dataset: str) -> pd.DataFrame:
    d = summary[summary.dataset == dataset]
    rows = []
    d = d.assign(_defended=d.family != "none").sort_values(["method", "he", "swept", "_defended", "family", "strength"])
    for _, r in d.iterrows():
        row = {"method": r.method, "defense": setting_label(r.defense)}
        if r.he != "off" or (summary.he != "off").any():
            row["HE"] = r.he
        swept = json.loads(r.swept)
        for k, v in swept.items():
            row[k] = v
        row["seeds"] = int(r.seeds)
        row[f"utility ({r.metric})"] = _pm(r.utility, r.utility_std)
        for a in attack_names(summary):
            if not pd.isna(r.get(f"{a}_value", np.nan)):
                row[a] = _pm(r[f"{a}_value"], r[f"{a}_value_std"])
                row[f"{a} control"] = _pm(r.get(f"{a}_control"), r.get(f"{a}_control_std"))
                row[f"{a} baseline"] = "–" if pd.isna(r.get(f"{a}_baseline", np.nan)) else f"{r[f'{a}_baseline']:.4f}"
                leak, sd = _num(r.get(f"{a}_leakage")), _num(r.get(f"{a}_leakage_std"))
                row[f"{a} leakage"] = "–" if math.isnan(leak) else f"{leak:+.4f} ± {0.0 if math.isnan(sd) else sd:.4f}"
        row["ε"] = "–" if pd.isna(r.epsilon) else f"{r.epsilon:.3g}"
        if summary.feature_epsilon.notna().any():
            row["feature ε"] = "–" if pd.isna(r.feature_epsilon) else f"{r.feature_epsilon:.3g}"
        row["train s"] = f"{r.seconds:.1f}"
        rows.append(row)
    return pd.DataFrame(rows).astype(object).fillna("–")


def column_notes(summary: pd.DataFrame, dataset: str) -> list[str]:
    """What every column of the cell table means."""
    d = summary[summary.dataset == dataset]
    metric = d.metric.iloc[0] if len(d) else "utility"
    notes = ["`seeds`: runs the cell's mean ± std rests on (each error bar in the plots, too).",
             f"`utility ({metric})`: the federation's test {metric}, mean ± std over seeds."]
    for a in attack_names(summary):
        if a.startswith("fr"):
            notes += [f"`{a}`: the active party's reconstruction of `passive1`'s features, mean per-feature R² "
                      "(accuracy where all fields are categorical); lower is better for privacy.",
                      f"`{a} control`: the same reconstruction trained on noise observations of the same shape.",
                      f"`{a} baseline`: the mean predictor (mean of the rows the attacker knows).",
                      f"`{a} leakage`: value − max(control, baseline)."]
            continue
        notes += [f"`{a}`: the attack's value — label inference on the passive adversary's own training rows "
                  "(top-1 accuracy for multi-class tasks, AUC for binary ones); lower is better for privacy.",
                  f"`{a} control`: the same attack with the same budget when the federation leaks nothing: "
                  "model completion on the same architecture at random initialisation; gradient scoring "
                  "against labels shuffled within each batch.",
                  f"`{a} baseline`: the same attack on an encoder the adversary pre-trains alone (local SSL) "
                  "on its own rows; – where the attack has none.",
                  f"`{a} leakage`: what the federation itself leaks, value − max(control, baseline), computed "
                  "per seed, mean ± std; ≤ 0 means nothing beyond what the adversary gets without it."]
    notes += ["`ε`: the label-DP bound of the defense at the reported δ; – where the defense has "
              "no DP accounting (no defense, ISO, sparsification), so no ε exists.",
              "`train s`: training wall time per run on this machine (attacks excluded)."]
    if "feature_epsilon" in d and d.feature_epsilon.notna().any():
        notes.append("`feature ε`: the largest feature-level ε (δ 1e-5) of any passive party under embedding-dp "
                     "(replace one entity's feature row, against the active party's whole view).")
    return notes


def setup_lines(runs: pd.DataFrame, attacks: pd.DataFrame, dataset: str) -> list[str]:
    """The setup a reader needs to interpret the numbers, read from the stored configs and results."""
    ok = runs[(runs.status == "ok") & (runs.dataset == dataset)]
    if ok.empty:
        return []
    cfg = json.loads(ok.config.iloc[0])
    part = json.loads(ok.partition.iloc[0])
    fed = ok[ok.method != "local"]
    if len(fed):
        part = json.loads(fed.partition.iloc[0])
    data, spec, train, model, optim = cfg["data"], cfg["partition"], cfg["train"], cfg["model"], cfg["optim"]
    rows = data.get("max_rows")
    size = f"the first {rows:,} rows" if rows else "all rows"
    per_setting = {}
    for sw, cell_part in zip(fed.swept if len(fed) else ok.swept, fed.partition if len(fed) else ok.partition,
                             strict=True):
        label = ", ".join(f"{k} {v}" for k, v in json.loads(sw).items() if ":" not in k)
        counts = json.loads(cell_part)
        per_setting[label] = (f"{counts.get('aligned', '?')} aligned training rows, {counts.get('labeled', '?')} of "
                              "them labeled")
    aligned = "; ".join(f"{k}: {v}" if k else v for k, v in sorted(per_setting.items()))
    lines = [f"Data: **{dataset}**, {size}; {part.get('parties', spec.get('n_parties'))} parties "
             f"(party 0 holds the labels); {aligned}; {part.get('test_rows', '?')} test rows.",
             f"Training: {train['epochs']} epochs, batch {train['batch_size']}, {optim['optimizer']} lr "
             f"{optim['lr'] if optim['lr'] is not None else DEFAULT_LR.get(optim['optimizer'], 'default')}; "
             f"bottom models {model['bottom']} (cut width {model['cut_dim']}); methods "
             f"{', '.join(sorted(ok.method.unique()))}; seeds {', '.join(str(s) for s in sorted(ok.seed.unique()))}."]
    at = attacks[(attacks.dataset == dataset) & attacks.run_id.isin(ok.run_id)] if len(attacks) else attacks
    for name, g in at.groupby("attack") if len(at) else []:
        params = json.loads(g.params.iloc[0])
        if name.startswith("mc"):
            ssl = {m: json.loads(x).get("epochs") for m, x in zip(g.method, g.baseline_ssl, strict=True)
                   if json.loads(x)}
            ssl_text = ", ".join(f"{m} {e}" for m, e in sorted(ssl.items())) or "–"
            lines.append(f"Attack **{name}**: the passive party `passive1` completes its bottom model with a head "
                         f"and trains the {g.finetunes.iloc[0]}: {params.get('steps')} steps of "
                         f"{'MixMatch' if name != 'mc-plain' else 'supervised training'} on "
                         f"{int(g.n_aux.iloc[0])} labeled auxiliary rows of its own (balanced by class); "
                         f"local-SSL baseline: SimSiam on all the adversary's rows, as many epochs as the method's "
                         f"own SSL stage, 10 without one ({ssl_text}).")
        elif name.startswith("fr"):
            aux = (f"knows the passive features of {int(g.n_aux.iloc[0])} aligned rows and trains a decoder from"
                   if name == "fr" else "knows no passive row; fits a generator from its own features and a "
                   "surrogate of the passive bottom model to")
            lines.append(f"Attack **{name}**: the active party attacks `passive1`'s features: it {aux} what it "
                         "observes per row (the released rows with HE off, a_P = t·W_P with HE on); scored by "
                         "R² on the other aligned training rows.")
        else:
            lines.append(f"Attack **{name}**: scores the gradients the passive party `passive1` received "
                         "(under HE: the rows it decrypts with its own key).")
    return lines


def epsilon_table(runs: pd.DataFrame) -> pd.DataFrame:
    ok = runs[(runs.status == "ok") & runs.epsilon.notna()]
    if ok.empty:
        return pd.DataFrame()
    keys = ["dataset", "method", "defense"]
    g = ok.groupby(keys).agg(epsilon=("epsilon", "mean"), delta=("delta", "first"),
                             noise_multiplier=("noise_multiplier", "first"))
    if "privacy_status" in ok and ok.privacy_status.notna().any():  # a fixed mechanism seed voids ε: say so
        g["status"] = ok.groupby(keys).privacy_status.first().fillna("private")
    g = g.reset_index().assign(defense=lambda x: x.defense.map(setting_label))
    return g


def he_table(runs: pd.DataFrame) -> pd.DataFrame:
    ok = runs[runs.status == "ok"]
    if ok.empty or (ok.he == "off").all():
        return pd.DataFrame()
    steps = pd.to_numeric(ok.train_steps, errors="coerce").where(lambda x: x > 0)
    ok = ok.assign(step_s=ok.seconds / steps, mb_step=ok.bytes_sent / steps / 1e6)
    g = ok.groupby(["dataset", "method", "defense", "he"]).agg(
        seconds=("seconds", "mean"), bytes_sent=("bytes_sent", "mean"), he_seconds=("he_seconds", "mean"),
        s_per_step=("step_s", "mean"), mb_per_step=("mb_step", "mean"),
        parameters=("he_params", "first")).reset_index()
    off = g[g.he == "off"].set_index(["dataset", "method", "defense"])
    g["× off (seconds)"] = [f"{r.seconds / off.loc[(r.dataset, r.method, r.defense), 'seconds']:.1f}"
                           if (r.dataset, r.method, r.defense) in off.index else "–" for r in g.itertuples()]
    g["MB sent"] = (g.bytes_sent / 1e6).round(2)
    return g.drop(columns=["bytes_sent"])


# ------------------------------------------------------------------------------------- rendering
def _md_table(df: pd.DataFrame) -> str:
    return df.to_markdown(index=False) if not df.empty else "(none)"


def write_report(store_path: str | Path, out_dir: str | Path) -> list[Path]:
    """Render a sweep store as ``report.md`` + a self-contained ``report.html`` and their figures.

    Args:
        store_path: the sweep's SQLite store.
        out_dir: where the report and its PNG figures go (created if missing).

    Returns:
        the paths of ``report.md``, ``report.html`` and every figure, in document order.
    """
    runs, attacks = load_frames(store_path)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarise(runs, attacks)
    sections: list[tuple[str, list]] = [(f"{ds}", _dataset_blocks(runs, attacks, summary, ds, out))
                                        for ds in sorted(runs.dataset.unique())]
    sections += _run_wide_sections(runs)
    intro = _intro(runs, attacks, store_path)
    (out / "report.md").write_text(_render_md(intro, sections, out))
    (out / "report.html").write_text(_render_html(intro, sections))
    figures = [content for _, blocks in sections for kind, content in blocks if kind == "img"]
    return [out / "report.md", out / "report.html", *figures]


# A section is (title, blocks); a block is ("p", text) | ("ul", lines) | ("h3", title) | ("img", path) | ("table", df).
def _dataset_blocks(runs: pd.DataFrame, attacks: pd.DataFrame, summary: pd.DataFrame, ds: str, out: Path) -> list:
    """One dataset's section: its setup, what encryption buys, the attack trade-offs, utility against
    each swept data key, and the per-cell table."""
    blocks: list = [("ul", setup_lines(runs, attacks, ds))]
    if summary.empty:
        return blocks + _size_blocks(summary, runs, ds, out)
    kinds = control_kinds(attacks)
    if shows_encryption(summary, attacks, ds):
        blocks += _encryption_blocks(summary, attacks, ds, out, kinds)
    atk = attack_names(summary)
    for a in atk:
        blocks += _tradeoff_blocks(summary, ds, a, out, kinds)
    if not atk:
        d = summary[summary.dataset == ds]
        best = d.loc[d.utility.idxmax()]
        blocks.append(("ul", [f"No attacks in this sweep. Best utility: **{best.method}** with "
                              f"**{setting_label(best.defense)}** ({best.utility:.4f})."]))
    blocks += _size_blocks(summary, runs, ds, out)
    blocks.append(("h3", "Mean ± std over seeds, per cell"))
    blocks.append(("table", cell_table(summary, ds)))
    blocks.append(("ul", column_notes(summary, ds)))
    return blocks


def _encryption_blocks(summary: pd.DataFrame, attacks: pd.DataFrame, ds: str, out: Path,
                       kinds: dict[str, str]) -> list:
    """Per feature attack: what encryption buys, beside the first label attack."""
    blocks: list = []
    labels_ = label_attacks(attacks)
    for f in feature_attacks(attacks):
        if not summary[summary.dataset == ds][f"{f}_value"].notna().any():
            continue
        blocks.append(("h3", f"What encryption buys: {f} (passive features) beside "
                             f"{labels_[0] if labels_ else 'no label attack'} (labels)"))
        fig = encryption_figure(summary, ds, f, labels_[0] if labels_ else None,
                                out / f"encryption_{ds}_{f}.png", kinds)
        blocks.append(("img", fig))  # the plot first: it is what the first screen must show
        blocks.append(("ul", encryption_headline(summary, ds, f, labels_[0] if labels_ else None)))
        grid = image_grid(attacks, ds, f, out / f"reconstructions_{ds}_{f}.png")
        if grid is not None:
            blocks.append(("img", grid))
    return blocks


def _tradeoff_blocks(summary: pd.DataFrame, ds: str, a: str, out: Path, kinds: dict[str, str]) -> list:
    """One trade-off per swept setting (e.g. each aligned fraction) for attack ``a``: comparing
    cells across different data sizes would mix two effects in one line."""
    blocks: list = []
    settings = sorted(summary[summary.dataset == ds].swept.unique())
    for i, sw in enumerate(settings):
        # the local reference runs once per data setting, whatever the attack parameters
        data_axes = json.dumps({k: v for k, v in json.loads(sw).items() if ":" not in k}, sort_keys=True)
        sub = summary[(summary.swept == sw) | ((summary.method == "local") & (summary.swept == data_axes))]
        if not sub[(sub.dataset == ds)][f"{a}_value"].notna().any():
            continue
        label = ", ".join(f"{k} = {v}" for k, v in json.loads(sw).items())
        if label:
            blocks.append(("h3", f"{a} attack, {label}"))
        blocks += [("ul", headline(sub, ds, a, kinds.get(a, "")))]
        suffix = f"_{i}" if len(settings) > 1 else ""
        fig = tradeoff_figure(sub, ds, a, out / f"tradeoff_{ds}_{a}{suffix}.png", label, kinds.get(a, ""))
        blocks.append(("img", fig))
    return blocks


def _size_blocks(summary: pd.DataFrame, runs: pd.DataFrame, ds: str, out: Path) -> list:
    """Utility against each swept data key (e.g. the aligned fraction)."""
    blocks: list = []
    for key in sorted({c[len("swept_"):] for c in runs.columns if c.startswith("swept_") and ":" not in c}):
        fig = size_figure(summary, runs, ds, key, out / f"utility_vs_{key}_{ds}.png")
        if fig is not None:
            blocks.append(("img", fig))
    return blocks


def _run_wide_sections(runs: pd.DataFrame) -> list[tuple[str, list]]:
    """The sections over all datasets: ε, HE cost, failed runs."""
    sections: list[tuple[str, list]] = []
    eps = epsilon_table(runs)
    if not eps.empty:
        sections.append(("Differential privacy (ε at the reported δ; label-DP of the active party's training labels: "
                         "dp = DP-SGD, rr = randomized response)",
                         [("table", eps)]))
    he = he_table(runs)
    if not he.empty:
        sections.append(("Encrypted activations: cost",
                         [("p", "HE protects the passive parties' activations from the active party; it does not "
                                "protect labels from a passive party (that is what the defenses are for)."),
                          ("table", he)]))
    failed = runs[runs.status == "failed"]
    if not failed.empty:
        ft = failed[["method", "defense", "seed", "error"]].assign(defense=lambda x: x.defense.map(setting_label))
        sections.append((f"Failed runs ({len(failed)})", [("table", ft)]))
    return sections


def _intro(runs: pd.DataFrame, attacks: pd.DataFrame, store_path: str | Path) -> str:
    n_ok, n_failed = int((runs.status == "ok").sum()), int((runs.status == "failed").sum())
    sweeps = ", ".join(sorted(runs.sweep.dropna().unique()))
    n_fixed = int(runs.privacy_status.notna().sum()) if "privacy_status" in runs else 0
    intro = (f"Sweep {sweeps}: {n_ok} runs ok, {n_failed} failed, store `{Path(store_path).name}`. "
             "Attack performance is measured on the passive adversary's own training rows (top-1 accuracy for "
             "multi-class tasks, AUC for binary); lower is better for privacy. **Leakage** is what the federation "
             "adds: the attack's value minus the larger of its control (what the same attack gets when the "
             "federation leaks nothing: model completion on an untrained encoder of the same architecture, "
             "gradient scoring against labels shuffled within each batch) and its local-SSL baseline.")
    if n_fixed:
        intro += (f" **{n_fixed} runs are not private (mechanism seed fixed)**: their noise is reproducible by anyone "
                  "who knows that seed, so their ε holds against no one (debugging runs only).")
    if feature_attacks(attacks):
        intro += (" Feature attacks (" + ", ".join(feature_attacks(attacks)) + ") are the other direction: the "
                  "active party reconstructing a passive party's features, scored by R² (higher leaks more) against "
                  "their control and the mean predictor.")
    return intro


def _render_md(intro: str, sections: list, out: Path) -> str:
    lines = ["# securevfl report", "", intro, ""]
    for title, blocks in sections:
        lines += [f"## {title}", ""]
        for kind, content in blocks:
            if kind == "ul":
                lines += [f"- {s}" for s in content] + [""]
            elif kind == "img":
                lines += [f"![{content.stem}]({content.relative_to(out)})", ""]
            elif kind == "table":
                lines += [_md_table(content), ""]
            elif kind == "h3":
                lines += [f"### {content}", ""]
            else:
                lines += [content, ""]
    return "\n".join(lines)


def _inline_md(text: str) -> str:
    parts = html.escape(text).split("**")
    return "".join(f"<b>{p}</b>" if i % 2 else p for i, p in enumerate(parts)).replace("`", "")


def _render_html(intro: str, sections: list) -> str:
    body = [f"<h1>securevfl report</h1><p>{_inline_md(intro)}</p>"]
    for title, blocks in sections:
        body.append(f"<h2>{html.escape(title)}</h2>")
        for kind, content in blocks:
            if kind == "ul":
                body.append("<ul class='headline'>" + "".join(f"<li>{_inline_md(s)}</li>" for s in content)
                            + "</ul>")
            elif kind == "img":
                data = base64.b64encode(content.read_bytes()).decode()
                body.append(f"<img alt='{content.stem}' src='data:image/png;base64,{data}'>")
            elif kind == "table":
                body.append(content.to_html(index=False, border=0, na_rep="–", escape=True)
                            if not content.empty else "<p>(none)</p>")
            elif kind == "h3":
                body.append(f"<h3>{html.escape(content)}</h3>")
            else:
                body.append(f"<p>{_inline_md(content)}</p>")
    style = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:1.2em auto;padding:0 1em;color:#222}"
             "h1{margin:.2em 0}h2{border-bottom:1px solid #ddd;margin-top:1.4em}"
             "ul.headline{background:#f5f7fa;border-left:4px solid #3b6ea5;padding:.6em 1.6em;margin:.6em 0}"
             "img{max-width:100%;height:auto}table{border-collapse:collapse;font-size:13px;margin:.5em 0}"
             "td,th{border-bottom:1px solid #e3e3e3;padding:3px 8px;text-align:left}th{background:#f0f0f0}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>securevfl report</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>")
