"""The WebSocket binding: the same events, one JSON text frame each
(``{"id"?, "event", "data"}`` with the payload inline), a source that reads them back,
and an endpoint that serves a hub subscription with resume.
"""

from __future__ import annotations

from essessey.bindings.ws._frame import MAX_FRAME_SIZE, decode_frame, encode_frame
from essessey.bindings.ws._sink import TextSender, WebSocketSink

__all__ = ["MAX_FRAME_SIZE", "TextSender", "WebSocketSink", "decode_frame", "encode_frame"]
