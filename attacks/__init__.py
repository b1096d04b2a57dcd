"""Attacks against a trained federation, organised by family: label inference by a passive party
(model completion, gradient scoring), feature reconstruction by the active party, backdoors a
passive party plants during training, and robustness attacks a passive party makes at inference.

Only securevfl's composition layer (``securevfl.lab``, the CLI) imports this package."""

from attacks import robustness  # noqa: F401  (registration)
from attacks.backdoor import gr, villain  # noqa: F401  (registration)
from attacks.base import ATTACKS, Attack, AttackResult, AttackTarget, adversary_party, attack_spec, parse_attack
from attacks.feature import fr, fsha, init_inversion, sdar, sign_probe  # noqa: F401  (registration)
from attacks.feature.audit import donor_distance_scores
from attacks.gradient import bli, cluster, dli, scoring  # noqa: F401  (registration)
from attacks.gradient.audit import AUDIT_SCORERS, CanaryScorer
from attacks.model_completion import mc  # noqa: F401  (registration)
from attacks.model_completion import sdar as sdar_label  # noqa: F401  (registration)

__all__ = ["ATTACKS", "AUDIT_SCORERS", "Attack", "AttackResult", "AttackTarget", "CanaryScorer", "adversary_party",
           "attack_spec", "donor_distance_scores", "parse_attack"]
