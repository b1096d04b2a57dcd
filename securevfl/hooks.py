"""Hook points on cut-layer messages (SPEC §4). Defenses live in the top-level ``defenses``
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
    n_examples: int | None = None
    """Size of the population batches are drawn from (e.g. labeled aligned rows), for accounting."""
    sample_rate: float | None = None
    """Nominal batch size / ``n_examples`` of the current training run."""
    planned_releases: int | None = None
    """How many messages of this kind the sender will emit in the current training run (steps ×
    receivers): lets a defense calibrate noise to a target ε before the first release."""


class TensorHook(ABC):
    """Transforms one outgoing message tensor. Subclasses declare the kinds they act on."""

    acts_on: ClassVar[frozenset[str]] = frozenset()
    name: ClassVar[str] = "hook"
    needs_aligned_batches: ClassVar[bool] = False
    """True when the hook's guarantee assumes each released row belongs to one labeled example of
    a batch all parties share (e.g. the label-DP accountant); methods without aligned batches
    (entity-aug) refuse such hooks."""

    @abstractmethod
    def __call__(self, tensor: torch.Tensor, ctx: HookContext) -> torch.Tensor: ...

    def for_party(self, party: str) -> TensorHook:
        """The copy a given party installs (parties never share hook state); defenses reseed here."""
        return copy.deepcopy(self)

    def privacy(self) -> dict | None:
        """Privacy report (ε, δ, mechanism, ...) if the hook accounts for one."""
        return None

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:  # noqa: B027 - optional for stateless hooks
        pass


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
