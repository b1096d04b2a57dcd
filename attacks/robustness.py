"""Robustness (untargeted) attacks at inference, as VFLAIR defines them (``MainTaskVFL`` with
``apply_ns`` / ``apply_mf``): a passive party, after an honest training, degrades its part of the
federation's predictions.

* ``noisy-sample`` (VFLAIR ``NoisySample``): for a ``noise_rate`` fraction of the test rows the
  adversary feeds its bottom model x + λ·N(0, 1) instead of x (λ = ``noise_lambda``; VFLAIR's
  defaults λ 2, rate 0.01). Categorical codes of tabular data are left as they are (noise on an
  embedding index is not a feature value).
* ``missing-feature`` (VFLAIR ``MissingFeature``): for a ``missing_rate`` fraction of the test rows
  the adversary sends zeros in place of its bottom output, as VFLAIR zeroes that party's local
  prediction (its features are absent; VFLAIR's default rate 0.25).

Score: the drop in the main task's headline utility from the clean evaluation of the same trained
federation (the control, ``details.clean``) to the attacked one; ``prior`` 0 is no drop.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch

from attacks.base import (
    ATTACKS,
    Attack,
    AttackResult,
    AttackTarget,
    PassiveTamper,
    adversary_party,
    check_adversary,
    numeric_cells,
)
from securevfl.errors import UserError

STREAM_ROBUSTNESS = 7927
"""Offset of these attacks' own random stream (which rows, what noise) from the run seed."""


class Untargeted(Attack, PassiveTamper):
    """An inference-time attack by a passive party on a ``rate`` fraction of the test rows."""

    kind = "untargeted"
    threat_model = "passive"
    requires = frozenset({"bottom_model", "own_rows"})
    rate_key = "rate"
    defaults: ClassVar[dict[str, object]] = {"adversary": "passive1"}

    @classmethod
    def validate(cls, config: dict) -> None:
        super().validate(config)
        check_adversary(f"attack {cls.name}", config)
        if not 0 <= config[cls.rate_key] <= 1:
            raise UserError(f"attack {cls.name}: {cls.rate_key} is a fraction of the test rows in [0, 1], "
                            f"got {config[cls.rate_key]}")

    def run(self, target: AttackTarget) -> AttackResult:
        assert target.method is not None  # the run pipeline passes the trained method
        party = adversary_party(target.federation, str(self.config["adversary"]))
        self.rng = np.random.default_rng(self.seed + STREAM_ROBUSTNESS)
        ids = np.asarray(party.data.test_ids)
        self.hit = self.rng.choice(ids, int(round(float(self.config[self.rate_key]) * len(ids))), replace=False)
        self.party = party
        clean = target.method.evaluate(target.federation)
        party.use_tamper(self)
        try:
            attacked = target.method.evaluate(target.federation)
        finally:
            party.use_tamper(None)
        return AttackResult(metric="utility_drop", value=float(clean["test"] - attacked["test"]), prior=0.0,
                            details={"utility_metric": clean["metric"], "clean": float(clean["test"]),
                                     "attacked": float(attacked["test"]), "rows_attacked": int(len(self.hit)),
                                     "adversary": party.name, "control_kind": "the same federation evaluated clean"})

    def rows(self, ids: np.ndarray, split: str, training: bool) -> np.ndarray:
        """Which of this request's rows the adversary attacks (test rows it drew, at inference)."""
        if training or split != "test":
            return np.zeros(len(ids), dtype=bool)
        return np.isin(ids, self.hit)


@ATTACKS.register
class NoisySample(Untargeted):
    name = "noisy-sample"
    rate_key = "noise_rate"
    defaults = {**Untargeted.defaults, "noise_lambda": 2.0, "noise_rate": 0.01}

    def features(self, x: torch.Tensor, ids: np.ndarray, split: str, training: bool) -> torch.Tensor:
        rows = np.flatnonzero(self.rows(ids, split, training))
        if len(rows) == 0:
            return x
        flat = x.reshape(len(x), -1).clone()
        cells = numeric_cells(self.party.data)
        noise = self.rng.standard_normal((len(rows), cells)).astype(np.float32)
        flat[torch.from_numpy(rows), :cells] += float(self.config["noise_lambda"]) * torch.from_numpy(noise)
        return flat.reshape(x.shape)


@ATTACKS.register
class MissingFeature(Untargeted):
    name = "missing-feature"
    rate_key = "missing_rate"
    defaults = {**Untargeted.defaults, "missing_rate": 0.25}

    def output(self, z: torch.Tensor, ids: np.ndarray, split: str, training: bool) -> torch.Tensor:
        rows = self.rows(ids, split, training)
        if not rows.any():
            return z
        z = z.clone()
        z[torch.from_numpy(rows)] = 0.0
        return z
