"""Cut-layer protocols: how a passive party's bottom output reaches the active party and how the
gradient comes back.

Each protocol has a *passive end* (owned by the passive party) and an *active end* (owned by the
active party); they talk only through the channel. The protocol object itself is a script that
calls the two ends in order: it never sees a tensor except the one it hands back to its owner
(``complete_forward`` returns the active party's input to the head; ``complete_backward`` returns
the passive party's gradient for its bottom output). Multi-round protocols such as the HE layer of
SPEC §5 override these two scripts. Hooks (defenses) run at the sending end.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar

import torch

from securevfl.channel import Endpoint, MessageKind
from securevfl.errors import UserError
from securevfl.hooks import HookContext, TensorHook, apply_hooks


class PassiveEnd(ABC):
    def __init__(self, endpoint: Endpoint, active: str, hooks: list[TensorHook]) -> None:
        self.endpoint, self.active, self.hooks = endpoint, active, hooks

    @abstractmethod
    def send_forward(self, z: torch.Tensor, ctx: HookContext) -> None:
        """First forward message: the passive party's bottom output (possibly protected)."""

    @abstractmethod
    def finish_backward(self) -> torch.Tensor:
        """Last backward step: ∂L/∂z as the passive party receives it."""

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
    name: ClassVar[str]

    def __init__(self, **params: object) -> None:
        self.params = params

    @abstractmethod
    def make_ends(self, passive: Endpoint, active: Endpoint, hooks_passive: list[TensorHook],
                  hooks_active: list[TensorHook], cut_dim: int) -> tuple[PassiveEnd, ActiveEnd]: ...

    def out_dim(self, cut_dim: int) -> int:
        """Width of what the active party receives per passive party."""
        return cut_dim

    def bind(self, active, passives: list, cut_dim: int) -> None:  # noqa: B027 - plaintext needs nothing
        """Called once the parties, head and ends exist (the HE layer reads the head's shape here)."""

    def combine(self, head: torch.nn.Module, own: torch.Tensor, received: list[torch.Tensor]) -> torch.Tensor:
        """The active party's head on its own output and what each cut-layer end delivered."""
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


class PlainCutLayer(CutLayer):
    """No encryption: r^k crosses as float32 bytes, ∂L/∂r^k comes back the same way."""

    name = "off"

    def make_ends(self, passive, active, hooks_passive, hooks_active, cut_dim):
        return (PlainPassiveEnd(passive, active.party, hooks_passive),
                PlainActiveEnd(active, passive.party, hooks_active))


_CUT_LAYERS: dict[str, Callable[..., CutLayer]] = {"off": PlainCutLayer}


def register_cut_layer(name: str, factory: Callable[..., CutLayer]) -> None:
    _CUT_LAYERS[name] = factory


def cut_layer_names() -> list[str]:
    import securevfl.crypto  # noqa: F401 - registers the HE schemes

    return sorted(_CUT_LAYERS)


def make_cut_layer(name: str, **params: object) -> CutLayer:
    import securevfl.crypto  # noqa: F401 - registers the HE schemes

    if name == "off" and params:
        raise UserError(f"--he-param {sorted(params)[0]} needs --he ckks or --he paillier")
    if name not in _CUT_LAYERS:
        raise UserError(f"--he {name} is not available; available: {', '.join(cut_layer_names())}")
    return _CUT_LAYERS[name](**params)
