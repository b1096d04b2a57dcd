"""Composition layer: the lab's one run. Every in-process run — CLI, config file, sweep cell, Python
API — goes through :func:`execute`: the run pipeline of :mod:`securevfl.pipeline` (configuration,
defenses, method, training) plus what only the lab does: the attacks (the one place ``securevfl``
imports the ``attacks`` package), the privacy audits and ``--save``."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

import attacks as attack_lib  # noqa: I001  (the lab: the one place securevfl imports the attacks)
from securevfl.config import RunConfig
from securevfl.data.partition import Partition
from securevfl.devices import CPU, device_name, resolve_device
from securevfl.errors import UserError
from securevfl.federation import Federation
from securevfl.hooks import GradientCheck, PartyHook, hooks_of
from securevfl.lab.audit import (
    GRADIENT_SCORER,
    AuditPlan,
    audit_config,
    audit_result,
    inclusion_scores,
    insert_canaries,
    insert_feature_canaries,
    insert_gradient_canaries,
)
from securevfl.methods import Method, adversary_exposes
from securevfl.models import check_model_memory
from securevfl.per_example import GradientCanaries, PerExampleActiveStep
from securevfl.pipeline import (  # noqa: F401  (re-exported: the lab's one entry keeps its names)
    MIN_STEPS,
    AttackSpec,
    build_partition,
    check_compatibility,
    check_head,
    check_task,
    defense_hooks,
    partition_spec,
    prepare_method,
    resolve_config,
    run_warnings,
    train_and_evaluate,
)
from securevfl.progress import phase
from securevfl.result import RunResult, cost_report, feature_privacy, privacy_report, randomness_report
from securevfl.roles import passive_name

ADVERSARY = passive_name(1)
"""The passive party attacks act as (active-party attacks read what the active party receives)."""


def execute(cfg: RunConfig, *, hooks: Sequence[PartyHook] = (), progress: bool | None = None,
            save: str | Path | None = None) -> RunResult:
    """Train ``cfg.method`` under ``cfg.defense`` (and ``cfg.he``), evaluate it, then run ``cfg.attacks``.

    Args:
        cfg: the run's configuration; it is not modified (the run works on a resolved copy, returned
            as ``RunResult.config``).
        hooks: extra tensor hooks installed after the defense's (tests and benchmarks use this to
            observe or alter cut-layer tensors).
        progress: show progress bars and print warnings (``None``: when attached to a terminal;
            sweeps pass ``False`` and keep warnings in the result).
        save: a folder: each party writes its own part of the trained federation into its own
            sub-folder (``securevfl predict`` scores new rows with it; :mod:`securevfl.lab.predict`).

    Returns:
        The finished run; ``to_json()`` is what ``train --json`` prints.

    Raises:
        UserError: a bad value or an incompatible combination, before any data is read."""
    defenses = [*defense_hooks(cfg), *hooks]
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
    device = resolve_device(cfg.device)  # once per run; a device this machine lacks is named before any data is read
    method, cut = prepare_method(cfg, defenses, attack_specs, record=record, progress=progress, device=device,
                                 audit=str(audit["side"]) if audit["canaries"] else None)
    dp_step = check_audit_mechanism(cfg, audit, defenses) if audit["canaries"] else None
    partition = build_partition(cfg)
    check_task(cfg, partition.regression, method, defenses, attack_specs)
    if save is not None:
        check_savable(cfg, method, partition)
    check_model_memory(cfg.model, [p.feature_shape for p in partition.parties], partition.n_classes,
                       method.interactive_layer or cfg.he != "off")
    gradient_mode = bool(audit["canaries"]) and audit["mode"] == "gradient"
    if audit["canaries"] and audit["side"] == "labels" and not gradient_mode:
        audit_scorers(audit, partition.n_classes, cfg.model.head)  # a named scorer that cannot apply is refused now
    insert = (insert_gradient_canaries if gradient_mode else insert_canaries if audit["side"] == "labels"
              else insert_feature_canaries)
    plan = insert(partition, int(audit["canaries"]), cfg.seed, cfg.mechanism_seed) if audit["canaries"] else None
    if gradient_mode and plan is not None and dp_step is not None:  # planted before the parties copy their hooks
        dp_step.canaries = GradientCanaries(plan.canaries, np.where(plan.included, 1.0, -1.0), dp_step.clip_norm())

    torch.manual_seed(cfg.seed)
    t0 = time.perf_counter()
    with phase("set-up (the parties, their models" + (", HE keys)" if cfg.he != "off" else ")"), progress):
        fed = method.build(partition, cut)
    attacks = prepare_attacks(attack_specs, fed, cfg.seed, partition)
    utility = train_and_evaluate(method, fed)
    seconds = time.perf_counter() - t0
    if facts := method.truth_facts(partition):  # the lab's own scoring, with ground truth no party held
        fed.meta["against_truth"] = facts
    if device.type != "cpu":  # the adversary's analyses, the audit and --save run on the CPU (devices.py)
        for party in fed.parties:
            party.use_device(CPU)

    warnings = run_warnings(fed, progress, utility)
    # the feature audit's inference queries are releases: made before the feature ε is computed, so it covers them
    feature_scores = run_feature_audit(plan, fed, partition, method) if plan and audit["side"] == "features" else None
    privacy, features = privacy_report(fed), feature_privacy(fed)
    if plan is not None:
        privacy["audit"] = run_audit(audit, plan, fed, partition, method, cfg.seed, feature_scores,
                                     privacy if feature_scores is None else features.get(passive_name(1), {}),
                                     head=cfg.model.head)
    result = RunResult(config=cfg, utility=utility, privacy={**privacy, "features": features, **randomness_report(cfg)},
                       cost=cost_report(fed, partition, cut.describe(), seconds, device_name(device)),
                       method_info=fed.meta,
                       warnings=warnings, federation=fed, partition=partition, method=method)
    if save is not None:  # before the attacks, which may probe (not change) the trained models
        save_run(result, Path(save))
    with phase(f"attacks ({', '.join(cls.name for cls, _ in attack_specs)})", progress if attack_specs else False):
        result.attacks = run_attacks(attacks, result)
    return result


def check_audit_mechanism(cfg: RunConfig, audit: dict, defenses: Sequence[PartyHook]) -> PerExampleActiveStep | None:
    """The DP-SGD step rule a white-box audit plants its canaries in, or the f-DP analysis needs
    (a Gaussian mechanism's claim); None when neither is asked for.

    Raises:
        UserError: ``mode=gradient`` or ``analysis=fdp`` without ``dp``, or ``mode=gradient`` under HE."""
    if audit["mode"] != "gradient" and audit["analysis"] != "fdp":
        return None
    steps = [h for h in defenses if isinstance(h, PerExampleActiveStep)]
    asked = "mode=gradient" if audit["mode"] == "gradient" else "analysis=fdp"
    if not steps:
        raise UserError(f"--audit {asked} audits DP-SGD's Gaussian release at the active party (defense dp); "
                        f"this run has {cfg.defense or 'no defense'}")
    if audit["mode"] == "gradient" and cfg.he != "off":
        raise UserError("--audit mode=gradient reads the canaries' plain gradient rows at passive1; under --he it "
                        "receives shares of them instead (audit with --he off: the HE layer adds no noise)")
    return steps[0]


def save_run(result: RunResult, folder: Path) -> list[Path]:
    """Each party of ``result``'s federation writes its own part into ``folder / <party name>``
    (:meth:`securevfl.parties.Party.save_own`), handed only the public facts of the run: its position,
    the task, its own slice of the configuration (its own file), and to the active party the class
    names. ``securevfl predict`` (:mod:`securevfl.lab.predict`) scores new rows with them."""
    fed, part, cfg = result.federation, result.partition, result.config
    config = cfg.to_dict()
    files = list(config["data"].pop("party_files"))
    run_id = uuid.uuid4().hex  # binds the folders of one run: predict refuses a folder from another
    out = []
    for k, party in enumerate(fed.parties):
        own = {**config, "data": {**config["data"], "party_files": [files[k]]}}  # no other party's file
        run = {"index": k, "n_parties": len(fed.parties), "run_id": run_id, "interactive": fed.cut.interactive,
               "config": own}
        if k == 0:  # the task and class names are the active party's (its label column)
            run.update(task=part.task, n_classes=part.n_classes, classes=list(part.meta.get("classes", [])))
        else:  # a passive folder holds nothing about the labels, not even the label settings
            own["data"] = {key: v for key, v in own["data"].items() if key not in ("label_column", "task")}
        out.append(party.save_own(folder / party.name, run))
    return out


def check_savable(cfg: RunConfig, method: Method, partition: Partition) -> None:
    """``--save`` keeps what ``securevfl predict`` can rebuild: file-based parties (every method serves:
    each lays out its saved models again, :meth:`~securevfl.methods.base.Method.serving_layout`).

    Raises:
        UserError: before training, naming what cannot be saved."""
    if any(p.preprocessing is None for p in partition.parties):
        raise UserError(f"--save: dataset {cfg.dataset} is not read from per-party files; new rows can be scored "
                        "only for --dataset csv")


# ----------------------------------------------------------------------------------------- stages
def run_feature_audit(plan: AuditPlan, fed: Federation, partition: Partition, method: Method) -> dict:
    """The feature audit's scores: the active party's donor-distance queries on the trained federation."""
    target = attack_lib.AttackTarget(fed, partition, passive_name(1), method=method)
    return {"donor-distance": attack_lib.donor_distance_scores(target, plan.canaries, plan.donor)}


def audit_scorers(audit: dict, n_classes: int, head: str) -> list[str]:
    """The label scorers the audit runs: every registered one that applies to the task and head
    (``attack=all``), or the one named.

    Raises:
        UserError: the named scorer does not apply."""
    if audit["attack"] != "all":
        why = attack_lib.AUDIT_SCORERS.get(str(audit["attack"])).refusal(n_classes, head)
        if why:
            raise UserError(f"--audit attack={audit['attack']}: {why}")
        return [str(audit["attack"])]
    return [n for n in attack_lib.AUDIT_SCORERS.names()
            if attack_lib.AUDIT_SCORERS.get(n).refusal(n_classes, head) is None]


def run_audit(audit: dict, plan: AuditPlan, fed: Federation, partition: Partition, method: Method, seed: int,
              feature_scores: dict | None, claim: dict, head: str = "split") -> dict:
    """``privacy.audit``: the label adversary's scores (every registered scorer, or the one named) or
    the feature adversary's, turned into the ε lower bound at the claim's δ (0 for pure ε or no claim)."""
    scores = feature_scores
    if audit["mode"] == "gradient":  # the white-box auditor: what the active party's DP-SGD step released
        step = next(h for h in fed.active.hooks if isinstance(h, PerExampleActiveStep))
        assert step.canaries is not None  # planted by execute before the parties were built
        scores = {GRADIENT_SCORER: step.canaries.scores()}
    elif scores is None:
        target = attack_lib.AttackTarget(fed, partition, ADVERSARY, method=method, head=head)
        scores = {n: inclusion_scores(plan, attack_lib.AUDIT_SCORERS.get(n).class_scores(target, plan.canaries, seed))
                  for n in audit_scorers(audit, fed.n_classes, head)}
    delta = float(claim.get("delta") or 0.0) if claim.get("epsilon") is not None else 0.0
    return audit_result(plan, scores, delta, float(audit["confidence"]), int(audit["guesses"]), str(audit["side"]),
                        analysis=str(audit["analysis"]), mode=str(audit["mode"]))


def prepare_attacks(attack_specs: Sequence[AttackSpec], fed: Federation, seed: int,
                    partition: Partition | None = None) -> list[attack_lib.Attack]:
    """Construct each attack against what the built federation exposes to its adversary (a missing
    observation fails here, before training); attacks that act during training install themselves
    (with the simulator's ground truth, for the few labeled rows of their own they know)."""
    exposes = frozenset(adversary_exposes(fed))
    passives = [p.name for p in fed.passives]
    built = []
    for cls, params in attack_specs:
        attack = cls(exposes, seed=seed, **params)
        if attack.adversary not in passives:
            have = ", ".join(passives) or "none"
            raise UserError(f"attack {cls.name}: adversary {attack.adversary} is not a passive party of this "
                            f"federation (passive parties: {have}; --parties sets how many parties there are)")
        if attack.during_training:
            attack.prepare(fed, attack.adversary, partition)
        built.append(attack)
    return built


def run_attacks(attacks: Sequence[attack_lib.Attack], run: RunResult) -> dict[str, dict]:
    """Each attack's result on the trained federation, as its ``adversary`` (default ``passive1``)."""
    # the adversary took part in the federation's SSL stage, so it knows how long it was
    ssl_epochs = run.method.params.get("ssl_epochs") if run.method.params else None
    targets: dict[str, attack_lib.AttackTarget] = {}  # one per adversary: its cache holds that party's artefacts
    malicious = [a.name for a in attacks if a.during_training]
    out = {}
    for attack in attacks:
        if attack.adversary not in targets:
            targets[attack.adversary] = attack_lib.AttackTarget(
                run.federation, run.partition, attack.adversary,
                ssl_epochs=int(ssl_epochs) if ssl_epochs else None, method=run.method, head=run.config.model.head)
        started = time.perf_counter()
        before = _alarms(run.federation)
        res = attack.run(targets[attack.adversary])
        after = _alarms(run.federation)
        if after:  # a passive party's detector (hook point (e)) was installed: did this attack trip it?
            res.details["detector_alarms"] = {p: a - before[p][0] for p, (a, _) in after.items()}
            res.details["detector_checked"] = {p: c - before[p][1] for p, (_, c) in after.items()}
        if malicious:  # every attack in this run saw a federation trained with a malicious adversary
            res.details["malicious_training"] = malicious
        # its wall time, with its control and baseline (an attack can cost more than the training it attacks)
        out[attack.name] = {**res.as_dict(), "seconds": round(time.perf_counter() - started, 3)}
    return out


def _alarms(fed: Federation) -> dict[str, tuple[int, int]]:
    """(alarms raised, gradients tested) so far by each passive party's gradient checks (none: absent)."""
    return {p.name: (sum(h.alarm_count for h in hooks), sum(h.checked for h in hooks))
            for p in fed.passives if (hooks := hooks_of(p.hooks, GradientCheck))}
