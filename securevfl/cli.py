"""``securevfl`` command line: train, sweep, report. User mistakes exit 2 with one ``error: ...`` line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from securevfl.errors import UserError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's usage dump → our one-line contract
        raise UserError(message)


def _fraction_or_train(v: str) -> float | str:
    if v == "train":
        return v
    try:
        return float(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction or 'train', got {v!r}") from None


def _workers(v: str) -> int | str:
    if v == "auto":
        return v
    try:
        return int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of workers or 'auto', got {v!r}") from None


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="train one method on one dataset and report utility, privacy and cost")
    p.add_argument("--dataset", help="dataset name (default fashion-mnist)")
    p.add_argument("--method", help="method name (default splitnn)")
    p.add_argument("--parties", type=int, help="number of parties K ≥ 2 (party 0 is active)")
    p.add_argument("--aligned-fraction", type=float, help="fraction of training entities held by all parties")
    p.add_argument("--aligned-count", type=int, help="exact number of aligned training entities")
    p.add_argument("--unaligned", choices=["disjoint", "all", "active"],
                   help="how unaligned rows are spread (active: only the active party has them)")
    p.add_argument("--test-aligned-fraction", type=_fraction_or_train,
                   help="share of test rows every party holds (rest: active party only), or 'train'")
    p.add_argument("--labeled", type=int, help="labeled aligned entities (default: all aligned)")
    p.add_argument("--alignment", choices=["given", "psi", "plain"], help="how the aligned set is established")
    p.add_argument("--epochs", type=int, help="passes over the training rows (default 5)")
    p.add_argument("--batch-size", type=int, help="rows per step (default 128)")
    p.add_argument("--lr", type=float, help="learning rate (default: 0.001 with adam, 0.05 with sgd)")
    p.add_argument("--optimizer", choices=["adam", "sgd"], help="every party's optimizer (default adam)")
    p.add_argument("--cut-dim", type=int, help="width of each bottom model's output (default 64)")
    p.add_argument("--bottom", choices=["auto", "mlp", "cnn"],
                   help="bottom model family (default auto: cnn for images ≥ 16 px tall, else mlp)")
    p.add_argument("--model-preset", help="a paper's architecture: vflhlp-avazu, vflhlp-criteo, fedud")
    p.add_argument("--seed", type=int, help="seed of data split, models and batching (default 0); not of "
                                           "the privacy mechanisms' noise")
    p.add_argument("--mechanism-seed", type=int,
                   help="fix the privacy mechanisms' noise (debugging only: the run is marked not private)")
    p.add_argument("--method-param", action="append", metavar="KEY=VALUE",
                   help="a method parameter, e.g. evidential=false (risa), alpha=0.5 (fedud) (repeatable)")
    p.add_argument("--defense", help="none | iso:LAMBDA | dp:clip=C,noise=Z | ... ('+' composes)")
    p.add_argument("--he", help="off | ckks | paillier: the HE-protected interactive layer (default off)")
    p.add_argument("--he-param", action="append", metavar="KEY=VALUE",
                   help="HE parameter, e.g. poly_modulus_degree=16384, key_bits=2048, packing=false (repeatable)")
    p.add_argument("--attack", action="append",
                   help="attack to run after training, NAME or NAME:key=value,... e.g. mc:n_aux=40,steps=600 "
                        "(repeatable)")
    p.add_argument("--data-dir", help="folder with file-based datasets")
    p.add_argument("--data-path", help="the data file of a single-file dataset (criteo, avazu, uci-credit)")
    p.add_argument("--max-rows", type=int, help="read at most N data rows")
    p.add_argument("--sample", type=float, help="keep each row with probability F while reading")
    p.add_argument("--fields", help="field-to-party preset of the dataset (e.g. vflhlp, fedud, fate)")
    p.add_argument("--party-file", action="append", help="csv source: one CSV/Parquet file per party, active first")
    p.add_argument("--id-column", action="append",
                   help="csv source: entity-ID column (default id); once for all files, or once per file in order")
    p.add_argument("--numeric-ids", action="store_true", default=None,
                   help="csv source: match IDs as numbers ('00133' = '133'); default: exact strings")
    p.add_argument("--label-column", help="csv source: label column in the active party's file (default label)")
    p.add_argument("--drop-columns", help="csv source: comma-separated columns to ignore (e.g. a row counter)")
    p.add_argument("--categorical", help="csv source: comma-separated columns to treat as categorical")
    p.add_argument("--numeric", help="csv source: comma-separated columns to treat as numeric (text cells = missing)")
    p.add_argument("--config", help="YAML file with run settings (flags override it)")
    p.add_argument("--record", action="store_true", help="keep the channel transcript")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: when stderr is a terminal)")


def _build_config(args: argparse.Namespace):
    from securevfl.config import RunConfig, apply_dict, load_config_file

    cfg = RunConfig()
    if args.config:
        apply_dict(cfg, load_config_file(args.config))
    flat = {
        "dataset": args.dataset, "method": args.method, "seed": args.seed, "defense": args.defense, "he": args.he,
        "mechanism_seed": args.mechanism_seed,
    }
    for k, v in flat.items():
        if v is not None:
            setattr(cfg, k, v)
    if args.attack:
        cfg.attacks = list(args.attack)
    for flag, target in (("--he-param", cfg.he_params), ("--method-param", cfg.method_params)):
        for kv in getattr(args, flag[2:].replace("-", "_")) or []:
            key, sep, value = kv.partition("=")
            if not sep or not key.strip():
                raise UserError(f"{flag} {kv!r}: expected KEY=VALUE")
            target[key.strip()] = yaml.safe_load(value)
    if args.record:
        cfg.record = True
    part = {"n_parties": args.parties, "aligned_fraction": args.aligned_fraction,
            "aligned_count": args.aligned_count, "unaligned": args.unaligned, "n_labeled": args.labeled,
            "alignment": args.alignment, "columns": args.fields, "test_aligned_fraction": args.test_aligned_fraction}
    for k, v in part.items():
        if v is not None:
            setattr(cfg.partition, k, v)
    for obj, k, v in [(cfg.train, "epochs", args.epochs), (cfg.train, "batch_size", args.batch_size),
                      (cfg.optim, "lr", args.lr), (cfg.optim, "optimizer", args.optimizer),
                      (cfg.model, "cut_dim", args.cut_dim),
                      (cfg.model, "bottom", args.bottom), (cfg.model, "preset", args.model_preset),
                      (cfg.data, "dir", args.data_dir),
                      (cfg.data, "path", args.data_path), (cfg.data, "max_rows", args.max_rows),
                      (cfg.data, "sample", args.sample), (cfg.data, "party_files", args.party_file),
                      (cfg.data, "label_column", args.label_column), (cfg.data, "numeric_ids", args.numeric_ids)]:
        if v is not None:
            setattr(obj, k, v)
    if args.id_column:
        if len(args.id_column) == 1:
            cfg.data.id_column = args.id_column[0]
        else:
            cfg.data.id_columns = list(args.id_column)
    for k in ("drop_columns", "categorical", "numeric"):
        if getattr(args, k) is not None:
            setattr(cfg.data, k, [c.strip() for c in getattr(args, k).split(",") if c.strip()])
    if args.data_dir is not None and not Path(args.data_dir).is_dir():
        raise UserError(f"--data-dir {args.data_dir}: no such directory")
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
    print(f"{r['method']} on {r['dataset']} (seed {r['seed']}): test {u['metric']} = {u['test']:.4f}")
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
        print(f"  attack {name}: {a['metric']} = {a['value']:.4f} (prior {a['prior']:.4f}{extra}){leak}")
    return 0


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
    rp = sub.add_parser("report", help="write report.md and report.html (with PNG plots) from a store")
    rp.add_argument("store")
    rp.add_argument("--out", required=True, help="output directory")
    return parser


def cmd_sweep(args: argparse.Namespace) -> int:
    from securevfl.lab.engine import run_sweep

    try:
        c = run_sweep(args.file, args.store, args.workers, args.engine, progress=not args.quiet)
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
    try:
        args = make_parser().parse_args(argv)
        if args.command in ("train", "sweep"):  # this process's thread share (securevfl/threads.py)
            from securevfl import threads

            threads.configure()
        return COMMANDS[args.command](args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
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
