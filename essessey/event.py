"""The wire model: an :class:`Event`, where events go (:class:`Sink`) and where they come
from (:data:`Source`).

An event's payload is serialised once, when it is published, and every binding carries
those bytes unchanged: SSE frames them, WebSocket splices them into a frame, NATS sends
them as the message body.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Awaitable, Iterator, Sequence
from typing import Any, Final, NamedTuple, Protocol, TypeAlias, overload, runtime_checkable

import orjson

__all__ = ["Event", "EventBatch", "Sink", "Source"]
# TextDeltaSink and BatchSink are not exported: speed capabilities that
# essessey's own sinks declare for its own Publisher, which no user implements.


class Event(NamedTuple):
    """One protocol event: its name, its JSON payload as bytes, and an optional id.

    ``id`` is assigned by an event store when the event enters a stream; a freshly
    published event has none. Immutable and without a ``__dict__``: a named tuple,
    because one is built per event and a tuple is the cheapest immutable object
    CPython can build (less than half the cost of a frozen dataclass).
    """

    event: str
    data: bytes
    id: str | None = None

    def with_id(self, event_id: str | None) -> Event:
        """Return a copy of this event carrying ``event_id``."""
        return self._replace(id=event_id)

    def json(self) -> Any:
        """Parse the payload (raises ``orjson.JSONDecodeError`` when it is not JSON)."""
        return orjson.loads(self.data)


new_event: Final = tuple.__new__
"""``new_event(Event, (name, data, id))``: an :class:`Event` built without the named
tuple's own ``__new__``, which parses its arguments; for the paths that build one per
event. Not part of the public API (not in ``__all__``)."""


class EventBatch(Sequence[Event]):
    """Several events of one name and without ids, in order: what a Publisher's batched
    methods hand to a sink's ``emit_many``.

    A sequence of :class:`Event` like any list, built on demand; a sink that frames
    events (an SSE response) may read ``name`` and ``datas`` instead and skip building
    an Event per item. A batch of text deltas of one block also says which block
    (``block_index``) and holds the ``texts`` its datas were made from, so a sink that writes
    another dialect need not decode them again.
    """

    __slots__ = ("block_index", "datas", "name", "texts")

    def __init__(
        self,
        name: str,
        datas: list[bytes],
        *,
        block_index: int | None = None,
        texts: list[str] | None = None,
    ) -> None:
        self.name = name
        self.datas = datas
        self.block_index = block_index
        self.texts = texts

    def __len__(self) -> int:
        return len(self.datas)

    @overload
    def __getitem__(self, index: int) -> Event: ...

    @overload
    def __getitem__(self, index: slice) -> list[Event]: ...

    def __getitem__(self, index: int | slice) -> Event | list[Event]:
        if isinstance(index, slice):
            return [new_event(Event, (self.name, data, None)) for data in self.datas[index]]
        return new_event(Event, (self.name, self.datas[index], None))

    def __iter__(self) -> Iterator[Event]:
        name = self.name
        for data in self.datas:
            yield new_event(Event, (name, data, None))

    def __repr__(self) -> str:
        return f"EventBatch({self.name!r}, {len(self.datas)} events)"


@runtime_checkable
class Sink(Protocol):
    """Where a Publisher writes events. Implementations must be safe to call from
    concurrent tasks and must raise when an event cannot be delivered.

    ``emit`` is the one method a sink has. (essessey's own sinks declare a few speed
    capabilities beside it, which a Publisher looks for once, on the sink's class; a sink
    of yours needs none of them.)
    """

    async def emit(self, event: Event) -> None:
        """Deliver one event, or raise."""
        ...


@runtime_checkable
class TextDeltaSink(Sink, Protocol):
    """A sink that takes a text delta as its block index, its text and its text's JSON.

    A Publisher whose sink's class has ``emit_text`` calls it, instead of ``emit``, for
    each text delta it sends one by one: a sink that writes the turn in another form (an
    SSE response in another wire dialect) then need not decode the event's JSON to find
    the text, and a sink that can deliver the delta at once does so in the call, without
    a coroutine. The class must define the method (the Publisher checks the class, once,
    not each instance).
    """

    def emit_text(self, index: int, text: str, text_json: bytes) -> Awaitable[None] | None:
        """Deliver the ``content_block_delta`` event of a text delta of ``text`` for the
        block at ``index``; ``text_json`` is ``text`` as JSON (orjson's), and the event's
        payload ``protocol.TEXT_DELTA_PAYLOAD % (index, text_json)``, made only by a sink
        that needs it (one that writes the turn in another form need not). None when it
        was delivered in the call, else an awaitable that delivers it (or raises, as
        ``emit`` would)."""
        ...


@runtime_checkable
class BatchSink(Sink, Protocol):
    """A sink that takes a sequence of events at once.

    A Publisher's batched methods (``send_content_block_deltas_text`` and the like) hand
    it one :class:`EventBatch` instead of calling ``emit`` per event, so an SSE response
    can write them in one send. The class must define the method (checked once, on the
    class, as for :class:`TextDeltaSink`).
    """

    async def emit_many(self, events: Sequence[Event]) -> None:
        """Deliver ``events`` in order, as ``emit`` would one by one, or raise."""
        ...


Source: TypeAlias = AsyncIterable[Event]
"""An async iterable of events. Iteration ends cleanly at the end of the stream; a
transport failure raises, it never looks like a clean end."""
