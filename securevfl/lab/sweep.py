"""Sweep files: YAML → a grid of resolved run configurations, one per (cell, seed).

Pure functions only: parsing and expansion. Running the cells lives in :mod:`engine`, keeping
their results in :mod:`store`.

Over 600 lines (697) in one file because the sweep grammar's keys, their checks and their expansion into
cells read one another (each key's error names its place in the file, each expansion the checked
value); the attack-search sampler is the part to move out next.

Keys (errors name the offending key, e.g. ``defenses[2].dp.noise``):

- ``name``: the sweep's name (default store ``runs/<name>.sqlite``).
- ``dataset``: ``{name, parties, aligned_fraction, labeled, ...}``; any partition key
  (``aligned_count``, ``unaligned``, ``test_aligned_fraction``, ``columns``, ...) or data key
  (``path``, ``dir``, ``max_rows``, ``sample``, ...). A list value sweeps that key (e.g.
  ``aligned_fraction: [0.1, 0.2]``; the report then plots utility against it).
- ``methods``: names, or one-key mappings ``{fedhssl: {ssl_epochs: 5}}`` giving method parameters.
- ``defenses``: ``none``, a spec string (``iso:5``), or one-key mappings whose list-valued
  parameter is the strength axis: ``{iso: [1, 5, 25]}``, ``{dp: {clip: 1.0, noise: [0.5, 1.0]}}``.
- ``attacks``: attack names, specs (``mc:n_aux=20``) or one-key mappings ``{mc: {n_aux: 20, steps: 600}}``;
  a list value sweeps that parameter (``{mc: {n_aux: [20, 80]}}``: one cell per value, the swept key
  shows as ``mc:n_aux``); ``he``: ``off`` / ``ckks`` / ``bfv`` / ``paillier`` or a list of them, each optionally
  with parameters (``{paillier: {key_bits: 2048}}``, as ``--he-param``);
  ``seeds``: list of ints; ``train``, ``model``, ``optim``: sections of the run config (a list given
  for a scalar ``model`` key sweeps it like a strength, e.g. ``model: {cut: [1, 2, 3]}``, shown as
  ``model.cut``); ``record``,
  ``mechanism_seed`` (:data:`RUN_KEYS`): top-level run settings.
- ``save``: ``DIR`` or ``{dir: DIR, methods: [...], seeds: [...]}``: the chosen cells' parties save the
  trained federation into ``DIR/<run id>/<party>/`` (as ``train --save``; ``securevfl predict`` scores with it).
- ``attack_search``: the worst-case attacker, ``{budget: N, seed: S, space: {mc: {n_aux: [20, 80],
  steps: [200, 600]}}}``: every cell also runs ``N − 1`` further tries, each a point of the listed
  attacks' parameter grid drawn by a seeded random search (the whole grid when it is smaller); try 0
  is the ``attacks`` entry as written. ``N`` is at most :data:`MAX_SEARCH_BUDGET` (10,000 tries per
  cell); a space's values are listed without repeats. The grid is never built: up to
  :data:`SEARCH_PERMUTED_MAX` points its indices are permuted, a larger space (any size) is sampled
  lazily. Each try is its own stored row (swept key ``search:try``); the
  report scores each cell with the try whose mean attack performance is largest, and names it.
  ``searcher: tpe`` asks Optuna's TPE for the tries after try 0, round by round
  (:mod:`securevfl.lab.search`); its later tries count towards ``max_cells`` too.
- ``mechanism_seed``: debugging only: fixes the privacy mechanisms' noise. Each cell gets its own
  mechanism seed derived from this one and the cell's configuration, so no two cells (nor two
  seeds of one cell) share noise; every such run is marked "not private (mechanism seed fixed)".
  Without it (the default) every cell draws its noise from the OS CSPRNG.

Why one file (about 680 lines): the sweep file's schema, its validation (messages naming the key
and line) and the expansion into cells read the same YAML nodes.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import json
import math
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from securevfl.config import RUN_KEYS, RunConfig, apply_dict, load_config_file
from securevfl.configuration.limits import brief
from securevfl.configuration.options import DataConfig, PartitionSpec
from securevfl.configuration.validate import number
from securevfl.errors import UserError
from securevfl.interactive import mixing_for
from securevfl.lab.search import with_params

if TYPE_CHECKING:
    from securevfl.lab.search import TPESearch

# keys of the ``dataset`` section that go to the data config rather than the partition spec
_DATA_KEYS = {"path", "dir", "max_rows", "sample", "min_freq", "hash_buckets", "party_files", "id_column",
              "label_column", "task", "id_columns", "drop_columns", "categorical", "numeric"}
# list-valued data settings: a list of names is the value itself; only a list of such lists sweeps them
_LIST_KEYS = {"party_files", "id_columns", "drop_columns", "categorical", "numeric"}
_PARTITION_ALIASES = {"parties": "n_parties", "labeled": "n_labeled"}
_GRID_KEYS = {"name", "dataset", "methods", "defenses", "attacks", "attack_search", "he", "seeds", "train", "model",
              "optim", "save", "max_cells"}
_TOP_KEYS = _GRID_KEYS | set(RUN_KEYS)


@dataclass
class Cell:
    """One (method, defense strength, swept values, seed) run, fully resolved."""

    method: str
    defense: str
    family: str
    strength: float | None
    seed: int
    he: str
    config: dict
    """``RunConfig.to_dict()`` of the run; its hash is the run id."""
    swept: dict = field(default_factory=dict)
    save: str | None = None
    """Where the cell's parties save the trained federation (the sweep's ``save`` key), or None; not
    part of the run id (saving does not change the run)."""

    @property
    def run_id(self) -> str:
        return run_id(self.config)


@dataclass
class Sweep:
    name: str
    cells: list[Cell]
    swept_keys: list[str]
    search: TPESearch | None = None
    """A library-driven attack search's later rounds (``attack_search.searcher: tpe``), run by the engine."""


HASH_EXEMPT_DEFAULTS: dict[tuple[str, ...], object] = {("model", "cut"): None, ("data", "task"): "auto",
                                                         ("model", "head"): "split",
                                                         ("audit",): {}, ("device",): "cpu",
                                                         ("model", "interactive_mixing"): "off",
                                                         ("passive_seeds",): [], ("partition", "train_rows"): None,
                                                         ("data", "hashed_ids"): False}
"""Settings added after stores and golden results were recorded (path in the config dict → default):
left out of the run id while at their default, so existing run ids, and the mechanism seeds derived
from them, stay as they were; a non-default value is hashed like any other."""


def run_id(config: dict) -> str:
    """Hash of the resolved configuration: equal configs share a row, whatever the sweep file."""
    hashed = dict(config)
    model = hashed.get("model")
    if isinstance(model, dict) and model.get("interactive_mixing") == "auto":  # hashed as what it resolves to
        hashed["model"] = {**model, "interactive_mixing": mixing_for("auto", str(hashed.get("he", "off")))}
    for path, default in HASH_EXEMPT_DEFAULTS.items():
        parent = hashed
        for key in path[:-1]:  # copy the dicts along the path: the caller's config is not changed
            if not isinstance(parent.get(key), dict):
                break
            parent[key] = parent = dict(parent[key])
        else:
            if json.dumps(parent.get(path[-1], default), default=str) == json.dumps(default):  # () and [] alike
                parent.pop(path[-1], None)
    return hashlib.sha256(json.dumps(hashed, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _fail(key: str, problem: str) -> UserError:
    return UserError(f"sweep file: key {key!r}: {problem}")


def _as_list(value: object, key: str) -> list:
    if isinstance(value, list):
        if not value:
            raise _fail(key, "empty list")
        return value
    return [value]


def spec_number(x: float) -> str:
    """A strength as written into a defense spec: ``:g`` (so existing stores keep their run IDs),
    but never with an exponent's ``+`` — the defense parser reads ``+`` as composition, so
    ``1e+06`` would split into ``1e`` and ``06``."""
    text = f"{x:g}"
    return np.format_float_positional(x, trim="-") if "e+" in text else text


def _spec_value(v: float | str) -> str:
    return v if isinstance(v, str) else spec_number(v)


def _number(v: object, key: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise _fail(key, f"expected a number, got {v!r}")
    return float(v)


def expand_defenses(entries: object) -> list[tuple[str, str, float | None]]:
    """Sweep-file defenses → ``(spec string, family, strength)`` for each strength."""
    out: list[tuple[str, str, float | None]] = []
    for i, entry in enumerate(_as_list(entries if entries is not None else ["none"], "defenses")):
        key = f"defenses[{i}]"
        if isinstance(entry, str):
            family = entry.split(":", 1)[0].strip()
            strength = None
            if ":" in entry and "=" not in entry.split(":", 1)[1]:
                try:
                    strength = float(entry.split(":", 1)[1])
                except ValueError:
                    raise _fail(key, f"cannot read strength of {entry!r}") from None
            out.append((entry.strip(), family, strength))
            continue
        if not isinstance(entry, dict) or len(entry) != 1:
            raise _fail(key, "expected 'none', a spec like 'iso:5', or a one-key mapping like {iso: [1, 5]}")
        (family, params), = entry.items()
        key = f"{key}.{family}"
        if isinstance(params, dict):
            swept = [k for k, v in params.items() if isinstance(v, list)]
            if len(swept) > 1:
                raise _fail(key, f"one strength list per defense, got lists for {', '.join(swept)}")
            # a fixed parameter may be a word (dp's accountant, laplace's on); the defense checks it
            fixed: dict[str, float | str] = {k: v if isinstance(v, str) else _number(v, f"{key}.{k}")
                                             for k, v in params.items() if k not in swept}
            values = _as_list(params[swept[0]], f"{key}.{swept[0]}") if swept else [None]
            for v in values:
                point = dict(fixed)  # this strength's parameter values
                if swept:
                    point[swept[0]] = _number(v, f"{key}.{swept[0]}")
                spec = f"{family}:" + ",".join(f"{k}={_spec_value(point[k])}" for k in point)
                out.append((spec, family, None if v is None else float(v)))
        else:
            for v in _as_list(params, key):
                s = _number(v, key)
                out.append((f"{family}:{spec_number(s)}", family, s))
    return out


def _validate_defenses(defenses: list[tuple[str, str, float | None]]) -> None:
    import defenses as defense_lib  # the lab's composition layer may import the defense package

    for spec, _, _ in defenses:
        try:
            defense_lib.parse_defense(spec)
        except UserError as e:
            raise _fail(f"defenses ({spec})", str(e)) from None


def expand_attacks(entries: object, cap: int | None = None) -> list[tuple[list, dict]]:
    """Sweep-file attacks → one ``(attack entries, swept values)`` pair per combination of the
    parameter lists (``{mc: {n_aux: [20, 80]}}`` → two); each entry is validated like ``--attack``.
    More combinations than ``cap`` (the sweep's cell cap) are refused before any is built."""
    import attacks as attack_lib  # the lab's composition layer may import the attack package

    if entries is None:
        return [([], {})]
    if not isinstance(entries, list):
        raise _fail("attacks", "expected a list of attack names, specs or {name: {param: value}} mappings")
    fixed: list[tuple[str, str, dict]] = []  # (key, name, params)
    axes: dict[tuple[int, str], list] = {}
    entry: object  # a YAML attack entry, then the one a variant passes to parse_attack
    for i, entry in enumerate(entries):
        key = f"attacks[{i}]"
        if isinstance(entry, dict) and len(entry) == 1:
            (name, params), = entry.items()
            params = {} if params is None else params
            if not isinstance(params, dict):
                raise _fail(f"{key}.{name}", "attack parameters must be a mapping")
            for k, v in params.items():
                if isinstance(v, list):
                    axes[(i, str(k))] = _as_list(v, f"{key}.{name}.{k}")
            fixed.append((key, str(name), params))
        elif isinstance(entry, str):
            fixed.append((key, entry, {}))
        else:
            raise _fail(key, "expected an attack name, a spec like 'mc:n_aux=20' or {name: {param: value}}")
    n = math.prod(len(v) for v in axes.values())
    if cap is not None and n > cap:
        raise _fail("max_cells", f"the attacks' parameter lists make {n:,} combinations "
                                 f"({' × '.join(str(len(v)) for v in axes.values())}), more than {cap:,} cells; "
                                 f"if you mean it, set max_cells: {n} or more in the sweep file")
    variants = []
    for combo in itertools.product(*axes.values()) if axes else [()]:
        chosen = dict(zip(axes, combo, strict=True))
        out, swept = [], {}
        for i, (key, name, params) in enumerate(fixed):
            entry = name
            if isinstance(entries[i], dict):
                entry = {name: {k: chosen.get((i, k), v) for k, v in params.items()}}
            try:
                cls, _ = attack_lib.parse_attack(entry)
            except UserError as e:
                raise _fail(key, str(e)) from None
            swept.update({f"{cls.name}:{k}": v for (j, k), v in chosen.items() if j == i})
            out.append(entry)
        variants.append((out, swept))
    return variants


def _search_spec(search: object) -> tuple[int, int, list[tuple[str, str, list]], str]:
    """``attack_search`` checked: budget, seed, the space's (attack, parameter, values) axes, searcher."""
    if not isinstance(search, dict):
        raise _fail("attack_search", "expected {budget: N, seed: S, space: {attack: {param: [values]}}}")
    unknown = set(search) - {"budget", "seed", "space", "searcher"}
    if unknown:
        raise _fail(f"attack_search.{sorted(unknown)[0]}", "unknown key; expected budget, seed, space, searcher")
    budget, seed = search.get("budget", 4), search.get("seed", 0)
    for key, v, low in (("budget", budget, 1), ("seed", seed, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise _fail(f"attack_search.{key}", f"expected an integer ≥ {low}, got {brief(v)}")
    if budget > MAX_SEARCH_BUDGET:
        raise _fail("attack_search.budget", f"{budget:,} tries per cell is more than the maximum of "
                                            f"{MAX_SEARCH_BUDGET:,}")
    from securevfl.lab.search import SEARCHERS, require_optuna

    searcher = search.get("searcher", "random")
    if searcher not in SEARCHERS:
        raise _fail("attack_search.searcher", f"expected one of {', '.join(SEARCHERS)}, got {searcher!r}")
    if searcher == "tpe":
        require_optuna()  # named before any cell runs
    space = search.get("space")
    if not isinstance(space, dict) or not space:
        raise _fail("attack_search.space", "expected a mapping {attack: {param: [values]}}")
    axes: list[tuple[str, str, list]] = []
    for name, params in space.items():
        if not isinstance(params, dict) or not params:
            raise _fail(f"attack_search.space.{name}", "expected a mapping {param: [values]}")
        for k, v in params.items():
            key = f"attack_search.space.{name}.{k}"
            values = _as_list(v, key)
            seen: set[str] = set()
            for x in values:  # a repeat adds no point to search, only draws that find nothing new
                canonical = json.dumps(x, sort_keys=True, default=str)
                if canonical in seen:
                    raise _fail(key, f"value {brief(x)} is listed twice")
                seen.add(canonical)
            axes.append((str(name), str(k), values))
    return budget, seed, axes, searcher


MAX_SEARCH_BUDGET = 10_000
"""The most tries per cell an ``attack_search`` may ask for (each try is a stored run)."""

SEARCH_PERMUTED_MAX = 1_000_000
"""A random search's space of up to this many points is drawn as a seeded permutation of its indices
(as it always was: a store keeps its tries); a larger space is sampled lazily, never enumerated."""


def _space_size(axes: list[tuple[str, str, list]]) -> int:
    """The number of points of the space's grid, by multiplication (an exact Python integer)."""
    return math.prod(len(values) for _, _, values in axes)


def _grid_point(axes: list[tuple[str, str, list]], index: int) -> dict[str, dict]:
    """Point ``index`` of the space's grid in ``itertools.product`` order (the last axis varies
    fastest), without building the grid."""
    digits = []
    for _, _, values in reversed(axes):
        index, r = divmod(index, len(values))
        digits.append(r)
    point: dict[str, dict] = {}
    for (name, k, values), r in zip(axes, reversed(digits), strict=True):
        point.setdefault(name, {})[k] = values[r]
    return point


def _lazy_draws(n: int, seed: int, budget: int) -> Iterator[int]:
    """Distinct indices of a grid of ``n`` > :data:`SEARCH_PERMUTED_MAX` points, seeded, drawn one by
    one; at most ``20 × budget`` draws (a space whose points mostly repeat one another ends early)."""
    rng = random.Random(seed)
    drawn: set[int] = set()
    for _ in range(20 * budget):
        i = rng.randrange(n)
        if i not in drawn:
            drawn.add(i)
            yield i


def expand_search(search: object, variants: list[tuple[list, dict]],
                  cap: int | None = None) -> list[tuple[list, dict]]:
    """``attack_search`` → each attack variant followed by its search tries (swept ``search:try``).

    ``searcher: random`` (the default): a plain seeded random search over the grid of ``space``, every
    try expanded here as ordinary cells; try 0 is the variant itself, so a sweep that gains a search
    keeps its rows. Tries repeating an earlier point are skipped. ``searcher: tpe``: only try 0 here;
    the later tries are asked of Optuna round by round as results arrive
    (:class:`securevfl.lab.search.TPESearch`). More tries in all than ``cap`` (the sweep's cell cap)
    are refused as soon as they are counted. The space's grid is never built (see
    :data:`SEARCH_PERMUTED_MAX`)."""
    import attacks as attack_lib

    budget, seed, axes, searcher = _search_spec(search)
    size = _space_size(axes)
    permuted = np.random.default_rng(seed).permutation(size) if searcher == "random" \
        and size <= SEARCH_PERMUTED_MAX else None
    out: list[tuple[list, dict]] = []
    for entries, swept in variants:
        names = [attack_lib.parse_attack(e)[0].name for e in entries]
        missing = sorted({n for n, _, _ in axes} - set(names))
        if missing:
            raise _fail(f"attack_search.space.{missing[0]}", "not in this sweep's attacks")
        tries = [(entries, {**swept, "search:try": 0})]
        for (a, k, values) in axes:  # every value must be one the attack takes, before anything runs
            for v in values:
                with_params(next(e for e in entries if attack_lib.parse_attack(e)[0].name == a), {a: {k: v}},
                             "attack_search.space")
        seen = {_attack_key(entries)}
        order: Iterable[int] = [] if searcher != "random" else permuted if permuted is not None \
            else _lazy_draws(size, seed, budget)
        for i in order:
            if len(tries) >= budget:
                break
            tried = [with_params(e, _grid_point(axes, int(i)), "attack_search.space") for e in entries]
            if _attack_key(tried) not in seen:
                seen.add(_attack_key(tried))
                tries.append((tried, {**swept, "search:try": len(tries)}))
                if cap is not None and len(out) + len(tries) > cap:  # refused as soon as counted
                    raise _fail("max_cells", f"the attack search alone makes more than {cap:,} cells "
                                             f"({len(variants):,} attack variants × up to {budget:,} tries); if "
                                             f"you mean it, set max_cells: {len(variants) * budget} in the sweep file")
        out += tries
    return out


def search_plan(search: object, cells: list[Cell]) -> TPESearch | None:
    """The sequential rounds of a ``searcher: tpe`` search over these (try-0) cells; None otherwise."""
    if search is None:
        return None
    budget, seed, axes, searcher = _search_spec(search)
    if searcher != "tpe" or budget < 2:
        return None
    from securevfl.lab.search import TPESearch

    plan = TPESearch(axes, budget, seed)
    plan.add_first(cells)
    return plan


def _attack_key(entries: list) -> str:
    """Entries as the typed parameters they run with (to tell repeated search points apart)."""
    import attacks as attack_lib

    return json.dumps([[c.name, {**c.defaults, **p}] for c, p in map(attack_lib.parse_attack, entries)],
                      sort_keys=True, default=str)


def _methods(entries: object) -> list[tuple[str, dict]]:
    from securevfl.methods import METHODS

    out = []
    params: dict
    for i, entry in enumerate(_as_list(entries, "methods")):
        if isinstance(entry, str):
            name, params = entry, {}
        elif isinstance(entry, dict) and len(entry) == 1:
            (name, params), = entry.items()
            if not isinstance(params, dict):
                raise _fail(f"methods[{i}].{name}", "method parameters must be a mapping")
        else:
            raise _fail(f"methods[{i}]", "expected a method name or {name: {param: value}}")
        try:
            METHODS.get(name)
        except UserError as e:
            raise _fail(f"methods[{i}]", str(e)) from None
        out.append((name, params))
    return out


@dataclass
class _Grid:
    """The sweep's non-dataset axes, each already expanded and validated."""

    methods: list[tuple[str, dict]]
    defenses: list[tuple[str, str, float | None]]
    he_modes: list[tuple[str, dict]]
    attack_variants: list[tuple[list, dict]]
    seeds: list[int]


def parse_sweep(data: dict, source: str = "sweep") -> Sweep:
    """Expand a sweep mapping into cells (the grid × seeds), each a resolved ``RunConfig`` dict.
    Single-party baselines (``local``) run once per seed with no defense, HE or attack."""
    name = _check_top_level(data, source)
    ds = _dataset_section(data.get("dataset"))
    methods = _methods(data.get("methods"))
    defenses = expand_defenses(data.get("defenses"))
    _validate_defenses(defenses)
    cap = _cell_cap(data)
    attack_variants = expand_attacks(data.get("attacks"), cap)
    if data.get("attack_search") is not None:
        attack_variants = expand_search(data["attack_search"], attack_variants, cap)
    he_modes = _he_modes(data.get("he", "off"))
    seeds = _seeds(data.get("seeds", [0]))
    base, data_axes = _base_config(ds, data)
    _check_size(data, [len(v) for v in data_axes.values()] + [len(methods), len(defenses), len(he_modes),
                                                            len(attack_variants) * _later_tries(data), len(seeds)])
    cells = _expand_cells(base, data_axes, _Grid(methods, defenses, he_modes, attack_variants, seeds))
    if data.get("mechanism_seed") is not None:
        cells = [_with_mechanism_seed(c, _mechanism_seed(data["mechanism_seed"])) for c in cells]
    if data.get("save") is not None:
        cells = _with_save(cells, data["save"])
    return Sweep(name, cells, list(data_axes) + [k for k in attack_variants[0][1] if k != "search:try"],
                 search_plan(data.get("attack_search"), cells))


def _later_tries(data: dict) -> int:
    """How many tries each attack variant becomes in the run: a ``searcher: tpe`` search's budget (its
    later tries are asked round by round, so they are not among the expanded cells), else 1."""
    search = data.get("attack_search")
    if search is None:
        return 1
    budget, _, _, searcher = _search_spec(search)
    return budget if searcher == "tpe" else 1


def _mechanism_seed(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31:
        raise _fail("mechanism_seed", f"expected an integer in [0, 2147483647], got {value!r}")
    return value


def _with_mechanism_seed(cell: Cell, sweep_seed: int) -> Cell:
    """The cell with its own fixed mechanism seed: a hash of the sweep's one and of the cell's whole
    configuration (seed included), so cells never share noise."""
    digest = hashlib.sha256(f"{sweep_seed}/{run_id(cell.config)}".encode()).digest()
    config = {**cell.config, "mechanism_seed": int.from_bytes(digest[:4], "little") % 2**31}
    return Cell(cell.method, cell.defense, cell.family, cell.strength, cell.seed, cell.he, config, cell.swept)


def _with_save(cells: list[Cell], value: object) -> list[Cell]:
    """``save: DIR`` (every cell) or ``save: {dir: DIR, methods: [...], seeds: [...]}`` (the chosen
    cells): each chosen cell's parties save into ``DIR/<run id>/<party>/`` (``train --save``)."""
    spec = {"dir": value} if isinstance(value, str) else value
    if not isinstance(spec, dict) or not isinstance(spec.get("dir"), str) or set(spec) - {"dir", "methods", "seeds"}:
        raise _fail("save", "expected a folder, or a mapping with dir and optionally methods and seeds")
    methods = None if spec.get("methods") is None else [str(m) for m in _as_list(spec["methods"], "save.methods")]
    seeds = None if spec.get("seeds") is None else _seeds(spec["seeds"])
    return [dataclasses.replace(c, save=str(Path(spec["dir"]) / c.run_id))
            if (methods is None or c.method in methods) and (seeds is None or c.seed in seeds) else c for c in cells]


def _check_top_level(data: object, source: str) -> str:
    """The top level is a mapping of known keys with a usable ``name``; returns that name."""
    if not isinstance(data, dict):
        raise UserError(f"{source}: top level must be a mapping")
    unknown = set(data) - _TOP_KEYS
    if unknown:
        key = sorted(unknown)[0]
        data_keys = {f.name for c in (DataConfig, PartitionSpec) for f in dataclasses.fields(c)}
        if key in data_keys | {"data", "partition"}:  # a section of the run config that a sweep file nests
            raise _fail(key, "data and partition keys go under `dataset:` (your own files: dataset: {name: csv, "
                             "party_files: [ACTIVE.csv, PASSIVE.csv], label_column: y}; docs/lab.md, \"Your own "
                             "files\", and sweeps/templates/compare-methods.yaml)")
        raise _fail(key, f"unknown key; expected one of {', '.join(sorted(_TOP_KEYS))}")
    name = data.get("name")
    # the name becomes a file name (runs/<name>.sqlite): no path separators, control characters (NUL
    # included) or leading dot, and a length every file system takes
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name.startswith(".") \
            or len(name) > 200 or any(not ch.isprintable() for ch in name):
        raise _fail("name", "a non-empty name (at most 200 printable characters, no '/', '\\' or leading '.') "
                            "is required")
    return name


def _dataset_section(ds: object) -> dict:
    """``dataset``: a name, or a mapping with at least ``name``."""
    if isinstance(ds, str):
        ds = {"name": ds}
    if not isinstance(ds, dict) or "name" not in ds:
        raise _fail("dataset", "expected a mapping with at least 'name'")
    return ds


def _seeds(value: object) -> list[int]:
    seeds = _as_list(value, "seeds")
    for i, s in enumerate(seeds):
        if isinstance(s, bool) or not isinstance(s, int):
            raise _fail(f"seeds[{i}]", f"expected an integer, got {s!r}")
    return seeds


def _base_config(ds: dict, data: dict) -> tuple[RunConfig, dict[str, list]]:
    """The configuration every cell starts from (fixed dataset keys, ``train``/``model``/``optim``
    sections), and the dataset keys given as lists: the swept data axes."""
    base = RunConfig(dataset=str(ds["name"]))
    fixed: dict[str, dict] = {"partition": {}, "data": {}}
    axes: dict[str, list] = {}
    for k, v in ds.items():
        if k == "name":
            continue
        if k == "columns" or not isinstance(v, list) or (k in _LIST_KEYS and not _is_list_axis(v)):
            section = "data" if k in _DATA_KEYS else "partition"
            if k in _LIST_KEYS and len(v) == 1 and isinstance(v[0], list):
                v = v[0]  # [[guest.csv, host.csv]]: one value written as a one-point list, not an axis
            fixed[section][_PARTITION_ALIASES.get(k, k)] = v
        else:
            axes[k] = _as_list(v, f"dataset.{k}")
    for section in ("train", "model", "optim"):
        if section in data:
            fixed[section] = data[section]
    if isinstance(fixed.get("model"), dict):  # a list for a scalar model key (the cut position) is an axis
        for k, v in list(fixed["model"].items()):
            if isinstance(v, list) and not isinstance(getattr(base.model, k, None), tuple | list):
                axes[f"model.{k}"] = _as_list(fixed["model"].pop(k), f"model.{k}")
    try:
        apply_dict(base, {k: data[k] for k in RUN_KEYS if k in data})
    except UserError as e:
        raise UserError(f"sweep file: {e}") from None
    for section, values in fixed.items():
        try:
            apply_dict(getattr(base, section), values, f"{'dataset' if section in ('partition', 'data') else section}.")
        except UserError as e:
            raise UserError(f"sweep file: {e}") from None
    return base, axes


MAX_CELLS = 5000
"""A sweep larger than this is refused unless its file says ``max_cells: N`` (a typo such as a seed
range of 30,000 would otherwise expand for minutes in silence and then run for weeks)."""


def _check_size(data: dict, axis_lengths: list[int]) -> None:
    """Refuse, before expanding, a grid over the cap (the product of its axes bounds its cells)."""
    n = math.prod(axis_lengths)
    cap = _cell_cap(data)
    if n > cap:
        raise _fail("max_cells", f"the grid has up to {n:,} cells ({' × '.join(map(str, axis_lengths))}), more than "
                                 f"{cap:,}; if you mean it, set max_cells: {n} in the sweep file")


def _cell_cap(data: dict) -> int:
    """The sweep's cell cap: its ``max_cells``, else :data:`MAX_CELLS`."""
    if data.get("max_cells") is not None:
        return int(number("sweep key max_cells", data["max_cells"], integer=True, ge=1))
    return MAX_CELLS


def _is_list_axis(v: list) -> bool:
    """A list-valued key is swept only by a list of at least two lists."""
    return len(v) > 1 and all(isinstance(x, list) for x in v)


def _expand_cells(base: RunConfig, data_axes: dict[str, list], grid: _Grid) -> list[Cell]:
    """One cell per point of data axes × methods × defenses × HE × attack variants × seeds."""
    from securevfl.methods import METHODS

    cells: list[Cell] = []
    for combo in itertools.product(*data_axes.values()) if data_axes else [()]:
        data_swept = dict(zip(data_axes, combo, strict=True))
        for (method, params), (spec, family, strength), (he, he_params), (attack_list, attack_swept), seed in \
                itertools.product(grid.methods, grid.defenses, grid.he_modes, grid.attack_variants, grid.seeds):
            swept = {**data_swept, **attack_swept}
            if not METHODS.get(method).uses_passives:
                # a single-party baseline (``local``) has no cut layer to defend, encrypt, attack or
                # audit: one plain run per seed, shown in the report as a reference utility
                if (spec, (he, he_params), attack_list) != (grid.defenses[0][0], grid.he_modes[0],
                                                            grid.attack_variants[0][0]):
                    continue
                spec, family, strength, he, he_params, attack_list, swept = ("none", "none", None, "off", {}, [],
                                                                             data_swept)
            cfg = copy.deepcopy(base)
            cfg.method, cfg.defense, cfg.he, cfg.seed = method, spec, he, int(seed)
            cfg.he_params = dict(he_params)
            cfg.method_params = dict(params)
            cfg.attacks = copy.deepcopy(attack_list)
            if not METHODS.get(method).uses_passives:
                cfg.audit = {}
            _apply_data_point(cfg, data_swept)
            cells.append(Cell(method, spec, family, strength, int(seed), he, cfg.to_dict(), swept))
    return cells


def _apply_data_point(cfg: RunConfig, data_swept: dict) -> None:
    """Set one point of the swept dataset keys on a cell's configuration."""
    for k, v in data_swept.items():
        section = cfg.model if k.startswith("model.") else cfg.data if k in _DATA_KEYS else cfg.partition
        try:
            if k.startswith("model."):
                apply_dict(section, {k.removeprefix("model."): v}, "model.")
                continue
            apply_dict(section, {_PARTITION_ALIASES.get(k, k): v}, "dataset.")
        except UserError as e:
            raise UserError(f"sweep file: {e}") from None


def _he_modes(value: object) -> list[tuple[str, dict]]:
    """``he``: a scheme, or a list of schemes each a name or ``{paillier: {key_bits: 2048}}``."""
    from securevfl.cutlayer import CUT_LAYERS, refuse_test_fixtures

    out = []
    for i, h in enumerate(_as_list(value, "he")):
        key = f"he[{i}]" if isinstance(value, list) else "he"
        params: dict = {}
        if isinstance(h, dict):
            if len(h) != 1 or not isinstance(next(iter(h.values())) or {}, dict):
                raise _fail(key, "expected a scheme name or a one-key mapping {scheme: {param: value}}")
            (h, params), = h.items()
            params = dict(params or {})
        name = str(h).lower() if h is not False else "off"
        if name not in CUT_LAYERS.names():
            raise _fail(key, f"{name!r} is not available; available: {', '.join(CUT_LAYERS.names())}")
        if params and name == "off":
            raise _fail(key, "off takes no parameters")
        refuse_test_fixtures(params, f"sweep file: key {key!r}")
        out.append((name, params))
    return out


def load_sweep(path: str | Path) -> Sweep:
    p = Path(path)
    data = load_config_file(p, "sweep file")
    return parse_sweep(data, str(p))


def config_from_dict(d: dict) -> RunConfig:
    """Rebuild a ``RunConfig`` from ``to_dict()`` output (in a worker process)."""
    cfg = RunConfig()
    apply_dict(cfg, d)
    return cfg
