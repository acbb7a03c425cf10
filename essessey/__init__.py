"""essessey: publish an agent's turn as a stream of protocol events.

The public API lives here; the modules behind it are implementation detail unless their
own docs say otherwise.
"""

from essessey.check import ProtocolChecker, Rule, Violation, check
from essessey.errors import (
    EssesseyError,
    ProtocolError,
    SerializationError,
    SSEDecodeError,
    StreamHTTPError,
    StreamRejected,
)
from essessey.event import Event, Sink, Source
from essessey.memory import InMemorySink, MultiSink, SliceSource
from essessey.protocol import BlockType, DeltaType, Dialect, EventType, StopReason
from essessey.publisher import Publisher
from essessey.reassemble import (
    Fragment,
    ItemKind,
    OtherItem,
    ParsedError,
    ParsedMessage,
    ParsedStream,
    ParsedToolCall,
    ParsedToolResult,
    Reassembler,
    TextItem,
    ThinkingItem,
    TimelineItem,
    ToolExecution,
    ToolResultItem,
    ToolUseItem,
    reassemble,
    reassemble_events,
)
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
    "Fragment",
    "InMemorySink",
    "ItemKind",
    "LineStreamer",
    "MultiSink",
    "OtherItem",
    "ParsedError",
    "ParsedMessage",
    "ParsedStream",
    "ParsedToolCall",
    "ParsedToolResult",
    "ProtocolChecker",
    "ProtocolError",
    "Publisher",
    "Reassembler",
    "Rule",
    "SSEDecodeError",
    "SerializationError",
    "Sink",
    "SliceSource",
    "Source",
    "StopReason",
    "StreamHTTPError",
    "StreamRejected",
    "TextItem",
    "TextStreamer",
    "ThinkingItem",
    "ThinkingStreamer",
    "TimelineItem",
    "ToolCall",
    "ToolExecution",
    "ToolResultItem",
    "ToolStreamer",
    "ToolUseItem",
    "Turn",
    "Violation",
    "check",
    "reassemble",
    "reassemble_events",
    "stream_turn",
]
