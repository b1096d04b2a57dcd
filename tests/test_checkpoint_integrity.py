"""Checkpoints with integrity (issue 54): each file holds its party, run key, epoch and the SHA-256 of
its payload, all checked on load, and the payload is unpickled only once its hash checks; epoch numbers
are ints in [0, MAX_EPOCH] on save, load and listing. Every test here failed on the code before the
fix (a file loaded into another party, run or epoch, a damaged one loaded with other values, an epoch
of 10**300 a traceback, a stray file name breaking the pruning). Fast: no training, small states."""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest
import torch

from securevfl.errors import UserError
from securevfl.storage import checkpoint
from securevfl.storage.checkpoint import KEEP, Checkpoints

KEY = "0123456789abcdef"


def _state(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"party": {"w": torch.arange(4096, dtype=torch.float32) + seed, "a": rng.normal(size=(8, 3))},
            "rng": rng.bit_generator.state, "losses": [0.5, 0.25], "epoch": seed}


def _equal(a: dict, b: dict) -> None:
    assert torch.equal(a["party"]["w"], b["party"]["w"])
    np.testing.assert_array_equal(a["party"]["a"], b["party"]["a"])
    assert a["rng"] == b["rng"] and a["losses"] == b["losses"] and a["epoch"] == b["epoch"]


def _payload_start(path: Path) -> int:
    """Where the payload begins in a checkpoint file (after the magic, the length and the header)."""
    data = path.read_bytes()
    at = len(checkpoint.MAGIC) + 4
    return at + int.from_bytes(data[len(checkpoint.MAGIC):at], "big")


def _one_line(exc: pytest.ExceptionInfo, path: Path, *needles: str) -> str:
    msg = str(exc.value)
    assert "\n" not in msg, msg
    assert str(path) in msg and "delete it" in msg, msg
    said = msg.replace(str(path), "<file>")  # the test's own folder name says "truncated" too
    for n in needles:
        assert n in said, msg
    return msg


@pytest.fixture
def no_unpickling(monkeypatch):
    """A refused file is never unpickled: torch.load fails the test if the module calls it."""
    def refuse(*args, **kwargs):
        raise AssertionError("a checkpoint that fails its checks was unpickled")

    monkeypatch.setattr(checkpoint.torch, "load", refuse)


def test_round_trip_with_a_header_and_private_files(tmp_path) -> None:
    ck = Checkpoints(tmp_path / "ck", KEY, party="passive1")
    state = _state(3)
    ck.save(3, state)
    _equal(ck.load(3), state)
    path = ck.dir / "epoch-3.pt"
    data = path.read_bytes()
    assert data.startswith(checkpoint.MAGIC)
    n = int.from_bytes(data[len(checkpoint.MAGIC):len(checkpoint.MAGIC) + 4], "big")
    head = json.loads(data[len(checkpoint.MAGIC) + 4:len(checkpoint.MAGIC) + 4 + n])
    assert (head["party"], head["key"], head["epoch"]) == ("passive1", KEY, 3)
    assert head["length"] == len(data) - _payload_start(path) and len(head["sha256"]) == 64
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(ck.dir.stat().st_mode) == 0o700 and stat.S_IMODE(ck.dir.parent.stat().st_mode) == 0o700
    assert not list(ck.dir.glob(".*.tmp"))
    # a second object on the same folder (a restarted party) reads it back; no party name: "" on both sides
    _equal(Checkpoints(tmp_path / "ck", KEY, party="passive1").load(3), state)
    plain = Checkpoints(tmp_path / "plain", KEY)
    plain.save(0, state)
    _equal(Checkpoints(tmp_path / "plain", KEY).load(0), state)


def test_a_64_byte_flip_in_the_payload_is_refused_before_unpickling(tmp_path, monkeypatch) -> None:
    ck = Checkpoints(tmp_path, KEY)
    ck.save(2, _state(2))
    path = ck.dir / "epoch-2.pt"
    data = bytearray(path.read_bytes())
    mid = len(data) // 2  # inside the tensor's bytes (16 KiB of the file's 17): torch.load alone reads other values
    data[mid:mid + 64] = bytes(b ^ 0xFF for b in data[mid:mid + 64])
    path.write_bytes(bytes(data))
    called = []
    monkeypatch.setattr(checkpoint.torch, "load", lambda *a, **k: called.append(1))
    with pytest.raises(UserError) as exc:
        ck.load(2)
    _one_line(exc, path, "SHA-256")
    assert not called
    assert len(data) // 2 > _payload_start(path)  # the flip was in the payload


def test_a_flip_in_the_header_is_refused(tmp_path, no_unpickling) -> None:
    ck = Checkpoints(tmp_path, KEY)
    ck.save(1, _state(1))
    path = ck.dir / "epoch-1.pt"
    data = bytearray(path.read_bytes())
    at = len(checkpoint.MAGIC) + 4
    for i in range(at, _payload_start(path)):  # every single byte of the header, one at a time
        flipped = bytearray(data)
        flipped[i] ^= 0x01
        path.write_bytes(bytes(flipped))
        with pytest.raises(UserError) as exc:
            ck.load(1)
        _one_line(exc, path)


@pytest.mark.parametrize("where", ["payload", "header", "magic", "empty"])
def test_a_truncated_file_is_refused(tmp_path, no_unpickling, where: str) -> None:
    ck = Checkpoints(tmp_path, KEY)
    ck.save(1, _state(1))
    path = ck.dir / "epoch-1.pt"
    data = path.read_bytes()
    start = _payload_start(path) if where == "header" else 0
    cut = {"payload": len(data) // 2, "header": start - 10, "magic": 5, "empty": 0}[where]
    path.write_bytes(data[:cut])
    with pytest.raises(UserError) as exc:
        ck.load(1)
    _one_line(exc, path, "truncated")


def test_bytes_past_the_payload_are_refused(tmp_path, no_unpickling) -> None:
    ck = Checkpoints(tmp_path, KEY)
    ck.save(1, _state(1))
    path = ck.dir / "epoch-1.pt"
    path.write_bytes(path.read_bytes() + b"\0" * 64)
    with pytest.raises(UserError) as exc:
        ck.load(1)
    _one_line(exc, path, "past its payload")


def test_a_newer_epochs_file_copied_over_an_older_one_is_refused(tmp_path, no_unpickling) -> None:
    ck = Checkpoints(tmp_path, KEY)
    ck.save(1, _state(1))
    ck.save(2, _state(2))
    shutil.copyfile(ck.dir / "epoch-2.pt", ck.dir / "epoch-1.pt")
    with pytest.raises(UserError) as exc:
        ck.load(1)
    _one_line(exc, ck.dir / "epoch-1.pt", "holds epoch 2, not epoch 1")


def test_a_file_from_another_partys_folder_is_refused(tmp_path, no_unpickling) -> None:
    mine = Checkpoints(tmp_path / "p1", KEY, party="passive1")
    theirs = Checkpoints(tmp_path / "p2", KEY, party="passive2")
    mine.save(1, _state(1))
    theirs.save(1, _state(7))
    shutil.copyfile(theirs.dir / "epoch-1.pt", mine.dir / "epoch-1.pt")
    with pytest.raises(UserError) as exc:
        mine.load(1)
    _one_line(exc, mine.dir / "epoch-1.pt", "'passive2'", "'passive1'", "another party")


def test_a_file_of_another_run_is_refused(tmp_path, no_unpickling) -> None:
    mine = Checkpoints(tmp_path, KEY)
    other = Checkpoints(tmp_path, "fedcba9876543210")
    other.save(1, _state(1))
    mine.save(2, _state(2))
    shutil.copyfile(other.dir / "epoch-1.pt", mine.dir / "epoch-1.pt")
    with pytest.raises(UserError) as exc:
        mine.load(1)
    _one_line(exc, mine.dir / "epoch-1.pt", "fedcba9876543210", KEY, "another run")


def test_an_earlier_versions_file_is_refused(tmp_path, no_unpickling) -> None:
    ck = Checkpoints(tmp_path, KEY)
    ck.dir.mkdir(parents=True)
    path = ck.dir / "epoch-0.pt"
    torch.save(_state(0), path)  # what the code before issue 54 wrote
    with pytest.raises(UserError) as exc:
        ck.load(0)
    _one_line(exc, path, "not a checkpoint of this version")
    path.write_bytes(b"not a checkpoint at all, just some text\n" * 4)
    with pytest.raises(UserError) as exc:
        ck.load(0)
    _one_line(exc, path, "not a checkpoint of this version")


BAD_EPOCHS = [-1, 10**300, -(10**5000), "3", 2.0, True, None, 10**6 + 1, np.int64(-2)]


def _id(e: object) -> str:
    return f"int-{e.bit_length()}-bits" if isinstance(e, int) and abs(e) > 10**30 else repr(e)


@pytest.mark.parametrize("epoch", BAD_EPOCHS, ids=_id)
def test_an_epoch_out_of_bounds_is_refused_on_save_and_load(tmp_path, epoch) -> None:
    ck = Checkpoints(tmp_path, KEY)
    ck.save(3, _state(3))  # a checkpoint "3" would reach were the string taken
    with pytest.raises(UserError) as exc:
        ck.save(epoch, _state(0))
    msg = str(exc.value)
    assert "\n" not in msg and "not an integer in [0, 1000000]" in msg and len(msg) < 200, msg
    assert sorted(p.name for p in ck.dir.iterdir()) == ["epoch-3.pt"]  # nothing written
    with pytest.raises(UserError, match=r"not an integer in \[0, 1000000\]"):
        ck.load(epoch)
    if epoch is not None:  # None there: start from scratch
        with pytest.raises(UserError, match=r"resume epoch .* not an integer"):
            Checkpoints(tmp_path, KEY, epoch)


def test_the_bounds_are_epochs_and_one_past_them_is_not(tmp_path) -> None:
    ck = Checkpoints(tmp_path, KEY, 10**6)
    ck.save(0, _state(0))
    ck.save(10**6, _state(1))
    ck.save(np.int64(5), _state(5))  # a numpy integer is an integer
    assert ck.epochs() == [5, 10**6] and ck.latest() == 10**6
    _equal(ck.load(10**6), _state(1))
    with pytest.raises(UserError, match=r"epoch 1000001 is not an integer in \[0, 1000000\]"):
        ck.save(10**6 + 1, _state(2))
    assert ck.epochs() == [5, 10**6]


def test_pruning_keeps_the_newest_valid_epochs_and_leaves_other_names(tmp_path) -> None:
    ck = Checkpoints(tmp_path, KEY)
    ck.dir.mkdir(parents=True)
    strays = ["epoch--1.pt", "epoch-01.pt", "epoch-99999999.pt", "epoch-+4.pt", "epoch-3.pt.bak", "notes.txt"]
    for name in strays:
        (ck.dir / name).write_bytes(b"x")
    for e in range(6):
        ck.save(e, _state(e))
        assert ck.epochs() == list(range(max(0, e - KEEP + 1), e + 1))
    assert ck.latest() == 5
    assert sorted(p.name for p in ck.dir.iterdir()) == sorted([*strays, "epoch-4.pt", "epoch-5.pt"])
    _equal(ck.load(4), _state(4))
    _equal(ck.load(5), _state(5))
