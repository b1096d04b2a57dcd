"""``securevfl train``: one run in this process, or as the active party with ``--peer`` (docs/deployment.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from securevfl.cli.common import (
    _build_config,
    _check_writable_dir,
    _configure_threads,
    _net_config,
    _peers,
    _score,
    _startup_tls,
    _view_failed,
    prepare_view_dir,
)
from securevfl.errors import UserError


def cmd_train(args: argparse.Namespace) -> int:
    from securevfl.configuration.catalog import check_names

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
            from securevfl.storage.view import try_write_view

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
