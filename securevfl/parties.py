"""Active and passive parties. A party owns its data, models, optimizer, hooks and its ends of the
cut layer; it talks to other parties only through its channel endpoint.

Everything a party can hold is declared in its constructor below; a method keeps its own per-party
state (FedHSSL's encoders and optimizers, Entity Augmentation's sampler) in the one slot
:attr:`Party.method_state` rather than in attributes of its own."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from typing import Protocol

import numpy as np
import torch
from torch import nn

from securevfl.channel import Endpoint, MessageKind
from securevfl.channel.codec import decode_batch_request, encode_batch_request
from securevfl.cutlayer import ActiveEnd, EndWiring, PassiveEnd
from securevfl.data.partition import PartyData
from securevfl.hooks import HookContext, LabelRandomizer, PassivePrivatizer, StepPrivatizer, TensorHook, find_hook
from securevfl.interactive import first_linear, interactive_hparams
from securevfl.models import set_mode
from securevfl.per_example import PerExampleTracer
from securevfl.roles import ACTIVE


class LocalStep(Protocol):
    """A party's own update rule, when it replaces the optimizer step (see :attr:`Party.local_step`)."""

    def __call__(self, params: list[nn.Parameter]) -> None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class Party:
    def __init__(self, data: PartyData, endpoint: Endpoint, hooks: list[TensorHook]) -> None:
        self.name = data.name
        self.data = data
        self.endpoint = endpoint
        self.hooks = hooks
        self.bottom: nn.Module | None = None
        # method-specific modules this party owns besides its bottom model (e.g. FedUD's Rep)
        self.extra_modules: dict[str, nn.Module] = {}
        self.optimizer: torch.optim.Optimizer | None = None
        self.step = 0
        # this party's own update rule, when it replaces the optimizer step: called with its
        # parameters (gradients set) after backward (a malicious party's optimizer, e.g. the active
        # MC attack's, which must not pass through the federation's optimizer choice); it has
        # state_dict() / load_state_dict() so snapshots (learning-rate search) cover it
        self.local_step: LocalStep | None = None
        self.aligned_ids: np.ndarray | None = None  # learnt from alignment (PSI or given)
        self.aligned_test_ids: np.ndarray | None = None  # test entities every party holds
        # what a method keeps inside this party between its stages (FedHSSL's HybridState, Entity
        # Augmentation's GuestState): created and read only by the method's code acting as this party
        self.method_state: object | None = None

    def features(self, ids: np.ndarray, split: str) -> torch.Tensor:
        return torch.from_numpy(self.data.rows(ids, split))

    def parameters(self) -> list[nn.Parameter]:
        """Trainable parameters (frozen ones, ``requires_grad=False``, stay out of the optimizer)."""
        mods = ([self.bottom] if self.bottom is not None else []) + list(self.extra_modules.values())
        return [q for m in mods for q in m.parameters() if q.requires_grad]

    def modules_to_snapshot(self) -> dict[str, nn.Module]:
        return {"bottom": self.bottom, **self.extra_modules}

    def n_parameters(self) -> int:
        """Trainable parameter count (sizes this party's per-step work for the thread policy)."""
        return sum(q.numel() for q in self.parameters())

    def cut_end_list(self) -> list:
        """This party's cut-layer ends (their protocol state, e.g. HE weight shares, is party state)."""
        return []

    def end_wiring(self, seed: int, interactive_lr: float | None) -> EndWiring:
        """What this party's cut-layer ends are built with: its endpoint and hooks, the run seed, and
        the interactive layer's settings read from its optimizer at each step."""
        return EndWiring(self.endpoint, self.hooks, seed, interactive_hparams(self, interactive_lr))

    def snapshot(self) -> dict:
        """Copy of this party's trainable state (models and optimizer), e.g. for a learning-rate search."""
        state = {k: copy.deepcopy(m.state_dict()) for k, m in self.modules_to_snapshot().items()}
        state["_optimizer"] = copy.deepcopy(self.optimizer.state_dict())
        state["_cut"] = [copy.deepcopy(e.state_dict()) for e in self.cut_end_list()]
        if self.local_step is not None:  # the party's own update rule has state too (momentum, history)
            state["_local_step"] = copy.deepcopy(self.local_step.state_dict())
        return state

    def restore(self, state: dict) -> None:
        for k, m in self.modules_to_snapshot().items():
            m.load_state_dict(state[k])
        self.optimizer.load_state_dict(state["_optimizer"])
        for end, s in zip(self.cut_end_list(), state.get("_cut", []), strict=False):
            end.load_state_dict(s)
        if self.local_step is not None and "_local_step" in state:
            self.local_step.load_state_dict(copy.deepcopy(state["_local_step"]))

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr


class PassiveParty(Party):
    """Features only. Receives batch IDs, sends its bottom output, applies the returned gradient."""

    def __init__(self, data: PartyData, endpoint: Endpoint, hooks: list[TensorHook]) -> None:
        super().__init__(data, endpoint, hooks)
        self.cut_end: PassiveEnd | None = None
        # this training step's bottom output and its rows: what the returned gradient applies to
        self._z: torch.Tensor | None = None
        self._ids: np.ndarray | None = None
        self.privatizer: PassivePrivatizer | None = find_hook(hooks, PassivePrivatizer)
        self._tracer = PerExampleTracer()

    def cut_end_list(self) -> list:
        return [] if self.cut_end is None else [self.cut_end]

    def forward(self) -> None:
        """Receive the batch request from the active party, compute r = h(x), send it."""
        split, training = decode_batch_request(self.endpoint.recv(ACTIVE, MessageKind.CONTROL))
        self.send_output(self.endpoint.recv_ids(ACTIVE, MessageKind.BATCH_IDS), split, training)

    def send_output(self, ids: np.ndarray, split: str, training: bool) -> None:
        """Compute r = h(x) on the rows ``ids`` and send it through the cut layer; in training, keep it
        for :meth:`backward`. (The rows are the active party's request, or — Entity Augmentation —
        this party's own choice.)"""
        set_mode(self.bottom, training)
        if training and self.privatizer is not None:
            self._tracer.arm([self.bottom])
        with torch.set_grad_enabled(training):
            z = self.bottom(self.features(ids, split))
        self._z, self._ids = (z, ids) if training else (None, None)
        ctx = HookContext(MessageKind.ACTIVATION, self.name, ACTIVE, self.step, training, ids)
        self.cut_end.send_forward(z, ctx)

    def backward(self, grad: torch.Tensor) -> None:
        """Apply ∂L/∂z (as received through the cut layer) and step the local optimizer."""
        self.optimizer.zero_grad(set_to_none=True)
        if self.privatizer is None:
            self._z.backward(grad)
        else:  # DP-SGD over this party's features: only the privatizer's noised sum is applied
            params = self.parameters()
            per, _ = self._tracer.per_example((self._z * grad).sum(1), params, [])
            self._tracer.disarm()
            for q, g in zip(params, self.privatizer.update(per, len(self._ids), self._ids), strict=True):
                q.grad = g
        if self.local_step is not None:
            self.local_step(self.parameters())
        else:
            self.optimizer.step()
        self._z = self._ids = None
        self.step += 1


Combine = Callable[[nn.Module, torch.Tensor, list[torch.Tensor]], torch.Tensor]


def concat_combine(head: nn.Module, own: torch.Tensor, received: list[torch.Tensor]) -> torch.Tensor:
    """The head on the concatenation [own, received...] (no interactive layer)."""
    return head(torch.cat([own, *received], dim=1))


class ActiveParty(Party):
    """Labels, its own bottom model and the head. Drives the batches of supervised VFL."""

    def __init__(self, data: PartyData, endpoint: Endpoint, hooks: list[TensorHook],
                 passive_names: list[str], combine: Combine = concat_combine) -> None:
        super().__init__(data, endpoint, hooks)
        self.passive_names = passive_names
        self.head: nn.Module | None = None
        self.cut_ends: dict[str, ActiveEnd] = {}
        # how the head consumes its own output and the cut-layer deliveries (the cut layer's: the
        # interactive layer splits the head's first linear layer; plain concatenation otherwise)
        self.combine = combine
        # the per-passive inputs the cut layer delivered this step, in ``passive_names`` order (leaves
        # that collect ∂L/∂r in training; FedUD's distillation reads them)
        self.received: list[torch.Tensor] = []
        self.own_output: torch.Tensor | None = None
        self.passive_widths: list[int] = []  # width of each passive party's input to the head
        # label defenses: a step privatizer (DP-SGD) replaces how gradients are computed; a label
        # randomizer replaces the training labels once, here, so nothing downstream sees the originals
        self.privatizer: StepPrivatizer | None = find_hook(hooks, StepPrivatizer)
        self._tracer = PerExampleTracer()

    def randomize_labels(self, n_classes: int) -> None:
        """Apply a label randomizer among this party's hooks to its training labels (once, at build)."""
        randomizer: LabelRandomizer | None = find_hook(self.hooks, LabelRandomizer)
        if randomizer is not None and self.data.y_labels is not None:
            try:
                own = self.data.rows(self.data.label_ids, "train")
            except KeyError:  # labels on rows this party holds no features for (active_labels_all)
                own = None
            y = randomizer.randomize(self.data.y_labels, n_classes, own)
            self.data = dataclasses.replace(self.data, y_labels=y)

    def parameters(self) -> list[nn.Parameter]:
        return super().parameters() + [q for q in self.head.parameters() if q.requires_grad]

    def cut_end_list(self) -> list:
        return list(self.cut_ends.values())

    def modules_to_snapshot(self) -> dict[str, nn.Module]:
        return {**super().modules_to_snapshot(), "head": self.head}

    def end_wiring(self, seed: int, interactive_lr: float | None) -> EndWiring:
        """As :meth:`Party.end_wiring`, plus the head's first-layer shape (read at first use: methods
        may rebuild the head after the ends exist)."""
        return dataclasses.replace(super().end_wiring(seed, interactive_lr), head_shape=self.head_shape)

    def head_shape(self) -> tuple[int, int]:
        """(out, in) features of the head's first linear layer (the interactive layer's W_P is d × out)."""
        first = first_linear(self.head)
        return first.out_features, first.in_features

    def request(self, ids: np.ndarray, split: str, training: bool) -> None:
        """Ask every passive party for its bottom output on ``ids`` (one control byte: split, mode)."""
        for p in self.passive_names:
            self.endpoint.send(p, MessageKind.CONTROL, encode_batch_request(split, training))
            self.endpoint.send_ids(p, MessageKind.BATCH_IDS, ids)

    def receive(self, reps: list[torch.Tensor], training: bool) -> None:
        """Take the per-passive inputs the cut layer delivered (leaves that collect ∂L/∂r)."""
        self.received = [r.requires_grad_(training) for r in reps]

    def _arm(self, training: bool) -> None:
        if training and self.privatizer is not None:  # per-example gradients need this step's layer calls
            self._tracer.arm([*self.modules_to_snapshot().values()])

    def logits(self, ids: np.ndarray, split: str, training: bool) -> torch.Tensor:
        self._arm(training)
        set_mode(self.bottom, training)
        set_mode(self.head, training)
        with torch.set_grad_enabled(training):
            own = self.bottom(self.features(ids, split))
            self.own_output = own  # r^1 of this step, for methods' extra loss terms (FedUD's Rep)
            return self.combine(self.head, own, self.received)

    def logits_alone(self, ids: np.ndarray, split: str, training: bool, passive_stand_in=None) -> torch.Tensor:
        """Logits for rows only this party holds: each passive party's input is ``passive_stand_in(r^1)`` (a
        list, one tensor per passive party; FedUD's Rep) or zeros — the absent party contributes
        nothing, which is how a plain VFL model must predict such rows."""
        self._arm(training)
        set_mode(self.bottom, training)
        set_mode(self.head, training)
        with torch.set_grad_enabled(training):
            own = self.bottom(self.features(ids, split))
            if passive_stand_in is not None:
                reps = passive_stand_in(own)
            else:
                reps = [own.new_zeros(len(ids), w) for w in self.passive_widths]
            # the plain head on a zero passive input equals the HE layer's split first layer with no
            # passive term (the passive columns multiply zeros), so this holds under --he too
            return self.head(torch.cat([own, *reps], dim=1))

    def backward(self, loss: torch.Tensor, ids: np.ndarray | Mapping[str, np.ndarray]) -> None:
        """Backprop the loss locally, step, and send ∂L/∂r^k back through each cut-layer end.

        Args:
            loss: this step's objective on the head's output.
            ids: the batch's entity IDs, one batch for every passive party; or each passive party's
                own batch IDs by name (Entity Augmentation: every guest chose its rows). A passive
                party missing from the mapping gets no gradient: its input this step was not its own
                message (the host's queue), so it has nothing to apply one to.
        """
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self._send_gradients([r.grad for r in self.received], ids)

    def backward_private(self, example_losses: torch.Tensor, example_ids: np.ndarray, free: torch.Tensor | None,
                         ids: np.ndarray, batch_size: int) -> None:
        """The step under a :class:`StepPrivatizer` (DP-SGD): per-example gradients of every labeled
        loss (rows of ``example_losses``: the batch ``ids`` first, then any other labeled rows of the
        step) with respect to this party's parameters and to the rows it received go to the
        privatizer; the parameters are updated, and the passive parties answered, with its release
        only. ``free`` is the label-free part of the objective (added unnoised)."""
        params = self.parameters()
        n, b = len(example_losses), len(ids)
        per, leaf_grads = self._tracer.per_example(example_losses, params, self.received)
        self._tracer.disarm()
        # pad each received row block to n: examples beyond the batch (e.g. FedUD's unaligned rows) have none
        rows = [torch.cat([g, g.new_zeros((n - b, *g.shape[1:]))]) if n > b else g for g in leaf_grads]
        summed, released = self.privatizer.release(per, rows, batch_size, example_ids)
        free_grads = (torch.autograd.grad(free, params, allow_unused=True) if free is not None and free.requires_grad
                      else [None] * len(params))
        self.optimizer.zero_grad(set_to_none=True)
        for q, s, f in zip(params, summed, free_grads, strict=True):
            q.grad = s if f is None else s + f
        self.optimizer.step()
        self._send_gradients([r[:b] for r in released], ids)

    def _send_gradients(self, grads: list[torch.Tensor], ids: np.ndarray | Mapping[str, np.ndarray]) -> None:
        per_passive = ids if isinstance(ids, Mapping) else dict.fromkeys(self.passive_names, ids)
        for name, g in zip(self.passive_names, grads, strict=True):
            if name in per_passive:
                ctx = HookContext(MessageKind.GRADIENT, self.name, name, self.step, True, per_passive[name])
                self.cut_ends[name].send_backward(g, ctx)
        self.received = []
        self.step += 1
