"""Issue 54: deployed alignment runs ECDH PSI both ways, so each passive party holds its own intersection.
The cost against one way, both parties' work in one process (python benchmarks/psi_both_ways.py)."""

import time

import numpy as np

from securevfl.channel import InMemoryChannel
from securevfl.data import psi

n = 20000
a = np.array([f"u{i}" for i in range(n)], dtype=object)
p = np.array([f"u{i}" for i in range(n // 2, n + n // 2)], dtype=object)
for mode in ("one way (before: the active party learns)", "both ways (now: each party learns)"):
    ch = InMemoryChannel()
    ea, ep = ch.endpoint("active"), ch.endpoint("passive1")
    t0 = time.perf_counter()
    c = psi.psi_client_start(ea, "passive1", a)
    psi.psi_server_round(ep, "active", p)
    got = psi.psi_client_finish(ea, "passive1", c, a)
    if mode.startswith("both"):
        c2 = psi.psi_client_start(ep, "active", p)
        psi.psi_server_round(ea, "passive1", a)
        own = psi.psi_client_finish(ep, "active", c2, p)
        assert set(own) == set(got)
    dt = time.perf_counter() - t0
    print(f"{mode}: {dt:.2f} s for {n:,} IDs per party ({len(got):,} in common), {ch.stats.total_bytes/1e6:.2f} MB")
