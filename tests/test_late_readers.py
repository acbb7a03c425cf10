"""A reader without a last event id, on a stream whose oldest events were evicted: it gets
whole messages or an explicit status, never half a message or an empty "finished" stream.

On every store (in memory, and JetStream on a real nats-server), then through the hub's
SSE and WebSocket routes on a real uvicorn.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import httpx
import nats as nats_py
import pytest
import websockets
from starlette.routing import BaseRoute

from essessey import (
    Event,
    EventStore,
    EventType,
    InMemoryEventStore,
    MessagesNotRetained,
    StreamHub,
)
from essessey.bindings.sse import hub_routes
from essessey.bindings.ws import ws_route
from essessey.stores.jetstream import JetStreamEventStore
from essessey.testing import delta, start, stop
from tests.hub_app import make_hub_app
from tests.nats_server import NatsServer
from tests.processes import WAIT
from tests.servers import serve

RETAINED = 200
LONG = 300  # deltas in a message: longer than what is retained


@asynccontextmanager
async def a_store(kind: str, nats: NatsServer | None) -> AsyncIterator[EventStore]:
    if kind == "memory":
        yield InMemoryEventStore(max_events_per_stream=RETAINED)
        return
    assert nats is not None
    nc = await nats_py.connect(nats.url, allow_reconnect=False)
    try:
        yield await JetStreamEventStore.connect(nc, max_msgs=RETAINED)
    finally:
        await nc.close()


@pytest.fixture(params=["memory", "jetstream"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def maybe_nats(kind: str, request: pytest.FixtureRequest) -> NatsServer | None:
    if kind != "jetstream":
        return None
    server: NatsServer = request.getfixturevalue("nats")
    return server


async def read_into(store: EventStore, got: list[Event]) -> None:
    async for event in store.follow("s"):
        got.append(event)


async def long_message(store: EventStore, stream_id: str, number: int) -> None:
    await store.append(stream_id, start(number))
    for n in range(LONG):
        await store.append(stream_id, delta(n))
    await store.append(stream_id, stop())


@pytest.mark.anyio
async def test_no_whole_message_and_the_turn_over_is_an_explicit_end(
    kind: str, maybe_nats: NatsServer | None
) -> None:
    async with a_store(kind, maybe_nats) as store:
        await store.open_stream("s")
        await long_message(store, "s", 1)
        await store.close_stream("s")
        got: list[Event] = []
        with anyio.fail_after(WAIT), pytest.raises(MessagesNotRetained):
            await read_into(store, got)
    assert got == []  # not the tail of the message, and not an empty "finished" stream


@pytest.mark.anyio
async def test_a_running_turn_s_late_reader_waits_for_the_next_whole_message(
    kind: str, maybe_nats: NatsServer | None
) -> None:
    async with a_store(kind, maybe_nats) as store:
        await store.open_stream("s")
        await store.append("s", start(1))
        for n in range(LONG):  # message 1 still open, its start evicted
            await store.append("s", delta(n))
        got: list[Event] = []
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(read_into, store, got)
                await anyio.sleep(0.2)  # the reader is waiting
                for n in range(5):
                    await store.append("s", delta(1000 + n))
                await store.append("s", stop())
                second = [start(2), delta(7), delta(8), stop()]
                for event in second:
                    await store.append("s", event)
                await store.close_stream("s")  # the reader ends once it has all
    assert [(e.event, e.data) for e in got] == [(e.event, e.data) for e in second]


# -- through the hub's routes -------------------------------------------------------------


def _routes(hub: StreamHub) -> list[BaseRoute]:
    return [*hub_routes(hub), ws_route(hub)]


@pytest.mark.anyio
async def test_a_late_reader_of_a_finished_long_turn_gets_404_and_close_4404() -> None:
    hub_app = make_hub_app(_routes, store=InMemoryEventStore(max_events_per_stream=RETAINED))
    with serve(hub_app.app, lifespan="on") as base:
        async with httpx.AsyncClient(base_url=base, timeout=WAIT) as http:
            assert (await http.post("/turns/s?chunks=600")).status_code == 202
            published = (await http.get("/published/s")).json()
            assert EventType.MESSAGE_START not in [name for name, _, _ in published]
            response = await http.get("/streams/s")
            url = base.replace("http", "ws") + "/streams/s/ws"
            async with websockets.connect(url, compression=None) as socket:
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await socket.recv()
    assert response.status_code == 404, response.text
    assert response.json()["error"]["type"] == "not_found_error"
    assert "no whole message" in response.json()["error"]["message"]
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 4404
    assert "no whole message" in closed.value.rcvd.reason
