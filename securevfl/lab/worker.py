"""Start-up of a sweep's worker processes, kept free of heavy imports.

A spawned worker imports the module of its initializer before running it; from here that is only
the standard library, so the worker arms its parent-death signal a fraction of a second after it
starts, before torch and the library are imported (several seconds, far more on a loaded machine).
A sweep killed while its workers start up then leaves none behind.
"""

from __future__ import annotations

from securevfl.procs import die_with_parent


def init_worker(share: int, parent: int) -> None:
    die_with_parent(parent)
    # several torch processes on few cores slow each other down badly unless each keeps to its share;
    # set once here, for every cell this worker runs
    from securevfl import threads

    threads.configure(share=share)
