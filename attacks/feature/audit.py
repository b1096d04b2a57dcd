"""The adversary of the feature-side one-run audit (:mod:`securevfl.lab.audit`, ``--audit
side=features``): the active party, against ``passive1``'s feature rows.

Each canary row at ``passive1`` holds either its own features or, with probability ½, the features
of one public donor row. The active party asks the trained federation for the released rows of the
canaries and the donor in one inference request (as :func:`attacks.feature.fr.observe` does; under
HE it sees a_P = z·W_P), and scores a canary by its distance from the donor's row: the passive
bottom model is deterministic at inference, so a canary that took the donor's features is released
as the donor's row plus fresh noise only. Larger distance = more likely it kept its own row.

These queries are releases like any other: the run's pipeline makes them before the feature ε is
computed, so the claimed ε covers them.
"""

from __future__ import annotations

import numpy as np

from attacks.base import AttackTarget
from attacks.feature.fr import observe


def donor_distance_scores(target: AttackTarget, canaries: np.ndarray, donor: object) -> np.ndarray:
    """One score per canary for "kept its own feature row": its released row's distance to the donor's."""
    ids = np.concatenate([np.asarray([donor], dtype=canaries.dtype), canaries])
    rows = observe(target, ids, "train")
    return np.linalg.norm(rows[1:] - rows[0], axis=1)
