"""A party's own view of a deployed run, on disk (``--record-view DIR``): every message it sent and
received, in order, as the bytes that crossed. The lab's attacks read a party's view as a list of
:class:`~securevfl.channel.base.Message` (what ``channel.received_by(party)`` gives in the simulator),
so the same attack code can be run offline on a real transcript: :func:`read_view` gives that list.

Layout (folder mode 0700, files 0600: a view holds what the party saw, e.g. gradients):
``view.json`` (format, party, run description, counts), ``index.jsonl`` (one line per message: seq,
src, dst, kind, offset, nbytes) and ``payloads.bin`` (the payloads, back to back)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from securevfl.channel.base import Message
from securevfl.errors import UserError
from securevfl.storage.files import make_private_dir, open_new

FORMAT = "securevfl-view/1"


def write_view(folder: str | Path, party: str, messages: list[Message], meta: dict) -> Path:
    """Write ``party``'s messages (its channel's transcript) into the new files of ``folder``."""
    out = make_private_dir(Path(folder))
    offset = 0
    digest = {"payloads.bin": hashlib.sha256(), "index.jsonl": hashlib.sha256()}
    with open_new(out / "payloads.bin", "wb") as data, open_new(out / "index.jsonl") as index:
        for m in messages:
            data.write(m.payload)
            digest["payloads.bin"].update(m.payload)
            line = json.dumps({"seq": m.seq, "src": m.src, "dst": m.dst, "kind": m.kind, "offset": offset,
                               "nbytes": m.nbytes}) + "\n"
            index.write(line)
            digest["index.jsonl"].update(line.encode())
            offset += m.nbytes
    with open_new(out / "view.json") as f:
        json.dump({"format": FORMAT, "party": party, "messages": len(messages), "bytes": offset,
                   "received": sum(m.dst == party for m in messages),
                   "sha256": {k: h.hexdigest() for k, h in digest.items()}, **meta}, f, indent=1, default=str)
    return out


def try_write_view(folder: str | Path, party: str, messages: list[Message], meta: dict) -> str | None:
    """:func:`write_view`, or why it could not (a full disk, a folder made unwritable): the one line
    to print beside a result that is never thrown away for it."""
    try:
        write_view(folder, party, messages, meta)
    except (OSError, UserError) as e:
        return f"--record-view {folder}: the view could not be written ({getattr(e, 'strerror', None) or e})"
    return None


def read_view(folder: str | Path) -> tuple[dict, list[Message]]:
    """(what the view says about itself, every message in order) from a ``--record-view`` folder."""
    d = Path(folder)
    try:
        meta = json.loads((d / "view.json").read_text())
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise UserError(f"{d}: not a securevfl view (format "
                            f"{meta.get('format') if isinstance(meta, dict) else None!r})")
        data = (d / "payloads.bin").read_bytes()
        index = (d / "index.jsonl").read_bytes()
    except (OSError, ValueError) as e:
        raise UserError(f"{d}: cannot read the view ({e})") from None
    sums = meta.get("sha256")
    if isinstance(sums, dict):  # views written before the hashes have none: read as they are
        for name, got in (("payloads.bin", data), ("index.jsonl", index)):
            if hashlib.sha256(got).hexdigest() != sums.get(name):
                raise UserError(f"{d}: {name} does not match its SHA-256 in view.json (damaged, truncated or from "
                                "another view)")
    out = []
    try:
        rows = [json.loads(line) for line in index.decode().splitlines() if line]
        for r in rows:
            seq, src, dst, kind, offset, nbytes = (r[k] for k in ("seq", "src", "dst", "kind", "offset", "nbytes"))
            if not (isinstance(offset, int) and isinstance(nbytes, int) and offset >= 0 and nbytes >= 0):
                raise ValueError(f"message {seq}: offset and nbytes must be whole numbers ≥ 0")
            payload = data[offset:offset + nbytes]
            if len(payload) != nbytes:
                raise UserError(f"{d}: payloads.bin is shorter than index.jsonl says (message {seq})")
            out.append(Message(seq, str(src), str(dst), str(kind), payload, nbytes))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise UserError(f"{d}: index.jsonl is malformed ({type(e).__name__}: {e})") from None
    if len(out) != meta.get("messages", len(out)):
        raise UserError(f"{d}: index.jsonl lists {len(out)} messages, view.json says {meta.get('messages')}")
    return meta, out


def received(messages: list[Message], party: str) -> list[Message]:
    """What ``party`` received, in order (the simulator's ``channel.received_by(party)``)."""
    return [m for m in messages if m.dst == party]
