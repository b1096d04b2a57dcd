"""gRPC transport: the same :class:`~securevfl.channel.base.Channel` as the in-memory one, between
processes (and machines), mutual TLS by default.

Topology: every passive party *serves* (``securevfl party --listen``); the active party is a client
of each. The service has generic byte methods (no protoc, identity serializers):

``Stream(frames)``  both ways, one call per run: the active party's messages flow to the passive
                    party and the passive party's back on one bidirectional stream (HTTP/2), so a
                    send never waits for the network and a protocol step costs one round trip.
``Deliver(frame)``  active → passive: one message as a unary call (kept for tools and tests).
``Take(frame)``     active ← passive: long poll for one message of a kind (kept, as ``Deliver``).
``Abort(frame)``    either side tells the other why the run ends, so the other ends at once.

A frame is ``b"SVFL1" <B len> src <B len> kind`` then the payload. Under mutual TLS the claimed
``src`` must be the party name in the caller's certificate (SAN DNS name), and a server answers only
the party it was started for (the active party). A stream keeps its order, so each (src, dst, kind)
stays FIFO, as in memory.

Failures become :class:`~securevfl.errors.UserError` (one ``error:`` line): a peer that is down,
refuses the TLS handshake (foreign CA, wrong party name), goes away mid-run, sends nothing within
``timeout`` seconds, or sends a message over ``max_message_bytes`` (gRPC's own limit on both sides,
set to the same value). A malformed frame is refused with INVALID_ARGUMENT; the server stays up.

Over 600 lines (690) in one file because the server and client halves of one channel share its queues,
streams, heartbeats and abort handling.
"""

from __future__ import annotations

import json
import os
import queue
import struct
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("GRPC_VERBOSITY", "NONE")  # gRPC's C core logs every refused handshake to stderr
import grpc  # noqa: E402

from securevfl.channel.base import ABANDON, Channel, Contact, Message, MessageKind, StepAbandoned
from securevfl.errors import UserError

DOCTOR_PING = b"doctor:"
"""The prefix of a ``Ping`` that asks a party for its doctor's answer (securevfl/operations/doctor.py)."""

SERVICE = "securevfl.Channel"
MAGIC = b"SVFL1"
DEFAULT_TIMEOUT = 120.0
"""Seconds a party waits for a peer's next message (or its first answer) before it gives up: long
enough for a Paillier step on a large batch, short enough that a dead peer is noticed."""
DEFAULT_MAX_MESSAGE_BYTES = 256 * 2 ** 20
"""Largest message either side accepts (gRPC's send and receive limits). A CKKS batch of 2048 rows ×
64 slots is a few tens of MB; 256 MiB leaves room and still bounds a hostile peer."""
_POLL = 0.2  # seconds between checks of a waiting receive for an abort or a closed server
_ABORT = "\x00abort"  # a server's abort, queued on its client's stream behind what it sent before
HEARTBEAT = "heartbeat"
"""A frame a busy party sends its peers (payload: what it is doing); never queued as a message."""
HEARTBEAT_EVERY = 10.0
"""Seconds between heartbeats (at most a quarter of the timeout, so a working peer is never judged gone)."""


@dataclass(frozen=True)
class TLSFiles:
    """One party's TLS material, as ``securevfl certs`` writes it into that party's folder."""

    ca: bytes
    key: bytes
    cert: bytes

    @classmethod
    def load(cls, folder: str | Path, party: str) -> TLSFiles:
        d = Path(folder)
        paths = (d / "ca.pem", d / f"{party}.key", d / f"{party}.pem")
        for p in paths:
            if not p.is_file():
                raise UserError(f"--tls {folder}: no {p.name} (make the folder with: securevfl certs --parties ... "
                                "--out DIR, then copy DIR/" f"{party} to this machine)")
        return cls(*(p.read_bytes() for p in paths))


@dataclass(frozen=True)
class NetConfig:
    """How a party talks to its peers. ``tls=None`` is plaintext (``--insecure``)."""

    tls: TLSFiles | None
    timeout: float = DEFAULT_TIMEOUT
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    psi: str = "x25519"
    """This party's PSI engine (``--psi``; securevfl/data/otpsi.py): every peer must run the same."""

    def options(self) -> list[tuple[str, int | str]]:
        return [("grpc.max_send_message_length", self.max_message_bytes),
                ("grpc.max_receive_message_length", self.max_message_bytes)]


def pack_frame(src: str, kind: str, payload: bytes) -> bytes:
    s, k = src.encode(), kind.encode()
    return MAGIC + struct.pack("<B", len(s)) + s + struct.pack("<B", len(k)) + k + payload


def unpack_frame(frame: bytes) -> tuple[str, str, bytes]:
    """``(src, kind, payload)``; ``ValueError`` on anything that is not a whole frame."""
    if not frame.startswith(MAGIC):
        raise ValueError("not a securevfl frame")
    pos = len(MAGIC)
    fields = []
    for _ in range(2):
        if pos >= len(frame):
            raise ValueError("truncated frame")
        n = frame[pos]
        if pos + 1 + n > len(frame):
            raise ValueError("truncated frame")
        fields.append(frame[pos + 1:pos + 1 + n].decode("utf-8"))
        pos += 1 + n
    return fields[0], fields[1], frame[pos:]


def peer_names(context: grpc.ServicerContext) -> set[str]:
    """The party names the caller's verified certificate carries (SAN DNS names and CN)."""
    auth = context.auth_context()
    names = auth.get("x509_subject_alternative_name", []) + auth.get("x509_common_name", [])
    return {n.decode() for n in names}


class NetStats:
    """Per peer and phase (alignment, train, evaluate; the caller names it): protocol round trips — a
    receive from a peer after sending to it completes one, the latency any transport must pay — and
    the RPCs this transport made, each a network round trip of its own (every send is a synchronous
    call, which keeps the per-kind FIFO order; a streaming transport could pipeline them)."""

    def __init__(self) -> None:
        self.phase = "setup"
        self.round_trips: Counter = Counter()
        self.rpcs: Counter = Counter()
        self._last_sent: dict[str, bool] = defaultdict(bool)

    def rpc(self, peer: str) -> None:
        self.rpcs[(self.phase, peer)] += 1

    def sent(self, peer: str) -> None:
        self._last_sent[peer] = True

    def received(self, peer: str) -> None:
        if self._last_sent[peer]:
            self.round_trips[(self.phase, peer)] += 1
        self._last_sent[peer] = False


class GrpcChannel(Channel):
    """One party's side of the network channel (``party``): it sends as that party and receives what
    is addressed to it. A serving party (``listen``) queues what it receives and keeps its outgoing
    messages for its client to take; a client (``peers``: name → host:port) calls the servers.

    Stats count both directions of this party's own traffic (the peer's process counts its own)."""

    remote = True

    def __init__(self, party: str, net: NetConfig, *, listen: str | None = None, client: str | None = None,
                 peers: dict[str, str] | None = None, record: bool = False) -> None:
        super().__init__(record)
        self.party, self.net = party, net
        self.peers = dict(peers or {})
        self.client = client  # the one party a server answers (the active party)
        self.netstats = NetStats()
        # one queue per (peer, kind), made on first use by whichever thread comes first: the server's
        # handler threads and the party's own thread both reach for it, so it is made under a lock (a
        # defaultdict made two queues when both came at once, and the message put into the losing
        # one was never read: the rare deadlock of issue 41)
        self._inbox: dict[tuple[str, str], queue.Queue[bytes]] = {}
        self._outbox: dict[tuple[str, str], queue.Queue[bytes]] = {}
        self._boxes = threading.Lock()
        self._lock = threading.Lock()
        self._aborted: str | None = None  # the peer's reason, once it aborted
        self._idle = False  # a server between runs: a late abort of the last run is not the next run's
        self._server: grpc.Server | None = None
        self._stubs: dict[str, dict[str, grpc.UnaryUnaryMultiCallable]] = {}
        self._streams: dict[str, queue.Queue[bytes | None]] = {}  # client: the frames to send on each peer's stream
        self._stream_errors: dict[str, grpc.RpcError] = {}  # client: why a peer's stream ended
        self._stream_out: queue.Queue[tuple[str, bytes]] | None = None  # server: what the client's stream carries back
        self._stream_peer: str | None = None  # server: the address of the connection the run's stream came on
        self._closing = False
        self._channels: list[grpc.Channel] = []
        self.port: int | None = None
        self._heard: dict[str, tuple[float, str]] = {}  # peer → (when its last heartbeat came, what it was busy with)
        self._waiting = 0  # receives in progress (no heartbeat goes out meanwhile)
        self.doctor: Callable[[dict], dict] | None = None
        """A server's answer to a peer's ``securevfl doctor`` (securevfl/operations/doctor.py), set by its party."""
        if listen is not None:
            self._serve(listen)
        for name, addr in self.peers.items():
            self._connect(name, addr)

    def psi_contact(self, party: str, peer: str) -> Contact:
        """How this party's OT PSI engine reaches ``peer``'s (securevfl/data/otpsi.py): the host this channel
        talks to it on (a client: the ``--peer`` address; a server: the run's connection), this party's
        TLS files and timeout; its worker listens on loopback when the peer is on loopback."""
        if peer in self.peers:
            host = self.peers[peer].rsplit(":", 1)[0].strip("[]")
        else:  # "ipv4:10.0.0.2:51234" / "ipv6:[::1]:51234"
            where = (self._stream_peer or "ipv4:127.0.0.1:0").split(":", 1)[-1]
            host = where.rsplit(":", 1)[0].strip("[]")
        loopback = host in ("127.0.0.1", "::1", "localhost")
        return Contact(self.net.psi, host if loopback else ("::" if ":" in host else "0.0.0.0"),
                       host, self.net.tls, self.net.timeout)

    # ------------------------------------------------------------------ server side
    def _serve(self, listen: str) -> None:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=self.net.options())
        handlers = {name: grpc.unary_unary_rpc_method_handler(fn) for name, fn in
                    (("Deliver", self._on_deliver), ("Take", self._on_take), ("Abort", self._on_abort),
                     ("Ping", self._on_ping))}
        handlers["Stream"] = grpc.stream_stream_rpc_method_handler(self._on_stream)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        tls = self.net.tls
        try:  # gRPC raises RuntimeError (newer) or returns 0 (older) for a port in use or a host not here
            if tls is None:
                port = server.add_insecure_port(listen)
            else:
                creds = grpc.ssl_server_credentials([(tls.key, tls.cert)], root_certificates=tls.ca,
                                                    require_client_auth=True)
                port = server.add_secure_port(listen, creds)
        except RuntimeError:
            port = 0
        if port == 0:
            server.stop(None)
            raise UserError(f"--listen {listen}: cannot listen there (the port is in use, or the host is not an "
                            "address of this machine or does not resolve)")
        self.port = port
        server.start()
        self._server = server

    def _caller(self, frame: bytes, context: grpc.ServicerContext) -> tuple[str, str, bytes]:
        """The frame's fields, after checking who sent it; aborts the RPC (never the server) otherwise."""
        try:
            src, kind, payload = unpack_frame(frame)
        except (ValueError, UnicodeDecodeError) as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed message: {e}")
        if self.net.tls is not None and src not in peer_names(context):
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          f"certificate names {sorted(peer_names(context))}, message claims {src!r}")
        if self.client is not None and src != self.client:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, f"this party serves {self.client}, not {src}")
        return src, kind, payload

    def _on_deliver(self, frame: bytes, context: grpc.ServicerContext) -> bytes:
        src, kind, payload = self._caller(frame, context)
        self._put(src, kind, payload)
        return b""

    def _put(self, src: str, kind: str, payload: bytes) -> None:
        """A frame that arrived from ``src``: a heartbeat is noted, any other message queued."""
        if kind == HEARTBEAT:
            self._heard[src] = (time.monotonic(), payload.decode(errors="replace")[:200])
        else:
            self._box(self._inbox, (src, kind)).put(payload)

    def _on_take(self, frame: bytes, context: grpc.ServicerContext) -> bytes:
        src, kind, _ = self._caller(frame, context)
        deadline = time.monotonic() + self.net.timeout
        q = self._box(self._outbox, (src, kind))
        while context.is_active() and time.monotonic() < deadline:
            try:  # what was sent before an abort is still delivered (e.g. the error reply it follows)
                return q.get(timeout=_POLL)
            except queue.Empty:
                if self._aborted is not None:
                    context.abort(grpc.StatusCode.ABORTED, self._aborted)
        context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"{self.party} sent no {kind} message")
        raise AssertionError("unreachable: abort raises")

    def _on_stream(self, frames, context: grpc.ServicerContext):  # type: ignore[no-untyped-def]
        """One run's stream: what the client sends is queued per (src, kind) as it arrives (a thread
        reads it), and what this party sends to the client goes back on the same stream."""
        deadline = time.monotonic() + self.net.timeout
        while self._stream_out is not None and context.is_active():
            # a server still ending its previous run (sending its refusal, draining): this run's stream
            # starts once that run is reset, so nothing of it (its abort, its queues) reaches this one
            if time.monotonic() >= deadline:
                context.abort(grpc.StatusCode.UNAVAILABLE, f"{self.party} is still ending its previous run")
            time.sleep(_POLL / 4)
        out: queue.Queue[tuple[str, bytes]] = queue.Queue()
        self._stream_out = out
        self._stream_peer = context.peer()  # this run's connection: an abort from another is an earlier run's
        failed: list[tuple[grpc.StatusCode, str]] = []
        names = peer_names(context) if self.net.tls is not None else set()

        def read() -> None:
            try:
                for frame in frames:
                    try:
                        src, kind, payload = unpack_frame(frame)
                    except (ValueError, UnicodeDecodeError) as e:
                        failed.append((grpc.StatusCode.INVALID_ARGUMENT, f"malformed message: {e}"))
                        return
                    if self.net.tls is not None and src not in names:
                        failed.append((grpc.StatusCode.PERMISSION_DENIED,
                                       f"certificate names {sorted(names)}, message claims {src!r}"))
                        return
                    if self.client is not None and src != self.client:
                        failed.append((grpc.StatusCode.PERMISSION_DENIED,
                                       f"this party serves {self.client}, not {src}"))
                        return
                    self._put(src, kind, payload)
            except grpc.RpcError:  # the client went away mid-run (its process ended, or the network)
                if self._stream_out is out and not self._closing:
                    self._aborted = self._aborted or f"{self.client} closed the connection (its process ended?)"

        threading.Thread(target=read, daemon=True, name=f"securevfl-{self.party}-stream").start()
        while True:
            if failed:
                context.abort(*failed[0])
            if self._aborted is not None and out.empty():
                context.abort(grpc.StatusCode.ABORTED, self._aborted)
            try:
                kind, payload = out.get(timeout=_POLL)
            except queue.Empty:
                if not context.is_active():
                    return
                continue
            if kind == _ABORT:  # this stream's run ended here: its reason reaches the client even if the
                context.abort(grpc.StatusCode.ABORTED, payload.decode())  # server already reset for the next
            yield pack_frame(self.party, kind, payload)

    def _on_ping(self, frame: bytes, context: grpc.ServicerContext) -> bytes:
        _, _, payload = self._caller(frame, context)
        if payload.startswith(DOCTOR_PING) and self.doctor is not None:  # a peer's doctor asks about a run
            try:
                description = json.loads(payload[len(DOCTOR_PING):].decode())
                if not isinstance(description, dict):
                    raise ValueError("not a JSON object")
            except ValueError as e:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed doctor request: {e}")
            return json.dumps(self.doctor(description), default=str).encode()
        return b""

    def _on_abort(self, frame: bytes, context: grpc.ServicerContext) -> bytes:
        src, _, payload = self._caller(frame, context)
        if self._idle:  # the active party's abort of a run this server already ended (e.g. after its refusal)
            return b""
        if self._stream_peer is not None and context.peer() != self._stream_peer:
            return b""  # a late abort of an earlier run (another connection of the active party): not this run's
        self._aborted = f"{src} ended the run: {payload.decode(errors='replace')}"
        return b""

    # ------------------------------------------------------------------ client side
    def _connect(self, name: str, addr: str) -> None:
        tls, opts = self.net.tls, self.net.options()
        if tls is None:
            ch = grpc.insecure_channel(addr, options=opts)
        else:
            creds = grpc.ssl_channel_credentials(root_certificates=tls.ca, private_key=tls.key,
                                                 certificate_chain=tls.cert)
            # the peer's certificate must name the party we expect there (SAN DNS = party name)
            ch = grpc.secure_channel(addr, creds, options=[*opts, ("grpc.ssl_target_name_override", name)])
        self._channels.append(ch)
        self._stubs[name] = {m: ch.unary_unary(f"/{SERVICE}/{m}") for m in ("Deliver", "Take", "Abort", "Ping")}
        self._stubs[name]["Stream"] = ch.stream_stream(f"/{SERVICE}/Stream")  # type: ignore[assignment]

    def _stream(self, name: str) -> queue.Queue[bytes | None]:
        """The frames queue of this run's stream to ``name``, opened on first use (one RPC per run): a
        thread puts each frame the peer sends back into this party's inbox."""
        with self._lock:
            q = self._streams.get(name)
            if q is not None:
                return q
            q = self._streams[name] = queue.Queue()
        self.netstats.rpc(name)

        def frames():  # type: ignore[no-untyped-def]
            while (frame := q.get()) is not None:
                yield frame

        responses = self._stubs[name]["Stream"](frames())

        def read() -> None:
            try:
                for frame in responses:
                    _, kind, payload = unpack_frame(frame)
                    self._put(name, kind, payload)
            except grpc.RpcError as e:
                if not self._closing:
                    self._stream_errors[name] = e
            except ValueError as e:  # a peer that sends what is not a frame
                self._stream_errors[name] = e  # type: ignore[assignment]

        threading.Thread(target=read, daemon=True, name=f"securevfl-{self.party}-{name}").start()
        return q

    def _stream_failed(self, peer: str, what: str) -> None:
        """Raise the one-line error of ``peer``'s stream, if it ended."""
        e = self._stream_errors.get(peer)
        if e is None:
            return
        if isinstance(e, ValueError):
            raise UserError(f"malformed message from {peer} ({e})")
        raise UserError(describe_rpc_error(e, peer, self.peers.get(peer, "?"), what, self.net))

    def _call(self, peer: str, method: str, frame: bytes, what: str) -> bytes:
        self.netstats.rpc(peer)
        try:
            return self._stubs[peer][method](frame, timeout=self.net.timeout)
        except grpc.RpcError as e:
            raise UserError(describe_rpc_error(e, peer, self.peers.get(peer, "?"), what, self.net)) from None

    def wait_ready(self) -> None:
        """Block until every peer accepts a connection (TLS included), or fail with the reason."""
        for name in self.peers:
            self.wait_ready_peer(name)

    def wait_ready_peer(self, name: str, refused_for: float | None = None) -> None:
        """Block until peer ``name`` accepts a connection (TLS included), or fail with the reason.

        A refused connection (nothing listens there: a party still starting, a wrong port, a firewall
        that rejects) is said once on stderr at once, and waited out for ``refused_for`` seconds at most
        (None: the timeout; the doctor gives a few seconds, so a wrong port is reported in seconds)."""
        addr = self.peers[name]
        start = time.monotonic()
        deadline = start + self.net.timeout
        said = False
        while True:
            try:  # answers only once connected (TLS verified both ways) and this party is authorised
                self._stubs[name]["Ping"](pack_frame(self.party, "ping", b""), timeout=min(2.0, self.net.timeout))
                return
            except grpc.RpcError as e:
                retry = e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) \
                    and not _tls_failure(e)  # a refused handshake will not fix itself: say so at once
                refused = _refused(e)
                if refused and not said:
                    print(f"{self.party}: {name} at {addr} refuses connections (nothing listens there yet); "
                          "waiting for it — check that `securevfl party` runs there, the port, and the firewall",
                          file=sys.stderr, flush=True)
                    said = True
                end = min(deadline, start + refused_for) if refused and refused_for is not None else deadline
                if not retry or time.monotonic() >= end:
                    raise UserError(describe_rpc_error(e, name, addr, "connect", self.net)) from None
                time.sleep(_POLL)

    def ping(self, name: str, payload: bytes) -> bytes:
        """One ``Ping`` to ``name`` carrying ``payload`` (a doctor's question), its answer."""
        return self._call(name, "Ping", pack_frame(self.party, "ping", payload), "doctor")

    # ------------------------------------------------------------------ Channel
    def _check_size(self, dst: str, kind: str, payload: bytes) -> None:
        if len(payload) + 64 > self.net.max_message_bytes:
            raise UserError(f"a {kind} message of {len(payload)} bytes to {dst} exceeds the "
                            f"{self.net.max_message_bytes}-byte message limit (--max-message-mb)")

    def _deliver(self, src: str, dst: str, kind: str, payload: bytes) -> None:
        self._check_size(dst, kind, payload)
        self.netstats.sent(dst)
        if dst in self._stubs:  # onto the run's stream: the send does not wait for the network
            self._stream_failed(dst, f"send {kind}")
            self._stream(dst).put(pack_frame(src, kind, payload))
        elif (out := self._stream_out) is not None:  # we serve dst, which streams: back on its stream
            out.put((kind, payload))
        else:  # we serve dst: it takes the message with its next Take
            self._box(self._outbox, (dst, kind)).put(payload)

    def recv(self, dst: str, src: str, kind: str) -> bytes:
        self._waiting += 1  # a party waiting on a peer is not busy: no heartbeat says it is (two waiting
        try:  # parties would keep each other waiting forever)
            payload = self._wait_stream(src, kind) if src in self._stubs else self._wait_inbox(src, kind)
        finally:
            self._waiting -= 1
        return self._received(src, dst, kind, payload)

    def _received(self, src: str, dst: str, kind: str, payload: bytes) -> bytes:
        """Count (and record) a message this party received: its view, as in memory."""
        self.netstats.received(src)
        self.stats.add(kind, src, dst, len(payload))
        if self.record:
            self._seq += 1
            self.transcript.append(Message(self._seq, src, dst, kind, payload, len(payload)))
        return payload

    def _deadline(self, src: str, start: float) -> float:
        """When a wait on ``src`` that began at ``start`` gives up: the timeout after the later of the
        start and ``src``'s last heartbeat (a peer that says it is working is waited for)."""
        heard = self._heard.get(src)
        return max(start, heard[0] if heard else start) + self.net.timeout

    def _silent(self, src: str, start: float) -> str:
        """What a timed-out wait says of ``src``'s heartbeats (why it waited that long, if it did)."""
        heard = self._heard.get(src)
        if heard is None or heard[0] < start:
            return ""
        return (f"; it had said it was busy ({heard[1]}) until {time.monotonic() - heard[0]:.0f} s ago, then went "
                "silent: its process stopped or hangs, its own log says where")

    def _wait_inbox(self, src: str, kind: str) -> bytes:
        start = time.monotonic()
        q = self._box(self._inbox, (src, kind))
        while True:
            if self._aborted is not None:
                raise UserError(self._aborted)
            if kind != MessageKind.CONTROL:
                self._check_abandoned(src)
            try:
                return q.get(timeout=_POLL)
            except queue.Empty:
                if time.monotonic() >= self._deadline(src, start):
                    raise UserError(f"{src} sent no {kind} message within {self.net.timeout:g} s (stalled or gone; "
                                    f"--timeout sets the wait){self._silent(src, start)}") from None

    def _wait_stream(self, src: str, kind: str) -> bytes:
        """A client's receive: the next ``kind`` message ``src`` sent back on its stream."""
        self._stream(src)
        start = time.monotonic()
        q = self._box(self._inbox, (src, kind))
        while True:
            try:
                return q.get_nowait()
            except queue.Empty:
                pass
            self._stream_failed(src, f"receive {kind}")
            if self._aborted is not None:
                raise UserError(self._aborted)
            try:
                return q.get(timeout=_POLL)
            except queue.Empty:
                if time.monotonic() >= self._deadline(src, start):
                    raise UserError(f"{src} at {self.peers.get(src, '?')} sent no {kind} message within "
                                    f"{self.net.timeout:g} s while this party waited for it (the peer is stalled, "
                                    "gone, or itself waiting for a message of ours; its own log says what it "
                                    f"waited for; --timeout sets the wait){self._silent(src, start)}") from None

    def _check_abandoned(self, src: str) -> None:
        """Raise StepAbandoned when ``src``'s next control message abandons the step (channel/base.py)."""
        ctrl = self._box(self._inbox, (src, MessageKind.CONTROL))
        with ctrl.mutex:
            if not (ctrl.queue and ctrl.queue[0] == ABANDON):
                return
            ctrl.queue.popleft()
        self._received(src, self.party, MessageKind.CONTROL, ABANDON)
        raise StepAbandoned(f"{src} abandoned the step")

    def _box(self, box: dict[tuple[str, str], queue.Queue[bytes]], key: tuple[str, str]) -> queue.Queue[bytes]:
        """The queue of ``key`` in ``box``, made once even when threads race for it."""
        with self._boxes:
            q = box.get(key)
            if q is None:
                q = box[key] = queue.Queue()
            return q

    def _outbox_queues(self) -> list[queue.Queue]:
        with self._boxes:
            return [*self._outbox.values(), *([self._stream_out] if self._stream_out is not None else [])]

    def pending(self) -> int:
        with self._boxes:
            queues = [*self._inbox.values(), *self._outbox.values()]
        return sum(q.qsize() for q in queues)

    def wait_inbox(self, src: str, kind: str, timeout: float) -> bytes | None:
        """The next ``kind`` message from ``src`` within ``timeout`` s, or None (a server idling
        between runs); raises on an abort like :meth:`recv`."""
        try:
            payload = self._box(self._inbox, (src, kind)).get(timeout=timeout)
        except queue.Empty:
            return None
        self._idle = False  # a run starts
        return self._received(src, self.party, kind, payload)

    @contextmanager
    def busy(self, party: str, what: str) -> Iterator[None]:
        """While the body runs, a heartbeat to every peer each :data:`HEARTBEAT_EVERY` s (≤ timeout / 4),
        saying ``what``: the peers wait on a working party, and never blame the network for its work."""
        stop = threading.Event()
        every = min(HEARTBEAT_EVERY, self.net.timeout / 4)
        payload = what.encode()[:200]

        def beat() -> None:
            while not stop.wait(every):
                if self._waiting:
                    continue
                try:
                    for name in list(self._stubs):  # a client: onto each peer's stream
                        self._stream(name).put(pack_frame(party, HEARTBEAT, payload))
                    if (out := self._stream_out) is not None:  # a server: back on its client's stream
                        out.put((HEARTBEAT, payload))
                except Exception:  # noqa: BLE001 -- best effort: the work itself reports its failures
                    return

        t = threading.Thread(target=beat, daemon=True, name=f"securevfl-{party}-heartbeat")
        t.start()
        try:
            yield
        finally:
            stop.set()

    def reset(self) -> None:
        """Forget the last run (queues, abort, counts): a server between runs (``--serve-forever``)."""
        with self._boxes:
            self._inbox.clear()
            self._outbox.clear()
        self._stream_out = None  # the next run comes on a stream of its own
        self._stream_peer = None
        self._idle = True
        self._aborted = None
        self._heard = {}
        self.stats = type(self.stats)()
        self.netstats = NetStats()
        self.transcript = []

    def abort(self, reason: str) -> None:
        """Tell every peer why this run ends (best effort: the peer may be the reason)."""
        self._aborted = self._aborted or f"{self.party} ended the run: {reason}"
        if (out := self._stream_out) is not None:  # a server: on its client's stream, after what it sent
            out.put((_ABORT, self._aborted.encode()))
        for name in self._stubs:
            try:
                self._stubs[name]["Abort"](pack_frame(self.party, "abort", reason.encode()), timeout=2.0)
            except grpc.RpcError:
                pass

    def drain(self, grace: float) -> None:
        """Wait (≤ ``grace`` s) until the client took every message this server still holds."""
        deadline = time.monotonic() + grace
        while any(q.qsize() for q in self._outbox_queues()) and time.monotonic() < deadline:
            time.sleep(0.05)

    def close(self) -> None:
        self._closing = True
        for q in self._streams.values():
            q.put(None)  # the client half-closes its streams
        for ch in self._channels:
            ch.close()
        if self._server is not None:
            self._server.stop(grace=0.5).wait(2.0)


def describe_rpc_error(e: grpc.RpcError, peer: str, addr: str, what: str, net: NetConfig) -> str:
    """One line for a failed call to ``peer``: what was tried, and the likely cause."""
    code = e.code()
    detail = (e.details() or "").splitlines()[0] if e.details() else ""
    where = f"{peer} at {addr}"
    if code == grpc.StatusCode.UNAVAILABLE and what != "connect":  # connected and past the handshake
        return (f"{where} went away mid-run ({what}): {detail or 'unavailable'} — the peer's process stopped or "
                "its machine became unreachable; restart it with the same flags")
    if code == grpc.StatusCode.UNAVAILABLE and _refused(e):
        return (f"cannot reach {where} ({what}): connection refused — nothing listens there: check that "
                f"`securevfl party` runs on that host with --listen on port {addr.rsplit(':', 1)[-1]}, and that no "
                "firewall rejects the port")
    if code == grpc.StatusCode.UNAVAILABLE:
        tls_hint = ""
        low = detail.lower()
        if net.tls is not None and ("hostname" in low or "no match found for server name" in low):
            tls_hint = f" — its certificate does not name {peer} (wrong party at that address?)"
        elif net.tls is not None and _tls_failure(e):
            signature = "signature" in low or "unknown ca" in low or "verify" in low
            why = ("its certificate is signed by another CA than ours" if signature else
                   f"the peer's certificate is not from our CA or does not name {peer} (or it rejected ours)")
            # the raw handshake text (OpenSSL's codes) says less than this and would cut the line short
            return (f"cannot reach {where} ({what}): the TLS handshake failed — {why}: both parties' --tls folders "
                    "must come from one `securevfl certs --out` folder (securevfl doctor checks it against the peer)")
        elif net.tls is not None and ("connection reset" in low or "closed" in low):
            tls_hint = " — the connection was closed (a peer without TLS, or one that rejected our certificate)"
        return f"cannot reach {where} ({what}): {detail or 'unavailable'}{tls_hint}"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        if what.startswith("receive "):  # connected and past the handshake: the peer never sent it
            return (f"{where} sent no {what.removeprefix('receive ')} message within {net.timeout:g} s while this "
                    "party waited for it (the peer is stalled, gone, or itself waiting for a message of ours; "
                    "its own log says what it waited for; --timeout sets the wait)")
        return (f"{where} did not answer ({what}) within {net.timeout:g} s (stalled, down, or refusing the TLS "
                "handshake; --timeout sets the wait)")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return (f"{where} ({what}): a message over the size limit ({detail}); --max-message-mb sets this party's, "
                f"the peer sets its own")
    if code == grpc.StatusCode.ABORTED:
        return detail or f"{where} aborted the run"
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return f"{where} refused us ({what}): {detail}"
    return f"{where} ({what}): {code.name.lower()}: {detail}"


def _refused(e: grpc.RpcError) -> bool:
    """Nothing accepts connections at the address (the host answers, the port is closed)."""
    return e.code() == grpc.StatusCode.UNAVAILABLE and "refused" in (e.details() or "").lower()


def _tls_failure(e: grpc.RpcError) -> bool:
    """A refused handshake (or a plaintext client closed by a TLS server: "socket closed")."""
    low = (e.details() or "").lower()
    return any(s in low for s in ("ssl", "handshake", "certificate", "tls", "verification", "socket closed"))
