"""``peloss:ALPHA``: the potential energy loss (Zheng et al., "Protecting Split Learning by Potential
Energy Loss", IJCAI 2024; SecretFlow's ``PELoss``).

At the active party, each passive party's delivery r joins the objective through
α · Σ_c (1/n_c) Σ_{i≠j, y_i = y_j = c} 1 / (‖r_i − r_j‖ + ε): rows of the same class repel like
charges, so the passive bottom model learns to spread each class over its output space instead of
clustering it, and a passive party that fits a head to its own outputs from a few labeled rows
(model completion, ``mc``) finds less to fit. The term's gradient reaches the passive party through
the gradient the cut layer already returns; nothing new crosses the channel.

Readings where the paper and SecretFlow's code leave details open, stated here:
- the distance is the Euclidean one between deliveries (SecretFlow's default; its angular variant
  "may explode");
- ε sits inside the reciprocal, 1/(d + ε) (SecretFlow's code adds it outside the sum's terms, which
  leaves coincident rows at 1/0);
- with several passive parties the term is summed over their deliveries; with the interactive layer
  or HE the delivery is a_P = t·W_P, the tensor the active party holds;
- soft training labels (``cae``, ``kdk``) group rows by their largest class.

The term reads labels outside DP-SGD's per-example clipping, so ``peloss`` refuses to compose with
``dp`` (whose ε would not bound it). ``peloss:0`` is the undefended run (installed nowhere,
bit-identical to ``--defense none``). Party: active.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from defenses.base import DEFENSES, Defense, _finite
from securevfl.channel import MessageKind
from securevfl.hooks import ExtraLoss, StepView
from securevfl.roles import ACTIVE

EPS = 1e-8


def potential_energy(r: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Σ over classes of (1/n_c) Σ_{i≠j in c} 1/(‖r_i − r_j‖ + ε) (a class with one row adds nothing)."""
    flat = r.reshape(len(r), -1).float()
    total = flat.new_zeros(())
    for c in torch.unique(labels):
        rows = flat[labels == c]
        n = len(rows)
        if n < 2:
            continue
        diff = rows[:, None, :] - rows[None, :, :]
        off = ~torch.eye(n, dtype=torch.bool, device=rows.device)
        dist = (diff[off].pow(2).sum(-1) + EPS ** 2).sqrt()  # smooth at 0, so coincident rows have a gradient
        total = total + (1.0 / (dist + EPS)).sum() / n
    return total


@DEFENSES.register
class PELoss(Defense, ExtraLoss):
    name = "peloss"
    primary = "alpha"
    defaults = {"alpha": 2.0}
    ranges = {"alpha": "≥ 0 (0 = off; SecretFlow's default 2)"}
    runs_at = frozenset({ACTIVE})
    observes = frozenset({"labels", "received"})
    uses_labels = True
    # the term changes the gradients the active party returns
    acts_on = frozenset({MessageKind.GRADIENT})
    targets: ClassVar[tuple[str, ...]] = ("mc", "mc-plain", "norm", "direction")
    he = "composes: the term is on a_P = t·W_P, which the active party holds under HE too"

    def validate(self) -> None:
        _finite("peloss alpha", self.config["alpha"])
        if self.config["alpha"] == 0:  # the undefended control: installed nowhere, bit-identical
            self.runs_at = frozenset()
        self.energy: list[float] = []

    def loss_term(self, view: StepView) -> torch.Tensor:
        if view.labels is None or not view.received:
            return torch.zeros(())
        energy = sum((potential_energy(r, view.labels) for r in view.received), torch.zeros(()))
        if len(self.energy) < 10_000:  # the first steps' energies, for the run's report
            self.energy.append(float(energy.detach()))
        return self.config["alpha"] * energy

    def privacy(self) -> dict:
        first, last = (self.energy[0], self.energy[-1]) if self.energy else (None, None)
        return {"epsilon": None, "delta": None, "mechanism": self.name, "formal_guarantee": False,
                "protects": "the active party's labels (same-class deliveries pushed apart)",
                "alpha": self.config["alpha"], "energy_first_step": first, "energy_last_step": last}
