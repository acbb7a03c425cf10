"""RedisEventStore against a real redis-server, beyond the conformance suite
(tests/test_store_conformance.py): its options, its keys and their expiry, retried appends
stored once, a lost pub/sub connection, a reader that falls past the trim. The leases are
in the conformance suite, on Redis and JetStream alike."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis

from essessey import (
    Event,
    RedisUnavailable,
    StreamNotFound,
    SubscriberLagged,
)
from essessey.stores.redis import RedisEventStore
from essessey.testing import delta
from tests.processes import WAIT
from tests.redis_server import RedisServer, ReplyProxy, Verdict, redis_server

pytestmark = pytest.mark.anyio

_names = itertools.count(1)


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with redis_server() as started:
        yield started


@asynccontextmanager
async def store_on(url: str, **options: Any) -> AsyncIterator[RedisEventStore]:
    options.setdefault("prefix", f"t{next(_names)}")
    async with RedisEventStore.from_url(url, **options) as store:
        yield store


async def test_bad_options_raise(server: RedisServer) -> None:
    decoding = aioredis.Redis.from_url(server.url, decode_responses=True)
    try:
        with pytest.raises(ValueError, match="decode_responses"):
            RedisEventStore(decoding)
    finally:
        await decoding.aclose()
    client = aioredis.Redis.from_url(server.url)
    try:
        for bad in (
            {"max_events_per_stream": 0},
            {"max_streams": -1},
            {"max_age": 0},
            {"running_ttl": 0},
            {"prefix": ""},
            {"prefix": "a b"},
        ):
            with pytest.raises(ValueError, match="must"):
                RedisEventStore(client, **bad)
    finally:
        await client.aclose()


async def test_stream_ids_must_be_valid_ids(server: RedisServer) -> None:
    async with store_on(server.url) as store:
        for bad in ("", "a b", "a.b", "x" * 300):
            with pytest.raises(ValueError, match="not a valid stream id"):
                await store.append(bad, delta(0))
            assert await store.since(bad, None) == ([], False)


async def test_the_keys_of_a_stream_and_their_expiry(server: RedisServer) -> None:
    async with store_on(server.url, prefix="keys", max_age=30) as store:
        await store.open_stream("s")
        await store.append("s", delta(0))
        redis = store.redis
        assert set(await redis.keys("keys:*")) == {
            b"keys:s:m",
            b"keys:s:e",
            b"keys:streams",
            b"keys:streams:clock",
        }
        for key in ("keys:s:m", "keys:s:e"):
            assert 0 < await redis.pttl(key) <= 30_000  # max_age, renewed by every write
        assert await redis.xlen("keys:s:e") == 1
        await store.clear("s")
        assert await redis.exists("keys:s:m", "keys:s:e") == 0
        assert await redis.zscore("keys:streams", "s") is None


async def test_a_stream_past_max_age_is_gone_and_its_ids_unknown(server: RedisServer) -> None:
    async with store_on(server.url, max_age=0.3) as store:
        old = [await store.append("s", delta(n)) for n in range(3)]
        await anyio.sleep(0.5)
        assert not await store.exists("s")
        assert await store.since("s", old[0].id) == ([], False)
        new = await store.append("s", delta(9))
        assert new.id is not None
        assert new.id.rpartition("-")[0] != old[0].id.rpartition("-")[0]  # type: ignore[union-attr]
        assert await store.since("s", None) == ([new], True)


class CutAppendReplies:
    """While ``armed``, cut the connection once an append's reply ({epoch, seq}) comes
    back: a stored append whose reply was lost."""

    def __init__(self) -> None:
        self.armed = 0  # replies to cut
        self.cut = 0

    def __call__(self, reply: bytes) -> Verdict:
        if self.armed and b"ESS" not in reply and reply.startswith(b"*2"):
            self.armed -= 1
            self.cut += 1
            return "cut"
        return "pass"


async def test_an_append_whose_reply_was_lost_is_stored_once(server: RedisServer) -> None:
    cutter = CutAppendReplies()
    async with (
        ReplyProxy(server.port, cutter) as proxy,
        store_on(proxy.url, retry_timeout=5) as store,
    ):
        first = await store.append("s", delta(0))
        cutter.armed = 1
        second = await store.append("s", delta(1))  # stored, reply cut, sent again
        third = await store.append("s", delta(2))
        events, known = await store.since("s", None)
    assert cutter.cut == 1
    assert known
    assert events == [first, second, third]  # the retried append once, its first id


async def test_a_subscription_redis_never_confirms_is_redis_out_of_reach(
    server: RedisServer,
) -> None:
    # A turn's start watches its cancel channel: Redis took the SUBSCRIBE and its
    # confirmation never came. That is Redis out of reach (a 503 for a request that
    # starts a turn), not a bare TimeoutError (a 500); once it answers, the watch is made.
    dropping = True

    def verdict(reply: bytes) -> Verdict:
        return "drop" if dropping and b"subscribe" in reply else "pass"

    async with (
        ReplyProxy(server.port, verdict) as proxy,
        store_on(proxy.url, retry_timeout=0.5) as store,
    ):
        with anyio.fail_after(WAIT):
            with pytest.raises(RedisUnavailable, match="did not confirm a subscription"):
                await store.watch_cancel("s", lambda: None)
            dropping = False
            stop = await store.watch_cancel("s", lambda: None)
            stop()


async def test_a_lost_pubsub_connection_loses_no_event(server: RedisServer) -> None:
    async with store_on(server.url, heartbeat=0.3) as store:
        await store.open_stream("s")
        got: list[Event] = []

        async def read() -> None:
            async for event in store.follow("s"):
                got.append(event)

        sent: list[Event] = []
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(read)
                for n in range(60):
                    if n == 20:
                        # Every pub/sub connection of the server cut: notifications of
                        # the next appends are lost until the store resubscribes.
                        await store.redis.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
                    sent.append(await store.append("s", delta(n)))
                    await anyio.sleep(0.01)
                await store.close_stream("s")
    assert got == sent


async def test_a_malformed_notification_is_skipped_and_the_listener_goes_on(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    # A note no store wrote (its sequence thousands of digits long) on the stream's
    # channel: skipped with a line; the one listener of the store still hears the next
    # notes (a heartbeat far off, so a dead listener would leave the reader waiting).
    async with store_on(server.url, prefix="badnote", heartbeat=60) as store:
        await store.open_stream("s")
        got: list[Event] = []
        first, all_of_them = anyio.Event(), anyio.Event()

        async def read() -> None:
            async for event in store.follow("s"):
                got.append(event)
                first.set()
                if len(got) == 10:
                    all_of_them.set()

        sent: list[Event] = []
        with anyio.fail_after(WAIT), caplog.at_level("WARNING", logger="essessey.stores.redis"):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(read)
                sent.append(await store.append("s", delta(0)))
                await first.wait()
                await store.redis.publish("badnote:s:n", b"x " + b"9" * 5000 + b" e name\n{}")
                for n in range(1, 10):
                    sent.append(await store.append("s", delta(n)))
                with anyio.fail_after(5):
                    await all_of_them.wait()
                await store.close_stream("s")
    assert got == sent
    assert any("not laid out as expected" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    "fields",
    [{b"x": b"y"}, {b"e": b"\xff\xfe", b"d": b"{}"}, {b"e": b"ping"}],
    ids=["no-fields", "name-not-utf8", "no-data"],
)
async def test_an_entry_the_store_did_not_write_is_skipped_with_a_line(
    server: RedisServer, caplog: pytest.LogCaptureFixture, fields: dict[bytes, bytes]
) -> None:
    # Written into the stream between the store's own entries (another writer's, a damaged
    # key): every reader passes over it with a WARNING and reads the rest, to the end.
    prefix = f"foreign{next(_names)}"
    async with store_on(server.url, prefix=prefix) as store:
        await store.open_stream("s")
        first = await store.append("s", delta(0))
        await store.redis.xadd(f"{prefix}:s:e", fields, id="0-2")
        await store.redis.hset(f"{prefix}:s:m", "seq", 2)
        last = await store.append("s", delta(1))
        await store.close_stream("s")
        with caplog.at_level("WARNING", logger="essessey.stores.redis"):
            events, known = await store.since("s", None)
            with anyio.fail_after(WAIT):
                followed = [event async for event in store.follow("s")]
    assert known
    assert events == followed == [first, last]
    assert sum("skipped stream entry 2" in r.getMessage() for r in caplog.records) == 2


async def test_a_stream_record_the_store_did_not_write_reads_as_not_held(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    async with store_on(server.url, prefix="damaged") as store:
        await store.open_stream("s")
        await store.append("s", delta(0))
        await store.redis.hset("damaged:s:m", "seq", "abc")
        with caplog.at_level("WARNING", logger="essessey.stores.redis"):
            assert await store.since("s", None) == ([], False)
            with pytest.raises(StreamNotFound):
                async for _ in store.follow("s"):
                    pass
    assert any("not the store's (seq is not a count)" in r.getMessage() for r in caplog.records)


async def test_a_reader_that_falls_past_the_trim_is_ended(server: RedisServer) -> None:
    async with store_on(server.url, max_events_per_stream=100) as store:
        await store.open_stream("s")
        await store.append("s", delta(0))
        follower = store.follow("s")
        with anyio.fail_after(WAIT):
            assert (await anext(follower)).data == delta(0).data
            # It reads nothing while 6,000 events go by: more than its inbox holds and
            # than the stream retains.
            for n in range(1, 6_001):
                await store.append("s", delta(n))
            with pytest.raises(SubscriberLagged):
                await drain(follower)
        await follower.aclose()


async def drain(events: AsyncIterator[Event]) -> None:
    async for _ in events:
        pass


async def test_a_client_with_a_short_socket_timeout_follows_a_quiet_stream(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    # The listener waits for news no longer than half the client's socket_timeout, so a
    # quiet stream is not taken for a broken connection.
    client = aioredis.Redis.from_url(server.url, socket_timeout=0.3)
    try:
        async with RedisEventStore(client, prefix=f"t{next(_names)}") as store:
            await store.open_stream("s")
            got: list[Event] = []

            async def read() -> None:
                async for event in store.follow("s"):
                    got.append(event)

            with anyio.fail_after(WAIT), caplog.at_level("WARNING", "essessey.stores.redis"):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(read)
                    await anyio.sleep(1.2)  # quiet: four socket timeouts
                    sent = await store.append("s", delta(1))
                    await store.close_stream("s")
    finally:
        await client.aclose()
    assert got == [sent]
    assert [r.message for r in caplog.records if r.levelname == "WARNING"] == []
