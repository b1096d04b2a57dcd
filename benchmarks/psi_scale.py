"""PSI at scale (issue 53): IDs/s per party for 100k, 1M and 10M IDs per party (half overlap).

Two measurements, both printed as one table row per (size, cores):

- ``alone``: both parties' sessions in one process, driven in turn (:func:`securevfl.data.psi.mutual_psi_local`
  with each party's own worker processes), so each party's work runs alone on the machine: IDs/s per
  party is its set size over the seconds its own session was busy (hashing, bucketing, exponentiations,
  comparing). This is the per-party figure on ``--cores`` cores.
- ``--e2e``: the two parties as two OS processes over the gRPC channel on loopback (mutual TLS off:
  the channel, not TLS, is measured), each with ``--cores`` worker processes; IDs/s per party is the set
  size over the wall time; on a machine of C cores two parties of C/2 each is the fair split.

Each row also gives how far each party's resident memory rose above where it stood before the PSI
(the set's own arrays are made before), and a worker process's peak.

    python benchmarks/psi_scale.py --n 100000 1000000 --cores 1 2
    python benchmarks/psi_scale.py --n 1000000 --cores 1 --e2e
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import numpy as np


def sets(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Two sets of ``n`` IDs sharing half: random 63-bit customer numbers (seeded)."""
    rng = np.random.default_rng(53)
    pool = np.unique(rng.integers(0, 2**62, size=int(2.2 * n), dtype=np.int64))[: 2 * n]
    rng.shuffle(pool)
    return pool[:n], pool[n // 2: n // 2 + n]


def _rss_mb(_: object = None) -> float:
    """This process's peak resident memory since :func:`_reset_peak` (VmHWM; ru_maxrss would keep the
    pre-exec peak of a spawned worker's parent)."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak() -> float:
    """Reset the peak to the present resident memory (Linux: clear_refs 5); returns it, MB."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _rss_mb()


def alone(n: int, cores: int) -> dict:
    from securevfl.channel import InMemoryChannel
    from securevfl.data import psi

    a_ids, b_ids = sets(n)
    busy = {"a": 0.0, "b": 0.0}

    def timed(who: str, fn):
        def wrapped(*args, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                busy[who] += time.perf_counter() - t0
        return wrapped

    ch = InMemoryChannel()
    ea, eb = ch.endpoint("active"), ch.endpoint("passive1")
    with psi.Workers(cores) as wa, psi.Workers(cores) as wb:
        wa.map(len, [(b"",), (b"",)])  # start the worker processes before the clock
        wb.map(len, [(b"",), (b"",)])
        base = _reset_peak()
        sa, sb = psi.MutualPSI(a_ids, "passive1", wa), psi.MutualPSI(b_ids, "active", wb)
        for who, s in (("a", sa), ("b", sb)):
            for name in ("agree", "start", "handle", "result"):
                setattr(s, name, timed(who, getattr(s, name)))
        t0 = time.perf_counter()
        got_a, got_b = psi.drive_local(ea, eb, sa, sb)
        wall = time.perf_counter() - t0
        workers_rss = max(wa.map(_rss_mb, [(None,), (None,)]) + wb.map(_rss_mb, [(None,), (None,)]))
    assert len(got_a) == len(got_b) == n // 2, (len(got_a), len(got_b))
    return {"n": n, "cores": cores, "mode": "alone", "s_a": busy["a"], "s_b": busy["b"], "wall": wall,
            "ids_per_s": n / max(busy.values()), "mb": ch.stats.total_bytes / 1e6,
            "rss_mb": _rss_mb() - base, "base_mb": base, "workers_rss_mb": workers_rss if cores > 1 else 0.0}


def _party(role: str, n: int, cores: int, port: int) -> None:
    """One party of the ``--e2e`` run, in its own process."""
    from securevfl.channel.grpc import GrpcChannel, NetConfig
    from securevfl.data import psi

    a_ids, b_ids = sets(n)
    net = NetConfig(tls=None)
    if role == "active":
        ch = GrpcChannel("active", net, peers={"passive1": f"127.0.0.1:{port}"})
        ch.wait_ready()
        ids, peer = a_ids, "passive1"
    else:
        ch = GrpcChannel("passive1", net, listen=f"127.0.0.1:{port}", client="active")
        ids, peer = b_ids, "active"
    with psi.Workers(cores) as w:
        w.map(len, [(b"",), (b"",)])
        base = _reset_peak()
        t0 = time.perf_counter()
        got = psi.mutual_psi(ch.endpoint(role), peer, ids, w)
        dt = time.perf_counter() - t0
        if role == "active":  # wait for the passive party's last answer before closing the stream
            ch.endpoint(role).recv_json(peer, "control")
        else:
            ch.endpoint(role).send_json(peer, "control", {"done": 1})
        workers_rss = max(w.map(_rss_mb, [(None,), (None,)])) if cores > 1 else 0.0
    assert len(got) == n // 2
    print(f"{role} {dt:.3f} {_rss_mb() - base:.0f} {workers_rss:.0f} {base:.0f}", flush=True)
    ch.close()


def e2e(n: int, cores: int) -> dict:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, __file__, "--party"]
    t0 = time.perf_counter()
    p = subprocess.Popen([*cmd, "passive1", str(n), str(cores), str(port)], stdout=subprocess.PIPE, text=True)
    a = subprocess.Popen([*cmd, "active", str(n), str(cores), str(port)], stdout=subprocess.PIPE, text=True)
    out = {}
    for proc in (a, p):
        line = proc.communicate()[0].strip().splitlines()[-1].split()
        out[line[0]] = [float(x) for x in line[1:]]
    wall = time.perf_counter() - t0
    return {"n": n, "cores": cores, "mode": "e2e", "s_a": out["active"][0], "s_b": out["passive1"][0], "wall": wall,
            "ids_per_s": n / max(out["active"][0], out["passive1"][0]), "mb": float("nan"),
            "rss_mb": max(out["active"][1], out["passive1"][1]),
            "workers_rss_mb": max(out["active"][2], out["passive1"][2]), "base_mb": out["active"][3]}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--party":
        _party(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[100_000])
    ap.add_argument("--cores", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--e2e", action="store_true")
    args = ap.parse_args()
    print("| IDs per party | mode | cores per party | party A s | party B s | IDs/s per party | MB on the wire "
          "| party's RSS growth MB (baseline) | a worker's peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in args.n:
        for c in args.cores:
            r = (e2e if args.e2e else alone)(n, c)
            print(f"| {r['n']:,} | {r['mode']} | {r['cores']} | {r['s_a']:.1f} | {r['s_b']:.1f} | "
                  f"{r['ids_per_s']:,.0f} | {r['mb']:.0f} | {r['rss_mb']:.0f} ({r['base_mb']:.0f}) | "
                  f"{r['workers_rss_mb']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
