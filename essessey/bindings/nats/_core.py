"""Core NATS: :class:`NATSSink` publishes events to subjects, :class:`NATSSource` reads a
subscription back into events.

The layout (docs/nats.md, "Subjects"): an event goes to ``<prefix>.<stream_id>.<event>``
with its payload as the message body, unchanged, and its id (when it has one) in the
``Essessey-Event-Id`` header. A plain NATS subscriber rebuilds the event from those three
places alone.

Why it is shaped this way:
- Subject tokens are checked before anything is published: a ``.`` would shift the
  tokens, and ``*``/``>`` would make a subscriber's subject a wildcard, so a bad stream id
  or event name could silently reach the wrong readers.
- Core NATS is at-most-once and has no replay: a reader that is not subscribed, or whose
  connection is down, misses what is published meanwhile. Streams that must survive that
  use the JetStream backend.
- nats-py ends a subscription's message iterator the same way on ``unsubscribe``, on
  ``drain`` and when the connection closes; only the subscription's state tells a clean
  end from a lost connection, so :class:`NATSSource` reads that state rather than
  letting a dead connection look like the end of a stream.
- What reaches into nats-py (that state, a flush that keeps order, publishing and reading
  without a coroutine or a task per message) is in one module, ``_nats_py``, each part
  falling back to the public API on a nats-py it does not know.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine
from typing import TYPE_CHECKING, Any, Final

from nats import errors as nats_errors

from essessey._ids import MAX_ID_LENGTH, check_token, is_event_id, is_token
from essessey._nats_py import (
    EMPTY,
    direct_publish,
    flush_connection,
    lost_connection_error,
    queued_messages,
    subscription_finished,
)
from essessey.event import Event, new_event

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.aio.msg import Msg
    from nats.aio.subscription import Subscription

__all__ = [
    "DEFAULT_PREFIX",
    "HEADER_EVENT_ID",
    "MAX_PREFIX_BYTES",
    "NATSSink",
    "NATSSource",
    "check_token",
    "event_subject",
    "parse_subject",
    "subscribe_all",
    "subscribe_stream",
]

logger = logging.getLogger("essessey.nats")

DEFAULT_PREFIX: Final = "essessey"
"""The first subject token(s) of every event, unless a ``prefix`` is given."""

HEADER_EVENT_ID: Final = "Essessey-Event-Id"
"""The message header carrying the event id (already in the canonical form Go's
``nats.Header`` uses, so clients in either language find it under the same key)."""

# Event names are few (the protocol has about ten), so every valid one is cached; the cap
# only guards against a producer inventing names without end.
_MAX_CACHED_SUBJECTS: Final = 1024
_HEADER_HEAD: Final = b"NATS/1.0\r\n" + HEADER_EVENT_ID.encode() + b": "
_HEADER_TAIL: Final = b"\r\n\r\n"


MAX_PREFIX_BYTES: Final = 1024
"""The longest subject prefix, in bytes of UTF-8. A stream id and an event name are at most
256 characters (1 KiB) each, so a subject stays under nats-server's ``max_control_line``
(4 KiB by default) with room for the rest of its command line: past it the server closes
the whole connection, every stream on it with it."""


def _check_prefix(prefix: str) -> str:
    # A prefix may be several tokens ("tenant1.essessey"); each is checked on its own.
    if not isinstance(prefix, str) or not prefix:
        raise ValueError("the subject prefix must be a non-empty str")
    for token in prefix.split("."):
        check_token(token, "prefix token")
    if len(prefix.encode()) > MAX_PREFIX_BYTES:
        raise ValueError(f"the subject prefix is longer than {MAX_PREFIX_BYTES} bytes of UTF-8")
    return prefix


def event_subject(stream_id: str, event: str, *, prefix: str = DEFAULT_PREFIX) -> str:
    """The subject an event named ``event`` of stream ``stream_id`` is published to:
    ``<prefix>.<stream_id>.<event>``. Raises ``ValueError`` on an invalid token."""
    _check_prefix(prefix)
    return f"{prefix}.{check_token(stream_id, 'stream id')}.{check_token(event, 'event name')}"


def _split(subject: str, prefix_dot: str) -> tuple[str, str]:
    # Raises ValueError with the reason only: the source logs it without the subject.
    if not subject.startswith(prefix_dot):
        raise ValueError("subject does not start with the prefix")
    rest = subject[len(prefix_dot) :]
    stream_id, _, event = rest.partition(".")
    if not event or "." in event:
        count = rest.count(".") + 1
        raise ValueError(f"subject has {count} tokens after the prefix, expected 2")
    if not stream_id:
        raise ValueError("subject has an empty stream id token")
    # What no sink publishes (a control character, a token past 256 characters): the
    # layout's rule on the way in too, not only on the way out.
    if not is_token(stream_id):
        raise ValueError(f"the stream id token ({len(stream_id)} characters) is no valid token")
    if not is_token(event):
        raise ValueError(f"the event name token ({len(event)} characters) is no valid token")
    return stream_id, event


def parse_subject(subject: str, prefix: str = DEFAULT_PREFIX) -> tuple[str, str]:
    """Split ``<prefix>.<stream_id>.<event>`` into ``(stream_id, event)``.

    Raises ``ValueError`` when ``subject`` does not start with ``prefix`` or does not have
    exactly two tokens after it.
    """
    try:
        return _split(subject, _check_prefix(prefix) + ".")
    except ValueError as exc:
        raise ValueError(f"{exc}: {subject!r}") from None


def _check_event_id(event_id: str) -> None:
    # What every reader takes as an id (NATSSource skips any other: the event would be
    # lost to each of them), and nats-py, which strips header values, leaves as it is.
    if not is_event_id(event_id):
        raise ValueError(
            f"an event id must be 1 to {MAX_ID_LENGTH} printable characters "
            f"(this one has {len(event_id)})"
        )
    if event_id != event_id.strip():
        raise ValueError("an event id sent as a NATS header cannot start or end with whitespace")


class NATSSink:
    """A sink that publishes each event of one stream to core NATS.

    ``emit(event)`` publishes ``event.data`` unchanged to
    ``<prefix>.<stream_id>.<event.event>``, with the id in the ``Essessey-Event-Id``
    header when the event has one (an empty id counts as none). The stream id and prefix
    are checked here, each event name on its first use; an invalid one raises
    ``ValueError`` and nothing is published. Safe to call from concurrent tasks: nats-py
    queues each message whole, in call order.

    nats-py buffers what is published and writes it in the background, so ``emit``
    returning means buffered, not delivered: await :meth:`flush` to know the server has
    everything so far. Core NATS keeps nothing: only subscribers connected at the time
    receive a message, and there is no replay (the JetStream backend keeps streams).
    Failures come from nats-py as they are: ``ConnectionClosedError``,
    ``OutboundBufferLimitError`` while reconnecting with a full buffer,
    ``MaxPayloadError`` for a payload over the server's limit (its id header counted, as
    the server counts it).

    ``emit`` buffers the message in a plain call while the connection is up, as
    ``nc.publish`` would, and goes through ``publish`` whenever that would wait or raise.
    """

    __slots__ = ("_base", "_direct", "_nc", "_prefix", "_stream_id", "_subjects")

    def __init__(self, nc: Client, stream_id: str, *, prefix: str = DEFAULT_PREFIX) -> None:
        self._nc = nc
        self._direct = direct_publish(nc)
        self._prefix = _check_prefix(prefix)
        self._stream_id = check_token(stream_id, "stream id")
        self._base = f"{prefix}.{stream_id}."
        self._subjects: dict[str, str] = {}

    @property
    def stream_id(self) -> str:
        """The stream id every event is published under."""
        return self._stream_id

    @property
    def prefix(self) -> str:
        """The subject prefix."""
        return self._prefix

    def subject(self, event_name: str) -> str:
        """The subject an event named ``event_name`` goes to (``ValueError`` if invalid)."""
        subject = self._subjects.get(event_name)
        if subject is None:
            subject = self._base + check_token(event_name, "event name")
            if len(self._subjects) < _MAX_CACHED_SUBJECTS:
                self._subjects[event_name] = subject
        return subject

    def emit(self, event: Event) -> Coroutine[Any, Any, None]:
        """Publish ``event``; raise ``ValueError`` (publishing nothing) on an invalid event
        name or id, or nats-py's error when the connection cannot take it."""
        # A plain function returning a coroutine: nothing awaited when the message is
        # buffered in a plain call, and nats-py's own publish coroutine otherwise.
        subject = self._subjects.get(event.event) or self.subject(event.event)
        event_id = event.id
        direct = self._direct
        if event_id:
            _check_event_id(event_id)
            # The header section nats-py writes for this one header, byte for byte.
            header = _HEADER_HEAD + event_id.encode() + _HEADER_TAIL
            if len(header) + len(event.data) > self._nc.max_payload:
                # The server counts the headers in max_payload, and closes the whole
                # connection over a message past it; nats-py counts the payload alone.
                raise nats_errors.MaxPayloadError
            if direct is not None and direct(subject, event.data, header, ""):
                return _buffered()
            return self._nc.publish(subject, event.data, headers={HEADER_EVENT_ID: event_id})
        if direct is not None and direct(subject, event.data, None, ""):
            return _buffered()
        return self._nc.publish(subject, event.data)

    async def flush(self) -> None:
        """Wait until the server has received everything published so far (a PING/PONG
        round trip); nats-py raises ``FlushTimeoutError`` after its 10 s default, and a
        caller wanting less wraps the call in ``asyncio.timeout``."""
        await flush_connection(self._nc)


async def _buffered() -> None:
    """What :meth:`NATSSink.emit` returns for a message already buffered."""


class NATSSource:
    """The events of a core NATS subscription, as an async iterable of
    :class:`~essessey.Event`.

    ``sub`` is a subscription made without a callback (``await nc.subscribe(subject)``)
    on subjects laid out as ``<prefix>.<stream_id>.<event>``. Each message becomes
    ``Event(<event>, <payload>, <Essessey-Event-Id header or None>)``; the stream id is
    :attr:`last_stream_id` after each event, or comes paired with it from
    :meth:`with_stream_ids`. A message whose subject does not fit the layout is skipped
    with a WARNING giving the reason and the subject's length (never the payload).

    Iteration ends cleanly when the subscription is unsubscribed or drained (``sub``'s
    own methods, ``nc.drain()``, or :meth:`aclose`) or reaches an auto-unsubscribe limit.
    When the connection closes first (the server went away and reconnection is off or
    gave up, or ``nc.close()`` was called) it raises :class:`NATSConnectionLost`, after
    the messages already received. A disconnect that nats-py reconnects from is not
    seen: core NATS drops what was published meanwhile, and so does a subscription
    whose pending limits overflow (nats-py reports a ``SlowConsumerError`` to the
    client's ``error_cb``). A source can be iterated once.
    """

    __slots__ = (
        "_last_event_id",
        "_last_stream_id",
        "_messages",
        "_prefix_dot",
        "_queue",
        "_started",
        "_sub",
        "_subjects",
    )

    def __init__(self, sub: Subscription, *, prefix: str = DEFAULT_PREFIX) -> None:
        self._prefix_dot = _check_prefix(prefix) + "."
        try:
            messages = sub.messages
        except nats_errors.Error as exc:
            raise ValueError(
                "NATSSource needs a subscription made without a callback "
                "(await nc.subscribe(subject))"
            ) from exc
        self._sub = sub
        self._messages: AsyncIterator[Msg] = messages
        self._queue = queued_messages(sub, messages)
        # A stream's events use a handful of subjects: each is split once.
        self._subjects: dict[str, tuple[str, str]] = {}
        self._started = False
        self._last_stream_id: str | None = None
        self._last_event_id = ""

    @property
    def subscription(self) -> Subscription:
        """The nats-py subscription read from."""
        return self._sub

    @property
    def prefix(self) -> str:
        """The subject prefix expected before the stream id."""
        return self._prefix_dot[:-1]

    @property
    def last_stream_id(self) -> str | None:
        """The stream id of the last event handed out (None before the first)."""
        return self._last_stream_id

    @property
    def last_event_id(self) -> str:
        """The id of the last event handed out that carried one ("" when none yet)."""
        return self._last_event_id

    def __aiter__(self) -> AsyncIterator[Event]:
        self._start()
        return self._events()

    def with_stream_ids(self) -> AsyncIterator[tuple[str, Event]]:
        """Iterate ``(stream_id, event)`` pairs instead of events: what a reader of
        :func:`subscribe_all` needs, since an :class:`~essessey.Event` has no stream id."""
        self._start()
        return self._pairs()

    async def aclose(self) -> None:
        """Unsubscribe (when the subscription and its connection are still open): the
        iteration then ends cleanly, after handing out the messages the client had
        already received; nothing published later arrives."""
        # Already unsubscribed, drained or closed: nothing is left to stop.
        with contextlib.suppress(
            nats_errors.BadSubscriptionError,
            nats_errors.ConnectionClosedError,
            nats_errors.ConnectionDrainingError,
        ):
            await self._sub.unsubscribe()

    def _start(self) -> None:
        if self._started:
            raise RuntimeError("a NATSSource can be iterated only once")
        self._started = True

    def _decode(self, msg: Msg) -> tuple[str, Event] | None:
        subject = msg.subject
        parsed = self._subjects.get(subject)
        if parsed is None:
            try:
                parsed = _split(subject, self._prefix_dot)
            except ValueError as exc:
                # The reason and the length only: the subject holds a stream id and the
                # body is model output.
                logger.warning(
                    "skipped a NATS message: %s (subject of %d characters)", exc, len(subject)
                )
                return None
            if len(self._subjects) >= _MAX_CACHED_SUBJECTS:
                self._subjects.clear()  # many streams: start over rather than grow
            self._subjects[subject] = parsed
        headers = msg.headers
        event_id: str | None = None
        if headers:
            event_id = headers.get(HEADER_EVENT_ID)
            if event_id is None:
                event_id = _header_any_case(headers)
            if event_id and not is_event_id(event_id):
                # What no sink sends, and no SSE or WebSocket reader could resume by.
                logger.warning(
                    "skipped a NATS message: its event id (%d characters) is no printable "
                    "id of at most %d",
                    len(event_id),
                    MAX_ID_LENGTH,
                )
                return None
            if event_id:
                self._last_event_id = event_id
            else:
                event_id = None
        stream_id = parsed[0]
        self._last_stream_id = stream_id
        return stream_id, new_event(Event, (parsed[1], msg.data, event_id))

    async def _next(self) -> Msg | None:
        """The next message, or None at the subscription's end: straight from its queue
        when this nats-py allows (see ``_nats_py.QueuedMessages``), else through the
        public iterator."""
        queue = self._queue
        if queue is not None:
            return await queue.next()
        try:
            return await anext(self._messages)
        except StopAsyncIteration:
            return None

    async def _pairs(self) -> AsyncGenerator[tuple[str, Event], None]:
        queue, decode = self._queue, self._decode
        next_message = self._next if queue is None else queue.next
        while (msg := await next_message()) is not None:
            pair = decode(msg)
            if pair is not None:
                yield pair
        if not subscription_finished(self._sub):
            raise lost_connection_error(self._sub)

    async def _events(self) -> AsyncGenerator[Event, None]:
        # The same loop as _pairs, not a wrapper around it: one generator per event is
        # enough on the path every event of every reader takes; and for the same reason
        # the queue's wait is awaited here, not through QueuedMessages.next.
        queue, decode = self._queue, self._decode
        if queue is None:
            while (msg := await self._next()) is not None:
                pair = decode(msg)
                if pair is not None:
                    yield pair[1]
        else:
            take, wait, handed_out = queue.take, queue.wait, queue.handed_out
            while True:
                taken = take()
                if taken is EMPTY:
                    if queue.ended:
                        break
                    taken = handed_out(await wait())
                if taken is None:
                    break
                pair = decode(taken)
                if pair is not None:
                    yield pair[1]
        if not subscription_finished(self._sub):
            raise lost_connection_error(self._sub)


def _header_any_case(headers: dict[str, str]) -> str | None:
    # HTTP-style header names are case-insensitive; a client other than ours may have
    # changed the case of the name.
    wanted = HEADER_EVENT_ID.lower()
    for key, value in headers.items():
        if key.lower() == wanted:
            return value
    return None


async def subscribe_stream(
    nc: Client, stream_id: str, *, prefix: str = DEFAULT_PREFIX
) -> NATSSource:
    """Subscribe to the events of one stream (``<prefix>.<stream_id>.*``) and return
    their :class:`NATSSource`. Every event published after this returns arrives (core
    NATS has no replay: nothing published before)."""
    check_token(stream_id, "stream id")
    return await _subscribe(nc, f"{_check_prefix(prefix)}.{stream_id}.*", prefix)


async def subscribe_all(nc: Client, *, prefix: str = DEFAULT_PREFIX) -> NATSSource:
    """Subscribe to the events of every stream under ``prefix`` (``<prefix>.*.*``).

    Read it with :meth:`NATSSource.with_stream_ids` to get ``(stream_id, event)`` pairs,
    or iterate it for events and read :attr:`NATSSource.last_stream_id`. Every event
    published after this returns arrives.
    """
    return await _subscribe(nc, f"{_check_prefix(prefix)}.*.*", prefix)


async def _subscribe(nc: Client, subject: str, prefix: str) -> NATSSource:
    sub = await nc.subscribe(subject)
    # The SUB is only buffered: a round trip makes sure the server has it, so a producer
    # on another connection cannot publish into the gap before it (and its events be
    # lost) once this helper has returned.
    await flush_connection(nc)
    return NATSSource(sub, prefix=prefix)
