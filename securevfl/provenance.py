"""Where a result came from: the installed securevfl version and the git commit of its source tree."""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path


def version() -> str:
    """securevfl's installed version (package metadata), ``"unknown"`` when not installed."""
    try:
        return metadata.version("securevfl")
    except metadata.PackageNotFoundError:
        return "unknown"


def git_commit() -> str | None:
    """The commit of the source tree this module was imported from, if it is a git checkout;
    ``None`` otherwise (no git, not a checkout, any failure)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and commit else None
