"""``securevfl party`` (a passive party serving runs, with its own settings and policy) and ``securevfl certs``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from securevfl.cli.common import _check_writable_dir, _net_config, _startup_tls, prepare_view_dir
from securevfl.configuration.validate import host_port, number
from securevfl.errors import UserError


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
    from securevfl.operations.doctor import passive_verdict

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
    from securevfl.configuration.settings import parse_keyvalues
    from securevfl.party_settings import PartySettings, check_own

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
    from securevfl.configuration.catalog import check_names  # torch-free: a typo is answered at once
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


def cmd_psi_engine(args: argparse.Namespace) -> int:
    """``securevfl psi-engine install``: the OT PSI engine's own environment (securevfl/data/otpsi.py)."""
    from securevfl.data import otpsi

    if args.action == "where":
        print(otpsi.engine_python())
        return 0
    python = otpsi.install(Path(args.dir) if args.dir else None)
    print(f"psi-engine: installed ({python}); parties choose it with --psi rr22 (or kkrt)"
          + (f"; set {otpsi.ENGINE_ENV}={python}" if args.dir else ""))
    return 0
