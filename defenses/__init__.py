"""Defenses on cut-layer messages, organised by family. Only securevfl's composition
layer imports this package."""

from defenses.base import DEFENSES, Defense, defense_names, parse_defense
from defenses.compression import discrete, sparsify  # noqa: F401  (registration)
from defenses.detection import gradient_subspace  # noqa: F401  (registration)
from defenses.encoding import cae, fedpass, kdk  # noqa: F401  (registration)
from defenses.information import dcor, mid, peloss  # noqa: F401  (registration)
from defenses.perturbation import (  # noqa: F401  (registration)
    embedding,
    gradperturb,
    iso,
    label_dp,
    laplace,
    marvell,
    maxnorm,
    rr,
)

__all__ = ["DEFENSES", "Defense", "defense_names", "parse_defense"]
