"""What the backdoor attacks share: a malicious passive party that knows a few rows of the target
class, tampers with its own part of training, and is scored by its attack success rate (ASR) on
triggered test rows.

ASR = the fraction of test rows whose true label is not the target that the federation classifies
as the target once the adversary adds its trigger at inference. ``prior`` is the same fraction
without the trigger (what the model does anyway). The control the issue asks for — the same trigger
on a federation trained with no poisoning — is the same attack with ``poison=0``: it trains
honestly and still adds the trigger at inference (tests and ``benchmarks/RESULTS.md`` run both).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from attacks.base import (
    Attack,
    AttackResult,
    AttackTarget,
    GroundTruth,
    PassiveTamper,
    adversary_party,
    check_adversary,
)
from securevfl.errors import UserError

if TYPE_CHECKING:
    from securevfl.federation import Federation

STREAM_BACKDOOR = 7919
"""Offset of the backdoor's own random stream from the run seed (apart from the federation's)."""


class Backdoor(Attack, PassiveTamper):
    """A backdoor planted by a passive party during training (subclasses say how)."""

    kind = "backdoor"
    threat_model = "passive"
    during_training = True
    requires = frozenset({"bottom_model", "received_gradients", "own_rows", "aux_labels"})
    defaults: ClassVar[dict[str, object]] = {"target": 0, "poison": 0.01, "n_known": 10, "adversary": "passive1"}
    """``target``: the class triggered rows should get; ``poison``: the fraction of the adversary's
    training rows it poisons (0: the control, honest training, trigger at inference only);
    ``n_known``: rows of the target class whose labels the adversary knows; ``adversary``: which
    passive party attacks."""

    @classmethod
    def validate(cls, config: dict) -> None:
        super().validate(config)
        check_adversary(f"attack {cls.name}", config)
        if not 0 <= config["poison"] <= 1:
            raise UserError(f"attack {cls.name}: poison is a fraction of the training rows in [0, 1], "
                            f"got {config['poison']}")
        if config["n_known"] < 1:
            raise UserError(f"attack {cls.name}: n_known must be ≥ 1 (the adversary needs a target row)")

    def prepare(self, federation: object, adversary: str, partition: GroundTruth | None = None) -> None:
        fed: Federation = federation  # type: ignore[assignment]  # the harness passes the built federation
        if partition is None:
            raise RuntimeError(f"attack {self.name} needs the simulator's ground truth for its known rows")
        target = int(self.config["target"])
        if target >= fed.n_classes:
            raise UserError(f"attack {self.name}: target={target}, but this task has classes 0..{fed.n_classes - 1}")
        self.party = adversary_party(fed, str(self.config["adversary"]))
        self.rng = np.random.default_rng(self.seed + STREAM_BACKDOOR)
        ids = np.asarray(self.party.data.train_ids)
        y = partition.true_labels(ids)
        pool = ids[y == target]
        if len(pool) == 0:
            raise UserError(f"attack {self.name}: the adversary holds no training row of class {target}")
        # the few labeled target rows the adversary knows (its auxiliary labels)
        self.known = np.sort(self.rng.choice(pool, min(int(self.config["n_known"]), len(pool)), replace=False))
        self.n_poison = int(round(float(self.config["poison"]) * len(ids)))
        self.triggering = False  # at inference: add the trigger to every row (run() switches it)
        self.setup(ids)
        self.party.use_tamper(self)

    def setup(self, ids: np.ndarray) -> None:
        """Choose what to poison among the adversary's training rows ``ids`` (before training)."""

    def details(self) -> dict[str, Any]:
        """What the attack reports about its own training-time work."""
        return {}

    def run(self, target: AttackTarget) -> AttackResult:
        assert target.method is not None and target.method.trainer is not None  # the run pipeline passes them
        trainer, active = target.method.trainer, target.federation.active
        ids = active.data.test_ids if active.aligned_test_ids is None else active.aligned_test_ids
        tgt = int(self.config["target"])
        y = target.truth(np.asarray(ids))
        clean = trainer.predict_proba(ids, "test").argmax(1)
        rows = np.asarray(ids)[y != tgt]
        self.triggering = True
        try:
            triggered = trainer.predict_proba(rows, "test").argmax(1)
        finally:  # the party is honest again for the attacks that follow
            self.triggering = False
            self.party.use_tamper(None)
        off_target = clean[y != tgt]
        return AttackResult(metric="asr", value=float((triggered == tgt).mean()),
                            prior=float((off_target == tgt).mean()),
                            details={"target": tgt, "rows_scored": int(len(rows)), "poisoned_rows": self.n_poison,
                                     "known_rows": int(len(self.known)), "adversary": self.party.name,
                                     "clean_accuracy": float((clean == y).mean()),
                                     "control_kind": "run the same attack with poison=0 (same trigger, no poisoning)",
                                     **self.details()})
