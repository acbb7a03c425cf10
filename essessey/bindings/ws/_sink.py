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
        self._lock = anyio.Lock()

    async def emit(self, event: Event) -> None:
        """Send ``event``; the frame is built before anything is sent."""
        frame = encode_frame(event)
        lock = self._lock
        # anyio's acquire() yields to the loop even when the lock is free, which cost a
        # loop pass (and a client wake-up) per event; take a free lock without one.
        try:
            lock.acquire_nowait()
        except anyio.WouldBlock:
            await lock.acquire()
        try:
            await self._socket.send_text(frame)
        finally:
            lock.release()
