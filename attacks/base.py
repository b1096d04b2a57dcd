"""Attack contract and registry, in the spirit of IBM ART: each attack declares its threat model
(which party attacks) and what it must observe, and checks at construction that the trained
federation exposes it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

from securevfl.errors import UserError

ATTACKS: dict[str, type[Attack]] = {}


@dataclass
class AttackResult:
    metric: str
    value: float
    prior: float
    baseline: float | None = None
    details: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        out = {"metric": self.metric, "value": self.value, "prior": self.prior}
        if self.baseline is not None:
            out["baseline"] = self.baseline
        return {**out, **self.details}


class Attack(ABC):
    name: ClassVar[str]
    threat_model: ClassVar[str] = "passive"
    """Which party attacks (SPEC §6: a passive party, FedHSSL's T1)."""
    requires: ClassVar[frozenset[str]] = frozenset()
    """What the attack must observe, e.g. ``bottom_model``, ``own_rows``, ``gradients``, ``aux_labels``."""

    def __init__(self, exposes: frozenset[str], **params: object) -> None:
        missing = self.requires - exposes
        if missing:
            raise UserError(f"attack {self.name} needs {', '.join(sorted(missing))}, "
                            f"which this run does not expose")
        self.params = params

    @abstractmethod
    def run(self, fed: object, partition: object) -> AttackResult: ...


def register_attack(cls: type[Attack]) -> type[Attack]:
    ATTACKS[cls.name] = cls
    return cls


def attack_names() -> list[str]:
    return sorted(ATTACKS)
