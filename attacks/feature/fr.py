"""Feature reconstruction by the *active* party against one passive party (the run's targeted
party, ``passive1``): ``fr`` (model inversion with auxiliary rows) and ``fr-grn`` (generative
regression, no auxiliary features).

Threat model: the active party is semi-honest and knows the passive features of ``n_aux`` aligned
rows (default 1 % of the aligned rows, at least 50). After training it asks the federation for
forward passes, as the protocol lets it, and keeps exactly what it observes per row:
- HE off: the passive party's released rows t (the ACTIVATION messages it receives);
- HE on: a_P = t·W_P, the interactive layer's output it can unmask (W_P unknown to it).
It trains a decoder (MLP) from observation to the passive feature row on the aux rows and
reconstructs the other aligned training rows (``value``) and test rows (``test``).

``fr-grn`` (Luo et al. 2021, "Feature inference attack on model predictions in VFL", without their
white-box model): the attacker knows no passive feature row. It trains a generator G(x_A, r) from its
own features x_A and noise r to passive feature rows, and a surrogate S of the passive bottom model
(an MLP of the bottom's width; it cannot know the real one), jointly, so that S(G(x_A, r)) matches
what it observed for the same row. Its prior knowledge is stated, not hidden: each passive feature's
marginal mean and standard deviation (public schema statistics; 0 and 1 for standardised tabular
columns) and each categorical field's cardinality; G's outputs are standardised values (and
probabilities over each categorical field's values). Nothing ties G's outputs to the real features
except that prior and x_A, which is what this attack measures: without auxiliary rows or the model,
how much of the passive features the observations give away.

Scores: R² averaged over numeric features (higher = more leakage), MSE, accuracy per categorical
field (fields with more than ``MAX_CARDINALITY`` values are not scored), PSNR and SSIM for image data
(pixels scaled to [0, 1] by the aux rows' range; the first rows' reconstructions are kept, as uint8,
for the report's image grid). Beside them: the **control**, the same decoder with the
same budget trained on Gaussian noise inputs of the same shape (what the aux rows alone give), and
the **prior**, the mean of the aux rows as the prediction (also the baseline). ``leakage`` = value −
max(control, prior).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch
from torch import nn

from attacks.base import ATTACKS, Attack, AttackResult, AttackTarget
from securevfl.channel import MessageKind
from securevfl.channel.codec import decode_tensor
from securevfl.errors import UserError

SHOWN = 8
"""Reconstructed image rows kept in the result (the report's grid of halves next to the originals)."""


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


def ssim(pred: np.ndarray, truth: np.ndarray, lo: float, hi: float) -> float:
    """Mean SSIM over images (rows shaped (n, H, W)), scikit-image's implementation with the largest
    odd window that fits the image (Gaussian weighting off: halves of 8×8 digits are 8×4)."""
    from skimage.metrics import structural_similarity

    win = min(7, *truth.shape[1:3])
    win -= 1 - win % 2
    if win < 3:
        return float("nan")
    return float(np.mean([structural_similarity(p, t, data_range=max(hi - lo, 1e-12), win_size=win)
                          for p, t in zip(pred, truth, strict=True)]))


def encode_images(x: np.ndarray, lo: float, hi: float) -> str:
    """Images as base64 uint8 (scaled by [lo, hi]): compact enough for the run JSON."""
    q = np.clip(np.round((x - lo) / max(hi - lo, 1e-12) * 255), 0, 255).astype(np.uint8)
    return base64.b64encode(q.tobytes()).decode()


def decode_images(text: str, shape: list[int]) -> np.ndarray:
    """Inverse of :func:`encode_images`, in [0, 1]."""
    return np.frombuffer(base64.b64decode(text), dtype=np.uint8).reshape(-1, *shape) / 255.0


def observe(target: AttackTarget, ids: np.ndarray, split: str, batch: int = 512) -> np.ndarray:
    """What the active party observes about the targeted passive party for ``ids`` (inference
    requests it makes itself): the released rows with HE off, the unmasked a_P with HE on."""
    # the active party makes inference requests through the trained method's trainer
    assert target.method is not None and target.method.trainer is not None
    fed, trainer = target.federation, target.method.trainer
    k = fed.active.passive_names.index(target.adversary)
    he = fed.cut.name != "off"
    if not he and not fed.channel.record:  # the run pipeline builds the federation recording for this attack
        raise RuntimeError("fr reads the messages the active party received: build the federation with record=True")
    out = []
    for s in range(0, len(ids), batch):
        start = len(fed.channel.transcript)
        with torch.no_grad():
            trainer._exchange(ids[s:s + batch], split, False)
        if he:  # a_P as the active party computed it (its own unmasked value)
            out.append(fed.active.received[k].detach().numpy())
        else:  # the released rows, decoded from the messages the active party received
            msgs = [m for m in fed.channel.transcript[start:] if m.dst == fed.active.name
                    and m.src == target.adversary and m.kind == MessageKind.ACTIVATION]
            out.append(decode_tensor(msgs[-1].payload).numpy())
    return np.concatenate(out).reshape(len(ids), -1).astype(np.float32)


DRAWS = 16
"""Noise draws fr-grn averages per row for its reconstruction."""

MAX_CARDINALITY = 1000
"""Categorical fields with more values are left out of the scoring (a decoder head per value)."""


@dataclass
class Truth:
    """Ground truth from the simulator (scoring only) in the attacker's coding: numeric columns
    standardised by the known marginal mean/std, categorical fields as codes."""

    num: np.ndarray
    cat: np.ndarray
    mu: np.ndarray
    sd: np.ndarray
    cards: tuple[int, ...]
    shape: tuple[int, ...] | None  # image rows (H, W), None for tabular


def truth_rows(victim, ids: np.ndarray, split: str, n_numeric: int | None, kind: str) -> tuple[np.ndarray, np.ndarray]:
    x = victim.rows(ids, split)
    flat = x.reshape(len(x), -1).astype(np.float64)
    k = flat.shape[1] if kind == "image" or n_numeric is None else n_numeric
    return flat[:, :k], flat[:, k:].astype(np.int64)


def fit_net(net: nn.Module, x: np.ndarray, t: Truth, epochs: int, lr: float,
            seed: int) -> nn.Module:
    """Full-batch Adam on MSE (numeric) + cross-entropy per scored categorical field."""
    torch.manual_seed(seed)
    opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=1e-4)
    xt = torch.from_numpy(x.astype(np.float32))
    yn = torch.from_numpy(((t.num - t.mu) / t.sd).astype(np.float32))
    yc = torch.from_numpy(t.cat)
    for _ in range(epochs):
        opt.zero_grad()
        loss = mixed_loss(net(xt), yn, yc, t)
        loss.backward()
        opt.step()
    return net.eval()


def mixed_loss(out: torch.Tensor, yn: torch.Tensor, yc: torch.Tensor, t: Truth) -> torch.Tensor:
    n = yn.shape[1]
    loss = ((out[:, :n] - yn) ** 2).mean() if n else out.sum() * 0
    start = n
    for j, c in enumerate(t.cards):
        if c <= MAX_CARDINALITY:
            loss = loss + nn.functional.cross_entropy(out[:, start:start + c], yc[:, j]) / max(len(t.cards), 1)
            start += c
    return loss


def out_width(t: Truth) -> int:
    return t.num.shape[1] + sum(c for c in t.cards if c <= MAX_CARDINALITY)


def mlp(width_in: int, hidden: int, width_out: int) -> nn.Module:
    return nn.Sequential(nn.Linear(width_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, width_out))


def decode(out: np.ndarray, t: Truth) -> tuple[np.ndarray, np.ndarray]:
    """Network outputs → (numeric rows in data units, categorical codes)."""
    n = t.num.shape[1]
    num = out[:, :n] * t.sd + t.mu
    cats, start = [], n
    for c in t.cards:
        if c <= MAX_CARDINALITY:
            cats.append(out[:, start:start + c].argmax(1))
            start += c
        else:
            cats.append(np.full(len(out), -1))
    return num, np.stack(cats, 1) if cats else np.zeros((len(out), 0), dtype=np.int64)


def cat_accuracy(pred: np.ndarray, truth: np.ndarray, cards: tuple[int, ...]) -> float:
    keep = [j for j, c in enumerate(cards) if c <= MAX_CARDINALITY]
    return float((pred[:, keep] == truth[:, keep]).mean()) if keep else float("nan")


def score(pred: tuple[np.ndarray, np.ndarray], t: Truth) -> dict:
    num, cat = pred
    out = {"r2": r2_per_feature(num, t.num) if t.num.shape[1] else float("nan"),
           "mse": float(((num - t.num) ** 2).mean()) if t.num.shape[1] else float("nan")}
    if t.cards:
        out["categorical_accuracy"] = cat_accuracy(cat, t.cat, t.cards)
    return out


class FeatureAttack(Attack):
    """Shared set-up and scoring of the active party's feature-reconstruction attacks."""

    threat_model = "active"
    kind = "feature_reconstruction"

    def split_rows(self, target: AttackTarget) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """(aux, scored, test) IDs: the same draw for every feature attack of a run."""
        fed = target.federation
        aligned = np.asarray(fed.active.aligned_ids)
        n_aux = int(self.config.get("n_aux", 0)) or max(50, int(round(0.01 * len(aligned))))
        if n_aux >= len(aligned):
            raise UserError(f"attack {self.name}: n_aux {n_aux} leaves no aligned row to reconstruct "
                            f"({len(aligned)} aligned)")
        perm = np.random.default_rng(self.seed + 4242).permutation(aligned)
        victim = self.victim(target)
        # the active party learnt its aligned test rows at alignment, before any attack runs
        aligned_test = cast(np.ndarray, fed.active.aligned_test_ids)
        test = np.intersect1d(victim.test_ids, aligned_test)[: int(self.config["eval_rows"])]
        return perm[:n_aux], perm[n_aux:n_aux + int(self.config["eval_rows"])], test, n_aux

    @staticmethod
    def victim(target: AttackTarget):
        return next(p for p in target.partition.parties if p.name == target.adversary)  # ground truth (simulator)

    def truth(self, target: AttackTarget, groups: dict[str, tuple[np.ndarray, str]], stats_from: str) -> dict:
        """Ground truth per group, coded with the marginal statistics of ``stats_from``'s rows."""
        victim, kind = self.victim(target), target.partition.kind
        nn_ = None if kind == "image" else victim.n_numeric
        raw = {k: truth_rows(victim, ids, split, nn_, kind) for k, (ids, split) in groups.items()}
        num, _ = raw[stats_from]
        mu, sd = num.mean(0), num.std(0) + 1e-6
        shape = tuple(victim.feature_shape) if kind == "image" else None
        cards = () if kind == "image" else tuple(victim.cardinalities)
        return {k: Truth(n, c, mu, sd, cards, shape) for k, (n, c) in raw.items()}

    def result(self, target: AttackTarget, pred: dict, ctrl: tuple, truth: dict, n_aux: int,
               control_kind: str) -> AttackResult:
        rest = truth["rest"]
        mine, theirs = score(pred["rest"], rest), score(ctrl, rest)
        prior_num = np.broadcast_to(rest.mu, rest.num.shape)
        prior_cat = np.stack([np.bincount(truth["stats"].cat[:, j]).argmax() * np.ones(len(rest.cat), dtype=np.int64)
                              for j in range(len(rest.cards))], 1) if rest.cards else rest.cat
        prior = score((prior_num, prior_cat), rest)
        numeric = rest.num.shape[1] > 0
        key = "r2" if numeric else "categorical_accuracy"
        details = {"n_aux": n_aux, "rows_scored": int(len(rest.num)), "control_kind": control_kind,
                   "observes": "a_P = t·W_P" if target.federation.cut.name != "off" else "released rows t",
                   "mse": mine["mse"], "control_mse": theirs["mse"], "prior_mse": prior["mse"]}
        if rest.cards:
            details |= {"categorical_accuracy": mine["categorical_accuracy"],
                        "control_categorical_accuracy": theirs["categorical_accuracy"],
                        "prior_categorical_accuracy": prior["categorical_accuracy"]}
        if "test" in pred:
            details["test"] = score(pred["test"], truth["test"])[key]
        if rest.shape is not None:
            lo, hi = float(truth["stats"].num.min()), float(truth["stats"].num.max())
            img = {k: v.reshape(-1, *rest.shape) for k, v in (("rest", rest.num), ("pred", pred["rest"][0]),
                                                               ("ctrl", ctrl[0]))}
            k = min(SHOWN, len(rest.num))
            details |= {"psnr": psnr(pred["rest"][0], rest.num, lo, hi),
                        "control_psnr": psnr(ctrl[0], rest.num, lo, hi),
                        "ssim": ssim(img["pred"], img["rest"], lo, hi),
                        "control_ssim": ssim(img["ctrl"], img["rest"], lo, hi),
                        "examples": {"shape": list(rest.shape), "truth": encode_images(img["rest"][:k], lo, hi),
                                     "reconstruction": encode_images(img["pred"][:k], lo, hi)}}
        # the decoder on noise can overfit the few aux rows below the mean predictor: leakage is
        # measured against the better of the two (the mean predictor is the baseline)
        return AttackResult("r2" if numeric else "accuracy", mine[key], prior[key], baseline=prior[key],
                            control=theirs[key], details=details)


@ATTACKS.register
class FeatureReconstruction(FeatureAttack):
    name = "fr"
    summary = "feature reconstruction: a decoder from the passive messages to features, trained on aux rows"
    requires = frozenset({"passive_messages", "aux_features"})
    defaults = {"n_aux": 0, "epochs": 500, "lr": 3e-3, "hidden": 256, "eval_rows": 2000}

    def run(self, target: AttackTarget) -> AttackResult:
        aux, rest, test_ids, n_aux = self.split_rows(target)
        groups = {"stats": (aux, "train"), "aux": (aux, "train"), "rest": (rest, "train")}
        if len(test_ids):
            groups["test"] = (test_ids, "test")
        truth = self.truth(target, groups, "aux")  # the attacker standardises on the aux rows it knows
        obs = {k: observe(target, ids, split) for k, (ids, split) in groups.items() if k != "stats"}
        o_mu, o_sd = obs["aux"].mean(0), obs["aux"].std(0) + 1e-6
        obs = {k: (v - o_mu) / o_sd for k, v in obs.items()}
        c, t = self.config, truth["aux"]
        hidden, epochs, lr = int(c["hidden"]), int(c["epochs"]), float(c["lr"])
        dec = fit_net(mlp(obs["aux"].shape[1], hidden, out_width(t)), obs["aux"], t, epochs, lr,
                      self.seed)
        noise = np.random.default_rng(self.seed + 99)
        ctrl = fit_net(mlp(obs["aux"].shape[1], hidden, out_width(t)),
                       noise.standard_normal(obs["aux"].shape), t, epochs, lr, self.seed)

        def predict(net: nn.Module, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            with torch.no_grad():
                return decode(net(torch.from_numpy(x.astype(np.float32))).double().numpy(), t)

        pred = {k: predict(dec, obs[k]) for k in obs if k != "aux"}
        return self.result(target, pred, predict(ctrl, noise.standard_normal(obs["rest"].shape)), truth, n_aux,
                           "the same decoder trained on noise inputs of the same shape")


@ATTACKS.register
class GenerativeRegression(FeatureAttack):
    name = "fr-grn"
    summary = "generative regression (Luo et al.): generator + surrogate bottom fitted to the messages, no aux rows"
    requires = frozenset({"passive_messages"})
    defaults = {"epochs": 300, "lr": 1e-3, "hidden": 256, "eval_rows": 2000, "train_rows": 4000, "noise_dim": 16}

    def fit(self, x_a: np.ndarray, obs: np.ndarray, t: Truth, seed: int) -> tuple[nn.Module, float]:
        """Jointly fit G(x_A, r) and the surrogate S so that S(G(x_A, r)) ≈ the observation; returns G
        and the final fit (the attacker's objective, relative to the observations' variance)."""
        c = self.config
        hidden, width, k = int(c["hidden"]), out_width(t), int(c["noise_dim"])
        torch.manual_seed(seed)
        gen, sur = mlp(x_a.shape[1] + k, hidden, width), mlp(width, hidden, obs.shape[1])
        opt = torch.optim.Adam([*gen.parameters(), *sur.parameters()], lr=float(c["lr"]))
        xa, o = torch.from_numpy(x_a.astype(np.float32)), torch.from_numpy(obs.astype(np.float32))
        n, cards = t.num.shape[1], [cc for cc in t.cards if cc <= MAX_CARDINALITY]
        fit = float("nan")
        for _ in range(int(c["epochs"])):
            opt.zero_grad()
            out = self.bounded(gen(torch.cat([xa, torch.randn(len(xa), k)], 1)), n, cards)
            recon = ((sur(out) - o) ** 2).mean()
            loss = recon
            # the stated prior: each generated numeric feature has mean 0 and variance 1
            if n:
                loss = loss + out[:, :n].mean(0).pow(2).mean() + (out[:, :n].var(0) - 1).pow(2).mean()
            loss.backward()
            opt.step()
            fit = recon.item() / max(float(o.var(0).mean()), 1e-12)
        return gen.eval(), fit

    @staticmethod
    def bounded(out: torch.Tensor, n: int, cards: list[int]) -> torch.Tensor:
        """Standardised numeric values (tanh-bounded to ±4) and a softmax per categorical field."""
        parts, start = [4 * torch.tanh(out[:, :n] / 4)], n
        for c in cards:
            parts.append(torch.softmax(out[:, start:start + c], 1))
            start += c
        return torch.cat(parts, 1)

    def run(self, target: AttackTarget) -> AttackResult:
        _, rest, test_ids, _ = self.split_rows(target)
        fed = target.federation
        aligned = np.asarray(fed.active.aligned_ids)
        pool = np.random.default_rng(self.seed + 4343).permutation(aligned)[: int(self.config["train_rows"])]
        groups = {"stats": (aligned, "train"), "rest": (rest, "train")}
        if len(test_ids):
            groups["test"] = (test_ids, "test")
        # the marginal statistics are the stated prior (public schema), taken over all aligned rows
        truth = self.truth(target, groups, "stats")
        t = truth["stats"]

        def own(ids: np.ndarray, split: str) -> np.ndarray:  # the active party's own feature rows
            x = fed.active.features(ids, split).numpy()
            return x.reshape(len(x), -1).astype(np.float32)

        x_pool, x_eval = own(pool, "train"), {k: own(ids, split) for k, (ids, split) in groups.items() if k != "stats"}
        a_mu, a_sd = x_pool.mean(0), x_pool.std(0) + 1e-6
        obs = observe(target, pool, "train")
        o_mu, o_sd = obs.mean(0), obs.std(0) + 1e-6
        obs = (obs - o_mu) / o_sd
        gen, fit = self.fit((x_pool - a_mu) / a_sd, obs, t, self.seed)
        noise = np.random.default_rng(self.seed + 99)
        ctrl_gen, _ = self.fit((x_pool - a_mu) / a_sd, noise.standard_normal(obs.shape), t, self.seed)
        cards = [c for c in t.cards if c <= MAX_CARDINALITY]

        def predict(g: nn.Module, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            # the point estimate under squared loss: the generator's mean over noise draws
            with torch.no_grad():
                xa = torch.from_numpy(((x - a_mu) / a_sd).astype(np.float32))
                k = int(self.config["noise_dim"])
                outs = [self.bounded(g(torch.cat([xa, torch.randn(len(xa), k)], 1)), t.num.shape[1], cards)
                        for _ in range(DRAWS)]
                return decode(torch.stack(outs).mean(0).double().numpy(), t)

        pred = {k: predict(gen, x) for k, x in x_eval.items()}
        res = self.result(target, pred, predict(ctrl_gen, x_eval["rest"]), truth, 0,
                          "the same generator and surrogate fitted to noise observations of the same shape")
        res.details |= {"surrogate_fit": fit, "train_rows": int(len(pool)),
                        "prior_knowledge": "passive features' marginal mean/std and categorical cardinalities"}
        return res
