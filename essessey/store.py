"""Event stores: where a stream's events wait for the clients that resume it.

An event gets its id when it enters a stream's store. Ids are ``<epoch>-<sequence>``:
the sequence counts up per stream, and the epoch changes whenever the stream is created
anew (first event, after a clear, after it expired), so an id from before a reset can
never be mistaken for a position in the new stream. Clients treat ids as opaque.

``since`` answers ``known=False`` whenever it cannot replay everything after an id
without a gap: the caller must not guess.
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
from typing import Final, Protocol, runtime_checkable

import anyio

from essessey.errors import StreamNotFound, StreamReset, SubscriberLagged, UnknownEventId
from essessey.event import Event
from essessey.protocol import EventType

__all__ = ["EventStore", "InMemoryEventStore"]

logger = logging.getLogger("essessey.store")

_new_event: Final = tuple.__new__


@runtime_checkable
class EventStore(Protocol):
    """What a :class:`~essessey.StreamHub` needs from a store of events."""

    async def append(self, stream_id: str, event: Event) -> Event:
        """Store ``event`` at the end of the stream (creating it if needed) and return it
        with its id set. Wakes the stream's followers."""
        ...

    async def since(self, stream_id: str, last_event_id: str | None) -> tuple[list[Event], bool]:
        """The events after ``last_event_id`` (all retained ones when None), and whether
        that id is known: False means no gap-free replay exists, and the list is empty."""
        ...

    def follow(
        self, stream_id: str, last_event_id: str | None = None, *, max_lag: int | None = None
    ) -> AsyncIterator[Event]:
        """Replay the events after ``last_event_id``, then yield new ones as they are
        appended, until the stream is closed and drained.

        Without a last id it starts at the oldest message still retained whole. It raises
        :class:`StreamNotFound`, :class:`UnknownEventId`, :class:`SubscriberLagged` (more
        than ``max_lag`` of the events appended since it started are waiting for it, or
        its position was evicted) or :class:`StreamReset` (cleared or dropped meanwhile).
        The backlog it replays on starting does not count towards ``max_lag``, so a
        follower that resumes by id after being ended for lag always makes progress."""
        ...

    async def open_stream(self, stream_id: str) -> None:
        """Create the stream if needed and mark it open, so subscribers can wait for its
        first event (a turn that has started but not yet emitted)."""
        ...

    async def close_stream(self, stream_id: str) -> None:
        """Say that no more events are coming for now: followers end once drained. An
        ``append`` reopens the stream."""
        ...

    async def clear(self, stream_id: str) -> None:
        """Forget the stream; ids from it become unknown."""
        ...

    async def exists(self, stream_id: str) -> bool:
        """Whether the stream is retained."""
        ...


class _Stream:
    __slots__ = ("closed", "epoch", "events", "first_seq", "next_seq", "updated", "waiters")

    def __init__(self, epoch: str, capacity: int) -> None:
        self.epoch = epoch
        self.events: deque[Event] = deque(maxlen=capacity)
        self.first_seq = 1  # the sequence of events[0]
        self.next_seq = 1
        self.closed = False
        self.updated = time.monotonic()
        # One per follower waiting for the next change: an asyncio future on asyncio
        # (the cheapest wake-up there is, and every append of a paced turn wakes its
        # followers), an anyio Event on any other backend. Each follower has its own,
        # so a follower cancelled while it waits cancels nobody else's wait.
        self.waiters: list[asyncio.Future[None] | anyio.Event] = []

    def wake(self) -> None:
        waiters = self.waiters
        if waiters:
            self.waiters = []
            for waiter in waiters:
                if isinstance(waiter, asyncio.Future):
                    if not waiter.done():
                        waiter.set_result(None)
                else:
                    waiter.set()

    async def wait(self) -> None:
        """Until the next change (an append, a close, a drop)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not asyncio (trio): anyio's portable event
            event = anyio.Event()
            self.waiters.append(event)
            try:
                await event.wait()
            finally:
                self._forget(event)
            return
        future: asyncio.Future[None] = loop.create_future()
        self.waiters.append(future)
        try:
            await future
        except BaseException:
            # Cancelled while waiting (the client left): take the future off the list,
            # or a quiet stream would collect one per departed follower.
            self._forget(future)
            raise

    def _forget(self, waiter: asyncio.Future[None] | anyio.Event) -> None:
        with contextlib.suppress(ValueError):
            self.waiters.remove(waiter)


class InMemoryEventStore:
    """An :class:`EventStore` in this process's memory, bounded three ways.

    ``max_events_per_stream`` (oldest evicted first), ``max_streams`` (the stream updated
    longest ago is dropped) and ``max_age`` seconds since a stream's last event (a finished
    stream stays resumable until then). Every bound must be positive.
    """

    def __init__(
        self,
        *,
        max_events_per_stream: int = 10_000,
        max_streams: int = 10_000,
        max_age: float = 3600.0,
    ) -> None:
        if max_events_per_stream <= 0:
            raise ValueError("max_events_per_stream must be > 0")
        if max_streams <= 0:
            raise ValueError("max_streams must be > 0")
        if max_age <= 0:
            raise ValueError("max_age must be > 0 seconds")
        self.max_events_per_stream = max_events_per_stream
        self.max_streams = max_streams
        self.max_age = max_age
        # Ordered by last update, oldest first, so expiry pops from the front.
        self._streams: OrderedDict[str, _Stream] = OrderedDict()

    def __len__(self) -> int:
        return len(self._streams)

    def _expire(self, now: float | None = None) -> None:
        streams = self._streams
        horizon = (time.monotonic() if now is None else now) - self.max_age
        while streams:
            stream_id, stream = next(iter(streams.items()))
            if stream.updated >= horizon and len(streams) <= self.max_streams:
                break
            del streams[stream_id]
            # Followers of a dropped stream must not wait forever. It is not marked
            # closed: a follower that has not seen the stream closed by its producer
            # gets StreamReset, never an end that looks like the turn's.
            stream.wake()
            logger.debug("dropped stream %s (expired or over max_streams)", stream_id)

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
            # A fresh epoch per creation: ids from an earlier life of this stream id
            # (before a clear or expiry) must not match positions in this one.
            stream = _Stream(secrets.token_hex(4), self.max_events_per_stream)
            self._streams[stream_id] = stream
        else:
            self._streams.move_to_end(stream_id)
        return stream

    def append_nowait(self, stream_id: str, event: Event) -> Event:
        """:meth:`append` without a coroutine: the in-memory store never waits."""
        now = time.monotonic()
        stream = self._create_or_touch(stream_id, now)
        seq = stream.next_seq
        stored = _new_event(Event, (event.event, event.data, f"{stream.epoch}-{seq}"))
        if len(stream.events) == self.max_events_per_stream:
            stream.first_seq += 1  # the deque drops its oldest on append
        stream.events.append(stored)
        stream.next_seq = seq + 1
        stream.closed = False
        stream.updated = now
        stream.wake()
        if len(self._streams) > self.max_streams:
            self._expire(now)
        return stored

    async def append(self, stream_id: str, event: Event) -> Event:
        """Store ``event`` and return it with its id; wakes the stream's followers."""
        return self.append_nowait(stream_id, event)

    def _start(self, stream: _Stream, last_event_id: str | None) -> int | None:
        """The sequence of the first event to replay, or None when ``last_event_id``
        cannot be resumed from without a gap."""
        if last_event_id is None:
            if stream.first_seq == 1:
                return 1
            # Part of the stream was evicted: start at a message boundary so a client
            # never renders half a message.
            for offset, event in enumerate(stream.events):
                if event.event == EventType.MESSAGE_START:
                    return stream.first_seq + offset
            return stream.next_seq
        epoch, _, seq_text = last_event_id.rpartition("-")
        # Only the exact spelling this store issues: ASCII digits (str.isdigit also
        # accepts digits int() rejects, such as "²"), no leading zero, no sign.
        if (
            epoch != stream.epoch
            or not seq_text.isascii()
            or not seq_text.isdigit()
            or len(seq_text) > 18
            or seq_text[0] == "0"
        ):
            return None
        seq = int(seq_text)
        # Known when everything after it is still here: the event itself may have been
        # evicted, its successors not.
        if stream.first_seq - 1 <= seq < stream.next_seq:
            return seq + 1
        return None

    async def since(self, stream_id: str, last_event_id: str | None) -> tuple[list[Event], bool]:
        """The events after ``last_event_id`` and whether it is known (see the protocol)."""
        stream = self._get(stream_id)
        if stream is None:
            return [], False
        if last_event_id is None:
            return list(stream.events), True  # everything retained, as documented
        start = self._start(stream, last_event_id)
        if start is None:
            return [], False
        # islice walks the deque once; indexing it is O(n) away from its ends.
        return list(islice(stream.events, start - stream.first_seq, None)), True

    async def follow(
        self, stream_id: str, last_event_id: str | None = None, *, max_lag: int | None = None
    ) -> AsyncIterator[Event]:
        """Replay, then live events, until the stream is closed and drained."""
        stream = self._get(stream_id)
        if stream is None:
            raise StreamNotFound(f"no stream {stream_id!r}")
        start = self._start(stream, last_event_id)
        if start is None:
            raise UnknownEventId(f"event id is not retained for stream {stream_id!r}")
        cursor = start  # the sequence of the next event to yield
        # Lag counts only what was appended after the follower started: the backlog it
        # replays first is not a sign of a slow reader, and counting it would end a
        # resuming follower before its first event, again at every attempt.
        live_from = stream.next_seq
        while True:
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
                event = stream.events[cursor - stream.first_seq]
                cursor += 1
                yield event
                continue
            if stream.closed:
                return
            await stream.wait()

    async def open_stream(self, stream_id: str) -> None:
        """Create the stream if needed and mark it open for followers to wait on."""
        now = time.monotonic()
        stream = self._create_or_touch(stream_id, now)
        stream.closed = False
        stream.updated = now
        if len(self._streams) > self.max_streams:
            self._expire(now)

    async def close_stream(self, stream_id: str) -> None:
        """No more events for now: followers end once they have everything."""
        stream = self._streams.get(stream_id)
        if stream is not None:
            stream.closed = True
            stream.wake()

    async def clear(self, stream_id: str) -> None:
        """Forget the stream; its ids become unknown and its followers end."""
        stream = self._streams.pop(stream_id, None)
        if stream is not None:
            stream.wake()

    async def exists(self, stream_id: str) -> bool:
        """Whether the stream is retained (not expired, not cleared)."""
        return self._get(stream_id) is not None
