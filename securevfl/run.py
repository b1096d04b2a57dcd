"""One training run, end to end, without attacks or defenses resolved: those come from the
composition layer (:mod:`securevfl.lab.compose`) as ready objects."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass

import torch

from securevfl import __version__
from securevfl.channel import MessageKind
from securevfl.config import RunConfig
from securevfl.cutlayer import make_cut_layer
from securevfl.data import get_dataset_entry, load_dataset, make_partition
from securevfl.data.partition import Partition
from securevfl.errors import UserError
from securevfl.federation import DEFAULT_LR, Federation
from securevfl.hooks import TensorHook
from securevfl.methods import Method, MethodContext, get_method
from securevfl.models import apply_model_preset
from securevfl.validate import validate_config

MIN_STEPS = 50
"""Fewer supervised steps than this in a run print a warning (and go to the JSON ``warnings``)."""


@dataclass
class RunOutput:
    result: dict
    """The JSON object ``train --json`` prints."""
    federation: Federation
    partition: Partition
    method: Method


def json_safe(obj):
    """The result object with NaN/inf as ``null`` (strict JSON for ``--json`` and the sweep store)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj


def privacy_report(fed: Federation) -> dict:
    """Privacy object from the active party's label defenses (every party holds its own copy of each
    defense; the active party's copy did the accounting).

    Accounted label mechanisms (``dp``, ``rr``: their reports carry a ``ledger``) compose by adding
    ε and δ (sequential composition; a true, possibly loose, bound). Heuristic defenses composed
    with them (e.g. ISO on the gradients) act on what the accounted mechanism already released, so
    they are post-processing and leave ε unchanged; without an accounted mechanism ε is ``None``."""
    # label mechanisms only: the active party's copies of feature-side (activation) defenses are idle
    reports = [r for h in fed.active.hooks if h.acts_on - {MessageKind.ACTIVATION} and (r := h.privacy()) is not None]
    if not reports:
        return {"epsilon": None, "delta": None, "mechanism": "none"}
    accounted = [r for r in reports if "ledger" in r]
    if len(reports) == 1:
        return reports[0]
    finite = bool(accounted) and all(r.get("epsilon") is not None for r in accounted)
    return {"epsilon": sum(r["epsilon"] for r in accounted) if finite else None,
            "delta": sum(r["delta"] for r in accounted) if finite else None,
            "formal_guarantee": finite, "mechanism": "+".join(r["mechanism"] for r in reports),
            "composition": "ε and δ of the accounted label mechanisms add up; the other components act on their "
                           "output (post-processing)" if accounted else "no component accounts for ε",
            "components": reports}


def feature_privacy(fed: Federation) -> dict:
    """Per passive party, the report of its feature-side (activation) defenses, if any."""
    out = {}
    for p in fed.passives:
        reports = [r for h in p.hooks if MessageKind.ACTIVATION in h.acts_on and (r := h.privacy()) is not None]
        if reports:
            out[p.name] = reports[0] if len(reports) == 1 else {"components": reports}
    return out


def build_partition(cfg: RunConfig) -> Partition:
    """The run's partition: simulated from a dataset, or built from per-party files (``csv``)."""
    if cfg.partition.active_labels_unaligned is None:
        cfg.partition.active_labels_unaligned = get_method(cfg.method).active_labels_unaligned
    if cfg.partition.test_aligned_fraction is None:
        cfg.partition.test_aligned_fraction = get_method(cfg.method).test_aligned_default
    for key, value in get_method(cfg.method).partition_defaults.items():
        if getattr(cfg.partition, key) is None:
            setattr(cfg.partition, key, value)
    entry = get_dataset_entry(cfg.dataset)
    if entry.partition is not None:
        return entry.partition(cfg.data, cfg.partition, cfg.seed)
    return make_partition(load_dataset(cfg.dataset, cfg.data), cfg.partition, cfg.seed, cfg.data)


def run_training(cfg: RunConfig, hooks: list[TensorHook] | None = None, progress: bool | None = None,
                 before_fit=None) -> RunOutput:
    validate_config(cfg)  # every entry point (CLI, config file, sweep cell, Python API) passes here
    if cfg.optim.lr is None:  # the record says which rate ran
        cfg.optim.lr = DEFAULT_LR[cfg.optim.optimizer]
    method_cls = get_method(cfg.method)
    apply_model_preset(cfg.model)
    cut = make_cut_layer(cfg.he, **cfg.he_params)
    if cfg.he != "off" and not method_cls.uses_passives:
        raise UserError(f"--he {cfg.he}: method {cfg.method} sends no passive activations, so there is nothing "
                        "to encrypt")
    if cfg.he != "off" and not method_cls.supports_he:
        raise UserError(f"--he {cfg.he}: method {cfg.method} {method_cls.he_refusal}")
    for hook in hooks or []:
        if not hook.acts_on & method_cls.sends:
            sent = ", ".join(sorted(method_cls.sends)) or "no cut-layer messages"
            raise UserError(f"defense {hook.name} acts on {', '.join(sorted(hook.acts_on))} messages, but method "
                            f"{cfg.method} sends {sent}")
        if getattr(hook, "feature_level", False) and method_cls.passive_features_outside_loop:
            raise UserError(f"defense {hook.name} bounds what the supervised loop releases about passive features, but "
                            f"method {cfg.method} also uses them outside it (pre-training, SSL or imputation)")
        if hook.needs_aligned_batches and not method_cls.aligned_batches:
            raise UserError(f"defense {hook.name} accounts per labeled example of an aligned batch, but method "
                            f"{cfg.method} trains on unaligned batches (rows mix several entities' labels)")
    # the method validates its parameters before any data is read, so a typo fails fast
    method = method_cls(MethodContext(train=cfg.train, model=cfg.model, optim=cfg.optim, seed=cfg.seed, cut=cut,
                                      hooks=hooks or [], record=cfg.record, progress=progress,
                                      params=cfg.method_params))
    if not method.interactive_layer:  # no first linear layer to split (e.g. RISA's evidential heads)
        if cfg.he != "off":
            raise UserError(f"--he {cfg.he}: method {cfg.method} with these parameters has no linear first head "
                            "layer to run the encrypted interactive layer on (risa: --method-param evidential=false)")
        cut.interactive = False
    partition = build_partition(cfg)
    torch.manual_seed(cfg.seed)
    t0 = time.perf_counter()
    fed, util = method.run(partition, before_fit)
    seconds = time.perf_counter() - t0
    warnings = list(fed.meta.pop("warnings", []))  # a method's advice about this configuration
    if 0 < fed.active.step < MIN_STEPS:  # a first try that "trains" for a handful of steps misleads
        warnings.append(f"training ran only {fed.active.step} supervised steps in all; the model is likely "
                        f"undertrained — raise --epochs or lower --batch-size (≥ {MIN_STEPS} steps)")
    if progress is not False:  # interactive use; sweeps keep them in the stored JSON instead
        for w in warnings:
            print(f"warning: {w}", file=sys.stderr)
    stats = fed.channel.stats.as_dict()
    # a file source aligns before the federation exists (its own setup channel): that traffic is part
    # of the run's cost too, under the alignment kind
    setup = int(partition.meta.get("psi_bytes", 0) or 0)
    if setup:
        stats["bytes_sent"] += setup
        stats["bytes_by_kind"]["alignment"] = stats["bytes_by_kind"].get("alignment", 0) + setup
    he = cut.describe()
    if cfg.he != "off":
        he_kinds = {k: v for k, v in stats["bytes_by_kind"].items() if k.startswith("he_")}
        steps = max(fed.active.step, 1)
        he.update({"bytes": sum(he_kinds.values()), "bytes_by_kind": he_kinds,
                   "seconds_per_step": round(he["seconds"] / steps, 4)})
    result = {
        "dataset": cfg.dataset,
        "method": cfg.method,
        "seed": cfg.seed,
        "defense": cfg.defense,
        "utility": util,
        "attacks": {},
        "privacy": {**privacy_report(fed), "features": feature_privacy(fed)},
        "cost": {"seconds": round(seconds, 4), "bytes_sent": stats["bytes_sent"], "messages": stats["messages"],
                 "bytes_by_kind": stats["bytes_by_kind"], "he": he,
                 "train_steps": fed.active.step},
        "partition": partition.summary(),
        "method_info": fed.meta,
        "warnings": warnings,
        "versions": {"securevfl": __version__, "torch": torch.__version__},
        "config": cfg.to_dict(),
    }
    return RunOutput(result, fed, partition, method)
