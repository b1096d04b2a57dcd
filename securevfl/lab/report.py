"""Reports (SPEC §7): store → tidy DataFrames → figures and tables → ``report.md`` + ``report.html``.

The first screen answers "which method leaks least, at what utility cost": a few computed sentences
(best utility, least leakage, the least-leaking setup within a small utility budget) above the
privacy–utility trade-off plot (x = utility, y = attack performance, one line per method across
defense strengths, prior dashed, error bars over seeds, Pareto front ringed).
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
from securevfl.lab.store import Store  # noqa: E402

UTILITY_BUDGET = 0.02
"""Utility loss a user would trade for privacy in the headline ("least leakage within 0.02")."""

_GROUP = ["dataset", "method", "defense", "family", "strength", "he", "swept"]


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
                     "he_bytes": he.get("bytes"),
                     "he_params": json.dumps(he["params"], sort_keys=True) if he.get("params") else None,
                     "delta": (res.get("privacy") or {}).get("delta"),
                     "noise_multiplier": (res.get("privacy") or {}).get("noise_multiplier")})
        for name, a in (res.get("attacks") or {}).items():
            attacks.append({**base, "attack": name, "attack_metric": a.get("metric"), "value": a.get("value"),
                            "prior": a.get("prior"), "baseline": a.get("baseline"), "utility": r["utility"]})
    return pd.DataFrame(runs), pd.DataFrame(attacks)


def setting_label(defense: str) -> str:
    return "none" if defense == "none" else defense.replace(":", " ")


def summarise(runs: pd.DataFrame, attacks: pd.DataFrame) -> pd.DataFrame:
    """Mean ± std over seeds per cell (ok runs), with each attack's mean/std/prior/baseline."""
    ok = runs[runs.status == "ok"]
    if ok.empty:
        return pd.DataFrame()
    g = ok.groupby(_GROUP, dropna=False)
    out = g.agg(utility=("utility", "mean"), utility_std=("utility", "std"), seeds=("seed", "nunique"),
                metric=("metric", "first"), epsilon=("epsilon", "mean"), seconds=("seconds", "mean"),
                bytes_sent=("bytes_sent", "mean")).reset_index()
    if not attacks.empty:
        okat = attacks[attacks.run_id.isin(ok.run_id)]
        ag = okat.groupby(_GROUP + ["attack"], dropna=False).agg(
            value=("value", "mean"), value_std=("value", "std"), prior=("prior", "mean"),
            baseline=("baseline", "mean"), attack_metric=("attack_metric", "first")).reset_index()
        wide = ag.pivot_table(index=_GROUP, columns="attack", values=["value", "value_std", "prior", "baseline"],
                              dropna=False)
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


def attack_names(summary: pd.DataFrame) -> list[str]:
    return sorted({c[: -len("_value")] for c in summary.columns if c.endswith("_value")})


# ------------------------------------------------------------------------------------- headline
def headline(summary: pd.DataFrame, dataset: str, attack: str) -> list[str]:
    """Sentences for the first screen, computed from the cell means."""
    d = summary[(summary.dataset == dataset) & summary[f"{attack}_value"].notna()]
    if d.empty:
        return [f"No finished runs with attack {attack} on {dataset}."]
    metric = d.metric.iloc[0]

    def name(r) -> str:
        he = "" if r.he == "off" else f", HE {r.he}"
        return f"**{r.method}** with defense **{setting_label(r.defense)}**{he}"

    best = d.loc[d.utility.idxmax()]
    least = d.loc[d[f"{attack}_value"].idxmin()]
    prior = d[f"{attack}_prior"].mean()
    out = [f"Best utility: {name(best)} — {metric} {best.utility:.4f}, {attack} attack {best[f'{attack}_value']:.4f}."]
    cost = best.utility - least.utility
    out.append(f"Least leakage: {name(least)} — {attack} attack {least[f'{attack}_value']:.4f} "
               f"(prior {prior:.4f}) at utility {least.utility:.4f}, i.e. a cost of {cost:.4f} vs the best.")
    spread = d[f"{attack}_value"].max() - d[f"{attack}_value"].min()
    noise = d[f"{attack}_value_std"].mean()
    if not math.isnan(noise) and spread < 2 * noise:
        out.append(f"Caution: the attack values of all cells lie within {spread:.3f} of each other, less than twice "
                   f"the typical std over seeds ({noise:.3f}): no setting leaks clearly less than another here.")
    cheap = d[d.utility >= best.utility - UTILITY_BUDGET]
    pick = cheap.loc[cheap[f"{attack}_value"].idxmin()]
    out.append(f"Least leakage within {UTILITY_BUDGET} utility of the best: {name(pick)} — attack "
               f"{pick[f'{attack}_value']:.4f}, utility {pick.utility:.4f}.")
    ref = summary[(summary.dataset == dataset) & (summary.method == "local")]
    if len(ref):
        out.append(f"The active party alone (**local**, nothing shared, nothing to attack) reaches "
                   f"{ref.utility.mean():.4f}.")
    if f"{attack}_baseline" in d and d[f"{attack}_baseline"].notna().any():
        base = d[f"{attack}_baseline"].mean()
        out.append(f"An encoder the adversary trains alone (local-SSL baseline) already gives {base:.4f}: "
                   "attack values near it mean the federation itself leaks little beyond that.")
    return out


# -------------------------------------------------------------------------------------- figures
def _draw_tradeoff(ax, summary: pd.DataFrame, d: pd.DataFrame, dataset: str, attack: str, detail: bool) -> None:
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (method, g) in enumerate(d.groupby("method", sort=True)):
        color = colors[i % len(colors)]
        for (family, he), gf in g.groupby(["family", "he"], dropna=False):
            pts = pd.concat([g[(g.defense == "none") & (g.he == he)], gf]) if family != "none" else gf
            pts = pts.drop_duplicates("defense").sort_values("strength", na_position="last")
            ax.errorbar(pts.utility, pts[f"{attack}_value"], xerr=pts.utility_std.fillna(0),
                        yerr=pts[f"{attack}_value_std"].fillna(0), color=color, ls="-" if he == "off" else "--",
                        marker="o", ms=5, capsize=2, lw=1.3, alpha=0.9)
            if detail:
                for _, r in pts.iterrows():
                    if r.defense != "none" or family == "none":
                        short = setting_label(r.defense) if pd.isna(r.strength) or r.defense == "none" \
                            else f"{r.family} {r.strength:g}"
                        ax.annotate(short, (r.utility, r[f"{attack}_value"]), fontsize=7,
                                    xytext=(4, 3), textcoords="offset points", color=color)
        ax.plot([], [], color=color, marker="o", label=method)
    prior = d[f"{attack}_prior"].mean()
    ax.axhline(prior, color="black", ls="--", lw=1, label=f"prior ({prior:.3f})")
    ref = summary[(summary.dataset == dataset) & (summary.method == "local")]
    if len(ref):  # the active party alone: the utility a federation has to beat
        ax.axvline(ref.utility.mean(), color="tab:red", ls="-.", lw=1,
                   label=f"local, active party alone ({ref.utility.mean():.3f})")
    if f"{attack}_baseline" in d and d[f"{attack}_baseline"].notna().any():
        base = d[f"{attack}_baseline"].mean()
        ax.axhline(base, color="gray", ls=":", lw=1.2, label=f"local-SSL baseline ({base:.3f})")
    pts = d[["utility", f"{attack}_value"]].to_numpy()
    front = pareto_front(pts)
    if len(front):
        f = pts[front][np.argsort(pts[front][:, 0])]
        ax.scatter(f[:, 0], f[:, 1], s=160, facecolors="none", edgecolors="black", lw=1.5, zorder=5,
                   label="Pareto front")
    ax.grid(alpha=0.3)


def tradeoff_figure(summary: pd.DataFrame, dataset: str, attack: str, path: Path, setting: str = "") -> Path:
    """Left: the whole range down to the prior; right: zoomed on the cells, labelled by defense."""
    d = summary[(summary.dataset == dataset) & summary[f"{attack}_value"].notna()].copy()
    fig, (full, zoom) = plt.subplots(1, 2, figsize=(12, 5.0), dpi=100, gridspec_kw={"width_ratios": [1, 1.5]})
    _draw_tradeoff(full, summary, d, dataset, attack, detail=False)
    _draw_tradeoff(zoom, summary, d, dataset, attack, detail=True)
    lo = (d[f"{attack}_value"] - d[f"{attack}_value_std"].fillna(0)).min()
    hi = (d[f"{attack}_value"] + d[f"{attack}_value_std"].fillna(0)).max()
    pad = max(0.01, 0.1 * (hi - lo))
    zoom.set_ylim(lo - pad, hi + pad)
    metric = d.metric.iloc[0] if len(d) else "utility"
    for ax in (full, zoom):
        ax.set_xlabel(f"utility: test {metric} (higher is better) →")
    full.set_ylabel(f"{attack} attack performance (lower leaks less)")
    full.set_title("full range, with the prior", fontsize=10)
    zoom.set_title("zoomed on the runs; ringed = Pareto front", fontsize=10)
    zoom.legend(fontsize=8, loc="best")
    where = f" ({setting})" if setting else ""
    fig.suptitle(f"{dataset}{where}: privacy–utility trade-off under the {attack} attack (mean ± std over seeds)")
    fig.tight_layout()
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
                if not pd.isna(r.get(f"{a}_baseline", np.nan)):
                    row[f"{a} − baseline"] = f"{r[f'{a}_value'] - r[f'{a}_baseline']:+.4f}"
        row["ε"] = "–" if pd.isna(r.epsilon) else f"{r.epsilon:.3g}"
        row["train s"] = f"{r.seconds:.1f}"
        rows.append(row)
    return pd.DataFrame(rows).fillna("–")


def epsilon_table(runs: pd.DataFrame) -> pd.DataFrame:
    ok = runs[(runs.status == "ok") & runs.epsilon.notna()]
    if ok.empty:
        return pd.DataFrame()
    g = ok.groupby(["dataset", "method", "defense"]).agg(epsilon=("epsilon", "mean"), delta=("delta", "first"),
                                                         noise_multiplier=("noise_multiplier", "first"))
    return g.reset_index().assign(defense=lambda x: x.defense.map(setting_label))


def he_table(runs: pd.DataFrame) -> pd.DataFrame:
    ok = runs[runs.status == "ok"]
    if ok.empty or (ok.he == "off").all():
        return pd.DataFrame()
    g = ok.groupby(["dataset", "method", "defense", "he"]).agg(
        seconds=("seconds", "mean"), bytes_sent=("bytes_sent", "mean"), he_seconds=("he_seconds", "mean"),
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
    runs, attacks = load_frames(store_path)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarise(runs, attacks)
    n_ok, n_failed = int((runs.status == "ok").sum()), int((runs.status == "failed").sum())
    sweeps = ", ".join(sorted(runs.sweep.dropna().unique()))
    sections: list[tuple[str, list]] = []  # (title, blocks) ; block = ("p", text) | ("img", path) | ("table", df)
    figures: list[Path] = []
    datasets = sorted(runs.dataset.unique())
    atk = attack_names(summary) if not summary.empty else []
    for ds in datasets:
        blocks: list = []
        # one trade-off per attack and per swept setting (e.g. each aligned fraction): comparing
        # cells across different data sizes would mix two effects in one line
        settings = sorted(summary[summary.dataset == ds].swept.unique()) if not summary.empty else []
        for a in atk:
            for i, sw in enumerate(settings):
                sub = summary[summary.swept == sw]
                if not sub[(sub.dataset == ds)][f"{a}_value"].notna().any():
                    continue
                label = ", ".join(f"{k} = {v}" for k, v in json.loads(sw).items())
                if label:
                    blocks.append(("h3", f"{a} attack, {label}"))
                blocks += [("ul", headline(sub, ds, a))]
                suffix = f"_{i}" if len(settings) > 1 else ""
                fig = tradeoff_figure(sub, ds, a, out / f"tradeoff_{ds}_{a}{suffix}.png", label)
                figures.append(fig)
                blocks.append(("img", fig))
        if not atk and not summary.empty:
            d = summary[summary.dataset == ds]
            best = d.loc[d.utility.idxmax()]
            blocks.append(("ul", [f"No attacks in this sweep. Best utility: **{best.method}** with "
                                  f"**{setting_label(best.defense)}** ({best.utility:.4f})."]))
        for key in sorted({c[len("swept_"):] for c in runs.columns if c.startswith("swept_")}):
            fig = size_figure(summary, runs, ds, key, out / f"utility_vs_{key}_{ds}.png")
            if fig is not None:
                figures.append(fig)
                blocks.append(("img", fig))
        if not summary.empty:
            blocks.append(("h3", "Mean ± std over seeds, per cell"))
            blocks.append(("table", cell_table(summary, ds)))
        sections.append((f"{ds}", blocks))
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
    intro = (f"Sweep {sweeps}: {n_ok} runs ok, {n_failed} failed, store `{Path(store_path).name}`. "
             "Attack performance is measured on the passive adversary's own training rows (top-1 accuracy for "
             "multi-class tasks, AUC for binary); lower is better for privacy.")
    md = _render_md(intro, sections, out)
    html_text = _render_html(intro, sections)
    (out / "report.md").write_text(md)
    (out / "report.html").write_text(html_text)
    return [out / "report.md", out / "report.html", *figures]


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
