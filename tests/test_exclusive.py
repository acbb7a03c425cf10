"""``StreamHub.exclusive``: a key held against every other holder, in one hub and across
replicas sharing a store (two hubs on one redis-server, on one nats-server), and what a
chat's new turn gains from it: two messages for one chat sent to two replicas at the same
moment start one turn."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import httpx
import nats as nats_py
import pytest

from essessey import InMemoryEventStore, RedisUnavailable, StreamBusy, StreamHub
from essessey.stores import SharedEventStore
from essessey.stores.jetstream import JetStreamEventStore
from essessey.stores.redis import RedisEventStore
from tests.nats_server import NatsServer
from tests.processes import WAIT
from tests.redis_server import RedisServer, ReplyProxy, Verdict, redis_server
from tests.test_replicas import replicas

pytestmark = pytest.mark.anyio

_names = itertools.count(1)


async def test_a_held_key_is_refused_until_its_holder_lets_go() -> None:
    async with StreamHub(InMemoryEventStore()) as hub:
        async with hub.exclusive("chat-1~start"):
            with pytest.raises(StreamBusy):
                async with hub.exclusive("chat-1~start"):
                    pytest.fail("held twice")
            async with hub.exclusive("chat-2~start"):  # another key: its own hold
                pass
        with pytest.raises(RuntimeError):  # a body that raises lets go too
            async with hub.exclusive("chat-1~start"):
                raise RuntimeError
        async with hub.exclusive("chat-1~start"):
            pass


async def test_a_key_no_stream_id_could_be_is_refused() -> None:
    async with StreamHub(InMemoryEventStore()) as hub:
        for bad in ("", "a b", "a.b", "x" * 300):
            with pytest.raises(ValueError, match="not a valid stream id"):
                async with hub.exclusive(bad):
                    pytest.fail("held")


@asynccontextmanager
async def two_stores(
    broker: NatsServer | RedisServer,
) -> AsyncIterator[tuple[SharedEventStore, SharedEventStore]]:
    """Two stores on ``broker``, as two replicas would have (each its own connection)."""
    n = next(_names)
    if isinstance(broker, RedisServer):
        async with (
            RedisEventStore.from_url(broker.url, prefix=f"ex{n}") as a,
            RedisEventStore.from_url(broker.url, prefix=f"ex{n}") as b,
        ):
            yield a, b
        return
    nc_a = await nats_py.connect(broker.url, allow_reconnect=False)
    nc_b = await nats_py.connect(broker.url, allow_reconnect=False)
    try:
        options = {"stream": f"EX{n}", "prefix": f"ex{n}"}
        yield (
            await JetStreamEventStore.connect(nc_a, **options),
            await JetStreamEventStore.connect(nc_b, **options),
        )
    finally:
        await nc_a.close()
        await nc_b.close()


async def test_a_key_held_on_one_replica_is_refused_on_the_other(
    broker: NatsServer | RedisServer,
) -> None:
    async with two_stores(broker) as (store_a, store_b):
        with anyio.fail_after(WAIT):
            async with StreamHub(store_a) as hub_a, StreamHub(store_b) as hub_b:
                async with hub_a.exclusive("chat-9~start"):
                    with pytest.raises(StreamBusy):
                        async with hub_b.exclusive("chat-9~start"):
                            pytest.fail("held on both replicas")
                    async with hub_b.exclusive("chat-10~start"):
                        pass
                async with hub_b.exclusive("chat-9~start"):  # A let go
                    with pytest.raises(StreamBusy):
                        async with hub_a.exclusive("chat-9~start"):
                            pytest.fail("held on both replicas")


@pytest.mark.parametrize("ending", ["cancelled", "out of reach"])
async def test_a_hold_whose_claim_was_cut_short_is_let_go(ending: str) -> None:
    # The claim reached Redis and was made, but its reply had not come back when the
    # request was cancelled (its client left), or when the store gave up waiting for it
    # (RedisUnavailable, a 503): the hold is let go of at once, not left to lapse after
    # running_ttl, in which time every new message of the chat got a 409.
    held = False  # while set, the server's replies are kept from store A

    def hold(reply: bytes) -> Verdict:
        return "drop" if held else "pass"

    with redis_server() as server:
        async with (
            ReplyProxy(server.port, hold) as proxy,
            RedisEventStore.from_url(proxy.url, prefix="held", retry_timeout=1) as store_a,
            RedisEventStore.from_url(server.url, prefix="held") as store_b,
        ):
            with anyio.fail_after(WAIT):
                async with StreamHub(store_a) as hub_a, StreamHub(store_b) as hub_b:

                    async def claim() -> None:
                        nonlocal held
                        with (
                            pytest.raises(RedisUnavailable)
                            if ending != "cancelled"
                            else (contextlib.nullcontext())
                        ):
                            async with hub_a.exclusive("chat-3~start"):
                                pytest.fail("the claim's reply was held back")
                        held = False  # the store gave up: its release goes through

                    # A connection made and the scripts loaded, their replies let through.
                    async with hub_a.exclusive("warm~start"):
                        pass
                    async with anyio.create_task_group() as tasks:
                        held = True
                        tasks.start_soon(claim)
                        for _ in range(1000):  # a state in Redis to poll; bounded
                            if await store_b.turn_running("chat-3~start"):
                                break
                            await anyio.sleep(0.01)
                        else:
                            pytest.fail("the claim never reached Redis")
                        if ending == "cancelled":
                            held = False
                            tasks.cancel_scope.cancel()
                    for _ in range(100):  # let go of apart, after a store error; bounded
                        if not await store_b.turn_running("chat-3~start"):
                            break
                        await anyio.sleep(0.01)
                    assert not await store_b.turn_running("chat-3~start")
                    async with hub_b.exclusive("chat-3~start"):
                        pass


CHATS = 12


async def test_two_messages_for_one_chat_on_two_replicas_at_once_start_one_turn(
    broker: NatsServer | RedisServer,
) -> None:
    # The same new message for a chat reaches A and B at the same moment (a retry through
    # a round-robin balancer): one replica starts the chat's turn, the other answers 409,
    # for every chat; without a hold both could read "no turn running" and both start.
    with replicas(broker) as (a, b):
        async with httpx.AsyncClient(timeout=WAIT) as http:

            async def send(base: str, chat_id: str, into: dict[str, list[int]]) -> None:
                # Paced, so that a turn outlasts the other replica's request: a turn
                # that ended already would rightly let the next one start.
                body = {"id": chat_id, "messages": [], "trigger": "submit-message"}
                body["delay_ms"] = 30
                async with http.stream("POST", base + "/api/chat", json=body) as response:
                    await response.aread()  # a turn's whole stream, or the refusal
                    into.setdefault(chat_id, []).append(response.status_code)

            statuses: dict[str, list[int]] = {}
            with anyio.fail_after(WAIT):
                async with anyio.create_task_group() as tasks:
                    for n in range(CHATS):
                        tasks.start_soon(send, a.url, f"race-{n}", statuses)
                        tasks.start_soon(send, b.url, f"race-{n}", statuses)
    assert {chat: sorted(codes) for chat, codes in statuses.items()} == {
        f"race-{n}": [200, 409] for n in range(CHATS)
    }
