"""Method contract and registry. One method per file; each registers itself by name."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from securevfl.channel import MessageKind
from securevfl.configuration.spec import check_nonnegative, check_params
from securevfl.cutlayer import CutLayer
from securevfl.data.partition import Partition
from securevfl.federation import (
    Federation,
    OptimConfig,
    PartyModels,
    PartySeeds,
    align,
    build_federation,
    standard_models,
)
from securevfl.hooks import PartyHook
from securevfl.ids import intersect
from securevfl.models import HEADS, ModelConfig
from securevfl.registry import Registry
from securevfl.training import SplitTrainer, TrainConfig, fit_with_lr_search

if TYPE_CHECKING:
    from securevfl.parties import Party, PassiveParty


@dataclass
class MethodContext:
    """Everything a method needs besides the partition."""

    train: TrainConfig = field(default_factory=TrainConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    seed: int = 0
    hooks: list[PartyHook] = field(default_factory=list)
    record: bool = False
    progress: bool | None = None
    params: dict = field(default_factory=dict)
    """Method-specific hyperparameters (validated by the method)."""
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    """Where the parties keep their models and batches (the run's resolved ``--device``)."""
    passive_seeds: tuple[int, ...] = ()
    """The simulated passive parties' own seeds (``RunConfig.passive_seeds``)."""


class Method(ABC):
    """A VFL training method. The run pipeline (:func:`securevfl.lab.compose.execute`) calls
    :meth:`build`, :meth:`train` (which calls :meth:`fit`) and :meth:`evaluate`; the trained
    federation stays split by party so attacks can take exactly the adversary's part.

    To add one: subclass, set :attr:`name`, :attr:`summary` and :attr:`defaults`, implement
    :meth:`fit`, decorate the class with ``@METHODS.register`` and import its module in
    ``securevfl/methods/__init__.py``. ``self.params`` holds the checked parameters, ``self.ctx`` the
    run's configuration (:class:`MethodContext`)."""

    name: ClassVar[str]
    """The ``--method`` name."""
    summary: ClassVar[str]
    """One line for ``securevfl methods``."""
    uses_passives: ClassVar[bool] = True
    """False for single-party baselines (no cut layer, so defenses and HE do not apply)."""
    defaults: ClassVar[dict[str, object]] = {}
    """The method's parameters and their defaults (``--method-param key=value``); a default's type is the
    parameter's type and every number must be finite and ≥ 0 (:func:`securevfl.configuration.spec.check_params`)."""
    partition_defaults: ClassVar[dict] = {"active_labels_unaligned": False, "test_aligned_fraction": 1.0}
    """Partition fields this method sets when the spec leaves them ``None``. A subclass lists only
    what it changes (e.g. ``{"active_labels_unaligned": True}``; ``test_aligned_fraction: "train"``
    for methods that predict rows only the active party holds); :meth:`default_partition` merges."""
    label_only_host: ClassVar[bool] = False
    """Whether the method can train with a label-only active party (``partition.active_features: false``)."""
    aligned_batches: ClassVar[bool] = True
    """Whether every training batch is one set of entities shared by all parties (False for
    entity-aug); defenses with ``needs_aligned_batches`` (the label-DP accountant) refuse otherwise."""
    supports_he: ClassVar[bool] = True
    """False for methods whose active party reads passive representations in plaintext (e.g. to
    distil or impute them), which the HE cut layer hides; ``--he`` is then refused."""
    passive_features_outside_loop: ClassVar[bool] = False
    """True when passive parties use their features outside the supervised loop (local pre-training,
    cross-party SSL, imputation statistics): a feature-level DP defense cannot bound that."""
    soft_label_training: ClassVar[bool] = False
    """True when every loss on the training labels is the shared trainer's cross-entropy, which takes
    class-probability rows too; defenses with ``soft_labels`` (CAE) refuse other methods."""
    supports_regression: ClassVar[bool] = True
    """False for methods whose training uses class labels outside the shared loop's loss (pre-training
    heads, soft labels, pseudo-labels, evidential heads): a continuous label is refused."""
    he_refusal: ClassVar[str] = "reads the passive parties' representations in plaintext, which the HE cut layer hides"
    """Why ``--he`` is refused (when ``supports_he`` is False), for the one-line error."""
    heads: ClassVar[frozenset[str]] = frozenset(HEADS)
    """The ``--head`` kinds this method trains with (:data:`securevfl.models.HEADS`)."""
    head_refusal: ClassVar[str] = ""
    """Why a head outside :attr:`heads` is refused, for the one-line error."""

    per_role: ClassVar[bool] = False
    """Whether :meth:`fit` is the active party's program alone (it reaches each passive party only
    through its handle's requests and the channel; the passive party's side is :meth:`passive_ops`),
    so the roles can run as threads or processes (:mod:`securevfl.runtime`). False: one program
    drives every party in one process (not deployable)."""

    resumable: ClassVar[bool] = False
    """Whether a deployed run can resume from checkpoints (``--checkpoint``, ``--resume``): the checkpoints
    of a supervised stage's epochs hold the whole state of its loop (parties, batch order, label terms),
    and what comes before the resumed stage either only sets the parties' parameters (a resumed run
    skips it, :meth:`resuming`) or replays to the same state from the same seeds (FedUD's first stage;
    the training loop replays a stage that ended before the checkpoint)."""

    def resuming(self, fed: Federation) -> bool:
        """Whether this run resumes from a checkpoint of its supervised stage: the stages before it
        already happened, and their result is in every party's checkpoint."""
        return fed.checkpoints is not None and fed.checkpoints.resume_epoch is not None
    not_deployable: ClassVar[str] = "its stages outside the supervised loop are not yet written per role"
    """Why a method that is not :attr:`per_role` cannot run across processes (the one-line error)."""

    passive_permissions: ClassVar[dict[str, str]] = {}
    """Passive operations that reveal more than a supervised step does, or reset a party's weights, and
    the permission each needs of a deployed passive party's policy (``securevfl party --allow``)."""

    supervised_stages: ClassVar[int] = 1
    """Supervised stages a run of this method trains (each may search ``train.lr_grid``): with the
    grid's size they bound the state operations an honest run asks of a passive party
    (:meth:`state_budget`)."""
    extra_snapshots: ClassVar[int] = 0
    """Snapshots (and restores of them) the method takes besides its stages' searches (RISA's
    self-training restores the start)."""

    def state_budget(self) -> dict[str, int]:
        """The most ``snapshot``, ``restore``, ``set_lr`` and ``reset_optimizer`` requests an honest run of
        this method, as configured, makes of each passive party (a deployed one refuses more, issue 60:
        a hostile active party restored a fresh optimizer thousands of times to probe one feature per
        step). Per stage, a search over k > 1 rates takes one snapshot, restores it before each rate and
        after the search, and sets each rate and then the chosen one; a single rate is set once."""
        k = len(self.ctx.train.lr_grid)
        search = k > 1
        stages, extra = type(self).supervised_stages, type(self).extra_snapshots
        return {"snapshot": stages * int(search) + extra,
                "restore": stages * ((k + 1) if search else 0) + extra,
                "set_lr": stages * ((k + 1) if search else int(k == 1)),
                "reset_optimizer": stages}

    def permissions_needed(self) -> frozenset[str]:
        """The permissions (values of :attr:`passive_permissions`) this run, as configured, asks of
        every passive party; a deployed one refuses the run before any data moves without them."""
        return frozenset()

    def passive_ops(self) -> dict[str, Callable[[PassiveParty, dict], object]]:
        """The operations a passive party runs for this method besides supervised steps, by request
        name (:data:`securevfl.runtime.PassiveOp`); a method's active program asks for them with
        ``handle.call(name, ...)``."""
        return {}

    # ---- serving after training (``train --save``, ``securevfl predict``; securevfl/scoring.py)
    def serving_layout(self, party: Party, n_classes: int) -> None:  # noqa: B027 - optional
        """Give ``party``, freshly built with this method's models, the module layout its training ended
        with (an encoder pre-training replaced, a module a stage added), so that its saved weights load.
        Each party runs it on itself, in its own process when deployed; the standard models need none.
        ``n_classes``: the head's outputs (the active party's fact; 0 at a passive party)."""

    def scoring_trainer(self, fed: Federation) -> SplitTrainer:
        """The active party's predictor over ``fed``: the trainer the method evaluates with (its output →
        probability map; e.g. RISA's fused evidential opinion)."""
        return SplitTrainer(fed, self.ctx.train, self.ctx.seed, progress=False)

    def unaligned_path(self, fed: Federation, trainer: SplitTrainer) -> str:
        """The active party's program, before it scores rows no passive party holds: set the passive
        inputs the method gives such rows (``trainer.passive_stand_in`` from the active party's own output,
        or ``trainer.delivered_stand_in`` as the cut layer delivers them; None: zeros, the active party's part
        alone, as :meth:`SplitTrainer.evaluate` scores unaligned test rows) and name the path, which the
        predictions mark. The paper's own path where it has one (FedUD's Rep, RISA's imputation)."""
        trainer.passive_stand_in = trainer.delivered_stand_in = None
        # a label-only active party (Entity Augmentation's host) has no part: its head sees no input
        return "active-only" if int(np.prod(fed.active.data.feature_shape)) else "no-features"

    def scoring_ops(self) -> dict[str, Callable[[PassiveParty, dict], object]]:
        """The passive operations a scoring run asks for besides inference batches (a subset of what
        :meth:`unaligned_path` needs); a scoring run serves no training operation."""
        return {}

    def truth_facts(self, partition: Partition) -> dict:
        """What only the lab can say about this run: its steps scored against ground truth no party
        holds (e.g. how many of RISA's pseudo-labels were right). Added to ``method_info["against_truth"]``
        after training; never seen by a party."""
        return {}

    def attach(self, fed: Federation) -> None:
        """After the run, one program drives the trained federation (the lab's attacks and audit
        queries): the trainer now talks to the parties themselves, not to their handles."""
        if self.trainer is not None:
            self.trainer.fed = fed

    @property
    def interactive_layer(self) -> bool:
        """Whether the head's first linear layer becomes the interactive layer (securevfl/interactive.py)
        in both HE modes; False keeps the plain concatenation (and refuses --he)."""
        return True
    sends: ClassVar[frozenset[str]] = frozenset({MessageKind.ACTIVATION, MessageKind.GRADIENT})
    """Cut-layer message kinds this method exchanges; a defense must act on at least one of them."""

    @classmethod
    def default_partition(cls) -> dict:
        """The partition defaults of this method, its own over those of its base classes."""
        out: dict = {}
        for klass in reversed(cls.__mro__):
            out.update(vars(klass).get("partition_defaults", {}))
        return out

    def __init__(self, ctx: MethodContext) -> None:
        owner = f"method {self.name}"
        given = check_params(owner, self.defaults, ctx.params, parse_strings=False)  # typed by YAML
        check_nonnegative(owner, given)
        self.ctx = ctx
        self.params: dict[str, Any] = {**self.defaults, **given}
        self.trainer: SplitTrainer | None = None

    def build(self, partition: Partition, cut: CutLayer | None = None) -> Federation:
        """The federation this method trains: parties with fresh models, the cut layer's ends, aligned.

        Args:
            partition: who holds which rows and features.
            cut: the cut-layer protocol (``None``: plaintext, interactive).
        Returns:
            The federation, its parties talking only through its channel."""
        c = self.ctx
        fed = build_federation(partition, c.model, c.optim, c.seed, cut, c.hooks,
                               with_passives=self.uses_passives, record=c.record, models=self.models, device=c.device,
                               passive_seeds=c.passive_seeds)
        # a file-based source already ran PSI to build the partition: announce its result, don't redo it
        mode = partition.spec.alignment if self.uses_passives and "aligned_by" not in partition.meta else "given"
        align(fed, mode, partition.aligned_ids, partition.test_aligned_ids)
        return fed

    def models(self, partition: Partition, model: ModelConfig, cut: CutLayer, seeds: PartySeeds,
               passive_data: list) -> PartyModels:
        """The models the parties are built with (:func:`securevfl.federation.standard_models`); a
        method with another layout overrides this rather than replacing a party's models afterwards."""
        return standard_models(partition, model, cut, seeds, passive_data)

    def make_trainer(self, fed: Federation, **kw) -> SplitTrainer:
        return SplitTrainer(fed, self.ctx.train, self.ctx.seed, progress=self.ctx.progress, **kw)

    def reset_optimizers(self, fed: Federation) -> None:
        """Fresh optimizers over each party's current models (after pre-training replaced or
        re-initialised them), so fine-tuning starts without stale optimizer state."""
        for party in fed.parties:
            party.reset_optimizer()

    def finetune(self, fed: Federation, ids: np.ndarray, epochs: int | None = None, stage: str = "fit",
                 **kw) -> SplitTrainer:
        """The supervised VFL stage every method ends with: train on ``ids`` (choosing the learning
        rate from ``train.lr_grid`` when it lists several, :func:`securevfl.training.fit_with_lr_search`).

        Args:
            fed: the federation, trained in place.
            ids: labeled rows to train on.
            epochs: this stage's epochs (None: ``train.epochs``); a stage with its own count passes it
                here rather than changing the run's configuration.
            stage: the stage's name, under which its own search is recorded (``lr_searches``).
            **kw: passed to :class:`SplitTrainer` (extra loss terms, the passive inputs of rows only the
                active party holds).

        Returns:
            The trainer, which answers inference requests afterwards."""
        return fit_with_lr_search(fed, ids, lambda: self.make_trainer(fed, **kw), self.ctx.train.lr_grid,
                                  self.ctx.seed, epochs=epochs, stage=stage)

    def finetune_plan(self, epochs: int | None = None) -> tuple[int, int]:
        """(participations, private selections) one :meth:`finetune` charges a labeled row: ``epochs``
        per training run, one run per lr-grid candidate plus the final one, and one selection."""
        epochs = self.ctx.train.epochs if epochs is None else epochs
        grid = len(self.ctx.train.lr_grid)
        return (epochs * (grid + 1), 1) if grid > 1 else (epochs, 0)

    def privacy_plan(self, fed: Federation) -> tuple[int, int]:
        """Upper bound on the steps one labeled row takes part in over the whole method, and the number
        of private model selections: what a per-example step rule (DP-SGD) calibrates a target ε for. Methods with
        several supervised stages override it; one that trains on labels outside the shared loop
        raises a UserError (its ε would not be a bound)."""
        return self.finetune_plan()

    @abstractmethod
    def fit(self, fed: Federation) -> None:
        """Train ``fed`` in place; set ``self.trainer`` to the trainer used for inference.

        Args:
            fed: the federation :meth:`build` made (parties, channel, cut layer, hooks), aligned.
                Cross-party data moves only through ``fed.channel``; most methods end with
                :meth:`finetune` on :func:`labeled_aligned_ids`.
        Returns:
            None; results go to ``self.trainer`` and run facts to ``fed.meta``.
        """

    def evaluate(self, fed: Federation) -> dict:
        """Test utility of the trained federation.

        Args:
            fed: the federation :meth:`fit` trained.
        Returns:
            ``{"metric": "accuracy" | "auc", "test": value, ...}`` as :func:`securevfl.metrics.utility`.
        """
        assert self.trainer is not None  # fit sets self.trainer (its contract)
        return self.trainer.evaluate()

    def train(self, fed: Federation) -> None:
        """Give the active party's step rule the whole method's plan (a target-ε accountant calibrates
        its noise on it; the plain rule ignores it), then fit."""
        fed.active.plan_budget(lambda: self.privacy_plan(fed))
        self.fit(fed)


def adversary_exposes(fed: Federation) -> set[str]:
    """What a passive adversary can observe in this federation (attacks check it at construction)."""
    out = {"own_rows", "aux_labels"}
    if fed.passives:
        # passive adversary: its model and gradients; active adversary (feature attacks): the passive
        # messages it receives, and aux feature rows the simulator hands it
        out |= {"bottom_model", "received_gradients", "passive_messages", "aux_features"}
    if fed.channel.record:
        out.add("transcript")
    if fed.n_classes == 2:
        out.add("binary_task")
    return out


def labeled_aligned_ids(fed: Federation) -> np.ndarray:
    """IDs the active party holds labels for and that every party holds (its view only)."""
    a = fed.active
    # called after alignment; the active party's data always carries its labels
    assert a.data.label_ids is not None and a.aligned_ids is not None
    return intersect(a.data.label_ids, a.aligned_ids)


METHODS: Registry[type[Method]] = Registry("method")
"""Every method by name; a method file registers its class with ``@METHODS.register``."""

# the run path (run.py, lab/sweep.py, catalog) looks methods up by these two names
