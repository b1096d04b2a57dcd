"""Channel: the only way data crosses a party boundary."""

from securevfl.channel.base import Channel, ChannelStats, Endpoint, Message, MessageKind
from securevfl.channel.memory import InMemoryChannel

__all__ = ["Channel", "ChannelStats", "Endpoint", "InMemoryChannel", "Message", "MessageKind"]
