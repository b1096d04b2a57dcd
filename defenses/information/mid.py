"""``mid:LAMBDA``: Mutual Information Regularization Defense (Zou et al. 2023, "Mutual Information
Regularization for Vertical Federated Learning"; VFLAIR's MID layer). The active party puts a
variational information bottleneck on what each passive party delivers, before its head reads it:
encoder (width → 2·width → 2·b) gives μ and σ = softplus(raw − 5) of a b-dimensional Gaussian
(b = ``scale`` · width), a sample μ + σ·ε goes through the decoder (b → 2·width → width), and
λ · KL(N(μ, σ²) ‖ N(0, I)) joins the active party's objective (label-free, outside a DP-SGD clip).
The bottleneck limits how much of the labels the passive party's gradient (now ∂L/∂r *through* the
bottleneck) and its trained bottom model carry: it targets model completion (``mc``) and gradient
scoring (``norm``, ``direction``).

Reading where the paper is open: at inference the layer uses μ (no sampling), the usual VIB
prediction; the noise ε comes from the defense's own generator. ``mid:0`` is the undefended run
(no layer; VFLAIR's λ = 0 keeps an untrained-for-privacy bottleneck, a different architecture).

Party: active. Composes with HE (the layer sits on a_P = t·W_P, which the active party holds in the
clear), with every method that trains through the active party's head, and with an agg head (the
layer then sits on each passive party's logits before the sum).
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from defenses.base import DEFENSES, Defense, _finite
from securevfl.channel import MessageKind
from securevfl.devices import noise_like
from securevfl.errors import UserError
from securevfl.hooks import ExtraLoss, ModelWrap, StepView
from securevfl.roles import ACTIVE

STD_SHIFT = 5.0
"""σ = softplus(raw − 5): the bottleneck starts nearly deterministic (VFLAIR's MID layer)."""


class Bottleneck(nn.Module):
    """One passive party's variational bottleneck; keeps its last KL for the loss term."""

    def __init__(self, width: int, latent: int, generator: torch.Generator) -> None:
        super().__init__()
        self.latent, self.generator = latent, generator
        self.encoder = nn.Sequential(nn.Linear(width, 2 * width), nn.ReLU(), nn.Linear(2 * width, 2 * latent))
        self.decoder = nn.Sequential(nn.Linear(latent, 2 * width), nn.ReLU(), nn.Linear(2 * width, width))
        self.kl: torch.Tensor | None = None

    def forward(self, r: torch.Tensor) -> torch.Tensor:
        h = self.encoder(r)
        mu, std = h[:, : self.latent], F.softplus(h[:, self.latent:] - STD_SHIFT)
        if not self.training:
            self.kl = None
            return self.decoder(mu)
        eps = noise_like(torch.randn(mu.shape, generator=self.generator, dtype=mu.dtype), mu)  # CPU draw (devices.py)
        # KL(N(μ, σ²) ‖ N(0, I)) per example, averaged over the batch
        self.kl = 0.5 * (mu.pow(2) + std.pow(2) - 2 * torch.log(std + 1e-12) - 1).sum(1).mean()
        return self.decoder(mu + std * eps)


@DEFENSES.register
class MID(Defense, ModelWrap, ExtraLoss):
    name = "mid"
    primary = "lam"
    defaults = {"lam": 1e-3, "scale": 0.5}
    runs_at = frozenset({ACTIVE})
    observes = frozenset({"received"})
    # the bottleneck changes the gradients the active party returns
    acts_on = frozenset({MessageKind.GRADIENT})
    targets: ClassVar[tuple[str, ...]] = ("mc", "mc-plain", "norm", "direction")

    def validate(self) -> None:
        _finite("mid lam", self.config["lam"])
        if not 0 < self.config["scale"] <= 4:
            raise UserError(f"mid scale (bottleneck width / delivery width) must be in (0, 4], "
                            f"got {self.config['scale']}")
        if self.config["lam"] == 0:  # the undefended control: installed nowhere, bit-identical
            self.runs_at = frozenset()
        self.layers: list[Bottleneck] = []

    def wrap_received(self, passive: str, width: int) -> nn.Module | None:
        layer = Bottleneck(width, max(1, round(self.config["scale"] * width)), self.generator)
        self.layers.append(layer)
        return layer

    def loss_term(self, view: StepView) -> torch.Tensor:
        kls = [layer.kl for layer in self.layers if layer.kl is not None]
        return self.config["lam"] * torch.stack(kls).sum() if kls else torch.zeros(())

    def privacy(self) -> dict:
        return {"epsilon": None, "delta": None, "mechanism": "mid", "formal_guarantee": False,
                "protects": "the active party's labels (information bottleneck on the deliveries)",
                "lam": self.config["lam"]}
