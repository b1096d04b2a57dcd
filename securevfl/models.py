"""Bottom models (one per party) and the active party's head. CPU-sized by design."""

from __future__ import annotations

import dataclasses
import os

import torch
from torch import nn

from securevfl.configuration.options import HEADS, ModelConfig  # noqa: F401  (their home: the light settings module)
from securevfl.errors import UserError

MODEL_PRESETS: dict[str, dict] = {
    # VFLHLP Table 1. "#dim" there is the embedded input width (Avazu 7 fields → 56, so 8 per field;
    # Criteo 26 fields → 416, so 16); "encoder 64→64→16" are the layer widths after the input, the
    # last being r^k; the head is one linear layer on the concatenation (48 = 3 × 16, 32 = 2 × 16).
    "vflhlp-avazu": {"hidden": (64, 64), "cut_dim": 16, "head_hidden": (), "emb_dim": 8},
    "vflhlp-criteo": {"hidden": (256, 128, 64), "cut_dim": 16, "head_hidden": (), "emb_dim": 16},
    # FedUD §4.3: embeddings 10, top model {256, 128}, other models {512, 256, 128} (last = r^k)
    "fedud": {"hidden": (512, 256), "cut_dim": 128, "head_hidden": (256, 128), "emb_dim": 10},
}


def apply_model_preset(cfg: ModelConfig) -> None:
    if cfg.preset is None:
        return
    if cfg.preset not in MODEL_PRESETS:
        raise UserError(f"unknown model preset {cfg.preset!r}; available: {', '.join(MODEL_PRESETS)}")
    for key, value in MODEL_PRESETS[cfg.preset].items():
        setattr(cfg, key, value)


class MLPEncoder(nn.Module):
    def __init__(self, in_dim: int, hidden: tuple[int, ...], out_dim: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        d = in_dim
        for h in hidden:
            layers += [nn.Linear(d, h), nn.ReLU()]
            d = h
        layers.append(nn.Linear(d, out_dim))
        self.net = nn.Sequential(*layers)
        self.out_dim = out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class ConvEncoder(nn.Module):
    """Small CNN for an image slice of shape (H, W)."""

    def __init__(self, shape: tuple[int, int], channels: tuple[int, ...], out_dim: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c, (h, w) = 1, shape
        for ch in channels:
            layers += [nn.Conv2d(c, ch, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2, ceil_mode=True)]
            c, h, w = ch, -(-h // 2), -(-w // 2)
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(c * h * w, out_dim)
        self.out_dim = out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x.unsqueeze(1)).flatten(1))


class TabularEncoder(nn.Module):
    """Per-field embeddings for categorical columns, concatenated with the numeric columns, then an
    MLP. Input: one float tensor ``(B, n_numeric + n_categorical)`` whose categorical part holds
    vocabulary ids (0 = unknown)."""

    def __init__(self, n_numeric: int, cardinalities: tuple[int, ...], emb_dim: int, hidden: tuple[int, ...],
                 out_dim: int) -> None:
        super().__init__()
        self.n_numeric = n_numeric
        self.embeddings = nn.ModuleList(nn.Embedding(c, emb_dim) for c in cardinalities)
        self.mlp = MLPEncoder(n_numeric + emb_dim * len(cardinalities), hidden, out_dim)
        self.out_dim = out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = [x[:, : self.n_numeric]]
        ids = x[:, self.n_numeric:].long()
        parts += [emb(ids[:, j]) for j, emb in enumerate(self.embeddings)]
        return self.mlp(torch.cat(parts, dim=1))


def estimate_model_bytes(cfg: ModelConfig, shapes: list[tuple[int, ...]], n_classes: int, interactive: bool) -> int:
    """A coarse upper estimate of the memory the models of one run take (parameters with their
    gradients and two Adam moments; the interactive layer's d × d matrices per passive party), from the
    configuration and the parties' feature shapes, before anything is allocated."""
    params = 0
    for shape in shapes:
        in_dim = 1
        for s in shape:
            in_dim *= s
        widths = [in_dim, *cfg.hidden, cfg.cut_dim] if cfg.bottom != "cnn" or len(shape) != 2 else \
            [cfg.cnn_channels[-1] * in_dim, cfg.cut_dim]  # a CNN's last linear layer bounds it
        params += sum(a * b for a, b in zip(widths, widths[1:], strict=False))
    head = [cfg.cut_dim * len(shapes), *cfg.head_hidden, n_classes]
    params += sum(a * b for a, b in zip(head, head[1:], strict=False))
    if interactive:  # W_P and the masks of the interactive layer: d × d per passive party, float64
        params += 2 * cfg.cut_dim * cfg.cut_dim * max(1, len(shapes) - 1)
    return 4 * 8 * params


def check_model_memory(cfg: ModelConfig, shapes: list[tuple[int, ...]], n_classes: int, interactive: bool) -> None:
    """A user error when :func:`estimate_model_bytes` exceeds the limit (``SECUREVFL_MAX_MODEL_BYTES``,
    default half the machine's memory), instead of an allocation that swaps or is killed."""
    from securevfl.configuration.limits import env_limit

    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        ram = 16 << 30
    limit = env_limit("SECUREVFL_MAX_MODEL_BYTES", ram // 2)
    need = estimate_model_bytes(cfg, shapes, n_classes, interactive)
    if need > limit:
        raise UserError(f"the models would need about {need / 2**30:.1f} GiB (cut_dim {cfg.cut_dim}, hidden "
                        f"{list(cfg.hidden)}), more than the limit of {limit / 2**30:.1f} GiB "
                        "(SECUREVFL_MAX_MODEL_BYTES); lower --cut-dim or the hidden widths")


def set_mode(module: nn.Module, training: bool) -> None:
    """``module.train(training)``, skipped when every submodule is already in that mode: the call walks
    the module tree setting attributes, ≈ 5 % of a small tabular split step when made every step."""
    if any(m.training != training for m in module.modules()):
        module.train(training)


def split_layers(cfg: ModelConfig) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The hidden widths of the MLP bottom model and of the head at cut position ``cfg.cut``."""
    if cfg.cut is None:
        return cfg.hidden, cfg.head_hidden
    if cfg.cut > len(cfg.hidden) + 1:
        raise UserError(f"--cut {cfg.cut}: the bottom model has only {len(cfg.hidden) + 1} layers (hidden "
                        f"{list(cfg.hidden)} and its output layer)")
    return cfg.hidden[: cfg.cut - 1], cfg.hidden[cfg.cut - 1:] + cfg.head_hidden


def build_bottom(feature_shape: tuple[int, ...], cfg: ModelConfig, n_numeric: int | None = None,
                 cardinalities: tuple[int, ...] = ()) -> nn.Module:
    """A party's bottom model for its feature block. Tabular blocks with categorical fields get a
    :class:`TabularEncoder`."""
    hidden = split_layers(cfg)[0]
    if cardinalities:
        return TabularEncoder(n_numeric or 0, cardinalities, cfg.emb_dim, hidden, cfg.cut_dim)
    kind = cfg.bottom
    if kind == "auto":
        kind = "cnn" if len(feature_shape) == 2 and feature_shape[0] >= 16 else "mlp"
    if kind == "cnn":
        if len(feature_shape) != 2:
            raise ValueError("the cnn bottom model needs image slices")
        if cfg.cut is not None:
            raise UserError("--cut moves MLP layers between the bottom model and the head; use --bottom mlp")
        return ConvEncoder(feature_shape, cfg.cnn_channels, cfg.cut_dim)
    if kind == "mlp":
        in_dim = 1
        for s in feature_shape:
            in_dim *= s
        return MLPEncoder(in_dim, hidden, cfg.cut_dim)
    raise ValueError(f"unknown bottom model {cfg.bottom!r}")


class NoFeatures(nn.Module):
    """A label-only active party's 'bottom model' (Entity Augmentation's host): a zero-width output, so
    the head reads only the passive parties' activations."""

    out_dim = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.new_zeros((x.shape[0], 0))


class SumHead(nn.Module):
    """aggVFL's head: no parameters; its input is the parties' logits side by side, its output their sum."""

    def __init__(self, n_classes: int) -> None:
        super().__init__()
        self.n_classes = n_classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(len(x), -1, self.n_classes).sum(1)


def for_head(cfg: ModelConfig, n_classes: int) -> ModelConfig:
    """``cfg`` as the bottom models are built with it: under the ``agg`` head every bottom outputs logits."""
    return dataclasses.replace(cfg, cut_dim=n_classes) if cfg.head == "agg" else cfg


def build_head(in_dim: int, n_classes: int, cfg: ModelConfig) -> nn.Module:
    if cfg.head == "agg":
        return SumHead(n_classes)
    layers: list[nn.Module] = []
    d = in_dim
    for h in split_layers(cfg)[1]:
        layers += [nn.Linear(d, h), nn.ReLU()]
        d = h
    layers.append(nn.Linear(d, n_classes))
    return nn.Sequential(*layers)


def soft_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against soft targets (rows of class probabilities), averaged over the batch."""
    return -(target * torch.log_softmax(logits, dim=1)).sum(1).mean()


def reset_parameters(model: nn.Module, include_root: bool = True, strict: bool = False) -> nn.Module:
    """Re-initialise, in place, every submodule that can (``include_root``: the model itself too).
    ``strict``: refuse a module that holds parameters but cannot reset them (it would stay trained)."""
    for m in model.modules():
        reset = getattr(m, "reset_parameters", None)
        if reset is not None and (include_root or m is not model):
            reset()
        elif strict and reset is None and any(True for _ in m.parameters(recurse=False)):
            raise TypeError(f"{type(m).__name__} holds parameters but has no reset_parameters()")
    return model
