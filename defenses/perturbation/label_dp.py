"""``dp``: label-DP Gaussian mechanism on the gradients the active party returns.

Neighbouring relation: two datasets differ in **one example's label** (replace-one). The returned
rows are gradients of the batch-*mean* loss, so row i is (1/B)·∇ℓ_i; like DP-SGD, clipping and
noise act on the per-example-loss gradient: each row is scaled by B, clipped to L2 norm C, noised,
and scaled back by 1/B (post-processing by the public batch size, so ε is unchanged, and C does
not depend on B). Replacing one label moves one per-example row by at most 2C, so Δ = 2C and the
noise is N(0, (z·Δ)² I) on the whole (B × d) release before the 1/B scaling. One accountant
step per release with ``noise_multiplier = z`` and ``sample_rate = B/N`` (N = the labeled aligned
rows training draws from); with K−1 passive parties each batch is K−1 releases.

ε comes from Opacus's accountants (``rdp`` default, ``prv`` option); δ defaults to 1e-5.
Caveats, also in the privacy report: the accountant assumes Poisson sampling while training uses
shuffled fixed-size batches (the usual approximation); and the active party's own head and bottom
model train on the raw labels — only what leaves the active party is protected.
"""

from __future__ import annotations

import math
import warnings

import torch
from opacus.accountants import PRVAccountant, RDPAccountant
from opacus.accountants.utils import get_noise_multiplier

from defenses.base import Defense, _finite, register_defense
from defenses.functional import clip_per_example, gaussian
from securevfl.channel import MessageKind
from securevfl.errors import UserError
from securevfl.hooks import HookContext

ACCOUNTANTS = {"rdp": RDPAccountant, "prv": PRVAccountant}
CAVEAT = ("label-DP for gradients sent to passive parties only: the active party's own models train on raw labels; "
          "the accountant assumes Poisson sampling, training uses shuffled batches")


@register_defense
class LabelDP(Defense):
    name = "dp"
    primary = "noise"
    params = {"clip": float, "noise": float, "epsilon": float, "delta": float, "accountant": str}
    defaults = {"clip": 1.0, "delta": 1e-5, "accountant": "rdp"}
    acts_on = frozenset({MessageKind.GRADIENT})
    needs_aligned_batches = True  # Δ = 2C per row and sample rate B/N assume one labeled example per row

    def validate(self) -> None:
        c = self.config
        _finite("dp clip", c["clip"], 0.0, lo_inclusive=False)
        if ("noise" in c) == ("epsilon" in c):
            raise UserError("dp needs exactly one of noise=Z (noise multiplier) or epsilon=E (target)")
        if "noise" in c:
            _finite("dp noise", c["noise"])
        else:
            _finite("dp epsilon", c["epsilon"], 0.0, lo_inclusive=False)
        if not 0 < c["delta"] < 1:
            raise UserError(f"dp delta must be in (0, 1), got {c['delta']}")
        if c["accountant"] not in ACCOUNTANTS:
            raise UserError(f"dp accountant must be one of {', '.join(ACCOUNTANTS)}, got {c['accountant']!r}")
        self.noise_multiplier: float | None = c.get("noise")
        self.accountant = ACCOUNTANTS[c["accountant"]]()
        self.sample_rate: float | None = None

    def _calibrate(self, ctx: HookContext) -> None:
        if ctx.sample_rate is None or ctx.planned_releases is None:
            raise RuntimeError("dp with a target epsilon needs the training plan (sample rate, steps)")
        with warnings.catch_warnings():  # opacus warns when the best RDP order is the largest one tried
            warnings.simplefilter("ignore", UserWarning)
            self.noise_multiplier = get_noise_multiplier(
                target_epsilon=self.config["epsilon"], target_delta=self.config["delta"],
                sample_rate=ctx.sample_rate, steps=ctx.planned_releases, accountant=self.config["accountant"])

    def __call__(self, tensor: torch.Tensor, ctx: HookContext) -> torch.Tensor:
        if not ctx.training:
            return tensor
        if self.noise_multiplier is None:
            self._calibrate(ctx)
        z, clip = self.noise_multiplier, self.config["clip"]
        batch = tensor.shape[0]
        out = clip_per_example(tensor * batch, clip)  # per-example-loss gradients, clipped to C
        if z > 0:
            out = out + gaussian(out, z * 2.0 * clip, self.generator)
            self.sample_rate = ctx.sample_rate
            self.accountant.step(noise_multiplier=z, sample_rate=ctx.sample_rate)
        return out / batch

    def steps(self) -> int:
        return sum(n for _, _, n in self.accountant.history)

    def privacy(self) -> dict:
        z, delta = self.noise_multiplier, self.config["delta"]
        if z == 0:
            eps = math.inf
        elif self.steps() == 0:
            eps = 0.0
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                eps = float(self.accountant.get_epsilon(delta=delta))
        return {"epsilon": eps if math.isfinite(eps) else None, "delta": delta, "mechanism": "label-dp-gaussian",
                "formal_guarantee": math.isfinite(eps), "noise_multiplier": z, "sample_rate": self.sample_rate,
                "steps": self.steps(), "accountant": self.config["accountant"], "clip": self.config["clip"],
                "sensitivity": 2.0 * self.config["clip"], "neighbouring": "replace-one-label", "caveat": CAVEAT}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "accountant": self.accountant.state_dict(),
                "noise_multiplier": self.noise_multiplier, "sample_rate": self.sample_rate}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.accountant.load_state_dict(state["accountant"])
        self.noise_multiplier, self.sample_rate = state["noise_multiplier"], state["sample_rate"]
