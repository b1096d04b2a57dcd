"""``mc``, ``mc-plain`` and ``mc-active``: passive model completion (Fu et al. 2022).

The adversary (a passive party) appends a head (BN → ReLU → Linear) to a copy of its trained
bottom model and trains the completed model on ``n_aux`` labeled rows of its own, drawn balanced
by class:

* ``mc``: MixMatch on the adversary's other rows (T 0.8, α 0.75, λ_u 50 with a linear ramp-up,
  K = 2 augmentations, EMA 0.999 of the weights for inference), bottom and head both trained;
* ``mc-plain``: supervised training of the head on the aux rows, bottom frozen;
* ``mc-active``: during VFL training the adversary scales each element of its local update by
  r = clamp(1 + γ·g_t / (g_{t−1} + 1e-7), 1, 5) (Fu et al.'s malicious local optimizer), then ``mc``.

Label inference is scored on the adversary's training rows (minus the aux rows, at most
``eval_rows``) — the headline ``value`` — and on test rows (``test``): accuracy for multi-class
tasks, AUC for binary ones. Beside every result: the prior (majority-class accuracy, or AUC 0.5)
and the local-SSL baseline: the same attack on an encoder of the same architecture that the
adversary pre-trained alone with SimSiam on its own rows (``baseline_ssl_epochs`` 5 epochs over at
most ``baseline_rows`` 10,000 of them, to bound the cost). ``leakage`` = value − baseline is what the
federation leaked beyond what the adversary could learn alone.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score
from torch import nn

from attacks.base import Attack, AttackResult, AttackTarget, register_attack
from attacks.model_completion.mixmatch import linear_rampup, mixup, sharpen, soft_cross_entropy
from securevfl.errors import UserError
from securevfl.ssl import SSLConfig, make_augmentation, make_objective, pretrain_local


def balanced_draw(ids: np.ndarray, y: np.ndarray, n: int, n_classes: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` ids, as equal a share per class as the data allows."""
    per, out = max(1, n // n_classes), []
    for c in range(n_classes):
        pool = ids[y == c]
        out.append(rng.choice(pool, size=min(per, len(pool)), replace=False))
    chosen = np.concatenate(out)
    if len(chosen) < n:  # top up from any class
        rest = np.setdiff1d(ids, chosen)
        chosen = np.concatenate([chosen, rng.choice(rest, size=min(n - len(chosen), len(rest)), replace=False)])
    return chosen


def reset_parameters(model: nn.Module) -> nn.Module:
    for m in model.modules():
        if hasattr(m, "reset_parameters") and m is not model:
            m.reset_parameters()
    return model


def score(probs: np.ndarray, y: np.ndarray, n_classes: int) -> float:
    if n_classes == 2:
        return float(roc_auc_score(y, probs[:, 1])) if len(np.unique(y)) == 2 else float("nan")
    return float((probs.argmax(1) == y).mean())


class Completed(nn.Module):
    def __init__(self, bottom: nn.Module, d: int, n_classes: int) -> None:
        super().__init__()
        self.bottom = bottom
        self.head = nn.Sequential(nn.BatchNorm1d(d), nn.ReLU(), nn.Linear(d, n_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.bottom(x))


@register_attack
class ModelCompletion(Attack):
    name = "mc"
    requires = frozenset({"bottom_model", "own_rows", "aux_labels"})
    params = {"n_aux": 40, "steps": 300, "batch_size": 64, "lr": 2e-3, "T": 0.8, "alpha": 0.75, "lambda_u": 50.0,
              "ema": 0.999, "eval_rows": 5000, "baseline": True, "baseline_ssl_epochs": 5,
              "baseline_rows": 10000}
    mixmatch = True

    # ------------------------------------------------------------------------------------ harness
    def run(self, target: AttackTarget) -> AttackResult:
        cfg, party = self.config, target.party
        n_classes = target.federation.n_classes
        rng = np.random.default_rng(self.seed + 11)
        train_ids = party.data.train_ids
        y_train = target.truth(train_ids)
        known = y_train >= 0
        if known.sum() <= cfg["n_aux"]:
            raise UserError(f"attack {self.name}: the adversary has {int(known.sum())} rows with known labels, "
                            f"need more than n_aux={cfg['n_aux']}")
        aux = balanced_draw(train_ids[known], y_train[known], int(cfg["n_aux"]), n_classes, rng)
        rest = np.setdiff1d(train_ids[known], aux)
        eval_ids = rng.choice(rest, size=min(len(rest), int(cfg["eval_rows"])), replace=False)
        unl_ids = np.setdiff1d(train_ids, aux)
        data = {
            "aux": (party.features(aux, "train"), torch.from_numpy(target.truth(aux))),
            "unl": party.features(unl_ids, "train"),
            "eval_train": (party.features(eval_ids, "train"), target.truth(eval_ids)),
            "eval_test": (party.features(party.data.test_ids, "test"), target.truth(party.data.test_ids)),
        }
        kind = "image" if party.data.X_train.ndim == 3 else "tabular"
        aug = make_augmentation(kind, party.data.X_train, party.data.n_numeric, 0.3)
        d = party.bottom.out_dim
        fed_train, fed_test = self._complete_and_score(copy.deepcopy(party.bottom), d, n_classes, data, aug)
        y_eval = data["eval_train"][1]
        prior = 0.5 if n_classes == 2 else float(np.bincount(y_eval, minlength=n_classes).max() / len(y_eval))
        details = {"train": fed_train, "test": fed_test, "n_aux": int(len(aux)), "eval_rows": int(len(eval_ids)),
                   "adversary": target.adversary, "attack": "mixmatch" if self.mixmatch else "supervised",
                   "encoder": getattr(target.federation, "meta", {}).get("attacked_encoder", "bottom model")}
        baseline = None
        if cfg["baseline"]:
            local = reset_parameters(copy.deepcopy(party.bottom))
            ssl = SSLConfig(epochs=int(cfg["baseline_ssl_epochs"]), batch_size=256)
            torch.manual_seed(self.seed + 13)
            X = party.data.X_train  # bounded so the baseline costs minutes, not tens of minutes, on 60k rows
            if len(X) > int(cfg["baseline_rows"]):
                X = X[rng.choice(len(X), size=int(cfg["baseline_rows"]), replace=False)]
            pretrain_local(make_objective(local, ssl), X, aug, self.seed + 17)
            baseline, base_test = self._complete_and_score(local, d, n_classes, data, aug)
            details.update(baseline_test=base_test, leakage=fed_train - baseline)
        return AttackResult("auc" if n_classes == 2 else "accuracy", fed_train, prior, baseline, details)

    # ------------------------------------------------------------------------------------- attack
    def _complete_and_score(self, bottom: nn.Module, d: int, n_classes: int, data: dict, aug) -> tuple[float, float]:
        torch.manual_seed(self.seed + 19)
        model = Completed(bottom, d, n_classes)
        train_bottom = self.mixmatch
        for p in model.bottom.parameters():
            p.requires_grad_(train_bottom)
        ema = copy.deepcopy(model)
        for p in ema.parameters():
            p.requires_grad_(False)
        opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=self.config["lr"])
        (x_aux, y_aux), x_unl = data["aux"], data["unl"]
        gen = torch.Generator().manual_seed(self.seed + 23)
        rng = np.random.default_rng(self.seed + 29)
        steps = int(self.config["steps"])
        for step in range(steps):
            model.train()
            if self.mixmatch:
                loss = self._mixmatch_loss(model, x_aux, y_aux, x_unl, n_classes, aug, gen, rng, step, steps)
            else:
                loss = F.cross_entropy(model(x_aux), y_aux)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            with torch.no_grad():  # EMA of weights (warm-up so short runs are not dominated by the init)
                decay = min(self.config["ema"], (1 + step) / (10 + step)) if self.mixmatch else 0.0
                for e, m in zip(ema.parameters(), model.parameters(), strict=True):
                    e.mul_(decay).add_(m.detach(), alpha=1 - decay)
                for e, m in zip(ema.buffers(), model.buffers(), strict=True):
                    e.copy_(m)
        ema.eval()
        with torch.no_grad():
            out = []
            for key in ("eval_train", "eval_test"):
                x, y = data[key]
                probs = torch.cat([torch.softmax(ema(x[s:s + 4096]), 1) for s in range(0, len(x), 4096)]).numpy()
                out.append(score(probs, y, n_classes))
        return out[0], out[1]

    def _mixmatch_loss(self, model, x_aux, y_aux, x_unl, n_classes, aug, gen, rng, step, steps) -> torch.Tensor:
        cfg = self.config
        b = min(int(cfg["batch_size"]), len(x_aux))
        li = torch.from_numpy(rng.choice(len(x_aux), size=b, replace=len(x_aux) < b))
        ui = torch.from_numpy(rng.choice(len(x_unl), size=b, replace=len(x_unl) < b))
        xl, yl = aug(x_aux[li], gen), F.one_hot(y_aux[li], n_classes).float()
        u1, u2 = aug(x_unl[ui], gen), aug(x_unl[ui], gen)
        with torch.no_grad():
            q = sharpen((torch.softmax(model(u1), 1) + torch.softmax(model(u2), 1)) / 2, cfg["T"])
        xs, ys = mixup(torch.cat([xl, u1, u2]), torch.cat([yl, q, q]), cfg["alpha"], rng, gen)
        logits = model(xs)
        loss_x = soft_cross_entropy(logits[:b], ys[:b])
        loss_u = F.mse_loss(torch.softmax(logits[b:], 1), ys[b:])
        return loss_x + cfg["lambda_u"] * linear_rampup(step, steps) * loss_u


@register_attack
class ModelCompletionPlain(ModelCompletion):
    name = "mc-plain"
    mixmatch = False


class MaliciousUpdate:
    """Fu et al.'s malicious local optimizer as a local-update hook: scale each gradient element by
    r = clamp(1 + γ·g_t / (g_{t−1} + 1e-7), 1, 5) before the party's own optimizer steps."""

    def __init__(self, gamma: float) -> None:
        self.gamma = gamma
        self.prev: dict[int, torch.Tensor] = {}
        self.calls = 0

    @torch.no_grad()
    def __call__(self, params: list[nn.Parameter]) -> None:
        self.calls += 1
        for p in params:
            if p.grad is None:
                continue
            g = p.grad.detach().clone()
            prev = self.prev.get(id(p))
            if prev is not None and prev.shape == g.shape:
                p.grad.mul_(torch.clamp(1 + self.gamma * g / (prev + 1e-7), 1.0, 5.0))
            self.prev[id(p)] = g


@register_attack
class ModelCompletionActive(ModelCompletion):
    name = "mc-active"
    during_training = True
    params = {**ModelCompletion.params, "gamma": 1.0}

    def prepare(self, federation, adversary: str) -> None:
        self.hook = MaliciousUpdate(float(self.config["gamma"]))
        federation.party(adversary).update_hooks.append(self.hook)

    def run(self, target: AttackTarget) -> AttackResult:
        result = super().run(target)
        result.details["malicious_updates"] = self.hook.calls
        return result
