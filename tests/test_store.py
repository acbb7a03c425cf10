"""InMemoryEventStore beyond the conformance suite every store passes (essessey.testing,
run on every store by tests/test_store_conformance.py, which owns the ids, the unknown and
foreign ids, the reference model of eviction, the running-turn rules and the byte budget
per stream): its clock-driven expiry, its bounds' details, follow() and the delivery in
the append."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import anyio
import anyio.lowlevel
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from essessey import (
    Event,
    EventType,
    InMemoryEventStore,
    StoreFull,
    StreamNotFound,
    StreamReset,
    SubscriberLagged,
    UnknownEventId,
)
from essessey.protocol import TEXT_DELTA_PAYLOAD
from essessey.testing import delta, epoch, fill, seq, start, stop, wait_until
from tests.clients import collect
from tests.conftest import Clock
from tests.processes import WAIT

pytestmark = pytest.mark.anyio


def bare(events: list[Event]) -> list[tuple[str, bytes]]:
    return [(event.event, event.data) for event in events]


# -- ids ------------------------------------------------------------------------------


async def test_append_returns_the_event_with_an_id() -> None:
    store = InMemoryEventStore()
    event = delta(1)
    stored = await store.append("s", event)
    assert stored.id
    assert (stored.event, stored.data) == (event.event, event.data)
    assert event.id is None  # the caller's event is not changed


async def test_ids_are_unique_and_increasing_per_stream() -> None:
    store = InMemoryEventStore()
    a = await fill(store, "a", 50)
    b = await fill(store, "b", 50)
    for events in (a, b):
        ids = [event.id for event in events]
        assert len(set(ids)) == len(ids)
        sequences = [seq(event_id) for event_id in ids]
        assert sequences == sorted(sequences)
        assert len(set(sequences)) == len(sequences)
        assert len({epoch(event_id) for event_id in ids}) == 1
    assert not {event.id for event in a} & {event.id for event in b}


async def test_a_client_resumes_by_id_without_parsing_it() -> None:
    store = InMemoryEventStore()
    events = await fill(store, "s", 20)
    for i, event in enumerate(events):
        assert event.id is not None
        replay, known = await store.since("s", event.id)
        assert known
        assert replay == events[i + 1 :]
    # Walking the stream by "since the last one I got" visits every event once.
    walked: list[Event] = []
    last: str | None = None
    while True:
        replay, known = await store.since("s", last)
        assert known
        if not replay:
            break
        walked.append(replay[0])
        last = replay[0].id
    assert walked == events


async def test_since_none_gives_everything() -> None:
    store = InMemoryEventStore()
    events = await fill(store, "s", 7)
    assert await store.since("s", None) == (events, True)


async def test_since_the_last_id_is_empty_and_known() -> None:
    store = InMemoryEventStore()
    events = await fill(store, "s", 3)
    assert await store.since("s", events[-1].id) == ([], True)


# -- unknown ids ------------------------------------------------------------------------


async def test_an_id_from_before_the_stream_expired_is_unknown(clock: Clock) -> None:
    store = InMemoryEventStore(max_age=10)
    old = await fill(store, "s", 5)
    clock.now += 11
    new = await fill(store, "s", 5)  # the same stream id, created anew
    assert epoch(new[0].id) != epoch(old[0].id)
    for event in old:
        assert await store.since("s", event.id) == ([], False)
    assert await store.since("s", None) == (new, True)


# -- the bounds ---------------------------------------------------------------------------


async def test_open_stream_counts_as_an_update_for_max_streams() -> None:
    store = InMemoryEventStore(max_streams=2)
    await fill(store, "a", 1)
    await fill(store, "b", 1)
    await store.open_stream("a")
    await store.open_stream("c")
    assert await store.exists("a")
    assert not await store.exists("b")
    assert await store.exists("c")


async def test_max_age_expires_a_stream_after_its_last_event(clock: Clock) -> None:
    store = InMemoryEventStore(max_age=10)
    events = await fill(store, "s", 3)
    await store.close_stream("s")
    clock.now += 9
    assert await store.since("s", events[0].id) == (events[1:], True)
    await store.append("t", delta(0))
    clock.now += 2  # 11 s after s's last event, 2 s after t's
    assert not await store.exists("s")
    assert await store.exists("t")
    assert await store.since("s", events[0].id) == ([], False)
    assert await store.since("s", None) == ([], False)
    clock.now += 9
    assert not await store.exists("t")
    assert len(store) == 0


async def test_max_age_with_real_time() -> None:
    store = InMemoryEventStore(max_age=0.05)
    await fill(store, "s", 2)
    await anyio.sleep(0.2)
    assert not await store.exists("s")


@pytest.mark.parametrize(
    "options",
    [
        {"max_events_per_stream": 0},
        {"max_events_per_stream": -1},
        {"max_streams": 0},
        {"max_streams": -5},
        {"max_age": 0},
        {"max_age": -0.5},
        {"max_bytes_per_stream": 0},
        {"max_bytes": -1},
    ],
)
async def test_a_bound_of_zero_or_less_raises(options: dict[str, float]) -> None:
    name = next(iter(options))
    with pytest.raises(ValueError, match=name):
        InMemoryEventStore(**options)  # type: ignore[arg-type]


# -- follow -------------------------------------------------------------------------------


async def test_follow_replays_then_goes_live_and_ends_once_closed_and_drained() -> None:
    store = InMemoryEventStore()
    first = await fill(store, "s", 3)
    got: list[Event] = []
    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(collect, store.follow("s"), got)
            await wait_until(lambda: len(got) == 3, "the replay")
            live = [await store.append("s", delta(10 + n)) for n in range(4)]
            await wait_until(lambda: len(got) == 7, "the live events")
            later = await store.append("s", delta(20))
            await store.close_stream("s")  # appended before the close: still delivered
    assert got == [*first, *live, later]


async def test_follow_of_a_closed_stream_ends_and_an_append_reopens_it() -> None:
    store = InMemoryEventStore()
    events = await fill(store, "s", 2)
    await store.close_stream("s")
    with anyio.fail_after(WAIT):
        assert [event async for event in store.follow("s")] == events
        assert [event async for event in store.follow("s", events[-1].id)] == []
        got: list[Event] = []
        async with anyio.create_task_group() as tasks:
            more = await store.append("s", delta(5))  # reopens it
            tasks.start_soon(collect, store.follow("s", events[-1].id), got)
            await wait_until(lambda: len(got) == 1, "the event after the reopening")
            last = await store.append("s", delta(6))
            await store.close_stream("s")
    assert got == [more, last]


async def test_follow_without_an_id_after_eviction_starts_at_a_whole_message() -> None:
    store = InMemoryEventStore(max_events_per_stream=5)
    first = [start(1), delta(1), delta(2), delta(3), stop()]
    second = [start(2), delta(4), delta(5)]
    stored = [await store.append("s", event) for event in [*first, *second]]
    # Retained: delta(3), stop, start(2), delta(4), delta(5).
    await store.close_stream("s")
    with anyio.fail_after(WAIT):
        got = [event async for event in store.follow("s")]
    assert got == stored[5:]
    assert got[0].event == EventType.MESSAGE_START
    # since(None) still gives everything retained, half message included.
    assert await store.since("s", None) == (stored[3:], True)


async def test_follow_without_an_id_and_no_whole_message_retained_starts_live() -> None:
    store = InMemoryEventStore(max_events_per_stream=3)
    await fill(store, "s", 6)  # no message_start retained at all
    got: list[Event] = []
    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(collect, store.follow("s"), got)
            await anyio.wait_all_tasks_blocked()  # the follower waits for an event
            assert got == []
            new = await store.append("s", start(3))
            await store.close_stream("s")
    assert got == [new]


async def test_follow_raises_stream_not_found() -> None:
    store = InMemoryEventStore()
    with pytest.raises(StreamNotFound):
        await anext(aiter(store.follow("nowhere")))


async def test_follow_raises_unknown_event_id_before_any_event() -> None:
    store = InMemoryEventStore(max_events_per_stream=3)
    events = await fill(store, "s", 6)
    for bogus in ("garbage", events[0].id, f"{epoch(events[0].id)}-99"):
        follower = store.follow("s", bogus)
        with pytest.raises(UnknownEventId):
            await anext(aiter(follower))


async def test_follow_raises_subscriber_lagged_past_max_lag() -> None:
    store = InMemoryEventStore()
    events = await fill(store, "s", 2)
    follower = aiter(store.follow("s", max_lag=3))
    assert await anext(follower) == events[0]
    assert await anext(follower) == events[1]
    await fill(store, "s", 3)  # 3 behind: still allowed
    assert await anext(follower)
    await fill(store, "s", 2)  # now 4 behind
    with pytest.raises(SubscriberLagged):
        await anext(follower)


async def test_the_backlog_replayed_on_attaching_is_not_lag() -> None:
    # A follower resuming far behind the head must make progress, not be ended at once.
    store = InMemoryEventStore()
    events = await fill(store, "s", 50)
    await store.close_stream("s")
    with anyio.fail_after(WAIT):
        got = [event async for event in store.follow("s", events[2].id, max_lag=3)]
    assert got == events[3:]


async def test_follow_raises_subscriber_lagged_when_its_position_is_evicted() -> None:
    store = InMemoryEventStore(max_events_per_stream=3)
    events = await fill(store, "s", 3)
    follower = aiter(store.follow("s"))
    assert await anext(follower) == events[0]
    await fill(store, "s", 3)  # events[1] and events[2] are gone
    with pytest.raises(SubscriberLagged):
        await anext(follower)


async def test_follow_raises_stream_reset_when_cleared_while_following() -> None:
    store = InMemoryEventStore()
    await fill(store, "s", 2)
    raised: list[BaseException] = []

    async def follow() -> None:
        try:
            async for _ in store.follow("s"):
                pass
        except StreamReset as exc:
            raised.append(exc)

    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(follow)
            await anyio.wait_all_tasks_blocked()  # the follower waits for a third event
            await store.clear("s")
    assert len(raised) == 1


async def test_a_stream_dropped_while_open_resets_its_followers() -> None:
    # Dropped for max_streams while its producer had not closed it: the follower must not
    # see an end that looks like the turn's.
    store = InMemoryEventStore(max_streams=1)
    await fill(store, "s", 2)
    raised: list[BaseException] = []
    got: list[Event] = []

    async def follow() -> None:
        try:
            await collect(store.follow("s"), got)
        except StreamReset as exc:
            raised.append(exc)

    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(follow)
            await wait_until(lambda: len(got) == 2, "the replay")
            await store.append("other", delta(0))  # drops s
    assert len(raised) == 1


async def test_a_closed_stream_expiring_after_a_follower_drained_it_ends_cleanly(
    clock: Clock,
) -> None:
    store = InMemoryEventStore(max_age=10)
    events = await fill(store, "s", 2)
    follower = aiter(store.follow("s"))
    assert [await anext(follower), await anext(follower)] == events
    await store.close_stream("s")
    clock.now += 11
    assert not await store.exists("s")
    with pytest.raises(StopAsyncIteration):
        await anext(follower)


async def test_open_stream_lets_a_follower_wait_for_the_first_event() -> None:
    store = InMemoryEventStore()
    await store.open_stream("s")
    assert await store.exists("s")
    assert await store.since("s", None) == ([], True)
    got: list[Event] = []
    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(collect, store.follow("s"), got)
            await anyio.wait_all_tasks_blocked()  # the follower waits for an event
            first = await store.append("s", start())
            await wait_until(lambda: len(got) == 1, "the first event")
            await store.close_stream("s")
    assert got == [first]


# -- delivery in the append (follow_delivering) -----------------------------------------


class FnTaker:
    """A taker that hands every event it is offered to ``take(name, data, event_id)``,
    noting which way each came (a text delta offered as such, or any event)."""

    def __init__(self, take: Callable[[str, bytes, str], bool]) -> None:
        self._take = take
        self.texts = 0

    def take(self, name: str, data: bytes, event_id: str) -> bool:
        return self._take(name, data, event_id)

    def take_text(
        self, data: bytes, id_head: bytes, seq: int, index: int, text: str, text_json: bytes
    ) -> bool:
        self.texts += 1
        return self._take("content_block_delta", data, f"{id_head.decode()}{seq}")


@settings(max_examples=150, deadline=None)
@given(
    plan=st.lists(
        st.tuples(
            st.integers(min_value=1, max_value=4),  # events appended at once
            st.booleans(),  # does the reader take the next one offered?
            st.integers(min_value=0, max_value=2),  # checkpoints before the next append
            st.booleans(),  # appended as a Publisher's text deltas (the appender's emit_text)?
        ),
        min_size=1,
        max_size=25,
    ),
    replayed=st.integers(min_value=0, max_value=3),
)
def test_a_follower_that_takes_some_events_in_the_append_gets_each_once_in_order(
    plan: list[tuple[int, bool, int, bool]], replayed: int
) -> None:
    async def main() -> tuple[list[tuple[str, bytes, str]], list[tuple[str, bytes]], int]:
        store = InMemoryEventStore()
        await store.open_stream("s")
        for i in range(replayed):
            await store.append("s", Event("e", b"r%d" % i))
        takes = [take for _, take, _, _ in plan]
        got: list[tuple[str, bytes, str]] = []
        delivered = [0]

        def deliver(name: str, data: bytes, event_id: str) -> bool:
            take = takes.pop(0) if takes else False
            if take:
                got.append((name, data, event_id))
                delivered[0] += 1
            return take

        async def read() -> None:
            async for event in store.follow_delivering("s", taker=FnTaker(deliver)):
                assert event.id is not None
                got.append((event.event, event.data, event.id))

        sent = [("e", b"r%d" % i) for i in range(replayed)]
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(read)
            for step, (count, _, pauses, text) in enumerate(plan):
                for j in range(count):
                    if text:
                        appender = store.appender("s")
                        assert appender is not None
                        chunk = orjson.dumps(str(j))
                        index = 97 * j  # past the indexes whose heads are made once, too
                        sent.append(("content_block_delta", TEXT_DELTA_PAYLOAD % (index, chunk)))
                        appender.emit_text(index, str(j), chunk)
                    else:
                        data = b"%d.%d" % (step, j)
                        sent.append(("e", data))
                        await store.append("s", Event("e", data))
                for _ in range(pauses):
                    await anyio.lowlevel.checkpoint()
            await store.close_stream("s")
        return got, sent, delivered[0]

    got, sent, delivered = anyio.run(main)
    # None lost, none twice, in order, whichever way each went, each with its own name.
    assert [(name, data) for name, data, _ in got] == sent
    # And each with the id the store gave it, taken or read: consecutive from the first.
    seqs = [int(event_id.rsplit("-", 1)[1]) for _, _, event_id in got]
    assert seqs == list(range(1, len(sent) + 1))
    assert delivered <= len(sent) - replayed  # the replay is never offered


@settings(max_examples=100, deadline=None)
@given(
    takes=st.lists(st.lists(st.booleans(), max_size=30), min_size=1, max_size=4),
    plain=st.integers(min_value=0, max_value=2),
    batches=st.lists(st.integers(min_value=1, max_value=5), min_size=1, max_size=10),
    leaves=st.integers(min_value=-1, max_value=3),
)
def test_followers_that_take_and_followers_that_read_each_get_every_event_once(
    takes: list[list[bool]], plain: int, batches: list[int], leaves: int
) -> None:
    # Several followers of one stream at once: some take events in the append (each by
    # its own pattern, falling back to reading), some only read, and one may leave
    # (cancelled while it waits) part-way. Each gets the whole stream, in order.
    async def main() -> tuple[list[list[bytes]], list[bytes]]:
        store = InMemoryEventStore()
        await store.open_stream("s")
        got: list[list[bytes]] = [[] for _ in range(len(takes) + plain)]
        sent: list[bytes] = []

        def taker(n: int) -> FnTaker:
            pattern = list(takes[n])

            def deliver(name: str, data: bytes, event_id: str) -> bool:
                take = pattern.pop(0) if pattern else True
                if take:
                    got[n].append(data)
                return take

            return FnTaker(deliver)

        async def read(n: int) -> None:
            each = taker(n) if n < len(takes) else None
            async for event in store.follow_delivering("s", taker=each):
                got[n].append(event.data)

        async with anyio.create_task_group() as tasks:
            scopes = []
            for n in range(len(got)):
                scope = anyio.CancelScope()
                scopes.append(scope)

                async def run(n: int = n, scope: anyio.CancelScope = scope) -> None:
                    with scope:
                        await read(n)

                tasks.start_soon(run)
            await anyio.wait_all_tasks_blocked()
            for step, count in enumerate(batches):
                if step == leaves and len(got) > 1:
                    scopes[0].cancel()  # the first follower leaves
                    await anyio.wait_all_tasks_blocked()
                for j in range(count):
                    data = b"%d.%d" % (step, j)
                    sent.append(data)
                    await store.append("s", Event("e", data))
                await anyio.wait_all_tasks_blocked()
            await store.close_stream("s")
        if 0 <= leaves < len(batches) and len(got) > 1:
            got = got[1:]  # the one that left has a prefix only
        return got, sent

    got, sent = anyio.run(main)
    for each in got:
        assert each == sent


@pytest.mark.anyio
async def test_a_follower_taking_every_live_event_is_never_woken_for_one() -> None:
    store = InMemoryEventStore()
    await store.open_stream("s")
    await store.append("s", Event("e", b"old"))
    taken: list[bytes] = []
    yielded: list[bytes] = []

    def deliver(name: str, data: bytes, event_id: str) -> bool:
        taken.append(data)
        return True

    async def read() -> None:
        async for event in store.follow_delivering("s", taker=FnTaker(deliver)):
            yielded.append(event.data)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(read)
        await anyio.wait_all_tasks_blocked()  # parked, caught up
        for i in range(5):
            await store.append("s", Event("e", b"%d" % i))
        await store.close_stream("s")
    assert yielded == [b"old"]
    assert taken == [b"0", b"1", b"2", b"3", b"4"]


@pytest.mark.anyio
@pytest.mark.parametrize("text", [False, True], ids=["event", "text-delta"])
@pytest.mark.parametrize("readers", [1, 2])
async def test_a_delivery_that_raises_falls_back_to_waking_the_follower(
    caplog: pytest.LogCaptureFixture, text: bool, readers: int
) -> None:
    # One caught-up reader is offered a text delta on a path of its own: both ways, a
    # taker that raises fails no append, and its follower reads every event itself.
    store = InMemoryEventStore()
    await store.open_stream("s")
    appender = store.appender("s")
    assert appender is not None
    yielded: list[list[bytes]] = [[] for _ in range(readers)]

    def deliver(name: str, data: bytes, event_id: str) -> bool:
        raise RuntimeError("a bug in the reader")

    async def read(into: list[bytes]) -> None:
        async for event in store.follow_delivering("s", taker=FnTaker(deliver)):
            into.append(event.data)

    def append(n: int) -> bytes:
        if text:
            appender.emit_text(0, str(n), orjson.dumps(str(n)))
            return TEXT_DELTA_PAYLOAD % (0, orjson.dumps(str(n)))
        appender.append("e", b"%d" % n)
        return b"%d" % n

    async with anyio.create_task_group() as tasks:
        for into in yielded:
            tasks.start_soon(read, into)
        await anyio.wait_all_tasks_blocked()  # the readers are parked
        sent = [append(0)]  # the writer's append does not fail
        await anyio.wait_all_tasks_blocked()  # the readers took it
        sent += [append(1), append(2)]
        await store.close_stream("s")
    assert yielded == [sent] * readers
    assert "a follower's delivery failed" in caplog.text


# -- a running turn's stream ------------------------------------------------------------


async def test_a_running_stream_is_never_dropped_for_its_age(clock: Clock) -> None:
    store = InMemoryEventStore(max_age=10)
    await store.open_stream("paused")
    await store.append("paused", start())
    clock.now += 60  # a tool call that takes a minute
    assert await store.exists("paused")
    await store.close_stream("paused")
    clock.now += 11
    assert not await store.exists("paused")  # finished: max_age applies


async def test_a_long_turn_s_stream_counts_as_updated_when_it_ends(clock: Clock) -> None:
    # Its appends leave a running stream where it was opened; its end moves it to the
    # newest, so the streams that finished before it go first, for max_streams and for
    # max_age alike.
    store = InMemoryEventStore(max_streams=2, max_age=10)
    await store.open_stream("long")
    await store.append("long", start())
    await fill(store, "short", 1)
    await store.close_stream("short")
    clock.now += 8
    await fill(store, "long", 3)
    await store.close_stream("long")
    await store.open_stream("next")  # one stream over max_streams: the oldest finished goes
    assert not await store.exists("short")
    assert await store.exists("long")
    clock.now += 9  # 17 s after short's last event, 9 s after long's end
    assert await store.exists("long")
    clock.now += 2
    assert not await store.exists("long")


# -- byte budgets -------------------------------------------------------------------------

EVENT_COST = 180  # what the store counts per event beyond its data (store._EVENT_OVERHEAD)


def sized(n: int, size: int = 100) -> Event:
    return Event(EventType.CONTENT_BLOCK_DELTA, b"x" * (size - 6) + b"%06d" % n)


async def test_over_the_total_budget_finished_streams_go_first() -> None:
    cost = 100 + EVENT_COST
    store = InMemoryEventStore(max_bytes=25 * cost)
    await store.open_stream("running")
    for n in range(10):
        await store.append("running", sized(n))
    for name in ("old", "new"):
        for n in range(10):
            await store.append(name, sized(n))
        await store.close_stream(name)
    assert not await store.exists("old")  # finished, updated longest ago: dropped
    assert await store.exists("new")
    events, _ = await store.since("running", None)
    assert len(events) == 10  # the running turn kept all of its events
    assert store.held_bytes <= 25 * cost


async def test_when_running_streams_alone_are_over_budget_the_writer_pays() -> None:
    cost = 100 + EVENT_COST
    store = InMemoryEventStore(max_bytes=15 * cost)
    await store.open_stream("a")
    await store.open_stream("b")
    for n in range(10):
        await store.append("a", sized(n))
    for n in range(10):
        await store.append("b", sized(n))
    a, _ = await store.since("a", None)
    b, _ = await store.since("b", None)
    assert len(a) == 10  # untouched
    assert len(b) == 5  # the stream being appended to lost its oldest
    assert store.held_bytes == 15 * cost


@settings(max_examples=100, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["append", "open", "close", "clear"]),
            st.sampled_from(["a", "b", "c", "d"]),
            st.integers(min_value=1, max_value=400),
        ),
        max_size=80,
    )
)
def test_the_held_bytes_are_what_the_retained_events_hold(
    steps: list[tuple[str, str, int]],
) -> None:
    async def main() -> None:
        store = InMemoryEventStore(
            max_streams=3, max_events_per_stream=6, max_bytes_per_stream=1500, max_bytes=3000
        )
        for action, name, size in steps:
            if action == "append":
                with contextlib.suppress(StoreFull, StreamReset):
                    await store.append(name, sized(size, size + 6))
            elif action == "open":
                with contextlib.suppress(StoreFull):
                    await store.open_stream(name)
            elif action == "close":
                await store.close_stream(name)
            else:
                await store.clear(name)
            held = 0
            for stream_name in "abcd":
                events, _ = await store.since(stream_name, None)
                held += sum(len(event.data) + EVENT_COST for event in events)
                assert len(events) <= 6
            assert store.held_bytes == held
            assert len(store) <= 3

    anyio.run(main)


# -- what the garbage collector sees ------------------------------------------------------


async def test_retained_events_are_not_walked_by_the_garbage_collector() -> None:
    # A full collection visits every tracked object: retained events must not be among
    # them, or a store of a million events makes every full collection pause 4x longer.
    import gc

    store = InMemoryEventStore()
    await store.append("s", delta(0))
    gc.collect()
    before = len(gc.get_objects())
    for n in range(5_000):
        await store.append("s", delta(n))
    gc.collect()
    grown = len(gc.get_objects()) - before
    assert store.held_events == 5_001
    assert grown < 100, f"{grown} tracked objects for 5,000 retained events"
    events, _ = await store.since("s", None)
    assert all(type(event) is Event for event in events)  # readers still get Events
    assert bare(events[1:]) == bare([delta(n) for n in range(5_000)])


async def test_a_long_since_lets_other_tasks_run_and_reads_up_to_the_head_it_was_asked_at() -> None:
    # 12,000 events: read in steps (a snapshot's first read of a long turn), so a live
    # turn appends meanwhile; the read gives the stream as it was when asked.
    store = InMemoryEventStore(max_events_per_stream=20_000)
    events = await fill(store, "s", 12_000)
    appended: list[int] = []

    async def live() -> None:
        for n in range(3):
            await store.append("s", delta(20_000 + n))
            appended.append(n)
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(live)
        got, known = await store.since("s", None)
    assert appended  # the live task ran during the read
    assert known
    assert got == events  # the 12,000 there when asked, in order, nothing more
    later, _ = await store.since("s", got[-1].id)
    assert len(later) == 3  # and a follow-on read gets what came meanwhile


async def test_a_long_since_of_a_stream_cleared_meanwhile_gives_what_it_read() -> None:
    store = InMemoryEventStore(max_events_per_stream=20_000)
    events = await fill(store, "s", 12_000)

    async def clear() -> None:
        await anyio.lowlevel.checkpoint()
        await store.clear("s")

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(clear)
        got, known = await store.since("s", None)
    assert known
    assert 0 < len(got) < len(events)
    assert got == events[: len(got)]  # a prefix, no gap
    assert not await store.exists("s")  # and a follower from its last id is told so
    assert (await store.since("s", got[-1].id)) == ([], False)


@pytest.mark.anyio
async def test_a_turn_s_appender_keeps_the_store_s_rules_once_its_stream_is_closed_or_cleared() -> (
    None
):
    store = InMemoryEventStore()
    assert store.appender("s") is None  # not open: the turn appends as usual
    await store.open_stream("s")
    appender = store.appender("s")
    assert appender is not None
    appender.append("message_start", b"{}")
    appender.emit_text(0, "a", b'"a"')
    first_epoch = epoch((await store.since("s", None))[0][-1].id)
    # Cleared while its turn runs: only a new message may start it again, in a new epoch.
    await store.clear("s")
    with pytest.raises(StreamReset):
        appender.emit_text(0, "b", b'"b"')
    with pytest.raises(StreamReset):
        appender.append("content_block_stop", b"{}")
    appender.append("message_start", b"{}")
    appender.emit_text(0, "c", b'"c"')
    events, known = await store.since("s", None)
    assert known
    assert [e.event for e in events] == ["message_start", "content_block_delta"]
    assert events[1].data == TEXT_DELTA_PAYLOAD % (0, b'"c"')
    assert epoch(events[0].id) != first_epoch
    assert [seq(e.id) for e in events] == [1, 2]
    # Closed: an append after it goes on in the same epoch, as append would.
    await store.close_stream("s")
    appender.append("ping", b"{}")
    events, _ = await store.since("s", None)
    assert [seq(e.id) for e in events] == [1, 2, 3]
