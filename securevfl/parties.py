"""Active and passive parties. A party owns its data, models, optimizer, hooks and its ends of the
cut layer; it talks to other parties only through its channel endpoint.

A party is built whole: its constructor takes everything it holds (data, bottom model, head,
optimizer factory, hooks, the cut layer to make its ends with) and installs its hooks at their hook
points (:mod:`securevfl.hooks`): label transforms run on its labels, model wraps on its models, its
step rule is the one defense that provides it or the plain one. After construction its attributes
are set only by its own methods (:meth:`Party.__setattr__`): with parties in separate processes
nothing else could. A method changes what a party holds between stages through the party's own
methods (:meth:`Party.install`, :meth:`Party.reset_optimizer`, ...), and keeps its own per-party
state (FedHSSL's encoders and optimizers, Entity Augmentation's sampler) in the one slot
:attr:`Party.method_state`.

Over 600 lines (656) in one file because the active and passive parties share :class:`Party`'s state,
checkpoint and save logic; the cut-layer ends are in cutlayer.py.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar, Protocol, cast

import numpy as np
import torch
from torch import nn

from securevfl.channel import Endpoint, MessageKind
from securevfl.channel.codec import decode_batch_request, encode_batch_request
from securevfl.cutlayer import ActiveEnd, CutLayer, EndWiring, PassiveEnd
from securevfl.data.partition import PartyData
from securevfl.errors import UserError
from securevfl.hooks import (
    ActiveStep,
    ExtraLoss,
    HookContext,
    LabelTransform,
    MessageTransform,
    ModelWrap,
    Objective,
    PartyHook,
    PassiveStep,
    PlainActiveStep,
    PlainPassiveStep,
    StepView,
    find_hook,
    hooks_of,
)
from securevfl.ids import member
from securevfl.interactive import first_linear, interactive_hparams
from securevfl.models import set_mode
from securevfl.policy import ServedRows
from securevfl.roles import ACTIVE, PASSIVE, party_index, seed_for
from securevfl.storage.saved import read_party_folder, restored, write_party_folder

OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]
"""Builds a party's optimizer over its trainable parameters (the federation's optimizer choice)."""


class LocalStep(Protocol):
    """A party's own update rule, when it replaces the optimizer step (see :attr:`Party.local_step`)."""

    def __call__(self, params: list[nn.Parameter]) -> None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class Tamper(Protocol):
    """A malicious passive party's own deviations from the protocol (a backdoor or robustness attack
    acting as that party, :meth:`PassiveParty.use_tamper`): what it feeds its bottom model, what it
    sends, and what it applies of the gradient it received. Each sees only the party's own tensors."""

    def features(self, x: torch.Tensor, ids: np.ndarray, split: str, training: bool) -> torch.Tensor: ...

    def output(self, z: torch.Tensor, ids: np.ndarray, split: str, training: bool) -> torch.Tensor: ...

    def gradient(self, grad: torch.Tensor, ids: np.ndarray) -> torch.Tensor: ...


class Party:
    role: ClassVar[str]
    """The role whose hooks this party installs (``runs_at``)."""

    def __init__(self, data: PartyData, endpoint: Endpoint, hooks: list[PartyHook], bottom: nn.Module,
                 optimizer: OptimizerFactory, seed: int = 0, interactive_lr: float | None = None,
                 device: torch.device | None = None, own_seed: int | None = None) -> None:
        self.name = data.name
        # the base of every draw this party makes alone (securevfl.federation.PartySeeds): its own,
        # never the run seed another party chose
        self.own_seed = seed_for(seed, party_index(data.name)) if own_seed is None else own_seed
        self.data = data
        # where this party's models, batches and per-example gradients live (--device, resolved once by
        # the run); what it receives through its own endpoint arrives there too
        self.device = torch.device("cpu") if device is None else device
        endpoint.device = self.device
        self.endpoint = endpoint
        # this party's own copy of every hook that runs at its role, in the order written
        self.hooks: list[PartyHook] = [h.for_party(self.name) for h in hooks if self.role in h.runs_at]
        self._wraps: list[ModelWrap] = hooks_of(self.hooks, ModelWrap)
        self._losses: list[ExtraLoss] = hooks_of(self.hooks, ExtraLoss)
        self.bottom: nn.Module = self._wrap_bottom(bottom)
        # method-specific modules this party owns besides its bottom model (e.g. FedUD's Rep)
        self._modules: dict[str, nn.Module] = {}
        self._make_optimizer = optimizer
        self.optimizer: torch.optim.Optimizer | None = None  # built by the subclass once its models exist
        self._seed, self._interactive_lr = seed, interactive_lr
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
        # the rows this party answers requests for (a deployed passive party's own check,
        # securevfl/policy.py; None: every row it holds, as in the simulator)
        self.serves: ServedRows | None = None

    def __setattr__(self, name: str, value: object) -> None:
        # once built, only the party's own methods set its attributes (the caller's ``self`` is it)
        if self.__dict__.get("_built") and sys._getframe(1).f_locals.get("self") is not self:
            raise AttributeError(f"{type(self).__name__}.{name} is set only by the party's own methods "
                                 "(build it whole, or call one of its methods)")
        object.__setattr__(self, name, value)

    def _finish(self) -> None:
        """End of construction: the optimizer over the final models, then the attributes freeze."""
        self.optimizer = self._make_optimizer(self.parameters())
        self._built = True

    def _wrap_bottom(self, bottom: nn.Module) -> nn.Module:
        for w in self._wraps:
            bottom = w.wrap_bottom(bottom)
        return self._placed(bottom)

    def _placed(self, module: nn.Module) -> nn.Module:
        """``module`` moved (in place) to this party's device: every model it trains lives there. Built on
        the CPU first, so a seed gives the same initial weights on every device."""
        return module.to(self.device)

    @property
    def extra_modules(self) -> Mapping[str, nn.Module]:
        """Method-specific modules this party owns besides its models (read-only; :meth:`install` adds)."""
        return MappingProxyType(self._modules)

    # ---- stage changes, by the party itself
    def install(self, bottom: nn.Module | None = None, modules: Mapping[str, nn.Module] | None = None) -> None:
        """A method's next stage: this party now trains ``bottom`` (through its model wraps) and owns
        ``modules`` besides it; its optimizer starts fresh over them (:meth:`reset_optimizer`)."""
        if bottom is not None:
            self.bottom = self._wrap_bottom(bottom)
        self._modules.update({k: self._placed(m) for k, m in (modules or {}).items()})
        self.reset_optimizer()

    def reset_optimizer(self) -> None:
        """A fresh optimizer over this party's current models (after a method pre-trained, replaced or
        re-initialised them), and no stale optimizer state in its cut-layer ends."""
        self.optimizer = self._make_optimizer(self.parameters())
        for end in self.cut_end_list():
            end.reset_optimizer_state()

    def use_data(self, data: PartyData) -> None:
        """This party's view of its own rows from now on (RISA's imputing view; the same rows, same party)."""
        if data.name != self.name:
            raise ValueError(f"party {self.name} cannot take {data.name}'s data")
        self.data = data

    def use_device(self, device: torch.device) -> None:
        """This party's models, optimizer state and incoming tensors move to ``device`` (the run moves every
        party back to the CPU after training: the adversary's attacks, the audit and --save work there)."""
        for m in self.modules_to_snapshot().values():
            m.to(device)
        optimizer = self._built_optimizer()
        optimizer.load_state_dict(optimizer.state_dict())  # torch's own cast of the state to the parameters' device
        self.device = device
        self.endpoint.device = device

    def use_local_step(self, rule: LocalStep | None) -> None:
        """This party's own update rule replaces its optimizer step (a malicious party's optimizer)."""
        self.local_step = rule

    def learn_alignment(self, train_ids: np.ndarray | None = None, test_ids: np.ndarray | None = None) -> None:
        """The aligned IDs this party learnt (from PSI or the active party's announcement)."""
        if train_ids is not None:
            self.aligned_ids = train_ids
        if test_ids is not None:
            self.aligned_test_ids = test_ids

    def serve_only(self, rows: ServedRows | None) -> None:
        """From now on, answer requests only for ``rows`` (:class:`securevfl.policy.ServedRows`)."""
        self.serves = rows

    def requested_ids(self, split: str = "train") -> np.ndarray:
        """The batch IDs the active party sends next, checked against the rows this party serves (an
        imputing view answers rows outside them with its imputed row, as for rows it does not hold)."""
        ids = self.endpoint.recv_ids(ACTIVE, MessageKind.BATCH_IDS)
        if self.serves is not None:
            self.serves.check(ids, split, outside_ok=getattr(self.data, "imputed_row", None) is not None)
        return ids

    def keep_method_state(self, state: object) -> None:
        """What a method keeps inside this party between its stages (:attr:`method_state`)."""
        self.method_state = state

    # ---- what the party holds
    def features(self, ids: np.ndarray, split: str) -> torch.Tensor:
        """This party's feature rows for ``ids``, on its device."""
        x = torch.from_numpy(self.data.rows(ids, split))
        return x if self.device.type == "cpu" else x.to(self.device)

    def parameters(self) -> list[nn.Parameter]:
        """Trainable parameters (frozen ones, ``requires_grad=False``, stay out of the optimizer)."""
        mods = [self.bottom, *self._modules.values()]
        return [q for m in mods for q in m.parameters() if q.requires_grad]

    def modules_to_snapshot(self) -> dict[str, nn.Module]:
        return {"bottom": self.bottom, **self._modules}

    def n_parameters(self) -> int:
        """Trainable parameter count (sizes this party's per-step work for the thread policy)."""
        return sum(q.numel() for q in self.parameters())

    def cut_end_list(self) -> list:
        """This party's cut-layer ends (their protocol state, e.g. HE weight shares, is party state)."""
        return []

    def end_wiring(self) -> EndWiring:
        """What this party's cut-layer ends are built with: its endpoint and hooks, the run seed, and
        the interactive layer's settings read from its optimizer at each step."""
        return EndWiring(self.endpoint, self.hooks, self._seed, interactive_hparams(self, self._interactive_lr))

    def privacy_reports(self, accounted_only: bool = False) -> list[dict]:
        """The privacy report of every hook this party installed that gives one (``accounted_only``:
        of those that declare they carry an ε, ``PartyHook.carries_epsilon``)."""
        return [r for h in self.hooks if (h.carries_epsilon or not accounted_only) and (r := h.privacy()) is not None]

    def _built_optimizer(self) -> torch.optim.Optimizer:
        """The optimizer over this party's models."""
        assert self.optimizer is not None  # _finish builds it at the end of construction
        return self.optimizer

    def snapshot(self) -> dict:
        """Copy of this party's trainable state (models and optimizer), e.g. for a learning-rate search."""
        state: dict[str, Any] = {k: copy.deepcopy(m.state_dict()) for k, m in self.modules_to_snapshot().items()}
        state["_optimizer"] = copy.deepcopy(self._built_optimizer().state_dict())
        state["_cut"] = [copy.deepcopy(e.state_dict()) for e in self.cut_end_list()]
        if self.local_step is not None:  # the party's own update rule has state too (momentum, history)
            state["_local_step"] = copy.deepcopy(self.local_step.state_dict())
        return state

    def restore(self, state: dict) -> None:
        for k, m in self.modules_to_snapshot().items():
            m.load_state_dict(state[k])
        self._built_optimizer().load_state_dict(state["_optimizer"])
        for end, s in zip(self.cut_end_list(), state.get("_cut", []), strict=False):
            end.load_state_dict(s)
        if self.local_step is not None and "_local_step" in state:
            self.local_step.load_state_dict(copy.deepcopy(state["_local_step"]))

    def checkpoint_state(self) -> dict:
        """Everything of this party a resumed run needs: :meth:`snapshot`, its step count, its
        hooks' state (e.g. a DP accountant's ledger, a mechanism's generator) and a method's state
        inside it where that state says how (``state_dict``: e.g. an entity-aug guest's sampler)."""
        out = {"snapshot": self.snapshot(), "step": self.step, "hooks": [h.state_dict() for h in self.hooks]}
        if hasattr(self.method_state, "state_dict"):
            out["method_state"] = self.method_state.state_dict()  # type: ignore[union-attr]
        return out

    def load_checkpoint_state(self, state: dict) -> None:
        self.restore(state["snapshot"])
        self.step = int(state["step"])
        for h, s in zip(self.hooks, state["hooks"], strict=True):
            h.load_state_dict(s)
        if "method_state" in state:  # the method set its state up again before the resume (same program)
            self.method_state.load_state_dict(state["method_state"])  # type: ignore[union-attr]

    # ---- a saved model: each party writes and reads only its own folder (securevfl/storage/saved.py)
    def save_own(self, folder: Path, run: dict) -> Path:
        """Write this party's own part into ``folder``: its models and cut-layer ends' state (e.g. its
        HE weight share; never a key), its preprocessing and a manifest (``run``: the public run facts
        the caller hands every party, plus what this party is and expects).

        Raises:
            UserError: the party's data came from no file (nothing to score new rows of)."""
        if self.data.preprocessing is None:
            raise UserError(f"--save: party {self.name} read no file, so new rows cannot be scored (--dataset csv)")
        state = {"modules": {k: m.state_dict() for k, m in self.modules_to_snapshot().items()},
                 "cut_ends": [e.state_dict() for e in self.cut_end_list()]}
        manifest = {**run, "party": self.name, "role": self.role,
                    "model": {"feature_shape": list(self.data.feature_shape), "n_numeric": self.data.n_numeric,
                              "cardinalities": list(self.data.cardinalities)}, **self._own_manifest()}
        return write_party_folder(folder, state, self.data.preprocessing, manifest)

    def _own_manifest(self) -> dict:
        """What only this role records about itself in its manifest."""
        return {}

    def load_own(self, folder: Path) -> None:
        """Load this party's models and cut-layer ends' state from its own saved folder.

        Raises:
            UserError: the folder is another party's, altered, or made for other models."""
        manifest, state, _ = read_party_folder(folder)
        if manifest["party"] != self.name:
            raise UserError(f"--model: {folder} holds party {manifest['party']}, not {self.name}")
        try:
            for k, m in self.modules_to_snapshot().items():
                m.load_state_dict(state["modules"][k])
            for end, s in zip(self.cut_end_list(), state["cut_ends"], strict=True):
                end.load_state_dict(restored(s, numpy=True))
        except (KeyError, RuntimeError, ValueError, TypeError, AttributeError) as e:
            raise UserError(f"--model: {folder}: the saved models do not fit this configuration "
                            f"({(str(e).splitlines() or [type(e).__name__])[0]})") from None

    def set_lr(self, lr: float) -> None:
        for group in self._built_optimizer().param_groups:
            group["lr"] = lr

    def _extra_loss(self, view: StepView) -> torch.Tensor | None:
        """The sum of this party's extra loss terms on this step (None without any)."""
        terms = [h.loss_term(view) for h in self._losses]
        return sum(terms[1:], terms[0]) if terms else None


class PassiveParty(Party):
    """Features only. Receives batch IDs, sends its bottom output, applies the returned gradient."""

    role = PASSIVE

    def __init__(self, data: PartyData, endpoint: Endpoint, hooks: list[PartyHook], bottom: nn.Module,
                 optimizer: OptimizerFactory, cut: CutLayer, seed: int = 0,
                 interactive_lr: float | None = None, device: torch.device | None = None,
                 own_seed: int | None = None) -> None:
        super().__init__(data, endpoint, hooks, bottom, optimizer, seed, interactive_lr, device, own_seed)
        self.cut_end: PassiveEnd = cut.passive_end(self.end_wiring(), ACTIVE)
        self._cut = cut  # this party runs its half of each exchange (run_step)
        # this training step's bottom output, its rows and inputs: what the returned gradient applies to
        self._z: torch.Tensor | None = None
        self._ids: np.ndarray | None = None
        self._x: torch.Tensor | None = None
        # find_hook returns a hook of the kind it is given
        self._rule: PassiveStep = cast("PassiveStep | None", find_hook(self.hooks, PassiveStep)) or PlainPassiveStep()
        self.tamper: Tamper | None = None  # set by the party itself when it turns malicious (use_tamper)
        self._finish()

    def use_tamper(self, tamper: Tamper | None) -> None:
        """This party deviates from the protocol as ``tamper`` says from now on (None: honest again)."""
        self.tamper = tamper

    def cut_end_list(self) -> list:
        return [self.cut_end]

    def forward(self) -> None:
        """Receive the batch request from the active party, compute r = h(x), send it."""
        split, training = decode_batch_request(self.endpoint.recv(ACTIVE, MessageKind.CONTROL))
        self.send_output(self.requested_ids(split), split, training)

    def send_output(self, ids: np.ndarray, split: str, training: bool) -> None:
        """Compute r = h(x) on the rows ``ids`` and send it through the cut layer; in training, keep it
        for :meth:`backward`. (The rows are the active party's request, or — Entity Augmentation —
        this party's own choice.)"""
        set_mode(self.bottom, training)
        if training:
            self._rule.arm([self.bottom])
        x = self.features(ids, split)
        # a malicious party's own deviations compute on the CPU (its attack code is CPU code); the
        # handoff is differentiable, so the bottom model's graph runs through it
        if self.tamper is not None:
            x = self.tamper.features(x.cpu(), ids, split, training).to(self.device)
        with torch.set_grad_enabled(training):
            z = self.bottom(x)
            if self.tamper is not None:
                z = self.tamper.output(z.cpu(), ids, split, training).to(self.device)
        self._z, self._ids, self._x = (z, ids, x) if training else (None, None, None)
        ctx = HookContext(MessageKind.ACTIVATION, self.name, ACTIVE, self.step, training, ids)
        self.cut_end.send_forward(z, ctx)

    def run_step(self, ids: np.ndarray, split: str, training: bool) -> None:
        """This party's half of one step on ``ids``: send r = h(x) through the cut layer and, in
        training, apply the gradient that comes back (the passive program's step, securevfl/runtime.py)."""
        self.send_output(ids, split, training)
        self._cut.passive_forward(self.cut_end)
        if training:
            self.backward(self._cut.passive_backward(self.cut_end))

    def abandon_step(self) -> None:
        """The active party abandoned this step (its loss diverged): nothing of it is applied."""
        self._z = self._ids = self._x = None

    def backward(self, grad: torch.Tensor) -> None:
        """Apply ∂L/∂z (as received through the cut layer), through this party's step rule, and step
        the local optimizer."""
        self._built_optimizer().zero_grad(set_to_none=True)
        # a backward pass follows a training send_output, which kept its output, rows and inputs
        assert self._z is not None and self._ids is not None and self._x is not None
        params = self.parameters()
        if self.tamper is not None:
            grad = self.tamper.gradient(grad.cpu(), self._ids).to(self.device)
        extra = self._extra_loss(StepView(self._ids, self._x, self._z)) if self._losses else None
        for q, g in zip(params, self._rule.gradients(self._z, grad, extra, params, self._ids), strict=True):
            q.grad = g
        if self.local_step is not None:
            self.local_step(self.parameters())
        else:
            self._built_optimizer().step()
        self._z = self._ids = self._x = None
        self.step += 1


Combine = Callable[[nn.Module, torch.Tensor, list[torch.Tensor]], torch.Tensor]


def concat_combine(head: nn.Module, own: torch.Tensor, received: list[torch.Tensor]) -> torch.Tensor:
    """The head on the concatenation [own, received...] (no interactive layer)."""
    return head(torch.cat([own, *received], dim=1))


class ActiveParty(Party):
    """Labels, its own bottom model and the head. Drives the batches of supervised VFL."""

    role = ACTIVE

    def __init__(self, data: PartyData, endpoint: Endpoint, hooks: list[PartyHook], bottom: nn.Module,
                 head: nn.Module, optimizer: OptimizerFactory, cut: CutLayer, passive_names: list[str],
                 passive_widths: list[int], n_classes: int, seed: int = 0,
                 interactive_lr: float | None = None, device: torch.device | None = None,
                 own_seed: int | None = None) -> None:
        super().__init__(data, endpoint, hooks, bottom, optimizer, seed, interactive_lr, device, own_seed)
        self.passive_names = passive_names
        self.passive_widths = passive_widths  # width of each passive party's input to the head
        for w in self._wraps:
            head = w.wrap_head(head)
        self.head: nn.Module = self._placed(head)
        # model wraps' layers on each passive party's delivery (MID's), owned and trained like Rep
        self._on_received: dict[str, list[nn.Module]] = {}
        for w in self._wraps:
            for p, width in zip(passive_names, passive_widths, strict=True):
                if (layer := w.wrap_received(p, cut.delivery_width(width, head))) is not None:
                    self._placed(layer)
                    self._on_received.setdefault(p, []).append(layer)
                    self._modules[f"{w.name}/{p}"] = layer
        # how the head consumes its own output and the cut-layer deliveries (the cut layer's: the
        # interactive layer splits the head's first linear layer; plain concatenation otherwise)
        self.combine: Combine = cut.combine
        self.cut_ends: dict[str, ActiveEnd] = {p: cut.active_end(self.end_wiring(), p) for p in passive_names}
        # the per-passive inputs the cut layer delivered this step, in ``passive_names`` order (leaves
        # that collect ∂L/∂r in training; FedUD's distillation reads them)
        self.received: list[torch.Tensor] = []
        self.own_output: torch.Tensor | None = None
        self._view: StepView | None = None  # this training step's tensors, for extra loss terms
        # label transforms replace the training labels once, here, so nothing downstream sees the
        # originals; the step rule decides how a batch's losses become an update and a release
        for t in hooks_of(self.hooks, LabelTransform):
            self._transform_labels(t, n_classes)
        # find_hook returns a hook of the kind it is given
        self._rule: ActiveStep = cast("ActiveStep | None", find_hook(self.hooks, ActiveStep)) or PlainActiveStep()
        self._finish()

    def _own_manifest(self) -> dict:
        # the label scaler (regression) and the parties this head reads, in order
        return {"label_scale": self.data.label_scale, "passives": list(self.passive_names),
                "passive_widths": list(self.passive_widths)}

    def _transform_labels(self, transform: LabelTransform, n_classes: int) -> None:
        if self.data.y_labels is None:
            return
        assert self.data.label_ids is not None  # labels come with the IDs of their rows (PartyData)
        try:
            own = self.data.rows(self.data.label_ids, "train")
        except KeyError:  # labels on rows this party holds no features for (active_labels_all)
            own = None
        y = transform.transform_labels(self.data.y_labels, n_classes, own)
        self.data = dataclasses.replace(self.data, y_labels=y)

    def install_head(self, head: nn.Module) -> None:
        """A method's next stage trains ``head`` (through this party's model wraps; e.g. RISA's
        evidential heads); the optimizer starts fresh."""
        for w in self._wraps:
            head = w.wrap_head(head)
        self.head = self._placed(head)
        self.reset_optimizer()

    def parameters(self) -> list[nn.Parameter]:
        return super().parameters() + [q for q in self.head.parameters() if q.requires_grad]

    def cut_end_list(self) -> list:
        return list(self.cut_ends.values())

    def modules_to_snapshot(self) -> dict[str, nn.Module]:
        return {**super().modules_to_snapshot(), "head": self.head}

    def end_wiring(self) -> EndWiring:
        """As :meth:`Party.end_wiring`, plus the head's first-layer shape (read at first use: methods
        may rebuild the head after the ends exist)."""
        return dataclasses.replace(super().end_wiring(), head_shape=self.head_shape)

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
        if training:  # a per-example step rule traces this step's layer calls from here
            self._rule.arm([*self.modules_to_snapshot().values()])

    def logits(self, ids: np.ndarray, split: str, training: bool) -> torch.Tensor:
        self._arm(training)
        set_mode(self.bottom, training)
        set_mode(self.head, training)
        x = self.features(ids, split)
        with torch.set_grad_enabled(training):
            own = self.bottom(x)
            self.own_output = own  # r^1 of this step, for methods' extra loss terms (FedUD's Rep)
            if training and self._losses:
                labels = self._view_labels(ids) if any(h.uses_labels for h in self._losses) else None
                self._view = StepView(np.asarray(ids), x, own, self.received, labels)
            return self.combine(self.head, own, self._delivered(self.received))

    def _view_labels(self, ids: np.ndarray) -> torch.Tensor | None:
        """The batch's training labels for a label-reading loss term (class indices), or None."""
        try:
            y = np.asarray(self.data.labels(np.asarray(ids)))
        except KeyError:  # rows without a label in this party's table (a method's own label source)
            return None
        return torch.from_numpy(y.argmax(1) if y.ndim == 2 else y.astype(np.int64)).to(self.device)

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
            return self.head(torch.cat([own, *self._delivered(reps)], dim=1))

    def logits_delivered(self, ids: np.ndarray, split: str, delivered: list[torch.Tensor]) -> torch.Tensor:
        """Logits (no training) for rows whose passive inputs are ``delivered``: one row per passive
        party, as its cut-layer end delivered it (plain or interactive), the same for every row."""
        set_mode(self.bottom, False)
        set_mode(self.head, False)
        own = self.bottom(self.features(ids, split))
        reps = [r.expand(len(ids), -1) for r in delivered]
        return self.combine(self.head, own, self._delivered(reps))

    def _delivered(self, reps: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each passive party's input to the head, through the model wraps' layers on it (if any)."""
        if not self._on_received:
            return reps
        out = []
        for name, r in zip(self.passive_names, reps, strict=True):
            for layer in self._on_received.get(name, []):
                r = layer(r)
            out.append(r)
        return out

    def backward(self, objective: Objective, ids: np.ndarray | Mapping[str, np.ndarray]) -> torch.Tensor:
        """Turn this step's objective into an update through the party's step rule (plain backprop, or
        a defense's, e.g. DP-SGD), step, and send the rule's ∂L/∂r^k back through each cut-layer end.

        Args:
            objective: this step's objective on the head's output (the trainer's).
            ids: the batch's entity IDs, one batch for every passive party; or each passive party's
                own batch IDs by name (Entity Augmentation: every guest chose its rows). A passive
                party missing from the mapping gets no gradient: its input this step was not its own
                message (the host's queue), so it has nothing to apply one to.
        Returns:
            The step's loss as the rule reports it.
        """
        if self._losses:  # this party's own label-free terms join the objective
            view = self._view

            def extra() -> torch.Tensor:
                # logits() kept this training step's view, and with loss terms their sum is a tensor
                assert view is not None
                loss = self._extra_loss(view)
                assert loss is not None
                return loss

            objective = objective.plus(extra)
        params = self.parameters()
        self._built_optimizer().zero_grad(set_to_none=True)
        out = self._rule.gradients(objective, params, self.received)
        for q, g in zip(params, out.params, strict=True):
            q.grad = g
        self._built_optimizer().step()
        self._view = None
        self._send_gradients(out.rows, ids)
        return out.loss

    # ---- the step rule's other decisions that touch labels (plain: none of them is private)
    def plan_budget(self, budget: Callable[[], tuple[int, int]]) -> None:
        """The method's whole training plan, before the first step (a target-ε accountant calibrates here)."""
        self._rule.plan(budget)

    def begin_run(self, run: str, n_examples: int, batch_size: int, steps: int, participations: int) -> None:
        """A training run starts (an lr-grid candidate, a stage, the final fit)."""
        self._rule.begin_run(run, n_examples, batch_size, steps, participations)

    def score_candidate(self, probs: np.ndarray, y: np.ndarray, n_classes: int) -> float:
        """A learning-rate candidate's score on this party's held-out labeled rows."""
        return self._rule.score(probs, y, n_classes)

    def choose_lr(self, grid: list[float], scores: dict[float, float], n_val: int) -> float:
        """The learning rate to retrain with, chosen as this party's step rule allows."""
        return self._rule.choose(grid, scores, n_val)

    def _labels_for_hooks(self, ids: np.ndarray) -> np.ndarray | None:
        """The batch's own training labels, for the gradient hooks that observe them (else None,
        so no label reaches a hook that did not declare it); -1 for rows without a label. Soft labels
        (a label transform such as CAE's) are given as their most likely class: the labels the party
        trains on, never the originals."""
        if self.data.label_ids is None or not any("labels" in h.observes and isinstance(h, MessageTransform)
                                                  for h in self.hooks):
            return None
        known = member(ids, self.data.label_ids)
        out = np.full(len(ids), -1, dtype=np.int64)
        y = np.asarray(self.data.labels(ids[known]))
        out[known] = y.argmax(axis=1) if y.ndim == 2 else y
        return out

    def _send_gradients(self, grads: list[torch.Tensor], ids: np.ndarray | Mapping[str, np.ndarray]) -> None:
        per_passive = ids if isinstance(ids, Mapping) else dict.fromkeys(self.passive_names, ids)
        for name, g in zip(self.passive_names, grads, strict=True):
            if name in per_passive:
                ctx = HookContext(MessageKind.GRADIENT, self.name, name, self.step, True, per_passive[name],
                                  self._labels_for_hooks(per_passive[name]))
                self.cut_ends[name].send_backward(g, ctx)
        self.received = []
        self.step += 1
