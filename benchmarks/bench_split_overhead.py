"""Time one training epoch of ``splitnn`` against the same architecture trained centrally.

The centralised model is one ``nn.Module`` holding the same bottom models and head (same init,
same optimiser, same data, same batch order and size); only the party separation, the channel's
byte serialisation and the ID lookups differ. Epochs alternate (split, central, split, ...) so
machine noise hits both alike; the script prints the median of each and their ratio.

    python benchmarks/bench_split_overhead.py --dataset fashion-mnist --batch-size 256 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from securevfl.data import PartitionSpec, load_dataset, make_partition
from securevfl.federation import OptimConfig, align, build_federation, make_optimizer
from securevfl.models import ModelConfig
from securevfl.training import SplitTrainer, TrainConfig


class Central(nn.Module):
    """The federation's bottoms + head as one model on the full feature vector."""

    def __init__(self, bottoms: list[nn.Module], head: nn.Module, columns: list[np.ndarray]) -> None:
        super().__init__()
        self.bottoms, self.head = nn.ModuleList(bottoms), head
        self.columns = [torch.as_tensor(c) for c in columns]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([b(x[..., c]) for b, c in zip(self.bottoms, self.columns, strict=True)], 1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="fashion-mnist")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--parties", type=int, default=2)
    ap.add_argument("--bottom", default="auto")
    args = ap.parse_args()

    ds = load_dataset(args.dataset)
    part = make_partition(ds, PartitionSpec(n_parties=args.parties), 0)
    mcfg, ocfg = ModelConfig(bottom=args.bottom), OptimConfig()
    fed = build_federation(part, mcfg, ocfg, seed=0)
    align(fed, "given", part.aligned_ids)
    trainer = SplitTrainer(fed, TrainConfig(batch_size=args.batch_size), seed=0, progress=False)
    ids = np.sort(part.labeled_ids)

    # central twin: same initial weights, full feature rows looked up once
    twin = build_federation(part, mcfg, ocfg, seed=0)
    central = Central([p.bottom for p in twin.parties], twin.active.head, [p.columns for p in part.parties])
    opt = make_optimizer(list(central.parameters()), ocfg)
    pos = np.searchsorted(ds.ids, ids)
    X = torch.from_numpy(ds.X[pos]).float()
    y = torch.from_numpy(ds.y[pos])

    def central_epoch(rng: np.random.Generator) -> None:
        central.train()
        order = rng.permutation(len(ids))
        for s in range(0, len(order), args.batch_size):
            b = order[s:s + args.batch_size]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(central(X[b]), y[b]).backward()
            opt.step()

    t_split, t_central = [], []
    crng = np.random.default_rng(0)
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        trainer.fit(ids, epochs=1)
        t_split.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        central_epoch(crng)
        t_central.append(time.perf_counter() - t0)
    s, c = statistics.median(t_split), statistics.median(t_central)
    steps = -(-len(ids) // args.batch_size)
    mb = fed.channel.stats.total_bytes / 1e6 / args.repeats
    print(f"dataset={args.dataset} parties={args.parties} batch={args.batch_size} steps/epoch={steps} "
          f"threads={torch.get_num_threads()}")
    print(f"splitnn epoch: {s:.2f} s (median of {args.repeats}; {mb:.1f} MB through the channel per epoch)")
    print(f"central epoch: {c:.2f} s")
    print(f"ratio split/central: {s / c:.3f}")


if __name__ == "__main__":
    main()
