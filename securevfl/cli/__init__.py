"""``securevfl`` command line: train, sweep, report. User mistakes exit 2 with one ``error: ...`` line.

One module per command (its heavy imports inside its functions: ``securevfl --help`` and the
catalogues import no torch): :mod:`.train`, :mod:`.party` (and ``certs``), :mod:`.doctor`,
:mod:`.listing` (``datasets``, ``methods``, ``defenses``, ``attacks``), :mod:`.lab` (``sweep``,
``predict``, ``report``), :mod:`.advise`; the parser in :mod:`.parser`, what several share in :mod:`.common`."""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator

from securevfl.cli.advise import cmd_advise
from securevfl.cli.common import _build_config, _configure_threads, prepare_view_dir
from securevfl.cli.doctor import cmd_doctor
from securevfl.cli.lab import cmd_predict, cmd_report, cmd_sweep
from securevfl.cli.listing import cmd_attacks, cmd_datasets, cmd_defenses, cmd_methods
from securevfl.cli.parser import make_parser
from securevfl.cli.party import cmd_certs, cmd_party, cmd_psi_engine, party_settings
from securevfl.cli.train import cmd_train
from securevfl.errors import UserError

__all__ = ["COMMANDS", "_build_config", "main", "make_parser", "party_settings", "prepare_view_dir"]

COMMANDS = {"train": cmd_train, "datasets": cmd_datasets, "methods": cmd_methods, "defenses": cmd_defenses,
            "attacks": cmd_attacks, "sweep": cmd_sweep, "report": cmd_report, "predict": cmd_predict,
            "party": cmd_party, "certs": cmd_certs, "doctor": cmd_doctor, "psi-engine": cmd_psi_engine,
            "advise": cmd_advise}


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
        args.argv = list(sys.argv[1:] if argv is None else argv)
        if args.command in ("sweep", "predict"):  # this process's thread share (securevfl/threads.py; train's
            _configure_threads()  # once its flags are checked: it imports torch)
        return COMMANDS[args.command](args)
    except UserError as e:
        from securevfl.configuration.limits import cap_line

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
        from securevfl.configuration.limits import cap_line
        from securevfl.errors import environment_error

        print(f"error: {cap_line(str(environment_error(e)))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
