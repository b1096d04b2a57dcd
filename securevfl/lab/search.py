"""The worst-case attack search by a library: Optuna's TPE over a sweep's ``attack_search`` space
(``searcher: tpe``; the seeded random search stays the default and the fallback).

Each try is still one stored cell per seed (swept ``search:try`` = t), so a search is resumable:
the searcher's state is never saved, it is rebuilt from the store. For each group of cells (one
point of the sweep's grid, all its seeds) and each searched attack there is one study; round t
rebuilds it from tries 0 … t − 1 (parameters → the attack's mean AP over the seeds, as the report's
:func:`securevfl.lab.scores.worst_case` scores them) with a sampler seeded by (search seed, group,
attack, t), and asks it for try t. So the same stored history always gives the same next try, and
a killed sweep continues where it stopped. Every attack of a try runs its own study's point.

The budget is at most :data:`securevfl.lab.sweep.MAX_SEARCH_BUDGET` (10,000 tries per cell), checked
when the sweep file is read, where the later tries also count towards the sweep's ``max_cells``; the
space is never enumerated (each parameter is one categorical distribution of its listed values).

Ray Tune's searchers are not used, also under ``engine: ray``: a trial here is a stored cell that
any engine runs, and Ray Tune's TPE is this same Optuna sampler behind its own trial runner.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from securevfl.errors import UserError

SEARCHERS = ("random", "tpe")


def require_optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise UserError("attack_search searcher tpe needs Optuna: pip install 'securevfl[search]' (or searcher: "
                        "random)") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


@dataclass
class TPESearch:
    """The sequential part of a sweep's ``attack_search``: its tries after try 0."""

    axes: list[tuple[str, str, list]]
    """(attack, parameter, values) of the search space."""
    budget: int
    seed: int
    groups: dict[str, list] = field(default_factory=dict)
    """Group key → its try-0 cells (one per seed)."""
    tries: dict[str, list[list]] = field(default_factory=dict)
    """Group key → the cells of each try so far (tries[g][t])."""

    def add_first(self, cells: list) -> None:
        """Register the sweep's try-0 cells (cells without an attack search are ignored)."""
        for c in cells:
            if c.swept.get("search:try") == 0:
                self.groups.setdefault(group_key(c), []).append(c)
        self.tries = {g: [cs] for g, cs in self.groups.items()}

    def remaining(self) -> int:
        """Cells the rounds after try 0 will add."""
        return (self.budget - 1) * sum(len(cs) for cs in self.groups.values())

    def next_round(self, t: int, results: dict[str, dict]) -> list:
        """The cells of try ``t`` for every group, from what tries 0 … t − 1 scored (``results``: run id
        → the run's result JSON; a missing or failed run counts as no evidence)."""
        out = []
        for g, first in self.groups.items():
            point: dict[str, dict] = {}
            for attack in sorted({a for a, _, _ in self.axes}):
                point[attack] = self._ask(g, attack, t, results)
            cells = []
            for c in first:
                config = copy.deepcopy(c.config)
                config["attacks"] = [with_params(e, point, "attack_search.space") for e in config["attacks"]]
                cells.append(type(c)(c.method, c.defense, c.family, c.strength, c.seed, c.he, config,
                                     {**c.swept, "search:try": t}, c.save))
            self.tries[g].append(cells)
            out += cells
        return out

    def _ask(self, g: str, attack: str, t: int, results: dict[str, dict]) -> dict:
        optuna = require_optuna()
        params = [(p, values) for a, p, values in self.axes if a == attack]
        dists = {p: optuna.distributions.CategoricalDistribution([_choice(v) for v in values]) for p, values in params}
        digest = hashlib.sha256(f"{self.seed}/{g}/{attack}/{t}".encode()).digest()
        sampler = optuna.samplers.TPESampler(seed=int.from_bytes(digest[:4], "little"), multivariate=True,
                                             n_startup_trials=max(1, (self.budget - 1) // 3))
        study = optuna.create_study(direction="maximize", sampler=sampler)
        seen: dict[str, float] = {}
        for cells in self.tries[g][:t]:
            p_of = _point_of(cells[0].config["attacks"], attack, [p for p, _ in params])
            value = _mean_ap(cells, attack, results)
            if value is None:
                continue
            seen[json.dumps(p_of, sort_keys=True)] = value
            study.add_trial(optuna.trial.create_trial(params={k: _choice(v) for k, v in p_of.items()},
                                                      distributions=dists, value=value))
        for _ in range(20):  # a point already tried is told its known value and asked again
            trial = study.ask(dists)
            chosen = {p: _unchoice(trial.params[p], values) for p, values in params}
            key = json.dumps(chosen, sort_keys=True)
            if key not in seen:
                return chosen
            study.tell(trial, seen[key])
        return chosen  # a small space, all tried: the repeat pools with its twin in the report


def with_params(entry: object, point: dict[str, dict], key: str) -> object:
    """An attack entry with a search point's parameters set over its own (validated)."""
    import attacks as attack_lib

    cls, given = attack_lib.parse_attack(entry)
    if cls.name not in point:
        return entry
    new = {cls.name: {**given, **point[cls.name]}}
    try:
        attack_lib.parse_attack(new)
    except UserError as e:
        raise UserError(f"sweep file: key {f'{key}.{cls.name}'!r}: {e}") from None
    return new


def group_key(cell: Any) -> str:
    """A cell's grid point without its seed and its attack parameters (its mechanism seed is the
    seed's too)."""
    config = {k: v for k, v in cell.config.items() if k not in ("seed", "mechanism_seed", "attacks")}
    swept = {k: v for k, v in cell.swept.items() if k != "search:try"}
    return json.dumps([config, swept], sort_keys=True, default=str)


def _choice(value: object) -> object:
    # Optuna's categorical choices are None/bool/int/float/str: anything else goes as its JSON
    return value if value is None or isinstance(value, bool | int | float | str) else json.dumps(value)


def _unchoice(value: object, values: list) -> object:
    return next(v for v in values if _choice(v) == value)


def _point_of(entries: list, attack: str, params: list[str]) -> dict:
    """The searched parameters' values of ``attack`` in a try's attack entries (defaults filled)."""
    import attacks as attack_lib

    for cls, given in map(attack_lib.parse_attack, entries):
        if cls.name == attack:
            full = {**cls.defaults, **given}
            return {p: full.get(p) for p in params}
    return {}


def _mean_ap(cells: list, attack: str, results: dict[str, dict]) -> float | None:
    """The attack's mean AP over a try's seeds (the report's score), or None without evidence."""
    from securevfl.lab.scores import attack_performance

    values = []
    for c in cells:
        found = (results.get(c.run_id) or {}).get("attacks", {}).get(attack)
        if isinstance(found, dict):
            ap = attack_performance(found.get("metric"), found.get("value"))
            if ap == ap:  # not NaN
                values.append(ap)
    return sum(values) / len(values) if values else None
