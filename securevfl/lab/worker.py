"""Start-up of a sweep's worker processes, kept free of heavy imports.

A spawned worker imports the module of its initializer before running it; from here that is only
the standard library, so the worker arms its parent-death signal a fraction of a second after it
starts, before torch and the library are imported (several seconds, far more on a loaded machine).
A sweep killed while its workers start up then leaves none behind.
"""

from __future__ import annotations

import os


def die_with_parent(parent: int) -> None:
    """Linux: ask the kernel to kill this worker when the sweep process dies, however it dies (kill -9
    included), so no worker lives on as an orphan; elsewhere the pool's own shutdown does it."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def init_worker(share: int, parent: int) -> None:
    die_with_parent(parent)
    # several torch processes on few cores slow each other down badly unless each keeps to its share;
    # set once here, for every cell this worker runs
    from securevfl import threads

    threads.configure(share=share)
