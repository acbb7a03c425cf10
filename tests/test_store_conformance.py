"""One suite for every event store: the in-memory store, JetStream and Redis answer the
same calls the same way, so a hub, a binding or an app can swap one for another.

Each test runs on every backend that has what it needs: all three for ids, ``since``,
``follow``, the count bounds, the byte budgets and the running-turn rules; the two that
replicas share (JetStream and Redis) for the leases. A backend's own behaviour beyond this
(its retries, its wire layout) is tested beside it: tests/test_store.py,
tests/test_jetstream_store.py, tests/test_redis_store.py.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import nats as nats_py
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from essessey import (
    Event,
    EventStore,
    EventType,
    InMemoryEventStore,
    LeaseLost,
    MessagesNotRetained,
    StoreFull,
    StreamBusy,
    StreamNotFound,
    StreamReset,
    SubscriberLagged,
    UnknownEventId,
)
from essessey.bindings.nats import JetStreamEventStore
from essessey.bindings.redis import RedisEventStore
from tests.clients import delta, fill, wait_until
from tests.nats_server import NatsServer, nats_server
from tests.processes import WAIT
from tests.redis_server import RedisServer, redis_server
from tests.test_store import BOGUS_IDS, epoch, seq, start, stop

pytestmark = pytest.mark.anyio

"""Seconds any one step may take before the test fails."""

PER_STREAM = "per-stream bounds"
"""Bounds kept per stream id (counts, bytes, the running turns): every store has them."""

LEASES = "leases"
"""Turn leases and cancel across replicas (the stores shared by replicas)."""

BACKENDS = {
    "memory": {PER_STREAM},
    "jetstream": {PER_STREAM, LEASES},
    "redis": {PER_STREAM, LEASES},
}

_names = itertools.count(1)


def needs(*features: str) -> pytest.MarkDecorator:
    """Run the test only on the backends that have ``features``."""
    return pytest.mark.needs(*features)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("needs")
    wanted = set(marker.args) if marker else set()
    metafunc.parametrize(
        "backend", [name for name, has in BACKENDS.items() if wanted <= has], indirect=True
    )


@pytest.fixture(scope="module")
def nats_for_suite() -> Iterator[NatsServer]:
    with nats_server() as server:
        yield server


@pytest.fixture(scope="module")
def redis_for_suite() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


class Backend:
    """Opens stores of one kind, each on names of its own (a JetStream stream, a Redis
    key prefix), so the tests of a module can share one server."""

    def __init__(self, name: str, server: Any) -> None:
        self.name = name
        self.server = server

    @asynccontextmanager
    async def store(self, **bounds: Any) -> AsyncIterator[Any]:
        """A store with ``bounds`` (the in-memory store's names; ``retain`` = how many
        events a single stream keeps, whatever the backend calls it)."""
        n = bounds.pop("name", None) or next(_names)
        retain = bounds.pop("retain", None)
        if self.name == "memory":
            if retain is not None:
                bounds["max_events_per_stream"] = retain
            yield InMemoryEventStore(**bounds)
        elif self.name == "jetstream":
            if retain is not None:
                bounds["max_events_per_stream"] = retain
            nc = await nats_py.connect(self.server.url, allow_reconnect=False)
            try:
                yield await JetStreamEventStore.connect(
                    nc, stream=f"CONF{n}", prefix=f"conf{n}", **bounds
                )
            finally:
                await nc.close()
        else:
            if retain is not None:
                bounds["max_events_per_stream"] = retain
            bounds.setdefault("heartbeat", 0.5)
            async with RedisEventStore.from_url(
                self.server.url, prefix=f"conf{n}", **bounds
            ) as store:
                yield store


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> Backend:
    name = request.param
    server = None
    if name == "jetstream":
        server = request.getfixturevalue("nats_for_suite")
    elif name == "redis":
        server = request.getfixturevalue("redis_for_suite")
    return Backend(name, server)


async def read_all(store: Any, stream_id: str, last_id: str | None = None) -> list[Event]:
    got: list[Event] = []
    with anyio.fail_after(WAIT):
        async for event in store.follow(stream_id, last_id):
            got.append(event)
    return got


async def take(events: AsyncIterator[Event], count: int) -> list[Event]:
    """The next ``count`` events of ``events``."""
    return [await anext(events) for _ in range(count)]


# -- ids --------------------------------------------------------------------------------


async def test_it_is_an_event_store(backend: Backend) -> None:
    async with backend.store() as store:
        assert isinstance(store, EventStore)


async def test_ids_are_unique_and_increasing_and_resume_exactly(backend: Backend) -> None:
    async with backend.store() as store:
        events = await fill(store, "s", 8)
        assert len({event.id for event in events}) == 8
        assert [(e.event, e.data) for e in events] == [
            (d.event, d.data) for d in map(delta, range(8))
        ]
        assert await store.since("s", None) == (events, True)
        for k, event in enumerate(events):
            assert await store.since("s", event.id) == (events[k + 1 :], True)


async def test_a_stream_never_seen_is_unknown(backend: Backend) -> None:
    async with backend.store() as store:
        assert await store.since("nowhere", None) == ([], False)
        assert await store.since("nowhere", "abcd1234-1") == ([], False)
        assert not await store.exists("nowhere")
        with pytest.raises(StreamNotFound):
            await read_all(store, "nowhere")


@pytest.mark.parametrize("spell", list(BOGUS_IDS.values()), ids=list(BOGUS_IDS))
async def test_a_garbage_or_foreign_id_is_unknown(
    backend: Backend, spell: Callable[[str, int], str]
) -> None:
    async with backend.store() as store:
        events = await fill(store, "s", 5)
        bogus = spell(epoch(events[0].id), seq(events[-1].id))
        assert bogus not in {event.id for event in events}
        assert await store.since("s", bogus) == ([], False)
        with pytest.raises(UnknownEventId):
            await read_all(store, "s", bogus)


async def test_an_id_of_another_stream_is_unknown(backend: Backend) -> None:
    async with backend.store() as store:
        a = await fill(store, "a", 3)
        await fill(store, "b", 3)
        assert await store.since("b", a[0].id) == ([], False)


async def test_an_id_from_before_clear_is_unknown(backend: Backend) -> None:
    async with backend.store() as store:
        old = await fill(store, "s", 5)
        await store.clear("s")
        assert not await store.exists("s")
        assert await store.since("s", None) == ([], False)
        new = await fill(store, "s", 5)
        for event in old:
            assert await store.since("s", event.id) == ([], False)
        assert await store.since("s", new[1].id) == (new[2:], True)


# -- follow -----------------------------------------------------------------------------


async def test_follow_replays_then_goes_live_and_ends_once_closed(backend: Backend) -> None:
    async with backend.store() as store:
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


async def test_follow_from_an_id_and_after_a_reopen(backend: Backend) -> None:
    async with backend.store() as store:
        first = await fill(store, "s", 4)
        await store.close_stream("s")
        assert await read_all(store, "s", first[1].id) == first[2:]
        second = await fill(store, "s", 2, first=4)  # an append reopens it
        await store.close_stream("s")
        assert await read_all(store, "s", first[-1].id) == second


async def test_open_stream_lets_a_follower_wait_for_the_first_event(backend: Backend) -> None:
    async with backend.store() as store:
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


async def test_follow_raises_subscriber_lagged_past_max_lag(backend: Backend) -> None:
    async with backend.store() as store:
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


async def test_the_backlog_replayed_on_attaching_is_not_lag(backend: Backend) -> None:
    async with backend.store() as store:
        await store.open_stream("s")  # (JetStream knows a stream's start by this marker)
        events = await fill(store, "s", 20)
        await store.close_stream("s")
        got: list[Event] = []
        with anyio.fail_after(WAIT):
            async for event in store.follow("s", None, max_lag=2):
                got.append(event)
        assert got == events


async def test_follow_raises_stream_reset_when_cleared_while_following(backend: Backend) -> None:
    async with backend.store() as store:
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


async def test_a_late_reader_starts_at_the_oldest_whole_message(backend: Backend) -> None:
    async with backend.store(retain=15) as store:
        await store.append("s", start(1))
        await fill(store, "s", 10)
        await store.append("s", stop())
        second = [await store.append("s", start(2)), *await fill(store, "s", 5, first=10)]
        await store.close_stream("s")
        got = await read_all(store, "s")
        assert got == second


async def test_a_late_reader_of_a_finished_turn_with_no_whole_message_is_told(
    backend: Backend,
) -> None:
    async with backend.store(retain=5) as store:
        await store.append("s", start(1))
        await fill(store, "s", 20)
        await store.close_stream("s")
        with pytest.raises(MessagesNotRetained):
            await read_all(store, "s")


async def test_a_late_reader_of_a_running_turn_waits_for_the_next_message(
    backend: Backend,
) -> None:
    async with backend.store(retain=5) as store:
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


@needs(PER_STREAM)
async def test_eviction_keeps_an_id_known_while_everything_after_it_is_retained(
    backend: Backend,
) -> None:
    async with backend.store(retain=5) as store:
        events = await fill(store, "s", 12)
        assert await store.since("s", None) == (events[7:], True)
        assert await store.since("s", events[6].id) == (events[7:], True)
        for evicted in events[:6]:
            assert await store.since("s", evicted.id) == ([], False)
        assert await store.since("s", events[11].id) == ([], True)


@needs(PER_STREAM)
async def test_follow_raises_subscriber_lagged_when_its_position_is_trimmed(
    backend: Backend,
) -> None:
    async with backend.store(retain=5) as store:
        events = await fill(store, "s", 3)
        await fill(store, "s", 10, first=3)
        with pytest.raises(UnknownEventId):
            await read_all(store, "s", events[0].id)


@needs(PER_STREAM)
async def test_max_streams_drops_the_finished_stream_updated_longest_ago(
    backend: Backend,
) -> None:
    async with backend.store(max_streams=2) as store:
        a = await fill(store, "a", 2)
        await fill(store, "b", 2)
        await store.append("a", delta(9))
        await fill(store, "c", 2)
        assert await store.exists("a")
        assert not await store.exists("b")
        assert await store.exists("c")
        assert (await store.since("a", a[0].id))[1]


@needs(PER_STREAM)
async def test_a_running_stream_is_never_dropped_to_make_room(backend: Backend) -> None:
    async with backend.store(max_streams=3) as store:
        await store.open_stream("running")
        first = await store.append("running", start())
        for n in range(10):  # finished streams made after it, many more than fit
            await store.append(f"done{n}", start())
            await store.close_stream(f"done{n}")
        assert await store.exists("running")
        assert [await store.exists(f"done{n}") for n in (7, 8, 9)] == [False, True, True]
        second = await store.append("running", delta(1))  # its turn goes on, same epoch
        assert await store.since("running", None) == ([first, second], True)


@needs(PER_STREAM)
async def test_a_store_full_of_running_turns_refuses_another(backend: Backend) -> None:
    async with backend.store(max_streams=2) as store:
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


@needs(PER_STREAM)
async def test_a_running_stream_cleared_is_not_recreated_mid_message(backend: Backend) -> None:
    async with backend.store() as store:
        await store.open_stream("s")
        await store.append("s", start(1))
        await store.clear("s")
        with pytest.raises(StreamReset):
            await store.append("s", delta(1))
        assert not await store.exists("s")
        fresh = await store.append("s", start(2))  # a new message may start it
        assert await store.since("s", None) == ([fresh], True)


@needs(PER_STREAM)
async def test_a_stream_over_its_byte_budget_loses_its_oldest_events(backend: Backend) -> None:
    cost = 100 + 180  # an event's data and what the store counts beside it
    async with backend.store(max_bytes_per_stream=10 * cost) as store:
        events = [
            await store.append("s", Event(EventType.CONTENT_BLOCK_DELTA, b"x" * 94 + b"%06d" % n))
            for n in range(30)
        ]
        assert await store.since("s", None) == (events[-10:], True)
        assert await store.since("s", events[5].id) == ([], False)


@needs(PER_STREAM)
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
    backend: Backend, capacity: int, operations: list[tuple[str, int]]
) -> None:
    async with backend.store(retain=capacity) as store:
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


@needs(LEASES)
async def test_a_claimed_stream_is_busy_for_other_holders(backend: Backend) -> None:
    async with (
        backend.store(name="lease1") as a,
        backend.store(name="lease1") as b,
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


@needs(LEASES)
async def test_a_stale_holder_writes_nothing_into_the_turn_that_replaced_it(
    backend: Backend,
) -> None:
    async with backend.store(running_ttl=1.0) as store:
        await store.claim_turn("s", "old")
        await store.append_as("s", start(1), "old")
        await anyio.sleep(1.5)  # its lease ran out
        await store.claim_turn("s", "new")
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


@needs(LEASES)
async def test_a_reader_ends_an_abandoned_turn_with_an_error(backend: Backend) -> None:
    async with (
        backend.store(name="lease3", running_ttl=1.0, heartbeat=0.2) as writer,
        backend.store(name="lease3", heartbeat=0.2) as reader,
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


@needs(LEASES)
async def test_a_cancel_through_another_store_reaches_the_holder(backend: Backend) -> None:
    async with (
        backend.store(name="lease4") as a,
        backend.store(name="lease4") as b,
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
