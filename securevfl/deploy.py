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
import json
import secrets
import struct
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from securevfl.channel import MessageKind
from securevfl.channel.base import Endpoint
from securevfl.channel.codec import decode_json
from securevfl.checkpoint import Checkpoints, run_key
from securevfl.config import RunConfig, apply_dict
from securevfl.cutlayer import make_cut_layer
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
from securevfl.data.dataset import DataConfig
from securevfl.devices import device_name, resolve_device
from securevfl.errors import UserError, environment_error
from securevfl.federation import Federation, OptimConfig, build_active, build_passive
from securevfl.files import make_private_dir, open_new
from securevfl.ids import member
from securevfl.lab.party_settings import PartySettings
from securevfl.models import ModelConfig, for_head
from securevfl.parties import PassiveParty
from securevfl.policy import RequestLimits, ServedRows
from securevfl.progress import phase
from securevfl.roles import ACTIVE, passive_name
from securevfl.runtime import PROTOCOL, ActiveOnlyCut, PassiveHandle, handles, serve_passive
from securevfl.view import try_write_view

_DATA_OPTIONS = ("numeric_ids", "label_column", "drop_columns", "categorical", "numeric", "min_freq", "hash_buckets")


# ---------------------------------------------------------------------------------- both sides
def run_description(cfg: RunConfig, k: int, n_parties: int, interactive: bool) -> dict:
    """What passive party ``k`` needs to build its own party for this run (no data, no labels)."""
    return {"op": "run", "protocol": PROTOCOL, "party": passive_name(k), "index": k, "n_parties": n_parties,
            "seed": cfg.seed, "model": dataclasses.asdict(cfg.model), "optim": dataclasses.asdict(cfg.optim),
            "he": cfg.he, "he_params": dict(cfg.he_params), "interactive": interactive, "defense": cfg.defense,
            "mechanism_seed": cfg.mechanism_seed, "alignment": "plain" if cfg.partition.alignment == "plain" else "psi",
            "method": cfg.method, "method_params": dict(cfg.method_params), "train": dataclasses.asdict(cfg.train),
            "data": {k: getattr(cfg.data, k) for k in _DATA_OPTIONS}}


def _model_config(d: dict) -> ModelConfig:
    # JSON turned the tuple fields into lists
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
    return ModelConfig(**fields)


def _defenses(cfg: RunConfig) -> list:
    from securevfl.lab.compose import run_defenses  # the composition layer imports the defenses

    return run_defenses(cfg)


def _expect(obj: object, what: str) -> dict:
    if not isinstance(obj, dict):
        raise UserError(f"malformed {what} message (expected a JSON object)")
    return obj


# ---------------------------------------------------------------------------------- passive side
def serve_run(ep: Endpoint, hello: dict, party_file: str, id_column: str,
              settings: PartySettings | None = None, checkpoint_dir: str | None = None,
              save_dir: str | None = None) -> dict:
    """One run as a passive party, from the active party's run description ``hello`` to its ``end``;
    ``settings``: this party's own privacy settings, which decide over what ``hello`` asks
    (:func:`securevfl.lab.party_settings.reconcile`); ``checkpoint_dir``: where this party keeps its
    own checkpoints (``--checkpoint``; securevfl/checkpoint.py).

    Returns:
        The report sent to the active party at the end (also what ``securevfl party`` prints)."""
    from securevfl.lab.party_settings import admit, check_model_size, reconcile  # the composition layer

    settings = settings or PartySettings()
    try:
        if hello.get("protocol") != PROTOCOL or hello.get("op") != "run":
            raise UserError(f"the active party speaks protocol {hello.get('protocol')!r}, this party {PROTOCOL}")
        name = hello["party"]
        if name != ep.party:
            raise UserError(f"the active party addresses {name!r}, this party serves {ep.party!r}")
        checkpoints = _own_checkpoints(hello, party_file, checkpoint_dir)
        hello, notes = reconcile(hello, settings)
        method = _method(hello, _model_config(hello["model"]), OptimConfig(**hello["optim"]), int(hello["seed"]))
        notes += admit(hello, settings, method)
        for note in notes:
            print(f"{name}: {note}", file=sys.stderr, flush=True)
        data_cfg = DataConfig(**hello["data"])
        path = Path(party_file)
        with ep.busy(f"reading its file {path.name}"):
            table = read_file(data_cfg, path, id_column, active=False)
        own = table.ids
    except UserError as e:
        ep.send_json(ACTIVE, MessageKind.CONTROL, {"error": str(e)})
        raise
    # which of the columns its data options name it holds: a name no party holds is refused by the active
    # party, as in one process (its other column names stay its own)
    ep.send_json(ACTIVE, MessageKind.CONTROL, {"ok": int(len(own)), "named_held": named_held(data_cfg, table.columns)})
    # this party's own intersection: every ID the active party announces or asks for is checked against it
    with ep.busy("aligning IDs"):  # (heartbeats pause while it waits on the active party's messages)
        aligned, own_result = psi.align_to(ep, ACTIVE, own, hello["alignment"])
        _within(aligned, own_result, "aligned IDs")
    test_ids = ep.recv_ids(ACTIVE, MessageKind.ALIGNMENT)
    with ep.busy("encoding its rows and building its bottom model"):
        _within(test_ids, aligned, "test IDs")
        split = Split(test_ids, aligned[~member(aligned, test_ids)], aligned[:0])  # (np.isin: quadratic on str IDs)
        data, ingest = party_data(name, table, id_column, aligned, split, data_cfg, None)
        del table  # its columns live on in the encoded arrays only
        cfg = RunConfig(seed=int(hello["seed"]), defense=hello["defense"], mechanism_seed=hello["mechanism_seed"])
        optim = OptimConfig(**hello["optim"])
        model = _model_config(hello["model"])
        check_model_size(bottom_parameters(data, model), settings)
        cut = make_cut_layer(hello["he"], interactive=bool(hello["interactive"]), mixing=model.interactive_mixing,
                             **hello["he_params"])
        party = build_passive(data, ep, _defenses(cfg), model, optim, cut, cfg.seed,
                              own_seed(settings, checkpoints))
    ep.send_json(ACTIVE, MessageKind.CONTROL, {"n_parameters": party.n_parameters()})
    train_aligned = ep.recv_ids(ACTIVE, MessageKind.ALIGNMENT)
    _within(train_aligned, split.train_aligned, "aligned training IDs")
    party.learn_alignment(train_aligned)
    party.serve_only(ServedRows(train_aligned, test_ids, settings.max_batch_size))
    resumes = checkpoints is not None and checkpoints.resume_epoch is not None
    limits = run_limits(settings, method, hello, resumes=resumes)
    # the method's passive program, the same as in the simulator (securevfl/runtime.py)
    def save_own(party: PassiveParty, req: dict) -> dict:
        """``--save``: this party writes its own part into the folder it chose (``party --save``)."""
        if save_dir is None:
            raise UserError("the active party saves the trained federation, but this party keeps no model: start it "
                            "with --save DIR (its own folder)")
        run = dict(req["run"])
        run["config"] = {**run["config"], "data": {**run["config"]["data"], "party_files": [str(party_file)]}}
        where = party.save_own(Path(save_dir) / party.name, run)
        print(f"{party.name}: saved its part in {where}", file=sys.stderr, flush=True)
        return {"saved": party.name}

    report = serve_passive(party, cut, method, progress=None, desc=f"{name} serving", checkpoints=checkpoints,
                           own_ops={"save": save_own}, limits=limits,
                           extra={"rows": ingest["rows_read"], "rows_matched": ingest["rows_matched"]})
    return report


def run_limits(settings: PartySettings, method: Any, hello: dict, resumes: bool = False) -> RequestLimits:
    """What this party answers in one run (securevfl/policy.py): its request budget and rate, the
    permissions of the method's operations, the state operations the run's own settings need, the
    learning rates of its own grid, and the smallest training batch. ``method`` None: a scoring run
    (no training, no state operations)."""
    own = settings.model.resolved()
    budget = {} if method is None else method.state_budget()
    budget["resume"] = int(resumes)
    train = hello.get("train") or {}
    return RequestLimits(settings.max_requests, settings.max_rate,
                         {} if method is None else type(method).passive_permissions, settings.allow,
                         state_budget=budget, rates=[*own.train.lr_grid, float(own.optim.lr or 0)],
                         max_lr=settings.max_lr,
                         batch_size=int(train.get("batch_size") or 1), min_batch_fraction=settings.min_batch_fraction)


def own_seed(settings: PartySettings, checkpoints: Checkpoints | None = None) -> int:
    """This party's own seed (``party --seed``, or fresh from the OS): its initial weights and every draw
    it makes alone (securevfl.federation.PartySeeds); never sent. With checkpoints, a fresh seed is
    kept beside them (``own-seed``, 0600), so that a resumed run draws as the interrupted one did."""
    if settings.seed is not None:
        return settings.seed
    if checkpoints is None:
        return secrets.randbelow(2 ** 62)
    path = checkpoints.dir / "own-seed"
    if checkpoints.resume_epoch is not None:
        try:
            return int(path.read_text())
        except (OSError, ValueError):
            raise UserError(f"the run resumes, but this party's own seed {path} is missing or damaged; start "
                            "over without --resume") from None
    seed = secrets.randbelow(2 ** 62)
    make_private_dir(checkpoints.dir)
    path.unlink(missing_ok=True)
    with open_new(path) as f:
        f.write(str(seed))
    return seed


def bottom_parameters(data: Any, model: ModelConfig) -> int:
    """Parameters of the bottom model ``model`` asks for on ``data``, counted on torch's meta device:
    nothing is allocated, so a hostile description cannot make this party reserve gigabytes."""
    from securevfl.models import build_bottom

    with torch.device("meta"):
        m = build_bottom(data.feature_shape, model, data.n_numeric, data.cardinalities)
    return sum(q.numel() for q in m.parameters())


def _within(ids: np.ndarray, allowed: np.ndarray, what: str) -> None:
    """The active party's announcement stays inside what this party aligned on itself; the refusal
    names counts only (no ID: no membership oracle)."""
    outside = int((~member(ids, allowed)).sum())
    if outside:
        raise UserError(f"the active party announced {outside} {what} outside this party's own PSI result; refused")


def serve_predict(ep: Endpoint, hello: dict, party_file: str, model_dir: str | None,
                  settings: PartySettings | None = None) -> dict:
    """One ``securevfl predict --peer`` run as a passive party: this party reads its new rows through
    the preprocessing it saved, aligns them by PSI with the active party's, loads its own saved part
    (``party --model DIR``: ``DIR/<role>``), and answers the inference batches (its bottom model, its
    half of the cut layer) until the active party ends the run.

    Returns:
        The report sent to the active party at the end."""
    from securevfl.data.csvsource import encode_file_rows, read_party_file
    from securevfl.lab.compose import defense_hooks
    from securevfl.lab.party_settings import admit
    from securevfl.lab.predict import party_rows
    from securevfl.saved import read_party_folder

    settings = settings or PartySettings()
    try:
        if hello.get("protocol") != PROTOCOL:
            raise UserError(f"the active party speaks protocol {hello.get('protocol')!r}, this party {PROTOCOL}")
        name = hello.get("party")
        if name != ep.party:
            raise UserError(f"the active party addresses {name!r}, this party serves {ep.party!r}")
        if model_dir is None:
            raise UserError("the active party asks to score rows, but this party serves no saved model: start it "
                            "with --model DIR (the folder its party --save wrote)")
        folder = Path(model_dir) / ep.party
        manifest, _, prep = read_party_folder(folder)
        if manifest.get("run_id") != hello.get("run_id"):
            raise UserError(f"--model {model_dir}: {ep.party}'s folder is from another training run than the active "
                            "party's (the folders of one train --save belong together)")
        cfg = RunConfig()
        apply_dict(cfg, manifest["config"])
        # the same policy as a training run: its alignment, its methods (no training: no state operations)
        for note in admit({"method": cfg.method, "alignment": hello.get("alignment", "psi")}, settings, None):
            print(f"{name}: {note}", file=sys.stderr, flush=True)
        cfg.model = dataclasses.replace(cfg.model, cut_dim=int(hello.get("cut_dim", cfg.model.cut_dim)))
        ids, X = encode_file_rows(read_party_file(party_file), party_file, prep, cfg.data.numeric_ids)
    except UserError as e:
        ep.send_json(ACTIVE, MessageKind.CONTROL, {"error": str(e)})
        raise
    ep.send_json(ACTIVE, MessageKind.CONTROL, {"ok": int(len(ids))})
    aligned, own_result = psi.align_to(ep, ACTIVE, ids, "plain" if hello.get("alignment") == "plain" else "psi")
    _within(aligned, own_result, "aligned IDs")
    data = party_rows(manifest, prep, ids, X, aligned)
    cut = make_cut_layer(cfg.he, interactive=bool(manifest["interactive"]), mixing=cfg.model.interactive_mixing,
                         **cfg.he_params)
    # the saved weights replace the initial ones; the draws after them are this party's own
    party = build_passive(data, ep, defense_hooks(cfg), cfg.model, cfg.optim, cut, cfg.seed,
                          own_seed(settings))
    party.load_own(folder)
    party.serve_only(ServedRows(aligned, aligned, settings.max_batch_size))
    return serve_passive(party, cut, None, progress=None, desc=f"{name} scoring", extra={"rows": int(len(ids))},
                         limits=run_limits(settings, None, {}))


def _own_checkpoints(hello: dict, party_file: str, folder: str | None) -> Checkpoints | None:
    """This party's checkpoints of the run ``hello`` describes, when the active party keeps them."""
    if not hello.get("checkpoint"):
        return None
    if folder is None:
        raise UserError("the active party keeps checkpoints of this run, but this party keeps none: start it with "
                        "--checkpoint DIR (its own folder) to take part")
    ck = Checkpoints(folder, run_key(hello, party_file), hello.get("resume_epoch"), party=str(hello.get("party")))
    if ck.resume_epoch is not None and int(ck.resume_epoch) not in ck.epochs():
        raise UserError(f"the active party resumes after epoch {ck.resume_epoch}, but this party has no checkpoint "
                        f"of it in {ck.dir} (have: {', '.join(map(str, ck.epochs())) or 'none'}); start it with the "
                        "same --checkpoint folder and file as the interrupted run")
    return ck


def _method(hello: dict, model: ModelConfig, optim: OptimConfig, seed: int) -> Any:
    """The run's method at this passive party (its passive operations), from the run description."""
    from securevfl.methods import METHODS, MethodContext
    from securevfl.training import TrainConfig

    name = hello.get("method", "splitnn")
    if name not in METHODS.names():
        raise UserError(f"the active party asks for method {name!r}, which this party does not know")
    cls = METHODS.get(name)
    if not cls.per_role:
        raise UserError(f"method {name} cannot run across processes: {cls.not_deployable}")
    train = TrainConfig(**hello.get("train", {}))
    return cls(MethodContext(train=train, model=model, optim=optim, seed=seed, params=hello.get("method_params", {}),
                             progress=False))


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
    if save is not None and not method.savable:
        raise UserError(f"--save: method {cfg.method} is not supported (it ends with other models or predicts another "
                        "way than the plain split model); splitnn, fedlocal-* and vflhlp* are")
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
    from securevfl.lab.compose import resolve_config

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
    from securevfl.lab.compose import prepare_method

    n_parties = len(peers) + 1
    cfg = _resolved(cfg, n_parties)
    _, cut = prepare_method(cfg, _defenses(cfg), [], record=False, progress=False, device=torch.device("cpu"))
    names = sorted(peers, key=lambda n: int(n.removeprefix("passive")) if n.removeprefix("passive").isdigit() else 0)
    return {n: run_description(cfg, k, n_parties, cut.interactive) for k, n in enumerate(names, start=1)}


def run_deployed(cfg: RunConfig, channel: Any, peers: dict[str, str], progress: bool | None = None,
                 checkpoint: str | None = None, resume: bool = False, save: str | None = None) -> dict:
    """Train and evaluate as the active party with every passive party in its own process.

    Args:
        cfg: the run (``--dataset csv``, this party's file only).
        channel: a connected :class:`~securevfl.channel.grpc.GrpcChannel` for party ``active``.
        peers: passive party name → address (for the record).
        progress: progress bars on stderr.
        checkpoint: a folder where this party keeps its checkpoints at each epoch end (each passive
            party keeps its own, securevfl/checkpoint.py).
        resume: continue the run from the newest checkpoint in ``checkpoint``.
        save: this party writes its trained part into ``save/active``; each passive party writes its
            own into its own ``securevfl party --save`` folder (for ``securevfl predict``).

    Returns:
        The run's JSON object (as ``train --json``, plus ``transport`` and ``cost.network``)."""
    from securevfl.lab.compose import check_task, prepare_method, run_warnings

    check_deployable(cfg, peers, checkpoint, resume, save)
    defenses = _defenses(cfg)
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
    for k, name in enumerate(names, start=1):
        ep.send_json(name, MessageKind.CONTROL,
                     run_description(cfg, k, n_parties, interactive) | resume_at)
    held = set(named_held(cfg.data, table.columns))
    for name in names:
        reply = _expect(ep.recv_json(name, MessageKind.CONTROL), "handshake")
        if "error" in reply:
            raise UserError(f"{name}: {reply['error']}")
        held |= {str(c) for c in reply.get("named_held", [])}
    check_named(cfg.data, [sorted(held)])  # a column named on the command line that no party holds
    # 2. alignment
    channel.netstats.phase = "alignment"
    t_align = time.perf_counter()
    with ep.busy("aligning IDs"), phase("aligning IDs with the passive parties", progress):
        aligned = psi.align_with(ep, names, own, "plain" if cfg.partition.alignment == "plain" else "psi")
        if len(aligned) == 0:
            raise UserError("the party files share no IDs; IDs are compared as exact strings unless --numeric-ids "
                            "is set")
        split = split_rows(aligned, own, has_label, cfg.partition, cfg.seed)
    for name in names:
        ep.send_ids(name, MessageKind.ALIGNMENT, split.test_ids)
    labels = ActiveLabels(y_all, has_label, cfg.partition.active_labels_unaligned)
    with ep.busy("encoding its rows"):
        a_data, ingest = party_data(ACTIVE, table, id_col, aligned, split, cfg.data, labels,
                                    features=cfg.partition.active_features)
    del table
    with phase("waiting for the passive parties' set-up (their rows and bottom models)", progress):
        remotes = [PassiveHandle(n, ep, int(_expect(ep.recv_json(n, MessageKind.CONTROL), "ready")["n_parameters"]))
                   for n in names]
    # the active party's models from the same seed streams as the simulator's standard_models
    active = build_active(a_data, ep, defenses, cfg.model, cfg.optim, cut, names, n_classes, cfg.seed, device,
                          features=cfg.partition.active_features)
    fed = Federation(channel, active, remotes, ActiveOnlyCut(cut), n_classes,  # type: ignore[arg-type]
                     regression=regression, checkpoints=ck)
    active.learn_alignment(split.train_aligned, a_data.test_ids)
    for name in names:
        ep.send_ids(name, MessageKind.ALIGNMENT, split.train_aligned)
    phases["alignment"] = mark.take(seconds=time.perf_counter() - t_align)
    # 3. training and evaluation: the simulator's own code (the torch RNG continues from the head's
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
    # 4. end: every passive party reports
    for r in remotes:
        _expect(r.end(), "report")
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


_BAD_BYTES: tuple[type[Exception], ...] = (ValueError, KeyError, TypeError, IndexError, AttributeError,
                                           UnicodeDecodeError, struct.error, RuntimeError, AssertionError)
"""What decoding a peer's malformed bytes raises (codec, JSON, PSI, HE deserialisation, tensor shapes)."""


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
    from securevfl.provenance import versions
    from securevfl.result import feature_privacy, json_safe, privacy_report, randomness_report

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
    return json_safe({
        "dataset": cfg.dataset, "method": cfg.method, "seed": cfg.seed, "defense": cfg.defense,
        "utility": utility, "attacks": {},
        "privacy": {**privacy_report(fed), "features": feature_privacy(fed), **randomness_report(cfg)},
        "cost": {"seconds": round(seconds, 4), "bytes_sent": stats["bytes_sent"], "messages": stats["messages"],
                 "bytes_by_kind": stats["bytes_by_kind"], "he": he, "train_steps": fed.active.step,
                 "network": phases, "device": device_name(fed.active.device)},
        # "aligned" as the simulator counts it: the aligned training rows (test rows apart)
        "partition": {"parties": len(fed.passives) + 1, "aligned": int(len(split.train_aligned)),
                      "labeled": int(len(split.labeled_ids)), "test_rows": int(len(split.test_ids)),
                      "classes": [str(c) for c in classes], "ingest": ingest},
        "transport": {"kind": "grpc", "security": "mutual TLS" if tls else "INSECURE (plaintext, --insecure)",
                      "peers": dict(peers), "timeout_s": channel.net.timeout,
                      "max_message_bytes": channel.net.max_message_bytes,
                      "passive_reports": {p.name: p.report for p in fed.passives}},  # type: ignore[attr-defined]
        "method_info": fed.meta, "warnings": [] if tls else ["--insecure: plaintext gRPC, no peer authentication"],
        "versions": versions(),
        "config": cfg.to_dict(),
    })


# ---------------------------------------------------------------------------------- the server
def serve(channel: Any, party_file: str, id_column: str, serve_forever: bool = False,
          own: PartySettings | None = None, record_view: str | None = None, checkpoint: str | None = None,
          save: str | None = None, model: str | None = None) -> int:
    """``securevfl party``: answer runs of the active party on ``channel`` (a listening
    :class:`~securevfl.channel.grpc.GrpcChannel`); one run, or one after another with ``serve_forever``.
    A run that fails (bad bytes, a vanished or stalled peer, a bad file) ends with one ``error:``
    line here and an abort message to the active party; the server itself never crashes on it.

    ``record_view``: a folder for this party's own view of each run (``channel`` records; with
    ``serve_forever`` one sub-folder per run), written also when a run fails.

    Returns:
        The exit status: 0 when the (last) run finished, 2 when it failed."""
    status, runs = 0, 0
    while True:
        hello = None
        while hello is None:  # idle until the active party starts a run (no timeout: a server waits)
            hello = channel.wait_inbox(ACTIVE, MessageKind.CONTROL, timeout=1.0)
        print(f"{channel.party}: run started by the active party", file=sys.stderr, flush=True)
        try:
            desc = _expect(decode_json(hello), "run description")
            if desc.get("op") == "predict":
                report = serve_predict(channel.endpoint(channel.party), desc, party_file, model, own)
            else:
                report = serve_run(channel.endpoint(channel.party), desc, party_file, id_column, own, checkpoint, save)
            channel.drain(grace=min(10.0, channel.net.timeout))
            print(json.dumps({"party": channel.party, "steps": report["steps"], "bytes": channel.stats.as_dict()}))
            status = 0
        except UserError as e:
            status = _fail(channel, str(e))
        except (OSError, MemoryError) as e:  # this machine's limits: one line here and to the peer; it serves on
            status = _fail(channel, f"{channel.party}: {environment_error(e)}")
        except _BAD_BYTES as e:  # bytes that do not decode as the protocol says
            status = _fail(channel, f"malformed message from the active party ({type(e).__name__}: {e})")
        runs += 1
        if record_view is not None:
            folder = Path(record_view) / f"run-{runs}" if serve_forever else Path(record_view)
            error = try_write_view(folder, channel.party, channel.transcript, {"status": status})
            if error is None:
                print(f"{channel.party}: its view of the run is in {folder}", file=sys.stderr, flush=True)
            else:
                print(f"error: {error}", file=sys.stderr, flush=True)
                status = 2
        if not serve_forever:
            return status
        channel.reset()


def _fail(channel: Any, reason: str) -> int:
    print(f"error: {reason}", file=sys.stderr, flush=True)
    channel.abort(reason)
    channel.drain(grace=2.0)
    return 2
