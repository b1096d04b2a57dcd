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

A checkpoint file holds :data:`MAGIC`, a 4-byte big-endian header length, the header (canonical JSON
with ``format``, ``party``, ``key``, ``epoch``, ``length`` and ``sha256``) and then the payload, the
torch.save bytes of the party's state, numpy generator states included. On load every field is
checked: this party's name, this run's key, the epoch the file is named after (a newer epoch's file
copied over an older one's name is refused), the payload's length (a truncated file) and its SHA-256;
any mismatch, or a file not in this format (e.g. one an earlier version wrote), is one
:class:`~securevfl.errors.UserError` line naming the file and what is wrong. The payload is a pickle
and is unpickled only after its hash checks, so a damaged or mixed-up file is never unpickled. The
hash guards against damage and mix-ups, not against someone who can write the folder (they can
recompute it): load only checkpoints your own party wrote (the folder is made 0700, the files 0600).

Epoch numbers are ints in ``[0, MAX_EPOCH]``; :meth:`Checkpoints.save` and :meth:`Checkpoints.load`
refuse any other value (on a passive party the number comes in the active party's request), and
:meth:`Checkpoints.epochs` lists only files named ``epoch-<N>.pt`` with such an ``N`` written
canonically (no sign, no leading zero)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import numbers
import os
import re
from pathlib import Path
from typing import Any

import torch

from securevfl.errors import UserError, os_cause
from securevfl.storage.files import make_private_dir, open_new

KEEP = 2
"""Epochs each party keeps (the newest two: a crash between two parties' writes leaves one in common)."""

MAX_EPOCH = 10**6
"""The largest epoch number a checkpoint may have (epochs are numbered over a run's supervised stages)."""

MAGIC = b"SECUREVFL-CKPT\n\x00"
"""The first bytes of every checkpoint file (16 bytes)."""

FORMAT = 1
"""The header's ``format``: the version of this file layout."""

_LEN_BYTES = 4
_MAX_HEADER = 64 * 1024
_NAME = re.compile(r"epoch-(0|[1-9][0-9]{0,6})\.pt")


def run_key(description: dict, own_file: str | Path) -> str:
    """The digest that names a party's checkpoints of a run: the run description (without what differs
    between parties or on a resume) and the party's own file (its size and modification time)."""
    stable = {k: v for k, v in description.items() if k not in ("resume_epoch", "checkpoint", "party", "index")}
    st = Path(own_file).stat()
    stable["_file"] = [str(Path(own_file).resolve()), st.st_size, st.st_mtime_ns]
    return hashlib.sha256(json.dumps(stable, sort_keys=True, default=str).encode()).hexdigest()[:16]


def check_epoch(epoch: object, what: str = "checkpoint epoch") -> int:
    """``epoch`` as an int if it is an integer (not a bool) in ``[0, MAX_EPOCH]``, else one UserError line."""
    if isinstance(epoch, numbers.Integral) and not isinstance(epoch, bool):
        value = int(epoch)
        if 0 <= value <= MAX_EPOCH:
            return value
        sign = "negative " if value < 0 else ""  # str() of a huge int is refused (and slow): its size instead
        shown = str(value) if abs(value) <= 10**30 else f"(a {sign}{value.bit_length()}-bit number)"
    else:
        shown = repr(epoch)
    if len(shown) > 40:
        shown = shown[:37] + "..."
    raise UserError(f"{what} {shown} is not an integer in [0, {MAX_EPOCH}]")


def _encode(header: dict[str, Any]) -> bytes:
    """A header as the file holds it: canonical JSON (sorted keys, no spaces, ASCII)."""
    return json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


class Checkpoints:
    """One party's checkpoints of one run, in its own folder."""

    def __init__(self, folder: str | Path, key: str, resume_epoch: int | None = None, *, party: str = "") -> None:
        self.dir = Path(folder) / key
        self.key = key
        self.party = party
        """The party whose state these are: written into each file and checked on load."""
        self.resume_epoch = None if resume_epoch is None else check_epoch(resume_epoch, "resume epoch")
        """The epoch to resume after (None: start from scratch), taken once by the supervised loop."""
        self.offset = 0
        """Epochs of the run's supervised stages before the current one: checkpoints number epochs
        over the whole run, so a method with several stages resumes in the right one."""

    def _path(self, epoch: int) -> Path:
        return self.dir / f"epoch-{epoch}.pt"

    def save(self, epoch: int, state: dict[str, Any]) -> None:
        epoch = check_epoch(epoch)
        buf = io.BytesIO()
        torch.save(state, buf)
        payload = buf.getvalue()
        header = _encode({"format": FORMAT, "party": self.party, "key": self.key, "epoch": epoch,
                          "length": len(payload), "sha256": hashlib.sha256(payload).hexdigest()})
        tmp = self.dir / f".epoch-{epoch}.pt.tmp"
        try:
            make_private_dir(self.dir.parent)
            make_private_dir(self.dir)
            if tmp.exists() or tmp.is_symlink():
                tmp.unlink()
            with open_new(tmp, "wb") as f:
                f.write(MAGIC + len(header).to_bytes(_LEN_BYTES, "big") + header)
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._path(epoch))  # whole or absent: a kill mid-write leaves the previous epoch
        except OSError as e:  # a full disk, a file-size limit, a folder it may not write
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            kept = self.latest()
            raise UserError(f"--checkpoint {self.dir.parent}: cannot write {self.party}'s checkpoint of epoch {epoch} "
                            f"({os_cause(e)}); the run ends here, "
                            + (f"its checkpoint of epoch {kept} is kept: free space (or choose another folder) "
                               "and rerun with --resume" if kept is not None else "no earlier checkpoint was "
                               "written: free space or choose another folder, and rerun")) from None
        for old in self.epochs()[:-KEEP]:
            self._path(old).unlink(missing_ok=True)

    def epochs(self) -> list[int]:
        """The epochs this folder has a checkpoint file of (named ``epoch-<N>.pt``, N a valid epoch), oldest first."""
        if not self.dir.is_dir():
            return []
        got = (int(m.group(1)) for p in self.dir.iterdir() if (m := _NAME.fullmatch(p.name)))
        return sorted(e for e in got if e <= MAX_EPOCH)

    def latest(self) -> int | None:
        got = self.epochs()
        return got[-1] if got else None

    def load(self, epoch: int) -> dict[str, Any]:
        epoch = check_epoch(epoch)
        path = self._path(epoch)
        if not path.is_file():
            raise UserError(f"no checkpoint of this run for epoch {epoch} in {self.dir} (have: "
                            f"{', '.join(map(str, self.epochs())) or 'none'}); was this party started with the same "
                            "--checkpoint folder and file?")
        try:
            data = path.read_bytes()
        except OSError as e:
            raise UserError(f"checkpoint {path} cannot be read ({e.strerror or e})") from None
        payload = self._verified(path, epoch, data)
        try:  # the payload's hash checked: our own party's file (see the module docstring)
            return torch.load(io.BytesIO(payload), weights_only=False)
        except Exception as e:  # noqa: BLE001 - a damaged file is the user's to remove
            raise self._bad(path, f"its payload cannot be unpickled ({type(e).__name__}: {e})") from None

    def _bad(self, path: Path, what: str) -> UserError:
        what = " ".join(what.split())  # one line, whatever an exception's text holds
        return UserError(f"checkpoint {path} {what}; delete it to resume from the one before")

    def _verified(self, path: Path, epoch: int, data: bytes) -> bytes:
        """The payload of checkpoint file ``data`` once its header matches this party, run and epoch and
        the payload its length and SHA-256; else a UserError naming ``path`` and what is wrong."""
        if not data.startswith(MAGIC):
            if MAGIC.startswith(data):
                raise self._bad(path, f"is truncated ({len(data)} bytes, no header)")
            raise self._bad(path, "is not a checkpoint of this version of securevfl (no checkpoint header: an "
                                  "earlier version's file, or not a checkpoint at all)")
        at = len(MAGIC) + _LEN_BYTES
        if len(data) < at:
            raise self._bad(path, f"is truncated ({len(data)} bytes, in its header)")
        n = int.from_bytes(data[len(MAGIC):at], "big")
        if n > _MAX_HEADER:
            raise self._bad(path, f"has a damaged header (its length says {n} bytes)")
        if len(data) < at + n:
            raise self._bad(path, f"is truncated ({len(data)} bytes, in its header)")
        raw = data[at:at + n]
        try:
            head = json.loads(raw.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            raise self._bad(path, "has a damaged header (not JSON)") from None
        fields = {"format": int, "party": str, "key": str, "epoch": int, "length": int, "sha256": str}
        if (not isinstance(head, dict) or set(head) != set(fields)
                or any(type(head[k]) is not t for k, t in fields.items())):
            raise self._bad(path, "has a damaged header (not the fields of a checkpoint header)")
        if head["format"] != FORMAT:
            raise self._bad(path, f"is in checkpoint format {head['format']}, not {FORMAT} (another version of "
                                  "securevfl wrote it)")
        payload = data[at + n:]
        if raw != _encode(head):
            raise self._bad(path, "has a damaged header (not as this version writes it)")
        if head["party"] != self.party:
            raise self._bad(path, f"is party {head['party']!r}'s, not this party's ({self.party!r}): a file from "
                                  "another party's folder")
        if head["key"] != self.key:
            raise self._bad(path, f"is of run {head['key']}, not of this run ({self.key}): a file from another "
                                  "run's folder")
        if head["epoch"] != epoch:
            raise self._bad(path, f"holds epoch {head['epoch']}, not epoch {epoch} as its name says (a file copied "
                                  "over another epoch's)")
        if len(payload) < head["length"]:
            raise self._bad(path, f"is truncated ({len(payload)} of its {head['length']} payload bytes)")
        if len(payload) > head["length"]:
            raise self._bad(path, f"has {len(payload) - head['length']} bytes past its payload")
        if hashlib.sha256(payload).hexdigest() != head["sha256"]:
            raise self._bad(path, "is damaged (its payload's SHA-256 does not match its header's)")
        return payload
