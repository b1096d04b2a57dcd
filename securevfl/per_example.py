"""Per-example gradients for DP-SGD at the active party (see ``defenses/perturbation/label_dp.py``).

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

from collections.abc import Iterable
from functools import cache
from typing import cast

import torch
from torch import nn


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
                                       grad_outputs=torch.eye(n, dtype=losses.dtype), is_grads_batched=True)
            for i, g in zip(missing, slow, strict=True):
                out[i] = torch.zeros((n, *params[i].shape)) if g is None else g
        # the loop above filled every entry that was None
        return [cast(torch.Tensor, g).to(q.dtype) for g, q in zip(out, params, strict=True)], leaf_grads
