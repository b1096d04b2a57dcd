import os

import numpy as np
import pytest

from securevfl import threads
from securevfl.config import RunConfig

# one thread share for the whole session, from the idle cores: on a machine other jobs load, the
# suite then slows by its share instead of oversubscribing (securevfl/threads.py)
# HE work stays on one core in tests (the threaded paths have their own tests): no worker pools
os.environ.setdefault("SECUREVFL_HE_THREADS", "1")
threads.configure()


@pytest.fixture
def digits_cfg() -> RunConfig:
    cfg = RunConfig(dataset="digits", method="splitnn", seed=0)
    cfg.train.epochs = 2
    return cfg


def write_idx(path, arr: np.ndarray) -> None:
    import struct

    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    with open(path, "wb") as f:
        f.write(struct.pack(">HBB", 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape))
        f.write(arr.tobytes())
