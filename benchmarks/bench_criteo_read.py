"""Streaming read of a Criteo / Avazu-format file: rows/second and peak memory, fast (pyarrow) reader
against the checked line-by-line reader, each in a fresh process, alternating.

    python benchmarks/bench_criteo_read.py --rows 1000000 [--kind avazu] [--repeats 1]

Writes a synthetic file in the Kaggle layout (``securevfl.data.synthetic``, cached by size in the
temporary directory) unless ``--file`` is given, then loads it through the registered loader's fast
path and through its checked path, and reports wall time, rows/second, peak RSS (``VmHWM``) next to
the RSS after imports, the parsed arrays and the file size.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from harness import data_file  # noqa: E402

# VmHWM (peak RSS of this address space) rather than ru_maxrss, which Linux carries across exec
# from the parent that wrote the file.
CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[4])
from harness import hwm_mb
from pathlib import Path
from securevfl.data import DataConfig
from securevfl.data import ctr, readers
kind, path, reader = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
if sys.argv[5] == "stream":  # the streaming regime of files above readers.WHOLE_READ_BYTES
    readers.WHOLE_READ_BYTES = 0
fn = getattr(ctr, f"_{kind}_{reader}")
base = hwm_mb()
t = time.perf_counter()
arrays = fn(path, DataConfig(path=str(path)))
dt = time.perf_counter() - t
print(json.dumps({"rows": len(arrays[-1]), "seconds": dt, "base_mb": base, "peak_mb": hwm_mb(),
                  "dataset_mb": sum(a.nbytes for a in arrays) / 2**20}))
"""


def measure(kind: str, path: Path, reader: str, stream: bool = False) -> dict:
    """One read in a fresh process; ``stream``: the fast reader streams even a file it would read whole."""
    out = subprocess.run([sys.executable, "-c", CHILD, kind, str(path), reader, str(Path(__file__).parent),
                          "stream" if stream else "auto"], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--kind", choices=["criteo", "avazu"], default="criteo")
    ap.add_argument("--file")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--fast-only", action="store_true", help="skip the checked reader (large files)")
    args = ap.parse_args()
    path = Path(args.file) if args.file else data_file(args.kind, args.rows)
    readers = ["fast"] if args.fast_only else ["fast", "checked"]
    runs: dict[str, list[dict]] = {r: [] for r in readers}
    for rep in range(args.repeats):
        for r in (readers if rep % 2 == 0 else readers[::-1]):
            runs[r].append(measure(args.kind, path, r))
    size = path.stat().st_size / 2**20
    print(f"{args.kind} file: {size:.0f} MB, {runs['fast'][0]['rows']:,} rows")
    for r, outs in runs.items():
        s = statistics.median(o["seconds"] for o in outs)
        o = outs[0]
        print(f"{r:>8}: {s:.2f} s = {o['rows'] / s:,.0f} rows/s; peak RSS {max(x['peak_mb'] for x in outs):.0f} MB "
              f"(after imports {o['base_mb']:.0f} MB; parsed arrays {o['dataset_mb']:.0f} MB)")
    if "checked" in runs:
        ratio = statistics.median(o["seconds"] for o in runs["checked"]) / statistics.median(
            o["seconds"] for o in runs["fast"])
        print(f"checked / fast time: {ratio:.2f}")


if __name__ == "__main__":
    main()
