"""``cae:LAMBDA`` and ``dcae:LAMBDA``: the confusional autoencoder (Zou et al. 2022, "Defending
Batch-Level Label Inference and Replacement Attacks in Vertical Federated Learning", CoAE; VFLAIR's
CAE / DCAE, SecretFlow's CoAE).

Inside the run, before training, the active party trains an autoencoder on one-hot labels of its K
classes only (no data): the encoder E maps a one-hot label y to a soft "confused" label ỹ = E(y)
(softmax), the decoder D maps ỹ back (softmax), with the paper's loss

    L = 10 · CE(y, D(ỹ)) − λ · H(ỹ) − CE(y, ỹ)

(reconstruct y; keep ỹ high-entropy with weight λ; push ỹ away from y). The cross-entropies are
taken on the softmax outputs as logits, as in the reference implementations, so the negative term
is bounded. The party then replaces its training labels by ỹ once (a label transform: nothing
downstream sees the originals), trains on them, and decodes at prediction: the head's output p
becomes D(p) (a last head layer that is the identity in training). The gradients the passive
parties receive are those of the confused labels: it targets model completion (``mc``) and gradient
scoring (``norm``, ``direction``). ``dcae`` adds DiscreteSGD's quantisation of every returned
gradient (``bins`` levels; :func:`defenses.functional.quantize`, as ``discrete-sgd``).

Reading where the paper is open: the autoencoder (VFLAIR's shape: hidden (6K + 2)², normal(0, 0.01)
initialisation) trains ``ae_steps`` Adam steps on random one-hot batches drawn from the defense's own
generator. ``cae:0`` is the undefended run (no autoencoder; VFLAIR's λ = 0 model still confuses).

Party: active. Composes with HE (labels never cross the cut layer; dcae's quantisation runs on the
gradient before it is encrypted), with methods that train on the labels through the shared loss
(soft labels; others refuse), not with a learning-rate search (its score would compare predictions
with confused labels), and with an agg head (the decoder is a layer after the head's output).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from defenses.base import DEFENSES, Defense, _finite
from defenses.functional import level_width, quantize
from securevfl.channel import MessageKind
from securevfl.errors import UserError
from securevfl.hooks import HookContext, LabelTransform, MessageTransform, ModelWrap
from securevfl.roles import ACTIVE

RECONSTRUCT_WEIGHT, CONFUSE_WEIGHT = 10.0, 1.0
"""The loss weights of the reference implementations (SecretFlow's CoAE_Loss pw, nw)."""


class ConfusionalAE(nn.Module):
    def __init__(self, n_classes: int, generator: torch.Generator) -> None:
        super().__init__()
        hidden = (6 * n_classes + 2) ** 2

        def mlp() -> nn.Sequential:
            return nn.Sequential(nn.Linear(n_classes, hidden), nn.ReLU(), nn.Linear(hidden, n_classes),
                                 nn.Softmax(dim=1))

        self.encoder, self.decoder = mlp(), mlp()
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, 0.01, generator=generator)
                nn.init.zeros_(m.bias)


def train_autoencoder(n_classes: int, lam: float, steps: int, generator: torch.Generator) -> ConfusionalAE:
    """The confusional autoencoder, trained on random one-hot labels (no data, no true label)."""
    ae = ConfusionalAE(n_classes, generator)
    opt = torch.optim.Adam(ae.parameters(), lr=1e-3)
    eye = torch.eye(n_classes)
    for _ in range(steps):
        y = eye[torch.randint(0, n_classes, (128,), generator=generator)]
        soft = ae.encoder(y)
        back = ae.decoder(soft)
        reconstruct = -(y * F.log_softmax(back, 1)).sum(1).mean()
        entropy = -(soft * torch.log(soft + 1e-12)).sum(1).mean()
        confuse = -(y * F.log_softmax(soft, 1)).sum(1).mean()
        loss = RECONSTRUCT_WEIGHT * reconstruct - lam * entropy - CONFUSE_WEIGHT * confuse
        opt.zero_grad()
        loss.backward()
        opt.step()
    return ae.requires_grad_(False).eval()


class Decode(nn.Module):
    """The head's last layer: the identity in training (the head learns the confused labels); at
    prediction, logits whose softmax is D(softmax(out)), the decoded class probabilities."""

    def __init__(self) -> None:
        super().__init__()
        self.decoder: nn.Module | None = None

    def forward(self, out: torch.Tensor) -> torch.Tensor:
        if self.training or self.decoder is None:
            return out
        return torch.log(self.decoder(torch.softmax(out, 1)).clamp_min(1e-12))


@DEFENSES.register
class CAE(Defense, LabelTransform, ModelWrap):
    name = "cae"
    primary = "lam"
    defaults = {"lam": 0.5, "ae_steps": 500}
    runs_at = frozenset({ACTIVE})
    observes = frozenset({"labels"})
    # changes the labels behind every gradient; listed so methods that return gradients accept it
    acts_on = frozenset({MessageKind.GRADIENT})
    soft_labels = True
    targets: ClassVar[tuple[str, ...]] = ("mc", "mc-plain", "norm", "direction")

    def validate(self) -> None:
        _finite(f"{self.name} lam", self.config["lam"])
        if self.config["ae_steps"] < 1:
            raise UserError(f"{self.name} ae_steps must be ≥ 1, got {self.config['ae_steps']}")
        if self.config["lam"] == 0:  # the undefended control: installed nowhere, bit-identical
            self.runs_at = frozenset()
        self.decodes: list[Decode] = []
        self.summary: dict = {}

    def wrap_head(self, head: nn.Module) -> nn.Module:
        decode = Decode()
        self.decodes.append(decode)
        layers = list(head) if isinstance(head, nn.Sequential) else [head]
        return nn.Sequential(*layers, decode)  # still a Sequential: HE splits its first linear layer

    def transform_labels(self, labels: np.ndarray, n_classes: int, features: np.ndarray | None = None
                         ) -> np.ndarray:
        ae = train_autoencoder(n_classes, self.config["lam"], self.config["ae_steps"], self.generator)
        for decode in self.decodes:
            decode.decoder = ae.decoder
        with torch.no_grad():
            table = ae.encoder(torch.eye(n_classes))  # ỹ for each class
            decoded = ae.decoder(table).argmax(1)
        self.summary = {"confused_classes": int((table.argmax(1) != torch.arange(n_classes)).sum()),
                        "decoded_correctly": int((decoded == torch.arange(n_classes)).sum()),
                        "mean_soft_label_max": round(float(table.max(1).values.mean()), 4)}
        return table.numpy().astype(np.float32)[np.asarray(labels)]

    def privacy(self) -> dict:
        return {"epsilon": None, "delta": None, "mechanism": self.name, "formal_guarantee": False,
                "protects": "the active party's labels (confused soft labels)", "lam": self.config["lam"],
                **self.summary}


@DEFENSES.register
class DCAE(CAE, MessageTransform):
    name = "dcae"
    defaults = {"lam": 0.5, "ae_steps": 500, "bins": 12}
    observes = frozenset({"labels", "messages"})

    def validate(self) -> None:
        super().validate()
        if self.config["bins"] < 2:
            raise UserError(f"dcae bins must be ≥ 2, got {self.config['bins']}")
        self.width: dict[str, float] = {}

    def __call__(self, tensor: torch.Tensor, ctx: HookContext) -> torch.Tensor:
        """The returned gradients on discrete-sgd's levels (the same quantiser, fixed at each passive
        party's first batch)."""
        if not ctx.training:
            return tensor
        half = (self.config["bins"] + 1) // 2
        if ctx.dst not in self.width:
            self.width[ctx.dst] = level_width(tensor, half)
        return quantize(tensor, self.width[ctx.dst], half)
