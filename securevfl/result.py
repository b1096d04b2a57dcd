"""What one run returns: :class:`RunResult`, whose :meth:`RunResult.to_json` is the only place the
JSON object of ``train --json`` and of a sweep's stored row is built, and the pure functions that
summarise a trained federation's privacy and cost for it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from securevfl.config import RunConfig
from securevfl.data.partition import Partition
from securevfl.federation import Federation
from securevfl.operations.provenance import versions

if TYPE_CHECKING:  # the methods package imports this module's callers; types only
    from securevfl.methods.base import Method


@dataclass
class RunResult:
    """One finished run: the JSON-able record plus the trained objects (kept split by party) for
    callers that inspect them (tests, benchmarks)."""

    config: RunConfig
    """The resolved configuration that ran (presets, method defaults and the learning rate filled in)."""
    utility: dict
    """Test utility: ``metric``, ``test`` and per-split details, from the method's evaluation."""
    privacy: dict
    """Label privacy (:func:`privacy_report`) with ``features`` (:func:`feature_privacy`)."""
    cost: dict
    """Seconds, bytes and messages (by kind), HE cost and supervised steps (:func:`cost_report`)."""
    method_info: dict
    """What the method reports about its run (``Federation.meta``)."""
    warnings: list[str]
    """Advice about this configuration (too few steps, a method's caveats)."""
    federation: Federation = field(repr=False)
    partition: Partition = field(repr=False)
    method: Method = field(repr=False)
    """The trained :class:`securevfl.methods.Method` (its trainer answers inference requests)."""
    attacks: dict[str, dict] = field(default_factory=dict)
    """Per attack name, its result (``AttackResult.as_dict()``)."""

    def to_json(self) -> dict:
        """The run's JSON object (strict JSON: NaN and infinities become ``null``).

        Returns:
            The object ``securevfl train --json`` prints and a sweep stores as ``result_json``."""
        return run_json(self.config, self.utility, self.attacks, self.privacy, self.cost, self.partition.summary(),
                        self.method_info, self.warnings)


def run_json(cfg: RunConfig, utility: dict, attacks: dict, privacy: dict, cost: dict, partition: dict,
             method_info: dict, warnings: list[str], transport: dict | None = None) -> dict:
    """The JSON object of every run: an in-process one (:meth:`RunResult.to_json`, ``train --json``, a
    sweep's stored row) and a deployed one (:mod:`securevfl.deploy`, which adds ``transport``: the
    peers, the channel's security and limits, each passive party's report). The one builder, so the
    records cannot drift apart (issue 62: the deployed one once lacked the commit)."""
    out = {"dataset": cfg.dataset, "method": cfg.method, "seed": cfg.seed, "defense": cfg.defense,
           "utility": utility, "attacks": attacks, "privacy": privacy, "cost": cost, "partition": partition}
    if transport is not None:
        out["transport"] = transport
    out |= {"method_info": method_info, "warnings": warnings, "versions": versions(), "config": cfg.to_dict()}
    return json_safe(out)


def json_safe(obj):
    """``obj`` with NaN/inf as ``None`` (strict JSON for ``--json`` and the sweep store)."""
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
    reports = fed.active.privacy_reports()  # the hooks that run at the active party
    if not reports:
        return {"epsilon": None, "delta": None, "mechanism": "none"}
    accounted = fed.active.privacy_reports(accounted_only=True)
    if len(reports) == 1:
        return reports[0]
    finite = bool(accounted) and all(r.get("epsilon") is not None for r in accounted)
    return {"epsilon": sum(r["epsilon"] for r in accounted) if finite else None,
            "delta": sum(r["delta"] for r in accounted) if finite else None,
            "formal_guarantee": finite, "mechanism": "+".join(r["mechanism"] for r in reports),
            "composition": "ε and δ of the accounted label mechanisms add up; the other components act on their "
                           "output (post-processing)" if accounted else "no component accounts for ε",
            "components": reports}


NOT_PRIVATE = "not private (mechanism seed fixed)"
"""The mark of a run whose privacy mechanisms' noise was fixed (``mechanism_seed`` or HE ``seeded_shares``):
anyone who knows that seed regenerates the noise, so its ε holds against no one."""


def randomness_report(cfg: RunConfig) -> dict:
    """Where the privacy mechanisms' randomness came from (part of the ``privacy`` object).

    Returns:
        ``{"randomness": "private (OS CSPRNG)"}``, or, with a fixed mechanism seed or seeded HE shares,
        ``{"randomness": "fixed ...", "status": NOT_PRIVATE}``."""
    fixed = []
    if cfg.mechanism_seed is not None:
        fixed.append("mechanism_seed")
    if cfg.he != "off" and str(cfg.he_params.get("seeded_shares", False)).lower() in ("1", "true", "yes", "on"):
        fixed.append("he seeded_shares")
    if not fixed:
        return {"randomness": "private (OS CSPRNG)"}
    return {"randomness": f"fixed by {' and '.join(fixed)}", "status": NOT_PRIVATE}


def feature_privacy(fed: Federation) -> dict:
    """Per passive party, the report of its feature-side (activation) defenses, if any."""
    out = {}
    for party in fed.passives:
        reports = party.privacy_reports()  # the hooks that run at a passive party
        if reports:
            out[party.name] = reports[0] if len(reports) == 1 else {"components": reports}
    return out


def cost_report(fed: Federation, partition: Partition, he: dict, seconds: float, device: str = "cpu") -> dict:
    """The run's cost: wall seconds, channel bytes and messages by kind, the HE layer's own cost, and the
    device the parties computed on (``device``: the resolved ``--device``, e.g. ``cpu`` or ``cuda:0``;
    the configuration keeps what was asked for, e.g. ``auto``).

    Args:
        fed: the trained federation (its channel counted every message).
        partition: the partition; a file source's PSI ran on its own setup channel before the
            federation existed, and that traffic counts too, under the alignment kind.
        he: the cut layer's description (``CutLayer.describe()``).
        seconds: wall time of build, fit and evaluate.
        device: where the parties trained (:func:`securevfl.devices.device_name` of the resolved ``--device``).

    Returns:
        The ``cost`` object of the run's JSON."""
    stats = fed.channel.stats.as_dict()
    setup = int(partition.meta.get("psi_bytes", 0) or 0)
    if setup:
        stats["bytes_sent"] += setup
        stats["bytes_by_kind"]["alignment"] = stats["bytes_by_kind"].get("alignment", 0) + setup
    he = dict(he)
    if he.get("scheme", "off") != "off":
        he_kinds = {k: v for k, v in stats["bytes_by_kind"].items() if k.startswith("he_")}
        he.update({"bytes": sum(he_kinds.values()), "bytes_by_kind": he_kinds,
                   "seconds_per_step": round(he["seconds"] / max(fed.active.step, 1), 4)})
    return {"seconds": round(seconds, 4), "bytes_sent": stats["bytes_sent"], "messages": stats["messages"],
            "bytes_by_kind": stats["bytes_by_kind"], "he": he, "train_steps": fed.active.step,
            "device": device}
