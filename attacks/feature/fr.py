"""``fr``: feature reconstruction (model inversion with auxiliary rows) by the *active* party
against one passive party (the run's targeted party, ``passive1``).

Threat model: the active party is semi-honest and knows the passive features of ``n_aux`` aligned
rows (default 1 % of the aligned rows, at least 50). After training it asks the federation for
forward passes, as the protocol lets it, and keeps exactly what it observes per row:
- HE off: the passive party's released rows t (the ACTIVATION messages it receives);
- HE on: a_P = t·W_P, the interactive layer's output it can unmask (W_P unknown to it).
It trains a decoder (MLP) from observation to the passive feature row on the aux rows and
reconstructs the other aligned training rows (``value``) and test rows (``test``).

Scores: R² averaged over features (higher = more leakage), MSE, and PSNR for image data (pixels
scaled to [0, 1] by the aux rows' range). Beside them: the **control**, the same decoder with the
same budget trained on Gaussian noise inputs of the same shape (what the aux rows alone give), and
the **prior**, the mean of the aux rows as the prediction (also the baseline). ``leakage`` = value −
max(control, prior).
Not implemented: ``fr-grn`` (generative regression without auxiliary features), SSIM.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from attacks.base import Attack, AttackResult, AttackTarget, register_attack
from securevfl.channel import MessageKind
from securevfl.channel.codec import decode_tensor


def r2_per_feature(pred: np.ndarray, truth: np.ndarray) -> float:
    """Mean over features of 1 − SSE/SST (constant features are left out)."""
    sst = ((truth - truth.mean(0)) ** 2).sum(0)
    keep = sst > 1e-12
    sse = ((truth - pred) ** 2).sum(0)
    return float(np.mean(1.0 - sse[keep] / sst[keep])) if keep.any() else float("nan")


def psnr(pred: np.ndarray, truth: np.ndarray, lo: float, hi: float) -> float:
    rng = max(hi - lo, 1e-12)
    mse = float((((pred - truth) / rng) ** 2).mean())
    return float(10 * np.log10(1.0 / max(mse, 1e-12)))


def observe(target: AttackTarget, ids: np.ndarray, split: str, batch: int = 512) -> np.ndarray:
    """What the active party observes about the targeted passive party for ``ids`` (inference
    requests it makes itself): the released rows with HE off, the unmasked a_P with HE on."""
    fed, trainer = target.federation, target.method.trainer
    k = fed.active.passive_names.index(target.adversary)
    he = fed.cut.name != "off"
    was = fed.channel.record
    fed.channel.record = True
    out = []
    try:
        for s in range(0, len(ids), batch):
            start = len(fed.channel.transcript)
            with torch.no_grad():
                trainer._exchange(ids[s:s + batch], split, False)
            if he:  # a_P as the active party computed it (its own unmasked value)
                out.append(fed.active._received[k].detach().numpy())
            else:  # the released rows, decoded from the messages the active party received
                msgs = [m for m in fed.channel.transcript[start:] if m.dst == fed.active.name
                        and m.src == target.adversary and m.kind == MessageKind.ACTIVATION]
                out.append(decode_tensor(msgs[-1].payload).numpy())
    finally:
        fed.channel.record = was
        if not was:
            fed.channel.transcript.clear()
    return np.concatenate(out).reshape(len(ids), -1).astype(np.float32)


def fit_decoder(x: np.ndarray, y: np.ndarray, hidden: int, epochs: int, lr: float, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(x.shape[1], hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                        nn.Linear(hidden, y.shape[1]))
    opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=1e-4)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    for _ in range(epochs):
        opt.zero_grad()
        loss = ((net(xt) - yt) ** 2).mean()
        loss.backward()
        opt.step()
    return net.eval()


@register_attack
class FeatureReconstruction(Attack):
    name = "fr"
    threat_model = "active"
    requires = frozenset({"passive_messages", "aux_features"})
    params = {"n_aux": 0, "epochs": 500, "lr": 3e-3, "hidden": 256, "eval_rows": 2000}

    def run(self, target: AttackTarget) -> AttackResult:
        fed, part = target.federation, target.partition
        rng = np.random.default_rng(self.seed + 4242)
        aligned = np.asarray(fed.active.aligned_ids)
        n_aux = int(self.config["n_aux"]) or max(50, int(round(0.01 * len(aligned))))
        if n_aux >= len(aligned):
            from securevfl.errors import UserError
            raise UserError(f"attack fr: n_aux {n_aux} leaves no aligned row to reconstruct ({len(aligned)} aligned)")
        perm = rng.permutation(aligned)
        aux, rest = perm[:n_aux], perm[n_aux:n_aux + int(self.config["eval_rows"])]
        victim = next(p for p in part.parties if p.name == target.adversary)  # ground truth (simulator)
        truth = {"aux": victim.rows(aux, "train"), "rest": victim.rows(rest, "train")}
        test_ids = np.intersect1d(victim.test_ids, fed.active.aligned_test_ids)[: int(self.config["eval_rows"])]
        truth["test"] = victim.rows(test_ids, "test")
        flat = {k: v.reshape(len(v), -1).astype(np.float32) for k, v in truth.items()}
        mu, sd = flat["aux"].mean(0), flat["aux"].std(0) + 1e-6  # the attacker standardises on what it knows
        norm = {k: (v - mu) / sd for k, v in flat.items()}
        obs = {"aux": observe(target, aux, "train"), "rest": observe(target, rest, "train")}
        if len(test_ids):
            obs["test"] = observe(target, test_ids, "test")
        o_mu, o_sd = obs["aux"].mean(0), obs["aux"].std(0) + 1e-6
        obs = {k: (v - o_mu) / o_sd for k, v in obs.items()}
        c = self.config
        dec = fit_decoder(obs["aux"], norm["aux"], int(c["hidden"]), int(c["epochs"]), float(c["lr"]), self.seed)
        noise_rng = np.random.default_rng(self.seed + 99)
        ctrl = fit_decoder(noise_rng.standard_normal(obs["aux"].shape).astype(np.float32), norm["aux"],
                           int(c["hidden"]), int(c["epochs"]), float(c["lr"]), self.seed)

        def predict(net: nn.Module, x: np.ndarray) -> np.ndarray:
            with torch.no_grad():
                return net(torch.from_numpy(x)).numpy() * sd + mu

        pred = {k: predict(dec, obs[k]) for k in obs if k != "aux"}
        ctrl_pred = predict(ctrl, noise_rng.standard_normal(obs["rest"].shape).astype(np.float32))
        prior_pred = np.broadcast_to(mu, flat["rest"].shape)
        details = {"n_aux": n_aux, "rows_scored": int(len(rest)), "observes": "a_P = t·W_P" if fed.cut.name != "off"
                   else "released rows t", "mse": float(((pred["rest"] - flat["rest"]) ** 2).mean()),
                   "control_mse": float(((ctrl_pred - flat["rest"]) ** 2).mean()),
                   "prior_mse": float(((prior_pred - flat["rest"]) ** 2).mean())}
        if "test" in pred:
            details["test"] = r2_per_feature(pred["test"], flat["test"])
        if part.kind == "image":
            lo, hi = float(flat["aux"].min()), float(flat["aux"].max())
            details |= {"psnr": psnr(pred["rest"], flat["rest"], lo, hi),
                        "control_psnr": psnr(ctrl_pred, flat["rest"], lo, hi)}
        prior = r2_per_feature(prior_pred, flat["rest"])
        # the decoder on noise can overfit the few aux rows below the mean predictor: leakage is
        # measured against the better of the two (the mean predictor is the baseline)
        return AttackResult("r2", r2_per_feature(pred["rest"], flat["rest"]), prior, baseline=prior,
                            control=r2_per_feature(ctrl_pred, flat["rest"]), details=details)
