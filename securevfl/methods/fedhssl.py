"""FedHSSL (He et al.; docs/methods.md) and its ablations FedCSSL and FedGSSL.

Per party i: a cross-party encoder f_c^i (with SimSiam projector + predictor h_c^i) and a local
encoder f_l^i = (f_lb^i, f_lt^i) (with projector + predictor h_l^i). Pre-training alternates, one
epoch each, for ``ssl_epochs`` rounds:

1. FedCSSL on aligned rows: the active party picks the batch IDs; every party computes
   z_c = proj(f_c(x)), p_c = h_c(z_c). The active party sends z_c^1 to every passive party and each
   passive party sends z_c^i to the active party, as bytes through the channel (kind
   ``ssl_representation``, so ISO's λ_p can noise what the active party sends). Eq. 2: the active
   party minimises mean_j D(p_c^1, z_c^j), a passive party D(p_c^i, z_c^1). Received vectors are
   decoded constants: no gradient can cross parties (the stop-gradient).
2. FedGSSL on all local rows (party-local): SimSiam on two augmented views plus γ·guidance by the
   (frozen) cross-party encoder, Eq. 4.
3. PMA: every party sends f_lt∘proj_l∘h_l (top linear layer of its local encoder, projector and
   predictor, parameters and float buffers) to the server — the active party hosts it — which
   FedAvg-s them weighted by the parties' local row counts and sends the average back. Bottom layers
   stay private.

Per role: :meth:`FedHSSL.fit` is the active party's program; a passive party runs the operations of
:meth:`FedHSSL.passive_ops` when the active party asks (:mod:`securevfl.runtime`).

Fine-tuning: z^i = ½(f_c^i(x) + f_l^i(x)) (FedGSSL, FedHSSL) or f_c^i(x) (FedCSSL); a linear head
owned by the active party on the concatenation; supervised VFL on the labeled aligned rows.
"""

from __future__ import annotations

from typing import ClassVar, cast

import numpy as np
import torch
from torch import nn

from securevfl.channel import MessageKind
from securevfl.errors import UserError
from securevfl.federation import (
    STREAM_HSSL_BATCHES,
    STREAM_HSSL_CROSS_INIT,
    STREAM_HSSL_STATE,
    Federation,
    seeded_build,
)
from securevfl.hooks import HookContext, apply_hooks
from securevfl.methods.base import METHODS, Method, labeled_aligned_ids
from securevfl.methods.ssl_common import SSL_PARAMS, party_augmentation, ssl_config
from securevfl.models import build_bottom
from securevfl.parties import Party
from securevfl.progress import progress_bar
from securevfl.roles import ACTIVE
from securevfl.runtime import handles
from securevfl.ssl import SSLConfig, neg_cosine
from securevfl.ssl.objectives import SimSiam
from securevfl.storage import spill


class AveragedEncoder(nn.Module):
    """z = ½(f_c(x) + f_l(x)): the fine-tuning encoder of FedGSSL/FedHSSL."""

    def __init__(self, f_c: nn.Module, f_l: nn.Module) -> None:
        super().__init__()
        self.f_c, self.f_l = f_c, f_l
        self.out_dim = f_l.out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * (self.f_c(x) + self.f_l(x))


def top_layer(encoder: nn.Module) -> nn.Linear:
    """f_lt: the last linear layer of a bottom model (FedHSSL Table 1: 'top 1 layer of f_l')."""
    return [m for m in encoder.modules() if isinstance(m, nn.Linear)][-1]


class HybridState:
    """One party's FedHSSL models and optimizers (lives inside that party)."""

    def __init__(self, party: Party, f_c: nn.Module, cfg: SSLConfig, seed: int) -> None:
        # built on the CPU from the seeds, trained on the party's device (--device)
        self.cross = SimSiam(f_c, cfg).to(party.device)  # f_c + projector + h_c
        self.local = SimSiam(party.bottom, cfg).to(party.device)  # f_l + projector + h_l
        self.opt_c = torch.optim.Adam(self.cross.parameters(), lr=cfg.lr)
        self.opt_l = torch.optim.Adam(self.local.parameters(), lr=cfg.lr)
        self.aug = party_augmentation(party, cfg)
        self.gen = torch.Generator().manual_seed(seed)
        self.shared = nn.ModuleList([top_layer(party.bottom), self.local.projector, self.local.predictor])

    def shared_vector(self) -> torch.Tensor:
        return torch.cat([t.detach().flatten().float() for t in self.shared.state_dict().values()
                          if t.is_floating_point()])

    def load_shared_vector(self, vec: torch.Tensor) -> None:
        state, offset = self.shared.state_dict(), 0
        for k, t in state.items():
            if t.is_floating_point():
                state[k] = vec[offset:offset + t.numel()].view_as(t).to(t.dtype)
                offset += t.numel()
        self.shared.load_state_dict(state)


# ----------------------------------------------------------------------------- step 1: FedCSSL
OP_INIT, OP_CROSS, OP_LOCAL, OP_PMA, OP_INSTALL = (f"fedhssl.{n}" for n in ("init", "cross", "local", "pma",
                                                                            "install"))


def _cross_forward(party: Party, ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    st = cast(HybridState, party.method_state)  # FedHSSL keeps a HybridState in every party (fit)
    st.cross.train()
    return st.cross.embed(party.features(ids, "train"))


def _send_rep(party: Party, dst: str, z: torch.Tensor) -> None:
    ctx = HookContext(MessageKind.SSL_REPRESENTATION, party.name, dst, party.step, True)
    party.endpoint.send_tensor(dst, MessageKind.SSL_REPRESENTATION, apply_hooks(party.hooks, z.detach(), ctx))


def _cross_update(party: Party, loss: torch.Tensor) -> None:
    st = cast(HybridState, party.method_state)  # FedHSSL keeps a HybridState in every party (fit)
    st.opt_c.zero_grad(set_to_none=True)
    loss.backward()
    st.opt_c.step()


def cross_party_step(fed: Federation, ids: np.ndarray) -> float:
    """One FedCSSL mini-batch (Algorithm 1 lines 3–11), the active party's side: it picks the batch,
    sends z_c^1, receives every z_c^i and minimises mean_i D(p_c^1, z_c^i). Returns its loss."""
    a = fed.active
    for p in handles(fed):
        p.call(OP_CROSS)
        a.endpoint.send_ids(p.name, MessageKind.BATCH_IDS, ids)
    z_a, p_a = _cross_forward(a, ids)
    for p in handles(fed):
        _send_rep(a, p.name, z_a)
    received = [a.endpoint.recv_tensor(p.name, MessageKind.SSL_REPRESENTATION) for p in handles(fed)]
    loss_a = torch.stack([neg_cosine(p_a, z) for z in received]).mean()
    _cross_update(a, loss_a)
    return float(loss_a.detach())


def passive_cross_step(party: Party, req: dict) -> None:
    """One FedCSSL mini-batch at a passive party: embed the active party's batch, send z_c^i, minimise
    D(p_c^i, z_c^1) on the z_c^1 it received (a decoded constant: the stop-gradient)."""
    ids = party.requested_ids("train")
    z_p, p_p = _cross_forward(party, ids)
    _send_rep(party, ACTIVE, z_p)
    z_from_active = party.endpoint.recv_tensor(ACTIVE, MessageKind.SSL_REPRESENTATION)
    _cross_update(party, neg_cosine(p_p, z_from_active))


# ----------------------------------------------------------------------------- step 2: FedGSSL
def guided_local_epoch(party: Party, gamma: float, batch_size: int, rng: np.random.Generator) -> float:
    """Eq. 4 on all of the party's rows. The paper prints D(p1,z1)+D(p2,z1) for the SimSiam part;
    that is a typo for the symmetric SimSiam loss D(p1,z2)+D(p2,z1), which is what we use."""
    st = cast(HybridState, party.method_state)  # FedHSSL keeps a HybridState in every party (fit)
    X = party.data.X_train
    st.local.train()
    st.cross.eval()
    total, n = 0.0, 0
    order = spill.permutation(rng, len(X))  # rng.permutation's draws, on disk when large
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        if len(idx) < 2:
            continue
        x = torch.from_numpy(X[idx])
        # augmented on the CPU (its generator's stream is the same on every device), then moved
        x1, x2 = st.aug(x, st.gen).to(party.device), st.aug(x, st.gen).to(party.device)
        (z1, p1), (z2, p2) = st.local.embed(x1), st.local.embed(x2)
        with torch.no_grad():
            c1, _ = st.cross.embed(x1)
            c2, _ = st.cross.embed(x2)
        loss = 0.5 * ((neg_cosine(p1, z2) + neg_cosine(p2, z1)) + gamma * (neg_cosine(p1, c1) + neg_cosine(p2, c2)))
        st.opt_l.zero_grad(set_to_none=True)
        loss.backward()
        st.opt_l.step()
        total, n = total + float(loss.detach()), n + 1
    return total / max(n, 1)


# ------------------------------------------------------------------------------------- step 3: PMA
def pma_round(fed: Federation) -> None:
    """Partial model aggregation with the active party as the server (the paper leaves the server's
    host open; a third process would see no more than this): every passive party sends f_lt∘proj∘h_l
    and its row count, the active party FedAvg-s them with its own and sends the average back."""
    a = fed.active
    for p in handles(fed):
        p.call(OP_PMA)
    st = cast(HybridState, a.method_state)
    counts, vecs = [len(a.data.train_ids)], [st.shared_vector()]
    for p in handles(fed):
        counts.append(int(cast(int, a.endpoint.recv_json(p.name, MessageKind.MODEL_PARAMS))))  # a row count
        vecs.append(a.endpoint.recv_tensor(p.name, MessageKind.MODEL_PARAMS))
    if len({v.numel() for v in vecs}) != 1:
        raise UserError("partial model aggregation needs the same top-encoder shape at every party "
                        f"(got {sorted({v.numel() for v in vecs})} parameters); use fedgssl or equal feature blocks")
    w = torch.tensor(counts, dtype=torch.float32) / sum(counts)
    avg = (torch.stack(vecs) * w[:, None]).sum(0)
    for p in handles(fed):
        a.endpoint.send_tensor(p.name, MessageKind.MODEL_PARAMS, avg)
    st.load_shared_vector(avg)


def passive_pma(party: Party, req: dict) -> None:
    """A passive party's part of PMA: send its shared sub-model and row count, load the average."""
    st = cast(HybridState, party.method_state)
    party.endpoint.send_json(ACTIVE, MessageKind.MODEL_PARAMS, len(party.data.train_ids))
    party.endpoint.send_tensor(ACTIVE, MessageKind.MODEL_PARAMS, st.shared_vector())
    st.load_shared_vector(party.endpoint.recv_tensor(ACTIVE, MessageKind.MODEL_PARAMS))


@METHODS.register
class FedHSSL(Method):
    name = "fedhssl"
    heads = frozenset({"split"})
    head_refusal = "pre-trains cut-layer representations by cross-party SSL and fine-tunes a linear head on them"
    summary = "cross-party SSL + guided local SSL + partial model aggregation, then fine-tuning (FedHSSL)"
    passive_features_outside_loop = True  # cross-party and local SSL on raw features
    use_local: ClassVar[bool] = True
    use_pma: ClassVar[bool] = True
    defaults = {**SSL_PARAMS, "gamma": 0.5}
    sends = frozenset({MessageKind.ACTIVATION, MessageKind.GRADIENT, MessageKind.SSL_REPRESENTATION})
    # cross-party SSL exchanges the parties' representations z_c in plaintext (Eq. 2 needs them at
    # both ends); encrypting that exchange is not implemented, so --he is refused rather than implied
    supports_he = False
    he_refusal = ("exchanges the passive parties' SSL representations in plaintext during cross-party "
                  "pre-training, which --he would not protect")

    per_role = True
    # pre-training only sets the parties' encoders (f_c, f_l and the PMA average), which the
    # checkpoints hold; a resumed run builds the same modules, installs them and skips it
    resumable = True

    def _init_party(self, party: Party) -> None:
        """This party's cross-party encoder f_c and SimSiam heads, from its own seed stream."""
        cfg = ssl_config(self.params, "simsiam")
        model_cfg = self.ctx.model

        def build() -> HybridState:
            f_c = build_bottom(party.data.feature_shape, model_cfg, party.data.n_numeric, party.data.cardinalities)
            return HybridState(party, f_c, cfg, party.own_seed + STREAM_HSSL_STATE)

        party.keep_method_state(seeded_build(party.own_seed + STREAM_HSSL_CROSS_INIT, build))

    def _install(self, party: Party) -> None:
        """Fine-tuning encoder ½(f_c + f_l) (or f_c), with a fresh optimizer."""
        f_c = cast(HybridState, party.method_state).cross.encoder
        party.install(bottom=AveragedEncoder(f_c, party.bottom) if self.use_local else f_c)

    def _local(self, party: Party, shuffle_seed: int) -> float:
        cfg = ssl_config(self.params, "simsiam")
        return guided_local_epoch(party, float(self.params["gamma"]), cfg.batch_size,
                                  np.random.default_rng(shuffle_seed))

    def passive_ops(self) -> dict:
        return {OP_INIT: lambda party, req: self._init_party(party),
                OP_CROSS: passive_cross_step,
                OP_LOCAL: lambda party, req: self._local(party, int(req["shuffle_seed"])),
                OP_PMA: passive_pma,
                OP_INSTALL: lambda party, req: self._install(party)}

    def serving_layout(self, party: Party, n_classes: int) -> None:
        """The fine-tuned encoder ½(f_c + f_l) (or f_c) in place of the standard bottom model."""
        self._init_party(party)
        self._install(party)

    def fit(self, fed: Federation) -> None:
        cfg = ssl_config(self.params, "simsiam")
        self._init_party(fed.active)
        for p in handles(fed):
            p.call(OP_INIT)
        if not self.resuming(fed):  # a resumed run's pre-trained encoders come with its checkpoints
            fed.meta["pretrain_history"] = self._pretrain(fed, cfg)
        for p in handles(fed):  # each party fine-tunes its pre-trained encoder (a fresh optimizer)
            p.call(OP_INSTALL)
        self._install(fed.active)
        fed.meta["attacked_encoder"] = "½(f_c + f_l)" if self.use_local else "f_c"
        self.trainer = self.finetune(fed, labeled_aligned_ids(fed))

    def _pretrain(self, fed: Federation, cfg: SSLConfig) -> list[dict]:
        """Cross-party SSL, then (FedHSSL, FedGSSL) each party's guided local epoch and (FedHSSL) a PMA
        round, per pre-training epoch; the per-epoch losses."""
        aligned = fed.active.aligned_ids
        assert aligned is not None  # pre-training runs after alignment
        rng = np.random.default_rng(self.ctx.seed + STREAM_HSSL_BATCHES)
        history = []
        bar = progress_bar(cfg.epochs, f"{self.name} pre-training", self.ctx.progress, unit="epoch")
        for _ in range(cfg.epochs):
            order = spill.take(aligned, spill.permutation(rng, len(aligned)))
            cross = [cross_party_step(fed, order[s:s + cfg.batch_size])
                     for s in range(0, len(order), cfg.batch_size) if len(order[s:s + cfg.batch_size]) >= 2]
            record: dict[str, object] = {"cross": float(np.mean(cross)) if cross else None}
            if self.use_local:
                # each party shuffles its own rows; the active party hands out the shuffle seeds (from
                # its batch stream, as one program did) — an order of local rows, no data
                seeds = [int(rng.integers(2**32)) for _ in fed.parties]
                local = {fed.active.name: self._local(fed.active, seeds[0])}
                for p, seed in zip(handles(fed), seeds[1:], strict=True):
                    local[p.name] = float(cast(float, p.call(OP_LOCAL, reply=True, shuffle_seed=seed)))
                record["local"] = local
                if self.use_pma:
                    pma_round(fed)
            history.append(record)
            bar.set_postfix(cross_loss=f"{record['cross']:.4g}" if record["cross"] is not None else None)
            bar.update(1)
        bar.close()
        return history


@METHODS.register
class FedCSSL(FedHSSL):
    name = "fedcssl"
    summary = "FedHSSL ablation: cross-party SSL only; fine-tunes f_c"
    use_local = False
    use_pma = False


@METHODS.register
class FedGSSL(FedHSSL):
    name = "fedgssl"
    summary = "FedHSSL ablation: cross-party + guided local SSL, no partial model aggregation"
    use_pma = False
