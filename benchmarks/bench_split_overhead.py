"""Per-step time of ``splitnn`` against the same architecture trained centrally, per path.

The centralised model is one ``nn.Module`` holding the same bottom models and head (same init,
same optimiser, same batches); only the party separation, the channel's byte serialisation, the
interactive layer and the ID lookups differ. Chunks of steps alternate (split, central, split, ...)
so machine noise hits both alike; the script prints the median per-step time of each and their ratio.
The benchmark suite (``benchmarks/test_bench_split.py``) runs the same code (``harness.py``).

    python benchmarks/bench_split_overhead.py --case credit image-mlp image-cnn criteo [--rounds 9 --steps 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from harness import SPLIT_CASES, make_split_pair, split_overhead  # noqa: E402

from securevfl import threads  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", nargs="+", default=list(SPLIT_CASES), choices=list(SPLIT_CASES))
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    threads.configure()
    print("| path | batch | split step | central step | ratio | threads |")
    print("|---|---|---|---|---|---|")
    for case in args.case:
        pair = make_split_pair(case)
        r = split_overhead(pair, rounds=args.rounds, steps=args.steps)
        s, c = statistics.median(r.a), statistics.median(r.b)
        print(f"| {case} | {pair.batch} | {s * 1e3:.2f} ms | {c * 1e3:.2f} ms | **{s / c:.2f}** | "
              f"{torch.get_num_threads()} |", flush=True)


if __name__ == "__main__":
    main()
