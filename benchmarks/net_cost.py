"""Seconds, bytes and round trips per training step of a deployed run (issue 30), on loopback and
through a delaying TCP proxy that shapes the link to ``--mbit`` Mbit/s and ``--rtt-ms`` RTT.

The passive party runs as its own process (``securevfl party``, mutual TLS); the proxy is a third
process between them (TLS passes through it untouched: it only delays bytes). Shaping model, per
direction: a chunk read at time t leaves at max(t + RTT/2, previous departure + size·8/rate), i.e.
a bottleneck link of that rate plus propagation delay (no loss, no TCP slow-start effects).

    OMP_NUM_THREADS=1 nice python benchmarks/net_cost.py --out benchmarks/net_cost.json
    python benchmarks/net_cost.py --he off --host breast_hetero_host_partial.csv \
        --methods splitnn,fedhssl,vflhlp,fedud,risa,entity-aug,fedlocal-simsiam

(``train`` phase, per supervised step: a method's pre-training traffic and time are spread over its
supervised steps.) Prints one markdown table (and writes the runs' cost objects to ``--out``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "deploy-example"


# ------------------------------------------------------------------------------------ the proxy
async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, one_way: float, rate: float) -> None:
    q: asyncio.Queue = asyncio.Queue()
    loop = asyncio.get_running_loop()

    async def send() -> None:
        free = 0.0  # when the bottleneck link is next free
        while True:
            data = await q.get()
            if data is None:
                writer.close()
                return
            t_in, chunk = data
            free = max(free, t_in) + len(chunk) * 8 / rate
            delay = max(t_in + one_way, free) - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            writer.write(chunk)
            await writer.drain()

    task = asyncio.create_task(send())
    while chunk := await reader.read(65536):
        q.put_nowait((loop.time(), chunk))
    q.put_nowait(None)
    await task


async def _proxy(listen_port: int, target: tuple[str, int], one_way: float, rate: float) -> None:
    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        tr, tw = await asyncio.open_connection(*target)
        await asyncio.gather(_pipe(r, tw, one_way, rate), _pipe(tr, w, one_way, rate), return_exceptions=True)

    server = await asyncio.start_server(handle, "127.0.0.1", listen_port)
    print(f"proxy listening on {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


# ------------------------------------------------------------------------------------ the runs
def _start(cmd: list[str], marker: str, env: dict) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stream = proc.stdout if marker == "proxy" else proc.stderr
    assert stream is not None
    line = stream.readline()
    return proc, line.split()[-1] if marker == "proxy" else line.split("listening on ")[1].split()[0]


def run_one(he: str, shaped: bool, args: argparse.Namespace, certs: Path, env: dict, method: str = "splitnn") -> dict:
    py = sys.executable
    passive, addr = _start([py, "-m", "securevfl", "party", "--role", "passive1", "--listen", "127.0.0.1:0",
                            "--party-file", str(EXAMPLE / args.host), "--tls",
                            str(certs / "passive1"), "--timeout", "600"], "party", env)
    procs = [passive]
    try:
        if shaped:
            proxy, port = _start([py, __file__, "proxy", "--to", addr, "--rtt-ms", str(args.rtt_ms),
                                  "--mbit", str(args.mbit)], "proxy", env)
            procs.append(proxy)
            addr = f"127.0.0.1:{port}"
        cmd = [py, "-m", "securevfl", "train", "--dataset", "csv", "--party-file",
               str(EXAMPLE / "breast_hetero_guest.csv"), "--label-column", "y", "--peer", f"passive1={addr}",
               "--tls", str(certs / "active"), "--timeout", "600", "--epochs", str(args.epochs), "--batch-size",
               str(args.batch_size), "--he", he, "--method", method, "--json", "--no-progress"]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3000)
        if out.returncode:
            raise SystemExit(f"{he} shaped={shaped}: {out.stderr.strip().splitlines()[-1]}")
        return json.loads(out.stdout)
    finally:
        for p in procs:
            p.kill()
            p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    sub = ap.add_subparsers(dest="cmd")
    px = sub.add_parser("proxy")
    px.add_argument("--to", required=True)
    px.add_argument("--listen-port", type=int, default=0)
    px.add_argument("--rtt-ms", type=float, default=50)
    px.add_argument("--mbit", type=float, default=100)
    ap.add_argument("--he", default="off,ckks,paillier")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--rtt-ms", type=float, default=50)
    ap.add_argument("--mbit", type=float, default=100)
    ap.add_argument("--methods", default="splitnn", help="comma-separated methods (each with every --he)")
    ap.add_argument("--host", default="breast_hetero_host.csv",
                    help="the passive party's file in docs/deploy-example (breast_hetero_host_partial.csv: a third "
                         "of the rows aligned, for the methods that use unaligned rows)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.cmd == "proxy":
        host, port = args.to.rsplit(":", 1)
        asyncio.run(_proxy(args.listen_port, (host, int(port)), args.rtt_ms / 2000, args.mbit * 1e6))
        return
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    rows, runs = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "securevfl", "certs", "--parties", "active,passive1", "--out",
                        f"{tmp}/certs"], env=env, check=True, capture_output=True)
        for method, he in ((m, h) for m in args.methods.split(",") for h in args.he.split(",")):
            for shaped in (False, True):
                t0 = time.perf_counter()
                r = run_one(he, shaped, args, Path(tmp) / "certs", env, method)
                net = r["cost"]["network"]["train"]
                link = f"{args.mbit:g} Mbit/s, {args.rtt_ms:g} ms RTT" if shaped else "loopback"
                runs[f"{method}/{he}/{link}"] = r["cost"]
                down, up = net["per_step"]["active->passive1"], net["per_step"]["passive1->active"]
                rows.append(f"| {method} | {he} | {link} | {net['seconds_per_step']:.3f} | "
                            f"{down['bytes'] / 1e3:.1f} kB / {down['messages']:g} | "
                            f"{up['bytes'] / 1e3:.1f} kB / {up['messages']:g} | "
                            f"{net['round_trips_per_step']['passive1']:g} | "
                            f"{net['rpcs_per_step'].get('passive1', 0):g} | "
                            f"{r['utility']['test']:.4f} | "
                            f"{time.perf_counter() - t0:.0f} |")
                print(rows[-1], file=sys.stderr, flush=True)
    print("| method | HE | link | s / step | active→passive per step (bytes / msgs) | passive→active per step | "
          "protocol round trips / step | RPCs / step | test AUC | wall s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    if args.out:
        Path(args.out).write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
