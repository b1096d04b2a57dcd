"""The math of the defenses as pure functions on a batch of per-example messages ``(B, ...)``."""

from __future__ import annotations

import math

import torch


def per_example_norms(t: torch.Tensor) -> torch.Tensor:
    return t.flatten(1).norm(dim=1)


def iso_sigma(g: torch.Tensor, lam: float) -> float:
    """ISO's noise scale: σ = λ · max_j ‖g_j‖₂ / √d, d the per-example size (Li et al. 2022)."""
    d = g[0].numel()
    return float(lam * per_example_norms(g).max() / math.sqrt(d)) if len(g) else 0.0


def clip_per_example(t: torch.Tensor, clip: float) -> torch.Tensor:
    """Scale every example's row to L2 norm ≤ ``clip`` (rows already inside are untouched)."""
    norms = per_example_norms(t)
    factor = torch.clamp(clip / (norms + 1e-12), max=1.0)
    return t * factor.view(-1, *([1] * (t.dim() - 1))).to(t.dtype)


def gaussian(like: torch.Tensor, std: float, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(like.shape, generator=generator, dtype=like.dtype) * std


def topk_per_example(t: torch.Tensor, keep_fraction: float) -> torch.Tensor:
    """Keep the ``keep_fraction`` largest-magnitude entries of each example; zero the rest."""
    flat = t.flatten(1)
    k = max(1, math.ceil(keep_fraction * flat.shape[1]))
    if k >= flat.shape[1]:
        return t
    idx = flat.abs().topk(k, dim=1).indices
    mask = torch.zeros_like(flat, dtype=torch.bool).scatter_(1, idx, True)
    return (flat * mask).view_as(t)
