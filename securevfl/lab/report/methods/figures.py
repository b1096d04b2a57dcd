"""The methods report's regime figure: each comparison's paired difference across the swept values."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from securevfl.lab.report.figures import finish_line_plot  # noqa: E402
from securevfl.lab.report.methods.claims import _fmt, _is_number  # noqa: E402
from securevfl.lab.report.methods.stats import references  # noqa: E402
from securevfl.lab.report.methods.text import _label  # noqa: E402


def regime_figure(claim: dict, table: pd.DataFrame, path: Path, axis: str | None = None) -> Path:
    """Paired difference (arm − baseline) against the regime key (or ``axis``: the rows axis), 95 %
    intervals, the paper's value marked at its setting."""
    table = table[table.n > 0]  # a comparison without runs (an arm not run at that value) is no point
    many = table.assign(vs=[_label(r, claim, short=True) for _, r in table.iterrows()]).vs.nunique() > 3
    fig, ax = plt.subplots(figsize=(7, 5.2 if many else 4), dpi=110)
    numeric = bool(axis or claim.get("regime")) and table.regime.notna().all()
    vals = table.regime.astype(float) if numeric else pd.Series([0.0])
    log = numeric and vals.min() > 0 and vals.max() / vals.min() > 8
    table = table.assign(vs=[_label(r, claim, short=True) for _, r in table.iterrows()])
    n_base = table.vs.nunique()
    for i, (base, g) in enumerate(table.groupby("vs", sort=False)):
        g = g.sort_values("regime")
        x = g.regime.astype(float).to_numpy() if numeric else np.arange(len(g), dtype=float)
        off = (i - (n_base - 1) / 2) * 0.04  # side by side, so the intervals do not hide each other
        span = (x.max() - x.min()) if len(x) > 1 else 1.0
        xs = x * (1 + off) if log else x + off * span
        bars = ax.errorbar(xs, g["mean"], yerr=[g["mean"] - g["low"], g["high"] - g["mean"]], marker="o",
                           capsize=3, label=base)
        head = np.flatnonzero(g.headline.to_numpy())
        paper = g.paper.iloc[head[0]] if len(head) else None
        if isinstance(paper, int | float) and _is_number(paper):
            ax.scatter([xs[head[0]]], [float(paper)], marker="*", s=140, zorder=5,
                       color=bars.lines[0].get_color(), label=f"the paper: {base}")
    ax.axhline(0, color="black", lw=0.8)
    if numeric:
        if log:
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xticks(sorted(vals.unique()))
        ax.set_xlabel(axis or claim["regime"] + " (the paper's setting: " + _fmt(claim.get("headline", "–")) + ")")
    ax.set_ylabel(("arm" if references(claim) else claim["method"]) + " − baseline\n(paired by seed, 95 % CI)")
    ax.set_title(claim["title"] + (f" — {claim.get('regime')} {_fmt(claim.get('headline', '–'))}" if axis else ""))
    if not many:
        return finish_line_plot(fig, ax, path)
    ax.grid(alpha=0.3)  # many series: the legend goes under the axes, where it hides no point
    ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.16))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


