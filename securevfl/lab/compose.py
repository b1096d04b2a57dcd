"""Composition layer: resolves defense and attack names into objects and runs them with a method."""

from __future__ import annotations

import attacks as attack_lib  # noqa: I001  (composition layer: the one place core imports these)
import defenses as defense_lib
from securevfl.config import RunConfig
from securevfl.errors import UserError
from securevfl.methods.base import adversary_exposes
from securevfl.run import RunOutput, run_training

ADVERSARY = "passive1"


def execute(cfg: RunConfig, progress: bool | None = None) -> RunOutput:
    """Train ``cfg.method`` under ``cfg.defense``, then run ``cfg.attacks`` as the passive party
    ``passive1``. Attacks are constructed (and their requirements checked) once the federation is
    built, before training, so a mismatch fails fast; attacks that act during training install
    themselves then. Transcript attacks switch on channel recording."""
    hooks = defense_lib.parse_defense(cfg.defense, seed=cfg.seed)
    classes = []
    for name in cfg.attacks:
        if name not in attack_lib.ATTACKS:
            raise UserError(f"unknown attack {name!r}; available: {', '.join(attack_lib.attack_names())}")
        classes.append(attack_lib.ATTACKS[name])
    if cfg.he != "off" and any("transcript" in c.requires for c in classes):
        # under HE the passive party's gradient is assembled from a decrypted and a masked part, not
        # sent as one plaintext message; the transcript attacks read plaintext gradient messages
        raise UserError(f"attacks {', '.join(c.name for c in classes if 'transcript' in c.requires)} read plaintext "
                        f"gradient messages and do not support --he {cfg.he} yet")
    if any("transcript" in c.requires for c in classes):
        cfg.record = True
    built: list = []

    def before_fit(fed) -> None:
        exposes = frozenset(adversary_exposes(fed))
        for cls in classes:
            attack = cls(exposes, seed=cfg.seed)
            if attack.during_training:
                attack.prepare(fed, ADVERSARY)
            built.append(attack)

    out = run_training(cfg, hooks=hooks, progress=progress, before_fit=before_fit)
    target = attack_lib.AttackTarget(out.federation, out.partition, ADVERSARY)
    malicious = [a.name for a in built if a.during_training]
    for attack in built:
        res = attack.run(target)
        if malicious:  # every attack in this run saw a federation trained with a malicious adversary
            res.details["malicious_training"] = malicious
        out.result["attacks"][attack.name] = res.as_dict()
    return out
