"""Parties in separate processes: the active party drives, each passive party serves (SPEC §11).

The same party code as the simulator runs on each side (:class:`~securevfl.parties.ActiveParty`,
:class:`~securevfl.parties.PassiveParty`, the cut layer's ends, the defenses' hooks, PSI); only the
channel's transport differs (:mod:`securevfl.channel.grpc`), and each process builds only its own
party. With the same seed and the same per-party files, a deployed run gives the same utility as
``securevfl train --dataset csv`` with all the files in one process.

Protocol, all through the channel (the passive party's script is :func:`serve_run`):

1. active → passive CONTROL: the run description (:func:`run_description`: seed, model, optimizer,
   cut layer, defense, alignment mode, the encoding options, the label column's *name* so the
   passive party can refuse a file that holds it); passive → active CONTROL ``{"ok": rows}`` or
   ``{"error": ...}`` once it has read its file.
2. alignment: ECDH PSI (``plain``: ID lists) per passive party; the active party announces the aligned
   set and the test IDs (the active party draws the test split, as the csv source does), the passive
   party encodes its features on its own training rows and builds its party; passive → active
   CONTROL ``{"n_parameters": ...}``; then the usual announcement of the aligned training IDs.
3. the method: the active party runs the method's program (:meth:`Method.train`, :meth:`Method.evaluate`);
   each passive party runs its own (:func:`securevfl.runtime.serve_passive`), exactly as the
   simulator's threads do: supervised steps (batch request, IDs, the cut layer's forward and
   gradient rounds, each side its half) and the method's named operations.
4. active → passive CONTROL ``{"op": "end"}``; passive → active CONTROL its report (its feature
   defenses' privacy reports, its HE scheme description, the rows it read).

Scope: every method whose :meth:`~securevfl.methods.base.Method.fit` is written per role (the
active party's program; each passive party runs :func:`securevfl.runtime.serve_passive` with the
method's operations), with any defense, ``--he off|ckks|bfv|paillier`` and PSI or plain alignment.
Refused with the reason: attacks (their adversary's view lives in another process, and their scoring
needs the simulator's ground truth), a label-only active party, ``--save``.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from securevfl.channel import MessageKind
from securevfl.channel.base import Endpoint
from securevfl.config import RunConfig
from securevfl.data import psi
from securevfl.data.csvsource import (
    ActiveLabels,
    Split,
    check_flags,
    check_named,
    named_held,
    party_data,
    read_file,
    split_rows,
)
from securevfl.devices import device_name, resolve_device
from securevfl.errors import UserError, environment_error
from securevfl.federation import Federation, build_active
from securevfl.models import for_head
from securevfl.pipeline import defense_hooks
from securevfl.progress import phase
from securevfl.roles import ACTIVE, passive_name
from securevfl.runtime import PROTOCOL, expect_object, handles, remote_federation
from securevfl.serve import (  # noqa: F401  (the passive side: securevfl.deploy.serve stays its entry)
    _BAD_BYTES,
    _method,
    _model_config,
    run_limits,
    serve,
    serve_predict,
    serve_run,
)
from securevfl.storage.checkpoint import Checkpoints, run_key

_DATA_OPTIONS = ("numeric_ids", "label_column", "drop_columns", "categorical", "numeric", "min_freq", "hash_buckets")


# ---------------------------------------------------------------------------------- the description
def run_description(cfg: RunConfig, k: int, n_parties: int, interactive: bool) -> dict:
    """What passive party ``k`` needs to build its own party for this run (no data, no labels)."""
    return {"op": "run", "protocol": PROTOCOL, "party": passive_name(k), "index": k, "n_parties": n_parties,
            "seed": cfg.seed, "model": dataclasses.asdict(cfg.model), "optim": dataclasses.asdict(cfg.optim),
            "he": cfg.he, "he_params": dict(cfg.he_params), "interactive": interactive, "defense": cfg.defense,
            "mechanism_seed": cfg.mechanism_seed, "alignment": "plain" if cfg.partition.alignment == "plain" else "psi",
            "method": cfg.method, "method_params": dict(cfg.method_params), "train": dataclasses.asdict(cfg.train),
            "data": {k: getattr(cfg.data, k) for k in _DATA_OPTIONS}
            | ({"hashed_ids": True} if cfg.data.hashed_ids else {})}  # (absent when off: the digest of a run stays)


# ---------------------------------------------------------------------------------- active side
def check_deployable(cfg: RunConfig, peers: dict[str, str], checkpoint: str | None = None,
                     resume: bool = False, save: str | None = None) -> None:
    """What a deployed run cannot do (yet), refused before anything connects."""
    if resume and checkpoint is None:
        raise UserError("--resume continues from checkpoints: give the run's --checkpoint DIR")
    if cfg.dataset != "csv":
        raise UserError("--peer runs on your own files: --dataset csv --party-file ACTIVE.csv (the passive parties "
                        "read theirs)")
    if len(cfg.data.party_files) != 1:
        raise UserError("with --peer, give only this (the active) party's file: --party-file ACTIVE.csv; each passive "
                        "party reads its own (securevfl party --party-file)")
    expected = [passive_name(k) for k in range(1, len(peers) + 1)]
    if sorted(peers) != expected:
        raise UserError(f"--peer names must be {', '.join(expected)} (one per passive party), got {', '.join(peers)}")
    from securevfl.methods import METHODS

    method = METHODS.get(cfg.method)
    if not method.per_role:
        raise UserError(f"method {cfg.method} cannot run across processes: {method.not_deployable}")
    if not method.uses_passives:
        raise UserError(f"method {cfg.method} trains the active party alone: there is nothing to deploy")
    if checkpoint is not None and not method.resumable:
        resumable = ", ".join(m for m in METHODS.names() if METHODS.get(m).resumable)
        raise UserError(f"--checkpoint: method {cfg.method} cannot resume yet (it keeps state in or between its "
                        f"stages that the checkpoints do not hold; resumable: {resumable})")
    if checkpoint is not None and len(cfg.train.lr_grid) > 1:
        raise UserError("--checkpoint with several --lr-grid rates is not supported (each rate is a run of its own)")
    for a in cfg.attacks:
        raise UserError(f"attack {a}: attacks run in the simulator only; across processes the adversary's view lives "
                        "in its own process and scoring needs ground truth no party holds (run it with --dataset csv "
                        "and every party file)")
    if cfg.audit:
        raise UserError("--audit runs in the simulator only: the one-run audit plants canaries and scores its guesses "
                        "against ground truth that no party of a deployment holds (run it with --dataset csv and every "
                        "party file)")
    if cfg.passive_seeds:
        raise UserError("passive_seeds is the simulator's: a deployed passive party holds its own seed (securevfl "
                        "party --seed)")


def _resolved(cfg: RunConfig, n_parties: int) -> RunConfig:
    from securevfl.pipeline import resolve_config

    if cfg.partition.n_parties not in (2, n_parties):  # 2: the default
        raise UserError(f"--parties {cfg.partition.n_parties} but {n_parties} parties (this party's file and "
                        f"{n_parties - 1} --peer); drop --parties or give one --peer per passive party")
    # validation sees this party's file alone (the peers hold the others): check it as a 2-party run,
    # then record the real count
    given = copy.deepcopy(cfg)
    given.partition.n_parties = 2
    cfg = resolve_config(given)
    cfg.partition.n_parties = n_parties
    return cfg


def planned_descriptions(cfg: RunConfig, peers: dict[str, str]) -> dict[str, dict]:
    """The run description ``train --peer`` will send each passive party (``securevfl doctor``: the
    settings digest and each party's policy verdict), built as :func:`run_deployed` builds them."""
    from securevfl.pipeline import prepare_method

    n_parties = len(peers) + 1
    cfg = _resolved(cfg, n_parties)
    _, cut = prepare_method(cfg, defense_hooks(cfg), [], record=False, progress=False, device=torch.device("cpu"))
    names = sorted(peers, key=lambda n: int(n.removeprefix("passive")) if n.removeprefix("passive").isdigit() else 0)
    return {n: run_description(cfg, k, n_parties, cut.interactive) for k, n in enumerate(names, start=1)}


# ------------------------------------------------------------------ the active party's set-up
# The steps every run the active party starts over a channel takes — training (run_deployed) and scoring
# (securevfl/lab/predict.py: predict_deployed) — exist once, here.
def open_run(ep: Endpoint, descriptions: dict[str, dict]) -> dict[str, dict]:
    """Step 1: each passive party gets its run description (it admits it by its own policy and reads its
    file); their replies, by party. A refusal ends the run with one line naming that party."""
    for name, description in descriptions.items():
        engine = psi.engine_of(ep, name)  # the PSI engine this party runs (--psi), which the passive one must too
        ep.send_json(name, MessageKind.CONTROL, description | ({"psi": engine} if engine != "x25519" else {}))
    replies = {}
    for name in descriptions:
        reply = expect_object(ep.recv_json(name, MessageKind.CONTROL), "handshake")
        if "error" in reply:
            raise UserError(f"{name}: {reply['error']}")
        replies[name] = reply
    return replies


def align_over(ep: Endpoint, names: list[str], ids: np.ndarray, alignment: str, progress: bool | None) -> np.ndarray:
    """Step 2: the IDs this party shares with every passive party, by PSI (``plain`` where the run asks
    for it and each passive party allows it)."""
    with ep.busy("aligning IDs"), phase("aligning IDs with the passive parties", progress):
        aligned = psi.align_with(ep, names, ids, "plain" if alignment == "plain" else "psi")
    if len(aligned) == 0:
        raise UserError("the party files share no IDs; IDs are compared as exact strings unless --numeric-ids is set")
    return aligned


def run_deployed(cfg: RunConfig, channel: Any, peers: dict[str, str], progress: bool | None = None,
                 checkpoint: str | None = None, resume: bool = False, save: str | None = None) -> dict:
    """Train and evaluate as the active party with every passive party in its own process.

    Args:
        cfg: the run (``--dataset csv``, this party's file only).
        channel: a connected :class:`~securevfl.channel.grpc.GrpcChannel` for party ``active``.
        peers: passive party name → address (for the record).
        progress: progress bars on stderr.
        checkpoint: a folder where this party keeps its checkpoints at each epoch end (each passive
            party keeps its own, securevfl/storage/checkpoint.py).
        resume: continue the run from the newest checkpoint in ``checkpoint``.
        save: this party writes its trained part into ``save/active``; each passive party writes its
            own into its own ``securevfl party --save`` folder (for ``securevfl predict``).

    Returns:
        The run's JSON object (as ``train --json``, plus ``transport`` and ``cost.network``)."""
    from securevfl.pipeline import check_task, prepare_method, run_warnings

    check_deployable(cfg, peers, checkpoint, resume, save)
    defenses = defense_hooks(cfg)
    n_parties = len(peers) + 1
    cfg = _resolved(cfg, n_parties)
    device = resolve_device(cfg.device)  # this process's own parties: the active one (each passive runs on its CPU)
    method, cut = prepare_method(cfg, defenses, [], record=cfg.record, progress=progress, device=device)
    interactive = cut.interactive
    names = sorted(peers, key=lambda n: int(n.removeprefix("passive")))
    ep = channel.endpoint(ACTIVE)
    path = Path(cfg.data.party_files[0])
    id_col = cfg.data.id_columns[0] if cfg.data.id_columns else cfg.data.id_column
    check_flags(cfg.data)
    table = read_file(cfg.data, path, id_col, active=True, features=cfg.partition.active_features)
    own = table.ids
    assert table.labels is not None  # read with the label column
    y_all, has_label, classes = table.labels.y, table.labels.has_label, table.labels.classes
    regression = not classes
    n_classes = 1 if regression else len(classes)
    check_task(cfg, regression, method, defenses, [])
    # the models every party builds (under the agg head each bottom outputs one value per class)
    cfg.model = for_head(cfg.model, n_classes)
    t0 = time.perf_counter()
    channel.wait_ready()
    phases: dict[str, dict] = {}
    mark = _Marks(channel)

    ck = None
    if checkpoint is not None:
        ck = Checkpoints(checkpoint, run_key(run_description(cfg, 1, n_parties, interactive), path), party=ACTIVE)
        if resume:
            ck.resume_epoch = ck.latest()
            if ck.resume_epoch is None:
                raise UserError(f"--resume: no checkpoint of this run in {checkpoint} (a run with other settings or "
                                "files keeps other checkpoints)")
            print(f"active: resuming after epoch {ck.resume_epoch} (its checkpoint in {ck.dir})", file=sys.stderr,
                  flush=True)
    resume_at = {"checkpoint": True, "resume_epoch": ck.resume_epoch} if ck is not None else {}
    # 1. every passive party gets the run and reads its file
    replies = open_run(ep, {name: run_description(cfg, k, n_parties, interactive) | resume_at
                            for k, name in enumerate(names, start=1)})
    held = set(named_held(cfg.data, table.columns)).union(*({str(c) for c in r.get("named_held", [])}
                                                            for r in replies.values()))
    check_named(cfg.data, [sorted(held)])  # a column named on the command line that no party holds
    # 2. alignment
    channel.netstats.phase = "alignment"
    t_align = time.perf_counter()
    aligned = align_over(ep, names, own, cfg.partition.alignment, progress)
    with ep.busy("splitting the aligned rows"):
        split = split_rows(aligned, own, has_label, cfg.partition, cfg.seed)
    for name in names:
        ep.send_ids(name, MessageKind.ALIGNMENT, split.test_ids)
    labels = ActiveLabels(y_all, has_label, cfg.partition.active_labels_unaligned)
    with ep.busy("encoding its rows"):
        a_data, ingest = party_data(ACTIVE, table, id_col, aligned, split, cfg.data, labels,
                                    features=cfg.partition.active_features)
    del table
    # 3. the federation: the active party's models from the same seed streams as the simulator's
    # standard_models, and a handle on each passive party once its own are built
    fed = remote_federation(channel, lambda: build_active(a_data, ep, defenses, cfg.model, cfg.optim, cut, names,
                                                          n_classes, cfg.seed, device,
                                                          features=cfg.partition.active_features),
                            names, cut, n_classes, regression, checkpoints=ck, ready=True, progress=progress)
    active, remotes = fed.active, fed.passives
    active.learn_alignment(split.train_aligned, a_data.test_ids)
    for name in names:
        ep.send_ids(name, MessageKind.ALIGNMENT, split.train_aligned)
    phases["alignment"] = mark.take(seconds=time.perf_counter() - t_align)
    # 4. training and evaluation: the simulator's own code (the torch RNG continues from the head's
    # initialisation, as in the simulator, where the head is built last)
    channel.netstats.phase = "train"
    t_train = time.perf_counter()
    method.train(fed)
    phases["train"] = mark.take(steps=active.step, seconds=time.perf_counter() - t_train)
    channel.netstats.phase = "evaluate"
    t_eval = time.perf_counter()
    utility = method.evaluate(fed)
    phases["evaluate"] = mark.take(seconds=time.perf_counter() - t_eval)
    if save is not None:  # each party writes only its own part, in its own process
        _save_deployed(cfg, fed, Path(save), classes, n_classes)
    # 5. end: every passive party reports
    for r in remotes:
        expect_object(r.end(), "report")  # type: ignore[attr-defined]
    seconds = time.perf_counter() - t0
    out = _result(cfg, fed, utility, phases, seconds, channel, peers, classes, ingest, split, aligned)
    out["warnings"] = run_warnings(fed, progress) + out["warnings"]
    return out


def _save_deployed(cfg: RunConfig, fed: Federation, folder: Path, classes: list, n_classes: int) -> None:
    """``--save`` across processes: the public facts of the run to every party (as the simulator's
    :func:`securevfl.lab.compose.save_run`); each writes its own folder where it chose."""
    import uuid

    config = cfg.to_dict()
    config["data"]["party_files"] = list(cfg.data.party_files)
    run_id = uuid.uuid4().hex
    n = len(fed.parties)
    common = {"n_parties": n, "run_id": run_id, "interactive": fed.cut.interactive}
    task = "regression" if fed.regression else "binary" if n_classes == 2 else "multiclass"  # as Partition.task
    active_run = {**common, "index": 0, "config": config, "task": task,
                  "n_classes": n_classes, "classes": [str(c) for c in classes]}
    fed.active.save_own(folder / fed.active.name, active_run)
    passive_config = {**config, "data": {k: v for k, v in config["data"].items()
                                         if k not in ("label_column", "task", "party_files")}}
    for k, h in enumerate(handles(fed), start=1):
        h.call("save", reply=True, run={**common, "index": k, "config": passive_config})


def train_deployed(cfg: RunConfig, channel: Any, peers: dict[str, str], progress: bool | None = None,
                   checkpoint: str | None = None, resume: bool = False, save: str | None = None) -> dict:
    """:func:`run_deployed`, with every failure one :class:`UserError` and the peers told why (an
    abort message), so that they end at once rather than at their timeout. Bytes a peer sent that do
    not decode as the protocol says (a malformed message) fail the run, never this process."""
    try:
        try:
            return run_deployed(cfg, channel, peers, progress, checkpoint, resume, save)
        except (OSError, MemoryError) as e:  # this machine's limits (a full disk, ...): the peers are told too
            raise environment_error(e) from None
    except UserError as e:
        channel.abort(str(e))
        if checkpoint is not None and "went away mid-run" in str(e):
            raise UserError(f"{e}, then run this same train command again with --resume (it goes on from the newest "
                            f"epoch every party checkpointed, {checkpoint})") from None
        raise
    except _BAD_BYTES as e:
        channel.abort("the active party failed on a malformed message")
        raise UserError(f"malformed message from a passive party ({type(e).__name__}: {e})") from None




class _Marks:
    """Byte and message counts of the active party's traffic between two marks, per direction."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.last: dict = {}

    def take(self, steps: int | None = None, seconds: float | None = None) -> dict:
        now = self.channel.stats.as_dict()["by_direction"]
        out: dict[str, Any] = {}
        for key, v in now.items():
            prev = self.last.get(key, {"bytes": 0, "messages": 0})
            b, m = v["bytes"] - prev["bytes"], v["messages"] - prev["messages"]
            if m:
                _, route = key.split(":", 1)
                d = out.setdefault(route, {"bytes": 0, "messages": 0})
                d["bytes"] += b
                d["messages"] += m
        self.last = {k: dict(v) for k, v in now.items()}
        phase = self.channel.netstats.phase
        rts = {peer: n for (ph, peer), n in self.channel.netstats.round_trips.items() if ph == phase}
        rpcs = {peer: n for (ph, peer), n in self.channel.netstats.rpcs.items() if ph == phase}
        res: dict[str, Any] = {"by_direction": out, "round_trips": rts, "rpcs": rpcs}
        if steps:
            res["steps"] = steps
            res["per_step"] = {route: {"bytes": round(d["bytes"] / steps, 1),
                                       "messages": round(d["messages"] / steps, 2)} for route, d in out.items()}
            res["round_trips_per_step"] = {p: round(n / steps, 2) for p, n in rts.items()}
            res["rpcs_per_step"] = {p: round(n / steps, 2) for p, n in rpcs.items()}
        if seconds is not None:
            res["seconds"] = round(seconds, 4)
            if steps:
                res["seconds_per_step"] = round(seconds / steps, 5)
        return res


def _result(cfg: RunConfig, fed: Federation, utility: dict, phases: dict, seconds: float, channel: Any,
            peers: dict[str, str], classes: list, ingest: dict, split: Split, aligned: np.ndarray) -> dict:
    from securevfl.result import feature_privacy, privacy_report, randomness_report, run_json

    stats = channel.stats.as_dict()
    he = fed.cut.describe()
    if cfg.he != "off":  # the key owners describe the scheme; HE time is spent on both sides
        reports = {p.name: p.report.get("he", {}) for p in fed.passives}  # type: ignore[attr-defined]
        by_party = {ACTIVE: he.get("seconds", 0.0), **{n: r.get("seconds", 0.0) for n, r in reports.items()}}
        he_kinds = {k: v for k, v in stats["bytes_by_kind"].items() if k.startswith("he_")}
        he.update({"params": next(iter(reports.values())).get("params", he.get("params")),
                   "seconds": round(sum(by_party.values()), 4), "seconds_by_party": by_party,
                   "bytes": sum(he_kinds.values()), "bytes_by_kind": he_kinds,
                   "seconds_per_step": round(sum(by_party.values()) / max(fed.active.step, 1), 4)})
    tls = channel.net.tls is not None
    # "aligned" as the simulator counts it: the aligned training rows (test rows apart)
    partition = {"parties": len(fed.passives) + 1, "aligned": int(len(split.train_aligned)),
                 "labeled": int(len(split.labeled_ids)), "test_rows": int(len(split.test_ids)),
                 "classes": [str(c) for c in classes], "ingest": ingest}
    transport = {"kind": "grpc", "security": "mutual TLS" if tls else "INSECURE (plaintext, --insecure)",
                 "peers": dict(peers), "timeout_s": channel.net.timeout,
                 "max_message_bytes": channel.net.max_message_bytes,
                 "passive_reports": {p.name: p.report for p in fed.passives}}  # type: ignore[attr-defined]
    cost = {"seconds": round(seconds, 4), "bytes_sent": stats["bytes_sent"], "messages": stats["messages"],
            "bytes_by_kind": stats["bytes_by_kind"], "he": he, "train_steps": fed.active.step,
            "network": phases, "device": device_name(fed.active.device)}
    privacy = {**privacy_report(fed), "features": feature_privacy(fed), **randomness_report(cfg)}
    return run_json(cfg, utility, {}, privacy, cost, partition, fed.meta,
                    [] if tls else ["--insecure: plaintext gRPC, no peer authentication"], transport)

