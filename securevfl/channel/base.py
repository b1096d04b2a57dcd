"""Transport between parties. Every cross-party message is bytes; the channel counts them by kind
and direction and can keep a transcript (what each party received is its *view*)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from securevfl.channel import codec
from securevfl.errors import UserError
from securevfl.storage import spill


class MessageKind:
    """Names of the messages the library sends. Defenses declare which of these they act on."""

    BATCH_IDS = "batch_ids"
    ACTIVATION = "activation"  # passive bottom output → active (the cut layer, forward)
    GRADIENT = "gradient"  # ∂L/∂activation, active → passive (the cut layer, backward)
    SSL_REPRESENTATION = "ssl_representation"  # representations exchanged in cross-party SSL
    MODEL_PARAMS = "model_params"  # FedAvg of shared sub-models through a server role (FedHSSL's PMA)
    ALIGNMENT = "alignment"  # PSI protocol messages and the announced aligned set
    CONTROL = "control"
    HE_CONTEXT = "he_context"  # a key owner's public HE context / public key (never the secret key)
    HE_CIPHERTEXT = "he_ciphertext"  # encrypted activations, weight shares and masked products
    HE_MASKED = "he_masked"  # plaintext values blinded by the other party's random mask


ABANDON = b"\x00abandon-step"
"""A control message that ends the step its receiver is in the middle of (the sender's training
diverged mid-step, e.g. one learning-rate candidate): a party waiting for that step's next message
gets :class:`StepAbandoned` instead, and goes back to waiting for requests."""


class StepAbandoned(Exception):
    """The party that drives the step abandoned it (:data:`ABANDON`)."""


@dataclass(frozen=True)
class Message:
    seq: int
    src: str
    dst: str
    kind: str
    payload: bytes
    nbytes: int


@dataclass
class ChannelStats:
    """Byte and message counters keyed by (kind, src, dst)."""

    bytes: Counter = field(default_factory=Counter)
    messages: Counter = field(default_factory=Counter)

    def add(self, kind: str, src: str, dst: str, nbytes: int) -> None:
        self.bytes[(kind, src, dst)] += nbytes
        self.messages[(kind, src, dst)] += 1

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())

    @property
    def total_messages(self) -> int:
        return sum(self.messages.values())

    def bytes_by_kind(self) -> dict[str, int]:
        out: Counter = Counter()
        for (kind, _, _), n in self.bytes.items():
            out[kind] += n
        return dict(sorted(out.items()))

    def bytes_sent_by(self, party: str) -> int:
        return sum(n for (_, src, _), n in self.bytes.items() if src == party)

    def as_dict(self) -> dict:
        return {
            "bytes_sent": self.total_bytes,
            "messages": self.total_messages,
            "bytes_by_kind": self.bytes_by_kind(),
            "by_direction": {
                f"{k}:{s}->{d}": {"bytes": n, "messages": self.messages[(k, s, d)]}
                for (k, s, d), n in sorted(self.bytes.items())
            },
        }


class Channel(ABC):
    """Abstract transport. Implementations move bytes; counting and transcripts live here."""

    remote: bool = False
    """Whether the other parties are other processes (another organisation): then a tensor received
    with a non-finite value is that sender's fault, refused by name (:meth:`Endpoint.recv_tensor`),
    not a divergence of this run's training."""

    def __init__(self, record: bool = False) -> None:
        self.stats = ChannelStats()
        self.record = record
        self.transcript: list[Message] = []
        self._seq = 0

    def send(self, src: str, dst: str, kind: str, payload: bytes) -> None:
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise TypeError("only bytes cross the channel")
        payload = bytes(payload)
        self.stats.add(kind, src, dst, len(payload))
        self._seq += 1
        if self.record:
            self.transcript.append(Message(self._seq, src, dst, kind, payload, len(payload)))
        self._deliver(src, dst, kind, payload)

    @abstractmethod
    def _deliver(self, src: str, dst: str, kind: str, payload: bytes) -> None: ...

    @abstractmethod
    def recv(self, dst: str, src: str, kind: str) -> bytes:
        """Next message of ``kind`` from ``src`` to ``dst`` (FIFO)."""

    @abstractmethod
    def pending(self) -> int:
        """Messages sent but not yet received (a finished protocol leaves none)."""

    def endpoint(self, party: str) -> Endpoint:
        return Endpoint(self, party)

    def busy(self, party: str, what: str) -> AbstractContextManager[None]:
        """While ``party`` computes without a message to send (reading its file, its PSI, a long set-up),
        a networked channel tells its peers so (a heartbeat): a peer waiting on it keeps waiting as long
        as the heartbeats come, and says what it waited on when they stop. In one process: nothing."""
        return nullcontext()

    def received_by(self, party: str) -> list[Message]:
        """The party's view: every message it received (needs ``record=True``)."""
        if not self.record:
            raise RuntimeError("channel was created without record=True")
        return [m for m in self.transcript if m.dst == party]


@dataclass(frozen=True)
class Contact:
    """How a party's external PSI engine (securevfl/data/otpsi.py) reaches a peer's: the engine both run,
    where this party's worker listens, the peer's host, this party's TLS files (None: ``--insecure``),
    and how long to wait."""

    engine: str
    listen_host: str
    peer_host: str
    tls: Any  # securevfl.channel.grpc.TLSFiles | None (not imported: the in-memory channel has no grpc)
    timeout: float


class Endpoint:
    """A party's handle on the channel: it can only send as itself and receive what is addressed to it.

    This is where tensors become bytes and back: :meth:`send_tensor` encodes from CPU memory, and
    :meth:`recv_tensor` hands the decoded tensor over on ``device``, the owning party's (``--device``;
    the party sets it when it takes its endpoint, :class:`securevfl.parties.Party`)."""

    def __init__(self, channel: Channel, party: str, device: torch.device | None = None) -> None:
        self._channel = channel
        self.party = party
        self.device = torch.device("cpu") if device is None else device

    def send(self, dst: str, kind: str, payload: bytes) -> None:
        self._channel.send(self.party, dst, kind, payload)

    def traffic_mb(self) -> float:
        """Megabytes this party sent and received so far (for its progress line)."""
        n = sum(b for (_, src, dst), b in list(self._channel.stats.bytes.items()) if self.party in (src, dst))
        return round(n / 1e6, 2)

    def recv(self, src: str, kind: str) -> bytes:
        return self._channel.recv(self.party, src, kind)

    def busy(self, what: str) -> AbstractContextManager[None]:
        """:meth:`Channel.busy` for this party."""
        return self._channel.busy(self.party, what)

    def psi_contact(self, peer: str) -> Any:
        """How this party's PSI engine reaches ``peer`` (None: the channel's own X25519 PSI only)."""
        contact = getattr(self._channel, "psi_contact", None)
        return None if contact is None else contact(self.party, peer)

    # typed helpers
    def send_tensor(self, dst: str, kind: str, t: torch.Tensor) -> None:
        self.send(dst, kind, codec.encode_tensor(t))

    def recv_tensor(self, src: str, kind: str, device: torch.device | str | None = None,
                    bound: float | None = None) -> torch.Tensor:
        """The next tensor of ``kind`` from ``src``, on this party's device (``device="cpu"``: for an end
        that computes on the CPU, e.g. the interactive layer, without a round trip through the GPU).
        ``bound``: every value the protocol lets ``src`` send lies in [−bound, bound] (t = tanh(z)); from
        another process, a value outside is that party's fault, named as such (not a divergence)."""
        t = codec.decode_tensor(self.recv(src, kind))
        if self._channel.remote and t.is_floating_point():
            if not bool(torch.isfinite(t).all()):
                raise UserError(f"{src} sent a {kind} message with non-finite values (NaN or infinity): the run "
                                f"ends; the fault is {src}'s message, not this run's settings")
            if bound is not None and t.numel() and float(t.abs().max()) > bound:
                raise UserError(f"{src} sent a {kind} message with values outside [-{bound:g}, {bound:g}] (largest "
                                f"|value| {float(t.abs().max()):.3g}) where the protocol sends tanh(z): the run ends; "
                                f"the fault is {src}'s message, not this run's learning rate")
        target = self.device if device is None else torch.device(device)
        return t if target.type == "cpu" else t.to(target)

    def send_ids(self, dst: str, kind: str, ids: np.ndarray) -> None:
        if np.asarray(ids).dtype.kind in "iu" and len(ids) > codec.ID_PART:  # in parts (codec.ID_PART)
            self.send(dst, kind, codec.id_parts_head(len(ids)))
            for i in range(0, len(ids), codec.ID_PART):
                self.send(dst, kind, codec.encode_ids(np.asarray(ids[i:i + codec.ID_PART])))
            return
        self.send(dst, kind, codec.encode_ids(ids))

    def recv_ids(self, src: str, kind: str) -> np.ndarray:
        buf = self.recv(src, kind)
        n = codec.parts_of(buf)
        if n is None:
            return codec.decode_ids(buf)
        out = spill.empty(n, np.int64)
        for i in range(0, n, codec.ID_PART):
            part = codec.decode_array(self.recv(src, kind))
            if part.ndim != 1 or part.dtype != np.int64 or len(part) != min(codec.ID_PART, n - i):
                raise ValueError(f"{src} sent an ID list part of {len(part)} IDs where {min(codec.ID_PART, n - i)} "
                                 "were due")
            out[i:i + len(part)] = part
        return out

    def send_json(self, dst: str, kind: str, obj: object) -> None:
        self.send(dst, kind, codec.encode_json(obj))

    def recv_json(self, src: str, kind: str) -> object:
        return codec.decode_json(self.recv(src, kind))
