"""``dcor:ALPHA``: NoPeek (Vepakomma et al. 2020, "NoPeek: Information leakage reduction to share
activations in distributed deep learning"). Each passive party adds α · dCor(x, z) to its own
objective, the sample distance correlation between its input rows x and its cut-layer output z on
the batch, so the bottom model learns representations that keep what the task needs while
decorrelating from the raw features. It targets feature reconstruction from the released rows
(``fr``, ``fr-grn``). dCor is computed batched and numerically careful (no square root at zero
distance; :func:`defenses.functional.distance_correlation`). Reading: tabular categorical fields
enter x as their integer codes (the party's own input rows as the bottom model reads them).

Party: passive. Composes with HE (the party reads only its own tensors), with every method whose
passive bottom trains in the supervised loop, and with an agg head. ``dcor:0`` is the undefended run.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from defenses.base import DEFENSES, Defense, _finite
from defenses.functional import distance_correlation
from securevfl.channel import MessageKind
from securevfl.hooks import ExtraLoss, StepView
from securevfl.roles import PASSIVE


@DEFENSES.register
class NoPeek(Defense, ExtraLoss):
    name = "dcor"
    primary = "alpha"
    defaults = {"alpha": 0.5}
    runs_at = frozenset({PASSIVE})
    acts_on = frozenset({MessageKind.ACTIVATION})  # it changes what the passive party sends
    targets: ClassVar[tuple[str, ...]] = ("fr", "fr-grn")

    def validate(self) -> None:
        _finite("dcor alpha", self.config["alpha"])
        if self.config["alpha"] == 0:  # the undefended control: installed nowhere, bit-identical
            self.runs_at = frozenset()

    def loss_term(self, view: StepView) -> torch.Tensor:
        return self.config["alpha"] * distance_correlation(view.features, view.output)

    def privacy(self) -> dict:
        return {"epsilon": None, "delta": None, "mechanism": "nopeek", "formal_guarantee": False,
                "protects": "passive features (distance-correlation penalty)", "alpha": self.config["alpha"]}
