"""Hand-written requests for clients that must misbehave on purpose (stop reading, drop
mid-request), which an HTTP or WebSocket library would not let them do."""

from __future__ import annotations

import base64
import os


def sse_request(stream_id: str) -> bytes:
    """The bytes of a GET for ``stream_id``'s SSE subscription."""
    return (
        f"GET /streams/{stream_id} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n"
    ).encode()


def ws_request(stream_id: str) -> bytes:
    """The bytes of a WebSocket upgrade for ``stream_id``'s subscription."""
    key = base64.b64encode(os.urandom(16)).decode()
    return (
        f"GET /streams/{stream_id}/ws HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode()
