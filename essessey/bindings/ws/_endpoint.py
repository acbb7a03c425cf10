"""Serving a :class:`~essessey.StreamHub` over a WebSocket: subscribe and resume.

The policies are those of the SSE endpoint (``essessey.bindings.sse.hub_routes``), with
close codes where SSE has HTTP statuses:

==========================================  =====  ==========================================
case                                        code   what the client should do
==========================================  =====  ==========================================
the turn ended (the stream is complete)     1000   nothing: do not reconnect
the server is shutting down                 1012   reconnect (elsewhere) with the last id
bad stream id, last id or first message     4400   do not reconnect
not authorised                              4403   do not reconnect
no such stream                              4404   do not reconnect
unknown last id, or the stream was reset    4410   reconnect without an id (start over)
too many subscribers, subscriber lagged,    1013   reconnect after a pause, with the last id
store unavailable, a send stalled, the
``authorize`` hook raised
the server failed                           1011   give up (or retry later)
==========================================  =====  ==========================================

Why it is shaped this way:
- Refusals come after the handshake: the socket is accepted, then closed with a code and
  a short reason. A browser cannot read why an HTTP handshake was refused (its
  ``WebSocket`` only fires ``error`` and a close with 1006), but it reads a close code.
  No event frame is sent before the checks have passed.
- The resume point is the ``last_event_id`` query parameter: every WebSocket client,
  the browser's included, can set the URL (unlike headers), so the access asked of the
  ``authorize`` hook (``"read"`` or ``"resume"``) is known at once and the first event
  goes out without waiting. A first message ``{"last_event_id": "..."}`` is accepted
  only when ``resume_message_timeout`` is set: the server then waits that long for it
  (when the query parameter is absent), and a client that sends nothing gets its first
  event that much later. ``{"last_event_id": null}`` (or ``{}``) means "from the start"
  without the wait. An empty id means "from the start" too.
- The hub subscription feeds a bounded queue (``max_queue``) that a writer drains into
  the socket, so a slow client holds the queue and then falls behind in the store,
  where the hub's ``max_lag`` ends it (1013); a send stalled past ``send_timeout``
  ends it with a log line: 1013, or under uvicorn a reset when bytes are still waiting
  for the client (a close frame would queue behind them forever). The producer is never
  slowed: it runs in the hub.
- When no frame went out for ``ping_interval`` seconds, a ``ping`` event frame
  (``{"event":"ping","data":{"type":"ping"}}``, no id) is sent: protocol-level pings are
  invisible to a page's script and to some proxies' idle timers.
- The client closing or dropping ends the subscription at once (the hub's subscriber
  count drops); the turn goes on. Messages the client sends after the first are ignored.
- When the server shuts down (:func:`essessey.begin_shutdown` called, or uvicorn's
  shutdown detected), the subscription stops sending (a frame goes out whole or not at
  all; queued ones are dropped: the client gets them on resuming) and closes with 1012,
  "service restart": the server is going and the client should reconnect, with its last
  id, and it will be served (by another replica, with a shared store). Not 1001 "going
  away": :class:`WebSocketSource` (like many clients) takes 1001 for a clean end and
  would stop, not resume. 1012 is also what uvicorn sends when it closes the sockets it
  still holds at shutdown, so a client sees one code whichever comes first.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Final

import anyio
import orjson
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from essessey._ids import MAX_ID_LENGTH, is_event_id, is_token
from essessey._shutdown import wait_for_shutdown
from essessey.bindings.sse._hub import check_access
from essessey.bindings.sse._response import abort_stalled_connection
from essessey.bindings.ws._frame import encode_frame
from essessey.bindings.ws._source import CloseCode
from essessey.errors import (
    StoreUnavailable,
    StreamNotFound,
    StreamReset,
    SubscriberLagged,
    TooManySubscribers,
    UnknownEventId,
)
from essessey.event import Event
from essessey.hub import Access, StreamHub
from essessey.protocol import EventType

__all__ = ["websocket_subscription", "ws_route"]

logger = logging.getLogger("essessey.ws")

PING_FRAME: Final = encode_frame(Event(EventType.PING, b'{"type":"ping"}'))
"""The keep-alive frame: a protocol ``ping`` event without an id."""

_CLOSE_TIMEOUT: Final = 5.0
"""Seconds the close frame may take to go out (the client may have stopped reading)."""
_MAX_FIRST_MESSAGE: Final = 4 * MAX_ID_LENGTH + 64
"""The longest first message read for a last event id (an id escaped in JSON)."""


def _check_options(
    ping_interval: float, send_timeout: float | None, max_queue: int, resume_timeout: float | None
) -> None:
    if ping_interval < 0:
        raise ValueError("ping_interval must be >= 0 (0 disables the keep-alive)")
    if send_timeout is not None and send_timeout <= 0:
        raise ValueError("send_timeout must be > 0, or None for no timeout")
    if max_queue < 1:
        raise ValueError("max_queue must be >= 1")
    if resume_timeout is not None and resume_timeout <= 0:
        raise ValueError("resume_message_timeout must be > 0, or None for no first message")


@dataclass(slots=True)
class _Ending:
    """How the socket is to be closed, and whether the client is already gone."""

    code: int = CloseCode.NORMAL
    reason: str = "the turn ended"
    disconnected: bool = False
    shutdown: bool = False  # the server is shutting down: close with 1012
    idle: anyio.CancelScope | None = None  # the writer's wait for an event, while it waits

    def set(self, code: int, reason: str) -> None:
        self.code = code
        self.reason = reason


async def websocket_subscription(
    hub: StreamHub,
    websocket: WebSocket,
    stream_id: str,
    *,
    ping_interval: float = 15.0,
    send_timeout: float | None = 30.0,
    max_queue: int = 1024,
    resume_message_timeout: float | None = None,
) -> None:
    """Serve ``stream_id`` of ``hub`` on ``websocket``, one frame per event, until the
    turn ends (close 1000) or the client leaves; see the module docstring for the close
    codes and the rules. Call it from a Starlette WebSocket route; it accepts the socket
    (unless the route already has) and closes it.

    The resume point is the ``last_event_id`` query parameter, or, when
    ``resume_message_timeout`` is set and the parameter is absent, a first message
    ``{"last_event_id": "..." | null}`` sent within that many seconds.
    """
    _check_options(ping_interval, send_timeout, max_queue, resume_message_timeout)
    if websocket.application_state == WebSocketState.CONNECTING:
        await websocket.accept()
    if not is_token(stream_id):
        await _close(websocket, CloseCode.BAD_REQUEST, "invalid stream id")
        return
    last_event_id = websocket.query_params.get("last_event_id")
    if last_event_id is None and resume_message_timeout is not None:
        try:
            last_event_id = await _first_message(websocket, resume_message_timeout)
        except WebSocketDisconnect:
            return
        except ValueError as exc:
            await _close(websocket, CloseCode.BAD_REQUEST, str(exc))
            return
    if last_event_id == "":
        last_event_id = None
    if last_event_id is not None and not is_event_id(last_event_id):
        await _close(websocket, CloseCode.BAD_REQUEST, "invalid last event id")
        return
    access: Access = "resume" if last_event_id is not None else "read"
    allowed = await check_access(hub, websocket, stream_id, access, logger)
    if allowed is None:
        await _close(websocket, CloseCode.TRY_AGAIN_LATER, "could not check access; try later")
        return
    if not allowed:
        await _close(websocket, CloseCode.FORBIDDEN, f"not allowed to {access} this stream")
        return
    ending = _Ending()
    send_stream, receive_stream = anyio.create_memory_object_stream[Event](max_queue)
    with receive_stream:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(_watch_disconnect, websocket, tasks.cancel_scope, ending)
            tasks.start_soon(_follow, hub, stream_id, last_event_id, send_stream, ending)
            tasks.start_soon(_watch_shutdown, ending)
            clock = _SendClock()
            if send_timeout is not None:
                tasks.start_soon(_watch_sends, clock, send_timeout, tasks.cancel_scope, ending)
            try:
                await _write(websocket, receive_stream, ending, ping_interval, clock)
            finally:
                # Cancelled while the queue is still open: the subscription, maybe
                # blocked on a full queue, sees a cancellation and is closed.
                tasks.cancel_scope.cancel()
    if clock.started is not None and abort_stalled_connection():
        # A send stalled (the watchdog cut it): a close frame would wait behind frames the
        # client is not reading, and the server would hold the socket until it reads.
        ending.disconnected = True
    if not ending.disconnected:
        await _close(websocket, ending.code, ending.reason)


async def _first_message(websocket: WebSocket, window: float) -> str | None:
    """The last event id of the client's first message; None when it gives none or no
    message came within ``window`` seconds (from the start, either way). ValueError for a
    message that is not ``{"last_event_id": str | null}``; WebSocketDisconnect when the
    client left."""
    message: Any = None
    with anyio.move_on_after(window):
        message = await websocket.receive()
    if message is None:
        return None
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", CloseCode.NO_STATUS))
    data = message.get("text")
    if data is None:
        data = message.get("bytes") or b""
    if len(data) > _MAX_FIRST_MESSAGE:
        raise ValueError("first message too long")
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise ValueError("first message is not JSON") from None
    if not isinstance(parsed, dict):
        raise ValueError("first message is not a JSON object")
    last_event_id = parsed.get("last_event_id")
    if last_event_id is None or isinstance(last_event_id, str):
        return last_event_id
    raise ValueError("invalid last event id")


async def _watch_disconnect(
    websocket: WebSocket, scope: anyio.CancelScope, ending: _Ending
) -> None:
    # The client's messages are read (and dropped) so its close is seen at once.
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            logger.debug("WebSocket client left; ending its subscription")
            ending.disconnected = True
            scope.cancel()
            return


async def _watch_shutdown(ending: _Ending) -> None:
    await wait_for_shutdown()
    ending.shutdown = True
    # Only the writer's wait is cancelled, never a send; a writer in a send sees the flag
    # when it returns.
    idle = ending.idle
    if idle is not None:
        idle.cancel()


async def _follow(
    hub: StreamHub,
    stream_id: str,
    last_event_id: str | None,
    stream: MemoryObjectSendStream[Event],
    ending: _Ending,
) -> None:
    async with stream:
        events = hub.subscribe(stream_id, last_event_id)
        try:
            async for event in events:
                # The queue usually has room: skip the checkpoint a send() always makes.
                try:
                    stream.send_nowait(event)
                except anyio.WouldBlock:
                    await stream.send(event)
        except StreamNotFound:
            ending.set(CloseCode.NOT_FOUND, "no such stream")
        except UnknownEventId:
            ending.set(CloseCode.RESUME_UNAVAILABLE, "last event id not retained; start over")
        except StreamReset:
            ending.set(CloseCode.RESUME_UNAVAILABLE, "the stream was reset; start over")
        except TooManySubscribers:
            ending.set(CloseCode.TRY_AGAIN_LATER, "too many subscribers")
        except (SubscriberLagged, StoreUnavailable) as exc:
            # The store still holds the client's last id: it reconnects with it.
            logger.warning(
                "ending a WebSocket subscription of %s: %s", stream_id, type(exc).__name__
            )
            ending.set(CloseCode.TRY_AGAIN_LATER, "reconnect with the last event id")
        except Exception:
            logger.exception("a WebSocket subscription of %s failed", stream_id)
            ending.set(CloseCode.INTERNAL_ERROR, "internal error")
        finally:
            await events.aclose()


async def _write(
    websocket: WebSocket,
    stream: MemoryObjectReceiveStream[Event],
    ending: _Ending,
    ping_interval: float,
    clock: _SendClock,
) -> None:
    wait = ping_interval or math.inf
    while True:
        if ending.shutdown:
            ending.set(CloseCode.SERVICE_RESTART, "the server is shutting down; reconnect")
            return
        event: Event | None = None
        try:
            # Drain what is queued without a timer; wait under the ping timer only when
            # the queue is empty (a scope per event cost about 40% of this loop).
            event = stream.receive_nowait()
        except anyio.WouldBlock:
            with anyio.move_on_after(wait) as idle:
                ending.idle = idle
                try:
                    event = await stream.receive()
                except anyio.EndOfStream:
                    return  # the subscription ended; ``ending`` says how
                finally:
                    ending.idle = None
            if ending.shutdown:
                continue
        except anyio.EndOfStream:
            return
        if event is None:
            frame = PING_FRAME  # quiet for ping_interval
        else:
            try:
                frame = encode_frame(event)
            except ValueError:
                logger.exception("an event of a WebSocket subscription cannot be framed")
                ending.set(CloseCode.INTERNAL_ERROR, "internal error")
                return
        clock.started = time.monotonic()
        try:
            await websocket.send_text(frame)
        except (WebSocketDisconnect, OSError):
            logger.debug("the WebSocket client went away during a send")
            ending.disconnected = True
            return
        clock.started = None


class _SendClock:
    """When the send in progress started (None between sends), for the watchdog."""

    __slots__ = ("started",)

    def __init__(self) -> None:
        self.started: float | None = None


async def _watch_sends(
    clock: _SendClock, limit: float, scope: anyio.CancelScope, ending: _Ending
) -> None:
    # One watchdog per connection instead of a timeout scope around every send: a scope
    # per frame (a timer on the loop each time) was the largest cost of the writer.
    while True:
        await anyio.sleep(min(limit / 4, 1.0))
        started = clock.started
        if started is not None and time.monotonic() - started > limit:
            logger.warning(
                "a WebSocket send stalled for more than %.1f s; ending the subscription", limit
            )
            ending.set(CloseCode.TRY_AGAIN_LATER, "send timed out")
            scope.cancel()
            return


async def _close(websocket: WebSocket, code: int, reason: str) -> None:
    with anyio.move_on_after(_CLOSE_TIMEOUT):
        try:
            await websocket.close(code, reason)
        except (WebSocketDisconnect, OSError, RuntimeError):
            # Gone already (Starlette raises RuntimeError once a close went either way).
            logger.debug("could not send the WebSocket close frame; the client is gone")


def ws_route(
    hub: StreamHub,
    path: str = "/streams/{stream_id}/ws",
    *,
    ping_interval: float = 15.0,
    send_timeout: float | None = 30.0,
    max_queue: int = 1024,
    resume_message_timeout: float | None = None,
) -> WebSocketRoute:
    """A Starlette ``WebSocketRoute`` at ``path`` (which must hold ``{stream_id}``)
    serving :func:`websocket_subscription` with these options."""
    if "{stream_id}" not in path and "{stream_id:" not in path:
        raise ValueError("the path must hold a {stream_id} parameter")
    _check_options(ping_interval, send_timeout, max_queue, resume_message_timeout)

    async def subscribe(websocket: WebSocket) -> None:
        await websocket_subscription(
            hub,
            websocket,
            websocket.path_params["stream_id"],
            ping_interval=ping_interval,
            send_timeout=send_timeout,
            max_queue=max_queue,
            resume_message_timeout=resume_message_timeout,
        )

    return WebSocketRoute(path, subscribe)
