"""Defense contracts: the hook points a party offers. This module is the reference for writing a
defense, and the only thing the core knows about one: no core module branches on a defense's name
or concrete class.

A defense is one file under ``defenses/`` whose class implements one or more hook points below.
Every hook is a :class:`PartyHook` and declares

- ``runs_at``: the roles whose parties install it (``active``, ``passive``). A party installs its own
  copy (:meth:`PartyHook.for_party`) of every hook that runs at its role, when it is constructed;
  the others never reach it.
- ``observes``: what the hook may read (:data:`OBSERVABLES`; checked when the class is defined).
- ``carries_epsilon``: whether its :meth:`PartyHook.privacy` report carries an accounted ε.
- ``acts_on``: the cut-layer message kinds whose content it changes, directly or through the
  party's step (a run refuses a defense that changes nothing its method sends).

Hook points, and where the party calls them:

(a) :class:`MessageTransform` — transform a message tensor at the sender's boundary just before it
    is serialised: activations at a passive party, gradients at the active party, SSL
    representations (ISO, sparsify, activation noise). Called by the cut-layer ends.
(b) :class:`ActiveStep` / :class:`PassiveStep` — own a party's training step: how a batch's losses
    become a parameter update and, at the active party, the gradient rows released to the passive
    parties (DP-SGD). This is Opacus's ``make_private`` shape: the party delegates to its step rule,
    :class:`PlainActiveStep` / :class:`PlainPassiveStep` unless a defense provides one (at most one
    per party), and the trainer's loop never asks whether training is private.
    :class:`securevfl.per_example.PerExampleActiveStep` / ``PerExamplePassiveStep`` do the
    per-example plumbing, leaving a mechanism only its ``release`` / ``update``.
(c) :class:`LabelTransform` — transform the active party's training labels once, at the source, when
    the party is constructed (RR; CAE): nothing downstream ever sees the originals.
(d) :class:`ModelWrap` — wrap the party's bottom model or head, or put a trainable layer on what
    each passive party delivers before the active party's head reads it (MID's bottleneck), when
    the party is constructed; the new parameters are the party's own and join its optimizer.
    :class:`ExtraLoss` — add a term to the party's objective each training step from what the
    step exposes (:class:`StepView`; dCor / NoPeek at a passive party). At the active party a term
    is label-free (it sees no labels) and stays outside a DP-SGD clipped sum.
(e) :class:`GradientCheck` — read each gradient a passive party receives for what it sent, as the
    cut-layer end holds it before turning it into ∂L/∂z (∂L/∂t of the interactive layer, decrypted
    under HE, before the party's own unmixing), and raise a :class:`UserError` to end the run (a
    detector). It changes nothing. Called by the passive cut-layer ends, in training and in any
    later step the active party drives.

A hook that needs randomness draws it only from its own generator (``defenses.base.Defense``
creates it and reseeds it per party), so all of a mechanism's noise comes from one place.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, cast

import numpy as np
import torch
from torch import nn

from securevfl.errors import UserError
from securevfl.metrics import utility
from securevfl.models import HEADS
from securevfl.roles import ACTIVE, PASSIVE

OBSERVABLES = frozenset({
    "messages",  # the outgoing message tensor it transforms (and its batch IDs)
    "labels",  # the active party's training labels
    "own_features",  # the installing party's feature rows
    "own_output",  # the installing party's bottom output
    "received",  # what the active party received through the cut layer
    "per_example_gradients",  # each example's gradient, before anything is released
    "validation_scores",  # the learning-rate search's scores on held-out labeled rows
    "received_gradients",  # the gradients a passive party receives for what it sent (hook point (e))
})
"""What a hook may declare it observes (``PartyHook.observes``)."""


@dataclass(frozen=True)
class HookContext:
    kind: str
    """Message kind (see :class:`securevfl.channel.MessageKind`)."""
    src: str
    dst: str
    step: int
    """Training step counter of the sending party (0-based)."""
    training: bool
    batch_ids: np.ndarray | None = None
    labels: np.ndarray | None = None
    """Returned gradients only, and only for hooks that observe ``labels`` (the active party's own
    training labels of ``batch_ids``; -1 where it holds none): label-aware mechanisms (MARVELL)."""


class PartyHook(ABC):  # noqa: B024 - the base of the hook points; it has no abstract method of its own
    """What every hook declares (see the module docstring)."""

    name: ClassVar[str] = "hook"
    runs_at: frozenset[str] = frozenset({ACTIVE, PASSIVE})
    """Roles whose parties install this hook (a class default; a defense at zero strength sets its own,
    empty: installed nowhere, so the run is bit-identical to no defense)."""
    observes: ClassVar[frozenset[str]] = frozenset()
    """What the hook may read (a subset of :data:`OBSERVABLES`)."""
    carries_epsilon: ClassVar[bool] = False
    """Whether :meth:`privacy` reports an accounted ε (a true upper bound over the whole run)."""
    acts_on: frozenset[str] = frozenset()
    """Message kinds (:class:`securevfl.channel.MessageKind`) whose content the hook changes (a class
    default; a hook whose kinds depend on its parameters, e.g. ISO's ``lam_p``, sets its own)."""
    needs_aligned_batches: ClassVar[bool] = False
    """True when the hook's guarantee assumes each released row belongs to one labeled example of
    a batch all parties share (e.g. the label-DP accountant); methods without aligned batches
    (entity-aug) refuse such hooks."""
    soft_labels: ClassVar[bool] = False
    """True when the hook's label transform yields class-probability rows (CAE's confused labels);
    methods that read training labels as classes, and a learning-rate search, refuse it."""
    bounds_features: ClassVar[bool] = False
    """True when the hook bounds what the supervised loop releases about passive features; methods
    that use those features outside the loop (pre-training, SSL, imputation) refuse it."""
    heads: ClassVar[frozenset[str]] = frozenset(HEADS)
    """The ``--head`` kinds (:data:`securevfl.models.HEADS`) this hook applies to; a run with another
    head refuses it at build time."""

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        unknown = set(cls.observes) - OBSERVABLES
        if unknown:  # a typo here would silently widen what a defense claims to see
            raise TypeError(f"{cls.__name__}.observes names unknown observables {sorted(unknown)}")

    def for_party(self, party: str) -> PartyHook:
        """The copy a given party installs (parties never share hook state); defenses reseed here.

        Args:
            party: the installing party's name.
        Returns:
            An independent copy.
        """
        return copy.deepcopy(self)

    def privacy(self) -> dict | None:
        """Privacy report (ε, δ, mechanism, ...) if the hook accounts for one.

        Returns:
            A dict whose ``epsilon`` must be a true upper bound over the whole run, or None.
        """
        return None

    def state_dict(self) -> dict:
        """State a party snapshots with its models (e.g. an accountant's ledger).

        Returns:
            A dict :meth:`load_state_dict` restores.
        """
        return {}

    def load_state_dict(self, state: dict) -> None:  # noqa: B027 - optional for stateless hooks
        """Restore what :meth:`state_dict` returned."""


# ----------------------------------------------------------------------------- (a) messages
class MessageTransform(PartyHook):
    """Hook point (a): transforms one outgoing message tensor at the sender, for the kinds in
    :attr:`acts_on`. Must keep shape and dtype (checked by :func:`apply_hooks`)."""

    observes = frozenset({"messages"})

    @abstractmethod
    def __call__(self, tensor: torch.Tensor, ctx: HookContext) -> torch.Tensor:
        """Transform one outgoing message.

        Args:
            tensor: what the sending party is about to send (detached), one row per example.
            ctx: the message's kind, sender, receiver, batch IDs and whether the step trains.
        Returns:
            A tensor of the same shape and dtype (checked by :func:`apply_hooks`).
        """


TensorHook = MessageTransform
"""The message hook's earlier name (tests and benchmarks observe cut-layer tensors through it)."""


def apply_hooks(hooks: list[PartyHook], tensor: torch.Tensor, ctx: HookContext) -> torch.Tensor:
    """Run the message transforms among ``hooks`` that act on ``ctx.kind``, in order."""
    for hook in hooks:
        if not isinstance(hook, MessageTransform) or ctx.kind not in hook.acts_on:
            continue
        out = hook(tensor, ctx)
        if out.shape != tensor.shape or out.dtype != tensor.dtype:
            raise RuntimeError(f"hook {hook.name} changed {tuple(tensor.shape)}/{tensor.dtype} "
                               f"to {tuple(out.shape)}/{out.dtype}")
        tensor = out
    return tensor


# ------------------------------------------------------------------------------- (b) the step
def _no_per_example() -> tuple[torch.Tensor, np.ndarray]:
    raise UserError("this method's objective has no per-example form, so a per-example step rule "
                    "(e.g. dp) cannot run on it")


@dataclass(frozen=True)
class Objective:
    """One training step's objective at the active party, as the trainer defines it; the party's
    step rule asks for the form it needs. Every form is computed on demand, at most once."""

    mean: Callable[[], torch.Tensor]
    """The whole objective as the batch mean (labeled loss + every extra term), not yet checked."""
    check: Callable[[torch.Tensor], torch.Tensor]
    """Returns its argument, or raises :class:`securevfl.errors.TrainingDiverged` if it is not finite."""
    batch_size: int
    """The nominal (public) batch size a per-example release is averaged over."""
    per_example: Callable[[], tuple[torch.Tensor, np.ndarray]] = _no_per_example
    """Every labeled example's loss (the batch rows first, then a method's other labeled rows) and
    their IDs; ``Σ / batch_size`` is the labeled part of :attr:`mean`."""
    free: Callable[[], torch.Tensor] = field(default=lambda: torch.zeros(()))
    """The label-free part of the objective (added outside a per-example clip)."""

    def plus(self, term: Callable[[], torch.Tensor]) -> Objective:
        """This objective with a label-free ``term`` added (a hook's :class:`ExtraLoss`)."""
        mean, free = self.mean, self.free
        return Objective(lambda: mean() + term(), self.check, self.batch_size, self.per_example,
                         lambda: free() + term())


@dataclass(frozen=True)
class StepGradients:
    """What an active step rule returns: the reported loss, the gradient to apply to each of the
    party's parameters (None: untouched) and the gradient row block to send back for each received input."""

    loss: torch.Tensor
    params: list[torch.Tensor | None]
    rows: list[torch.Tensor]


class ActiveStep(PartyHook):
    """Hook point (b) at the active party: how a batch's objective becomes a parameter update and a
    gradient release, and, because they too touch labels, how learning-rate candidates are scored
    and chosen and how the budget of a whole training plan is set."""

    runs_at = frozenset({ACTIVE})

    def arm(self, modules: list[nn.Module]) -> None:  # noqa: B027 - rules that need no tracing
        """A training forward through ``modules`` is about to run (per-example tracing arms here)."""

    @abstractmethod
    def gradients(self, objective: Objective, params: list[nn.Parameter], received: list[torch.Tensor]
                  ) -> StepGradients:
        """The step's update and release.

        Args:
            objective: the step's objective (:class:`Objective`).
            params: the party's trainable parameters (their ``.grad`` is None).
            received: the leaves the cut layer delivered this step (one per passive party).
        Returns:
            The loss to report, the gradients to apply and the rows to send back (shaped as ``received``).
        """

    def plan(self, budget: Callable[[], tuple[int, int]]) -> None:  # noqa: B027 - only accountants plan
        """The method's whole training plan, before the first step: ``budget()`` gives how many steps
        at most one labeled example takes part in, and how many private selections there are (it
        raises a UserError for a method whose labels reach training outside the shared loop)."""

    def begin_run(self, run: str, n_examples: int, batch_size: int, steps: int,  # noqa: B027
                  participations: int) -> None:
        """A training run starts (an lr-grid candidate, a stage, the final fit)."""

    def score(self, probs: np.ndarray, y: np.ndarray, n_classes: int) -> float:
        """A learning-rate candidate's score on held-out labeled rows."""
        return utility(probs, y, n_classes)["test"]

    def choose(self, grid: list[float], scores: dict[float, float], n_val: int) -> float:
        """The learning rate to retrain with (the best score; ties go to the smaller rate)."""
        return max(grid, key=lambda lr: (np.nan_to_num(scores[lr], nan=-1.0), -lr))


class PlainActiveStep(ActiveStep):
    """The ordinary step: backpropagate the batch-mean objective; send ∂L/∂r as computed."""

    name = "plain"

    def gradients(self, objective: Objective, params: list[nn.Parameter], received: list[torch.Tensor]
                  ) -> StepGradients:
        loss = objective.check(objective.mean())
        loss.backward()
        # every received input is a leaf that requires grad in training (ActiveParty.receive) and
        # feeds the head, so backward set its gradient
        rows = cast(list[torch.Tensor], [r.grad for r in received])
        return StepGradients(loss, [q.grad for q in params], rows)


class PassiveStep(PartyHook):
    """Hook point (b) at a passive party: how the gradient it received for its bottom output
    (plus any extra loss terms of its own) becomes the gradient it applies to its parameters."""

    runs_at = frozenset({PASSIVE})

    def arm(self, modules: list[nn.Module]) -> None:  # noqa: B027 - rules that need no tracing
        """A training forward through ``modules`` is about to run."""

    @abstractmethod
    def gradients(self, z: torch.Tensor, grad: torch.Tensor, extra: torch.Tensor | None,
                  params: list[nn.Parameter], ids: np.ndarray) -> list[torch.Tensor | None]:
        """Gradients to apply, one per parameter (None: untouched).

        Args:
            z: this step's bottom output (the graph to the parameters).
            grad: ∂L/∂z as received.
            extra: the sum of this party's extra loss terms (None when it has none).
            params: the party's trainable parameters (their ``.grad`` is None).
            ids: the rows of this step.
        """


class PlainPassiveStep(PassiveStep):
    """The ordinary step: backpropagate the received gradient (and any extra term)."""

    name = "plain"

    def gradients(self, z: torch.Tensor, grad: torch.Tensor, extra: torch.Tensor | None,
                  params: list[nn.Parameter], ids: np.ndarray) -> list[torch.Tensor | None]:
        if extra is None:
            z.backward(grad)
        else:
            torch.autograd.backward([z, extra], [grad, torch.ones_like(extra)])
        return [q.grad for q in params]


# ----------------------------------------------------------------------------- (e) received gradients
class GradientCheck(PartyHook):
    """Hook point (e) at a passive party: read a received gradient (a detector); changes nothing."""

    runs_at = frozenset({PASSIVE})
    alarm_count = 0
    """Alarms raised so far (the lab reports how many each attack raised)."""
    checked = 0
    """Gradients tested so far (the lab reports how many each attack sent, beside its alarms)."""

    @abstractmethod
    def check(self, grad: torch.Tensor, ctx: HookContext) -> None:
        """Read one received gradient (batch, width); raise a UserError to end the run."""


def check_received(hooks: list[PartyHook], grad: torch.Tensor, ctx: HookContext | None) -> None:
    """Hand a received gradient to the party's :class:`GradientCheck` hooks (ctx: the training send's)."""
    if ctx is None:
        return
    for h in hooks:
        if isinstance(h, GradientCheck):
            h.check(grad.detach().cpu(), ctx)


# ----------------------------------------------------------------------------- (c) labels
class LabelTransform(PartyHook):
    """Hook point (c): transforms the active party's training labels once, when the party is built."""

    runs_at = frozenset({ACTIVE})
    observes = frozenset({"labels", "own_features"})

    @abstractmethod
    def transform_labels(self, labels: np.ndarray, n_classes: int, features: np.ndarray | None = None
                         ) -> np.ndarray:
        """The training labels to train on (same order and dtype; with :attr:`PartyHook.soft_labels`,
        one float32 row of class probabilities per label).

        Args:
            labels: the party's training labels.
            n_classes: the number of classes.
            features: the party's own rows for those labels (None where it holds none), for
                mechanisms that build a prior from them.
        """


# --------------------------------------------------------------------- (d) models and losses
@dataclass(frozen=True)
class StepView:
    """What one training step exposes to a party's :class:`ExtraLoss` (the party's own tensors,
    with their graphs)."""

    ids: np.ndarray
    features: torch.Tensor
    """The party's input rows."""
    output: torch.Tensor
    """Its bottom model's output on them."""
    received: list[torch.Tensor] = field(default_factory=list)
    """Active party only: the cut layer's deliveries."""
    labels: torch.Tensor | None = None
    """Active party, only for a loss term that declares :attr:`ExtraLoss.uses_labels`: the batch's
    training labels as class indices (soft labels by their largest class); None where the batch's
    rows carry none in the party's table."""


class ModelWrap(PartyHook):
    """Hook point (d): wraps the party's models when it is constructed (before its optimizer exists,
    so the wrapper's parameters are trained with the rest)."""

    def wrap_bottom(self, bottom: nn.Module) -> nn.Module:
        """The bottom model the party trains (default: unchanged)."""
        return bottom

    def wrap_head(self, head: nn.Module) -> nn.Module:
        """Active party: the head it trains (default: unchanged)."""
        return head

    def wrap_received(self, passive: str, width: int) -> nn.Module | None:
        """Active party: a trainable layer on what passive party ``passive`` delivers (``width``
        columns in and out: the sent rows, or a_P = t·W_P with the interactive layer) before the
        head reads it, e.g. MID's bottleneck; None: no layer. The cut layer still returns
        ∂L/∂(the delivery), now through this layer."""
        return None


class ExtraLoss(PartyHook):
    """Hook point (d): a term added to the party's objective at every training step."""

    observes = frozenset({"own_features", "own_output"})
    uses_labels: ClassVar[bool] = False
    """The term reads the batch's labels (:attr:`StepView.labels`). Extra terms join the objective
    outside a DP step rule's per-example clipping, so such a term cannot compose with one (``dp``):
    the composition check refuses it."""

    @abstractmethod
    def loss_term(self, view: StepView) -> torch.Tensor:
        """A scalar added to the party's objective (at the active party: label-free unless the hook
        declares :attr:`uses_labels`)."""


def find_hook(hooks: list[PartyHook], kind: type) -> object | None:
    """The one hook of a given contract among a party's hooks (None if there is none)."""
    found = [h for h in hooks if isinstance(h, kind)]
    if len(found) > 1:
        raise UserError(f"defenses {' and '.join(h.name for h in found)} each provide the party's {kind.__name__} "
                        "(a party has one); compose at most one of them")
    return found[0] if found else None


def hooks_of(hooks: list[PartyHook], kind: type) -> list:
    """Every hook of a given contract among a party's hooks, in installation order."""
    return [h for h in hooks if isinstance(h, kind)]
