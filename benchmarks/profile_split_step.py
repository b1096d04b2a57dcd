"""Where a split step's time goes, next to the centralised step (per-call timers on the party,
cut-layer and optimizer methods; the cProfile view agrees but inflates Python calls).

    python benchmarks/profile_split_step.py credit [--steps 300]
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from harness import SPLIT_CASES, chunk_timer, make_split_pair  # noqa: E402

import securevfl.cutlayer as C  # noqa: E402
import securevfl.parties as P  # noqa: E402
import securevfl.training as T  # noqa: E402

TIMED = [(P.ActiveParty, "request"), (P.PassiveParty, "forward"), (P.ActiveParty, "logits"),
         (P.ActiveParty, "backward"), (P.PassiveParty, "backward"), (C.InteractiveActiveEnd, "finish_forward"),
         (C.InteractiveActiveEnd, "send_backward"), (C.InteractivePassiveEnd, "send_forward"),
         (C.InteractivePassiveEnd, "finish_backward"), (T.SplitTrainer, "total_loss"), (P.Party, "features"),
         (torch.optim.Adam, "step"), (torch.Tensor, "backward")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=list(SPLIT_CASES))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    acc: collections.Counter = collections.Counter()

    def wrap(owner, name: str) -> None:
        f = getattr(owner, name)

        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                acc[f"{owner.__name__}.{name}"] += time.perf_counter() - t0

        setattr(owner, name, timed)

    for owner, name in TIMED:
        wrap(owner, name)
    pair = make_split_pair(args.case)
    torch.set_num_threads(args.threads)
    for b in pair.batches(20):
        pair.split_step(b)
        pair.central_step(b)
    batches = pair.batches(args.steps)
    acc.clear()
    ts = chunk_timer(pair.split_step, batches)
    split = dict(acc)
    acc.clear()
    tc = chunk_timer(pair.central_step, batches)
    print(f"{args.case}: split {ts * 1e3:.3f} ms/step, central {tc * 1e3:.3f} ms/step, ratio {ts / tc:.2f} "
          f"({args.threads} thread(s); nested calls are counted in their callers too)")
    for k, v in sorted(split.items(), key=lambda x: -x[1]):
        print(f"  split   {k:40s} {v / args.steps * 1e3:.3f} ms")
    for k, v in sorted(acc.items(), key=lambda x: -x[1]):
        print(f"  central {k:40s} {v / args.steps * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
