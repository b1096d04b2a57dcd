"""``sdar-label``: SDAR's label side (Zhu et al., NDSS 2025, "Passive Inference Attacks on Split
Learning via Adversarial Regularization"; our reading checked against the authors' code,
zhxchd/SDAR_SplitNN, ``src/sdar/sdar.py``), adapted to a passive party of VFL.

The paper's label attack is in U-shaped split learning: client bottom f → server middle g → client
head h, which holds the labels. The server trains a simulator e of f and a simulated head h_s so that
h_s(g(e(x_aux))) predicts the auxiliary labels (cross-entropy on labels flipped at rate 0.1–0.2, the
paper's regulariser for h_s), while an unconditional discriminator keeps e(x_aux) indistinguishable
from the smashed data it receives (weight λ₁ 0.02–0.04, its learning rate λ₁ × the simulator's). The
label of a private row is then h_s(g(z)) on the real smashed data z.

Our VFL roles: the attacker is passive party ``adversary``. Its own bottom model plays g and needs no
simulator (it sees its own input); what it does not know is the active party's side, the head on
[z_A, z_P]. So it trains h_s on its bottom output of ``n_aux`` labeled rows of its own (the
budget ``mc`` gets, drawn by the same rule), with the paper's label flipping, and the adversarial
regularisation moves to what it observes of the unknown head in ordinary training: the gradient the
active party returns for each of its rows. A discriminator sees (bottom output, gradient) pairs, real
ones from the last training epoch's transcript and simulated ones ∂CE(h_s(z_aux), y_aux)/∂z_aux, so
h_s is pushed to have the real head's gradient field on the adversary's embedding. Gradients are
compared by direction and relative size: each side is divided by its median row norm (the real
ones carry the batch-mean 1/B and any defense's scale). The paper trains online at every step; our
attacks run after training, so h_s and the discriminator train ``steps`` steps against the final
bottom model and the last epoch's gradients.

``value``: accuracy (AUC for binary tasks) of h_s on the adversary's training rows minus the aux rows
(at most ``eval_rows``), as ``mc``. Details: ``test`` rows, and ``without_regularization`` (λ₁ 0,
no flipping: a supervised head on the aux rows, the paper's "naive" ablation) from the same draw.
Control: the same pipeline on the same architecture untrained, with Gaussian noise in place of
every received gradient (what the adversary has with no federation).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from attacks.base import ATTACKS, Attack, AttackResult, AttackTarget
from attacks.gradient.cluster import last_epoch
from attacks.gradient.scoring import received_gradient_batches
from attacks.model_completion.mc import draw_aux, reset_parameters
from securevfl.errors import UserError
from securevfl.metrics import headline_score

if TYPE_CHECKING:
    from securevfl.federation import Federation


def embed(bottom: nn.Module, x: torch.Tensor, batch: int = 4096) -> torch.Tensor:
    """The bottom model's output rows (eval mode, no graph)."""
    bottom.eval()
    with torch.no_grad():
        return torch.cat([bottom(x[s:s + batch]).reshape(len(x[s:s + batch]), -1) for s in range(0, len(x), batch)])


def unit_scale(g: torch.Tensor) -> torch.Tensor:
    """Rows divided by the median row norm (direction and relative size kept)."""
    return g / (g.norm(dim=1).median().clamp_min(1e-12))


def flip(y: torch.Tensor, rate: float, n_classes: int, gen: torch.Generator) -> torch.Tensor:
    """The paper's label flipping: each label replaced by a uniform class with probability ``rate``."""
    if rate <= 0:
        return y
    swap = torch.rand(len(y), generator=gen) < rate
    return torch.where(swap, torch.randint(n_classes, y.shape, generator=gen), y)


def train_head(z_aux: torch.Tensor, y_aux: torch.Tensor, z_real: torch.Tensor, g_real: torch.Tensor,
               n_classes: int, cfg: dict, lambda1: float, flip_rate: float, seed: int) -> nn.Module:
    """h_s trained on the aux rows (flipped labels) against a discriminator of (z, gradient) pairs."""
    torch.manual_seed(seed)
    d, hidden = z_aux.shape[1], int(cfg["hidden"])
    mu, sd = z_real.mean(0), z_real.std(0).clamp_min(1e-6)  # its own embedding's scale, a fixed map
    head = nn.Sequential(nn.Linear(d, hidden), nn.ReLU(), nn.Linear(hidden, n_classes))
    model = _Standardised(head, mu, sd)
    disc = nn.Sequential(nn.Linear(2 * d, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, 1))
    opt = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
    opt_d = torch.optim.Adam(disc.parameters(), lr=cfg["lr"] * max(lambda1, 1e-12))
    gen = torch.Generator().manual_seed(seed + 1)
    real = torch.cat([(z_real - mu) / sd, unit_scale(g_real)], 1)
    b = min(int(cfg["batch_size"]), len(z_aux))
    for _ in range(int(cfg["steps"])):
        i = torch.randint(len(z_aux), (b,), generator=gen)
        z = z_aux[i].clone().requires_grad_(True)
        logits = model(z)
        loss = F.cross_entropy(logits, flip(y_aux[i], flip_rate, n_classes, gen))
        fake = None
        if lambda1 > 0:
            # the simulated head's gradient on its input for the true labels, as the active party computes it
            sim = torch.autograd.grad(F.cross_entropy(logits, y_aux[i], reduction="sum"), z, create_graph=True)[0]
            fake = torch.cat([(z.detach() - mu) / sd, unit_scale(sim)], 1)
            loss = loss + lambda1 * F.binary_cross_entropy_with_logits(disc(fake), torch.ones(b, 1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if fake is not None:  # then the discriminator, on real pairs against the simulated ones
            out_r = disc(real[torch.randint(len(real), (b,), generator=gen)])
            out_f = disc(fake.detach())
            loss_d = (F.binary_cross_entropy_with_logits(out_r, torch.ones_like(out_r))
                      + F.binary_cross_entropy_with_logits(out_f, torch.zeros_like(out_f)))
            opt_d.zero_grad(set_to_none=True)
            loss_d.backward()
            opt_d.step()
    return model


class _Standardised(nn.Module):
    mu: torch.Tensor
    sd: torch.Tensor

    def __init__(self, head: nn.Module, mu: torch.Tensor, sd: torch.Tensor) -> None:
        super().__init__()
        self.head = head
        self.register_buffer("mu", mu)
        self.register_buffer("sd", sd)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.head((z - self.mu) / self.sd)


@ATTACKS.register
class SDARLabel(Attack):
    """SDAR's label side: a simulated head on the adversary's bottom output, regularised adversarially
    against the gradients it received."""

    name = "sdar-label"
    kind = "label_inference"
    summary = "SDAR's label side (Zhu et al. 2025): a simulated head, adversarially matched to the received gradients"
    requires = frozenset({"bottom_model", "own_rows", "aux_labels", "transcript", "received_gradients"})
    defaults = {"n_aux": 40, "steps": 600, "batch_size": 64, "lr": 1e-3, "hidden": 64, "lambda1": 0.04,
                "flip_rate": 0.1, "eval_rows": 5000, "control": True, "ablation": True}
    """λ₁ 0.04 and flip rate 0.1: the authors' U-shaped settings for their plain (non-ResNet) network;
    lr 1e-3: their h_s learning rate."""

    @classmethod
    def validate(cls, config: dict) -> None:
        super().validate(config)
        for key in ("n_aux", "steps", "batch_size", "eval_rows", "hidden"):
            if int(config[key]) < 1:
                raise UserError(f"attack {cls.name}: {key} must be ≥ 1, got {config[key]}")
        if not 0 <= config["flip_rate"] < 1 or config["lr"] <= 0:
            raise UserError(f"attack {cls.name}: need 0 ≤ flip_rate < 1 and lr > 0")

    def run(self, target: AttackTarget) -> AttackResult:
        cfg, party = self.config, target.party
        k = cast("Federation", target.federation).n_classes  # the harness hands the trained federation
        if k < 2:
            raise UserError(f"attack {self.name}: needs a classification task")
        pairs = received_gradient_batches(target)
        if not pairs:
            raise UserError(f"attack {self.name}: {target.adversary} received no training gradients")
        g_ids, g_rows = last_epoch(pairs)
        _, aux, eval_ids = draw_aux(self, target, k)  # mc's draw: the same aux rows as mc at the same n_aux
        x = {key: party.features(ids, split) for key, ids, split in
             (("aux", aux, "train"), ("real", g_ids, "train"), ("eval", eval_ids, "train"),
              ("test", party.data.test_ids, "test"))}
        y_aux = torch.from_numpy(target.truth(aux)).long()
        truth = {"eval": target.truth(eval_ids), "test": target.truth(party.data.test_ids)}

        def attack(bottom: nn.Module, grads: np.ndarray, lambda1: float, flip_rate: float) -> tuple[float, float]:
            z = {key: embed(bottom, v) for key, v in x.items()}
            if grads.shape[1] != z["real"].shape[1]:
                raise UserError(f"attack {self.name}: the received gradients have {grads.shape[1]} columns, "
                                f"the bottom output {z['real'].shape[1]}: no cut layer to simulate a head on")
            g = torch.from_numpy(grads).float()
            head = train_head(z["aux"], y_aux, z["real"], g, k, cfg, lambda1, flip_rate, self.seed + 19)
            with torch.no_grad():
                return cast(tuple[float, float], tuple(
                    headline_score(torch.softmax(head(z[key]), 1).numpy(), truth[key], k) for key in ("eval", "test")))

        lam, rate = float(cfg["lambda1"]), float(cfg["flip_rate"])
        value, test = attack(copy.deepcopy(party.bottom), g_rows, lam, rate)
        y_eval = truth["eval"]
        prior = 0.5 if k == 2 else float(np.bincount(y_eval, minlength=k).max() / len(y_eval))
        details: dict = {"test": test, "n_aux": int(len(aux)), "eval_rows": int(len(eval_ids)),
                         "gradient_rows": int(len(g_ids)), "adversary": target.adversary, "params": dict(cfg)}
        if cfg["ablation"]:
            details["without_regularization"], _ = attack(copy.deepcopy(party.bottom), g_rows, 0.0, 0.0)
        control = None
        if cfg["control"]:
            torch.manual_seed(self.seed + 13)
            noise = np.random.default_rng(self.seed + 47).standard_normal(g_rows.shape)
            control, details["control_test"] = attack(reset_parameters(copy.deepcopy(party.bottom)), noise, lam, rate)
            details["control_kind"] = "same attack on the same architecture untrained, noise for the gradients"
        return AttackResult("auc" if k == 2 else "accuracy", value, prior, None, control, details)
