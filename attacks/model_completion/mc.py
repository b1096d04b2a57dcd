"""Model completion (Fu et al. 2022, "Label Inference Attacks Against Vertical Federated
Learning"): the passive adversary appends a head (BN → ReLU → Linear) to a copy of its trained bottom
model and trains it on ``n_aux`` labeled rows of its own, drawn balanced by class:

* ``mc`` (default): MixMatch on the adversary's other rows (T 0.8, α 0.75, λ_u 50 with a linear
  ramp-up, K = 2 augmentations, EMA 0.999 of the weights for inference), the head trained on the
  frozen encoder the federation produced (``bottom_lr`` 0);
* ``mc-full``: the same MixMatch fine-tuning the bottom model too (encoder-blind at this budget);
* ``mc-plain``: supervised training of the head on the aux rows, bottom frozen;
* ``mc-active``: during VFL training the adversary steps its bottom model with its own malicious
  optimizer (:class:`MaliciousSGD`), whatever the federation's optimizer, then ``mc``.

Label inference is scored on the adversary's training rows (minus the aux rows, at most
``eval_rows``) — the headline ``value`` — and on test rows (``test``): accuracy for multi-class
tasks, AUC for binary ones. Beside every result: the prior (majority-class accuracy, or
AUC 0.5); the control, the same attack with the same budget on the same architecture at random
initialisation (what the adversary has with no federation); and the local-SSL baseline, the same
attack on an encoder of the same architecture that the adversary pre-trains alone with SimSiam on
all its own rows, as many epochs as the federation's own SSL stage (``FALLBACK_SSL_EPOCHS`` for
methods without one). ``leakage`` = value − max(control, baseline).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from attacks.base import ATTACKS, Attack, AttackResult, AttackTarget
from attacks.model_completion.mixmatch import linear_rampup, mixup, sharpen
from securevfl.errors import UserError
from securevfl.metrics import headline_score
from securevfl.models import reset_parameters as reset_model
from securevfl.models import soft_cross_entropy
from securevfl.ssl import SSLConfig, make_augmentation, make_objective, pretrain_local

if TYPE_CHECKING:
    from securevfl.federation import Federation


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


def draw_aux(attack: Attack, target: AttackTarget, n_classes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(training ids, ``n_aux`` labeled aux rows drawn balanced, at most ``eval_rows`` other labeled rows
    to score on): the adversary's labeled budget, the same draw for every attack with the same seed.

    Raises:
        UserError: no more labeled rows than ``n_aux``."""
    cfg, party = attack.config, target.party
    rng = np.random.default_rng(attack.seed + 11)
    train_ids = party.data.train_ids
    y_train = target.truth(train_ids)
    known = y_train >= 0
    if known.sum() <= cfg["n_aux"]:
        raise UserError(f"attack {attack.name}: the adversary has {int(known.sum())} rows with known labels, "
                        f"need more than n_aux={cfg['n_aux']}")
    aux = balanced_draw(train_ids[known], y_train[known], int(cfg["n_aux"]), n_classes, rng)
    rest = np.setdiff1d(train_ids[known], aux)
    return train_ids, aux, rng.choice(rest, size=min(len(rest), int(cfg["eval_rows"])), replace=False)


def reset_parameters(model: nn.Module) -> nn.Module:
    """The architecture as built, never trained (the MC control): refuses a module it cannot reset."""
    return reset_model(model, include_root=False, strict=True)


def score(probs: np.ndarray, y: np.ndarray, n_classes: int) -> float:
    return headline_score(probs, y, n_classes)


class Completed(nn.Module):
    """The adversary's bottom model with an inference head (Fu et al.'s BottomModelPlus with one
    layer: BN → ReLU → Linear). A frozen bottom runs in eval mode without autograd."""

    def __init__(self, bottom: nn.Module, d: int, n_classes: int, train_bottom: bool) -> None:
        super().__init__()
        self.bottom = bottom
        self.train_bottom = train_bottom
        self.head = nn.Sequential(nn.BatchNorm1d(d), nn.ReLU(), nn.Linear(d, n_classes))
        for p in bottom.parameters():
            p.requires_grad_(train_bottom)

    def train(self, mode: bool = True) -> Completed:
        super().train(mode)
        self.bottom.train(mode and self.train_bottom)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.set_grad_enabled(self.train_bottom and torch.is_grad_enabled()):
            z = self.bottom(x)
        return self.head(z)


FALLBACK_SSL_EPOCHS = 10
"""Local-SSL baseline length when the federation had no SSL stage to match (the library's default
SSL stage, ``ssl_epochs`` of fedhssl / fedlocal-*)."""


@ATTACKS.register
class ModelCompletion(Attack):
    name = "mc"
    kind = "label_inference"
    summary = "model completion (Fu et al.): a head on the frozen trained bottom, n_aux labels + MixMatch"
    requires = frozenset({"bottom_model", "own_rows", "aux_labels"})
    # Budget (Fu et al. 2022, their public code FuChong-cyber/label-inference-attacks,
    # Code/model_completion.py): Adam lr 2e-3, MixMatch T 0.8, α 0.75, λ_u 50, EMA 0.999, head
    # BottomModelPlus(num_layer=1), batch 16, val_iteration 1024 × 5–10 epochs. They fine-tune the
    # bottom model with the head on CIFAR/CINIC/Yahoo and freeze it on Criteo. Fine-tuning the whole
    # bottom for our 300 steps reaches the same accuracy from a random start (issue 17: trained 0.645
    # vs random-init 0.642 on Fashion-MNIST), i.e. it measures the adversary's own features, not what
    # the federation taught its encoder. The default therefore follows their frozen-bottom variant
    # (``bottom_lr`` 0: the head alone learns, on the encoder the federation trained); the full
    # fine-tune is ``mc-full``.
    defaults = {"n_aux": 40, "steps": 300, "batch_size": 64, "lr": 2e-3, "bottom_lr": 0.0, "T": 0.8, "alpha": 0.75,
              "lambda_u": 50.0, "ema": 0.999, "eval_rows": 5000, "control": True, "baseline": True,
              "baseline_ssl_epochs": 0, "baseline_rows": 0}
    """``bottom_lr`` 0 freezes the bottom; ``baseline_ssl_epochs`` 0 = as long as the federation's SSL
    stage (``FALLBACK_SSL_EPOCHS`` without one); ``baseline_rows`` 0 = all the adversary's rows."""
    mixmatch = True

    @classmethod
    def validate(cls, config: dict) -> None:
        super().validate(config)
        for key in ("n_aux", "steps", "batch_size", "eval_rows"):
            if int(config[key]) < 1:
                raise UserError(f"attack {cls.name}: {key} must be ≥ 1, got {config[key]}")
        if not 0 < config["T"] <= 1 or not 0 <= config["ema"] < 1 or config["lr"] <= 0:
            raise UserError(f"attack {cls.name}: need 0 < T ≤ 1, 0 ≤ ema < 1 and lr > 0")

    # ------------------------------------------------------------------------------------ harness
    def run(self, target: AttackTarget) -> AttackResult:
        cfg, party = self.config, target.party
        n_classes = cast("Federation", target.federation).n_classes  # the harness hands the trained federation
        train_ids, aux, eval_ids = draw_aux(self, target, n_classes)
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

        def attack(bottom: nn.Module) -> tuple[float, float]:
            return self._complete_and_score(bottom, d, n_classes, data, aug)

        fed_train, fed_test = attack(copy.deepcopy(party.bottom))
        y_eval = data["eval_train"][1]
        prior = 0.5 if n_classes == 2 else float(np.bincount(y_eval, minlength=n_classes).max() / len(y_eval))
        details = {"train": fed_train, "test": fed_test, "n_aux": int(len(aux)), "eval_rows": int(len(eval_ids)),
                   "adversary": target.adversary, "attack": "mixmatch" if self.mixmatch else "supervised",
                   "finetunes": "bottom and head" if cfg["bottom_lr"] > 0 else "head (bottom frozen)",
                   "encoder": getattr(target.federation, "meta", {}).get("attacked_encoder", "bottom model"),
                   "params": dict(cfg)}
        control = baseline = None
        if cfg["control"]:
            # what the adversary has with no federation: the same architecture, never trained
            torch.manual_seed(self.seed + 13)
            control, details["control_test"] = attack(reset_parameters(copy.deepcopy(party.bottom)))
            details["control_kind"] = "same attack on the same architecture, untrained"
        if cfg["baseline"]:
            baseline, details["baseline_test"], details["baseline_ssl"] = self._baseline(target, aug, attack)
        return AttackResult("auc" if n_classes == 2 else "accuracy", fed_train, prior, baseline, control, details)

    def _baseline(self, target: AttackTarget, aug, attack) -> tuple[float, float, dict]:
        """The same attack on an encoder of the same architecture that the adversary pre-trains alone
        with SimSiam on its own rows, as long as the federation's own SSL stage."""
        cfg, party = self.config, target.party
        epochs = int(cfg["baseline_ssl_epochs"]) or target.ssl_epochs or FALLBACK_SSL_EPOCHS
        key = ("local-ssl", epochs, int(cfg["baseline_rows"]), self.seed)
        if key not in target.cache:  # one pre-training per run, whichever MC variants use it
            torch.manual_seed(self.seed + 13)
            local = reset_parameters(copy.deepcopy(party.bottom))
            X = party.data.X_train
            if cfg["baseline_rows"] and len(X) > int(cfg["baseline_rows"]):
                X = X[np.random.default_rng(self.seed + 41).choice(len(X), size=int(cfg["baseline_rows"]),
                                                                     replace=False)]
            pretrain_local(make_objective(local, SSLConfig(epochs=epochs, batch_size=256)), X, aug, self.seed + 17)
            target.cache[key] = (local, len(X))
        local, n_rows = target.cache[key]
        local = copy.deepcopy(local)
        value, test = attack(local)
        return value, test, {"epochs": epochs, "rows": int(n_rows), "objective": "simsiam"}

    # ------------------------------------------------------------------------------------- attack
    def _complete_and_score(self, bottom: nn.Module, d: int, n_classes: int, data: dict, aug) -> tuple[float, float]:
        cfg = self.config
        torch.manual_seed(self.seed + 19)
        model = Completed(bottom, d, n_classes, train_bottom=cfg["bottom_lr"] > 0)
        ema = copy.deepcopy(model)
        for p in ema.parameters():
            p.requires_grad_(False)
        groups = [{"params": list(model.head.parameters()), "lr": cfg["lr"]}]
        if model.train_bottom:
            groups.append({"params": list(model.bottom.parameters()), "lr": cfg["bottom_lr"]})
        opt = torch.optim.Adam(groups)
        (x_aux, y_aux), x_unl = data["aux"], data["unl"]
        gen = torch.Generator().manual_seed(self.seed + 23)
        rng = np.random.default_rng(self.seed + 29)
        steps = int(cfg["steps"])
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
                decay = min(cfg["ema"], (1 + step) / (10 + step)) if self.mixmatch else 0.0
                for e, m in zip(ema.parameters(), model.parameters(), strict=True):
                    e.mul_(decay).add_(m.detach(), alpha=1 - decay)
                for e_buf, m_buf in zip(ema.buffers(), model.buffers(), strict=True):
                    e_buf.copy_(m_buf)
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


@ATTACKS.register
class ModelCompletionFull(ModelCompletion):
    """MixMatch fine-tuning the whole completed model (bottom at the head's lr): Fu et al.'s setting
    on image data; with a small step budget it is encoder-blind (see ``mc``)."""

    name = "mc-full"
    defaults = {**ModelCompletion.defaults, "bottom_lr": 2e-3}


@ATTACKS.register
class ModelCompletionPlain(ModelCompletion):
    """Supervised training of the head on the aux rows alone, bottom frozen (no MixMatch)."""

    name = "mc-plain"
    mixmatch = False


def malicious_ratio(d: torch.Tensor, prev: torch.Tensor, gamma: float) -> torch.Tensor:
    """Fu et al.'s per-element update scaling r = clamp(1 + γ·d_t / (d_{t−1} + 1e-7), 1, 5)."""
    return torch.clamp(1 + gamma * d / (prev + 1e-7), 1.0, 5.0)


class MaliciousSGD:
    """Fu et al.'s malicious local optimizer (their ``my_optimizers.MaliciousSGD``): SGD with momentum
    whose update direction is scaled per element by :func:`malicious_ratio` against the previous
    (scaled) direction, so the adversary's bottom model learns faster than the federation intends.
    It replaces the adversary's optimizer step, whatever optimizer the federation chose.

    ``lr`` is a callable so the adversary can follow the learning rate it is told (``lr_of_party``).
    Unlike their code the momentum buffer is not scaled in place (there ``p.grad.data = buf`` aliases
    it); the scaling acts on the step only, as their paper's algorithm writes it."""

    def __init__(self, lr, momentum: float, gamma: float, weight_decay: float = 0.0) -> None:
        self.lr, self.momentum, self.gamma, self.weight_decay = lr, momentum, gamma, weight_decay
        self.buf: dict[int, torch.Tensor] = {}
        self.prev: dict[int, torch.Tensor] = {}
        self.calls = 0

    def state_dict(self) -> dict:
        """Momentum and history (``calls`` counts every step applied, like the party's ``step``)."""
        return {"buf": {k: v.clone() for k, v in self.buf.items()},
                "prev": {k: v.clone() for k, v in self.prev.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.buf, self.prev = dict(state["buf"]), dict(state["prev"])

    @torch.no_grad()
    def __call__(self, params: list[nn.Parameter]) -> None:
        self.calls += 1
        lr = float(self.lr())
        for p in params:
            if p.grad is None:
                continue
            g = p.grad + self.weight_decay * p if self.weight_decay else p.grad
            buf = self.buf.get(id(p))
            if buf is None or buf.shape != g.shape or self.momentum == 0:
                buf = g.clone()
            else:
                buf.mul_(self.momentum).add_(g)
            self.buf[id(p)] = buf
            step = buf.clone()
            prev = self.prev.get(id(p))
            if prev is not None and prev.shape == step.shape:
                step.mul_(malicious_ratio(step, prev, self.gamma))
            self.prev[id(p)] = step
            p.add_(step, alpha=-lr)


@ATTACKS.register
class ModelCompletionActive(ModelCompletion):
    """Active model completion: during VFL training the adversary steps its bottom model with
    :class:`MaliciousSGD` instead of the federation's optimizer, then runs ``mc``."""

    name = "mc-active"
    summary = "active model completion: a malicious optimizer boosts the adversary's bottom in training, then mc"
    during_training = True
    defaults = {**ModelCompletion.defaults, "gamma": 1.0, "momentum": 0.9, "mal_lr": 0.3}
    """``mal_lr``: the adversary's own learning rate; 0 follows the one the federation gives it (Fu
    et al.'s federations use SGD and give every party the same lr). Following the federation's is
    useless under Adam (lr 1e-3 is tiny for SGD): on digits (splitnn, 10 epochs, seeds 0–2) MC went
    0.754 → 0.684 under adam and +0.006 under SGD lr 0.01; at 0.3 it gains +0.071 (adam) and +0.174
    (SGD), at 1.0 the bottom diverged. At 0.3 most of the gain is the larger step (γ = 0 gains about
    as much); at 0.1 the scaling itself adds +0.042 / +0.045 (benchmarks/mc_active.py, RESULTS.md)."""

    @classmethod
    def validate(cls, config: dict) -> None:
        super().validate(config)
        if not 0 <= config["momentum"] < 1:
            raise UserError(f"attack {cls.name}: momentum must be in [0, 1), got {config['momentum']}")

    def prepare(self, federation, adversary: str, partition=None) -> None:
        party = federation.party(adversary)
        fixed = float(self.config["mal_lr"])

        def lr() -> float:  # read at every step: a learning-rate search may change it
            return fixed or party.optimizer.param_groups[0]["lr"]

        self.optimizer = MaliciousSGD(lr, float(self.config["momentum"]), float(self.config["gamma"]))
        party.use_local_step(self.optimizer)

    def run(self, target: AttackTarget) -> AttackResult:
        result = super().run(target)
        result.details["malicious_updates"] = self.optimizer.calls
        return result
