"""The command line's parser: one sub-command per command, ``train``'s flags generated from the settings
dataclasses on first use (so ``securevfl --help`` and ``securevfl methods`` import no torch)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NoReturn

from securevfl.errors import UserError

DESCRIPTION = "``securevfl`` command line: train, sweep, report. User mistakes exit 2 with one ``error: ...`` line."


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
    """``train``'s flags: one per setting that declares a flag (securevfl/configuration/settings.py), then the few
    that are not one setting."""
    from securevfl.config import RunConfig
    from securevfl.configuration.settings import add_flags

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
    g.add_argument("--psi", default="x25519", choices=("x25519", "rr22", "kkrt"),
                   help="PSI engine: x25519 (default), or OT-based rr22/kkrt (faster; `securevfl psi-engine install` "
                        "first); every party must name the same")
    g.add_argument("--checkpoint", default=None, metavar="DIR",
                   help="keep this party's own checkpoint in DIR at each epoch end, so that a killed run can be "
                        "resumed (train --resume; every party needs its own)")
    g.add_argument("--record-view", default=None, metavar="DIR",
                   help="write this party's own view (every message it sent and received) into the new folder DIR, "
                        "for the lab's attacks offline (securevfl/storage/view.py)")


def _add_train(sub) -> None:
    sub.add_parser("train", help="train one method on one dataset and report utility, privacy and cost",
                   populate=_train_flags)


def make_parser() -> _Parser:
    from securevfl.operations.provenance import git_commit, version

    parser = _Parser(prog="securevfl", description=DESCRIPTION)
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
    pr.add_argument("--federated-only", action="store_true",
                    help="score only the rows every party holds (default: every row of the active party's file, "
                         "each marked in column scored_by)")
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
    ad = sub.add_parser("advise", help="which method to try first on your party files, and the comparison to run "
                        "(docs/which-method.md)")
    ad.add_argument("--party-file", action="append", required=True, metavar="FILE",
                    help="every party's file, the active party's (with the label) first")
    ad.add_argument("--label-column", required=True, help="the active party's label column")
    ad.add_argument("--id-column", default="id", help="the ID column of every file (default id)")
    ad.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    pe = sub.add_parser("psi-engine", help="install the optional OT-based PSI engine (--psi rr22/kkrt; "
                        "docs/deployment.md)")
    pe.add_argument("action", choices=("install", "where"), help="install: make its environment; where: print it")
    pe.add_argument("--dir", default=None, help="its folder (default ~/.local/share/securevfl/psi-engine)")
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
