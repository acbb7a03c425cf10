"""essessey: publish an agent's turn as a stream of protocol events.

The public API lives here; the modules behind it are implementation detail unless their
own docs say otherwise.
"""

from essessey.check import ProtocolChecker, Rule, Violation, check
from essessey.errors import (
    EssesseyError,
    ProtocolError,
    RoundOrderError,
    SerializationError,
    SSEDecodeError,
    StoreUnavailable,
    StreamBusy,
    StreamHTTPError,
    StreamNotFound,
    StreamRejected,
    StreamReset,
    SubscriberLagged,
    TooManySubscribers,
    UnknownEventId,
    WebSocketClosed,
)
from essessey.event import Event, Sink, Source
from essessey.hub import Access, Authorize, StreamHub, TurnProducer
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
from essessey.store import EventStore, InMemoryEventStore
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
    "Access",
    "Authorize",
    "BlockType",
    "DeltaType",
    "Dialect",
    "EssesseyError",
    "Event",
    "EventStore",
    "EventType",
    "Fragment",
    "InMemoryEventStore",
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
    "RoundOrderError",
    "Rule",
    "SSEDecodeError",
    "SerializationError",
    "Sink",
    "SliceSource",
    "Source",
    "StopReason",
    "StoreUnavailable",
    "StreamBusy",
    "StreamHTTPError",
    "StreamHub",
    "StreamNotFound",
    "StreamRejected",
    "StreamReset",
    "SubscriberLagged",
    "TextItem",
    "TextStreamer",
    "ThinkingItem",
    "ThinkingStreamer",
    "TimelineItem",
    "TooManySubscribers",
    "ToolCall",
    "ToolExecution",
    "ToolResultItem",
    "ToolStreamer",
    "ToolUseItem",
    "Turn",
    "TurnProducer",
    "UnknownEventId",
    "Violation",
    "WebSocketClosed",
    "check",
    "reassemble",
    "reassemble_events",
    "stream_turn",
]
