"""Composition layer: the one run pipeline. It is the only place in ``securevfl`` that imports the
``attacks`` and ``defenses`` packages, and every run — CLI, config file, sweep cell, Python API —
goes through :func:`execute`."""

from __future__ import annotations

import copy
import dataclasses
import sys
import time
from collections.abc import Sequence

import torch

import attacks as attack_lib  # noqa: I001  (composition layer: the one place core imports these)
import defenses as defense_lib
from securevfl.channel import MessageKind
from securevfl.config import RunConfig
from securevfl.cutlayer import CUT_LAYERS, make_cut_layer
from securevfl.data import DATASETS, load_dataset, make_partition
from securevfl.data.partition import Partition, PartitionSpec
from securevfl.errors import UserError
from securevfl.federation import DEFAULT_LR, Federation
from securevfl.hooks import PartyHook
from securevfl.lab.audit import (
    AuditPlan,
    audit_config,
    audit_result,
    inclusion_scores,
    insert_canaries,
    insert_feature_canaries,
)
from securevfl.methods import METHODS, Method, MethodContext, adversary_exposes
from securevfl.models import apply_model_preset
from securevfl.result import RunResult, cost_report, feature_privacy, privacy_report, randomness_report
from securevfl.roles import passive_name
from securevfl.validate import validate_config

ADVERSARY = passive_name(1)
"""The passive party attacks act as (active-party attacks read what the active party receives)."""

MIN_STEPS = 50
"""Fewer supervised steps than this in a run print a warning (and go to the JSON ``warnings``)."""

AttackSpec = tuple[type[attack_lib.Attack], dict]


def execute(cfg: RunConfig, *, hooks: Sequence[PartyHook] = (), progress: bool | None = None) -> RunResult:
    """Train ``cfg.method`` under ``cfg.defense`` (and ``cfg.he``), evaluate it, then run ``cfg.attacks``.

    Args:
        cfg: the run's configuration; it is not modified (the run works on a resolved copy, returned
            as ``RunResult.config``).
        hooks: extra tensor hooks installed after the defense's (tests and benchmarks use this to
            observe or alter cut-layer tensors).
        progress: show progress bars and print warnings (``None``: when attached to a terminal;
            sweeps pass ``False`` and keep warnings in the result).

    Returns:
        The finished run; ``to_json()`` is what ``train --json`` prints.

    Raises:
        UserError: a bad value or an incompatible combination, before any data is read."""
    defenses = [*defense_lib.parse_defense(cfg.defense, mechanism_seed=cfg.mechanism_seed), *hooks]
    attack_specs = [attack_lib.parse_attack(entry) for entry in cfg.attacks]
    audit = audit_config(cfg.audit)
    if audit["canaries"] and audit["attack"] != "all":
        attack_lib.AUDIT_SCORERS.get(str(audit["attack"]))  # an unknown scorer is named before any data is read
    # either audit's adversary reads what it received from the recorded channel
    cfg = resolve_config(cfg, transcript=bool(audit["canaries"]) or any("transcript" in cls.requires
                                                                        for cls, _ in attack_specs))
    # an active adversary reads the passive messages it received from its channel view: the federation
    # is built recording then (recording is chosen here, never switched on a live federation)
    record = cfg.record or any("passive_messages" in cls.requires for cls, _ in attack_specs)
    method = METHODS.get(cfg.method)(MethodContext(  # validates the method's parameters before any data is read
        train=cfg.train, model=cfg.model, optim=cfg.optim, seed=cfg.seed, hooks=defenses,
        record=record, progress=progress, params=cfg.method_params))
    check_compatibility(cfg, method, defenses, attack_specs, audit=str(audit["side"]) if audit["canaries"] else None)
    # no first linear layer to split (e.g. RISA's evidential heads): plain concatenation
    cut = make_cut_layer(cfg.he, interactive=method.interactive_layer, **cfg.he_params)
    partition = build_partition(cfg)
    insert = insert_canaries if audit["side"] == "labels" else insert_feature_canaries
    plan = insert(partition, int(audit["canaries"]), cfg.seed, cfg.mechanism_seed) if audit["canaries"] else None

    torch.manual_seed(cfg.seed)
    t0 = time.perf_counter()
    fed = method.build(partition, cut)
    attacks = prepare_attacks(attack_specs, fed, cfg.seed, partition)
    method.train(fed)
    utility = method.evaluate(fed)
    seconds = time.perf_counter() - t0

    warnings = run_warnings(fed, progress)
    # the feature audit's inference queries are releases: made before the feature ε is computed, so it covers them
    feature_scores = run_feature_audit(plan, fed, partition, method) if plan and audit["side"] == "features" else None
    privacy, features = privacy_report(fed), feature_privacy(fed)
    if plan is not None:
        privacy["audit"] = run_audit(audit, plan, fed, partition, method, cfg.seed, feature_scores,
                                     privacy if feature_scores is None else features.get(passive_name(1), {}))
    result = RunResult(config=cfg, utility=utility, privacy={**privacy, "features": features, **randomness_report(cfg)},
                       cost=cost_report(fed, partition, cut.describe(), seconds), method_info=fed.meta,
                       warnings=warnings, federation=fed, partition=partition, method=method)
    result.attacks = run_attacks(attacks, result)
    return result


# ----------------------------------------------------------------------------------------- stages
def run_feature_audit(plan: AuditPlan, fed: Federation, partition: Partition, method: Method) -> dict:
    """The feature audit's scores: the active party's donor-distance queries on the trained federation."""
    target = attack_lib.AttackTarget(fed, partition, passive_name(1), method=method)
    return {"donor-distance": attack_lib.donor_distance_scores(target, plan.canaries, plan.donor)}


def run_audit(audit: dict, plan: AuditPlan, fed: Federation, partition: Partition, method: Method, seed: int,
              feature_scores: dict | None, claim: dict) -> dict:
    """``privacy.audit``: the label adversary's scores (every registered scorer, or the one named) or
    the feature adversary's, turned into the ε lower bound at the claim's δ (0 for pure ε or no claim)."""
    scores = feature_scores
    if scores is None:
        names = attack_lib.AUDIT_SCORERS.names() if audit["attack"] == "all" else [str(audit["attack"])]
        target = attack_lib.AttackTarget(fed, partition, ADVERSARY, method=method)
        scores = {n: inclusion_scores(plan, attack_lib.AUDIT_SCORERS.get(n).scores(target, plan.canaries, seed))
                  for n in names}
    delta = float(claim.get("delta") or 0.0) if claim.get("epsilon") is not None else 0.0
    return audit_result(plan, scores, delta, float(audit["confidence"]), int(audit["guesses"]), str(audit["side"]))


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
    if cfg.he != "off":
        if not m.uses_passives:
            raise UserError(f"--he {cfg.he}: method {cfg.method} sends no passive activations, so there is nothing "
                            "to encrypt")
        if not m.supports_he:
            raise UserError(f"--he {cfg.he}: method {cfg.method} {m.he_refusal}")
    for hook in defenses:
        if not hook.acts_on & m.sends:
            sent = ", ".join(sorted(m.sends)) or "no cut-layer messages"
            raise UserError(f"defense {hook.name} acts on {', '.join(sorted(hook.acts_on))} messages, but method "
                            f"{cfg.method} sends {sent}")
        if hook.bounds_features and m.passive_features_outside_loop:
            raise UserError(f"defense {hook.name} bounds what the supervised loop releases about passive features, but "
                            f"method {cfg.method} also uses them outside it (pre-training, SSL or imputation)")
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
    if not cfg.partition.active_features and not m.label_only_host:
        raise UserError(f"method {cfg.method} needs features at the active party; a label-only host "
                        "(partition.active_features: false) works with entity-aug")


def prepare_attacks(attack_specs: Sequence[AttackSpec], fed: Federation, seed: int,
                    partition: Partition | None = None) -> list[attack_lib.Attack]:
    """Construct each attack against what the built federation exposes to its adversary (a missing
    observation fails here, before training); attacks that act during training install themselves
    (with the simulator's ground truth, for the few labeled rows of their own they know)."""
    exposes = frozenset(adversary_exposes(fed))
    built = []
    for cls, params in attack_specs:
        attack = cls(exposes, seed=seed, **params)
        if "adversary" in attack.config:  # a party this federation lacks is a one-line error before training
            attack_lib.adversary_party(fed, str(attack.config["adversary"]))
        if attack.during_training:
            attack.prepare(fed, ADVERSARY, partition)
        built.append(attack)
    return built


def run_warnings(fed: Federation, progress: bool | None) -> list[str]:
    """The method's advice about this configuration, plus a warning when training was too short;
    printed to stderr in interactive use (sweeps keep them in the stored JSON instead)."""
    warnings = list(fed.meta.pop("warnings", []))
    if 0 < fed.active.step < MIN_STEPS:  # a first try that "trains" for a handful of steps misleads
        warnings.append(f"training ran only {fed.active.step} supervised steps in all; the model is likely "
                        f"undertrained — raise --epochs or lower --batch-size (≥ {MIN_STEPS} steps)")
    if progress is not False:
        for w in warnings:
            print(f"warning: {w}", file=sys.stderr)
    return warnings


def run_attacks(attacks: Sequence[attack_lib.Attack], run: RunResult) -> dict[str, dict]:
    """Each attack's result on the trained federation, as ``passive1``."""
    # the adversary took part in the federation's SSL stage, so it knows how long it was
    ssl_epochs = run.method.params.get("ssl_epochs") if run.method.params else None
    target = attack_lib.AttackTarget(run.federation, run.partition, ADVERSARY,
                                     ssl_epochs=int(ssl_epochs) if ssl_epochs else None, method=run.method)
    malicious = [a.name for a in attacks if a.during_training]
    out = {}
    for attack in attacks:
        res = attack.run(target)
        if malicious:  # every attack in this run saw a federation trained with a malicious adversary
            res.details["malicious_training"] = malicious
        out[attack.name] = res.as_dict()
    return out
