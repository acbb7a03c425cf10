"""A replay must not hold the event loop: a connection that has a long backlog to send lets
the other connections run every ``EVENTS_PER_TURN`` events (SSE and WebSocket), on a real
uvicorn. Counted in loop turns (at least one per 100 events), not timed: a task of the app
counts the turns the loop gave other tasks while one replay ran.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.lowlevel
import httpx
import pytest
import websockets
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from essessey import Event, EventType, InMemoryEventStore, StreamHub
from essessey.bindings.sse import EventStreamResponse, subscription_response
from essessey.bindings.ws import websocket_subscription
from tests.processes import WAIT
from tests.servers import serve

BACKLOG = 5_000
MIN_TURNS = BACKLOG // 100  # the loop's turns a replay must give, at the least


class _CountingStore(InMemoryEventStore):
    """Records, in ``counts["during"]``, the loop turns other tasks had while a follower
    read the stream to its end."""

    def __init__(self, counts: dict[str, int]) -> None:
        super().__init__()
        self.counts = counts

    async def follow(
        self, stream_id: str, last_event_id: str | None = None, *, max_lag: int | None = None
    ) -> AsyncIterator[Event]:
        before = self.counts["ticks"]
        async for event in super().follow(stream_id, last_event_id, max_lag=max_lag):
            yield event
        self.counts["during"] = self.counts["ticks"] - before


def _app() -> tuple[Starlette, dict[str, int]]:
    counts = {"ticks": 0, "during": -1}
    store = _CountingStore(counts)
    hub = StreamHub(store)

    async def ticker() -> None:
        while True:
            counts["ticks"] += 1
            await anyio.lowlevel.checkpoint()

    async def backlog() -> AsyncIterator[Event]:
        before = counts["ticks"]
        for n in range(BACKLOG):
            yield Event(EventType.PING, b'{"type":"ping","n":%d}' % n)
        counts["during"] = counts["ticks"] - before

    async def sse(request: Request) -> Response:
        return EventStreamResponse(backlog())

    async def hub_sse(request: Request) -> Response:
        return await subscription_response(hub, request, "long")

    async def hub_ws(websocket: WebSocket) -> None:
        await websocket_subscription(hub, websocket, "long")

    async def during(request: Request) -> Response:
        return JSONResponse(counts)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await store.open_stream("long")
        for n in range(BACKLOG):
            await store.append("long", Event(EventType.PING, b'{"type":"ping","n":%d}' % n))
        await store.close_stream("long")
        async with hub, anyio.create_task_group() as tasks:
            tasks.start_soon(ticker)
            yield
            tasks.cancel_scope.cancel()

    routes = [
        Route("/sse", sse),
        Route("/hub", hub_sse),
        WebSocketRoute("/ws", hub_ws),
        Route("/counts", during),
    ]
    return Starlette(routes=routes, lifespan=lifespan), counts


def test_an_sse_replay_lets_the_loop_run_every_few_dozen_events() -> None:
    app, _ = _app()
    with serve(app, lifespan="on") as base:
        response = httpx.get(f"{base}/sse", timeout=WAIT)
        assert response.text.count("event: ping") == BACKLOG
        during = httpx.get(f"{base}/counts", timeout=WAIT).json()["during"]
    # A turn for the other tasks every 64 events (EVENTS_PER_TURN); it was about one per
    # 1,024, when the held events filled the queue.
    assert during >= MIN_TURNS, during


@pytest.mark.anyio
async def test_hub_replays_over_sse_and_websocket_let_the_loop_run() -> None:
    app, _ = _app()
    with serve(app, lifespan="on") as base:
        async with httpx.AsyncClient(timeout=WAIT) as http:
            response = await http.get(f"{base}/hub")
            assert response.text.count("event: ping") == BACKLOG
            during_sse = (await http.get(f"{base}/counts")).json()["during"]
            url = base.replace("http", "ws") + "/ws"
            frames = 0
            async with websockets.connect(url, compression=None) as socket:
                async for _ in socket:  # ends at the normal close
                    frames += 1
            during_ws = (await http.get(f"{base}/counts")).json()["during"]
    assert frames == BACKLOG
    assert during_sse >= MIN_TURNS, during_sse
    assert during_ws >= MIN_TURNS, during_ws
