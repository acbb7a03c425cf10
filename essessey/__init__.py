"""essessey: publish an agent's turn as a stream of protocol events.

The public API lives here; the modules behind it are implementation detail unless their
own docs say otherwise.
"""

from essessey.check import ProtocolChecker, Rule, Violation, check
from essessey.errors import EssesseyError, ProtocolError, SerializationError
from essessey.event import Event, Sink, Source
from essessey.memory import InMemorySink, MultiSink, SliceSource
from essessey.protocol import BlockType, DeltaType, Dialect, EventType, StopReason
from essessey.publisher import Publisher
from essessey.streamers import (
    LineStreamer,
    TextStreamer,
    ThinkingStreamer,
    ToolCall,
    ToolStreamer,
    Turn,
    stream_turn,
)

__version__ = "0.1.0"

__all__ = [
    "BlockType",
    "DeltaType",
    "Dialect",
    "EssesseyError",
    "Event",
    "EventType",
    "InMemorySink",
    "LineStreamer",
    "MultiSink",
    "ProtocolChecker",
    "ProtocolError",
    "Publisher",
    "Rule",
    "SerializationError",
    "Sink",
    "SliceSource",
    "Source",
    "StopReason",
    "TextStreamer",
    "ThinkingStreamer",
    "ToolCall",
    "ToolStreamer",
    "Turn",
    "Violation",
    "check",
    "stream_turn",
]
