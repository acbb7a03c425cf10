"""Every dialect is delivered as the protocol's own SSE is: the UI message stream, AG-UI,
Chat Completions and Responses each get the keep-alive pings, the shutdown hand-off
(``retry:`` and the end, the turn going on) and the stalled-client timeout (the
connection reset, one warning), on a real uvicorn server."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from essessey import Event, InMemoryEventStore, Publisher, StopReason, StreamHub
from essessey.bindings.sse import SSEDecoder
from essessey.dialects._routes import WHOLE_BUILDS_AT_ONCE
from essessey.dialects.agui import AGUIRunRequest, agui_routes
from essessey.dialects.chat_completions import ChatCompletionRequest, chat_completions_routes
from essessey.dialects.responses import ResponsesRequest, responses_routes
from essessey.dialects.ui import ChatRequest, ui_chat_routes
from essessey.hub import TurnProducer
from essessey.shutdown import begin_shutdown
from tests.processes import WAIT
from tests.scripted_turn import scripted_turn
from tests.servers import serve

pytestmark = pytest.mark.anyio

PING_INTERVAL = 0.05
SEND_TIMEOUT = 0.25
BIG_DELTAS = 3_000
BIG_DELTA = "x" * 10_000  # 30 MB in all: more than any socket buffers hold


def big_turn(stream_id: str) -> TurnProducer:
    async def produce(p: Publisher) -> None:
        await p.send_stream_preamble("msg_big", stream_id, "big")
        await p.send_content_block_start_text(0)
        for _ in range(BIG_DELTAS):
            await p.send_content_block_delta_text(0, BIG_DELTA)
        await p.send_content_block_stop(0)
        await p.send_stream_epilogue(StopReason.END_TURN, BIG_DELTAS)

    return produce


def turn_for(stream_id: str, options: dict[str, Any]) -> TurnProducer:
    if options.get("big"):
        return big_turn(stream_id)
    return scripted_turn(stream_id, delay=float(options.get("delay_ms", 0)) / 1000)


def ui_turn(chat: ChatRequest) -> TurnProducer:
    return turn_for(chat.id, chat.body)


def chat_turn(request: ChatCompletionRequest) -> TurnProducer:
    return turn_for(request.id, request.body)


def responses_turn(request: ResponsesRequest) -> TurnProducer:
    return turn_for(request.id, request.body)


def agui_turn(run: AGUIRunRequest) -> TurnProducer:
    return turn_for(run.id, run.body.get("forwardedProps") or {})


# Each dialect: its POST (path, body with the turn's options) and the frame its whole
# stream ends with.
DIALECTS: dict[str, tuple[str, Any, bytes]] = {
    "ui": (
        "/api/chat",
        lambda n, o: {"id": f"chat-{n}", "messages": [{"role": "user"}], **o},
        b"data: [DONE]",
    ),
    "agui": (
        "/agui",
        lambda n, o: {"threadId": "t", "runId": f"r-{n}", "messages": [], "forwardedProps": o},
        b'"RUN_FINISHED"',
    ),
    "chat_completions": (
        "/v1/chat/completions",
        lambda n, o: {"model": "m", "messages": [{"role": "user"}], "stream": True, **o},
        b"data: [DONE]",
    ),
    "responses": (
        "/v1/responses",
        lambda n, o: {"model": "m", "input": "x", "stream": True, **o},
        b"event: response.completed",
    ),
}


@pytest.fixture
def base_url() -> Iterator[str]:
    hub = StreamHub()
    options: dict[str, Any] = {"ping_interval": PING_INTERVAL, "send_timeout": SEND_TIMEOUT}

    async def shutdown(request: Request) -> JSONResponse:
        begin_shutdown()
        return JSONResponse({"shutting_down": True})

    routes = [
        *ui_chat_routes(hub, ui_turn, **options),
        *agui_routes(hub, agui_turn, **options),
        *chat_completions_routes(hub, chat_turn, **options),
        *responses_routes(hub, responses_turn, **options),
        Route("/shutdown", shutdown, methods=["POST"]),
    ]
    app = Starlette(routes=routes, lifespan=hub.lifespan)
    with serve(app, lifespan="on") as url:
        yield url


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_an_idle_stream_gets_pings_and_ends_whole(base_url: str, dialect: str) -> None:
    path, body, end = DIALECTS[dialect]
    async with httpx.AsyncClient(base_url=base_url, timeout=WAIT) as http:
        # 75 ms between deltas: more than a ping's time, several times over.
        response = await http.post(path, json=body(1, {"delay_ms": 75}))
    assert response.status_code == 200, response.text
    assert b": ping\n" in response.content
    assert end in response.content.rstrip().split(b"\n\n")[-1]  # the dialect's own end
    decoder = SSEDecoder()
    messages = decoder.feed(response.content) + decoder.close()
    assert [m for m in messages if m.id]  # the protocol's ids, for a resume


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_shutdown_ends_the_stream_with_a_retry_hint(base_url: str, dialect: str) -> None:
    path, body, end = DIALECTS[dialect]
    received = b""
    async with httpx.AsyncClient(base_url=base_url, timeout=WAIT) as http:
        with anyio.fail_after(WAIT):
            async with http.stream("POST", path, json=body(2, {"delay_ms": 50})) as response:
                async for piece in response.aiter_bytes():
                    if not received:
                        await http.post("/shutdown")
                    received += piece
    assert received.endswith(b"retry: 1000\n")
    assert end not in received  # cut, not finished: the client comes back


def drain(connection: socket.socket) -> None:
    """Read ``connection`` to its end."""
    while connection.recv(1 << 20):
        pass


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_stalled_client_is_reset_after_the_send_timeout(
    base_url: str, dialect: str, caplog: pytest.LogCaptureFixture
) -> None:
    path, body, _ = DIALECTS[dialect]
    payload = httpx.Request("POST", base_url + path, json=body(3, {"big": True}))
    host, port = base_url.removeprefix("http://").split(":")
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(payload.content)}\r\n\r\n"
    ).encode()
    caplog.set_level(logging.WARNING, "essessey.sse")
    with socket.socket() as stalled:
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect((host, int(port)))
        stalled.sendall(head + payload.content)
        # Not a byte read: the server's sends fill the buffers and stall.
        deadline = time.monotonic() + SEND_TIMEOUT + 30
        while "a send stalled" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "a send stalled" in caplog.text
        stalled.settimeout(WAIT)
        with pytest.raises(ConnectionResetError):  # reset, not a close waiting for reads
            drain(stalled)


class _CountingStore(InMemoryEventStore):
    """Counts the reads of a stream whole that are under way at once."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0
        self.most = 0

    async def since(self, stream_id: str, last_event_id: str | None) -> tuple[list[Event], bool]:
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await anyio.sleep(0.02)  # a store's round trip, during which others start theirs
            return await super().since(stream_id, last_event_id)
        finally:
            self.now -= 1


def test_whole_answers_are_built_a_few_at_a_time() -> None:
    # A crowd of retrieves of one finished turn (each reads the stream's log whole and
    # builds its answer from it) holds the log a few times, not once per request.
    store = _CountingStore()
    hub = StreamHub(store)
    routes = [
        *chat_completions_routes(hub, chat_turn),
        *responses_routes(hub, responses_turn),
    ]
    app = Starlette(routes=routes, lifespan=hub.lifespan)
    with serve(app, lifespan="on") as url:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": False}
        made = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=WAIT)
        assert made.status_code == 200
        completion_id = made.json()["id"]
        response = httpx.post(f"{url}/v1/responses", json={"model": "m", "input": "hi"})
        assert response.status_code == 200
        response_id = response.json()["id"]
        store.most = 0

        async def crowd() -> list[int]:
            async with httpx.AsyncClient(base_url=url, timeout=WAIT) as client:
                json_only = {"accept": "application/json"}
                paths = [f"/v1/chat/completions/{completion_id}"] * 12
                paths += [f"/v1/responses/{response_id}"] * 12
                answers = [0] * len(paths)

                async def get(i: int) -> None:
                    answers[i] = (await client.get(paths[i], headers=json_only)).status_code

                async with anyio.create_task_group() as tasks:
                    for i in range(len(paths)):
                        tasks.start_soon(get, i)
                return answers

        statuses = anyio.run(crowd)
    assert statuses == [200] * 24
    # A gate per dialect's routes: two here.
    assert 1 <= store.most <= WHOLE_BUILDS_AT_ONCE * 2
