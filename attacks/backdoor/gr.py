"""``backdoor-gr``: the gradient-replacement backdoor (Liu, Yi & Chen, "Backdoor attacks and defenses in
feature-partitioned collaborative learning", 2020; SecretFlow ``GradReplaceAttack``).

The adversary is a passive party that knows the labels of a few of its training rows of the target
class (``n_known``). Before training it picks ``poison`` of its training rows at random. During
training it adds its trigger to its own features of those rows, and for them it applies, instead of
the gradient the active party returned, γ × the gradient the active party returned for one of its
known target rows (from the same batch, else the latest one it saw: with a handful of known rows
most batches hold none, a detail the paper leaves open). Its bottom model thus learns to map the
trigger to what moves the head towards the target class; at inference the trigger does the rest.

The trigger is a patch on the adversary's own block, like the papers' pixel patterns: its last
``trigger_size`` feature cells (numeric columns only on tabular data) set alternately to their
training maximum and minimum.

What the poisoned rows upload in training (``upload``): ``own`` (default), the bottom output of the
triggered row, so the active party also trains on it with the row's true label; ``zero``, a zero
vector, as the authors' released code does (FederatedAI/research, ``publications/vfl_backdoor``; a
later implementation uploads N(0, 1e-6) noise), so the active party never learns that the trigger
goes with the true class. The replaced gradient still reaches the adversary's bottom model as if the
row's own output had been sent (the zero is z − z.detach()).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from attacks.backdoor.base import Backdoor
from attacks.base import ATTACKS, numeric_cells
from securevfl.errors import UserError


def patch_trigger(party: Any, size: int) -> tuple[np.ndarray, torch.Tensor]:
    """The flattened cells a feature trigger sets and their values: the party's last ``size`` numeric
    (or, on images, pixel) cells, alternately at their training maximum and minimum."""
    flat = party.data.X_train.reshape(len(party.data.X_train), -1)
    n_cells = numeric_cells(party.data)
    if n_cells == 0:
        raise UserError(f"the adversary {party.name} holds no numeric feature to put a trigger on")
    cells = np.arange(max(0, n_cells - size), n_cells)
    hi, lo = flat[:, cells].max(0), flat[:, cells].min(0)
    values = np.where(np.arange(len(cells)) % 2 == 0, hi, lo)
    return cells, torch.as_tensor(values, dtype=torch.float32)


@ATTACKS.register
class GradientReplacement(Backdoor):
    """Liu, Yi & Chen's gradient-replacement backdoor by a passive party (module docstring)."""

    name = "backdoor-gr"
    defaults = {**Backdoor.defaults, "gamma": 10.0, "trigger_size": 4, "upload": "own"}
    """``gamma``: the amplification of the replaced gradients (SecretFlow's ``gamma``); ``trigger_size``:
    feature cells the trigger sets; ``upload``: what a poisoned row sends in training, ``own`` or
    ``zero`` (module docstring)."""

    @classmethod
    def validate(cls, config: dict) -> None:
        super().validate(config)
        if config["trigger_size"] < 1:
            raise UserError(f"attack {cls.name}: trigger_size must be ≥ 1, got {config['trigger_size']}")
        if config["upload"] not in ("own", "zero"):
            raise UserError(f"attack {cls.name}: upload must be own or zero, got {config['upload']!r}")

    def setup(self, ids: np.ndarray) -> None:
        rest = np.setdiff1d(ids, self.known)
        self.poisoned = np.sort(self.rng.choice(rest, min(self.n_poison, len(rest)), replace=False))
        self.cells, self.values = patch_trigger(self.party, int(self.config["trigger_size"]))
        self.target_grads: torch.Tensor | None = None
        self.replaced = self.swapped = 0

    def features(self, x: torch.Tensor, ids: np.ndarray, split: str, training: bool) -> torch.Tensor:
        if not (training and split == "train"):
            return self.trigger(x, np.full(len(ids), self.triggering))
        x = self.trigger(x, np.isin(ids, self.poisoned))
        known = np.flatnonzero(np.isin(ids, self.known))
        if len(known) and len(self.poisoned):
            # the known target rows' slots carry triggered poisoned rows instead, so the gradient
            # returned there is the target class's gradient on a triggered input (SecretFlow's swap)
            swap = self.rng.choice(self.poisoned, len(known))
            rows = torch.from_numpy(self.party.data.rows(swap, "train")).to(x.dtype)
            x = x.clone()
            x[torch.from_numpy(known)] = self.trigger(rows, np.ones(len(swap), dtype=bool))
            self.swapped += len(known)
        return x

    def output(self, z: torch.Tensor, ids: np.ndarray, split: str, training: bool) -> torch.Tensor:
        if self.config["upload"] != "zero" or not (training and split == "train"):
            return z
        poisoned = torch.from_numpy(np.isin(ids, self.poisoned)).unsqueeze(1)
        # zero in value, the identity in the backward pass: the replaced gradient trains the bottom model
        return torch.where(poisoned, z - z.detach(), z) if bool(poisoned.any()) else z

    def trigger(self, x: torch.Tensor, rows: np.ndarray) -> torch.Tensor:
        """``x`` with the trigger on the rows ``rows`` marks."""
        if not rows.any():
            return x
        flat = x.reshape(len(x), -1).clone()
        sel = torch.from_numpy(np.flatnonzero(rows))
        flat[sel.unsqueeze(1), torch.from_numpy(self.cells)] = self.values.to(flat.dtype)
        return flat.reshape(x.shape)

    def gradient(self, grad: torch.Tensor, ids: np.ndarray) -> torch.Tensor:
        known = np.isin(ids, self.known)
        if known.any():
            self.target_grads = grad[torch.from_numpy(known)].detach().clone()
        poisoned = np.flatnonzero(np.isin(ids, self.poisoned))
        if len(poisoned) == 0 or self.target_grads is None:
            return grad
        pick = torch.from_numpy(self.rng.integers(0, len(self.target_grads), len(poisoned)))
        grad = grad.clone()
        grad[torch.from_numpy(poisoned)] = float(self.config["gamma"]) * self.target_grads[pick]
        self.replaced += len(poisoned)
        return grad

    def details(self) -> dict[str, Any]:
        return {"replaced_gradients": self.replaced, "swapped_inputs": self.swapped}
