"""Run configuration: nested dataclasses, one field per setting, each declared with
:func:`securevfl.configuration.settings.setting` (type, default, docstring, validation, flag).

A YAML file given with ``--config`` maps onto these (``data:``, ``partition:``, ``train:``,
``model:``, ``optim:`` sections plus top-level keys); unknown keys and wrong types are user errors naming the key.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass
from pathlib import Path

from securevfl.configuration.limits import brief, load_yaml, read_text_limited
from securevfl.configuration.options import DEVICES, DataConfig, ModelConfig, OptimConfig, PartitionSpec, TrainConfig
from securevfl.configuration.settings import setting
from securevfl.errors import UserError


@dataclass
class RunConfig:
    dataset: str = setting("digits", flag="--dataset", doc="""
        Registered dataset name (``securevfl datasets``); the default, scikit-learn's digits, ships with a
        dependency, so a bare ``securevfl train`` runs anywhere.""")
    method: str = setting("splitnn", flag="--method", doc="Registered method name (``securevfl methods``).")
    seed: int = setting(0, flag="--seed", ge=0, le=2**31 - 1, doc="""
        Fixes the partition, initialisation and batching (not the privacy mechanisms' noise; see
        mechanism_seed).""")
    passive_seeds: tuple[int, ...] = setting(factory=tuple, flag="--passive-seed", cli="append", metavar="N", ge=0,
                                             le=2**63 - 1, doc="""
        The simulated passive parties' own seeds (passive1's first): each passive party's initial
        weights and every draw it makes alone come from its own seed, which no other party knows.
        Unset: ``seed·1009 + k`` for passive party k, so a run reproduces from ``seed`` alone. A
        deployed passive party draws its own from the OS, or takes ``securevfl party --seed``; set
        the same values here (one ``--passive-seed`` per passive party, in order) to reproduce a deployed
        run in one process. The lab's attacks are never
        given them, except ``fr-init``, whose threat model is an active party that knows them.""")
    mechanism_seed: int | None = setting(None, flag="--mechanism-seed", metavar="N", ge=0, le=2**31 - 1, doc="""
        Fixes the privacy mechanisms' noise (RR flips, DP-SGD and embedding-DP noise, the private
        learning-rate choice) for debugging and exact tests. Unset (default): the noise comes from the
        OS CSPRNG and is never recorded. A run with it set is marked 'not private (mechanism seed
        fixed)'.""")
    he: str = setting("off", flag="--he", doc="""
        Cut-layer protection: ``off`` (plaintext), ``ckks``, ``bfv`` or ``paillier`` (the HE-protected
        interactive layer; ``bfv`` and ``paillier`` hide every mask by ≥ 40 bits, ``ckks`` by 12).""")
    he_params: dict = setting(factory=dict, flag="--he-param", cli="keyvalue", doc="""
        HE scheme parameters, e.g. ``{poly_modulus_degree: 8192}`` or ``{key_bits: 3072, packing: true}``;
        on the command line ``KEY=VALUE[,KEY=VALUE...]``, the flag repeatable (a key once).""")
    defense: str = setting("none", flag="--defense", doc="""
        Defense spec, e.g. ``iso:5`` or ``dp:clip=1,noise=1``; ``+`` composes.""")
    attacks: list[str | dict] = setting(factory=list, flag="--attack", cli="append", doc="""
        Attacks run on the trained federation: ``mc``, ``mc:n_aux=40,steps=600`` or ``{mc: {n_aux: 40}}``;
        on the command line one ``NAME`` or ``NAME:key=value,...`` per flag (repeatable).""")
    record: bool = setting(False, flag="--record", doc="""
        Keep the full channel transcript (needed by transcript attacks and invariant checks).""")
    device: str = setting("cpu", flag="--device", choices=DEVICES, doc="""
        Where every party's models, batches and per-example gradients live: ``cpu``, ``cuda``, ``mps``, or
        ``auto`` (CUDA when available, else MPS, else the CPU). Messages still cross as bytes, HE and the
        interactive layer run on the CPU, and defense noise is drawn on the CPU. The default is ``cpu``:
        the same command gives the same numbers on every machine (GPU kernels differ in the last bits);
        ``auto`` opts in. A device this machine lacks is an error. The run's JSON records the one used as
        ``cost.device``.""")
    audit: dict = setting(factory=dict, flag="--audit", cli="keyvalue", doc="""
        One-run privacy audit (docs/audit.md): ``canaries=M`` swaps M canary labels for an alternative
        with probability ½ each and reports ``privacy.audit.epsilon_lower``, an empirical ε lower bound
        beside the claimed ε; ``side=features`` audits passive1's feature rows (embedding-dp) instead.
        Also ``attack`` (``all``: every scorer that applies; ``aux-axis``, ``direction``, ``norm``:
        binary; ``prototype``; ``dli``: agg head), ``confidence`` (0.95; 0.5 to 0.9999), ``guesses`` (2 to
        the canaries; unset: a fixed schedule), ``mode`` (``natural``; ``gradient``: white-box gradient
        canaries in dp's release) and ``analysis`` (``binomial``; ``fdp``: the f-DP bound of a Gaussian
        claim). On the command line ``KEY=VALUE[,KEY=VALUE...]``, the flag repeatable.""")
    method_params: dict = setting(factory=dict, flag="--method-param", cli="keyvalue", doc="""
        Method-specific hyperparameters, e.g. ``evidential: false`` (risa), ``alpha: 0.5`` (fedud); on the
        command line ``KEY=VALUE[,KEY=VALUE...]``, the flag repeatable (a key once).""")
    data: DataConfig = setting(factory=DataConfig, doc="Which data is read and how.")
    partition: PartitionSpec = setting(factory=PartitionSpec, doc="""
        How the entities and columns are split across parties (sweep files: keys of the ``dataset``
        section, ``parties`` and ``labeled`` for ``n_parties`` and ``n_labeled``).""")
    train: TrainConfig = setting(factory=TrainConfig, doc="The training loop.")
    model: ModelConfig = setting(factory=ModelConfig, doc="Every party's bottom model and the active party's head.")
    optim: OptimConfig = setting(factory=OptimConfig, doc="Every party's optimizer.")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# top-level run settings that are no grid axis of a sweep (record, mechanism_seed, ...): every cell gets the
# value, so a new top-level setting is a sweep key without an edit there
RUN_KEYS = tuple(f.name for f in dataclasses.fields(RunConfig) if not dataclasses.is_dataclass(f.default_factory)
                 and f.name not in {"dataset", "method", "seed", "he", "he_params", "defense", "attacks",
                                    "method_params"})
"""The top-level run settings a sweep file sets for every cell (securevfl/lab/sweep.py)."""


def _coerce(value: object, typ: object, key: str) -> object:
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(typ)
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except UserError:
                continue
        raise UserError(f"config key {key!r}: {brief(value)} is not a valid {typ}")
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise UserError(f"config key {key!r}: expected a list, got {brief(value)}")
        return origin(value)
    if origin is dict or typ is dict:
        if not isinstance(value, dict):
            raise UserError(f"config key {key!r}: expected a mapping, got {brief(value)}")
        return value
    if typ is bool:
        if not isinstance(value, bool):
            raise UserError(f"config key {key!r}: expected true/false, got {brief(value)}")
        return value
    if typ in (int, float):
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                or (typ is int and value != int(value)):
            raise UserError(f"config key {key!r}: expected a finite {typ.__name__}, got {brief(value)}")
        return typ(value)
    if typ is str:
        if not isinstance(value, str):
            raise UserError(f"config key {key!r}: expected a string, got {brief(value)}")
        return value
    return value


def apply_dict(obj: typing.Any, data: dict, prefix: str = "") -> None:
    """Set dataclass fields of ``obj`` from ``data``, recursing into nested dataclasses."""
    if not isinstance(data, dict):
        raise UserError(f"config section {prefix.rstrip('.') or '(top)'} must be a mapping")
    hints = typing.get_type_hints(type(obj))
    fields = {f.name for f in dataclasses.fields(obj)}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name not in fields:
            raise UserError(f"config: unknown key {prefix + str(key)!r}")
        current = getattr(obj, name)
        if dataclasses.is_dataclass(current):
            apply_dict(current, value, f"{prefix}{key}.")
        else:
            setattr(obj, name, _coerce(value, hints[name], prefix + str(key)))


def load_config_file(path: str | Path, what: str = "config file") -> dict:
    """A YAML config (or sweep) file as a mapping, read under the limits of :mod:`securevfl.configuration.limits`."""
    p = Path(path)
    if not p.exists() or p.is_dir():  # exists(), not is_file(): also accept pipes like <(...)
        raise UserError(f"{what} {p} not found")
    text = read_text_limited(p, what)
    try:
        data = load_yaml(text) or {}
    except UserError as e:
        raise UserError(f"{what} {p} {e}" if str(e).startswith("line ") else f"{what} {p}: {e}") from None
    if not isinstance(data, dict):
        raise UserError(f"{what} {p}: top level must be a mapping")
    return data
