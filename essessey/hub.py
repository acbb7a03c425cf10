"""The hub: turns run apart from the connections that watch them.

A producer runs as a task of the hub, not of a request, so a dropped connection never
stops a turn. Its events go into an :class:`~essessey.stores.EventStore`, and every
subscriber follows the store: replay after its last event id, then live events, with no
gap and no duplicate at the seam because both come from one ordered log.

Policies, and why:
- A subscriber more than ``max_lag`` events behind the head is ended
  (:class:`~essessey.SubscriberLagged`, logged). Its last event id is still retained, so
  it resumes by id; keep ``max_lag`` well below the store's per-stream capacity. The
  backlog a subscriber replays when it attaches does not count as lag (only events
  appended after it attached do), so a resume always makes progress.
- A last event id the store cannot resume from raises :class:`~essessey.UnknownEventId`
  before any event: the client starts over without an id and gets the stream from the
  oldest message retained whole. Nothing is guessed, nothing silently repeated.
- :meth:`StreamHub.cancel` stops a turn: the open block is closed and the message ends
  with stop reason ``cancelled``, so every subscriber sees why it ended. A client
  disconnecting only ends its own subscription.
- A producer that raises or returns while its message is still open gets an ``error``
  event to end that message, so no subscriber waits forever; one that fails outside a
  message (before message_start, after message_stop) is only logged, and the stream is
  closed either way.
- A stream id is not a secret: ``authorize`` decides who may read, resume or cancel.
- Leaving the hub (the app shutting down) first lets the running turns finish, for up to
  ``shutdown_grace`` seconds (20 by default), and only then cancels those still running
  (stop reason ``cancelled``, as :meth:`StreamHub.cancel`). With a shared store the
  clients of this replica resume on another while the turn is still being written, so
  what they get is the whole turn, not one cut at the shutdown; in one process a turn's
  own work (saving the answer, say) still completes. No new turn starts meanwhile
  (``RuntimeError``). The default leaves a cancelled turn's ending (up to 2 x 5 s) room
  within the 30 s an orchestrator commonly allows between SIGTERM and SIGKILL
  (Kubernetes' ``terminationGracePeriodSeconds``). Left because of an exception (a
  cancellation included), the hub cancels its turns at once. The lifespan shutdown, where
  the hub is usually left, runs only after the server's responses have ended, which the
  SSE and WebSocket endpoints do at once when the server shuts down
  (``essessey.shutdown``).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import logging
import multiprocessing
import os
import secrets
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from functools import partial
from types import TracebackType
from typing import Any, Final, Literal, TypeAlias

import anyio
from anyio.abc import TaskGroup, TaskStatus

from essessey._ids import MAX_ID_LENGTH, is_stream_id, new_message_id
from essessey._logsafe import log_failure
from essessey.errors import (
    EssesseyError,
    NotWaiting,
    StreamBusy,
    StreamNotFound,
    SubscriberLagged,
    TooManySubscribers,
    UnknownEventId,
)
from essessey.event import Event, new_event
from essessey.metrics import totals
from essessey.protocol import (
    TEXT_DELTA_PAYLOAD,
    Dialect,
    EventType,
    MessageDelta,
    StopReason,
    read,
)
from essessey.protocol.asking import (
    Answer,
    Answered,
    QuestionAnswer,
    ToolApproval,
    Waiting,
    match_answers,
    waiting,
)
from essessey.publisher import Publisher, TurnProducer
from essessey.snapshot import SnapshotCache, compact_yielding
from essessey.stores import (
    AppendsWithoutWaiting,
    DeliversInAppend,
    EventStore,
    InMemoryEventStore,
    KnowsEventIds,
    SharedEventStore,
    StreamAppender,
    Taker,
)

__all__ = [
    "Access",
    "Authorize",
    "Continuation",
    "Continued",
    "StreamHub",
    "Subscription",
    "TurnProducer",
]

logger = logging.getLogger("essessey.hub")

Access: TypeAlias = Literal["read", "resume", "cancel", "answer"]
"""What a request wants to do with a stream: read it from the start, resume it from a
last event id, cancel its turn, or answer what it asks."""

Continuation: TypeAlias = Callable[[Publisher, Answered], Awaitable[None]]
"""``continue_turn(publisher, answered)``: what runs when a stream's client answers what
it asked (docs/asking.md). The hub has started the message and recorded the answers; the
continuation writes the rest of it from ``answered.next_index`` and ends it (with
``essessey.continue_turn`` or ``essessey.adapters.continue_rounds``)."""

_ASKED: Final = "~asked"
_ASKED_EVENT: Final = "asked"


def _asked_key(request_id: str) -> str:
    """The stream that indexes the turns that asked ``request_id``: ``<id>~asked``, or
    for an id a stream id cannot hold (a ``.``, whitespace, too long) ``~asked~`` and a
    digest of it, so that every request a turn asks can be answered by its id."""
    key = request_id + _ASKED
    if is_stream_id(key):
        return key
    digest = hashlib.sha256(request_id.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{_ASKED}~{digest}"


ANSWER_WAIT: Final = 10.0
"""Seconds an answer that finds a turn running on the stream keeps trying: until that
turn's record of the answers (another replica took the same answer a moment earlier), or
until the turn ends (the asking turn, still writing its end, when a client answers as
soon as it reads the question)."""


@dataclass(frozen=True, slots=True)
class Continued:
    """An answer taken: the turn goes on in ``stream_id``, after event ``after`` (the
    asking message's last), which a reader resumes from to read the continuation.
    ``started`` is False when the same answer had continued the turn already."""

    stream_id: str
    after: str | None
    started: bool


Authorize: TypeAlias = Callable[[Any, str, Access], "bool | Awaitable[bool]"]
"""``authorize(request, stream_id, access) -> bool`` (sync or async), supplied by the app."""


_END_TIMEOUT: Final = 5.0
"""Seconds a cancelled or failed turn may spend writing its last events."""
# The name every delta the Publisher makes carries (the same object: compared by identity).
_DELTA: Final = EventType.CONTENT_BLOCK_DELTA
DEFAULT_SHUTDOWN_GRACE: Final = 20.0
"""Seconds the running turns may take to finish when the hub is left."""


class _HubSink:
    """The sink of a running turn: appends to the store (as the turn's lease holder, on a
    shared store), remembers the last event."""

    __slots__ = (
        "_appender",
        "_holder",
        "_shared",
        "_store",
        "_stream_id",
        "emit_text",
        "last_was_error",
        "message_open",
        "stop_reason",
    )

    emit_text: Callable[[int, str, bytes], Awaitable[None] | None]
    """The sink's text path (``TextDeltaSink``): the store's own for a store that appends
    in a plain call, so that a Publisher's text delta goes into the stream in one call.
    A text delta never follows an ``error`` (the hub's Publisher is strict, and an error
    ends the message), so it need not note that the last event was not one."""

    def __init__(self, hub: StreamHub, stream_id: str, holder: str) -> None:
        self._store = hub.store
        self._shared = hub._shared
        self._stream_id = stream_id
        self._holder = holder
        appender = None if hub._appender is None else hub._appender(stream_id)
        self._appender = appender
        self.emit_text = self._emit_text_event if appender is None else appender.emit_text
        self.last_was_error = False
        # Whether what the store took so far leaves a message open: the Publisher's
        # checker counts an event before its write, so a write that failed leaves the
        # two apart, and only this says whether the turn still needs its end.
        self.message_open = False
        self.stop_reason: str | None = None  # of the last message_delta, for the metrics

    def _note(self, event: Event) -> None:
        name = event.event
        self.last_was_error = name == EventType.ERROR
        if name == EventType.MESSAGE_START:
            self.message_open = True
        elif name == EventType.MESSAGE_STOP or self.last_was_error:
            self.message_open = False
        if name == EventType.MESSAGE_DELTA:
            record = read(event)
            if isinstance(record, MessageDelta):
                self.stop_reason = record.stop_reason

    async def emit(self, event: Event) -> None:
        appender = self._appender
        if appender is not None:
            # A store that appends in a plain call (the in-memory one): no await.
            appender.append(event.event, event.data)
        elif (shared := self._shared) is not None:
            await shared.append_as(self._stream_id, event, self._holder)
        else:
            await self._store.append(self._stream_id, event)
        if event.event is _DELTA:
            # A delta leaves the message as it was: nearly every event of a turn.
            self.last_was_error = False
        else:
            self._note(event)

    def _emit_text_event(self, index: int, text: str, text_json: bytes) -> Awaitable[None]:
        """The text path for a store that appends only with ``append``: the event."""
        data = TEXT_DELTA_PAYLOAD % (index, text_json)
        return self.emit(new_event(Event, (_DELTA, data, None)))


@dataclass(slots=True)
class _Turn:
    scope: anyio.CancelScope
    done: anyio.Event = field(default_factory=anyio.Event)
    started: bool = False
    # Its lease on a store with leases (a Redis store shared by replicas): who holds the
    # stream while the turn runs, so no other replica starts one on it.
    holder: str = field(default_factory=lambda: secrets.token_hex(8))


_OUTCOMES: Final = frozenset(
    value for name, value in vars(StopReason).items() if name.isupper() and isinstance(value, str)
)
"""The stop reasons a finished turn is counted by; any other (a provider's own, passed
through) counts as ``other``: a metric's label takes a bounded set of values, never text a
provider or a producer chose."""


def _outcome(stop_reason: str | None) -> str:
    """A finished turn's ``outcome`` label: its stop reason when the protocol names it,
    ``other`` for any other, ``error`` without one."""
    if not stop_reason:
        return "error"
    return stop_reason if stop_reason in _OUTCOMES else "other"


async def _let_go(store: SharedEventStore, key: str, holder: str) -> None:
    """Release ``holder``'s hold of ``key`` (:meth:`StreamHub.exclusive`), shielded and
    bounded; when the store is out of reach the hold lapses instead."""
    with anyio.CancelScope(shield=True), anyio.move_on_after(_END_TIMEOUT):
        try:
            await store.release_turn(key, holder)
        except Exception as exc:
            logger.warning("could not let go of %s (%s)", key, type(exc).__name__)


async def _leave(tasks: TaskGroup, exc: BaseException) -> None:
    """Leave the hub's task group as ``exc`` (raised in the ``async with`` body, or a
    cancellation while draining) leaves it.

    anyio's task group wraps such an exception in an ``ExceptionGroup``, so an
    ``except MessagesNotRetained:`` around the ``async with`` would never match. The
    turns' own tasks never raise (each turn catches and logs its failures), so a group
    holding only ``exc`` is ``exc``: the caller raises it unwrapped. Anything else in it
    is a bug of the hub's, raised as the group so it is not lost.
    """
    try:
        await tasks.__aexit__(type(exc), exc, exc.__traceback__)
    except BaseExceptionGroup as group:
        if _only(group) is not exc:
            raise


def _only(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The one exception ``group`` holds (in nested groups too), or None."""
    inner: BaseException = group
    while isinstance(inner, BaseExceptionGroup):
        if len(inner.exceptions) != 1:
            return None
        inner = inner.exceptions[0]
    return inner


_warned_worker = False


def _warn_if_worker() -> None:
    """Warn, once per process, when a stream is not found in an in-memory store of a
    process another started (a server's worker, ``--workers N``): the stream may be held
    by a sibling worker, which a client reaches at random, and the 404 it gets says
    nothing of that."""
    global _warned_worker
    if _warned_worker or multiprocessing.parent_process() is None:
        return
    _warned_worker = True
    logger.warning(
        "a stream was not found in this worker's in-memory store (pid %d): if the server "
        "runs several workers, each keeps streams of its own and a client that reaches "
        "another worker than its turn's gets 404; run one worker, or give the hub a "
        "shared store (essessey.stores.redis, essessey.stores.jetstream)",
        os.getpid(),
    )


class Subscription:
    """One reader's follow of a stream, from the resume point :meth:`StreamHub.open`
    checked: iterate it for the events (the head it opened with, then live ones until the
    turn ends). What every transport and dialect reads a hub's stream through.

    ``resuming`` says whether it resumes after an id. A transport that can take an event
    without waiting (essessey's SSE and WebSocket endpoints) may call
    :meth:`deliver_live` before iterating: live events then reach it in the turn's own
    append where the store can, and are not yielded."""

    __slots__ = ("_hub", "after", "head", "live_delivery", "resuming", "stream_id")

    def __init__(
        self,
        hub: StreamHub,
        stream_id: str,
        head: list[Event],
        after: str | None,
        *,
        resuming: bool,
    ) -> None:
        self._hub = hub
        self.stream_id = stream_id
        self.head = head
        """The events it starts with (a replay, or a snapshot), read at open."""
        self.after = after
        """The id the store's follow goes on from (None: the oldest whole message)."""
        self.resuming = resuming
        self.live_delivery: Taker | None = None

    def deliver_live(self, taker: Taker) -> None:
        """Offer each live event to ``taker`` in the turn's own append, where the store
        can (it returns whether it took it; never raises)."""
        self.live_delivery = taker

    def __aiter__(self) -> AsyncGenerator[Event, None]:
        return self._hub._follow(self)


class StreamHub:
    """Runs turns as tasks and lets any number of subscribers follow each stream.

    Enter it once for the life of the app (``async with hub:`` in a lifespan, or
    ``lifespan=hub.lifespan``); leaving it waits up to ``shutdown_grace`` seconds for the
    running turns to finish, then cancels those still running, ending each properly (0: at
    once).
    """

    def __init__(
        self,
        store: EventStore | None = None,
        *,
        dialect: Dialect = "essessey",
        authorize: Authorize | None = None,
        max_lag: int = 1000,
        max_subscribers: int = 1000,
        shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE,
        snapshot_after: int | None = None,
        on_answer: Continuation | None = None,
    ) -> None:
        if max_lag <= 0 or max_subscribers <= 0:
            raise ValueError("max_lag and max_subscribers must be > 0")
        if snapshot_after is not None and snapshot_after < 0:
            raise ValueError("snapshot_after must be >= 0, or None for no snapshots")
        if not shutdown_grace >= 0:
            raise ValueError("shutdown_grace must be >= 0")
        self.shutdown_grace = shutdown_grace
        self._closing = False
        self.store: EventStore = store if store is not None else InMemoryEventStore()
        if not isinstance(self.store, EventStore):
            raise TypeError(
                f"{type(self.store).__name__} is not an EventStore (see essessey.stores)"
            )
        # What the store can do beyond the contract, learnt once (see essessey.stores).
        # The store as a SharedEventStore (leases, cancel from any replica), or None.
        self._shared: SharedEventStore | None = (
            self.store if isinstance(self.store, SharedEventStore) else None
        )
        # The store's open streams as plain calls, when it has them.
        self._appender: Callable[[str], StreamAppender | None] | None = (
            self.store.appender if isinstance(self.store, AppendsWithoutWaiting) else None
        )
        self._delivering: DeliversInAppend | None = (
            self.store if isinstance(self.store, DeliversInAppend) else None
        )
        # The store's check of a resume point, when it has one that reads no events.
        self._knows: Callable[[str, str], Awaitable[bool]] | None = (
            self.store.knows if isinstance(self.store, KnowsEventIds) else None
        )
        self.dialect: Dialect = dialect
        self.max_lag = max_lag
        self.max_subscribers = max_subscribers
        self._authorize = authorize
        self.snapshot_after = snapshot_after
        """A subscriber that would be replayed more than this many events gets them as a
        snapshot (:mod:`essessey.snapshot`); None: never."""
        self._snapshots = SnapshotCache(self.store) if snapshot_after is not None else None
        self.on_answer = on_answer
        """What runs when a client answers what a stream asks (:meth:`answer`)."""
        self._said_no_continuation = False  # logged once: answers came, none can be taken
        self._turns: dict[str, _Turn] = {}
        self._exclusive: set[str] = set()  # the keys held here (see exclusive)
        self._subscribers: dict[str, int] = {}
        self._tasks: TaskGroup | None = None

    async def __aenter__(self) -> StreamHub:
        if self._tasks is not None:
            raise RuntimeError("this StreamHub is already running")
        tasks = anyio.create_task_group()
        await tasks.__aenter__()
        self._tasks = tasks
        self._closing = False
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        tasks = self._tasks
        if tasks is None:
            return None
        self._closing = True  # no new turn from here on
        interrupted: BaseException | None = None
        if exc_type is None and self._turns and self.shutdown_grace > 0:
            try:
                await self._drain(self.shutdown_grace)
            except BaseException as error:  # cancelled while waiting: cancel the turns
                interrupted = error
        self._tasks = None
        for turn in list(self._turns.values()):
            turn.scope.cancel()
        if interrupted is not None:
            await _leave(tasks, interrupted)
            raise interrupted
        if exc is None:
            return await tasks.__aexit__(None, None, None)
        await _leave(tasks, exc)
        return None  # the body's own exception goes on as it was raised

    @contextlib.asynccontextmanager
    async def lifespan(self, app: object) -> AsyncGenerator[None, None]:
        """Run the hub for the life of an ASGI app: ``FastAPI(lifespan=hub.lifespan)`` or
        ``Starlette(lifespan=hub.lifespan)``, the same as ``async with hub:`` in a lifespan
        of your own (write that one when the app starts more than the hub)."""
        async with self:
            yield

    async def _drain(self, grace: float) -> None:
        """Wait up to ``grace`` seconds for the running turns to finish."""
        count = len(self._turns)
        logger.info("waiting up to %.1f s for %d running turn(s) to finish", grace, count)
        with anyio.move_on_after(grace):
            for turn in list(self._turns.values()):
                await turn.done.wait()
        if self._turns:
            logger.warning(
                "%d turn(s) still running after the %.1f s shutdown grace; cancelling them",
                len(self._turns),
                grace,
            )

    def running(self, stream_id: str) -> bool:
        """Whether a turn is running on ``stream_id`` in this hub."""
        return stream_id in self._turns

    async def running_anywhere(self, stream_id: str) -> bool:
        """Whether a turn is running on ``stream_id`` in this hub or, with a
        :class:`~essessey.SharedEventStore`, on another replica (its lease is alive)."""
        if stream_id in self._turns:
            return True
        shared = self._shared
        return shared is not None and await shared.turn_running(stream_id)

    @contextlib.asynccontextmanager
    async def exclusive(self, key: str) -> AsyncIterator[None]:
        """Hold ``key`` for the body against every other holder: in this hub and, with a
        :class:`~essessey.SharedEventStore`, on every replica sharing the store. Raises
        :class:`~essessey.StreamBusy` at once while another holds it (it never waits).

        For a decision that must be made once however many replicas are asked at the
        same moment, such as whether a chat may start a turn: check, then act (start
        the turn, whose own lease then answers for it), all inside. On a shared store
        the key is a stream id (the same rules), held as a turn's lease is: a replica
        that dies holding it holds it no longer after the store's ``running_ttl``.
        """
        if not is_stream_id(key):
            raise ValueError(f"a key of {len(key)} characters is not a valid stream id")
        if key in self._exclusive:
            raise StreamBusy(f"{key!r} is held on this replica")
        self._exclusive.add(key)
        try:
            shared = self._shared
            if shared is None:
                yield
                return
            holder = secrets.token_hex(8)
            try:
                await shared.claim_turn(key, holder)  # StreamBusy while another holds it
            except StreamBusy:
                raise  # held by another: nothing of this holder's to let go of
            except Exception:
                # Out of reach while it answered: the claim may have been made (its reply
                # lost), and a release by a holder that holds nothing does nothing. Let go
                # of apart, so the caller's error is not held up by the store's retries.
                tasks = self._tasks
                if tasks is not None:
                    tasks.start_soon(_let_go, shared, key, holder)
                raise
            except BaseException:
                # Cancelled while the store answered: the same, before the cancellation
                # goes on.
                await _let_go(shared, key, holder)
                raise
            try:
                yield
            finally:
                await _let_go(shared, key, holder)
        finally:
            self._exclusive.discard(key)

    def subscriber_count(self, stream_id: str) -> int:
        """How many subscribers follow ``stream_id`` right now."""
        return self._subscribers.get(stream_id, 0)

    async def start(self, stream_id: str, producer: TurnProducer) -> None:
        """Run ``producer(publisher)`` as a task of the hub, publishing into the stream.

        Returns once the turn is registered (subscribers may attach at once). Raises
        :class:`~essessey.StreamBusy` when a turn is already running on the stream, and
        ValueError for a stream id the SSE and WebSocket routes would refuse (see
        ``essessey._ids``: 1 to 256 printable characters, no whitespace, ``.``, ``*``,
        ``>``), since no client could then read it.
        """
        if not is_stream_id(stream_id):
            raise ValueError(
                f"stream id of {len(stream_id)} characters is not a valid token: 1 to "
                f"{MAX_ID_LENGTH} printable characters, no whitespace, '.', '*' or '>'"
            )
        tasks = self._tasks
        if tasks is None:
            raise RuntimeError("enter the StreamHub (async with hub:) before starting turns")
        if self._closing:
            raise RuntimeError("the StreamHub is shutting down; no new turn starts")
        if stream_id in self._turns:
            raise StreamBusy(f"a turn is already running on stream {stream_id!r}")
        # Registered before the first await, so a concurrent start on the same stream
        # (a double click) gets StreamBusy instead of running a second producer.
        turn = _Turn(anyio.CancelScope())
        self._turns[stream_id] = turn
        opening = False
        try:
            shared = self._shared
            if shared is not None:
                # StreamBusy while another replica runs it
                await shared.claim_turn(stream_id, turn.holder)
            else:
                # Marked first: cancelled while the store answers, the stream may be
                # open already.
                opening = True
                await self.store.open_stream(stream_id)
            opening = True
            await tasks.start(self._run, stream_id, producer, turn)
        except BaseException:
            if not turn.started:
                self._forget(stream_id, turn)
                if opening:
                    # Cancelled between opening the stream and running its turn (the
                    # caller's client left): a stream left open would keep its readers
                    # waiting for a turn that never comes.
                    with anyio.CancelScope(shield=True):
                        await self._close(stream_id, turn)
            raise

    def _forget(self, stream_id: str, turn: _Turn) -> None:
        if self._turns.get(stream_id) is turn:
            del self._turns[stream_id]
        turn.done.set()

    async def _run(
        self,
        stream_id: str,
        producer: TurnProducer,
        turn: _Turn,
        *,
        task_status: TaskStatus[None],
    ) -> None:
        sink = _HubSink(self, stream_id, turn.holder)
        shared = self._shared
        publisher = Publisher(sink, dialect=self.dialect, strict=True)
        unwatch: Callable[[], None] | None = None
        if shared is not None:
            # A cancel asked on another replica reaches this turn.
            unwatch = await shared.watch_cancel(stream_id, turn.scope.cancel)
        turn.started = True
        totals.turns_running += 1
        task_status.started()
        if shared is not None and self._tasks is not None:
            self._tasks.start_soon(self._keep_lease, shared, stream_id, turn)
        failed = False
        cut = False  # cancelled from outside the turn: the hub left with an exception
        try:
            with turn.scope:
                try:
                    await producer(publisher)
                except Exception as exc:
                    failed = True
                    # Its frames, not its message: that may quote the turn's content.
                    log_failure(logger, exc, "the turn on stream %s failed", stream_id)
        except anyio.get_cancelled_exc_class():
            cut = True
            raise
        finally:
            # In ``finally``, so that a turn cancelled from outside (the hub's task group
            # or its host cancelled) ends too. Shielded and bounded: the turn's last
            # events go out even when the hub is being left. Nothing raised here may
            # reach the hub's task group, where it would cancel every other turn; and
            # the stream is always closed, or its subscribers would wait forever.
            try:
                with anyio.CancelScope(shield=True):
                    await self._finish(
                        stream_id,
                        publisher,
                        sink,
                        turn,
                        cancelled=turn.scope.cancel_called or cut,
                        failed=failed,
                    )
            finally:
                if unwatch is not None:
                    unwatch()
                totals.turns_running -= 1
                outcome = "error" if sink.last_was_error else _outcome(sink.stop_reason)
                totals.turns_finished[outcome] += 1
                self._forget(stream_id, turn)

    async def _keep_lease(self, store: SharedEventStore, stream_id: str, turn: _Turn) -> None:
        """Renew the turn's lease a few times per ``running_ttl`` while it runs; when it
        is lost (not renewed in time: another replica may run the stream now), cancel
        the turn, whose writes the store refuses from then on."""
        interval = store.running_ttl / 3
        while not turn.done.is_set():
            with anyio.move_on_after(interval):
                await turn.done.wait()
            if turn.done.is_set():
                return
            try:
                held = await store.keep_running(stream_id, turn.holder)
            except Exception as exc:  # the store is down: try again, the lease may hold
                logger.warning(
                    "could not renew the lease of %s (%s)", stream_id, type(exc).__name__
                )
                continue
            if not held and not turn.done.is_set():
                logger.warning("the turn on %s lost its lease; cancelling it", stream_id)
                turn.scope.cancel()
                return

    async def _finish(
        self,
        stream_id: str,
        publisher: Publisher,
        sink: _HubSink,
        turn: _Turn,
        *,
        cancelled: bool,
        failed: bool,
    ) -> None:
        ended = False
        with anyio.move_on_after(_END_TIMEOUT) as ending:
            try:
                await self._end(publisher, sink, cancelled=cancelled, failed=failed)
                ended = True
            except Exception as exc:
                log_failure(logger, exc, "could not end the turn on stream %s", stream_id)
        if ending.cancelled_caught:
            logger.warning("ending the turn on stream %s timed out", stream_id)
        shared = self._shared
        if shared is not None and not ended:
            # Its message is still open (the store was out of reach): releasing would
            # close the stream mid-message, and its readers would take the cut for the
            # end. Its lease lapses instead, and the store ends the message with an error
            # event once it is back (docs/resume.md, "Leases").
            logger.warning("the turn on stream %s is left for its store to end", stream_id)
            return
        if sink.stop_reason == StopReason.TOOL_USE:
            with anyio.move_on_after(_END_TIMEOUT):
                try:
                    await self._note_requests(stream_id)
                except Exception as exc:
                    log_failure(logger, exc, "could not index the requests of stream %s", stream_id)
        await self._close(stream_id, turn)

    async def _close(self, stream_id: str, turn: _Turn) -> None:
        """Let go of the turn's stream (its lease, on a shared store): its readers end
        once they have read it. Bounded; a failure is logged, never raised."""
        shared = self._shared
        with anyio.move_on_after(_END_TIMEOUT):
            try:
                if shared is not None:
                    await shared.release_turn(stream_id, turn.holder)
                else:
                    await self.store.close_stream(stream_id)
            except Exception as exc:
                log_failure(logger, exc, "could not close stream %s", stream_id)

    async def _end(
        self, publisher: Publisher, sink: _HubSink, *, cancelled: bool, failed: bool
    ) -> None:
        checker = publisher.checker
        counted_open = checker is not None and checker.in_message
        if sink.last_was_error or not (sink.message_open or counted_open):
            return  # already ended (stream_turn sends its own error) or nothing open
        if not counted_open:
            # The Publisher counted an end its store never took (that write failed):
            # what is stored is still an open message, which a fresh Publisher ends.
            # (The other way round, a write cancelled in flight, may have been stored:
            # the Publisher's count is followed, as it always was.)
            publisher, checker = Publisher(sink, dialect=self.dialect), None
        try:
            if cancelled and checker is not None:
                block = checker.open_block
                if block is not None:
                    await publisher.send_content_block_stop(block[0])
                await publisher.send_stream_epilogue(StopReason.CANCELLED, 0)
                return
        except EssesseyError as exc:
            logger.warning(
                "could not end the cancelled turn cleanly (%s); sending an error",
                type(exc).__name__,
            )
        if failed or cancelled:
            await publisher.send_error("api_error", "the turn failed")
        else:
            logger.warning("a turn returned with its message still open; sending an error")
            await publisher.send_error("api_error", "the turn ended before message_stop")

    async def cancel(self, stream_id: str) -> bool:
        """Stop the turn running on ``stream_id`` and wait until it has ended its
        message; False when no turn is running there. On a store shared by replicas
        that has leases (Redis), a turn running on another replica is asked to stop
        there, and this returns True once it has."""
        turn = self._turns.get(stream_id)
        if turn is None:
            shared = self._shared
            if shared is None:
                return False
            return await shared.request_cancel(stream_id)
        turn.scope.cancel()
        await turn.done.wait()
        return True

    async def cancel_all(self) -> int:
        """Stop every turn running in this hub, at once, and wait until each has ended
        its message (stop reason ``cancelled``); the number stopped. For a shutdown that
        ends the turns before the streams, so that readers see why they ended. The hub
        keeps running: new turns can start."""
        turns = list(self._turns.values())
        for turn in turns:
            turn.scope.cancel()
        for turn in turns:
            await turn.done.wait()
        return len(turns)

    async def wait(self, stream_id: str) -> None:
        """Wait until the turn running on ``stream_id`` (if any) has finished: in this hub
        or, with a :class:`~essessey.SharedEventStore`, on another replica (its stream
        is followed to its end; a replica gone ends it once its lease lapses)."""
        turn = self._turns.get(stream_id)
        if turn is not None:
            await turn.done.wait()
            return
        shared = self._shared
        if shared is None or not await shared.turn_running(stream_id):
            return
        events, known = await self.store.since(stream_id, None)
        if not known:
            return
        # From its last event on: what follows is read only to learn where it ends.
        async for _ in self.subscribe(stream_id, events[-1].id if events else None):
            pass

    # -- turns that ask (docs/asking.md) ---------------------------------------------------

    async def waiting(self, stream_id: str) -> Waiting | None:
        """What ``stream_id`` waits for (read from its log, on any replica), or None when
        its retained messages ask nothing. Raises :class:`~essessey.StreamNotFound`
        for a stream the store does not hold."""
        events, known = await self.store.since(stream_id, None)
        if not known:
            raise StreamNotFound(f"no stream {stream_id!r} is retained")
        return waiting(events)

    async def record(self, stream_id: str, event: Event) -> None:
        """Append ``event`` to ``stream_id``, a stream of records that is no turn (an
        index: the turns that asked a request, which turn a chat is on), and close it
        again: a reader of it by id reads what it holds and ends, instead of waiting
        for a turn that never comes."""
        store = self.store
        await store.append(stream_id, event)
        await store.close_stream(stream_id)

    async def asking_streams(self, request_id: str) -> list[str]:
        """The streams whose turns asked request ``request_id`` (an approval, a
        question, a client call), the latest first, on any replica with the same store;
        empty when none did (or none is kept). For a dialect whose answers name only the
        requests (Chat Completions' ``tool`` messages, AG-UI's interrupts): a model's
        call ids need not be unique across turns (``functions.get_weather:0``), so more
        than one may have asked, and the caller tells them apart (what each still waits
        for, who may answer it)."""
        events, known = await self.store.since(_asked_key(request_id), None)
        if not known:
            return []
        return list(dict.fromkeys(event.data.decode() for event in reversed(events)))

    async def asking_stream(self, request_id: str) -> str | None:
        """The stream whose turn asked request ``request_id`` last
        (:meth:`asking_streams`' first); None when none did."""
        streams = await self.asking_streams(request_id)
        return streams[0] if streams else None

    async def _note_requests(self, stream_id: str) -> None:
        """Index the requests of a turn that ended asking, by request id
        (:meth:`asking_streams`)."""
        asked = await self.waiting(stream_id)
        if asked is None or asked.continued:
            return
        for request in asked.requests:
            await self.record(_asked_key(request.id), Event(_ASKED_EVENT, stream_id.encode()))

    async def answer(
        self,
        stream_id: str,
        answers: Sequence[Answer],
        *,
        continuation: Continuation | None = None,
    ) -> Continued:
        """Answer what ``stream_id`` asks and continue its turn, exactly once.

        The answers must answer every request of the stream's asking message. The
        continuation (``continuation``, else the hub's ``on_answer``) runs as a new turn
        on the stream, on this replica: a message whose first blocks record the answers,
        then what the continuation writes. The same answers given again (a retried POST,
        a double click, the other replica a moment later) start nothing and return the
        same :class:`Continued` with ``started=False``.

        Raises :class:`~essessey.StreamNotFound`; :class:`~essessey.NotWaiting` when the
        stream asks nothing or a turn runs on it that is not this answer's, or when there
        is no continuation (no ``continuation`` and no ``on_answer``: a WARNING, once);
        :class:`~essessey.InvalidAnswer`, :class:`~essessey.AnswerExpired` and
        :class:`~essessey.AnswerConflict` (answered already, differently), all before
        anything is written.
        """
        go_on = continuation if continuation is not None else self.on_answer
        if go_on is None:
            # Nothing here can take an answer: a refusal for the client (a stream this hub
            # does not know stays a 404), and a line for the app's developer, once.
            await self.waiting(stream_id)
            if not self._said_no_continuation:
                self._said_no_continuation = True
                logger.warning(
                    "an answer came, but this StreamHub has no on_answer continuation to "
                    "run: answers are refused (give StreamHub(on_answer=...))"
                )
            raise NotWaiting("this server takes no answers")
        # A turn may be running on the stream when the answer comes: another answer's
        # continuation, here or on another replica (its record of the answers decides),
        # or the asking turn itself, still writing its end when a client that read the
        # question answers. Tried again until it settles, up to ANSWER_WAIT seconds.
        deadline = anyio.current_time() + ANSWER_WAIT
        while True:
            tried = await self._answer_once(stream_id, answers, go_on)
            if isinstance(tried, Continued):
                return tried
            if anyio.current_time() >= deadline:
                if tried is None:
                    raise NotWaiting(f"stream {stream_id!r} asks nothing; a turn is running on it")
                if tried.continued and not self.running(stream_id):
                    raise NotWaiting("the stream went on after its question without an answer")
                raise NotWaiting(
                    f"a turn is running on stream {stream_id!r}; it takes no answer now"
                )
            await anyio.sleep(0.05)

    async def _answer_once(
        self, stream_id: str, answers: Sequence[Answer], go_on: Continuation
    ) -> Continued | Waiting | None:
        """One try of :meth:`answer`: the continuation started here, or found recorded;
        else what the stream asks, while a turn runs on it that has not recorded these
        answers (or another replica holds its lease); None while it asks nothing yet and
        a turn runs on it (the asking turn, its message not ended yet)."""
        asked = await self.waiting(stream_id)
        if asked is None:
            # A client answers as soon as it reads the question; the message that asks
            # ends later, when its turn writes the rest (a second question, its end).
            if await self.running_anywhere(stream_id):
                return None
            raise NotWaiting(f"stream {stream_id!r} asks nothing")
        if asked.recorded:
            match_answers(asked, answers)  # AnswerConflict when they differ
            return Continued(stream_id, asked.last_event_id, started=False)
        if self.running(stream_id) or asked.continued:
            return asked
        given = match_answers(asked, answers)
        outcome: list[Waiting | None] = []
        written = anyio.Event()
        producer = self._continuation(stream_id, asked, given, go_on, outcome, written)
        try:
            await self.start(stream_id, producer)
        except StreamBusy:
            return asked
        await written.wait()
        if outcome and outcome[0] is not None:
            # Another replica went on first (read again under the lease): the same
            # answers are no error, others are refused.
            match_answers(outcome[0], answers)
            return Continued(stream_id, outcome[0].last_event_id, started=False)
        return Continued(stream_id, asked.last_event_id, started=True)

    def _continuation(
        self,
        stream_id: str,
        asked: Waiting,
        given: Mapping[str, Answer],
        go_on: Continuation,
        outcome: list[Waiting | None],
        written: anyio.Event,
    ) -> TurnProducer:
        """The turn an answer starts: under the stream's lease, the log read again (a
        replica may have gone on meanwhile), then the record of the answers, then
        ``go_on``."""

        async def produce(publisher: Publisher) -> None:
            try:
                now = await self.waiting(stream_id)
                if now is None or now.message_id != asked.message_id or now.continued:
                    outcome.append(now if now is not None else asked)
                    return
                checker = publisher.checker
                if checker is not None:
                    checker.expect_answers(asked.requests)
                message_id = new_message_id()
                model = asked.model or "essessey"
                await publisher.send_stream_preamble(message_id, stream_id, model)
                index = 0
                for request in asked.requests:
                    answer = given[request.id]
                    if isinstance(answer, ToolApproval):
                        await publisher.send_approval_response(
                            index, answer.request_id, answer.approved, reason=answer.reason
                        )
                    elif isinstance(answer, QuestionAnswer):
                        await publisher.send_answer(index, answer.request_id, answer.value)
                    else:
                        await publisher.send_tool_result_block(
                            index, answer.tool_use_id, answer.text, is_error=answer.is_error
                        )
                    index += 1
            finally:
                written.set()
            answered = Answered(stream_id, message_id, model, index, asked.requests, dict(given))
            await go_on(publisher, answered)

        return produce

    def subscribe(
        self, stream_id: str, last_event_id: str | None = None, *, snapshot: bool = True
    ) -> AsyncGenerator[Event, None]:
        """Replay the stream after ``last_event_id`` (from the oldest whole message when
        None), then follow it live until its turn ends: :meth:`open`, then its events.

        With ``snapshot_after`` set on the hub (and ``snapshot``), a replay of more than
        that many events comes as a snapshot instead: each run of a block's deltas merged
        into one, carrying the id of its last delta, so a resume by the last id received
        stays exact (docs/resume.md, "Snapshots for late readers").

        Raises, before any event: :class:`~essessey.StreamNotFound`,
        :class:`~essessey.UnknownEventId`, :class:`~essessey.TooManySubscribers`; and
        :class:`~essessey.SubscriberLagged` when it falls more than ``max_lag`` behind.
        """
        # Opened on the first event asked for, in the follow loop itself: no generator of
        # its own between the store's follow and the reader, on the path of every event.
        return self._follow(partial(self.open, stream_id, last_event_id, snapshot=snapshot))

    async def open(
        self,
        stream_id: str,
        last_event_id: str | None = None,
        *,
        snapshot: bool = True,
        prime: Callable[[Event], object] | None = None,
    ) -> Subscription:
        """A :class:`Subscription` to ``stream_id`` after ``last_event_id``: the resume
        point read and checked once, here, so that a refusal is raised before the caller
        answers anything; then iterate it.

        Without ``prime`` it starts as :meth:`subscribe` does (a snapshot where the hub
        gives one). With ``prime`` and a last event id (a wire dialect's resume, whose
        frames depend on what came before) the stream is read from its oldest whole
        message and each event up to the id is handed to ``prime``, not yielded; the
        iteration goes on after the id, without reading the stream again.

        Raises :class:`~essessey.StreamNotFound`, :class:`~essessey.UnknownEventId`,
        :class:`~essessey.TooManySubscribers`.
        """
        count = self._subscribers.get(stream_id, 0)
        if count >= self.max_subscribers:
            raise TooManySubscribers(f"stream {stream_id!r} has {count} subscribers")
        head: list[Event]
        if last_event_id is not None and prime is not None:
            head, after = await self._primed(stream_id, last_event_id, prime)
        elif (
            last_event_id is not None
            and self._knows is not None
            and not (snapshot and self.snapshot_after is not None)
        ):
            # Checked without reading what follows: the follow replays it as it goes,
            # so the first event goes out without the whole rest read first.
            if not await self._knows(stream_id, last_event_id):
                raise await self._not_resumable(stream_id, last_event_id)
            head, after = [], last_event_id
        elif last_event_id is not None:
            head, known = await self.store.since(stream_id, last_event_id)
            if not known:
                raise await self._not_resumable(stream_id, last_event_id)
            after = head[-1].id if head else last_event_id
            threshold = self.snapshot_after
            if snapshot and threshold is not None and len(head) > threshold:
                # Far behind: what it misses, compacted (not cached: each resumes elsewhere).
                totals.snapshots += 1
                head = await compact_yielding(head)
        elif snapshot and self._snapshots is not None:
            head, after = await self._snapshot(stream_id)
        else:
            head, after = [], None
        if not head and last_event_id is None and not await self.store.exists(stream_id):
            self._not_found()
            raise StreamNotFound(f"no stream {stream_id!r}")
        return Subscription(self, stream_id, head, after, resuming=last_event_id is not None)

    async def _primed(
        self, stream_id: str, last_event_id: str, prime: Callable[[Event], object]
    ) -> tuple[list[Event], str | None]:
        """The stream read once from its oldest whole message: the events up to
        ``last_event_id`` handed to ``prime``, the rest and the id to follow on from."""
        events, _ = await self.store.since(stream_id, None)
        # From the oldest whole message: what comes before it is a message's tail.
        start = next(
            (i for i, event in enumerate(events) if event.event == EventType.MESSAGE_START),
            len(events),
        )
        end = next((i for i, event in enumerate(events) if event.id == last_event_id), -1)
        if end < start:
            raise await self._not_resumable(stream_id, last_event_id)
        for event in events[start : end + 1]:
            prime(event)
        head = events[end + 1 :]
        return head, (head[-1].id if head else last_event_id)

    async def _not_resumable(self, stream_id: str, last_event_id: str) -> Exception:
        """Why a resume after ``last_event_id`` cannot be served: the stream or the id."""
        if await self.store.exists(stream_id):
            return UnknownEventId(f"event id is not retained for stream {stream_id!r}")
        self._not_found()
        return StreamNotFound(f"no stream {stream_id!r}")

    def _not_found(self) -> None:
        if isinstance(self.store, InMemoryEventStore):
            _warn_if_worker()

    async def _follow(
        self, opened: Subscription | Callable[[], Awaitable[Subscription]]
    ) -> AsyncGenerator[Event, None]:
        """The one follow loop every transport and dialect reads through: the head the
        subscription opened with (``opened``, or what opening it gives), then the store's
        follow after it, counted as a subscriber of the stream while it runs."""
        subscription = opened if isinstance(opened, Subscription) else await opened()
        stream_id = subscription.stream_id
        # Counted before the first await: nothing waits until it is added.
        count = self._subscribers.get(stream_id, 0)
        if count >= self.max_subscribers:
            raise TooManySubscribers(f"stream {stream_id!r} has {count} subscribers")
        taker, delivering = subscription.live_delivery, self._delivering
        after = subscription.after
        if taker is not None and delivering is not None:
            events = delivering.follow_delivering(
                stream_id, after, max_lag=self.max_lag, taker=taker
            )
        else:
            events = self.store.follow(stream_id, after, max_lag=self.max_lag)
        self._subscribers[stream_id] = count + 1
        try:
            for event in subscription.head:
                yield event
            async for event in events:
                yield event
        except SubscriberLagged:
            totals.lagged += 1
            logger.warning("a subscriber of %s fell behind and was ended", stream_id)
            raise
        except StreamNotFound:
            self._not_found()
            raise
        finally:
            try:
                # Closed now, not whenever the garbage collector finalises it: a store's
                # follower may hold a subscription of its own.
                if isinstance(events, AsyncGenerator):
                    await events.aclose()
            finally:
                remaining = self._subscribers[stream_id] - 1
                if remaining:
                    self._subscribers[stream_id] = remaining
                else:
                    del self._subscribers[stream_id]

    async def _snapshot(self, stream_id: str) -> tuple[list[Event], str | None]:
        """What a subscriber without an id starts with: the stream's cached snapshot,
        brought up to date, when it covers more than ``snapshot_after`` events; else
        nothing (it follows from the oldest whole message)."""
        threshold, snapshots = self.snapshot_after, self._snapshots
        assert threshold is not None  # called only when snapshot_after is set
        assert snapshots is not None
        events, covered = await snapshots.snapshot(stream_id)
        if covered <= threshold:
            return [], None
        totals.snapshots += 1
        return events, events[-1].id

    async def authorized(self, request: Any, stream_id: str, access: Access) -> bool:
        """Ask the app's ``authorize`` hook; True when the hub has none."""
        hook = self._authorize
        if hook is None:
            return True
        verdict = hook(request, stream_id, access)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        return bool(verdict)
