"""Augmentations for one party's feature block.

Tabular (SCARF-style, Bahri et al. 2022, as FedHSSL uses on NUS-WIDE/Avazu): corrupt a random
``fraction`` of each row's features. Numeric columns are replaced by a draw from the column's
empirical marginal (its values over the party's training rows); categorical columns are replaced
by the reserved unknown id 0 (FedHSSL's "extra untrained embedding", Yao et al. 2021) or, with
``categorical="marginal"``, by a marginal draw as well.

Images (torchvision is not available as a CPU build here, so these are written with torch ops):
random translation by up to ``shift`` pixels (zero padding), random erasing of one rectangle,
brightness/contrast jitter and Gaussian noise — the parts of SimSiam's recipe that make sense for
an 8–28 px grey image slice.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import torch


class Augmentation(ABC):
    @abstractmethod
    def __call__(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor: ...


class TabularCorruption(Augmentation):
    def __init__(self, X_train: np.ndarray, n_numeric: int, fraction: float = 0.3,
                 categorical: str = "unknown") -> None:
        if not 0 <= fraction <= 1:
            raise ValueError("corruption fraction must be in [0, 1]")
        self.marginals = torch.as_tensor(np.asarray(X_train, dtype=np.float32))
        self.n_numeric = n_numeric
        self.fraction = fraction
        self.categorical = categorical

    def corruption_mask(self, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
        """Exactly round(fraction·F) corrupted features per row of a (rows, F) ``shape``."""
        n, f = shape
        k = int(round(self.fraction * f))
        order = torch.rand(n, f, generator=generator).argsort(dim=1)
        return order < k

    def __call__(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        mask = self.corruption_mask(tuple(x.shape), generator)
        rows = torch.randint(0, len(self.marginals), x.shape, generator=generator)
        draws = torch.gather(self.marginals, 0, rows)  # column j resampled from column j's marginal
        if self.categorical == "unknown" and x.shape[1] > self.n_numeric:
            draws[:, self.n_numeric:] = 0.0
        return torch.where(mask, draws, x)


class ImageAugment(Augmentation):
    """``shift`` is a fraction of the slice's shorter side (28×14 → 1 px; an 8×4 digits slice is not
    shifted, since moving it by even one column destroys a quarter of it)."""

    def __init__(self, shift: float = 0.1, erase: float = 0.5, noise: float = 0.05, jitter: float = 0.2) -> None:
        self.shift, self.erase, self.noise, self.jitter = shift, erase, noise, jitter

    def __call__(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        n, h, w = x.shape
        s = int(self.shift * min(h, w))
        padded = torch.nn.functional.pad(x, (s, s, s, s))
        dy = torch.randint(0, 2 * s + 1, (n,), generator=generator)
        dx = torch.randint(0, 2 * s + 1, (n,), generator=generator)
        rows = (dy[:, None] + torch.arange(h)[None, :])[:, :, None].expand(n, h, w)
        cols = (dx[:, None] + torch.arange(w)[None, :])[:, None, :].expand(n, h, w)
        out = padded[torch.arange(n)[:, None, None], rows, cols]
        # brightness / contrast jitter
        a = 1 + self.jitter * (2 * torch.rand(n, 1, 1, generator=generator) - 1)
        b = self.jitter * (2 * torch.rand(n, 1, 1, generator=generator) - 1) * 0.5
        out = out * a + b
        # random erasing of one rectangle (up to a quarter of each side) with probability `erase`
        eh = torch.randint(1, max(2, h // 4 + 1), (n,), generator=generator)
        ew = torch.randint(1, max(2, w // 4 + 1), (n,), generator=generator)
        y0 = (torch.rand(n, generator=generator) * (h - eh + 1)).long()
        x0 = (torch.rand(n, generator=generator) * (w - ew + 1)).long()
        yy, xx = torch.arange(h)[None, :, None], torch.arange(w)[None, None, :]
        box = (yy >= y0[:, None, None]) & (yy < (y0 + eh)[:, None, None]) & \
              (xx >= x0[:, None, None]) & (xx < (x0 + ew)[:, None, None])
        box &= (torch.rand(n, 1, 1, generator=generator) < self.erase)
        out = out.masked_fill(box, 0.0)
        return out + self.noise * torch.randn(out.shape, generator=generator)


def make_augmentation(kind: str, X_train: np.ndarray, n_numeric: int, fraction: float = 0.3,
                      categorical: str = "unknown") -> Augmentation:
    if kind == "image":
        return ImageAugment()
    return TabularCorruption(X_train, n_numeric, fraction, categorical)
