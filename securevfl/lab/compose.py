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
    parsed = [attack_lib.parse_attack(entry) for entry in cfg.attacks]
    classes = [cls for cls, _ in parsed]
    names = [cls.name for cls in classes]
    if len(set(names)) < len(names):  # results are keyed by attack name
        dup = next(n for n in names if names.count(n) > 1)
        raise UserError(f"attack {dup} is listed twice; run one setting per run (a sweep file's list of values "
                        "sweeps a parameter)")
    if sum(cls.during_training for cls in classes) > 1:
        raise UserError("at most one attack may act during training (each replaces the adversary's optimizer)")
    if any("transcript" in c.requires for c in classes):
        cfg.record = True
    built: list = []

    def before_fit(fed) -> None:
        exposes = frozenset(adversary_exposes(fed))
        for cls, params in parsed:
            attack = cls(exposes, seed=cfg.seed, **params)
            if attack.during_training:
                attack.prepare(fed, ADVERSARY)
            built.append(attack)

    out = run_training(cfg, hooks=hooks, progress=progress, before_fit=before_fit)
    # the adversary took part in the federation's SSL stage, so it knows how long it was
    ssl_epochs = out.method.params.get("ssl_epochs") if out.method.params else None
    target = attack_lib.AttackTarget(out.federation, out.partition, ADVERSARY,
                                     ssl_epochs=int(ssl_epochs) if ssl_epochs else None, method=out.method)
    malicious = [a.name for a in built if a.during_training]
    for attack in built:
        res = attack.run(target)
        if malicious:  # every attack in this run saw a federation trained with a malicious adversary
            res.details["malicious_training"] = malicious
        out.result["attacks"][attack.name] = res.as_dict()
    return out
