"""Sections → ``report.md`` and a self-contained ``report.html`` (PNGs inlined): the one entry
point, :func:`write_report`, runs store → frames → figures and words → the two documents."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

import pandas as pd

from securevfl.lab.report.figures import audit_figure, encryption_figure, image_grid, size_figure, tradeoff_figure
from securevfl.lab.report.frame import (
    attack_names,
    control_kinds,
    feature_attacks,
    label_attacks,
    load_frames,
    setting_label,
    shows_encryption,
    summarise,
)
from securevfl.lab.report.text import (
    cell_table,
    column_notes,
    encryption_headline,
    epsilon_table,
    he_table,
    headline,
    setup_lines,
)


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
    sections += _run_wide_sections(runs, out)
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


def _run_wide_sections(runs: pd.DataFrame, out: Path | None = None) -> list[tuple[str, list]]:
    """The sections over all datasets: ε (with the one-run audit's lower bound), HE cost, failed runs."""
    sections: list[tuple[str, list]] = []
    eps = epsilon_table(runs)
    if not eps.empty:
        audit = audit_figure(runs, out / "epsilon_audit.png") if out is not None else None
        sections.append(("Differential privacy (ε at the reported δ; label-DP of the active party's training labels: "
                         "dp = DP-SGD, rr = randomized response)",
                         [("table", eps)] + ([("p", "Audited ε ≥: the one-run audit's empirical lower bound "
                                                    "(95 % confidence, mean over seeds; docs/audit.md). Below the "
                                                    "claimed ε is evidence, not proof; above it refutes the claim."),
                                              ("img", audit)] if audit else [])))
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
