"""``sdar-label``: SDAR's label side by a passive party (a simulated head, adversarially regularised
against the gradients it received)."""

from __future__ import annotations

import numpy as np
import torch

from attacks.model_completion.sdar import train_head
from securevfl.config import RunConfig
from securevfl.lab.compose import execute


def _synthetic(seed: int, lambda1: float, noise: bool, n_aux: int = 20, k: int = 4, d: int = 8,
               n: int = 2000) -> float:
    """Accuracy of h_s on the unlabeled rows when the head is a function of the adversary's embedding
    alone: the received gradients then carry the head's whole gradient field."""
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(k, d, generator=g) * 2
    z = torch.randn(n, d, generator=g)
    logits = z @ W.T
    y = torch.distributions.Categorical(logits=logits).sample()
    grad = (torch.softmax(logits, 1) - torch.nn.functional.one_hot(y, k)) @ W / 64  # the batch-mean gradient
    if noise:
        grad = torch.randn(n, d, generator=g)
    cfg = {"hidden": 64, "lr": 1e-3, "batch_size": 64, "steps": 600}
    head = train_head(z[:n_aux], y[:n_aux], z, grad, k, cfg, lambda1, 0.0, seed)
    with torch.no_grad():
        return float((head(z[n_aux:]).argmax(1) == y[n_aux:]).float().mean())


def test_the_adversarial_regulariser_reads_the_received_gradients():
    """Measured: λ₁ 1 lifts 20-label accuracy from 0.626 to 0.704 (mean of 4 seeds); with noise in
    place of the gradients it adds nothing (0.620 → 0.601). Removing the discriminator, or feeding it
    anything but the gradients, fails this test."""
    plain = np.mean([_synthetic(s, 0.0, False) for s in range(4)])
    reg = np.mean([_synthetic(s, 1.0, False) for s in range(4)])
    blind = np.mean([_synthetic(s, 1.0, True) for s in range(4)])
    assert reg > plain + 0.04 and blind < plain + 0.01


def test_sdar_label_on_a_trained_federation_beats_its_control():
    """Digits, splitnn: the simulated head on the trained bottom infers labels far above the prior and
    above the same attack on the untrained architecture with noise for the gradients (measured 0.779
    against 0.639; mc-plain 0.784 on the same 40 rows)."""
    cfg = RunConfig(dataset="digits", method="splitnn", seed=0, attacks=["sdar-label"])
    cfg.train.epochs = 10
    a = execute(cfg, progress=False).to_json()["attacks"]["sdar-label"]
    assert a["value"] > 0.7 and a["value"] > a["control"] + 0.05 and a["gradient_rows"] > 500
    assert abs(a["value"] - a["without_regularization"]) < 0.1
