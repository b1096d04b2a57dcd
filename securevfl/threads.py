"""Thread-count policy: how many threads each process's torch / OpenMP / BLAS may use.

torch defaults to one intra-op thread per core. That is wrong twice for this library's workloads:
(1) several processes (sweep workers, a test run beside other jobs) each taking every core
oversubscribe the machine, and OpenMP's spin-waiting then burns CPU without progress (the fast
suite once took 13× longer, with ≈ 4× the CPU time, on a loaded 2-core machine); (2) the steps are
small (a tabular MLP step is a few MFLOP), so past a few threads the synchronisation costs more than
the parallel work saves (a one-worker sweep was 2× slower on 16 cores than on 2).

So a process first gets a *share* of the cores (:func:`configure`: the cores it may run on, minus
what other processes are already using by the load average, divided among the workers), and a
training run then uses at most as many threads as its work size justifies (:func:`fit_to_work`).
An explicit ``OMP_NUM_THREADS`` or ``SECUREVFL_THREADS`` in the environment wins over both.
"""

from __future__ import annotations

import math
import os

WORK_PER_THREAD = 6_000_000
"""Per-step work (batch × trainable parameters, a multiply-add count proxy) that one more thread
needs to pay for itself. Measured on the 2-core machine: a uci-credit split step (batch 128, 94k
parameters, 12M) runs 1.14× faster on 2 threads than on 1, Fashion-MNIST MLP halves (73M) 1.43×."""
MAX_THREADS = 4
"""Ceiling for one process: the models here are small, and intra-op parallelism of tiny GEMMs stops
paying after a few threads (a conservative bound: not measured on a many-core machine here)."""

_share: int | None = None


def _explicit() -> int | None:
    for var in ("SECUREVFL_THREADS", "OMP_NUM_THREADS"):
        v = os.environ.get(var, "").strip()
        if v.isdigit() and int(v) > 0:
            return int(v)
    return None


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity; the container's limit where one is set)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    try:  # cgroup v2 CPU quota (containers)
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()
        if quota != "max":
            n = min(n, max(1, math.floor(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, n)


def idle_cores(cores: int | None = None) -> int:
    """Cores not already busy with other processes (the 1-minute load average, rounded)."""
    cores = cores or available_cores()
    try:
        busy = os.getloadavg()[0]
    except (AttributeError, OSError):
        busy = 0.0
    return max(1, min(cores, cores - int(round(busy))))


def share_for(workers: int = 1, cores: int | None = None, idle: int | None = None) -> int:
    """Threads per process when ``workers`` processes divide the machine (pure: for tests)."""
    cores = cores or available_cores()
    idle = cores if idle is None else idle
    return max(1, min(MAX_THREADS, min(cores, idle) // max(1, workers)))


def threads_for_work(work: float, share: int) -> int:
    """Threads a step of ``work`` (batch × parameters) gets within a share (pure)."""
    return max(1, min(share, int(work // WORK_PER_THREAD) or 1))


def configure(workers: int = 1, *, load_aware: bool = True, share: int | None = None) -> int:
    """Set this process's thread share (torch intra-op, OpenMP, BLAS). The environment is left alone,
    so a user's ``OMP_NUM_THREADS`` stays the only explicit setting children inherit. Call once per
    process: CLI start, each sweep worker, the test session. ``share``: the count a parent already
    chose (sweep workers). Returns the share."""
    global _share
    share = _explicit() or share or share_for(workers, idle=idle_cores() if load_aware else None)
    _share = share
    try:  # numpy's BLAS and the OpenMP runtimes already loaded (the environment is read only at load)
        from threadpoolctl import threadpool_limits

        threadpool_limits(share)
    except ImportError:  # scikit-learn's dependency, so normally present
        pass
    import torch

    torch.set_num_threads(share)
    if not os.environ.get("SECUREVFL_HE_THREADS"):  # HE products and decryptions: the same share
        from securevfl.crypto.backend import set_he_threads

        set_he_threads(share)
    try:  # only settable before the first inter-op parallel call; the default is harmless then
        torch.set_num_interop_threads(max(1, min(2, share)))
    except RuntimeError:
        pass
    return share


def fit_to_work(work: float) -> int:
    """Set torch's intra-op threads for a run whose steps do ``work`` (batch × trainable parameters),
    within this process's share (set by :func:`configure`; torch's current count if never called)."""
    global _share
    import torch

    explicit = _explicit()
    if explicit is not None:  # the environment wins, also when it changed since configure() (tests)
        if explicit != torch.get_num_threads():
            torch.set_num_threads(explicit)
        return explicit
    if _share is None:  # never configured (library use): the count torch started with is the share
        _share = torch.get_num_threads()
    n = threads_for_work(work, _share)
    if n != torch.get_num_threads():
        torch.set_num_threads(n)
    return n


def workers_auto(cells: int | None = None, cores: int | None = None) -> int:
    """``--workers auto``: one worker per idle core (each then gets one thread: the cells' small steps
    gain more from running side by side than from intra-op threads), never more than the cells."""
    n = idle_cores(cores)
    return max(1, min(n, cells) if cells else n)
