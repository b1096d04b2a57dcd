"""The run pipeline below the lab: what an in-process run (:func:`securevfl.lab.compose.execute`) and a
deployed party (:mod:`securevfl.deploy`) both need to set up a run, and nothing of the attack lab.

A run's configuration is resolved (:func:`resolve_config`), its defenses parsed (:func:`defense_hooks`),
its method and cut layer built and every cross-component rule checked before any data is read
(:func:`prepare_method`, :func:`check_compatibility`), then trained and evaluated
(:func:`train_and_evaluate`). Attacks enter only as classes the lab passes in (``attack_specs``), so
this module, and a passive party's process, never imports the ``attacks`` package (issue 62; the
defenses are a party's own protection and live below both)."""

from __future__ import annotations

import copy
import dataclasses
import math
import sys
from collections.abc import Sequence
from typing import Any

import torch

import defenses as defense_lib
from securevfl.channel import MessageKind
from securevfl.config import RunConfig
from securevfl.configuration.validate import validate_config
from securevfl.cutlayer import CUT_LAYERS, CutLayer, make_cut_layer
from securevfl.data import DATASETS, load_dataset, make_partition
from securevfl.data.partition import Partition, PartitionSpec
from securevfl.errors import UserError
from securevfl.federation import DEFAULT_LR, Federation
from securevfl.hooks import ActiveStep, LabelTransform, PartyHook
from securevfl.methods import METHODS, Method, MethodContext
from securevfl.models import apply_model_preset
from securevfl.progress import phase
from securevfl.runtime import run_in_process

MIN_STEPS = 50
"""Fewer supervised steps than this in a run print a warning (and go to the JSON ``warnings``)."""

AttackSpec = tuple[Any, dict]
"""An attack class of the lab (:class:`attacks.base.Attack`) and its parameters: what the rules here
read of it are its declared class attributes (``name``, ``heads``, ``threat_model``, ...)."""


def train_and_evaluate(method: Method, fed: Federation) -> dict:
    """Train and evaluate: each party runs its own program in its own thread (:mod:`securevfl.runtime`)
    for a method written per role; one program drives them all otherwise."""
    if type(method).per_role:
        def active_program(view: Federation) -> dict:
            method.train(view)
            with phase("evaluation", method.ctx.progress):
                return method.evaluate(view)

        utility = run_in_process(fed, method, active_program)
        method.attach(fed)
        return utility
    method.train(fed)
    with phase("evaluation", method.ctx.progress):
        return method.evaluate(fed)


def prepare_method(cfg: RunConfig, defenses: Sequence[PartyHook], attack_specs: Sequence, *, record: bool,
                   progress: bool | None, device: torch.device, audit: str | None = None) -> tuple[Method, CutLayer]:
    """The run's method and cut layer, and every check of the combination that needs no data: the
    one set-up of an in-process run (:func:`execute`) and a deployed one (:mod:`securevfl.deploy`).

    Raises:
        UserError: a bad method parameter or an incompatible combination, before any data is read."""
    method = METHODS.get(cfg.method)(MethodContext(  # validates the method's parameters
        train=cfg.train, model=cfg.model, optim=cfg.optim, seed=cfg.seed, hooks=list(defenses),
        record=record, progress=progress, params=cfg.method_params, device=device,
        passive_seeds=tuple(cfg.passive_seeds)))
    check_compatibility(cfg, method, list(defenses), list(attack_specs), audit=audit)
    # no first linear layer to split (e.g. RISA's evidential heads, the agg head): plain concatenation
    interactive = method.interactive_layer and cfg.model.head == "split"
    if cfg.model.interactive_mixing == "on" and not interactive:
        raise UserError(f"--interactive-mixing on: {cfg.method} with the {cfg.model.head} head has no interactive "
                        "layer to mix")
    return method, make_cut_layer(cfg.he, interactive=interactive, mixing=cfg.model.interactive_mixing,
                                  **cfg.he_params)


def defense_hooks(cfg: RunConfig) -> list[PartyHook]:
    """The hooks of ``cfg.defense`` (a saved model is rebuilt with the same ones to predict)."""
    return list(defense_lib.parse_defense(cfg.defense, mechanism_seed=cfg.mechanism_seed))


def resolve_config(cfg: RunConfig, transcript: bool = False) -> RunConfig:
    """A validated copy of ``cfg`` with everything the run will use filled in: the optimizer's
    default learning rate, the model preset, the method's partition defaults, and channel recording
    when an attack reads the transcript. The caller's object is left as it was.

    Raises:
        UserError: the first value of the wrong type or range."""
    validate_config(cfg)
    cfg = copy.deepcopy(cfg)
    if cfg.optim.lr is None:  # the record says which rate ran
        cfg.optim.lr = DEFAULT_LR[cfg.optim.optimizer]
    apply_model_preset(cfg.model)
    cfg.partition = partition_spec(cfg)
    cfg.record = cfg.record or transcript
    return cfg


def partition_spec(cfg: RunConfig) -> PartitionSpec:
    """``cfg.partition`` with the fields the user left ``None`` set to the method's defaults."""
    defaults = METHODS.get(cfg.method).default_partition()
    unset = {k: v for k, v in defaults.items() if getattr(cfg.partition, k) is None}
    return dataclasses.replace(cfg.partition, **unset)


def build_partition(cfg: RunConfig) -> Partition:
    """The run's partition: simulated from a dataset, or built from per-party files (``csv``)."""
    spec = partition_spec(cfg)
    entry = DATASETS.get(cfg.dataset)
    if entry.partition is not None:
        return entry.partition(cfg.data, spec, cfg.seed)
    return make_partition(load_dataset(cfg.dataset, cfg.data), spec, cfg.seed, cfg.data)


def check_compatibility(cfg: RunConfig, method: Method, defenses: Sequence[PartyHook],
                        attack_specs: Sequence[AttackSpec], audit: str | None = None) -> None:
    """Every cross-component rule of a run, in one place: HE, defenses and attacks against what
    the method does, and the partition against what the method needs.

    Raises:
        UserError: one line naming the combination that cannot run."""
    m = type(method)
    CUT_LAYERS.get(cfg.he)  # an unknown scheme is named as such, before any rule about it
    check_head(cfg, m, defenses, attack_specs)
    if cfg.he != "off":
        if not m.uses_passives:
            raise UserError(f"--he {cfg.he}: method {cfg.method} sends no passive activations, so there is nothing "
                            "to encrypt")
        if not m.supports_he:
            raise UserError(f"--he {cfg.he}: method {cfg.method} {m.he_refusal}")
    rules = [h.name for h in defenses if isinstance(h, ActiveStep)]
    for hook in defenses:
        if getattr(hook, "uses_labels", False) and rules:
            raise UserError(f"defense {hook.name} adds a loss term that reads the labels, outside {rules[0]}'s "
                            f"per-example clipping, so {rules[0]}'s ε would not bound it; use one of them")
        if not hook.acts_on & m.sends:
            sent = ", ".join(sorted(m.sends)) or "no cut-layer messages"
            raise UserError(f"defense {hook.name} acts on {', '.join(sorted(hook.acts_on))} messages, but method "
                            f"{cfg.method} sends {sent}")
        if hook.bounds_features and m.passive_features_outside_loop:
            raise UserError(f"defense {hook.name} bounds what the supervised loop releases about passive features, but "
                            f"method {cfg.method} also uses them outside it (pre-training, SSL or imputation)")
        if hook.soft_labels and not m.soft_label_training:
            raise UserError(f"defense {hook.name} trains on soft (class-probability) labels, which method "
                            f"{cfg.method} cannot train on (splitnn can)")
        if hook.soft_labels and len(cfg.train.lr_grid) > 1:
            raise UserError(f"defense {hook.name} trains on confused soft labels, so a learning-rate search cannot "
                            "score candidates against them; give one learning rate")
        if hook.needs_aligned_batches and not m.aligned_batches:
            raise UserError(f"defense {hook.name} accounts per labeled example of an aligned batch, but method "
                            f"{cfg.method} trains on unaligned batches (rows mix several entities' labels)")
    if audit == "labels" and (MessageKind.GRADIENT not in m.sends or not m.aligned_batches or not m.uses_passives):
        raise UserError(f"--audit: method {cfg.method} returns no per-example gradients of aligned labeled batches to "
                        "a passive party, so the label audit's adversary has nothing to score")
    if audit == "features" and (MessageKind.ACTIVATION not in m.sends or not m.uses_passives):
        raise UserError(f"--audit side=features: method {cfg.method} sends no passive activations to the active party")
    if cfg.he != "off" and not method.interactive_layer:
        raise UserError(f"--he {cfg.he}: method {cfg.method} with these parameters has no linear first head "
                        "layer to run the encrypted interactive layer on (risa: --method-param evidential=false)")
    names = [cls.name for cls, _ in attack_specs]
    if len(set(names)) < len(names):  # results are keyed by attack name
        dup = next(n for n in names if names.count(n) > 1)
        raise UserError(f"attack {dup} is listed twice; run one setting per run (a sweep file's list of values "
                        "sweeps a parameter)")
    if sum(cls.during_training for cls, _ in attack_specs) > 1:
        raise UserError("at most one attack may act during training (each replaces the adversary's optimizer)")
    if cfg.data.task == "regression":  # said up front: refuse before any data is read
        check_task(cfg, True, method, defenses, attack_specs)
    if not cfg.partition.active_features and not m.label_only_host:
        raise UserError(f"method {cfg.method} needs features at the active party; a label-only host "
                        "(partition.active_features: false) works with entity-aug")


def check_task(cfg: RunConfig, regression: bool, method: Method, defenses: Sequence[PartyHook],
               attack_specs: Sequence[AttackSpec]) -> None:
    """A regression (continuous label) runs with the methods, defenses and attacks that do not need
    classes: label-inference attacks (``threat_model`` passive: they guess a class) and label
    transforms (randomized response re-draws a class) are refused; feature attacks and the defenses
    on messages and gradients (including label DP-SGD, which clips per-example losses of any kind) run.

    Raises:
        UserError: one line naming what a continuous label rules out."""
    if cfg.data.task == "regression" and not regression:
        raise UserError(f"--task regression: dataset {cfg.dataset} has class labels; a continuous target comes "
                        "from your own files (--dataset csv)")
    if not regression:
        return
    if not type(method).supports_regression:
        raise UserError(f"method {cfg.method} trains on class labels outside the supervised loss, so it does not "
                        "run on a regression task (continuous label); splitnn, fedlocal-*, fedhssl and local do")
    for hook in defenses:
        if isinstance(hook, LabelTransform):
            raise UserError(f"defense {hook.name} re-draws class labels; a regression task has a continuous label")
    for cls, _ in attack_specs:
        if cls.threat_model == "passive":
            raise UserError(f"attack {cls.name} infers class labels; on a regression task (continuous label) that "
                            "is a different attack, not implemented here (feature attacks such as fr run)")


def check_head(cfg: RunConfig, m: type[Method], defenses: Sequence[PartyHook],
               attack_specs: Sequence[AttackSpec]) -> None:
    """The ``--head`` rules: the method, every defense and every attack must apply to the run's head.

    Raises:
        UserError: one line naming the component that does not."""
    head = cfg.model.head
    if head not in m.heads:
        raise UserError(f"--head {head}: method {cfg.method} {m.head_refusal or 'does not support it'}")
    if head == "agg" and cfg.model.cut is not None:
        raise UserError("--cut: the agg head has no top model to move bottom layers into; use --head split")
    if head == "agg" and cfg.he != "off":
        raise UserError(f"--he {cfg.he}: the agg head has no top model whose first layer the encrypted interactive "
                        "layer could run on; use --head split")
    for hook in defenses:
        if head not in hook.heads:
            raise UserError(f"defense {hook.name} applies to --head {'/'.join(sorted(hook.heads))}, not {head}")
    for cls, _ in attack_specs:
        if head not in cls.heads:
            why = cls.head_refusal or f"it applies to --head {'/'.join(sorted(cls.heads))}"
            raise UserError(f"attack {cls.name} cannot run with --head {head}: {why}")


def run_warnings(fed: Federation, progress: bool | None, utility: dict | None = None) -> list[str]:
    """The method's advice about this configuration, plus a warning when training was too short or the
    test score is undefined; printed to stderr in interactive use (sweeps keep them in the stored JSON)."""
    warnings = list(fed.meta.pop("warnings", []))
    test = (utility or {}).get("test")
    if isinstance(test, float) and math.isnan(test):  # AUC of test rows that hold one class only
        warnings.append(f"test {utility.get('metric') if utility else 'metric'} is undefined (utility.test is null): "
                        "the aligned test rows hold one class only — use more rows or a stratified split")
    if 0 < fed.active.step < MIN_STEPS:  # a first try that "trains" for a handful of steps misleads
        warnings.append(f"training ran only {fed.active.step} supervised steps in all; the model is likely "
                        f"undertrained — raise --epochs or lower --batch-size (≥ {MIN_STEPS} steps)")
    if progress is not False:
        for w in warnings:
            print(f"warning: {w}", file=sys.stderr)
    return warnings
