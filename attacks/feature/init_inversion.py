"""``fr-init``: feature reconstruction by an active party that knows a passive party's *initial
weights*, from the first activations it receives (issue 54).

Threat model (explicit, labelled): the active party knows the passive party's own seed, as a
deployed active party did while passive parties initialised from the run seed it chose (before
issue 54), or as it does when a passive party's ``party --seed`` leaks. With the code, the
configuration and that seed it rebuilds the passive bottom model exactly as it was before the first
step, takes the first training batch's IDs and the released rows it received for them, and inverts
the released function row by row (L-BFGS on the inputs from the all-zero row, i.e. the
standardised mean): no auxiliary rows, no training. Today a passive party draws its seed from the
OS and never sends it, so the adversary of every other attack does not know it; this attack is
what a leaked seed costs.

Scored like ``fr``: R² over the passive party's numeric features of the first batch (images: every
pixel). The **control** runs the same inversion through a bottom model initialised from a seed the
adversary draws itself (what it can do without the passive party's seed); the **prior** is the rows'
mean (R² 0). It applies where the first activation comes from the initial weights (no local or
cross-party pre-training first: ``splitnn``, ``fedud``, ``risa``, ``local-vfl``, ...), with HE off
and numeric or image rows (categorical codes are embedding indices, which a gradient cannot invert).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from attacks.base import ATTACKS, Attack, AttackResult, AttackTarget
from attacks.feature.fr import r2_per_feature
from securevfl.channel import MessageKind
from securevfl.channel.codec import decode_ids, decode_tensor
from securevfl.errors import UserError


def invert_release(bottom: nn.Module, released: np.ndarray, in_shape: tuple[int, ...], interactive: bool,
                   steps: int = 500) -> np.ndarray:
    """The input rows x that best explain ``released`` = t(bottom(x)) (t = tanh under the interactive
    layer, the identity otherwise): L-BFGS on ||t(bottom(x)) − released||² from x = 0.

    Returns:
        The reconstructed rows, flattened (n, prod(in_shape))."""
    bottom = bottom.eval()
    target = torch.as_tensor(released, dtype=torch.float32)
    if interactive:  # tanh's range: keep the target inside it so that atanh-like steps stay finite
        target = target.clamp(-1 + 1e-6, 1 - 1e-6)
    x = torch.zeros(len(released), *in_shape, requires_grad=True)
    opt = torch.optim.LBFGS([x], lr=1.0, max_iter=steps, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        z = bottom(x)
        out = torch.tanh(z) if interactive else z
        loss = ((out - target) ** 2).sum()
        loss.backward()
        return loss

    for p in bottom.parameters():
        p.requires_grad_(False)
    opt.step(closure)  # type: ignore[arg-type]
    return x.detach().reshape(len(released), -1).numpy()


def first_training_batch(transcript: list, active: str, passive: str) -> tuple[np.ndarray, np.ndarray]:
    """The IDs of the first batch the active party sent ``passive`` and the first activation message it
    received back (both from the active party's own view of the channel)."""
    ids = next((m for m in transcript if m.src == active and m.dst == passive and m.kind == MessageKind.BATCH_IDS),
               None)
    act = next((m for m in transcript if m.src == passive and m.dst == active and m.kind == MessageKind.ACTIVATION),
               None)
    if ids is None or act is None:
        raise UserError(f"attack fr-init: the active party received no activation from {passive}")
    return decode_ids(ids.payload), decode_tensor(act.payload).numpy().reshape(len(decode_ids(ids.payload)), -1)


@ATTACKS.register
class InitialWeightsInversion(Attack):
    name = "fr-init"
    summary = ("feature reconstruction from the first activations by an active party that knows the passive "
               "party's own seed (its initial weights): no auxiliary rows")
    threat_model = "active"
    kind = "feature_reconstruction"
    requires = frozenset({"passive_messages"})
    defaults = {"knows_seed": True, "steps": 500}

    def run(self, target: AttackTarget) -> AttackResult:
        from securevfl.federation import fresh_bottom
        from securevfl.models import for_head

        fed = target.federation
        if fed.cut.name != "off":
            raise UserError("attack fr-init inverts released rows: it needs --he off (under HE the active party "
                            "receives no passive activation)")
        victim = next(p for p in target.partition.parties if p.name == target.adversary)  # ground truth
        if target.partition.kind != "image" and victim.cardinalities:
            raise UserError("attack fr-init inverts numeric rows only (categorical codes are embedding indices)")
        assert target.method is not None  # the harness hands every attack the trained method
        ctx = target.method.ctx
        ids, released = first_training_batch(fed.channel.transcript, fed.active.name, target.adversary)
        model = for_head(ctx.model, fed.n_classes)
        party = fed.party(target.adversary)
        # what the adversary knows under this threat model: the passive party's own seed; the control
        # draws one of its own
        known = party.own_seed if self.config["knows_seed"] else int(self.seed) + 7_777_777
        guess = int(self.seed) + 7_777_777 if self.config["knows_seed"] else int(self.seed) + 8_888_888
        interactive = fed.cut.interactive
        steps = int(self.config["steps"])
        pred = invert_release(fresh_bottom(victim, model, known), released, victim.feature_shape, interactive, steps)
        ctrl = invert_release(fresh_bottom(victim, model, guess), released, victim.feature_shape, interactive, steps)
        truth = victim.rows(ids, "train").reshape(len(ids), -1).astype(np.float64)
        value, control = r2_per_feature(pred, truth), r2_per_feature(ctrl, truth)
        # leakage against the better of the control and the mean (an inversion can land far below the mean)
        return AttackResult("r2", value, 0.0, baseline=0.0, control=control,
                            details={"rows_scored": int(len(ids)), "knows_seed": bool(self.config["knows_seed"]),
                                     "observes": "the first released rows t and the initial weights"})
