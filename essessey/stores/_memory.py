"""The in-memory event store: one process's streams, bounded in count, bytes and age.

Ids are ``<epoch>-<sequence>``: the sequence counts up per stream, and the epoch changes
whenever the stream is created anew (first event, after a clear, after it expired), so an
id from before a reset can never be mistaken for a position in the new stream. The rules
every store keeps are declared in :mod:`essessey.stores` (docs/resume.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from itertools import islice
from typing import Final

from essessey import metrics
from essessey._ids import parse_event_id
from essessey._logsafe import log_failure
from essessey.errors import (
    MessagesNotRetained,
    StoreFull,
    StreamNotFound,
    StreamReset,
    SubscriberLagged,
    UnknownEventId,
)
from essessey.event import Event, new_event
from essessey.protocol import TEXT_DELTA_HEADS, TEXT_DELTA_TAIL, EventType, text_delta_head
from essessey.stores._checks import check_positive
from essessey.stores._contract import StreamAppender, Taker

__all__ = ["InMemoryEventStore"]

logger = logging.getLogger("essessey.stores")
_DELTA: Final = EventType.CONTENT_BLOCK_DELTA


class _Follower:
    """One follower of a stream: its position and, while it waits, how it is woken.

    A follower with a ``taker`` waits caught up (its next event is the next to be
    appended) among its stream's takers: an append hands it the new event in the writer's
    own call, and it stays parked. At a model's pace an event then reaches a connection
    without a task switch or the generators between the store and the connection."""

    __slots__ = ("cursor", "signal", "taker")

    def __init__(self, cursor: int, taker: Taker | None) -> None:
        # The sequence of the next event this follower reads; while it is a taker, the
        # sequence it parked at (what it took since is counted when it leaves).
        self.cursor = cursor
        self.taker = taker
        self.signal: asyncio.Future[None] | None = None

    def wake(self) -> None:
        signal = self.signal
        if signal is not None and not signal.done():
            signal.set_result(None)


class _Stream:
    """One stream of the store; while its turn runs, also that turn's
    :class:`~essessey.stores.StreamAppender` (see :meth:`InMemoryEventStore.appender`)."""

    __slots__ = (
        "bytes",
        "capacity",
        "closed",
        "datas",
        "epoch",
        "first_seq",
        "id_head",
        "names",
        "next_seq",
        "running",
        "sole",
        "store",
        "stream_id",
        "takers",
        "updated",
        "waiters",
    )

    def __init__(self, store: InMemoryEventStore, stream_id: str, epoch: str) -> None:
        self.store = store
        self.stream_id = stream_id
        self.epoch = epoch
        self.id_head = f"{epoch}-".encode()  # what each id starts with (Taker.take_text)
        # The deques' maxlen, kept in a slot of its own: the append's check reads it,
        # and a slot is cheaper to read than a deque's maxlen.
        self.capacity = capacity = store.max_events_per_stream
        # The events as two deques of strings and bytes, their ids made when read: no
        # object the garbage collector tracks is made per event kept. (As Events, a
        # tuple subclass the collector never stops tracking, a million retained events
        # made every full collection walk a million objects, and every append brought the
        # next collection nearer: at a few hundred paced streams, a pause a reader sees.)
        self.names: deque[str] = deque(maxlen=capacity)
        self.datas: deque[bytes] = deque(maxlen=capacity)
        self.first_seq = 1  # the sequence of names[0] and datas[0]
        self.next_seq = 1
        self.bytes = 0  # what its events hold, as counted (see _EVENT_OVERHEAD)
        self.closed = False
        # Opened (open_stream) and not yet closed: a turn is writing it. Such a stream
        # is never dropped to make room or for its age: its reader would lose it, and the
        # turn would go on writing into a new epoch, mid-message.
        self.running = False
        self.updated = time.monotonic()
        # The followers waiting for the next change, each with its own wake-up (an
        # asyncio future, the cheapest there is), so a follower cancelled while it
        # waits cancels nobody else's wait: those that read every change themselves,
        # and those that take each appended event in the append (see _Follower).
        self.waiters: list[_Follower] = []
        self.takers: list[_Follower] = []
        # The taker of the one follower among the takers, or None (none, or several):
        # the one an event is offered to, without the loop over the takers.
        self.sole: Taker | None = None

    def append(self, name: str, data: bytes) -> None:
        """Append the event ``name`` with ``data`` (a running turn's append)."""
        if self.running:
            self.put(name, data)
        else:  # closed or cleared since: the store's rules for such an append
            self.store._append_fields(self.stream_id, name, data)

    def emit_text(self, index: int, text: str, text_json: bytes) -> None:
        """Append a Publisher's text delta (a running turn's append; see
        :meth:`Taker.take_text`): nearly every event of a turn."""
        try:
            data = TEXT_DELTA_HEADS[index] + text_json + TEXT_DELTA_TAIL
        except KeyError:  # a block index past the first 256
            data = text_delta_head(index) + text_json + TEXT_DELTA_TAIL
        if self.running:
            self.put(_DELTA, data, index, text, text_json)
        else:
            self.store._append_fields(self.stream_id, _DELTA, data, index, text, text_json)

    def put(
        self,
        name: str,
        data: bytes,
        index: int = 0,
        text: str | None = None,
        text_json: bytes = b"",
    ) -> None:
        """Keep the event, within the store's bounds, and offer it to the takers (as a
        Publisher's text delta of ``index``, ``text`` and ``text_json``, when ``text`` is
        not None), then wake the waiters."""
        datas = self.datas
        if len(datas) == self.capacity:
            self.first_seq += 1  # the deques drop their oldest on append
            dropped = len(datas[0]) + _EVENT_OVERHEAD
            self.bytes -= dropped
            self.store._bytes -= dropped
        self.names.append(name)
        datas.append(data)
        size = len(data) + _EVENT_OVERHEAD  # _cost, inline on the path of every event
        self.bytes += size
        store = self.store
        store._bytes += size
        if self.bytes > store.max_bytes_per_stream or store._bytes > store.max_bytes:
            store._keep_budgets(self)
        seq = self.next_seq
        self.next_seq = seq + 1
        sole = self.sole
        if sole is not None:
            # One caught-up reader (nearly always): its taker, without the loop.
            try:
                took = (
                    sole.take(name, data, f"{self.epoch}-{seq}")
                    if text is None
                    else sole.take_text(data, self.id_head, seq, index, text, text_json)
                )
            except Exception as exc:  # a reader's bug must not fail the writer's append
                took = False
                for follower in self.takers:  # the one whose taker it is
                    if follower.taker is sole:
                        self.failed(follower, exc)
            if not took:
                # Every taker (the one, unless the call changed the list) reads it itself.
                self.refused(self.takers[:])
        elif self.takers:
            self.offer(name, data, seq, index, text, text_json)
        if self.waiters:
            self.wake()

    def offer(
        self,
        name: str,
        data: bytes,
        seq: int,
        index: int = 0,
        text: str | None = None,
        text_json: bytes = b"",
    ) -> None:
        """Offer the event just kept to each taker; those that refuse it leave the takers
        and are woken to read it."""
        event_id = f"{self.epoch}-{seq}" if text is None else ""
        refused: list[_Follower] | None = None
        for follower in self.takers:
            taker = follower.taker
            try:
                took = taker is not None and (
                    taker.take(name, data, event_id)
                    if text is None
                    else taker.take_text(data, self.id_head, seq, index, text, text_json)
                )
            except Exception as exc:  # a reader's bug must not fail the writer's append
                took = self.failed(follower, exc)
            if not took:
                if refused is None:
                    refused = []
                refused.append(follower)
        if refused is not None:
            self.refused(refused)

    @staticmethod
    def failed(follower: _Follower, exc: Exception) -> bool:
        """A taker raised: it is logged and not offered another event (False: the
        follower reads this one itself)."""
        log_failure(logger, exc, "a follower's delivery failed; waking it instead")
        follower.taker = None
        return False

    def event_at(self, seq: int) -> Event:
        offset = seq - self.first_seq
        return new_event(Event, (self.names[offset], self.datas[offset], f"{self.epoch}-{seq}"))

    def events_from(self, seq: int, end: int | None = None) -> list[Event]:
        """Every retained event from ``seq`` on (up to ``end``, excluded)."""
        offset = seq - self.first_seq
        stop = None if end is None else end - self.first_seq
        epoch = self.epoch
        pairs = zip(islice(self.names, offset, stop), islice(self.datas, offset, stop), strict=True)
        return [
            new_event(Event, (name, data, f"{epoch}-{n}"))
            for n, (name, data) in enumerate(pairs, seq)
        ]

    def refused(self, followers: list[_Follower]) -> None:
        """These takers did not take the event just appended: each leaves the takers and
        is woken to read it itself."""
        seq = self.next_seq - 1
        for follower in followers:
            self.takers.remove(follower)
            follower.cursor = seq
            follower.wake()
        self.takers_changed()

    def takers_changed(self) -> None:
        """Keep ``sole`` to its rule: the taker of the one follower among the takers."""
        takers = self.takers
        self.sole = takers[0].taker if len(takers) == 1 else None

    def wake(self) -> None:
        """A change every waiter reads itself: an append (after its takers'), or
        (with the takers) a close or a drop."""
        waiters = self.waiters
        if waiters:
            self.waiters = []
            for follower in waiters:
                follower.wake()

    def wake_all(self) -> None:
        """A close or a drop: every follower reads what is left itself (a taker has
        taken everything appended so far)."""
        takers = self.takers
        if takers:
            self.takers = []
            self.sole = None
            for follower in takers:
                follower.cursor = self.next_seq
                follower.wake()
        self.wake()

    def waiting(self, follower: _Follower, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        """What the follower awaits until the next change it must read itself (an append
        it did not take, a close, a drop). A plain function, so that the follow loop
        awaits the future itself: one frame fewer to suspend and resume through for each
        event a reader is woken for. A follower cancelled while it waits must be
        :meth:`forget`-ten."""
        future: asyncio.Future[None] = loop.create_future()
        follower.signal = future
        if follower.taker is None:
            self.waiters.append(follower)
        else:
            self.takers.append(follower)
            self.takers_changed()
        return future

    def forget(self, follower: _Follower) -> None:
        """Take a follower cancelled while it waited (the client left) off its list, or
        a quiet stream would collect one per departed follower."""
        with contextlib.suppress(ValueError):
            if follower in self.waiters:
                self.waiters.remove(follower)
            else:
                self.takers.remove(follower)
                self.takers_changed()


_SINCE_STEP: Final = 5000
"""Events :meth:`InMemoryEventStore.since` reads between two turns of the event loop
(a few milliseconds' work)."""
_EVENT_OVERHEAD: Final = 180
"""Bytes an event counts against the byte budgets beyond its data: at least what the store
spends on keeping it (two deque slots and the data's bytes object), so the budgets hold
more than they promise, never less. The Redis and JetStream stores count the same, so one
budget means one thing on every store."""


def _cost(data: bytes) -> int:
    """What an event of ``data`` counts against the byte budgets."""
    return len(data) + _EVENT_OVERHEAD


class InMemoryEventStore:
    """An :class:`~essessey.stores.EventStore` in this process's memory, bounded in count
    and in bytes.

    ``max_events_per_stream`` and ``max_bytes_per_stream`` (a stream's oldest events are
    evicted first), ``max_streams`` and ``max_bytes`` for the whole store (the finished
    stream updated longest ago is dropped first; when running streams alone hold more
    than ``max_bytes``, the stream being appended to loses its oldest events), and
    ``max_age`` seconds since a stream's last event or its turn's end, whichever came
    last (a finished stream stays resumable until then). An event counts ``len(data)``
    plus 180 bytes of the store's own (see docs/resume.md). Every bound must be positive.

    A stream whose turn is running (opened with :meth:`open_stream`, not yet closed) is
    never dropped, by count or by age. When ``max_streams`` streams are running, opening
    (or first appending to) another raises :class:`~essessey.StoreFull`. A running stream
    that is cleared stays cleared: appending to it anything but a ``message_start`` (a new
    message) raises :class:`~essessey.StreamReset` instead of starting a new epoch with
    the tail of a message.
    """

    def __init__(
        self,
        *,
        max_events_per_stream: int = 10_000,
        max_streams: int = 10_000,
        max_age: float = 3600.0,
        max_bytes_per_stream: int = 32 * 1024 * 1024,
        max_bytes: int = 512 * 1024 * 1024,
    ) -> None:
        check_positive(
            max_events_per_stream=max_events_per_stream,
            max_bytes_per_stream=max_bytes_per_stream,
            max_bytes=max_bytes,
            max_streams=max_streams,
            max_age=max_age,
        )
        self.max_events_per_stream = max_events_per_stream
        self.max_streams = max_streams
        self.max_age = max_age
        self.max_bytes_per_stream = max_bytes_per_stream
        self.max_bytes = max_bytes
        self._bytes = 0  # what every stream holds, as counted
        # Ordered by last update, oldest first, so expiry pops from the front.
        self._streams: OrderedDict[str, _Stream] = OrderedDict()
        # Running streams that were cleared: their turn's next event must not recreate
        # them mid-message. Bounded; the oldest is forgotten first.
        self._cleared_running: OrderedDict[str, None] = OrderedDict()
        metrics.watch_store(self)

    def __len__(self) -> int:
        return len(self._streams)

    @property
    def held_events(self) -> int:
        """How many events the store holds, every stream together."""
        return sum(len(stream.names) for stream in self._streams.values())

    @property
    def held_bytes(self) -> int:
        """What the store's events hold, counted as its byte budgets count them."""
        return self._bytes

    def _expire(self, now: float | None = None, room: int = 0) -> None:
        """Drop the finished streams past ``max_age``, and the finished streams updated
        longest ago while more than ``max_streams - room`` are held."""
        streams = self._streams
        horizon = (time.monotonic() if now is None else now) - self.max_age
        over = len(streams) + room - self.max_streams
        if not streams or (over <= 0 and next(iter(streams.values())).updated >= horizon):
            return  # the common case: nothing to drop
        dropped: list[str] = []
        for stream_id, stream in streams.items():
            expired = stream.updated < horizon
            if not expired and over <= 0:
                break  # ordered by update: the rest are fresher still
            if stream.running:
                continue  # a running turn's stream is never dropped
            dropped.append(stream_id)
            over -= 1
        for stream_id in dropped:
            self._drop(stream_id, "expired or over max_streams")

    def _drop(self, stream_id: str, why: str) -> None:
        """Drop a finished stream to keep a bound."""
        stream = self._streams.pop(stream_id)
        self._bytes -= stream.bytes
        # Followers of a dropped stream must not wait forever. It is not marked closed: a
        # follower that has not seen the stream closed by its producer gets StreamReset,
        # never an end that looks like the turn's.
        stream.wake_all()
        logger.debug("dropped stream %s (%s)", stream_id, why)

    def _get(self, stream_id: str) -> _Stream | None:
        self._expire()
        return self._streams.get(stream_id)

    def _create_or_touch(self, stream_id: str, now: float) -> _Stream:
        stream = self._streams.get(stream_id)
        if stream is not None and stream.updated < now - self.max_age:
            # Past max_age, the stream is gone whether or not a read has dropped it
            # yet: writing to it starts a new epoch either way.
            self._expire(now)
            stream = self._streams.get(stream_id)
        if stream is None:
            if len(self._streams) >= self.max_streams:
                self._expire(now, room=1)
                if len(self._streams) >= self.max_streams:
                    raise StoreFull(
                        f"the store holds {len(self._streams)} streams whose turns are "
                        "running; no other can start until one ends"
                    )
            # A fresh epoch per creation: ids from an earlier life of this stream id
            # (before a clear or expiry) must not match positions in this one.
            stream = _Stream(self, stream_id, secrets.token_hex(4))
            self._streams[stream_id] = stream
        else:
            self._streams.move_to_end(stream_id)
        return stream

    def appender(self, stream_id: str) -> StreamAppender | None:
        """The open stream ``stream_id`` as a :class:`~essessey.stores.StreamAppender`
        (its running turn's appends, as plain calls and with no lookup by id each), or
        None when it is not open."""
        stream = self._streams.get(stream_id)
        return stream if stream is not None and stream.running else None

    def _append_fields(
        self,
        stream_id: str,
        name: str,
        data: bytes,
        index: int = 0,
        text: str | None = None,
        text_json: bytes = b"",
    ) -> None:
        """:meth:`append` of the event ``name`` with ``data``, without a coroutine and
        without an :class:`~essessey.Event` (see :meth:`_Stream.put`)."""
        stream = self._streams.get(stream_id)
        if stream is None or not stream.running:
            stream = self._reopen(stream_id, name)
        # A running turn's stream is neither dropped nor reordered while it runs: its
        # place and time are its opening's until close_stream moves it to the end, so
        # the order by update holds for the streams expiry may drop.
        stream.put(name, data, index, text, text_json)

    def _reopen(self, stream_id: str, name: str) -> _Stream:
        """The stream an append to a stream with no running turn goes to: created anew
        when it is gone (only a new message may start a running stream that was
        cleared), moved to the end as updated now, and open."""
        now = time.monotonic()
        cleared = self._cleared_running
        if cleared and stream_id in cleared and stream_id not in self._streams:
            if name != EventType.MESSAGE_START:
                raise StreamReset(
                    f"stream {stream_id!r} was cleared while its turn ran; only a new "
                    "message may start it again"
                )
            del cleared[stream_id]
        stream = self._create_or_touch(stream_id, now)
        stream.closed = False
        stream.updated = now
        return stream

    def _keep_budgets(self, stream: _Stream) -> None:
        """An append to ``stream`` took it past ``max_bytes_per_stream`` or the store
        past ``max_bytes``: make room (see :meth:`_trim` and :meth:`_over_budget`)."""
        if stream.bytes > self.max_bytes_per_stream:
            self._trim(stream, self.max_bytes_per_stream)
        if self._bytes > self.max_bytes:
            self._over_budget(stream)

    def _trim(self, stream: _Stream, budget: int) -> None:
        """Evict ``stream``'s oldest events until it holds at most ``budget`` bytes (its
        newest event always stays)."""
        datas = stream.datas
        while stream.bytes > budget and len(datas) > 1:
            stream.names.popleft()
            dropped = _cost(datas.popleft())
            stream.first_seq += 1
            stream.bytes -= dropped
            self._bytes -= dropped

    def _over_budget(self, stream: _Stream) -> None:
        """The store holds more than ``max_bytes``: drop finished streams, updated longest
        ago first; if running streams alone hold too much, the one appended to pays."""
        streams = self._streams
        excess = self._bytes - self.max_bytes
        dropped: list[str] = []
        for other_id, other in streams.items():
            if excess <= 0:
                break
            if other.running or other is stream:
                continue
            dropped.append(other_id)
            excess -= other.bytes
        for other_id in dropped:
            self._drop(other_id, "over max_bytes")
        if self._bytes > self.max_bytes:
            self._trim(stream, max(stream.bytes - (self._bytes - self.max_bytes), 0))

    async def append(self, stream_id: str, event: Event) -> Event:
        """Store ``event`` and return it with its id; wakes the stream's followers."""
        self._append_fields(stream_id, event.event, event.data)
        return self._newest(stream_id)

    def _newest(self, stream_id: str) -> Event:
        """The stream's newest event, with its id (an append never evicts it)."""
        stream = self._streams[stream_id]
        return stream.event_at(stream.next_seq - 1)

    def _start(self, stream: _Stream, last_event_id: str | None) -> int | None:
        """The sequence of the first event to replay, or None when ``last_event_id``
        cannot be resumed from without a gap."""
        if last_event_id is None:
            if stream.first_seq == 1:
                return 1
            # Part of the stream was evicted: start at a message boundary so a client
            # never renders half a message.
            for offset, name in enumerate(stream.names):
                if name == EventType.MESSAGE_START:
                    return stream.first_seq + offset
            # No whole message retained: the follower skips to the next message_start.
            return stream.next_seq
        seq = parse_event_id(last_event_id, stream.epoch)
        if seq is None:
            return None
        # Known when everything after it is still here: the event itself may have been
        # evicted, its successors not.
        if stream.first_seq - 1 <= seq < stream.next_seq:
            return seq + 1
        return None

    async def knows(self, stream_id: str, last_event_id: str) -> bool:
        """Whether :meth:`since` would call ``last_event_id`` known now, without making
        the events after it."""
        stream = self._get(stream_id)
        return stream is not None and self._start(stream, last_event_id) is not None

    async def since(self, stream_id: str, last_event_id: str | None) -> tuple[list[Event], bool]:
        """The events after ``last_event_id`` and whether it is known (see the protocol).

        A long read goes in steps that let other tasks run; should the stream be cleared,
        or trimmed past what is still to read, meanwhile, it gives what it read so far
        (a follower from its last event then finds it gone, as a slow one would)."""
        stream = self._get(stream_id)
        if stream is None:
            return [], False
        if last_event_id is None:
            start = stream.first_seq  # everything retained
        else:
            resume_at = self._start(stream, last_event_id)
            if resume_at is None:
                return [], False
            start = resume_at
        end = stream.next_seq
        if end - start <= _SINCE_STEP:
            # islice walks the deque once; indexing it is O(n) away from its ends.
            return stream.events_from(start), True
        # A long read (a snapshot's first, of a turn of 100,000 deltas) in steps, so that
        # the other tasks of the process (the live turns) run between them: up to the
        # head as it was when asked, as if it had been read at once then.
        events: list[Event] = []
        seq = start
        while seq < end:
            if self._streams.get(stream_id) is not stream or stream.first_seq > seq:
                break  # cleared, or trimmed past what is still to read: what was read
            step = min(seq + _SINCE_STEP, end)
            events += stream.events_from(seq, step)
            seq = step
            if seq < end:
                await asyncio.sleep(0)
        return events, True

    def follow(
        self, stream_id: str, last_event_id: str | None = None, *, max_lag: int | None = None
    ) -> AsyncIterator[Event]:
        """Replay, then live events, until the stream is closed and drained."""
        return self._follow(stream_id, last_event_id, max_lag, None)

    def follow_delivering(
        self,
        stream_id: str,
        last_event_id: str | None = None,
        *,
        max_lag: int | None = None,
        taker: Taker | None = None,
    ) -> AsyncIterator[Event]:
        """:meth:`follow`; and while the follower waits caught up, each new event is
        offered to ``taker`` in the append itself, and what it takes is not yielded.

        For a reader whose connection can take an event without waiting (essessey's SSE
        subscription response): the events reach it in the same order, none twice and
        none skipped, whichever way each one goes. A subclass that reads its streams its
        own way (overrides :meth:`follow`) is read through its ``follow``.
        """
        if type(self).follow is not InMemoryEventStore.follow:
            return self.follow(stream_id, last_event_id, max_lag=max_lag)
        return self._follow(stream_id, last_event_id, max_lag, taker)

    async def _follow(
        self,
        stream_id: str,
        last_event_id: str | None,
        max_lag: int | None,
        taker: Taker | None,
    ) -> AsyncIterator[Event]:
        stream = self._get(stream_id)
        if stream is None:
            raise StreamNotFound(f"no stream {stream_id!r}")
        start = self._start(stream, last_event_id)
        if start is None:
            raise UnknownEventId(f"event id is not retained for stream {stream_id!r}")
        # Without an id, with no whole message retained, what comes before the next
        # message_start is the tail of a message: skipped, and never offered in the append.
        seeking = last_event_id is None and start == stream.next_seq and stream.first_seq > 1
        me = _Follower(start, None if seeking else taker)
        loop = asyncio.get_running_loop()
        # Lag counts only what was appended after the follower started: the backlog it
        # replays first is not a sign of a slow reader, and counting it would end a
        # resuming follower before its first event, again at every attempt.
        live_from = stream.next_seq
        while True:
            cursor = me.cursor
            if self._streams.get(stream_id) is not stream:
                if stream.closed and cursor >= stream.next_seq:
                    return  # expired after we had everything
                raise StreamReset(f"stream {stream_id!r} was cleared or dropped")
            if cursor < stream.first_seq:
                raise SubscriberLagged(
                    f"events after the subscriber's position in {stream_id!r} were evicted"
                )
            if max_lag is not None and stream.next_seq - max(cursor, live_from) > max_lag:
                raise SubscriberLagged(
                    f"subscriber is {stream.next_seq - cursor} events behind {stream_id!r}"
                )
            if cursor < stream.next_seq:
                event = stream.event_at(cursor)
                me.cursor = cursor + 1
                if seeking:
                    if event.event != EventType.MESSAGE_START:
                        continue
                    seeking = False
                    me.taker = taker
                yield event
                continue
            if stream.closed:
                if seeking:
                    raise MessagesNotRetained(
                        f"no whole message of {stream_id!r} is retained, and its turn ended"
                    )
                return
            try:
                await stream.waiting(me, loop)
            except BaseException:
                stream.forget(me)
                raise

    async def open_stream(self, stream_id: str) -> None:
        """Create the stream if needed and mark it open for followers to wait on, and
        running: it is not dropped until :meth:`close_stream`. Raises
        :class:`~essessey.StoreFull` when ``max_streams`` streams are running."""
        now = time.monotonic()
        self._cleared_running.pop(stream_id, None)  # a new turn may start afresh
        stream = self._create_or_touch(stream_id, now)
        stream.closed = False
        stream.running = True
        stream.updated = now

    async def close_stream(self, stream_id: str) -> None:
        """No more events for now: followers end once they have everything."""
        stream = self._streams.get(stream_id)
        if stream is not None:
            stream.closed = True
            stream.running = False
            # Its appends left its place and time as they were; its age counts from now.
            stream.updated = time.monotonic()
            self._streams.move_to_end(stream_id)
            stream.wake_all()

    async def clear(self, stream_id: str) -> None:
        """Forget the stream; its ids become unknown and its followers end."""
        stream = self._streams.pop(stream_id, None)
        if stream is not None:
            self._bytes -= stream.bytes
            if stream.running:
                # Its turn's appender (the stream itself) appends through the store
                # from now on, whose rules for a cleared running stream then hold.
                stream.running = False
                cleared = self._cleared_running
                cleared[stream_id] = None
                if len(cleared) > self.max_streams:
                    cleared.popitem(last=False)
            stream.wake_all()

    async def exists(self, stream_id: str) -> bool:
        """Whether the stream is retained (not expired, not cleared)."""
        return self._get(stream_id) is not None
