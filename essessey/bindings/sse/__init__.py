"""The SSE binding: the WHATWG event stream format, an ASGI response that streams a turn
to browsers, and a Source that reads any SSE stream back into events.

``encode``/``format_message`` write the format and ``SSEDecoder`` reads it (no
dependencies). ``EventStreamResponse`` needs the ``server`` extra (Starlette);
``connect`` needs httpx.
"""

from __future__ import annotations

import importlib
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
    from essessey.bindings.sse._hub import MAX_ID_LENGTH as MAX_ID_LENGTH
    from essessey.bindings.sse._hub import cancel_response as cancel_response
    from essessey.bindings.sse._hub import hub_routes as hub_routes
    from essessey.bindings.sse._hub import subscription_response as subscription_response
    from essessey.bindings.sse._response import EventStreamResponse as EventStreamResponse
    from essessey.bindings.sse._response import Producer as Producer

_NEEDS_STARLETTE = {
    "EventStreamResponse": "_response",
    "Producer": "_response",
    "MAX_ID_LENGTH": "_hub",
    "cancel_response": "_hub",
    "hub_routes": "_hub",
    "subscription_response": "_hub",
}


def __getattr__(name: str) -> Any:
    # The ASGI response needs Starlette (the ``server`` extra), so it is imported on
    # first use: the format, the decoder and the source work without it.
    module = _NEEDS_STARLETTE.get(name)
    if module is not None:
        return getattr(importlib.import_module(f"{__name__}.{module}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
