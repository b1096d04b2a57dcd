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

# CI (CI=true) replays the same fuzz examples every run, so a red CI names a change, not a draw; a
# developer's run explores fresh examples (and a failure there becomes a deterministic test)
try:
    from hypothesis import settings as _hypothesis_settings

    _hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
    if os.environ.get("CI"):
        _hypothesis_settings.load_profile("ci")
except ImportError:  # hypothesis comes with the test extra; without it the fuzz tests fail to import anyway
    pass


@pytest.fixture
def one_torch_thread(monkeypatch):
    """Equality across runtimes is bit for bit only at a fixed thread count: the thread policy picks a
    share of the cores from the machine's load, and another reduction order is another float. The
    count is set before any party thread starts: torch's OpenMP pool reads it once per thread."""
    import torch

    before, share = torch.get_num_threads(), threads._share
    monkeypatch.setenv("SECUREVFL_THREADS", "1")  # subprocesses (a passive party's process) inherit it
    threads.configure()
    yield
    threads._share = share
    torch.set_num_threads(before)


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
