"""Evidential deep learning pieces for RISA (RISA §II-D; Sensoy et al. 2018; docs/methods.md), as pure
functions on tensors.

An *opinion* over C classes is (b, u): belief masses b ≥ 0 (shape ``(..., C)``) and an uncertainty
mass u ≥ 0 (shape ``(...)``) with Σb + u = 1. From evidence e ≥ 0: α = e + 1, S = Σα, b = e / S,
u = C / S. Back from an opinion: S = C / u, α = b·S + 1.
"""

from __future__ import annotations

import math

import torch

Opinion = tuple[torch.Tensor, torch.Tensor]


def opinion_from_evidence(evidence: torch.Tensor) -> Opinion:
    """(b, u) of the Dirichlet Dir(e + 1)."""
    n_classes = evidence.shape[-1]
    strength = evidence.sum(-1) + n_classes
    return evidence / strength.unsqueeze(-1), n_classes / strength


def alpha_from_opinion(b: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Dirichlet parameters of an opinion: S = C / u, α = b·S + 1 (RISA Eq. 5)."""
    strength = b.shape[-1] / u
    return b * strength.unsqueeze(-1) + 1.0


def reduced_yager(o1: Opinion, o2: Opinion) -> Opinion:
    """RISA's reduced Yager combination (Def. 1; the paper's Eq. 3 was lost in extraction
    fixes it): conflict c = Σ_{i≠j} b1_i b2_j; b_k = b1_k b2_k + b1_k u2 + b2_k u1; u = u1 u2 + c.

    Unlike Dempster's rule there is no 1/(1 − c) normalisation: conflict becomes uncertainty, so
    the masses still sum to 1 and stay non-negative. A vacuous opinion (u = 1) is the identity."""
    (b1, u1), (b2, u2) = o1, o2
    agree = (b1 * b2).sum(-1)
    conflict = b1.sum(-1) * b2.sum(-1) - agree
    b = b1 * b2 + b1 * u2.unsqueeze(-1) + b2 * u1.unsqueeze(-1)
    return b, u1 * u2 + conflict


def fuse(opinions: list[Opinion]) -> Opinion:
    """Fold K opinions pairwise, left to right, with the reduced Yager rule (RISA Eq. 4:
    ω = ω¹ ⊕ ω² ⊕ … ⊕ ω^K). The rule is commutative but, like Yager's, not associative (conflict
    already moved to uncertainty is not redistributed), so for K > 2 the party order matters: we
    fold in party order, the active party first."""
    out = opinions[0]
    for o in opinions[1:]:
        out = reduced_yager(out, o)
    return out


def kl_to_uniform(alpha: torch.Tensor) -> torch.Tensor:
    """KL(Dir(α) ‖ Dir(1)) per row (Sensoy et al. 2018, Eq. 5 with the all-ones prior)."""
    n_classes = alpha.shape[-1]
    s = alpha.sum(-1)
    log_norm = torch.lgamma(s) - math.lgamma(n_classes) - torch.lgamma(alpha).sum(-1)
    return log_norm + ((alpha - 1.0) * (torch.digamma(alpha) - torch.digamma(s).unsqueeze(-1))).sum(-1)


def edl_loss(alpha: torch.Tensor, y: torch.Tensor, kl_weight: float) -> torch.Tensor:
    """Per-row EDL loss: Σ_j y_j (ψ(S) − ψ(α_j)) + λ_t · KL(Dir(α̃) ‖ Dir(1)) with α̃ = y + (1 − y)⊙α,
    i.e. the KL term only penalises evidence for wrong classes (Sensoy et al. 2018, Eq. 4 + 5).
    ``y``: integer labels; ``kl_weight``: λ_t (annealed min(1, t/T) by the caller)."""
    onehot = torch.nn.functional.one_hot(y, alpha.shape[-1]).to(alpha.dtype)
    s = alpha.sum(-1, keepdim=True)
    fit = (onehot * (torch.digamma(s) - torch.digamma(alpha))).sum(-1)
    if kl_weight == 0:
        return fit
    return fit + kl_weight * kl_to_uniform(onehot + (1.0 - onehot) * alpha)


def kl_annealing(epoch: int, anneal_epochs: int) -> float:
    """λ_t = min(1, t / T): the KL term grows over the first T epochs (Sensoy et al. use T = 10)."""
    return 1.0 if anneal_epochs <= 0 else min(1.0, epoch / anneal_epochs)


def uncertainty_threshold(epoch: int, total_epochs: int, final: float, every: int = 1) -> float:
    """RISA's threshold schedule τ_t = 1 − (1 − τ_final)·t / t_last: linear from 1 (t = 0, nothing is
    dropped) to τ_final at t_last, the last epoch at which rows are checked (the last multiple of
    ``every`` before ``total_epochs``). The paper's formula was lost in extraction; its text says τ
    falls "from 1 to τ_final" over training. Ending at the last *check* (not at the last epoch, which
    no check reaches unless E − 1 is a multiple of N) is our reading: the final threshold is used."""
    last = (total_epochs - 1) // every * every if every > 0 else total_epochs - 1
    if last <= 0:
        return final
    return 1.0 - (1.0 - final) * min(1.0, epoch / last)
