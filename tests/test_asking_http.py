"""The answer route of the hub's SSE routes over a real uvicorn server: what a client
posts, what it gets back, and the continuation it then reads by resuming the stream."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from essessey import (
    Answered,
    Publisher,
    StreamHub,
    check,
    continue_turn,
    reassemble_events,
    stream_turn,
)
from essessey.bindings.answering import answer_route
from essessey.bindings.sse import connect, hub_routes
from essessey.bindings.ws import ws_route
from tests.clients import read_ws
from tests.servers import serve

pytestmark = pytest.mark.anyio


async def go_on(publisher: Publisher, answered: Answered) -> None:
    async with continue_turn(publisher, answered) as turn:
        [(question, answer)] = answered.questions()
        await (await turn.text()).write(f"{question.question} {answer.value}")


def authorize(request: Any, stream_id: str, access: str) -> bool:
    return not (stream_id == "locked" and access == "answer")


hub = StreamHub(on_answer=go_on, authorize=authorize)


async def ask(request: Request) -> Response:
    stream_id = request.path_params["stream_id"]

    async def produce(publisher: Publisher) -> None:
        async with stream_turn(publisher, message_id="m1", stream_id=stream_id, model="m") as t:
            await t.ask("Which city?", schema={"type": "string"}, request_id="q_" + stream_id)

    await hub.start(stream_id, produce)
    await hub.wait(stream_id)
    return JSONResponse({"asked": stream_id})


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    async with hub:
        yield


app = Starlette(
    routes=[
        *hub_routes(hub),
        Route("/ask/{stream_id}", ask, methods=["POST"]),
        # A WebSocket app's own mount: its subscriptions and the answer route alone.
        ws_route(hub, "/ws/{stream_id}"),
        answer_route(hub, "/ws/{stream_id}/answer"),
    ],
    lifespan=lifespan,
)


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    with serve(app, lifespan="on") as url:
        yield url


async def test_an_answer_posted_continues_the_stream_and_a_resume_reads_it(base: str) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        assert (await http.post(f"{base}/ask/s1")).status_code == 200
        first = []
        async with connect(http, "GET", f"{base}/streams/s1") as stream:
            first = [event async for event in stream]
        assert [r.id for r in reassemble_events(first).pending] == ["q_s1"]
        body = {"answers": [{"id": "q_s1", "value": "Oslo"}]}
        answered = await http.post(f"{base}/streams/s1/answer", json=body)
        assert answered.status_code == 200, answered.text
        assert answered.json() == {"stream_id": "s1", "after": first[-1].id, "started": True}
        again = await http.post(f"{base}/streams/s1/answer", json=body)
        assert again.json()["started"] is False
        async with connect(http, "GET", f"{base}/streams/s1", last_event_id=first[-1].id) as s:
            rest = [event async for event in s]
    whole = first + rest
    assert check(whole) == []
    parsed = reassemble_events(whole)
    assert parsed.messages[1].text == "Which city? Oslo"
    assert parsed.pending == ()


@pytest.mark.parametrize(
    ("stream_id", "body", "status", "error_type"),
    [
        ("s2", b"not json", 400, "invalid_request_error"),
        ("s2", {"answers": []}, 400, "invalid_request_error"),
        ("s2", {"answers": [{"id": "q_s2", "value": 1, "approved": True}]}, 400, None),
        ("s2", {"answers": [{"id": "q_other", "value": 1}]}, 400, "invalid_request_error"),
        ("nowhere", {"answers": [{"id": "q", "value": 1}]}, 404, "not_found_error"),
        ("locked", {"answers": [{"id": "q_locked", "value": 1}]}, 403, "permission_error"),
        ("bad.id", {"answers": [{"id": "q", "value": 1}]}, 400, "invalid_request_error"),
    ],
)
async def test_a_refused_answer_says_why(
    base: str, stream_id: str, body: Any, status: int, error_type: str | None
) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        if stream_id in ("s2", "locked"):
            await http.post(f"{base}/ask/{stream_id}")
        url = f"{base}/streams/{stream_id}/answer"
        if isinstance(body, bytes):
            response = await http.post(url, content=body)
        else:
            response = await http.post(url, json=body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["type"] == (error_type or "invalid_request_error")


async def test_an_answer_to_a_stream_that_asks_nothing_is_a_409(base: str) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        await http.post(f"{base}/ask/s3")
        await http.post(f"{base}/streams/s3/answer", json={"answers": [{"id": "q_s3", "value": 2}]})
        other = await http.post(
            f"{base}/streams/s3/answer", json={"answers": [{"id": "q_s3", "value": 3}]}
        )
    assert other.status_code == 409
    assert other.json()["error"]["type"] == "conflict_error"


async def test_a_websocket_client_answers_and_resumes_for_the_continuation(base: str) -> None:
    ws_base = base.replace("http://", "ws://")
    async with httpx.AsyncClient(timeout=10) as http:
        await http.post(f"{base}/ask/w1")
        asked = await read_ws(f"{ws_base}/ws/w1", close_code=1000)
        body = {"answers": [{"id": "q_w1", "value": "Lima"}]}
        answered = await http.post(f"{base}/ws/w1/answer", json=body)
    assert answered.status_code == 200, answered.text
    assert answered.json()["after"] == asked[-1].id
    rest = await read_ws(f"{ws_base}/ws/w1?last_event_id={asked[-1].id}", close_code=1000)
    assert check(asked + rest) == []
    assert reassemble_events(asked + rest).messages[1].text == "Which city? Lima"


def test_the_answer_route_needs_the_stream_id_in_its_path() -> None:
    with pytest.raises(ValueError, match="stream_id"):
        answer_route(hub, "/answer")


def test_a_hub_without_on_answer_refuses_answers_without_a_500(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The README's backend: hub_routes serve the answer route on a hub that cannot take
    # answers. A client is refused (404 for a stream it does not know, 409 for one that
    # asks), never a 500; the app's developer reads why, once.
    plain = StreamHub()

    async def asking(request: Request) -> Response:
        async def produce(publisher: Publisher) -> None:
            async with stream_turn(publisher, message_id="m1", stream_id="q", model="m") as t:
                await t.ask("Which city?", schema={"type": "string"}, request_id="q_1")

        await plain.start("q", produce)
        await plain.wait("q")
        return Response(status_code=204)

    answer = {"answers": [{"type": "answer", "id": "q_1", "value": "Oslo"}]}
    routes = [*hub_routes(plain), Route("/ask", asking, methods=["POST"])]
    with (
        caplog.at_level("WARNING", logger="essessey.hub"),
        serve(Starlette(routes=routes, lifespan=plain.lifespan), lifespan="on") as url,
    ):
        assert httpx.post(f"{url}/ask").status_code == 204
        unknown = httpx.post(f"{url}/streams/nobody/answer", json=answer)
        asked = [httpx.post(f"{url}/streams/q/answer", json=answer) for _ in range(2)]
    assert unknown.status_code == 404
    assert [r.status_code for r in asked] == [409, 409]
    assert asked[0].json()["error"]["message"] == "this server takes no answers"
    said = [r.getMessage() for r in caplog.records if "no on_answer" in r.getMessage()]
    assert len(said) == 1
