"""Private set intersection over the channel: a mutual, streaming, parallel Diffie–Hellman PSI.

The protocol (Huberman–Franklin–Hogg 1999; the ECDH-PSI of SecretFlow and FATE), between two parties A
and B with secret exponents a and b, run symmetrically so that both learn the intersection (issue 54:
a passive party holds its own result and checks every ID the active party announces against it):

1. each sends its set size and a random nonce; the run's nonce is the hash of both, and both split
   their IDs into the same buckets by a keyed hash of the ID (:func:`securevfl.ecdh.buckets_of`);
2. per bucket, each sends ``H(x)^a`` for its IDs, padded with blinded random points to a size fixed by
   its set size alone (:func:`securevfl.ecdh.padded_size`) and shuffled;
3. each raises the peer's bucket to its own exponent and sends back the first 16 bytes of every
   ``H(y)^ba``, in the peer's order;
4. each compares the digests of its own points (received) with those of the peer's (computed): its own
   IDs whose digest appears are the intersection.

What each side learns (docs/threat-model.md, "What PSI reveals"): the intersection and the size of the
peer's set, nothing else about the peer's IDs under DDH (the padding hides how the peer's IDs fall into
buckets). A party may lie about its own set — as in any PSI, it can claim IDs it does not hold — but it
cannot make the other party's result include an ID that party does not hold.

Scale (issue 53): buckets of about :data:`BUCKET_TARGET` IDs stream over the channel with at most
:data:`WINDOW` of each party's buckets in flight, so memory grows with the window, not with the peer's
set; the exponentiations run on the party's cores (:class:`Workers`). ``benchmarks/psi_scale.py``
measures IDs/s. The messages cross the channel as bytes under kind ``alignment``, so their cost is
counted. The primitive is X25519 from ``cryptography``; openmined-psi (P-256, one call for a whole set,
one-way output) was replaced because it neither streams nor gives both sides a result, at 4,650 IDs/s
per core against this protocol's 9,000 IDs/s per core for both sides' results (RESULTS, "PSI at scale").
"""

from __future__ import annotations

import hashlib
import os
from collections import deque
from collections.abc import Callable

import numpy as np

from securevfl import ecdh
from securevfl.channel import Endpoint, MessageKind
from securevfl.errors import UserError
from securevfl.ids import intersect, sorted_copy
from securevfl.procs import spawn_pool
from securevfl.progress import progress_bar

NAME = "x25519-dh-psi/1"
BUCKET_TARGET = 1 << 15
"""IDs per bucket (the larger set's): 32,768 IDs are 1 MiB of points, streamed one bucket at a time."""
WINDOW = 4
"""Buckets a party sends ahead of the ones it has finished."""
CHUNK = 2048
"""IDs per task of a worker process (16 to a bucket: the workers finish a bucket within a task of each other)."""
BAR_MIN = 8
"""Buckets (≈ 260,000 IDs) from which a PSI shows its progress."""
POOL_MIN = 50_000
"""Sets smaller than this are exponentiated in this process (a worker process takes ≈ 0.3 s to start)."""
MAX_IDS = 1 << 34
MAX_PADDING = 1 << 20
"""The padding a peer's announced set size may cost this party beyond twice its own set (a minute of
one core): more is refused, so a peer cannot make a small party exponentiate without end."""
_BLIND, _ANSWER = b"B", b"A"


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (not on Linux)
        return os.cpu_count() or 1


class Workers:
    """Where the exponentiations run: in this process (``n == 1``) or in ``n`` spawned worker processes
    that import :mod:`securevfl.ecdh` only (spawned, not forked: a forked gRPC or torch process is not safe)."""

    def __init__(self, n: int = 1) -> None:
        self.n = max(1, int(n))
        self._pool = spawn_pool(self.n) if self.n > 1 else None

    @classmethod
    def for_size(cls, n_ids: int, n: int | None = None) -> Workers:
        """``SECUREVFL_PSI_WORKERS`` or this process's cores, for a set of at least :data:`POOL_MIN` IDs."""
        if n is None:
            given = os.environ.get("SECUREVFL_PSI_WORKERS", "").strip()
            if given and not (given.isdigit() and int(given) >= 1):
                raise UserError(f"SECUREVFL_PSI_WORKERS={given!r}: expected a whole number of processes, at least 1")
            n = int(given) if given else cores()
        return cls(n if n_ids >= POOL_MIN else 1)

    def map(self, fn: Callable[..., bytes], calls: list[tuple]) -> list[bytes]:
        return self.run([(fn, c) for c in calls])

    def run(self, tasks: list[tuple[Callable[..., bytes], tuple]]) -> list[bytes]:
        """Each ``(fn, args)`` of ``tasks``, all in flight at once (no barrier between kinds), in order."""
        if self._pool is None or len(tasks) < 2:
            return [fn(*args) for fn, args in tasks]
        pool = self._pool
        return [f.result() for f in [pool.submit(fn, *args) for fn, args in tasks]]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _split(n: int) -> list[tuple[int, int]]:
    return [(i, min(i + CHUNK, n)) for i in range(0, n, CHUNK)]


class MutualPSI:
    """One party's side of the mutual PSI with one peer, as a state machine over messages (bytes): the
    same object drives the in-process simulator (:func:`mutual_psi_local`) and a deployed party
    (:func:`mutual_psi`). Each message is tagged: ``B`` + bucket (blinded IDs) or ``A`` + bucket (the
    peer's points, blinded again, as digests)."""

    def __init__(self, ids: np.ndarray, peer: str, workers: Workers | None = None,
                 target: int = BUCKET_TARGET) -> None:
        self.ids, self.peer, self.target = np.asarray(ids), peer, target
        self.workers = workers or Workers(1)
        self._key, self._nonce = ecdh.new_key(), os.urandom(16)
        self._rng = np.random.default_rng(int.from_bytes(os.urandom(16), "little"))
        self._slots: dict[int, np.ndarray] = {}  # bucket → own row per shuffled slot (−1: padding)
        self._theirs: dict[int, np.ndarray] = {}  # bucket → digests of the peer's points, raised again
        self._mine: dict[int, np.ndarray] = {}  # bucket → digests of this party's points, from the peer
        self._found: list[np.ndarray] = []
        self._sent = self._finished = self._next_blind = self._next_answer = 0

    # ------------------------------------------------------------------ set-up
    def hello(self) -> dict:
        return {"psi": NAME, "n": len(self.ids), "nonce": self._nonce.hex()}

    def agree(self, theirs: object) -> None:
        """Take the peer's hello: the run's nonce, the bucket count and both padded sizes."""
        if not (isinstance(theirs, dict) and theirs.get("psi") == NAME):
            got = theirs.get("psi") if isinstance(theirs, dict) else type(theirs).__name__
            raise UserError(f"{self.peer} speaks another PSI ({got!r}, this party: {NAME}); is it an older securevfl?")
        n, nonce = theirs.get("n"), theirs.get("nonce")
        if not (isinstance(n, int) and 0 <= n <= MAX_IDS and isinstance(nonce, str) and len(nonce) == 32):
            raise UserError(f"{self.peer} sent a malformed PSI hello (set size {n!r}, nonce {nonce!r})")
        self.n_peer = n
        self.nonce = hashlib.sha256(b"".join(sorted([self._nonce, bytes.fromhex(nonce)]))).digest()
        self.n_buckets = ecdh.bucket_count(len(self.ids), n, self.target)
        self.size_own = ecdh.padded_size(len(self.ids), self.n_buckets)
        self.size_peer = ecdh.padded_size(n, self.n_buckets)
        spans = _split(len(self.ids))
        parts = self.workers.map(ecdh.buckets_bytes, [(self.nonce, self.n_buckets, self.ids[a:b]) for a, b in spans])
        bucket = np.frombuffer(b"".join(parts), dtype=np.uint32)
        self._order = np.argsort(bucket, kind="stable")
        self._bounds = np.searchsorted(bucket[self._order], np.arange(self.n_buckets + 1))
        padded = self.n_buckets * self.size_own
        if padded > 2 * len(self.ids) + MAX_PADDING:  # a peer's huge set size would make this party pad for it
            raise UserError(f"{self.peer} announced {n:,} IDs, which would make this party pad its {len(self.ids):,} "
                            f"to {padded:,} blinded points; refused (a peer's set at most "
                            f"{MAX_PADDING:,} points of padding away)")
        fullest = int(np.diff(self._bounds).max(initial=0))
        if fullest > self.size_own:  # probability < n_buckets · 2^-40
            raise UserError(f"PSI: a bucket holds {fullest} IDs, over its padded size {self.size_own}; run again "
                            "(a fresh nonce redraws the buckets)")

    @property
    def done(self) -> bool:
        return self._finished == self.n_buckets

    @property
    def finished(self) -> int:
        """Buckets compared so far."""
        return self._finished

    # ------------------------------------------------------------------ messages
    def start(self) -> list[bytes]:
        """The first :data:`WINDOW` buckets of blinded IDs."""
        return [self._blinded() for _ in range(min(WINDOW, self.n_buckets))]

    def handle(self, msg: bytes) -> list[bytes]:
        """The messages to send after receiving ``msg`` from the peer."""
        tag, j, body = msg[:1], int.from_bytes(msg[1:5], "little"), msg[5:]
        if tag == _BLIND and j == self._next_blind < self.n_buckets:
            self._next_blind += 1
            if len(body) != self.size_peer * ecdh.POINT:
                raise UserError(f"{self.peer} sent PSI bucket {j} of {len(body)} bytes, not its padded size "
                                f"{self.size_peer} × {ecdh.POINT}")
            digests = self._raise(body)
            self._theirs[j] = np.frombuffer(digests, dtype=f"S{ecdh.DIGEST}")
            return [_ANSWER + j.to_bytes(4, "little") + digests, *self._complete(j)]
        if tag == _ANSWER and j == self._next_answer < self._sent:
            self._next_answer += 1
            if len(body) != self.size_own * ecdh.DIGEST:
                raise UserError(f"{self.peer} answered PSI bucket {j} with {len(body)} bytes, not "
                                f"{self.size_own} × {ecdh.DIGEST}")
            self._mine[j] = np.frombuffer(body, dtype=f"S{ecdh.DIGEST}")
            return self._complete(j)
        raise UserError(f"{self.peer} sent a PSI message out of order ({tag!r}, bucket {j}); its stream is broken")

    def result(self) -> np.ndarray:
        """This party's IDs in the intersection, sorted."""
        if not self.done:
            raise UserError(f"the PSI with {self.peer} ended after {self._finished} of {self.n_buckets} buckets")
        rows = np.concatenate(self._found) if self._found else np.zeros(0, dtype=np.int64)
        return np.sort(self.ids[rows])

    # ------------------------------------------------------------------ the work
    def _blinded(self) -> bytes:
        j = self._sent
        self._sent += 1
        rows = self._order[self._bounds[j]:self._bounds[j + 1]]
        ids, pad = self.ids[rows], self.size_own - len(rows)
        tasks: list[tuple[Callable[..., bytes], tuple]] = [
            (ecdh.blind_ids, (self._key, self.nonce, ids[a:b])) for a, b in _split(len(ids))]
        tasks += [(ecdh.blind_random, (self._key, b - a)) for a, b in _split(pad)]
        parts = self.workers.run(tasks)
        points = np.frombuffer(b"".join(parts), dtype=f"V{ecdh.POINT}")
        perm = self._rng.permutation(self.size_own)
        slot_rows = np.concatenate([rows, np.full(pad, -1, dtype=np.int64)])
        self._slots[j] = slot_rows[perm]
        return _BLIND + j.to_bytes(4, "little") + points[perm].tobytes()

    def _raise(self, points: bytes) -> bytes:
        spans = _split(len(points) // ecdh.POINT)
        calls = [(self._key, points[a * ecdh.POINT:b * ecdh.POINT], ecdh.DIGEST) for a, b in spans]
        try:
            return b"".join(self.workers.map(ecdh.reblind, calls))
        except ecdh.BadPoint as e:
            raise UserError(f"{self.peer} sent a PSI point no honest party sends ({e})") from e

    def _complete(self, j: int) -> list[bytes]:
        if j not in self._theirs or j not in self._mine:
            return []
        hit = np.isin(self._mine.pop(j), self._theirs.pop(j))
        rows = self._slots.pop(j)[hit]
        self._found.append(rows[rows >= 0])
        self._finished += 1
        return [self._blinded()] if self._sent < self.n_buckets else []


def mutual_psi(endpoint: Endpoint, peer: str, own_ids: np.ndarray, workers: Workers | None = None,
               target: int = BUCKET_TARGET) -> np.ndarray:
    """This party's side of the mutual PSI with ``peer`` in another process: the intersection, as its IDs."""
    own = workers is None
    workers = workers or Workers.for_size(len(own_ids))
    try:
        s = MutualPSI(own_ids, peer, workers, target)
        if endpoint.party < peer:  # ("active" first: a served party speaks once its client has)
            endpoint.send_json(peer, MessageKind.ALIGNMENT, s.hello())
            s.agree(endpoint.recv_json(peer, MessageKind.ALIGNMENT))
        else:
            theirs = endpoint.recv_json(peer, MessageKind.ALIGNMENT)
            endpoint.send_json(peer, MessageKind.ALIGNMENT, s.hello())
            s.agree(theirs)
        # a bar (a line every interval off a terminal) once the run is long enough to want one
        bar = progress_bar(s.n_buckets, f"PSI with {peer}", enabled=None if s.n_buckets >= BAR_MIN else False,
                           unit="bucket")
        try:
            for m in s.start():
                endpoint.send(peer, MessageKind.ALIGNMENT, m)
            while not s.done:
                before = s.finished
                for m in s.handle(endpoint.recv(peer, MessageKind.ALIGNMENT)):
                    endpoint.send(peer, MessageKind.ALIGNMENT, m)
                bar.update(s.finished - before)
        finally:
            bar.close()
        return s.result()
    finally:
        if own:
            workers.close()


def mutual_psi_local(a: Endpoint, b: Endpoint, ids_a: np.ndarray, ids_b: np.ndarray,
                     target: int = BUCKET_TARGET) -> tuple[np.ndarray, np.ndarray]:
    """Both sides of the mutual PSI in one process (the simulator), every message through the channel."""
    return drive_local(a, b, MutualPSI(ids_a, b.party, target=target), MutualPSI(ids_b, a.party, target=target))


def drive_local(a: Endpoint, b: Endpoint, sa: MutualPSI, sb: MutualPSI) -> tuple[np.ndarray, np.ndarray]:
    """Run two sessions to the end in turn, in this thread (:func:`mutual_psi_local`)."""
    a.send_json(b.party, MessageKind.ALIGNMENT, sa.hello())
    b.send_json(a.party, MessageKind.ALIGNMENT, sb.hello())
    sb.agree(b.recv_json(a.party, MessageKind.ALIGNMENT))
    sa.agree(a.recv_json(b.party, MessageKind.ALIGNMENT))
    to_b, to_a = deque(sa.start()), deque(sb.start())
    while to_b or to_a:
        if to_b:
            a.send(b.party, MessageKind.ALIGNMENT, to_b.popleft())
            to_a.extend(sb.handle(b.recv(a.party, MessageKind.ALIGNMENT)))
        if to_a:
            b.send(a.party, MessageKind.ALIGNMENT, to_a.popleft())
            to_b.extend(sa.handle(a.recv(b.party, MessageKind.ALIGNMENT)))
    return sa.result(), sb.result()


def plain_intersection(id_sets: list[np.ndarray]) -> np.ndarray:
    """The non-private fallback (only when explicitly requested)."""
    out = np.asarray(id_sets[0])
    for ids in id_sets[1:]:
        out = intersect(out, ids)
    return sorted_copy(out)  # sorted already after an intersection: then no copy


def align_with(endpoint: Endpoint, peers: list[str], own_ids: np.ndarray, mode: str) -> np.ndarray:
    """The active party's side of aligning with passive parties in other processes: the mutual PSI with
    each (``mode`` ``psi``; ``plain``: each sends its ID list in the clear), then the intersection of all,
    which it announces to each (kind ``alignment``)."""
    theirs = []
    with Workers.for_size(len(own_ids)) as workers:
        for name in peers:
            if mode == "plain":
                theirs.append(endpoint.recv_ids(name, MessageKind.ALIGNMENT))
            else:
                theirs.append(_psi_with(endpoint, name, own_ids, workers))
    aligned = plain_intersection([own_ids, *theirs])
    if len(aligned):
        for name in peers:
            endpoint.send_ids(name, MessageKind.ALIGNMENT, aligned)
    return aligned


def align_to(endpoint: Endpoint, active: str, own_ids: np.ndarray, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """A passive party's side of :func:`align_with`: the mutual PSI (or its ID list), then the aligned IDs.

    Returns:
        (the aligned IDs the active party announced, the IDs this party may align on by its own
        account: its PSI intersection with the active party; under ``plain`` its own IDs, since it
        does not see the active party's)."""
    if mode == "plain":
        endpoint.send_ids(active, MessageKind.ALIGNMENT, own_ids)
        own_result = np.asarray(own_ids)
    else:
        own_result = _psi_with(endpoint, active, own_ids)
    return endpoint.recv_ids(active, MessageKind.ALIGNMENT), own_result


def engine_of(endpoint: Endpoint, peer: str) -> str:
    """The PSI engine this party runs with ``peer`` (``--psi``; x25519 on a channel without engines)."""
    contact = endpoint.psi_contact(peer)
    return "x25519" if contact is None else str(contact.engine)


def _psi_with(endpoint: Endpoint, peer: str, own_ids: np.ndarray, workers: Workers | None = None) -> np.ndarray:
    """The PSI with ``peer`` by this party's engine: the X25519 PSI here, or an OT-based one (otpsi.py)."""
    contact = endpoint.psi_contact(peer)
    if contact is None or contact.engine == "x25519":
        return mutual_psi(endpoint, peer, own_ids, workers)
    from securevfl.data.otpsi import ot_psi

    return ot_psi(endpoint, peer, own_ids, contact)
