"""The SSE binding: the WHATWG event stream format, an ASGI response that streams a turn
to browsers, and a Source that reads any SSE stream back into events.

``encode``/``format_message`` write the format and ``SSEDecoder`` reads it (no
dependencies). ``EventStreamResponse`` needs the ``server`` extra (Starlette);
``connect`` needs httpx.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from essessey._ids import MAX_ID_LENGTH, is_event_id, is_stream_id
from essessey._public import import_lazily, set_public_module
from essessey.bindings.sse._decoder import SSEDecoder, SSEMessage
from essessey.bindings.sse._source import MAX_ERROR_BODY, SSEEventStream, SSESource, connect
from essessey.bindings.sse._writer import encode, encode_many, format_message

__all__ = [
    "MAX_ERROR_BODY",
    "MAX_ID_LENGTH",
    "SSEDecoder",
    "SSEEventStream",
    "SSEMessage",
    "SSESource",
    "connect",
    "encode",
    "encode_many",
    "format_message",
    "is_event_id",
    "is_stream_id",
]

set_public_module(__name__, globals(), __all__)

if TYPE_CHECKING:
    from essessey.bindings.sse._hub import cancel_response as cancel_response
    from essessey.bindings.sse._hub import hub_routes as hub_routes
    from essessey.bindings.sse._hub import subscription_response as subscription_response
    from essessey.bindings.sse._response import EventStreamResponse as EventStreamResponse
    from essessey.bindings.sse._response import SSEOptions as SSEOptions

_NEEDS_STARLETTE = {
    "EventStreamResponse": "_response",
    "SSEOptions": "_response",
    "cancel_response": "_hub",
    "hub_routes": "_hub",
    "subscription_response": "_hub",
}


def __getattr__(name: str) -> Any:
    # The ASGI response needs Starlette (the ``server`` extra), so it is imported on
    # first use: the format, the decoder and the source work without it.
    return import_lazily(__name__, _NEEDS_STARLETTE, name)
