"""In-process transport: per-(src, dst, kind) FIFO queues of bytes.

Parties may run as threads of one process (:mod:`securevfl.runtime`, one thread per party): then the
channel runs them in *lockstep*. One party's thread runs at a time, and the turn passes only when it
waits for a message that has not been sent yet, to the first party (in the order they joined) that
can go on. A run is therefore as deterministic as one program, whatever the OS scheduler does: two
parties never draw from torch's process-wide generator at once, and the transcript's order is fixed.
When every party waits and no awaited message exists, no party can ever go on: each gets a
:class:`ProtocolError` that names what every party was waiting for (a deadlock is an error, not a hang)."""

from __future__ import annotations

import threading
from collections import defaultdict, deque

from securevfl.channel.base import ABANDON, Channel, MessageKind, StepAbandoned
from securevfl.errors import ProtocolError


class InMemoryChannel(Channel):
    def __init__(self, record: bool = False) -> None:
        super().__init__(record)
        self._queues: dict[tuple[str, str, str], deque[bytes]] = defaultdict(deque)
        self._cond = threading.Condition()
        self._party_of: dict[int, str] = {}  # thread id → the party it runs (lockstep only)
        self._order: list[str] = []
        self._turn: str | None = None
        self._waiting: dict[str, tuple[str, str, str]] = {}  # party → (src, dst, kind) it waits for
        self._done: set[str] = set()
        self._broken: str | None = None

    # ---------------------------------------------------------------- lockstep (parties as threads)
    def lockstep(self, parties: list[str]) -> None:
        """From now on ``parties`` run as threads, in lockstep; the first holds the turn, and the turn
        goes to the first of them (in this order) that can go on."""
        with self._cond:
            self._order, self._turn, self._done, self._broken = list(parties), parties[0], set(), None

    def join(self, party: str) -> None:
        """The calling thread runs ``party`` (one of :meth:`lockstep`'s) from now on."""
        with self._cond:
            self._party_of[threading.get_ident()] = party

    def abort(self, reason: str) -> None:
        """A party failed: every party waiting on this channel gets a ProtocolError with ``reason``."""
        with self._cond:
            self._broken = reason
            self._cond.notify_all()

    def wait_turn(self) -> None:
        """Block until the calling thread's party holds the turn (its thread's first step)."""
        with self._cond:
            me = self._party_of[threading.get_ident()]
            while self._turn != me and self._broken is None:
                self._cond.wait()
            if self._broken is not None:
                raise ProtocolError(self._broken)

    def leave(self) -> None:
        """The calling thread's party has finished (or failed): the turn passes on."""
        with self._cond:
            me = self._party_of.pop(threading.get_ident(), None)
            if me is None:
                return
            self._done.add(me)
            self._waiting.pop(me, None)
            if self._turn == me:
                self._pass_turn()
            if not self._party_of:  # the last party left: the channel is plain in-memory again
                self._order, self._turn, self._done, self._broken = [], None, set(), None

    def _runnable(self, party: str) -> bool:
        if party in self._done:
            return False
        want = self._waiting.get(party)
        return want is None or bool(self._queues.get(want)) or self._abandoned(*want)

    def _abandoned(self, src: str, dst: str, kind: str) -> bool:
        """Whether ``src`` abandoned the step ``dst`` waits on (its next control message says so)."""
        q = self._queues.get((src, dst, MessageKind.CONTROL))
        return kind != MessageKind.CONTROL and q is not None and len(q) > 0 and q[0] == ABANDON

    def _pass_turn(self) -> None:
        nxt = next((p for p in self._order if self._runnable(p)), None)
        if nxt is None and any(p not in self._done for p in self._order):
            waits = "; ".join(f"{p} waited for a {k!r} message from {s}" + (f" (as {d})" if d != p else "")
                              for p, (s, d, k) in self._waiting.items())
            self._broken = f"no party can go on: {waits}"
        self._turn = nxt
        self._cond.notify_all()

    # ---------------------------------------------------------------- transport
    def _deliver(self, src: str, dst: str, kind: str, payload: bytes) -> None:
        with self._cond:
            self._queues[(src, dst, kind)].append(payload)

    def recv(self, dst: str, src: str, kind: str) -> bytes:
        with self._cond:
            me = self._party_of.get(threading.get_ident())
            q = self._queues.get((src, dst, kind))
            if me is None and not q and self._abandoned(src, dst, kind):
                self._queues[(src, dst, MessageKind.CONTROL)].popleft()
                raise StepAbandoned(f"{src} abandoned the step")
            if me is None:  # one program drives every party: a missing message is a bug in that program
                if not q:
                    raise ProtocolError(f"{dst} waited for a {kind!r} message from {src}, none was sent")
                return q.popleft()
            key = (src, dst, kind)
            while not self._queues.get(key):
                if self._broken is not None:
                    raise ProtocolError(self._broken)
                if self._abandoned(*key) and self._turn == me:
                    self._queues[(src, dst, MessageKind.CONTROL)].popleft()
                    self._waiting.pop(me, None)
                    raise StepAbandoned(f"{src} abandoned the step")
                self._waiting[me] = key
                if self._turn == me:
                    self._pass_turn()
                    continue  # the deadlock check may have broken the run
                self._cond.wait()
            self._waiting.pop(me, None)
            while self._turn != me and self._broken is None:  # a message arrived: wait for the turn
                self._cond.wait()
            if self._broken is not None and self._turn != me:
                raise ProtocolError(self._broken)
            return self._queues[key].popleft()

    def pending(self) -> int:
        return sum(len(q) for q in self._queues.values())
