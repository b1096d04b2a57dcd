"""A deployed passive party's own bottom model, optimiser, learning rates and columns (issue 60).

The active party's run description used to fix them for every party; a hostile active party then
chose a one-layer linear bottom, a 1-wide cut, Adam at a rate of its choosing and the passive
party's columns (``drop_columns``: all but one), and read a passive feature back exactly. Now each of
these is the passive party's own (``securevfl party --config party.yaml`` or its flags, the FATE
convention: each party configures its own bottom model), and the description can only *ask*:

- :data:`OWNED` names the settings a passive party owns. :func:`check_asked` refuses a description
  that asks for any other value than the party's own, before any of its data moves. The refusal names
  the setting and the value asked for, never the party's own value: the active party learns what the
  protocol needs (the bottom's output width, which it must size its head for) and nothing else.
- :func:`merged` puts the party's own values into the description it runs with, so nothing downstream
  reads the active party's word for them. When both sides hold the same settings (the simulator's
  flags on the active side, the same values in ``party.yaml``), a deployed run equals the in-process
  run bit for bit.
- :func:`is_linear` is the floor on what a bottom may look like: a bottom with no hidden
  non-linearity hands its inputs to a linear read-out (and to the sign probe of issue 60), so a party
  serves one only with ``--allow linear-bottom``.

Torch-free: ``securevfl party`` checks its own settings at once, before any heavy import."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from securevfl.configuration.options import DEFAULT_LR, DataConfig, ModelConfig, OptimConfig
from securevfl.errors import UserError

OWNED: dict[str, tuple[str, ...]] = {
    "model": ("bottom", "cut_dim", "hidden", "cnn_channels", "emb_dim", "cut", "preset"),
    "optim": ("optimizer", "lr", "weight_decay"),
    "train": ("lr_grid",),
    "data": ("drop_columns", "categorical", "numeric", "min_freq", "hash_buckets"),
}
"""Section → the settings a passive party owns (``party.yaml`` takes only these keys).

Why each: the bottom's shape, width and embeddings decide what its output can carry of its inputs;
the optimiser, its rates and the rates a learning-rate search may set decide how one gradient moves
it; the columns and their types decide which of its features enter at all. The head, the
interactive layer's rate, the batch size and the epochs stay the active party's (they shape the run,
not what this party's model is). ``preset`` names a set of these fields (``fedud``, ...); the
fields it sets are compared, not its name."""

_COMPARED = {s: tuple(k for k in keys if k != "preset") for s, keys in OWNED.items()}


@dataclass
class OwnTrain:
    lr_grid: list[float] = field(default_factory=list)
    """The learning rates a run may set on this party (``--lr-grid``; each supervised stage's search,
    securevfl/training.py); empty: none, the run trains at ``optim.lr``."""


@dataclass
class PassiveOwn:
    """What a served passive party's model is, decided by that party (:data:`OWNED`). The defaults are
    ``securevfl train``'s, so a run with default settings on both sides needs no configuration."""

    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: OwnTrain = field(default_factory=OwnTrain)
    data: DataConfig = field(default_factory=DataConfig)

    def resolved(self) -> PassiveOwn:
        """A copy with the defaults the run resolves filled in (the optimiser's rate, the preset's fields),
        as :func:`securevfl.lab.compose.resolve_config` fills the active party's."""
        out = copy.deepcopy(self)
        if out.optim.lr is None:
            out.optim.lr = DEFAULT_LR[out.optim.optimizer]
        if out.model.preset is not None:
            from securevfl.models import apply_model_preset

            apply_model_preset(out.model)
        return out

    def as_dict(self) -> dict[str, dict[str, Any]]:
        """The owned settings, as JSON carries them (tuples as lists)."""
        r = self.resolved()
        return {s: {k: _json(getattr(getattr(r, s), k)) for k in keys} for s, keys in OWNED.items()}


def _json(v: object) -> object:
    return list(v) if isinstance(v, tuple | list) else v


def from_mapping(data: dict, where: str = "party.yaml") -> PassiveOwn:
    """``party --config FILE``'s settings: sections ``model``, ``optim``, ``train``, ``data`` with the keys
    of :data:`OWNED` only (a key of the active party's, e.g. ``train.epochs``, is refused naming the
    ones this file takes)."""
    from securevfl.config import apply_dict

    own = PassiveOwn()
    for section, values in data.items():
        s = str(section)
        if s not in OWNED:
            raise UserError(f"{where}: unknown section {s!r}; a passive party's own settings are "
                            f"{', '.join(OWNED)} (the rest of a run is the active party's)")
        if not isinstance(values, dict):
            raise UserError(f"{where}: section {s} must be a mapping")
        for key in values:
            if str(key).replace("-", "_") not in OWNED[s]:
                raise UserError(f"{where}: {s}.{key} is not a passive party's own setting; {s} takes "
                                f"{', '.join(OWNED[s])}")
        apply_dict(getattr(own, s), values, f"{s}.")
    check(own)
    return own


def check(own: PassiveOwn) -> None:
    """The settings make sense on their own (ranges, as ``train``'s flags check them)."""
    from securevfl.config import RunConfig
    from securevfl.configuration.settings import by_key
    from securevfl.configuration.settings import check as check_value

    entries = by_key(RunConfig)  # the keys as a run names them (optim.lr), with train's flags
    for s, keys in OWNED.items():
        if s == "train":
            continue
        for k in keys:
            check_value(entries[f"{s}.{k}"], getattr(getattr(own, s), k))
    for lr in own.train.lr_grid:
        if not (isinstance(lr, int | float) and 0 < lr <= 10):
            raise UserError(f"train.lr_grid: {lr!r} is not a learning rate in (0, 10]")


def from_run(model: ModelConfig, optim: OptimConfig, lr_grid: list[float], data: DataConfig) -> PassiveOwn:
    """The owned settings a run's sections give (the simulator's parties, and a test's passive party that
    agrees with the active party)."""
    own = PassiveOwn()
    for s, src in (("model", model), ("optim", optim), ("data", data)):
        for k in OWNED[s]:
            setattr(getattr(own, s), k, copy.deepcopy(getattr(src, k)))
    own.train.lr_grid = list(lr_grid)
    return own


def is_linear(model: ModelConfig) -> bool:
    """Whether the bottom has no hidden non-linearity: an MLP with no hidden layer, or whose cut keeps
    only its output layer at the party (``cut: 1``). A CNN bottom has its conv blocks' ReLUs."""
    if model.bottom == "cnn":
        return False
    return not model.hidden or model.cut == 1


def check_asked(hello: dict, own: PassiveOwn) -> None:
    """Refuse a run description that asks for another value of any setting this party owns.

    Raises:
        UserError: one line naming the setting and the value asked for (not this party's own)."""
    mine = own.as_dict()
    agg = (hello.get("model") or {}).get("head") == "agg"
    for s, keys in _COMPARED.items():
        asked = hello.get(s)
        if not isinstance(asked, dict):
            raise UserError(f"malformed run description: no {s} section")
        for k in keys:
            if agg and s == "model" and k == "cut_dim":
                continue  # the agg head fixes it: every bottom outputs one value per class (the protocol's need)
            if k not in asked:
                if s == "train":  # an older description: no grid means none asked
                    continue
                raise UserError(f"malformed run description: no {s}.{k}")
            value = asked[k]
            if s == "optim" and k == "lr" and value is None:  # unset: the optimiser's default, as a run resolves it
                value = DEFAULT_LR.get(str(asked.get("optimizer", "adam")))
            if _json(value) != mine[s][k]:
                raise UserError(f"the active party asked for {s}.{k} = {asked[k]!r} at this party; this party's bottom "
                                "model, optimiser, learning rates and columns are its own (securevfl party --config "
                                "party.yaml, docs/deployment.md) and it runs another value; refused")


def merged(hello: dict, own: PassiveOwn) -> dict:
    """``hello`` with this party's own values of every owned setting (what it builds from)."""
    out = copy.deepcopy(hello)
    mine = own.as_dict()
    for s in OWNED:
        section = dict(out.get(s) or {})
        for k, v in mine[s].items():
            if s == "model" and k == "cut_dim" and section.get("head") == "agg":
                continue
            section[k] = v
        out[s] = section
    return out


def describe(own: PassiveOwn) -> str:
    """One line for this party's stderr: what its bottom model is (never sent)."""
    r = own.resolved()
    shape = f"cnn {list(r.model.cnn_channels)}" if r.model.bottom == "cnn" else f"hidden {list(r.model.hidden)}"
    cut = "" if r.model.cut is None else f", cut {r.model.cut}"
    grid = f", lr grid {r.train.lr_grid}" if r.train.lr_grid else ""
    cols = f", dropping {', '.join(r.data.drop_columns)}" if r.data.drop_columns else ""
    return (f"its own bottom model: {r.model.bottom} {shape}{cut}, cut width {r.model.cut_dim}, "
            f"{r.optim.optimizer} lr {r.optim.lr}{grid}{cols}")


def replace_model(own: PassiveOwn, **changes: object) -> PassiveOwn:
    """A copy with model fields changed (tests and the lab)."""
    out = copy.deepcopy(own)
    out.model = dataclasses.replace(out.model, **changes)  # type: ignore[arg-type]
    return out


# ------------------------------------------------------------------------------- securevfl party
def _flag(section: str, key: str) -> str:
    if section == "train":
        return "--lr-grid"
    from securevfl.configuration.settings import by_key

    s = by_key(type(getattr(PassiveOwn(), section)))[key].setting
    return s.flag if s is not None and s.flag else "--" + key.replace("_", "-")


def add_flags(group: Any) -> None:
    """``securevfl party``'s flags for its own model (one per :data:`OWNED` key, named as ``train``'s, and
    ``--config`` for a file of them); every flag overrides the file."""
    from securevfl.configuration.settings import by_key

    group.add_argument("--config", metavar="FILE", dest="own_config",
                       help="YAML file with this party's own bottom model, optimiser, rates and columns (sections "
                            "model, optim, train, data; docs/deployment.md); flags override it")
    for s, keys in OWNED.items():
        entries = by_key(type(getattr(PassiveOwn(), s))) if s != "train" else {}
        for k in keys:
            entry = entries.get(k)
            doc = (entry.setting.doc if entry is not None and entry.setting is not None
                   else "learning rates a run's search may set on this party (comma-separated)")
            group.add_argument(_flag(s, k), dest=f"own__{s}__{k}", metavar="VALUE", default=None,
                               help=doc.split(". ")[0].replace("%", "%%").replace("``", ""))


def from_args(args: Any) -> PassiveOwn:
    """``securevfl party``'s own model settings: its ``--config`` file, then each flag given."""
    import typing

    from securevfl.config import _coerce, load_config_file

    path = getattr(args, "own_config", None)
    own = from_mapping(load_config_file(path, "--config"), str(path)) if path else PassiveOwn()
    for s, keys in OWNED.items():
        target = getattr(own, s)
        hints = typing.get_type_hints(type(target))
        for k in keys:
            text = getattr(args, f"own__{s}__{k}", None)
            if text is None:
                continue
            flag, hint = _flag(s, k), hints[k]
            origin = typing.get_origin(hint)
            if text.strip().lower() in ("none", "") and (origin is not None or type(None) in typing.get_args(hint)):
                value: object = [] if origin in (list, tuple) else None
            elif origin in (list, tuple):
                inner = typing.get_args(hint)[0]
                value = [_parse(flag, p.strip(), inner) for p in text.split(",") if p.strip()]
            else:
                value = _parse(flag, text.strip(), hint)
            setattr(target, k, _coerce(value, hint, flag))
    check(own)
    return own


def _parse(flag: str, text: str, hint: object) -> object:
    import typing

    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    for t in (int, float):
        if t in args:
            try:
                return t(text)
            except ValueError:
                if t is int and float in args:
                    continue
                raise UserError(f"{flag} {text!r}: expected a number") from None
    return text
