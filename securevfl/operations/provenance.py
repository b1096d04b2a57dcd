"""Which code made a result: the installed package version and, for a git checkout, its commit."""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path


def version() -> str:
    """The installed ``securevfl`` version ("unknown" when the package metadata is absent)."""
    try:
        return metadata.version("securevfl")
    except metadata.PackageNotFoundError:
        return "unknown"


def git_commit() -> str | None:
    """The commit of the source tree this module was loaded from, if it is a git checkout; never fails."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and len(commit) == 40 else None


def versions() -> dict:
    """What produced a run or a saved model (the simulator's, a deployed run's and a saved folder's
    alike): the package, the commit of its checkout (None outside one) and torch."""
    import torch

    return {"securevfl": version(), "commit": git_commit(), "torch": torch.__version__}
