"""A passive party's side of a deployed run (SPEC §11): ``securevfl party`` serves runs and scoring
requests of the active party (:func:`serve`), each run by its own policy (:func:`serve_run`,
:func:`serve_predict`). The protocol is described in :mod:`securevfl.deploy` (the active party's side).

This module and what it imports are what a passive organisation runs: the core, its own settings
(:mod:`securevfl.party_settings`) and its own protection (``defenses``), never the attack lab
(``tests/test_layering.py`` checks its process)."""

from __future__ import annotations

import dataclasses
import json
import secrets
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from securevfl.channel import MessageKind
from securevfl.channel.base import Endpoint
from securevfl.channel.codec import decode_json
from securevfl.config import RunConfig, apply_dict
from securevfl.cutlayer import make_cut_layer
from securevfl.data import psi
from securevfl.data.csvsource import Split, named_held, party_data, read_file
from securevfl.data.dataset import DataConfig
from securevfl.errors import UserError, environment_error
from securevfl.federation import OptimConfig, build_passive
from securevfl.ids import member
from securevfl.models import ModelConfig
from securevfl.parties import PassiveParty
from securevfl.party_settings import PartySettings
from securevfl.pipeline import defense_hooks
from securevfl.policy import RequestLimits, ServedRows
from securevfl.roles import ACTIVE
from securevfl.runtime import PROTOCOL, expect_object, serve_passive
from securevfl.storage.checkpoint import Checkpoints, run_key
from securevfl.storage.files import make_private_dir, open_new
from securevfl.storage.view import try_write_view

_BAD_BYTES: tuple[type[Exception], ...] = (ValueError, KeyError, TypeError, IndexError, AttributeError,
                                           UnicodeDecodeError, struct.error, RuntimeError, AssertionError)
"""What decoding a peer's malformed bytes raises (codec, JSON, PSI, HE deserialisation, tensor shapes)."""


def _model_config(d: dict) -> ModelConfig:
    # JSON turned the tuple fields into lists
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
    return ModelConfig(**fields)


def serve_run(ep: Endpoint, hello: dict, party_file: str, id_column: str,
              settings: PartySettings | None = None, checkpoint_dir: str | None = None,
              save_dir: str | None = None) -> dict:
    """One run as a passive party, from the active party's run description ``hello`` to its ``end``;
    ``settings``: this party's own privacy settings, which decide over what ``hello`` asks
    (:func:`securevfl.party_settings.reconcile`); ``checkpoint_dir``: where this party keeps its
    own checkpoints (``--checkpoint``; securevfl/storage/checkpoint.py).

    Returns:
        The report sent to the active party at the end (also what ``securevfl party`` prints)."""
    from securevfl.party_settings import admit, check_model_size, reconcile

    settings = settings or PartySettings()
    try:
        if hello.get("protocol") != PROTOCOL or hello.get("op") != "run":
            raise UserError(f"the active party speaks protocol {hello.get('protocol')!r}, this party {PROTOCOL}")
        name = hello["party"]
        if name != ep.party:
            raise UserError(f"the active party addresses {name!r}, this party serves {ep.party!r}")
        _check_engine(ep, hello)
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
        party = build_passive(data, ep, defense_hooks(cfg), model, optim, cut, cfg.seed,
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
        # its own file, and the bottom model and optimiser it trained with (its own settings decided them)
        run["config"] = {**run["config"], "data": {**run["config"]["data"], "party_files": [str(party_file)]},
                         "model": dict(hello["model"]), "optim": dict(hello["optim"])}
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


def _check_engine(ep: Endpoint, hello: dict) -> None:
    """The run's PSI engine is this party's own (``--psi``): refused before any ID moves otherwise."""
    if hello.get("alignment", "psi") == "plain":
        return
    theirs, own = str(hello.get("psi", "x25519")), psi.engine_of(ep, ACTIVE)
    if theirs != own:
        raise UserError(f"the active party aligns with PSI engine {theirs}, this party with {own} (securevfl party "
                        "--psi); both must name the same")


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
    from securevfl.party_settings import admit
    from securevfl.scoring import ScoringOps, method_for
    from securevfl.storage.saved import party_rows, read_party_folder

    settings = settings or PartySettings()
    try:
        if hello.get("protocol") != PROTOCOL:
            raise UserError(f"the active party speaks protocol {hello.get('protocol')!r}, this party {PROTOCOL}")
        name = hello.get("party")
        if name != ep.party:
            raise UserError(f"the active party addresses {name!r}, this party serves {ep.party!r}")
        _check_engine(ep, hello)
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
        ids, X = encode_file_rows(read_party_file(party_file), party_file, prep, cfg.data.numeric_ids,
                                  cfg.data.hashed_ids)
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
    method = method_for(cfg)  # the layout its training ended with, and its scoring operations only
    method.serving_layout(party, 0)
    party.load_own(folder)
    party.serve_only(ServedRows(aligned, aligned, settings.max_batch_size))
    return serve_passive(party, cut, ScoringOps(method), progress=None, desc=f"{name} scoring",
                         extra={"rows": int(len(ids))}, limits=run_limits(settings, None, {}))


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
            desc = expect_object(decode_json(hello), "run description")
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
