"""Hook points on cut-layer messages. Defenses live in the top-level ``defenses``
package and subclass :class:`TensorHook`; the core only knows this contract.

A hook runs at the *sender*, on the tensor just before it is serialised: gradient hooks at the
active party before ∂L/∂r is returned, activation hooks at a passive party before r is sent,
SSL-representation hooks on representations exchanged during cross-party pre-training. A hook must
keep shape and dtype (checked by :func:`apply_hooks`).
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from securevfl.errors import UserError


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


class TensorHook(ABC):
    """Transforms one outgoing message tensor. Subclasses declare the kinds they act on."""

    acts_on: ClassVar[frozenset[str]] = frozenset()
    """Message kinds (:class:`securevfl.channel.MessageKind`) the hook transforms; others pass."""
    name: ClassVar[str] = "hook"
    needs_aligned_batches: ClassVar[bool] = False
    """True when the hook's guarantee assumes each released row belongs to one labeled example of
    a batch all parties share (e.g. the label-DP accountant); methods without aligned batches
    (entity-aug) refuse such hooks."""

    @abstractmethod
    def __call__(self, tensor: torch.Tensor, ctx: HookContext) -> torch.Tensor:
        """Transform one outgoing message.

        Args:
            tensor: what the sending party is about to send (detached), one row per example.
            ctx: the message's kind, sender, receiver, batch IDs and whether the step trains.
        Returns:
            A tensor of the same shape and dtype (checked by :func:`apply_hooks`).
        """

    def for_party(self, party: str) -> TensorHook:
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


def apply_hooks(hooks: list[TensorHook], tensor: torch.Tensor, ctx: HookContext) -> torch.Tensor:
    for hook in hooks:
        if ctx.kind not in hook.acts_on:
            continue
        out = hook(tensor, ctx)
        if out.shape != tensor.shape or out.dtype != tensor.dtype:
            raise RuntimeError(f"hook {hook.name} changed {tuple(tensor.shape)}/{tensor.dtype} "
                               f"to {tuple(out.shape)}/{out.dtype}")
        tensor = out
    return tensor


class StepPrivatizer(ABC):
    """A defense that replaces how the active party turns its labeled loss into gradients (DP-SGD
    over everything that touches labels). The active party hands it per-example gradients and uses
    only what it returns, both for its own update and for what it sends back through the cut layer."""

    @abstractmethod
    def plan(self, participations: int) -> None:
        """The whole training plan before the first step: how many times at most one labeled example
        takes part in a step over every training run of the method (target-ε calibration)."""

    @abstractmethod
    def begin_run(self, run: str, n_examples: int, batch_size: int, steps: int, participations: int) -> None:
        """A training run starts (one ledger entry: an lr-grid candidate, a stage, the final fit)."""

    @abstractmethod
    def release(self, summed: list[torch.Tensor], rows: list[torch.Tensor], batch_size: int
                ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-example gradients in, the step's private release out.

        Args:
            summed: per-parameter tensors ``(n, *param.shape)`` (example i's gradient of its own loss).
            rows: per-cut-layer tensors ``(n, *row.shape)`` (example i's gradient of its received row).
            batch_size: the nominal batch size the release is averaged over.
        Returns:
            the parameter gradients (summed over examples) and the released rows, both noised.
        """

    @abstractmethod
    def select(self, scores: list[float], n_val: int) -> int:
        """Private choice of the best of several candidates scored by accuracy on ``n_val`` labeled rows."""


class PassivePrivatizer(ABC):
    """A defense that replaces how a passive party updates its bottom model (DP-SGD over its
    features): it gets per-example parameter gradients and returns the noised sum to apply."""

    @abstractmethod
    def update(self, per_example: list[torch.Tensor], batch_size: int, ids: np.ndarray) -> list[torch.Tensor]: ...


class LabelRandomizer(ABC):
    """A defense that randomises the active party's training labels once, at the source."""

    @abstractmethod
    def randomize(self, labels: np.ndarray, n_classes: int, features: np.ndarray | None = None) -> np.ndarray:
        """Randomised training labels (same order). ``features``: the party's own rows for those
        labels, for mechanisms that build a prior from them (None where the party holds none)."""


def find_hook(hooks: list[TensorHook], kind: type) -> object | None:
    """The one hook of a given contract among a party's hooks (None if there is none)."""
    found = [h for h in hooks if isinstance(h, kind)]
    if len(found) > 1:
        raise UserError(f"compose at most one {found[0].name} defense")
    return found[0] if found else None
