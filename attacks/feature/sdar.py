"""``sdar``: feature reconstruction by simulator decoding with adversarial regularization (Zhu et al.,
NDSS 2025, "Passive Inference Attacks on Split Learning via Adversarial Regularization"; our reading
checked against SecretFlow's ``sdar`` attack at ``secretflow/sfl``).

The paper's attacker is the server of U-shaped split learning, holding the top model g and a few
auxiliary rows from the victim's distribution. It trains a **simulator** e of the victim's bottom
model so that g classifies e(x_aux) correctly (cross-entropy through g) while a label-conditioned
discriminator cannot tell e(x_aux) from the victim's real smashed data (adversarial regularization,
weight 0.02), and a **decoder** that inverts e on the aux rows (MSE, plus a 1e-5-weighted
discriminator on decoded rows). The victim's smashed data then goes through the decoder.

Our VFL roles: the attacker is the active party. Its g is its trained head on its own bottom
output and each passive delivery (through the interactive layer and any model wrap, exactly the
function that produced the logits); the smashed data is what that head reads from ``passive1``
(HE off: the delivery it computes from the released rows; HE on: a_P = t·W_P, which it unmasks);
the aux rows are, as for ``fr``, ``n_aux`` aligned rows whose passive features it knows; the labels
are its own training labels. The paper trains online at every training step against the current g;
our attacks run after training on the run's final model, so the simulator, discriminators and
decoder train for ``steps`` steps against the final g and the deliveries of every aligned training
row (the attacker's observation, as ``fr``'s). The simulator is an MLP from the passive features to
the delivery (the attacker cannot build W_P's side of the victim under HE; with HE off the delivery
is a fixed function of the released rows, so it loses nothing ``fr`` sees). The decoder takes the
delivery and the row's label (one-hot; zeros where the active party holds none).

Scores as ``fr`` (R² over numeric features, MSE, categorical accuracy, PSNR/SSIM for images). The
control runs the same pipeline with Gaussian noise in place of every observation, labels kept: what
the aux rows and the labels give without the smashed data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from attacks.base import ATTACKS, AttackResult, AttackTarget
from attacks.feature.fr import MAX_CARDINALITY, FeatureAttack, Truth, decode, mixed_loss, mlp, observe, out_width
from securevfl.errors import UserError


def deliveries(target: AttackTarget, ids: np.ndarray, split: str, batch: int = 512) -> list[np.ndarray]:
    """What the active party's head reads from each passive party for ``ids`` (its own inference
    requests; under HE the a_P it unmasks), before its own model wraps."""
    assert target.method is not None and target.method.trainer is not None
    fed, trainer = target.federation, target.method.trainer
    out: list[list[np.ndarray]] = [[] for _ in fed.active.passive_names]
    for s in range(0, len(ids), batch):
        with torch.no_grad():
            trainer._exchange(ids[s:s + batch], split, False)
        for k, r in enumerate(fed.active.received):
            out[k].append(r.detach().reshape(len(r), -1).numpy().astype(np.float32))
    return [np.concatenate(parts) for parts in out]


def to_delivery(target: AttackTarget) -> Callable[[torch.Tensor], torch.Tensor]:
    """The active party's own map from what it observes of ``passive1`` to what its head reads: the
    identity under HE (it observes a_P) and without the interactive layer; t ↦ t·W_P with the plaintext
    interactive layer, whose W_P its cut-layer end holds.

    Raises:
        UserError: the plaintext layer with secret mixing (the map then draws fresh passes per step)."""
    from securevfl.cutlayer import InteractiveActiveEnd

    fed = target.federation
    end = fed.active.cut_ends[target.adversary]
    if fed.cut.name != "off" or not isinstance(end, InteractiveActiveEnd):
        return lambda z: z
    if end.mix is not None or end.W is None:
        raise UserError("attack sdar: the plaintext interactive layer with mixing has no fixed map from the released "
                        "rows to the head's input; run it with --interactive-mixing off")
    w = torch.from_numpy(end.W).float()
    return lambda z: z @ w


def one_hot_labels(target: AttackTarget, ids: np.ndarray, n_classes: int) -> np.ndarray:
    """The active party's own training labels as rows of class weights (zeros where it has none)."""
    data = target.federation.active.data
    out = np.zeros((len(ids), n_classes), dtype=np.float32)
    for i, e in enumerate(ids.tolist()):
        try:
            y = np.asarray(data.labels(np.asarray([e])))[0]
        except KeyError:
            continue
        if np.ndim(y) == 1:  # soft labels (a label defense's): the weights themselves
            out[i] = y
        else:
            out[i, int(y)] = 1.0
    return out


class _Critic(nn.Module):
    """A label-conditioned discriminator (logit: real)."""

    def __init__(self, width: int, n_classes: int, hidden: int) -> None:
        super().__init__()
        self.net = mlp(width + n_classes, hidden, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([x, y], 1))


@ATTACKS.register
class SDAR(FeatureAttack):
    name = "sdar"
    summary = ("SDAR (Zhu et al. 2025): a simulator of the passive bottom trained through the active head with "
               "adversarial regularization, and its decoder, reconstruct the passive features")
    requires = frozenset({"passive_messages", "aux_features"})
    defaults = {"n_aux": 0, "steps": 1500, "batch_size": 64, "lr": 1e-3, "hidden": 256, "adv": 0.02,
                "decoder_adv": 1e-5, "eval_rows": 2000}

    def run(self, target: AttackTarget) -> AttackResult:
        fed = target.federation
        if fed.regression:
            raise UserError("attack sdar trains its simulator through the head's classification loss: "
                            "classification tasks only")
        aux, rest, test_ids, n_aux = self.split_rows(target)
        aligned = np.asarray(fed.active.aligned_ids)
        groups = {"stats": (aux, "train"), "aux": (aux, "train"), "rest": (rest, "train")}
        truth = self.truth(target, groups, "aux")
        k = fed.active.passive_names.index(target.adversary)
        own = {n: self._own(target, ids) for n, ids in (("aux", aux), ("all", aligned))}
        obs_aux = deliveries(target, aux, "train")  # the other passive parties' slots of g's input
        obs_all = {k: observe(target, aligned, "train")}  # what fr observes: t (HE off) or a_P (HE on)
        obs_rest = observe(target, rest, "train")
        c = fed.n_classes
        y = {"aux": one_hot_labels(target, aux, c), "all": one_hot_labels(target, aligned, c),
             "rest": one_hot_labels(target, rest, c)}
        noise = np.random.default_rng(self.seed + 77)

        def attack(observed_all: np.ndarray, observed_rest: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            dec = self._fit(target, truth["aux"], own, obs_aux, k, observed_all, y, to_delivery(target))
            with torch.no_grad():
                out = dec(torch.from_numpy(observed_rest), torch.from_numpy(y["rest"]))
            return decode(out.double().numpy(), truth["aux"])

        pred = {"rest": attack(obs_all[k], obs_rest)}
        ctrl = attack(noise.standard_normal(obs_all[k].shape).astype(np.float32),
                      noise.standard_normal(obs_rest.shape).astype(np.float32))
        res = self.result(target, pred, ctrl, truth, n_aux, "the same attack with Gaussian noise in place of every "
                                                            "observation (labels and aux rows kept)")
        res.details |= {"steps": int(self.config["steps"]), "observes_for_g": "the delivery the head reads",
                        "test_rows": int(len(test_ids))}
        return res

    @staticmethod
    def _own(target: AttackTarget, ids: np.ndarray) -> torch.Tensor:
        a = target.federation.active
        a.bottom.eval()
        with torch.no_grad():
            return a.bottom(a.features(ids, "train")).detach()

    def _fit(self, target: AttackTarget, t: Truth, own: dict[str, torch.Tensor], obs_aux: list[np.ndarray], k: int,
             observed_all: np.ndarray, y: dict[str, np.ndarray],
             deliver: Callable[[torch.Tensor], torch.Tensor]) -> nn.Module:
        """Simulator, its critic, the decoder and its critic, trained together on mini-batches."""
        cfg = self.config
        a = target.federation.active
        torch.manual_seed(self.seed)
        rng = np.random.default_rng(self.seed + 5)
        x_aux = torch.from_numpy(np.concatenate([(t.num - t.mu) / t.sd, _one_hot_cats(t)], 1).astype(np.float32))
        yn = torch.from_numpy(((t.num - t.mu) / t.sd).astype(np.float32))
        yc = torch.from_numpy(t.cat)
        width, hidden, n_classes = observed_all.shape[1], int(cfg["hidden"]), y["aux"].shape[1]
        sim = mlp(x_aux.shape[1], hidden, width)
        sim_critic = _Critic(width, n_classes, hidden)
        dec = _Decoder(width, n_classes, hidden, out_width(t))
        dec_critic = _Critic(out_width(t), n_classes, hidden)
        opts = [torch.optim.Adam(m.parameters(), lr=float(cfg["lr"])) for m in (sim, sim_critic, dec, dec_critic)]
        others = [torch.from_numpy(o) for o in obs_aux]
        ya, yall = torch.from_numpy(y["aux"]), torch.from_numpy(y["all"])
        real_all = torch.from_numpy(observed_all)
        bs = int(cfg["batch_size"])
        was_training = a.head.training
        a.head.eval()
        for p in a.head.parameters():
            p.requires_grad_(False)
        try:
            for _ in range(int(cfg["steps"])):
                i = torch.from_numpy(rng.integers(0, len(x_aux), size=min(bs, len(x_aux))))
                j = torch.from_numpy(rng.integers(0, len(real_all), size=bs))
                z = sim(x_aux[i])
                # the simulated delivery in passive1's slot; the other passive parties' real ones
                received = [deliver(z) if q == k else others[q][i] for q in range(len(others))]
                logits = a.combine(a.head, own["aux"][i], a._delivered(received))
                target_y = ya[i]
                fool = sim_critic(z, target_y)
                loss_sim = _soft_ce(logits, target_y) + float(cfg["adv"]) * F.binary_cross_entropy_with_logits(
                    fool, torch.ones_like(fool))
                opts[0].zero_grad()
                loss_sim.backward()
                opts[0].step()
                real, fake = sim_critic(real_all[j], yall[j]), sim_critic(z.detach(), target_y)
                loss_critic = F.binary_cross_entropy_with_logits(real, torch.ones_like(real)) + \
                    F.binary_cross_entropy_with_logits(fake, torch.zeros_like(fake))
                opts[1].zero_grad()
                loss_critic.backward()
                opts[1].step()
                with torch.no_grad():
                    zs = sim(x_aux[i])
                out = dec(zs, target_y)
                judged = dec_critic(dec.coded(out, t), target_y)
                loss_dec = mixed_loss(out, yn[i], yc[i], t) + float(cfg["decoder_adv"]) * \
                    F.binary_cross_entropy_with_logits(judged, torch.ones_like(judged))
                opts[2].zero_grad()
                loss_dec.backward()
                opts[2].step()
                real_d, fake_d = dec_critic(x_aux[i], target_y), dec_critic(dec.coded(out.detach(), t), target_y)
                loss_dc = F.binary_cross_entropy_with_logits(real_d, torch.ones_like(real_d)) + \
                    F.binary_cross_entropy_with_logits(fake_d, torch.zeros_like(fake_d))
                opts[3].zero_grad()
                loss_dc.backward()
                opts[3].step()
        finally:
            for p in a.head.parameters():
                p.requires_grad_(True)
            a.head.train(was_training)
        return dec.eval()


class _Decoder(nn.Module):
    """Delivery and label → the passive feature row, in fr's coding (standardised numeric values and
    one logit per value of each categorical field)."""

    def __init__(self, width: int, n_classes: int, hidden: int, out: int) -> None:
        super().__init__()
        self.net = mlp(width + n_classes, hidden, out)

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([z, y], 1))

    @staticmethod
    def coded(out: torch.Tensor, t: Truth) -> torch.Tensor:
        """The output as the critic sees real rows: numeric values, a softmax per categorical field."""
        n = t.num.shape[1]
        parts, start = [out[:, :n]], n
        for c in t.cards:
            if c <= MAX_CARDINALITY:
                parts.append(torch.softmax(out[:, start:start + c], 1))
                start += c
        return torch.cat(parts, 1)


def _one_hot_cats(t: Truth) -> np.ndarray:
    parts = [np.eye(c, dtype=np.float32)[t.cat[:, j]] for j, c in enumerate(t.cards) if c <= MAX_CARDINALITY]
    return np.concatenate(parts, 1) if parts else np.zeros((len(t.num), 0), dtype=np.float32)


def _soft_ce(logits: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against label weights (one-hot or soft); rows without a label weigh nothing."""
    has = weights.sum(1) > 0
    if not bool(has.any()):
        return logits.sum() * 0
    return cast(torch.Tensor, -(weights[has] * F.log_softmax(logits[has], 1)).sum(1).mean())
