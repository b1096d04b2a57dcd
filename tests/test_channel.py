import numpy as np
import pytest
import torch

from securevfl.channel import InMemoryChannel, MessageKind, codec
from securevfl.errors import ProtocolError


def test_tensor_roundtrip_and_size():
    t = torch.randn(7, 5)
    buf = codec.encode_tensor(t)
    assert isinstance(buf, bytes)
    assert len(buf) == codec.tensor_nbytes((7, 5)) == 2 + 8 + 7 * 5 * 4
    assert torch.equal(codec.decode_tensor(buf), t)


@pytest.mark.parametrize("ids", [np.array([3, 1, 2]), np.array(["u1", "u2", "ü3"], dtype=object)])
def test_ids_roundtrip(ids):
    assert list(codec.decode_ids(codec.encode_ids(ids))) == list(ids)


def test_only_bytes_cross_and_counters_by_kind_and_direction():
    ch = InMemoryChannel(record=True)
    a, p = ch.endpoint("active"), ch.endpoint("passive1")
    with pytest.raises(TypeError):
        ch.send("active", "passive1", "x", torch.zeros(3))  # a tensor object is not bytes
    p.send_tensor("active", MessageKind.ACTIVATION, torch.ones(4, 2))
    a.send_tensor("passive1", MessageKind.GRADIENT, torch.ones(4, 2))
    a.send_tensor("passive1", MessageKind.GRADIENT, torch.ones(4, 2))
    assert ch.stats.bytes[(MessageKind.ACTIVATION, "passive1", "active")] == 2 + 8 + 32
    assert ch.stats.messages[(MessageKind.GRADIENT, "active", "passive1")] == 2
    assert ch.stats.total_bytes == 3 * 42
    assert ch.stats.bytes_sent_by("active") == 84
    assert torch.equal(a.recv_tensor("passive1", MessageKind.ACTIVATION), torch.ones(4, 2))
    # the passive party's view holds exactly the two gradient messages
    assert [m.kind for m in ch.received_by("passive1")] == [MessageKind.GRADIENT] * 2
    assert ch.pending() == 2


def test_recv_without_send_is_a_protocol_error():
    ch = InMemoryChannel()
    with pytest.raises(ProtocolError, match="none was sent"):
        ch.endpoint("active").recv("passive1", MessageKind.ACTIVATION)


def test_transcript_needs_record():
    ch = InMemoryChannel()
    ch.endpoint("a").send("b", "k", b"xyz")
    assert ch.transcript == []
    with pytest.raises(RuntimeError):
        ch.received_by("b")


def test_batch_request_codec_roundtrip_bytes_and_other_control_messages():
    """One encoding of the per-step batch request: the one-byte JSON integer 2·split + training the
    byte counts were recorded with; any other control message (entity-aug's batch size, a seed) is
    not read as a request."""
    for split in ("train", "test"):
        for training in (False, True):
            buf = codec.encode_batch_request(split, training)
            assert buf == str(("train", "test").index(split) * 2 + int(training)).encode() and len(buf) == 1
            assert codec.decode_batch_request(buf) == (split, training)
    for other in (64, 4, -1, None, "train"):
        with pytest.raises(ValueError, match="not a batch request"):
            codec.decode_batch_request(codec.encode_json(other))
