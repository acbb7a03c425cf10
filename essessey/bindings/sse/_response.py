"""An ASGI response that streams a turn to a browser as SSE.

Give it a producer (``async def produce(publisher)``) or a source (an async iterable of
events, such as a hub subscription). Return it from a Starlette or FastAPI route, or mount
it as a bare ASGI app. What it takes care of, and why:

- The status line waits for the first event. A producer that refuses the stream
  (:class:`~essessey.StreamRejected`) before emitting anything gets a real HTTP error
  with a JSON body, which clients can tell from a stream; after the first event only an
  ``error`` event can say that something failed. A source that raises
  :class:`~essessey.StreamInterrupted` (a hub subscription whose store went out of reach)
  ends the body with nothing more, even before its first event: no error event, no
  dialect's end, no ``empty_status``, so the client reconnects with its last id.
- An event goes out in the producer's own send when nothing else is being written: at a
  model's pace (a token every few tens of milliseconds) each event costs one ASGI send
  and no task switch. Events that come while a send is in progress, or in a burst (one
  right after another, a replay), are held and go out together in one send by whoever
  writes next. It never waits to fill a batch: it writes what is held.
- What is held is bounded (``max_queue`` events), so a slow client slows its producer
  instead of growing memory.
- A keep-alive comment goes out after ``ping_interval`` seconds without an event, so
  proxies and browsers do not drop an idle stream.
- The client leaving (``http.disconnect``) cancels the producer at once (a source is
  closed).
- A send stalled past ``send_timeout`` ends the response, with a log line, and cancels
  the producer. One watchdog per response notices it (no timer around each send).
- When the server shuts down (:func:`essessey.shutdown.begin_shutdown` called, or uvicorn's
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

import contextlib
import logging
import math
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Callable,
    Coroutine,
    Mapping,
    Sequence,
)
from typing import Any, Final, Protocol, TypedDict, cast, runtime_checkable

import anyio
import anyio.lowlevel
from starlette.background import BackgroundTask
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from essessey import metrics
from essessey.bindings._asgi import (
    EVENTS_PER_TURN,
    backlog_turn,
    connection_tasks,
    watch_line,
)
from essessey.bindings._server import BodyWriter, body_writer, connection_aborter
from essessey.bindings.sse._encoder import (
    ErrorShape,
    FrameEncoder,
    ProtocolFrames,
    TextDeltaEncoder,
)
from essessey.bindings.sse._format import encode, error_body, format_message
from essessey.errors import StreamInterrupted, StreamRejected
from essessey.event import Event, EventBatch, Source
from essessey.metrics import totals
from essessey.protocol import Dialect, EventType
from essessey.publisher import Publisher, TurnProducer
from essessey.shutdown import on_shutdown, shutting_down

__all__ = ["RESUME_HEADERS_WITHIN", "DeliveringSource", "EventStreamResponse", "SSEOptions"]

logger = logging.getLogger("essessey.sse")


# A comment line with no blank line after it: a valid keep-alive that no decoder
# dispatches on (httpx-sse and decoders built like it turn a blank line after a
# field-only block into an empty event). Written only between whole events.
_PING: Final = b": ping\n"
_BODY_HEADERS: Final = frozenset((b"content-type", b"content-length"))
"""Headers that describe a body: an error or empty answer sets its own."""

_SSE_HEADERS: Final = (
    (b"cache-control", b"no-cache"),
    # nginx buffers proxied responses unless told not to; a stream must not be buffered.
    (b"x-accel-buffering", b"no"),
)
# The frame head of each event a Publisher batches (its data is JSON from orjson: no
# line break in it, so one data line).
_BATCH_PREFIXES: Final = {EventType.CONTENT_BLOCK_DELTA: b"event: content_block_delta\ndata: "}
_PROTOCOL_FRAMES: Final = ProtocolFrames()
RESUME_HEADERS_WITHIN: Final = 0.25
"""Seconds a resume's response waits for its first event before it sends its headers
without one: long enough for the store to refuse the id (an HTTP error) or to end a
finished turn with nothing after it (a 204), far below any proxy's idle timeout."""
_BURST: Final = 0.0005
"""Seconds after a send within which the next event is taken for part of a burst: it is
held for the next send instead of going out in a send of its own."""


def refusal_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """The app's ``headers`` that go on a refusal or an empty answer too (a CORS header
    lets a cross-origin client read it): all but those describing a body, which that
    answer sets itself."""
    return {
        name: value
        for name, value in (headers or {}).items()
        if name.lower().encode("latin-1") not in _BODY_HEADERS
    }


class _Ended(BaseException):
    """The response has ended (the client left, a send stalled, the server shuts down):
    the producer is being cancelled, and nothing more is written. A BaseException, as a
    cancellation is: a producer's ``except Exception`` must not take it for a failure of
    its own and try to publish an error into a closed response."""


class _Outbox:
    """One response's writes: in the writer's own send when the line is free, held and
    joined otherwise. Whoever holds the send (``sending``) writes what was held before
    it lets go, so the events keep their order.

    The flusher task writes what is held when nobody else will (a producer that held
    events and then went quiet), sends the keep-alive comment when it is due and ends the
    body when the server shuts down. The deadlines (the keep-alive, a send stalled past
    ``send_timeout``) are kept by the event loop's line watch, which calls :meth:`check`:
    no timer is set per send.
    """

    __slots__ = (
        "_abort",
        "_burst_until",
        "_cancel",
        "_direct",
        "_flusher_wake",
        "_held",
        "_held_bytes",
        "_idle",
        "_ping_due",
        "_response",
        "_room",
        "_send",
        "_start_due",
        "ended",
        "last_sent",
        "last_was_error",
        "opened",
        "send_began",
        "sending",
        "started",
        "stopping",
    )

    def __init__(
        self, response: EventStreamResponse, send: Send, cancel: anyio.CancelScope, method: str
    ) -> None:
        self._response = response
        self._send = send
        self._cancel = cancel
        # Found now, in the request's own task: the watchdog that may need it runs in
        # another task (see connection_aborter).
        self._abort = connection_aborter()
        # A body chunk written straight to the server's transport costs a fraction of an
        # ASGI send (see body_writer); None where that is not safe.
        self._direct: BodyWriter | None = body_writer(
            send, method, response.status_code, response.raw_headers
        )
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._room: anyio.Event | None = None  # set when held events went out
        self._idle: anyio.Event | None = None  # set when a send ends and nothing is held
        self._flusher_wake: anyio.Event | None = None
        self._ping_due = False
        self._start_due = False  # the headers are due before any event (see headers_within)
        self.sending = False
        self.started = False
        self.ended = False
        self.stopping = False  # the server is shutting down: end with the retry hint
        self.last_was_error = False
        self.send_began = 0.0
        self.last_sent = self.opened = time.monotonic()  # the keep-alive counts from here
        self._burst_until = 0.0  # the first event goes out at once

    # -- the producer's side -----------------------------------------------------------

    @property
    def held(self) -> bool:
        """Whether events wait for the next send."""
        return bool(self._held)

    def takes_now(self) -> bool:
        """Whether :meth:`put` would take a frame now, asked before the event is
        encoded: a dialect's encoder is stateful and sees each event once, so nothing is
        encoded that the line then refuses. False when the frame must go through
        :meth:`write` (an ASGI send: no direct writer, the response not started, the
        server stopping; or ``max_queue`` frames held already)."""
        if self.ended:
            raise _Ended
        if not self.sending and not self._held and time.monotonic() > self._burst_until:
            # The paced path, one event on a free line: written straight to the transport.
            return self._direct is not None and self.started and not self.stopping
        return len(self._held) < self._response.max_queue

    def put(self, frame: bytes) -> None:
        """Take ``frame`` (after :meth:`takes_now` said yes): written now, straight to
        the server's transport, when the line is free and this is no burst; held for the
        next send otherwise, or when the transport is full (its slow client then paces
        the sends of what is held, and ``max_queue`` the producer)."""
        if not self.sending and not self._held:
            now = time.monotonic()
            direct = self._direct
            if now > self._burst_until and direct is not None and direct.write(frame):
                self.last_sent = now
                self._burst_until = now + _BURST
                return
        self._held.append(frame)
        self._held_bytes += len(frame)
        if not self.sending:
            self._wake_flusher()

    async def write(self, frame: bytes) -> None:
        """Send ``frame`` now, or hold it while another send is in progress (waiting
        for room when ``max_queue`` events are held already)."""
        if not (self.sending or self._held or self.ended or self.stopping) and self.started:
            # One event and a free line: the send itself, nothing more.
            self.sending = True
            self.send_began = time.monotonic()
            try:
                await self._send({"type": "http.response.body", "body": frame, "more_body": True})
            except OSError:
                logger.debug("the client went away during a send")
                self._end()
                raise _Ended from None
            finally:
                self._sent()
            if self._held and not self.ended:
                await self._drain()  # what another task held meanwhile
            return
        if self.ended:
            raise _Ended
        if self.sending or self._held:
            while len(self._held) >= self._response.max_queue:
                room = self._room
                if room is None:
                    room = self._room = anyio.Event()
                await room.wait()
                if self.ended:
                    raise _Ended
            self._held.append(frame)
            self._held_bytes += len(frame)
            if not self.sending:
                await self._drain()
            return
        await self._send_all(frame)

    async def finish(self, tail: bytes) -> None:
        """End the body with ``tail`` once everything held went out."""
        while self.sending:
            idle = self._idle
            if idle is None:
                idle = self._idle = anyio.Event()
            await idle.wait()
        if self.ended:
            return
        if self._held:
            await self._drain()
        if self.ended or self.stopping:
            return
        self.sending = True  # the flusher must not write after the body's end
        try:
            await self._send_body(tail, more=False)
        finally:
            self.sending = False

    # -- sending -----------------------------------------------------------------------

    async def _drain(self) -> None:
        held = self._held
        body = b"".join(held)
        held.clear()
        self._held_bytes = 0
        await self._send_all(body)

    async def _send_all(self, body: bytes) -> None:
        """Send ``body``, then whatever was held meanwhile, holding the line throughout."""
        self.sending = True
        try:
            while True:
                if self.stopping:
                    return  # the flusher ends the body with the retry hint
                await self._send_body(body, more=True)
                held = self._held
                room = self._room
                if room is not None:
                    self._room = None
                    room.set()
                if not held or self.ended:
                    return
                limit = self._response.max_batch_bytes
                if self._held_bytes <= limit:
                    body = b"".join(held)
                    held.clear()
                    self._held_bytes = 0
                else:
                    # A batch at a time, so one write stays bounded; with a turn of the
                    # loop between two, so that a long replay (a snapshot's large deltas)
                    # does not hold up the other streams' sends until it is all written.
                    size = count = 0
                    while size < limit:
                        size += len(held[count])
                        count += 1
                    body = b"".join(held[:count])
                    del held[:count]
                    self._held_bytes -= size
                    await anyio.lowlevel.checkpoint()
                    if self.ended:
                        return
        finally:
            self._sent()

    def _sent(self) -> None:
        """A send ended: the line is free."""
        self.sending = False
        self.last_sent = now = time.monotonic()
        self._burst_until = now + _BURST
        room = self._room
        if room is not None:
            self._room = None
            room.set()
        idle = self._idle
        if idle is not None:
            self._idle = None
            idle.set()
        if self.stopping:
            self._wake_flusher()

    async def _send_body(self, body: bytes, *, more: bool) -> None:
        response = self._response
        self.send_began = time.monotonic()
        try:
            if not self.started:
                self.started = True
                if body:
                    metrics.first_event("sse", time.monotonic() - self.opened)
                await self._send(
                    {
                        "type": "http.response.start",
                        "status": response.status_code,
                        "headers": response.raw_headers,
                    }
                )
                body = response._retry + body
            elif more and self._direct is not None and self._direct.write(body):
                return
            await self._send({"type": "http.response.body", "body": body, "more_body": more})
        except OSError:
            logger.debug("the client went away during a send")
            self._end()
            raise _Ended from None
        if not more:
            self.ended = True

    def _end(self) -> None:
        self.ended = True
        self._cancel.cancel()
        room = self._room
        if room is not None:
            self._room = None
            room.set()

    def _wake_flusher(self) -> None:
        wake = self._flusher_wake
        if wake is not None:
            self._flusher_wake = None
            wake.set()

    # -- the flusher ---------------------------------------------------------------------

    async def flusher(self) -> None:
        """Write what is held when nobody else will; keep the stream alive; watch for a
        stalled send; end the body when the server shuts down."""
        response = self._response
        while not self.ended:
            if self.stopping and not self.sending:
                # Held events are dropped: the client resumes from the last one it got
                # whole, and a slow client must not hold the shutdown up.
                self._held.clear()
                with contextlib.suppress(_Ended):
                    await self._send_body(response._shutdown_tail, more=False)
                self._end()
                return
            if self._held and not self.sending:
                gather = self._burst_until - time.monotonic()
                if gather > 0:
                    # A burst: what the producer sends for the rest of its window joins
                    # this write, instead of a wake-up and a write per event.
                    await anyio.sleep(gather)
                    if self.ended or self.sending or not self._held:
                        continue
                try:
                    await self._drain()
                except _Ended:
                    return
                continue
            # The line watch keeps the deadlines: it calls check(), which wakes this.
            if self._start_due and not self.sending:
                # No event yet, and the headers are due: a proxy waiting for them would
                # time out the request, and an EventSource gives up on its answer.
                self._start_due = False
                if not self.started:
                    try:
                        await self._send_all(b"")
                    except _Ended:
                        return
                continue
            if self._ping_due and not self.sending:
                self._ping_due = False
                try:
                    await self._send_all(_PING)
                except _Ended:
                    return
                continue
            wake = self._flusher_wake = anyio.Event()
            await wake.wait()

    def check(self, now: float) -> float | None:
        """The line watch's look at this response (see ``essessey.bindings._asgi``): end
        a send stalled past send_timeout, ask for the keep-alive after ping_interval of
        quiet; the time of the next deadline, or None once the response has ended."""
        if self.ended:
            return None
        response = self._response
        timeout = response.send_timeout if response.send_timeout is not None else math.inf
        if self.sending:
            if now - self.send_began > timeout:
                totals.stalled += 1
                logger.warning(
                    "a send stalled for more than %.1f s; ending the response",
                    response.send_timeout,
                )
                self._abort()
                self._end()
                return None
            return self.send_began + timeout
        ping = response.ping_interval or math.inf
        start_due = math.inf
        if not self.started and response.headers_within is not None:
            start_due = self.opened + response.headers_within
            if now >= start_due:
                self._start_due = True
                self._wake_flusher()
                start_due = math.inf
        if now - self.last_sent >= ping:
            # Quiet for ping_interval: a comment keeps proxies from closing it.
            self._ping_due = True
            self._wake_flusher()
            return min(now + ping, start_due)
        return min(self.last_sent + ping, start_due)

    def stop(self) -> None:
        """The server is shutting down: end with the retry hint after the send in
        progress (an event is sent whole or not at all)."""
        self.stopping = True
        self._wake_flusher()


async def _nothing() -> None:
    return None


class _OutboxSink:
    """The sink a producer writes into: each event framed and handed to the outbox."""

    __slots__ = ("_encode", "_encode_text", "_outbox")

    def __init__(self, outbox: _Outbox, encoder: FrameEncoder | None) -> None:
        self._outbox = outbox
        # The protocol's own framing, or a dialect's (one call either way).
        self._encode: Callable[[Event], bytes] = encode if encoder is None else encoder.encode
        self._encode_text: Callable[[int, str], bytes | None] | None = (
            cast(TextDeltaEncoder, encoder).encode_text
            if encoder is not None and issubclass(type(encoder), TextDeltaEncoder)
            else None
        )

    def emit_nowait(self, event: Event) -> bool:
        outbox = self._outbox
        if not outbox.takes_now():
            return False  # nothing encoded: the Publisher calls emit(), which does it
        frame = self._encode(event)
        if frame:
            outbox.put(frame)
            outbox.last_was_error = event.event == EventType.ERROR
            totals.sse_events += 1
            totals.sse_bytes += len(frame)
        return True

    def deliver(self, event: Event) -> bool:
        """:meth:`emit_nowait` for a store's append (see ``essessey.stores.Deliver``):
        False, never an exception, when the event must come through the source."""
        if self._outbox.ended:
            return False
        try:
            return self.emit_nowait(event)
        except Exception:
            return False  # read again through the source, which then raises it

    def emit(self, event: Event) -> Coroutine[Any, Any, None]:
        # A plain function returning the write's coroutine: one coroutine frame fewer on
        # the path of every event that must wait.
        outbox = self._outbox
        outbox.last_was_error = event.event == EventType.ERROR
        frame = self._encode(event)
        if not frame:
            return _nothing()
        totals.sse_events += 1
        totals.sse_bytes += len(frame)
        return outbox.write(frame)

    async def emit_many(self, events: Sequence[Event]) -> None:
        # Many events ready at once (a Publisher's batched deltas): one write.
        if not events:
            return
        outbox = self._outbox
        if (
            self._encode is encode
            and isinstance(events, EventBatch)
            and events.name in _BATCH_PREFIXES
        ):
            # One name, no ids, JSON data without line breaks: framed by concatenation.
            prefix = _BATCH_PREFIXES[events.name]
            body = b"".join([prefix + data + b"\n\n" for data in events.datas])
        else:
            frames: list[bytes] = []
            encode_text = self._encode_text
            if (
                encode_text is not None
                and isinstance(events, EventBatch)
                and events.texts is not None
                and events.block_index is not None
            ):
                # A dialect writes a batch's text deltas from their texts; any it cannot
                # (not an open text block) go through encode, as the rest would.
                index = events.block_index
                for text in events.texts:
                    frame = encode_text(index, text)
                    if frame is None:
                        break
                    frames.append(frame)
            rest = events[len(frames) :] if frames else events
            body = b"".join(frames) + b"".join([self._encode(e) for e in rest])
        if not body:
            return
        totals.sse_events += len(events)
        totals.sse_bytes += len(body)
        await outbox.write(body)
        outbox.last_was_error = events[-1].event == EventType.ERROR


class _TextOutboxSink(_OutboxSink):
    """The sink of a response whose dialect writes text deltas from their text (a
    :class:`TextDeltaEncoder`): a Publisher hands it each text delta's text beside the
    event (``emit_text_nowait``), so the encoder need not decode the event. A class of
    its own, so that the protocol's responses keep the plain ``emit_nowait`` path."""

    __slots__ = ()

    def emit_text_nowait(self, event: Event, index: int, text: str) -> bool:
        outbox = self._outbox
        if not outbox.takes_now():
            return False  # nothing encoded: the Publisher calls emit(), which does it
        encode_text = self._encode_text
        frame = None if encode_text is None else encode_text(index, text)
        if frame is None:
            frame = self._encode(event)  # not an open text block: the general path
        if frame:
            outbox.put(frame)
            outbox.last_was_error = False
            totals.sse_events += 1
            totals.sse_bytes += len(frame)
        return True


@runtime_checkable
class DeliveringSource(Protocol):
    """A source that can also hand its live events straight to the response.

    The response calls :meth:`deliver_to` once, before it starts iterating, with a
    function that writes an event to the client at once and returns True, or returns
    False (having done nothing, never raising) when it cannot: the source then yields
    that event as usual. An event delivered is not yielded. The hub's subscription
    (``subscription_response``) is one: a live event reaches the connection in the
    turn's own append, without waking the response's task. Detected once per response,
    on the source's class.
    """

    def __aiter__(self) -> AsyncIterator[Event]:
        """The events not delivered, in order."""
        ...

    def deliver_to(self, deliver: Callable[[Event], bool]) -> None:
        """Offer live events to ``deliver`` from now on."""
        ...


class SSEOptions(TypedDict, total=False):
    """The options of the SSE response that a hub route (``hub_routes``,
    ``subscription_response``) passes on to :class:`EventStreamResponse`; each means
    what it means there."""

    headers: Mapping[str, str] | None
    ping_interval: float
    retry: int | None
    send_timeout: float | None
    max_queue: int
    max_batch_bytes: int
    shutdown_retry: int | None
    headers_within: float | None


class EventStreamResponse(Response):
    """Streams events as ``text/event-stream``; see the module docstring for the rules.

    ``content`` is a producer (``async def produce(publisher: Publisher) -> None``) or a
    source (an async iterable of :class:`~essessey.Event`). ``dialect`` and ``strict`` shape
    the Publisher given to a producer. ``retry`` (milliseconds) is sent first as the
    client's reconnection delay. ``max_queue`` bounds the events held for the client;
    ``max_batch_bytes`` bounds one write. ``shutdown_retry`` (milliseconds, 1000 by
    default) is the reconnection delay sent when the server shuts down, as the response
    ends; None lets the response run to its end through a shutdown. ``empty_status``
    (say 204) answers a content that ends without an event with that status and no body
    instead of an empty 200 stream: an EventSource stops on a 204 instead of reconnecting.
    ``encoder`` writes the events in another wire dialect (a
    :class:`~essessey.bindings.sse.FrameEncoder`, one per response; docs/dialects.md)
    instead of the protocol's own SSE; everything else is delivered the same way.
    ``error_shape`` writes the JSON body of an error answered before the first event (the
    protocol's ``error_body`` by default; a dialect's own error object).
    ``headers_within`` (seconds) sends the status line and headers when no event came
    within it, instead of waiting for the first event: for a resume that may land in a
    pause of its turn, which a proxy with a short idle timeout would otherwise answer with
    a 504 (an EventSource then stops for good). An error after that goes out as an error
    event, and an end with no event as an empty stream. The hub's routes use it on every
    resume (:data:`RESUME_HEADERS_WITHIN`).
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        content: TurnProducer | Source,
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
        empty_status: int | None = None,
        encoder: FrameEncoder | None = None,
        error_shape: ErrorShape = error_body,
        headers_within: float | None = None,
    ) -> None:
        if ping_interval < 0:
            raise ValueError("ping_interval must be >= 0 (0 disables the keep-alive)")
        if send_timeout is not None and send_timeout <= 0:
            raise ValueError("send_timeout must be > 0, or None for no timeout")
        if max_queue < 1 or max_batch_bytes < 1:
            raise ValueError("max_queue and max_batch_bytes must be >= 1")
        # A field of the first event's block, not a block of its own: a blank line after
        # it alone would be an empty event to some decoders.
        self._retry = format_message(retry=retry)[:-1] if retry is not None else b""
        if headers_within is not None and headers_within < 0:
            raise ValueError("headers_within must be >= 0, or None to wait for the first event")
        self.headers_within = headers_within
        self.empty_status = empty_status
        self.encoder = encoder
        self.error_shape = error_shape
        self.shutdown_retry = shutdown_retry
        self._shutdown_tail = (
            # The field alone (a reader takes it as it parses the line): no block that a
            # decoder would dispatch as an empty event.
            format_message(retry=shutdown_retry)[:-1] if shutdown_retry is not None else b""
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
        # The app's own headers (CORS, a request id) go on an error or empty answer too:
        # without them a cross-origin client cannot even read why it was refused.
        self._app_headers = [
            (name, value) for name, value in self.raw_headers if name not in _BODY_HEADERS
        ]
        self.raw_headers.extend(h for h in _SSE_HEADERS if h[0] not in dict(self.raw_headers))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._respond(scope, receive, send)
        # As for any Starlette response: after whatever answer was sent (a stream, a
        # refusal, an empty answer, a HEAD's headers), so cleanup put here always runs.
        if self.background is not None:
            await self.background()

    async def _respond(self, scope: Scope, receive: Receive, send: Send) -> None:
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
        if self.shutdown_retry is not None and shutting_down():
            # Opened while the server shuts down: nothing but the hint to come back.
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                }
            )
            await send({"type": "http.response.body", "body": self._shutdown_tail})
            return
        async with connection_tasks() as tasks:
            outbox = _Outbox(self, send, tasks.cancel_scope, scope.get("method", "GET"))
            tasks.start_soon(self._watch_disconnect, receive, tasks.cancel_scope)
            unwatch = watch_line(outbox)
            tasks.start_soon(outbox.flusher)
            # A callback, not a task per response waiting for the shutdown.
            forget = on_shutdown(outbox.stop) if self.shutdown_retry is not None else None
            try:
                # The producer runs in the request's own task: an event it publishes
                # goes to the socket without a task switch.
                failure: Exception | None = None
                try:
                    await self._produce(outbox)
                except _Ended:
                    pass
                except Exception as exc:
                    failure = exc
                with contextlib.suppress(_Ended):
                    await self._finish(send, outbox, failure)
            finally:
                unwatch()
                if forget is not None:
                    forget()

    async def _watch_disconnect(self, receive: Receive, scope: anyio.CancelScope) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                logger.debug("client disconnected; cancelling the stream")
                scope.cancel()
                return

    async def _produce(self, outbox: _Outbox) -> None:
        encoder = self.encoder
        sink = (
            _TextOutboxSink(outbox, encoder)
            if encoder is not None and issubclass(type(encoder), TextDeltaEncoder)
            else _OutboxSink(outbox, encoder)
        )
        content = self.content
        if isinstance(content, AsyncIterable):
            await self._drain(content, sink)
        else:
            await content(Publisher(sink, dialect=self.dialect, strict=self.strict))

    @staticmethod
    async def _drain(source: Source, sink: _OutboxSink) -> None:
        if issubclass(type(source), DeliveringSource):
            # A hub subscription: its live events may come straight from the turn's
            # append, in order with those the loop below reads.
            cast(DeliveringSource, source).deliver_to(sink.deliver)
        iterator = aiter(source)
        handled = 0
        try:
            async for event in iterator:
                # Held without a checkpoint while a burst lasts (a hub subscription
                # replaying): the backlog goes out in few sends.
                if not sink.emit_nowait(event):
                    await sink.emit(event)
                handled += 1
                if handled == EVENTS_PER_TURN:
                    handled = 0
                    await backlog_turn()  # a replay must not hold up live turns
        finally:
            # A source parked at a yield would otherwise be finalised only when the
            # garbage collector gets to it, and the response itself may hold it: close
            # it now, on any early end.
            if isinstance(iterator, AsyncGenerator):
                with anyio.CancelScope(shield=True):
                    await iterator.aclose()

    async def _finish(self, send: Send, outbox: _Outbox, failure: Exception | None) -> None:
        if outbox.ended or outbox.stopping:
            return
        if isinstance(failure, StreamInterrupted):
            # The body ends with nothing more (after the retry hint when nothing went out
            # yet), so the client reconnects with its last id.
            await outbox.finish(b"")
            return
        if failure is not None and not (outbox.started or outbox.sending or outbox.held):
            outbox.ended = True
            if isinstance(failure, StreamRejected):
                await self._send_error(send, failure.status, failure.error_type, failure.message)
            else:
                logger.error("the stream failed before its first event", exc_info=failure)
                await self._send_error(send, 500, "api_error", "Internal server error")
            return
        if (
            failure is None
            and self.empty_status is not None
            and not (outbox.started or outbox.sending or outbox.held)
        ):
            outbox.ended = True
            await send(
                {
                    "type": "http.response.start",
                    "status": self.empty_status,
                    "headers": self._app_headers,
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return
        if failure is not None and not isinstance(failure, StreamRejected):
            # Logged even when the producer sent its own error event (stream_turn does):
            # the client was told, but the exception would otherwise be seen nowhere.
            logger.error("the stream failed after it started", exc_info=failure)
        frames = self.encoder if self.encoder is not None else _PROTOCOL_FRAMES
        if failure is not None and not outbox.last_was_error:
            if isinstance(failure, StreamRejected):
                error_type, message = failure.error_type, failure.message
            else:
                error_type, message = "api_error", "Internal server error"
            tail = frames.fail(error_type, message)
        else:
            tail = frames.finish()
        await outbox.finish(tail)

    async def _send_error(self, send: Send, status: int, error_type: str, message: str) -> None:
        body = self.error_shape(error_type, message)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    *self._app_headers,
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
