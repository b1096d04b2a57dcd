"""The lab's commands: ``securevfl sweep``, ``securevfl predict`` and ``securevfl report``."""

from __future__ import annotations

import argparse
import json
import sys
import time

from securevfl.cli.common import _check_writable_dir, _command_line, _net_config, _peers
from securevfl.errors import UserError


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
        summary = predict(args.model, args.party_file, args.out, federated_only=args.federated_only)
    if args.json:
        print(json.dumps(summary))
    else:
        paths = ", ".join(f"{k} {v}" for k, v in summary["scored_by"].items())
        print(f"predict: {summary['rows_scored']} rows scored ({paths}) → {summary['out']}")
    return 0


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
            return predict_deployed(args.model, args.party_file[0], args.out, channel, peers,
                                    federated_only=args.federated_only)
        except UserError as e:
            channel.abort(str(e))
            raise
    finally:
        channel.close()


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
