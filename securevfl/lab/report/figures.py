"""Frames → figures (matplotlib PNGs): the privacy–utility trade-off, utility against a swept size,
what encryption buys, and the grid of reconstructed images."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from securevfl.lab.report.frame import is_feature_attack, pareto_front, setting_label  # noqa: E402
from securevfl.lab.report.text import he_cost_label  # noqa: E402

_HE_MARKERS = {"off": "o", "ckks": "s", "bfv": "D", "paillier": "^"}


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
        name = "mean predictor" if is_feature_attack(attack) else "local-SSL baseline"
        ax.axhline(base, color="gray", ls=":", lw=1.2, label=f"{name} ({base:.3f})")
    _local_line(ax, summary, dataset)


def _local_line(ax, summary: pd.DataFrame, dataset: str) -> None:
    ref = summary[(summary.dataset == dataset) & (summary.method == "local")]
    if len(ref):  # the active party alone: the utility a federation has to beat
        ax.axvline(ref.utility.mean(), color="tab:red", ls="-.", lw=1,
                   label=f"local, active party alone ({ref.utility.mean():.3f})")


def tradeoff_figure(summary: pd.DataFrame, dataset: str, attack: str, path: Path, setting: str = "",
                    control_kind: str = "", picked: dict | None = None) -> Path:
    """Left: attack values down to the prior, with the control and local-SSL baseline; right: the
    leakage (value − max(control, baseline)) per cell, labelled by defense, Pareto front ringed;
    ``picked`` (the first screen's pick: method, defense, he, swept) starred on both panels."""
    d = summary[(summary.dataset == dataset) & summary[f"{attack}_value"].notna()].copy()
    has_leak = f"{attack}_leakage" in d and d[f"{attack}_leakage"].notna().any()
    fig, (full, zoom) = plt.subplots(1, 2, figsize=(13, 5.6), dpi=100, gridspec_kw={"width_ratios": [1, 1.4]})
    full_labels = _draw_lines(full, d, f"{attack}_value")
    _reference_lines(full, summary, d, dataset, attack, control_kind)
    col = f"{attack}_leakage" if has_leak else f"{attack}_value"
    labels = _draw_lines(zoom, d, col)
    _local_line(zoom, summary, dataset)
    if has_leak:
        zoom.axhline(0, color="tab:purple", ls=(0, (1, 1)), lw=1.6,
                     label="0: no more than the control / baseline")
    # the front is drawn among cells above chance and above `local` only: a cell worse than not
    # federating is no trade-off anyone should pick, however little it leaks
    ok = pd.Series(True, index=d.index)
    if "chance" in d:
        ok &= ~d.chance.astype(bool)
    if "beats_local" in d:
        ok &= d.beats_local.map(lambda b: b is not False)  # None: no `local` ran to compare with
    pts = d[ok][["utility", col]].to_numpy(dtype=float)
    front = pareto_front(pts)
    if len(front):
        zoom.scatter(pts[front, 0], pts[front, 1], s=220, facecolors="none", edgecolors="black", lw=1.2, zorder=4,
                     label="Pareto front (higher utility, less leakage)")
    if picked is not None:  # the cell the first screen's sentence names (issue 51)
        at = d[(d.method == picked["method"]) & (d.defense == picked["defense"]) & (d.he == picked["he"])
               & (d.swept == picked.get("swept", d.swept))]
        for ax, y in ((full, f"{attack}_value"), (zoom, col)):
            ax.scatter(at.utility, at[y], marker="*", s=380, color="gold", edgecolors="black", lw=1.0, zorder=5,
                       label="the pick (first screen)")
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
    feature = is_feature_attack(attack)
    full.set_ylabel(f"{attack} attack: feature reconstruction R² by the active party" if feature
                    else f"{attack} attack: label inference {metric} on the adversary's rows")
    zoom.set_ylabel(f"{attack} leakage = attack − max(control, baseline)" if has_leak else f"{attack} attack")
    full.set_title("attack values, with prior, control and baseline", fontsize=10)
    zoom.set_title("leakage per cell (lower leaks less), labelled by defense", fontsize=10)
    for ax in (full, zoom):  # below the axes: a legend inside would hide the reference lines and points
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False)
    where = f" ({setting})" if setting else ""
    fig.suptitle(f"{dataset}{where}: privacy–utility trade-off under the {attack} attack "
                 f"(mean ± std over {seeds} seeds)")
    fig.tight_layout()
    _place_labels(full, full_labels, fontsize=8)  # after the layout: placement works in display coordinates
    _place_labels(zoom, labels)
    fig.savefig(path, bbox_inches="tight")
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
    return finish_line_plot(fig, ax, path)


def finish_line_plot(fig, ax, path: Path) -> Path:
    """A one-panel line plot's grid, legend and layout; written to ``path`` and closed."""
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _encryption_panel(ax, d: pd.DataFrame, attack: str, summary_all: pd.DataFrame, dataset: str,
                      with_cost: bool) -> list[tuple[float, float, str, str]]:
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    labels = []
    col = f"{attack}_value"
    for i, (method, g) in enumerate(d.groupby("method", sort=True)):
        color = colors[i % len(colors)]
        for he, gh in g.groupby("he"):
            pts = gh[(gh.family == "none") | gh.feature_side.astype(bool)].sort_values("strength", na_position="last")
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
    ax.set_title("passive features → active party: what " + ("encryption and feature-side defenses buy"
                 if d.he.nunique() > 1 else "feature-side defenses buy"), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7.5, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False)
    if panels == 2:
        assert label is not None  # a second panel only for a label attack
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
        lx.legend(fontsize=7.5, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False)
    lo, hi = (int(d.seeds.min()), int(d.seeds.max())) if len(d) else (0, 0)
    seeds = f"{lo}" if lo == hi else f"{lo}–{hi}"
    modes = " / ".join(sorted(d.he.unique())) if d.he.nunique() > 1 else None
    fig.suptitle(f"{dataset}: feature leakage and label leakage vs utility"
                 + (f", HE {modes}" if modes else ", feature-side defenses (no HE in this sweep)")
                 + f" (mean ± std over {seeds} seeds per cell)")
    fig.tight_layout()
    _place_labels(ax, labels, fontsize=8)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path


def image_grid(attacks: pd.DataFrame, dataset: str, attack: str, path: Path) -> Path | None:
    """Originals (top row) and each cell's reconstruction of the same rows (seed of the first run;
    every cell draws the same aux/scored split from the seed), for image datasets."""
    at = attacks[(attacks.dataset == dataset) & (attacks.attack == attack) & attacks.examples.notna()]
    if at.empty:
        return None
    at = at[at.seed == at.seed.min()].drop_duplicates(["method", "defense", "he", "swept"])
    he_order = {"off": 0, "ckks": 1, "bfv": 2, "paillier": 3}
    at = at.assign(_defended=at.family != "none", _he=at.he.map(he_order).fillna(4)).sort_values(
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


def audit_figure(runs: pd.DataFrame, path: Path) -> Path | None:
    """Claimed ε against the one-run audit's lower bound (mean over seeds), one point per dataset and
    label-DP setting; a point above the diagonal is an audit that refutes the claim."""
    ok = runs[(runs.status == "ok") & runs.epsilon.notna()]
    if "epsilon_audit" not in ok or ok.epsilon_audit.isna().all():
        return None
    g = ok[ok.epsilon_audit.notna()].groupby(["dataset", "family", "defense"]).agg(
        claimed=("epsilon", "mean"), audited=("epsilon_audit", "mean"), low=("epsilon_audit", "min"),
        high=("epsilon_audit", "max")).reset_index()
    fig, ax = plt.subplots(figsize=(5.5, 4.5), layout="constrained")
    markers = ["o", "s", "^", "D", "v"]
    for i, ((ds, family), d) in enumerate(g.groupby(["dataset", "family"])):
        d = d.sort_values("claimed")
        ax.errorbar(d.claimed, d.audited, yerr=[d.audited - d.low, d.high - d.audited], marker=markers[i % 5],
                    capsize=2, lw=1.2, label=f"{ds} · {family}")
    top = float(max(g.claimed.max(), g.high.max())) * 1.05
    ax.plot([0, top], [0, top], color="grey", ls=":", lw=1, label="audited = claimed")
    ax.set(xlabel="claimed ε (accountant)", ylabel="audited ε lower bound (95 %)", xlim=(0, top), ylim=(0, top))
    ax.legend(fontsize=8)
    fig.savefig(path)
    plt.close(fig)
    return path
