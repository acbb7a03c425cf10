"""An :class:`~essessey.EventStore` on Redis Streams, shared by replicas.

The keys, the scripts that change them and the notifications are described in
``essessey.stores.redis._scripts`` and docs/redis.md. In short: a stream id's events are
the entries ``0-1``, ``0-2``, ... of a Redis stream, beside a hash with its epoch and
bounds; every change is one Lua script, which also publishes a notification on the stream
id's channel (the event itself, for an append).

Ids are ``<epoch>-<seq>`` as the in-memory store issues them: the epoch is drawn when the
stream id's keys are created, so an id from before a clear, an expiry or an eviction names
another epoch and is unknown. Since the sequences of an epoch have no holes, an id is known
exactly when every event after it is retained, as in :class:`~essessey.InMemoryEventStore`.

Following. One pub/sub connection per store carries the notifications of the stream ids
its followers read. A follower replays with ``XRANGE`` (one ``MULTI`` read with the
stream's hash), subscribes once it has caught up, reads once more for what came before
the subscription, then takes each new event from its notification when it is the next one
(no round trip) and reads from Redis whenever it sees a hole (a notification lost with a
dropped pub/sub connection), when it fell behind, and every ``heartbeat`` seconds while it
waits, so a lost notification costs at most that long.

Retries. A command that fails on the connection (Redis restarting, a timeout) is sent again
until ``retry_timeout`` seconds have passed, then :class:`RedisUnavailable` is raised. An
append carries a token that its retry repeats, and the script stores it once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Any, Final, TypeAlias, TypedDict

import anyio
import redis.asyncio as aioredis
import redis.exceptions

from essessey._ids import is_stream_id, parse_event_id
from essessey.errors import (
    LeaseLost,
    MessagesNotRetained,
    RedisUnavailable,
    StoreFull,
    StreamBusy,
    StreamNotFound,
    StreamReset,
    SubscriberLagged,
    UnknownEventId,
)
from essessey.event import Event
from essessey.protocol import EventType
from essessey.stores._checks import check_positive
from essessey.stores._retry import RetryPolicy
from essessey.stores.redis import _scripts

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["RedisEventStore", "RedisStoreOptions"]

logger = logging.getLogger("essessey.stores.redis")


_EVENT_OVERHEAD: Final = 180
"""What an event counts against the byte budgets beyond its data, as in the in-memory
store (docs/resume.md), so the same budgets hold the same turns on either."""

_READ_BATCH: Final = 512
_FIRST_PAGE: Final = 16
"""Events a follower reads with its position: enough to start, small enough to be quick."""
_INBOX_LIMIT: Final = 4096
"""Notifications a follower holds before it stops taking them and reads from Redis."""

_ABANDONED: Final = (
    b'{"type":"error","error":{"type":"api_error",'
    b'"message":"the replica running the turn stopped"}}'
)
"""The error event that ends the message of a turn whose replica died."""

_CANCEL_RESEND: Final = 1.0
"""Seconds between requests to cancel while the turn has not ended."""

_RETRYABLE: Final = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


def _is_retryable(exc: Exception) -> bool:
    """A failure on the connection (Redis restarting, a timeout): the request may succeed
    when sent again."""
    return isinstance(exc, _RETRYABLE)


_Arg: TypeAlias = "bytes | str | int"


def _resume_point(snap: _Snapshot, last_event_id: str) -> int | None:
    """The sequence of ``last_event_id`` when a resume after it has no gap (every event
    after it retained, the same epoch), else None."""
    seq = parse_event_id(last_event_id, snap.epoch)
    if seq is None or not snap.first - 1 <= seq <= snap.seq:
        return None
    return seq


_MAX_SEQ_DIGITS: Final = 19
"""Digits of a Redis integer (64 bits): a longer count is none the store wrote."""


class _Snapshot:
    """What one read of a stream id saw, in one transaction (``MULTI``: the server's time,
    the meta hash, the entries after the sequence asked for)."""

    __slots__ = ("abandoned", "closed", "entries", "epoch", "first", "seq")

    def __init__(self, now: tuple[int, int], state: list[Any], entries: list[Any]) -> None:
        """Raises :class:`_Corrupt` when the meta hash is not laid out as the store writes
        it; an entry that is not is skipped with a WARNING."""
        epoch, seq, first, closed, run, holder = state
        self.epoch: str = _text(epoch, "epoch")
        self.seq: int = _count(seq, "seq")  # the last event's sequence (0: none yet)
        self.first: int = _count(first, "first")  # the oldest retained event's sequence
        self.closed = closed == b"1"
        now_ms = now[0] * 1000 + now[1] // 1000
        # Open, claimed, and the claim ran out: the turn's replica stopped renewing it.
        running_until = _count(run, "run") if run is not None else 0
        self.abandoned = running_until < now_ms and not self.closed and bool(holder)
        # (seq, name, data) of the entries after the sequence asked for; the name None
        # for an entry the store did not write (skipped, logged), which still moves a
        # reader past its sequence.
        self.entries: list[_Entry] = []
        for entry_id, fields in entries:
            entry = _entry(entry_id, fields)
            if entry is not None:
                self.entries.append(entry)


class _Corrupt(Exception):
    """A stream's meta hash that no store wrote: the reason, without its content."""


def _text(value: object, field: str) -> str:
    if not isinstance(value, bytes):
        raise _Corrupt(f"{field} is missing")
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise _Corrupt(f"{field} is not UTF-8") from None


def _is_count(text: bytes | str) -> bool:
    """Whether ``text`` is a count the store writes: a Redis integer, ASCII digits, 64 bits
    at most (``int()`` of thousands of digits raises)."""
    return text.isascii() and text.isdigit() and len(text) <= _MAX_SEQ_DIGITS


def _count(value: object, field: str) -> int:
    if not (isinstance(value, bytes) and _is_count(value)):
        raise _Corrupt(f"{field} is not a count")
    return int(value)


_Entry: TypeAlias = tuple[int, "str | None", bytes]
"""An entry read: its sequence, its event's name (None: not the store's, skipped) and
data."""


def _entry(entry_id: object, fields: object) -> _Entry | None:
    """An entry as (seq, name, data); one the store did not write is logged, and kept
    with no name when its id still gives its place (None when not even that)."""
    if not (isinstance(entry_id, bytes) and entry_id.startswith(b"0-") and _is_count(entry_id[2:])):
        logger.warning("skipped a stream entry whose id is not one the store gives")
        return None
    seq = int(entry_id[2:])
    reason = None
    if not isinstance(fields, dict) or not isinstance(fields.get(b"e"), bytes):
        reason = "it has no event name"
    elif not isinstance(fields.get(b"d"), bytes):
        reason = "it has no data"
    else:
        try:
            return seq, fields[b"e"].decode(), fields[b"d"]
        except UnicodeDecodeError:
            reason = "its event name is not UTF-8"
    logger.warning("skipped stream entry %d, which the store did not write: %s", seq, reason)
    return seq, None, b""


class _Note:
    """One notification: ``kind`` is ``e`` (an event, with ``name`` and ``data``), ``o``,
    ``c``, ``r`` or ``d`` (see _scripts); ``seq`` the stream's last sequence then."""

    __slots__ = ("data", "epoch", "kind", "name", "seq")

    def __init__(self, epoch: str, seq: int, kind: str, name: str, data: bytes) -> None:
        self.epoch = epoch
        self.seq = seq
        self.kind = kind
        self.name = name
        self.data = data


_RESYNC: Final = _Note("", 0, "s", "", b"")
"""Not from Redis: the pub/sub connection was lost, so notifications may be missing."""


def _parse_note(payload: bytes) -> _Note | None:
    head, _, data = payload.partition(b"\n")
    parts = head.decode("ascii", "replace").split(" ")
    if len(parts) < 3 or not _is_count(parts[1]):
        return None
    name = parts[3] if len(parts) > 3 else ""
    return _Note(parts[0], int(parts[1]), parts[2], name, data)


class _Inbox:
    """A follower's notifications, and the future it waits on for the next one."""

    __slots__ = ("newest", "notes", "overflow", "waiter")

    def __init__(self) -> None:
        self.notes: deque[_Note] = deque()
        self.newest = 0  # the highest sequence any notification named
        self.overflow = False
        self.waiter: asyncio.Future[None] | None = None

    def put(self, note: _Note) -> None:
        if note.seq > self.newest:
            self.newest = note.seq
        if len(self.notes) >= _INBOX_LIMIT:
            self.overflow = True  # it reads from Redis instead
        else:
            self.notes.append(note)
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, at_most: float) -> None:
        """Until a notification arrives, or ``at_most`` seconds."""
        if self.notes or self.overflow:
            return
        waiter = self.waiter = asyncio.get_running_loop().create_future()
        try:
            with anyio.move_on_after(at_most):
                await waiter
        finally:
            self.waiter = None


class _CancelWatch(_Inbox):
    """An inbox that calls ``on_cancel`` when a request to cancel arrives, and keeps
    nothing else."""

    __slots__ = ("on_cancel",)

    def __init__(self, on_cancel: Callable[[], None]) -> None:
        super().__init__()
        self.on_cancel = on_cancel

    def put(self, note: _Note) -> None:
        if note.kind == "k":
            self.on_cancel()


class _Listener:
    """The store's pub/sub connection: the channels its followers read, and their inboxes."""

    def __init__(self, store: RedisEventStore) -> None:
        self._store = store
        self._pubsub: Any = None
        self._task: asyncio.Task[None] | None = None
        self._inboxes: dict[bytes, set[_Inbox]] = {}
        self._confirmed: dict[bytes, asyncio.Future[None]] = {}

    async def join(
        self, stream_id: str, inbox: _Inbox | None = None, channel_kind: str = "n"
    ) -> _Inbox:
        """An inbox for ``stream_id``'s notifications (``channel_kind`` ``k``: its
        cancel requests), once Redis confirmed the subscription (so nothing published
        after this returns is missed)."""
        channel = self._store._key(stream_id, channel_kind).encode()
        inbox = inbox if inbox is not None else _Inbox()
        members = self._inboxes.get(channel)
        if members is not None:
            members.add(inbox)
            confirmed = self._confirmed.get(channel)
            if confirmed is not None:
                await asyncio.shield(confirmed)
            return inbox
        self._inboxes[channel] = {inbox}
        self._start()
        confirmed = self._confirmed[channel] = asyncio.get_running_loop().create_future()
        try:
            await self._store._retry.run(lambda _: self._pubsub.subscribe(channel))
            try:
                with anyio.fail_after(self._store.retry_timeout):
                    await asyncio.shield(confirmed)
            except TimeoutError as exc:
                # Redis took the subscription and never confirmed it: out of reach, as a
                # request that goes unanswered is.
                raise RedisUnavailable(
                    f"Redis did not confirm a subscription within {self._store.retry_timeout} s"
                ) from exc
        except BaseException:
            self.leave(stream_id, inbox, channel_kind)
            raise
        return inbox

    def leave(self, stream_id: str, inbox: _Inbox, channel_kind: str = "n") -> None:
        channel = self._store._key(stream_id, channel_kind).encode()
        members = self._inboxes.get(channel)
        if members is None:
            return
        members.discard(inbox)
        if not members:
            del self._inboxes[channel]
            self._confirmed.pop(channel, None)
            pubsub = self._pubsub
            if pubsub is not None and pubsub.connection is not None:
                task = asyncio.get_running_loop().create_task(self._unsubscribe(channel))
                task.add_done_callback(_log_failure)

    async def _unsubscribe(self, channel: bytes) -> None:
        if channel not in self._inboxes:
            try:
                await self._pubsub.unsubscribe(channel)
            except _RETRYABLE as exc:  # the subscription dies with the connection
                logger.debug("unsubscribe failed: %r", exc)

    def _start(self) -> None:
        if self._task is not None and not self._task.done():
            return
        if self._pubsub is None:
            self._pubsub = self._store.redis.pubsub()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="essessey-redis")

    async def _run(self) -> None:
        pubsub = self._pubsub
        # The wait for a message is bounded by the client's socket_timeout, or redis-py
        # would take a quiet second for a failed connection.
        socket_timeout = self._store.redis.connection_pool.connection_kwargs.get("socket_timeout")
        wait = min(1.0, socket_timeout / 2) if socket_timeout else 1.0
        failing = False  # one warning per outage, not one per attempt
        while self._inboxes:
            try:
                if pubsub.connection is None:
                    # Not connected yet (the first subscribe is on its way).
                    await asyncio.sleep(0.01)
                    continue
                message = await pubsub.get_message(timeout=wait)
            except _RETRYABLE as exc:
                (logger.debug if failing else logger.warning)(
                    "the Redis pub/sub connection failed (%s); reconnecting", type(exc).__name__
                )
                failing = True
                self._store._retry.note_trouble()
                self._resync()
                await asyncio.sleep(0.2)
                continue
            if failing:
                failing = False
                logger.info("the Redis pub/sub connection is back")
            if message is None:
                continue
            kind = message["type"]
            channel = message["channel"]
            if kind == "subscribe":
                confirmed = self._confirmed.get(channel)
                if confirmed is not None and not confirmed.done():
                    confirmed.set_result(None)
                elif confirmed is not None:
                    # Subscribed again after a reconnect: notes may be missing meanwhile.
                    for inbox in self._inboxes.get(channel, ()):
                        inbox.put(_RESYNC)
                continue
            if kind != "message":
                continue
            note = _parse_note(message["data"])
            if note is None:
                logger.warning("skipped a notification that is not laid out as expected")
                continue
            for inbox in list(self._inboxes.get(channel, ())):
                inbox.put(note)

    def _resync(self) -> None:
        for members in self._inboxes.values():
            for inbox in members:
                inbox.put(_RESYNC)

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            # Cancelled: whatever it was doing is moot.
            with anyio.CancelScope(shield=True), contextlib.suppress(BaseException):
                await task
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            await pubsub.aclose()


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.debug("a pub/sub request failed: %r", task.exception())


class RedisStoreOptions(TypedDict, total=False):
    """The keyword options of :class:`RedisEventStore`, for
    :meth:`RedisEventStore.from_url` (each one's meaning and default are the
    constructor's)."""

    prefix: str
    max_events_per_stream: int
    max_bytes_per_stream: int
    max_streams: int
    max_age: float
    running_ttl: float
    heartbeat: float
    retry_timeout: float


class RedisEventStore:
    """An :class:`~essessey.EventStore` in Redis (see the module docstring and
    docs/redis.md for its keys, ids, bounds and retries).

    ``redis`` is a ``redis.asyncio.Redis`` client made with ``decode_responses=False``
    (the default); the store does not own it, but :meth:`aclose` ends the store's own
    pub/sub connection. Bounds as :class:`~essessey.InMemoryEventStore`:
    ``max_events_per_stream`` and ``max_bytes_per_stream`` (a stream's oldest events go
    first), ``max_streams`` (the finished stream updated longest ago is dropped first; a
    running one never, and when every one is running, opening another raises
    :class:`~essessey.StoreFull`) and ``max_age`` seconds since a stream's last write
    (the keys' expiry). A stream counts as running from :meth:`open_stream` to
    :meth:`close_stream`, for ``running_ttl`` seconds after its last write or
    :meth:`keep_running`, so a replica that dies mid-turn does not pin its stream
    forever. ``prefix`` begins every key (for Redis Cluster, put it in braces, such as
    ``"{essessey}"``, so all of them share one slot).
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        *,
        prefix: str = "essessey",
        max_events_per_stream: int = 10_000,
        max_bytes_per_stream: int = 32 * 1024 * 1024,
        max_streams: int = 10_000,
        max_age: float = 3600.0,
        running_ttl: float = 10.0,
        heartbeat: float = 1.0,
        retry_timeout: float = 30.0,
    ) -> None:
        if redis.connection_pool.connection_kwargs.get("decode_responses"):
            raise ValueError("the Redis client must be made with decode_responses=False")
        if not prefix or any(c.isspace() for c in prefix):
            raise ValueError(f"prefix {prefix!r} must be non-empty, without whitespace")
        check_positive(
            max_events_per_stream=max_events_per_stream,
            max_bytes_per_stream=max_bytes_per_stream,
            max_streams=max_streams,
            max_age=max_age,
            running_ttl=running_ttl,
            heartbeat=heartbeat,
            retry_timeout=retry_timeout,
        )
        self.redis = redis
        self.prefix = prefix
        self.max_events_per_stream = max_events_per_stream
        self.max_bytes_per_stream = max_bytes_per_stream
        self.max_streams = max_streams
        self.max_age = max_age
        self.running_ttl = running_ttl
        self.heartbeat = heartbeat
        self.retry_timeout = retry_timeout
        self._index = f"{prefix}:streams"
        self._key_prefix = f"{prefix}:"
        self._append = redis.register_script(_scripts.APPEND)
        self._open = redis.register_script(_scripts.OPEN)
        self._close = redis.register_script(_scripts.CLOSE)
        self._clear = redis.register_script(_scripts.CLEAR)
        self._keep = redis.register_script(_scripts.KEEP_RUNNING)
        self._cancel = redis.register_script(_scripts.CANCEL)
        self._running = redis.register_script(_scripts.TURN_RUNNING)
        self._abandon_script = redis.register_script(_scripts.ABANDON)
        self._listener = _Listener(self)
        self._retry = RetryPolicy(
            retry_timeout,
            broker="Redis",
            retryable=_is_retryable,
            unavailable=lambda _: RedisUnavailable(
                f"Redis did not answer within {retry_timeout} s"
            ),
            logger=logger,
        )
        self._token = secrets.token_hex(8)
        self._counter = 0

    @classmethod
    def from_url(cls, url: str, **options: Unpack[RedisStoreOptions]) -> RedisEventStore:
        """A store on a new client for ``url`` (``redis://host:port/db``); the store
        owns that client: :meth:`aclose` closes it."""
        store = cls(aioredis.Redis.from_url(url), **options)
        store._owns_client = True
        return store

    _owns_client = False

    async def aclose(self) -> None:
        """End the store's pub/sub connection (and its client, from :meth:`from_url`)."""
        await self._listener.aclose()
        if self._owns_client:
            await self.redis.aclose()

    async def __aenter__(self) -> RedisEventStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- keys and retries -------------------------------------------------------------------

    def _key(self, stream_id: str, kind: str) -> str:
        return f"{self._key_prefix}{stream_id}:{kind}"

    def _keys(self, stream_id: str) -> list[str]:
        return [
            self._key(stream_id, "m"),
            self._key(stream_id, "e"),
            self._index,
            self._key(stream_id, "x"),
        ]

    @property
    def _ttl_ms(self) -> int:
        return max(1, int(self.max_age * 1000))

    @property
    def _run_ms(self) -> int:
        return max(1, int(self.running_ttl * 1000))

    @staticmethod
    def _refused(exc: redis.exceptions.ResponseError, stream_id: str) -> Exception:
        text = str(exc)
        if text.startswith("ESSFULL"):
            return StoreFull(text.removeprefix("ESSFULL ") + "; no other can start until one ends")
        if text.startswith("ESSBUSY"):
            return StreamBusy(f"stream {stream_id!r}: " + text.removeprefix("ESSBUSY "))
        if text.startswith("ESSLOST"):
            return LeaseLost(f"stream {stream_id!r}: " + text.removeprefix("ESSLOST "))
        if text.startswith("ESSRESET"):
            return StreamReset(f"stream {stream_id!r}: " + text.removeprefix("ESSRESET "))
        return exc

    # -- writing ------------------------------------------------------------------------------

    async def append(self, stream_id: str, event: Event) -> Event:
        """Store ``event`` and return it with its id; notifies the stream's followers.

        Raises ValueError for a stream id that is not a valid id, :class:`StoreFull`,
        :class:`StreamReset` (a running stream that was cleared, for anything but a
        ``message_start``) and :class:`RedisUnavailable`."""
        return await self.append_as(stream_id, event, "")

    async def append_as(self, stream_id: str, event: Event, holder: str) -> Event:
        """:meth:`append` for the turn that claimed the stream as ``holder`` (see
        :meth:`claim_turn`): raises :class:`~essessey.LeaseLost` when it no longer
        holds it, and stores nothing."""
        self._check(stream_id)
        self._counter += 1
        token = f"{self._token}-{self._counter}"
        args: list[_Arg] = [
            stream_id,
            self._key_prefix,
            event.event,
            event.data,
            secrets.token_hex(4),
            self.max_events_per_stream,
            self.max_bytes_per_stream,
            self._ttl_ms,
            self.max_streams,
            _EVENT_OVERHEAD,
            token,
            self._run_ms,
            holder,
        ]
        keys = self._keys(stream_id)
        try:
            reply = await self._retry.run(lambda _: self._append(keys=keys, args=args))
        except redis.exceptions.ResponseError as exc:
            raise self._refused(exc, stream_id) from None
        return Event(event.event, event.data, f"{reply[0].decode()}-{int(reply[1])}")

    async def open_stream(self, stream_id: str) -> None:
        """Create the stream if needed and mark it open and running; raises
        :class:`StoreFull` when ``max_streams`` streams are running."""
        await self._open_as(stream_id, "")

    async def claim_turn(self, stream_id: str, holder: str) -> None:
        """:meth:`open_stream` for a turn, leased to ``holder`` for ``running_ttl``
        seconds at a time (renew with :meth:`keep_running`, release with
        :meth:`release_turn`). Raises :class:`~essessey.StreamBusy` while another holder's
        lease runs; a lease that ran out with the stream open was abandoned, and its
        message is ended with an error event first."""
        await self._open_as(stream_id, holder)

    async def _open_as(self, stream_id: str, holder: str) -> None:
        self._check(stream_id)
        args: list[_Arg] = [
            stream_id,
            self._key_prefix,
            secrets.token_hex(4),
            self._ttl_ms,
            self.max_streams,
            self._run_ms,
            holder,
            _ABANDONED,
            self.max_events_per_stream,
            self.max_bytes_per_stream,
            _EVENT_OVERHEAD,
            "1" if self._may_end_lapsed() else "0",
        ]
        keys = self._keys(stream_id)
        try:
            await self._retry.run(lambda _: self._open(keys=keys, args=args))
        except redis.exceptions.ResponseError as exc:
            raise self._refused(exc, stream_id) from None

    async def close_stream(self, stream_id: str) -> None:
        """No more events for now: followers end once they have everything."""
        await self.release_turn(stream_id, "")

    async def release_turn(self, stream_id: str, holder: str) -> bool:
        """:meth:`close_stream` by the turn that claimed it as ``holder``: False (and
        nothing done) when it no longer holds it."""
        self._check(stream_id)
        keys = self._keys(stream_id)[:3]
        args: list[_Arg] = [stream_id, self._key_prefix, self._ttl_ms, holder]
        return bool(await self._retry.run(lambda _: self._close(keys=keys, args=args)))

    async def clear(self, stream_id: str) -> None:
        """Forget the stream; its ids become unknown and its followers get StreamReset."""
        self._check(stream_id)
        keys = self._keys(stream_id)
        args: list[_Arg] = [stream_id, self._key_prefix, self._ttl_ms]
        await self._retry.run(lambda _: self._clear(keys=keys, args=args))

    async def keep_running(self, stream_id: str, holder: str = "") -> bool:
        """Count a running stream as running for another ``running_ttl`` seconds (and
        keep its keys from expiring): the renewal of ``holder``'s lease, or of whoever
        runs it when ``holder`` is empty. False when it is not running (for ``holder``)."""
        self._check(stream_id)
        keys = self._keys(stream_id)[:3]
        args: list[_Arg] = [stream_id, self._ttl_ms, self._run_ms, holder]
        return bool(await self._retry.run(lambda _: self._keep(keys=keys, args=args)))

    async def turn_running(self, stream_id: str) -> bool:
        """Whether a turn holds a live lease on ``stream_id`` (claimed with
        :meth:`claim_turn` on any replica, not released, renewed in time)."""
        self._check(stream_id)
        key = self._key(stream_id, "m")
        return bool(await self._retry.run(lambda _: self._running(keys=[key], args=[])))

    async def request_cancel(self, stream_id: str, wait: float = 15.0) -> bool:
        """Ask the replica whose turn holds ``stream_id`` to cancel it, and wait (up to
        ``wait`` seconds) until the stream is closed: True once it is, False when no
        turn holds it (or it did not end in time, which is logged)."""
        self._check(stream_id)
        key = self._key(stream_id, "m")
        args: list[_Arg] = [stream_id, self._key_prefix]
        inbox = await self._listener.join(stream_id)
        try:
            with anyio.move_on_after(wait):
                asked_once = False
                while True:
                    asked = await self._retry.run(lambda _: self._cancel(keys=[key], args=args))
                    if not asked:
                        # Nothing holds it: it ended (after our request), or never ran.
                        return asked_once
                    asked_once = True
                    # Until it closes; then again (a request lost with a connection).
                    resend = time.monotonic() + _CANCEL_RESEND
                    while (left := resend - time.monotonic()) > 0:
                        await inbox.wait(left)
                        if _saw_close(inbox):
                            return True
        finally:
            self._listener.leave(stream_id, inbox)
        logger.warning("the turn on %s did not end within %.1f s of the cancel", stream_id, wait)
        return False

    async def watch_cancel(
        self, stream_id: str, on_cancel: Callable[[], None]
    ) -> Callable[[], None]:
        """Call ``on_cancel()`` whenever a replica asks to cancel the turn of
        ``stream_id`` (:meth:`request_cancel`), from when this returns; call what it
        returns to stop."""
        watch = _CancelWatch(on_cancel)
        await self._listener.join(stream_id, watch, "k")
        return lambda: self._listener.leave(stream_id, watch, "k")

    def _may_end_lapsed(self) -> bool:
        """Whether a lease that lapsed may be taken for a dead replica's: only once this
        store has seen Redis answer for a whole ``running_ttl`` (see
        :meth:`RetryPolicy.settled_for`); before that its holder may be alive and about
        to renew it."""
        return self._retry.settled_for(self.running_ttl)

    async def _abandon(self, stream_id: str) -> bool:
        keys = self._keys(stream_id)[:2]
        args: list[_Arg] = [
            stream_id,
            self._key_prefix,
            _ABANDONED,
            self.max_events_per_stream,
            self.max_bytes_per_stream,
            _EVENT_OVERHEAD,
        ]
        ended = bool(await self._retry.run(lambda _: self._abandon_script(keys=keys, args=args)))
        if ended:
            logger.warning("the turn on %s lost its replica; ended it with an error", stream_id)
        return ended

    @staticmethod
    def _check(stream_id: str) -> None:
        if not is_stream_id(stream_id):
            raise ValueError(f"{stream_id!r} is not a valid stream id")

    # -- reading ------------------------------------------------------------------------------

    async def _snapshot(self, stream_id: str, after: int, count: int) -> _Snapshot | None:
        """The stream id's state and up to ``count`` entries after ``after``; None when
        it is not held. A transaction, not a script: a script's reply of many entries
        costs Redis twice what the same XRANGE does."""
        meta, events = self._key(stream_id, "m"), self._key(stream_id, "e")

        async def read(_: float) -> list[Any]:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.time()
                pipe.hmget(meta, "epoch", "seq", "first", "closed", "run", "holder")
                if count:
                    pipe.xrange(events, f"(0-{after}", "+", count=count)
                return await pipe.execute()

        replies = await self._retry.run(read)
        if replies[1][0] is None:
            return None
        try:
            return _Snapshot(replies[0], replies[1], replies[2] if count else [])
        except _Corrupt as exc:
            # Not the store's layout (another writer's, a damaged key): read as not held,
            # which a reader is told (404), rather than a failure of every read.
            logger.warning(
                "%s's record in Redis is not the store's (%s); read as not held", stream_id, exc
            )
            return None

    async def exists(self, stream_id: str) -> bool:
        """Whether the stream is retained (not expired, cleared or dropped)."""
        if not is_stream_id(stream_id):
            return False
        key = self._key(stream_id, "m")
        return bool(await self._retry.run(lambda _: self.redis.exists(key)))

    async def knows(self, stream_id: str, last_event_id: str) -> bool:
        """Whether :meth:`since` would call ``last_event_id`` known now: one read of the
        stream's state, none of its events."""
        if not is_stream_id(stream_id):
            return False
        snap = await self._snapshot(stream_id, 0, 0)
        return snap is not None and _resume_point(snap, last_event_id) is not None

    async def since(self, stream_id: str, last_event_id: str | None) -> tuple[list[Event], bool]:
        """The events after ``last_event_id`` (all retained ones when None) and whether
        that id is known: it is when every event after it is retained."""
        if not is_stream_id(stream_id):
            return [], False
        snap = await self._snapshot(stream_id, 0, 0)
        if snap is None:
            return [], False
        after = snap.first - 1
        if last_event_id is not None:
            seq = _resume_point(snap, last_event_id)
            if seq is None:
                return [], False
            after = seq
        epoch = snap.epoch
        events: list[Event] = []
        while True:
            page = await self._snapshot(stream_id, after, _READ_BATCH * 4)
            if page is None or page.epoch != epoch or page.first - 1 > after:
                return [], False  # cleared, recreated or trimmed past it under the read
            events.extend(
                Event(name, data, f"{epoch}-{seq}") for seq, name, data in page.entries if name
            )
            if not page.entries or page.entries[-1][0] >= page.seq:
                return events, True
            after = page.entries[-1][0]

    async def follow(
        self, stream_id: str, last_event_id: str | None = None, *, max_lag: int | None = None
    ) -> AsyncGenerator[Event, None]:
        """Replay after ``last_event_id``, then live events, until the stream is closed
        and drained.

        Without an id it starts at the stream's first event when it is retained, else at
        the oldest ``message_start`` retained, else at the next one to come
        (:class:`MessagesNotRetained` when the stream closes first). Raises
        :class:`StreamNotFound` or :class:`UnknownEventId` before any event,
        :class:`SubscriberLagged` (more than ``max_lag`` of the events appended since it
        started wait for it, or its position was trimmed) and :class:`StreamReset`
        (cleared, expired or dropped meanwhile)."""
        if not is_stream_id(stream_id):
            raise StreamNotFound(f"no stream {stream_id!r}")
        inbox = _Inbox()
        # The first page is handed out before the follower subscribes: a resume's first
        # event is one read away. The follower subscribes before it reads again or
        # waits for news, and then reads Redis once more, for what was appended before
        # the subscription was in place.
        follower = _Follower(self, stream_id, inbox, max_lag)
        try:
            await follower.start(last_event_id)
            while True:
                event = await follower.next()
                if event is None:
                    return
                yield event
        finally:
            if follower.joined:
                self._listener.leave(stream_id, inbox)


class _Follower:
    """The position of one ``follow`` and how it moves: from what it read of Redis, and
    from the notifications in its inbox."""

    def __init__(
        self,
        store: RedisEventStore,
        stream_id: str,
        inbox: _Inbox,
        max_lag: int | None,
    ) -> None:
        self.joined = False  # subscribed to the stream's notifications
        self.store = store
        self.stream_id = stream_id
        self.inbox = inbox
        self.max_lag = max_lag
        self.epoch = ""
        self.cursor = 0  # the sequence of the last event handed out (or skipped)
        self.latest = 0  # the newest sequence known to exist
        self.live_from = 0  # lag counts what was appended after this one
        self.closed = False
        self.seeking = False  # skipping a message's tail until the next message_start
        self.ready: deque[_Entry] = deque()  # read or notified, in order
        self.behind = True  # Redis holds events after the cursor not yet read
        self.page = _FIRST_PAGE  # events the last read asked for

    async def start(self, last_event_id: str | None) -> None:
        store, stream_id = self.store, self.stream_id
        # One read for the position and the first page after it: a resume's first event
        # is one round trip away. The id's sequence is read before its epoch is known,
        # and the page kept only once the id turns out to be this stream's.
        guess = (
            parse_event_id(last_event_id, last_event_id.rpartition("-")[0]) if last_event_id else 0
        )
        snap = await store._snapshot(stream_id, guess or 0, _FIRST_PAGE)
        if snap is None:
            raise StreamNotFound(f"no stream {stream_id!r}")
        self.epoch = snap.epoch
        self.latest = self.live_from = snap.seq
        self.closed = snap.closed
        if last_event_id is not None:
            seq = parse_event_id(last_event_id, snap.epoch)
            if seq is None or not snap.first - 1 <= seq <= snap.seq:
                raise UnknownEventId(f"event id is not retained for stream {stream_id!r}")
            self.cursor = seq
            self._take_page(snap)
            return
        if snap.first == 1:
            self._take_page(snap)
            return  # the whole stream is retained: from its start
        # Part of it was trimmed: start at a message boundary, so a client never renders
        # half a message.
        after = snap.first - 1
        while True:
            page = await store._snapshot(stream_id, after, _READ_BATCH)
            if page is None or page.epoch != self.epoch:
                raise StreamNotFound(f"no stream {stream_id!r}")
            for seq, name, _ in page.entries:
                if name == EventType.MESSAGE_START:
                    self.cursor = seq - 1
                    return
            if not page.entries or page.entries[-1][0] >= page.seq:
                break
            after = page.entries[-1][0]
        # No whole message retained: skip to the next message_start.
        self.cursor = snap.seq
        self.seeking = True
        if snap.closed:
            raise MessagesNotRetained(
                f"no whole message of {stream_id!r} is retained, and its turn ended"
            )

    async def next(self) -> Event | None:
        """The next event, or None once the stream is closed and drained."""
        inbox = self.inbox
        while True:
            if self.ready:
                seq, name, data = self.ready.popleft()
                if seq <= self.cursor:
                    continue
                event = self._hand_out(seq, name, data)
                if event is not None:
                    return event
                continue
            if inbox.overflow or self.behind:
                if inbox.overflow:
                    inbox.overflow = False
                    inbox.notes.clear()
                if await self._fetch():
                    return None
                continue
            if not self.joined:
                # Caught up with what Redis held at the last read: from here on the
                # follower needs the notifications. (A replay given up half way, the
                # client gone, never subscribes.)
                self.joined = True  # (join leaves the channel itself when it fails)
                await self.store._listener.join(self.stream_id, inbox)
                self.behind = True
                continue
            if inbox.notes:
                note = inbox.notes.popleft()
                if await self._take(note):
                    return None
                continue
            if self.closed and self.cursor >= self.latest:
                return None
            await inbox.wait(self.store.heartbeat)
            # Quiet for a heartbeat: a notification may have been lost.
            if not inbox.notes and not inbox.overflow and await self._fetch():
                return None

    def _hand_out(self, seq: int, name: str | None, data: bytes) -> Event | None:
        self.cursor = seq
        if name is None:
            return None  # an entry the store did not write: passed over, logged
        if self.max_lag is not None:
            # What is known to exist, notifications not yet looked at included.
            lag = max(self.latest, self.inbox.newest) - max(seq, self.live_from)
            if lag > self.max_lag:
                raise SubscriberLagged(f"subscriber is {lag} events behind {self.stream_id!r}")
        if self.seeking:
            if name != EventType.MESSAGE_START:
                return None
            self.seeking = False
        return Event(name, data, f"{self.epoch}-{seq}")

    async def _take(self, note: _Note) -> bool:
        """Act on a notification; True when the follow ends."""
        kind = note.kind
        if kind == "s":
            self.behind = True
            return False
        if note.epoch != self.epoch:
            if self.closed and self.cursor >= self.latest:
                return True  # a new life began after we had everything of ours
            raise StreamReset(f"stream {self.stream_id!r} was cleared or dropped")
        if kind == "e":
            if note.seq > self.latest:
                self.latest = note.seq
            self.closed = False
            have = self.ready[-1][0] if self.ready else self.cursor
            if note.seq == have + 1:
                self.ready.append((note.seq, note.name, note.data))  # no round trip
            elif note.seq > have + 1:
                self.behind = True  # a hole: read what is missing
            return False
        if kind == "o":
            self.closed = False
            return False
        if kind == "c":
            self.latest = max(self.latest, note.seq)
            self.closed = True
            if self.cursor >= self.latest and not self.inbox.notes:
                return self._ended()
            return False
        # r (cleared) or d (dropped)
        if kind == "d" and self.closed and self.cursor >= self.latest:
            return True
        raise StreamReset(f"stream {self.stream_id!r} was cleared or dropped")

    def _ended(self) -> bool:
        if self.seeking:
            raise MessagesNotRetained(
                f"no whole message of {self.stream_id!r} is retained, and its turn ended"
            )
        return True

    async def _fetch(self) -> bool:
        """Read from Redis what follows the cursor; True when the follow ends."""
        # Pages grow from the first one's size: a replay that is given up early (the
        # client went away after a few events) reads little more than it sent.
        self.page = min(self.page * 4, _READ_BATCH)
        snap = await self.store._snapshot(self.stream_id, self.cursor, self.page)
        if snap is None or snap.epoch != self.epoch:
            if self.closed and self.cursor >= self.latest:
                return True  # expired or dropped after we had everything
            raise StreamReset(f"stream {self.stream_id!r} was cleared or dropped")
        if snap.first - 1 > self.cursor:
            raise SubscriberLagged(
                f"events after the subscriber's position in {self.stream_id!r} were trimmed"
            )
        if snap.abandoned and not snap.entries and self.store._may_end_lapsed():
            # Caught up with a turn whose replica died: end it (once, whoever gets here
            # first); its error event and close arrive as notifications.
            await self.store._abandon(self.stream_id)
            self.behind = True
            return False
        self._take_page(snap)
        if not snap.entries and snap.closed and self.cursor >= snap.seq:
            return self._ended()
        return False

    def _take_page(self, snap: _Snapshot) -> None:
        """What a read gave after the cursor becomes the next events to hand out."""
        self.latest = max(self.latest, snap.seq)
        self.closed = snap.closed
        self.ready.clear()
        self.ready.extend(snap.entries)
        last = snap.entries[-1][0] if snap.entries else self.cursor
        self.behind = last < snap.seq


def _saw_close(inbox: _Inbox) -> bool:
    """Whether ``inbox`` holds a close (or a clear, a drop) of the stream; it is emptied."""
    seen = any(note.kind in "crd" for note in inbox.notes)
    inbox.notes.clear()
    return seen
