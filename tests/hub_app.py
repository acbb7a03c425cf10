"""The app the SSE and WebSocket hub tests serve: a StreamHub behind the routes of one
transport, plus test routes that start a turn, return what it published and tell the
hub's state."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
import anyio.lowlevel
import orjson
from starlette.applications import Starlette
from starlette.requests import HTTPConnection, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from essessey import EventStore, InMemoryEventStore, Publisher, StreamHub, stream_turn
from essessey.hub import Access
from tests.processes import WAIT

"""Seconds any one wait of these tests may take before the test fails."""


@dataclass
class HubApp:
    """A Starlette app serving a hub, plus test routes that start a turn
    (``POST /turns/{id}?chunks=&hold_at=&hang=&size=``), wait for it and return what it
    published (``GET /published/{id}``) and tell the hub's state (``GET /state/{id}``).

    A held turn stops before chunk ``hold_at``, sets ``reached[id]`` and waits for
    ``release[id]`` (or, with ``hang``, until cancelled). Those are threading events:
    the server runs in its own thread and event loop. ``authorize`` lets every user but
    ``mallory`` in and raises for ``crasher``; ``asked`` records each question.
    """

    hub: StreamHub
    app: Starlette
    release: dict[str, threading.Event] = field(default_factory=dict)
    reached: dict[str, threading.Event] = field(default_factory=dict)
    asked: list[tuple[str, str, Access]] = field(default_factory=list)


def make_hub_app(
    transport: Callable[[StreamHub], Sequence[BaseRoute]],
    *,
    store: EventStore | None = None,
    max_lag: int = 1000,
    max_subscribers: int = 1000,
    extra_routes: Sequence[BaseRoute] = (),
    snapshot_after: int | None = None,
) -> HubApp:
    """A :class:`HubApp` whose hub is served by the routes ``transport(hub)`` returns."""

    def authorize(connection: HTTPConnection, stream_id: str, access: Access) -> bool:
        user = connection.headers.get("x-user", "")
        holder.asked.append((user, stream_id, access))
        if user == "crasher":
            raise RuntimeError("the hook failed")
        return user != "mallory"

    hub = StreamHub(
        store if store is not None else InMemoryEventStore(),
        authorize=authorize,
        max_lag=max_lag,
        max_subscribers=max_subscribers,
        snapshot_after=snapshot_after,
    )

    async def start_turn(request: Request) -> Response:
        stream_id = request.path_params["stream_id"]
        query = request.query_params
        chunks = int(query.get("chunks", "20"))
        hold_at = int(query.get("hold_at", "-1"))
        hang = "hang" in query
        padding = "x" * int(query.get("size", "0"))
        release = holder.release.setdefault(stream_id, threading.Event())
        reached = holder.reached.setdefault(stream_id, threading.Event())

        async def produce(publisher: Publisher) -> None:
            async with stream_turn(
                publisher, message_id=f"msg-{stream_id}", stream_id=stream_id, model="m"
            ) as turn:
                text = await turn.text()
                for i in range(chunks):
                    if i == hold_at:
                        reached.set()
                        if hang:
                            await anyio.sleep_forever()
                        for _ in range(int(WAIT / 0.002)):
                            if release.is_set():
                                break
                            await anyio.sleep(0.002)
                        else:
                            raise TimeoutError("the test never released the turn")
                    await text.write(f"w{i} {padding}")
                    await anyio.lowlevel.checkpoint()

        await hub.start(stream_id, produce)
        return Response(status_code=202)

    async def published(request: Request) -> Response:
        stream_id = request.path_params["stream_id"]
        with anyio.fail_after(WAIT):
            await hub.wait(stream_id)
        events, known = await hub.store.since(stream_id, None)
        assert known
        body = [[event.event, event.data.decode(), event.id] for event in events]
        return Response(orjson.dumps(body), media_type="application/json")

    async def state(request: Request) -> Response:
        stream_id = request.path_params["stream_id"]
        body = {"running": hub.running(stream_id), "subscribers": hub.subscriber_count(stream_id)}
        return Response(orjson.dumps(body), media_type="application/json")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with hub:
            yield

    routes = [
        *transport(hub),
        Route("/turns/{stream_id}", start_turn, methods=["POST"]),
        Route("/published/{stream_id}", published),
        Route("/state/{stream_id}", state),
        *extra_routes,
    ]
    holder = HubApp(hub, Starlette(routes=routes, lifespan=lifespan))
    return holder
