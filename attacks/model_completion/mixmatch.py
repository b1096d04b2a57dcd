"""MixMatch's pieces (Berthelot et al. 2019) as pure functions."""

from __future__ import annotations

import numpy as np
import torch


def sharpen(p: torch.Tensor, T: float) -> torch.Tensor:
    p = p ** (1.0 / T)
    return p / p.sum(dim=1, keepdim=True)


def mixup(x: torch.Tensor, y: torch.Tensor, alpha: float, rng: np.random.Generator,
          gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """MixMatch's MixUp: λ ~ Beta(α, α), λ' = max(λ, 1 − λ), mixed with a shuffled copy."""
    lam = float(rng.beta(alpha, alpha))
    lam = max(lam, 1 - lam)
    perm = torch.randperm(len(x), generator=gen)
    return lam * x + (1 - lam) * x[perm], lam * y + (1 - lam) * y[perm]


def linear_rampup(step: int, total: int) -> float:
    return float(np.clip(step / max(total, 1), 0.0, 1.0))
