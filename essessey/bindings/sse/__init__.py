"""The SSE binding: the WHATWG event stream format, an ASGI response that streams a turn
to browsers, and a Source that reads any SSE stream back into events.

``encode``/``format_message`` write the format and ``SSEDecoder`` reads it (no
dependencies). ``EventStreamResponse`` needs the ``server`` extra (Starlette);
``connect`` needs httpx.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from essessey.bindings.sse._decoder import SSEDecoder, SSEMessage
from essessey.bindings.sse._source import MAX_ERROR_BODY, SSEEventStream, SSESource, connect
from essessey.bindings.sse._writer import encode, encode_many, format_message

__all__ = [
    "MAX_ERROR_BODY",
    "SSEDecoder",
    "SSEEventStream",
    "SSEMessage",
    "SSESource",
    "connect",
    "encode",
    "encode_many",
    "format_message",
]

if TYPE_CHECKING:
    from essessey.bindings.sse._response import EventStreamResponse as EventStreamResponse
    from essessey.bindings.sse._response import Producer as Producer

_NEEDS_STARLETTE = frozenset({"EventStreamResponse", "Producer"})


def __getattr__(name: str) -> Any:
    # The ASGI response needs Starlette (the ``server`` extra), so it is imported on
    # first use: the format, the decoder and the source work without it.
    if name in _NEEDS_STARLETTE:
        from essessey.bindings.sse import _response

        return getattr(_response, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
