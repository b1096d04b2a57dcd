"""Party-local SSL pre-training: one party, its own rows, no channel."""

from __future__ import annotations

import numpy as np
import torch

from securevfl.devices import module_device
from securevfl.ssl.augment import Augmentation
from securevfl.ssl.objectives import SSLObjective


def two_views(x: torch.Tensor, aug: Augmentation, clean_anchor: bool, gen: torch.Generator):
    return (x if clean_anchor else aug(x, gen)), aug(x, gen)


def pretrain_local(objective: SSLObjective, X: np.ndarray, aug: Augmentation, seed: int,
                   epochs: int | None = None) -> list[float]:
    """Train ``objective`` (encoder + heads) on the rows ``X`` for ``epochs`` epochs; returns the
    per-step losses. Batches smaller than 2 rows are skipped (BatchNorm needs two)."""
    cfg = objective.cfg
    epochs = cfg.epochs if epochs is None else epochs
    gen = torch.Generator().manual_seed(seed)  # augmentations draw on the CPU: the same views on every device
    device = module_device(objective.encoder)  # the party's (--device)
    objective.to(device)
    rng = np.random.default_rng(seed)
    opt = torch.optim.Adam([p for p in objective.parameters() if p.requires_grad], lr=cfg.lr)
    X_t = torch.as_tensor(np.asarray(X, dtype=np.float32))
    objective.train()
    losses = []
    for _ in range(epochs):
        order = rng.permutation(len(X_t))
        for s in range(0, len(order), cfg.batch_size):
            idx = order[s:s + cfg.batch_size]
            if len(idx) < 2:
                continue
            x1, x2 = (v.to(device) for v in two_views(X_t[idx], aug, objective.anchor_is_clean, gen))
            loss = objective.loss(x1, x2)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            objective.after_step()
            losses.append(float(loss.detach()))
    return losses
