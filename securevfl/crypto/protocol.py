"""The HE-protected interactive layer, scheme-agnostic (CKKS, BFV and Paillier share it).

The layer is :mod:`securevfl.interactive` (t = tanh(z), a_P = t W_P, clip of g, momentum SGD on W_P)
computed on additive shares: the active party A holds V, the passive party P holds R, W_P = V + R,
and the velocity likewise (b = b_A + b_P). P owns the key pair; only the public context/key crosses.
Everything is fixed point: t, g, W at 2^f (``frac_bits`` f = 20), products and velocities at 2^2f,
as Python integers — Paillier and BFV compute on them exactly, CKKS approximately.

Public bounds size every mask (so the hiding is a number, κ = the backend's ``kappa``: Paillier's and
BFV's ``mask_bits`` ≥ 40, CKKS 12, see ckks.py): |t| ≤ 1 (tanh), |g| ≤ GRAD_BOUND (clip), |W_s| ≤
2^``weight_bits`` for the stored matrix W_s = W_P / 2^e (the active party's running bound,
:class:`securevfl.interactive.WeightBound`, rescales the shares before an update could pass it, and
refuses past e = MAX_RESCALE_BITS), sums over ≤ 2^``max_terms_bits`` terms (B, d, h).
Every mask and share comes fresh from a CSPRNG (:class:`securevfl.interactive.Drbg`).

Set-up (first use): W_P(0) = X·Y, X (d×d) P's secret, Y (d×h) A's (interactive.py).
  P → A  [[X]];  A → P  [[X·Y − U·2^f]] (U uniform, κ bits above |W|: A's share V = U)
  P: R = round((X·Y)/2^f) − U. Neither party learns W_P(0).
Forward:
  P → A  [[t]]
  A → P  [[t V + E]]          E: fresh uniform, κ bits above |tV|
  P → A  t V + E + t R        (rounded to the 2^-f grid under CKKS, so raw noise does not travel)
  A: a_P = (that) − E = t W_P.   In training P also sends [[Rᵀ]] (fresh encryption).
Backward, g = clip(hooks(∂L/∂a_P)), re-sharing every step so no mask accumulates in a share:
  A → P  [[Gᵀ + Mᵀ]], G = tᵀg, M = μ b_A + λ V − U_b   (U_b fresh, κ bits above the velocity bound)
  P: b_P ← (G + M) + μ b_P + λ R  = b' − U_b,  A: b_A ← U_b     (b' = μ b + G + λ W: torch's SGD)
  A → P  F = V − η U_b − U'   (U' fresh, κ bits above |W|): P: R ← R − η b_P + F,  A: V ← U'
         so W' = V' + R' = W − η b' and P's new share is W' − U' (masked by a fresh draw)
  A → P  [[g Rᵀ + g Vᵀ]] = [[g W_Pᵀ]]: P decrypts ∂L/∂t exactly as with HE off, and ∂L/∂z = ∂L/∂t ⊙ (1−t²).
What each party sees: A — [[·]] under P's key, t W_P (= a_P, by design: with W_P unknown to A; its
consequence is measured by the feature-reconstruction attack ``fr``), its own draws. P —
values each masked by a fresh uniform κ bits above the secret (tV + E, G + M, its shares R and b_P,
F) and ∂L/∂t = g W_Pᵀ, which it receives with HE off too. HE does not protect labels from P: that
is what the defenses are for; the defense point is g in both modes (interactive.py).

Paillier results are re-randomised (fresh obfuscator) and exact; BFV results are exact, switched down,
re-randomised with a fresh encryption of zero and noise-flooded (bfv.py). CKKS product slots carry the key
owner's encryption error times A's plaintext: the real parts under the term masks (κ bits), the
imaginary parts under a fresh uniform flood κ_f bits above a public bound on that noise (ckks.py;
κ_f = ``flooding_bits``, 51 at the defaults).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch

from securevfl.channel import Message, MessageKind
from securevfl.crypto.backend import (
    BackendClass,
    Encrypted,
    HEBackend,
    HETimer,
    bits_of,
    dump_ints,
    he_threads,
    load_ints,
    load_ints_meta,
)
from securevfl.cutlayer import ActiveEnd, CutLayer, EndWiring, PassiveEnd
from securevfl.hooks import HookContext, apply_hooks
from securevfl.interactive import (
    GRAD_BOUND,
    MIX_LR_GAIN,
    X_ROW_BOUND,
    Drbg,
    WeightBound,
    bound_activation,
    clip_grad,
    draw_mix_a,
    draw_mix_p,
    draw_x,
    draw_y,
    mix_g,
    mix_t,
    tanh_backward,
    to_host,
    to_party,
    unmix_grad,
)


@dataclass(frozen=True)
class Bounds:
    """Public bit bounds (integers at 2^f or 2^2f) that size masks and Paillier slots."""

    kappa: int
    f: int = 20
    weight_bits: int = 4
    grad_bits: int = 0  # GRAD_BOUND = 1
    terms_bits: int = 12

    @property
    def share(self) -> int:  # V, R, U: uniform, κ above |W| at 2^f
        return self.kappa + self.weight_bits + self.f

    @property
    def velocity(self) -> int:  # |b| ≤ (B·C + λ|W|)/(1 − μ) at 2^2f (μ 0.9: × 10 < 16, λ ≤ 1)
        return 2 * self.f + max(self.grad_bits + self.terms_bits, self.weight_bits) + 5

    @property
    def slot_bits(self) -> int:  # the largest masked result: t V + E (E κ above t V) or G + M
        fwd = self.kappa + self.f + self.share + self.terms_bits + 2
        bwd = self.kappa + self.velocity + 3
        return max(fwd, bwd) + 4


def mul_real(q: np.ndarray, c: float, f: int, shift: int = 0) -> np.ndarray:
    """round(q · c / 2^shift) for integers q (object array) and a real c quantised to 2^-f."""
    cq, k = int(round(c * 2 ** f)), f + shift
    if k <= 0:
        return np.asarray(q, dtype=object) * (cq << -k)
    return (np.asarray(q, dtype=object) * cq + (1 << (k - 1))) >> k


def shift_down(q: np.ndarray | None, k: int) -> np.ndarray | None:
    """round(q / 2^k) for integers q (the rescale of a stored share)."""
    if q is None or k == 0:
        return q
    return (np.asarray(q, dtype=object) + (1 << (k - 1))) >> k


def int_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b for integer matrices (object arrays), exact: in int64 when no partial sum can pass 2^63
    (the CKKS shares), in Python integers otherwise (Paillier's 40-bit masks)."""
    bits = [max((abs(int(v)).bit_length() for v in np.asarray(m, dtype=object).ravel()), default=0) for m in (a, b)]
    if bits[0] + bits[1] + max(1, int(a.shape[-1])).bit_length() < 63:
        return (np.asarray(a, dtype=np.int64) @ np.asarray(b, dtype=np.int64)).astype(object)
    return np.asarray(a, dtype=object) @ np.asarray(b, dtype=object)


def fixed(x: np.ndarray, f: int) -> np.ndarray:
    return np.rint(np.asarray(x, dtype=np.float64) * 2.0 ** f).astype(np.int64).astype(object)


def real(q: np.ndarray, bits: int) -> np.ndarray:
    return np.asarray(q, dtype=object).astype(np.float64) / 2.0 ** bits


class HEPassiveEnd(PassiveEnd):
    """P's end: owns the key pair, the factor X and the shares R (d×h, 2^f) and b_P (2^2f)."""

    def __init__(self, own: EndWiring, active: str, layer: HECutLayer) -> None:
        super().__init__(own, active)
        self.seed, self.hparams = own.seed, own.hparams
        self.layer = layer
        self.backend: HEBackend = layer.make_backend(None)
        self.context_sent = False
        self.R: np.ndarray | None = None
        self.b: np.ndarray | None = None
        self._t: np.ndarray | None = None  # t at 2^f (integers); with mixing t'
        self._training = False
        self.mix: np.ndarray | None = None  # X_m, the secret mixing (``layer.mixing``)
        self._t_raw: np.ndarray | None = None  # with mixing: t itself, and where the clip of t' passes
        self._passes: np.ndarray | None = None
        self.scale_exp = 0  # W_P = 2^e·(V + R): the rescales the active party announced (WeightBound)

    def send_forward(self, z: torch.Tensor, ctx: HookContext) -> None:
        ep, a, be, f = self.endpoint, self.active, self.backend, self.layer.bounds.f
        if not self.context_sent:
            ep.send(a, MessageKind.HE_CONTEXT, self.backend.public_bytes())
            self.context_sent = True
        self.keep(ctx)
        t = to_host(bound_activation(apply_hooks(self.hooks, z.detach(), ctx)))
        if self.layer.mixing:
            if self.mix is None:
                rng = Drbg.derived(self.seed, f"{ep.party}/Xmix") if self.layer.seeded_shares else Drbg()
                self.mix = draw_mix_p(rng, t.shape[1])
            self._t_raw = t
            t, self._passes = mix_t(t, self.mix)
        if self.R is None:  # set-up: [[X]] for W_P(0) = X·Y
            rng = Drbg.derived(self.seed, f"{ep.party}/X") if self.layer.seeded_shares else Drbg()
            x = fixed(draw_x(rng, t.shape[1]), f)
            ep.send(a, MessageKind.HE_CIPHERTEXT, be.dumps(be.encrypt(x, frozenset({"right"}))))
        self._t, self._training = fixed(t, f), ctx.training
        ep.send(a, MessageKind.HE_CIPHERTEXT, be.dumps(be.encrypt(self._t, frozenset({"right", "left"}))))

    def _recv_dec(self) -> np.ndarray:
        return self.backend.decrypt(self.backend.loads(self.endpoint.recv(self.active, MessageKind.HE_CIPHERTEXT)))

    def return_masked_forward(self) -> None:
        """(Set-up: take R(0).) Decrypt [[tV + E]], add tR, send the still-masked sum; in training, [[Rᵀ]]."""
        f, be = self.layer.bounds.f, self.backend
        if self.R is None:
            self.R = (self._recv_dec() + (1 << (f - 1))) >> f
            self.b = np.zeros(self.R.shape, dtype=object)
        assert self._t is not None  # send_forward set it for this step
        y = self._recv_dec() + int_matmul(self._t, self.R)
        if not be.exact:  # round to the 2^-f grid: the CKKS noise (≈ 2^-22) of y does not travel to A
            y = ((y + (1 << (f - 1))) >> f) << f
        self.endpoint.send(self.active, MessageKind.HE_MASKED, dump_ints(y))
        if self._training:
            enc_rt = be.encrypt(self.R.T, frozenset({"left"}))
            self.endpoint.send(self.active, MessageKind.HE_CIPHERTEXT, be.dumps(enc_rt))
        else:
            self._t = None

    def finish_backward(self) -> torch.Tensor:
        f = self.layer.bounds.f
        d = self._recv_dec().T  # G + M (d×h)
        # F = V/2^k − η U_b/2^(e+k) − U', k = this step's rescale (in the header when > 0)
        masked_f, meta = load_ints_meta(self.endpoint.recv(self.active, MessageKind.HE_MASKED))
        e, k = self.scale_exp, int(meta.get("rescale", 0))
        grad_t = real(self._recv_dec(), 2 * f) * 2.0 ** e  # g W_Pᵀ = ∂L/∂t (W_P = 2^e W_s)
        self.received(torch.from_numpy(grad_t))  # hook point (e): before the party's own unmixing
        # backward follows a training forward: the set-up gave R and b, send_forward t; the party's
        # end wiring always carries the layer's hparams
        assert self.R is not None and self.b is not None and self._t is not None and self.hparams is not None
        lr, mu, wd = self.hparams()
        if self.mix is not None:  # ∂L/∂t' → ∂L/∂t through P's own mixing
            assert self._t_raw is not None and self._passes is not None
            lr, grad_t = lr * MIX_LR_GAIN, unmix_grad(grad_t, self._passes, self.mix)
        self.b = d + mul_real(self.b, mu, f) + mul_real(self.R, wd, f, -f - e)  # λW = λ 2^e W_s
        self.R = shift_down(self.R, k) - mul_real(self.b, lr, f, f + e + k) + masked_f
        self.scale_exp = e + k
        t = real(self._t, f) if self._t_raw is None else self._t_raw
        out = tanh_backward(t, torch.from_numpy(grad_t))
        self._t = self._t_raw = self._passes = None
        return to_party(out.numpy(), self.endpoint.device)  # ciphertext work done: back to the party's device

    def received_gradient(self, msg: Message, previous: Message | None) -> np.ndarray | None:
        """∂L/∂t as this party decrypts it: the ciphertext [[g W_Pᵀ]] is the one that follows the
        active party's masked share refresh F (the only HE_MASKED message it sends)."""
        if msg.kind == MessageKind.HE_CIPHERTEXT and previous is not None and previous.kind == MessageKind.HE_MASKED:
            return real(self.backend.decrypt(self.backend.loads(msg.payload)), 2 * self.layer.bounds.f)
        return None

    # party state (snapshot/restore, fresh optimizer)
    def state_dict(self) -> dict:
        return {"R": None if self.R is None else self.R.copy(), "b": None if self.b is None else self.b.copy(),
                **({"mix": self.mix} if self.mix is not None else {}),
                **({"scale_exp": self.scale_exp} if self.scale_exp else {})}

    def load_state_dict(self, state: dict) -> None:
        self.R, self.b = state["R"], state["b"]
        self.mix = state.get("mix", self.mix)
        self.scale_exp = int(state.get("scale_exp", 0))

    def reset_optimizer_state(self) -> None:
        if self.b is not None:
            self.b = np.zeros(self.b.shape, dtype=object)


class HEActiveEnd(ActiveEnd):
    """A's end: the public context, the factor Y, the shares V (2^f) and b_A (2^2f), this step's masks."""

    def __init__(self, own: EndWiring, passive: str, layer: HECutLayer) -> None:
        super().__init__(own, passive)
        self.seed, self.hparams, self.head_shape = own.seed, own.hparams, own.head_shape
        self.layer = layer
        self.backend: HEBackend | None = None
        self.V: np.ndarray | None = None
        self.b: np.ndarray | None = None
        self.rng = Drbg()  # masks and share refreshes: OS entropy, never the run seed
        self._enc_t: Encrypted | None = None
        self._enc_rt: Encrypted | None = None
        self._E: np.ndarray | None = None
        self.mix: np.ndarray | None = None  # Z_m, the secret mixing (``layer.mixing``)
        self.bound: WeightBound | None = None  # the running bound on |W_P| (set up with V)
        self.scale_exp = 0  # W_P = 2^e·(V + R): the rescales the bound asked for

    def send_masked_forward(self) -> None:
        ep, p, bd = self.endpoint, self.passive, self.layer.bounds
        if self.backend is None:
            self.backend = self.layer.make_backend(ep.recv(p, MessageKind.HE_CONTEXT))
            if self.backend.has_secret():
                raise RuntimeError("the received HE context carries a secret key")
        be, f = self.backend, bd.f
        if self.V is None:  # set-up: [[X·Y − U·2^f]]
            enc_x = be.loads(ep.recv(p, MessageKind.HE_CIPHERTEXT))
            assert self.head_shape is not None  # the active party's end wiring always carries it
            h, fan_in = self.head_shape()
            y_rng = Drbg.derived(self.seed, f"{p}/Y") if self.layer.seeded_shares else Drbg()
            self.Y = y = fixed(draw_y(y_rng, enc_x.shape[1], h, fan_in), f)  # A's secret factor
            # |W_P(0)|_jk = |Σ_l X_jl Y_lk| ≤ ‖X_j‖·‖Y_k‖ ≤ X_ROW_BOUND·‖Y_k‖ (the running bound's start),
            # checked before the set-up leaves: every mask from the first message on is sized for it
            self.bound = WeightBound(X_ROW_BOUND * np.linalg.norm(real(y, f), axis=0), 2.0 ** bd.weight_bits,
                                     2.0 ** -f)
            self.bound.check_start()
            self.V = self.rng.ints(y.shape, bd.share)
            res, _ = be.right(enc_x, y, -self.V * (1 << f), 2 * f, False, self.rng, addend_bits=bd.share + f)
            ep.send(p, MessageKind.HE_CIPHERTEXT, be.dumps(res))
            self.b = np.zeros(self.V.shape, dtype=object)
            if self.layer.mixing and self.mix is None:
                z_rng = Drbg.derived(self.seed, f"{p}/Zmix") if self.layer.seeded_shares else Drbg()
                self.mix = draw_mix_a(z_rng, h)
        self._enc_t = be.loads(ep.recv(p, MessageKind.HE_CIPHERTEXT))
        zero = np.zeros((self._enc_t.shape[0], self.V.shape[1]), dtype=object)
        res, self._E = be.right(self._enc_t, self.V, zero, f + bd.share, True, self.rng, addend_bits=0)
        ep.send(p, MessageKind.HE_CIPHERTEXT, be.dumps(res))

    def finish_forward(self, training: bool) -> torch.Tensor:
        y = load_ints(self.endpoint.recv(self.passive, MessageKind.HE_MASKED))
        if training:
            assert self.backend is not None  # send_masked_forward built it
            self._enc_rt = self.backend.loads(self.endpoint.recv(self.passive, MessageKind.HE_CIPHERTEXT))
        a = real(y - self._E, 2 * self.layer.bounds.f) * 2.0 ** self.scale_exp
        self._E = None
        return to_party(a if self.mix is None else a @ self.mix, self.endpoint.device)

    def send_backward(self, grad: torch.Tensor, ctx: HookContext) -> None:
        ep, p, be, bd = self.endpoint, self.passive, self.backend, self.layer.bounds
        f = bd.f
        # backward follows a training forward: it built the backend and V, b, [[t]] and [[Rᵀ]]; the
        # party's end wiring always carries the layer's hparams
        assert be is not None and self.V is not None and self.b is not None and self.hparams is not None
        assert self._enc_t is not None and self._enc_rt is not None
        g_real = clip_grad(to_host(apply_hooks(self.hooks, grad, ctx)))
        lr, mu, wd = self.hparams()
        if self.mix is not None:  # g' = clip(g Z_mᵀ): what the shared W̃ is trained on
            g_real, lr = mix_g(g_real, self.mix), lr * MIX_LR_GAIN
        g = fixed(g_real, f)
        e = self.scale_exp
        # rescale (or refuse) before this step's update could take the stored W_s past the masks' bound
        k = (self.bound.step(real(g, f), lr, mu, wd, e) if self.bound is not None else e) - e
        u_b = self.rng.ints(self.V.shape, bd.kappa + bd.velocity)
        m = mul_real(self.b, mu, f) + mul_real(self.V, wd, f, -f - e) - u_b  # λW = λ 2^e W_s
        # |m| < 3·2^(κ + velocity): μ|b_A| and |U_b| below 2^(κ + velocity), |λ V 2^(f+e)| far below
        gm, _ = be.left(g.T, self._enc_t, m.T, 2 * f + bd.grad_bits, False, self.rng,
                        addend_bits=bd.kappa + bd.velocity + 2)  # [[Gᵀ + Mᵀ]]
        ep.send(p, MessageKind.HE_CIPHERTEXT, be.dumps(gm))
        v_next = self.rng.ints(self.V.shape, bd.share)
        # W_s' = W_s/2^k − η b'/2^(e+k): F = V/2^k − η U_b/2^(e+k) − U' (k announced in the header)
        refresh = shift_down(self.V, k) - mul_real(u_b, lr, f, f + e + k) - v_next
        ep.send(p, MessageKind.HE_MASKED, dump_ints(refresh, **({"rescale": k} if k else {})))
        self.scale_exp = e + k
        gv = int_matmul(g, self.V.T)
        gw, _ = be.left(g, self._enc_rt, gv, f + bd.grad_bits + bd.share, False, self.rng,  # [[g W_Pᵀ]]
                        addend_bits=f + bd.grad_bits + bd.share + bits_of(self.V.shape[1]))
        ep.send(p, MessageKind.HE_CIPHERTEXT, be.dumps(gw))
        self.V, self.b = v_next, u_b
        self._enc_t = self._enc_rt = None

    def state_dict(self) -> dict:
        return {"V": None if self.V is None else self.V.copy(), "b": None if self.b is None else self.b.copy(),
                **({"mix": self.mix} if self.mix is not None else {}),
                **({"bound": self.bound.state()} if self.bound is not None else {}),
                **({"scale_exp": self.scale_exp} if self.scale_exp else {})}

    def load_state_dict(self, state: dict) -> None:
        self.V, self.b = state["V"], state["b"]
        self.mix = state.get("mix", self.mix)
        self.scale_exp = int(state.get("scale_exp", 0))
        if self.V is None:
            self.bound = None
        elif "bound" in state:
            bd = self.layer.bounds
            self.bound = self.bound or WeightBound(state["bound"][0], 2.0 ** bd.weight_bits, 2.0 ** -bd.f)
            self.bound.load(state["bound"])

    def reset_optimizer_state(self) -> None:
        if self.b is not None:
            self.b = np.zeros(self.b.shape, dtype=object)
        if self.bound is not None:  # the velocity restarts at zero, and so does its bound
            self.bound.b = 0.0 * self.bound.w


MIXING_LEAKS = ("on: W_P = ρ·X_m·W̃·Z_m (X_m the passive party's secret, Z_m the active party's); over the run "
                "the active party learns t' = clip(ρ·t·X_m) up to a rotation, the passive party g' = clip(g·Z_mᵀ) up "
                "to a rotation (docs/he-protocol.md, the leakage function)")


class HECutLayer(CutLayer):
    """The interactive layer on shares, with a pluggable scheme (``backend_cls``)."""

    validate: Callable[[dict], dict]

    def __init__(self, *, interactive: bool = True, mixing: str = "off", **params: object) -> None:
        params = dict(params)
        seeded = params.pop("seeded_shares", False)
        self.seeded_shares = str(seeded).lower() in ("1", "true", "yes", "on")
        self.scheme_params = type(self).validate(params)
        super().__init__(interactive=interactive, mixing=mixing, **self.scheme_params,
                         **({"seeded_shares": True} if self.seeded_shares else {}))
        self.timer = HETimer()
        self.passive_ends: list[HEPassiveEnd] = []  # the first one's backend describes the scheme
        kappa = self.scheme_params["mask_bits"] if "mask_bits" in self.scheme_params else self._kappa()
        self.bounds = Bounds(kappa=kappa)

    @property
    def backend_cls(self) -> BackendClass:
        """The scheme's backend class (a property in each scheme's layer: its library is imported only
        when the layer is used)."""
        raise NotImplementedError

    def _kappa(self) -> int:
        from securevfl.crypto.ckks import CKKSBase  # the one scheme whose κ follows from its library's precision

        return cast(type[CKKSBase], self.backend_cls).kappa_for(self.scheme_params, Bounds.f, Bounds.weight_bits)

    def make_backend(self, public: bytes | None) -> HEBackend:
        kw = {"slot_bits": self.bounds.slot_bits, "frac_bits": self.bounds.f, "weight_bits": self.bounds.weight_bits}
        if public is None:
            return self.backend_cls(self.scheme_params, timer=self.timer, **kw)
        return self.backend_cls.from_public(public, self.scheme_params, timer=self.timer, **kw)

    def passive_end(self, own: EndWiring, active: str) -> HEPassiveEnd:
        end = HEPassiveEnd(own, active, self)
        self.passive_ends.append(end)
        return end

    def active_end(self, own: EndWiring, passive: str) -> HEActiveEnd:
        return HEActiveEnd(own, passive, self)

    def complete_forward(self, p_end: PassiveEnd, a_end: ActiveEnd) -> torch.Tensor:
        # the federation hands back the ends this layer's make_ends built
        p_end, a_end = cast(HEPassiveEnd, p_end), cast(HEActiveEnd, a_end)
        training = p_end._training
        a_end.send_masked_forward()
        p_end.return_masked_forward()
        return a_end.finish_forward(training)

    def active_forward(self, a_end: ActiveEnd, training: bool) -> torch.Tensor:
        a_end = cast(HEActiveEnd, a_end)
        a_end.send_masked_forward()
        return a_end.finish_forward(training)

    def passive_forward(self, p_end: PassiveEnd) -> None:
        cast(HEPassiveEnd, p_end).return_masked_forward()

    def describe(self) -> dict:
        be = self.passive_ends[0].backend.describe() if self.passive_ends else {}
        bd = self.bounds
        return {"scheme": self.name, "params": {**be, **({"seeded_shares": True} if self.seeded_shares else {})},
                "hiding_bits": bd.kappa, "threads": he_threads(),
                **({"flooding_bits": be["flooding_bits"]} if "flooding_bits" in be else {}),
                "bounds": {"frac_bits": bd.f, "activation": "tanh, |t| ≤ 1", "grad_clip": GRAD_BOUND,
                           "weight_bound": 2 ** bd.weight_bits, "max_terms": 2 ** bd.terms_bits},
                "protocol": "interactive layer on re-shared additive shares (V at active, R at passive), "
                            "W_P(0) = X·Y from both parties' secret factors, momentum SGD on W_P in both modes",
                "leaks": ("the active party learns a_P = tanh(z)·W_P with W_P unknown to it"
                          + ("" if be.get("exact", True) else
                             f"; CKKS: each product slot's noise (the key owner's encryption error × the active "
                             f"party's plaintext) is hidden by the term masks ({bd.kappa} bits, real parts) and "
                             f"the flood ({be.get('flooding_bits', 0)} bits, imaginary parts); the unmasked sum "
                             "∂L/∂t reads g·(W_P + ε)ᵀ, ε the passive party's own error")),
                **({"interactive_mixing": MIXING_LEAKS} if self.mixing else {}),
                **({"weight_rescale_bits": self.passive_ends[0].scale_exp}
                   if self.passive_ends and self.passive_ends[0].scale_exp else {}),
                "threat_model": "semi-honest, no collusion; HE protects passive activations from the active party, "
                                "not labels from the passive party (use a defense for that)",
                "seconds": round(self.timer.total, 4), "seconds_by_op": self.timer.as_dict()["by_op"],
                "calls": self.timer.as_dict()["calls"]}
