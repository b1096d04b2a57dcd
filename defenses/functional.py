"""The math of the defenses as pure functions on a batch of per-example messages ``(B, ...)``."""

from __future__ import annotations

import math
from typing import cast

import numpy as np
import torch

from securevfl.devices import noise_like


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
    """N(0, std²) noise shaped like ``like``, drawn from the CPU ``generator`` and moved to ``like``'s
    device: one seed gives the same noise on every --device (securevfl/devices.py)."""
    return noise_like(torch.randn(like.shape, generator=generator, dtype=like.dtype) * std, like)


def topk_per_example(t: torch.Tensor, keep_fraction: float) -> torch.Tensor:
    """Keep the ``keep_fraction`` largest-magnitude entries of each example; zero the rest."""
    flat = t.flatten(1)
    k = max(1, math.ceil(keep_fraction * flat.shape[1]))
    if k >= flat.shape[1]:
        return t
    idx = flat.abs().topk(k, dim=1).indices
    mask = torch.zeros_like(flat, dtype=torch.bool).scatter_(1, idx, True)
    return (flat * mask).view_as(t)


def dp_sgd_release(summed: list[torch.Tensor], rows: list[torch.Tensor], clip: float, std: float,
                   batch_size: int, generator: torch.Generator) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """One DP-SGD release over per-example gradients (all tensors ``(n, ...)``, example i in row i).

    Every example's gradients — of the parameters (``summed``) and of its own cut-layer rows
    (``rows``) — are clipped *jointly* to L2 norm ``clip``; the parameter gradients are summed over
    examples; Gaussian noise of ``std`` is added to every released coordinate (each summed entry and
    each row entry); everything is divided by the nominal ``batch_size`` (public)."""
    parts = [*summed, *rows]
    if not parts:
        return [], []
    sq = cast(torch.Tensor, sum(t.flatten(1).pow(2).sum(1) for t in parts))  # parts is not empty
    factor = torch.clamp(clip / (sq.sqrt() + 1e-12), max=1.0)

    def scaled(t: torch.Tensor) -> torch.Tensor:
        return t * factor.view(-1, *([1] * (t.dim() - 1))).to(t.dtype)

    out_sum = [(scaled(t).sum(0) + gaussian(t[0], std, generator)) / batch_size for t in summed]
    out_rows = [(scaled(t) + gaussian(t, std, generator)) / batch_size for t in rows]
    return out_sum, out_rows


def randomized_response(labels: np.ndarray, n_classes: int, eps: float, rng: np.random.Generator) -> np.ndarray:
    """K-ary randomized response: keep the label with probability e^ε/(e^ε + K − 1), otherwise move
    it to each other class with probability 1/(e^ε + K − 1) (Warner 1965; Ghazi et al. 2021, RR)."""
    labels = np.asarray(labels)
    e = math.exp(min(eps, 700.0))  # e^700 already makes keep 1.0; e^710 overflows
    keep = e / (e + n_classes - 1)
    flip = rng.random(len(labels)) >= keep
    shift = rng.integers(1, n_classes, size=len(labels))  # uniform over the K − 1 other classes
    return np.where(flip, (labels + shift) % n_classes, labels).astype(labels.dtype)


def rr_with_prior_probs(prior: np.ndarray, label: int, eps: float) -> np.ndarray:
    """Output distribution of RRWithPrior (Ghazi et al. 2021, Alg. 2) for one example: with the k
    classes of highest prior that maximise e^ε/(e^ε + k − 1) · Σ_top-k prior, randomized response
    restricted to them (a label outside them becomes uniform over them)."""
    order = np.argsort(-prior, kind="stable")
    e = math.exp(min(eps, 700.0))  # as in randomized_response
    ks = np.arange(1, len(prior) + 1)
    k = int(ks[np.argmax(e / (e + ks - 1) * np.cumsum(prior[order]))])
    top = order[:k]
    out = np.zeros(len(prior))
    if label in top:
        out[top] = 1.0 / (e + k - 1)
        out[label] = e / (e + k - 1)
    else:
        out[top] = 1.0 / k
    return out


def rr_with_prior(labels: np.ndarray, priors: np.ndarray, eps: float, rng: np.random.Generator) -> np.ndarray:
    """RRWithPrior for every row (``priors``: n × K, computed without these labels)."""
    return np.array([rng.choice(priors.shape[1], p=rr_with_prior_probs(p, int(y), eps))
                     for y, p in zip(labels, priors, strict=True)], dtype=np.asarray(labels).dtype)


def _centered_distances(t: torch.Tensor) -> torch.Tensor:
    """Double-centred pairwise Euclidean distance matrix of the rows of ``t`` (B, d)."""
    sq = (t.unsqueeze(1) - t.unsqueeze(0)).pow(2).sum(-1)
    # sqrt has an infinite slope at 0 (the diagonal, duplicate rows): take it only where sq > 0
    pos = sq > 0
    d = torch.where(pos, sq.clamp_min(1e-30).sqrt(), torch.zeros_like(sq))
    return d - d.mean(0, keepdim=True) - d.mean(1, keepdim=True) + d.mean()


def distance_correlation(x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Sample distance correlation dCor(x, z) ∈ [0, 1] between two batches of rows (Székely et al.
    2007; NoPeek's leakage measure, Vepakomma et al. 2020), differentiable in both. Rows are
    flattened; a batch with constant rows on either side has dCor 0."""
    a, b = _centered_distances(x.flatten(1).float()), _centered_distances(z.flatten(1).float())
    dcov2_xz = (a * b).mean()
    denom = ((a * a).mean() * (b * b).mean()).sqrt()
    if float(denom.detach()) <= 0.0:
        return (dcov2_xz * 0.0).clamp_min(0.0)
    # dCov² ≥ 0 in exact arithmetic; clamp round-off before the square root (and its gradient)
    return (dcov2_xz.clamp_min(0.0) / denom).clamp_min(1e-30).sqrt()


def quantize(t: torch.Tensor, width: float, half: int) -> torch.Tensor:
    """Discrete SGD's levels (VFLAIR's ``DiscreteSGD``, used by ``discrete-sgd`` and ``dcae``): every
    entry rounded to the nearest k·``width``, k = −``half`` … ``half`` (values beyond take the outer
    level); a zero width (an all-constant first batch) is the single level 0."""
    if width == 0:
        return torch.zeros_like(t)
    return (torch.round(t.double() / width).clamp(-half, half) * width).to(t.dtype)


def level_width(t: torch.Tensor, half: int) -> float:
    """The bin width 2σ₀ / ``half`` from the first batch's standard deviation σ₀ (VFLAIR's reading:
    the levels span ±2σ₀, fixed once per receiver)."""
    return 2 * float(t.double().std()) / half if t.numel() > 1 else 0.0
