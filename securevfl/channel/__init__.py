"""Channel: the only way data crosses a party boundary."""

from securevfl.channel.base import Channel, ChannelStats, Endpoint, Message, MessageKind
from securevfl.channel.memory import InMemoryChannel


def net_transport():
    """The gRPC transport module (:mod:`securevfl.channel.grpc`), registered only when its packages
    import; otherwise a UserError saying which extra to install."""
    try:
        from securevfl.channel import certs  # noqa: F401 - the extra's other half (cryptography)
        from securevfl.channel import grpc as transport
    except ImportError as e:
        from securevfl.errors import UserError

        raise UserError(f"the network transport needs the net extra: pip install 'securevfl[net]' "
                        f"({e.name} is not installed)") from None
    return transport


__all__ = ["Channel", "ChannelStats", "Endpoint", "InMemoryChannel", "Message", "MessageKind"]
