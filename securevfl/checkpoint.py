"""A party's own checkpoints of a deployed run (``--checkpoint DIR``, ``train --resume``).

At the end of every epoch of a supervised stage the active party asks each passive party to write
its state, waits for each to say it did, then writes its own: so the newest epoch the active party
has, every passive party has too (each keeps its last :data:`KEEP`). A party writes only its own
state (models, optimizer, cut-layer ends, step count, its hooks' state such as a DP accountant's
ledger), into its own folder: ``DIR/<run key>/epoch-<N>.pt``; the run key is a digest of the run
description, so a checkpoint is never loaded into another run.

Resuming (``train --resume``): the active party finds its newest epoch, says so in the run
description, every party loads its own state of that epoch, and training goes on at the next epoch
with the active party's batch order restored: the result equals an uninterrupted run's. Epochs are
numbered over all of a run's supervised stages; a method with several (FedUD) runs the stages before
the resumed one again — from the same seeds, so to the same state — and then takes the checkpoint.

A checkpoint is a pickle (torch.save of the party's state, numpy generator states included): load
only checkpoints your own party wrote (the folder is made 0700, the files 0600)."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import torch

from securevfl.errors import UserError
from securevfl.files import make_private_dir, open_new

KEEP = 2
"""Epochs each party keeps (the newest two: a crash between two parties' writes leaves one in common)."""


def run_key(description: dict, own_file: str | Path) -> str:
    """The digest that names a party's checkpoints of a run: the run description (without what differs
    between parties or on a resume) and the party's own file (its size and modification time)."""
    stable = {k: v for k, v in description.items() if k not in ("resume_epoch", "checkpoint", "party", "index")}
    st = Path(own_file).stat()
    stable["_file"] = [str(Path(own_file).resolve()), st.st_size, st.st_mtime_ns]
    return hashlib.sha256(json.dumps(stable, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Checkpoints:
    """One party's checkpoints of one run, in its own folder."""

    def __init__(self, folder: str | Path, key: str, resume_epoch: int | None = None) -> None:
        self.dir = Path(folder) / key
        self.key = key
        self.resume_epoch = resume_epoch
        """The epoch to resume after (None: start from scratch), taken once by the supervised loop."""
        self.offset = 0
        """Epochs of the run's supervised stages before the current one: checkpoints number epochs
        over the whole run, so a method with several stages resumes in the right one."""

    def _path(self, epoch: int) -> Path:
        return self.dir / f"epoch-{epoch}.pt"

    def save(self, epoch: int, state: dict[str, Any]) -> None:
        make_private_dir(self.dir.parent)
        make_private_dir(self.dir)
        tmp = self.dir / f".epoch-{epoch}.pt.tmp"
        if tmp.exists():
            tmp.unlink()
        with open_new(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path(epoch))  # whole or absent: a kill mid-write leaves the previous epoch
        for old in self.epochs()[:-KEEP]:
            self._path(old).unlink(missing_ok=True)

    def epochs(self) -> list[int]:
        if not self.dir.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.dir.iterdir() if (m := re.fullmatch(r"epoch-(\d+)\.pt", p.name)))

    def latest(self) -> int | None:
        got = self.epochs()
        return got[-1] if got else None

    def load(self, epoch: int) -> dict[str, Any]:
        path = self._path(epoch)
        if not path.is_file():
            raise UserError(f"no checkpoint of this run for epoch {epoch} in {self.dir} (have: "
                            f"{', '.join(map(str, self.epochs())) or 'none'}); was this party started with the same "
                            "--checkpoint folder and file?")
        try:
            return torch.load(path, weights_only=False)  # our own party's file (see the module docstring)
        except Exception as e:  # noqa: BLE001 - a damaged file is the user's to remove
            raise UserError(f"checkpoint {path} cannot be read ({type(e).__name__}: {e}); delete it to resume "
                            "from the one before") from None
