"""Reports: store → tidy DataFrames → figures and tables → ``report.md`` + ``report.html``.

The first screen answers "which method leaks least, at what utility cost": the setup that was
measured, then a few computed sentences (led by a caution when the cells are within seed noise;
which defense settings move the attack beyond noise; best utility, least leakage) above the
privacy–utility trade-off plot. Leakage is what the federation adds: the attack value
minus the larger of its control (the same attack on the same architecture, untrained) and the
local-SSL baseline; the plot shows the raw values with prior, control and baseline beside the
leakage, one line per method across defense strengths, error bars over seeds, Pareto front ringed.

The package follows that flow: ``frame`` (store → tidy DataFrames), ``text`` (computed sentences and
tables), ``figures`` (PNGs) and ``render`` (markdown and HTML, and :func:`write_report`).
"""

from securevfl.lab.report.figures import encryption_figure, image_grid, size_figure, tradeoff_figure
from securevfl.lab.report.frame import (
    attack_names,
    control_kinds,
    defense_effects,
    feature_attacks,
    feature_epsilon,
    label_attacks,
    load_frames,
    pareto_front,
    setting_label,
    shows_encryption,
    summarise,
)
from securevfl.lab.report.render import write_report
from securevfl.lab.report.text import (
    UTILITY_BUDGET,
    cell_table,
    column_notes,
    encryption_headline,
    epsilon_table,
    he_cost_label,
    he_table,
    headline,
    setup_lines,
)

__all__ = [
    "UTILITY_BUDGET", "attack_names", "cell_table", "column_notes", "control_kinds",
    "defense_effects", "encryption_figure", "encryption_headline", "epsilon_table", "feature_attacks",
    "feature_epsilon", "he_cost_label", "he_table", "headline", "image_grid", "label_attacks", "load_frames",
    "pareto_front", "setting_label", "setup_lines", "shows_encryption", "size_figure", "summarise",
    "tradeoff_figure", "write_report",
]
