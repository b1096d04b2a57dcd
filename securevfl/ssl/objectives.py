"""SSL objectives, one implementation each: SimSiam (Chen & He 2021), BYOL (Grill et al. 2020),
MoCo v2 (He et al. 2020; Chen et al. 2020) and SCARF (Bahri et al. 2022, InfoNCE between a row and
its corrupted view). Each wraps an encoder (the party's bottom model, output dim d) with its own
projector/predictor heads; ``loss(x1, x2)`` returns the objective on two views.

Heads follow FedHSSL's appendix: a 3-FC projector and a 2-FC predictor (sizes scaled to CPU models:
``proj_dim`` 128, predictor hidden ``pred_hidden`` 32).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from securevfl.registry import Registry


@dataclass
class SSLConfig:
    objective: str = "simsiam"
    """``simsiam``, ``byol``, ``moco`` or ``scarf``."""
    epochs: int = 10
    """Pre-training epochs over the party's local rows (FedHSSL: 10–40)."""
    batch_size: int = 512
    """Pre-training batch size (FedHSSL: 512)."""
    lr: float = 1e-3
    """Adam learning rate of pre-training."""
    corruption: float = 0.3
    """Fraction of tabular features corrupted per view (FedHSSL 0.3; the SCARF paper uses 0.6)."""
    proj_dim: int = 128
    """Projector output width."""
    pred_hidden: int = 32
    """Predictor bottleneck width."""
    temperature: float = 0.1
    """InfoNCE temperature τ (SCARF, MoCo)."""
    ema: float = 0.99
    """Target-network momentum (BYOL, MoCo)."""
    queue: int = 2048
    """MoCo negative queue length."""


def neg_cosine(p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """SimSiam's D(p, z) = −cos(p, stopgrad(z)), averaged over the batch."""
    return -(F.normalize(p, dim=1) * F.normalize(z.detach(), dim=1)).sum(dim=1).mean()


def projector(d: int, p: int) -> nn.Module:
    return nn.Sequential(nn.Linear(d, p), nn.BatchNorm1d(p), nn.ReLU(), nn.Linear(p, p), nn.BatchNorm1d(p),
                         nn.ReLU(), nn.Linear(p, p), nn.BatchNorm1d(p))


def predictor(p: int, h: int) -> nn.Module:
    return nn.Sequential(nn.Linear(p, h), nn.BatchNorm1d(h), nn.ReLU(), nn.Linear(h, p))


def info_nce(q: torch.Tensor, k: torch.Tensor, tau: float, negatives: torch.Tensor | None = None) -> torch.Tensor:
    """InfoNCE with row i of ``k`` the positive for row i of ``q``; other rows (and ``negatives``)
    are negatives."""
    q, k = F.normalize(q, dim=1), F.normalize(k, dim=1)
    logits = q @ k.T
    if negatives is not None:
        logits = torch.cat([logits, q @ negatives.T], dim=1)
    return F.cross_entropy(logits / tau, torch.arange(len(q), device=q.device))


class SSLObjective(nn.Module):
    """A self-supervised objective around a party's encoder. To add one: subclass, set ``name``,
    build the heads in ``__init__``, implement :meth:`loss` (and :meth:`after_step` for a momentum
    target) and add the class to :data:`OBJECTIVES`."""

    name = "ssl"
    """The ``SSLConfig.objective`` name."""
    anchor_is_clean = False
    """SCARF contrasts the clean row with one corrupted view; the others use two augmented views."""

    def __init__(self, encoder: nn.Module, cfg: SSLConfig) -> None:
        super().__init__()
        self.encoder = encoder
        self.cfg = cfg
        d = cast(int, encoder.out_dim)  # every bottom encoder records its output width (models.py)

        self.projector = projector(d, cfg.proj_dim)

    def loss(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        """The objective on one batch.

        Args:
            x1: the first view (the clean rows when :attr:`anchor_is_clean`).
            x2: the second, augmented view of the same rows.
        Returns:
            A scalar loss to minimise.
        """
        raise NotImplementedError

    def after_step(self) -> None:
        """Called after each optimizer step (momentum targets update here)."""


class SimSiam(SSLObjective):
    name = "simsiam"

    def __init__(self, encoder: nn.Module, cfg: SSLConfig) -> None:
        super().__init__(encoder, cfg)
        self.predictor = predictor(cfg.proj_dim, cfg.pred_hidden)

    def embed(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.projector(self.encoder(x))
        return z, self.predictor(z)

    def loss(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        (z1, p1), (z2, p2) = self.embed(x1), self.embed(x2)
        return 0.5 * (neg_cosine(p1, z2) + neg_cosine(p2, z1))


class _Momentum(SSLObjective):
    """Shared by BYOL and MoCo: an EMA target copy of encoder + projector."""

    def __init__(self, encoder: nn.Module, cfg: SSLConfig) -> None:
        super().__init__(encoder, cfg)
        self.target = copy.deepcopy(nn.Sequential(self.encoder, self.projector))
        for p in self.target.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def after_step(self) -> None:
        online = list(self.encoder.parameters()) + list(self.projector.parameters())
        for t, o in zip(self.target.parameters(), online, strict=True):
            t.mul_(self.cfg.ema).add_(o.detach(), alpha=1 - self.cfg.ema)


class BYOL(_Momentum):
    name = "byol"

    def __init__(self, encoder: nn.Module, cfg: SSLConfig) -> None:
        super().__init__(encoder, cfg)
        self.predictor = predictor(cfg.proj_dim, cfg.pred_hidden)

    def loss(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        p1 = self.predictor(self.projector(self.encoder(x1)))
        p2 = self.predictor(self.projector(self.encoder(x2)))
        with torch.no_grad():
            t1, t2 = self.target(x1), self.target(x2)
        # 2 − 2·cos = 2 + 2·D; the constant does not matter for the gradient
        return 2 + 2 * 0.5 * (neg_cosine(p1, t2) + neg_cosine(p2, t1))


class MoCo(_Momentum):
    name = "moco"
    bank: torch.Tensor  # the key queue, a buffer (register_buffer below)

    def __init__(self, encoder: nn.Module, cfg: SSLConfig) -> None:
        super().__init__(encoder, cfg)
        self.register_buffer("bank", F.normalize(torch.randn(cfg.queue, cfg.proj_dim), dim=1))
        self._ptr = 0

    def loss(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        q = self.projector(self.encoder(x1))
        with torch.no_grad():
            k = F.normalize(self.target(x2), dim=1)
        loss = info_nce(q, k, self.cfg.temperature, self.bank.clone())
        with torch.no_grad():  # enqueue the newest keys
            n = min(len(k), len(self.bank))
            idx = (self._ptr + torch.arange(n, device=self.bank.device)) % len(self.bank)
            self.bank[idx] = k[:n]
            self._ptr = int((self._ptr + n) % len(self.bank))
        return loss


class SCARF(SSLObjective):
    name = "scarf"
    anchor_is_clean = True

    def loss(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        z1 = self.projector(self.encoder(x1))
        z2 = self.projector(self.encoder(x2))
        return 0.5 * (info_nce(z1, z2, self.cfg.temperature) + info_nce(z2, z1, self.cfg.temperature))


OBJECTIVES: Registry[type[SSLObjective]] = Registry("SSL objective")
"""SSL objectives by name (``SSLConfig.objective``)."""
for _cls in (SimSiam, BYOL, MoCo, SCARF):
    OBJECTIVES.register(_cls)


def make_objective(encoder: nn.Module, cfg: SSLConfig) -> SSLObjective:
    """``cfg.objective`` wrapped around ``encoder``.

    Args:
        encoder: the party's bottom model (``out_dim`` attribute: its output width).
        cfg: SSL hyperparameters; ``cfg.objective`` names the objective.
    Returns:
        The objective module (its parameters: the encoder's plus its own heads).
    """
    return OBJECTIVES.get(cfg.objective)(encoder, cfg)
