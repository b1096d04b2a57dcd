"""A malicious active party's program in the simulator (issue 60): after training, the active party keeps
driving the passive parties through the ordinary protocol, but chooses every step itself: which rows,
which gradient it returns, when a passive party snapshots or restores its state.

:class:`Steering` is what such a program holds: the active party's view of the federation (its own
party, a handle per passive party, the active half of the cut layer: :func:`securevfl.runtime.active_view`)
while every passive party serves in its own thread (:func:`securevfl.runtime.run_in_process`), exactly
as during training. Nothing here touches a passive party's objects: requests, released rows and
gradients cross the channel as bytes, and the passive parties answer as their program does. The
``limits`` of :func:`steer` puts a deployed passive party's own limits in place
(:class:`securevfl.policy.RequestLimits`), so the lab can show what they stop.

The gradient goes through the active party's own end of the cut layer (``send_backward``), so the
same program runs under HE: there the active party chooses ∂L/∂(what it received), and the passive
party gets that times W_P, which the active party does not know in full."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch

from securevfl.channel import MessageKind
from securevfl.hooks import HookContext

if TYPE_CHECKING:
    from securevfl.federation import Federation
    from securevfl.policy import RequestLimits

T = TypeVar("T")


class Steering:
    """The active party's hands on one passive party (``target``) during a hijacked program."""

    def __init__(self, view: Federation, target: str) -> None:
        from securevfl.runtime import handles

        self.view = view
        self.active = view.active
        self.target = target
        self.handle = next(h for h in handles(view) if h.name == target)
        self.names = [h.name for h in handles(view)]
        self.requests = 0

    def snapshot(self) -> dict:
        """Every passive party keeps its state; the active party keeps its own (the interactive layer)."""
        from securevfl.runtime import handles

        self.requests += len(self.names)
        return {"passives": {h.name: h.snapshot() for h in handles(self.view)}, "active": self.active.snapshot()}

    def restore(self, snap: dict) -> None:
        from securevfl.runtime import handles

        self.requests += len(self.names)
        for h in handles(self.view):
            h.restore(snap["passives"][h.name])
        self.active.restore(snap["active"])

    def release(self, ids: np.ndarray, training: bool = False) -> dict[str, torch.Tensor]:
        """Ask every passive party for its output on ``ids``; what the active party receives from each
        (plaintext: a_P = t·W_P through the interactive layer, or z without it; HE: the decrypted a_P)."""
        self.requests += len(self.names)
        self.active.request(np.asarray(ids), "train", training)
        return {n: self.view.cut.active_forward(self.active.cut_ends[n], training) for n in self.names}

    def step(self, ids: np.ndarray, gradient: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """One training step on ``ids`` whose gradient the active party chooses: ``gradient(received)``
        for the target (the others get zeros). Returns what it received from the target."""
        got = self.release(ids, training=True)
        for n in self.names:
            g = gradient(got[n]) if n == self.target else torch.zeros_like(got[n])
            ctx = HookContext(MessageKind.GRADIENT, self.active.name, n, self.active.step, True, np.asarray(ids))
            self.active.cut_ends[n].send_backward(g.to(got[n].dtype), ctx)
        return got[self.target]

    def pre_activation(self, received: torch.Tensor) -> np.ndarray:
        """The adversary's best reading of the target's bottom output z from what it received: with the
        plaintext interactive layer it knows W_P, so t = a_P·W_P⁺ and z = atanh(t); otherwise (HE, or
        the secret mixing) what it received, as is."""
        end: Any = self.active.cut_ends[self.target]
        a = received.detach().double().cpu().numpy()
        W = getattr(end, "W", None)
        if W is None or getattr(end, "mix", None) is not None or self.view.cut.name != "off":
            return a
        t = a @ np.linalg.pinv(np.asarray(W, dtype=np.float64))
        return np.arctanh(np.clip(t, -1 + 1e-9, 1 - 1e-9))


def steer(fed: Federation, target: str, program: Callable[[Steering], T],
          limits: Callable[[], RequestLimits] | None = None) -> T:
    """Run ``program`` as the active party's program on the trained federation ``fed`` (simulator), every
    passive party serving its own program in its thread. ``limits``: each passive party's
    :class:`~securevfl.policy.RequestLimits` (a deployed party's own; None: the simulator's, none)."""
    from securevfl.runtime import run_in_process

    return run_in_process(fed, None, lambda view: program(Steering(view, target)), limits=limits)
