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
- The hub subscription is read in the request's own task and each event handed to the
  connection's line (``essessey.bindings._line``, shared with the SSE response): at a
  model's pace a frame goes out in that task's own write (no queue, no task switch per
  frame); frames that come while a send is in progress are held (at most ``max_queue``)
  and go out together. A slow client falls behind in the store, where the hub's
  ``max_lag`` ends it (1013); a send stalled past ``send_timeout`` ends it with a log
  line: 1013, or under uvicorn a reset when bytes are still waiting for the client (a
  close frame would queue behind them forever). The event loop's line watch notices the
  stall; no timer is set per frame or per connection. The producer is never slowed: it
  runs in the hub.
- When no frame went out for ``ping_interval`` seconds, a ``ping`` event frame
  (``{"event":"ping","data":{"type":"ping"}}``, no id) is sent: protocol-level pings are
  invisible to a page's script and to some proxies' idle timers.
- The client closing or dropping ends the subscription at once (the hub's subscriber
  count drops); the turn goes on. Messages the client sends after the first are ignored.
- When the server shuts down (:func:`essessey.shutdown.begin_shutdown` called, or uvicorn's
  shutdown detected), the subscription stops sending (a frame goes out whole or not at
  all; queued ones are dropped: the client gets them on resuming) and closes with 1012,
  "service restart": the server is going and the client should reconnect, with its last
  id, and it will be served (by another replica, with a shared store). Not 1001 "going
  away": :class:`WebSocketSource` (like many clients) takes 1001 for a clean end and
  would stop, not resume. 1012 is also what uvicorn sends when it closes the sockets it
  still holds at shutdown, so a client sees one code whichever comes first.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any, Final

import anyio
import anyio.lowlevel
import orjson
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from essessey import metrics
from essessey._ids import MAX_ID_LENGTH, is_stream_id
from essessey._logsafe import log_failure
from essessey.bindings._asgi import (
    EVENTS_PER_TURN,
    SubscriptionCount,
    backlog_turn,
    connection_tasks,
    subscription_end,
    watch_line,
)
from essessey.bindings._line import Line, LineEnded
from essessey.bindings._uvicorn import FrameWriter, frame_writer
from essessey.bindings.admission import Refusal, admit
from essessey.bindings.ws._frame import encode_frame, frame_bytes, frame_fields
from essessey.bindings.ws._guard import stall_guard
from essessey.bindings.ws._source import CloseCode
from essessey.event import Event
from essessey.hub import StreamHub
from essessey.metrics import totals
from essessey.protocol import EventType
from essessey.shutdown import on_shutdown, shutting_down

__all__ = ["websocket_subscription", "ws_route"]

logger = logging.getLogger("essessey.ws")

PING_FRAME: Final = encode_frame(Event(EventType.PING, b'{"type":"ping"}'))
_PING_BYTES: Final = PING_FRAME.encode()
"""The keep-alive frame: a protocol ``ping`` event without an id."""

_MAX_BATCH_BYTES: Final = 256 * 1024
"""The most bytes of held frames one send writes."""
_CLOSE_TIMEOUT: Final = 5.0
"""Seconds the close frame may take to go out (the client may have stopped reading)."""
_YIELD_EVERY: Final = 4
"""Frames written through ASGI between turns of the event loop (see ``_WSWire.send``)."""
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
    if not is_stream_id(stream_id):
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
    admitted = await admit(hub, websocket, stream_id, last_event_id, logger)
    if isinstance(admitted, Refusal):
        await _close(websocket, admitted.close_code, admitted.message)
        return
    last_event_id = admitted.last_event_id
    if shutting_down():
        # Opened while the server shuts down: the client reconnects, elsewhere.
        await _close(websocket, CloseCode.SERVICE_RESTART, "the server is shutting down; reconnect")
        return
    ending = _Ending()
    async with connection_tasks() as tasks:
        wire = _WSWire(websocket, ending, send_timeout)
        line = Line(
            wire,
            tasks.cancel,
            kind="websocket",
            log=logger,
            ping=_PING_BYTES,
            ping_interval=ping_interval,
            send_timeout=send_timeout,
            max_queue=max_queue,
            max_batch_bytes=_MAX_BATCH_BYTES,
            started=True,
        )
        tasks.start_soon(_watch_disconnect, websocket, tasks.cancel, ending)
        unwatch = watch_line(line)
        tasks.start_soon(line.run)

        def stop() -> None:
            ending.shutdown = True
            ending.set(CloseCode.SERVICE_RESTART, "the server is shutting down; reconnect")
            line.stop()

        # A callback, not a task per connection waiting for the shutdown.
        forget = on_shutdown(stop)
        try:
            # The subscription is read in the request's own task and each event handed
            # to the line from here: at a model's pace an event costs one write and no
            # task switch.
            await _follow(hub, stream_id, last_event_id, line, ending)
        finally:
            unwatch()
            forget()
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
    websocket: WebSocket, cancel: Callable[[], None], ending: _Ending
) -> None:
    # The client's messages are read (and dropped) so its close is seen at once.
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            logger.debug("WebSocket client left; ending its subscription")
            ending.disconnected = True
            cancel()
            return


async def _follow(
    hub: StreamHub,
    stream_id: str,
    last_event_id: str | None,
    line: Line,
    ending: _Ending,
) -> None:
    count = SubscriptionCount("websocket", last_event_id is not None)
    error: Exception | None = None
    handled = 0
    events: AsyncGenerator[Event, None] | None = None
    opened = time.monotonic()
    try:
        subscription = await hub.open(stream_id, last_event_id)
        # A live event goes out in the turn's own append while the line takes it now.
        subscription.deliver_live(_LiveTaker(line, ending))
        events = aiter(subscription)
        async for event in events:
            count.started()
            handled += 1
            if handled == EVENTS_PER_TURN:
                handled = 0
                await backlog_turn()  # a replay must not hold up live turns
            try:
                frame = frame_bytes(event)
            except ValueError as exc:
                log_failure(logger, exc, "an event of a WebSocket subscription cannot be framed")
                ending.set(CloseCode.INTERNAL_ERROR, "internal error")
                return
            if opened:
                opened = _first(opened)
            totals.websocket_events += 1
            totals.websocket_bytes += len(frame)
            if not line.offer(frame):
                await line.write(frame)
        await line.finish(b"")  # what is held goes out before the close frame
    except LineEnded:
        if not (ending.shutdown or line.stalled):
            ending.disconnected = True  # a send found the client gone
    except Exception as exc:
        error = exc
        end = subscription_end(exc)
        if end is None:
            log_failure(logger, exc, "a WebSocket subscription of %s failed", stream_id)
            ending.set(CloseCode.INTERNAL_ERROR, "internal error")
            return
        if end.status is None:
            logger.warning(
                "ending a WebSocket subscription of %s: %s", stream_id, type(exc).__name__
            )
        ending.set(end.close_code, end.reason)
        with contextlib.suppress(LineEnded):
            await line.finish(b"")
    finally:
        count.ended(error)
        if events is not None:
            with anyio.CancelScope(shield=True):
                await events.aclose()


def _first(opened: float) -> float:
    """The first event of a subscription goes out: the metrics' time to it; 0.0, so
    that the caller asks no more."""
    metrics.first_event("websocket", time.monotonic() - opened)
    return 0.0


class _LiveTaker:
    """A subscription's live events in the turn's own append (see
    ``essessey.stores.Taker``): each taken when the line takes it now; False, having
    written nothing and never raising, otherwise."""

    __slots__ = ("_ending", "_line")

    def __init__(self, line: Line, ending: _Ending) -> None:
        self._line = line
        self._ending = ending

    def take(self, name: str, data: bytes, event_id: str) -> bool:
        ending = self._ending
        if ending.shutdown or ending.disconnected:
            return False
        try:
            # The framing keeps no state: a frame the line refuses is made again when
            # the event comes through the subscription, and nothing else is lost.
            frame = frame_fields(name, data, event_id)
            if not self._line.offer(frame):
                return False
        except (Exception, LineEnded):
            return False  # the subscription's own loop reads it, and ends on it
        totals.websocket_events += 1
        totals.websocket_bytes += len(frame)
        return True

    def take_text(
        self, data: bytes, id_head: bytes, seq: int, index: int, text: str, text_json: bytes
    ) -> bool:
        return self.take(EventType.CONTENT_BLOCK_DELTA, data, f"{id_head.decode()}{seq}")


class _WSWire:
    """How a WebSocket subscription's frames reach the client: one text frame per
    event, written straight to the server's transport where that is safe (see
    ``frame_writer``), through ASGI otherwise."""

    __slots__ = ("_abort", "_ending", "_websocket", "_writer", "direct")

    def __init__(self, websocket: WebSocket, ending: _Ending, send_timeout: float | None) -> None:
        self._websocket = websocket
        self._ending = ending
        # Found now, in the request's own task (see stall_guard and frame_writer).
        self._abort = stall_guard(send_timeout)
        writer: FrameWriter | None = frame_writer()
        self._writer = writer
        self.direct: Callable[[bytes], bool] | None = None if writer is None else writer.write

    async def send(self, frames: list[bytes], *, start: bool, more: bool) -> None:
        frames = [frame for frame in frames if frame]
        writer = self._writer
        if not frames or (writer is not None and writer.write_joined(frames)):
            return
        websocket = self._websocket
        for n, frame in enumerate(frames, 1):
            if n % _YIELD_EVERY == 0:
                # uvicorn's send never waits: a replay held whole would be written into a
                # connection the client dropped (asyncio logging every write) before the
                # disconnect is seen. A turn of the loop lets it be seen.
                await anyio.lowlevel.checkpoint()
                if self._ending.disconnected:
                    raise ConnectionResetError("the WebSocket client went away")
            try:
                await websocket.send_text(frame.decode())
            except (WebSocketDisconnect, OSError, RuntimeError):
                # RuntimeError: the server closed the connection itself (uvicorn does on a
                # client's protocol error, such as a frame of invalid UTF-8) and refuses
                # any further send, as Starlette does once a close went either way.
                logger.debug("the WebSocket client went away during a send")
                self._ending.disconnected = True
                raise ConnectionResetError("the WebSocket client went away") from None

    def stalled(self) -> None:
        ending = self._ending
        ending.set(CloseCode.TRY_AGAIN_LATER, "send timed out")
        if self._abort():
            # A close frame would wait behind frames the client is not reading, and the
            # server would hold the socket until it reads.
            ending.disconnected = True


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
