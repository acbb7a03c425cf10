"""The wire model: an :class:`Event`, where events go (:class:`Sink`) and where they come
from (:data:`Source`).

An event's payload is serialised once, when it is published, and every binding carries
those bytes unchanged: SSE frames them, WebSocket splices them into a frame, NATS sends
them as the message body.
"""

from __future__ import annotations

from collections.abc import AsyncIterable
from typing import Any, NamedTuple, Protocol, TypeAlias, runtime_checkable

import orjson

__all__ = ["Event", "Sink", "Source"]


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


@runtime_checkable
class Sink(Protocol):
    """Where a Publisher writes events. Implementations must be safe to call from
    concurrent tasks and must raise when an event cannot be delivered.

    A sink may also offer ``emit_nowait(event) -> bool``: deliver the event at once and
    return True, or return False (having done nothing) when it would have to wait. A
    Publisher uses it when present, because most events of a turn then skip a
    coroutine; ``emit`` stays the method every sink must have.
    """

    async def emit(self, event: Event) -> None:
        """Deliver one event, or raise."""
        ...


Source: TypeAlias = AsyncIterable[Event]
"""An async iterable of events. Iteration ends cleanly at the end of the stream; a
transport failure raises, it never looks like a clean end."""
