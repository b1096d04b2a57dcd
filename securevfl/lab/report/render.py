"""Sections → ``report.md`` and a self-contained ``report.html`` (PNGs inlined): the one entry
point, :func:`write_report`, runs store → frames → figures and words → the two documents."""

from __future__ import annotations

import base64
import html
import json
import os
import re
from pathlib import Path

import pandas as pd

from securevfl.errors import UserError
from securevfl.lab import scores
from securevfl.lab.report.figures import audit_figure, encryption_figure, image_grid, size_figure, tradeoff_figure
from securevfl.lab.report.frame import (
    attack_names,
    control_kinds,
    feature_attacks,
    label_attacks,
    load_frames,
    load_sweeps,
    setting_label,
    shows_encryption,
    summarise,
)
from securevfl.lab.report.text import (
    cell_marks,
    cell_table,
    column_notes,
    encryption_headline,
    epsilon_table,
    he_table,
    headline,
    honesty_lines,
    pm,
    recommendation,
    setup_lines,
)
from securevfl.operations import provenance


def _md_table(df: pd.DataFrame) -> str:
    return df.to_markdown(index=False) if not df.empty else "(none)"


def _no_symlink(path: Path) -> Path:
    """``path`` unless it is a symbolic link (left by someone else): the report never writes through one."""
    if path.is_symlink():
        raise UserError(f"report: {path} is a symbolic link; refusing to write through it")
    return path


def _write_new(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` without following a symbolic link there (O_NOFOLLOW where it exists)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(_no_symlink(path), flags, 0o644)
    except OSError as e:
        raise UserError(f"report: cannot write {path} ({e.strerror or e})") from None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def _figure_path(out: Path, *parts: str) -> Path:
    """A figure's path in ``out`` from names that come from the store (dataset, attack, swept key):
    only letters, digits, ``.``, ``_`` and ``-`` survive, so a name like ``../x`` or one with quotes
    cannot leave the folder or break out of an HTML attribute."""
    safe = ["".join(ch if ch.isascii() and (ch.isalnum() or ch in "._-") else "-" for ch in str(p))[:60].lstrip(".")
            or "x" for p in parts]
    return _no_symlink(out / ("_".join(safe) + ".png"))


def write_report(store_path: str | Path, out_dir: str | Path, command: str | None = None,
                 weights: dict[str, float] | None = None) -> list[Path]:
    """Render a sweep store as ``report.md`` + a self-contained ``report.html`` and their figures.

    Args:
        store_path: the sweep's SQLite store.
        out_dir: where the report and its PNG figures go (created if missing).
        command: the command that made the report, recorded in its provenance section.
        weights: C-DCS weight per attack type (:func:`securevfl.lab.scores.parse_weights`); equal if None.

    Returns:
        the paths of ``report.md``, ``report.html`` and every figure, in document order.
    """
    runs, attacks = load_frames(store_path)
    out = Path(out_dir)
    if out.is_symlink():
        raise UserError(f"report --out {out}: is a symbolic link; give a real directory")
    out.mkdir(parents=True, exist_ok=True)
    for name in ("report.md", "report.html"):  # refused before the work, not after it
        _no_symlink(out / name)
    summary = summarise(runs, attacks)
    ok_attacks = attacks[attacks.run_id.isin(runs[runs.status == "ok"].run_id)] if len(attacks) else attacks
    table = scores.score_table(summary, ok_attacks, weights)
    rest: list[tuple[str, list]] = [(f"{ds}", _dataset_blocks(runs, attacks, summary, ds, out, table, weights))
                                    for ds in sorted(runs.dataset.unique())]
    rest += _run_wide_sections(runs, out)
    rest.append(("Provenance", _provenance_blocks(runs, store_path, command)))
    # the first screen is the answer and its plot; definitions, the other ranking and the tables follow
    glance = [("p", _intro(runs, attacks, store_path)), ("ul", [f"[{t}](#{_anchor(t)})" for t, _ in rest]),
              *_glance(summary, table)]
    sections: list[tuple[str, list]] = [("The answer", _answer(summary, table, out, control_kinds(attacks))),
                                        ("At a glance", glance), *rest]
    intro = ""
    _write_new(out / "report.md", _render_md(intro, sections, out))
    _write_new(out / "report.html", _render_html(intro, sections))
    figures = [content for _, blocks in sections for kind, content in blocks if kind == "img"]
    return [out / "report.md", out / "report.html", *figures]


# A section is (title, blocks); a block is ("p", text) | ("ul", lines) | ("h3", title) | ("img", path) | ("table", df).
def _dataset_blocks(runs: pd.DataFrame, attacks: pd.DataFrame, summary: pd.DataFrame, ds: str, out: Path,
                    table: pd.DataFrame, weights: dict[str, float] | None = None) -> list:
    """One dataset's section: its setup, what encryption buys, the attack trade-offs, the defense
    scores, utility against each swept data key, and the per-cell table."""
    blocks: list = [("ul", setup_lines(runs, attacks, ds))]
    if summary.empty:
        return blocks + _size_blocks(summary, runs, ds, out)
    blocks += _score_blocks(summary, table, ds, weights)
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
                              f"**{setting_label(best.defense)}** ({best.utility:.4f}).",
                              *honesty_lines(d, summary, ds)]))
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
        he_varies = summary[summary.dataset == ds].he.nunique() > 1
        what = "What encryption buys" if he_varies else "What feature-side defenses buy (no HE in this sweep)"
        blocks.append(("h3", f"{what}: {f} (passive features) beside "
                             f"{labels_[0] if labels_ else 'no label attack'} (labels)"))
        fig = encryption_figure(summary, ds, f, labels_[0] if labels_ else None,
                                _figure_path(out, "encryption", ds, f), kinds)
        blocks.append(("img", fig))  # the plot first: it is what the first screen must show
        blocks.append(("ul", encryption_headline(summary, ds, f, labels_[0] if labels_ else None)))
        grid = image_grid(attacks, ds, f, _figure_path(out, "reconstructions", ds, f))
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
        # a cell at chance is no point of a trade-off: its "privacy" is a model that learned nothing
        drawn = sub[~sub.chance.astype(bool)] if "chance" in sub else sub
        if not drawn[drawn.dataset == ds][f"{a}_value"].notna().any():
            continue
        fig = tradeoff_figure(drawn, ds, a, _figure_path(out, "tradeoff", ds, f"{a}{suffix}"), label, kinds.get(a, ""))
        blocks.append(("img", fig))
    return blocks


def _answer(summary: pd.DataFrame, table: pd.DataFrame, out: Path, kinds: dict[str, str]) -> list:
    """Per dataset: which defense to pick, from what to what and at what cost (or why none), then the
    trade-off plot of the attack it is about (text.recommendation)."""
    blocks: list = []
    for ds in sorted(summary.dataset.unique()) if len(summary) else []:
        picked: dict = {}
        lines, attack = recommendation(summary, table, ds, picked)
        blocks.append(("ul", [f"**{ds}**: {lines[0]}", *lines[1:]] if len(summary.dataset.unique()) > 1 else lines))
        if attack is None:
            continue
        d = summary[(summary.dataset == ds)]
        drawn = d[~d.chance.astype(bool)] if "chance" in d else d
        settings = sorted(drawn[drawn[f"{attack}_value"].notna()].swept.unique())
        if not settings:
            continue
        sw = settings[0]  # one data setting per plot (the others are in the dataset's section)
        data_axes = json.dumps({k: v for k, v in json.loads(sw).items() if ":" not in k}, sort_keys=True)
        sub = drawn[(drawn.swept == sw) | ((drawn.method == "local") & (drawn.swept == data_axes))]
        label = ", ".join(f"{k} = {v}" for k, v in json.loads(sw).items())
        blocks.append(("img", tradeoff_figure(sub, ds, attack, _figure_path(out, "answer", ds, attack), label,
                                              kinds.get(attack, ""), picked=picked or None)))
    return blocks or [("p", "No finished runs.")]


def _anchor(title: str) -> str:
    """The HTML id of a section title (and GitHub's Markdown anchor for simple titles)."""
    return "".join(ch if ch.isalnum() or ch == "-" else "" for ch in title.lower().replace(" ", "-"))


def _glance(summary: pd.DataFrame, table: pd.DataFrame) -> list:
    """The first screen's verdicts per dataset: cells worse than not federating, cells at chance,
    the top cells by C-DCS and by the normalised score, and where the two rankings disagree."""
    lines: list[str] = []
    for ds in sorted(summary.dataset.unique()) if len(summary) else []:
        d = summary[summary.dataset == ds]
        lines += [f"**{ds}**: {x}" for x in honesty_lines(d, summary, ds)]
        t = table[table.dataset == ds] if len(table) else table
        if len(t):
            ranked = scores.eligible(t.merge(d[[*scores.CELL, "chance", "beats_local"]], on=scores.CELL))
            for col in ("C-DCS", "normalised C-DCS"):
                r = ranked.dropna(subset=[col])
                if len(r):
                    top = r.loc[r[col].idxmax()]
                    lines.append(f"**{ds}**: best {col} (worst-case attacks; among cells above chance and above "
                                 f"`local`): {scores.cell_name(top)}, {col} {top[col]:.3f}.")
    lines += scores.disagreements(table) if len(table) else []
    return [("ul", lines or ["No finished runs."])]


def _score_blocks(summary: pd.DataFrame, table: pd.DataFrame, ds: str,
                  weights: dict[str, float] | None = None) -> list:
    """Defense scores of one dataset: the ranking by C-DCS beside the normalised one, and which
    attack parameters won the worst-case search."""
    t = table[table.dataset == ds] if len(table) else table
    if t.empty:
        return []
    d = summary[summary.dataset == ds]
    t = t.merge(d[[*scores.CELL, "utility", "utility_std", "seeds", "chance", "beats_local"]], on=scores.CELL)
    t = t.sort_values(["rank C-DCS", "rank normalised"])
    cols = [c for c in t.columns if c.startswith(("DCS ", "T-DCS "))]
    view = pd.DataFrame({
        "rank": t["rank C-DCS"].astype(int), "cell": [scores.cell_name(r) for _, r in t.iterrows()],
        "utility (MP)": [pm(r.utility, r.utility_std, int(r.seeds)) for _, r in t.iterrows()],
        "MP*": t["MP*"].round(4), **{c: t[c].round(3) for c in cols},
        "C-DCS": t["C-DCS"].round(3), "normalised C-DCS": t["normalised C-DCS"].round(3),
        "rank normalised": t["rank normalised"].astype("Int64"),
        "marks": [cell_marks(r) for _, r in t.iterrows()]})
    blocks: list = [("h3", "Defense scores: DCS, T-DCS, C-DCS (VFLAIR) and the control-normalised C-DCS"),
                    ("p", "DCS = 1 / (1 + √(0.5·d_AP² + 0.5·d_MP²)), d_AP = max(AP − 0, 0), d_MP = max(MP* − MP, 0); "
                          "MP* is the same method's undefended cell; AP is each attack's worst case over its "
                          "parameter search, in \"higher leaks more\" form (AUC as max(AUC, 1 − AUC)); T-DCS is the "
                          "worst attack of a type (LI label inference, FR feature reconstruction, TB targeted "
                          "backdoor, NTB untargeted), C-DCS their "
                          + ("mean" if weights is None else "mean weighted " + ", ".join(
                              f"{scores.TYPE_SHORT[k]} {w:g}" for k, w in weights.items()) + " (`--weights`)")
                          + ". The normalised score uses AP over the "
                          "attack's control (and local baseline), at least 0. Higher is better. A marked cell (worse "
                          "than not federating, or at chance) ranks below every unmarked one, whatever its score. "
                          "See docs/scores.md."),
                    ("table", view)]
    won = [c for c in t.columns if c.endswith(" won") or (c.startswith("worst ") and c.endswith(" attack"))]
    searched = any(t[c].astype(str).str.startswith("try ").any() for c in won)
    wt = t[[*scores.CELL, *won]]
    blocks += [("h3", "Worst-case attacker: the winning parameters per cell and attack, and the worst attack per type"),
               ("table", pd.DataFrame({"cell": [scores.cell_name(r) for _, r in wt.iterrows()],
                                       **{c: wt[c].fillna("–") for c in won}}))]
    if not searched:
        blocks.append(("p", "No `attack_search` in this sweep: each attack ran with its sweep-file parameters "
                            "only, so the worst case is over the attacks of a type alone."))
    blocks += [("ul", scores.disagreements(t))] if scores.disagreements(t) else []
    return blocks


def _provenance_blocks(runs: pd.DataFrame, store_path: str | Path, command: str | None) -> list:
    """What produced this report: the code, the command, and each sweep file with its hash and text."""
    commit = provenance.git_commit()
    seeds = ", ".join(str(int(s)) for s in sorted(runs.seed.dropna().unique()))
    stored = runs["versions"].dropna() if "versions" in runs else []
    versions = sorted({json.loads(v).get("securevfl", "?") for v in stored})
    lines = [f"Report made by securevfl {provenance.version()}, git commit {commit or 'none (not a git checkout)'}, "
             f"with `{command or f'securevfl report {store_path} --out DIR'}`.",
             f"Store `{Path(store_path).name}`: {len(runs)} runs; seeds {seeds}"
             + (f"; securevfl versions in the runs: {', '.join(versions)}" if versions else "") + "; "
             + _time_taken(runs) + "."]
    nodes = runs["node"].dropna().value_counts() if "node" in runs else pd.Series(dtype=int)
    if len(nodes):  # where each run ran (a Ray cluster's nodes; issue 53)
        lines.append("Runs per node: " + "; ".join(f"`{n}`: {c}" for n, c in sorted(nodes.items())) + ".")
    blocks: list = [("ul", lines)]
    recorded = load_sweeps(store_path)
    if not recorded:
        blocks.append(("p", "The store records no sweep file (made by an older securevfl): the sweep file, its "
                            "hash and the sweep command are unknown."))
    for sw in recorded:
        blocks += [("ul", [f"Sweep **{sw['name']}** from `{sw['path']}` (sha256 `{sw['sha256']}`), run with "
                           f"`{sw['command']}` by securevfl {sw['version']}, git commit "
                           f"{sw['git_commit'] or 'none (not a git checkout)'}."]),
                   ("code", sw["text"])]
    return blocks


def _time_taken(runs: pd.DataFrame) -> str:
    """How long the sweep took: training seconds summed over runs, and the wall time from the first
    stored row's start to the last row (attacks and resumed gaps included)."""
    train = pd.to_numeric(runs.seconds, errors="coerce").sum()
    done = pd.to_numeric(runs.get("finished_at"), errors="coerce").dropna()
    if done.empty:
        return f"training took {train:.0f} s in all"
    first = runs.loc[done.idxmin()]
    wall = done.max() - done.min() + (float(first.seconds) if pd.notna(first.seconds) else 0.0)
    return f"training took {train:.0f} s in all; {wall / 60:.1f} min from the first run to the last stored row"


def _size_blocks(summary: pd.DataFrame, runs: pd.DataFrame, ds: str, out: Path) -> list:
    """Utility against each swept data key (e.g. the aligned fraction)."""
    blocks: list = []
    for key in sorted({c[len("swept_"):] for c in runs.columns if c.startswith("swept_") and ":" not in c}):
        fig = size_figure(summary, runs, ds, key, _figure_path(out, "utility_vs", key, ds))
        if fig is not None:
            blocks.append(("img", fig))
    return blocks


def _run_wide_sections(runs: pd.DataFrame, out: Path | None = None) -> list[tuple[str, list]]:
    """The sections over all datasets: ε (with the one-run audit's lower bound), HE cost, failed runs."""
    sections: list[tuple[str, list]] = []
    eps = epsilon_table(runs)
    if not eps.empty:
        audit = audit_figure(runs, _figure_path(out, "epsilon_audit")) if out is not None else None
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
                                "protect labels from a passive party (that is what the defenses are for). "
                                "hiding_bits: κ, the bits by which every mask exceeds the public bound on what it "
                                "hides (statistical hiding 2^-κ); flooding_bits: κ_f, the same for the CKKS flood "
                                "over the slot noise (docs/he-protocol.md)."),
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
    lines = ["# securevfl report", ""] + ([intro, ""] if intro else [])
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
            elif kind == "code":
                lines += ["```yaml", content.rstrip("\n"), "```", ""]
            else:
                lines += [content, ""]
    return "\n".join(lines)


_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")


def _inline_md(text: str) -> str:
    """The Markdown our blocks use, as HTML: **bold**, `code` (plain) and [links](#anchor)."""
    parts = html.escape(text).split("**")
    out = "".join(f"<b>{p}</b>" if i % 2 else p for i, p in enumerate(parts)).replace("`", "")
    return _LINK.sub(lambda m: f"<a href='{html.escape(m.group(2), quote=True)}'>{m.group(1)}</a>", out)


def _render_html(intro: str, sections: list) -> str:
    body = ["<h1>securevfl report</h1>" + (f"<p>{_inline_md(intro)}</p>" if intro else "")]
    for title, blocks in sections:
        body.append(f"<h2 id='{_anchor(title)}'>{html.escape(title)}</h2>")
        for kind, content in blocks:
            if kind == "ul":
                body.append("<ul class='headline'>" + "".join(f"<li>{_inline_md(s)}</li>" for s in content)
                            + "</ul>")
            elif kind == "img":
                data = base64.b64encode(content.read_bytes()).decode()
                body.append(f"<img alt='{html.escape(content.stem, quote=True)}' src='data:image/png;base64,{data}'>")
            elif kind == "table":
                # one line per cell ("0.903 ± 0.012" never wraps), a wide table scrolls in its own box
                body.append("<div class='scroll'>" + content.to_html(index=False, border=0, na_rep="–", escape=True)
                            + "</div>" if not content.empty else "<p>(none)</p>")
            elif kind == "h3":
                body.append(f"<h3>{html.escape(content)}</h3>")
            elif kind == "code":
                body.append(f"<pre>{html.escape(content)}</pre>")
            else:
                body.append(f"<p>{_inline_md(content)}</p>")
    style = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:1.2em auto;padding:0 1em;color:#222}"
             "h1{margin:.2em 0}h2{border-bottom:1px solid #ddd;margin-top:1.4em}"
             "ul.headline{background:#f5f7fa;border-left:4px solid #3b6ea5;padding:.6em 1.6em;margin:.6em 0}"
             "img{max-width:100%;height:auto}table{border-collapse:collapse;font-size:13px;margin:.5em 0}"
             "td,th{border-bottom:1px solid #e3e3e3;padding:3px 8px;text-align:left;white-space:nowrap}"
             "th{background:#f0f0f0}.scroll{overflow-x:auto}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>securevfl report</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>")
