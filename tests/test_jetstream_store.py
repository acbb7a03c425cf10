"""JetStreamEventStore against a real nats-server (the ``nats`` fixture): ids, since() and
``known``, retries deduplicated by Nats-Msg-Id, retention, follow(), the hub, and two
stores on two connections as two replicas would use them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any, cast

import anyio
import nats as nats_py
import pytest
from nats import errors as nats_errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import api
from nats.js.client import JetStreamContext

from essessey import (
    Event,
    EventStore,
    EventType,
    JetStreamUnavailable,
    Publisher,
    StoreFull,
    StreamHub,
    StreamNotFound,
    StreamReset,
    SubscriberLagged,
    UnknownEventId,
    check,
    reassemble_events,
    stream_turn,
)
from essessey._nats_py import flush_connection
from essessey._nats_py import ready_push_subscription as _ready_subscription
from essessey.stores.jetstream import CONTROL_HEADER, JetStreamEventStore, _reader, _writer
from essessey.stores.jetstream._reader import Reader, ack_fields, position
from essessey.testing import BOGUS_IDS, delta, fill, seq, start, stop, wait_until
from tests.clients import collect
from tests.nats_server import NatsServer
from tests.processes import WAIT

pytestmark = pytest.mark.anyio

"""Seconds any one step of these tests may take before the test fails."""


def epoch(event_id: str | None) -> str:
    assert event_id is not None
    return event_id.rpartition("-")[0]


@asynccontextmanager
async def connected(server: NatsServer) -> AsyncIterator[Client]:
    nc = await nats_py.connect(server.url, allow_reconnect=False)
    try:
        yield nc
    finally:
        await nc.close()


@asynccontextmanager
async def store_on(server: NatsServer, **options: Any) -> AsyncIterator[JetStreamEventStore]:
    async with connected(server) as nc:
        yield await JetStreamEventStore.connect(nc, **options)


async def drain(events: AsyncIterator[Event]) -> None:
    async for _ in events:
        pass


# -- configuration ----------------------------------------------------------------------


async def test_it_is_an_event_store(nats: NatsServer) -> None:
    async with store_on(nats) as store:
        assert isinstance(store, EventStore)


async def test_setup_configures_retention_and_dedup_and_updates_it(nats: NatsServer) -> None:
    async with connected(nats) as nc:
        store = await JetStreamEventStore.connect(
            nc, stream="EVENTS", prefix="app", max_age=600, max_msgs=5000, duplicate_window=60
        )
        info = await nc.jetstream().stream_info("EVENTS")
        config = info.config
        assert config.subjects == ["app.>"]
        assert config.max_age == 600
        assert config.max_msgs == 5000
        assert config.discard == api.DiscardPolicy.OLD
        assert config.retention == api.RetentionPolicy.LIMITS
        assert config.storage == api.StorageType.FILE
        assert config.duplicate_window == 60
        event = await store.append("s", delta(1))
        # Another replica with other bounds updates the stream; ids stay the same epoch.
        other = await JetStreamEventStore.connect(
            nc, stream="EVENTS", prefix="app", max_age=1200, max_msgs=-1, duplicate_window=60
        )
        config = (await nc.jetstream().stream_info("EVENTS")).config
        assert (config.max_age, config.max_msgs) == (1200, -1)
        assert await other.since("s", None) == ([event], True)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_age": 0}, "max_age"),
        ({"max_age": -1}, "max_age"),
        ({"max_msgs": 0}, "max_msgs"),
        ({"max_msgs": -2}, "max_msgs"),
        ({"duplicate_window": 0}, "duplicate_window"),
        ({"publish_timeout": 0}, "publish_timeout"),
        ({"publish_timeout": 200}, "publish_timeout"),  # beyond the duplicate window
        ({"heartbeat": 0}, "heartbeat"),
        ({"storage": "disk"}, "storage"),
        ({"stream": "a.b"}, "stream"),
        ({"stream": ""}, "stream"),
        ({"prefix": "a.*"}, "prefix"),
        ({"prefix": "a..b"}, "prefix"),
    ],
)
async def test_bad_options_raise(options: dict[str, Any], message: str) -> None:
    nc = Client()  # never connected: the options are checked first
    with pytest.raises(ValueError, match=message):
        JetStreamEventStore(nc, **options)


async def test_events_go_to_the_subjects_a_plain_subscriber_reads(nats: NatsServer) -> None:
    async with store_on(nats, prefix="app.v1") as store, connected(nats) as plain:
        sub = await plain.subscribe("app.v1.conv-1.>")
        await flush_connection(plain)  # nats-py's flush() can overtake the SUB
        await store.open_stream("conv-1")
        stored = await store.append("conv-1", delta(7))
        with anyio.fail_after(WAIT):
            marker: Msg = await sub.next_msg(WAIT)
            msg: Msg = await sub.next_msg(WAIT)
        assert marker.subject == "app.v1.conv-1.__control"
        assert marker.headers is not None
        assert marker.headers[CONTROL_HEADER] == "open"
        assert msg.subject == "app.v1.conv-1.content_block_delta"
        assert msg.data == stored.data
        assert msg.headers is not None
        assert "Nats-Msg-Id" in msg.headers


@pytest.mark.parametrize("bad", ["", "a.b", "*", ">", "a b", "a\tb", "\u00a0x"])
async def test_stream_ids_and_event_names_must_be_tokens(nats: NatsServer, bad: str) -> None:
    async with store_on(nats) as store:
        with pytest.raises(ValueError, match="token"):
            await store.append(bad, delta(1))
        with pytest.raises(ValueError, match="token"):
            await store.append("s", Event(bad, b"{}"))
        with pytest.raises(ValueError, match="token"):
            await store.open_stream(bad)
        with pytest.raises(ValueError, match="reserved"):
            await store.append("s", Event("__control", b"{}"))
        # Reading a stream id that cannot exist is "not found", not an error.
        assert await store.since(bad, None) == ([], False)
        assert not await store.exists(bad)
        with pytest.raises(StreamNotFound):
            await anext(aiter(store.follow(bad)))


# -- ids and since ------------------------------------------------------------------------


async def test_ids_are_unique_and_increasing_per_stream(nats: NatsServer) -> None:
    async with store_on(nats) as store:
        a: list[Event] = []
        b: list[Event] = []
        for n in range(20):  # interleaved: sequences are global, not contiguous
            a.append(await store.append("a", delta(n)))
            b.append(await store.append("b", delta(n)))
        for events in (a, b):
            sequences = [seq(event.id) for event in events]
            assert sequences == sorted(set(sequences))
            assert len({epoch(event.id) for event in events}) == 1
            assert [(e.event, e.data) for e in events] == [
                (delta(n).event, delta(n).data) for n in range(20)
            ]
        assert not {event.id for event in a} & {event.id for event in b}


async def test_since_is_exact_after_every_id(nats: NatsServer) -> None:
    async with store_on(nats) as store:
        events = await fill(store, "s", 12)
        await fill(store, "other", 3)
        for i, event in enumerate(events):
            assert event.id is not None
            assert await store.since("s", event.id) == (events[i + 1 :], True)
        assert await store.since("s", None) == (events, True)
        assert await store.since("s", events[-1].id) == ([], True)


async def test_open_and_close_markers_are_not_events(nats: NatsServer) -> None:
    async with store_on(nats) as store:
        assert not await store.exists("s")
        await store.open_stream("s")
        assert await store.exists("s")
        assert await store.since("s", None) == ([], True)
        events = await fill(store, "s", 3)
        await store.close_stream("s")
        assert await store.exists("s")
        assert await store.since("s", None) == (events, True)
        assert await store.since("s", events[0].id) == (events[1:], True)


async def test_a_stream_never_seen_is_unknown(nats: NatsServer) -> None:
    async with store_on(nats) as store:
        await fill(store, "other", 2)
        assert await store.since("nowhere", None) == ([], False)
        assert not await store.exists("nowhere")
        await store.close_stream("nowhere")  # closing what does not exist does nothing
        assert not await store.exists("nowhere")


async def test_garbage_and_foreign_ids_are_unknown(nats: NatsServer) -> None:
    async with store_on(nats) as store:
        events = await fill(store, "s", 5)
        last = seq(events[-1].id)
        for name, spell in BOGUS_IDS.items():
            bogus = spell(epoch(events[0].id), last)
            assert bogus not in {event.id for event in events}, name
            assert await store.since("s", bogus) == ([], False), name


async def test_an_id_of_another_stream_is_unknown(nats: NatsServer) -> None:
    async with store_on(nats) as store:
        a = await fill(store, "a", 3)
        await fill(store, "b", 3)
        await store.open_stream("c")
        for event in a:
            assert await store.since("b", event.id) == ([], False)
            assert await store.since("c", event.id) == ([], False)


async def test_an_id_from_before_clear_is_unknown(nats: NatsServer) -> None:
    async with store_on(nats) as store:
        old = await fill(store, "s", 5)
        kept = await fill(store, "t", 2)
        await store.clear("s")
        assert not await store.exists("s")
        assert await store.since("s", None) == ([], False)
        new = await fill(store, "s", 5)
        for event in old:
            assert await store.since("s", event.id) == ([], False)
        assert await store.since("s", None) == (new, True)
        assert await store.since("s", new[1].id) == (new[2:], True)
        assert await store.since("t", None) == (kept, True)  # other streams untouched


async def test_a_recreated_jetstream_stream_makes_old_ids_unknown(nats: NatsServer) -> None:
    async with connected(nats) as nc:
        store = await JetStreamEventStore.connect(nc)
        old = await fill(store, "s", 5)
        await nc.jetstream().delete_stream("ESSESSEY")
        assert not await store.exists("s")
        # The next append finds no stream, creates it again, and carries on.
        new = await fill(store, "s", 5)
        assert epoch(new[0].id) != epoch(old[0].id)
        # Sequences start again at 1: the old ids name positions the new stream has.
        assert {seq(e.id) for e in old} & {seq(e.id) for e in new}
        for event in old:
            assert await store.since("s", event.id) == ([], False)
            with pytest.raises(UnknownEventId):
                await anext(aiter(store.follow("s", event.id)))
        assert await store.since("s", new[0].id) == (new[1:], True)
        # A store on another connection agrees.
        other = await JetStreamEventStore.connect(nc)
        assert await other.since("s", new[2].id) == (new[3:], True)
        assert await other.since("s", old[2].id) == ([], False)


async def test_the_servers_cap_keeps_an_id_known_while_everything_after_it_is_retained(
    nats: NatsServer,
) -> None:
    # max_msgs counts every stream id's messages together, oldest first. The last evicted
    # event of a stream id is still known (its successor names it as the message before),
    # as in the in-memory store; older ones are not.
    async with store_on(nats, max_msgs=10) as store:
        s: list[Event] = []
        t: list[Event] = []
        for n in range(8):
            s.append(await store.append("s", delta(n)))
            t.append(await store.append("t", delta(n)))
        # 16 messages, the newest 10 retained: s[3:] and t[3:]
        assert await store.since("s", None) == (s[3:], True)
        assert await store.since("t", None) == (t[3:], True)
        assert await store.since("s", s[2].id) == (s[3:], True)
        assert await store.since("t", t[2].id) == (t[3:], True)
        for evicted in s[:2]:
            assert await store.since("s", evicted.id) == ([], False)
        for evicted in t[:2]:
            assert await store.since("t", evicted.id) == ([], False)
        assert await store.since("s", s[7].id) == ([], True)


async def test_max_age_expires_events(nats: NatsServer) -> None:
    async with store_on(nats, max_age=0.5, duplicate_window=0.5, publish_timeout=0.5) as store:
        events = await fill(store, "s", 2)
        assert await store.since("s", events[0].id) == (events[1:], True)
        for _ in range(int(WAIT / 0.1)):
            if not await store.exists("s"):
                break
            await anyio.sleep(0.1)
        assert not await store.exists("s")
        assert await store.since("s", events[0].id) == ([], False)


# -- retries ------------------------------------------------------------------------------


@pytest.fixture(params=["direct", "js.publish"])
def publishing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How stores made in the test publish: ``direct`` (nats-py's internals, as
    installed: _nats_py.direct_jetstream_publish) or ``js.publish`` (as when they are
    absent)."""
    if request.param == "js.publish":
        monkeypatch.setattr(_writer, "direct_jetstream_publish", lambda nc: None)
    return str(request.param)


def _msg_id(block: bytes) -> str:
    for line in block.decode().split("\r\n"):
        if line.startswith("Nats-Msg-Id: "):
            return line.removeprefix("Nats-Msg-Id: ")
    raise AssertionError("no Nats-Msg-Id in the header block")


class LostAcks:
    """Wraps the store's publish, whichever way it publishes: the first ``lose``
    publishes reach JetStream, but their acks are lost (the caller sees a timeout), as
    when a connection drops after sending. Records each send's msg id and the
    sequence JetStream acked."""

    def __init__(self, store: JetStreamEventStore, lose: int, monkeypatch: pytest.MonkeyPatch):
        self.lose = lose
        self.msg_ids: list[str] = []
        self.seqs: list[int] = []
        direct = store._writer.direct
        if direct is not None:

            async def publish_direct(subject: str, payload: bytes, block: bytes) -> int | None:
                self.msg_ids.append(_msg_id(block))
                seq = await direct(subject, payload, block)
                assert seq is not None
                return self._acked(seq)

            monkeypatch.setattr(store._writer, "direct", publish_direct)
        else:
            publish = store._ctx.js.publish

            async def publish_js(subject: str, payload: bytes, **options: Any) -> api.PubAck:
                self.msg_ids.append(options["headers"]["Nats-Msg-Id"])
                ack: api.PubAck = await publish(subject, payload, **options)
                self._acked(ack.seq)
                return ack

            monkeypatch.setattr(store._ctx.js, "publish", publish_js)

    def _acked(self, seq: int) -> int:
        self.seqs.append(seq)
        if self.lose > 0:
            self.lose -= 1
            raise nats_errors.TimeoutError
        return seq


async def test_a_retried_publish_is_stored_once(
    nats: NatsServer, monkeypatch: pytest.MonkeyPatch, publishing: str
) -> None:
    async with store_on(nats) as store:
        assert (store._writer.direct is not None) == (publishing == "direct")
        first = await store.append("s", delta(0))
        lossy = LostAcks(store, 2, monkeypatch)
        with anyio.fail_after(WAIT):
            retried = await store.append("s", delta(1))
        # Three sends with one msg id; JetStream kept the first and acked the same
        # sequence for the two duplicates.
        assert len(lossy.msg_ids) == 3
        assert len(set(lossy.msg_ids)) == 1
        assert lossy.seqs == [seq(retried.id)] * 3
        later = await store.append("s", delta(2))
        assert await store.since("s", None) == ([first, retried, later], True)
        info = await store._ctx.js.stream_info(store.stream)
        assert info.state.messages == 3


async def test_a_publish_that_never_succeeds_raises_after_publish_timeout(
    nats: NatsServer, monkeypatch: pytest.MonkeyPatch, publishing: str
) -> None:
    async with store_on(nats, publish_timeout=0.3) as store:

        async def unreachable(*args: Any, **options: Any) -> api.PubAck:
            raise nats_errors.TimeoutError

        monkeypatch.setattr(store._ctx.js, "publish", unreachable)
        if store._writer.direct is not None:
            monkeypatch.setattr(store._writer, "direct", unreachable)
        started = anyio.current_time()
        with anyio.fail_after(WAIT), pytest.raises(JetStreamUnavailable):
            await store.append("s", delta(0))
        assert 0.3 <= anyio.current_time() - started < 3


async def test_append_on_a_closed_connection_raises_at_once(nats: NatsServer) -> None:
    async with connected(nats) as nc:
        store = await JetStreamEventStore.connect(nc)
        await nc.close()
        with anyio.fail_after(WAIT), pytest.raises(JetStreamUnavailable):
            await store.append("s", delta(0))


# -- follow -------------------------------------------------------------------------------


async def test_follow_replays_then_goes_live_and_ends_once_closed(nats: NatsServer) -> None:
    async with store_on(nats) as store:
        await store.open_stream("s")
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


async def test_follow_after_an_id_and_reopening(nats: NatsServer) -> None:
    async with store_on(nats) as store:
        await store.open_stream("s")
        events = await fill(store, "s", 4)
        await store.close_stream("s")
        with anyio.fail_after(WAIT):
            assert [e async for e in store.follow("s")] == events
            assert [e async for e in store.follow("s", events[1].id)] == events[2:]
            assert [e async for e in store.follow("s", events[-1].id)] == []
            got: list[Event] = []
            async with anyio.create_task_group() as tasks:
                more = await store.append("s", delta(5))  # reopens it
                tasks.start_soon(collect, store.follow("s", events[-1].id), got)
                await wait_until(lambda: len(got) == 1, "the event after the reopening")
                last = await store.append("s", delta(6))
                await store.close_stream("s")
        assert got == [more, last]


async def test_follow_without_an_id_starts_at_a_whole_message(nats: NatsServer) -> None:
    # max_msgs counts every message of the JetStream stream, markers included.
    async with store_on(nats, max_msgs=6) as store:
        first = [start(1), delta(1), delta(2), delta(3), stop()]
        second = [start(2), delta(4), delta(5)]
        stored = [await store.append("s", event) for event in [*first, *second]]
        await store.close_stream("s")  # retained: delta(3), stop, start(2), ..., close
        with anyio.fail_after(WAIT):
            got = [event async for event in store.follow("s")]
        assert got == stored[5:]
        assert await store.since("s", None) == (stored[3:], True)  # half message too


async def test_follow_without_an_id_and_no_whole_message_starts_live(
    nats: NatsServer,
) -> None:
    async with store_on(nats, max_msgs=3) as store:
        await fill(store, "s", 6)  # no open marker and no message_start retained
        got: list[Event] = []
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(collect, store.follow("s"), got)
                await anyio.sleep(0.3)
                assert got == []
                new = await store.append("s", start(3))
                await wait_until(lambda: len(got) == 1, "the live event")
                await store.close_stream("s")
        assert got == [new]


async def test_open_stream_lets_a_follower_wait_for_the_first_event(nats: NatsServer) -> None:
    async with store_on(nats) as store:
        await store.open_stream("s")
        got: list[Event] = []
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(collect, store.follow("s"), got)
                await anyio.sleep(0.2)
                first = await store.append("s", delta(0))  # not a message_start: still whole
                await wait_until(lambda: len(got) == 1, "the first event")
                await store.close_stream("s")
        assert got == [first]


async def test_follow_raises_before_any_event(nats: NatsServer) -> None:
    async with store_on(nats, max_msgs=3) as store:
        with pytest.raises(StreamNotFound):
            await anext(aiter(store.follow("nowhere")))
        with pytest.raises(StreamNotFound):
            await anext(aiter(store.follow("nowhere", "abc-1")))
        events = await fill(store, "s", 6)
        await fill(store, "other", 1)
        for bogus in ("garbage", events[0].id, f"{epoch(events[0].id)}-99", events[2].id):
            # events[2] and [3] are evicted now ("other" pushed [3] out): a gap after [2]
            with pytest.raises(UnknownEventId):
                await anext(aiter(store.follow("s", bogus)))
        # events[3] is gone too, but everything after it is retained: resumable.
        follower = store.follow("s", events[3].id)
        assert await anext(aiter(follower)) == events[4]
        await follower.aclose()


async def test_follow_raises_subscriber_lagged_past_max_lag(nats: NatsServer) -> None:
    async with connected(nats) as nc:
        store = await JetStreamEventStore.connect(nc)
        await store.open_stream("s")
        events = await fill(store, "s", 2)
        follower = store.follow("s", max_lag=3)
        with anyio.fail_after(WAIT):
            assert await anext(follower) == events[0]
            assert await anext(follower) == events[1]
            await fill(store, "s", 2)  # 2 behind: allowed
            assert await anext(follower)
            assert await anext(follower)
            await fill(store, "s", 12)  # far behind
            await _delivered_up_to_last(nc, store.stream_config().name)  # to it, not taken
            with pytest.raises(SubscriberLagged):
                await anext(follower)
        await follower.aclose()


async def _delivered_up_to_last(nc: Any, stream: str) -> None:
    """Until the server has delivered the last message of ``stream`` to every consumer
    of it (it is then in the client's queue): the follower's ordered consumer included."""
    js = nc.jetstream()
    target = (await js.stream_info(stream)).state.last_seq
    while True:
        infos = await js.consumers_info(stream)
        if infos and all(
            info.delivered is not None
            and info.delivered.stream_seq is not None
            and info.delivered.stream_seq >= target
            for info in infos
        ):
            return
        await anyio.sleep(0.01)


async def test_the_backlog_replayed_on_attaching_is_not_lag(nats: NatsServer) -> None:
    async with store_on(nats) as store:
        events = await fill(store, "s", 50)
        await store.close_stream("s")
        with anyio.fail_after(WAIT):
            got = [event async for event in store.follow("s", events[2].id, max_lag=3)]
        assert got == events[3:]


async def test_follow_raises_subscriber_lagged_when_its_backlog_is_evicted(
    nats: NatsServer,
) -> None:
    # The server pushes a flow-control window of the backlog (about 2 MB) to the client
    # and keeps the rest until the reader takes it: evicting some of that rest is a gap,
    # seen as a drop in num_pending.
    async with store_on(nats, max_msgs=80) as store:
        await store.open_stream("s")
        big = Event(EventType.CONTENT_BLOCK_DELTA, b'"%s"' % (b"x" * 131072))
        first = await store.append("s", big)
        for _ in range(59):
            await store.append("s", big)
        follower = aiter(store.follow("s"))
        with anyio.fail_after(WAIT):
            assert await anext(follower) == first
            await fill(store, "other", 50)  # evicts the stream's first 50 messages
            await store.close_stream("s")
            with pytest.raises(SubscriberLagged, match="evicted"):
                await drain(follower)


async def test_follow_raises_stream_reset_when_cleared_while_following(
    nats: NatsServer,
) -> None:
    async with store_on(nats) as store:
        await store.open_stream("s")
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
                await store.clear("s")
                with pytest.raises(StreamReset):  # the cleared turn's tail is refused
                    await store.append("s", delta(2))
                # A new life, begun by a new message: the follower must not see it.
                await store.append("s", start(2))
                await fill(store, "s", 2)
        assert len(raised) == 1
        assert len(got) == 2


async def test_follow_raises_stream_reset_when_the_jetstream_stream_is_deleted(
    nats: NatsServer,
) -> None:
    async with connected(nats) as nc:
        store = await JetStreamEventStore.connect(nc, heartbeat=0.2)
        await store.open_stream("s")
        await fill(store, "s", 2)
        got: list[Event] = []
        with anyio.fail_after(WAIT):
            follower = store.follow("s")
            async with anyio.create_task_group() as tasks:

                async def follow() -> None:
                    with pytest.raises(StreamReset):
                        await collect(follower, got)

                tasks.start_soon(follow)
                await wait_until(lambda: len(got) == 2, "the replay")
                await nc.jetstream().delete_stream("ESSESSEY")


# -- how a follower takes its messages ------------------------------------------------------
#
# _Reader.next takes its messages straight from the push subscription's queue, and waits
# on that queue when it is empty (nats-py's next_msg costs a task, a uuid and a wait_for
# each), and reads the stream sequence and num_pending from the reply subject
# (msg.metadata builds two dataclasses and a datetime each). Both rest on nats-py
# internals, with next_msg and msg.metadata as the fallbacks: the tests below run both
# ways.

ACK_REPLIES = [
    "$JS.ACK.ESSESSEY.c1.1.42.7.1700000000000000000.5",  # 9 tokens
    "$JS.ACK._.ACCHASH.ESSESSEY.c1.1.42.7.1700000000000000000.5.r4nd",  # 12, no domain
    "$JS.ACK.hub.ACCHASH.ESSESSEY.c1.2.42.7.1700000000000000000.0.r4nd",  # 12, a domain
    "$JS.ACK.hub.ACCHASH.ESSESSEY.c1.2.42.7.1700000000000000000.5",  # 11
    "$JS.ACK.hub.ACCHASH.ESSESSEY.c1.2.42.7.1700000000000000000.5.r4nd.more",  # 13
    "$JS.ACK.ESSESSEY.c1.1.18446744073709551615.9.1700000000000000000.123456789012",
]


@pytest.mark.parametrize("reply", ACK_REPLIES)
async def test_the_reply_subject_gives_what_metadata_gives(reply: str) -> None:
    meta = Msg.Metadata._from_reply(reply)
    assert ack_fields(reply) == (meta.consumer, meta.sequence.stream, meta.num_pending)
    msg = Msg(_client=cast(Any, None), reply=reply)
    assert position(msg) == (meta.consumer, meta.sequence.stream, meta.num_pending)
    assert msg._metadata is None  # read from the tokens: no metadata built


@pytest.mark.parametrize(
    "reply",
    [
        "",
        "_INBOX.abc",
        "$JS.ACK.ESSESSEY.c1.1.42.7.1700000000000000000",  # 8 tokens
        "$JS.ACK.x.ESSESSEY.c1.1.42.7.1700000000000000000.5",  # 10 tokens
        "$JS.NAK.ESSESSEY.c1.1.42.7.1700000000000000000.5",
        "JS.ACK.ESSESSEY.c1.1.42.7.1700000000000000000.5",
        "$JS.ACK.ESSESSEY.c1.1.x.7.1700000000000000000.5",
        "$JS.ACK.ESSESSEY.c1.1..7.1700000000000000000.5",
        "$JS.ACK.ESSESSEY.c1.1.+42.7.1700000000000000000.5",
        "$JS.ACK.ESSESSEY.c1.1.42.7.1700000000000000000.-5",
        "$JS.ACK.ESSESSEY.c1.1.4\u00b2.7.1700000000000000000.5",  # isdigit(), not int()
        "$JS.ACK.ESSESSEY.c1.1.\u0664\u0662.7.1700000000000000000.5",  # non-ASCII digits
        "$JS.ACK._.ACCHASH.ESSESSEY.c1.1.42.7.1700000000000000000.x.r4nd",
    ],
)
async def test_an_unexpected_reply_subject_is_left_to_metadata(reply: str) -> None:
    assert ack_fields(reply) is None


async def test_the_position_falls_back_to_metadata() -> None:
    # Digits int() reads but the reply-subject parser refuses: msg.metadata decides.
    msg = Msg(_client=cast(Any, None), reply="$JS.ACK.S.c1.1.\u0664\u0662.7.17.5")
    assert position(msg) == ("c1", 42, 5)
    assert msg._metadata is not None
    for reply in ("", "_INBOX.abc"):  # not a JetStream message: as msg.metadata raises
        with pytest.raises(nats_errors.NotJSMessageError):
            position(Msg(_client=cast(Any, None), reply=reply))


def _internals() -> tuple[SimpleNamespace, SimpleNamespace, SimpleNamespace]:
    queue: asyncio.Queue[Msg] = asyncio.Queue()
    jsi = SimpleNamespace(_active=True, _fciseq=0, _fcr=None, get_js_delivered=lambda: 0)
    inner = SimpleNamespace(_pending_queue=queue, _cb=None, _pending_size=0, _jsi=jsi)
    return SimpleNamespace(_sub=inner, _pending_queue=queue), inner, jsi


@pytest.mark.parametrize(
    ("where", "name"),
    [
        ("sub", "_sub"),
        ("sub", "_pending_queue"),
        ("inner", "_pending_queue"),
        ("inner", "_pending_size"),
        ("inner", "_jsi"),
        ("jsi", "_active"),
        ("jsi", "_fciseq"),
        ("jsi", "_fcr"),
        ("jsi", "get_js_delivered"),
    ],
)
async def test_queued_messages_are_taken_only_with_every_internal_in_place(
    where: str, name: str
) -> None:
    sub, inner, jsi = _internals()
    assert _ready_subscription(sub) is inner
    delattr({"sub": sub, "inner": inner, "jsi": jsi}[where], name)
    assert _ready_subscription(sub) is None


async def test_queued_messages_are_not_taken_from_another_layout() -> None:
    sub, inner, _ = _internals()
    sub._pending_queue = asyncio.Queue()  # not the queue pending_msgs counts
    assert _ready_subscription(sub) is None
    sub, inner, _ = _internals()
    inner._cb = print  # a callback subscription: its own task takes the messages
    assert _ready_subscription(sub) is None
    sub, inner, _ = _internals()
    inner._pending_size = None
    assert _ready_subscription(sub) is None
    assert _ready_subscription(object()) is None


@pytest.fixture(params=["queued", "next_msg"])
def reading(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How followers take their messages: ``queued`` (nats-py's internals, as installed)
    or ``next_msg`` (as when they are absent). The list counts next_msg calls."""
    if request.param == "next_msg":
        monkeypatch.setattr(_reader, "ready_push_subscription", lambda sub: None)
    calls = [0]
    next_msg = JetStreamContext.PushSubscription.next_msg

    async def counting(self: JetStreamContext.PushSubscription, *args: Any) -> Msg:
        calls[0] += 1
        return await next_msg(self, *args)

    monkeypatch.setattr(JetStreamContext.PushSubscription, "next_msg", counting)
    return calls


async def test_follow_takes_every_message_once_either_way(
    nats: NatsServer, reading: list[int], request: pytest.FixtureRequest
) -> None:
    async with store_on(nats) as store:
        await store.open_stream("s")
        backlog = await fill(store, "s", 300)
        got: list[Event] = []
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(collect, store.follow("s"), got)
                await wait_until(lambda: len(got) == 300, "the replay")
                replay_calls = reading[0]
                live = [await store.append("s", delta(1000 + n)) for n in range(20)]
                await store.close_stream("s")
        assert got == [*backlog, *live]
        if request.node.callspec.params["reading"] == "queued":
            # Replayed or live, every message is taken from the queue, and the follower
            # waits on it when caught up: next_msg (a task per call) is never called.
            assert reading[0] == replay_calls == 0
        else:
            assert replay_calls >= 302  # every message, markers included


async def test_follow_answers_flow_control_either_way(
    nats: NatsServer, reading: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A backlog of several flow-control windows (about 2 MB each): the server sends no
    # more than a window until the client replies. nats-py's own reply task (every
    # 0.25 s) is off here, and the heartbeat (which repeats a request) is rare, so the
    # replay finishes in time only when taking a message sends the reply it waited for.
    async def off(self: object) -> None:
        return None

    monkeypatch.setattr(JetStreamContext._JSI, "check_flow_control_response", off)
    async with store_on(nats, heartbeat=60.0) as store:
        await store.open_stream("s")
        big = Event(EventType.CONTENT_BLOCK_DELTA, b'"%s"' % (b"x" * 65536))
        backlog = [await store.append("s", big) for _ in range(160)]  # about 10 MB
        await store.close_stream("s")
        with anyio.fail_after(WAIT):
            got = [event async for event in store.follow("s")]
        assert got == backlog


async def test_a_reader_keeps_the_subscription_accounts_either_way(
    nats: NatsServer, reading: list[int], request: pytest.FixtureRequest
) -> None:
    # What next_msg does with a message it takes (the bytes held, task_done for a drain)
    # is done for the messages taken from the queue too.
    async with store_on(nats) as store:
        await store.open_stream("s")
        events = await fill(store, "s", 50)
        await store.close_stream("s")
        epoch = await store._ctx.current_epoch()
        assert epoch is not None
        reader = Reader(store._ctx, "s", epoch)
        try:
            assert await reader.open(None) == 52
            queued = request.node.callspec.params["reading"] == "queued"
            assert (reader.ready is not None) == queued
            seqs: list[int] = []
            with anyio.fail_after(WAIT):
                while not seqs or reader.pending:
                    msg = await reader.next(WAIT)
                    assert msg is not None
                    seqs.append(reader.seq)
                sub = reader.sub
                assert sub is not None
                assert (sub.pending_msgs, sub.pending_bytes) == (0, 0)
                assert reader.lag == 0
                await cast(Any, sub).drain()  # waits until every message taken is done
            assert seqs[1:-1] == [seq(event.id) for event in events]
            assert len(seqs) == reader.count == 52
        finally:
            await reader.close()


async def test_a_reader_whose_consumer_is_lost_is_not_caught_up_and_does_not_raise(
    nats: NatsServer,
) -> None:
    # A server that restarted has lost the reader's ephemeral consumer: asked whether it
    # is caught up, the reader cannot tell yet (it recreates the consumer once the
    # connection is back); a resume read through it must not fail with NotFoundError.
    async with store_on(nats) as store:
        await store.open_stream("s")
        await fill(store, "s", 3)
        epoch = await store._ctx.current_epoch()
        assert epoch is not None
        reader = Reader(store._ctx, "s", epoch)
        try:
            await reader.open(None)
            sub = reader.sub
            assert sub is not None
            name = (await sub.consumer_info()).name
            await store._ctx.js.delete_consumer(store.stream, name)
            with anyio.fail_after(WAIT):
                assert await reader.caught_up() is False
        finally:
            await reader.close()


async def _consumers(nc: Client) -> list[str]:
    return [info.name for info in await nc.jetstream().consumers_info("ESSESSEY")]


async def _new_consumer(nc: Client, old: str) -> str:
    for _ in range(int(WAIT / 0.05)):
        names = await _consumers(nc)
        if names and old not in names:
            return names[0]
        await anyio.sleep(0.05)
    pytest.fail("the ordered consumer was not recreated")


async def test_follow_survives_losing_its_consumer_mid_backlog_either_way(
    nats: NatsServer, reading: list[int]
) -> None:
    # Heartbeats keep an idle follower's consumer; when it is deleted they stop, and
    # nats-py recreates the ordered consumer after the last message it received, while
    # messages it received before are still waiting to be taken.
    async with connected(nats) as nc:
        store = await JetStreamEventStore.connect(nc, heartbeat=0.2)
        await store.open_stream("s")
        backlog = await fill(store, "s", 200)
        follower = store.follow("s")
        got: list[Event] = []
        with anyio.fail_after(WAIT):
            got += [await anext(follower) for _ in range(10)]
            [consumer] = await _consumers(nc)
            await anyio.sleep(1.0)  # five heartbeats: the same consumer all along
            assert await _consumers(nc) == [consumer]
            await nc.jetstream().delete_consumer("ESSESSEY", consumer)
            await _new_consumer(nc, consumer)
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(collect, follower, got)
                live = [await store.append("s", delta(1000 + n)) for n in range(20)]
                await store.close_stream("s")
        assert got == [*backlog, *live]


async def test_a_server_restart_with_messages_queued_loses_and_duplicates_nothing(
    nats: NatsServer, reading: list[int]
) -> None:
    options: dict[str, Any] = {"reconnect_time_wait": 0.1, "max_reconnect_attempts": -1}
    producer = await nats_py.connect(nats.url, **options)
    reader = await nats_py.connect(nats.url, **options)
    try:
        store = await JetStreamEventStore.connect(producer, heartbeat=0.3)
        other = await JetStreamEventStore.connect(reader, heartbeat=0.3)
        await store.open_stream("s")
        sent = await fill(store, "s", 200)
        follower = other.follow("s")
        got: list[Event] = []
        with anyio.fail_after(WAIT):
            got += [await anext(follower) for _ in range(10)]  # the rest is queued
            await anyio.to_thread.run_sync(nats.restart)
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(collect, follower, got)
                sent += [await store.append("s", delta(1000 + n)) for n in range(30)]
                await store.close_stream("s")
        assert got == sent
    finally:
        await producer.close()
        await reader.close()


# -- the hub, and two replicas -------------------------------------------------------------


class Turn:
    """A turn of ``chunks`` text deltas; it waits for ``release`` before chunk ``hold_at``."""

    def __init__(self, stream_id: str, chunks: int = 30, hold_at: int = 10) -> None:
        self.stream_id = stream_id
        self.chunks = chunks
        self.hold_at = hold_at
        self.reached = anyio.Event()
        self.release = anyio.Event()

    async def __call__(self, publisher: Publisher) -> None:
        async with stream_turn(
            publisher, message_id=f"msg-{self.stream_id}", stream_id=self.stream_id, model="m"
        ) as turn:
            text = await turn.text()
            for i in range(self.chunks):
                if i == self.hold_at:
                    self.reached.set()
                    await self.release.wait()
                await text.write(f"w{i} ")

    @property
    def text(self) -> str:
        return "".join(f"w{i} " for i in range(self.chunks))


async def test_a_hub_runs_a_turn_on_the_jetstream_store(nats: NatsServer) -> None:
    async with store_on(nats) as store:
        turn = Turn("conv-1", hold_at=-1)
        with anyio.fail_after(WAIT):
            async with StreamHub(store) as hub:
                await hub.start("conv-1", turn)
                got = [event async for event in hub.subscribe("conv-1")]
                await hub.wait("conv-1")
        assert check(got) == []
        assert reassemble_events(got).text == turn.text
        assert got[0].event == EventType.MESSAGE_START
        assert got[-1].event == EventType.MESSAGE_STOP
        assert len({event.id for event in got}) == len(got)
        assert await store.since("conv-1", None) == (got, True)


async def test_two_replicas_follow_and_resume_exactly(nats: NatsServer) -> None:
    # Two connections, two stores, two hubs on one JetStream stream: the turn runs on A.
    async with store_on(nats) as store_a, store_on(nats) as store_b:
        turn = Turn("conv-9", chunks=40, hold_at=15)
        live_b: list[Event] = []
        with anyio.fail_after(WAIT):
            async with StreamHub(store_a) as hub_a, StreamHub(store_b) as hub_b:
                await hub_a.start("conv-9", turn)
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(collect, hub_b.subscribe("conv-9"), live_b)
                    await turn.reached.wait()
                    # A reader on A drops mid-turn...
                    dropped: list[Event] = []
                    async for event in hub_a.subscribe("conv-9"):
                        dropped.append(event)
                        if len(dropped) == 8:
                            break
                    turn.release.set()
                    # ...and resumes on B with the last id it got from A.
                    rest = [e async for e in hub_b.subscribe("conv-9", dropped[-1].id)]
                await hub_a.wait("conv-9")
        full, known = await store_b.since("conv-9", None)
        assert known
        assert await store_a.since("conv-9", None) == (full, True)
        assert check(full) == []
        assert reassemble_events(full).text == turn.text
        assert live_b == full  # followed live through B: nothing lost, nothing twice
        assert dropped + rest == full  # resumed through B from A's id: exact


async def test_a_server_restart_mid_turn_loses_and_duplicates_nothing(nats: NatsServer) -> None:
    # File storage: the stream survives; the appends that fail while the server is away
    # are retried with their msg ids, and the follower's consumer is recreated.
    options: dict[str, Any] = {"reconnect_time_wait": 0.1, "max_reconnect_attempts": -1}
    producer = await nats_py.connect(nats.url, **options)
    reader = await nats_py.connect(nats.url, **options)
    try:
        store = await JetStreamEventStore.connect(producer, heartbeat=0.5)
        other = await JetStreamEventStore.connect(reader, heartbeat=0.5)
        await store.open_stream("s")
        sent: list[Event] = []
        got: list[Event] = []
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(collect, other.follow("s"), got)
                for n in range(60):
                    if n == 30:
                        await anyio.to_thread.run_sync(nats.restart)
                    sent.append(await store.append("s", delta(n)))
                await store.close_stream("s")
        assert got == sent
        assert await other.since("s", None) == (sent, True)
    finally:
        await producer.close()
        await reader.close()


async def test_a_live_reader_resumes_within_2_s_of_a_quick_server_restart(
    nats: NatsServer,
) -> None:
    # The default heartbeat: the follower's ephemeral consumer dies with the server, and
    # waiting for missed heartbeats to tell would leave the reader idle for several of
    # them; the reader must be back soon after the server is.
    options: dict[str, Any] = {"reconnect_time_wait": 0.1, "max_reconnect_attempts": -1}
    producer = await nats_py.connect(nats.url, **options)
    reader = await nats_py.connect(nats.url, **options)
    try:
        store = await JetStreamEventStore.connect(producer)
        other = await JetStreamEventStore.connect(reader)
        await store.open_stream("s")
        sent: list[Event] = []
        got: list[Event] = []
        arrived: list[float] = []

        async def read() -> None:
            async for event in other.follow("s"):
                got.append(event)
                arrived.append(anyio.current_time())

        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(read)
                for n in range(10):
                    sent.append(await store.append("s", delta(n)))
                await wait_until(lambda: len(got) == 10, "the first events")
                await anyio.to_thread.run_sync(nats.restart)
                back = anyio.current_time()
                for n in range(10, 20):
                    sent.append(await store.append("s", delta(n)))
                    await anyio.sleep(0.05)
                await wait_until(lambda: len(got) == 20, "the events after the restart")
                await store.close_stream("s")
        assert got == sent
        gap = arrived[10] - back
        assert gap < 2.0, f"the reader resumed {gap:.1f} s after the server was back"
    finally:
        await producer.close()
        await reader.close()


# -- the per-stream bounds across processes (see essessey.stores.jetstream._bounds) ------------


async def test_a_second_writer_counts_what_the_first_left_before_it_trims(
    nats: NatsServer,
) -> None:
    async with store_on(nats, max_events_per_stream=5) as first:
        old = await fill(first, "s", 4)
        async with store_on(nats, max_events_per_stream=5) as second:
            # It has never written "s": it reads what "s" keeps (4 events) first.
            new = [await second.append("s", delta(n)) for n in range(10, 13)]
            assert await second.since("s", None) == ([*old[2:], *new], True)
            assert await first.since("s", old[1].id) == ([*old[2:], *new], True)
            assert await first.since("s", old[0].id) == ([], False)


async def test_a_turn_on_another_replica_reads_the_stream_again_before_it_writes(
    nats: NatsServer,
) -> None:
    budget = 3 * (100 + 180)
    async with (
        store_on(nats, max_bytes_per_stream=budget) as a,
        store_on(nats, max_bytes_per_stream=budget) as b,
    ):
        big = [Event(EventType.CONTENT_BLOCK_DELTA, b"x" * 94 + b"%06d" % n) for n in range(6)]
        await a.open_stream("s")
        await a.append("s", big[0])
        await a.close_stream("s")
        await b.open_stream("s")  # a's turn is what b has not seen
        await b.append("s", big[1])
        await b.close_stream("s")
        await a.open_stream("s")  # a's picture is stale now: read again
        kept = [await a.append("s", event) for event in big[2:4]]
        await a.close_stream("s")
        events, known = await b.since("s", None)
        assert known
        assert [event.data for event in events] == [big[1].data, *(e.data for e in kept)]


async def test_max_streams_holds_for_stores_on_two_connections(nats: NatsServer) -> None:
    async with (
        store_on(nats, max_streams=2) as a,
        store_on(nats, max_streams=2) as b,
    ):
        await a.open_stream("x")
        await a.append("x", start(1))
        await a.close_stream("x")
        await b.open_stream("y")  # running, on the other store
        await a.append("z", start(2))  # past the bound: the finished "x" goes
        assert not await b.exists("x")
        assert await a.exists("y")
        assert await a.exists("z")
        await a.open_stream("w")  # "z" is the finished one now: it goes
        assert not await b.exists("z")
        with pytest.raises(StoreFull, match="running"):
            await b.open_stream("v")  # "y" and "w" both run
        await b.close_stream("y")
        await b.open_stream("v")
        assert [await a.exists(sid) for sid in ("y", "w", "v")] == [False, True, True]


async def test_the_stream_index_is_a_bucket_with_the_stores_max_age(nats: NatsServer) -> None:
    async with store_on(nats, stream="IDX", max_age=600) as store:
        await store.append("s", start(1))
        js = store.nc.jetstream()
        kv = await js.key_value("IDX_STREAMS")
        status = await kv.status()
        assert status.values == 1
        info = await js.stream_info("KV_IDX_STREAMS")
        assert info.config.max_age == 600
        await store.clear("s")
        assert (await kv.status()).values == 0


async def test_a_waiting_follower_ends_with_an_error_when_its_connection_closes_either_way(
    nats: NatsServer, reading: list[int]
) -> None:
    # Caught up, the follower waits on the queue in its own task (or in next_msg, which
    # nats-py cancels on close): closing the connection ends it, as the store being
    # unavailable (what an SSE subscription ends on without an error event), not with
    # nats-py's own error.
    async with store_on(nats) as store:
        await store.open_stream("s")
        events = await fill(store, "s", 3)
        got: list[Event] = []
        with anyio.fail_after(WAIT), pytest.RaisesGroup(JetStreamUnavailable):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(collect, store.follow("s"), got)
                await wait_until(lambda: len(got) == 3, "the replay")
                await store.nc.close()
        assert got == events


@pytest.mark.parametrize(
    ("err_code", "retried"),
    [(10026, True), (10059, False), (None, False)],
    ids=["consumer limit", "stream not found", "no code"],
)
def test_a_request_past_the_consumer_limit_is_made_again(
    err_code: int | None, retried: bool
) -> None:
    # After a stall the server holds the consumers of readers that have gone until they
    # lapse, and refuses new ones with 10026 (a 400): made again it succeeds, and when it
    # does not within the retry budget the caller gets JetStreamUnavailable (a 503), never
    # nats-py's own error (a 500). The error as nats-py builds it from the server's reply.
    from essessey.stores.jetstream._context import is_retryable

    reply = {"code": 400, "description": "refused", "err_code": err_code}
    with pytest.raises(nats_py.js.errors.APIError) as refused:
        nats_py.js.errors.APIError.from_error(reply)
    assert is_retryable(refused.value) is retried


async def test_a_lapsed_lease_taken_back_by_two_of_its_holder_s_calls_at_once_is_kept(
    nats: NatsServer,
) -> None:
    # The keeper's renewal and a write's check both took the lapsed lease back; the one
    # that lost took the winner's key (its own holder's) for another holder's, forgot
    # the lease, and the turn failed with LeaseLost though nobody else held it.
    async with store_on(nats, stream="TAKEBACK", running_ttl=1.0) as store:
        await store.claim_turn("s1", "holder-1")
        await store.append_as("s1", start(), "holder-1")
        await anyio.sleep(2.5)  # the holder stalls: the lease lapses, nobody takes it
        renewed, appended = await asyncio.gather(
            store.keep_running("s1", "holder-1"),
            store.append_as("s1", Event("ping", b'{"type":"ping"}'), "holder-1"),
        )
        assert renewed is True
        assert appended.id is not None
        await store.append_as("s1", Event("ping", b'{"type":"ping"}'), "holder-1")


async def test_starts_at_the_same_moment_take_every_free_stream_of_max_streams(
    nats: NatsServer,
) -> None:
    # Each start wrote its key, counted every key (the others' too) and, finding no
    # finished stream to drop, refused itself: 0 of 10 started with 4 free.
    async with (
        store_on(nats, stream="BURST", max_streams=4) as a,
        store_on(nats, stream="BURST", max_streams=4) as b,
    ):

        async def claim(n: int) -> bool:
            try:
                await (a, b)[n % 2].claim_turn(f"s{n}", f"holder-{n}")
            except StoreFull:
                return False
            return True

        outcomes = await asyncio.gather(*(claim(n) for n in range(10)))
        assert outcomes.count(True) == 4
        with pytest.raises(StoreFull):  # all four running: no room for another
            await a.claim_turn("late", "holder-late")
