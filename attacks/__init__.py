"""Label-inference attacks against a trained federation (SPEC §6), organised by family.

Only securevfl's composition layer (``securevfl.lab``, the CLI) imports this package."""

from attacks.base import (
                          ATTACKS,
                          Attack,
                          AttackResult,
                          AttackTarget,
                          attack_class,
                          attack_names,
                          attack_spec,
                          parse_attack,
                          register_attack,
)
from attacks.gradient import scoring  # noqa: F401  (registration)
from attacks.model_completion import mc  # noqa: F401  (registration)

__all__ = ["ATTACKS", "Attack", "AttackResult", "AttackTarget", "attack_class", "attack_names", "attack_spec",
           "parse_attack", "register_attack"]
