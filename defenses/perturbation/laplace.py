"""``laplace``: i.i.d. Laplace noise of scale b on every coordinate of the returned gradients
(``on=gradients``, at the active party) or of the passive parties' cut-layer activations
(``on=activations``, at each passive party), beside ISO / ``noise`` (Gaussian). VFLAIR's LaplaceDP
(``dp_strength`` = b) also clips each batch to a largest row norm of 0.2 first; ``clip=C`` does
that here (0: no clipping, the default).

No ε: the messages are not clipped per coordinate to a public bound before the noise (and with
``clip`` the bound is on the L2 norm, while Laplace noise calibrates to an L1 sensitivity), the
same rows are released every epoch and the models are trained on the exact values, so no bound
over the run holds. The privacy report says ε = n/a.
"""

from __future__ import annotations

import torch

from defenses.base import DEFENSES, Defense, _finite
from defenses.functional import per_example_norms
from securevfl.channel import MessageKind
from securevfl.devices import noise_like
from securevfl.errors import UserError
from securevfl.hooks import HookContext, MessageTransform
from securevfl.roles import ACTIVE, PASSIVE

KINDS = {"gradients": MessageKind.GRADIENT, "activations": MessageKind.ACTIVATION}


@DEFENSES.register
class Laplace(Defense, MessageTransform):
    name = "laplace"
    primary = "b"
    defaults = {"b": 1e-3, "on": "gradients", "clip": 0.0}
    ranges = {"b": "≥ 0, the Laplace scale (0: off)", "on": "gradients (active party) or activations (passive)",
              "clip": "≥ 0, largest row L2 norm before the noise (0: none)"}
    acts_on = frozenset({MessageKind.GRADIENT})  # the class default; validate() sets the instance's
    runs_at = frozenset({ACTIVE, PASSIVE})  # each party acts on the kind it sends (acts_on)
    targets = ("norm", "direction")  # on=activations is the Laplace sibling of `noise` (fr); not measured here
    he = ("composes: the sender adds the noise to the plaintext (g = ∂L/∂a_P at the active party, z before "
          "encryption at a passive party)")

    def validate(self) -> None:
        _finite("laplace b", self.config["b"])
        _finite("laplace clip", self.config["clip"])
        if self.config["on"] not in KINDS:
            raise UserError(f"laplace on must be one of {', '.join(KINDS)}, got {self.config['on']!r}")
        self.acts_on = frozenset({KINDS[self.config["on"]]})

    def __call__(self, tensor: torch.Tensor, ctx: HookContext) -> torch.Tensor:
        b = self.config["b"]
        if b == 0 or (ctx.kind == MessageKind.GRADIENT and not ctx.training):
            return tensor
        if self.config["clip"] > 0 and len(tensor):  # VFLAIR: scale the batch so its largest row is ≤ clip
            tensor = tensor / (per_example_norms(tensor).max() / self.config["clip"]).clamp(min=1.0)
        # inverse-CDF draw from the defense's own generator: b · sign(w) · −log(1 − 2|w|), w ~ U(−½, ½)
        w = torch.rand(tensor.shape, generator=self.generator, dtype=torch.float64) - 0.5
        noise = -b * torch.sign(w) * torch.log1p(-2 * w.abs())
        return tensor + noise_like(noise.to(tensor.dtype), tensor)

    def privacy(self) -> dict:
        return {"epsilon": None, "delta": None, "mechanism": "laplace", "formal_guarantee": False,
                "note": "no per-coordinate sensitivity bound: no ε", "b": self.config["b"], "on": self.config["on"]}
