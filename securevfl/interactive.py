"""The interactive layer, shared by the plaintext and the HE cut layers.

For a passive party P with bottom output z (B×d) the head's first linear layer has P's block W_P
(d×h) taken out of the head and made a layer of its own between the parties, in both modes:

    t   = tanh(z)                     P: bounds every value that crosses (|t| ≤ 1, public)
    a_P = t W_P                       what the active party A receives (its leaf for ∂L/∂a_P)
    g   = clip(hooks(∂L/∂a_P), ±C)    A's defense hooks act here, then a public clip (C = GRAD_BOUND)
    ∂L/∂t = g W_Pᵀ, ∂L/∂z = ∂L/∂t ⊙ (1 − t²)   what P receives (post-processing of g)
    W_P is trained by momentum SGD (μ 0.9): b ← μ b + tᵀg + λ W_P,  W_P ← W_P − η b.

With HE off the active party holds W_P in plaintext inside its cut-layer end; with HE on W_P exists
only as additive shares (:mod:`securevfl.crypto.protocol`). Either way W_P is not among the active
party's own parameters, its optimizer is this momentum SGD (never the parties' Adam: Adam's per-
coordinate G² cannot be split into shares), and the defense point is g — so toggling HE changes only
the encryption. The head's own columns for P stay in the head but are unused (they multiply zeros in
``logits_alone``).

Initialisation: W_P(0) = X·Y with X (d×d, entries N(0, 1/d)) the passive party's secret draw and Y
(d×h, U(±1/√fan_in), the head's default init) the active party's, so neither party knows W_P(0): A
knowing Y learns at most t·X (t mixed by P's secret X), P knowing X learns W_P only up to A's Y.
Under HE the product is computed once under encryption; with HE off the active end draws both
factors from the same streams, so with the same seed both modes start from the same W_P(0).

Randomness: :class:`Drbg`, SHAKE-256 in counter mode. Seeded from ``os.urandom`` by default (a
CSPRNG); HE-off seeds the factor streams from the run seed (reproducible runs); HE-on does so only
with the test/benchmark-only ``seeded_shares`` parameter.

Secret mixing (``--interactive-mixing``, on by default under HE; issue 32's gauge leak). Plain SGD on W_P is consistent
across steps only under an orthogonal change of P's coordinates, so from a_P(s) = t(s)·W_P(s) over a
run the active party solves for t up to a rotation (h > d), and symmetrically the passive party for g
up to a rotation from ∂L/∂t (h < d). With mixing the layer is re-parameterised as
W_P = ρ·X_m·W̃·Z_m, X_m (d×d, N(0, 1/d)) the passive party's secret and Z_m (h×h, N(0, 1/h)) the active
party's, both fixed for the run; W̃ is what the parties train (shares under HE):

    t' = clip(ρ·t·X_m, ±1)      P (ρ = MIX_SCALE, public: the clip keeps the public bound |t'| ≤ 1)
    a_P = (t'·W̃)·Z_m             A
    g' = clip(g·Z_mᵀ, ±C)        A (after the defense hooks and the clip of g)
    ∂L/∂t' = g'·W̃ᵀ,  ∂L/∂t = (∂L/∂t' ⊙ [|ρ t X_m| < 1])·(ρ X_m)ᵀ      P
    W̃ trained by momentum SGD on t'ᵀg' with lr × MIX_LR_GAIN (= 1/ρ²: E[ρ² X_m X_mᵀ]·gain = I).

In W_P's coordinates this is SGD preconditioned by ρ²X_mX_mᵀ on the left and Z_mᵀZ_m on the right,
and every invertible change of coordinates Q is matched by a different secret preconditioner, so the
gauge is all of GL(d), not O(d): A's whole view is a function of t' (it learns t' up to a rotation, i.e.
t·X_m up to a linear map it cannot pin down) and P's of g' = g·Z_mᵀ (docs/he-protocol.md has the
leakage function; tests/test_he_gauge.py the attacks). On by default under HE (``auto``), off without
it (nothing is secret from the active party there); the same mixing runs with HE off when asked for
(``on``), so HE-on = HE-off step for step holds for the same setting.

Learning rate of W_P: the party's lr under ``sgd``; under ``adam`` the optimizer's lr is an Adam
step size, far too small for SGD, so W_P uses ``OptimConfig.interactive_lr`` (default 0.1, FATE
Hetero-NN's ``interactive_layer_lr`` default).
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from securevfl.errors import UserError

GRAD_BOUND = 1.0
"""Public per-entry clip of g = ∂L/∂a_P (both modes). g of a mean loss is ≪ 1 in practice, so the clip
only binds under heavy defense noise; it is what lets HE masks be sized from a public bound."""
MOMENTUM = 0.9
DEFAULT_INTERACTIVE_LR = 0.1

MIX_SCALE = 0.5
"""ρ: t' = clip(ρ·t·X_m, ±1). Entries of t·X_m have std ≤ 1 (|t| ≤ 1, X_m ~ N(0, 1/d)), so the clip
binds on ≲ 5 % of entries at ρ = 1/2 even for saturated t."""
MIX_LR_GAIN = 1.0 / MIX_SCALE ** 2
"""W̃'s learning-rate gain under mixing: the left preconditioner ρ²X_mX_mᵀ has mean ρ²·I."""
MIXING = ("auto", "off", "on")
"""``--interactive-mixing``: ``auto`` (the default) is ``on`` under HE and ``off`` without it
(:func:`mixing_for`)."""


def mixing_for(setting: str, he: str) -> str:
    """The mixing a run gets: ``auto`` closes the gauge leak wherever W_P is secret (HE on) and keeps
    the plain layer where the active party sees the activations anyway (HE off)."""
    if setting == "auto":
        return "off" if he in ("off", None) else "on"
    return setting

HParams = Callable[[], tuple[float, float, float]]
"""(lr, momentum, weight decay) of the interactive layer, read at update time (lr search changes lr)."""


# ------------------------------------------------------------------------------------- randomness
class Drbg:
    """SHAKE-256 in counter mode over a 32-byte seed (``os.urandom`` unless given)."""

    def __init__(self, seed: bytes | None = None) -> None:
        self.seed = os.urandom(32) if seed is None else hashlib.sha256(seed).digest()
        self.counter = 0

    @classmethod
    def derived(cls, run_seed: int, label: str) -> Drbg:
        return cls(f"securevfl/{run_seed}/{label}".encode())

    def bytes(self, n: int) -> bytes:
        out = hashlib.shake_256(self.seed + self.counter.to_bytes(8, "little")).digest(n)
        self.counter += 1
        return out

    def ints(self, shape: tuple[int, ...], bits: int) -> np.ndarray:
        """Uniform integers in [−2^(bits−1), 2^(bits−1)) (object array of Python ints)."""
        n, nb = math.prod(shape), (bits + 7) // 8
        buf, mask, off = self.bytes(n * nb), (1 << bits) - 1, 1 << (bits - 1)
        vals = [(int.from_bytes(buf[i * nb:(i + 1) * nb], "little") & mask) - off for i in range(n)]
        return np.array(vals + [0], dtype=object)[:n].reshape(shape)

    def uniform(self, shape: tuple[int, ...], lo: float = 0.0, hi: float = 1.0) -> np.ndarray:
        u = np.frombuffer(self.bytes(8 * math.prod(shape)), dtype="<u8") >> np.uint64(11)
        return lo + (hi - lo) * (u.astype(np.float64) / 2.0 ** 53).reshape(shape)

    def normal(self, shape: tuple[int, ...]) -> np.ndarray:
        u1, u2 = self.uniform(shape), self.uniform(shape)
        return np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2 * np.pi * u2)


X_ROW_BOUND = 2.0
"""Public bound on the 2-norm of every row of X (draw_x scales down the rare row above it: for d ≥ 8
a row's norm² is χ²_d/d, above 4 with probability < 1e-4), so |W_P(0)| ≤ 2·‖Y's column‖ — the start
of the active party's running weight bound."""


def draw_x(rng: Drbg, d: int) -> np.ndarray:
    """P's secret factor X (d×d), entries N(0, 1/d), rows of norm ≤ X_ROW_BOUND."""
    x = rng.normal((d, d)) / math.sqrt(d)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.where(norms > X_ROW_BOUND, x * (X_ROW_BOUND / np.maximum(norms, 1e-300)), x)


def draw_y(rng: Drbg, d: int, h: int, fan_in: int) -> np.ndarray:
    """A's secret factor Y (d×h), the head's default init U(±1/√fan_in)."""
    bound = 1.0 / math.sqrt(fan_in)
    return rng.uniform((d, h), -bound, bound)


def init_factors(x_rng: Drbg, y_rng: Drbg, d: int, h: int, fan_in: int) -> tuple[np.ndarray, np.ndarray]:
    """X (P's secret) and Y (A's secret); W_P(0) = X·Y."""
    return draw_x(x_rng, d), draw_y(y_rng, d, h, fan_in)


def draw_mix_p(rng: Drbg, d: int) -> np.ndarray:
    """P's secret mixing X_m (d×d), entries N(0, 1/d): far from orthogonal, so t·X_m is not t up to a
    rotation (its singular values spread over (0, 2))."""
    return draw_x(rng, d)


def draw_mix_a(rng: Drbg, h: int) -> np.ndarray:
    """A's secret mixing Z_m (h×h), entries N(0, 1/h)."""
    return rng.normal((h, h)) / math.sqrt(h)


def mix_t(t: np.ndarray, xm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """P: t' = clip(ρ t X_m, ±1) and where the clip passes the gradient."""
    pre = MIX_SCALE * (t @ xm)
    return np.clip(pre, -1.0, 1.0), np.abs(pre) < 1.0


def unmix_grad(grad_mixed: np.ndarray, passes: np.ndarray, xm: np.ndarray) -> np.ndarray:
    """P: ∂L/∂t from ∂L/∂t' (the clip's and the mixing's backward)."""
    return (grad_mixed * passes) @ (MIX_SCALE * xm).T


def mix_g(g: np.ndarray, zm: np.ndarray) -> np.ndarray:
    """A: g' = clip(g Z_mᵀ, ±C), the gradient with respect to t'·W̃ (public bound kept)."""
    return clip_grad(g @ zm.T)


# -------------------------------------------------------------------------------- the update rule
def velocity(b, grad, w, mu: float, wd: float):
    """Momentum SGD (torch's): b ← μ b + (grad + λ w). Linear, so it applies to shares."""
    return mu * b + grad + wd * w


def clip_grad(g: np.ndarray) -> np.ndarray:
    return np.clip(g, -GRAD_BOUND, GRAD_BOUND)


def interactive_hparams(party, interactive_lr: float | None) -> HParams:
    def read() -> tuple[float, float, float]:
        group = party.optimizer.param_groups[0]
        adam = "betas" in group
        lr = (interactive_lr or DEFAULT_INTERACTIVE_LR) if adam else float(interactive_lr or group["lr"])
        return float(lr), MOMENTUM, float(group.get("weight_decay", 0.0))
    return read


def to_host(t: torch.Tensor) -> np.ndarray:
    """The CPU handoff (``--device``): W_P's float64 arithmetic and HE run in numpy on the CPU, so a
    tensor from the party's device enters here."""
    return t.detach().cpu().double().numpy()


def to_party(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """The way back: a CPU result as float32 on the owning party's device."""
    out = torch.from_numpy(a).float()
    return out if device.type == "cpu" else out.to(device)
MAX_RESCALE_BITS = 8
"""How far the HE layer may rescale W_P's stored shares (W_P = 2^e·W_s, e ≤ this): each bit costs one
of W_P's 2^-f fixed-point bits; past it the run is refused."""


class WeightBound:
    """The active party's running bound on |W_P| (per column, entrywise, in W_P's own units), kept under
    HE where the masks are sized for |W_s| ≤ 2^weight_bits, W_s the stored shares' matrix. Sound from
    what the active party holds: |t| ≤ 1 (|t'| ≤ 1 with mixing) bounds |tᵀg|_jk by Σ_i |g_ik|, so
    b ← μb + tᵀg + λW and W ← W − ηb give |b| ≤ μ|b| + Σ_i|g_i| + λ|W| and |W| ≤ |W| + η|b| (+ the
    rounding). Conservative — it adds every step's worst case where SGD's steps mostly cancel — so
    instead of refusing when it passes the masks' bound, the layer rescales: :meth:`step` returns the
    exponent e with bound ≤ 2^(weight_bits + e), and the parties store W_s = W_P / 2^e (the function is
    unchanged; W_P loses e fractional bits). Past MAX_RESCALE_BITS: a one-line UserError."""

    def __init__(self, w0: np.ndarray, limit: float, ulp: float) -> None:
        self.w, self.b, self.limit, self.ulp, self.steps = np.asarray(w0, dtype=float), 0.0 * w0, limit, ulp, 0

    def check_start(self) -> None:
        """The bound at the set-up must already hold: the set-up and the first forward are masked for
        |W_P(0)| ≤ the masks' bound, and no rescale has been agreed yet (the default draws keep it ≤ 2
        against 16; a non-default factor or initialisation can pass it).

        Raises:
            UserError: before any masked value is sent."""
        if self.w.max() > self.limit:
            raise UserError(f"--he: the interactive layer's initial weights are bounded by {self.w.max():.3g}, above "
                            f"the masks' bound |W_P| ≤ {self.limit:g}: the set-up would go out with weaker hiding than "
                            "κ; use the default initialisation of the head (or a larger weight bound)")

    def step(self, g: np.ndarray, lr: float, mu: float, wd: float, exp: int) -> int:
        """Account for one update with this step's g (the gradient the shared matrix is trained on);
        returns the rescale exponent the stored shares need after it (≥ ``exp``, the current one)."""
        ulp = self.ulp * 2.0 ** exp  # one stored rounding unit, in W_P's units
        b = mu * self.b + np.abs(g).sum(0) + wd * self.w + ulp
        w = self.w + lr * b + 2 * ulp  # the update's and the rescale's roundings
        need = max(exp, math.ceil(math.log2(w.max() / self.limit)) if w.max() > self.limit else 0)
        if need > MAX_RESCALE_BITS:
            raise UserError(f"--he: the public running bound on the interactive layer's weights would pass "
                            f"|W_P| ≤ {self.limit * 2 ** MAX_RESCALE_BITS:g} (the masks' bound {self.limit:g} "
                            f"after the largest rescale, 2^{MAX_RESCALE_BITS}) at step {self.steps + 1} "
                            f"(bound {w.max():.3g}): lower the interactive layer's learning rate (--lr under sgd, "
                            "optim.interactive_lr under adam) or train fewer steps")
        self.w, self.b, self.steps = w, b, self.steps + 1
        return need

    def state(self) -> tuple[np.ndarray, np.ndarray, int]:
        return self.w.copy(), np.array(self.b, copy=True), self.steps

    def load(self, state: tuple[np.ndarray, np.ndarray, int]) -> None:
        self.w, self.b, self.steps = state[0].copy(), np.array(state[1], copy=True), state[2]


def bound_activation(z: torch.Tensor) -> torch.Tensor:
    return torch.tanh(z)


def tanh_backward(t: np.ndarray | torch.Tensor, grad_t: torch.Tensor) -> torch.Tensor:
    t = torch.as_tensor(t, dtype=grad_t.dtype)
    return grad_t * (1.0 - t * t)


# ------------------------------------------------------------------------------------- the head
def first_linear(head: nn.Module) -> nn.Linear:
    """The head's input layer, which the interactive layer splits by party; it must be linear."""
    first = head[0] if isinstance(head, nn.Sequential) else head
    if not isinstance(first, nn.Linear):
        raise UserError("--he needs a head whose first layer is a linear layer (RISA's evidential heads are not: "
                        "run risa with evidential: false, or without --he)")
    return first


def split_combine(head: nn.Module, own: torch.Tensor, received: list[torch.Tensor]) -> torch.Tensor:
    """The head with its first layer split: own·W_ownᵀ + b + Σ_P a_P, then the rest of the head."""
    first = first_linear(head)
    pre = F.linear(own, first.weight[:, : own.shape[1]], first.bias)
    for a in received:
        pre = pre + a
    return head[1:](pre) if isinstance(head, nn.Sequential) else pre
