"""Reading WebSocket frames back into events, and the close codes the endpoint uses.

Why it is shaped this way:
- A Source must never make a broken transport look like the end of a stream
  (docs/websocket.md says the same for its readers): only a normal close (1000, or 1001
  going away) ends the iteration. Any other code, a close frame without a code (1005),
  or a connection dropped without one (1006) raises
  :class:`~essessey.errors.WebSocketClosed` with the code, so the caller decides whether
  to reconnect. 1005 counts as abnormal because uvicorn reports a dropped connection
  with it too: the two cannot be told apart on the server side.
- One bad frame must not end a stream: a frame :func:`decode_frame` refuses (not JSON,
  not the envelope's shape, too large, a binary frame that is not UTF-8) is skipped
  with a warning giving the reason and its length, never its content (model output).
- It reads from either kind of socket without importing either library: a ``websockets``
  client connection (anything with ``async recv() -> str | bytes``) or a Starlette
  ``WebSocket`` (anything with ``async receive()`` returning ASGI messages).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from enum import IntEnum
from typing import Any, Final, Protocol, TypeAlias, runtime_checkable

from essessey.bindings.ws._frame import MAX_FRAME_SIZE, decode_frame
from essessey.errors import WebSocketClosed
from essessey.event import Event

__all__ = [
    "NORMAL_CLOSE_CODES",
    "CloseCode",
    "FrameReceiver",
    "MessageReceiver",
    "WebSocketSource",
]

logger = logging.getLogger("essessey.ws")


class CloseCode(IntEnum):
    """The close codes :func:`~essessey.bindings.ws.websocket_subscription` ends with,
    and what a client should do on each."""

    NORMAL = 1000
    """The turn ended (the stream is complete): do not reconnect."""
    GOING_AWAY = 1001
    """The peer is going away (a browser leaving the page, a proxy shutting down). It
    ends a :class:`WebSocketSource` cleanly, like 1000: a client that needs the whole
    turn checks that it ended (``message_stop`` or ``error``) and otherwise resumes."""
    NO_STATUS = 1005
    """A close frame without a code (uvicorn also reports a dropped connection so)."""
    ABNORMAL = 1006
    """The connection dropped without a close frame: reconnect with the last id."""
    INTERNAL_ERROR = 1011
    """The server failed: reconnecting may not help."""
    SERVICE_RESTART = 1012
    """The server is shutting down or restarting (what the endpoint and uvicorn send on
    shutdown): reconnect, after a pause, with the last event id received."""
    TRY_AGAIN_LATER = 1013
    """Too many subscribers, the subscriber lagged, the store is unavailable, or a send
    stalled: reconnect (after a pause) with the last event id received."""
    BAD_REQUEST = 4400
    """An invalid stream id, last event id or first message: do not reconnect."""
    FORBIDDEN = 4403
    """The authorization hook refused: do not reconnect."""
    NOT_FOUND = 4404
    """No such stream: do not reconnect."""
    RESUME_UNAVAILABLE = 4410
    """The last event id is not retained (or the stream was reset): reconnect without
    an id, to get the stream from its oldest retained message."""


NORMAL_CLOSE_CODES: Final = frozenset({CloseCode.NORMAL, CloseCode.GOING_AWAY})
"""The close codes that end a :class:`WebSocketSource` cleanly; any other raises."""


@runtime_checkable
class FrameReceiver(Protocol):
    """A socket that hands out whole messages: a ``websockets`` client connection.

    ``recv`` returns a text frame as ``str`` and a binary one as ``bytes``. When the
    connection closes it raises ``websockets.exceptions.ConnectionClosed`` or
    :class:`~essessey.errors.WebSocketClosed` (either carrying the close code).
    """

    async def recv(self) -> str | bytes:
        """The next message."""
        ...


@runtime_checkable
class MessageReceiver(Protocol):
    """A socket that hands out ASGI messages: Starlette's ``WebSocket``, once accepted."""

    async def receive(self) -> Mapping[str, Any]:
        """The next ASGI message (``websocket.receive`` or ``websocket.disconnect``)."""
        ...


_Receive: TypeAlias = Callable[[], Awaitable["str | bytes | None"]]
"""Reads the next frame; None at a normal close; raises WebSocketClosed otherwise."""


def _closed(code: int, reason: str) -> None:
    """Return at a normal close, raise :class:`WebSocketClosed` at any other."""
    if code not in NORMAL_CLOSE_CODES:
        raise WebSocketClosed(code, reason)


def _websockets_closed() -> tuple[type[Exception], ...]:
    try:
        from websockets.exceptions import ConnectionClosed
    except ImportError:  # only a socket from that library raises it
        return ()
    return (ConnectionClosed,)


class WebSocketSource:
    """The events of a WebSocket, as an async iterable of :class:`~essessey.Event`.

    ``socket`` is a ``websockets`` client connection (or anything with
    ``async recv() -> str | bytes``) or an accepted Starlette ``WebSocket`` (anything with
    ``async receive()`` giving ASGI messages). Each frame is one event in the envelope of
    :func:`~essessey.bindings.ws.encode_frame`; a malformed frame, or one longer than
    ``max_frame_size``, is skipped with a warning. A normal close (1000, 1001) ends the
    iteration; any other close raises :class:`~essessey.errors.WebSocketClosed`, and any
    other exception from the socket propagates as it is.

    ``last_event_id`` follows the events handed out (to resume from on reconnecting);
    ``close_code`` and ``close_reason`` tell how the socket closed. The source never
    closes the socket: its owner does. A source can be iterated once.
    """

    __slots__ = (
        "_events",
        "_max_frame_size",
        "_receive",
        "close_code",
        "close_reason",
        "last_event_id",
    )

    def __init__(
        self, socket: FrameReceiver | MessageReceiver, *, max_frame_size: int = MAX_FRAME_SIZE
    ) -> None:
        if max_frame_size < 1:
            raise ValueError("max_frame_size must be >= 1")
        receive: _Receive
        if isinstance(socket, FrameReceiver):
            receive = self._recv_reader(socket)
        elif isinstance(socket, MessageReceiver):
            receive = self._asgi_reader(socket)
        else:
            raise TypeError(
                "a WebSocketSource reads a socket with async recv() (websockets) "
                "or async receive() (Starlette)"
            )
        self._receive = receive
        self._max_frame_size = max_frame_size
        self._events: AsyncGenerator[Event, None] | None = None
        self.last_event_id: str | None = None
        """The id of the last event handed out that had one (None before)."""
        self.close_code: int | None = None
        """The close code, once the socket has closed."""
        self.close_reason = ""
        """The close reason, once the socket has closed."""

    def _recv_reader(self, socket: FrameReceiver) -> _Receive:
        closed_types = _websockets_closed()

        async def receive() -> str | bytes | None:
            try:
                return await socket.recv()
            except closed_types as exc:
                # websockets: the close frame received, if any; none means a drop.
                frame = getattr(exc, "rcvd", None)
                if frame is None:
                    code, reason = int(CloseCode.ABNORMAL), str(exc)
                else:
                    code, reason = int(frame.code), str(frame.reason)
            except WebSocketClosed as exc:
                code, reason = exc.code, exc.reason
            self._note_close(code, reason)
            return None

        return receive

    def _asgi_reader(self, socket: MessageReceiver) -> _Receive:
        async def receive() -> str | bytes | None:
            message = await socket.receive()
            kind = message["type"]
            if kind == "websocket.receive":
                text = message.get("text")
                if text is not None:
                    return str(text)
                return bytes(message.get("bytes") or b"")
            if kind == "websocket.disconnect":
                self._note_close(
                    int(message.get("code", CloseCode.NO_STATUS)), str(message.get("reason") or "")
                )
                return None
            raise RuntimeError(f"unexpected ASGI message {kind!r}: accept the WebSocket first")

        return receive

    def _note_close(self, code: int, reason: str) -> None:
        self.close_code = code
        self.close_reason = reason
        _closed(code, reason)

    def __aiter__(self) -> AsyncIterator[Event]:
        if self._events is not None:
            raise RuntimeError("a WebSocketSource can be iterated only once")
        self._events = self._iterate()
        return self._events

    async def aclose(self) -> None:
        """Stop reading (the socket stays open: its owner closes it)."""
        if self._events is not None:
            await self._events.aclose()

    async def _iterate(self) -> AsyncGenerator[Event, None]:
        receive = self._receive
        max_size = self._max_frame_size
        while True:
            frame = await receive()
            if frame is None:
                return
            try:
                event = decode_frame(frame, max_size=max_size)
            except ValueError as exc:
                # The reason and the length only: the frame is model output.
                logger.warning(
                    "skipped a malformed WebSocket frame (length %d): %s", len(frame), exc
                )
                continue
            if event.id is not None:
                self.last_event_id = event.id
            yield event
