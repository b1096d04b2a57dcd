"""What several commands share: the run configuration from flags, network flags, peers, output folders."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from securevfl.configuration.validate import host_port, number
from securevfl.errors import UserError


def _build_config(args: argparse.Namespace):
    from securevfl.config import RunConfig, apply_dict, load_config_file
    from securevfl.configuration.settings import apply_flags
    from securevfl.configuration.validate import refuse_test_fixtures, validate_config

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
    from securevfl.configuration.catalog import check_component_names

    check_component_names(cfg.attacks, cfg.defense)
    return cfg  # and again, whole, by lab.compose.execute, the one entry every run passes through


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
    if getattr(args, "psi", "x25519") != "x25519":
        from securevfl.data.otpsi import engine_python

        engine_python()  # a missing engine is named before anything connects
    return grpc_mod, grpc_mod.NetConfig(tls, psi=getattr(args, "psi", "x25519"), **kw)


def _view_failed(error: str | None) -> int:
    """After the result is out: the one line saying the view was not written (exit 2), if it was not."""
    if error is None:
        return 0
    print(f"error: {error}", file=sys.stderr)
    return 2


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


def prepare_view_dir(path: str | None) -> None:
    """``--record-view``'s folder is new or empty, and made now: a place that cannot hold it fails before
    the run, not after it."""
    if path is None:
        return
    _check_new_dir(path, "--record-view")
    from securevfl.storage.files import make_private_dir

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


def _check_writable_dir(path: str, what: str, private: bool = False) -> None:
    """``path`` is (made) a folder this process can write in; ``private``: made 0700 (checkpoints)."""
    import tempfile

    from securevfl.storage.files import make_private_dir

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


def _command_line(args: argparse.Namespace) -> str:
    """The command line, as the user could type it again (recorded in stores and reports)."""
    import shlex

    return "securevfl " + " ".join(shlex.quote(a) for a in args.argv)


def _configure_threads() -> None:
    from securevfl import threads

    threads.configure()


def _startup_tls(args: argparse.Namespace, party: str) -> None:
    """The doctor's certificate check, run by ``train --peer`` and ``party`` as they start."""
    if args.insecure:
        return
    from securevfl.operations import doctor

    check = doctor.check_tls(args.tls, party)
    if not check.ok:
        raise UserError(f"--tls {args.tls}: {check.detail}")
    if check.warning:
        print(f"warning: {check.detail} (expires soon: securevfl certs makes new ones)", file=sys.stderr)


def _score(x: float | None) -> str:
    """A score as printed; ``undefined`` for null (an AUC over rows of one class)."""
    return "undefined" if x is None else f"{x:.4f}"
