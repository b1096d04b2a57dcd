"""Entity-ID matching (issue 33): the set operations a CSV run does on its parties' ID columns,
on string IDs at 30 000 and 1 000 000 rows per party, against a one-epoch ``splitnn`` run on two
30 000-row party files (plain alignment, so the run's own matching is inside it; PSI's ECDH rounds
are a separate cost, benchmarks/test_bench_psi.py). Target: matching ≤ 5 % of a one-epoch run; the
1 000 000-row case is compared with the epoch time scaled linearly in rows (an epoch is linear in
its rows). Before (np.isin on object arrays): ≈ 23–75 s of a 30 000-row run."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import timed

from securevfl.ids import intersect, member

N_RUN = 30_000


def _ids(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.array([f"c{v:08d}" for v in rng.permutation(n + n // 10)[:n]], dtype=object)


def match(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """What the CSV source does with the ID columns: intersect, then mask each party's rows."""
    aligned = intersect(a, b)
    test = aligned[: len(aligned) // 5]
    member(a, aligned), member(b, aligned), member(a, test), member(b, test)
    return aligned


@pytest.fixture(scope="module")
def epoch_seconds(tmp_path_factory) -> float:
    from securevfl.config import RunConfig
    from securevfl.lab.compose import execute

    d: Path = tmp_path_factory.mktemp("ids")
    rng = np.random.default_rng(0)
    ids = _ids(N_RUN, 0)
    x = rng.normal(size=(N_RUN, 23))
    y = (x[:, 0] + x[:, 15] > 0).astype(int)
    pd.DataFrame({"id": ids, "y": y, **{f"a{i}": x[:, i] for i in range(10)}}).to_csv(d / "guest.csv", index=False)
    pd.DataFrame({"id": ids[::-1], **{f"b{i}": x[::-1, 10 + i] for i in range(13)}}).to_csv(d / "host.csv",
                                                                                            index=False)
    cfg = RunConfig(dataset="csv", method="splitnn", seed=0)
    cfg.data.party_files, cfg.data.label_column, cfg.partition.alignment = [str(d / "guest.csv"),
                                                                             str(d / "host.csv")], "y", "plain"
    cfg.train.epochs = 1
    t0 = time.perf_counter()
    execute(cfg, progress=False)
    return time.perf_counter() - t0


@pytest.mark.parametrize("n", [N_RUN, 1_000_000])
def test_id_matching(benchmark, targets, epoch_seconds, n):
    a, b = _ids(n, 1), _ids(n, 2)
    took: list[float] = []
    out = benchmark.pedantic(timed(match, took), args=(a, b), rounds=3 if n == N_RUN else 1, iterations=1)
    assert len(out) > 0
    t_match, t_epoch = float(np.median(took)), epoch_seconds * n / N_RUN
    benchmark.extra_info.update(rows_per_party=n, match_s=round(t_match, 4), epoch_s=round(t_epoch, 2))
    targets.check(benchmark, "matching / one epoch", t_match / t_epoch, 0.05)
