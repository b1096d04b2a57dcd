"""The methods report (issue 42): each paper's headline comparison beside ours, from one store.

A *claims file* (``sweeps/methods/claims.yaml``) lists, per method, the paper's comparison (its
baselines and their published differences), the sweep that re-runs it, the swept key whose values
form the regime map and the value that is the paper's own setting. For each comparison we pair the
runs by seed (the same partition, initialisation and batches for both arms) and report the mean
paired difference with its 95 % t-interval. A verdict says how much of the paper's effect the interval
shows, in the direction of the paper's difference P (:func:`.stats.verdict`): *reproduced* (it holds P
and excludes 0), *larger than the paper's*, *a smaller effect* (above 0, below P), *no effect* (it
holds 0, excludes P), *the opposite* (below 0), or *unresolved* (it holds both). A method's verdict
is its comparisons' common one, or each comparison's, and where the paper's effect is not reproduced
at its setting, the swept values where it is. The claims file can add
a ``why`` sentence whose ``{fields}`` are filled from the measured step counters, so the explanation
quotes the run and never a typed-in number.

Flow as in the sweep report: store → tidy frame (one row per run with its counters) → paired table
→ figure and sentences → ``report.md`` + ``report.html``.

Split as the main report is: :mod:`.claims` (the claims file), :mod:`.frame` (store → tidy frame),
:mod:`.stats` (paired differences and verdicts), :mod:`.text` (sentences and tables), :mod:`.figures`
(the regime figure); this module writes the report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from securevfl.errors import UserError
from securevfl.lab.report import render
from securevfl.lab.report.frame import load_frames
from securevfl.lab.report.methods.claims import (
    CLAIM_KEYS,
    COMPARISON_KEYS,
    MAX_FORMAT_NUMBER,
    POWER,
    REFERENCE_SUFFIX,
    REQUIRED_KEYS,
    ROWS_KEY,
    SUBSETS,
    _fmt,
    _vs,
    load_claims,
)
from securevfl.lab.report.methods.figures import (
    regime_figure,
)
from securevfl.lab.report.methods.frame import (
    arm,
    counters,
    method_frame,
    sweep_members,
)
from securevfl.lab.report.methods.stats import (
    _authors_rows,
    _same,
    claim_runs,
    claim_verdict,
    comparison_table,
    detectable,
    method_verdict,
    ours,
    paired,
    pairs,
    references,
    rows_runs,
    rows_table,
    theirs,
    verdict,
)
from securevfl.lab.report.methods.text import (
    _diff,
    _label,
    _shown,
    counter_table,
    fill,
    headline_counters,
    rows_sentence,
    sentence,
)

__all__ = ["CLAIM_KEYS", "COMPARISON_KEYS", "MAX_FORMAT_NUMBER", "POWER", "REFERENCE_SUFFIX",
           "REQUIRED_KEYS", "ROWS_KEY", "SUBSETS", "arm", "claim_runs", "claim_verdict", "comparison_table",
           "counter_table", "counters", "detectable", "fill", "headline_counters", "load_claims",
           "method_frame", "method_verdict", "ours", "paired", "pairs", "references", "regime_figure",
           "rows_runs", "rows_sentence", "rows_table", "sentence", "sweep_members", "theirs", "verdict",
           "write_methods_report"]


def sample_of(runs: pd.DataFrame, claim: dict) -> str:
    """The sample a claim's verdict rests on: the rows its runs drew (dataset and file), with the training
    rows at the paper's setting, and the claim's ``source`` (where the rows come from, their time span),
    which the store cannot know."""
    if runs.empty or "sample" not in runs:
        return "–"
    names = sorted(set(runs["sample"].astype(str)))
    key = f"swept_{claim['regime']}" if claim.get("regime") else None
    head = runs
    if key and key in runs and "headline" in claim:
        head = runs[[_same(v, claim["headline"]) for v in runs[key]]]
    rows = head.train_total.dropna()
    told = f", {int(rows.median()):,} training rows" if len(rows) else ""
    source = f" ({claim['source']})" if claim.get("source") else ""
    return " + ".join(names) + told + source


def one_sample_sentence(per_claim: list[str]) -> str:
    """Which verdicts rest on one sample only: every claim whose runs drew one dataset file."""
    single = [s for s in per_claim if s != "–" and " + " not in s]
    if not single:
        return "Each verdict rests on more than one sample."
    return (f"{len(single)} of {len([s for s in per_claim if s != '–'])} verdicts rest on one sample only (the one "
            "named beside each): a verdict is a statement about that sample, and another sample of the same source "
            "can move it (issue 65 re-ran three comparisons on other real rows and they moved beyond seed noise).")


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
                            "paper's setting": _fmt(claim.get("headline", "–")), "sample": "–"})
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
            "paper's setting": f"{claim['regime']} {_fmt(claim['headline'])}" if claim.get("regime") else "–",
            "sample": sample_of(claim_runs(frame, claim), claim)})
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
    intro = ("Each paper's headline comparison re-run with the current code on real rows. A verdict says how "
             "much of the paper's effect the 95 % interval of the seed-paired difference shows: the paper's effect "
             "**reproduced** (the interval holds the paper's difference and excludes zero), **larger** than the "
             "paper's, **a smaller effect** (above zero, below the paper's difference), **no effect** (it holds zero "
             "and excludes the paper's difference), **the opposite** (below zero), or **unresolved** (it holds both). "
             "An arm of a sweep with a learning-rate grid (`train.lr_grid`) chooses its rate on a stratified 20 % "
             "of the labeled rows it trains on, drawn the same way for every arm, so arms training on the same "
             "labeled rows validate on the same rows; an arm that trains on more (`local` with the active party's "
             "labels on unaligned rows) validates on its own larger pool; each stage of a multi-stage method "
             "chooses its own. Entity Augmentation's sweeps have no grid: every arm trains at the paper's rate. "
             "*Detectable*: the smallest true difference our seeds find with 80 % power. "
             "Where the authors released code, their code is one more arm on the same rows and seeds "
             "(benchmarks/reference/).")
    all_sections = [("The answer", [("table", pd.DataFrame(answers)),
                                    ("p", "Each claim's section below gives the measured reason, the regime map and "
                                          "the step counters. "
                                          + one_sample_sentence([a["sample"] for a in answers]))]),
                    *sections,
                    ("Provenance", render._provenance_blocks(runs, store_path, command))]
    md = render._render_md(intro, all_sections, out).replace("# securevfl report", "# securevfl methods report", 1)
    render._write_new(out / "report.md", md)
    html = render._render_html(intro, all_sections).replace("securevfl report<", "securevfl methods report<")
    render._write_new(out / "report.html", html)
    return [out / "report.md", out / "report.html", *figures]
