"""``backdoor-villain``: Villain (Bai et al., "VILLAIN: Backdoor Attacks Against Vertical Split
Learning", USENIX Security 2023; SecretFlow ``VillainAttack``), the newer backdoor of issue 27.

A clean-label backdoor on the embedding a passive party sends, in two phases:

1. **Target-label inference.** For its first ``infer_epochs`` epochs the adversary trains honestly
   and keeps, for every one of its rows, the gradient the active party last returned. A row's
   gradient points towards its own class (∂L/∂z = Jᵀ(p − onehot(y))), so the rows whose gradient is
   most similar (cosine) to the mean gradient of its ``n_known`` known target rows are inferred to
   be of the target class; it poisons the ``poison`` fraction of its rows that score highest. (The
   paper infers by swapping a known target row's embedding into candidate slots and comparing the
   gradient norms; we use the same signal — the returned gradients — by direction, as the issue's
   "embedding/gradient similarity" allows, because it needs no extra exchange.)
2. **Data poisoning.** From then on it adds the stripe trigger E = M ⊙ (β·Δ) to the embedding it
   sends for those rows: Δ = (+δ, +δ, −δ, −δ, …) on the ``trigger_dims`` embedding dimensions with
   the largest standard deviation over its own recorded embeddings, δ = their mean standard
   deviation. Backdoor augmentation: each element of the trigger is dropped with probability
   ``dropout`` and the whole trigger scaled by U(0.6, 1.2) per row (SecretFlow's range), so the head
   learns a robust trigger. At inference it adds the full trigger times ``amplify``.

Because the poisoned rows carry their true (target) labels, the head itself learns trigger → target.
"""

from __future__ import annotations

import numpy as np
import torch

from attacks.backdoor.base import Backdoor
from attacks.base import ATTACKS, AttackResult, AttackTarget
from securevfl.errors import UserError

SHIFT = (0.6, 1.2)
"""Range of the per-row trigger multiplier during training (backdoor augmentation)."""


@ATTACKS.register
class Villain(Backdoor):
    """Villain by a passive party: gradient-based target-row inference, then an embedding trigger."""

    name = "backdoor-villain"
    defaults = {**Backdoor.defaults, "beta": 0.4, "trigger_dims": 0, "dropout": 0.25, "amplify": 2.0,
                "infer_epochs": 1}
    """``beta``: trigger magnitude (SecretFlow's default, 0.4; on digits at CPU scale the backdoor
    takes hold from β ≈ 1–2, see RESULTS.md); ``trigger_dims``: embedding dimensions the stripe
    covers (0: all of them, as SecretFlow's trigger does); ``dropout``: the share of trigger elements
    dropped per poisoned row in training; ``amplify``: the trigger's multiplier at inference;
    ``infer_epochs``: honest epochs that collect the gradients the inference reads, before
    poisoning starts."""

    @classmethod
    def validate(cls, config: dict) -> None:
        super().validate(config)
        if not 0 <= config["dropout"] < 1:
            raise UserError(f"attack {cls.name}: dropout must be in [0, 1), got {config['dropout']}")
        if config["infer_epochs"] < 1:
            raise UserError(f"attack {cls.name}: infer_epochs must be ≥ 1, got {config['infer_epochs']}")

    def setup(self, ids: np.ndarray) -> None:
        self.ids = ids
        self.index = {int(i): k for k, i in enumerate(ids)}
        self.grads: np.ndarray | None = None  # last returned gradient of every own training row
        self.embeds: np.ndarray | None = None  # last sent embedding of every own training row
        self.seen = np.zeros(len(ids), dtype=np.int64)  # gradients received per row
        self.sent = np.zeros(len(ids), dtype=bool)  # rows whose embedding it has sent in training
        self.poisoned: np.ndarray | None = None  # chosen once inference ends
        self.dims: np.ndarray | None = None  # the trigger's embedding dimensions
        self.poisoned_steps = 0

    def slots(self, ids: np.ndarray) -> np.ndarray:
        return np.fromiter((self.index.get(int(i), -1) for i in ids), dtype=np.int64, count=len(ids))

    def output(self, z: torch.Tensor, ids: np.ndarray, split: str, training: bool) -> torch.Tensor:
        if not (training and split == "train"):
            if self.triggering and self.dims is not None:
                return z + float(self.config["amplify"]) * self.pattern().reshape(z.shape[1:]).to(z.dtype)
            return z
        slots = self.slots(ids)
        flat = z.detach().reshape(len(z), -1).numpy()
        if self.embeds is None:
            self.embeds = np.zeros((len(self.ids), flat.shape[1]), dtype=np.float32)
        ok = slots >= 0
        self.embeds[slots[ok]] = flat[ok]  # what it sends honestly, the trigger's scale
        self.sent[slots[ok]] = True
        rows = np.flatnonzero(np.isin(ids, self.poisoned)) if self.poisoned is not None else np.zeros(0, np.int64)
        if len(rows) == 0:
            return z
        pattern = self.pattern()
        keep = self.rng.random((len(rows), pattern.numel())) >= float(self.config["dropout"])
        scale = self.rng.uniform(*SHIFT, size=(len(rows), 1))
        trigger = torch.zeros_like(z.reshape(len(z), -1))
        trigger[torch.from_numpy(rows)] = torch.from_numpy((keep * scale).astype(np.float32)) * pattern.reshape(1, -1)
        self.poisoned_steps += 1
        return z + trigger.reshape(z.shape)

    def pattern(self) -> torch.Tensor:
        """β·Δ on the trigger dimensions: (+δ, +δ, −δ, −δ, …), δ their mean standard deviation over
        the adversary's latest embeddings of its rows. The embeddings grow as training goes on (on
        digits their spread rose 0.05 → 0.66 over 10 epochs), so δ follows them rather than
        freezing at the value where inference ended."""
        assert self.embeds is not None and self.dims is not None  # set once inference ends
        delta = float(self.embeds[self.sent][:, self.dims].std(0).mean())
        stripe = np.where(np.arange(len(self.dims)) % 4 < 2, delta, -delta)
        pattern = np.zeros(self.embeds.shape[1], dtype=np.float32)
        pattern[self.dims] = float(self.config["beta"]) * stripe
        return torch.from_numpy(pattern)

    def gradient(self, grad: torch.Tensor, ids: np.ndarray) -> torch.Tensor:
        if self.poisoned is not None:
            return grad
        slots = self.slots(ids)
        ok = slots >= 0
        slots = slots[ok]
        if (self.seen[slots] >= int(self.config["infer_epochs"])).any():
            # a row comes back for one epoch more than the inference reads: its epochs are over (rows
            # the method never trains on, e.g. unlabeled ones, are never seen and never chosen)
            self.infer()
            return grad
        flat = grad.detach().reshape(len(grad), -1).numpy()
        if self.grads is None:
            self.grads = np.zeros((len(self.ids), flat.shape[1]), dtype=np.float32)
        self.grads[slots] = flat[ok]
        self.seen[slots] += 1
        return grad

    def infer(self) -> None:
        """Choose the rows to poison (the most target-like gradients) and build the trigger."""
        assert self.grads is not None and self.embeds is not None  # filled during the inference phase
        seen = self.seen > 0
        known = self.slots(self.known)
        known = known[seen[known]]
        if len(known) == 0:  # none of its known rows came up in training: nothing to compare with
            self.poisoned = np.zeros(0, dtype=self.ids.dtype)
        else:
            ref = self.grads[known].mean(0)
            norms = np.linalg.norm(self.grads, axis=1) * np.linalg.norm(ref) + 1e-12
            score = self.grads @ ref / norms
            score[~seen] = -np.inf  # rows it never trained on tell it nothing
            score[known] = np.inf  # the rows it knows are target rows come first
            n = min(self.n_poison, int(seen.sum()))
            self.poisoned = np.sort(self.ids[np.argsort(-score, kind="stable")[:n]])
        m = int(self.config["trigger_dims"]) or self.embeds.shape[1]
        self.dims = np.argsort(-self.embeds[self.sent].std(0), kind="stable")[:m]

    def run(self, target: AttackTarget) -> AttackResult:
        result = super().run(target)
        if self.poisoned is not None and len(self.poisoned):
            truth = target.truth(self.poisoned)
            result.details["inference_precision"] = float((truth == int(self.config["target"])).mean())
        result.details["poisoning_started"] = self.poisoned is not None
        result.details["poisoned_sends"] = self.poisoned_steps
        return result
