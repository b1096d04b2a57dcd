"""Streaming read of a Criteo-format file: rows/second and peak memory.

    python benchmarks/bench_criteo_read.py --rows 1000000

Writes a synthetic Kaggle-layout file (``securevfl.data.synthetic.write_criteo``) unless ``--file``
is given, then loads it in a fresh process through the ``criteo`` loader and reports wall time,
rows/second and peak RSS (``VmHWM``) next to the RSS after imports and the file size.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

# VmHWM (peak RSS of this address space) rather than ru_maxrss, which Linux carries across exec
# from the parent that wrote the file.
CHILD = r"""
import json, sys, time
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
from securevfl.data import DataConfig, load_dataset
base = hwm()
t = time.perf_counter()
ds = load_dataset("criteo", DataConfig(path=sys.argv[1]))
dt = time.perf_counter() - t
peak = hwm()
print(json.dumps({"rows": len(ds.y), "seconds": dt, "base_mb": base / 1024, "peak_mb": peak / 1024,
                  "dataset_mb": (ds.X.nbytes + ds.categorical.nbytes + ds.y.nbytes) / 2**20}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--file")
    args = ap.parse_args()
    if args.file:
        path = Path(args.file)
    else:
        from securevfl.data.synthetic import write_criteo

        path = Path(tempfile.mkdtemp()) / "train.txt"
        write_criteo(path, args.rows, seed=0)
    out = json.loads(subprocess.run([sys.executable, "-c", CHILD, str(path)], check=True, capture_output=True,
                                    text=True).stdout)
    size = path.stat().st_size / 2**20
    print(f"file: {size:.0f} MB, {out['rows']} rows")
    print(f"read: {out['seconds']:.1f} s = {out['rows'] / out['seconds']:,.0f} rows/s")
    print(f"peak RSS: {out['peak_mb']:.0f} MB (after imports {out['base_mb']:.0f} MB; "
          f"parsed arrays {out['dataset_mb']:.0f} MB; file {size:.0f} MB)")


if __name__ == "__main__":
    main()
