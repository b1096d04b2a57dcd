"""The golden runs' perturbation study (issue 46): how far each recorded number moves when only the
floating-point kernels change (torch's CPU capability, MKL's reproducibility mode, thread count), and,
for scale, when the seed changes. Its table is what ``tests/golden_runs.py``'s tolerances and
``docs/install.md`` ("Golden runs on every CPU") rest on.

    python scripts/golden_spread.py run  --out runs/spread       # every variant, one subprocess each
    python scripts/golden_spread.py table --out runs/spread      # per field family: max |Δ| vs recorded

A variant that sets ``ATEN_CPU_CAPABILITY`` above what the CPU has falls back to the best it has
(torch's rule); the table names the capability each variant really ran with."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.golden_runs import GOLDEN, family  # noqa: E402
from tests.golden_runs import float_leaves as leaves  # noqa: E402

KERNELS: dict[str, dict[str, str]] = {
    "as-is": {},
    "aten-default": {"ATEN_CPU_CAPABILITY": "default"},
    "aten-avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "aten-avx512": {"ATEN_CPU_CAPABILITY": "avx512"},
    "mkl-avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"},
    "mkl-compatible": {"MKL_CBWR": "COMPATIBLE"},
    # the nearest this machine comes to an AVX2-only CPU: torch, MKL and numpy all kept to AVX2
    "all-avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "NPY_DISABLE_CPU_FEATURES": " ".join(
        ["AVX512F", "AVX512CD", "AVX512VPOPCNTDQ", "AVX512VL", "AVX512BW", "AVX512DQ", "AVX512VNNI", "AVX512IFMA",
         "AVX512VBMI", "AVX512VBMI2", "AVX512BITALG", "AVX512BF16", "AVX512_SKX", "X86_V4", "AVX512_CLX",
         "AVX512_CNL", "AVX512_ICL"])},
}
THREADS = {"threads-2": 2}
SEEDS = {f"seed-{s}": s for s in (1, 2, 3)}


def run_variants(out: Path, only: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    plan = ([(n, env, 0, 1) for n, env in KERNELS.items()] + [(n, {}, 0, t) for n, t in THREADS.items()]
            + [(n, {}, s, 1) for n, s in SEEDS.items()])
    for name, env, seed, threads in plan:
        if only and name not in only or (out / f"{name}.json").exists():
            continue
        cap = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                             env={**os.environ, **env}, capture_output=True, text=True, check=True).stdout.strip()
        print(f"{name}: capability {cap}", flush=True)
        subprocess.run([sys.executable, "-m", "tests.golden_runs", "--seed", str(seed), "--threads", str(threads),
                        "--out", str(out / f"{name}.tmp")], env={**os.environ, **env}, cwd=ROOT, check=True)
        data = json.loads((out / f"{name}.tmp").read_text())
        (out / f"{name}.json").write_text(json.dumps({"capability": cap, "env": env, "seed": seed,
                                                      "threads": threads, "runs": data}))
        (out / f"{name}.tmp").unlink()


def recorded() -> dict:
    runs = {p.stem: json.loads(p.read_text()) for p in GOLDEN.glob("*.json") if p.stem != "fingerprint"}
    return {"sweep" if k == "sweep" else k: v for k, v in runs.items()}


def table(out: Path) -> str:
    want = recorded()
    rows: dict[str, dict[str, float]] = {}
    variants = sorted(out.glob("*.json"))
    for f in variants:
        v = json.loads(f.read_text())
        col = f.stem
        for run, result in v["runs"].items():
            he = run.endswith(("ckks", "paillier"))
            ref = dict(leaves(want[run]))
            for path, x in leaves(result):
                if path not in ref:
                    continue
                fam = family(path, he)
                d = abs(x - ref[path]) if x == x and ref[path] == ref[path] else (0.0 if x != x and ref[path] != ref[
                    path] else float("inf"))
                cell = rows.setdefault(fam, {})
                cell[col] = max(cell.get(col, 0.0), d)
    cols = [f.stem for f in variants]
    caps = {f.stem: json.loads(f.read_text())["capability"] for f in variants}
    lines = ["| field family | " + " | ".join(f"{c} ({caps[c]})" for c in cols) + " |",
             "|---|" + "---|" * len(cols)]
    for fam in sorted(rows):
        lines.append(f"| {fam} | " + " | ".join(f"{rows[fam].get(c, 0.0):.4f}" for c in cols) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("run", "table"))
    ap.add_argument("--out", default="runs/spread")
    ap.add_argument("--only", nargs="*", default=[])
    args = ap.parse_args()
    if args.what == "run":
        run_variants(Path(args.out), args.only)
    print(table(Path(args.out)))


if __name__ == "__main__":
    main()
