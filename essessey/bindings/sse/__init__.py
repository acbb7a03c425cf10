"""The SSE binding: the WHATWG event stream format, an ASGI response that streams a turn
to browsers, and a Source that reads any SSE stream back into events.

Its modules, by job:

- the wire format, with no dependencies: ``_format`` (``encode``, ``format_message``,
  ``error_body``: writing the protocol's SSE), ``_decoder`` (``SSEDecoder``: reading any
  SSE), ``_encoder`` (``FrameEncoder``, what a wire dialect gives the response to be
  delivered in its own frames; ``ProtocolFrames`` the protocol's own; ``data_frame``,
  ``with_id`` and ``id_line`` write a dialect's frames: docs/dialects.md);
- the client, on httpx: ``_client`` (``connect``, ``SSESource``);
- the server side, on Starlette (the ``server`` extra, imported on first use):
  ``_response`` (``EventStreamResponse``, ``SSEOptions``) and ``_routes`` (the hub's
  routes: ``hub_routes``, ``subscription_response``, ``stream_response``,
  ``cancel_response``, ``requested_resume_point``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from essessey._ids import MAX_ID_LENGTH, is_event_id, is_stream_id
from essessey._public import import_lazily, public_dir, set_public_module
from essessey.bindings.sse._client import MAX_ERROR_BODY, SSEEventStream, SSESource, connect
from essessey.bindings.sse._decoder import SSEDecoder, SSEMessage
from essessey.bindings.sse._encoder import (
    ErrorShape,
    FrameEncoder,
    ProtocolFrames,
    data_frame,
    id_line,
    with_id,
)
from essessey.bindings.sse._format import encode, encode_many, error_body, format_message

if TYPE_CHECKING:
    from essessey.bindings.sse._response import (
        RESUME_HEADERS_WITHIN as RESUME_HEADERS_WITHIN,
    )
    from essessey.bindings.sse._response import EventStreamResponse as EventStreamResponse
    from essessey.bindings.sse._response import SSEOptions as SSEOptions
    from essessey.bindings.sse._routes import HubSubscription as HubSubscription
    from essessey.bindings.sse._routes import cancel_response as cancel_response
    from essessey.bindings.sse._routes import hub_routes as hub_routes
    from essessey.bindings.sse._routes import requested_resume_point as requested_resume_point
    from essessey.bindings.sse._routes import stream_response as stream_response
    from essessey.bindings.sse._routes import subscription_response as subscription_response

__all__ = [
    "MAX_ERROR_BODY",
    "MAX_ID_LENGTH",
    "RESUME_HEADERS_WITHIN",
    "ErrorShape",
    "EventStreamResponse",
    "FrameEncoder",
    "HubSubscription",
    "ProtocolFrames",
    "SSEDecoder",
    "SSEEventStream",
    "SSEMessage",
    "SSEOptions",
    "SSESource",
    "cancel_response",
    "connect",
    "data_frame",
    "encode",
    "encode_many",
    "error_body",
    "format_message",
    "hub_routes",
    "id_line",
    "is_event_id",
    "is_stream_id",
    "requested_resume_point",
    "stream_response",
    "subscription_response",
    "with_id",
]

set_public_module(__name__, globals(), __all__)

_NEEDS_STARLETTE = {
    "EventStreamResponse": "_response",
    "SSEOptions": "_response",
    "RESUME_HEADERS_WITHIN": "_response",
    "HubSubscription": "_routes",
    "cancel_response": "_routes",
    "requested_resume_point": "_routes",
    "stream_response": "_routes",
    "hub_routes": "_routes",
    "subscription_response": "_routes",
}


def __getattr__(name: str) -> Any:
    # The ASGI response needs Starlette (the ``server`` extra), so it is imported on
    # first use: the format, the decoder and the source work without it.
    return import_lazily(__name__, _NEEDS_STARLETTE, name, extra="server")


def __dir__() -> list[str]:
    return public_dir(globals(), __all__)
