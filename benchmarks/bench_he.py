"""Seconds and bytes per training step with the cut layer in plaintext, CKKS (both packings), BFV,
packed Paillier and naive per-value Paillier (issue 9).

One federation per mode (same partition, seed and batches): ``splitnn``, two parties, batch B,
bottom output d, head ``Linear(·, h) → ReLU → Linear(h, K)`` so the interactive layer is d×h.
Each mode runs one untimed warm-up step (key exchange, first-use costs), then ``--steps`` timed
steps; the table shows the median step time, the ratio to ``off`` from the same run, bytes per step
from the channel's counters, and where the HE time goes (the backends' per-operation timers).
Use OMP_NUM_THREADS=1; other jobs on the machine change absolute times, compare ratios.

``--threads 1,2`` repeats every mode at each core count in the same run: torch's threads (the
plaintext step) and the HE threads (:func:`securevfl.crypto.backend.set_he_threads`: TenSEAL's thread
pool for CKKS, worker processes for Paillier) are both set to k, and each ratio is against ``off`` at the
same k, so the table shows whether the HE / plaintext ratio grows with the cores.

    OMP_NUM_THREADS=1 python benchmarks/bench_he.py --dataset fashion-mnist --batch-size 256 \\
        --cut-dim 16 --hidden 32 [--threads 1,2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from securevfl.crypto.backend import set_he_threads
from securevfl.cutlayer import make_cut_layer
from securevfl.data import PartitionSpec, dataset_status, load_dataset, make_partition
from securevfl.federation import OptimConfig, align, build_federation
from securevfl.models import ModelConfig
from securevfl.training import SplitTrainer, TrainConfig

MODES = {
    "off": ("off", {}),
    "ckks": ("ckks", {"backend": "tenseal"}),
    "ckks-rotations": ("ckks", {"packing": "rotations", "backend": "tenseal"}),
    "ckks-openfhe": ("ckks", {"backend": "openfhe"}),  # the optional extra, as bfv-openfhe
    "ckks-rotations-openfhe": ("ckks", {"packing": "rotations", "backend": "openfhe"}),
    "bfv": ("bfv", {"backend": "tenseal"}),
    "bfv-openfhe": ("bfv", {"backend": "openfhe"}),  # the optional extra (CPython 3.10): --modes to leave it out
    "bfv-rotations": ("bfv", {"backend": "tenseal", "packing": "rotations"}),
    "bfv-rotations-openfhe": ("bfv", {"backend": "openfhe", "packing": "rotations"}),
    "paillier-3072": ("paillier", {"key_bits": 3072}),
    "paillier-2048": ("paillier", {"key_bits": 2048}),
    "paillier-naive-2048": ("paillier", {"key_bits": 2048, "packing": False}),
}
STEPS = {"off": 20, "ckks": 10, "ckks-rotations": 10, "ckks-openfhe": 10, "ckks-rotations-openfhe": 10, "bfv": 5,
         "bfv-openfhe": 5, "bfv-rotations": 5, "bfv-rotations-openfhe": 5, "paillier-3072": 2, "paillier-2048": 3,
         "paillier-naive-2048": 1}


def run_mode(name: str, part, args) -> dict:
    he, params = MODES[name]
    cut = make_cut_layer(he, **params)
    mcfg = ModelConfig(bottom=args.bottom, cut_dim=args.cut_dim, head_hidden=(args.hidden,))
    fed = build_federation(part, mcfg, OptimConfig(optimizer="sgd", lr=0.05), seed=0, cut=cut)
    align(fed, "given", part.aligned_ids)
    trainer = SplitTrainer(fed, TrainConfig(batch_size=args.batch_size), seed=0, progress=False)
    ids = np.sort(part.labeled_ids)
    rng = np.random.default_rng(0)
    batches = [ids[rng.permutation(len(ids))[: args.batch_size]] for _ in range(STEPS[name] + 1)]
    trainer.train_step(batches[0])  # warm-up: context / key exchange, allocator, first-use costs
    stats, timer = fed.channel.stats, getattr(cut, "timer", None)
    b0, ops0 = stats.total_bytes, dict(timer.seconds) if timer else {}
    times = []
    for b in batches[1:]:
        t0 = time.perf_counter()
        trainer.train_step(b)
        times.append(time.perf_counter() - t0)
    n = len(times)
    ops = {k: (v - ops0.get(k, 0.0)) / n for k, v in timer.seconds.items()} if timer else {}
    return {"mode": name, "steps": n, "seconds": statistics.median(times), "bytes": (stats.total_bytes - b0) / n,
            "ops": ops, "params": cut.describe().get("params", {})}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="fashion-mnist")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--cut-dim", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--bottom", default="auto")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--threads", default="1", help="comma-separated core counts, e.g. 1,2")
    args = ap.parse_args()
    if args.dataset == "fashion-mnist" and not dict((n, ok) for n, ok, _ in dataset_status())[args.dataset]:
        raise SystemExit("fashion-mnist not installed (apt-get install dataset-fashion-mnist)")
    part = make_partition(load_dataset(args.dataset), PartitionSpec(n_parties=2), 0)
    for k in [int(v) for v in args.threads.split(",")]:
        torch.set_num_threads(k)
        set_he_threads(k)
        rows = []
        for name in args.modes.split(","):
            rows.append(run_mode(name, part, args))
            r = rows[-1]
            print(f"# threads {k}, {name}: {r['seconds']:.4f} s/step over {r['steps']} steps", flush=True)
        report(rows, args, k)


def report(rows: list[dict], args, threads: int) -> None:
    base = next((r["seconds"] for r in rows if r["mode"] == "off"), None)
    naive = next((r["seconds"] for r in rows if r["mode"] == "paillier-naive-2048"), None)
    print(f"\nsplitnn on {args.dataset}, B={args.batch_size}, d={args.cut_dim}, h={args.hidden}, bottom={args.bottom}, "
          f"threads={threads}")
    print(f"{'mode':22s} {'s/step':>9s} {'× off':>8s} {'MB/step':>9s} {'naive ÷':>8s}  HE time by operation (s/step)")
    for r in rows:
        ratio = f"{r['seconds'] / base:8.1f}" if base else "       -"
        vs_naive = f"{naive / r['seconds']:8.1f}" if naive and r["mode"].startswith("paillier") else "       -"
        ops = ", ".join(f"{k} {v:.3f}" for k, v in sorted(r["ops"].items(), key=lambda kv: -kv[1]) if v > 5e-4)
        print(f"{r['mode']:22s} {r['seconds']:9.4f} {ratio} {r['bytes'] / 1e6:9.2f} {vs_naive}  {ops}")
    for r in rows:
        if r["params"]:
            print(f"  {r['mode']}: {r['params']}")
    print(flush=True)


if __name__ == "__main__":
    main()
