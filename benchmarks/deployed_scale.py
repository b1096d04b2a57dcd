"""A million rows and more across processes (issue 53): deployed training against the same run in one
process, with each party's peak anonymous memory.

    python benchmarks/deployed_scale.py --rows 1000000 10000000 --methods splitnn fedhssl --dir /var/tmp/ds

Writes two seeded synthetic party files in a Criteo-like layout (active: ``id``, ``label`` and 26
categorical columns of 8-hex-digit values; passive: ``id`` and 13 integer columns with missing cells;
the label depends on both parties' columns), every ID in both files. Then, per row count and method,
one epoch (FedHSSL: one pre-training epoch, ``ssl_epochs=1``, and one fine-tuning epoch):

- in one process: ``securevfl train --dataset csv --party-file A --party-file P``;
- deployed: ``securevfl party`` (the passive party, its own process) and ``securevfl train --peer``
  over gRPC with mutual TLS on loopback.

Both align by ``--alignment plain`` (the PSI at this scale is measured on its own in
``benchmarks/psi_scale.py``: 10M IDs take ≈ 12 min a party on 2 cores) and read ``--numeric-ids``
(int64 IDs are what keep a party's memory flat; string IDs are held in memory). Each process's
``RssAnon`` is sampled every 0.2 s (the memory the kernel cannot drop: the memory-mapped columns and
encoded arrays are file-backed and are not in it). Prints one markdown table and writes ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
N_CAT, N_NUM, CHUNK = 26, 13, 500_000


def write_files(rows: int, folder: Path, seed: int = 0, string_ids: bool = False) -> tuple[Path, Path]:
    """The two party files (kept and reused when they exist with the same row count); ``string_ids``:
    a bank's customer IDs, ``CUST-000000123456`` (17 characters), instead of integers."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    tag = "_str" if string_ids else ""
    active, passive = folder / f"active_{rows}{tag}.csv", folder / f"passive_{rows}{tag}.csv"
    if active.exists() and passive.exists():
        return active, passive
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    w_cat = rng.normal(size=(N_CAT, 64))  # each categorical column's effect per value (64 values each)
    w_num = rng.normal(size=N_NUM)
    writers: dict[str, pacsv.CSVWriter] = {}
    try:
        for start in range(0, rows, CHUNK):
            n = min(CHUNK, rows - start)
            ids = np.arange(start, start + n, dtype=np.int64)
            if string_ids:
                ids = np.char.add("CUST-", np.char.zfill(ids.astype(str), 12)).astype(object)
            cats = np.minimum(rng.zipf(1.3, size=(n, N_CAT)) - 1, 63)
            nums = rng.lognormal(2.0, 1.5, size=(n, N_NUM)).round()
            logit = w_cat[np.arange(N_CAT), cats].sum(axis=1) / 3 + (np.log1p(nums) - 2.0) @ w_num / 2
            label = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int8)
            salt = (np.arange(N_CAT, dtype=np.int64) * 2654435761) % (1 << 32)
            a = {"id": ids, "label": label}
            for j in range(N_CAT):  # 64 values a column, as 8 hex digits
                values = np.array([f"{(v * 40503 + int(salt[j])) % (1 << 32):08x}" for v in range(64)], dtype=object)
                a[f"C{j + 1}"] = values[cats[:, j]]
            p = {"id": ids}
            for j in range(N_NUM):
                col = nums[:, j].astype(np.int64).astype(str).astype(object)
                col[rng.random(n) < 0.05] = ""  # missing cells
                p[f"I{j + 1}"] = col
            for name, table in (("a", a), ("p", p)):
                t = pa.table({k: pa.array(v) for k, v in table.items()})
                if name not in writers:
                    writers[name] = pacsv.CSVWriter(active if name == "a" else passive, t.schema,
                                                    write_options=pacsv.WriteOptions(quoting_style="none"))
                writers[name].write_table(t)
    finally:
        for w in writers.values():
            w.close()
    return active, passive


class Peak:
    """The peak RssAnon (MB) of a process, sampled every 0.2 s while it runs."""

    def __init__(self, pid: int) -> None:
        self.pid, self.mb, self._stop = pid, 0.0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for line in open(f"/proc/{self.pid}/status"):
                    if line.startswith("RssAnon:"):
                        self.mb = max(self.mb, int(line.split()[1]) / 1024)
            except OSError:
                return
            time.sleep(0.2)

    def stop(self) -> float:
        self._stop.set()
        self.thread.join()
        return round(self.mb, 1)


HASHED = False
"""``--hashed-ids`` with ``--string-ids``: the active party asks for the IDs' 64-bit hashes (issue 64)."""


def _common(method: str, batch: int, numeric: bool = True) -> list[str]:
    extra = ["--method-param", "ssl_epochs=1"] if method == "fedhssl" else []
    extra += ["--numeric-ids"] if numeric else ["--hashed-ids"] if HASHED else []
    return ["--method", method, "--epochs", "1", "--batch-size", str(batch), "--alignment", "plain",
            "--id-column", "id", "--label-column", "label", "--json", "--no-progress", "--seed", "0", *extra]


def in_process(files: tuple[Path, Path], method: str, batch: int, env: dict, numeric: bool = True) -> dict:
    cmd = [sys.executable, "-m", "securevfl", "train", "--dataset", "csv", "--party-file", str(files[0]),
           "--party-file", str(files[1]), "--passive-seed", "7", *_common(method, batch, numeric)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = Peak(proc.pid)
    out, err = proc.communicate()
    anon = peak.stop()
    if proc.returncode:
        raise SystemExit(f"in-process {method}: {err.strip().splitlines()[-1]}")
    r = json.loads(out)
    return {"wall_s": round(time.perf_counter() - t0, 1), "anon_mb": anon, "auc": r["utility"].get("auc"),
            "train_s": r["cost"]["seconds"], "bytes": r["cost"]["bytes_sent"]}


def deployed(files: tuple[Path, Path], method: str, batch: int, env: dict, certs: Path, numeric: bool = True,
             timeout: list[str] | None = None) -> dict:
    """``timeout``: both parties' ``--timeout`` flag (None: 3600 s; [] : the default)."""
    py = sys.executable
    timeout = ["--timeout", "3600"] if timeout is None else timeout
    party = subprocess.Popen([py, "-m", "securevfl", "party", "--role", "passive1", "--listen", "127.0.0.1:0",
                              "--party-file", str(files[1]), "--id-column", "id", "--tls", str(certs / "passive1"),
                              *timeout, "--seed", "7", "--allow", "plain-alignment"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    p_peak = Peak(party.pid)
    try:
        assert party.stderr is not None
        line = party.stderr.readline()
        addr = line.split("listening on ")[1].split()[0]
        t0 = time.perf_counter()
        proc = subprocess.Popen([py, "-m", "securevfl", "train", "--dataset", "csv", "--party-file", str(files[0]),
                                 "--peer", f"passive1={addr}", "--tls", str(certs / "active"), *timeout,
                                 *_common(method, batch, numeric)], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        a_peak = Peak(proc.pid)
        out, err = proc.communicate()
        a_anon = a_peak.stop()
        wall = time.perf_counter() - t0
        if proc.returncode:
            raise SystemExit(f"deployed {method}: {err.strip().splitlines()[-1]}")
        party.wait(timeout=60)
    finally:
        party.kill()
        party.wait()
    r = json.loads(out)
    net = r["cost"]["network"]
    train_s = sum(float(net[k]["seconds"]) for k in ("train", "evaluate") if k in net)
    return {"wall_s": round(wall, 1), "anon_mb": a_anon, "passive_anon_mb": p_peak.stop(),
            "auc": r["utility"].get("auc"), "train_s": round(train_s, 2), "bytes": r["cost"]["bytes_sent"],
            "phases": net}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1_000_000])
    ap.add_argument("--methods", nargs="+", default=["splitnn", "fedhssl"])
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/securevfl-deployed-scale"))
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--only", choices=["in-process", "deployed"], default=None)
    ap.add_argument("--string-ids", action="store_true",
                    help="IDs as CUST-000000123456 strings (no --numeric-ids; both parties on their default timeout)")
    ap.add_argument("--hashed-ids", action="store_true", help="with --string-ids: train --hashed-ids")
    args = ap.parse_args()
    global HASHED
    HASHED = args.hashed_ids
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SECUREVFL_SPILL_DIR": str(args.dir)}
    certs = args.dir / "certs"
    if not (certs / "active").exists():
        subprocess.run([sys.executable, "-m", "securevfl", "certs", "--parties", "active,passive1", "--out",
                        str(certs)], env=env, check=True, capture_output=True)
    rows_out = []
    for rows in args.rows:
        t = time.perf_counter()
        files = write_files(rows, args.dir, string_ids=args.string_ids)
        print(f"# {rows:,} rows: files ready in {time.perf_counter() - t:.0f} s "
              f"({files[0].stat().st_size >> 20} + {files[1].stat().st_size >> 20} MB)", file=sys.stderr, flush=True)
        for method in args.methods:
            rec: dict = {"rows": rows, "method": method}
            if args.only != "deployed":
                rec["in_process"] = in_process(files, method, args.batch_size, env, not args.string_ids)
                print(f"  {method} in one process: {rec['in_process']}", file=sys.stderr, flush=True)
            if args.only != "in-process":
                rec["deployed"] = deployed(files, method, args.batch_size, env, certs, not args.string_ids,
                                          [] if args.string_ids else None)
                print(f"  {method} deployed: { {k: v for k, v in rec['deployed'].items() if k != 'phases'} }",
                      file=sys.stderr, flush=True)
            rows_out.append(rec)
            if args.out:
                args.out.write_text(json.dumps(rows_out, indent=1))
    print("| rows | method | one process: s (train+eval) / peak anon MB | deployed: s (train+eval) / active, passive "
          "peak anon MB | deployed ÷ one process | wire bytes per row | AUC (one process / deployed) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows_out:
        i, d = r.get("in_process"), r.get("deployed")
        if not (i and d):
            continue
        print(f"| {r['rows']:,} | {r['method']} | {i['train_s']:.1f} / {i['anon_mb']:.0f} | {d['train_s']:.1f} / "
              f"{d['anon_mb']:.0f}, {d['passive_anon_mb']:.0f} | {d['train_s'] / i['train_s']:.2f} | "
              f"{d['bytes'] / r['rows']:.0f} | {i['auc']:.4f} / {d['auc']:.4f} |")


if __name__ == "__main__":
    main()
