"""``securevfl`` command line: train, sweep, report. User mistakes exit 2 with one ``error: ...`` line."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

from securevfl.errors import UserError
from securevfl.validate import host_port, number


class _Parser(argparse.ArgumentParser):
    """User mistakes → one ``error: ...`` line. ``populate`` adds the flags on first use: ``train``'s
    come from the config dataclasses, whose modules import torch, which ``securevfl methods`` and
    ``securevfl --help`` must not wait for."""

    def __init__(self, *args, populate: Callable[[argparse.ArgumentParser], None] | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._populate = populate

    def _ensure(self) -> None:
        if self._populate is not None:
            populate, self._populate = self._populate, None
            populate(self)

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        self._ensure()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self._ensure()
        return super().format_help()

    def format_usage(self) -> str:
        self._ensure()
        return super().format_usage()

    def error(self, message: str) -> NoReturn:  # argparse's usage dump → our one-line contract
        raise UserError(message)


def _workers(v: str) -> int | str:
    if v == "auto":
        return v
    try:
        return int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of workers or 'auto', got {v!r}") from None


def _train_flags(p: argparse.ArgumentParser) -> None:
    """``train``'s flags: one per setting that declares a flag (securevfl/settings.py), then the few
    that are not one setting."""
    from securevfl.config import RunConfig
    from securevfl.settings import add_flags

    groups = add_flags(p, RunConfig)
    groups["data"].add_argument("--id-column", action="append",
                                help="csv source: entity-ID column (default id); once for all files "
                                     "(data.id_column), or once per file in order (data.id_columns)")
    p.add_argument("--config", help="YAML file with run settings (flags override it)")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: when stderr is a terminal)")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no warnings on stderr")
    p.add_argument("--save", metavar="DIR",
                   help="each party writes its trained part into DIR/<party>/ (for securevfl predict)")
    net = p.add_argument_group("parties in other processes (docs/deployment.md)")
    net.add_argument("--peer", action="append", default=[], metavar="NAME=HOST:PORT",
                     help="a passive party served by `securevfl party` (once per passive party: passive1, ...); "
                          "this process is then the active party, with --party-file its own file only")
    net.add_argument("--resume", action="store_true",
                     help="continue the run from the newest checkpoint in --checkpoint DIR (same flags and files)")
    _net_flags(net)


def _net_flags(g) -> None:
    """Flags of the network transport, shared by ``train --peer`` and ``party``."""
    g.add_argument("--tls", metavar="DIR", help="this party's folder from `securevfl certs` (mutual TLS)")
    g.add_argument("--insecure", action="store_true", help="plaintext gRPC without authentication (warns)")
    g.add_argument("--timeout", default=None, metavar="S",
                   help="seconds to wait for a peer's next message or answer (default 120; at most a week)")
    g.add_argument("--max-message-mb", default=None, metavar="MB",
                   help="largest message accepted or sent, MiB (default 256; gRPC's limit: under 2048)")
    g.add_argument("--checkpoint", default=None, metavar="DIR",
                   help="keep this party's own checkpoint in DIR at each epoch end, so that a killed run can be "
                        "resumed (train --resume; every party needs its own)")
    g.add_argument("--record-view", default=None, metavar="DIR",
                   help="write this party's own view (every message it sent and received) into the new folder DIR, "
                        "for the lab's attacks offline (securevfl/view.py)")


def _add_train(sub) -> None:
    sub.add_parser("train", help="train one method on one dataset and report utility, privacy and cost",
                   populate=_train_flags)


def _build_config(args: argparse.Namespace):
    from securevfl.config import RunConfig, apply_dict, load_config_file
    from securevfl.settings import apply_flags
    from securevfl.validate import refuse_test_fixtures, validate_config

    cfg = RunConfig()
    if args.config:
        apply_dict(cfg, load_config_file(args.config))
    apply_flags(cfg, args)
    refuse_test_fixtures(cfg.he_params, "--he-param" if not args.config else "--he-param / config he_params")
    if args.id_column:  # once: the column of every file; more: one per file
        if len(args.id_column) == 1:
            cfg.data.id_column = args.id_column[0]
        else:
            cfg.data.id_columns = list(args.id_column)
    data_dir = getattr(args, "data.dir")
    if data_dir is not None and not Path(data_dir).is_dir():
        raise UserError(f"--data-dir {data_dir}: no such directory")
    validate_config(cfg, data_options=False)  # every type and range now, before any heavy import (issue 51)
    from securevfl.catalog import check_component_names

    check_component_names(cfg.attacks, cfg.defense)
    return cfg  # and again, whole, by lab.compose.execute, the one entry every run passes through


def cmd_train(args: argparse.Namespace) -> int:
    from securevfl.catalog import check_names

    check_names(args.dataset, args.method)  # before the heavy imports below: a typo answers at once
    view_error = None
    if args.peer:
        r, view_error = _train_deployed(args)
    else:
        given = [f for f, v in (("--tls", args.tls), ("--insecure", args.insecure), ("--timeout", args.timeout),
                                ("--max-message-mb", args.max_message_mb), ("--record-view", args.record_view),
                                ("--checkpoint", args.checkpoint), ("--resume", args.resume))
                 if v]
        if given:
            raise UserError(f"{'/'.join(given)} go{'es' if len(given) == 1 else ''} with --peer (parties in other "
                            "processes); without --peer every party runs in this process")
        cfg = _build_config(args)  # a mistake is answered before the heavy imports below
        _configure_threads()
        from securevfl.lab.compose import execute

        if args.save is not None:
            _check_writable_dir(args.save, "--save")
        progress = False if args.quiet else args.progress
        r = execute(cfg, progress=progress, save=args.save).to_json()
        if args.save is not None and not args.quiet:
            print(f"saved: each party's part in {args.save}/<party>/ (securevfl predict --model {args.save})",
                  file=sys.stderr)
    if args.json:
        print(json.dumps(r))
        return _view_failed(view_error)
    u, c, pr = r["utility"], r["cost"], r["privacy"]
    test = _score(u["test"])
    print(f"{r['method']} on {r['dataset']} (seed {r['seed']}): test {u['metric']} = {test}")
    print(f"  partition: {r['partition']['parties']} parties, {r['partition']['aligned']} aligned, "
          f"{r['partition']['labeled']} labeled, {r['partition']['test_rows']} test rows")
    eps = "n/a" if pr["epsilon"] is None else f"{pr['epsilon']:.3g} (δ={pr['delta']:.2g})"
    print(f"  privacy: mechanism {pr['mechanism']}, ε = {eps}")
    audit = pr.get("audit")
    if isinstance(audit, dict) and "epsilon_lower" in audit:  # the audit's bound beside the claim it checks
        print(f"  audit: ε ≥ {audit['epsilon_lower']:.3g} at {100 * audit.get('confidence', 0.95):.0f} % confidence "
              f"({audit.get('side', 'labels')} side, {audit.get('correct')} of {audit.get('guesses')} guesses right "
              f"by {audit.get('adversary', '?')}'s best scorer {audit.get('attack', '?')}; docs/audit.md)")
    print(f"  cost: {c['seconds']:.1f} s, {c['bytes_sent'] / 1e6:.2f} MB in {c['messages']} messages, "
          f"he={c['he']['scheme']}")
    if c["he"]["scheme"] != "off":
        he = c["he"]
        print(f"  he: {he['scheme']} {he['params'].get('security_bits')}-bit security, {he['seconds']:.1f} s "
              f"in HE, {he['bytes'] / 1e6:.2f} MB of HE messages; protects passive activations from the active "
              "party, not labels from passive parties")
    if "transport" in r:
        t = r["transport"]
        step = r["cost"]["network"]["train"]
        print(f"  transport: gRPC, {t['security']}, peers {', '.join(f'{k}={v}' for k, v in t['peers'].items())}; "
              f"{step.get('seconds_per_step', 0):.3f} s per training step")
    for name, a in r["attacks"].items():
        base = "mean predictor" if _attack_kind(name) == "feature_reconstruction" else "local-SSL baseline"
        extra = "".join(f", {label} {a[key]:.4f}" for key, label in
                        (("control", "control"), ("baseline", base)) if a.get(key) is not None)
        leak = f"; leakage {a['leakage']:+.4f}" if a.get("leakage") is not None else ""
        print(f"  attack {name}: {a['metric']} = {_score(a['value'])} (prior {_score(a.get('prior'))}{extra}){leak}")
    return _view_failed(view_error)


def _attack_kind(name: str) -> str:
    """The attack's declared kind (its baseline is named after it: fr's is the mean predictor)."""
    from attacks import ATTACKS

    try:
        return str(getattr(ATTACKS.get(name), "kind", ""))
    except UserError:
        return ""


def _net_config(args: argparse.Namespace, party: str):
    """The transport settings of ``party`` (exits 2 with the install hint without the ``net`` extra)."""
    from securevfl.channel import net_transport

    grpc_mod = net_transport()
    if args.insecure == bool(args.tls):
        raise UserError("give --tls DIR (this party's folder from `securevfl certs`), or --insecure for plaintext")
    if args.insecure:
        print("warning: --insecure: plaintext gRPC; peers are not authenticated and messages are readable on the "
              "network", file=sys.stderr)
    kw = {}
    if args.timeout is not None:
        kw["timeout"] = number("--timeout", args.timeout, gt=0, le=7 * 86400)
    if args.max_message_mb is not None:
        kw["max_message_bytes"] = int(number("--max-message-mb", args.max_message_mb, gt=0, le=2047) * 2 ** 20)
    tls = None if args.insecure else grpc_mod.TLSFiles.load(args.tls, party)
    return grpc_mod, grpc_mod.NetConfig(tls, **kw)


def _view_failed(error: str | None) -> int:
    """After the result is out: the one line saying the view was not written (exit 2), if it was not."""
    if error is None:
        return 0
    print(f"error: {error}", file=sys.stderr)
    return 2


def _train_deployed(args: argparse.Namespace) -> tuple[dict, str | None]:
    """The deployed run's result, and why its ``--record-view`` could not be written (None: it was, or
    none was asked for): a view that fails never loses the result."""
    from securevfl.roles import ACTIVE

    peers = _peers(args.peer)
    if args.save is not None:
        _check_writable_dir(args.save, "--save")
    cfg = _build_config(args)
    prepare_view_dir(args.record_view)
    if args.checkpoint is not None:  # a folder that cannot hold checkpoints fails now, not at the first epoch's end
        _check_writable_dir(args.checkpoint, "--checkpoint", private=True)
    _configure_threads()
    from securevfl.deploy import train_deployed  # heavy: after every flag is checked
    grpc_mod, net = _net_config(args, ACTIVE)
    _startup_tls(args, ACTIVE)
    channel = grpc_mod.GrpcChannel(ACTIVE, net, peers=peers, record=cfg.record or args.record_view is not None)
    view_error = None
    try:
        r = train_deployed(cfg, channel, peers, progress=args.progress, checkpoint=args.checkpoint, resume=args.resume,
                           save=args.save)
    except KeyboardInterrupt:  # Ctrl-C: the passive parties are told why, and the operator what was kept
        where = _kept_checkpoint(args.checkpoint)
        channel.abort("the active party's operator interrupted the run (Ctrl-C)" + (
            "; restart this party with the same flags: the active party resumes the run" if where else ""))
        raise KeyboardInterrupt(f"interrupted; {where}" if where else "interrupted (no --checkpoint: nothing "
                                "of the run was kept; rerun it)") from None
    finally:
        if args.record_view is not None:  # also when the run failed: what this party saw up to then
            from securevfl.view import try_write_view

            view_error = try_write_view(args.record_view, ACTIVE, channel.transcript,
                                        {"method": cfg.method, "seed": cfg.seed})
            if view_error is not None and sys.exc_info()[0] is not None:  # the run's own error follows
                print(f"error: {view_error}", file=sys.stderr)
        channel.close()
    return r, view_error


def _kept_checkpoint(folder: str | None) -> str | None:
    """What an interrupted deployed run kept in ``--checkpoint``, and how to go on (None: no folder)."""
    if folder is None:
        return None
    kept = sorted(Path(folder).glob("*/epoch-*.pt"), key=lambda p: p.stat().st_mtime)
    if not kept:
        return (f"no epoch had ended, so {folder} holds no checkpoint of this run yet: restart every passive party "
                "with the same flags and rerun this command")
    epoch = kept[-1].stem.removeprefix("epoch-")
    return (f"the checkpoints of epoch {epoch} are kept in {folder} (each passive party keeps its own): restart every "
            "passive party with the same flags, then rerun this command with --resume")


def _peers(specs: list[str]) -> dict[str, str]:
    """``--peer NAME=HOST:PORT`` flags, checked."""
    peers: dict[str, str] = {}
    for spec in specs:
        name, sep, addr = spec.partition("=")
        if not sep or not name or ":" not in addr:
            raise UserError(f"--peer {spec}: expected NAME=HOST:PORT (e.g. passive1=10.0.0.2:50051)")
        if host_port(f"--peer {name}", addr)[1] == 0:
            raise UserError(f"--peer {spec}: port 0 is not a peer's port (0 means 'any free port' only to --listen)")
        if name in peers:
            raise UserError(f"--peer {name} given twice")
        peers[name] = addr
    return peers


def _predict_deployed(args: argparse.Namespace) -> dict:
    from securevfl.lab.predict import predict_deployed
    from securevfl.roles import ACTIVE

    peers = _peers(args.peer)
    if args.checkpoint or args.record_view:
        raise UserError("--checkpoint and --record-view are for training runs (train --peer), not predict")
    if len(args.party_file) != 1:
        raise UserError("with --peer, give only this (the active) party's new file: --party-file ACTIVE.csv")
    grpc_mod, net = _net_config(args, ACTIVE)
    channel = grpc_mod.GrpcChannel(ACTIVE, net, peers=peers)
    try:
        try:
            return predict_deployed(args.model, args.party_file[0], args.out, channel, peers)
        except UserError as e:
            channel.abort(str(e))
            raise
    finally:
        channel.close()


def prepare_view_dir(path: str | None) -> None:
    """``--record-view``'s folder is new or empty, and made now: a place that cannot hold it fails before
    the run, not after it."""
    if path is None:
        return
    _check_new_dir(path, "--record-view")
    from securevfl.files import make_private_dir

    try:
        make_private_dir(Path(path))
    except (OSError, UserError) as e:
        raise UserError(f"--record-view {path}: cannot create the folder ({getattr(e, 'strerror', None) or e})") \
            from None


def _check_new_dir(path: str | None, flag: str) -> None:
    """``flag``'s folder is new or empty (checked before the run, so nothing is lost at its end)."""
    if path is None:
        return
    p = Path(path)
    if p.is_symlink() or (p.exists() and (not p.is_dir() or any(p.iterdir()))):
        raise UserError(f"{flag} {path}: exists and is not an empty folder")


def cmd_doctor(args: argparse.Namespace) -> int:
    """``securevfl doctor train ...`` / ``securevfl doctor party ...``: securevfl/doctor.py's checks."""
    from securevfl import doctor

    if not args.checked or args.checked[0] not in ("train", "party"):
        raise UserError("doctor checks the command a party is about to run: securevfl doctor train --peer ... or "
                        "securevfl doctor party --role ... (the same flags)")
    inner = make_parser().parse_args(args.checked)
    checks = _doctor_train(inner) if inner.command == "train" else _doctor_party(inner)
    return doctor.report(checks, lambda line: print(line, flush=True))


def _startup_tls(args: argparse.Namespace, party: str) -> None:
    """The doctor's certificate check, run by ``train --peer`` and ``party`` as they start."""
    if args.insecure:
        return
    from securevfl import doctor

    check = doctor.check_tls(args.tls, party)
    if not check.ok:
        raise UserError(f"--tls {args.tls}: {check.detail}")
    if check.warning:
        print(f"warning: {check.detail} (expires soon: securevfl certs makes new ones)", file=sys.stderr)


def _doctor_tls(args: argparse.Namespace, party: str) -> list:
    from securevfl import doctor

    if args.insecure:
        return [doctor.Check("tls", True, "--insecure: plaintext, no certificates to check", warning=True)]
    if not args.tls:
        raise UserError("give --tls DIR (this party's folder from `securevfl certs`), or --insecure for plaintext")
    return [doctor.check_tls(args.tls, party)]


def _doctor_train(args: argparse.Namespace) -> list:
    """The active party's checks: its certificate, its file, its resources, then every peer."""
    from securevfl import doctor
    from securevfl.roles import ACTIVE

    if not args.peer:
        raise UserError("doctor checks a deployment: give the train command with its --peer flags")
    peers = _peers(args.peer)
    cfg = _build_config(args)
    if len(cfg.data.party_files) != 1:
        raise UserError("with --peer, give only this (the active) party's file: --party-file ACTIVE.csv")
    id_col = cfg.data.id_columns[0] if cfg.data.id_columns else cfg.data.id_column
    checks = [*_doctor_tls(args, ACTIVE),
              doctor.check_party_file(cfg.data.party_files[0], id_col, cfg.data.label_column, True,
                                      cfg.data.numeric_ids),
              *doctor.check_resources(cfg.data.party_files[0], [args.checkpoint, args.record_view])]
    if not all(c.ok for c in checks):
        return checks
    from securevfl.deploy import planned_descriptions
    from securevfl.party_settings import settings_digest

    descriptions = planned_descriptions(cfg, peers)
    digest = settings_digest(next(iter(descriptions.values())))
    checks.append(doctor.Check("settings", True, f"digest {digest} (a passive party may pin it: party "
                                                 f"--expect-settings {digest})"))
    grpc_mod, net = _net_config(args, ACTIVE)
    channel = grpc_mod.GrpcChannel(ACTIVE, net, peers=peers)
    try:
        return checks + doctor.check_peers(channel, peers, descriptions)
    finally:
        channel.close()


def _doctor_party(args: argparse.Namespace) -> list:
    """A passive party's checks: its certificate, its file, its address, its resources."""
    from securevfl import doctor

    role = args.role
    if not (role.startswith("passive") and role.removeprefix("passive").isdigit()):
        raise UserError(f"--role {role}: a served party is passive1, passive2, ...")
    party_settings(args)  # its own settings and policy flags make sense
    return [*_doctor_tls(args, role), doctor.check_party_file(args.party_file, args.id_column, None, False),
            doctor.check_listen(args.listen),
            *doctor.check_resources(args.party_file, [args.checkpoint, args.record_view, args.save])]


def cmd_party(args: argparse.Namespace) -> int:
    from securevfl import threads

    host_port("--listen", args.listen)
    if not (args.role.startswith("passive") and args.role.removeprefix("passive").isdigit()):
        raise UserError(f"--role {args.role}: a served party is passive1, passive2, ... (the active party runs "
                        "`securevfl train --peer ...`)")
    check_party_file(args.party_file)  # before listening: a server that cannot serve any run must not start
    own = party_settings(args)
    prepare_view_dir(args.record_view)
    if args.checkpoint is not None:
        _check_writable_dir(args.checkpoint, "--checkpoint", private=True)
    grpc_mod, net = _net_config(args, args.role)
    _startup_tls(args, args.role)
    from securevfl.serve import serve  # heavy (torch): after every flag is checked

    threads.configure()
    channel = grpc_mod.GrpcChannel(args.role, net, listen=args.listen, client="active",
                                   record=args.record_view is not None)
    from securevfl.doctor import passive_verdict

    channel.doctor = lambda description: passive_verdict(description, own, args.party_file, args.id_column)
    print(f"{args.role}: listening on {args.listen.rsplit(':', 1)[0]}:{channel.port} "
          f"({'mutual TLS' if net.tls else 'INSECURE plaintext'})", file=sys.stderr, flush=True)
    try:
        return serve(channel, args.party_file, args.id_column, args.serve_forever, own, args.record_view,
                     args.checkpoint, args.save, args.model)
    finally:
        channel.close()


def check_party_file(path: str) -> None:
    """``party --party-file`` exists and is a file (checked before the server listens)."""
    if not Path(path).is_file():
        raise UserError(f"--party-file {path}: no such file")


def party_settings(args: argparse.Namespace):
    """``party``'s own privacy settings (:class:`securevfl.party_settings.PartySettings`), checked."""
    from securevfl.party_settings import PartySettings, check_own
    from securevfl.settings import parse_keyvalues

    he_params = parse_keyvalues("--he-param", args.he_param)  # the one key=value syntax of every command
    if args.defense is not None and not args.defense.strip():
        raise UserError("--defense is empty: name a defense, or 'none'")
    seed = None if args.mechanism_seed is None else int(number("--mechanism-seed", args.mechanism_seed, integer=True,
                                                               ge=0, le=2 ** 63 - 1))
    if args.he is not None and args.he not in ("off", "ckks", "bfv", "paillier"):
        raise UserError(f"--he {args.he}: expected off, ckks, bfv or paillier")
    policy = party_policy(args)
    from securevfl.passive_own import from_args

    own = PartySettings(defense=args.defense, mechanism_seed=seed, he=args.he, he_params=he_params,
                        interactive_mixing=args.interactive_mixing, model=from_args(args), **policy)
    check_own(own)
    return own


_LIMIT_RANGES = {"max_rate": (0, 10 ** 12), "max_lr": (1e-12, 10), "min_batch_fraction": (0, 1)}


def party_policy(args: argparse.Namespace) -> dict:
    """``party``'s own seed and policy flags, checked (fields of ``PartySettings``)."""
    from securevfl.catalog import check_names  # torch-free: a typo is answered at once
    from securevfl.party_settings import DIGEST_HEX, PERMISSIONS

    out: dict = {}
    if args.seed is not None:
        out["seed"] = int(number("--seed", args.seed, integer=True, ge=0, le=2 ** 63 - 1))
    allow = [a.strip() for item in args.allow for a in item.split(",") if a.strip()]
    for a in allow:
        if a not in PERMISSIONS:
            raise UserError(f"--allow {a}: expected one of {', '.join(PERMISSIONS)}")
    out["allow"] = frozenset(allow)
    if args.methods is not None:
        methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
        if not methods:
            raise UserError("--methods is empty: name the methods this party takes part in")
        for m in methods:
            check_names(None, m)  # a one-line error naming the known ones
        out["methods"] = methods
    if args.expect_settings is not None:
        digest = args.expect_settings.strip().lower()
        if len(digest) != DIGEST_HEX or any(c not in "0123456789abcdef" for c in digest):
            raise UserError(f"--expect-settings {args.expect_settings!r}: expected the {DIGEST_HEX} hex digits "
                            "`securevfl doctor train` prints")
        out["expect_settings"] = digest
    limits = (("--max-batch-size", "max_batch_size", True), ("--max-parameters", "max_parameters", True),
              ("--max-requests", "max_requests", True), ("--max-rate", "max_rate", False),
              ("--max-lr", "max_lr", False), ("--min-batch-fraction", "min_batch_fraction", False))
    for flag, key, integer in limits:
        given = getattr(args, key)
        if given is not None:
            lo, hi = _LIMIT_RANGES.get(key, (1, 10 ** 12))
            value = number(flag, given, integer=integer, ge=lo, le=hi)
            out[key] = int(value) if integer else float(value)
    return out


def cmd_certs(args: argparse.Namespace) -> int:
    from securevfl.channel import net_transport

    net_transport()  # the certs need the same extra
    from securevfl.channel.certs import make_certs

    folders = make_certs(args.parties.split(","), args.out)
    for name, d in folders.items():
        print(f"{name}: {d}  (copy this folder to {name}'s machine; its .key never leaves it)")
    print(f"CA key: {Path(args.out) / 'ca' / 'ca.key'} (keep it here, or delete it)")
    return 0


def _score(x: float | None) -> str:
    """A score as printed; ``undefined`` for null (an AUC over rows of one class)."""
    return "undefined" if x is None else f"{x:.4f}"


def cmd_datasets(args: argparse.Namespace) -> int:
    from securevfl.data import DATASETS, dataset_status
    from securevfl.data.dataset import DataConfig

    for name, ok, where in dataset_status(DataConfig(dir=args.data_dir)):
        desc = DATASETS.get(name).description
        print(f"{name:15s} {'found' if ok else 'missing':8s} {desc}\n{'':24s}{where}")
    return 0


def cmd_methods(args: argparse.Namespace) -> int:
    from securevfl.catalog import METHODS  # no torch import: answers at once

    for name, summary in METHODS.items():
        print(f"{name:18s} {summary}")
    return 0


def cmd_defenses(args: argparse.Namespace) -> int:
    from defenses import DEFENSES
    from defenses.base import listing

    for name in DEFENSES.names():
        d = listing(DEFENSES.get(name))
        print(f"{name}  party: {', '.join(d['party'])}  hooks: {', '.join(d['hooks'])}  ε: {d['epsilon']}")
        print(f"  targets: {', '.join(d['targets']) or '-'}")
        for key, p in d["params"].items():
            mark = " (primary)" if key == d["primary"] else ""
            print(f"  {key} = {p['default']}{mark}: {p['range']}")
        print(f"  he: {d['he']}\n  methods: {d['methods']}\n  heads: {d['heads']}")
    return 0


def cmd_attacks(args: argparse.Namespace) -> int:
    from attacks import ATTACKS  # the catalogue is the live registry (imports torch)

    print("\n\n".join(ATTACKS.get(name).describe() for name in ATTACKS.names()))
    return 0


def make_parser() -> _Parser:
    from securevfl.provenance import git_commit, version

    parser = _Parser(prog="securevfl", description=__doc__)
    commit = git_commit()
    parser.add_argument("--version", action="version",
                        version=f"securevfl {version()}" + (f" (commit {commit[:12]})" if commit else ""))
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_train(sub)
    d = sub.add_parser("datasets", help="list datasets and where each is found, or why not")
    d.add_argument("--data-dir")
    sub.add_parser("methods", help="list registered methods")
    sub.add_parser("defenses", help="list defenses: parameters, party, hook points, targets, ε status")
    sub.add_parser("attacks", help="list attacks: threat model, what each observes, heads, parameters")
    sw = sub.add_parser("sweep", help="run a sweep file (YAML) into an SQLite store; rerun to resume")
    sw.add_argument("file")
    sw.add_argument("--store", help="SQLite store (default runs/<sweep name>.sqlite)")
    sw.add_argument("--workers", type=_workers, default=1,
                    help="cells run in parallel (local processes or Ray tasks); auto: one per idle core")
    sw.add_argument("--engine", default="local", help="local (default) or ray (optional extra)")
    sw.add_argument("--quiet", action="store_true", help="no progress bar")
    pr = sub.add_parser("predict", help="score new rows with a federation saved by train --save")
    pr.add_argument("--model", required=True, metavar="DIR", help="the train --save folder")
    pr.add_argument("--party-file", action="append", required=True, metavar="FILE",
                    help="one new file per party, in the training order (active party first)")
    pr.add_argument("--out", required=True, help="predictions file: .csv, or .parquet")
    pr.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    prn = pr.add_argument_group("passive parties in other processes (docs/deployment.md)")
    prn.add_argument("--peer", action="append", default=[], metavar="NAME=HOST:PORT",
                     help="a passive party serving its saved part (securevfl party --model); this process is then "
                          "the active party, --party-file its own new file only, --model the folder with active/")
    _net_flags(prn)
    pa = sub.add_parser("party", help="serve one passive party of a run driven by `train --peer` (docs/deployment.md)")
    pa.add_argument("--role", required=True, help="this party's name (passive1, passive2, ...)")
    pa.add_argument("--listen", required=True, metavar="HOST:PORT", help="address to serve on (port 0: any free)")
    pa.add_argument("--party-file", required=True, help="this party's CSV/Parquet file (no label column)")
    pa.add_argument("--id-column", default="id", help="entity-ID column of the file (default id)")
    pa.add_argument("--serve-forever", action="store_true", help="serve run after run (default: exit after one)")
    pa.add_argument("--save", metavar="DIR", help="when the active party saves the trained federation (train --save), "
                    "write this party's own part into DIR/<role>/")
    pa.add_argument("--model", metavar="DIR", help="serve `securevfl predict --peer` runs with this party's saved "
                    "part, DIR/<role>/ (what party --save wrote), on --party-file's new rows")
    own = pa.add_argument_group("this party's own protection (it decides; the active party can only ask)")
    own.add_argument("--defense", metavar="SPEC", help="defenses this party runs itself (e.g. embedding-dp:noise=1); "
                     "default: those the active party asks for, said on stderr")
    own.add_argument("--mechanism-seed", metavar="N", help="fix this party's mechanism noise (tests only: not "
                     "private); the active party cannot fix it")
    own.add_argument("--he", metavar="SCHEME", help="require this HE scheme (ckks, bfv, paillier); refuse other runs")
    own.add_argument("--he-param", action="append", default=[], metavar="KEY=VALUE",
                     help="require this HE parameter (e.g. mask_bits=40); refuse runs that differ")
    own.add_argument("--interactive-mixing", choices=("auto", "off", "on"), help="require this mixing")
    own.add_argument("--seed", metavar="N", help="this party's own seed (its initial weights and its own draws); "
                     "default: fresh from the OS each run. Never sent to the active party")
    from securevfl.passive_own import add_flags as own_model_flags  # torch-free

    own_model_flags(pa.add_argument_group("this party's own bottom model, optimiser, rates and columns (a run that "
                                          "asks for others is refused; docs/deployment.md)"))
    pol = pa.add_argument_group("this party's policy: what it lets the active party do (docs/deployment.md)")
    pol.add_argument("--allow", action="append", default=[], metavar="WHAT",
                     help="permit, beyond the safe default (repeatable or comma-separated): plain-alignment (send "
                          "this party's IDs in the clear), unaligned-ids (risa, random-match, local-vfl announce "
                          "the IDs of its rows outside the intersection), reinit (fedud reinit: true), linear-bottom "
                          "(a bottom with no hidden non-linearity)")
    pol.add_argument("--methods", metavar="LIST", help="comma-separated methods this party takes part in "
                     "(default: every method that runs across processes)")
    pol.add_argument("--max-batch-size", metavar="N", help="the most rows a batch may ask for (default 4096)")
    pol.add_argument("--max-parameters", metavar="N", help="the largest bottom model it builds (default 50000000)")
    pol.add_argument("--max-requests", metavar="N", help="the most requests in one run (default 100000000)")
    pol.add_argument("--max-rate", metavar="R", help="requests per second at most; more wait (default 5000; 0: none)")
    pol.add_argument("--max-lr", metavar="R", help="the largest learning rate a run may set (default 1)")
    pol.add_argument("--min-batch-fraction", metavar="F", help="refuse training batches below this share of the "
                     "run's batch size, the last of an epoch excepted (default 0.25; 0: any)")
    pol.add_argument("--expect-settings", metavar="DIGEST", help="serve only runs whose settings have this digest "
                     "(as the active party's `securevfl doctor train` prints it); default: any its policy admits")
    _net_flags(pa)
    dr = sub.add_parser("doctor", help="check a deployment before it starts: securevfl doctor train|party "
                        "<that command's flags> (docs/deployment.md)")
    dr.add_argument("checked", nargs=argparse.REMAINDER, metavar="COMMAND ...",
                    help="the train --peer ... or party ... command this party is about to run, flags and all")
    ce = sub.add_parser("certs", help="make a CA and one key/certificate folder per party (mutual TLS)")
    ce.add_argument("--parties", required=True, help="comma-separated party names, e.g. active,passive1")
    ce.add_argument("--out", required=True, help="new folder: OUT/<party>/ per party, OUT/ca/ the CA")
    sw.add_argument("--take-over-leases", action="store_true",
                    help="run cells another sweep has claimed (for stale claims, e.g. of a host that is gone)")
    rp = sub.add_parser("report", help="write report.md and report.html (with PNG plots) from a store")
    rp.add_argument("store")
    rp.add_argument("--out", required=True, help="output directory")
    rp.add_argument("--weights", metavar="TYPE=W,...",
                    help="C-DCS weight per attack type, e.g. LI=2,FR=1 (LI label inference, FR feature "
                         "reconstruction, TB targeted backdoor, NTB untargeted; unnamed types weigh 0); "
                         "default: equal weights, as VFLAIR")
    rp.add_argument("--claims", metavar="FILE",
                    help="write the methods report instead: each claim of FILE (e.g. sweeps/methods/claims.yaml) "
                         "re-measured, paired by seed (docs/methods.md)")
    return parser


def cmd_sweep(args: argparse.Namespace) -> int:
    from securevfl.lab.engine import run_sweep

    started = time.perf_counter()
    try:
        extra = {"take_over_leases": True} if args.take_over_leases else {}
        c = run_sweep(args.file, args.store, args.workers, args.engine, progress=not args.quiet,
                      command=_command_line(args), **extra)
    except KeyboardInterrupt:
        print("error: sweep interrupted; finished cells are stored, rerun the same command to resume",
              file=sys.stderr)
        return 130
    elsewhere = f", {c['elsewhere']} being run by another sweep on this store" if c.get("elsewhere") else ""
    print(f"sweep: {c['cells']} cells: {c['ok']} ran ok, {c['failed']} failed, {c['skipped']} already done"
          f"{elsewhere} → {c['store']} in {time.perf_counter() - started:.0f} s")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from securevfl.lab.predict import predict

    if args.peer:
        summary = _predict_deployed(args)
    else:
        given = [f for f, v in (("--tls", args.tls), ("--insecure", args.insecure), ("--timeout", args.timeout))
                 if v]
        if given:
            raise UserError(f"{'/'.join(given)} go{'es' if len(given) == 1 else ''} with --peer")
        summary = predict(args.model, args.party_file, args.out)
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"predict: {summary['rows_scored']} rows scored → {summary['out']}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from securevfl.lab.report import write_report
    from securevfl.lab.scores import parse_weights
    from securevfl.lab.store import Store

    weights = parse_weights(args.weights) if args.weights is not None else None  # refused before any work
    Store.open_existing(args.store).close()  # a missing or foreign store: refused before --out is created
    if args.claims is not None:
        from securevfl.lab.report.methods import load_claims, write_methods_report

        if args.weights is not None:
            raise UserError("--weights applies to the sweep report, not to --claims")
        load_claims(args.claims)
        _check_writable_dir(args.out, "report --out")
        paths = write_methods_report(args.store, args.out, args.claims, command=_command_line(args))
        print("report: " + ", ".join(str(p) for p in paths))
        return 0
    _check_writable_dir(args.out, "report --out")
    paths = write_report(args.store, args.out, command=_command_line(args), weights=weights)
    print("report: " + ", ".join(str(p) for p in paths))
    return 0


def _command_line(args: argparse.Namespace) -> str:
    """The command line, as the user could type it again (recorded in stores and reports)."""
    import shlex

    return "securevfl " + " ".join(shlex.quote(a) for a in args.argv)


def _check_writable_dir(path: str, what: str, private: bool = False) -> None:
    """``path`` is (made) a folder this process can write in; ``private``: made 0700 (checkpoints)."""
    import tempfile

    from securevfl.files import make_private_dir

    p = Path(path)
    try:
        if private:
            make_private_dir(p)
        else:
            p.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=p):
            pass
    except (OSError, UserError) as e:
        raise UserError(f"{what} {path}: not a writable directory ({getattr(e, 'strerror', None) or e})") from None


COMMANDS = {"train": cmd_train, "datasets": cmd_datasets, "methods": cmd_methods, "defenses": cmd_defenses,
            "attacks": cmd_attacks, "sweep": cmd_sweep, "report": cmd_report, "predict": cmd_predict,
            "party": cmd_party, "certs": cmd_certs, "doctor": cmd_doctor}


def main(argv: list[str] | None = None) -> int:
    if not (sys.argv[1:] if argv is None else argv):  # a bare command: say what it can do
        parser = make_parser()
        print(parser.format_help(), file=sys.stderr)
        print("error: choose a command (securevfl COMMAND --help for its options)", file=sys.stderr)
        return 2
    with _runtime_warnings_held() as held:
        code = _run(argv)
    if code != 2:  # a user error's line stands alone; otherwise the numeric warnings still show
        for w in held:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    return code


@contextlib.contextmanager
def _runtime_warnings_held() -> Iterator[list[warnings.WarningMessage]]:
    """Hold back numpy's RuntimeWarnings (overflow, invalid value) while a command runs: a run that ends
    in an ``error:`` line prints that line alone, not the warnings that led to it."""
    held: list[warnings.WarningMessage] = []
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):  # type: ignore[no-untyped-def]
        if issubclass(category, RuntimeWarning):
            held.append(warnings.WarningMessage(message, category, filename, lineno, file, line))
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield held
    finally:
        warnings.showwarning = shown


def _configure_threads() -> None:
    from securevfl import threads

    threads.configure()


def _run(argv: list[str] | None) -> int:
    try:
        args = make_parser().parse_args(argv)
        args.argv = list(sys.argv[1:] if argv is None else argv)
        if args.command in ("sweep", "predict"):  # this process's thread share (securevfl/threads.py; train's
            _configure_threads()  # once its flags are checked: it imports torch)
        return COMMANDS[args.command](args)
    except UserError as e:
        from securevfl.limits import cap_line

        print(f"error: {cap_line(str(e))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print(f"error: {e or 'interrupted'}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into e.g. `head`, which closed early: not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (OSError, MemoryError) as e:  # this machine's limits (a full disk, a file-size limit, memory)
        from securevfl.errors import environment_error
        from securevfl.limits import cap_line

        print(f"error: {cap_line(str(environment_error(e)))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
