"""Per-example gradients for DP-SGD step rules (``defenses/perturbation/label_dp.py`` at the active
party, ``defenses/perturbation/embedding.py`` at a passive party), and the two step-rule bases
that do the per-example plumbing of :mod:`securevfl.hooks` hook point (b).

Fast path: while armed, the tracer records the input of every ``Linear`` / ``Conv2d`` /
``Embedding`` call of the party's modules and hooks the call's output, so one ordinary backward of
Σ_i ℓ_i yields each call's per-row backprops; Opacus's per-layer grad samplers turn (input, backprop)
into per-example parameter gradients (O(n) work, as in Opacus). A module called several times in one
step (e.g. the bottom model on the aligned batch, then on FedUD's unaligned rows) contributes its
calls' rows in call order, which is the order of the example vector. Any parameter this cannot cover
exactly (another layer type, a weight used outside its module's forward, row counts that do not add
up) falls back to the exact generic path: a vmapped backward over the examples
(``is_grads_batched``), O(n²) but correct for any graph without cross-example coupling (no batch
normalisation in securevfl's models).
"""

from __future__ import annotations

import dataclasses
from abc import abstractmethod
from collections.abc import Iterable
from functools import cache
from typing import cast

import numpy as np
import torch
from torch import nn

from securevfl.errors import UserError
from securevfl.hooks import ActiveStep, Objective, PassiveStep, StepGradients


@cache
def grad_samplers() -> dict:
    """Opacus's per-layer per-sample gradient functions (imported on first use: Opacus is slow to import)."""
    from opacus.grad_sample.conv import compute_conv_grad_sample
    from opacus.grad_sample.embedding import compute_embedding_grad_sample
    from opacus.grad_sample.linear import compute_linear_grad_sample

    return {nn.Linear: compute_linear_grad_sample, nn.Conv2d: compute_conv_grad_sample,
            nn.Embedding: compute_embedding_grad_sample}


class PerExampleTracer:
    """Records the calls of a party's layers during one training step (armed → backward → disarmed)."""

    def __init__(self) -> None:
        self._handles: list = []
        self._calls: list[tuple[nn.Module, torch.Tensor]] = []
        self._samples: dict[int, dict[nn.Parameter, torch.Tensor]] = {}
        self.collecting = False

    @property
    def armed(self) -> bool:
        return bool(self._handles)

    def arm(self, modules: Iterable[nn.Module]) -> None:
        if self.armed:
            return
        for root in modules:
            for m in root.modules():
                if type(m) in grad_samplers() and any(q.requires_grad for q in m.parameters(recurse=False)):
                    self._handles.append(m.register_forward_hook(self._on_forward))

    def disarm(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles, self._calls, self._samples = [], [], {}

    def _on_forward(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        if not (torch.is_grad_enabled() and output.requires_grad):
            return
        k = len(self._calls)
        self._calls.append((module, inputs[0].detach()))
        output.register_hook(lambda g, k=k: self._on_backprop(k, g))

    def _on_backprop(self, k: int, backprops: torch.Tensor) -> None:
        if self.collecting:
            module, act = self._calls[k]
            self._samples[k] = grad_samplers()[type(module)](module, [act], backprops.detach())

    def per_example(self, losses: torch.Tensor, params: list[nn.Parameter], leaves: list[torch.Tensor]
                    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-example gradients ``(n, *shape)`` of ``losses`` (one entry per example, each depending
        only on its own rows) for every parameter, and the gradients of ``leaves`` (row i = example i's)."""
        n = len(losses)
        self.collecting = True
        try:
            grads = torch.autograd.grad(losses.sum(), [*leaves, *params], retain_graph=True, allow_unused=True)
        finally:
            self.collecting = False
        leaf_grads = [torch.zeros_like(r) if g is None else g.detach() for g, r in zip(grads, leaves, strict=False)]
        rows: dict[nn.Parameter, list[torch.Tensor]] = {}
        for k in sorted(self._samples):
            for q, gs in self._samples[k].items():
                rows.setdefault(q, []).append(gs)
        out: list[torch.Tensor | None] = []
        for q in params:
            parts = rows.get(q)
            joined = torch.cat(parts) if parts else None
            out.append(joined if joined is not None and joined.shape[0] == n else None)
        missing = [i for i, g in enumerate(out) if g is None]
        if missing:  # exact generic path for what the layer samplers did not cover
            slow = torch.autograd.grad(losses, [params[i] for i in missing], retain_graph=True, allow_unused=True,
                                       grad_outputs=torch.eye(n, dtype=losses.dtype, device=losses.device),
                                       is_grads_batched=True)
            for i, g in zip(missing, slow, strict=True):  # on the parameter's device (--device)
                out[i] = torch.zeros((n, *params[i].shape), device=params[i].device) if g is None else g
        # the loop above filled every entry that was None
        return [cast(torch.Tensor, g).to(q.dtype) for g, q in zip(out, params, strict=True)], leaf_grads


class _Traced:
    """A step rule's tracer, created on first use (defenses are built before any party exists and
    copied per party; an unarmed tracer copies cleanly)."""

    def tracer(self) -> PerExampleTracer:
        if getattr(self, "_tracer", None) is None:
            self._tracer = PerExampleTracer()
        return self._tracer

    def arm(self, modules: list[nn.Module]) -> None:
        self.tracer().arm(modules)


@dataclasses.dataclass
class GradientCanaries:
    """White-box audit canaries (Steinke, Nasr & Jagielski 2023, gradient canaries): in every step, each
    canary example's per-example gradient is replaced by ``sign · norm · u`` on its row to
    ``passive1`` and zero elsewhere, before the mechanism's clipping and noise. ``u`` is public
    (:func:`canary_direction`); the sign is the auditor's private coin. The two signs differ by
    2·norm in one example's contribution, the sensitivity the mechanism's ε is computed for.

    The white-box auditor observes the mechanism's release itself (every party's view is a
    post-processing of it): :meth:`observe` sums each canary's released row projected on ``u``."""

    ids: np.ndarray
    signs: np.ndarray
    """±1 per canary (in ``ids``' order)."""
    norm: float
    """The mechanism's clip norm (a canary at the norm passes clipping unchanged)."""
    observed: dict[int, float] = dataclasses.field(default_factory=dict)
    """Canary ID → Σ over its steps of ⟨released row, u⟩ (the likelihood-ratio statistic for its sign)."""

    def observe(self, example_ids: np.ndarray, released: list[torch.Tensor]) -> None:
        if not released:
            return
        wanted = set(self.ids.tolist())
        block = released[0].detach().reshape(len(released[0]), -1).double().cpu().numpy()
        u = canary_direction(block.shape[1])
        for row, e in enumerate(np.asarray(example_ids).tolist()):
            if e in wanted and row < len(block):
                self.observed[e] = self.observed.get(e, 0.0) + float(block[row] @ u)

    def scores(self) -> np.ndarray:
        """Each canary's statistic, in ``ids``' order (higher: sign +1 more likely)."""
        return np.asarray([self.observed.get(e, 0.0) for e in self.ids.tolist()])


def canary_direction(width: int) -> np.ndarray:
    """The public unit direction of a gradient canary on a row of ``width`` entries."""
    return np.full(width, 1.0 / np.sqrt(width))


def plant_gradient_canaries(per: list[torch.Tensor], rows: list[torch.Tensor], example_ids: np.ndarray,
                            canaries: GradientCanaries) -> None:
    """Replace the canary examples' gradients (``per``: per-parameter ``(n, …)``; ``rows``: per
    received block ``(n, …)``, block 0 being ``passive1``'s) in place."""
    pos = {e: i for i, e in enumerate(canaries.ids.tolist())}
    at = [(row, pos[e]) for row, e in enumerate(np.asarray(example_ids).tolist()) if e in pos]
    if not at or not rows:
        return
    index = torch.tensor([row for row, _ in at], dtype=torch.long)
    for t in [*per, *rows]:
        t[index.to(t.device)] = 0
    block = rows[0]
    u = torch.as_tensor(canary_direction(int(np.prod(block.shape[1:]))), dtype=block.dtype, device=block.device)
    signs = torch.as_tensor(canaries.signs[[k for _, k in at]], dtype=block.dtype, device=block.device)
    block[index.to(block.device)] = (canaries.norm * signs[:, None] * u[None, :]).view(len(at), *block.shape[1:])


class PerExampleActiveStep(_Traced, ActiveStep):
    """The DP-SGD shape of an active party's step (Opacus's per-sample gradients + private optimizer):
    per-example gradients of every labeled loss with respect to the party's parameters and to the
    rows it received go to :meth:`release`; the party is updated, and the passive parties answered,
    with its release only. The label-free part of the objective is added unnoised."""

    observes = frozenset({"per_example_gradients", "validation_scores"})
    canaries: GradientCanaries | None = None
    """Set by the lab's white-box audit before the parties are built; never in a real run."""

    @abstractmethod
    def clip_norm(self) -> float:
        """The L2 norm each example's joint gradient is clipped to (a gradient canary's norm)."""

    @abstractmethod
    def release(self, summed: list[torch.Tensor], rows: list[torch.Tensor], batch_size: int,
                ids: np.ndarray) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-example gradients in, the step's private release out.

        Args:
            summed: per-parameter tensors ``(n, *param.shape)`` (example i's gradient of its own loss).
            rows: per-cut-layer tensors ``(n, *row.shape)`` (example i's gradient of its received row;
                zero for examples beyond the batch).
            batch_size: the nominal batch size the release is averaged over.
            ids: the examples' IDs (the charge is what actually happened).
        Returns:
            The parameter gradients (summed over examples) and the released rows, both noised.
        """

    def gradients(self, objective: Objective, params: list[nn.Parameter], received: list[torch.Tensor]
                  ) -> StepGradients:
        examples, example_ids = objective.per_example()
        free = objective.free()
        loss = objective.check(examples.sum() / objective.batch_size + free)
        tracer = self.tracer()
        per, leaf_grads = tracer.per_example(examples, params, received)
        tracer.disarm()
        n = len(examples)
        # pad each received block to n rows: examples beyond the batch (FedUD's unaligned rows) have none
        rows = [torch.cat([g, g.new_zeros((n - len(g), *g.shape[1:]))]) if n > len(g) else g for g in leaf_grads]
        if self.canaries is not None:  # a white-box audit (lab only; securevfl/lab/audit.py)
            plant_gradient_canaries(per, rows, example_ids, self.canaries)
        summed, released = self.release(per, rows, objective.batch_size, example_ids)
        if self.canaries is not None:  # the white-box auditor reads the release itself
            self.canaries.observe(example_ids, released)
        free_grads = (torch.autograd.grad(free, params, allow_unused=True) if free.requires_grad
                      else [None] * len(params))
        grads: list[torch.Tensor | None] = [s if f is None else s + f for s, f in zip(summed, free_grads, strict=True)]
        return StepGradients(loss, grads, [r[:len(g)] for r, g in zip(released, received, strict=True)])


class PerExamplePassiveStep(_Traced, PassiveStep):
    """The DP-SGD shape of a passive party's step: per-example gradients of ⟨z_i, g_i⟩ with respect
    to the bottom parameters go to :meth:`update`, whose result is applied."""

    observes = frozenset({"per_example_gradients"})

    @abstractmethod
    def update(self, per_example: list[torch.Tensor], batch_size: int, ids: np.ndarray) -> list[torch.Tensor]:
        """The noised sum to apply, one tensor per parameter."""

    def gradients(self, z: torch.Tensor, grad: torch.Tensor, extra: torch.Tensor | None,
                  params: list[nn.Parameter], ids: np.ndarray) -> list[torch.Tensor | None]:
        if extra is not None:  # a whole-batch term has no per-example bound
            raise UserError(f"defense {self.name} bounds each example's update; a loss term at the same party "
                            "would leave it unbounded")
        tracer = self.tracer()
        per, _ = tracer.per_example((z * grad).sum(1), params, [])
        tracer.disarm()
        return list(self.update(per, len(ids), ids))
