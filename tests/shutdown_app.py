"""The app of the shutdown tests (``tests.shutdown_app:app``): one process, an in-memory hub.

Routes:

- ``GET /streams/{stream_id}`` (SSE, resume by ``Last-Event-ID``), ``POST
  /streams/{stream_id}/cancel`` and ``/streams/{stream_id}/ws`` (WebSocket): the hub's;
- ``POST /turns/{stream_id}?seed=N&events=K&delay_ms=M``: start the seeded turn of
  :mod:`tests.chaos_app` (``K`` events, sleeping ``M`` ms after each one);
- ``GET /forever``: an SSE response of its own producer that never ends (a ping a tick);
- ``POST /shutdown``: :func:`begin_shutdown`;
- ``GET /state``: ``{"shutting_down": ..., "running": [stream ids]}``.

Environment (optional): ``SHUTDOWN_GRACE`` (the hub's ``shutdown_grace``, 1 s);
``SHUTDOWN_DETECT=0`` turns the detection of uvicorn's shutdown off; ``SHUTDOWN_REPORT``,
a file the lifespan writes when it has left the hub: for each turn, its events and how
it ended (``stop_reason`` of its ``message_delta``, or ``error``).

``create_app(grace, report)`` builds one (the in-process tests do);
``python -m tests.shutdown_app PORT`` serves it with ``uvicorn.Server(...).serve()``
(the programmatic way) instead of the ``uvicorn`` command.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from essessey import EventType, InMemoryEventStore, Publisher, StreamHub
from essessey.bindings.sse import EventStreamResponse, hub_routes
from essessey.bindings.ws import ws_route
from essessey.shutdown import begin_shutdown, detect_uvicorn_shutdown, shutting_down
from tests.chaos_app import build_script, play


def create_app(grace: float = 1.0, report: str | None = None) -> Starlette:
    """The app, with a hub of its own (``shutdown_grace=grace``); ``report``: see above."""
    store = InMemoryEventStore()
    hub = StreamHub(store, shutdown_grace=grace)
    started: list[str] = []

    async def start_turn(request: Request) -> Response:
        stream_id = request.path_params["stream_id"]
        query = request.query_params
        script = build_script(int(query["seed"]), int(query["events"]))
        delay = int(query.get("delay_ms", "10")) / 1000

        async def pace() -> None:
            await anyio.sleep(delay)

        async def produce(publisher: Publisher) -> None:
            await play(publisher, script, stream_id, pace)

        await hub.start(stream_id, produce)
        started.append(stream_id)
        return JSONResponse({"started": stream_id}, status_code=202)

    async def forever(request: Request) -> Response:
        async def produce(publisher: Publisher) -> None:
            while True:
                await publisher.send_ping()
                await anyio.sleep(0.05)

        return EventStreamResponse(produce)

    async def shutdown(request: Request) -> Response:
        begin_shutdown()
        return JSONResponse({"shutting_down": True})

    async def state(request: Request) -> Response:
        running = [stream_id for stream_id in started if hub.running(stream_id)]
        return JSONResponse({"shutting_down": shutting_down(), "running": running})

    async def write_report(path: str) -> None:
        turns = {}
        for stream_id in started:
            events, _ = await store.since(stream_id, None)
            ending = None
            for event in events:
                if event.event == EventType.MESSAGE_DELTA:
                    ending = orjson.loads(event.data)["delta"]["stop_reason"]
                elif event.event == EventType.ERROR:
                    ending = "error"
            turns[stream_id] = {"events": len(events), "ending": ending}
        await anyio.Path(path).write_bytes(orjson.dumps(turns))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with hub:
            yield
        if report:
            await write_report(report)

    return Starlette(
        routes=[
            *hub_routes(hub, ping_interval=1.0),
            ws_route(hub, ping_interval=1.0),
            Route("/turns/{stream_id}", start_turn, methods=["POST"]),
            Route("/forever", forever, methods=["GET"]),
            Route("/shutdown", shutdown, methods=["POST"]),
            Route("/state", state, methods=["GET"]),
        ],
        lifespan=lifespan,
    )


if os.environ.get("SHUTDOWN_DETECT") == "0":
    detect_uvicorn_shutdown(False)

app = create_app(float(os.environ.get("SHUTDOWN_GRACE", "1")), os.environ.get("SHUTDOWN_REPORT"))


def main(port: int) -> None:
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    # After a SIGINT, serve() raises it again once it has shut down (KeyboardInterrupt).
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(uvicorn.Server(config).serve())


if __name__ == "__main__":
    main(int(sys.argv[1]))
