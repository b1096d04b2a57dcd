"""Criteo / Avazu readers: rows/s of the fast (pyarrow) path (issue 20 target ≥ 300k rows/s), its
speed-up over the checked line-by-line reader measured alternately in this run, and its peak memory
above the parsed arrays (bounded by a few blocks, not by the file), measured in a fresh process
(in this one, memory freed by earlier reads would hide a peak); the checked reader's figure is the
control that the bound can fail."""

from __future__ import annotations

import time

import pytest
from bench_criteo_read import measure
from conftest import timed
from harness import READ_TARGET, data_file

from securevfl.data import DataConfig, ctr

ROWS = 200_000
TRANSIENT_MB = 96  # allowed peak above the parsed arrays: arrow blocks, one block's parsed columns, allocator slack
WHOLE_READ_FACTOR = 4  # a file read whole: its Arrow table (dictionary codes, float columns) within 4× the file


def alternating(benchmark, timed_fn, other_fn, rounds: int) -> tuple[float, float]:
    """Median seconds of ``timed_fn`` (the benchmark's own rounds) and of ``other_fn``, run before each
    of them (alternating, so both see the same machine)."""
    other: list[float] = []

    def run_other():
        t0 = time.perf_counter()
        other_fn()
        other.append(time.perf_counter() - t0)

    mine: list[float] = []
    benchmark.pedantic(timed(timed_fn, mine), setup=run_other, rounds=rounds, iterations=1)
    return sorted(mine)[len(mine) // 2], sorted(other)[len(other) // 2]


@pytest.mark.parametrize("kind", ["criteo", "avazu"])
def test_reader(benchmark, targets, kind):
    path = data_file(kind, ROWS)
    cfg = DataConfig(path=str(path))
    fast, checked = getattr(ctr, f"_{kind}_fast"), getattr(ctr, f"_{kind}_checked")
    t_fast, t_checked = alternating(benchmark, lambda: fast(path, cfg), lambda: checked(path, cfg), 3)
    over = {name: (m["peak_mb"] - m["base_mb"]) - m["dataset_mb"]
            for name, m in [("fast", measure(kind, path, "fast")), ("stream", measure(kind, path, "fast", True)),
                            ("checked", measure(kind, path, "checked"))]}
    file_mb = path.stat().st_size / 2**20
    benchmark.extra_info.update(rows=ROWS, peak_over_parsed_mb=round(over["fast"], 1),
                                checked_peak_over_parsed_mb=round(over["checked"], 1),
                                checked_rows_per_s=round(ROWS / t_checked))
    targets.check(benchmark, "checked/fast time", t_checked / t_fast, None)
    targets.check(benchmark, "fast MB above parsed", over["fast"], None, unit=" MB")
    targets.check(benchmark, "streaming MB above parsed", over["stream"], None, unit=" MB")
    targets.check(benchmark, "checked MB above parsed", over["checked"], None, unit=" MB")
    # files above readers.WHOLE_READ_BYTES stream: a few blocks above the parsed arrays, whatever the size;
    # smaller ones are parsed whole: the Arrow table, a few times the file (the checked reader: the control)
    assert over["stream"] <= TRANSIENT_MB, f"streaming peak {over['stream']:.0f} MB above the parsed arrays"
    assert over["fast"] <= WHOLE_READ_FACTOR * file_mb, f"whole-read peak {over['fast']:.0f} MB above the parsed arrays"
    targets.check(benchmark, "rows/s", ROWS / t_fast, READ_TARGET, higher_is_better=True, unit=" rows/s")


PARSE_TARGET = 2.0
"""Issue 33: the fast reader takes at most this many times pyarrow's own parse of the same file."""


def _pyarrow_parse(path, kind: str):
    """pyarrow's plain parse of the file into a table (its inferred types, multi-threaded): the floor
    the issue measures the reader against. The reader does more (label and integer checks, hashing of
    the categorical columns, a float32 matrix), so the ratio is what that work costs."""
    from pyarrow import csv

    if kind == "criteo":
        names = ["label", *ctr.CRITEO_INT, *ctr.CRITEO_CAT]
        return csv.read_csv(path, read_options=csv.ReadOptions(column_names=names),
                            parse_options=csv.ParseOptions(delimiter="\t"))
    return csv.read_csv(path)


@pytest.mark.parametrize("kind", ["criteo", "avazu"])
def test_reader_vs_pyarrow(benchmark, targets, kind):
    path = data_file(kind, ROWS)
    cfg = DataConfig(path=str(path))
    fast = getattr(ctr, f"_{kind}_fast")
    t_fast, t_arrow = alternating(benchmark, lambda: fast(path, cfg), lambda: _pyarrow_parse(path, kind), 5)
    benchmark.extra_info.update(rows=ROWS, pyarrow_s=round(t_arrow, 4))
    targets.check(benchmark, "reader / pyarrow parse", t_fast / t_arrow, PARSE_TARGET)
