"""StreamHub: turns apart from subscribers, replay and resume, cancel, failures, limits."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from essessey import (
    Event,
    EventType,
    InMemoryEventStore,
    InMemorySink,
    MessagesNotRetained,
    Publisher,
    StopReason,
    StreamBusy,
    StreamHub,
    StreamNotFound,
    SubscriberLagged,
    TooManySubscribers,
    UnknownEventId,
    check,
    reassemble_events,
    stream_turn,
)
from essessey.hub import Access
from essessey.testing import wait_until
from tests.conftest import Clock
from tests.nats_server import NatsServer
from tests.processes import WAIT
from tests.redis_server import RedisServer

pytestmark = pytest.mark.anyio

"""Seconds any one step of these tests may take before the test fails."""


# -- producers ----------------------------------------------------------------------------


class Scripted:
    """A turn of ``chunks`` text deltas through stream_turn, yielding after each one.

    It can be held before chunk ``hold_at`` (``reached`` is set, then it waits for
    ``release``), and told to ``hang`` there instead: wait until cancelled.
    """

    def __init__(
        self, stream_id: str, chunks: int = 20, *, hold_at: int | None = None, hang: bool = False
    ) -> None:
        self.stream_id = stream_id
        self.chunks = chunks
        self.hold_at = hold_at
        self.hang = hang
        self.reached = anyio.Event()
        self.release = anyio.Event()
        self.finished = False

    async def __call__(self, publisher: Publisher) -> None:
        async with stream_turn(
            publisher, message_id=f"msg-{self.stream_id}", stream_id=self.stream_id, model="m"
        ) as turn:
            text = await turn.text()
            for i in range(self.chunks):
                if i == self.hold_at:
                    self.reached.set()
                    if self.hang:
                        await anyio.sleep_forever()
                    await self.release.wait()
                await text.write(f"w{i} ")
                await anyio.lowlevel.checkpoint()
        self.finished = True

    @property
    def text(self) -> str:
        return "".join(f"w{i} " for i in range(self.chunks))

    async def expected(self) -> list[tuple[str, bytes]]:
        """What it publishes when nothing holds it, without ids."""
        sink = InMemorySink()
        await Scripted(self.stream_id, self.chunks)(Publisher(sink))
        return bare(sink.events)


def bare(events: list[Event]) -> list[tuple[str, bytes]]:
    return [(event.event, event.data) for event in events]


async def published(hub: StreamHub, stream_id: str) -> list[Event]:
    events, known = await hub.store.since(stream_id, None)
    assert known
    return events


async def read_all(events: AsyncIterator[Event]) -> list[Event]:
    with anyio.fail_after(WAIT):
        return [event async for event in events]


async def drain(events: AsyncIterator[Event], into: list[Event]) -> None:
    """Read ``events`` to the end into ``into`` (kept when it raises)."""
    with anyio.fail_after(WAIT):
        async for event in events:
            into.append(event)


async def take(events: AsyncIterator[Event], count: int) -> list[Event]:
    """The first ``count`` events, then the subscription is closed (a client leaving)."""
    got: list[Event] = []
    try:
        with anyio.fail_after(WAIT):
            async for event in events:
                got.append(event)
                if len(got) == count:
                    break
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    return got


async def wait_for(event: anyio.Event) -> None:
    with anyio.fail_after(WAIT):
        await event.wait()


def names(events: list[Event]) -> list[str]:
    return [event.event for event in events]


def assert_unique_ids(events: list[Event]) -> None:
    ids = [event.id for event in events]
    assert None not in ids
    assert len(set(ids)) == len(ids)


# -- running turns ------------------------------------------------------------------------


async def test_a_turn_runs_with_no_subscriber_and_is_replayable() -> None:
    producer = Scripted("s", 30)
    async with StreamHub() as hub:
        await hub.start("s", producer)
        assert hub.running("s")
        with anyio.fail_after(WAIT):
            await hub.wait("s")
        assert not hub.running("s")
        events = await published(hub, "s")
        replay = await read_all(hub.subscribe("s"))
    assert producer.finished
    assert bare(events) == await producer.expected()
    assert_unique_ids(events)
    assert check(events) == []
    parsed = reassemble_events(events)
    assert parsed.complete
    assert parsed.text == producer.text
    assert parsed.stop_reason == StopReason.END_TURN
    assert replay == events


async def test_many_subscribers_get_identical_events() -> None:
    producer = Scripted("s", 200, hold_at=1)
    lists: list[list[Event]] = [[] for _ in range(8)]

    async def subscriber(into: list[Event]) -> None:
        into.extend(await read_all(hub.subscribe("s")))

    async with StreamHub() as hub:
        await hub.start("s", producer)
        await wait_for(producer.reached)
        async with anyio.create_task_group() as tasks:
            for into in lists[:5]:
                tasks.start_soon(subscriber, into)
            await wait_until(lambda: hub.subscriber_count("s") == 5, "five subscribers")
            producer.release.set()
            # Three more join while the producer is running.
            for into in lists[5:]:
                await anyio.lowlevel.checkpoint()
                tasks.start_soon(subscriber, into)
        events = await published(hub, "s")
        assert hub.subscriber_count("s") == 0
    assert bare(events) == await producer.expected()
    for got in lists:
        assert got == events


@pytest.mark.parametrize("position", [1, 2, 5, 12, 13])
async def test_subscribe_with_a_last_id_mid_turn_gets_exactly_the_rest(position: int) -> None:
    producer = Scripted("s", 100, hold_at=10)
    async with StreamHub() as hub:
        await hub.start("s", producer)
        await wait_for(producer.reached)
        so_far = len(await published(hub, "s"))
        assert so_far == 13  # preamble 2, block start, 10 deltas
        first = await take(hub.subscribe("s"), position)
        assert len(first) == position
        assert first[-1].id is not None
        rest: list[Event] = []
        async with anyio.create_task_group() as tasks:

            async def resume() -> None:
                rest.extend(await read_all(hub.subscribe("s", first[-1].id)))

            tasks.start_soon(resume)
            await wait_until(lambda: hub.subscriber_count("s") == 1, "the resumed subscriber")
            producer.release.set()
        events = await published(hub, "s")
    assert first + rest == events
    assert_unique_ids(first + rest)


async def test_a_subscriber_that_leaves_does_not_stop_the_turn() -> None:
    producer = Scripted("s", 50)
    async with StreamHub() as hub:
        await hub.start("s", producer)
        got = await take(hub.subscribe("s"), 3)  # then "disconnects"
        assert hub.subscriber_count("s") == 0
        with anyio.fail_after(WAIT):
            await hub.wait("s")
        events = await published(hub, "s")
    assert got == events[:3]
    assert producer.finished
    parsed = reassemble_events(events)
    assert parsed.complete
    assert parsed.stop_reason == StopReason.END_TURN
    assert parsed.text == producer.text


async def test_cancel_ends_the_turn_with_the_block_closed_and_stop_reason_cancelled() -> None:
    producer = Scripted("s", 50, hold_at=7, hang=True)
    async with StreamHub() as hub:
        await hub.start("s", producer)
        seen: list[Event] = []
        async with anyio.create_task_group() as tasks:

            async def subscriber() -> None:
                seen.extend(await read_all(hub.subscribe("s")))

            tasks.start_soon(subscriber)
            await wait_for(producer.reached)
            with anyio.fail_after(WAIT):
                assert await hub.cancel("s") is True
            assert not hub.running("s")
        events = await published(hub, "s")
        assert await hub.cancel("s") is False  # no turn running any more
        assert await hub.cancel("never-started") is False
    assert seen == events  # the subscriber saw why the turn ended
    assert not producer.finished
    assert check(events) == []
    assert names(events)[-3:] == [
        EventType.CONTENT_BLOCK_STOP,
        EventType.MESSAGE_DELTA,
        EventType.MESSAGE_STOP,
    ]
    parsed = reassemble_events(events)
    assert parsed.stop_reason == StopReason.CANCELLED == "cancelled"
    assert parsed.text == "".join(f"w{i} " for i in range(7))
    assert parsed.complete
    assert parsed.error is None


async def test_cancel_is_not_a_disconnect() -> None:
    left = Scripted("left", 30, hold_at=5)
    cancelled = Scripted("cancelled", 30, hold_at=5, hang=True)
    async with StreamHub() as hub:
        await hub.start("left", left)
        await hub.start("cancelled", cancelled)
        await wait_for(left.reached)
        await wait_for(cancelled.reached)
        assert len(await take(hub.subscribe("left"), 2)) == 2
        assert len(await take(hub.subscribe("cancelled"), 2)) == 2
        assert hub.running("left")  # leaving stopped nothing
        left.release.set()
        with anyio.fail_after(WAIT):
            await hub.cancel("cancelled")
            await hub.wait("left")
        after_leaving = reassemble_events(await published(hub, "left"))
        after_cancel = reassemble_events(await published(hub, "cancelled"))
    assert after_leaving.stop_reason == StopReason.END_TURN
    assert after_leaving.text == left.text
    assert after_cancel.stop_reason == StopReason.CANCELLED
    assert after_cancel.text == "".join(f"w{i} " for i in range(5))


async def test_a_cancel_that_cannot_close_the_block_ends_with_an_error_event() -> None:
    # An empty text block cannot be closed (a client would render a blank card), so the
    # hub ends the message with an error event instead.
    reached = anyio.Event()

    async def producer(publisher: Publisher) -> None:
        await publisher.send_stream_preamble("msg-1", "s", "m")
        await publisher.send_content_block_start_text(0)
        reached.set()
        await anyio.sleep_forever()

    async with StreamHub() as hub:
        await hub.start("s", producer)
        await wait_for(reached)
        with anyio.fail_after(WAIT):
            assert await hub.cancel("s")
        events = await published(hub, "s")
    assert names(events)[-1] == EventType.ERROR
    assert check(events) == []


# -- failing producers ----------------------------------------------------------------------


async def test_a_raw_producer_that_raises_mid_message_ends_with_an_error_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def producer(publisher: Publisher) -> None:
        await publisher.send_stream_preamble("msg-1", "s", "m")
        await publisher.send_content_block_start_text(0)
        await publisher.send_content_block_delta_text(0, "half")
        raise RuntimeError("the model went away")

    with caplog.at_level(logging.ERROR, logger="essessey.hub"):
        async with StreamHub() as hub:
            await hub.start("s", producer)
            events = await read_all(hub.subscribe("s"))
            assert not hub.running("s")
    assert names(events).count(EventType.ERROR) == 1
    assert names(events)[-1] == EventType.ERROR
    assert events[-1].json()["error"]["type"] == "api_error"
    assert check(events) == []
    assert reassemble_events(events).error is not None
    hub_lines = [r.getMessage() for r in caplog.records if r.name == "essessey.hub"]
    [failure] = [line for line in hub_lines if "Traceback" in line]
    # Its message withheld (the source line that raised it is shown, as Python shows it).
    assert failure.splitlines()[-1] == "RuntimeError (message withheld, 19 chars)"


async def test_a_stream_turn_producer_that_raises_sends_exactly_one_error_event() -> None:
    async def producer(publisher: Publisher) -> None:
        async with stream_turn(publisher, message_id="msg-1", stream_id="s", model="m") as turn:
            text = await turn.text()
            await text.write("half")
            raise ValueError("boom")

    async with StreamHub() as hub:
        await hub.start("s", producer)
        events = await read_all(hub.subscribe("s"))
    assert names(events).count(EventType.ERROR) == 1
    assert names(events)[-1] == EventType.ERROR
    assert check(events) == []


async def test_a_producer_that_returns_with_the_message_open_ends_with_an_error_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def producer(publisher: Publisher) -> None:
        await publisher.send_stream_preamble("msg-1", "s", "m")
        await publisher.send_content_block_start_text(0)
        await publisher.send_content_block_delta_text(0, "and then")

    with caplog.at_level(logging.WARNING, logger="essessey.hub"):
        async with StreamHub() as hub:
            await hub.start("s", producer)
            events = await read_all(hub.subscribe("s"))
    assert names(events)[-1] == EventType.ERROR
    assert names(events).count(EventType.ERROR) == 1
    assert check(events) == []
    assert any("still open" in r.getMessage() for r in caplog.records)


async def test_a_producer_that_raises_before_any_event_ends_the_stream() -> None:
    async def producer(publisher: Publisher) -> None:
        await anyio.lowlevel.checkpoint()
        raise RuntimeError("no model")

    async with StreamHub() as hub:
        await hub.start("s", producer)
        assert await read_all(hub.subscribe("s")) == []  # ends, never hangs
        # And the hub still runs other turns.
        await hub.start("t", Scripted("t", 3))
        assert reassemble_events(await read_all(hub.subscribe("t"))).complete


# -- the hub's own rules --------------------------------------------------------------------


async def test_start_on_a_running_stream_raises_stream_busy() -> None:
    producer = Scripted("s", 10, hold_at=2)
    async with StreamHub() as hub:
        await hub.start("s", producer)
        with pytest.raises(StreamBusy):
            await hub.start("s", Scripted("s"))
        producer.release.set()
        with anyio.fail_after(WAIT):
            await hub.wait("s")
        await hub.start("s", Scripted("s", 3))  # free again once it finished
        await hub.wait("s")
        events = await published(hub, "s")
    # The stream now holds both turns, one message each.
    assert names(events).count(EventType.MESSAGE_START) == 2
    assert check(events) == []


async def test_two_concurrent_starts_on_one_stream_run_one_producer() -> None:
    producers = [Scripted("s", 10, hold_at=1), Scripted("s", 10, hold_at=1)]
    outcomes: list[str] = []

    async def start(producer: Scripted) -> None:
        try:
            await hub.start("s", producer)
            outcomes.append("started")
        except StreamBusy:
            outcomes.append("busy")

    async with StreamHub() as hub:
        async with anyio.create_task_group() as tasks:
            for producer in producers:
                tasks.start_soon(start, producer)
        assert sorted(outcomes) == ["busy", "started"]
        for producer in producers:
            producer.release.set()
        with anyio.fail_after(WAIT):
            await hub.wait("s")
        events = await published(hub, "s")
    assert names(events).count(EventType.MESSAGE_START) == 1
    assert check(events) == []


async def test_start_outside_the_hub_raises() -> None:
    hub = StreamHub()
    with pytest.raises(RuntimeError, match="enter the StreamHub"):
        await hub.start("s", Scripted("s"))
    async with hub:
        pass
    with pytest.raises(RuntimeError, match="enter the StreamHub"):
        await hub.start("s", Scripted("s"))


async def test_leaving_the_hub_cancels_running_turns_and_ends_their_messages() -> None:
    producers = [Scripted(f"s{n}", 20, hold_at=3 + n, hang=True) for n in range(3)]
    store = InMemoryEventStore()
    hub = StreamHub(store, shutdown_grace=0)  # no grace: cancelled at once
    with anyio.fail_after(WAIT):
        async with hub:
            for producer in producers:
                await hub.start(producer.stream_id, producer)
            for producer in producers:
                await wait_for(producer.reached)
    for n, producer in enumerate(producers):
        assert not hub.running(producer.stream_id)
        events, _ = await store.since(producer.stream_id, None)
        assert check(events) == []
        parsed = reassemble_events(events)
        assert parsed.complete
        assert parsed.stop_reason == StopReason.CANCELLED
        assert parsed.text == "".join(f"w{i} " for i in range(3 + n))


async def test_a_finished_stream_stays_resumable_until_it_expires(clock: Clock) -> None:
    store = InMemoryEventStore(max_age=60)
    async with StreamHub(store) as hub:
        await hub.start("s", Scripted("s", 10))
        with anyio.fail_after(WAIT):
            await hub.wait("s")
        events = await published(hub, "s")
        clock.now += 59
        assert await read_all(hub.subscribe("s")) == events
        assert await read_all(hub.subscribe("s", events[4].id)) == events[5:]
        clock.now += 2
        with pytest.raises(StreamNotFound):
            await read_all(hub.subscribe("s"))
        with pytest.raises(StreamNotFound):
            await read_all(hub.subscribe("s", events[4].id))
        assert hub.subscriber_count("s") == 0


async def test_an_unknown_last_id_raises_before_any_event() -> None:
    async with StreamHub() as hub:
        await hub.start("s", Scripted("s", 5))
        await hub.wait("s")
        events = await published(hub, "s")
        epoch = str(events[0].id).rpartition("-")[0]
        for bogus in ("nonsense", f"{epoch}-999"):
            got: list[Event] = []
            with pytest.raises(UnknownEventId):
                await drain(hub.subscribe("s", bogus), got)
            assert got == []
        assert hub.subscriber_count("s") == 0
        with pytest.raises(StreamNotFound):
            await read_all(hub.subscribe("nowhere"))


class _CountingSince(InMemoryEventStore):
    """The in-memory store, counting the reads of a stream's whole rest."""

    def __init__(self) -> None:
        super().__init__()
        self.since_calls = 0

    async def since(self, stream_id: str, last_event_id: str | None) -> tuple[list[Event], bool]:
        self.since_calls += 1
        return await super().since(stream_id, last_event_id)


async def test_a_resume_replays_as_it_goes_instead_of_reading_the_rest_first() -> None:
    # A reconnect to a long turn gets its first event without the whole rest of the
    # stream made first: the resume point is checked alone, the follow replays.
    store = _CountingSince()
    async with StreamHub(store) as hub:
        await hub.start("s", Scripted("s", 300))
        with anyio.fail_after(WAIT):
            await hub.wait("s")
        events = await published(hub, "s")
        for cut in (0, 150, len(events) - 1):
            store.since_calls = 0
            subscription = await hub.open("s", events[cut].id)
            assert subscription.head == []
            assert await read_all(aiter(subscription)) == events[cut + 1 :]
            assert store.since_calls == 0
        epoch = str(events[0].id).rpartition("-")[0]
        for bogus in ("nonsense", f"{epoch}-9999"):
            with pytest.raises(UnknownEventId):
                await hub.open("s", bogus)
        # With snapshots on, a far-behind resume is measured first: read as before.
        store.since_calls = 0
        async with StreamHub(store, snapshot_after=100) as snapshotting:
            subscription = await snapshotting.open("s", events[0].id)
            assert len(subscription.head) < len(events) - 1
            assert store.since_calls == 1


async def test_too_many_subscribers() -> None:
    producer = Scripted("s", 10, hold_at=1)
    lists: list[list[Event]] = [[], []]

    async def subscriber(into: list[Event]) -> None:
        into.extend(await read_all(hub.subscribe("s")))

    async with StreamHub(max_subscribers=2) as hub:
        await hub.start("s", producer)
        async with anyio.create_task_group() as tasks:
            for into in lists:
                tasks.start_soon(subscriber, into)
            await wait_until(lambda: hub.subscriber_count("s") == 2, "two subscribers")
            with pytest.raises(TooManySubscribers):
                await read_all(hub.subscribe("s"))
            assert hub.subscriber_count("s") == 2
            producer.release.set()
        assert hub.subscriber_count("s") == 0
        # Room again: a third one is fine now.
        assert await read_all(hub.subscribe("s")) == lists[0] == lists[1]


async def test_a_lagging_subscriber_is_ended_and_resumes_by_id_with_no_gap(
    caplog: pytest.LogCaptureFixture,
) -> None:
    burst = 40
    producer = Scripted("s", 10 + burst, hold_at=4)
    async with StreamHub(max_lag=5) as hub:
        await hub.start("s", producer)
        await wait_for(producer.reached)
        first: list[Event] = []
        subscription = hub.subscribe("s")
        with caplog.at_level(logging.WARNING, logger="essessey.hub"):
            with anyio.fail_after(WAIT):
                async for event in subscription:
                    first.append(event)
                    if len(first) == 3:
                        break
                # It stops reading while the producer runs far ahead.
                producer.release.set()
                await hub.wait("s")
                with pytest.raises(SubscriberLagged):
                    await drain(subscription, first)
        assert hub.subscriber_count("s") == 0
        assert [r.levelno for r in caplog.records if r.name == "essessey.hub"] == [logging.WARNING]
        events = await published(hub, "s")
        # The backlog is far more than max_lag: resuming still makes progress.
        assert len(events) - len(first) > 5
        rest = await read_all(hub.subscribe("s", first[-1].id))
    assert first + rest == events  # 0 lost, 0 duplicated
    assert_unique_ids(first + rest)


async def test_subscriber_count_goes_back_to_zero() -> None:
    producer = Scripted("s", 30, hold_at=5)
    async with StreamHub() as hub:
        await hub.start("s", producer)
        assert hub.subscriber_count("s") == 0
        subscriptions = [hub.subscribe("s") for _ in range(3)]
        for subscription in subscriptions:
            await anext(aiter(subscription))
        assert hub.subscriber_count("s") == 3
        await subscriptions[0].aclose()  # type: ignore[attr-defined]
        assert hub.subscriber_count("s") == 2
        producer.release.set()
        await read_all(subscriptions[1])
        await read_all(subscriptions[2])
        assert hub.subscriber_count("s") == 0
        with pytest.raises(UnknownEventId):
            await read_all(hub.subscribe("s", "bogus"))
        assert hub.subscriber_count("s") == 0


# -- authorization --------------------------------------------------------------------------


async def test_authorized_allows_everything_without_a_hook() -> None:
    hub = StreamHub()
    accesses: tuple[Access, ...] = ("read", "resume", "cancel")
    for access in accesses:
        assert await hub.authorized(object(), "s", access) is True


async def test_authorized_asks_a_sync_hook() -> None:
    asked: list[tuple[Any, str, Access]] = []
    request = object()

    def authorize(request: Any, stream_id: str, access: Access) -> bool:
        asked.append((request, stream_id, access))
        return access != "cancel"

    hub = StreamHub(authorize=authorize)
    assert await hub.authorized(request, "s", "read") is True
    assert await hub.authorized(request, "s", "resume") is True
    assert await hub.authorized(request, "s", "cancel") is False
    assert asked == [(request, "s", "read"), (request, "s", "resume"), (request, "s", "cancel")]


async def test_authorized_awaits_an_async_hook() -> None:
    async def authorize(request: Any, stream_id: str, access: Access) -> bool:
        await anyio.lowlevel.checkpoint()
        return stream_id.startswith(f"{request}-")

    hub = StreamHub(authorize=authorize)
    assert await hub.authorized("alice", "alice-1", "read") is True
    assert await hub.authorized("bob", "alice-1", "read") is False


async def test_authorized_reads_a_truthy_verdict_as_a_bool() -> None:
    # A hook typed loosely by the app (returning a count, a user, None) still works.
    loose: Any = lambda request, stream_id, access: 1  # noqa: E731
    assert await StreamHub(authorize=loose).authorized(None, "s", "read") is True
    loose = lambda request, stream_id, access: None  # noqa: E731
    assert await StreamHub(authorize=loose).authorized(None, "s", "read") is False


@pytest.mark.parametrize(("max_lag", "max_subscribers"), [(0, 10), (-1, 10), (10, 0), (10, -3)])
async def test_limits_must_be_positive(max_lag: int, max_subscribers: int) -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        StreamHub(max_lag=max_lag, max_subscribers=max_subscribers)


@pytest.mark.anyio
@pytest.mark.parametrize("stream_id", ["", "conv.1", "a b", "x" * 257, "tab\there", "a*", ">"])
async def test_start_refuses_a_stream_id_no_client_could_read(stream_id: str) -> None:
    async with StreamHub() as hub:
        with pytest.raises(ValueError, match="not a valid token"):
            await hub.start(stream_id, Scripted(stream_id))
        assert not hub.running(stream_id)
        assert not await hub.store.exists(stream_id)


# -- what the hub learns of its store, and what it raises ----------------------------------


class _ContractOnly:
    """A store with the contract's methods and nothing more (an app's own store): the
    hub must run turns on it without any of the optional capabilities."""

    def __init__(self) -> None:
        self._inner = InMemoryEventStore()
        self.append = self._inner.append
        self.since = self._inner.since
        self.follow = self._inner.follow
        self.open_stream = self._inner.open_stream
        self.close_stream = self._inner.close_stream
        self.clear = self._inner.clear
        self.exists = self._inner.exists


async def test_a_store_with_only_the_contract_runs_turns() -> None:
    store = _ContractOnly()
    hub = StreamHub(store)  # type: ignore[arg-type]  # structurally an EventStore
    async with hub:

        async def turn(publisher: Any) -> None:
            await publisher.send_stream_preamble("msg_1", "s", "m")
            await publisher.send_stream_epilogue("end_turn", 1)

        await hub.start("s", turn)
        await hub.wait("s")
        with anyio.fail_after(WAIT):
            names = [event.event async for event in hub.subscribe("s")]
    assert names[0] == "message_start"
    assert names[-1] == "message_stop"


async def test_the_in_memory_store_is_learnt_as_appending_without_waiting() -> None:
    # Its turns append in a plain call: the store's coroutine append is never awaited.
    awaited: list[str] = []

    class Counting(InMemoryEventStore):
        async def append(self, stream_id: str, event: Event) -> Event:
            awaited.append(event.event)
            return await super().append(stream_id, event)

    store = Counting()
    async with StreamHub(store) as hub:

        async def turn(publisher: Any) -> None:
            await publisher.send_stream_preamble("msg_1", "s", "m")
            await publisher.send_stream_epilogue("end_turn", 1)

        await hub.start("s", turn)
        await hub.wait("s")
    assert awaited == []
    assert len((await store.since("s", None))[0]) == 4


def test_a_store_without_the_contract_is_refused_at_once() -> None:
    with pytest.raises(TypeError, match="not an EventStore"):
        StreamHub(object())  # type: ignore[arg-type]


async def test_an_exception_in_the_hub_s_body_is_raised_as_itself() -> None:
    with pytest.raises(MessagesNotRetained) as caught:
        async with StreamHub():
            raise MessagesNotRetained("nothing whole")
    assert not isinstance(caught.value, BaseExceptionGroup)


async def test_an_exception_in_the_hub_s_body_with_turns_running_is_raised_as_itself() -> None:
    ended = anyio.Event()

    async def turn(publisher: Any) -> None:
        await publisher.send_stream_preamble("msg_1", "s", "m")
        try:
            await anyio.sleep(WAIT)
        finally:
            ended.set()

    async def run() -> None:
        async with StreamHub() as hub:
            await hub.start("s", turn)
            raise KeyError("the app's own")

    with pytest.raises(KeyError):
        await run()
    assert ended.is_set()  # the turn was cancelled on the way out


async def test_an_exception_in_the_lifespan_is_raised_as_itself() -> None:
    hub = StreamHub()
    with pytest.raises(ValueError, match="startup failed"):
        async with hub.lifespan(object()):
            raise ValueError("startup failed")


async def test_a_cancelled_hub_body_is_still_a_cancellation() -> None:
    with anyio.move_on_after(0.01) as scope:
        async with StreamHub():
            await anyio.sleep(WAIT)
    assert scope.cancelled_caught


class _StoresThenHangs:
    """An event store (over an in-memory one) whose append of a ``message_start`` is
    stored and then never returns, as a broker's reply lost in flight: the turn's cancel
    lands after the store took it."""

    def __init__(self) -> None:
        self.inner = InMemoryEventStore()
        self.hung = anyio.Event()

    async def append(self, stream_id: str, event: Event) -> Event:
        stored = await self.inner.append(stream_id, event)
        if event.event == EventType.MESSAGE_START:
            self.hung.set()
            await anyio.sleep_forever()
        return stored

    async def since(self, stream_id: str, last_event_id: str | None) -> Any:
        return await self.inner.since(stream_id, last_event_id)

    def follow(self, stream_id: str, last_event_id: str | None = None, **kw: Any) -> Any:
        return self.inner.follow(stream_id, last_event_id, **kw)

    async def open_stream(self, stream_id: str) -> None:
        await self.inner.open_stream(stream_id)

    async def close_stream(self, stream_id: str) -> None:
        await self.inner.close_stream(stream_id)

    async def clear(self, stream_id: str) -> None:
        await self.inner.clear(stream_id)

    async def exists(self, stream_id: str) -> bool:
        return await self.inner.exists(stream_id)


async def test_a_turn_cancelled_while_its_first_write_is_in_flight_still_ends_its_message() -> None:
    store = _StoresThenHangs()

    async def produce(publisher: Publisher) -> None:
        await publisher.send_stream_preamble("m", "s", "model")

    async with StreamHub(store) as hub:
        await hub.start("s", produce)
        with anyio.fail_after(WAIT):
            await store.hung.wait()
            assert await hub.cancel("s")
        stored = (await store.since("s", None))[0]
    # The message_start the store took is ended: the cancelled turn's own end.
    assert stored[0].event == EventType.MESSAGE_START
    assert stored[-1].event == EventType.MESSAGE_STOP
    assert reassemble_events(stored).stop_reason == StopReason.CANCELLED
    assert check(stored) == []


class _SlowOpen(InMemoryEventStore):
    """A store whose ``open_stream`` answers late, as a networked store's reply may."""

    async def open_stream(self, stream_id: str) -> None:
        await super().open_stream(stream_id)
        await anyio.sleep(0.2)


async def test_a_start_cancelled_before_its_turn_runs_leaves_no_stream_open() -> None:
    # The caller of start (a request whose client left) cancelled after the stream was
    # opened and before the turn ran: the stream is closed again, so a reader of it ends
    # instead of waiting for a turn that never comes, and the id may run a turn later.
    async def turn(publisher: Publisher) -> None:
        await publisher.send_stream_preamble("msg_1", "s", "m")
        await publisher.send_stream_epilogue(StopReason.END_TURN, 0)

    hub = StreamHub(_SlowOpen())
    async with hub:
        with anyio.move_on_after(0.1) as cut:
            await hub.start("s", turn)
        assert cut.cancelled_caught
        assert not hub.running("s")
        with anyio.fail_after(WAIT):
            assert [event async for event in hub.subscribe("s")] == []
            await hub.start("s", turn)
            await hub.wait("s")
        events, _ = await hub.store.since("s", None)
        assert [event.event for event in events][-1] == "message_stop"


async def test_wait_on_one_replica_waits_for_the_turn_running_on_another(
    broker: NatsServer | RedisServer,
) -> None:
    # wait() knew only this hub's turns: a route reading a turn whole after waiting (a
    # non-streamed answer retried on another replica) read it unfinished.
    from tests.test_exclusive import two_stores

    go_on = anyio.Event()

    async def producer(publisher: Publisher) -> None:
        async with stream_turn(publisher, message_id="m1", stream_id="w1", model="m") as turn:
            text = await turn.text()
            await text.write("half ")
            await go_on.wait()
            await text.write("and the rest")

    async with two_stores(broker) as (store_a, store_b):
        with anyio.fail_after(WAIT):
            async with StreamHub(store_a) as hub_a, StreamHub(store_b) as hub_b:
                await hub_a.start("w1", producer)
                async with anyio.create_task_group() as tasks:
                    waited = anyio.Event()

                    async def wait_on_b() -> None:
                        await hub_b.wait("w1")
                        waited.set()

                    tasks.start_soon(wait_on_b)
                    await anyio.sleep(0.2)  # B has found the turn running and follows it
                    assert not waited.is_set()
                    go_on.set()
                await hub_b.wait("w1")  # over: returns at once
                events, _ = await store_b.since("w1", None)
    assert reassemble_events(events).text == "half and the rest"
    assert events[-1].event == EventType.MESSAGE_STOP


@pytest.mark.anyio
async def test_a_finished_turn_s_outcome_label_is_a_stop_reason_the_protocol_names() -> None:
    # A provider's own finish reason passes through as the stop reason: the metric's
    # label counts it as "other", so the label's values stay few and hold no text a
    # provider or a producer chose.
    from essessey.metrics import totals

    async def odd_stop(publisher: Publisher) -> None:
        await publisher.send_stream_preamble("m1", "s", "m")
        await publisher.send_stream_epilogue("weird <marker> reason", 0)

    before = dict(totals.turns_finished)
    async with StreamHub() as hub:
        for n in range(3):
            await hub.start(f"s{n}", odd_stop)
            await hub.wait(f"s{n}")
    after = dict(totals.turns_finished)
    assert after.get("other", 0) == before.get("other", 0) + 3
    assert not [key for key in after if "marker" in key]
