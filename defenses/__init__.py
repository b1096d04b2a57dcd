"""Defenses on cut-layer messages (SPEC §4). Only securevfl's composition layer imports this."""

from defenses.base import DEFENSES, Defense, defense_names, parse_defense

__all__ = ["DEFENSES", "Defense", "defense_names", "parse_defense"]
