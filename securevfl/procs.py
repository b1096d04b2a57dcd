"""Child processes and scratch files that must not outlive the process that owns them (standard
library only: imported by freshly spawned workers before anything heavy).

- :func:`die_with_parent`: ``PR_SET_PDEATHSIG`` (Linux) — the kernel kills the child when the thread
  that started it exits. Right for sweep workers, started by the sweep's main thread.
- :func:`watch_parent`: a daemon thread in the child that exits it once its parent is gone (it is
  re-parented). For pools started from a short-lived thread (the Paillier key holder's workers,
  created by whichever party thread decrypts first), where the death signal would fire too early.
- :func:`remove_when_gone`: a tiny watchdog process that deletes a scratch directory when the owner
  dies, however it dies (``kill -9`` skips ``atexit``): it waits for EOF on a pipe only the owner holds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time


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
