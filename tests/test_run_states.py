"""RunStates: a framework run's state kept in the stream store, whole or not at all, on
every store a hub shares (in-memory, Redis, JetStream)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from essessey import Event
from essessey.adapters import MAX_STATE_BYTES, RunStates
from essessey.stores import EventStore, InMemoryEventStore
from tests.nats_server import NatsServer
from tests.redis_server import RedisServer
from tests.test_jetstream_store import store_on

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def shared_store(broker: NatsServer | RedisServer, prefix: str) -> AsyncIterator[EventStore]:
    if isinstance(broker, RedisServer):
        from essessey.stores.redis import RedisEventStore

        store = RedisEventStore.from_url(broker.url, prefix=prefix)
        try:
            yield store
        finally:
            await store.aclose()
    else:
        async with store_on(broker) as jetstream:
            yield jetstream


async def test_a_state_saved_is_loaded_whole_and_replaced_by_the_next() -> None:
    states = RunStates()
    assert await states.load("req_1") is None
    big = os.urandom(600_000)  # three parts
    await states.save("req_1", big)
    assert await states.load("req_1") == big
    await states.save("req_1", b"small")
    assert await states.load("req_1") == b"small"
    await states.save("req_1", b"")
    assert await states.load("req_1") == b""
    await states.drop("req_1")
    assert await states.load("req_1") is None


async def test_a_save_cut_short_reads_as_no_state() -> None:
    store = InMemoryEventStore()
    states = RunStates(store)
    await states.save("req_1", b"x" * 300_000)
    events, _ = await store.since("req_1~run", None)
    # The parts without their count, as a writer that died between them leaves them.
    await store.clear("req_1~run")
    await store.append("req_1~run", events[0])
    assert await states.load("req_1") is None
    # A count that does not match its parts is no state either, never a shorter one.
    await store.append("req_1~run", Event("whole", b"2"))
    assert await states.load("req_1") is None


async def test_a_state_over_the_limit_is_refused_before_anything_is_written() -> None:
    store = InMemoryEventStore()
    states = RunStates(store)
    await states.save("req_1", b"kept")
    with pytest.raises(ValueError, match="over the"):
        await states.save("req_1", bytes(MAX_STATE_BYTES + 1))
    assert await states.load("req_1") == b"kept"


@given(st.binary(max_size=2_000))
@settings(max_examples=50, deadline=None)
def test_any_bytes_come_back_as_they_were(state: bytes) -> None:
    import anyio

    async def roundtrip() -> bytes | None:
        states = RunStates()
        await states.save("k", state)
        return await states.load("k")

    assert anyio.run(roundtrip) == state


async def test_two_replicas_on_one_store_share_a_state(broker: NatsServer | RedisServer) -> None:
    prefix = "states" + os.urandom(4).hex()
    async with shared_store(broker, prefix) as a, shared_store(broker, prefix) as b:
        state = os.urandom(700_000)
        await RunStates(a).save("req_shared", state)
        assert await RunStates(b).load("req_shared") == state
        await RunStates(b).drop("req_shared")
        assert await RunStates(a).load("req_shared") is None


async def test_an_answer_finds_the_state_its_first_request_keeps() -> None:
    from essessey.protocol.asking import Answered, Question

    states = RunStates()
    asked = (Question("q_first", "Which city?"), Question("q_second", "When?"))
    answered = Answered("s1", "msg_2", "m", 2, asked)
    assert RunStates.key_of(answered) == "q_first"
    with pytest.raises(LookupError, match="no run state is kept"):
        await states.load_answered(answered)
    await states.save("q_first", b"the run")
    assert await states.load_answered(answered) == b"the run"
