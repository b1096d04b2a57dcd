"""The machine's fingerprint, as golden runs depend on it: CPU model and vector extensions, and where
importable torch's kernel capability, MKL and numpy's SIMD dispatch. ``.ci/run`` prints it first, so a
red run names the CPU it ran on (docs/install.md, "Golden runs on every CPU"). Needs no package."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path


def fingerprint() -> dict:
    info: dict = {"machine": platform.machine(), "python": platform.python_version(), "cores": os.cpu_count()}
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        lines = cpuinfo.read_text().splitlines()
        field = {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[:40])}
        flags = set(field.get("flags", "").split())
        info |= {"cpu": field.get("model name", platform.processor()), "vendor": field.get("vendor_id"),
                 "vector": [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in flags]}
    else:
        info["cpu"] = platform.processor()
    for var in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "NPY_DISABLE_CPU_FEATURES", "OPENBLAS_CORETYPE"):
        if os.environ.get(var):
            info.setdefault("env", {})[var] = os.environ[var]
    try:
        import torch

        info |= {"torch": torch.__version__, "torch_capability": torch.backends.cpu.get_cpu_capability(),
                 "mkl": torch.backends.mkl.is_available()}
    except ImportError:
        pass
    try:
        import numpy as np
        from numpy._core._multiarray_umath import __cpu_features__ as feats  # type: ignore[attr-defined]

        info |= {"numpy": np.__version__, "numpy_simd": max((f for f in ("AVX2", "AVX512F", "AVX512_SKX")
                                                              if feats.get(f)), default="baseline",
                                                             key=("AVX2", "AVX512F", "AVX512_SKX").index)}
    except ImportError:
        pass
    return info


if __name__ == "__main__":
    print("machine: " + json.dumps(fingerprint()), flush=True)
