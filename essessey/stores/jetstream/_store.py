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
``essessey.stores.jetstream._bounds``: NATS limits per subject, which here is one event name
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

import contextlib
import enum
import re
import time
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Final, Literal, TypedDict

import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import api

from essessey._ids import check_token, is_stream_id, is_token, parse_event_id
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
from essessey.stores._checks import check_positive
from essessey.stores.jetstream._bounds import Bounds
from essessey.stores.jetstream._context import (
    CLOSE,
    CONTROL_EVENT,
    CONTROL_HEADER,
    OPEN,
    PREV_HEADER,
    RESET,
    TRANSIENT,
    StoreContext,
    epoch_of,
    logger,
)
from essessey.stores.jetstream._leases import Leases
from essessey.stores.jetstream._reader import Reader
from essessey.stores.jetstream._writer import Writer

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "CONTROL_EVENT",
    "CONTROL_HEADER",
    "JetStreamEventStore",
    "JetStreamStoreOptions",
]

_STREAM_IN_USE: Final = 10058  # JSStreamNameExistErr: exists with another configuration
_SINCE_IDLE: Final = 1.0  # seconds without a message before since() asks the consumer

_BAD_NAME: Final = re.compile(r"[\s.*>/\\]")


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
    if not _follows(msg, start) or _control(msg) == RESET:
        return _First.GONE
    return _First.NEXT


class _Read(enum.Enum):
    """What :func:`_messages` yields in place of a message."""

    IDLE = "no message for the idle time"
    OWN = "the id's own message, skipped"


class _Ended(enum.Enum):
    """What :func:`_live` gives at a ``close`` marker with nothing after it."""

    END = "the stream closed with nothing after it"


def _live(
    stream_id: str, reader: Reader, name: str, msg: Msg, max_lag: int | None
) -> Event | _Ended | None:
    """A message past a follower's start: its event; ``END`` at a ``close`` marker with
    nothing after it; None for another marker. Raises when the follower fell behind or the
    stream was cleared."""
    if reader.removed:
        raise SubscriberLagged(
            f"events of {stream_id!r} were evicted before the subscriber read them"
        )
    if max_lag is not None and reader.lag > max_lag:
        raise SubscriberLagged(f"subscriber is {reader.lag} events behind {stream_id!r}")
    if name != CONTROL_EVENT:
        return reader.event(name, msg)
    control = _control(msg)
    if control == RESET:
        raise StreamReset(f"stream {stream_id!r} was cleared")
    if control == CLOSE and reader.pending == 0:
        return _Ended.END
    return None


def _seek(
    stream_id: str, reader: Reader, name: str, msg: Msg, alive: bool
) -> tuple[bool, bool, Event | None]:
    """A message read without an id, before a whole message starts: (whether the follower
    is now past its start, whether a message of the current life was seen, the event to
    yield). What comes before the next ``message_start`` is a message's tail, skipped
    until it starts (or the stream closes, with no whole message retained: raised)."""
    live = False
    if name == CONTROL_EVENT:
        control = _control(msg)
        if control == RESET:
            alive = False  # what came before was another life
        else:
            alive = True
            if control == OPEN:
                live = True  # the events after an open marker are whole
            elif control == CLOSE and reader.pending == 0:
                raise MessagesNotRetained(
                    f"no whole message of {stream_id!r} is retained, and its turn ended"
                )
    else:
        alive = True
        if name == EventType.MESSAGE_START:
            return True, True, reader.event(name, msg)
    if not live and reader.pending == 0 and not alive:
        raise StreamNotFound(f"no stream {stream_id!r}")
    return live, alive, None


class _IdGone(Exception):
    """The first message after an id shows that the id's message is gone and more with
    it, or that the stream was cleared after it: the read cannot follow on from the id."""


async def _messages(
    reader: Reader, start: int | None, idle: float
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
    ``<stream>_LEASES``, see ``essessey.stores.jetstream._leases``): a hub's turn holds it,
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
        if max_msgs <= 0 and max_msgs != -1:
            raise ValueError("max_msgs must be > 0, or -1 for no limit")
        if storage not in ("file", "memory"):
            raise ValueError("storage must be 'file' or 'memory'")
        check_positive(
            max_age=max_age,
            max_events_per_stream=max_events_per_stream,
            max_bytes_per_stream=max_bytes_per_stream,
            max_streams=max_streams,
            duplicate_window=duplicate_window,
            publish_timeout=publish_timeout,
            heartbeat=heartbeat,
            running_ttl=running_ttl,
        )
        if publish_timeout > duplicate_window:
            raise ValueError("publish_timeout must not exceed duplicate_window")
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
        # The one object the parts share: none of them reads another's members.
        ctx = self._ctx = StoreContext(
            nc,
            stream=stream,
            prefix=prefix,
            storage=storage,
            publish_timeout=publish_timeout,
            heartbeat=heartbeat,
            setup=self.setup,
        )
        self._bounds = Bounds(
            ctx,
            max_events_per_stream=max_events_per_stream,
            max_bytes_per_stream=max_bytes_per_stream,
            max_streams=max_streams,
            max_age=max_age,
        )
        self._writer = Writer(ctx, self._bounds)
        self._leases = Leases(ctx, self._writer, running_ttl)

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
            info = await self._ctx.js.add_stream(config)
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code != _STREAM_IN_USE:
                raise
            info = await self._ctx.js.update_stream(config)
        self._ctx.epoch = epoch_of(info)
        await self._leases.setup()
        await self._bounds.setup()

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
        return await self._writer.append(stream_id, name, event.data)

    async def open_stream(self, stream_id: str) -> None:
        """Mark the stream open (creating it): followers wait for its first event.

        It also reads the JetStream stream's epoch again (one request per turn), so the
        ids of a turn name the stream it is stored in even when another process deleted
        and recreated that stream since this store last looked."""
        await self._writer.open(stream_id, "")

    # -- leases (see essessey.stores.jetstream._leases) --------------------------------------

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

    async def turn_running(self, stream_id: str) -> bool:
        """Whether a turn holds a live lease on ``stream_id`` (claimed with
        :meth:`claim_turn` on any replica, not released, renewed in time)."""
        check_token(stream_id, "stream id")
        return await self._leases.held(stream_id)

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
            await self._writer.close(stream_id)

    async def clear(self, stream_id: str) -> None:
        """Forget the stream: its ids become unknown and its followers get StreamReset.

        A ``reset`` marker is published, then every earlier message of the stream id is
        purged; the marker stays (until retention drops it) so that followers, wherever
        they are, see the reset in order."""
        check_token(stream_id, "stream id")
        await self._writer.clear(stream_id)

    # -- reading --------------------------------------------------------------------------

    async def exists(self, stream_id: str) -> bool:
        """Whether the stream is retained: it has a message and was not cleared since."""
        if not is_stream_id(stream_id):
            return False
        ctx = self._ctx
        await ctx.ensure()
        try:
            last = await ctx.retrying(
                lambda _: ctx.js.get_last_msg(self.stream, ctx.filter(stream_id))
            )
        except nats.js.errors.NotFoundError:
            return False
        headers = last.headers
        return not (
            last.subject == ctx.control_subject(stream_id)
            and headers is not None
            and headers.get(CONTROL_HEADER) == RESET
        )

    async def _missing(self, stream_id: str) -> EssesseyError:
        """The error for an id that cannot be resumed from: the stream is gone, or not."""
        if await self.exists(stream_id):
            return UnknownEventId(f"event id is not retained for stream {stream_id!r}")
        return StreamNotFound(f"no stream {stream_id!r}")

    async def _gone(self, stream_id: str, epoch: str) -> bool:
        """Whether the JetStream stream was deleted or recreated, or holds nothing of the
        stream id any more. False when that cannot be told now (a transient failure)."""
        ctx = self._ctx
        try:
            info = await ctx.js.stream_info(self.stream, subjects_filter=ctx.filter(stream_id))
        except nats.js.errors.NotFoundError:
            return True
        except TRANSIENT as exc:
            logger.debug("could not check stream %s: %r", stream_id, exc)
            return False
        return epoch_of(info) != epoch or not info.state.subjects

    async def _open_read(
        self, stream_id: str, last_event_id: str | None, *, explain: bool
    ) -> tuple[Reader, int | None]:
        """What ``since`` and ``follow`` both start with: a reader of ``stream_id`` opened
        after ``last_event_id`` (at the stream id's first message when None), and that
        id's sequence. Raises :class:`StreamNotFound` or :class:`UnknownEventId` when
        there is nothing to read from there; with ``explain`` False, an id that cannot be
        resumed from is an :class:`UnknownEventId` without the request that would tell
        the two apart (``since`` answers "not known" either way)."""
        if not is_stream_id(stream_id):
            raise StreamNotFound(f"no stream {stream_id!r}")
        epoch = await self._ctx.current_epoch()
        if epoch is None:
            raise StreamNotFound(f"no stream {stream_id!r}")
        start: int | None = None
        if last_event_id is not None:
            start = parse_event_id(last_event_id, epoch)
            if start is None:
                raise await self._unresumable(stream_id, explain)
        reader = Reader(self._ctx, stream_id, epoch)
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
                        if _control(msg) == RESET:
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
                        await self._quiet(stream_id, reader, live)
                        continue
                    if item is _Read.OWN:
                        continue
                    name, msg = item
                    if live:
                        event = _live(stream_id, reader, name, msg, max_lag)
                        if event is _Ended.END:
                            return
                        if isinstance(event, Event):
                            yield event
                        continue
                    live, alive, event = _seek(stream_id, reader, name, msg, alive)
                    if event is not None:
                        yield event
        except _IdGone:
            raise await self._missing(stream_id) from None
        finally:
            await reader.close()

    async def _quiet(self, stream_id: str, reader: Reader, live: bool) -> None:
        """A follower saw nothing for a while: raise when the stream is gone; else see
        whether the turn's replica died (its end then comes next)."""
        if await self._gone(stream_id, reader.epoch):
            if live:
                raise StreamReset(f"stream {stream_id!r} was cleared or dropped")
            raise StreamNotFound(f"no stream {stream_id!r}")
        try:
            await self._leases.end_if_abandoned(stream_id)
        except TRANSIENT as exc:
            logger.debug("could not check the lease of %s: %r", stream_id, exc)
