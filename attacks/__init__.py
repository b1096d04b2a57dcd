"""Label-inference attacks against a trained federation (SPEC §6), organised by family.

Only securevfl's composition layer (``securevfl.lab``, the CLI) imports this package."""

from attacks.base import ATTACKS, Attack, attack_names

__all__ = ["ATTACKS", "Attack", "attack_names"]
