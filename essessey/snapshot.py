"""A turn so far as a snapshot: the same events, with each run of a block's deltas merged.

A reader that joins a long turn late (a reload, a second tab, a dashboard) needs the state
of the turn, not every token of its history: :func:`compact` gives the events with each run
of consecutive deltas of one block (its text, thinking, tool arguments or tool result so
far) merged into one delta, or a few when that would be larger than ``max_delta_chars``.
Every other event passes through unchanged, in order.

Each merged delta carries the id of the last event it holds, so a client that resumes by
the last id it received continues exactly where it left off: the events after that id are
the ones it has not seen, whether it read the snapshot to its end or dropped half-way.
:func:`~essessey.reassemble_events` of a snapshot gives the same turn as of the events it
was made from, and :func:`~essessey.check` finds nothing wrong in it.

A :class:`Compactor` does the same a few events at a time, for a snapshot kept up to date
as the turn grows; a :class:`SnapshotCache` keeps one per stream, brought up to date from
the store when a reader asks (the hub's, see docs/resume.md "Snapshots for late readers").
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable
from typing import Final

import anyio
import anyio.lowlevel
import orjson

from essessey.event import Event
from essessey.protocol import Delta, DeltaType, EventType, read
from essessey.stores import EventStore

__all__ = [
    "DEFAULT_MAX_DELTA_CHARS",
    "Compactor",
    "SnapshotCache",
    "compact",
    "compact_yielding",
]

logger = logging.getLogger("essessey.snapshot")

DEFAULT_MAX_DELTA_CHARS: Final = 64 * 1024
"""Characters of text one merged delta holds at most: a run longer than that is cut into
several (between two of its deltas, so each keeps an id of its own), so that no single
event grows past what a reader's line limits take."""

# The delta types whose pieces make one string when joined, and the field that holds it.
_MERGEABLE: Final[dict[str, str]] = {
    DeltaType.TEXT: "text",
    DeltaType.THINKING: "thinking",
    DeltaType.INPUT_JSON: "partial_json",
    DeltaType.TOOL_RESULT: "text",
}
_DELTA_PREFIX: Final = b'{"type":"content_block_delta"'
_EVENTS_PER_STEP: Final = 500
"""Events folded between two checkpoints: about a millisecond's work."""


class _Run:
    """Consecutive deltas of one block and one type, waiting to be written as one."""

    __slots__ = ("delta_type", "field", "index", "last_id", "parts", "size")

    def __init__(self, index: int, delta_type: str, field: str) -> None:
        self.index = index
        self.delta_type = delta_type
        self.field = field
        self.parts: list[str] = []
        self.size = 0
        self.last_id: str | None = None

    def event(self) -> Event:
        payload = {
            "type": EventType.CONTENT_BLOCK_DELTA,
            "index": self.index,
            "delta": {"type": self.delta_type, self.field: "".join(self.parts)},
        }
        return Event(EventType.CONTENT_BLOCK_DELTA, orjson.dumps(payload), self.last_id)


class Compactor:
    """Folds events, in order, into their snapshot (see the module docstring).

    :meth:`add` takes the next event; :meth:`events` is the snapshot of everything added
    so far; :attr:`last_id` the id of the last event added, where a reader of the
    snapshot follows on from. ``events_added`` counts what it was made from."""

    __slots__ = ("_done", "_max", "_run", "events_added", "last_id")

    def __init__(self, *, max_delta_chars: int = DEFAULT_MAX_DELTA_CHARS) -> None:
        if max_delta_chars <= 0:
            raise ValueError("max_delta_chars must be > 0")
        self._max = max_delta_chars
        self._done: list[Event] = []  # written: they change no more
        self._run: _Run | None = None  # the run the next delta may join
        self.events_added = 0
        self.last_id: str | None = None

    def add(self, event: Event) -> None:
        """Fold in the next event of the stream."""
        self.events_added += 1
        self.last_id = event.id
        merge = self._mergeable(event)
        run = self._run
        if merge is None:
            if run is not None:
                self._done.append(run.event())
                self._run = None
            self._done.append(event)
            return
        index, delta_type, field, text = merge
        if run is not None and (
            run.index != index
            or run.delta_type != delta_type
            or (run.size + len(text) > self._max and run.parts)
        ):
            self._done.append(run.event())
            run = None
        if run is None:
            run = self._run = _Run(index, delta_type, field)
        run.parts.append(text)
        run.size += len(text)
        run.last_id = event.id

    async def add_all(self, events: Iterable[Event]) -> None:
        """:meth:`add` each of ``events``, letting the event loop run other tasks every
        few hundred: the first snapshot of a long turn takes a while to fold."""
        for n, event in enumerate(events, 1):
            self.add(event)
            if n % _EVENTS_PER_STEP == 0:
                await anyio.lowlevel.checkpoint()

    def events(self) -> list[Event]:
        """The snapshot so far: the events added, each run of deltas merged."""
        if self._run is None:
            return list(self._done)
        return [*self._done, self._run.event()]

    @staticmethod
    def _mergeable(event: Event) -> tuple[int, str, str, str] | None:
        """(index, delta type, field, text) of a delta that can join a run; None for
        anything else (which passes through as it is)."""
        if event.event != EventType.CONTENT_BLOCK_DELTA or not event.data.startswith(_DELTA_PREFIX):
            return None
        record = read(event)
        if not isinstance(record, Delta):
            logger.warning("a delta that is not laid out as expected passes through whole")
            return None
        delta = record.delta
        field = _MERGEABLE.get(record.delta_type)
        if field == "thinking" and "thinking" not in delta:
            field = "text"  # the essessey dialect's thinking_delta (thinking_delta_field)
        if field is None or set(delta) != {"type", field}:
            return None  # another type, or one with more in it than its text
        text = delta[field]
        if not isinstance(text, str):
            return None
        return record.index, record.delta_type, field, text


def compact(
    events: Iterable[Event], *, max_delta_chars: int = DEFAULT_MAX_DELTA_CHARS
) -> list[Event]:
    """``events`` as their snapshot: each run of one block's consecutive deltas merged
    into one (or a few, past ``max_delta_chars`` characters), carrying the id of its last
    delta; every other event as it is."""
    compactor = Compactor(max_delta_chars=max_delta_chars)
    for event in events:
        compactor.add(event)
    return compactor.events()


async def compact_yielding(
    events: Iterable[Event], *, max_delta_chars: int = DEFAULT_MAX_DELTA_CHARS
) -> list[Event]:
    """:func:`compact`, letting the event loop run other tasks every so many events: a
    long turn's first snapshot takes a while to fold, and the live turns of the process
    must not wait for it."""
    compactor = Compactor(max_delta_chars=max_delta_chars)
    await compactor.add_all(events)
    return compactor.events()


class _Entry:
    __slots__ = ("compactor", "lock")

    def __init__(self, compactor: Compactor) -> None:
        self.compactor = compactor
        self.lock = anyio.Lock()


class SnapshotCache:
    """The snapshot of each stream a reader joined without an id, read from ``store``
    and kept for the next reader, who pays only for what was appended since.

    A snapshot starts at the oldest ``message_start`` the store retains (where a
    follower without an id starts). At most ``max_streams`` are kept, the least recently
    read dropped first; a stream that was cleared or trimmed past the snapshot's last
    event is read again from its start."""

    def __init__(
        self,
        store: EventStore,
        *,
        max_streams: int = 128,
        max_delta_chars: int = DEFAULT_MAX_DELTA_CHARS,
    ) -> None:
        if max_streams <= 0:
            raise ValueError("max_streams must be > 0")
        self._store = store
        self._max_streams = max_streams
        self._max_delta_chars = max_delta_chars
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    async def snapshot(self, stream_id: str) -> tuple[list[Event], int]:
        """The stream so far as its snapshot, and how many of its events it holds (0,
        with no events, when the store has no whole message of it to start from)."""
        entry = self._entries.get(stream_id)
        if entry is None:
            entry = self._entries[stream_id] = _Entry(self._new())
            while len(self._entries) > self._max_streams:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(stream_id)
        async with entry.lock:
            compactor = entry.compactor
            events, known = await self._store.since(stream_id, compactor.last_id)
            if compactor.last_id is not None and not known:
                # Cleared, or trimmed past the snapshot's end: start again.
                compactor = entry.compactor = self._new()
                events, _known = await self._store.since(stream_id, None)
            if compactor.events_added == 0:
                events = _from_first_message(events)
            await compactor.add_all(events)
            return compactor.events(), compactor.events_added

    def _new(self) -> Compactor:
        return Compactor(max_delta_chars=self._max_delta_chars)


def _from_first_message(events: list[Event]) -> list[Event]:
    """``events`` from the first ``message_start`` on: before it, the rest of a message
    whose start the store no longer holds."""
    for at, event in enumerate(events):
        if event.event == EventType.MESSAGE_START:
            return events[at:]
    return []
