"""In-process transport: per-(src, dst, kind) FIFO queues of bytes."""

from __future__ import annotations

from collections import defaultdict, deque

from securevfl.channel.base import Channel
from securevfl.errors import ProtocolError


class InMemoryChannel(Channel):
    def __init__(self, record: bool = False) -> None:
        super().__init__(record)
        self._queues: dict[tuple[str, str, str], deque[bytes]] = defaultdict(deque)

    def _deliver(self, src: str, dst: str, kind: str, payload: bytes) -> None:
        self._queues[(src, dst, kind)].append(payload)

    def recv(self, dst: str, src: str, kind: str) -> bytes:
        q = self._queues.get((src, dst, kind))
        if not q:
            raise ProtocolError(f"{dst} waited for a {kind!r} message from {src}, none was sent")
        return q.popleft()

    def pending(self) -> int:
        return sum(len(q) for q in self._queues.values())
