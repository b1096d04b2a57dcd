"""Cut-layer protocols: how a passive party's bottom output reaches the active party and how the
gradient comes back.

Each protocol has a *passive end* (owned by the passive party) and an *active end* (owned by the
active party); they talk only through the channel. The protocol object itself is a script that
calls the two ends in order: it never sees a tensor except the one it hands back to its owner
(``complete_forward`` returns the active party's input to the head; ``complete_backward`` returns
the passive party's gradient for its bottom output). Multi-round protocols such as the HE layer of
the HE layer (securevfl/crypto/) override these two scripts. Hooks (defenses) run at the sending end.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np
import torch

from securevfl.channel import Endpoint, Message, MessageKind
from securevfl.channel.codec import decode_array
from securevfl.errors import UserError
from securevfl.hooks import HookContext, TensorHook, apply_hooks
from securevfl.interactive import (
    Drbg,
    HParams,
    bound_activation,
    clip_grad,
    first_linear,
    init_factors,
    interactive_hparams,
    split_combine,
    tanh_backward,
    velocity,
)
from securevfl.registry import Registry


class PassiveEnd(ABC):
    def __init__(self, endpoint: Endpoint, active: str, hooks: list[TensorHook]) -> None:
        self.endpoint, self.active, self.hooks = endpoint, active, hooks

    @abstractmethod
    def send_forward(self, z: torch.Tensor, ctx: HookContext) -> None:
        """First forward message: the passive party's bottom output (possibly protected)."""

    @abstractmethod
    def finish_backward(self) -> torch.Tensor:
        """Last backward step: ∂L/∂z as the passive party receives it."""

    def received_gradient(self, msg: Message, previous: Message | None) -> np.ndarray | None:
        """The gradient rows (per example) a message this party *received* carries, as the party
        reads them with what it holds (under HE: decrypted with its own key), or None if the message
        carries none. ``previous`` is the message the party received before it from the same sender.

        Args:
            msg: a recorded message with ``dst`` = this party.
            previous: the message received just before it from ``msg.src`` (None at the start).
        Returns:
            A (batch, width) array, or None.
        """
        if msg.kind == MessageKind.GRADIENT:
            return decode_array(msg.payload)
        return None

    # protocol state the owning party snapshots with its models (e.g. HE weight shares)
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:  # noqa: B027 - stateless ends keep nothing
        pass

    def reset_optimizer_state(self) -> None:  # noqa: B027
        """Forget optimizer state kept by the end (called when the party gets a fresh optimizer)."""


class ActiveEnd(ABC):
    def __init__(self, endpoint: Endpoint, passive: str, hooks: list[TensorHook]) -> None:
        self.endpoint, self.passive, self.hooks = endpoint, passive, hooks

    @abstractmethod
    def finish_forward(self) -> torch.Tensor:
        """The tensor the active party feeds to its head for this passive party (a leaf that
        requires grad during training)."""

    @abstractmethod
    def send_backward(self, grad: torch.Tensor, ctx: HookContext) -> None:
        """First backward message, given ∂L/∂(finish_forward output)."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:  # noqa: B027
        pass

    def reset_optimizer_state(self) -> None:  # noqa: B027
        pass


class CutLayer(ABC):
    """A cut-layer protocol (``--he`` scheme). To add one: subclass, set :attr:`name`, implement
    :meth:`make_ends` (a :class:`PassiveEnd` and an :class:`ActiveEnd` that talk only through their
    endpoints and run the hooks before they send), override :meth:`complete_forward` /
    :meth:`complete_backward` for a multi-round exchange, and add the class to :data:`CUT_LAYERS`."""

    name: ClassVar[str]
    """The ``--he`` name."""

    def __init__(self, **params: object) -> None:
        self.params = params

    @abstractmethod
    def make_ends(self, passive: Endpoint, active: Endpoint, hooks_passive: list[TensorHook],
                  hooks_active: list[TensorHook], cut_dim: int) -> tuple[PassiveEnd, ActiveEnd]:
        """The two ends of one passive party's link.

        Args:
            passive: the passive party's channel endpoint.
            active: the active party's channel endpoint.
            hooks_passive: the passive party's hooks (defenses on what it sends).
            hooks_active: the active party's hooks (defenses on what it sends back).
            cut_dim: width of the passive bottom model's output.
        Returns:
            (passive end, active end), each owned by its party.
        """

    def out_dim(self, cut_dim: int) -> int:
        """Width of what the active party receives per passive party."""
        return cut_dim

    interactive: bool = True
    """Whether the head's first linear layer is split into an interactive layer per passive party
    (:mod:`securevfl.interactive`); methods whose head has no first linear layer, or that read passive
    representations in plaintext, set it False (plain concatenation; refused under HE)."""

    def bind(self, active, passives: list, cut_dim: int, seed: int = 0, interactive_lr: float | None = None) -> None:
        """Called once the parties, head and ends exist: wire each interactive end to the head's shape
        (read at first use, so methods may rebuild the head before training), the run seed and the
        interactive layer's optimizer settings."""
        if not self.interactive:
            return
        for p in passives:
            a_end = active.cut_ends[p.name]
            a_end.head_shape = lambda: (first_linear(active.head).out_features, first_linear(active.head).in_features)
            a_end.hparams = interactive_hparams(active, interactive_lr)
            a_end.seed = p.cut_end.seed = seed
            p.cut_end.hparams = interactive_hparams(p, interactive_lr)

    def combine(self, head: torch.nn.Module, own: torch.Tensor, received: list[torch.Tensor]) -> torch.Tensor:
        """The active party's head on its own output and what each cut-layer end delivered."""
        if self.interactive:
            return split_combine(head, own, received)
        return head(torch.cat([own, *received], dim=1))

    def complete_forward(self, p_end: PassiveEnd, a_end: ActiveEnd) -> torch.Tensor:
        return a_end.finish_forward()

    def complete_backward(self, p_end: PassiveEnd, a_end: ActiveEnd) -> torch.Tensor:
        return p_end.finish_backward()

    def describe(self) -> dict:
        return {"scheme": self.name, **self.params}


# ------------------------------------------------------------------------------------- plaintext
class PlainPassiveEnd(PassiveEnd):
    def send_forward(self, z: torch.Tensor, ctx: HookContext) -> None:
        self.endpoint.send_tensor(self.active, MessageKind.ACTIVATION, apply_hooks(self.hooks, z.detach(), ctx))

    def finish_backward(self) -> torch.Tensor:
        return self.endpoint.recv_tensor(self.active, MessageKind.GRADIENT)


class PlainActiveEnd(ActiveEnd):
    def finish_forward(self) -> torch.Tensor:
        return self.endpoint.recv_tensor(self.passive, MessageKind.ACTIVATION)

    def send_backward(self, grad: torch.Tensor, ctx: HookContext) -> None:
        self.endpoint.send_tensor(self.passive, MessageKind.GRADIENT, apply_hooks(self.hooks, grad, ctx))


class InteractivePassiveEnd(PassiveEnd):
    """P's end of the plaintext interactive layer: sends t = tanh(z), gets ∂L/∂t back."""

    seed: int = 0
    hparams: HParams | None = None

    def send_forward(self, z: torch.Tensor, ctx: HookContext) -> None:
        t = bound_activation(apply_hooks(self.hooks, z.detach(), ctx))
        self._t = t if ctx.training else None
        self.endpoint.send_tensor(self.active, MessageKind.ACTIVATION, t)

    def finish_backward(self) -> torch.Tensor:
        grad_t = self.endpoint.recv_tensor(self.active, MessageKind.GRADIENT)
        out, self._t = tanh_backward(self._t, grad_t), None
        return out


class InteractiveActiveEnd(ActiveEnd):
    """A's end of the plaintext interactive layer: holds W_P (d×h) and its momentum, in float64."""

    seed: int = 0
    hparams: HParams | None = None
    head_shape = None

    def __init__(self, endpoint: Endpoint, passive: str, hooks: list[TensorHook]) -> None:
        super().__init__(endpoint, passive, hooks)
        self.W: np.ndarray | None = None
        self.b: np.ndarray | None = None
        self._t: np.ndarray | None = None

    def finish_forward(self) -> torch.Tensor:
        t = self.endpoint.recv_tensor(self.passive, MessageKind.ACTIVATION).double().numpy()
        if self.W is None:  # W_P(0) = X·Y, both factors from the run seed's streams (see interactive.py)
            h, fan_in = self.head_shape()
            x, y = init_factors(Drbg.derived(self.seed, f"{self.passive}/X"),
                                Drbg.derived(self.seed, f"{self.passive}/Y"), t.shape[1], h, fan_in)
            self.W, self.b = x @ y, np.zeros((t.shape[1], h))
        self._t = t
        return torch.from_numpy(t @ self.W).float()

    def send_backward(self, grad: torch.Tensor, ctx: HookContext) -> None:
        g = clip_grad(apply_hooks(self.hooks, grad, ctx).double().numpy())
        self.endpoint.send_tensor(self.passive, MessageKind.GRADIENT, torch.from_numpy(g @ self.W.T).float())
        lr, mu, wd = self.hparams()
        self.b = velocity(self.b, self._t.T @ g, self.W, mu, wd)
        self.W = self.W - lr * self.b
        self._t = None

    def state_dict(self) -> dict:
        return {"W": None if self.W is None else self.W.copy(), "b": None if self.b is None else self.b.copy()}

    def load_state_dict(self, state: dict) -> None:
        self.W, self.b = state["W"], state["b"]

    def reset_optimizer_state(self) -> None:
        if self.b is not None:
            self.b = np.zeros_like(self.b)


class PlainCutLayer(CutLayer):
    """No encryption. Interactive (default): t = tanh(z) crosses as float32 bytes and A applies W_P;
    otherwise z crosses and the head concatenates. ∂L/∂(what crossed) comes back the same way."""

    name = "off"

    def make_ends(self, passive, active, hooks_passive, hooks_active, cut_dim):
        if self.interactive:
            return (InteractivePassiveEnd(passive, active.party, hooks_passive),
                    InteractiveActiveEnd(active, passive.party, hooks_active))
        return (PlainPassiveEnd(passive, active.party, hooks_passive),
                PlainActiveEnd(active, passive.party, hooks_active))


CUT_LAYERS: Registry[type[CutLayer]] = Registry("cut layer", unknown="--he {name} is not available; available: {names}")
"""Every cut-layer scheme by ``--he`` name. The HE layers (securevfl/crypto) subclass this module's
classes, so they are named here by module path and imported on first use, without an import cycle."""
CUT_LAYERS.register(PlainCutLayer)
CUT_LAYERS.register_lazy("ckks", "securevfl.crypto:CKKSCutLayer")
CUT_LAYERS.register_lazy("paillier", "securevfl.crypto:PaillierCutLayer")
cut_layer_names = CUT_LAYERS.names  # sweep files check --he names with it


def make_cut_layer(name: str, **params: object) -> CutLayer:
    """The cut layer ``--he name --he-param key=value ...`` asks for.

    Args:
        name: ``off``, ``ckks`` or ``paillier``.
        params: the scheme's parameters (validated by the scheme).
    Returns:
        A fresh cut layer (its ends are made per passive party by the federation).
    """
    if name == "off" and params:
        raise UserError(f"--he-param {sorted(params)[0]} needs --he ckks or --he paillier")
    return CUT_LAYERS.get(name)(**params)
