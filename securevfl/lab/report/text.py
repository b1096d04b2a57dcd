"""Frames → the report's words and tables: computed sentences (headline, what encryption buys,
setup), the per-cell table with its column notes, the ε and HE-cost tables."""

from __future__ import annotations

import json
import math
import numbers

import numpy as np
import pandas as pd

from securevfl.federation import DEFAULT_LR
from securevfl.lab import scores
from securevfl.lab.report.frame import (
    _num,
    attack_names,
    defense_effects,
    is_feature_attack,
    setting_label,
)

UTILITY_BUDGET = 0.02
"""Utility loss a user would trade for privacy in the headline ("least leakage within 0.02")."""


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
    full, d = d, scores.eligible(d)  # "best" picks only among cells above chance and above local
    out = []
    if len(d) < len(full):
        left = full[~full.index.isin(d.index)]
        out.append(f"The picks below choose among the {len(d)} cells above chance and above the active party "
                   f"alone; left out: {_cells(left)}.")
    if d.empty:
        return out + ["No cell is above chance and above the active party alone, so no best trade-off is picked."]
    best = d.loc[d.utility.idxmax()]
    if clear.empty:
        why = (f"the {'leakage' if has_leak else 'attack'} values of all cells lie within {spread:.3g} of each "
               + (f"other (typical std over {seeds} seeds: {noise:.3g})" if seeds > 1 else
                  "other (n = 1: a single seed, so no seed noise to compare with)"))
        out.append(f"**Caution: no defense setting moves the {attack} attack by more than twice its seed std**; "
                   f"{why}. No setting here leaks clearly less than another, so no least-leakage pick is made.")
        out.append(f"Best utility: {name(best, bold=False)} — {metric} {best.utility:.3g}, {attack} attack "
                   f"{best[value]:.3g}.")
    else:
        clear = clear[clear.defense.isin(d.defense) & clear.method.isin(d.method)]
        for _, e in clear.head(4).iterrows():
            verb = "lowers" if e.delta < 0 else "raises"
            cost = (f"a utility cost of {e.utility_cost:.3g}" if e.utility_cost >= 0
                    else f"a utility gain of {-e.utility_cost:.3g}")
            out.append(f"Trade-off: defense **{setting_label(e.defense)}** {verb} the {attack} attack on "
                       f"**{e.method}** by {abs(e.delta):.3g} (more than twice the seed std, {e.noise:.3g}, over "
                       f"{seeds} seeds) at {cost}.")
        if len(clear) > 4:
            out.append(f"({len(clear) - 4} more defended cells move the attack beyond noise; see the table.)")
        out.append(f"Best utility: {name(best)} — {metric} {best.utility:.3g}, {attack} attack {best[value]:.3g}.")
        least = d.loc[d[score].idxmin()]
        out.append(f"Least leakage: {name(least)} — {'leakage' if has_leak else 'attack'} {least[score]:+.3g} "
                   f"(attack {least[value]:.3g}) at utility {least.utility:.3g}, a cost of "
                   f"{best.utility - least.utility:.3g} vs the best.")
        cheap = d[d.utility >= best.utility - UTILITY_BUDGET]
        pick = cheap.loc[cheap[score].idxmin()]
        out.append(f"Least leakage within {UTILITY_BUDGET} utility of the best: {name(pick)} — "
                   f"{'leakage' if has_leak else 'attack'} {pick[score]:+.3g}, utility {pick.utility:.3g}.")
    if has_leak:
        undefended = full[full.family == "none"]  # every undefended cell, picked or not
        parts = ", ".join(f"{r.method} {pm(r[leak], r[f'{leak}_std'], seeds, '+.3g')}"
                          for _, r in undefended.iterrows())
        ctl = d[f"{attack}_control"].mean()
        base = d[f"{attack}_baseline"].mean() if d[f"{attack}_baseline"].notna().any() else float("nan")
        base_name = "mean predictor" if is_feature_attack(attack) else "local-SSL baseline"
        refs = f"control ({control_kind or 'same attack, untrained encoder'}) {ctl:.3g}" + ("" if math.isnan(base) else
                                                                        f", {base_name} {base:.3g}")
        out.append(f"Leakage without a defense (attack − max(control, baseline), {_over(seeds)}): "
                   f"{parts}; {refs}; prior {d[f'{attack}_prior'].mean():.3g}.")
    ref = summary[(summary.dataset == dataset) & (summary.method == "local")]
    if len(ref):
        out.append(f"The active party alone (**local**, nothing shared, nothing to attack) reaches "
                   f"{ref.utility.mean():.3g}.")
    return out


def _over(seeds: int) -> str:
    return "n = 1, a single seed: no error bar" if seeds <= 1 else f"mean ± std over {seeds} seeds"


def pm(mean: object, std: object, n: int, fmt: str = ".3g") -> str:
    """``mean ± std``, or ``mean (n = 1)`` for a single seed (never ``± nan``); – without a mean."""
    m = _num(mean)
    if math.isnan(m):
        return "–"
    sd = _num(std)
    if n <= 1 or math.isnan(sd):
        return f"{m:{fmt}} (n = {max(n, 1)})"
    return f"{m:{fmt}} ± {sd:.3g}"


def _cells(d: pd.DataFrame) -> str:
    return "; ".join(f"{r.method} {setting_label(r.defense)}{'' if r.he == 'off' else ' HE ' + r.he} "
                     f"({r.utility:.3g})" for _, r in d.iterrows())


def honesty_lines(d: pd.DataFrame, summary: pd.DataFrame, dataset: str) -> list[str]:
    """How many cells are worse than the active party alone or at chance, and which: they are left
    out of every "best" pick and of the trade-off lines."""
    out = []
    fed = d[d.method != "local"]
    local = summary[(summary.dataset == dataset) & (summary.method == "local")]
    if local.empty:
        out.append("No `local` run (the active party alone) in this sweep: whether federating beats not "
                   "federating is not measured here.")
    elif len(fed):
        worse = fed[fed.beats_local == False]  # noqa: E712 (object column: True / False / None)
        out.append(f"**{len(worse)} of {len(fed)} cells are worse than not federating** (utility not above the "
                   f"active party alone, local {local.utility.mean():.3g})"
                   + (f": {_cells(worse)}." if 0 < len(worse) <= 8 else "."))
    chance = d[d.chance.astype(bool)]
    if len(chance):
        prior = chance.utility_prior.mean()
        are = "cell is" if len(chance) == 1 else "cells are"
        out.append(f"**{len(chance)} {are} at chance** (utility within noise of guessing, prior "
                   f"{prior:.3g}): the model learned nothing; left out of the trade-off lines: {_cells(chance)}.")
    return out


def he_cost_label(r, d: pd.DataFrame) -> str:
    """`ckks 9.8× s/step, 3.1 MB/step`: a cell's HE cost beside the same cell without HE."""
    if r.he == "off":
        return ""
    ref = d[(d.method == r.method) & (d.defense == r.defense) & (d.swept == r.swept) & (d.he == "off")]
    ratio = (f"{r.step_s / ref.step_s.iloc[0]:.1f}× s/step" if len(ref) and _num(ref.step_s.iloc[0]) > 0
             and not math.isnan(_num(r.step_s)) else f"{_num(r.step_s):.3g} s/step")
    return f"{r.he} {ratio}, {_num(r.mb_step):.2g} MB/step"


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
            lab = (f"; {label} label attack {ref[f'{label}_value']:.3g} → {r[f'{label}_value']:.3g} "
                   "(HE does not protect labels)")
        out.append(f"**{r.method}**, defense {setting_label(r.defense)}: HE **{r.he}** moves {feature} R² "
                   f"{ref[f'{feature}_value']:.3g} → {r[f'{feature}_value']:.3g} ({move:+.3g}{beyond}; control "
                   f"{r[f'{feature}_control']:.3g}, mean predictor {r[f'{feature}_prior']:.3g}) at "
                   f"{he_cost_label(r, d)}, utility {ref.utility:.3g} → {r.utility:.3g}{lab}.")
    feat = d[d.feature_side.astype(bool)]
    for (method, he), g in feat.groupby(["method", "he"]):
        strongest = g.loc[g[f"{feature}_value"].idxmin()]
        ref = d[(d.method == method) & (d.he == he) & (d.defense == "none") & (d.swept == strongest.swept)]
        if ref.empty:
            continue
        ref = ref.iloc[0]
        eps = ("" if pd.isna(strongest.feature_epsilon) else
               f" (feature-level ε {strongest.feature_epsilon:.3g} at δ 1e-5 per passive row)")
        out.append(f"**{method}**, HE {he}: **{setting_label(strongest.defense)}**{eps} brings {feature} R² "
                   f"{ref[f'{feature}_value']:.3g} → {strongest[f'{feature}_value']:.3g} (control "
                   f"{strongest[f'{feature}_control']:.3g}) at utility {ref.utility:.3g} → {strongest.utility:.3g}.")
    return out or [f"No cell pairs an HE mode or a feature-side defense with its undefended, unencrypted twin "
                   f"for {feature}."]


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
        n = int(r.seeds)
        row["seeds"] = n
        row[f"utility ({r.metric})"] = pm(r.utility, r.utility_std, n)
        row["marks"] = cell_marks(r)
        for a in attack_names(summary):
            if not pd.isna(r.get(f"{a}_value", np.nan)):
                na = int(_num(r.get(f"{a}_attack_seeds")) if not math.isnan(_num(r.get(f"{a}_attack_seeds"))) else n)
                flip = " (inverted: read as 1 − AUC)" if _num(r.get(f"{a}_inverted")) > 0.5 else ""
                row[a] = pm(r[f"{a}_value"], r[f"{a}_value_std"], na) + flip
                row[f"{a} control"] = pm(r.get(f"{a}_control"), r.get(f"{a}_control_std"), na)
                row[f"{a} baseline"] = "–" if pd.isna(r.get(f"{a}_baseline", np.nan)) else f"{r[f'{a}_baseline']:.3g}"
                row[f"{a} leakage"] = pm(r.get(f"{a}_leakage"), r.get(f"{a}_leakage_std"), na, "+.3g")
        row["ε"] = "–" if pd.isna(r.epsilon) else f"{r.epsilon:.3g}"
        if "epsilon_audit" in summary and summary.epsilon_audit.notna().any():  # the audit's bound, beside the claim
            row["audited ε ≥"] = "–" if pd.isna(r.epsilon_audit) else f"{r.epsilon_audit:.3g}"
        if summary.feature_epsilon.notna().any():
            row["feature ε"] = "–" if pd.isna(r.feature_epsilon) else f"{r.feature_epsilon:.3g}"
        row["train s"] = f"{r.seconds:.1f}"
        attack_s = [_num(r.get(f"{a}_seconds")) for a in attack_names(summary)]
        attack_s = [x for x in attack_s if not math.isnan(x)]
        if attack_s:  # an attack with its control and baseline can cost more than the training it attacks
            row["attacks s"] = f"{sum(attack_s):.1f}"
        rows.append(row)
    return pd.DataFrame(rows).astype(object).fillna("–")


def cell_marks(r: pd.Series) -> str:
    """A cell's honesty marks: at chance, worse than the active party alone."""
    marks = []
    if bool(r.get("chance", False)):
        marks.append("at chance")
    if r.get("beats_local") is False:
        marks.append("worse than not federating")
    return ", ".join(marks) or "–"


def column_notes(summary: pd.DataFrame, dataset: str) -> list[str]:
    """What every column of the cell table means."""
    d = summary[summary.dataset == dataset]
    metric = d.metric.iloc[0] if len(d) else "utility"
    notes = ["`seeds`: runs the cell's mean ± std rests on (each error bar in the plots, too).",
             f"`utility ({metric})`: the federation's test {metric}, mean ± std over seeds (n = 1: one seed, "
             "no error bar).",
             "`marks`: *at chance*: utility within 2 × max(seed std, the standard error of guessing on the test "
             "rows) of the majority-class rate (AUC 0.5); *worse than not federating*: utility not above the "
             "active party alone (`local`) on the same data."]
    for a in attack_names(summary):
        if is_feature_attack(a):
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
    if "epsilon_audit" in d and d.epsilon_audit.notna().any():
        notes.append("`audited ε ≥`: the one-run audit's empirical ε lower bound (95 %, mean over seeds; "
                     "docs/audit.md); above ε refutes the claim, below it is evidence, not proof.")
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
             f"bottom models {model['bottom']} (cut width {model['cut_dim']}){_head_text(model)}; methods "
             f"{', '.join(sorted(ok.method.unique()))}; seeds {', '.join(str(s) for s in sorted(ok.seed.unique()))}."]
    at = attacks[(attacks.dataset == dataset) & attacks.run_id.isin(ok.run_id)] if len(attacks) else attacks
    for name, g in at.groupby("attack") if len(at) else []:
        params = json.loads(g.params.iloc[0])
        adv = g.adversary.iloc[0]
        if name.startswith("mc"):
            ssl = {m: json.loads(x).get("epochs") for m, x in zip(g.method, g.baseline_ssl, strict=True)
                   if json.loads(x)}
            ssl_text = ", ".join(f"{m} {e}" for m, e in sorted(ssl.items())) or "–"
            lines.append(f"Attack **{name}**: the passive party `{adv}` completes its bottom model with a head "
                         f"and trains the {g.finetunes.iloc[0]}: {params.get('steps')} steps of "
                         f"{'MixMatch' if name != 'mc-plain' else 'supervised training'} on "
                         f"{_count(g.n_aux.iloc[0])} labeled auxiliary rows of its own (balanced by class); "
                         f"local-SSL baseline: SimSiam on all the adversary's rows, as many epochs as the method's "
                         f"own SSL stage, 10 without one ({ssl_text}).")
        elif is_feature_attack(name):
            aux = (f"knows the passive features of {_count(g.n_aux.iloc[0])} aligned rows and trains a decoder from"
                   if name == "fr" else "knows no passive row; fits a generator from its own features and a "
                   "surrogate of the passive bottom model to")
            lines.append(f"Attack **{name}**: the active party attacks `{adv}`'s features: it {aux} what it "
                         "observes per row (the released rows with HE off, a_P = t·W_P with HE on); scored by "
                         "R² on the other aligned training rows.")
        else:
            lines.append(f"Attack **{name}**: scores the gradients the passive party `{adv}` received "
                         "(under HE: the rows it decrypts with its own key).")
    return lines


def _head_text(model: dict) -> str:
    """The head, when it is not the default split head (aggVFL: the bottoms output class logits)."""
    return "; agg head (summed class logits, the cut width is the class count)" if model.get("head") == "agg" else ""


def epsilon_table(runs: pd.DataFrame) -> pd.DataFrame:
    ok = runs[(runs.status == "ok") & runs.epsilon.notna()]
    if ok.empty:
        return pd.DataFrame()
    keys = ["dataset", "method", "defense"]
    g = ok.groupby(keys).agg(epsilon=("epsilon", "mean"), delta=("delta", "first"),
                             noise_multiplier=("noise_multiplier", "first"))
    if "epsilon_audit" in ok and ok.epsilon_audit.notna().any():  # mean over seeds of per-run lower bounds
        g["audited ε ≥"] = ok.groupby(keys).epsilon_audit.mean()
    if "privacy_status" in ok and ok.privacy_status.notna().any():  # a fixed mechanism seed voids ε: say so
        g["status"] = ok.groupby(keys).privacy_status.first().fillna("private")
    out = g.reset_index().assign(defense=lambda x: x.defense.map(setting_label))
    # "–" where a column does not apply (rr has no noise multiplier; a run without an audit no bound)
    for col in ("noise_multiplier", "audited ε ≥"):
        if col in out:
            out[col] = [f"{v:.3g}" if pd.notna(v) else "–" for v in out[col]]
    return out


def he_table(runs: pd.DataFrame) -> pd.DataFrame:
    ok = runs[runs.status == "ok"]
    if ok.empty or (ok.he == "off").all():
        return pd.DataFrame()
    steps = pd.to_numeric(ok.train_steps, errors="coerce").where(lambda x: x > 0)
    ok = ok.assign(step_s=ok.seconds / steps, mb_step=ok.bytes_sent / steps / 1e6)
    g = ok.groupby(["dataset", "method", "defense", "he"]).agg(
        seconds=("seconds", "mean"), bytes_sent=("bytes_sent", "mean"), he_seconds=("he_seconds", "mean"),
        s_per_step=("step_s", "mean"), mb_per_step=("mb_step", "mean"),
        hiding_bits=("he_hiding_bits", "min"), flooding_bits=("he_flooding_bits", "min"),
        parameters=("he_params", "first")).reset_index()
    off = g[g.he == "off"].set_index(["dataset", "method", "defense"])
    g["× off (seconds)"] = [f"{r.seconds / off.loc[(r.dataset, r.method, r.defense), 'seconds']:.1f}"
                           if (r.dataset, r.method, r.defense) in off.index else "–" for r in g.itertuples()]
    g["MB sent"] = (g.bytes_sent / 1e6).round(2)
    for col in ("hiding_bits", "flooding_bits"):  # "–": HE off, or a scheme without that noise (Paillier)
        g[col] = ["–" if pd.isna(v) else _count(v) for v in g[col]]
    return g.drop(columns=["bytes_sent"])


def _count(x: object) -> str:
    """A stored count as text; ``?`` when an older or damaged row lacks it."""
    # numbers.Real: a pandas int64 column hands out numpy integers, which are not ``int``
    return str(int(float(x))) if isinstance(x, numbers.Real) and math.isfinite(x) else "?"


LEADING = "normalised C-DCS"
"""The ranking the first screen leads with (docs/scores.md): it scores each attack over its control and
baseline, so a defense gets no credit for stopping an attack that never worked; the raw C-DCS is a
column of the score table."""


def recommendation(summary: pd.DataFrame, table: pd.DataFrame, dataset: str,
                   picked: dict | None = None) -> tuple[list[str], str | None]:
    """The first screen's answer for one dataset, and the attack whose trade-off plot goes beside it
    (``picked``, if given, receives the picked cell's method, defense and he, for the plot to mark it).

    In order: "federating does not pay here" when no federated cell beats ``local``; else the defended
    cell with the best leading score among those above chance and above ``local`` that lower some
    attack by more than twice the seed std (the attack it lowers most, from what to what, and its
    utility cost); else "no defense here moves any attack beyond seed noise"."""
    d = summary[summary.dataset == dataset]
    attacks = [c[: -len("_value")] for c in d.columns if c.endswith("_value") and d[c].notna().any()]
    fed = d[d.method != "local"]
    local = d[d.method == "local"]
    if len(local) and len(fed) and not (fed.beats_local == True).any():  # noqa: E712 - None: not compared
        best = fed.loc[fed.utility.idxmax()]
        return [f"**Federating does not pay here**: no federated cell beats the active party alone "
                f"(`local` {_g(local.utility.mean())}; best federated: {scores.cell_name(best)}, "
                f"{_g(best.utility)}). Train alone, or change the method or data."], attacks[0] if attacks else None
    if not attacks:
        return ([f"No attacks ran on {dataset}: best utility {scores.cell_name(d.loc[d.utility.idxmax()])}, "
                 f"{_g(d.utility.max())}."] if len(d) else []), None
    ok = scores.eligible(d)
    moves = []
    for a in attacks:
        e = defense_effects(d, a)
        keys = ["method", "defense", "he"]
        e = e[e.clear.astype(bool) & (e.delta < 0)].merge(ok[keys], on=keys)
        moves += [{**r, "attack": a} for r in e.to_dict("records")]
    if not moves:
        seeds = int(d.seeds.min()) if len(d) else 0
        return [f"**No defense here moves any attack beyond seed noise** (more than twice the std over {seeds} "
                f"seeds, among cells above chance and above `local`): "
                + ", ".join(attacks) + " leak about as much with every defense as without. Best utility: "
                f"{scores.cell_name(d.loc[d.utility.idxmax()])}, {_g(d.utility.max())}."], attacks[0]
    m = pd.DataFrame(moves)
    t = table[table.dataset == dataset] if len(table) else table
    if len(t) and LEADING in t:
        m = m.merge(t[["method", "defense", "he", LEADING]].drop_duplicates(["method", "defense", "he"]),
                    on=["method", "defense", "he"], how="left")
        m = m.sort_values([LEADING, "delta"], ascending=[False, True], na_position="last")
    else:
        m = m.sort_values("delta")
    pick = m.iloc[0]
    cell = d[(d.method == pick.method) & (d.defense == pick.defense) & (d.he == pick.he)].iloc[0]
    if picked is not None:
        picked.update(method=pick.method, defense=pick.defense, he=pick.he, swept=cell.swept)
    ref = d[(d.method == pick.method) & (d.he == pick.he) & (d.swept == cell.swept) & (d.defense == "none")].iloc[0]
    lowered = m[(m.method == pick.method) & (m.defense == pick.defense) & (m.he == pick.he)]
    a = lowered.sort_values("delta").iloc[0].attack  # the attack this cell lowers most
    cost = ref.utility - cell.utility
    score = f"; {LEADING} {_g(pick[LEADING])}, rank 1 of the cells that qualify" if LEADING in pick and \
        not pd.isna(pick[LEADING]) else ""
    line = (f"**Pick {scores.cell_name(cell)}**: it lowers {attack_words(a)} (`{a}`) from {_g(ref[f'{a}_value'])} "
            f"to {_g(cell[f'{a}_value'])}{_beside(cell, a)} at a utility {'cost' if cost >= 0 else 'gain'} of "
            f"{_g(abs(cost))} ({_g(ref.utility)} → {_g(cell.utility)}, {cell.metric}){score}.")
    out = [line]
    others = [f"{r.attack} {_g(r.delta)}" for r in lowered.itertuples() if r.attack != a]
    if others:
        out.append(f"It also lowers: {', '.join(others)} (change of the attack's value).")
    unmoved = [f"{attack_words(b)} (`{b}`) {_g(ref[f'{b}_value'])} → {_g(cell[f'{b}_value'])}{_beside(cell, b)}"
               f"{_judged_by(d, cell, b)}"
               for b in attacks if b != a and b not in set(lowered.attack) and not pd.isna(cell.get(f"{b}_value"))]
    if unmoved:  # the sweep's other attacks, so a reader sees all of them (issue 51)
        out.append(f"Not moved beyond seed noise by it: {'; '.join(unmoved)}.")
    return out, a


def _judged_by(d: pd.DataFrame, cell: pd.Series, attack: str) -> str:
    """The interval a change was judged against (a reader sees why 0.264 → 0.083 is "not moved"), or that
    one seed cannot judge it."""
    e = defense_effects(d, attack)
    e = e[(e.method == cell.method) & (e.defense == cell.defense) & (e.he == cell.he)]
    if e.empty:
        return ""
    r = e.iloc[0]
    if not r.noise > 0:  # one seed (no std): no change can be told from seed noise
        return " (one seed per cell: it cannot judge a change; run more seeds)"
    return f" (change {_g(r.delta)}, within ±{_g(2 * r.noise)}: twice the larger seed std of the two cells)"


def attack_words(name: str) -> str:
    """An attack in words, by its kind (the code name follows it in the text)."""
    from attacks import ATTACKS

    kind = str(getattr(ATTACKS.get(name), "kind", "")) if name in ATTACKS.names() else ""
    return {"label_inference": "label inference by a passive party",
            "feature_reconstruction": "feature reconstruction by the active party",
            "backdoor": "a passive party's backdoor", "untargeted": "a passive party's robustness attack"}.get(
        kind, f"the {name} attack")


def _beside(cell: pd.Series, a: str) -> str:
    """``(its prior P, control C)`` for attack ``a`` at ``cell``: what guessing gets, and what the attack gets
    with no federation to attack, so a reader can tell a value near the control from a leak."""
    parts = [f"{label} {_g(cell.get(f'{a}_{label}'))}" for label in ("prior", "control")
             if not pd.isna(cell.get(f"{a}_{label}"))]
    return f" (its {', '.join(parts)})" if parts else ""


def _g(x: object) -> str:
    """One precision rule for the first screen: 3 significant digits."""
    v = _num(x)
    return "–" if math.isnan(v) else f"{v:.3g}"
