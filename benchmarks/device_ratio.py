"""Issue 33: one CNN sweep cell on the CPU against the same cell on a GPU (target ≥ 5×).

Runs the cell (``splitnn``, CNN bottoms, two parties, no defense) once per device, each after a
short warm-up run that is not timed (CUDA context, cuDNN autotuning), and prints the training-and-
evaluation seconds the run records (``cost.seconds``), seconds per step and the ratio. The CPU run
uses ``--threads`` intra-op threads (``SECUREVFL_THREADS``; the issue compares against 16 cores).

    PYTHONPATH=$PWD python benchmarks/device_ratio.py --dataset fashion-mnist --epochs 2 --threads 16

A device the machine lacks is reported as such and skipped (the ratio is then not printed).
"""

from __future__ import annotations

import argparse
import os
import platform


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="fashion-mnist", help="an image dataset (fashion-mnist, mnist, digits)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--threads", type=int, default=16, help="CPU intra-op threads (SECUREVFL_THREADS)")
    ap.add_argument("--devices", default="cpu,cuda", help="comma-separated --device values to time")
    args = ap.parse_args()
    os.environ["SECUREVFL_THREADS"] = str(args.threads)  # read by securevfl.threads at first use

    import torch

    from securevfl.config import RunConfig
    from securevfl.errors import UserError
    from securevfl.lab.compose import execute

    def cell(device: str, epochs: int) -> dict:
        cfg = RunConfig(dataset=args.dataset, method="splitnn", seed=0, device=device)
        cfg.model.bottom = "cnn"
        cfg.train.epochs, cfg.train.batch_size = epochs, args.batch_size
        return execute(cfg, progress=False).to_json()

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, GPU {gpu}, torch {torch.__version__}")
    print(f"cell: {args.dataset}, splitnn, --bottom cnn, {args.epochs} epochs, batch {args.batch_size}, "
          f"CPU threads {args.threads}")
    print("| device | seconds | steps | ms/step | test accuracy |\n|---|---|---|---|---|")
    seconds = {}
    for device in args.devices.split(","):
        try:
            cell(device, 1)  # warm-up, not timed
        except UserError as e:
            print(f"| {device} | unavailable: {e} | | | |")
            continue
        r = cell(device, args.epochs)
        c = r["cost"]
        seconds[device] = c["seconds"]
        print(f"| {c['device']} | {c['seconds']:.1f} | {c['train_steps']} | "
              f"{1000 * c['seconds'] / max(c['train_steps'], 1):.1f} | {r['utility']['test']:.4f} |")
    if "cpu" in seconds and len(seconds) > 1:
        for device, s in seconds.items():
            if device != "cpu":
                print(f"ratio cpu / {device}: {seconds['cpu'] / s:.2f}x")


if __name__ == "__main__":
    main()
