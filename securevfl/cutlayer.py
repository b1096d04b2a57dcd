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
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from securevfl.channel import Endpoint, Message, MessageKind
from securevfl.channel.codec import decode_array
from securevfl.errors import UserError
from securevfl.hooks import HookContext, PartyHook, apply_hooks, check_received
from securevfl.interactive import (
    MIX_LR_GAIN,
    MIXING,
    Drbg,
    HParams,
    bound_activation,
    clip_grad,
    draw_mix_a,
    draw_mix_p,
    first_linear,
    init_factors,
    mix_g,
    mix_t,
    mixing_for,
    split_combine,
    tanh_backward,
    to_host,
    to_party,
    unmix_grad,
    velocity,
)
from securevfl.registry import Registry


@dataclass(frozen=True)
class EndWiring:
    """What a cut-layer end is built with, from the party that owns it (:meth:`Party.end_wiring`).
    The interactive layer's settings are read at use time, because a method may give the party a
    fresh optimizer or rebuild the head after the ends exist."""

    endpoint: Endpoint
    """The owner's channel endpoint."""
    hooks: list[PartyHook]
    """The owner's hooks (defenses); its message transforms apply to what this end sends."""
    seed: int = 0
    """The run seed: the interactive layer's W_P(0) factors come from its named streams."""
    hparams: HParams | None = None
    """The interactive layer's (lr, momentum, weight decay), read from the owner's optimizer each step."""
    head_shape: Callable[[], tuple[int, int]] | None = None
    """Active ends only: (out, in) features of the head's first linear layer, read at first use."""


class PassiveEnd(ABC):
    """The passive party's end of one cut layer (built by :meth:`CutLayer.passive_end` with the passive
    party's :class:`EndWiring` and the active party's name)."""

    def __init__(self, own: EndWiring, active: str) -> None:
        self.endpoint, self.active, self.hooks = own.endpoint, active, own.hooks
        self._sent: HookContext | None = None  # the training send the next gradient answers

    def keep(self, ctx: HookContext) -> None:
        """Remember a training send: the gradient that answers it goes to hook point (e) with its step."""
        self._sent = ctx if ctx.training else None

    def received(self, grad: torch.Tensor) -> torch.Tensor:
        """Hook point (e): the party's gradient checks read what it received (before it is used)."""
        sent, self._sent = self._sent, None
        if sent is not None:
            check_received(self.hooks, grad, HookContext(MessageKind.GRADIENT, self.active, sent.src, sent.step,
                                                         True, sent.batch_ids))
        return grad

    @abstractmethod
    def send_forward(self, z: torch.Tensor, ctx: HookContext) -> None:
        """First forward message: the passive party's bottom output (possibly protected).

        Args:
            z: the bottom model's output on this step's rows (batch, cut_dim).
            ctx: the step's hook context; the end applies its hooks to what it sends."""

    @abstractmethod
    def finish_backward(self) -> torch.Tensor:
        """Last backward step: ∂L/∂z as the passive party receives it.

        Returns:
            The gradient with respect to ``z`` of :meth:`send_forward` (batch, cut_dim)."""

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
    """The active party's end of one cut layer towards passive party ``passive`` (built by
    :meth:`CutLayer.active_end` with the active party's :class:`EndWiring`)."""

    def __init__(self, own: EndWiring, passive: str) -> None:
        self.endpoint, self.passive, self.hooks = own.endpoint, passive, own.hooks

    @abstractmethod
    def finish_forward(self, training: bool) -> torch.Tensor:
        """Last forward step, at the active party.

        Args:
            training: whether this step trains (an end may then keep what its backward pass needs).
        Returns:
            The tensor the active party feeds to its head for this passive party (a leaf that
            requires grad during training)."""

    @abstractmethod
    def send_backward(self, grad: torch.Tensor, ctx: HookContext) -> None:
        """First backward message.

        Args:
            grad: ∂L/∂(the tensor :meth:`finish_forward` returned).
            ctx: the step's hook context; the end applies its hooks to what it sends."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:  # noqa: B027
        pass

    def reset_optimizer_state(self) -> None:  # noqa: B027
        pass


class CutLayer(ABC):
    """A cut-layer protocol (``--he`` scheme). To add one: subclass, set :attr:`name`, implement
    :meth:`passive_end` and :meth:`active_end` (a :class:`PassiveEnd` and an :class:`ActiveEnd` that
    talk only through their endpoints and run the hooks before they send; each party builds its
    own), override :meth:`complete_forward` / :meth:`complete_backward` for a multi-round exchange,
    and add the class to :data:`CUT_LAYERS`."""

    name: ClassVar[str]
    """The ``--he`` name."""

    def __init__(self, *, interactive: bool = True, mixing: str = "off", **params: object) -> None:
        mixing = mixing_for(mixing, self.name)
        if mixing not in MIXING:
            raise UserError(f"interactive mixing {mixing!r}: expected one of {', '.join(MIXING)}")
        self.interactive = interactive
        self.mixing = mixing == "on" and interactive
        """The interactive layer's secret mixing (:mod:`securevfl.interactive`; the gauge fix)."""
        """Whether the head's first linear layer is split into an interactive layer per passive party
        (:mod:`securevfl.interactive`); methods whose head has no first linear layer, or that read
        passive representations in plaintext, ask for False (plain concatenation; refused under HE)."""
        self.params = params

    @abstractmethod
    def passive_end(self, own: EndWiring, active: str) -> PassiveEnd:
        """A passive party's end of this layer towards the active party (built by that party).

        Args:
            own: what the passive party's end is built with (its endpoint, hooks, settings).
            active: the active party's name.
        """

    @abstractmethod
    def active_end(self, own: EndWiring, passive: str) -> ActiveEnd:
        """The active party's end of this layer towards passive party ``passive`` (built by the active party)."""

    def out_dim(self, cut_dim: int) -> int:
        """Width of what the active party receives per passive party."""
        return cut_dim

    def delivery_width(self, out_dim: int, head: torch.nn.Module) -> int:
        """Width of what the active party's end delivers per passive party: the head's first-layer
        width with the interactive layer (a_P = t·W_P), else ``out_dim`` (the sent rows)."""
        return first_linear(head).out_features if self.interactive else out_dim

    def combine(self, head: torch.nn.Module, own: torch.Tensor, received: list[torch.Tensor]) -> torch.Tensor:
        """The active party's head on its own output and what each cut-layer end delivered."""
        if self.interactive:
            return split_combine(head, own, received)
        return head(torch.cat([own, *received], dim=1))

    def complete_forward(self, p_end: PassiveEnd, a_end: ActiveEnd) -> torch.Tensor:
        # training steps run with autograd on; evaluation runs under torch.no_grad()
        return a_end.finish_forward(torch.is_grad_enabled())

    def complete_backward(self, p_end: PassiveEnd, a_end: ActiveEnd) -> torch.Tensor:
        return self.passive_backward(p_end)

    # The two halves of the scripts above, for parties running their own programs (securevfl/runtime.py):
    # each side runs its own half and blocks on the network where the script interleaves them.
    def active_forward(self, a_end: ActiveEnd, training: bool) -> torch.Tensor:
        """The active party's part of the forward exchange (after the passive party's send_forward)."""
        return a_end.finish_forward(training)

    def passive_forward(self, p_end: PassiveEnd) -> None:  # noqa: B027 - one-message layers have none
        """The passive party's part of the forward exchange after send_forward (none for one message)."""

    def passive_backward(self, p_end: PassiveEnd) -> torch.Tensor:
        """The passive party's part of the backward exchange: its gradient for its bottom output."""
        return p_end.finish_backward()

    def describe(self) -> dict:
        return {"scheme": self.name, **self.params, **({"interactive_mixing": "on"} if self.mixing else {})}


# ------------------------------------------------------------------------------------- plaintext
class PlainPassiveEnd(PassiveEnd):
    def send_forward(self, z: torch.Tensor, ctx: HookContext) -> None:
        self.keep(ctx)
        self.endpoint.send_tensor(self.active, MessageKind.ACTIVATION, apply_hooks(self.hooks, z.detach(), ctx))

    def finish_backward(self) -> torch.Tensor:
        return self.received(self.endpoint.recv_tensor(self.active, MessageKind.GRADIENT))


class PlainActiveEnd(ActiveEnd):
    def finish_forward(self, training: bool) -> torch.Tensor:
        return self.endpoint.recv_tensor(self.passive, MessageKind.ACTIVATION)

    def send_backward(self, grad: torch.Tensor, ctx: HookContext) -> None:
        self.endpoint.send_tensor(self.passive, MessageKind.GRADIENT, apply_hooks(self.hooks, grad, ctx))


class InteractivePassiveEnd(PassiveEnd):
    """P's end of the plaintext interactive layer: sends t = tanh(z), gets ∂L/∂t back."""

    def __init__(self, own: EndWiring, active: str) -> None:
        super().__init__(own, active)
        self.seed, self.hparams = own.seed, own.hparams

    def send_forward(self, z: torch.Tensor, ctx: HookContext) -> None:
        self.keep(ctx)
        t = bound_activation(apply_hooks(self.hooks, z.detach(), ctx))
        self._t = t if ctx.training else None
        self.endpoint.send_tensor(self.active, MessageKind.ACTIVATION, t)

    def finish_backward(self) -> torch.Tensor:
        grad_t = self.received(self.endpoint.recv_tensor(self.active, MessageKind.GRADIENT))
        assert self._t is not None  # a backward pass follows a training send_forward, which kept t
        out, self._t = tanh_backward(self._t, grad_t), None
        return out


class InteractiveActiveEnd(ActiveEnd):
    """A's end of the plaintext interactive layer: holds W_P (d×h) and its momentum, in float64 (with
    mixing: W̃ and both mixings)."""

    def __init__(self, own: EndWiring, passive: str, mixing: bool = False) -> None:
        super().__init__(own, passive)
        self.seed, self.hparams, self.head_shape = own.seed, own.hparams, own.head_shape
        self.mixing = mixing
        self.mix: tuple[np.ndarray, np.ndarray] | None = None  # (X_m, Z_m) once drawn
        self._passes: np.ndarray | None = None
        self.W: np.ndarray | None = None
        self.b: np.ndarray | None = None
        self._t: np.ndarray | None = None

    def finish_forward(self, training: bool) -> torch.Tensor:
        t = to_host(self.endpoint.recv_tensor(self.passive, MessageKind.ACTIVATION, device="cpu", bound=1.0))
        if self.W is None:  # W_P(0) = X·Y, both factors from the run seed's streams (see interactive.py)
            assert self.head_shape is not None  # the active party wires head_shape into its ends
            h, fan_in = self.head_shape()
            x, y = init_factors(Drbg.derived(self.seed, f"{self.passive}/X"),
                                Drbg.derived(self.seed, f"{self.passive}/Y"), t.shape[1], h, fan_in)
            self.W, self.b = x @ y, np.zeros((t.shape[1], h))
            if self.mixing:  # both parties' secret mixings, from the streams HE's seeded_shares uses too
                self.mix = (draw_mix_p(Drbg.derived(self.seed, f"{self.passive}/Xmix"), t.shape[1]),
                            draw_mix_a(Drbg.derived(self.seed, f"{self.passive}/Zmix"), h))
        if self.mix is not None:  # with HE off the active end plays both parties' part of the mixing
            t, self._passes = mix_t(t, self.mix[0])
        self._t = t
        out = t @ self.W
        return to_party(out if self.mix is None else out @ self.mix[1], self.endpoint.device)

    def send_backward(self, grad: torch.Tensor, ctx: HookContext) -> None:
        # a backward pass follows finish_forward, which set W, b and t; the owning party wires hparams
        assert self.W is not None and self.b is not None and self._t is not None and self.hparams is not None
        g = clip_grad(to_host(apply_hooks(self.hooks, grad, ctx)))
        lr, mu, wd = self.hparams()
        if self.mix is not None:
            assert self._passes is not None  # finish_forward mixed this step's t
            g, lr = mix_g(g, self.mix[1]), lr * MIX_LR_GAIN
            grad_t = unmix_grad(g @ self.W.T, self._passes, self.mix[0])
        else:
            grad_t = g @ self.W.T
        self.endpoint.send_tensor(self.passive, MessageKind.GRADIENT, torch.from_numpy(grad_t).float())
        self.b = velocity(self.b, self._t.T @ g, self.W, mu, wd)
        self.W = self.W - lr * self.b
        self._t = None

    def state_dict(self) -> dict:
        return {"W": None if self.W is None else self.W.copy(), "b": None if self.b is None else self.b.copy(),
                **({"mix": self.mix} if self.mix is not None else {})}

    def load_state_dict(self, state: dict) -> None:
        self.W, self.b = state["W"], state["b"]
        self.mix = state.get("mix", self.mix)

    def reset_optimizer_state(self) -> None:
        if self.b is not None:
            self.b = np.zeros_like(self.b)


class PlainCutLayer(CutLayer):
    """No encryption. Interactive (default): t = tanh(z) crosses as float32 bytes and A applies W_P;
    otherwise z crosses and the head concatenates. ∂L/∂(what crossed) comes back the same way."""

    name = "off"

    def passive_end(self, own: EndWiring, active: str) -> PassiveEnd:
        return (InteractivePassiveEnd if self.interactive else PlainPassiveEnd)(own, active)

    def active_end(self, own: EndWiring, passive: str) -> ActiveEnd:
        return InteractiveActiveEnd(own, passive, self.mixing) if self.interactive else PlainActiveEnd(own, passive)


CUT_LAYERS: Registry[type[CutLayer]] = Registry("cut layer", unknown="--he {name} is not available; available: {names}")
"""Every cut-layer scheme by ``--he`` name. The HE layers (securevfl/crypto) subclass this module's
classes, so they are named here by module path and imported on first use, without an import cycle."""
CUT_LAYERS.register(PlainCutLayer)
CUT_LAYERS.register_lazy("ckks", "securevfl.crypto:CKKSCutLayer")
CUT_LAYERS.register_lazy("paillier", "securevfl.crypto:PaillierCutLayer")
CUT_LAYERS.register_lazy("bfv", "securevfl.crypto:BFVCutLayer")


from securevfl.configuration.validate import TEST_FIXTURE_PARAMS, refuse_test_fixtures  # noqa: E402,F401  (light: checked with the flags)


def make_cut_layer(name: str, *, interactive: bool = True, mixing: str = "off", **params: object) -> CutLayer:
    """The cut layer ``--he name --he-param key=value ...`` asks for.

    Args:
        name: ``off``, ``ckks``, ``bfv`` or ``paillier``.
        interactive: split the head's first linear layer into the interactive layer (the method's
            ``interactive_layer``; the HE schemes need it).
        mixing: the interactive layer's secret mixing, ``auto`` (on under HE), ``off`` or ``on``
            (``--interactive-mixing``).
        params: the scheme's parameters (validated by the scheme).
    Returns:
        A fresh cut layer (its ends are made per passive party by the federation).
    """
    if name == "off" and params:
        raise UserError(f"--he-param {sorted(params)[0]} needs --he ckks, bfv or paillier")
    return CUT_LAYERS.get(name)(interactive=interactive, mixing=mixing_for(mixing, name), **params)
