"""Writing events to a WebSocket, one text frame each."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import anyio

from essessey.bindings.ws._frame import encode_frame
from essessey.event import Event

__all__ = ["TextSender", "WebSocketSink"]


@runtime_checkable
class TextSender(Protocol):
    """Anything that can send a text frame: Starlette's ``WebSocket`` has this method."""

    async def send_text(self, data: str) -> None:
        """Send one text frame."""
        ...


class WebSocketSink:
    """A sink that sends each event as one JSON text frame (see :func:`encode_frame`).

    Safe under concurrent emits: frames never interleave, and they go out in the order
    the emits acquired the lock.
    """

    __slots__ = ("_lock", "_socket")

    def __init__(self, socket: TextSender) -> None:
        self._socket = socket
        # A free lock is taken without a pass through the loop (acquire() would yield on
        # every event, a loop pass and a client wake-up each).
        self._lock = anyio.Lock(fast_acquire=True)

    async def emit(self, event: Event) -> None:
        """Send ``event``; the frame is built before anything is sent."""
        frame = encode_frame(event)
        async with self._lock:
            await self._socket.send_text(frame)
