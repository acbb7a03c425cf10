"""essessey: publish an agent's turn as a stream of protocol events.

Where a name lives, the one rule:

- **The top level** (``essessey.X``) holds what an app imports to publish a turn
  (``Publisher``, ``stream_turn`` and the streamers, ``Event`` and the sinks), serve it
  (``StreamHub`` and its hooks' types), store it (``EventStore``, ``InMemoryEventStore``),
  read it back (``reassemble``, ``reassemble_events``, ``ParsedStream``, ``check``,
  ``SliceSource`` for events already in hand), the
  protocol's names (``EventType``, ``StopReason``, ...) and every exception the library
  raises, the bindings' included (defined in :mod:`essessey.errors`).
- **Everything else is imported from the public module that owns it**, documented there:
  :mod:`essessey.reassemble` (the records a reassembled stream is made of, ``Reassembler``),
  :mod:`essessey.check` (``ProtocolChecker``, ``Rule``, ``Violation``),
  :mod:`essessey.shutdown` (ending open streams when the server stops),
  :mod:`essessey.event` (``Source``, ``EventBatch``), :mod:`essessey.adapters` and its
  provider modules, each binding (:mod:`essessey.bindings.sse`, ``.ws``, ``.nats``) and
  dialect (:mod:`essessey.dialects`), the stores' contract and backends (:mod:`essessey.stores`,
  ``.redis``, ``.jetstream``), :mod:`essessey.testing` and :mod:`essessey.demo`.
- ``essessey.check`` and ``essessey.reassemble`` here are the functions; their modules'
  other names are imported with ``from essessey.check import ...`` and
  ``from essessey.reassemble import ...``.
- A module whose name starts with ``_`` is private. A public name's ``__module__`` is the
  module the docs import it from, so a ``repr``, a traceback or ``help()`` says that path.
- A package's names that need an extra's library (the ASGI response and routes need
  Starlette) are imported on first use, and are in its ``__all__`` and ``dir()`` all the
  same; ``from package import *`` imports them, so it needs the extra.
"""

from essessey._public import set_public_module
from essessey.check import check
from essessey.errors import (
    AnswerConflict,
    AnswerExpired,
    AnswerRefused,
    EssesseyError,
    InvalidAnswer,
    JetStreamUnavailable,
    LeaseLost,
    MessagesNotRetained,
    NATSConnectionLost,
    NotWaiting,
    ProtocolError,
    ProviderStreamError,
    RedisUnavailable,
    RoundOrderError,
    SerializationError,
    SSEDecodeError,
    StoreFull,
    StoreUnavailable,
    StreamBusy,
    StreamHTTPError,
    StreamInterrupted,
    StreamNotFound,
    StreamRejected,
    StreamReset,
    SubscriberLagged,
    TooManySubscribers,
    UnknownEventId,
    WebSocketClosed,
)
from essessey.event import Event, Sink
from essessey.hub import Access, Authorize, Continuation, Continued, StreamHub, TurnProducer
from essessey.memory import InMemorySink, MultiSink, SliceSource
from essessey.protocol import BlockType, DeltaType, Dialect, EventType, StopReason
from essessey.protocol.asking import (
    Answer,
    Answered,
    ApprovalRequest,
    ClientToolCall,
    PendingRequest,
    Question,
    QuestionAnswer,
    ToolApproval,
    ToolOutput,
)
from essessey.publisher import Publisher
from essessey.reassemble import ParsedStream, reassemble, reassemble_events
from essessey.stores import EventStore, InMemoryEventStore
from essessey.streamers import (
    BlockStreamer,
    LineStreamer,
    TextStreamer,
    ThinkingStreamer,
    ToolCall,
    ToolStreamer,
    Turn,
    continue_turn,
    stream_turn,
)

__version__ = "0.1.0"

__all__ = [
    "Access",
    "Answer",
    "AnswerConflict",
    "AnswerExpired",
    "AnswerRefused",
    "Answered",
    "ApprovalRequest",
    "Authorize",
    "BlockStreamer",
    "BlockType",
    "ClientToolCall",
    "Continuation",
    "Continued",
    "DeltaType",
    "Dialect",
    "EssesseyError",
    "Event",
    "EventStore",
    "EventType",
    "InMemoryEventStore",
    "InMemorySink",
    "InvalidAnswer",
    "JetStreamUnavailable",
    "LeaseLost",
    "LineStreamer",
    "MessagesNotRetained",
    "MultiSink",
    "NATSConnectionLost",
    "NotWaiting",
    "ParsedStream",
    "PendingRequest",
    "ProtocolError",
    "ProviderStreamError",
    "Publisher",
    "Question",
    "QuestionAnswer",
    "RedisUnavailable",
    "RoundOrderError",
    "SSEDecodeError",
    "SerializationError",
    "Sink",
    "SliceSource",
    "StopReason",
    "StoreFull",
    "StoreUnavailable",
    "StreamBusy",
    "StreamHTTPError",
    "StreamHub",
    "StreamInterrupted",
    "StreamNotFound",
    "StreamRejected",
    "StreamReset",
    "SubscriberLagged",
    "TextStreamer",
    "ThinkingStreamer",
    "TooManySubscribers",
    "ToolApproval",
    "ToolCall",
    "ToolOutput",
    "ToolStreamer",
    "Turn",
    "TurnProducer",
    "UnknownEventId",
    "WebSocketClosed",
    "check",
    "continue_turn",
    "reassemble",
    "reassemble_events",
    "stream_turn",
]

set_public_module(__name__, globals(), __all__)
