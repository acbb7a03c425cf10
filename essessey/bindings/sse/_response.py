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
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Callable,
    Coroutine,
    Mapping,
    Sequence,
)
from typing import Any, Final, Protocol, TypedDict, TypeVar, cast, runtime_checkable

import anyio
import anyio.lowlevel
import orjson
from starlette.background import BackgroundTask
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from essessey._logsafe import log_failure
from essessey.bindings._asgi import (
    EVENTS_PER_TURN,
    ConnectionTasks,
    backlog_turn,
    connection_tasks,
    watch_line,
)
from essessey.bindings._line import Line, LineEnded
from essessey.bindings._uvicorn import (
    BodyWriter,
    body_writer,
    connection_aborter,
    limit_unacknowledged,
)
from essessey.bindings.sse._encoder import (
    ErrorShape,
    FrameEncoder,
    ProtocolFrames,
    TextDeltaEncoder,
    TextDeltaFrames,
)
from essessey.bindings.sse._format import encode, encode_fields, error_body, format_message
from essessey.errors import StreamInterrupted, StreamRejected
from essessey.event import Event, EventBatch, Source, new_event
from essessey.metrics import totals
from essessey.protocol import (
    TEXT_DELTA_HEADS,
    TEXT_DELTA_PAYLOAD,
    TEXT_DELTA_TAIL,
    Dialect,
    EventType,
)
from essessey.protocol.records import published_text
from essessey.publisher import Publisher, TurnProducer
from essessey.shutdown import on_shutdown, shutting_down
from essessey.stores import Taker

__all__ = ["RESUME_HEADERS_WITHIN", "DeliveringSource", "EventStreamResponse", "SSEOptions"]

logger = logging.getLogger("essessey.sse")
_T = TypeVar("_T")


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
_TEXT_DELTA_HEAD: Final = b"event: content_block_delta\ndata: "
_BATCH_PREFIXES: Final = {EventType.CONTENT_BLOCK_DELTA: _TEXT_DELTA_HEAD}
# A text delta's whole frame, to fill as its payload is.
_TEXT_DELTA_FRAME: Final = _TEXT_DELTA_HEAD + TEXT_DELTA_PAYLOAD + b"\n\n"
# _TEXT_DELTA_FRAME up to the text, for the first block indexes, and after it: a frame
# made with no format parsed (see TEXT_DELTA_HEADS).
_TEXT_DELTA_FRAME_HEADS: Final = {i: _TEXT_DELTA_HEAD + h for i, h in TEXT_DELTA_HEADS.items()}
_TEXT_DELTA_FRAME_TAIL: Final = TEXT_DELTA_TAIL + b"\n\n"
# A stored text delta's frame, to fill with its id and its data.
_ID_TEXT_DELTA_FRAME: Final = b"id: %b%d\n" + _TEXT_DELTA_HEAD + b"%b\n\n"
_PROTOCOL_FRAMES: Final = ProtocolFrames()
RESUME_HEADERS_WITHIN: Final = 0.25
"""Seconds a resume's response waits for its first event before it sends its headers
without one: long enough for the store to refuse the id (an HTTP error) or to end a
finished turn with nothing after it (a 204), far below any proxy's idle timeout."""


def refusal_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """The app's ``headers`` that go on a refusal or an empty answer too (a CORS header
    lets a cross-origin client read it): all but those describing a body, which that
    answer sets itself."""
    return {
        name: value
        for name, value in (headers or {}).items()
        if name.lower().encode("latin-1") not in _BODY_HEADERS
    }


class _SSEWire:
    """How an SSE response's frames reach the client: the status line and headers with
    the first bytes, held frames joined into one body chunk, written straight to the
    server's transport where that is safe (see ``body_writer``)."""

    __slots__ = ("_abort", "_response", "_send", "direct")

    def __init__(self, response: EventStreamResponse, send: Send, method: str) -> None:
        self._response = response
        self._send = send
        # Found now, in the request's own task: the watchdog that may need it runs in
        # another task (see connection_aborter).
        self._abort = connection_aborter()
        limit_unacknowledged(response.send_timeout)
        # A body chunk written straight to the server's transport costs a fraction of an
        # ASGI send; None where that is not safe.
        writer: BodyWriter | None = body_writer(
            send, method, response.status_code, response.raw_headers
        )
        self.direct: Callable[[bytes], bool] | None = None if writer is None else writer.write

    async def send(self, frames: list[bytes], *, start: bool, more: bool) -> None:
        body = frames[0] if len(frames) == 1 else b"".join(frames)
        response = self._response
        if start:
            await self._send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": response.raw_headers,
                }
            )
            body = response._retry + body
        elif more and self.direct is not None and self.direct(body):
            return
        await self._send({"type": "http.response.body", "body": body, "more_body": more})

    def stalled(self) -> None:
        self._abort()


async def _nothing() -> None:
    return None


class _LineSink:
    """The sink a producer writes into: each event in the protocol's own frames, handed
    to the line."""

    __slots__ = ("_encode", "_line", "last_was_error")

    def __init__(self, line: Line, encode_event: Callable[[Event], bytes] = encode) -> None:
        self._line = line
        self._encode = encode_event
        self.last_was_error = False

    def emit(self, event: Event) -> Coroutine[Any, Any, None]:
        # A plain function returning a coroutine: none of the write's frames on the path
        # of an event the line takes at once.
        frame = self._encode(event)
        self.last_was_error = event.event == EventType.ERROR
        return self._hand(frame) or _nothing()

    def emit_text(
        self, index: int, text: str, text_json: bytes
    ) -> Coroutine[Any, Any, None] | None:
        # Nearly every event of a turn: _hand written out, one call fewer per delta.
        self.last_was_error = False
        try:
            frame = _TEXT_DELTA_FRAME_HEADS[index] + text_json + _TEXT_DELTA_FRAME_TAIL
        except KeyError:  # a block index past the first ones
            frame = _TEXT_DELTA_FRAME % (index, text_json)
        totals.sse_events += 1
        totals.sse_bytes += len(frame)
        line = self._line
        if line.offer(frame):
            return None
        return line.write(frame)

    def _hand(self, frame: bytes) -> Coroutine[Any, Any, None] | None:
        """Give ``frame`` to the line: None when it took it now, else the write to await.
        Made once either way, so a dialect's encoder frames each event once."""
        if not frame:
            return None
        totals.sse_events += 1
        totals.sse_bytes += len(frame)
        line = self._line
        if line.offer(frame):
            return None
        return line.write(frame)

    def take(self, name: str, data: bytes, event_id: str) -> bool:
        """An event offered in a store's append (see ``essessey.stores.Taker``): taken
        when the line takes it now; False, having written nothing and never raising, when
        it must come through the source."""
        try:
            # The protocol's framing keeps no state: a frame the line refuses is made
            # again when the event comes through the source, and nothing else is lost.
            frame = encode_fields(name, data, event_id)
            if not self._line.offer(frame):
                return False
        except (Exception, LineEnded):
            return False  # read again through the source, which then raises it
        self.last_was_error = name == EventType.ERROR
        totals.sse_events += 1
        totals.sse_bytes += len(frame)
        return True

    def take_text(
        self, data: bytes, id_head: bytes, seq: int, index: int, text: str, text_json: bytes
    ) -> bool:
        """:meth:`take` of a Publisher's text delta: one line of JSON under a name known
        here and an id the store made, framed in one step."""
        # Nearly every event of a hub turn: take's steps written out, a call fewer. It
        # leaves last_was_error as it is: a Publisher's text delta never follows an error
        # (an error ends the message, and the hub's Publisher is strict).
        frame = _ID_TEXT_DELTA_FRAME % (id_head, seq, data)
        try:
            if not self._line.offer(frame):
                return False
        except (Exception, LineEnded):
            return False  # read again through the source, which then raises it
        totals.sse_events += 1
        totals.sse_bytes += len(frame)
        return True

    async def emit_many(self, events: Sequence[Event]) -> None:
        # Many events ready at once (a Publisher's batched deltas): one write.
        if not events:
            return
        body = self._frames(events)
        if not body:
            return
        totals.sse_events += len(events)
        totals.sse_bytes += len(body)
        await self._line.write(body)
        self.last_was_error = events[-1].event == EventType.ERROR

    def _frames(self, events: Sequence[Event]) -> bytes:
        if isinstance(events, EventBatch) and events.name in _BATCH_PREFIXES:
            # One name, no ids, JSON data without line breaks: framed by concatenation.
            prefix = _BATCH_PREFIXES[events.name]
            return b"".join([prefix + data + b"\n\n" for data in events.datas])
        return b"".join([self._encode(event) for event in events])


class _DialectLineSink(_LineSink):
    """The sink of a response in another wire dialect: each event in its encoder's
    frames. A :class:`TextDeltaEncoder` writes a text delta from its text, without
    decoding the event; a :class:`TextDeltaFrames` a stored one a hub hands over."""

    __slots__ = ("_encode_text", "_text_delta")

    def __init__(self, line: Line, encoder: FrameEncoder) -> None:
        super().__init__(line, encoder.encode)
        self._encode_text: Callable[[int, str, bytes], bytes | None] | None = (
            cast(TextDeltaEncoder, encoder).encode_text
            if issubclass(type(encoder), TextDeltaEncoder)
            else None
        )
        self._text_delta: Callable[[int, str, bytes, bytes], bytes | None] | None = (
            cast(TextDeltaFrames, encoder).encode_text_delta
            if issubclass(type(encoder), TextDeltaFrames)
            else None
        )

    def emit_text(
        self, index: int, text: str, text_json: bytes
    ) -> Coroutine[Any, Any, None] | None:
        encode_text = self._encode_text
        frame = None if encode_text is None else encode_text(index, text, text_json)
        if frame is None:
            # Not an open text block, or an encoder without encode_text: the general path.
            data = TEXT_DELTA_PAYLOAD % (index, text_json)
            frame = self._encode(new_event(Event, (EventType.CONTENT_BLOCK_DELTA, data, None)))
        self.last_was_error = False
        if not frame:
            return None
        # Nearly every event of a turn: _hand written out, one call fewer per delta.
        totals.sse_events += 1
        totals.sse_bytes += len(frame)
        line = self._line
        if line.offer(frame):
            return None
        return line.write(frame)

    def take(self, name: str, data: bytes, event_id: str) -> bool:
        """:meth:`_LineSink.take`, framing the event only when the line takes it: a
        dialect's encoder keeps state, so a refused event must be framed once, when it
        comes through the source."""
        event = new_event(Event, (name, data, event_id))
        return self._taken(self._encode, event, name == EventType.ERROR)

    def take_text(
        self, data: bytes, id_head: bytes, seq: int, index: int, text: str, text_json: bytes
    ) -> bool:
        """:meth:`take` of a Publisher's text delta, framed from its fields when the
        line takes it."""
        return self._taken(self._text_frames, (data, id_head, seq, index, text, text_json), False)

    def _taken(self, frame_of: Callable[[_T], bytes], item: _T, error: bool) -> bool:
        """Whether the line took ``item``'s frames (``frame_of`` called only if so);
        ``error``: the item is an ``error`` event."""
        try:
            frame = self._line.take(frame_of, item)
        except (Exception, LineEnded):
            return False  # read again through the source, which then raises it
        if frame is None:
            return False
        self.last_was_error = error
        if frame:
            totals.sse_events += 1
            totals.sse_bytes += len(frame)
        return True

    def _text_frames(self, delta: tuple[bytes, bytes, int, int, str, bytes]) -> bytes:
        """A stored text delta's frames: from its index and text when the encoder writes
        them so, else from its event, whose record is noted for the encoder to read
        without a parse."""
        data, id_head, seq, index, text, text_json = delta
        text_delta = self._text_delta
        if text_delta is not None:
            frame = text_delta(index, text, text_json, b"%b%d" % (id_head, seq))
            if frame is not None:
                return frame
        published_text(data, index, text)
        event_id = f"{id_head.decode()}{seq}"
        return self._encode(new_event(Event, (EventType.CONTENT_BLOCK_DELTA, data, event_id)))

    def _frames(self, events: Sequence[Event]) -> bytes:
        frames: list[bytes] = []
        encode_text = self._encode_text
        if (
            encode_text is not None
            and isinstance(events, EventBatch)
            and events.texts is not None
            and events.block_index is not None
        ):
            # A batch's text deltas from their texts; any the encoder cannot write (not
            # an open text block) go through encode, as the rest would.
            index = events.block_index
            dumps = orjson.dumps
            for text in events.texts:
                frame = encode_text(index, text, dumps(text))
                if frame is None:
                    break
                frames.append(frame)
        rest = events[len(frames) :] if frames else events
        return b"".join(frames) + b"".join([self._encode(event) for event in rest])


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

    def deliver_to(self, taker: Taker) -> None:
        """Offer live events to ``taker`` from now on."""
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
            line = Line(
                _SSEWire(self, send, scope.get("method", "GET")),
                tasks.cancel,
                kind="sse",
                log=logger,
                ping=_PING,
                ping_interval=self.ping_interval,
                send_timeout=self.send_timeout,
                max_queue=self.max_queue,
                max_batch_bytes=self.max_batch_bytes,
                shutdown_tail=self._shutdown_tail,
                start_within=self.headers_within,
            )
            encoder = self.encoder
            sink = _LineSink(line) if encoder is None else _DialectLineSink(line, encoder)
            tasks.start_soon(self._watch_disconnect, receive, tasks.cancel)
            unwatch = watch_line(line)
            tasks.start_soon(line.run)
            # A callback, not a task per response waiting for the shutdown.
            forget = on_shutdown(line.stop) if self.shutdown_retry is not None else None
            try:
                # A producer runs in a task of its own (run_apart), a source in the
                # request's: either way an event goes to the socket from the task that
                # published it, without a task switch.
                failure: Exception | None = None
                try:
                    await self._produce(sink, tasks)
                except LineEnded:
                    pass
                except Exception as exc:
                    failure = exc
                with contextlib.suppress(LineEnded):
                    await self._finish(send, line, sink, failure)
            finally:
                unwatch()
                if forget is not None:
                    forget()

    async def _watch_disconnect(self, receive: Receive, cancel: Callable[[], None]) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                logger.debug("client disconnected; cancelling the stream")
                cancel()
                return

    async def _produce(self, sink: _LineSink, tasks: ConnectionTasks) -> None:
        content = self.content
        if isinstance(content, AsyncIterable):
            await self._drain(content, sink)
        else:
            await tasks.run_apart(
                content(Publisher(sink, dialect=self.dialect, strict=self.strict))
            )

    @staticmethod
    async def _drain(source: Source, sink: _LineSink) -> None:
        if issubclass(type(source), DeliveringSource):
            # A hub subscription: its live events may come straight from the turn's
            # append, in order with those the loop below reads.
            cast(DeliveringSource, source).deliver_to(sink)
        iterator = aiter(source)
        handled = 0
        try:
            async for event in iterator:
                # Held without a checkpoint while a burst lasts (a hub subscription
                # replaying): the backlog goes out in few sends.
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

    async def _finish(
        self, send: Send, line: Line, sink: _LineSink, failure: Exception | None
    ) -> None:
        if line.ended or line.stopping:
            return
        if isinstance(failure, StreamInterrupted):
            # The body ends with nothing more (after the retry hint when nothing went out
            # yet), so the client reconnects with its last id.
            await line.finish(b"")
            return
        if failure is not None and not line.busy:
            line.end_quietly()
            if isinstance(failure, StreamRejected):
                await self._send_error(send, failure.status, failure.error_type, failure.message)
            else:
                log_failure(logger, failure, "the stream failed before its first event")
                await self._send_error(send, 500, "api_error", "Internal server error")
            return
        if failure is None and self.empty_status is not None and not line.busy:
            # Nothing after the resume point but, in a dialect, the stream's own end
            # (its finish and [DONE]): that still goes out, the client not having had it.
            tail = (self.encoder if self.encoder is not None else _PROTOCOL_FRAMES).finish()
            if tail:
                await line.finish(tail)
                return
            line.end_quietly()
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
            log_failure(logger, failure, "the stream failed after it started")
        frames = self.encoder if self.encoder is not None else _PROTOCOL_FRAMES
        if failure is not None and not sink.last_was_error:
            if isinstance(failure, StreamRejected):
                error_type, message = failure.error_type, failure.message
            else:
                error_type, message = "api_error", "Internal server error"
            tail = frames.fail(error_type, message)
        else:
            tail = frames.finish()
        await line.finish(tail)

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
