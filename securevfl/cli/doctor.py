"""``securevfl doctor train|party ...``: check a deployment before it starts (docs/deployment.md)."""

from __future__ import annotations

import argparse

from securevfl.cli.common import _build_config, _net_config, _peers
from securevfl.cli.parser import make_parser
from securevfl.cli.party import party_settings
from securevfl.errors import UserError


def cmd_doctor(args: argparse.Namespace) -> int:
    """``securevfl doctor train ...`` / ``securevfl doctor party ...``: securevfl/operations/doctor.py's checks."""
    from securevfl.operations import doctor

    if not args.checked or args.checked[0] not in ("train", "party"):
        raise UserError("doctor checks the command a party is about to run: securevfl doctor train --peer ... or "
                        "securevfl doctor party --role ... (the same flags)")
    inner = make_parser().parse_args(args.checked)
    checks = _doctor_train(inner) if inner.command == "train" else _doctor_party(inner)
    return doctor.report(checks, lambda line: print(line, flush=True))


def _doctor_tls(args: argparse.Namespace, party: str) -> list:
    from securevfl.operations import doctor

    if args.insecure:
        return [doctor.Check("tls", True, "--insecure: plaintext, no certificates to check", warning=True)]
    if not args.tls:
        raise UserError("give --tls DIR (this party's folder from `securevfl certs`), or --insecure for plaintext")
    return [doctor.check_tls(args.tls, party)]


def _doctor_train(args: argparse.Namespace) -> list:
    """The active party's checks: its certificate, its file, its resources, then every peer."""
    from securevfl.operations import doctor
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
    from securevfl.operations import doctor

    role = args.role
    if not (role.startswith("passive") and role.removeprefix("passive").isdigit()):
        raise UserError(f"--role {role}: a served party is passive1, passive2, ...")
    party_settings(args)  # its own settings and policy flags make sense
    return [*_doctor_tls(args, role), doctor.check_party_file(args.party_file, args.id_column, None, False),
            doctor.check_listen(args.listen),
            *doctor.check_resources(args.party_file, [args.checkpoint, args.record_view, args.save])]
