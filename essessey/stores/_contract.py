"""The store contract: what a :class:`~essessey.StreamHub` asks of a store of events.

Every store implements :class:`EventStore`. A store may also declare one of the optional
capabilities below, each a :class:`typing.Protocol`; the hub looks for them once, when it
is made, and uses what it finds (docs/resume.md has the table a store author works from,
and :mod:`essessey.testing` the conformance suite a store runs to prove it):

- :class:`SharedEventStore`: a store that replicas share (Redis, JetStream). It has
  leases, so a turn runs on one replica only and a cancel reaches it from any other.
- :class:`AppendsWithoutWaiting`: a store that can append in a plain call (the in-memory
  store), so a turn's events reach the store without a coroutine per event.
- :class:`DeliversInAppend`: a store that can hand a caught-up reader (its
  :class:`Taker`) each new event in the writer's own append, so a live event reaches a
  connection without a task switch.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Protocol, runtime_checkable

from essessey.event import Event

__all__ = [
    "AppendsWithoutWaiting",
    "DeliversInAppend",
    "EventStore",
    "SharedEventStore",
    "StreamAppender",
    "Taker",
]


@runtime_checkable
class EventStore(Protocol):
    """What every store does: keep each stream's events in order, give each an id, replay
    after an id, and wake its followers."""

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
        :class:`~essessey.StreamNotFound`, :class:`~essessey.UnknownEventId`,
        :class:`~essessey.SubscriberLagged` (more than ``max_lag`` of the events appended
        since it started are waiting for it, or its position was evicted) or
        :class:`~essessey.StreamReset` (cleared or dropped meanwhile). The backlog it
        replays on starting does not count towards ``max_lag``, so a follower that
        resumes by id after being ended for lag always makes progress."""
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


@runtime_checkable
class SharedEventStore(EventStore, Protocol):
    """A store that replicas share: a turn holds a lease on its stream while it runs.

    The hub claims the stream before a turn starts (another replica's claim makes it
    :class:`~essessey.StreamBusy`), writes every event as the lease's holder (a holder
    whose lease was taken over writes nothing: :class:`~essessey.LeaseLost`), renews the
    lease a few times per ``running_ttl``, and releases it when the turn ends. A cancel
    asked on any replica reaches the replica that runs the turn.
    """

    running_ttl: float
    """Seconds a lease lasts unless renewed; a replica that stops renewing (it died)
    loses the stream after this long, and another may run it."""

    async def claim_turn(self, stream_id: str, holder: str) -> None:
        """Open the stream as ``holder``'s running turn; raise
        :class:`~essessey.StreamBusy` when another holder's lease is alive."""
        ...

    async def append_as(self, stream_id: str, event: Event, holder: str) -> Event:
        """:meth:`EventStore.append`, only while ``holder`` holds the lease; raise
        :class:`~essessey.LeaseLost` otherwise, having stored nothing."""
        ...

    async def keep_running(self, stream_id: str, holder: str) -> bool:
        """Renew ``holder``'s lease for another ``running_ttl``; False when it is no
        longer held (it expired, or another holder took the stream)."""
        ...

    async def release_turn(self, stream_id: str, holder: str) -> bool:
        """Close the stream and drop ``holder``'s lease; False when ``holder`` no longer
        held it (the stream is then left to whoever does)."""
        ...

    async def turn_running(self, stream_id: str) -> bool:
        """Whether a turn holds a live lease on ``stream_id``, on any replica. Only
        reads: a lease whose replica died stops counting once it lapses."""
        ...

    async def request_cancel(self, stream_id: str, wait: float = 15.0) -> bool:
        """Ask whichever replica runs the turn on ``stream_id`` to cancel it, and wait up
        to ``wait`` seconds for the turn to end; False when no turn was running there."""
        ...

    async def watch_cancel(
        self, stream_id: str, on_cancel: Callable[[], None]
    ) -> Callable[[], None]:
        """Call ``on_cancel()`` whenever a replica asks to cancel the turn on
        ``stream_id``, from when this returns; call what it returns to stop watching."""
        ...


@runtime_checkable
class AppendsWithoutWaiting(Protocol):
    """A store whose append never waits: a running turn's stream appended to in a plain
    call."""

    def appender(self, stream_id: str) -> StreamAppender | None:
        """The open stream ``stream_id`` (opened by ``open_stream``) as a
        :class:`StreamAppender`, or None when it is not open (then append as usual)."""
        ...


class StreamAppender(Protocol):
    """One open stream's append, as plain calls (see :class:`AppendsWithoutWaiting`).

    Each is :meth:`EventStore.append` without a coroutine and without an
    :class:`~essessey.Event` made for it, returning nothing (a writer that appends this
    way has no use for the stored event's id), and raising as ``append`` would."""

    def append(self, name: str, data: bytes) -> None:
        """Append the event ``name`` with ``data``."""
        ...

    def emit_text(self, index: int, text: str, text_json: bytes) -> None:
        """Append a text delta a :class:`~essessey.Publisher` made, as a
        :class:`~essessey.event.TextDeltaSink` takes it: ``content_block_delta`` with the
        ``TEXT_DELTA_PAYLOAD`` filled (one line of JSON), offered to each :class:`Taker`
        as such (:meth:`Taker.take_text`)."""
        ...


@runtime_checkable
class KnowsEventIds(Protocol):
    """A store that can say whether a resume point is retained without reading the
    events after it: a resume then replays through :meth:`EventStore.follow` as it goes,
    instead of reading the whole rest of the stream before its first event."""

    async def knows(self, stream_id: str, last_event_id: str) -> bool:
        """Whether :meth:`EventStore.since` would call ``last_event_id`` known now."""
        ...


class Taker(Protocol):
    """A reader that takes events in the writer's own append (a binding's connection).

    Each method is given the event's fields (no :class:`~essessey.Event` is made for an
    event a reader takes) and the id the store gave it, and returns True when it took
    the event (written to its connection, or held for its next write), False when it
    cannot now (then its follower wakes and reads the event as usual). Neither may raise
    or wait."""

    def take(self, name: str, data: bytes, event_id: str) -> bool:
        """Take the event ``name`` with ``data``."""
        ...

    def take_text(
        self, data: bytes, id_head: bytes, seq: int, index: int, text: str, text_json: bytes
    ) -> bool:
        """:meth:`take` of a text delta a Publisher made (see
        :meth:`StreamAppender.emit_text`): its name is ``content_block_delta``, ``data``
        one line of JSON (so it is framed without a look for line breaks); ``index``,
        ``text`` and ``text_json`` its block's index, its text and its text's JSON (so a
        reader has its record without a parse). Its id is ``id_head`` (ASCII, the same for
        every event of the stream) followed by ``seq`` in decimal: given in parts, so that
        a reader that writes the id as bytes makes no string for it."""
        ...


@runtime_checkable
class DeliversInAppend(Protocol):
    """A store that can hand a caught-up follower each new event inside the append."""

    def follow_delivering(
        self,
        stream_id: str,
        last_event_id: str | None = None,
        *,
        max_lag: int | None = None,
        taker: Taker | None = None,
    ) -> AsyncIterator[Event]:
        """:meth:`EventStore.follow`; and while the follower waits caught up, each new
        event is offered to ``taker`` in the append itself, and what it takes is not
        yielded. The events reach the reader in the same order, none twice and none
        skipped, whichever way each one goes."""
        ...
