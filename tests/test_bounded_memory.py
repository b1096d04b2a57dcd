"""A party's memory does not grow with its rows (issue 53): its file read in blocks, its columns, encoded
arrays, IDs, labels and epoch orders on disk (securevfl/storage/spill.py), long ID lists sent in parts; and
none of it changes what is computed."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pandas as pd
import pytest

from securevfl import ids as ids_mod
from securevfl.channel import InMemoryChannel, codec
from securevfl.config import RunConfig
from securevfl.configuration.options import PartitionSpec
from securevfl.data import tabular
from securevfl.data.csvsource import ActiveLabels, party_data, read_file, split_rows
from securevfl.data.psi import plain_intersection
from securevfl.errors import UserError
from securevfl.lab.compose import build_partition
from securevfl.storage import spill
from tests.test_grpc import Passive, deploy, files, small_cfg  # noqa: F401  (files: the module's fixture)


def _files(tmp_path, n: int, seed: int = 0, late_text: bool = False):
    rng = np.random.default_rng(seed)
    ids = np.arange(n)
    city = rng.choice(["north", "south", "east", "west", ""], size=n).astype(object)
    x = rng.normal(size=n).round(4).astype(str).astype(object)
    x[rng.random(n) < 0.05] = "NA"
    code = rng.integers(0, 50, size=n).astype(str).astype(object)  # numbers, then text after the first block
    if late_text:
        code[n // 3:] = np.char.add("k", code[n // 3:].astype(str))
    y = (rng.random(n) < 0.4).astype(int).astype(str).astype(object)
    y[rng.random(n) < 0.1] = ""  # unlabeled rows
    a = pd.DataFrame({"id": ids, "label": y, "city": city, "code": code})
    p = pd.DataFrame({"id": ids[::-1], "x": x[::-1], "z": rng.integers(0, 9, size=n)})
    fa, fp = tmp_path / f"a{n}.csv", tmp_path / f"p{n}.csv"
    a.to_csv(fa, index=False)
    p.to_csv(fp, index=False)
    return fa, fp


def _partition(fa, fp, **data):
    cfg = RunConfig(dataset="csv")
    cfg.data.party_files = [str(fa), str(fp)]
    cfg.data.label_column = "label"
    cfg.partition.alignment = "plain"
    for k, v in data.items():
        setattr(cfg.data, k, v)
    return build_partition(cfg)


def test_blocks_read_as_the_whole_file(tmp_path, monkeypatch) -> None:
    """Blocks of 7 rows give the partition of one block, to the bit: counts, kinds, hashes of a column
    whose text starts in a later block (hashed again from its first row), and the lines errors name."""
    fa, fp = _files(tmp_path, 300, late_text=True)
    whole = _partition(fa, fp)
    monkeypatch.setenv("SECUREVFL_BLOCK_ROWS", "7")
    blocks = _partition(fa, fp)
    assert blocks.fingerprint() == whole.fingerprint()
    assert blocks.meta["ingest"] == whole.meta["ingest"]
    assert whole.meta["ingest"][0]["categorical_columns"] == ["city", "code"]
    for a, b in zip(whole.parties, blocks.parties, strict=True):
        assert np.array_equal(a.X_train, b.X_train) and np.array_equal(a.X_test, b.X_test)
    # the line an error names counts the blocks before it
    df = pd.read_csv(fp, dtype=str, keep_default_na=False)
    df.loc[40, "z"] = "oops"
    df.to_csv(fp, index=False)
    with pytest.raises(UserError, match=r"column 'z': line 42: value 'oops' is not a number \(299 of 300"):
        _partition(fa, fp)
    lab = pd.read_csv(fa, dtype=str, keep_default_na=False)
    lab.loc[100, "label"] = "maybe"
    lab.to_csv(fa, index=False)
    with pytest.raises(UserError, match=r"label column 'label': line 102: value 'maybe' is text among numbers"):
        _partition(fa, fp)


def test_a_duplicate_id_in_a_later_block_is_named(tmp_path, monkeypatch) -> None:
    fa, fp = _files(tmp_path, 100)
    df = pd.read_csv(fp, dtype=str, keep_default_na=False)
    df.loc[90, "id"] = df.loc[3, "id"]
    df.to_csv(fp, index=False)
    monkeypatch.setenv("SECUREVFL_BLOCK_ROWS", "10")
    for numeric in (False, True):
        with pytest.raises(UserError, match=r"duplicate ID '96' on lines \[5, 92\] \(2 rows"):
            _partition(fa, fp, numeric_ids=numeric)


def test_spilled_arrays_compute_what_memory_does(tmp_path, monkeypatch) -> None:
    """With every array on disk (and the ID matching by sorting) the partition is the same but for the
    last bits of the standardisation (summed in pieces), and the arrays are memory maps."""
    fa, fp = _files(tmp_path, 400)
    mem = _partition(fa, fp, numeric_ids=True)
    monkeypatch.setenv("SECUREVFL_SPILL_MIN_MB", "0")
    monkeypatch.setattr(ids_mod, "LARGE", 16)
    monkeypatch.setattr(tabular, "PIECE", 64)
    disk = _partition(fa, fp, numeric_ids=True)
    assert isinstance(disk.passives[0].X_train, np.memmap) and not isinstance(mem.passives[0].X_train, np.memmap)
    for a, b in zip(mem.parties, disk.parties, strict=True):
        assert np.array_equal(a.train_ids, b.train_ids) and np.array_equal(a.test_ids, b.test_ids)
        assert a.cardinalities == b.cardinalities
        np.testing.assert_allclose(a.X_train, b.X_train, rtol=0, atol=1e-5)
        np.testing.assert_allclose(a.X_test, b.X_test, rtol=0, atol=1e-5)
    assert np.array_equal(mem.active.y_labels, disk.active.y_labels)
    assert np.array_equal(mem.aligned_ids, disk.aligned_ids)


def _setup_peak(fa, fp) -> int:
    """Peak traced allocation (numpy's included; memory maps are not allocations) of a party's set-up:
    read both files, align, split, encode."""
    cfg = RunConfig(dataset="csv").data
    cfg.label_column, cfg.id_column, cfg.numeric_ids = "label", "id", True
    tracemalloc.start()
    try:
        a = read_file(cfg, fa, "id", True)
        p = read_file(cfg, fp, "id", False)
        assert a.labels is not None
        aligned = plain_intersection([a.ids, p.ids])
        split = split_rows(aligned, a.ids, a.labels.has_label, PartitionSpec(), 0)
        party_data("passive1", p, "id", aligned, split, cfg, None)
        party_data("active", a, "id", aligned, split, cfg, ActiveLabels(a.labels.y, a.labels.has_label, None))
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _small_pieces(monkeypatch) -> None:
    monkeypatch.setenv("SECUREVFL_BLOCK_ROWS", "2000")
    monkeypatch.setattr(tabular, "PIECE", 2048)
    monkeypatch.setattr(ids_mod, "PIECE", 4096)
    monkeypatch.setattr(ids_mod, "LARGE", 4096)
    monkeypatch.setattr(spill, "PIECE", 4096)


def test_a_party_set_up_does_not_grow_with_its_rows(tmp_path, monkeypatch) -> None:
    """Ten times the rows, about the same peak of allocated memory once arrays spill; the control (no
    spilling) grows with the rows, so the measure can tell."""
    small, large = _files(tmp_path, 20_000), _files(tmp_path, 200_000, seed=1)
    _small_pieces(monkeypatch)
    monkeypatch.setenv("SECUREVFL_SPILL_MIN_MB", "0")
    bounded = _setup_peak(*small), _setup_peak(*large)
    monkeypatch.setenv("SECUREVFL_SPILL_MIN_MB", "100000")
    monkeypatch.setattr(ids_mod, "LARGE", 1 << 30)
    control = _setup_peak(*small), _setup_peak(*large)
    assert bounded[1] <= 1.5 * bounded[0] + (1 << 20), bounded
    assert control[1] >= 5 * control[0], control


def test_long_id_lists_travel_in_parts(monkeypatch) -> None:
    monkeypatch.setattr(codec, "ID_PART", 10)
    ch = InMemoryChannel()
    a, b = ch.endpoint("active"), ch.endpoint("passive1")
    ids = np.arange(35, dtype=np.int64) * 3
    a.send_ids("passive1", "alignment", ids)
    assert sum(ch.stats.messages.values()) == 5  # the head, then four parts
    assert np.array_equal(b.recv_ids("active", "alignment"), ids)
    a.send_ids("passive1", "alignment", ids[:10])  # short: one message, as before
    assert sum(ch.stats.messages.values()) == 6 and np.array_equal(b.recv_ids("active", "alignment"), ids[:10])
    # a peer's parts must add up to what its head announced
    a.send("passive1", "alignment", codec.id_parts_head(25))
    a.send_ids("passive1", "alignment", ids[:10])
    a.send_ids("passive1", "alignment", ids[:4])
    with pytest.raises(ValueError, match="part of 4 IDs where 10 were due"):
        b.recv_ids("active", "alignment")
    a.send("passive1", "alignment", codec.id_parts_head(1 << 40))
    with pytest.raises(ValueError, match="more than"):
        b.recv_ids("active", "alignment")


def test_spilled_deployed_run_equals_in_process(files, monkeypatch) -> None:  # noqa: F811
    """Every array on disk, ID lists in parts, IDs matched by sorting: across processes (mutual TLS) as in
    one process, bit for bit."""
    from securevfl.lab.compose import execute

    monkeypatch.setenv("SECUREVFL_SPILL_MIN_MB", "0")
    monkeypatch.setattr(codec, "ID_PART", 16)
    monkeypatch.setattr(ids_mod, "LARGE", 8)
    p = Passive(files)
    r = deploy(files, small_cfg(files, "guest", data__numeric_ids=True), [p])
    p.close()
    sim = execute(small_cfg(files, "guest", "host", data__numeric_ids=True), progress=False).to_json()
    assert p.status == 0
    assert r["utility"] == sim["utility"]
    assert r["partition"]["aligned"] == sim["partition"]["aligned"]
