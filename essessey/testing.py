"""The store conformance suite: prove that a store of events keeps the contract.

Every store essessey ships (in memory, Redis, JetStream) runs this suite, and a store of
your own can run it too. Subclass :class:`EventStoreConformance` in a test module, name
the class ``Test...`` so pytest collects it, and say how to open a store::

    import contextlib
    from essessey.testing import EventStoreConformance, PER_STREAM, LEASES

    class TestPostgresStore(EventStoreConformance):
        features = frozenset({PER_STREAM, LEASES})

        @contextlib.asynccontextmanager
        async def open_store(self, **bounds):
            async with PostgresEventStore.connect(DSN, **bounds) as store:
                yield store

``open_store`` gets the in-memory store's names for the bounds a test sets
(``max_events_per_stream``, ``max_bytes_per_stream``, ``max_streams``, ``max_bytes``,
``max_age``; ``retain`` is how many events one stream keeps); each store it opens must
start empty, on names of its own. ``features`` says what the store has beyond
:class:`~essessey.stores.EventStore`: :data:`PER_STREAM` (the per-stream and per-store
bounds and the running-turn rules) and :data:`LEASES` (a
:class:`~essessey.stores.SharedEventStore`: leases and cancel across replicas); a test
that needs a feature the store lacks is skipped. The suite runs under pytest with anyio's
plugin (which anyio installs) and hypothesis (the ``testing`` extra:
``pip install "essessey[testing]"``). Ids must be ``<epoch>-<sequence>``, as essessey's
own stores issue them (docs/resume.md). See docs/resume.md for the contract itself.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, ClassVar, Final, TypeVar

import anyio

from essessey._public import missing_extra

try:
    import pytest
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ModuleNotFoundError as exc:  # the testing extra is not installed
    raise missing_extra(__name__, exc, extra="testing") from None

from essessey.errors import (
    LeaseLost,
    MessagesNotRetained,
    StoreFull,
    StreamBusy,
    StreamNotFound,
    StreamReset,
    SubscriberLagged,
    UnknownEventId,
)
from essessey.event import Event
from essessey.protocol import EventType
from essessey.stores import EventStore, KnowsEventIds

__all__ = ["LEASES", "PER_STREAM", "EventStoreConformance"]

PER_STREAM: Final = "per-stream bounds"
"""The store keeps bounds per stream and for the whole store (counts, bytes, age) and the
running-turn rules (a running stream is never dropped; a full store refuses another)."""

LEASES: Final = "leases"
"""The store is a :class:`~essessey.stores.SharedEventStore`: turn leases, fencing of a
stale holder, cancel across replicas."""

WAIT: Final = 30.0
"""Seconds any one step may take before a test fails: reached only by a failing store."""

_names = itertools.count(1)
_needed: dict[str, frozenset[str]] = {}
_Test = TypeVar("_Test", bound=Callable[..., Any])


def _needs(*features: str) -> Callable[[_Test], _Test]:
    """Run the test only on stores that have ``features``."""

    def mark(test: _Test) -> _Test:
        _needed[test.__name__] = frozenset(features)
        return test

    return mark


def start(n: int = 0) -> Event:
    """A ``message_start`` event, told apart by ``n``."""
    return Event(EventType.MESSAGE_START, b'{"m":%d}' % n)


def stop() -> Event:
    """A ``message_stop`` event."""
    return Event(EventType.MESSAGE_STOP, b'{"type":"message_stop"}')


def delta(n: int) -> Event:
    """The ``n``-th of a stream's numbered events (their data tells them apart)."""
    return Event(EventType.CONTENT_BLOCK_DELTA, b'{"n":%d}' % n)


def seq(event_id: str | None) -> int:
    """The sequence part of an id: what a test may look at, never a client."""
    assert event_id is not None
    epoch_part, dash, number = event_id.rpartition("-")
    assert dash
    assert epoch_part
    assert number.isdigit()
    return int(number)


def epoch(event_id: str | None) -> str:
    """The epoch part of an id."""
    assert event_id is not None
    return event_id.rpartition("-")[0]


BOGUS_IDS: Final[dict[str, Callable[[str, int], str]]] = {
    "empty": lambda e, n: "",
    "garbage": lambda e, n: "garbage",
    "dash": lambda e, n: "-",
    "no-epoch": lambda e, n: "-1",
    "bare-number": lambda e, n: "1",
    "no-sequence": lambda e, n: f"{e}-",
    "letters": lambda e, n: f"{e}-x",
    "trailing-letter": lambda e, n: f"{e}-1x",
    "plus-sign": lambda e, n: f"{e}-+1",
    "minus-sign": lambda e, n: f"{e}--1",
    "space": lambda e, n: f"{e}- 1",
    "leading-zero": lambda e, n: f"{e}-01",  # not the spelling the store issued
    "zero": lambda e, n: f"{e}-0",  # never issued
    "superscript-digit": lambda e, n: f"{e}-\u00b2",  # a "digit" int() refuses
    "arabic-indic-digit": lambda e, n: f"{e}-\u0661",  # one int() accepts
    "not-issued-yet": lambda e, n: f"{e}-{n + 1}",
    "huge": lambda e, n: f"{e}-{10**40}",
    "beyond-int64": lambda e, n: f"{e}-{2**63}",
    "epoch-suffixed": lambda e, n: f"{e}x-1",
    "epoch-prefixed": lambda e, n: f"x{e}-1",
    "other-epoch": lambda e, n: f"{'0' * len(e) if e != '0' * len(e) else '1' * len(e)}-1",
    "newline": lambda e, n: f"{e}-1\n",
}
"""Ids no store issued for a stream, spelt from its epoch and its last sequence."""


async def fill(store: EventStore, stream_id: str, count: int, first: int = 0) -> list[Event]:
    """Append ``count`` numbered events (from ``first``) to ``stream_id``, one by one; the
    stored events, ids set."""
    return [await store.append(stream_id, delta(n)) for n in range(first, first + count)]


async def wait_until(condition: Callable[[], bool], what: str) -> None:
    """Yield to other tasks until ``condition()`` holds; fail, naming ``what``, after
    :data:`WAIT` seconds."""
    for _ in range(int(WAIT / 0.001)):  # a state to poll, not an event to wait on
        if condition():
            return
        await anyio.sleep(0.001)
    pytest.fail(f"timed out waiting for {what}")


async def read_all(store: Any, stream_id: str, last_id: str | None = None) -> list[Event]:
    """Every event ``follow`` yields until the stream is closed and drained."""
    got: list[Event] = []
    with anyio.fail_after(WAIT):
        async for event in store.follow(stream_id, last_id):
            got.append(event)
    return got


async def take(events: AsyncIterator[Event], count: int) -> list[Event]:
    """The next ``count`` events of ``events``."""
    return [await anext(events) for _ in range(count)]


@pytest.mark.anyio
class EventStoreConformance:
    """The suite as test methods: subclass it, set :attr:`features`, write
    :meth:`open_store` (see the module's docstring)."""

    features: ClassVar[frozenset[str]] = frozenset()
    """What the store has beyond the contract: :data:`PER_STREAM`, :data:`LEASES`."""

    def open_store(self, **bounds: Any) -> AbstractAsyncContextManager[Any]:
        """A new, empty store with ``bounds``, on names no other store of the run uses."""
        raise NotImplementedError("a conformance suite's subclass says how to open its store")

    @pytest.fixture
    def anyio_backend(self) -> str:
        """essessey runs on asyncio."""
        return "asyncio"

    @pytest.fixture(autouse=True)
    def _skip_what_the_store_lacks(self, request: pytest.FixtureRequest) -> None:
        missing = _needed.get(request.function.__name__, frozenset()) - self.features
        if missing:
            pytest.skip(f"the store has no {', '.join(sorted(missing))}")

    # -- ids --------------------------------------------------------------------------------

    async def test_it_is_an_event_store(self) -> None:
        """Checks that the store is an ``EventStore``."""
        async with self.open_store() as store:
            assert isinstance(store, EventStore)

    async def test_ids_are_unique_and_increasing_and_resume_exactly(self) -> None:
        """Checks that ids are unique and increasing and resume exactly."""
        async with self.open_store() as store:
            events = await fill(store, "s", 8)
            assert len({event.id for event in events}) == 8
            assert [(e.event, e.data) for e in events] == [
                (d.event, d.data) for d in map(delta, range(8))
            ]
            assert await store.since("s", None) == (events, True)
            for k, event in enumerate(events):
                assert await store.since("s", event.id) == (events[k + 1 :], True)

    async def test_a_stream_never_seen_is_unknown(self) -> None:
        """Checks that a stream never seen is unknown."""
        async with self.open_store() as store:
            assert await store.since("nowhere", None) == ([], False)
            assert await store.since("nowhere", "abcd1234-1") == ([], False)
            assert not await store.exists("nowhere")
            with pytest.raises(StreamNotFound):
                await read_all(store, "nowhere")

    @pytest.mark.parametrize("spell", list(BOGUS_IDS.values()), ids=list(BOGUS_IDS))
    async def test_a_garbage_or_foreign_id_is_unknown(
        self, spell: Callable[[str, int], str]
    ) -> None:
        """Checks that a garbage or foreign id is unknown."""
        async with self.open_store() as store:
            events = await fill(store, "s", 5)
            bogus = spell(epoch(events[0].id), seq(events[-1].id))
            assert bogus not in {event.id for event in events}
            assert await store.since("s", bogus) == ([], False)
            if isinstance(store, KnowsEventIds):
                assert await store.knows("s", bogus) is False
            with pytest.raises(UnknownEventId):
                await read_all(store, "s", bogus)

    async def test_an_id_of_another_stream_is_unknown(self) -> None:
        """Checks that an id of another stream is unknown."""
        async with self.open_store() as store:
            a = await fill(store, "a", 3)
            await fill(store, "b", 3)
            assert await store.since("b", a[0].id) == ([], False)

    async def test_an_id_from_before_clear_is_unknown(self) -> None:
        """Checks that an id from before a ``clear`` is unknown."""
        async with self.open_store() as store:
            old = await fill(store, "s", 5)
            await store.clear("s")
            assert not await store.exists("s")
            assert await store.since("s", None) == ([], False)
            new = await fill(store, "s", 5)
            for event in old:
                assert await store.since("s", event.id) == ([], False)
            assert await store.since("s", new[1].id) == (new[2:], True)

    # -- follow -----------------------------------------------------------------------------

    async def test_follow_replays_then_goes_live_and_ends_once_closed(self) -> None:
        """Checks that ``follow`` replays, goes live, and ends once the stream is closed."""
        async with self.open_store() as store:
            await store.open_stream("s")
            before = await fill(store, "s", 3)
            got: list[Event] = []

            async def reader() -> None:
                got.extend(await read_all(store, "s"))

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(reader)
                await anyio.sleep(0.1)
                after = await fill(store, "s", 3, first=3)
                await store.close_stream("s")
            assert got == before + after

    async def test_follow_from_an_id_and_after_a_reopen(self) -> None:
        """Checks ``follow`` from an id, and after the stream is opened again."""
        async with self.open_store() as store:
            first = await fill(store, "s", 4)
            await store.close_stream("s")
            assert await read_all(store, "s", first[1].id) == first[2:]
            second = await fill(store, "s", 2, first=4)  # an append reopens it
            await store.close_stream("s")
            assert await read_all(store, "s", first[-1].id) == second

    async def test_open_stream_lets_a_follower_wait_for_the_first_event(self) -> None:
        """Checks that ``open_stream`` lets a follower wait for the first event."""
        async with self.open_store() as store:
            await store.open_stream("s")
            assert await store.exists("s")
            got: list[Event] = []

            async def reader() -> None:
                got.extend(await read_all(store, "s"))

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(reader)
                await anyio.sleep(0.2)
                assert got == []
                events = await fill(store, "s", 2)
                await store.close_stream("s")
            assert got == events

    async def test_follow_raises_subscriber_lagged_past_max_lag(self) -> None:
        """Checks that ``follow`` raises ``SubscriberLagged`` past ``max_lag``."""
        async with self.open_store() as store:
            await store.open_stream("s")
            await fill(store, "s", 2)
            follower = store.follow("s", None, max_lag=3)
            with anyio.fail_after(WAIT):
                await follower.__anext__()  # replaying: the backlog is not lag
                await follower.__anext__()
                await fill(store, "s", 10, first=2)
                with pytest.raises(SubscriberLagged):
                    await take(follower, 20)
            await follower.aclose()

    async def test_the_backlog_replayed_on_attaching_is_not_lag(self) -> None:
        """Checks that the backlog replayed on attaching is not lag."""
        async with self.open_store() as store:
            await store.open_stream("s")  # (JetStream knows a stream's start by this marker)
            events = await fill(store, "s", 20)
            await store.close_stream("s")
            got: list[Event] = []
            with anyio.fail_after(WAIT):
                async for event in store.follow("s", None, max_lag=2):
                    got.append(event)
            assert got == events

    async def test_follow_raises_stream_reset_when_cleared_while_following(self) -> None:
        """Checks that ``follow`` raises ``StreamReset`` when the stream is cleared."""
        async with self.open_store() as store:
            await store.open_stream("s")
            events = await fill(store, "s", 2)
            got: list[Event] = []
            ended: list[BaseException] = []

            async def reader() -> None:
                try:
                    async for event in store.follow("s"):
                        got.append(event)
                except StreamReset as exc:
                    ended.append(exc)

            with anyio.fail_after(WAIT):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(reader)
                    await wait_until(lambda: len(got) == 2, "the replay")
                    await store.clear("s")
            assert got == events
            assert len(ended) == 1

    # -- late readers -------------------------------------------------------------------------

    async def test_a_late_reader_starts_at_the_oldest_whole_message(self) -> None:
        """Checks that a late reader starts at the oldest whole message."""
        async with self.open_store(retain=15) as store:
            await store.append("s", start(1))
            await fill(store, "s", 10)
            await store.append("s", stop())
            second = [await store.append("s", start(2)), *await fill(store, "s", 5, first=10)]
            await store.close_stream("s")
            got = await read_all(store, "s")
            assert got == second

    async def test_a_late_reader_of_a_finished_turn_with_no_whole_message_is_told(
        self,
    ) -> None:
        """Checks that a late reader of a finished turn with no whole message is told."""
        async with self.open_store(retain=5) as store:
            await store.append("s", start(1))
            await fill(store, "s", 20)
            await store.close_stream("s")
            with pytest.raises(MessagesNotRetained):
                await read_all(store, "s")

    async def test_a_late_reader_of_a_running_turn_waits_for_the_next_message(
        self,
    ) -> None:
        """Checks that a late reader of a running turn waits for the next message."""
        async with self.open_store(retain=5) as store:
            await store.open_stream("s")
            await store.append("s", start(1))
            await fill(store, "s", 20)
            got: list[Event] = []

            async def reader() -> None:
                got.extend(await read_all(store, "s"))

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(reader)
                await anyio.sleep(0.2)
                await fill(store, "s", 2, first=20)  # the tail of the first message: skipped
                assert got == []
                nxt = [await store.append("s", start(2)), *await fill(store, "s", 2, first=30)]
                await store.close_stream("s")
            assert got == nxt

    # -- per-stream bounds ----------------------------------------------------------------------

    @_needs(PER_STREAM)
    async def test_eviction_keeps_an_id_known_while_everything_after_it_is_retained(
        self,
    ) -> None:
        """Checks that eviction keeps an id known while everything after it is retained."""
        async with self.open_store(retain=5) as store:
            events = await fill(store, "s", 12)
            assert await store.since("s", None) == (events[7:], True)
            assert await store.since("s", events[6].id) == (events[7:], True)
            for evicted in events[:6]:
                assert await store.since("s", evicted.id) == ([], False)
            assert await store.since("s", events[11].id) == ([], True)

    @_needs(PER_STREAM)
    async def test_follow_raises_subscriber_lagged_when_its_position_is_trimmed(
        self,
    ) -> None:
        """Checks that ``follow`` raises ``SubscriberLagged`` when its position is trimmed."""
        async with self.open_store(retain=5) as store:
            events = await fill(store, "s", 3)
            await fill(store, "s", 10, first=3)
            with pytest.raises(UnknownEventId):
                await read_all(store, "s", events[0].id)

    @_needs(PER_STREAM)
    async def test_max_streams_drops_the_finished_stream_updated_longest_ago(
        self,
    ) -> None:
        """Checks that ``max_streams`` drops the finished stream updated longest ago."""
        async with self.open_store(max_streams=2) as store:
            a = await fill(store, "a", 2)
            await fill(store, "b", 2)
            await store.append("a", delta(9))
            await fill(store, "c", 2)
            assert await store.exists("a")
            assert not await store.exists("b")
            assert await store.exists("c")
            assert (await store.since("a", a[0].id))[1]

    @_needs(PER_STREAM)
    async def test_a_running_stream_is_never_dropped_to_make_room(self) -> None:
        """Checks that a running stream is never dropped to make room."""
        async with self.open_store(max_streams=3) as store:
            await store.open_stream("running")
            first = await store.append("running", start())
            for n in range(10):  # finished streams made after it, many more than fit
                await store.append(f"done{n}", start())
                await store.close_stream(f"done{n}")
            assert await store.exists("running")
            assert [await store.exists(f"done{n}") for n in (7, 8, 9)] == [False, True, True]
            second = await store.append("running", delta(1))  # its turn goes on, same epoch
            assert await store.since("running", None) == ([first, second], True)

    @_needs(PER_STREAM)
    async def test_a_store_full_of_running_turns_refuses_another(self) -> None:
        """Checks that a store full of running turns refuses another."""
        async with self.open_store(max_streams=2) as store:
            await store.open_stream("a")
            await store.open_stream("b")
            with pytest.raises(StoreFull, match="running"):
                await store.open_stream("c")
            with pytest.raises(StoreFull):
                await store.append("c", delta(0))
            assert await store.exists("a")
            assert await store.exists("b")
            await store.close_stream("a")
            await store.open_stream("c")  # a finished stream makes room
            assert not await store.exists("a")

    @_needs(PER_STREAM)
    async def test_a_running_stream_cleared_is_not_recreated_mid_message(self) -> None:
        """Checks that a running stream cleared is not created again mid-message."""
        async with self.open_store() as store:
            await store.open_stream("s")
            await store.append("s", start(1))
            await store.clear("s")
            with pytest.raises(StreamReset):
                await store.append("s", delta(1))
            assert not await store.exists("s")
            fresh = await store.append("s", start(2))  # a new message may start it
            assert await store.since("s", None) == ([fresh], True)

    @_needs(PER_STREAM)
    async def test_a_stream_over_its_byte_budget_loses_its_oldest_events(self) -> None:
        """Checks that a stream over its byte budget loses its oldest events."""
        cost = 100 + 180  # an event's data and what the store counts beside it
        async with self.open_store(max_bytes_per_stream=10 * cost) as store:
            events = [
                await store.append(
                    "s", Event(EventType.CONTENT_BLOCK_DELTA, b"x" * 94 + b"%06d" % n)
                )
                for n in range(30)
            ]
            assert await store.since("s", None) == (events[-10:], True)
            assert await store.since("s", events[5].id) == ([], False)

    @_needs(PER_STREAM)
    @settings(
        max_examples=40,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )
    @given(
        capacity=st.integers(1, 6),
        operations=st.lists(
            st.tuples(st.sampled_from(["append", "append", "append", "clear"]), st.integers(0, 2)),
            max_size=40,
        ),
    )
    async def test_since_agrees_with_a_reference_model(
        self, capacity: int, operations: list[tuple[str, int]]
    ) -> None:
        """Checks that ``since`` agrees with a reference model."""
        async with self.open_store(retain=capacity) as store:
            lives: dict[str, list[Event]] = {}
            issued: list[tuple[str, Event, int]] = []
            life: dict[str, int] = {}
            for n, (operation, which) in enumerate(operations):
                stream_id = f"s{which}"
                if operation == "clear":
                    await store.clear(stream_id)
                    lives.pop(stream_id, None)
                    life[stream_id] = life.get(stream_id, 0) + 1
                    continue
                stored = await store.append(stream_id, delta(n))
                lives.setdefault(stream_id, []).append(stored)
                issued.append((stream_id, stored, life.get(stream_id, 0)))
            for stream_id, stored, born in issued:
                for asked in ("s0", "s1", "s2"):
                    got = await store.since(asked, stored.id)
                    if isinstance(store, KnowsEventIds) and stored.id is not None:
                        # A store's quick check of a resume point agrees with since().
                        assert await store.knows(asked, stored.id) is got[1]
                    current = lives.get(asked, [])
                    same_life = asked == stream_id and born == life.get(asked, 0)
                    position = current.index(stored) if same_life else -1
                    if same_life and position >= len(current) - capacity - 1:
                        assert got == (current[position + 1 :], True)
                    else:
                        assert got == ([], False)
            for stream_id, current in lives.items():
                assert await store.since(stream_id, None) == (current[-capacity:], True)

    # -- leases (the stores replicas share) ---------------------------------------------------

    @_needs(LEASES)
    async def test_a_claimed_stream_is_busy_for_other_holders(self) -> None:
        """Checks that a claimed stream is busy for other holders."""
        async with (
            self.open_store(name="lease1") as a,
            self.open_store(name="lease1") as b,
        ):
            await a.claim_turn("s", "one")
            with pytest.raises(StreamBusy):
                await b.claim_turn("s", "two")
            assert await a.keep_running("s", "one")
            assert not await b.keep_running("s", "two")
            with pytest.raises(LeaseLost):
                await b.append_as("s", delta(0), "two")
            assert not await b.release_turn("s", "two")  # not its turn: nothing done
            await a.append_as("s", start(1), "one")
            assert await a.release_turn("s", "one")
            await b.claim_turn("s", "two")  # released: free

    @_needs(LEASES)
    async def test_a_turn_runs_while_a_live_lease_holds_it(self) -> None:
        """Checks that a turn runs while a live lease holds it."""
        async with (
            self.open_store(name="lease8", running_ttl=1.0) as a,
            self.open_store(name="lease8", running_ttl=1.0) as b,
        ):
            assert not await b.turn_running("s")  # never claimed
            await a.open_stream("t")
            assert not await b.turn_running("t")  # open, but no turn holds it
            await a.claim_turn("s", "one")
            assert await b.turn_running("s")  # seen through another replica's store
            assert await a.release_turn("s", "one")
            assert not await b.turn_running("s")
            await a.claim_turn("s", "two")
            for _ in range(int(WAIT * 10)):  # not renewed: it lapses
                if not await b.turn_running("s"):
                    break
                await anyio.sleep(0.1)
            else:
                pytest.fail("a lease nobody renewed still counts as running")
            assert await a.keep_running("s", "two")  # nobody took it: taken back
            assert await b.turn_running("s")

    @_needs(LEASES)
    async def test_a_stale_holder_writes_nothing_into_the_turn_that_replaced_it(
        self,
    ) -> None:
        """Checks that a stale holder writes nothing into the turn that replaced it."""
        async with self.open_store(running_ttl=1.0) as store:
            await store.claim_turn("s", "old")
            await store.append_as("s", start(1), "old")
            await anyio.sleep(1.5)  # its lease ran out
            await store.claim_turn("s", "new")
            assert not await store.keep_running("s", "old")  # taken: not taken back
            with pytest.raises(LeaseLost):
                await store.append_as("s", delta(1), "old")
            assert not await store.release_turn("s", "old")
            new = await store.append_as("s", start(2), "new")
            events, _ = await store.since("s", None)
        # The old turn's message was ended with an error before the new one began.
        assert [event.event for event in events] == [
            EventType.MESSAGE_START,
            EventType.ERROR,
            EventType.MESSAGE_START,
        ]
        assert b"the replica running the turn stopped" in events[1].data
        assert events[-1] == new

    @_needs(LEASES)
    async def test_a_reader_ends_an_abandoned_turn_with_an_error(self) -> None:
        """Checks that a reader ends an abandoned turn with an error."""
        async with (
            self.open_store(name="lease3", running_ttl=1.0, heartbeat=0.2) as writer,
            self.open_store(name="lease3", running_ttl=1.0, heartbeat=0.2) as reader,
        ):
            await writer.claim_turn("s", "dead")
            sent = [
                await writer.append_as("s", start(1), "dead"),
                await writer.append_as("s", delta(1), "dead"),
            ]
            # The writer stops renewing (its replica died); the reader gets the end.
            with anyio.fail_after(WAIT):
                got = [event async for event in reader.follow("s")]
        assert got[:2] == sent
        assert [event.event for event in got[2:]] == [EventType.ERROR]
        assert got[2].json()["error"]["type"] == "api_error"

    @_needs(LEASES)
    async def test_a_lapsed_lease_nobody_took_is_renewed_by_its_holder(self) -> None:
        """Checks that a lapsed lease nobody took is renewed by its holder."""
        # The broker was out of reach for longer than the lease: nobody could take it.
        async with self.open_store(running_ttl=1.0) as store:
            await store.claim_turn("s", "one")
            sent = [await store.append_as("s", start(1), "one")]
            await anyio.sleep(1.5)  # its lease lapsed
            assert await store.keep_running("s", "one")
            sent.append(await store.append_as("s", delta(1), "one"))
            sent.append(await store.append_as("s", stop(), "one"))
            assert await store.release_turn("s", "one")
            events, _ = await store.since("s", None)
        assert events == sent  # no error: the turn went on

    @_needs(LEASES)
    async def test_a_store_that_just_started_takes_no_lapsed_lease_for_abandoned(
        self,
    ) -> None:
        """Checks that a store that just started takes no lapsed lease for abandoned."""
        # A store cannot tell a dead holder from one that could not reach the broker
        # until it has seen the broker answer for a whole running_ttl itself.
        async with self.open_store(name="lease5", running_ttl=1.0, heartbeat=0.2) as holder:
            await holder.claim_turn("s", "one")
            sent = [await holder.append_as("s", start(1), "one")]
            await anyio.sleep(1.5)  # lapsed
            async with self.open_store(name="lease5", running_ttl=1.0, heartbeat=0.2) as late:
                with pytest.raises(StreamBusy):
                    await late.claim_turn("s", "two")
                got: list[Event] = []

                async def read() -> None:
                    async for event in late.follow("s"):
                        got.append(event)

                with anyio.fail_after(WAIT):
                    async with anyio.create_task_group() as tasks:
                        tasks.start_soon(read)
                        await anyio.sleep(0.6)  # several of the reader's quiet checks
                        assert await holder.keep_running("s", "one")  # taken back
                        sent.append(await holder.append_as("s", delta(1), "one"))
                        sent.append(await holder.append_as("s", stop(), "one"))
                        assert await holder.release_turn("s", "one")
                await late.claim_turn("s", "two")  # released: free
        assert got == sent  # the turn's own end, no error event

    @_needs(LEASES)
    async def test_a_cancel_through_another_store_reaches_the_holder(self) -> None:
        """Checks that a cancel through another store reaches the holder."""
        async with (
            self.open_store(name="lease4") as a,
            self.open_store(name="lease4") as b,
        ):
            assert not await b.request_cancel("s")  # nothing runs
            await a.claim_turn("s", "one")
            asked = anyio.Event()

            def on_cancel() -> None:
                asked.set()

            unwatch = await a.watch_cancel("s", on_cancel)
            try:

                async def holder() -> None:
                    await asked.wait()
                    await a.append_as("s", stop(), "one")
                    await a.release_turn("s", "one")

                with anyio.fail_after(WAIT):
                    async with anyio.create_task_group() as tasks:
                        tasks.start_soon(holder)
                        assert await b.request_cancel("s")
            finally:
                unwatch()
            assert not await b.request_cancel("s")  # ended: nothing runs now
