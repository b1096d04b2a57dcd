"""The pyarrow fast path of the Criteo / Avazu readers gives exactly what the checked line-by-line
reader gives (values, hashes, sampling, max_rows), hands anything unusual back to it (so error
messages keep naming the line), and bounds its copies (ColumnSink)."""

import numpy as np
import pytest

from securevfl.data import DataConfig, ctr, load_dataset
from securevfl.data.readers import ColumnSink, FastPathRefused
from securevfl.data.synthetic import write_avazu, write_criteo
from securevfl.errors import UserError


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)


@pytest.fixture(params=["whole", "stream"])
def regime(request, monkeypatch):
    """Both ways the fast reader reads: a small file whole, a large one streamed (forced here)."""
    monkeypatch.setattr("securevfl.data.readers.ARROW_BLOCK_BYTES", 64 << 10)  # several blocks (and chunks)
    if request.param == "stream":
        monkeypatch.setattr("securevfl.data.readers.WHOLE_READ_BYTES", 0)
    return request.param


@pytest.mark.parametrize("kw", [{}, {"max_rows": 1234}, {"sample": 0.37, "sample_seed": 5},
                                {"sample": 0.5, "max_rows": 700}])
def test_criteo_fast_equals_checked(tmp_path, kw, regime):
    f = write_criteo(tmp_path / "c.txt", 3000, seed=4, missing=0.3)
    cfg = DataConfig(path=str(f), **kw)
    _same(ctr._criteo_fast(f, cfg), ctr._criteo_checked(f, cfg))


@pytest.mark.parametrize("kw", [{}, {"max_rows": 999}, {"sample": 0.4}])
def test_avazu_fast_equals_checked(tmp_path, kw, regime):
    f = write_avazu(tmp_path / "a.csv", 2500, seed=2)
    cfg = DataConfig(path=str(f), **kw)
    _same(ctr._avazu_fast(f, cfg), ctr._avazu_checked(f, cfg))


def test_loader_takes_the_fast_path(tmp_path, monkeypatch):
    # control for the tests above: on a clean file the checked reader is never needed
    f = write_criteo(tmp_path / "c.txt", 500, seed=1)

    def boom(*a, **k):
        raise AssertionError("checked reader used on a clean file")

    monkeypatch.setattr(ctr, "_criteo_checked", boom)
    assert len(load_dataset("criteo", DataConfig(path=str(f))).y) == 500


@pytest.mark.parametrize("cell,needle", [("nan", "I3 is 'nan', expected an integer"),
                                         ("inf", None), (" 7", None), ("1e3", None)])
def test_odd_cells_go_to_the_checked_reader(tmp_path, cell, needle):
    f = write_criteo(tmp_path / "c.txt", 50, seed=0)
    lines = f.read_text().splitlines()
    fields = lines[9].split("\t")
    fields[3] = cell
    lines[9] = "\t".join(fields)
    f.write_text("\n".join(lines) + "\n")
    cfg = DataConfig(path=str(f))
    try:
        fast = ctr._criteo_fast(f, cfg)
    except FastPathRefused:
        fast = None
    if needle:
        assert fast is None
        with pytest.raises(UserError, match=f"line 10: {needle}"):
            load_dataset("criteo", cfg)
        return
    try:
        checked = ctr._criteo_checked(f, cfg)
    except UserError:
        assert fast is None  # the fast path must not accept what the checked reader rejects
        return
    if fast is not None:
        _same(fast, checked)


def test_empty_line_is_still_an_error(tmp_path):
    f = write_criteo(tmp_path / "c.txt", 20, seed=0)
    lines = f.read_text().splitlines()
    f.write_text("\n".join(lines[:5] + [""] + lines[5:]) + "\n")
    with pytest.raises(UserError, match="line 6: expected 40 fields, found 1"):
        load_dataset("criteo", DataConfig(path=str(f)))


def test_sink_grows_when_the_estimate_is_short():
    sink = ColumnSink({"X": (np.float32, 2), "y": (np.int64, 0)})
    blocks = [np.arange(10 * i, 10 * i + 10) for i in range(5)]
    for b in blocks:
        sink.append({"X": [b, -b], "y": b}, len(b), estimate=12)
    out = sink.finish()
    np.testing.assert_array_equal(out["y"], np.arange(50))
    np.testing.assert_array_equal(out["X"][:, 1], -np.arange(50, dtype=np.float32))


def test_memory_mapped_columns_equal_in_memory(tmp_path, monkeypatch):
    f = write_criteo(tmp_path / "c.txt", 2000, seed=3)
    monkeypatch.setattr("securevfl.data.readers.ARROW_BLOCK_BYTES", 32 << 10)
    mem = load_dataset("criteo", DataConfig(path=str(f)))
    mapped = load_dataset("criteo", DataConfig(path=str(f), column_cache=str(tmp_path / "cols")))
    assert isinstance(mapped.categorical, np.memmap) and isinstance(mapped.X, np.memmap)
    np.testing.assert_array_equal(mem.X, mapped.X)
    np.testing.assert_array_equal(mem.categorical, mapped.categorical)
    np.testing.assert_array_equal(mem.y, mapped.y)


def test_chunked_synthetic_writer(tmp_path, monkeypatch):
    import securevfl.data.synthetic as synthetic

    small = write_criteo(tmp_path / "a.txt", 300, seed=0).read_bytes()
    monkeypatch.setattr(synthetic, "CHUNK_ROWS", 100)
    chunked = write_criteo(tmp_path / "b.txt", 300, seed=0)
    assert chunked.read_bytes() != small  # per-chunk generators past CHUNK_ROWS
    ds = load_dataset("criteo", DataConfig(path=str(chunked)))
    assert len(ds.y) == 300 and 0.1 < ds.y.mean() < 0.9
    a = write_avazu(tmp_path / "a.csv", 250, seed=1)
    assert len(a.read_text().splitlines()) == 251 and len(load_dataset("avazu", DataConfig(path=str(a))).y) == 250


@pytest.mark.parametrize("log", [True, False])
def test_column_gather_encodes_like_the_block(log):
    # partitions gather a party's columns one at a time (bounded memory on large files); the result must
    # equal, to the bit, encoding the column-major block that row-then-column indexing gives
    from securevfl.data.tabular import Gather, encode_party

    rng = np.random.default_rng(1)
    T = rng.lognormal(3, 2, size=(30_000, 6)).astype(np.float32)
    T[rng.random(T.shape) < 0.2] = np.nan
    C = rng.integers(0, 40, size=(30_000, 4))
    rows, te, num, cat = rng.permutation(30_000)[:25_000], np.arange(500), np.array([1, 3, 4]), np.array([0, 2])
    block = encode_party(T[rows][:, num], T[te][:, num], C[rows][:, cat], C[te][:, cat], log=log, min_freq=2,
                         hash_buckets=0)
    gathered = encode_party(Gather(T, rows, num), Gather(T, te, num), Gather(C, rows, cat), Gather(C, te, cat),
                            log=log, min_freq=2, hash_buckets=0)
    for a, b in zip(block[:2], gathered[:2], strict=True):
        assert np.array_equal(a, b, equal_nan=True)
    assert block[2] == gathered[2]
