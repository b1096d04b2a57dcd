"""Regenerate the committed reference reports listed in ``reports/manifest.yaml`` (issue 34).

    python scripts/regenerate_reports.py            # every report, in the manifest's order
    python scripts/regenerate_reports.py quick he   # the named ones

Each report's sweeps run into a fresh store ``runs/NAME.sqlite`` (an existing one is renamed
``.old``: the sweep would otherwise resume cells an older version computed), then ``securevfl
report`` writes ``reports/NAME`` anew (the old folder is removed first, once the sweeps
succeeded). The sweeps print their progress; a sweep that is interrupted resumes when the script
is run again with ``--resume`` (the store is then kept).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "reports" / "manifest.yaml"


def load_manifest(path: Path = MANIFEST) -> dict[str, dict]:
    """The manifest's entries, each checked for its keys (the test reads it through this too)."""
    entries = yaml.safe_load(path.read_text())
    for name, entry in entries.items():
        unknown = set(entry) - {"sweeps", "workers", "data", "claims", "references"}
        if unknown or not entry.get("sweeps"):
            raise SystemExit(f"error: {path.name}: entry {name!r} needs `sweeps` and knows only "
                             f"sweeps/workers/data/claims/references (got {sorted(entry)})")
        for ref in entry.get("references", []):
            if set(ref) - {"runner", "clone", "sweep", "args"} or not {"runner", "clone", "sweep"} <= set(ref):
                raise SystemExit(f"error: {path.name}: entry {name!r}: a reference needs runner, clone (the "
                                 f"environment variable naming the authors' clone) and sweep (got {sorted(ref)})")
        if isinstance(entry.get("data"), str):
            entry["data"] = [entry["data"]]
    return entries


def commands(name: str, entry: dict, env: dict[str, str] | None = None) -> list[list[str]]:
    """The command lines that regenerate one report: its sweeps, then each reference runner (the
    authors' code on the same cells, benchmarks/reference/; its clone from the named environment
    variable, shown as ``$NAME`` when unset), then the report."""
    env = os.environ if env is None else env
    store = f"runs/{name}.sqlite"
    cli = [sys.executable, "-m", "securevfl"]
    runs = [cli + ["sweep", s, "--store", store, "--workers", str(entry.get("workers", 1))]
            for s in entry["sweeps"]]
    refs = [[sys.executable, r["runner"], env.get(r["clone"], f"${r['clone']}"), r["sweep"], "--store", store,
             *[str(a) for a in r.get("args", [])]] for r in entry.get("references", [])]
    claims = ["--claims", entry["claims"]] if entry.get("claims") else []
    return runs + refs + [cli + ["report", store, "--out", f"reports/{name}", *claims]]


def shown(cmd: list[str]) -> str:
    """A command as the README writes it: ``securevfl …`` or ``python benchmarks/…``."""
    return " ".join(cmd[2:] if cmd[1] == "-m" else ["python", *cmd[1:]])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="reports to regenerate (default: all in the manifest)")
    parser.add_argument("--resume", action="store_true", help="keep runs/NAME.sqlite and resume its sweeps")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = parser.parse_args(argv)
    entries = load_manifest()
    unknown = [n for n in args.names if n not in entries]
    if unknown:
        print(f"error: no report {', '.join(unknown)} in reports/manifest.yaml (known: {', '.join(entries)})",
              file=sys.stderr)
        return 2
    chosen = args.names or list(entries)
    missing = [(n, d) for n in chosen for d in entries[n].get("data", []) if not (ROOT / d).exists()]
    if missing and not args.dry_run:  # printing the commands needs no data
        hint = " (python scripts/fetch_ctr_samples.py fetches it)" if missing[0][1].startswith("runs/data/") else ""
        print(f"error: report {missing[0][0]} needs {missing[0][1]}, which is not there{hint}", file=sys.stderr)
        return 2
    unset = [(n, r["clone"]) for n in chosen for r in entries[n].get("references", [])
             if not os.environ.get(r["clone"])]
    if unset and not args.dry_run:
        print(f"error: report {unset[0][0]} runs the authors' code: set {unset[0][1]} to their clone at the pinned "
              "commit (benchmarks/reference/README.md)", file=sys.stderr)
        return 2
    for name in chosen:
        cmds = commands(name, entries[name])
        if args.dry_run:
            print("\n".join(shown(c) for c in cmds))
            continue
        store = ROOT / "runs" / f"{name}.sqlite"
        if store.exists() and not args.resume:
            for part in ("", "-wal", "-shm"):  # SQLite's WAL files travel with the store
                if Path(f"{store}{part}").exists():
                    shutil.move(f"{store}{part}", f"{store}.old{part}")
        started = time.time()
        for cmd in cmds:
            if cmd[1] != "-m":  # a reference runner: the authors' code on the same cells
                print("+ python " + " ".join(cmd[1:]), flush=True)
                rc = subprocess.call(cmd, cwd=ROOT)
                if rc != 0:
                    print(f"error: {cmd[1]} for report {name} exited {rc}; it resumes its finished cells: "
                          f"python scripts/regenerate_reports.py {name} --resume", file=sys.stderr)
                    return rc
                continue
            if cmd[3] == "report":  # the old folder goes: a figure the new report no longer draws would linger
                shutil.rmtree(ROOT / "reports" / name, ignore_errors=True)
            print("+ securevfl " + " ".join(cmd[3:]), flush=True)
            rc = subprocess.call(cmd, cwd=ROOT)
            if rc != 0:
                print(f"error: {' '.join(cmd[3:5])} for report {name} exited {rc}", file=sys.stderr)
                if cmd[3] == "sweep":  # the sweep's own "rerun" would move its store aside here: say how
                    print(f"resume with: python scripts/regenerate_reports.py {name} --resume (keeps "
                          f"runs/{name}.sqlite and its finished cells)", file=sys.stderr)
                return rc
        shot = first_screen(ROOT / "reports" / name)
        print(f"report {name}: {time.time() - started:.0f} s" + (f"; first screen → {shot}" if shot else
                                                                  " (no chromium: no first-screen picture)"),
              flush=True)
    return 0


def chromium() -> str | None:
    """Headless Chromium (Debian's ``chromium``), if installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def first_screen(folder: Path, width: int = 1400, height: int = 900) -> Path | None:
    """What a reader sees first: ``report.html`` at ``width`` × ``height`` → ``first_screen.png``."""
    exe = chromium()
    if exe is None:
        return None
    out = folder / "first_screen.png"
    subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--window-size={width},{height}", f"--screenshot={out}", (folder / "report.html").as_uri()],
                   check=True, capture_output=True, timeout=120)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
