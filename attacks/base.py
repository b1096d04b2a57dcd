"""Attack contract and registry, in the spirit of IBM ART: each attack declares its threat model
(which party attacks) and what it must observe, and checks at construction that the trained
federation exposes it. Results are typed (:class:`AttackResult`).

The adversary is a passive party (FedHSSL's threat model T1; ``passive1`` by default). An attack
gets only the adversary's part of the federation (its party object: bottom model, rows, hooks)
and its view of the channel; the harness adds ``n_aux`` labeled auxiliary rows of the
adversary's own and the ground truth to score against, both from the simulator.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np
import torch

from securevfl.configuration.spec import check_nonnegative, check_params, parse_args, split_name
from securevfl.errors import UserError
from securevfl.registry import Registry
from securevfl.roles import passive_name

if TYPE_CHECKING:  # types only: attacks import the core's contracts, never its modules at run time
    from securevfl.federation import Federation
    from securevfl.methods.base import Method

NEEDS = {
    "bottom_model": "a passive party with a bottom model (this method trains the active party alone)",
    "received_gradients": "gradients returned to a passive party (this method sends none)",
    "passive_messages": "a passive party whose messages the active party receives (this method has none)",
    "aux_features": "a passive party whose auxiliary feature rows the attacker knows (this method has none)",
    "binary_task": "a binary task (this dataset has more than two classes)",
    "transcript": "the recorded messages (run with --record)",
}
"""What each observation an attack can require means, in the user's terms (for the refusal)."""

OBSERVATIONS = {
    "bottom_model": "its trained bottom model",
    "received_gradients": "the gradients returned to it",
    "passive_messages": "the passive party's cut-layer messages",
    "aux_features": "auxiliary feature rows of the passive party",
    "binary_task": "a binary task",
    "transcript": "its channel transcript (the run records it)",
    "own_rows": "its own feature rows",
    "aux_labels": "a few labeled rows of its own",
}
"""Each observation in the catalogue's terms (``securevfl attacks``)."""

ALL_HEADS = frozenset({"split", "agg"})
"""Every ``--head`` kind (``securevfl.models.HEADS``; named here so attacks import no model code)."""


KINDS = frozenset({"label_inference", "feature_reconstruction", "backdoor", "untargeted"})
"""Attack types (:attr:`Attack.kind`): scores take the worst case over the attacks of one type."""


@dataclass
class AttackResult:
    metric: str
    value: float
    """Headline number: label inference on the adversary's training rows (MC) or mean leak AUC."""
    prior: float
    """What guessing achieves: majority-class accuracy, or AUC 0.5."""
    baseline: float | None = None
    """Same attack on what the adversary can build alone (local-SSL MC), where defined."""
    control: float | None = None
    """Same attack, same budget, on what the adversary gets with no federation at all (MC: the same
    architecture at random initialisation; gradient scoring: labels shuffled within each batch)."""
    details: dict = field(default_factory=dict)

    @property
    def leakage(self) -> float | None:
        """What the federation leaked: value − max(control, baseline), where either is defined."""
        refs = [r for r in (self.control, self.baseline) if r is not None]
        return self.value - max(refs) if refs else None

    def as_dict(self) -> dict:
        out = {"metric": self.metric, "value": self.value, "prior": self.prior}
        for key in ("control", "baseline", "leakage"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return {**out, **self.details}


class GroundTruth(Protocol):
    """What attacks read of the simulator's partition (labels and rows to score against); a
    structural type, so attacks never import the data package."""

    @property
    def kind(self) -> str: ...

    @property
    def parties(self) -> Sequence[Any]: ...

    def true_labels(self, ids: np.ndarray) -> np.ndarray: ...


@dataclass
class AttackTarget:
    """What the harness hands an attack: the trained federation, the adversary's name, and the
    simulator's ground truth (for auxiliary labels and scoring only)."""

    federation: Federation
    partition: GroundTruth
    adversary: str = passive_name(1)
    exposes: frozenset[str] = frozenset()
    ssl_epochs: int | None = None
    """Epochs of the federation's own SSL pre-training stage, if it has one (the adversary took part
    in it, so it knows); the local-SSL baseline trains as long."""
    method: Method | None = None
    """The trained method (active attacks make inference requests through its trainer, as the active
    party may)."""
    head: str = "split"
    """The run's ``--head`` (part of the protocol every party knows)."""
    cache: dict = field(default_factory=dict)
    """The adversary's own artefacts shared by the attacks of one run (e.g. the local-SSL encoder,
    pre-trained once however many attacks use it)."""

    @property
    def party(self):
        return self.federation.party(self.adversary)

    def truth(self, ids: np.ndarray) -> np.ndarray:
        return self.partition.true_labels(ids)


class Attack(ABC):
    """An attack on a trained federation. To add one: subclass, set :attr:`name`, :attr:`requires`
    and :attr:`defaults`, implement :meth:`run`, decorate the class with ``@ATTACKS.register`` and
    import its module in ``attacks/__init__.py``. ``self.config`` holds the checked parameters."""

    name: ClassVar[str]
    """The ``--attack`` name."""
    threat_model: ClassVar[str] = "passive"
    """Which party attacks: ``passive`` (label inference) or ``active`` (feature reconstruction)."""
    requires: ClassVar[frozenset[str]] = frozenset()
    """What the attack must observe, keys of :data:`NEEDS` plus ``own_rows`` and ``aux_labels``
    (e.g. ``bottom_model``, ``received_gradients``, ``transcript``, ``binary_task``); construction
    refuses, with a one-line error, a federation that does not expose all of them."""
    kind: ClassVar[str] = ""
    """What the attack is, for scoring by type (:data:`KINDS`)."""
    during_training: ClassVar[bool] = False
    """True when the attack must act while the federation trains (it gets :meth:`prepare`)."""
    defaults: ClassVar[dict[str, object]] = {}
    """Parameters and their defaults; a default's type is the parameter's type (ints pass as floats;
    :func:`securevfl.configuration.spec.check_params`). Every attack also takes ``adversary`` (:data:`COMMON`)."""
    heads: ClassVar[frozenset[str]] = ALL_HEADS
    """The ``--head`` kinds the attack applies to; a run with another head refuses it at build time."""
    head_refusal: ClassVar[str] = ""
    """Why a head outside :attr:`heads` is refused, for the one-line error."""
    summary: ClassVar[str] = ""
    """One line for ``securevfl attacks`` (empty: the class docstring's first line)."""
    COMMON: ClassVar[dict[str, object]] = {"adversary": passive_name(1)}
    """Parameters every attack takes: ``adversary``, the passive party that attacks (a passive-party
    attack) or whose messages are attacked (an active-party attack)."""

    def __init__(self, exposes: frozenset[str], seed: int = 0, **params: object) -> None:
        """Args:
            exposes: what the trained federation lets the adversary observe
                (:func:`securevfl.methods.base.adversary_exposes`).
            seed: the attack's own randomness.
            params: parameters as the user wrote them.
        Raises:
            UserError: the federation does not expose :attr:`requires`, or a bad parameter.
        """
        missing = self.requires - exposes
        if missing:
            need = "; ".join(NEEDS.get(m, m) for m in sorted(missing))
            raise UserError(f"attack {self.name} cannot run here: it needs {need}")
        self.config: dict[str, Any] = {**self.parameters(), **self.check(params)}
        self.seed = seed

    @property
    def adversary(self) -> str:
        """The passive party this attack is about (the ``adversary`` parameter)."""
        return str(self.config["adversary"])

    @classmethod
    def parameters(cls) -> dict[str, object]:
        """Every parameter with its default: :data:`COMMON` and the attack's own :attr:`defaults`."""
        return {**cls.COMMON, **cls.defaults}

    @classmethod
    def describe(cls) -> str:
        """The attack's catalogue entry (``securevfl attacks``): threat model, observations, heads, parameters."""
        doc = (cls.__doc__ or "").strip().splitlines()
        summary = cls.summary or (doc[0] if doc else "")
        who = ("the active party, on passive party `adversary`'s messages" if cls.threat_model == "active"
               else "passive party `adversary`")
        seen = "; ".join(OBSERVATIONS.get(r, r) for r in sorted(cls.requires)) or "nothing beyond its own view"
        params = ", ".join(f"{k}={v}" for k, v in cls.parameters().items())
        during = " (acts during training)" if cls.during_training else ""
        return (f"{cls.name}: {summary}\n  attacker: {who}{during}\n  observes: {seen}\n"
                f"  heads: {', '.join(sorted(cls.heads))}\n  parameters: {params}")

    @classmethod
    def check(cls, params: dict) -> dict:
        """Typed, validated parameters.

        Args:
            params: parameter → value as the user wrote it (spec strings or YAML values).
        Returns:
            The given parameters, typed (merge them over :attr:`defaults`).
        Raises:
            UserError: one line naming a bad key or value.
        """
        out = check_params(f"attack {cls.name}", cls.parameters(), params)
        cls.validate({**cls.parameters(), **out})
        return out

    @classmethod
    def validate(cls, config: dict) -> None:
        """Range checks on the merged parameters (default: every number finite and ≥ 0, the adversary a
        passive party's name); raise a UserError naming the bad one."""
        check_nonnegative(f"attack {cls.name}", config)
        if not re.fullmatch(r"passive[1-9][0-9]*", str(config["adversary"])):
            raise UserError(f"attack {cls.name}: adversary must name a passive party (passive1, passive2, ...), "
                            f"got {config['adversary']!r}")

    def prepare(self, federation: object, adversary: str,  # noqa: B027 - optional
                partition: GroundTruth | None = None) -> None:
        """Act before training (only for ``during_training`` attacks).

        Args:
            federation: the built, untrained federation.
            adversary: the attacking party's name; the attack may touch only that party's objects.
            partition: the simulator's ground truth (only for the labeled rows the adversary knows).
        """

    @abstractmethod
    def run(self, target: AttackTarget) -> AttackResult:
        """Attack the trained federation from the adversary's view.

        Args:
            target: the adversary's party (``target.party``), its recorded channel view, the
                simulator's auxiliary labels and ground truth (``target.truth``, for scoring only).
        Returns:
            The headline value with its prior and, where defined, a control and a baseline.
        """


ATTACKS: Registry[type[Attack]] = Registry("attack")
"""Every attack by name; an attack module registers its class with ``@ATTACKS.register``."""


class PassiveTamper:
    """A malicious passive party's deviations from the protocol (:class:`securevfl.parties.Tamper`),
    honest by default: a backdoor or robustness attack overrides what it changes and installs itself
    with the adversary's own ``use_tamper``."""

    def features(self, x: torch.Tensor, ids: np.ndarray, split: str, training: bool) -> torch.Tensor:
        """What the party feeds its bottom model for ``ids`` (its own rows ``x``)."""
        return x

    def output(self, z: torch.Tensor, ids: np.ndarray, split: str, training: bool) -> torch.Tensor:
        """What the party sends for ``ids`` (its bottom output ``z``, with its graph in training)."""
        return z

    def gradient(self, grad: torch.Tensor, ids: np.ndarray) -> torch.Tensor:
        """What the party applies of the gradient ``grad`` it received for ``ids``."""
        return grad


def numeric_cells(data: Any) -> int:
    """How many leading cells of a party's flattened rows hold feature values an attacker can perturb:
    every pixel of an image, the standardised numeric columns of a tabular block (its categorical
    codes that follow are embedding indices, not values)."""
    return int(data.n_numeric) if data.cardinalities else int(np.prod(data.X_train.shape[1:]))


def check_adversary(owner: str, config: dict) -> None:
    """An ``adversary`` parameter names a passive party (``passive1``, ``passive2``, ...)."""
    if not re.fullmatch(r"passive[1-9][0-9]*", str(config["adversary"])):
        raise UserError(f"{owner}: adversary must name a passive party (passive1, passive2, ...), "
                        f"got {config['adversary']!r}")


def adversary_party(federation: Federation, name: str) -> Any:
    """The adversary's own party object; a one-line error when the federation has no such party."""
    found = [p for p in federation.passives if p.name == name]
    if not found:
        names = ", ".join(p.name for p in federation.passives) or "none"
        raise UserError(f"adversary {name}: this federation has no such passive party (it has {names})")
    return found[0]


def parse_attack(entry: object) -> tuple[type[Attack], dict]:
    """An attack as written by a user: ``"mc"``, ``"mc:n_aux=40,steps=600"`` (CLI, config) or
    ``{mc: {n_aux: 40}}`` (config and sweep files) → its class and typed, validated parameters."""
    if isinstance(entry, dict) and len(entry) == 1:
        (name, given), = entry.items()
        cls = ATTACKS.get(str(name))
        if given is None:
            given = {}
        if not isinstance(given, dict):
            raise UserError(f"attack {name}: parameters must be a mapping like {{n_aux: 40}}, got {given!r}")
        return cls, cls.check(given)
    if not isinstance(entry, str):
        raise UserError(f"attack {entry!r}: expected a name, 'name:key=value,...' or {{name: {{key: value}}}}")
    name, arg = split_name(entry)
    cls = ATTACKS.get(name)
    return cls, cls.check(parse_args("attack", entry, arg))


def attack_spec(name: str, params: dict) -> str:
    """The canonical string of an attack and its non-default parameters (``mc:n_aux=20``)."""
    return name + (":" + ",".join(f"{k}={v}" for k, v in params.items()) if params else "")
