"""Training on a large Criteo-layout file with bounded memory: rows/s and peak RSS per phase.

    python benchmarks/bench_scale.py --rows 10000000 [--epochs 1 --batch-size 1024]

Writes a synthetic Kaggle-layout file (``securevfl.data.synthetic.write_criteo``, chunked) unless
``--file`` is given, then in a fresh process: reads it through the fast reader into memory-mapped
columns (``data.column_cache``), partitions it (``vflhlp`` fields: active = 26 categorical, passive =
13 numeric), and trains ``splitnn`` for ``--epochs`` on the aligned rows. Reports each phase's wall
time and rows/s, peak RSS (VmHWM: anonymous + file-backed pages) and the peak anonymous RSS (sampled
every 0.1 s: the memory that cannot be reclaimed), and extrapolates linearly to 45,840,617 rows (the
Kaggle file).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from harness import data_file  # noqa: E402

KAGGLE_ROWS = 45_840_617

CHILD = r"""
import json, sys, threading, time
sys.path.insert(0, sys.argv[5])
from harness import hwm_mb
import numpy as np
from securevfl import threads
threads.configure()
from securevfl.config import RunConfig
from securevfl.data import load_dataset, make_partition
from securevfl.federation import align, build_federation
from securevfl.training import SplitTrainer, TrainConfig

path, cache, epochs, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
train_rows = int(sys.argv[6])
anon = {"max": 0.0}
def sample():
    while True:
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon:"):
                anon["max"] = max(anon["max"], int(line.split()[1]) / 1024)
        time.sleep(0.1)
threading.Thread(target=sample, daemon=True).start()
time.sleep(0.3)
out = {"base_mb": hwm_mb(), "base_anon_mb": anon["max"]}
cfg = RunConfig(dataset="criteo", method="splitnn", seed=0)
cfg.data.path, cfg.data.column_cache, cfg.partition.columns = path, cache, "vflhlp"
cfg.train.batch_size, cfg.optim.lr = batch, 1e-3
t = time.perf_counter(); ds = load_dataset("criteo", cfg.data); out["read_s"] = time.perf_counter() - t
out["rows"] = len(ds.y); out["read_peak_mb"], out["read_anon_mb"] = hwm_mb(), anon["max"]
t = time.perf_counter(); part = make_partition(ds, cfg.partition, 0, cfg.data)
out["partition_s"] = time.perf_counter() - t
out["partition_peak_mb"], out["partition_anon_mb"] = hwm_mb(), anon["max"]
fed = build_federation(part, cfg.model, cfg.optim, seed=0)
align(fed, "given", part.aligned_ids)
trainer = SplitTrainer(fed, TrainConfig(batch_size=batch, epochs=epochs), seed=0, progress=False)
ids = part.labeled_ids
if train_rows:  # a seeded subset: the epoch time is extrapolated from its rows/s
    ids = np.sort(np.random.default_rng(0).choice(ids, size=min(train_rows, len(ids)), replace=False))
t = time.perf_counter(); trainer.fit(ids); out["train_s"] = time.perf_counter() - t
out["train_rows"], out["epoch_rows"] = len(ids) * epochs, len(part.labeled_ids)
t = time.perf_counter(); util = trainer.evaluate(); out["eval_s"] = time.perf_counter() - t
out["auc"] = util.get("auc"); out["peak_mb"], out["anon_mb"] = hwm_mb(), anon["max"]
out["parsed_mb"] = (ds.X.nbytes + ds.categorical.nbytes + ds.y.nbytes) / 2**20
out["party_mb"] = sum(p.X_train.nbytes + p.X_test.nbytes for p in part.parties) / 2**20
import torch; out["threads"] = torch.get_num_threads()
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--file")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--train-rows", type=int, default=0,
                    help="train on a seeded subset of this many labeled rows (0 = all) and extrapolate the epoch")
    ap.add_argument("--cache", help="folder for the memory-mapped columns (default: a temporary folder)")
    args = ap.parse_args()
    path = Path(args.file) if args.file else data_file("criteo", args.rows)
    cache = args.cache or tempfile.mkdtemp(prefix="securevfl-columns-")
    r = json.loads(subprocess.run([sys.executable, "-c", CHILD, str(path), cache, str(args.epochs),
                                   str(args.batch_size), str(Path(__file__).parent), str(args.train_rows)],
                                  check=True, capture_output=True, text=True).stdout)
    n, scale = r["rows"], KAGGLE_ROWS / r["rows"]
    print(f"file {path.stat().st_size / 2**20:,.0f} MB, {n:,} rows; batch {args.batch_size}, {args.epochs} epoch(s)")
    print(f"read:      {r['read_s']:.1f} s = {n / r['read_s']:,.0f} rows/s; peak RSS {r['read_peak_mb']:,.0f} MB, "
          f"anonymous {r['read_anon_mb']:,.0f} MB (after imports {r['base_mb']:,.0f} MB; parsed columns "
          f"{r['parsed_mb']:,.0f} MB, memory-mapped)")
    print(f"partition: {r['partition_s']:.1f} s; peak RSS {r['partition_peak_mb']:,.0f} MB, anonymous "
          f"{r['partition_anon_mb']:,.0f} MB (per-party encoded arrays {r['party_mb']:,.0f} MB, in memory)")
    rate = r["train_rows"] / r["train_s"]
    epoch_s = r["epoch_rows"] * args.epochs / rate
    print(f"train:     {r['train_rows']:,} rows in {r['train_s']:.1f} s = {rate:,.0f} rows/s (all {r['epoch_rows']:,} "
          f"labeled rows: {epoch_s:.0f} s per {args.epochs} epoch(s)); eval {r['eval_s']:.1f} s; "
          f"test AUC {r['auc']:.4f}; peak RSS {r['peak_mb']:,.0f} MB, anonymous {r['anon_mb']:,.0f} MB")
    total = r["read_s"] + r["partition_s"] + epoch_s + r["eval_s"]
    print(f"extrapolated to {KAGGLE_ROWS:,} rows (linear): read {r['read_s'] * scale / 60:.1f} min, partition "
          f"{r['partition_s'] * scale / 60:.1f} min, {args.epochs} epoch(s) {epoch_s * scale / 60:.1f} min, total "
          f"{total * scale / 60:.1f} min; anonymous memory ≈ "
          f"{(r['base_anon_mb'] + (r['anon_mb'] - r['base_anon_mb']) * scale) / 1024:.1f} GB "
          f"(after imports {r['base_anon_mb']:,.0f} MB + the growth above it × {scale:.1f})")


if __name__ == "__main__":
    main()
