"""``gradperturb``: label perturbation of the returned gradients (Yang et al. 2022, "Differentially
Private Label Protection in Split Learning", in VFLAIR's reading ``GradPerturb``).

For each example i of a training batch, with g_i^c the gradient the passive party would receive if
i's label were c (c = 1 … K), the active party returns g̃_i = g_i^{y_i} + Σ_c u_ic g_i^c with
u_ic ~ Laplace(2/ε) i.i.d.: the released row is a public function of the coefficient vector
e_{y_i} + u_i, which has L1 sensitivity 2 under replacing i's label, so one release is ε-DP *given
the model*. With softmax cross-entropy, g_i^c = J_iᵀ(p_i − e_c)/B (J_i the head's Jacobian at i,
p_i its softmax, B the batch), so Σ_c u_ic g_i^c = J_iᵀ((Σ_c u_ic) p_i − u_i)/B: one extra
vector-Jacobian product through the head, computed by autograd on this step's graph. The active
party's own parameter update uses the exact gradient (as in VFLAIR: it does not perturb itself).

Why ``epsilon`` is null (no run-level ε is claimed): the per-release bound holds only for a fixed
model, but the model that shapes every g_i^c (and that the passive party later uses) is trained on
the true labels without noise, and each example is released once per epoch; no true bound over
the run follows. The privacy report gives the per-release ε as ``per_release_epsilon``.

Reading where the paper leaves it open for our heads: the head's output must be the logits of a
softmax cross-entropy (every supervised method here; the method's head must run once per step,
otherwise the step refuses). ``epsilon=inf`` is off.
"""

from __future__ import annotations

import math
from typing import cast

import torch
from torch import nn

from defenses.base import DEFENSES, Defense
from securevfl.channel import MessageKind
from securevfl.devices import noise_like
from securevfl.errors import UserError
from securevfl.hooks import ActiveStep, ModelWrap, Objective, StepGradients
from securevfl.roles import ACTIVE


class _Recorder(nn.Module):
    """The identity, appended to the head: keeps the training outputs (logits, with their graph)."""

    def __init__(self) -> None:
        super().__init__()
        self.outputs: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.requires_grad:
            self.outputs.append(x)
        return x


@DEFENSES.register
class GradPerturb(Defense, ActiveStep, ModelWrap):
    name = "gradperturb"
    primary = "epsilon"
    defaults = {"epsilon": 1.0}
    ranges = {"epsilon": "> 0, per-release ε; Laplace scale 2/ε (inf: off)"}
    acts_on = frozenset({MessageKind.GRADIENT})
    runs_at = frozenset({ACTIVE})  # it needs the head's Jacobian and outputs: the active party's own
    observes = frozenset({"messages", "received"})
    needs_aligned_batches = True  # one labeled example per returned row
    targets = ("norm", "direction")
    he = ("composes: the perturbation is added to the plaintext g = ∂L/∂a_P before the encrypted backward "
          "(the Jacobian is the head's, which the active party holds)")
    heads_note = "softmax cross-entropy heads (the per-class gradients assume it); the head runs once per step"

    def validate(self) -> None:
        eps = self.config["epsilon"]
        if not eps > 0:  # inf is allowed (off); nan fails here too
            raise UserError(f"gradperturb epsilon must be > 0 (inf: off), got {eps}")
        self._recorder: _Recorder | None = None

    def wrap_head(self, head: nn.Module) -> nn.Module:
        if math.isinf(self.config["epsilon"]):
            return head  # off: the head is not touched (bit-identical to no defense)
        self._recorder = _Recorder()
        # a Sequential keeps head[0] the first linear layer that the HE interactive layer splits
        layers = list(head) if isinstance(head, nn.Sequential) else [head]
        return nn.Sequential(*layers, self._recorder)

    def arm(self, modules: list[nn.Module]) -> None:
        if self._recorder is not None:
            self._recorder.outputs.clear()

    def gradients(self, objective: Objective, params: list[nn.Parameter], received: list[torch.Tensor]
                  ) -> StepGradients:
        loss = objective.check(objective.mean())
        if self._recorder is None:
            loss.backward()
            return StepGradients(loss, [q.grad for q in params], cast(list[torch.Tensor], [r.grad for r in received]))
        outs = self._recorder.outputs
        if len(outs) != 1:
            raise UserError(f"gradperturb needs the head to run once per training step; this method ran it "
                            f"{len(outs)} times")
        logits = outs[0]
        loss.backward(retain_graph=True)  # the exact gradients: the active party's own update
        # every received input is a leaf that requires grad in training and feeds the head
        rows = [cast(torch.Tensor, r.grad).clone() for r in received]
        probs = torch.softmax(logits.detach(), dim=1)
        scale = 2.0 / self.config["epsilon"]
        w = torch.rand(probs.shape, generator=self.generator, dtype=torch.float64) - 0.5
        u = noise_like((-scale * torch.sign(w) * torch.log1p(-2 * w.abs())).to(probs.dtype), probs)  # Laplace(2/ε)
        direction = (u.sum(1, keepdim=True) * probs - u) / len(logits)  # Σ_c u_c (p − e_c), batch-mean scaled
        extra = torch.autograd.grad(logits, received, grad_outputs=direction, allow_unused=True)
        rows = [r if e is None else r + e for r, e in zip(rows, extra, strict=True)]
        outs.clear()
        return StepGradients(loss, [q.grad for q in params], rows)

    def privacy(self) -> dict:
        return {"epsilon": None, "delta": None, "mechanism": "gradperturb", "formal_guarantee": False,
                "per_release_epsilon": self.config["epsilon"],
                "note": "ε-DP per release for a fixed model only; the model is trained on the true labels and "
                        "each example is released every epoch, so no bound over the run is claimed"}
