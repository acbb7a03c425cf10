"""The ASGI layer the bindings share (essessey/bindings/_asgi.py), on a real uvicorn.

The stalled-connection abort is the one place that reads uvicorn's internals (it has no
public API for a request's transport): these tests fail loudly, under every HTTP and
WebSocket implementation uvicorn is run with here, when that stops working.
"""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import anyio
import httpx
import pytest
import websockets
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from essessey.bindings._asgi import connection_aborter, resume_point, task_group
from tests.servers import serve

# h11 always; httptools where it is installed (uvicorn[standard]).
HTTP_IMPLEMENTATIONS = ["h11"] + (["httptools"] if importlib.util.find_spec("httptools") else [])


def _probe_app() -> Starlette:
    async def http(request: Request) -> JSONResponse:
        abort = connection_aborter()
        # Found: a real aborter (not the do-nothing one), which with nothing buffered
        # does not abort a healthy connection.
        return JSONResponse({"found": abort.__name__ != "_no_abort", "aborted": abort()})

    async def ws(websocket: WebSocket) -> None:
        await websocket.accept()
        abort = connection_aborter()
        await websocket.send_json({"found": abort.__name__ != "_no_abort", "aborted": abort()})
        await websocket.close()

    return Starlette(routes=[Route("/http", http), WebSocketRoute("/ws", ws)])


@pytest.mark.parametrize("http", HTTP_IMPLEMENTATIONS)
def test_the_aborter_finds_uvicorns_transport_for_http(http: str) -> None:
    with serve(_probe_app(), http=http) as base:
        answer = httpx.get(f"{base}/http", timeout=10).json()
    assert answer == {"found": True, "aborted": False}, (
        "connection_aborter no longer finds uvicorn's transport: stalled connections would "
        "hold their sockets until the client reads (see essessey/bindings/_asgi.py)"
    )


@pytest.mark.anyio
@pytest.mark.parametrize("ws", ["websockets", "websockets-sansio"])
async def test_the_aborter_finds_uvicorns_transport_for_websockets(ws: str) -> None:
    with serve(_probe_app(), ws=ws) as base:
        async with websockets.connect(base.replace("http", "ws") + "/ws") as socket:
            answer = json.loads(await socket.recv())
    assert answer == {"found": True, "aborted": False}


def test_outside_uvicorn_the_aborter_does_nothing() -> None:
    async def main() -> Any:
        return connection_aborter()()

    assert anyio.run(main) is False


@pytest.mark.anyio
async def test_a_task_group_failure_is_the_exception_itself() -> None:
    async def fail() -> None:
        raise LookupError("one")

    async def run() -> None:
        async with task_group() as tasks:
            tasks.start_soon(fail)
            await anyio.sleep(1)

    with pytest.raises(LookupError, match="one"):
        await run()


@pytest.mark.anyio
async def test_several_failures_stay_a_group() -> None:
    async def fail(kind: type[Exception]) -> None:
        raise kind("x")

    async def run() -> None:
        async with task_group() as tasks:
            tasks.start_soon(fail, LookupError)
            tasks.start_soon(fail, KeyError)
            await anyio.sleep(1)

    with pytest.raises(ExceptionGroup) as caught:
        await run()
    assert len(caught.value.exceptions) == 2


def test_the_resume_point() -> None:
    assert resume_point(None) is None
    assert resume_point("") is None  # "from the start", as for EventSource
    assert resume_point("abc-12") == "abc-12"
    for bad in ("x" * 300, "a\x00b", "a\nb"):
        with pytest.raises(ValueError, match="invalid last event id"):
            resume_point(bad)
