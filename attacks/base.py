"""Attack contract and registry, in the spirit of IBM ART: each attack declares its threat model
(which party attacks) and what it must observe, and checks at construction that the trained
federation exposes it. Results are typed (:class:`AttackResult`).

The adversary is a passive party (FedHSSL's threat model T1; ``passive1`` by default). An attack
gets only the adversary's part of the federation (its party object: bottom model, rows, hooks)
and its view of the channel; the harness adds ``n_aux`` labeled auxiliary rows of the
adversary's own and the ground truth to score against, both from the simulator.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from securevfl.errors import UserError

ATTACKS: dict[str, type[Attack]] = {}


@dataclass
class AttackResult:
    metric: str
    value: float
    """Headline number: label inference on the adversary's training rows (MC) or mean leak AUC."""
    prior: float
    """What guessing achieves: majority-class accuracy, or AUC 0.5."""
    baseline: float | None = None
    """Same attack without the federation (local-SSL MC), where defined."""
    details: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        out = {"metric": self.metric, "value": self.value, "prior": self.prior}
        if self.baseline is not None:
            out["baseline"] = self.baseline
        return {**out, **self.details}


@dataclass
class AttackTarget:
    """What the harness hands an attack: the trained federation, the adversary's name, and the
    simulator's ground truth (for auxiliary labels and scoring only)."""

    federation: object
    partition: object
    adversary: str = "passive1"
    exposes: frozenset[str] = frozenset()

    @property
    def party(self):
        return self.federation.party(self.adversary)

    def truth(self, ids: np.ndarray) -> np.ndarray:
        return self.partition.true_labels(ids)


class Attack(ABC):
    name: ClassVar[str]
    threat_model: ClassVar[str] = "passive"
    requires: ClassVar[frozenset[str]] = frozenset()
    """What the attack must observe: ``bottom_model``, ``own_rows``, ``aux_labels``, ``transcript``,
    ``binary_task``."""
    during_training: ClassVar[bool] = False
    """True when the attack must act while the federation trains (it gets :meth:`prepare`)."""
    params: ClassVar[dict[str, object]] = {}

    def __init__(self, exposes: frozenset[str], seed: int = 0, **params: object) -> None:
        missing = self.requires - exposes
        if missing:
            raise UserError(f"attack {self.name} needs {', '.join(sorted(missing))}, which this run does not "
                            f"expose (it exposes {', '.join(sorted(exposes)) or 'nothing'})")
        unknown = set(params) - set(self.params)
        if unknown:
            raise UserError(f"attack {self.name} has no parameter {sorted(unknown)[0]!r}")
        self.config = {**self.params, **params}
        self.seed = seed

    def prepare(self, federation: object, adversary: str) -> None:  # noqa: B027 - optional
        """Act before training (only for ``during_training`` attacks)."""

    @abstractmethod
    def run(self, target: AttackTarget) -> AttackResult: ...


def register_attack(cls: type[Attack]) -> type[Attack]:
    ATTACKS[cls.name] = cls
    return cls


def attack_names() -> list[str]:
    return sorted(ATTACKS)
