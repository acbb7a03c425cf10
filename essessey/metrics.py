"""The numbers an operator of a streaming service watches, through OpenTelemetry's metrics
API (the ``metrics`` extra).

The library counts in plain integers as it goes (an addition per event, nothing more), and
reports them through observable instruments that OpenTelemetry reads when it collects: so
a process without OpenTelemetry, or with its API but no SDK configured, pays nothing but
the additions, and one with an SDK pays per collection, not per event. Only the time to
first event is recorded as it happens (once per connection).

Instruments (meter ``essessey``):

- ``essessey.turns.running`` (gauge) and ``essessey.turns.finished`` (counter, by
  ``outcome``: the stop reason, ``error``, or ``cancelled``),
- ``essessey.subscribers`` (gauge, by ``transport``: ``sse``, ``websocket``),
- ``essessey.events.sent`` and ``essessey.bytes.sent`` (counters, by ``transport``),
- ``essessey.resumes`` (counter, by ``outcome``: ``replayed``, ``unknown_id``,
  ``nothing_to_resume``),
- ``essessey.subscribers.lagged``, ``essessey.subscribers.snapshots`` (subscribers that
  started with a snapshot, see :mod:`essessey.snapshot`) and ``essessey.sends.stalled``
  (counters),
- ``essessey.first_event.duration`` (histogram, seconds, by ``transport``),
- ``essessey.store.events`` and ``essessey.store.bytes`` (gauges: what the in-memory
  stores hold).
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, Final, Protocol

__all__ = ["totals"]


class _Totals:
    """What the library has counted so far in this process."""

    __slots__ = (
        "lagged",
        "resumes",
        "snapshots",
        "sse_bytes",
        "sse_events",
        "stalled",
        "subscribers",
        "turns_finished",
        "turns_running",
        "websocket_bytes",
        "websocket_events",
    )

    def __init__(self) -> None:
        self.turns_running = 0
        self.turns_finished: Counter[str] = Counter()
        self.subscribers: Counter[str] = Counter()
        # Plain attributes, not a Counter by transport: added to once per event.
        self.sse_events = self.sse_bytes = 0
        self.websocket_events = self.websocket_bytes = 0
        self.resumes: Counter[str] = Counter()
        self.lagged = 0
        self.snapshots = 0
        self.stalled = 0


totals = _Totals()
"""The process's counts (read them in tests; OpenTelemetry reads them when it collects)."""


class HeldCounts(Protocol):
    """What a store reports to ``essessey.store.*``: what it holds right now."""

    @property
    def held_events(self) -> int:
        """How many events the store holds."""
        ...

    @property
    def held_bytes(self) -> int:
        """What its events hold, as its byte budgets count them."""
        ...


_stores: weakref.WeakSet[HeldCounts] = weakref.WeakSet()
_first_event: Any = None  # the histogram, once OpenTelemetry is there


def watch_store(store: HeldCounts) -> None:
    """Count what ``store`` holds in ``essessey.store.*``."""
    _stores.add(store)


def first_event(transport: str, seconds: float) -> None:
    """A connection's first event went out ``seconds`` after it was opened."""
    if _first_event is not None:
        _first_event.record(seconds, {"transport": transport})


_FIRST_EVENT_BUCKETS: Final = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
"""Seconds: the bounds of the first-event histogram's buckets."""


def _install() -> None:
    global _first_event
    try:
        from opentelemetry import metrics
    except ImportError:  # the metrics extra is not installed: plain counts only
        return
    meter = metrics.get_meter("essessey")
    _observe_turns(meter)
    _observe_delivery(meter)
    _observe_stores(meter)
    _first_event = meter.create_histogram(
        "essessey.first_event.duration",
        unit="s",
        description="time from a connection's opening to its first event",
        explicit_bucket_boundaries_advisory=list(_FIRST_EVENT_BUCKETS),
    )


def _by(counts: Counter[str], key: str) -> Any:
    """A callback observing each count of ``counts``, labelled ``key``."""
    from opentelemetry.metrics import CallbackOptions, Observation

    def observe(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(value, {key: name}) for name, value in counts.items()]

    return observe


def _one(read: Callable[[], int]) -> Any:
    """A callback observing the one value ``read`` gives."""
    from opentelemetry.metrics import CallbackOptions, Observation

    def observe(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(read())]

    return observe


def _sent(kind: str) -> Any:
    """A callback observing what each transport sent (``events`` or ``bytes``)."""
    from opentelemetry.metrics import CallbackOptions, Observation

    def observe(options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(getattr(totals, f"{transport}_{kind}"), {"transport": transport})
            for transport in ("sse", "websocket")
        ]

    return observe


def _observe_turns(meter: Any) -> None:
    """Turns running and finished."""
    meter.create_observable_gauge(
        "essessey.turns.running", [_one(lambda: totals.turns_running)], description="turns running"
    )
    meter.create_observable_counter(
        "essessey.turns.finished",
        [_by(totals.turns_finished, "outcome")],
        description="turns finished, by outcome",
    )


def _observe_delivery(meter: Any) -> None:
    """Subscribers, what was sent to them, resumes, lag, snapshots and stalls."""
    meter.create_observable_gauge(
        "essessey.subscribers",
        [_by(totals.subscribers, "transport")],
        description="subscribers connected",
    )
    meter.create_observable_counter(
        "essessey.events.sent", [_sent("events")], description="events sent"
    )
    meter.create_observable_counter(
        "essessey.bytes.sent", [_sent("bytes")], unit="By", description="bytes of events sent"
    )
    meter.create_observable_counter(
        "essessey.resumes", [_by(totals.resumes, "outcome")], description="resumes, by outcome"
    )
    meter.create_observable_counter(
        "essessey.subscribers.lagged",
        [_one(lambda: totals.lagged)],
        description="subscribers ended for lag",
    )
    meter.create_observable_counter(
        "essessey.subscribers.snapshots",
        [_one(lambda: totals.snapshots)],
        description="subscribers that started with a snapshot",
    )
    meter.create_observable_counter(
        "essessey.sends.stalled", [_one(lambda: totals.stalled)], description="stalled sends reset"
    )


def _observe_stores(meter: Any) -> None:
    """What the in-memory stores hold."""
    meter.create_observable_gauge(
        "essessey.store.events",
        [_one(lambda: sum(store.held_events for store in list(_stores)))],
        description="events held by the in-memory stores",
    )
    meter.create_observable_gauge(
        "essessey.store.bytes",
        [_one(lambda: sum(store.held_bytes for store in list(_stores)))],
        unit="By",
        description="bytes held by the in-memory stores, as their budgets count them",
    )


_install()
