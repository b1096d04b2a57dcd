"""``fedpass:RANGE``: FedPass, adaptive obfuscation by passport layers (Gu et al., IJCAI 2023,
"FedPass: Privacy-Preserving Vertical Federated Deep Learning with Adaptive Obfuscation").

A passport layer is a linear map W whose output scale and bias are computed from secret keys, the
passports, through W itself: γ = Dec(LeakyReLU(Enc(mean_p W s_γ,p))), β likewise from s_β, and the
layer outputs γ ⊙ (W x) + β. Each passport entry is drawn from N(μ_j, σ²) with the mean μ_j of its
column drawn uniformly from [−RANGE, RANGE]; RANGE is the strength (the paper's N). Because γ and
β move with W as it trains, the obfuscation adapts: a party that does not hold the passports faces
an unknown, changing affine map.

Placement as in the paper: each passive party ends its bottom model with a passport layer (its
released rows are obfuscated against feature inference by the active party), and the active party
puts one on each passive delivery before its head reads it (the top model's first layer: the
gradients it returns, and what a completed model learns, go through it). ``side=passive`` or
``side=active`` keeps one of the two. Each party draws its passports from its own private
generator and never sends them. ``fedpass:0`` installs nothing: bit-identical to no defense.

Readings where the paper is open: one passport row per key (``passports``; VFLAIR's default for
linear blocks), the autoencoder of width w → w/4 → w without biases (VFLAIR's), W square and
initialised as ``nn.Linear``; σ = 1 (``sigma``).
"""

from __future__ import annotations

from typing import ClassVar, cast

import torch
import torch.nn.functional as F
from torch import nn

from defenses.base import DEFENSES, Defense, _finite
from securevfl.channel import MessageKind
from securevfl.errors import UserError
from securevfl.hooks import ModelWrap
from securevfl.roles import ACTIVE, PASSIVE

SIDES = {"both": frozenset({ACTIVE, PASSIVE}), "active": frozenset({ACTIVE}), "passive": frozenset({PASSIVE})}


class PassportLayer(nn.Module):
    """γ(W, s_γ) ⊙ (W x) + β(W, s_β) with secret passports s_γ, s_β (buffers: saved with the model,
    never sent)."""

    def __init__(self, width: int, mean_range: float, sigma: float, passports: int,
                 generator: torch.Generator) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width, bias=False)
        hidden = max(1, width // 4)
        self.encode = nn.Linear(width, hidden, bias=False)
        self.decode = nn.Linear(hidden, width, bias=False)
        for name in ("scale_key", "bias_key"):
            means = (torch.rand(width, generator=generator) * 2 - 1) * mean_range
            self.register_buffer(name, means + sigma * torch.randn(passports, width, generator=generator))

    def _from_key(self, key: torch.Tensor) -> torch.Tensor:
        # mean over the passports of W s: a (1, width) row, then the layer's own autoencoder
        return self.decode(F.leaky_relu(self.encode(self.linear(key).mean(0, keepdim=True))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._from_key(cast(torch.Tensor, self.scale_key)) * self.linear(x) + self._from_key(
            cast(torch.Tensor, self.bias_key))


class PassportBottom(nn.Module):
    """A passive party's bottom model followed by its passport layer (keeps ``out_dim``)."""

    def __init__(self, bottom: nn.Module, layer: PassportLayer) -> None:
        super().__init__()
        self.inner, self.passport = bottom, layer
        self.out_dim = bottom.out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.passport(self.inner(x))


@DEFENSES.register
class FedPass(Defense, ModelWrap):
    name = "fedpass"
    primary = "range"
    defaults = {"range": 50.0, "sigma": 1.0, "passports": 1, "side": "both"}
    ranges = {"range": "≥ 0 (the passports' means are drawn from [−range, range]; 0 = off)", "sigma": "> 0",
              "passports": "≥ 1", "side": "both, active or passive"}
    runs_at = SIDES["both"]
    observes = frozenset({"own_output", "received"})
    # the passive passport changes what is sent; the active one changes the gradients returned
    acts_on = frozenset({MessageKind.ACTIVATION, MessageKind.GRADIENT})
    targets: ClassVar[tuple[str, ...]] = ("mc", "mc-plain", "norm", "direction", "fr", "fr-grn")
    he = "composes: each passport layer is its party's own plaintext model, before encryption or after decryption"

    def validate(self) -> None:
        c = self.config
        _finite("fedpass range", c["range"])
        _finite("fedpass sigma", c["sigma"], 0.0, lo_inclusive=False)
        if int(c["passports"]) != c["passports"] or c["passports"] < 1:
            raise UserError(f"fedpass passports must be a whole number ≥ 1, got {c['passports']}")
        if c["side"] not in SIDES:
            raise UserError(f"fedpass side must be one of {', '.join(SIDES)}, got {c['side']!r}")
        self.runs_at = SIDES[c["side"]] if c["range"] > 0 else frozenset()  # range 0: installed nowhere
        self.at: str | None = None

    def for_party(self, party: str) -> Defense:
        twin = cast(FedPass, super().for_party(party))
        twin.at = party
        return twin

    def _layer(self, width: int) -> PassportLayer:
        c = self.config
        return PassportLayer(width, float(c["range"]), float(c["sigma"]), int(c["passports"]), self.generator)

    def wrap_bottom(self, bottom: nn.Module) -> nn.Module:
        if self.at == ACTIVE:  # the active party's passport sits on the deliveries (wrap_received)
            return bottom
        width = getattr(bottom, "out_dim", None)
        if not isinstance(width, int):
            raise UserError("fedpass: this bottom model does not state its output width")
        return PassportBottom(bottom, self._layer(width))

    def wrap_received(self, passive: str, width: int) -> nn.Module | None:
        return self._layer(width)

    def privacy(self) -> dict:
        return {"epsilon": None, "delta": None, "mechanism": "fedpass", "formal_guarantee": False,
                "protects": "labels (active passports) and features (passive passports) by secret adaptive obfuscation",
                "range": self.config["range"], "side": self.config["side"]}
