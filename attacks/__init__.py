"""Attacks against a trained federation, organised by family: label inference by a passive party
(model completion, gradient scoring) and feature reconstruction by the active party.

Only securevfl's composition layer (``securevfl.lab``, the CLI) imports this package."""

from attacks.base import ATTACKS, Attack, AttackResult, AttackTarget, attack_spec, parse_attack
from attacks.feature import fr  # noqa: F401  (registration)
from attacks.gradient import bli, dli, scoring  # noqa: F401  (registration)
from attacks.model_completion import mc  # noqa: F401  (registration)

__all__ = ["ATTACKS", "Attack", "AttackResult", "AttackTarget", "attack_spec", "parse_attack"]
