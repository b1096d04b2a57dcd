"""Child processes and scratch files that must not outlive the process that owns them (standard
library only: imported by freshly spawned workers before anything heavy).

- :func:`die_with_parent`: ``PR_SET_PDEATHSIG`` (Linux) — the kernel kills the child when the thread
  that started it exits. Right for sweep workers, started by the sweep's main thread.
- :func:`watch_parent`: a daemon thread in the child that exits it once its parent is gone (it is
  re-parented). For pools started from a short-lived thread (the Paillier key holder's workers,
  created by whichever party thread decrypts first), where the death signal would fire too early.
- :func:`remove_when_gone`: a tiny watchdog process that deletes a scratch directory when the owner
  dies, however it dies (``kill -9`` skips ``atexit``): it waits for EOF on a pipe only the owner holds.
- :func:`spawn_pool`: a ``spawn`` process pool whose children do not import the caller's main module.
  A ``spawn`` child imports the parent's ``__main__`` before its first task: a user's script that wraps
  the CLI without an ``if __name__ == "__main__":`` guard then ran again in every child (the PSI's,
  Paillier's or a sweep's workers), each starting a party that waits for a handshake, and the parent
  waited on its workers forever. Our tasks live in importable modules, so every process of the pool
  is started at once, while the parent's ``sys.modules["__main__"]`` is a stand-in with no file and no
  spec.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from multiprocessing import get_context
from typing import Any


def die_with_parent(parent: int) -> None:
    """Linux: ask the kernel to kill this process when its parent dies, however it dies (kill -9
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


def watch_parent(parent: int, interval: float = 0.5) -> None:
    """Exit this process (without cleanup: it holds secrets, nothing to save) within ``interval``
    seconds of its parent's death."""
    if os.getppid() != parent:
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        os._exit(1)

    threading.Thread(target=watch, name="watch-parent", daemon=True).start()


_CLEANER = "import shutil, sys; sys.stdin.buffer.read(); shutil.rmtree(sys.argv[1], ignore_errors=True)"
_WATCHDOGS: list[subprocess.Popen] = []


def remove_when_gone(path: str) -> None:
    """Delete ``path`` (a directory) once this process has exited, normally or killed: a watchdog
    process blocks on a pipe whose only writer is this process; the kernel closes it at our death."""
    try:
        proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _CLEANER, path], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True,
                                start_new_session=True)  # not in our process group: a group kill spares it
    except OSError:  # no interpreter to start: atexit's cleanup still covers a normal exit
        return
    _WATCHDOGS.append(proc)  # keep the pipe's write end open for our lifetime


@contextmanager
def _stand_in_main() -> Iterator[None]:
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")  # no __file__, no __spec__: the child imports nothing
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _ready() -> bool:
    return True


def spawn_pool(workers: int, initializer: Callable[..., Any] | None = None,
               initargs: tuple = ()) -> ProcessPoolExecutor:
    """A ``spawn`` pool of ``workers`` processes, all started now, none importing the caller's
    ``__main__`` (tasks and ``initializer`` must live in importable modules)."""
    pool = ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=initializer,
                               initargs=initargs)
    # a spawn pool starts its processes one by one as tasks come (CPython's executor); marked as a fork
    # pool is (its own attribute, CPython 3.11+; 3.10 starts them all anyway), it starts them all at its
    # first task: here
    pool._safe_to_dynamically_spawn_children = False  # type: ignore[attr-defined]
    with _stand_in_main():
        pool.submit(_ready).result()
    return pool
