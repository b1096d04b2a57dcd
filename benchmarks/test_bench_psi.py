"""PSI over the channel on 10k / 100k IDs against openmined-psi's own calls on the same sets.

The issue asks for throughput "against openmined-psi's own figure for the same sizes"; the library
publishes a benchmark harness, not figures, so its figure is measured here, in the same run: the same
client / server calls with no channel, serialisation or ID bookkeeping of ours around them."""

from __future__ import annotations

import time

import numpy as np
import private_set_intersection.python as psi_lib
import pytest
from conftest import timed

from securevfl.channel import InMemoryChannel
from securevfl.data import psi


def _ids(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    pool = rng.choice(10 * n, size=2 * n, replace=False)
    return np.sort(pool[:n]), np.sort(pool[n // 2:n // 2 + n])  # half overlap


def ours(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ch = InMemoryChannel()
    ea, eb = ch.endpoint("active"), ch.endpoint("passive1")
    client = psi.psi_client_start(ea, "passive1", a)
    psi.psi_server_round(eb, "active", b)
    return psi.psi_client_finish(ea, "passive1", client, a)


def raw(a: np.ndarray, b: np.ndarray) -> int:
    client, server = psi_lib.client.CreateWithNewKey(True), psi_lib.server.CreateWithNewKey(True)
    xa, xb = [str(i) for i in a], [str(i) for i in b]
    request = client.CreateRequest(xa)
    setup = server.CreateSetupMessage(psi.FPR, len(xa), xb, psi_lib.DataStructure.RAW)
    response = server.ProcessRequest(request)
    return len(client.GetIntersection(setup, response))


@pytest.mark.parametrize("n", [10_000, 100_000])
def test_psi(benchmark, targets, n):
    a, b = _ids(n)
    t_raw: list[float] = []

    def run_raw():
        t0 = time.perf_counter()
        raw(a, b)
        t_raw.append(time.perf_counter() - t0)

    mine: list[float] = []
    out = benchmark.pedantic(timed(ours, mine), args=(a, b), setup=run_raw, rounds=3 if n <= 10_000 else 1,
                             iterations=1)
    np.testing.assert_array_equal(out, np.intersect1d(a, b))
    t_ours = float(np.median(mine))
    benchmark.extra_info.update(ids_per_party=n, ours_ids_per_s=round(n / t_ours), raw_ids_per_s=round(n / min(t_raw)))
    targets.check(benchmark, "ours/openmined time", t_ours / float(np.median(t_raw)), None)
