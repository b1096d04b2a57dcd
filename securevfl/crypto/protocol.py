"""The HE-protected interactive layer of SPEC §5, scheme-agnostic (CKKS and Paillier share it).

For a passive party P with bottom output z (B×d) the interactive weights W_P (d×h) — the columns of
the head's first linear layer that multiply z — are additively shared: the active party A holds V,
P holds R, W_P = V + R. P owns the key pair; only the public context/key crosses the channel.

Forward (training step t):
  P → A  [[z]], [[Rᵀ]]              (Rᵀ re-encrypted fresh each step, see below)
  A → P  [[zV + E]]                  (E: A's random mask)
  P → A  zV + E + zR                 (P decrypts and adds its own share's term)
  A: a_P = (that) − E = z W_P; A's head computes own·W_ownᵀ + b + Σ_P a_P, then the rest of the head.
Backward, with g = ∂L/∂a_P (B×h) after A's defense hooks:
  A → P  [[Gᵀ + Mᵀ]]  = gᵀ[[z]] + Mᵀ  (G = zᵀg, the gradient of W_P; M: A's mask)
  A → P  [[gRᵀ + N]]  = g[[Rᵀ]] + N,  and gVᵀ − N in plaintext
  P: ∂L/∂z = (gVᵀ − N) + (gRᵀ + N) = g W_Pᵀ, exactly the plaintext gradient.
  Weight update by momentum SGD, split: P: b_P ← μ b_P + (G + M) + λR, R ← R − η b_P;
  A: b_A ← μ b_A − M + λV, V ← V − η b_A. The sums are torch's SGD on W_P (same lr η, momentum μ,
  weight decay λ as the party optimizers), so W_P moves by −η·(velocity of G) and neither party
  ever holds G. With ``--optimizer adam`` the head's other weights use Adam but W_P is updated by
  this momentum SGD (μ = 0.9) at the configured lr: Adam's per-coordinate G² cannot be split into
  additive shares. Only ``sgd`` runs match HE-off step for step.

Deviation from SPEC §5's "[[R]] sent once, then updated homomorphically": with momentum and weight
decay, A would multiply [[velocity]] by μ and λ every step — one CKKS level (or a growing Paillier
fixed-point exponent) per step, i.e. unbounded depth. P re-encrypts Rᵀ (d·h values, one CKKS
ciphertext) with each forward instead, which keeps every product at depth 1.

Shares at the start: V = the head's initial passive-column slice (transposed), R = 0, so W_P(0) is
exactly the HE-off initialisation. The active party knows W_P(0) — it is data-independent (a
seeded random init, or zero for VFLHLP) — and after the first update W_P is hidden from A because
G never appears in plaintext; R and V drift apart as A's masks M accumulate.

Masks E, M, N are fresh uniform reals in [−s, s] (``mask_scale`` s, default 1) from A's generator
(OS entropy): statistical blinding of real values, as in FATE's Hetero-NN — not information-
theoretic. Typical blinded quantities (G = zᵀg with g = ∂(mean loss)/∂a_P, entries ~1e-2) are
one to two orders below s. A larger s hides better but V and R random-walk faster (momentum
amplifies each step's ηM about 1/(1−μ) = 10×) and must stay inside the scheme's range (CKKS
operands < 2^9, Paillier < 2^int_bits, both checked). Shares are float64.

Defenses (SPEC §4 "act on the gradient P receives"): the active party's gradient hooks run on
g = ∂L/∂a_P before the backward protocol, so everything P receives (G + M, both halves of ∂L/∂z)
is a function of the defended g̃ and A's label-independent randomness — a DP guarantee on g̃ carries
over by post-processing. Consequence: under HE, W_P is also trained with g̃ (under HE-off only the
passive bottom sees the noise). A passive party's activation hooks run on z before encryption.

Invariants (tests/test_he.py): A never holds z, R or W_P in plaintext; P never holds labels, g, G;
the context/public key that leaves P has no secret key; same seed ⇒ HE-on matches HE-off.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from securevfl.channel import Endpoint, MessageKind
from securevfl.crypto.backend import HEBackend, HETimer
from securevfl.cutlayer import ActiveEnd, CutLayer, PassiveEnd
from securevfl.errors import UserError
from securevfl.hooks import HookContext, TensorHook, apply_hooks

OptimParams = Callable[[], tuple[float, float, float]]
"""(lr, momentum, weight decay) of the owning party's optimizer, read at update time."""


def optim_params(party) -> OptimParams:
    """The party's current optimizer settings; Adam has no momentum, so 0.9 (the codebase's SGD μ)."""
    def read() -> tuple[float, float, float]:
        g = party.optimizer.param_groups[0]
        mu = float(g["momentum"]) if "momentum" in g else 0.9
        return float(g["lr"]), mu, float(g.get("weight_decay", 0.0))
    return read


class HEPassiveEnd(PassiveEnd):
    """P's end: owns the key pair and the share R (d×h) with its velocity share."""

    def __init__(self, endpoint: Endpoint, active: str, hooks: list[TensorHook], layer: HECutLayer) -> None:
        super().__init__(endpoint, active, hooks)
        self.layer = layer
        self.backend: HEBackend = layer.make_backend(None)
        self.context_sent = False
        self.R: np.ndarray | None = None
        self.b: np.ndarray | None = None
        self._z: np.ndarray | None = None
        self._training = False
        self.optim: OptimParams | None = None

    def send_forward(self, z: torch.Tensor, ctx: HookContext) -> None:
        ep, a = self.endpoint, self.active
        if not self.context_sent:
            ep.send(a, MessageKind.HE_CONTEXT, self.backend.public_bytes())
            self.context_sent = True
        zt = apply_hooks(self.hooks, z.detach(), ctx).double().numpy()
        if self.R is None:
            self.R = np.zeros((zt.shape[1], self.layer.h))
            self.b = np.zeros_like(self.R)
        self._z, self._training = zt, ctx.training
        be = self.backend
        ep.send(a, MessageKind.HE_CIPHERTEXT, be.dumps(be.encrypt(zt, frozenset({"right", "left"}))))
        if ctx.training:
            ep.send(a, MessageKind.HE_CIPHERTEXT, be.dumps(be.encrypt(self.R.T, frozenset({"left"}))))

    def return_masked_forward(self) -> None:
        """Decrypt [[zV + E]], add zR, send the still-masked sum."""
        masked = self.backend.decrypt(self.backend.loads(self.endpoint.recv(self.active, MessageKind.HE_CIPHERTEXT)))
        self.endpoint.send_tensor(self.active, MessageKind.HE_MASKED, torch.from_numpy(masked + self._z @ self.R))
        if not self._training:
            self._z = None

    def finish_backward(self) -> torch.Tensor:
        ep, a, be = self.endpoint, self.active, self.backend
        g_masked = be.decrypt(be.loads(ep.recv(a, MessageKind.HE_CIPHERTEXT))).T  # G + M (d×h)
        gr = be.decrypt(be.loads(ep.recv(a, MessageKind.HE_CIPHERTEXT)))  # gRᵀ + N
        gv = ep.recv_tensor(a, MessageKind.HE_MASKED).numpy()  # gVᵀ − N
        lr, mu, wd = self.optim()
        self.b = mu * self.b + g_masked + wd * self.R
        self.R = self.R - lr * self.b
        self._z = None
        return torch.from_numpy(gv + gr).float()

    # party state (snapshot/restore, fresh optimizer)
    def state_dict(self) -> dict:
        return {"R": None if self.R is None else self.R.copy(), "b": None if self.b is None else self.b.copy()}

    def load_state_dict(self, state: dict) -> None:
        self.R, self.b = state["R"], state["b"]

    def reset_optimizer_state(self) -> None:
        if self.b is not None:
            self.b = np.zeros_like(self.b)


class HEActiveEnd(ActiveEnd):
    """A's end: holds V (d×h) with its velocity share, the public context and this step's masks."""

    def __init__(self, endpoint: Endpoint, passive: str, hooks: list[TensorHook], layer: HECutLayer) -> None:
        super().__init__(endpoint, passive, hooks)
        self.layer = layer
        self.backend: HEBackend | None = None
        self.V: np.ndarray | None = None
        self.b: np.ndarray | None = None
        self.initial_weight: Callable[[], torch.Tensor] | None = None  # the head's W_P slice (h×d) at first use
        self.optim: OptimParams | None = None
        self.rng = np.random.default_rng()  # A's masks: OS entropy, never derived from the run seed
        self._enc_z = self._enc_rt = self._E = None

    def noise(self, shape: tuple[int, ...]) -> np.ndarray:
        s = self.layer.mask_scale
        return self.rng.uniform(-s, s, size=shape)

    def send_masked_forward(self) -> None:
        ep, p = self.endpoint, self.passive
        if self.backend is None:
            self.backend = self.layer.make_backend(ep.recv(p, MessageKind.HE_CONTEXT))
            if self.backend.has_secret():
                raise RuntimeError("the received HE context carries a secret key")
        self._enc_z = self.backend.loads(ep.recv(p, MessageKind.HE_CIPHERTEXT))
        if self.V is None:
            self.V = self.initial_weight().detach().double().numpy().T.copy()
            self.b = np.zeros_like(self.V)
        res, self._E = self.backend.right(self._enc_z, self.V, self.noise)
        ep.send(p, MessageKind.HE_CIPHERTEXT, self.backend.dumps(res))

    def receive_rt(self) -> None:
        self._enc_rt = self.backend.loads(self.endpoint.recv(self.passive, MessageKind.HE_CIPHERTEXT))

    def finish_forward(self) -> torch.Tensor:
        y = self.endpoint.recv_tensor(self.passive, MessageKind.HE_MASKED).numpy()
        out = torch.from_numpy(y - self._E).float()
        self._E = None
        return out

    def send_backward(self, grad: torch.Tensor, ctx: HookContext) -> None:
        ep, p, be = self.endpoint, self.passive, self.backend
        g = apply_hooks(self.hooks, grad, ctx).double().numpy()
        gm, M_t = be.left(g.T, self._enc_z, self.noise)  # [[Gᵀ + Mᵀ]]
        ep.send(p, MessageKind.HE_CIPHERTEXT, be.dumps(gm))
        gr, N = be.left(g, self._enc_rt, self.noise)  # [[gRᵀ + N]]
        ep.send(p, MessageKind.HE_CIPHERTEXT, be.dumps(gr))
        ep.send_tensor(p, MessageKind.HE_MASKED, torch.from_numpy(g @ self.V.T - N))
        lr, mu, wd = self.optim()
        self.b = mu * self.b - M_t.T + wd * self.V
        self.V = self.V - lr * self.b
        self._enc_z = self._enc_rt = None

    def state_dict(self) -> dict:
        return {"V": None if self.V is None else self.V.copy(), "b": None if self.b is None else self.b.copy()}

    def load_state_dict(self, state: dict) -> None:
        self.V, self.b = state["V"], state["b"]

    def reset_optimizer_state(self) -> None:
        if self.b is not None:
            self.b = np.zeros_like(self.b)


class HECutLayer(CutLayer):
    """SPEC §5 interactive layer with a pluggable scheme (``backend_cls``)."""

    backend_cls: type[HEBackend]
    validate: Callable[[dict], dict]

    def __init__(self, **params: object) -> None:
        params = dict(params)
        try:
            self.mask_scale = float(params.pop("mask_scale", 1.0))
        except (TypeError, ValueError):
            raise UserError(f"--he {self.name}: mask_scale must be a number") from None
        if not self.mask_scale > 0:
            raise UserError(f"--he {self.name}: mask_scale must be > 0")
        self.scheme_params = type(self).validate(params)
        super().__init__(**self.scheme_params, mask_scale=self.mask_scale)
        self.timer = HETimer()
        self.h: int = 0
        self.ends: list[tuple[HEPassiveEnd, HEActiveEnd]] = []

    def make_backend(self, public: bytes | None) -> HEBackend:
        if public is None:
            return self.backend_cls(self.scheme_params, timer=self.timer)
        return self.backend_cls.from_public(public, self.scheme_params, timer=self.timer)

    def make_ends(self, passive, active, hooks_passive, hooks_active, cut_dim):
        p_end = HEPassiveEnd(passive, active.party, hooks_passive, self)
        a_end = HEActiveEnd(active, passive.party, hooks_active, self)
        self.ends.append((p_end, a_end))
        return p_end, a_end

    def bind(self, active, passives: list, cut_dim: int) -> None:
        """Wire each end to its owner: the head's passive-column slice (read at first use, so methods
        may re-initialise the head before training) and the owner's optimizer settings."""
        self.h = first_linear(active.head).out_features
        for k, p in enumerate(passives):
            p_end, a_end = p.cut_end, active.cut_ends[p.name]
            lo = cut_dim + k * cut_dim  # head input = [own (cut_dim), passive 1, passive 2, ...]
            a_end.initial_weight = (lambda lo=lo: first_linear(active.head).weight[:, lo:lo + cut_dim])
            a_end.optim, p_end.optim = optim_params(active), optim_params(p)

    def complete_forward(self, p_end: HEPassiveEnd, a_end: HEActiveEnd) -> torch.Tensor:
        a_end.send_masked_forward()
        if p_end._training:
            a_end.receive_rt()
        p_end.return_masked_forward()
        return a_end.finish_forward()

    def combine(self, head: nn.Module, own: torch.Tensor, received: list[torch.Tensor]) -> torch.Tensor:
        """The head with its first layer split: own·W_ownᵀ + b + Σ_P z_P W_P (delivered as a_P)."""
        first = first_linear(head)
        pre = F.linear(own, first.weight[:, : own.shape[1]], first.bias)
        for a in received:
            pre = pre + a
        return head[1:](pre) if isinstance(head, nn.Sequential) else pre

    def describe(self) -> dict:
        be = self.ends[0][0].backend.describe() if self.ends else {}
        return {"scheme": self.name, "params": {**be, "mask_scale": self.mask_scale},
                "protocol": "SPEC §5 secret-shared interactive layer (V at active, R at passive); W_P updated by "
                            "split momentum SGD (matches sgd; under adam W_P still uses momentum SGD at the lr)",
                "threat_model": "semi-honest, no collusion; HE protects passive activations from the active party, "
                                "not labels from the passive party (use a defense for that)",
                "seconds": round(self.timer.total, 4), "seconds_by_op": self.timer.as_dict()["by_op"],
                "calls": self.timer.as_dict()["calls"]}


def first_linear(head: nn.Module) -> nn.Linear:
    first = head[0] if isinstance(head, nn.Sequential) else head
    if not isinstance(first, nn.Linear):
        raise UserError("--he needs a head whose first layer is a linear layer (RISA's evidential heads are not: "
                        "run risa with evidential: false, or without --he)")
    return first
