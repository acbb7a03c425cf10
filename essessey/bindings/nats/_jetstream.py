"""An :class:`~essessey.EventStore` kept in a NATS JetStream stream, shared by replicas.

Layout. One JetStream stream (``ESSESSEY`` by default) holds every stream id, on the
subjects ``<prefix>.>``. An event ``ev`` of stream id ``sid`` is the message
``<prefix>.<sid>.<ev>`` whose body is ``Event.data`` unchanged: the subjects a
:class:`NATSSink` uses, so a plain NATS subscriber of ``<prefix>.<sid>.>`` sees the same
events. Markers go to ``<prefix>.<sid>.__control`` with an empty body and the header
``Essessey-Control``: ``open`` (a turn started: followers wait for its first event),
``close`` (no more events for now: followers end once drained) and ``reset`` (the stream
id was cleared: everything of it before the marker is purged). ``__control`` is therefore
not an event name.

Ids. ``<epoch>-<seq>``: ``seq`` is the JetStream sequence of the event's message (global
to the JetStream stream, so increasing per stream id but not contiguous) and ``epoch`` is
derived from the JetStream stream's creation time, so the ids of a deleted and recreated
stream never match positions in the new one. Every store on the same JetStream stream, in
any process, issues and accepts the same ids. An append names the epoch its store last read
(at setup, at every ``open_stream``, i.e. once per turn, and at every read) without a
request of its own; when another process deletes and recreates the JetStream stream, the
ids a store issues before it notices name the old epoch, so they are unknown, never
misplaced.

Known. ``since`` and ``follow`` accept an id when its epoch is the stream's current one and
every later message of the stream id is still retained: its own message is, or the first
message after it names it as the one before (each message carries the sequence of the
stream id's previous message in the header ``Essessey-Prev``), as the in-memory store keeps
an id known while everything after it is. Eviction drops a stream id's oldest messages
first and ``clear`` purges a stream id whole, so the replay has no gap.

Retention. Per stream id, as the in-memory and Redis stores: ``max_events_per_stream`` and
``max_bytes_per_stream`` (its oldest events go first), ``max_streams`` (the finished
stream id updated longest ago is dropped; a running one never is, and when all are running
a new one raises :class:`~essessey.StoreFull`), kept by the store itself (see
``essessey.bindings.nats._bounds``: NATS limits per subject, which here is one event name
of a stream id). The server keeps ``max_age`` per message, and ``max_msgs`` (off by
default) for all stream ids together, oldest first: a last-resort cap that, when reached,
drops messages of running turns too.

Retries. Every append carries a ``Nats-Msg-Id`` unique to it; a publish that times out,
finds no responders or meets a reconnecting connection is sent again with the same id
until ``publish_timeout`` seconds have passed, and JetStream stores it once (within
``duplicate_window``). Then :class:`JetStreamUnavailable` is raised. The requests that
start a read (``follow``, ``since``) or ask whether a stream exists are retried the same
way, so a reader that attaches while the server restarts waits for it, as a producer does.

Following. Each ``follow`` (and ``since``) reads through its own ordered push consumer
(ephemeral, in memory, with idle heartbeats and flow control) filtered on
``<prefix>.<sid>.>``. Lag is measured with the ``num_pending`` each message carries and
the messages this client holds but has not yet taken.
A follower ends with :class:`~essessey.StreamReset` when it meets a ``reset`` marker
(``clear``), and, best effort, when an idle check (every ``2 * heartbeat`` seconds without
a message) finds the JetStream stream deleted or recreated, or no message of the stream id
left (expired by ``max_age`` while the stream was open). Messages evicted before a follower
read them end it with :class:`~essessey.SubscriberLagged` when that shows as a drop in
``num_pending`` (messages it had been told were pending are gone); an eviction of messages
appended after the server last sent it one is not seen (best effort). Retention far larger
than any follower's lag makes both rare: the server pushes a follower's events to it as they
are appended, up to a flow-control window, and ``max_lag`` ends a follower that falls
further behind.

``max_age`` is per message: it drops a long stream's oldest events first (even a turn's
that runs longer than ``max_age``), and ``follow`` without an id then starts at the oldest
whole message.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import hashlib
import itertools
import logging
import re
import secrets
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, Literal, TypedDict, TypeVar

import anyio
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import api
from nats.js.client import JetStreamContext

from essessey._ids import is_stream_id, is_token, parse_event_id
from essessey.bindings.nats._bounds import PREV_HEADER, Bounds
from essessey.bindings.nats._core import check_token
from essessey.bindings.nats._leases import HOLDER_HEADER, Leases
from essessey.bindings.nats._nats_py import (
    direct_jetstream_publish,
    flow_control_due,
    header_block,
    ready_push_subscription,
    reply_flow_control,
    take_queued,
    wait_queued,
)
from essessey.errors import (
    EssesseyError,
    JetStreamUnavailable,
    MessagesNotRetained,
    StreamNotFound,
    StreamReset,
    SubscriberLagged,
    UnknownEventId,
)
from essessey.event import Event
from essessey.protocol import EventType

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "CONTROL_EVENT",
    "CONTROL_HEADER",
    "JetStreamEventStore",
    "JetStreamStoreOptions",
]

logger = logging.getLogger("essessey.bindings.nats.jetstream")

CONTROL_EVENT: Final = "__control"
"""The last subject token of a stream id's markers; reserved, never an event name."""

CONTROL_HEADER: Final = "Essessey-Control"
"""The header of a marker: ``open``, ``close`` or ``reset``."""

_OPEN: Final = "open"
_CLOSE: Final = "close"
_RESET: Final = "reset"

_MSG_ID: Final = "Nats-Msg-Id"
_STREAM_IN_USE: Final = 10058  # JSStreamNameExistErr: exists with another configuration
_SINCE_IDLE: Final = 1.0  # seconds without a message before since() asks the consumer
_MAX_BACKOFF: Final = 1.0
_REQUEST_TIMEOUT: Final = 5.0

_T = TypeVar("_T")

# The reply subject of a JetStream message (``Msg.Metadata._from_reply`` reads the same
# layouts): 9 tokens, ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>``,
# or 11 and more, ``$JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<delivered>.<sseq>.
# <cseq>.<ts>.<pending>[.<random>...]``. The positions of the consumer name, the stream
# sequence and num_pending in each.
_ACK_V1: Final = (3, 5, 8)
_ACK_V2: Final = (5, 7, 10)

_BAD_NAME: Final = re.compile(r"[\s.*>/\\]")

_RETRYABLE: Final = (
    nats.errors.TimeoutError,  # includes FlushTimeoutError
    nats.errors.NoRespondersError,
    nats.js.errors.NoStreamResponseError,
    nats.errors.ConnectionClosedError,  # retried only while the client may reconnect
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
    nats.js.errors.ServiceUnavailableError,
)
_TRANSIENT: Final = (*_RETRYABLE, nats.js.errors.ServerError)


def _is_retryable(exc: Exception) -> bool:
    if isinstance(exc, _RETRYABLE):
        return True
    # Some APIError subclasses (the KV ones) are made without a code.
    return isinstance(exc, nats.js.errors.APIError) and getattr(exc, "code", None) == 503


def _epoch_of(info: api.StreamInfo) -> str:
    """The epoch of a JetStream stream: from its creation time, so a stream deleted and
    created again under the same name gets another one."""
    created = info.created
    if created is None:
        raise RuntimeError("the nats-server does not report stream creation times (need 2.2+)")
    text = f"{info.config.name}|{created.isoformat()}"
    return hashlib.blake2b(text.encode(), digest_size=5).hexdigest()


def _ack_fields(reply: str) -> tuple[str, int, int] | None:
    """The consumer name, stream sequence and ``num_pending`` in the reply subject of a
    JetStream message, or None when it is not laid out as expected (the caller then asks
    ``msg.metadata``).

    ``msg.metadata`` builds two dataclasses and a ``datetime`` for every message, of which
    a reader needs these three fields: this reads them from the same tokens, accepting the
    layouts nats-py accepts (9 tokens, or 11 and more), and only ASCII digits as numbers.
    """
    tokens = reply.split(".")
    count = len(tokens)
    if count == 9:
        at_consumer, at_seq, at_pending = _ACK_V1
    elif count >= 11:
        at_consumer, at_seq, at_pending = _ACK_V2
    else:
        return None
    if tokens[0] != "$JS" or tokens[1] != "ACK":
        return None
    seq_text = tokens[at_seq]
    pending_text = tokens[at_pending]
    if not (
        seq_text.isdigit()
        and seq_text.isascii()
        and pending_text.isdigit()
        and pending_text.isascii()
    ):
        return None
    return tokens[at_consumer], int(seq_text), int(pending_text)


def _position(msg: Msg) -> tuple[str, int, int]:
    """The consumer name, stream sequence and ``num_pending`` of a JetStream message: from
    its reply subject, else from ``msg.metadata`` (which raises for a message that is not
    one)."""
    fields = _ack_fields(msg.reply) if msg.reply else None
    if fields is not None:
        return fields
    meta = msg.metadata
    return meta.consumer, meta.sequence.stream, meta.num_pending


def _control(msg: Msg) -> str | None:
    headers = msg.headers
    return headers.get(CONTROL_HEADER) if headers else None


def _follows(msg: Msg, seq: int | None) -> bool:
    """Whether ``msg`` is the stream id's next message after the one at ``seq`` (its
    ``Essessey-Prev`` header says so): nothing was between them, though that one may be
    gone."""
    headers = msg.headers
    return headers is not None and seq is not None and headers.get(PREV_HEADER) == str(seq)


class _First(enum.Enum):
    """What the first message a read after an id gets is, for that id."""

    OWN = "the id's own message: skipped"
    NEXT = "the next one: the id's own was trimmed, and nothing after it"
    GONE = "a gap: the id's message is gone and more with it, or the stream was cleared"


def _first_after(msg: Msg, name: str, seq: int, start: int) -> _First:
    """The one rule ``since`` and ``follow`` both apply to their first message after
    ``start`` (the sequence of the id they were given)."""
    if seq == start and name != CONTROL_EVENT:
        return _First.OWN
    if not _follows(msg, start) or _control(msg) == _RESET:
        return _First.GONE
    return _First.NEXT


class _Read(enum.Enum):
    """What :func:`_messages` yields in place of a message."""

    IDLE = "no message for the idle time"
    OWN = "the id's own message, skipped"


class _IdGone(Exception):
    """The first message after an id shows that the id's message is gone and more with
    it, or that the stream was cleared after it: the read cannot follow on from the id."""


async def _messages(
    reader: _Reader, start: int | None, idle: float
) -> AsyncGenerator[tuple[str, Msg] | _Read, None]:
    """The replay ``since`` and ``follow`` share: what ``reader`` delivers, as (event
    name, message), and ``IDLE`` after each ``idle`` seconds without a message.

    With ``start`` (the sequence of the id read after), the first message is checked
    against it (:func:`_first_after`): ``OWN`` in its place when it is the id's own, and
    :class:`_IdGone` raised when it shows a gap. What each caller does with the messages
    (collect them, or yield them live; the rules without an id) is its own.
    """
    name_at = len(reader.prefix)
    unchecked = start  # the id the first message must follow on from, until it has
    while True:
        msg = await reader.next(idle)
        if msg is None:
            yield _Read.IDLE
            continue
        name = msg.subject[name_at:]
        if unchecked is not None:
            first = _first_after(msg, name, reader.seq, unchecked)
            unchecked = None
            if first is _First.GONE:
                raise _IdGone
            if first is _First.OWN:
                yield _Read.OWN
                continue
        yield name, msg


class JetStreamStoreOptions(TypedDict, total=False):
    """The keyword options of :class:`JetStreamEventStore`, for
    :meth:`JetStreamEventStore.connect` (each one's meaning and default are the
    constructor's)."""

    stream: str
    prefix: str
    max_age: float
    max_events_per_stream: int
    max_bytes_per_stream: int
    max_streams: int
    max_msgs: int
    storage: Literal["file", "memory"]
    duplicate_window: float
    publish_timeout: float
    heartbeat: float
    running_ttl: float


class JetStreamEventStore:
    """An :class:`~essessey.EventStore` in a JetStream stream (see the module docstring
    for subjects, ids, retention and retries).

    ``nc`` is a connected nats-py client; the store does not own it. The JetStream stream
    is created (or its configuration updated) by :meth:`setup`, or on first use, with the
    KV buckets ``<stream>_STREAMS`` (the stream ids, for ``max_streams``) and
    ``<stream>_LEASES``. All bounds must be positive; ``max_msgs`` (the server's cap for
    all stream ids together) may also be -1, its default: no such cap. An event counts
    ``len(data)`` plus 180 bytes against ``max_bytes_per_stream``, as in the in-memory
    store.
    ``publish_timeout`` may not exceed ``duplicate_window``, or a late retry could be
    stored twice. ``heartbeat`` is the idle heartbeat of the followers' consumers.
    ``running_ttl`` is how long a turn's lease lasts unrenewed (the KV bucket
    ``<stream>_LEASES``, see ``essessey.bindings.nats._leases``): a hub's turn holds it,
    so no other replica starts one on the stream, and a cancel from any replica reaches
    it.
    """

    def __init__(
        self,
        nc: Client,
        *,
        stream: str = "ESSESSEY",
        prefix: str = "essessey",
        max_age: float = 3600.0,
        max_events_per_stream: int = 10_000,
        max_bytes_per_stream: int = 32 * 1024 * 1024,
        max_streams: int = 10_000,
        max_msgs: int = -1,
        storage: Literal["file", "memory"] = "file",
        duplicate_window: float = 120.0,
        publish_timeout: float = 30.0,
        heartbeat: float = 5.0,
        running_ttl: float = 10.0,
    ) -> None:
        if not stream or _BAD_NAME.search(stream):
            raise ValueError(f"stream {stream!r} is not a valid JetStream stream name")
        if not all(is_token(token) for token in prefix.split(".")):
            raise ValueError(f"prefix {prefix!r} is not a valid subject prefix")
        if max_age <= 0:
            raise ValueError("max_age must be > 0 seconds")
        if max_events_per_stream <= 0:
            raise ValueError("max_events_per_stream must be > 0")
        if max_bytes_per_stream <= 0:
            raise ValueError("max_bytes_per_stream must be > 0")
        if max_streams <= 0:
            raise ValueError("max_streams must be > 0")
        if max_msgs <= 0 and max_msgs != -1:
            raise ValueError("max_msgs must be > 0, or -1 for no limit")
        if storage not in ("file", "memory"):
            raise ValueError("storage must be 'file' or 'memory'")
        if duplicate_window <= 0:
            raise ValueError("duplicate_window must be > 0 seconds")
        if publish_timeout <= 0:
            raise ValueError("publish_timeout must be > 0 seconds")
        if publish_timeout > duplicate_window:
            raise ValueError("publish_timeout must not exceed duplicate_window")
        if heartbeat <= 0:
            raise ValueError("heartbeat must be > 0 seconds")
        if running_ttl <= 0:
            raise ValueError("running_ttl must be > 0 seconds")
        self.nc = nc
        self.stream = stream
        self.prefix = prefix
        self.max_age = max_age
        self.max_events_per_stream = max_events_per_stream
        self.max_bytes_per_stream = max_bytes_per_stream
        self.max_streams = max_streams
        self.max_msgs = max_msgs
        self.storage: Literal["file", "memory"] = storage
        self.duplicate_window = duplicate_window
        self.publish_timeout = publish_timeout
        self.heartbeat = heartbeat
        self.running_ttl = running_ttl
        self._leases = Leases(self)
        self._bounds = Bounds(self)
        self._js: JetStreamContext = nc.jetstream(timeout=_REQUEST_TIMEOUT)
        # js.publish without its layers (see _nats_py.direct_jetstream_publish); None:
        # every publish through js.publish.
        self._direct = direct_jetstream_publish(nc)
        # Msg ids: random per store, counted per publish, so no two publishes of any store
        # share one while a retry of the same publish always does.
        self._token = secrets.token_hex(12)
        self._counter = itertools.count(1)
        self._epoch: str | None = None
        self._setup_lock = anyio.Lock()

    @classmethod
    async def connect(
        cls, nc: Client, **options: Unpack[JetStreamStoreOptions]
    ) -> JetStreamEventStore:
        """Create a store (keyword options as for the constructor) and :meth:`setup` it."""
        store = cls(nc, **options)
        await store.setup()
        return store

    def stream_config(self) -> api.StreamConfig:
        """The JetStream stream configuration this store asks for."""
        return api.StreamConfig(
            name=self.stream,
            subjects=[f"{self.prefix}.>"],
            retention=api.RetentionPolicy.LIMITS,
            max_age=self.max_age,
            max_msgs=self.max_msgs,
            discard=api.DiscardPolicy.OLD,
            storage=api.StorageType.FILE if self.storage == "file" else api.StorageType.MEMORY,
            duplicate_window=self.duplicate_window,
        )

    async def setup(self) -> None:
        """Create the JetStream stream, or update its configuration to this store's."""
        config = self.stream_config()
        try:
            info = await self._js.add_stream(config)
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code != _STREAM_IN_USE:
                raise
            info = await self._js.update_stream(config)
        self._epoch = _epoch_of(info)
        await self._leases.setup()
        await self._bounds.setup()

    async def _ensure(self) -> str:
        epoch = self._epoch
        if epoch is None:
            async with self._setup_lock:
                if self._epoch is None:
                    await self.setup()
                epoch = self._epoch
                assert epoch is not None
        return epoch

    async def _current_epoch(self) -> str | None:
        """The epoch of the JetStream stream now (None when it does not exist); also
        refreshes the one appends use."""
        await self._ensure()
        try:
            info = await self._retrying(lambda _: self._js.stream_info(self.stream))
        except nats.js.errors.NotFoundError:
            return None
        epoch = _epoch_of(info)
        self._epoch = epoch
        return epoch

    async def _retrying(
        self,
        request: Callable[[float], Awaitable[_T]],
        *,
        subject: str | None = None,
        recover: Callable[[Exception], Awaitable[None]] | None = None,
    ) -> _T:
        """``await request(remaining)``, made again after a transient failure (the server
        restarting, the connection reconnecting) until ``publish_timeout`` seconds have
        passed; then :class:`JetStreamUnavailable`. ``subject`` names the subject of a
        publish, for the messages (built only on failure: publishing is the hot path).

        ``remaining`` is what is left of that budget (a request may bound its own timeout
        by it); ``recover(exc)`` runs before each new attempt."""
        deadline = time.monotonic() + self.publish_timeout
        delay = 0.05
        while True:
            try:
                return await request(deadline - time.monotonic())
            except Exception as exc:
                if not _is_retryable(exc):
                    raise
                if self.nc.is_closed:
                    raise _closed() from exc
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    failed = (
                        "JetStream did not answer"
                        if subject is None
                        else f"JetStream did not store a message on {subject!r}"
                    )
                    raise JetStreamUnavailable(f"{failed} within {self.publish_timeout} s") from exc
                what = "a JetStream request" if subject is None else f"publish to {subject}"
                logger.debug("%s failed (%r); retrying", what, exc)
                if recover is not None:
                    await recover(exc)
                await anyio.sleep(min(delay, max(deadline - time.monotonic(), 0.0)))
                delay = min(delay * 2, _MAX_BACKOFF)

    # -- writing --------------------------------------------------------------------------

    async def _publish(
        self,
        subject: str,
        data: bytes,
        control: str | None = None,
        holder: str = "",
        prev: int | None = None,
    ) -> tuple[int, str]:
        """Publish once to JetStream, retrying with the same msg id: the sequence, and
        the epoch of the stream that stored it as far as this store knows. ``prev`` is
        the sequence of the stream id's message before it, when known (see
        ``essessey.bindings.nats._bounds``)."""
        # The epoch from before the publish: if someone else recreates the JetStream
        # stream meanwhile, the id names the older epoch and is unknown, never misplaced.
        epoch = self._epoch or await self._ensure()
        headers = {_MSG_ID: f"{self._token}-{next(self._counter)}"}
        if control is not None:
            headers[CONTROL_HEADER] = control
        if holder:
            headers[HOLDER_HEADER] = holder
        if prev is not None:
            headers[PREV_HEADER] = str(prev)
        js = self._js
        direct = self._direct
        block = header_block(headers) if direct is not None else b""

        async def publish(remaining: float) -> tuple[int, str]:
            timeout = min(_REQUEST_TIMEOUT, max(remaining, 0.01))
            if direct is not None:
                try:
                    async with asyncio.timeout(timeout):
                        seq = await direct(subject, data, block)
                except TimeoutError:
                    raise nats.errors.TimeoutError from None  # what js.publish raises
                if seq is not None:
                    return seq, epoch
            ack = await js.publish(subject, data, timeout=timeout, headers=headers)
            return ack.seq, epoch

        async def recover(exc: Exception) -> None:
            nonlocal epoch
            if isinstance(exc, nats.js.errors.NoStreamResponseError):
                epoch = await self._recreate() or epoch

        return await self._retrying(publish, subject=subject, recover=recover)

    async def _recreate(self) -> str | None:
        # No stream answered: the JetStream stream was deleted, or the server is still
        # starting. Creating it is harmless in both cases (it is a no-op when it exists),
        # and a publish that succeeds after it was stored by the stream it describes.
        try:
            await self.setup()
        except Exception as exc:  # retried by the caller's loop
            logger.debug("could not create the JetStream stream: %r", exc)
            return None
        return self._epoch

    async def append(self, stream_id: str, event: Event) -> Event:
        """Store ``event`` and return it with its id; wakes the stream's followers.

        Past ``max_events_per_stream`` or ``max_bytes_per_stream`` the stream's oldest
        events are purged; a new stream past ``max_streams`` drops the finished stream
        updated longest ago, or raises :class:`~essessey.StoreFull` when every one is
        running. Raises ValueError for a stream id or event name that is not a subject
        token (or is ``__control``), :class:`~essessey.StreamReset` for anything but a
        ``message_start`` on a running stream this store cleared, and
        :class:`JetStreamUnavailable` when JetStream did not store it in time.
        """
        name = event.event
        if not is_stream_id(stream_id):
            check_token(stream_id, "stream id")
        if name == CONTROL_EVENT:
            raise ValueError(f"the event name {CONTROL_EVENT!r} is reserved")
        if not is_token(name):
            check_token(name, "event name")
        data = event.data
        bounds = self._bounds
        kept = bounds.kept(stream_id) or await bounds.before_append(stream_id, name)
        seq, epoch = await self._publish(
            f"{self.prefix}.{stream_id}.{name}", data, prev=kept.last_seq
        )
        await bounds.after_append(stream_id, kept, seq, len(data))
        return Event(name, data, f"{epoch}-{seq}")

    async def open_stream(self, stream_id: str) -> None:
        """Mark the stream open (creating it): followers wait for its first event.

        It also reads the JetStream stream's epoch again (one request per turn), so the
        ids of a turn name the stream it is stored in even when another process deleted
        and recreated that stream since this store last looked."""
        await self._open(stream_id, "")

    async def _open(self, stream_id: str, holder: str) -> None:
        check_token(stream_id, "stream id")
        if await self._current_epoch() is None:
            await self.setup()
        bounds = self._bounds
        await bounds.opening(stream_id)
        seq, _ = await self._publish(
            self._control_subject(stream_id), b"", _OPEN, holder, bounds.prev(stream_id)
        )
        bounds.marker_stored(stream_id, seq)

    async def _close_marker(self, stream_id: str) -> None:
        bounds = self._bounds
        seq, _ = await self._publish(
            self._control_subject(stream_id), b"", _CLOSE, prev=bounds.prev(stream_id)
        )
        bounds.marker_stored(stream_id, seq)
        await bounds.finished(stream_id)

    # -- leases (see essessey.bindings.nats._leases) ----------------------------------------

    async def claim_turn(self, stream_id: str, holder: str) -> None:
        """:meth:`open_stream` for a turn, leased to ``holder`` for ``running_ttl``
        seconds at a time: :class:`~essessey.StreamBusy` while another holder's lease
        runs; a turn left open by a holder whose lease ran out is ended first."""
        check_token(stream_id, "stream id")
        await self._leases.claim(stream_id, holder)

    async def append_as(self, stream_id: str, event: Event, holder: str) -> Event:
        """:meth:`append` for the turn holding the stream as ``holder``:
        :class:`~essessey.LeaseLost` (nothing stored) when it no longer does."""
        await self._leases.check(stream_id, holder)
        return await self.append(stream_id, event)

    async def keep_running(self, stream_id: str, holder: str = "") -> bool:
        """Renew ``holder``'s lease of the stream (any holder of this store when empty);
        False when it is lost."""
        return await self._leases.renew(stream_id, holder)

    async def release_turn(self, stream_id: str, holder: str) -> bool:
        """:meth:`close_stream` by the turn holding it as ``holder``, and the lease let
        go; False (nothing done) when it no longer holds it."""
        return await self._leases.release(stream_id, holder)

    async def request_cancel(self, stream_id: str, wait: float = 15.0) -> bool:
        """Ask the replica whose turn holds ``stream_id`` to cancel it; True once the
        stream closed (within ``wait`` seconds), False when no turn holds it."""
        check_token(stream_id, "stream id")
        return await self._leases.request_cancel(stream_id, wait)

    async def watch_cancel(
        self, stream_id: str, on_cancel: Callable[[], None]
    ) -> Callable[[], None]:
        """Call ``on_cancel()`` when a replica asks to cancel the turn of ``stream_id``;
        call what this returns to stop."""
        return await self._leases.watch_cancel(stream_id, on_cancel)

    async def close_stream(self, stream_id: str) -> None:
        """No more events for now: followers end once they have everything. Does nothing
        when the stream does not exist (never created, cleared, expired)."""
        check_token(stream_id, "stream id")
        if await self.exists(stream_id):
            await self._close_marker(stream_id)

    async def clear(self, stream_id: str) -> None:
        """Forget the stream: its ids become unknown and its followers get StreamReset.

        A ``reset`` marker is published, then every earlier message of the stream id is
        purged; the marker stays (until retention drops it) so that followers, wherever
        they are, see the reset in order."""
        check_token(stream_id, "stream id")
        bounds = self._bounds
        seq, _ = await self._publish(
            self._control_subject(stream_id), b"", _RESET, prev=bounds.prev(stream_id)
        )
        await self._js.purge_stream(self.stream, seq=seq, subject=self._filter(stream_id))
        bounds.marker_stored(stream_id, seq, reset=True)
        await bounds.cleared(stream_id)

    # -- reading --------------------------------------------------------------------------

    def _reader(self, stream_id: str, epoch: str, *, headers_only: bool = False) -> _Reader:
        return _Reader(self, stream_id, epoch, headers_only)

    def _filter(self, stream_id: str) -> str:
        return f"{self.prefix}.{stream_id}.>"

    def _control_subject(self, stream_id: str) -> str:
        return f"{self.prefix}.{stream_id}.{CONTROL_EVENT}"

    async def exists(self, stream_id: str) -> bool:
        """Whether the stream is retained: it has a message and was not cleared since."""
        if not is_stream_id(stream_id):
            return False
        await self._ensure()
        try:
            last = await self._retrying(
                lambda _: self._js.get_last_msg(self.stream, self._filter(stream_id))
            )
        except nats.js.errors.NotFoundError:
            return False
        headers = last.headers
        return not (
            last.subject == self._control_subject(stream_id)
            and headers is not None
            and headers.get(CONTROL_HEADER) == _RESET
        )

    async def _missing(self, stream_id: str) -> EssesseyError:
        """The error for an id that cannot be resumed from: the stream is gone, or not."""
        if await self.exists(stream_id):
            return UnknownEventId(f"event id is not retained for stream {stream_id!r}")
        return StreamNotFound(f"no stream {stream_id!r}")

    async def _gone(self, stream_id: str, epoch: str) -> bool:
        """Whether the JetStream stream was deleted or recreated, or holds nothing of the
        stream id any more. False when that cannot be told now (a transient failure)."""
        try:
            info = await self._js.stream_info(self.stream, subjects_filter=self._filter(stream_id))
        except nats.js.errors.NotFoundError:
            return True
        except _TRANSIENT as exc:
            logger.debug("could not check stream %s: %r", stream_id, exc)
            return False
        return _epoch_of(info) != epoch or not info.state.subjects

    async def _open_read(
        self, stream_id: str, last_event_id: str | None, *, explain: bool
    ) -> tuple[_Reader, int | None]:
        """What ``since`` and ``follow`` both start with: a reader of ``stream_id`` opened
        after ``last_event_id`` (at the stream id's first message when None), and that
        id's sequence. Raises :class:`StreamNotFound` or :class:`UnknownEventId` when
        there is nothing to read from there; with ``explain`` False, an id that cannot be
        resumed from is an :class:`UnknownEventId` without the request that would tell
        the two apart (``since`` answers "not known" either way)."""
        if not is_stream_id(stream_id):
            raise StreamNotFound(f"no stream {stream_id!r}")
        epoch = await self._current_epoch()
        if epoch is None:
            raise StreamNotFound(f"no stream {stream_id!r}")
        start: int | None = None
        if last_event_id is not None:
            start = parse_event_id(last_event_id, epoch)
            if start is None:
                raise await self._unresumable(stream_id, explain)
        reader = self._reader(stream_id, epoch)
        try:
            if await reader.open(start) == 0:
                if start is None:
                    raise StreamNotFound(f"no stream {stream_id!r}")
                raise await self._unresumable(stream_id, explain)
        except BaseException:
            await reader.close()
            raise
        return reader, start

    async def _unresumable(self, stream_id: str, explain: bool) -> EssesseyError:
        if explain:
            return await self._missing(stream_id)
        return UnknownEventId(f"event id is not retained for stream {stream_id!r}")

    async def since(self, stream_id: str, last_event_id: str | None) -> tuple[list[Event], bool]:
        """The events after ``last_event_id`` (all retained ones when None) and whether
        that id is known; see the module docstring for when it is."""
        try:
            reader, start = await self._open_read(stream_id, last_event_id, explain=False)
        except (StreamNotFound, UnknownEventId, StreamReset):
            return [], False
        events: list[Event] = []
        alive = start is not None
        idle_since = time.monotonic()
        try:
            async with contextlib.aclosing(_messages(reader, start, _SINCE_IDLE)) as messages:
                async for item in messages:
                    if item is _Read.IDLE:
                        if await reader.caught_up():
                            break
                        if time.monotonic() - idle_since > self.publish_timeout:
                            raise JetStreamUnavailable(f"reading stream {stream_id!r} stalled")
                        continue
                    idle_since = time.monotonic()
                    if item is _Read.OWN:
                        if reader.pending == 0:
                            break
                        continue
                    name, msg = item
                    if start is not None and reader.removed:
                        return [], False  # evicted or purged under the read: a gap
                    if name == CONTROL_EVENT:
                        if _control(msg) == _RESET:
                            if start is not None:
                                return [], False  # cleared after the id
                            events = []  # a new life begins after the reset
                            alive = False
                        else:
                            alive = True
                    else:
                        events.append(reader.event(name, msg))
                        alive = True
                    if reader.pending == 0:
                        break
        except (_IdGone, StreamReset):  # StreamReset: the JetStream stream was recreated
            return [], False
        finally:
            await reader.close()
        return (events, True) if alive else ([], False)

    async def follow(
        self, stream_id: str, last_event_id: str | None = None, *, max_lag: int | None = None
    ) -> AsyncGenerator[Event, None]:
        """Replay after ``last_event_id``, then live events, until a ``close`` marker
        with nothing after it.

        Without an id it starts at the stream's first event when its ``open`` marker is
        still retained, else at the oldest ``message_start`` (or ``open``) retained, else
        at the next ``message_start`` to come; :class:`MessagesNotRetained` when the
        stream closes first. Raises :class:`StreamNotFound` or :class:`UnknownEventId`
        before any event, :class:`SubscriberLagged` when more than ``max_lag`` of the
        messages appended since it started are waiting for it (or some were evicted
        before it read them),
        and :class:`StreamReset` when the stream id is cleared (or, best effort, the
        JetStream stream is deleted or recreated, or the stream id expires) meanwhile.
        """
        reader, start = await self._open_read(stream_id, last_event_id, explain=True)
        live = start is not None  # past the start: every event is yielded
        alive = False  # (without an id) a message of the current life has been seen
        try:
            async with contextlib.aclosing(
                _messages(reader, start, 2 * self.heartbeat)
            ) as messages:
                async for item in messages:
                    if item is _Read.IDLE:
                        if await self._gone(stream_id, reader.epoch):
                            if live:
                                raise StreamReset(f"stream {stream_id!r} was cleared or dropped")
                            raise StreamNotFound(f"no stream {stream_id!r}")
                        try:
                            # Quiet: has the turn's replica died? Then its end comes next.
                            await self._leases.end_if_abandoned(stream_id)
                        except _TRANSIENT as exc:
                            logger.debug("could not check the lease of %s: %r", stream_id, exc)
                        continue
                    if item is _Read.OWN:
                        continue
                    name, msg = item
                    if live:
                        if reader.removed:
                            raise SubscriberLagged(
                                f"events of {stream_id!r} were evicted before the subscriber "
                                "read them"
                            )
                        if max_lag is not None and reader.lag > max_lag:
                            raise SubscriberLagged(
                                f"subscriber is {reader.lag} events behind {stream_id!r}"
                            )
                        if name != CONTROL_EVENT:
                            yield reader.event(name, msg)
                            continue
                        control = _control(msg)
                        if control == _RESET:
                            raise StreamReset(f"stream {stream_id!r} was cleared")
                        if control == _CLOSE and reader.pending == 0:
                            return
                        continue
                    # Without an id: find where a whole message starts.
                    if name == CONTROL_EVENT:
                        control = _control(msg)
                        if control == _RESET:
                            alive = False  # what came before was another life
                        else:
                            alive = True
                            if control == _OPEN:
                                live = True  # the events after an open marker are whole
                            elif control == _CLOSE and reader.pending == 0:
                                # Closed, and no whole message retained: nothing to give.
                                raise MessagesNotRetained(
                                    f"no whole message of {stream_id!r} is retained, and "
                                    "its turn ended"
                                )
                    else:
                        alive = True
                        if name == EventType.MESSAGE_START:
                            live = True
                            yield reader.event(name, msg)
                            continue
                    # No whole message retained: what comes before the next message_start
                    # is a message's tail, skipped until it starts (or the stream closes).
                    if not live and reader.pending == 0 and not alive:
                        raise StreamNotFound(f"no stream {stream_id!r}")
        except _IdGone:
            raise await self._missing(stream_id) from None
        finally:
            await reader.close()


_RECONNECT_LOOK: Final = 0.25
"""Seconds a waiting follower may go without looking whether its connection reconnected."""


def _closed() -> JetStreamUnavailable:
    # As for a request (_retrying): a closed connection is for good, and what a reader
    # meets is the store being unavailable, not nats-py's own error.
    return JetStreamUnavailable("the NATS connection is closed")


def _reconnects(nc: Any) -> int:
    """How often ``nc`` has reconnected (nats-py's public ``stats``)."""
    stats = getattr(nc, "stats", None)
    return int(stats.get("reconnects", 0)) if isinstance(stats, dict) else 0


class _Reader:
    """One ordered push consumer on a stream id's subjects, with the accounting that
    ``since`` and ``follow`` need: the stream sequence of the last message, how many are
    pending after it, and whether messages were removed ahead of it."""

    __slots__ = (
        "backlog",
        "consumer",
        "count",
        "epoch",
        "headers_only",
        "pending",
        "prefix",
        "queued",
        "ready",
        "reconnects",
        "removed",
        "seq",
        "store",
        "stream_id",
        "sub",
        "total",
    )

    def __init__(
        self, store: JetStreamEventStore, stream_id: str, epoch: str, headers_only: bool = False
    ) -> None:
        self.store = store
        self.headers_only = headers_only
        self.stream_id = stream_id
        self.epoch = epoch
        self.prefix = f"{store.prefix}.{stream_id}."
        self.sub: JetStreamContext.PushSubscription | None = None
        # Its core subscription, when the messages it holds can be taken without waiting
        # (see _nats_py.ready_push_subscription); None: through next_msg only.
        self.ready: Any = None
        self.consumer = ""
        self.backlog = 0  # messages pending when the consumer was created
        self.count = 0  # messages delivered (each once)
        self.seq = 0  # stream sequence of the last message delivered
        self.pending = 0  # num_pending of the last message delivered
        self.queued = 0  # messages received after it, not yet taken
        self.total = 0  # count + pending: drops only when messages ahead are removed
        self.removed = False
        self.reconnects = 0  # the connection's reconnect count when the consumer was made

    def event(self, name: str, msg: Msg) -> Event:
        """The event ``msg`` (named ``name``) carries, with the id of its sequence."""
        return Event(name, msg.data, f"{self.epoch}-{self.seq}")

    async def open(self, start: int | None) -> int:
        """Create the consumer from ``start`` (its first message is the one at ``start``
        or after), or from the stream id's first message; the backlog it found.
        Retried as the store's requests are (a consumer left by a failed attempt is
        ephemeral: the server drops it once nothing listens to it)."""
        return await self.store._retrying(lambda _: self._open(start))

    async def _open(self, start: int | None) -> int:
        store = self.store
        js = store._js
        config = api.ConsumerConfig(
            deliver_subject=store.nc.new_inbox(),
            filter_subject=f"{self.prefix}>",
            deliver_policy=(
                api.DeliverPolicy.ALL if start is None else api.DeliverPolicy.BY_START_SEQUENCE
            ),
            opt_start_seq=start,
            # What nats-py sets for an ordered consumer.
            ack_policy=api.AckPolicy.NONE,
            max_deliver=1,
            ack_wait=22 * 3600,
            flow_control=True,
            idle_heartbeat=store.heartbeat,
            num_replicas=1,
            mem_storage=True,
            headers_only=self.headers_only or None,
        )
        self.reconnects = _reconnects(store.nc)
        info = await js.add_consumer(store.stream, config)
        self.consumer = info.name
        # After a reopen the count goes on: what is pending now is the backlog from here.
        self.backlog = self.total = self.count + (info.num_pending or 0)
        # nats-py may recreate an ordered consumer from the stream's first sequence
        # (missed heartbeats before any message): anything before the start is skipped.
        self.seq = 0 if start is None else start - 1
        self.sub = await js.subscribe_bind(store.stream, config, info.name, ordered_consumer=True)
        self.ready = ready_push_subscription(self.sub)
        if self.ready is None:
            logger.debug("nats-py internals not as expected: reading through next_msg only")
        return self.backlog

    @property
    def lag(self) -> int:
        """Messages waiting beyond the backlog the consumer started with, at least.

        What waits after the last message is what this client holds and has not taken
        (``queued``) plus what the server has not sent yet; ``num_pending`` counted both
        when the server sent the message, so the larger of the two is a lower bound. The
        server pushes a flow-control window ahead of the reader and then waits for it, so
        a reader that falls behind sees ``num_pending`` grow with the appends."""
        return max(self.pending, self.queued) - max(0, self.backlog - self.count)

    async def next(self, idle: float) -> Msg | None:
        """The next message (never one already delivered), or None after ``idle``
        seconds without one."""
        deadline = time.monotonic() + idle
        while True:
            sub = self.sub
            assert sub is not None
            ready = self.ready
            nc = self.store.nc
            msg = None if ready is None else take_queued(ready, nc)
            if msg is None:
                if _reconnects(nc) != self.reconnects:
                    await self._reopen()
                    continue
                wait = min(deadline - time.monotonic(), _RECONNECT_LOOK)
                if wait <= 0:
                    return None
                if nc.is_closed:
                    raise _closed()
                if ready is not None:
                    # A caught-up follower waits here for every message: on the queue,
                    # in this task, where next_msg would start one per message.
                    try:
                        async with asyncio.timeout(wait):
                            msg = await wait_queued(ready)
                    except TimeoutError:
                        continue
                else:
                    try:
                        msg = await sub.next_msg(wait)
                    except nats.errors.TimeoutError:
                        continue
                    except nats.errors.ConnectionClosedError as exc:
                        raise _closed() from exc
            if ready is not None and flow_control_due(ready):
                await reply_flow_control(ready, nc)
            consumer, seq, pending = _position(msg)
            if seq <= self.seq:
                continue
            if consumer != self.consumer:
                # The ordered consumer was recreated (a gap, missed heartbeats, a server
                # restart). If the JetStream stream was recreated too, these messages are
                # from another life.
                await self._check_epoch()
                self.consumer = consumer
            self.seq = seq
            self.count += 1
            self.pending = pending
            self.queued = sub.pending_msgs
            total = self.count + pending
            self.removed = total < self.total
            self.total = total
            return msg

    async def _reopen(self) -> None:
        """The connection came back: a new consumer from the next message. A server that
        restarted has lost this ephemeral consumer, and nats-py's ordered consumer would
        notice only after missing its heartbeats (two to four of them: 10-20 s with the
        default heartbeat), a pause every live reader would sit through."""
        logger.debug("the NATS connection came back; recreating the follower's consumer")
        old, self.sub = self.sub, None
        if old is not None:
            try:
                await old.unsubscribe()
            except nats.errors.Error as exc:
                logger.debug("unsubscribe failed: %r", exc)
        await self.open(self.seq + 1)
        await self._check_epoch()

    async def _check_epoch(self) -> None:
        store = self.store
        for attempt in range(5):
            try:
                info = await store._js.stream_info(store.stream)
            except nats.js.errors.NotFoundError:
                break
            except _TRANSIENT:
                await anyio.sleep(0.2 * (attempt + 1))
                continue
            if _epoch_of(info) == self.epoch:
                return
            break
        # Deleted, recreated, or it cannot be told: deliver nothing that may be from
        # another life of the JetStream stream.
        raise StreamReset(f"the JetStream stream of {self.stream_id!r} was deleted or recreated")

    async def caught_up(self) -> bool:
        """Whether the consumer has nothing left to deliver (asked of the server)."""
        sub = self.sub
        assert sub is not None
        try:
            info = await sub.consumer_info()
        except _TRANSIENT:
            return False
        return (info.num_pending or 0) == 0 and sub.pending_msgs == 0

    async def close(self) -> None:
        sub, self.sub = self.sub, None
        if sub is None:
            return
        with anyio.CancelScope(shield=True):
            try:
                await sub.unsubscribe()
            except nats.errors.Error as exc:  # closed connection, already unsubscribed
                logger.debug("unsubscribe failed: %r", exc)
