"""An ASGI response that streams a turn to a browser as SSE.

Give it a producer (``async def produce(publisher)``) or a source (an async iterable of
events, such as a hub subscription). Return it from a Starlette or FastAPI route, or mount
it as a bare ASGI app. What it takes care of, and why:

- The status line waits for the first event. A producer that refuses the stream
  (:class:`~essessey.StreamRejected`) before emitting anything gets a real HTTP error
  with a JSON body, which clients can tell from a stream; after the first event only an
  ``error`` event can say that something failed.
- Events that queue up while the client reads slower than the producer writes go out in
  one ASGI send. It never waits to fill a batch: it writes what is queued.
- The queue is bounded, so a slow client slows its producer instead of growing memory.
- A keep-alive comment goes out after ``ping_interval`` seconds without an event, so
  proxies and browsers do not drop an idle stream.
- The client leaving (``http.disconnect``) cancels the producer at once (a source is
  closed).
- A send stalled past ``send_timeout`` ends the response, with a log line, and cancels
  the producer.
- When the server shuts down (:func:`essessey.begin_shutdown` called, or uvicorn's
  shutdown detected), the response stops sending events, sends
  ``retry: <shutdown_retry>`` and ends, and the producer is cancelled (a source is
  closed: for a hub subscription that ends the subscription, never the turn). Otherwise
  uvicorn would wait for the stream before it shuts down, forever by default. Only whole
  events are sent, so the client's last event id is the last event it has whole; events
  still queued are dropped, not flushed, because a slow client could hold the shutdown
  up and a resuming client gets them anyway. The retry hint spaces out the reconnects
  (an EventSource reconnects by itself, the hint sets its delay). A producer's turn is
  cut there, having nowhere to resume from: run turns in a :class:`~essessey.StreamHub`,
  or pass ``shutdown_retry=None`` to let a response run to its end (and bound the wait
  with uvicorn's ``timeout_graceful_shutdown``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
import struct
from collections.abc import AsyncIterable, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Final, TypeAlias

import anyio
import orjson
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from starlette.background import BackgroundTask
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from essessey._shutdown import wait_for_shutdown
from essessey.bindings.sse._writer import encode, format_message
from essessey.errors import StreamRejected
from essessey.event import Event, Source
from essessey.protocol import Dialect, EventType
from essessey.publisher import Publisher

__all__ = ["EventStreamResponse", "Producer"]

logger = logging.getLogger("essessey.sse")

Producer: TypeAlias = Callable[[Publisher], Awaitable[None]]
"""An async function that publishes a stream through the Publisher it is given."""

_PING: Final = format_message(comment="ping")
_SSE_HEADERS: Final = (
    (b"cache-control", b"no-cache"),
    # nginx buffers proxied responses unless told not to; a stream must not be buffered.
    (b"x-accel-buffering", b"no"),
)


def error_body(error_type: str, message: str) -> bytes:
    """The JSON body of an error answered before a stream starts (the Anthropic shape)."""
    return orjson.dumps({"type": "error", "error": {"type": error_type, "message": message}})


@dataclass(slots=True)
class _Run:
    """What one request's tasks tell each other."""

    failure: BaseException | None = None
    last_was_error: bool = False
    started: bool = False
    shutdown: bool = False  # the server is shutting down: end with the retry hint
    idle: anyio.CancelScope | None = None  # the writer's wait for an event, while it waits


class _QueueSink:
    """The sink a producer writes into: a bounded queue the response drains."""

    __slots__ = ("_run", "_stream")

    def __init__(self, stream: MemoryObjectSendStream[Event], run: _Run) -> None:
        self._stream = stream
        self._run = run

    async def emit(self, event: Event) -> None:
        await self._stream.send(event)
        self._note(event)

    def emit_nowait(self, event: Event) -> bool:
        try:
            self._stream.send_nowait(event)
        except anyio.WouldBlock:
            return False
        self._note(event)
        return True

    def _note(self, event: Event) -> None:
        self._run.last_was_error = event.event == EventType.ERROR


class EventStreamResponse(Response):
    """Streams events as ``text/event-stream``; see the module docstring for the rules.

    ``content`` is a producer (``async def produce(publisher: Publisher) -> None``) or a
    source (an async iterable of :class:`~essessey.Event`). ``dialect`` and ``strict`` shape
    the Publisher given to a producer. ``retry`` (milliseconds) is sent first as the
    client's reconnection delay. ``max_queue`` bounds the events waiting for the client;
    ``max_batch_bytes`` bounds one write. ``shutdown_retry`` (milliseconds, 1000 by
    default) is the reconnection delay sent when the server shuts down, as the response
    ends; None lets the response run to its end through a shutdown.
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        content: Producer | Source,
        *,
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
        dialect: Dialect = "essessey",
        strict: bool = True,
        ping_interval: float = 15.0,
        retry: int | None = None,
        send_timeout: float | None = 30.0,
        max_queue: int = 1024,
        max_batch_bytes: int = 256 * 1024,
        background: BackgroundTask | None = None,
        shutdown_retry: int | None = 1000,
    ) -> None:
        if ping_interval < 0:
            raise ValueError("ping_interval must be >= 0 (0 disables the keep-alive)")
        if send_timeout is not None and send_timeout <= 0:
            raise ValueError("send_timeout must be > 0, or None for no timeout")
        if max_queue < 1 or max_batch_bytes < 1:
            raise ValueError("max_queue and max_batch_bytes must be >= 1")
        self._retry = format_message(retry=retry) if retry is not None else b""
        self.shutdown_retry = shutdown_retry
        self._shutdown_tail = (
            format_message(retry=shutdown_retry) if shutdown_retry is not None else b""
        )
        self.content = content
        self.status_code = status_code
        self.background = background
        self.dialect: Dialect = dialect
        self.strict = strict
        self.ping_interval = ping_interval
        self.send_timeout = send_timeout
        self.max_queue = max_queue
        self.max_batch_bytes = max_batch_bytes
        self.init_headers(headers)
        self.raw_headers.extend(h for h in _SSE_HEADERS if h[0] not in dict(self.raw_headers))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("method") == "HEAD":
            # Headers only: starting the producer for a body nobody reads would run a
            # whole turn for nothing.
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return
        run = _Run()
        send_stream, receive_stream = anyio.create_memory_object_stream[Event](self.max_queue)
        with receive_stream:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self._watch_disconnect, receive, tasks.cancel_scope)
                tasks.start_soon(self._produce, send_stream, run)
                if self.shutdown_retry is not None:
                    tasks.start_soon(self._watch_shutdown, run)
                try:
                    await self._write(send, receive_stream, run)
                finally:
                    # Cancelled while the queue is still open: a producer blocked on a
                    # full queue (the send stalled) must see a cancellation, not a
                    # BrokenResourceError it would take for a failure of its own.
                    tasks.cancel_scope.cancel()
        if self.background is not None and run.started:
            await self.background()

    async def _watch_disconnect(self, receive: Receive, scope: anyio.CancelScope) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                logger.debug("client disconnected; cancelling the stream")
                scope.cancel()
                return

    @staticmethod
    async def _watch_shutdown(run: _Run) -> None:
        await wait_for_shutdown()
        run.shutdown = True
        # Only the writer's wait for an event is cancelled, never a send: an event is
        # sent whole or not at all. A writer in a send sees the flag when it returns.
        idle = run.idle
        if idle is not None:
            idle.cancel()

    async def _produce(self, stream: MemoryObjectSendStream[Event], run: _Run) -> None:
        async with stream:
            sink = _QueueSink(stream, run)
            try:
                content = self.content
                if isinstance(content, AsyncIterable):
                    await self._drain(content, sink)
                else:
                    await content(Publisher(sink, dialect=self.dialect, strict=self.strict))
            except Exception as exc:
                run.failure = exc

    @staticmethod
    async def _drain(source: Source, sink: _QueueSink) -> None:
        iterator = aiter(source)
        try:
            async for event in iterator:
                # Into the queue without a checkpoint while it has room: awaiting each
                # event handed the writer one event per send (no coalescing) when a
                # source had a backlog, such as a hub subscription replaying.
                if not sink.emit_nowait(event):
                    await sink.emit(event)
        finally:
            # A source parked at a yield (its event waiting for room in the queue) would
            # otherwise be finalised only when the garbage collector gets to it, and
            # the response itself may hold it: close it now, on any early end.
            aclose = getattr(iterator, "aclose", None)
            if aclose is not None:
                await aclose()

    async def _write(self, send: Send, stream: MemoryObjectReceiveStream[Event], run: _Run) -> None:
        wait = self.ping_interval or math.inf
        while True:
            if run.shutdown:
                # The event the writer may hold is dropped: the client resumes from the
                # last one it got whole.
                await self._send_body(send, run, self._shutdown_tail, more=False)
                return
            event: Event | None = None
            with anyio.move_on_after(wait) as idle:
                run.idle = idle
                try:
                    event = await stream.receive()
                except anyio.EndOfStream:
                    break
                finally:
                    run.idle = None
            if run.shutdown:
                continue
            if event is None:
                # Quiet for ping_interval: a comment keeps proxies from closing it.
                if not await self._send_body(send, run, _PING):
                    return
                continue
            frames: list[bytes] = []
            size = 0
            unframable = False
            while True:
                try:
                    frame = encode(event)
                except ValueError as exc:
                    # An event from a source with CR, LF or NUL in its id or name: it
                    # cannot be written as it is. It ends the stream like a failure.
                    if run.failure is None:
                        run.failure = exc
                    unframable = True
                    break
                frames.append(frame)
                size += len(frame)
                if size >= self.max_batch_bytes:
                    break
                try:
                    event = stream.receive_nowait()
                except (anyio.WouldBlock, anyio.EndOfStream):
                    break
            if frames:
                body = b"".join(frames)
                # A stalled send waits (up to send_timeout) holding the joined body: not
                # its parts as well, which would double what a slow client costs.
                frames.clear()
                if not await self._send_body(send, run, body):
                    return
            if unframable:
                break
        await self._finish(send, run)

    async def _finish(self, send: Send, run: _Run) -> None:
        failure = run.failure
        if failure is not None and not run.started:
            if isinstance(failure, StreamRejected):
                await self._send_error(send, failure.status, failure.error_type, failure.message)
            else:
                logger.error("the stream failed before its first event", exc_info=failure)
                await self._send_error(send, 500, "api_error", "Internal server error")
            return
        tail = b""
        if failure is not None and not run.last_was_error:
            if isinstance(failure, StreamRejected):
                error_type, message = failure.error_type, failure.message
            else:
                logger.error("the stream failed after it started", exc_info=failure)
                error_type, message = "api_error", "Internal server error"
            tail = encode(Event(EventType.ERROR, error_body(error_type, message)))
        if not await self._send_body(send, run, tail, more=False):
            return

    async def _start(self, send: Send, run: _Run) -> None:
        run.started = True
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )

    async def _send_body(self, send: Send, run: _Run, body: bytes, *, more: bool = True) -> bool:
        """Send ``body`` (after the status line, the first time); False when the response
        must end: the client is gone or the send stalled past send_timeout."""
        timeout = self.send_timeout if self.send_timeout is not None else math.inf
        try:
            with anyio.fail_after(timeout):
                if not run.started:
                    await self._start(send, run)
                    if self._retry:
                        body = self._retry + body
                await send({"type": "http.response.body", "body": body, "more_body": more})
        except TimeoutError:
            logger.warning(
                "a send stalled for more than %.1f s; ending the response", self.send_timeout
            )
            abort_stalled_connection()
            return False
        except OSError:
            logger.debug("the client went away during a send")
            return False
        return True

    async def _send_error(self, send: Send, status: int, error_type: str, message: str) -> None:
        body = error_body(error_type, message)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def abort_stalled_connection() -> bool:
    """After a send stalled: abort the server's connection for the current request when it
    still holds bytes the client has not taken, so its socket and buffers are freed now.
    True when it did. Best effort; used by the SSE response and the WebSocket endpoint.

    ASGI has no way to say "abort". uvicorn closes the transport when the app returns, and
    an asyncio transport closes gracefully: it first waits for its buffer to drain, which
    a client that stopped reading never lets happen, so the socket, its kernel buffers and
    the unsent bytes would stay until that client leaves. The transport is found the way
    uvicorn runs an app: the current task is its ``run_asgi``, whose ``self`` holds the
    connection's ``transport`` (duck typed; uvicorn is never imported). Elsewhere (another
    server, the app run in a task of its own, a loop other than asyncio) nothing happens.
    Nothing is aborted while its buffer is empty: such a connection closes by itself (and
    with HTTP/2 it may carry other streams).
    """
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no asyncio loop running (trio)
        return False
    frame = getattr(task.get_coro() if task is not None else None, "cr_frame", None)
    owner = frame.f_locals.get("self") if frame is not None else None
    transport = getattr(owner, "transport", None)
    abort = getattr(transport, "abort", None)
    buffered = getattr(transport, "get_write_buffer_size", None)
    if not callable(abort) or not callable(buffered) or not buffered():
        return False
    logger.debug("aborting the stalled connection (%d bytes unsent)", buffered())
    extra = getattr(transport, "get_extra_info", None)
    sock = extra("socket") if callable(extra) else None
    if sock is not None:
        # A reset, not a FIN (SO_LINGER on, 0 s): closed with bytes unsent, the socket
        # would otherwise stay in the kernel, buffers and all, for minutes, probing a
        # receive window that never opens.
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    abort()
    return True
