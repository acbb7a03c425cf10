"""In-process sinks and sources: collect events, replay a list, fan out to several sinks."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence

from essessey.event import Event, Sink

__all__ = ["InMemorySink", "MultiSink", "SliceSource"]


class InMemorySink:
    """A sink that keeps every event it is given, in order. Useful in tests and for
    recording a turn to replay or check later."""

    __slots__ = ("_events",)

    def __init__(self) -> None:
        self._events: list[Event] = []

    async def emit(self, event: Event) -> None:
        """Record ``event``."""
        self._events.append(event)

    async def emit_many(self, events: Sequence[Event]) -> None:
        """Record ``events``, in order."""
        self._events.extend(events)

    @property
    def events(self) -> list[Event]:
        """A copy of the events recorded so far."""
        return list(self._events)

    def clear(self) -> None:
        """Forget every recorded event."""
        self._events.clear()

    def __len__(self) -> int:
        return len(self._events)


class SliceSource:
    """A source that yields a fixed sequence of events, then ends. Each iteration starts
    from the beginning, so one instance can be read several times."""

    __slots__ = ("_events",)

    def __init__(self, events: Iterable[Event]) -> None:
        self._events = tuple(events)

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Event]:
        for event in self._events:
            yield event


class MultiSink:
    """A sink that forwards every event to several sinks, in the order given.

    Every sink is called even when an earlier one fails, so one broken client cannot
    starve the others. When exactly one sink fails its exception is re-raised as it is;
    when several fail they are raised together in an ``ExceptionGroup``.
    """

    __slots__ = ("_sinks",)

    def __init__(self, *sinks: Sink) -> None:
        self._sinks = sinks

    @property
    def sinks(self) -> tuple[Sink, ...]:
        """The sinks this one forwards to."""
        return self._sinks

    async def emit(self, event: Event) -> None:
        """Forward ``event`` to every sink; raise what failed once all were tried."""
        errors: list[Exception] = []
        for sink in self._sinks:
            try:
                await sink.emit(event)
            except Exception as exc:
                errors.append(exc)
        if len(errors) == 1:
            raise errors[0]
        if errors:
            raise ExceptionGroup(f"{len(errors)} of {len(self._sinks)} sinks failed", errors)
