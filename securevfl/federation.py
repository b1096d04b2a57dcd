"""Builds a federation from a partition: one channel, one active party, K−1 passive parties, their
bottom models, the head, optimizers and cut-layer ends. After construction nothing holds the
partition's global view: each party has only its own :class:`PartyData`."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypedDict, TypeVar

import numpy as np
import torch
from torch import nn

from securevfl.channel import Channel, InMemoryChannel, MessageKind
from securevfl.configuration.options import DEFAULT_LR, OptimConfig  # noqa: F401  (their home: the light settings module)
from securevfl.cutlayer import CutLayer, PlainCutLayer
from securevfl.data import psi
from securevfl.data.partition import Partition, PartyData
from securevfl.hooks import PartyHook
from securevfl.models import ModelConfig, NoFeatures, build_bottom, build_head, for_head
from securevfl.parties import ActiveParty, OptimizerFactory, PassiveParty
from securevfl.roles import seed_for


def effective_lr(cfg: OptimConfig) -> float:
    return DEFAULT_LR[cfg.optimizer] if cfg.lr is None else cfg.lr


def make_optimizer(params: list[torch.nn.Parameter], cfg: OptimConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=effective_lr(cfg), weight_decay=cfg.weight_decay)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=effective_lr(cfg), momentum=0.9, weight_decay=cfg.weight_decay)
    raise ValueError(f"unknown optimizer {cfg.optimizer!r}")


class PartyWiring(TypedDict):
    """What every party of a federation is built with besides its data, endpoint, hooks and models."""

    optimizer: OptimizerFactory
    cut: CutLayer
    seed: int
    interactive_lr: float | None
    device: torch.device | None


@dataclass
class Federation:
    channel: Channel
    active: ActiveParty
    passives: list[PassiveParty]
    cut: CutLayer
    n_classes: int
    meta: dict = field(default_factory=dict)
    regression: bool = False
    """A continuous label: the head has one output, trained with MSE (``n_classes`` is 1)."""
    checkpoints: Any = None
    """The active party's :class:`securevfl.storage.checkpoint.Checkpoints` (a deployed run with ``--checkpoint``)."""

    @property
    def parties(self) -> list:
        return [self.active, *self.passives]

    def party(self, name: str):
        return next(p for p in self.parties if p.name == name)


@dataclass(frozen=True)
class PartySeeds:
    """The seeds a federation's parties draw from. The run seed (``run``) is public: every party
    knows it (the batch order, the test split). Each party's *own* seed is its own: the base of its
    bottom model's initialisation and of every draw it makes alone (augmentations, its local SSL,
    a re-initialisation). In the simulator each party holds ``own[k]`` (by default
    :func:`seed_for` (run seed, k), so a run reproduces from its seed alone); a deployed passive party
    draws its own from the OS (``securevfl party --seed`` fixes it) and never sends it (issue 54)."""

    run: int
    own: tuple[int, ...] = ()
    """Own seeds of party 0 (active), 1, ...; missing entries are ``seed_for(run, k)``."""

    def of(self, k: int) -> int:
        return self.own[k] if k < len(self.own) else seed_for(self.run, k)

    @classmethod
    def simulated(cls, run: int, passive: tuple[int, ...] | list[int] = ()) -> PartySeeds:
        """The simulator's seeds: the active party's from the run seed, the passive parties' ``passive``
        (``RunConfig.passive_seeds``: the seeds deployed passive parties ran with, ``party --seed``)."""
        return cls(run, (seed_for(run, 0), *passive))


# Offsets from seed_for(run seed, party) (or from the run seed) naming each random stream a method
# draws, so that two uses never share one by accident. The values are frozen: they fix every recorded
# result (tests/golden). FedUD's and RISA's 606 belong to different methods, never in one run.
STREAM_LOCAL_SSL = 1  # fedlocal: a party's local SSL pre-training
STREAM_LR_GRID = 7  # the learning-rate search's validation split (run seed)
STREAM_HSSL_CROSS_INIT = 101  # FedHSSL: a party's cross-party encoder f_c
STREAM_HSSL_STATE = 202  # FedHSSL: a party's hybrid (local SSL) state
STREAM_HSSL_BATCHES = 303  # FedHSSL: the aligned batch order (run seed)
STREAM_VFLHLP_ACTIVE = 404  # VFLHLP: the active party's supervised pre-training
STREAM_VFLHLP_PASSIVE = 505  # VFLHLP: a passive party's SCARF pre-training
STREAM_FEDUD_REP = 606  # FedUD: the representation-transfer net's initialisation
STREAM_FEDUD_UNALIGNED = 607  # FedUD: the unaligned-row batches
STREAM_FEDUD_REINIT = 608  # FedUD: a party's re-initialisation before step 2 (reinit: true)
STREAM_RISA_PAIRING = 606  # random-match: pairing own rows with passive-only IDs
STREAM_RISA_HEADS = 707  # RISA: the evidential heads' initialisation
STREAM_ENTITY_ORDER = 808  # entity-aug: a party's own batch order (guests; the host as party 0)
STREAM_ENTITY_SHARED = 909  # entity-aug: the common order the host hands every guest


@dataclass(frozen=True)
class PartyModels:
    """The models a federation's parties are built with."""

    bottoms: dict[str, nn.Module]
    """Each party's bottom model, by name."""
    head: nn.Module
    """The active party's head."""
    passive_widths: list[int]
    """Width of each passive party's input to the head."""


ModelsFactory = Callable[[Partition, ModelConfig, CutLayer, PartySeeds, list[PartyData]], PartyModels]
"""Builds a federation's models (a method's own layout: e.g. entity-aug's label-only host)."""


_SEEDED_INIT = threading.Lock()
T = TypeVar("T")


def seeded_build(seed: int, build: Callable[[], T]) -> T:
    """``build()`` right after ``torch.manual_seed(seed)``, as one step: initialisation draws from torch's
    process-wide generator, and parties hosted as threads of one process (the gRPC tests, or a
    deployment that does so) would otherwise interleave their draws."""
    with _SEEDED_INIT:
        torch.manual_seed(seed)
        return build()


def fresh_bottom(data: PartyData, model: ModelConfig, own_seed: int) -> nn.Module:
    """A party's fresh bottom model, from its own seed (:class:`PartySeeds`)."""
    return seeded_build(own_seed, lambda: build_bottom(data.feature_shape, model, data.n_numeric, data.cardinalities))


def fresh_head(partition: Partition, model: ModelConfig, seed: int, in_dim: int) -> nn.Module:
    """The active party's fresh head on ``in_dim`` inputs, from ``seed_for(seed, number of parties)``."""
    return seeded_build(seed_for(seed, len(partition.parties)), lambda: build_head(in_dim, partition.n_classes, model))


def standard_models(partition: Partition, model: ModelConfig, cut: CutLayer, seeds: PartySeeds,
                    passive_data: list[PartyData]) -> PartyModels:
    """A fresh bottom per party and the head on [r^1, r^2..r^K] (``agg``: every r^k is class logits)."""
    model = for_head(model, partition.n_classes)
    bottoms = {d.name: fresh_bottom(d, model, seeds.of(k)) for k, d in enumerate([partition.active, *passive_data])}
    widths = [cut.out_dim(model.cut_dim)] * len(passive_data)
    return PartyModels(bottoms, fresh_head(partition, model, seeds.run, model.cut_dim + sum(widths)), widths)


def build_active(data: PartyData, endpoint, hooks: list[PartyHook], model: ModelConfig, optim: OptimConfig,
                 cut: CutLayer, passive_names: list[str], n_classes: int, seed: int,
                 device: torch.device | None = None, features: bool = True) -> ActiveParty:
    """The active party with the standard models (:func:`standard_models`), built by itself in its own
    process: its bottom model from party 0's seed stream, the head from the last one. ``features``
    False: a label-only active party (Entity Augmentation's host), no bottom model, the head on the
    passive parties' activations only (as ``EntityAugmentation.models`` in the simulator)."""
    widths = [cut.out_dim(model.cut_dim)] * len(passive_names)
    own = model.cut_dim if features else 0
    head = seeded_build(seed_for(seed, len(passive_names) + 1),
                        lambda: build_head(own + sum(widths), n_classes, model))
    bottom = fresh_bottom(data, model, seed_for(seed, 0)) if features else NoFeatures()
    return ActiveParty(data, endpoint, hooks, bottom, head,
                       functools.partial(make_optimizer, cfg=optim), cut, passive_names=passive_names,
                       passive_widths=widths, n_classes=n_classes, seed=seed, interactive_lr=optim.interactive_lr,
                       device=device)


def build_passive(data: PartyData, endpoint, hooks: list[PartyHook], model: ModelConfig, optim: OptimConfig,
                  cut: CutLayer, seed: int, own_seed: int) -> PassiveParty:
    """A passive party with its standard bottom model, built by itself in its own process: the
    model and every draw of its own from ``own_seed`` (:class:`PartySeeds`), never from the run seed
    ``seed`` the active party chose."""
    return PassiveParty(data, endpoint, hooks, fresh_bottom(data, model, own_seed),
                        functools.partial(make_optimizer, cfg=optim), cut, seed=seed,
                        interactive_lr=optim.interactive_lr, own_seed=own_seed)


def build_federation(partition: Partition, model: ModelConfig, optim: OptimConfig, seed: int,
                     cut: CutLayer | None = None, hooks: list[PartyHook] | None = None,
                     with_passives: bool = True, record: bool = False,
                     models: ModelsFactory = standard_models, device: torch.device | None = None,
                     passive_seeds: tuple[int, ...] | list[int] = ()) -> Federation:
    """Create the parties, each whole: its data, its fresh models (``models``), an optimizer factory,
    the hooks that run at its role (each party installs its own copies, ``PartyHook.for_party``) and
    its cut-layer ends. ``record``: the channel keeps a transcript (chosen here, for the whole run).
    ``device``: where every party keeps its models and batches (resolved ``--device``; None: the CPU);
    the models are built on the CPU and each party moves its own. ``passive_seeds``: the passive
    parties' own seeds (:meth:`PartySeeds.simulated`)."""
    cut = cut or PlainCutLayer()
    hooks = hooks or []
    channel = InMemoryChannel(record=record)
    passive_data = partition.passives if with_passives else []
    seeds = PartySeeds.simulated(seed, passive_seeds)
    built = models(partition, model, cut, seeds, passive_data)
    optimizer = functools.partial(make_optimizer, cfg=optim)
    wiring: PartyWiring = {"optimizer": optimizer, "cut": cut, "seed": seed, "interactive_lr": optim.interactive_lr,
                           "device": device}
    a = partition.active
    active = ActiveParty(a, channel.endpoint(a.name), hooks, built.bottoms[a.name], built.head,
                         passive_names=[p.name for p in passive_data], passive_widths=built.passive_widths,
                         n_classes=partition.n_classes, own_seed=seeds.of(0), **wiring)
    passives = [PassiveParty(d, channel.endpoint(d.name), hooks, built.bottoms[d.name], own_seed=seeds.of(k), **wiring)
                for k, d in enumerate(passive_data, start=1)]
    return Federation(channel, active, passives, cut, partition.n_classes, regression=partition.regression)


def align(fed: Federation, mode: str, given: np.ndarray | None = None,
          given_test: np.ndarray | None = None) -> np.ndarray:
    """Establish the aligned training IDs (and the aligned test IDs) at the active party.

    ``given``: the simulator's aligned set; ``psi``: ECDH PSI with every passive party through the
    channel; ``plain``: passive parties send their ID lists in the clear (explicit fallback only).
    The active party announces the result to the passive parties either way. Test IDs go through
    the same step when some test entities exist only at the active party (``given_test``).
    """
    a = fed.active
    train = _intersect(fed, mode, "train_ids", given)
    test = a.data.test_ids if given_test is None else _intersect(fed, mode, "test_ids", given_test)
    a.learn_alignment(train, test)
    assert a.aligned_ids is not None  # learn_alignment just took ``train``
    return a.aligned_ids


def _intersect(fed: Federation, mode: str, which: str, given: np.ndarray | None) -> np.ndarray:
    a = fed.active
    own = getattr(a.data, which)
    if mode == "given":
        aligned = np.sort(np.asarray(given))
    elif mode == "psi":
        per_party = [psi.mutual_psi_local(a.endpoint, p.endpoint, own, getattr(p.data, which))[0]
                     for p in fed.passives]
        aligned = psi.plain_intersection([own, *per_party])
    elif mode == "plain":
        for p in fed.passives:
            p.endpoint.send_ids(a.name, MessageKind.ALIGNMENT, getattr(p.data, which))
        aligned = psi.plain_intersection([own, *[a.endpoint.recv_ids(p.name, MessageKind.ALIGNMENT)
                                                 for p in fed.passives]])
    else:
        raise ValueError(mode)
    for p in fed.passives:
        a.endpoint.send_ids(p.name, MessageKind.ALIGNMENT, aligned)
        received = p.endpoint.recv_ids(a.name, MessageKind.ALIGNMENT)
        if which == "train_ids":
            p.learn_alignment(received)
    return aligned
