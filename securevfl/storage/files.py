"""How the tool creates files that matter (keys, certificates, saved models): always a new file,
never through a symbolic link someone planted in the output folder, and with an explicit mode so a
permissive umask (``umask 000``) cannot make a key world-readable."""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any

from securevfl.errors import UserError

PRIVATE_FILE, PUBLIC_FILE, PRIVATE_DIR = 0o600, 0o644, 0o700


def make_private_dir(path: Path, mode: int = PRIVATE_DIR) -> Path:
    """Create ``path`` (and missing parents) or take an existing directory; a link is refused, and a
    directory this call creates gets ``mode`` exactly (the umask does not widen or narrow it)."""
    path = Path(path)
    if path.is_symlink():
        raise UserError(f"{path} is a symbolic link; refusing to write through it")
    if path.exists() and not path.is_dir():
        raise UserError(f"{path} exists and is not a directory")
    if not path.exists():
        try:
            path.mkdir(parents=True, mode=mode)
        except OSError as e:
            raise UserError(f"{path}: cannot create the directory ({e.strerror or e})") from None
        os.chmod(path, mode)  # mkdir's mode is filtered by the umask
    return path


def open_new(path: Path, mode: str = "w", perms: int = PRIVATE_FILE) -> IO[Any]:
    """Open a *new* file for writing: refused if anything (a file, a link, a dangling link) is already
    at ``path``, created with ``perms`` whatever the umask."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, perms)
    except FileExistsError:
        raise UserError(f"{path} already exists (or is a link); refusing to overwrite it") from None
    except OSError as e:
        raise UserError(f"{path}: cannot create ({e.strerror or e})") from None
    os.fchmod(fd, perms)
    return os.fdopen(fd, mode)
