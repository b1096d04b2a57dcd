"""PSI over the channel on 10k / 100k IDs against openmined-psi's own calls on the same sets.

Ours is the mutual X25519 PSI (issue 53): both parties learn the intersection, every message through the
channel, one core. openmined-psi's calls give one party the result; run twice (each party once the
client), they give what ours gives, so the ratio is taken against twice their time. openmined-psi is a
test extra for this comparison only; the package no longer uses it."""

from __future__ import annotations

import time

import numpy as np
import pytest
from conftest import timed

from securevfl.channel import InMemoryChannel
from securevfl.data import psi

psi_lib = pytest.importorskip("private_set_intersection.python")  # the bench extra


def _ids(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    pool = rng.choice(10 * n, size=2 * n, replace=False)
    return np.sort(pool[:n]), np.sort(pool[n // 2:n // 2 + n])  # half overlap


def ours(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ch = InMemoryChannel()
    ea, eb = ch.endpoint("active"), ch.endpoint("passive1")
    return psi.mutual_psi_local(ea, eb, a, b)[0]


def raw(a: np.ndarray, b: np.ndarray) -> int:
    client, server = psi_lib.client.CreateWithNewKey(True), psi_lib.server.CreateWithNewKey(True)
    xa, xb = [str(i) for i in a], [str(i) for i in b]
    request = client.CreateRequest(xa)
    setup = server.CreateSetupMessage(1e-9, len(xa), xb, psi_lib.DataStructure.RAW)
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
    both_ways = 2 * min(t_raw)
    benchmark.extra_info.update(ids_per_party=n, ours_ids_per_s=round(n / t_ours),
                                openmined_both_ways_ids_per_s=round(n / both_ways))
    targets.check(benchmark, "ours/openmined-both-ways time", t_ours / both_ways, None)
