"""What the ASGI bindings share: the SSE response and routes, and the WebSocket endpoint.

One definition each of what both need: the ``authorize`` check (:func:`check_access`),
the resume point a client asks for (:func:`resume_point`), what a subscription's end
means to a client (:func:`subscription_end`: an HTTP status for SSE, a close code for
WebSocket), a connection's helper tasks whose failure reaches the caller as the exception
itself (:func:`connection_tasks`, whose body may run in a task of its own as though it
ran in the request's), and one timer task per event loop for every
connection's keep-alive and stalled-send deadlines (:func:`watch_line`). All of it runs
on asyncio (or uvloop), as essessey does. What reaches into the server itself (an
abort, a write straight to the transport) is in ``essessey.bindings._uvicorn``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeVar

import anyio

from essessey._ids import is_event_id
from essessey._logsafe import log_failure, raised_at
from essessey.errors import (
    MessagesNotRetained,
    StoreUnavailable,
    StreamNotFound,
    StreamReset,
    SubscriberLagged,
    TooManySubscribers,
    UnknownEventId,
)
from essessey.hub import Access, StreamHub
from essessey.metrics import totals

__all__ = [
    "CHECK_FAILED",
    "EVENTS_PER_TURN",
    "ConnectionTasks",
    "SubscriptionEnd",
    "WatchedLine",
    "backlog_turn",
    "check_access",
    "connection_tasks",
    "resume_point",
    "subscription_end",
    "watch_line",
]

logger = logging.getLogger("essessey.bindings")

_T = TypeVar("_T")

CHECK_FAILED: Final = "could not check access to this stream; try again later"
"""What a client is told when the ``authorize`` hook raised."""

EVENTS_PER_TURN: Final = 64
"""Events one connection handles without waiting before it waits for its turn
(:func:`backlog_turn`): a replay (a store's backlog read and written without waiting)
would otherwise hold the event loop for its whole length."""


async def check_access(
    hub: StreamHub, request: Any, stream_id: str, access: Access, log: logging.Logger
) -> bool | None:
    """The ``authorize`` hook's answer, or None when it raised.

    A hook that raises is the app's failure, not the client's: the caller answers "try
    again later" (503, close 1013), never a 500 and never a refusal that would read as
    "your credentials are wrong". The log line names the exception's class and where it
    was raised, but not its text, which may hold the very token being checked.
    """
    try:
        return await hub.authorized(request, stream_id, access)
    except Exception as exc:
        log.error(
            "the authorize hook raised %s%s (%s access to stream %s); answered try again later",
            type(exc).__name__,
            raised_at(exc),
            access,
            stream_id,
        )
        return None


def resume_point(last_event_id: str | None) -> str | None:
    """The last event id a client gave, as the hub takes it: None for none or ``""``
    ("from the start", as for EventSource). ValueError for one no store could have
    issued (see ``essessey._ids``)."""
    if not last_event_id:
        return None
    if not is_event_id(last_event_id):
        raise ValueError("invalid last event id")
    return last_event_id


@dataclass(frozen=True, slots=True)
class SubscriptionEnd:
    """What a subscription that ended with an exception tells its client.

    Over HTTP, before the first event: ``status``, ``error_type`` and ``message`` (a
    None status: the response just ends, and the client reconnects with its last id).
    Over a WebSocket: ``close_code`` and ``reason`` (short: a close reason has at most
    123 bytes).
    """

    status: int | None
    error_type: str
    message: str
    close_code: int
    reason: str


_RECONNECT: Final = SubscriptionEnd(None, "", "", 1013, "reconnect with the last event id")
# The close codes are those of essessey.bindings.ws (CloseCode); written out here so the
# SSE binding need not import the WebSocket one.
_ENDS: Final[dict[type[Exception], SubscriptionEnd]] = {
    StreamNotFound: SubscriptionEnd(404, "not_found_error", "", 4404, "no such stream"),
    UnknownEventId: SubscriptionEnd(
        410,
        "resume_unavailable",
        "the last event id is not retained; start over without it",
        4410,
        "last event id not retained; start over",
    ),
    StreamReset: SubscriptionEnd(
        410,
        "resume_unavailable",
        "the stream was reset",
        4410,
        "the stream was reset; start over",
    ),
    # Nothing whole to show and nothing more to come: as final as a stream that is gone
    # (a 410 would tell the client to come again without an id, which would loop).
    MessagesNotRetained: SubscriptionEnd(
        404,
        "not_found_error",
        "no whole message of this stream is retained, and its turn has ended",
        4404,
        "no whole message retained; the turn ended",
    ),
    TooManySubscribers: SubscriptionEnd(
        503, "overloaded_error", "too many subscribers", 1013, "too many subscribers"
    ),
    # The store still holds the client's last id: ending the stream (not an error
    # event, which would read as the end of the turn) makes the client reconnect.
    SubscriberLagged: _RECONNECT,
    StoreUnavailable: _RECONNECT,
}


def _first_of(table: dict[type[Exception], _T], exc: Exception) -> _T | None:
    """The value of the first exception class in ``table`` that ``exc`` is one of."""
    for kind, value in table.items():
        if isinstance(exc, kind):
            return value
    return None


def subscription_end(exc: Exception) -> SubscriptionEnd | None:
    """What ``exc`` ending a hub subscription means to its client; None when it is not
    one of the hub's documented ends (a failure of the server)."""
    return _first_of(_ENDS, exc)


_RESUME_OUTCOMES: Final[dict[type[Exception], str]] = {
    UnknownEventId: "unknown_id",
    StreamReset: "unknown_id",
    MessagesNotRetained: "nothing_to_resume",
    StreamNotFound: "nothing_to_resume",
}


class SubscriptionCount:
    """One subscription in ``essessey.metrics``: a subscriber of its transport while it
    runs, and for a resume (a last event id given), its outcome, counted once."""

    __slots__ = ("_resuming", "_transport")

    def __init__(self, transport: str, resuming: bool) -> None:
        self._transport = transport
        self._resuming = resuming
        totals.subscribers[transport] += 1

    def started(self) -> None:
        """The subscription delivers: a resume replayed (possibly nothing, when the id
        was the last event)."""
        if self._resuming:
            self._resuming = False
            totals.resumes["replayed"] += 1

    def ended(self, error: Exception | None) -> None:
        """The subscription ended, by ``error`` or not."""
        if self._resuming:
            self._resuming = False
            outcome = "replayed" if error is None else _first_of(_RESUME_OUTCOMES, error)
            if outcome is not None:
                totals.resumes[outcome] += 1
        totals.subscribers[self._transport] -= 1


class ConnectionTasks(Protocol):
    """The helper tasks of one connection (its flusher, its watch for the client
    leaving, a ping) beside its body, which runs in the request's own task or, through
    :meth:`run_apart`, in one of its own."""

    def cancel(self) -> None:
        """End the body (wherever it runs, see :meth:`run_apart`) and its helpers."""
        ...

    def start_soon(self, func: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        """Start a helper task."""
        ...

    async def run_apart(self, body: Awaitable[None]) -> None:
        """Await ``body`` run in a task of its own, as though it ran in this one: what it
        raises is raised here, and :meth:`cancel` (or a cancellation of this task)
        cancels it through a scope of its own, so its shielded parts still finish, and
        waits for it.

        A producer at a model's pace is resumed at every await (each delta's timer), and
        a task's resume passes through every coroutine of its chain: in the request's
        task that is the server's, the app's and the response's frames above the
        producer, each one more object to touch per event, which hundreds of connections
        do not keep in the CPU's caches. In a task of its own the chain is the producer."""
        ...


class _LoopTasks:
    """Helpers as plain tasks of the asyncio loop, not an anyio task group: a task group,
    its tasks and its cancellation cost several times as much per connection, which every
    stream pays at its start and end. A helper that fails cancels the body, and
    :func:`connection_tasks` raises its exception as itself (a task group would wrap it
    in an ExceptionGroup)."""

    __slots__ = ("_apart", "_loop", "_scope", "_tasks", "closed", "failure")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._tasks: set[asyncio.Task[Any]] = set()
        self._scope = anyio.CancelScope()  # the body's, in the request's task
        self.failure: BaseException | None = None
        self.closed = False  # the body has ended: a failure now has nobody to reach
        self._apart: anyio.CancelScope | None = None  # the scope of a body run apart

    def cancel(self) -> None:
        # Both at once: a body run apart sees the cancellation at the very await it
        # would have seen it at in the request's task.
        self._scope.cancel()
        apart = self._apart
        if apart is not None:
            apart.cancel()

    async def run_apart(self, body: Awaitable[None]) -> None:
        scope = self._apart = anyio.CancelScope()
        if self._scope.cancel_called:
            scope.cancel()
        task = self._loop.create_task(_within(scope, body))
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                raise  # the body has ended already: only the cancellation goes on
            scope.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.wait((task,))
            error = None if task.cancelled() else task.exception()
            if error is not None:
                raise error from None  # what the body raised on its way out, as inline
            raise
        finally:
            self._apart = None

    def start_soon(self, func: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        task = self._loop.create_task(_run(func, args))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()  # retrieved, so asyncio never logs it as lost
        if error is None:
            return
        if self.closed:
            log_failure(logger, error, "a connection's helper task failed after it ended")
        elif self.failure is None:
            self.failure = error
            self.cancel()

    def stop(self) -> None:
        self.closed = True
        for task in list(self._tasks):
            task.cancel()


async def _run(func: Callable[..., Coroutine[Any, Any, Any]], args: tuple[Any, ...]) -> None:
    await func(*args)


@asynccontextmanager
async def connection_tasks() -> AsyncIterator[ConnectionTasks]:
    """A connection's helper tasks, the body's cancel scope entered around the block: on
    leaving, the helpers still running are cancelled (the body's own end is not waited on by them);
    a helper's failure cancels the body and is raised here as the exception itself."""
    tasks = _LoopTasks(asyncio.get_running_loop())
    try:
        with tasks._scope:
            yield tasks
    finally:
        tasks.stop()
    if tasks.failure is not None:
        raise tasks.failure


async def _within(scope: anyio.CancelScope, body: Awaitable[None]) -> None:
    with scope:
        await body


class _BacklogGate:
    """One per event loop: of the connections working through a backlog, one goes on per
    turn of the loop. Live events (a producer's timer, a socket that became readable)
    are handled every turn, so beside any number of replaying clients a live event waits
    for one backlog slice at most, not for one slice of every replaying client."""

    __slots__ = ("_loop", "_scheduled", "_waiting")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._scheduled = False

    async def wait(self) -> None:
        future: asyncio.Future[None] = self._loop.create_future()
        self._waiting.append(future)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._release)
        await future  # cancelled: _release skips it

    def _release(self) -> None:
        waiting = self._waiting
        while waiting:
            future = waiting.popleft()
            if not future.done():
                future.set_result(None)
                break
        if waiting:
            self._loop.call_soon(self._release)  # the next one, on the loop's next turn
        else:
            self._scheduled = False


_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _BacklogGate] = (
    weakref.WeakKeyDictionary()
)


async def backlog_turn() -> None:
    """Wait for this connection's next turn at backlog work (see :data:`EVENTS_PER_TURN`):
    one backlogged connection goes on per turn of the loop."""
    loop = asyncio.get_running_loop()
    gate = _gates.get(loop)
    if gate is None:
        gate = _gates[loop] = _BacklogGate(loop)
    await gate.wait()


class WatchedLine(Protocol):
    """A connection the line watch looks after: :meth:`check` is called now and then and
    says when it wants to be called next (a loop time, or None for "no need")."""

    def check(self, now: float) -> float | None:
        """Do what is due at ``now`` (a keep-alive to send, a stalled send to end) and
        return the time of the next thing that will be due."""
        ...


_MAX_TICK: Final = 1.0
"""The longest the line watch sleeps: a line's deadlines move with every send, and it
looks again at least this often."""


class _LineWatch:
    """One task per event loop that keeps every open connection's timers.

    A connection needs a timer for two rare things: a keep-alive after ``ping_interval``
    of quiet, and noticing a send stalled past ``send_timeout``. A timer (or a sleeping
    task) per connection puts hundreds of entries in the loop's timer heap, which every
    sleep of every producer then pays for; one watch that looks at all of them at the
    earliest deadline (and at least every second) costs one entry.
    """

    __slots__ = ("due", "lines", "task", "wake")

    def __init__(self) -> None:
        self.lines: set[WatchedLine] = set()
        self.task: asyncio.Task[None] | None = None
        self.wake: asyncio.Event | None = None
        self.due = 0.0  # when the watch looks next (time.monotonic)

    async def run(self) -> None:
        # time.monotonic, not loop.time(): the lines stamp their sends with it (uvloop's
        # loop.time() is libuv's cached clock).
        try:
            while self.lines:
                now = time.monotonic()
                due = now + _MAX_TICK
                for line in list(self.lines):
                    try:
                        at = line.check(now)
                    except Exception as exc:  # a bug in one line must not stop the others
                        log_failure(logger, exc, "a connection's timer check failed")
                        self.lines.discard(line)
                        continue
                    if at is not None and at < due:
                        due = at
                wake = self.wake = asyncio.Event()
                self.due = due
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), max(due - time.monotonic(), 0.001))
        finally:
            self.task = None


_watches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LineWatch] = (
    weakref.WeakKeyDictionary()
)


def watch_line(line: WatchedLine) -> Callable[[], None]:
    """Have ``line`` checked by its loop's line watch; returns the function that stops
    it."""
    loop = asyncio.get_running_loop()
    watch = _watches.get(loop)
    if watch is None:
        watch = _watches[loop] = _LineWatch()
    watch.lines.add(line)
    if watch.task is None:
        # A task of the loop, not of one connection: it outlives the connection that
        # started it, and ends by itself when no connection is left.
        watch.task = loop.create_task(watch.run(), name="essessey-line-watch")
    elif watch.wake is not None:
        # Woken only for a line due before the watch's next look: a wake-up per new
        # connection would look at every open one, each time hundreds connect at once.
        at = line.check(time.monotonic())
        if at is not None and at < watch.due:
            watch.wake.set()

    def unwatch() -> None:
        watch.lines.discard(line)

    return unwatch
