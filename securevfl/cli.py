"""``securevfl`` command line: train, sweep, report. User mistakes exit 2 with one ``error: ...`` line."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

from securevfl.errors import UserError


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


def _add_train(sub) -> None:
    sub.add_parser("train", help="train one method on one dataset and report utility, privacy and cost",
                   populate=_train_flags)


def _build_config(args: argparse.Namespace):
    from securevfl.config import RunConfig, apply_dict, load_config_file
    from securevfl.settings import apply_flags

    cfg = RunConfig()
    if args.config:
        apply_dict(cfg, load_config_file(args.config))
    apply_flags(cfg, args)
    if args.id_column:  # once: the column of every file; more: one per file
        if len(args.id_column) == 1:
            cfg.data.id_column = args.id_column[0]
        else:
            cfg.data.id_columns = list(args.id_column)
    data_dir = getattr(args, "data.dir")
    if data_dir is not None and not Path(data_dir).is_dir():
        raise UserError(f"--data-dir {data_dir}: no such directory")
    return cfg  # validated by lab.compose.execute, the one entry every run passes through


def cmd_train(args: argparse.Namespace) -> int:
    from securevfl.catalog import check_names

    check_names(args.dataset, args.method)  # before the heavy imports below: a typo answers at once
    from securevfl.lab.compose import execute

    r = execute(_build_config(args), progress=args.progress).to_json()
    if args.json:
        print(json.dumps(r))
        return 0
    u, c, pr = r["utility"], r["cost"], r["privacy"]
    test = _score(u["test"])
    print(f"{r['method']} on {r['dataset']} (seed {r['seed']}): test {u['metric']} = {test}")
    print(f"  partition: {r['partition']['parties']} parties, {r['partition']['aligned']} aligned, "
          f"{r['partition']['labeled']} labeled, {r['partition']['test_rows']} test rows")
    eps = "n/a" if pr["epsilon"] is None else f"{pr['epsilon']:.3g} (δ={pr['delta']:.2g})"
    print(f"  privacy: mechanism {pr['mechanism']}, ε = {eps}")
    print(f"  cost: {c['seconds']:.1f} s, {c['bytes_sent'] / 1e6:.2f} MB in {c['messages']} messages, "
          f"he={c['he']['scheme']}")
    if c["he"]["scheme"] != "off":
        he = c["he"]
        print(f"  he: {he['scheme']} {he['params'].get('security_bits')}-bit security, {he['seconds']:.1f} s "
              f"in HE, {he['bytes'] / 1e6:.2f} MB of HE messages; protects passive activations from the active "
              "party, not labels from passive parties")
    for name, a in r["attacks"].items():
        extra = "".join(f", {label} {a[key]:.4f}" for key, label in
                        (("control", "control"), ("baseline", "local-SSL baseline")) if a.get(key) is not None)
        leak = f"; leakage {a['leakage']:+.4f}" if a.get("leakage") is not None else ""
        print(f"  attack {name}: {a['metric']} = {_score(a['value'])} (prior {_score(a.get('prior'))}{extra}){leak}")
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


def make_parser() -> _Parser:
    parser = _Parser(prog="securevfl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_train(sub)
    d = sub.add_parser("datasets", help="list datasets and where each is found, or why not")
    d.add_argument("--data-dir")
    sub.add_parser("methods", help="list registered methods")
    sw = sub.add_parser("sweep", help="run a sweep file (YAML) into an SQLite store; rerun to resume")
    sw.add_argument("file")
    sw.add_argument("--store", help="SQLite store (default runs/<sweep name>.sqlite)")
    sw.add_argument("--workers", type=_workers, default=1,
                    help="cells run in parallel (local processes or Ray tasks); auto: one per idle core")
    sw.add_argument("--engine", default="local", help="local (default) or ray (optional extra)")
    sw.add_argument("--quiet", action="store_true", help="no progress bar")
    sw.add_argument("--take-over-leases", action="store_true",
                    help="run cells another sweep has claimed (for stale claims, e.g. of a host that is gone)")
    rp = sub.add_parser("report", help="write report.md and report.html (with PNG plots) from a store")
    rp.add_argument("store")
    rp.add_argument("--out", required=True, help="output directory")
    return parser


def cmd_sweep(args: argparse.Namespace) -> int:
    from securevfl.lab.engine import run_sweep

    try:
        extra = {"take_over_leases": True} if args.take_over_leases else {}
        c = run_sweep(args.file, args.store, args.workers, args.engine, progress=not args.quiet, **extra)
    except KeyboardInterrupt:
        print("error: sweep interrupted; finished cells are stored, rerun the same command to resume",
              file=sys.stderr)
        return 130
    elsewhere = f", {c['elsewhere']} being run by another sweep on this store" if c.get("elsewhere") else ""
    print(f"sweep: {c['cells']} cells: {c['ok']} ran ok, {c['failed']} failed, {c['skipped']} already done"
          f"{elsewhere} → {c['store']}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from securevfl.lab.report import write_report
    from securevfl.lab.store import Store

    Store.open_existing(args.store).close()  # a missing or foreign store: refused before --out is created
    _check_writable_dir(args.out, "report --out")
    paths = write_report(args.store, args.out)
    print("report: " + ", ".join(str(p) for p in paths))
    return 0


def _check_writable_dir(path: str, what: str) -> None:
    import tempfile

    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=p):
            pass
    except OSError as e:
        raise UserError(f"{what} {path}: not a writable directory ({e.strerror or e})") from None


COMMANDS = {"train": cmd_train, "datasets": cmd_datasets, "methods": cmd_methods, "sweep": cmd_sweep,
            "report": cmd_report}


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


def _run(argv: list[str] | None) -> int:
    try:
        args = make_parser().parse_args(argv)
        if args.command in ("train", "sweep"):  # this process's thread share (securevfl/threads.py)
            from securevfl import threads

            threads.configure()
        return COMMANDS[args.command](args)
    except UserError as e:
        from securevfl.limits import cap_line

        print(f"error: {cap_line(str(e))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into e.g. `head`, which closed early: not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
