"""The WebSocket binding: the same events, one JSON text frame each
(``{"id"?, "event", "data"}`` with the payload inline), a source that reads them back,
and an endpoint that serves a hub subscription with resume.

``encode_frame``/``decode_frame``, ``WebSocketSink`` and ``WebSocketSource`` need no
server library. ``websocket_subscription``, ``ws_route``, ``stall_guard`` and
``PING_FRAME`` need the ``server`` extra (Starlette) and are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from essessey._public import import_lazily, public_dir, set_public_module
from essessey.bindings.ws._frame import MAX_FRAME_SIZE, decode_frame, encode_frame
from essessey.bindings.ws._sink import TextSender, WebSocketSink
from essessey.bindings.ws._source import (
    NORMAL_CLOSE_CODES,
    CloseCode,
    FrameReceiver,
    MessageReceiver,
    WebSocketSource,
)

if TYPE_CHECKING:
    from essessey.bindings.ws._endpoint import PING_FRAME as PING_FRAME
    from essessey.bindings.ws._endpoint import websocket_subscription as websocket_subscription
    from essessey.bindings.ws._endpoint import ws_route as ws_route
    from essessey.bindings.ws._guard import stall_guard as stall_guard

__all__ = [
    "MAX_FRAME_SIZE",
    "NORMAL_CLOSE_CODES",
    "PING_FRAME",
    "CloseCode",
    "FrameReceiver",
    "MessageReceiver",
    "TextSender",
    "WebSocketSink",
    "WebSocketSource",
    "decode_frame",
    "encode_frame",
    "stall_guard",
    "websocket_subscription",
    "ws_route",
]

set_public_module(__name__, globals(), __all__)

_NEEDS_STARLETTE = {
    "PING_FRAME": "_endpoint",
    "websocket_subscription": "_endpoint",
    "ws_route": "_endpoint",
    "stall_guard": "_guard",
}


def __getattr__(name: str) -> Any:
    # The endpoint needs Starlette (the ``server`` extra), so it is imported on first
    # use: the envelope, the sink and the source work without it.
    return import_lazily(__name__, _NEEDS_STARLETTE, name, extra="server")


def __dir__() -> list[str]:
    return public_dir(globals(), __all__)
