"""FSHA, the feature-space hijacking attack (Pasquini, Ateniese, Bernaschi, "Unleashing the Tiger:
Inference Attacks on Split Learning", CCS 2021), by a malicious active party in the simulator.

The active party keeps training a passive party's bottom model f after the run, through the ordinary
protocol (:func:`attacks.feature.steer.steer`), but the gradient it returns is not the task's: it is
the gradient of an adversarial loss that pulls f(x_priv) into the feature space of an encoder f̃ the
attacker trains itself, on auxiliary rows, with a decoder f̃⁻¹ (f̃⁻¹(f̃(x)) ≈ x). Once f lands in
f̃'s space, f̃⁻¹(what the passive party sends) reconstructs its rows."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from attacks.base import ATTACKS, AttackResult, AttackTarget
from attacks.feature.fr import MAX_CARDINALITY, FeatureAttack, Truth, decode, fit_net, mixed_loss, mlp, out_width, score
from securevfl.errors import UserError


def one_hot_input(t: Truth) -> np.ndarray:
    """A row as the attacker's encoder reads it: standardised numeric values, one-hot categorical codes
    (fields with more than MAX_CARDINALITY values left out)."""
    parts = [(t.num - t.mu) / t.sd]
    for j, c in enumerate(t.cards):
        if c <= MAX_CARDINALITY:
            parts.append(np.eye(c)[np.clip(t.cat[:, j], 0, c - 1)])
    return np.concatenate(parts, 1).astype(np.float32)


class Space:
    """Where the attacker puts the feature space it hijacks: what it receives of the passive party.

    With HE off and the interactive layer, W_P is the active party's own plaintext state: it sets
    W_P = I before every exchange, so it receives t = tanh(z) itself and the passive party gets back
    exactly the ∂L/∂t it chose. Without the interactive layer it receives z and returns ∂L/∂z."""

    def __init__(self, end: Any) -> None:
        self.end = end
        self.interactive = getattr(end, "W", None) is not None

    def open(self) -> None:
        """Before an exchange: the active party's end passes t through (W_P = I, no momentum)."""
        if self.interactive:
            d = self.end.W.shape[0]
            self.end.W, self.end.b = np.eye(d), np.zeros((d, d))


@ATTACKS.register
class FeatureSpaceHijacking(FeatureAttack):
    """FSHA (Pasquini et al., CCS 2021): a malicious active party hijacks a passive party's training
    after the run and reconstructs its feature rows with a decoder of its own.

    Threat model: the active party (the split-learning server: head, loss, the gradient it returns)
    is malicious; the victim is passive party ``adversary``, which trains its bottom model f with
    whatever gradient it receives. The attacker knows ``n_aux`` of the victim's feature rows
    (auxiliary rows from the same distribution, drawn as :class:`attacks.feature.fr.FeatureReconstruction`
    draws them) and runs ``steps`` training steps of its own choosing, each on ``batch`` aligned rows
    (0: the run's ``train.batch_size``, full batches, so a deployed party's short-batch floor passes
    them), through the real protocol (:func:`attacks.feature.steer.steer`).

    What it observes: what it receives of the victim for the rows it asks for. With HE off and the
    interactive layer W_P is its own plaintext state, so it sets W_P = I (it receives t = tanh(z) and
    the victim gets back exactly the ∂L/∂t it chose); without the interactive layer it receives z.
    Under HE it receives a_P = t·W_P of the head's width with W_P secret-shared: the attack refuses.

    Each step: one Adam step of the encoder f̃ and decoder f̃⁻¹ on the autoencoder loss over aux rows,
    then the victim's step with the gradient the attacker chooses for f(x) on the batch. ``gan`` (the
    paper's unpaired attack): also one step of a discriminator D (f̃(x_aux) real, f(x_priv) fake) and the
    generator loss on f(x_priv) in the victim's gradient: ``gan`` (non-saturating, BCE with logits) or
    ``wgan-gp`` (D(fake) − D(real) + λ·GP, victim loss −D(f(x))). ``pair`` (our reading for partially
    aligned VFL, where the lab's aux rows are aligned rows whose features the attacker knows): a
    ``share`` of each batch is aux rows, and the victim's gradient also pulls f(x_aux) onto f̃(x_aux)
    (squared distance, weight ``pair``). The default is the paired hijack without D (gan=none), the
    strongest measured on tabular data; the paper's unpaired GAN (``gan=gan,pair=0,share=0``) did not
    converge there (benchmarks/RESULTS.md).

    Scored as the mean R² over the victim's numeric features of f̃⁻¹(what it receives after the hijack)
    on aligned training rows outside the aux set (:func:`attacks.feature.fr.r2_per_feature`). The
    **control** is the better of two decoders on what the same attacker received for the same rows
    *before* the hijack (the victim's bottom as honest training left it): the final f̃⁻¹, and a decoder
    fit on the aux rows' honest outputs (what ``fr`` does). value − control is what hijacking adds.
    prior and baseline 0 (the rows' mean). The lab restores every party's state afterwards (later
    attacks of the run see the trained federation).

    ``limits: true`` puts a deployed passive party's own limits in place (securevfl/policy.py): they do
    not stop FSHA. Its batches are full size and it asks no state operation; every step looks like a
    training step. FSHA is what a passive-side detector of the gradients it receives must catch.

    Readings of the paper: f̃ is trained on the autoencoder loss only (never against D), as in the
    paper; its last layer is tanh where the victim sends t = tanh(z). One attacker update per victim
    step. The aux rows are few (tabular data), so every attacker batch resamples them."""

    name = "fsha"
    summary = ("feature-space hijacking (Pasquini et al.): a malicious active party returns adversarial "
               "gradients that pull the bottom model into its own autoencoder's space, then decodes")
    requires = frozenset({"passive_messages", "aux_features"})
    during_training = False
    defaults = {"n_aux": 0, "steps": 1500, "batch": 0, "gan": "none", "pair": 1.0, "share": 0.25, "lr": 1e-3,
                "d_lr": 1e-3, "gp": 10.0, "hidden": 128, "eval_rows": 2000, "limits": False}

    @classmethod
    def validate(cls, config: dict) -> None:
        super().validate(config)
        if config["gan"] not in ("none", "gan", "wgan-gp"):
            raise UserError(f"attack fsha: gan must be none, gan or wgan-gp, got {config['gan']!r}")
        if not 0 <= float(config["share"]) < 1 or float(config["pair"]) < 0:
            raise UserError("attack fsha: share must be in [0, 1) and pair ≥ 0")
        if config["gan"] == "none" and not (float(config["pair"]) > 0 and float(config["share"]) > 0):
            raise UserError("attack fsha: with gan=none the paired term (pair > 0, share > 0) is the whole attack")

    def run(self, target: AttackTarget) -> AttackResult:
        from attacks.feature.steer import Steering, steer

        fed, adv, c = target.federation, target.adversary, self.config
        if fed.cut.name != "off" or getattr(fed.active.cut_ends[adv], "mix", None) is not None:
            raise UserError("attack fsha cannot run here: under HE (or the secret mixing) the active party "
                            "receives a_P = t·W_P, a few columns wide, and cannot choose the passive party's gradient")
        aux, rest, _, n_aux = self.split_rows(target)
        truth = self.truth(target, {"aux": (aux, "train"), "rest": (rest, "train")}, "aux")
        t_aux = truth["aux"]
        x_aux = torch.from_numpy(one_hot_input(t_aux))
        y_num = torch.from_numpy(((t_aux.num - t_aux.mu) / t_aux.sd).astype(np.float32))
        y_cat = torch.from_numpy(t_aux.cat)
        assert target.method is not None  # the harness hands every attack the trained method
        train = target.method.ctx.train  # type: ignore[attr-defined]
        batch = int(c["batch"]) or int(train.batch_size)
        aligned = np.asarray(fed.active.aligned_ids)
        batch = min(batch, len(aligned))
        rng = np.random.default_rng(self.seed + 4444)
        gan, hidden, steps = str(c["gan"]), int(c["hidden"]), int(c["steps"])
        state: dict[str, Any] = {"steps": 0}

        def program(s: Steering) -> tuple[np.ndarray, np.ndarray]:
            space = Space(s.active.cut_ends[adv])

            def observe(ids: np.ndarray) -> np.ndarray:
                out = []
                for k in range(0, len(ids), int(train.eval_batch_size)):
                    space.open()
                    out.append(s.release(ids[k:k + int(train.eval_batch_size)])[adv].detach().double().cpu().numpy())
                return np.concatenate(out).reshape(len(ids), -1)

            before = observe(rest)
            state["before_aux"] = observe(aux)  # for the control: a decoder on honest outputs (as ``fr``)
            width = before.shape[1]
            torch.manual_seed(self.seed)
            enc = mlp(x_aux.shape[1], hidden, width)
            dec = mlp(width, hidden, out_width(t_aux))
            disc = mlp(width, hidden, 1)
            squash = torch.tanh if space.interactive else (lambda v: v)
            opt_ae = torch.optim.Adam([*enc.parameters(), *dec.parameters()], lr=float(c["lr"]))
            opt_d = torch.optim.Adam(disc.parameters(), lr=float(c["d_lr"]), betas=(0.5, 0.9))
            order = np.empty(0, dtype=aligned.dtype)
            others = np.setdiff1d(aligned, aux)
            k_aux = min(int(round(float(c["share"]) * batch)), len(aux))
            for _ in range(steps):
                if len(order) < batch - k_aux:
                    order = np.concatenate([order, rng.permutation(others)])
                mine = rng.choice(len(aux), k_aux, replace=False)
                ids, order = np.concatenate([aux[mine], order[:batch - k_aux]]), order[batch - k_aux:]
                with torch.no_grad():
                    anchor = squash(enc(x_aux[torch.from_numpy(mine)]))
                pick = torch.from_numpy(rng.integers(0, len(x_aux), batch))
                xa = x_aux[pick]
                opt_ae.zero_grad()
                h_aux = squash(enc(xa))
                mixed_loss(dec(h_aux), y_num[pick], y_cat[pick], t_aux).backward()
                opt_ae.step()
                real = h_aux.detach()

                def gradient(received: torch.Tensor, real: torch.Tensor = real,
                             anchor: torch.Tensor = anchor) -> torch.Tensor:
                    fake = received.detach().float().reshape(len(received), -1)
                    f = fake.clone().requires_grad_(True)
                    loss = torch.zeros(())
                    if gan != "none":
                        opt_d.zero_grad()
                        d_loss(disc, real, fake, gan, float(c["gp"])).backward()
                        opt_d.step()
                        loss = g_loss(disc, f, gan)
                    if k_aux:  # the aux rows it knows sit in the batch: pull f(x) onto f̃(x) directly
                        loss = loss + float(c["pair"]) * ((f[:k_aux] - anchor) ** 2).sum(1).mean()
                    loss.backward()
                    assert f.grad is not None
                    # × batch: a per-row gradient of the usual size (the victim's own optimizer sets the step)
                    return (f.grad * len(f)).reshape(received.shape).to(received.dtype)

                space.open()
                s.step(ids, gradient)
                state["steps"] += 1
            after = observe(rest)
            with torch.no_grad():
                state["ae"] = dec(squash(enc(torch.from_numpy(one_hot_input(truth["rest"])))))
            state["dec"] = dec
            return before, after

        limits = self.deployed_limits(target) if c["limits"] else None
        snaps = {p.name: p.snapshot() for p in fed.parties}  # the lab's bookkeeping, not the attacker's
        refused = None
        try:
            before, after = steer(fed, adv, program, limits=limits)
        except (UserError, RuntimeError) as e:  # refused by the passive party's limits
            refused = str(e).splitlines()[0]
        finally:
            for p in fed.parties:
                p.restore(snaps[p.name])
        rest_t = truth["rest"]
        details: dict[str, Any] = {"n_aux": n_aux, "rows_scored": int(len(rest)), "steps": int(state["steps"]),
                                   "batch": batch, "gan": gan, "limits": bool(c["limits"]),
                                   "observes": "what it received after steps whose gradient it chose",
                                   "control_kind": ("the better of: the same decoder, and a decoder fit on the aux "
                                                    "rows (fr), on what it received before the hijack")}
        if refused is not None:
            details["refused"] = refused
            return AttackResult("r2", 0.0, 0.0, baseline=0.0, control=0.0, details=details)
        dec = state["dec"]

        def predict(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            with torch.no_grad():
                return decode(dec(torch.from_numpy(obs.astype(np.float32))).double().numpy(), t_aux)

        mine, same = score(predict(after), rest_t), score(predict(before), rest_t)
        # the stronger control: what the same aux rows give without hijacking (``fr``'s decoder on the
        # honest outputs), so value − control is what steering the training adds
        b_aux = state["before_aux"]
        mu, sd = b_aux.mean(0), b_aux.std(0) + 1e-6
        honest = fit_net(mlp(b_aux.shape[1], 256, out_width(t_aux)), (b_aux - mu) / sd, t_aux, 500, 3e-3, self.seed)
        with torch.no_grad():
            learned = score(decode(honest(torch.from_numpy(((before - mu) / sd).astype(np.float32))).double().numpy(),
                                   t_aux), rest_t)
        ceiling = score(decode(state["ae"].double().numpy(), t_aux), rest_t)
        details |= {"mse": mine["mse"], "control_same_decoder_r2": same["r2"], "control_learned_r2": learned["r2"],
                    "autoencoder_r2": ceiling["r2"]}
        return AttackResult("r2", mine["r2"], 0.0, baseline=0.0, control=max(same["r2"], learned["r2"]),
                            details=details)

    @staticmethod
    def deployed_limits(target: AttackTarget) -> Any:
        """A deployed passive party's own limits (as :class:`attacks.feature.sign_probe.SignProbe` puts them)."""
        from securevfl.party_settings import PartySettings
        from securevfl.policy import RequestLimits

        own = PartySettings()
        method = target.method
        assert method is not None
        budget = {**method.state_budget(), "resume": 0}

        def limits() -> RequestLimits:
            return RequestLimits(own.max_requests, own.max_rate, state_budget=budget, max_lr=own.max_lr,
                                 batch_size=method.ctx.train.batch_size,  # type: ignore[attr-defined]
                                 min_batch_fraction=own.min_batch_fraction)
        return limits


def d_loss(disc: nn.Module, real: torch.Tensor, fake: torch.Tensor, gan: str, gp: float) -> torch.Tensor:
    """The discriminator's loss: f̃(x_aux) is real, what the victim sent is fake."""
    if gan == "gan":
        bce = nn.functional.binary_cross_entropy_with_logits
        dr, df = disc(real), disc(fake)
        return bce(dr, torch.ones_like(dr)) + bce(df, torch.zeros_like(df))
    n = min(len(real), len(fake))
    eps = torch.rand(n, 1)
    mid = (eps * real[:n] + (1 - eps) * fake[:n]).requires_grad_(True)
    grad, = torch.autograd.grad(disc(mid).sum(), mid, create_graph=True)
    return disc(fake).mean() - disc(real).mean() + gp * ((grad.norm(dim=1) - 1) ** 2).mean()


def g_loss(disc: nn.Module, fake: torch.Tensor, gan: str) -> torch.Tensor:
    """The victim's loss (what its gradient is of): what it sends should pass for f̃'s output."""
    out = disc(fake)
    if gan == "gan":
        return nn.functional.binary_cross_entropy_with_logits(out, torch.ones_like(out))
    return -out.mean()
