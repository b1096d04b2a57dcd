"""``securevfl advise``: which method to try first on one's own party files, and the comparison to run.

It reads the party files (the active party's first, with its label column), measures what the methods
differ on — the share of the active party's rows every party holds (by plain ID intersection: this is
a local look at files the user holds, not a deployment's PSI), its labeled rows inside and outside that
overlap, whether it holds features besides the label, the rows and feature types of each party — and
maps the situation to the first method of docs/which-method.md, quoting the measured difference that
rests on (the methods report's, at the paper's setting) and what it does not know. The thresholds are
readings of the papers' settings, said beside each rule (:data:`RULES`); the answer is a first try, the
template sweep (``sweeps/templates/compare-methods.yaml``) the way to settle it on the user's rows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from securevfl.errors import UserError


@dataclass
class Situation:
    """What the methods differ on, measured on the user's files."""

    rows: list[int]
    aligned: int
    labeled: int
    labeled_aligned: int
    active_features: int
    feature_types: list[dict[str, int]] = field(default_factory=list)

    @property
    def aligned_share(self) -> float:
        return self.aligned / self.rows[0] if self.rows[0] else 0.0

    @property
    def labeled_outside(self) -> int:
        return self.labeled - self.labeled_aligned

    @property
    def unlabeled_aligned(self) -> int:
        return self.aligned - self.labeled_aligned


@dataclass(frozen=True)
class Rule:
    """One row of docs/which-method.md: when it applies, the method, and what it rests on."""

    when: str
    method: str
    applies: Callable[[Situation], bool]
    measured: str


RULES = [
    Rule("the active party holds labels and no features (a label-only host)", "entity-aug",
         lambda s: s.active_features == 0,
         "+0.194 [+0.165, +0.223] AUC over drawing partners among aligned rows only (digits, 5 % aligned); "
         "+0.028 [+0.017, +0.039] on Criteo"),
    Rule("most rows aligned (≥ 70 % of the active party's)", "splitnn",
         lambda s: s.aligned_share >= 0.7,
         "not measured as a regime: the other methods are built for few aligned rows"),
    Rule("few labels on the aligned rows (≤ 10 % of them labeled), many unlabeled", "fedhssl",
         lambda s: s.labeled_aligned <= 0.1 * s.aligned and s.unlabeled_aligned >= 1000,
         "+0.030 [+0.007, +0.054] over splitnn, but no better than each party's own SSL (fedlocal-simsiam, "
         "+0.002 [−0.010, +0.013]) (Avazu, 200 labels, 20 % aligned)"),
    Rule("few aligned rows (< 30 %), many labeled rows at the active party alone (≥ 5× the aligned labeled)",
         "vflhlp", lambda s: s.aligned_share < 0.3 and s.labeled_outside >= 5 * max(s.labeled_aligned, 1),
         "+0.149 [+0.123, +0.174] over splitnn, +0.028 [+0.014, +0.041] over local (Criteo, 200 aligned of "
         "40,000); compare fedud (+0.037 over splitnn, −0.014 against local on Avazu) and risa (+0.009 over "
         "splitnn, Criteo)"),
    Rule("few aligned rows (< 30 %), the active party's rows outside them labeled", "risa",
         lambda s: s.aligned_share < 0.3 and s.labeled_outside > 0,
         "+0.009 [+0.000, +0.017] over splitnn, +0.001 [−0.005, +0.006] over local (Criteo, 10 % aligned)"),
]
FALLBACK = Rule("none of the measured regimes", "splitnn", lambda s: True,
                "no regime of the methods report matches: compare the methods on your rows")


def situation(party_files: list[str], label_column: str, id_column: str = "id") -> Situation:
    """Measure the situation on ``party_files`` (the active party's first), each read by the reader
    training uses (:func:`securevfl.data.csvsource.read_file`: the same IDs, label cells and column kinds).

    Raises:
        UserError: a missing file or column, or a file training would refuse, in one line."""
    if len(party_files) < 2:
        raise UserError("advise needs every party's file: --party-file ACTIVE --party-file PASSIVE ...")
    for path in party_files:  # a usage error is answered before the readers (and torch) are imported
        if not Path(path).is_file():
            raise UserError(f"--party-file {path}: no such file")
    from securevfl.configuration.options import DataConfig
    from securevfl.data.csvsource import read_file
    from securevfl.data.psi import plain_intersection
    from securevfl.ids import member

    cfg = DataConfig(label_column=label_column)
    tables = [read_file(cfg, Path(path), id_column, active=k == 0) for k, path in enumerate(party_files)]
    active = tables[0]
    assert active.labels is not None  # the active party's file is read with its label column
    in_overlap = member(active.ids, plain_intersection([t.ids for t in tables]))
    has_label = np.asarray(active.labels.has_label, dtype=bool)
    types = [{"numeric": len(t.num_cols), "categorical": len(t.cat_cols)} for t in tables]
    return Situation(rows=[t.n_rows for t in tables], aligned=int(in_overlap.sum()), labeled=int(has_label.sum()),
                     labeled_aligned=int((has_label & in_overlap).sum()),
                     active_features=sum(types[0].values()), feature_types=types)


def advise(s: Situation) -> dict:
    """The first method for ``s``, the rule that chose it and what it rests on, the comparison to run."""
    rule = next((r for r in RULES if r.applies(s)), FALLBACK)
    compare = sorted({"local", "splitnn", rule.method} | ({"fedud", "risa"} if rule.method == "vflhlp" else set()))
    return {"situation": {"rows": s.rows, "aligned": s.aligned, "aligned_share": round(s.aligned_share, 4),
                          "labeled": s.labeled, "labeled_aligned": s.labeled_aligned,
                          "labeled_outside_overlap": s.labeled_outside, "feature_types": s.feature_types},
            "try_first": rule.method, "because": rule.when, "measured": rule.measured, "compare": compare,
            "does_not_know": "the measured regimes are CTR tables and digits at the papers' settings; your features, "
                             "label balance and row counts may move every difference (docs/which-method.md)"}


def lines(a: dict) -> list[str]:
    """The advice as text, for the terminal."""
    s = a["situation"]
    types = "; ".join(f"party {k}: {t['numeric']} numeric, {t['categorical']} categorical"
                      for k, t in enumerate(s["feature_types"]))
    return [f"rows per party: {', '.join(map(str, s['rows']))}; aligned (every party holds them): {s['aligned']} "
            f"({100 * s['aligned_share']:.0f} % of the active party's)",
            f"labeled rows: {s['labeled']} ({s['labeled_aligned']} aligned, {s['labeled_outside_overlap']} only at the "
            f"active party); features: {types}",
            f"try first: {a['try_first']} — {a['because']}",
            f"measured (methods report, paired 95 % interval): {a['measured']}",
            f"then compare on your rows: {', '.join(a['compare'])} (sweeps/templates/compare-methods.yaml; "
            "docs/lab.md, 'Your own files')",
            f"what this does not know: {a['does_not_know']}"]

