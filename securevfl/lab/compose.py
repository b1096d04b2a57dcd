"""Composition layer: resolves defense and attack names into objects and runs them with a method."""

from __future__ import annotations

import attacks as attack_lib  # noqa: I001  (composition layer: the one place core imports these)
import defenses as defense_lib
from securevfl.config import RunConfig
from securevfl.errors import UserError
from securevfl.run import RunOutput, run_training


def execute(cfg: RunConfig, progress: bool | None = None) -> RunOutput:
    hooks = defense_lib.parse_defense(cfg.defense, seed=cfg.seed)
    for name in cfg.attacks:
        if name not in attack_lib.ATTACKS:
            available = ", ".join(attack_lib.attack_names()) or "none yet"
            raise UserError(f"unknown attack {name!r}; available: {available}")
    out = run_training(cfg, hooks=hooks, progress=progress)
    for name in cfg.attacks:
        attack = attack_lib.ATTACKS[name](frozenset(out.method.exposes(out.federation)))
        out.result["attacks"][name] = attack.run(out.federation, out.partition).as_dict()
    return out
