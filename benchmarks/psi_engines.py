"""PSI engines side by side (issue 64): the X25519 PSI and the OT-based RR22 / KKRT (``--psi``), each
between two OS processes over the deployed gRPC channel with mutual TLS on loopback, on the same sets:
``--n`` string IDs per party (a bank's ``CUST-000000123456``, 17 characters; ``--int-ids``: 63-bit
integers), half of them shared.

Per engine: the wall seconds of the active party's alignment (PSI and the announcement of the aligned
IDs), IDs/s per party (set size / seconds), the bytes the channel carried (for the OT engines only
their announcements and the aligned IDs: the PSI runs on the engine's own link, whose bytes are
counted here from /proc/net/dev's loopback counters over the run, both directions, so ``link MB``
includes the channel's too), and each party's peak resident memory (VmHWM, this process only; the
OT engine's worker process is a child measured by its own peak, ``worker MB``).

    SECUREVFL_PSI_ENGINE=/path/to/engine/bin/python python benchmarks/psi_engines.py --n 1000000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def sets(n: int, int_ids: bool, hashed: bool = False) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(64)
    pool = np.unique(rng.integers(0, 10**12, size=int(2.2 * n), dtype=np.int64))[: 2 * n]
    rng.shuffle(pool)
    a, b = pool[:n], pool[n // 2: n // 2 + n]
    if int_ids:
        return a, b
    if hashed:  # --hashed-ids: each string ID's 64-bit hash, made a million at a time (as the reader does by block)
        from securevfl.data.blocks import hash_ids

        def hashed_of(x: np.ndarray) -> np.ndarray:
            return np.concatenate([hash_ids(np.array([f"CUST-{i:012d}" for i in x[s:s + 1_000_000].tolist()],
                                                     dtype=object)) for s in range(0, len(x), 1_000_000)])
        return hashed_of(a), hashed_of(b)
    return (np.array([f"CUST-{i:012d}" for i in a.tolist()], dtype=object),
            np.array([f"CUST-{i:012d}" for i in b.tolist()], dtype=object))


def _peak_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _lo_bytes() -> int:
    for line in Path("/proc/net/dev").read_text().splitlines():
        if line.strip().startswith("lo:"):
            f = line.split(":", 1)[1].split()
            return int(f[0])  # received on loopback = sent on loopback
    return 0


def party(role: str, n: int, int_ids: bool, engine: str, certs: str, port_file: str, hashed: bool = False) -> None:
    """One party's process: its set, its channel, its side of the alignment; one JSON line out."""
    from securevfl.channel import MessageKind
    from securevfl.channel.grpc import GrpcChannel, NetConfig, TLSFiles
    from securevfl.data import psi

    a, b = sets(n, int_ids, hashed)
    own = a if role == "active" else b
    del a, b
    net = NetConfig(TLSFiles.load(Path(certs) / role, role), timeout=3600, psi=engine)
    if role == "passive1":
        ch = GrpcChannel("passive1", net, listen="127.0.0.1:0", client="active")
        Path(port_file).write_text(str(ch.port))
        ep = ch.endpoint("passive1")
        t0 = time.perf_counter()
        aligned, _ = psi.align_to(ep, "active", own, "psi")
        seconds = time.perf_counter() - t0
        ep.send_json("active", MessageKind.CONTROL, {"done": int(len(aligned))})  # the active party closes after it
    else:
        while not Path(port_file).exists() or not Path(port_file).read_text():
            time.sleep(0.05)
        ch = GrpcChannel("active", net, peers={"passive1": f"127.0.0.1:{Path(port_file).read_text()}"})
        ch.wait_ready()
        ep = ch.endpoint("active")
        t0 = time.perf_counter()
        aligned = psi.align_with(ep, ["passive1"], own, "psi")
        seconds = time.perf_counter() - t0
        ep.recv_json("passive1", MessageKind.CONTROL)
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(json.dumps({"role": role, "seconds": seconds, "aligned": int(len(aligned)), "peak_mb": _peak_mb(),
                      "worker_mb": children, "channel_bytes": ch.stats.as_dict().get("bytes_sent", 0)}), flush=True)
    ch.close()


def run(n: int, int_ids: bool, engine: str, certs: Path, hashed: bool = False) -> dict:
    with tempfile.TemporaryDirectory() as d:
        port_file = str(Path(d) / "port")
        cmd = [sys.executable, __file__, "--party", "", "--n", str(n), "--engine", engine, "--certs", str(certs),
               "--port-file", port_file] + (["--int-ids"] if int_ids else []) + (["--hashed-ids"] if hashed else [])
        lo0 = _lo_bytes()
        procs = {r: subprocess.Popen([*cmd[:3], r, *cmd[4:]], stdout=subprocess.PIPE, text=True)
                 for r in ("passive1", "active")}
        out = {}
        for r, p in procs.items():
            stdout, _ = p.communicate(timeout=7200)
            if p.returncode != 0:
                raise SystemExit(f"{r} failed ({p.returncode})")
            out[r] = json.loads(stdout.strip().splitlines()[-1])
        out["link_mb"] = (_lo_bytes() - lo0) / 1e6
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, nargs="+", default=[1_000_000])
    ap.add_argument("--engines", nargs="+", default=["x25519", "rr22", "kkrt"])
    ap.add_argument("--int-ids", action="store_true")
    ap.add_argument("--hashed-ids", action="store_true", help="string IDs held as their 64-bit hashes (--hashed-ids)")
    ap.add_argument("--party", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--engine", default="x25519", help=argparse.SUPPRESS)
    ap.add_argument("--certs", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port-file", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.party:
        party(args.party, args.n[0], args.int_ids, args.engine, args.certs, args.port_file, args.hashed_ids)
        return
    from securevfl.channel.certs import make_certs

    kind = "int" if args.int_ids else "string (held as 64-bit hashes)" if args.hashed_ids else "string"
    print(f"{os.cpu_count()} cores; {kind} IDs, half shared")
    print("| IDs per party | engine | seconds | IDs/s per party | aligned | channel MB | loopback MB | "
          "active peak MB | passive peak MB | worker peak MB |\n|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        make_certs(["active", "passive1"], Path(d) / "certs")
        for n in args.n:
            for engine in args.engines:
                r = run(n, args.int_ids, engine, Path(d) / "certs", args.hashed_ids)
                a, p = r["active"], r["passive1"]
                mb = a["channel_bytes"] / 1e6  # the active channel counts both directions
                print(f"| {n:,} | {engine} | {a['seconds']:.1f} | {n / a['seconds']:,.0f} | {a['aligned']:,} | "
                      f"{mb:.1f} | {r['link_mb']:.1f} | {a['peak_mb']:.0f} | {p['peak_mb']:.0f} | "
                      f"{max(a['worker_mb'], p['worker_mb']):.0f} |", flush=True)


if __name__ == "__main__":
    main()
