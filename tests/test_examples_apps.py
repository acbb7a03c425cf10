"""The app examples, served by real uvicorn: examples/fastapi_app.py (an agent turn in a
hub, read over SSE and WebSocket, resumed, cancelled) and examples/openai_proxy.py (a
scripted OpenAI-compatible model, proxied as essessey SSE); and each one as a script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

import essessey
from essessey.bindings.sse import SSEDecoder, connect
from essessey.reassemble import TextItem
from tests.clients import read_sse, read_ws
from tests.processes import free_port, stop_process, wait_for_port
from tests.servers import serve
from tests.test_examples import load_example

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def layout(events: list[essessey.Event]) -> list[tuple[int, str]]:
    starts = (event.json() for event in events if event.event == "content_block_start")
    return [(start["index"], start["content_block"]["type"]) for start in starts]


def texts(parsed: essessey.ParsedStream) -> list[str]:
    return [item.text for item in parsed.timeline if isinstance(item, TextItem)]


# -- examples/fastapi_app.py -------------------------------------------------------------

PROMPT = 'Weather in "Paris" and Oslo?'
ANSWER = "Paris: sunny, 21 °C. Oslo: snow, -3 °C."


@contextmanager
def fastapi_app(monkeypatch: pytest.MonkeyPatch, pause: float) -> Iterator[tuple[Any, str]]:
    example = load_example("fastapi_app")
    monkeypatch.setattr(example, "PAUSE", pause)
    with serve(example.app, lifespan="on") as base_url:
        yield example, base_url


async def start_chat(client: httpx.AsyncClient) -> str:
    created = await client.post("/chat", json={"prompt": PROMPT})
    assert created.status_code == 201
    stream_id: str = created.json()["stream_id"]
    return stream_id


@pytest.mark.anyio
async def test_fastapi_app_streams_an_agent_turn_over_sse_and_ws(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with fastapi_app(monkeypatch, 0) as (_, base_url):
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
            stream_id = await start_chat(client)
            events = await read_sse(client, f"/chat/{stream_id}")
        ws_url = f"ws{base_url.removeprefix('http')}/chat/{stream_id}/ws"
        over_ws = await read_ws(ws_url, close_code=1000)
        resumed_ws = await read_ws(
            f"{ws_url}?{urlencode({'last_event_id': events[5].id})}", close_code=1000
        )

    assert essessey.check(events) == []
    parsed = essessey.reassemble_events(events)
    assert parsed.complete
    assert parsed.stop_reason == "end_turn"
    assert parsed.thinking == f"The user asks: {PROMPT!r}. Check both cities at once."
    assert [(e.call.name, e.call.params, e.result, e.is_error) for e in parsed.executions] == [
        ("get_weather", {"city": "Paris"}, '{"city":"Paris","sky":"sunny","celsius":21}', False),
        ("get_weather", {"city": "Oslo"}, '{"city":"Oslo","sky":"snow","celsius":-3}', False),
    ]
    assert texts(parsed) == ["Checking Paris and Oslo.", ANSWER]
    # Round 1: thinking, text, two calls, their results in call order; round 2: the answer.
    assert layout(events) == [
        (0, "thinking"),
        (1, "text"),
        (2, "tool_use"),
        (3, "tool_use"),
        (4, "tool_result"),
        (5, "tool_result"),
        (6, "text"),
    ]
    # The WebSocket carries the very same events, ids included, and resumes the same way.
    assert over_ws == events
    assert resumed_ws == events[6:]


@pytest.mark.anyio
async def test_fastapi_app_resumes_mid_turn_exactly_once(monkeypatch: pytest.MonkeyPatch) -> None:
    with fastapi_app(monkeypatch, 0.02) as (example, base_url):
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
            stream_id = await start_chat(client)
            url = f"/chat/{stream_id}"

            # Read part of the turn, then drop the connection (leaving the block closes it).
            first_part: list[essessey.Event] = []
            async with connect(client, "GET", url) as events:
                async for event in events:
                    first_part.append(event)
                    if len(first_part) == 8:
                        break
            assert example.app.state.hub.running(stream_id)  # mid-turn, still running

            # Resume with Last-Event-ID, as an EventSource does after a drop.
            rest = await read_sse(client, url, last_event_id=first_part[-1].id)
            # And with ?last_event_id=, as a page that reloads does.
            after_reload = await read_sse(client, url, params={"last_event_id": first_part[3].id})
            # The whole turn, read again from the start once it has finished.
            whole = await read_sse(client, url)

    assert first_part + rest == whole  # nothing lost, nothing repeated
    assert first_part[:4] + after_reload == whole
    ids = [event.id for event in whole]
    assert all(ids)
    assert len(set(ids)) == len(ids)
    assert essessey.check(whole) == []
    assert texts(essessey.reassemble_events(whole))[-1] == ANSWER


@pytest.mark.anyio
async def test_fastapi_app_cancel_ends_the_turn_for_its_readers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with fastapi_app(monkeypatch, 0.05) as (_, base_url):
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
            stream_id = await start_chat(client)
            url = f"/chat/{stream_id}"
            received: list[essessey.Event] = []
            async with connect(client, "GET", url) as events:
                async for event in events:
                    received.append(event)
                    # Cancel while the tools run: both calls are out, no result yet.
                    if layout(received)[-1:] == [(3, "tool_use")] and event.event == (
                        "content_block_stop"
                    ):
                        cancelled = await client.post(f"{url}/cancel")
                        assert cancelled.status_code == 200
                        assert cancelled.json() == {"cancelled": True}
            again = await client.post(f"{url}/cancel")

    assert again.status_code == 404
    assert again.json()["error"]["type"] == "not_found_error"
    assert essessey.check(received) == []
    parsed = essessey.reassemble_events(received)
    assert parsed.stop_reason == "cancelled"
    assert [call.name for call in parsed.tool_calls] == ["get_weather", "get_weather"]
    assert ANSWER not in parsed.text


@pytest.mark.anyio
async def test_fastapi_app_refuses_bad_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    from websockets.asyncio.client import connect as ws_connect

    from essessey import WebSocketClosed
    from essessey.bindings.ws import WebSocketSource

    json_type = {"content-type": "application/json"}
    with fastapi_app(monkeypatch, 0) as (_, base_url):
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
            for body in (b"", b"{", b"[]", b"{}", b'{"prompt": 3}', b'{"prompt": ""}'):
                response = await client.post("/chat", content=body, headers=json_type)
                assert response.status_code == 400, body
                assert response.json()["type"] == "error"
                assert response.json()["error"]["type"] == "invalid_request_error"
            missing = await client.get("/chat/chat_none")
            assert missing.status_code == 404
            assert missing.json()["error"]["type"] == "not_found_error"
            cancel = await client.post("/chat/chat_none/cancel")
            assert cancel.status_code == 404
        async with ws_connect(f"ws{base_url.removeprefix('http')}/chat/chat_none/ws") as socket:
            with pytest.raises(WebSocketClosed) as closed:
                await anext(aiter(WebSocketSource(socket)))
    assert closed.value.code == 4404


# -- examples/openai_proxy.py ------------------------------------------------------------

# Both quote kinds, non-ASCII: the arguments' JSON escapes, cut into fragments.
PROXY_PROMPT = 'Fait-il plus froid à "Oslo" qu\'à Paris, en °C ?'


def script_of(chunks: list[dict[str, Any]]) -> tuple[str, str, list[tuple[str, str]]]:
    """The reasoning, the text and the tool calls (name, arguments) a script streams."""
    reasoning = text = ""
    calls: dict[int, list[str]] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            reasoning += delta.get("reasoning_content") or ""
            text += delta.get("content") or ""
            for call in delta.get("tool_calls") or ():
                function = call.get("function", {})
                entry = calls.setdefault(call["index"], ["", ""])
                entry[0] += function.get("name") or ""
                entry[1] += function.get("arguments") or ""
    return reasoning, text, [(name, arguments) for name, arguments in calls.values()]


@pytest.mark.anyio
async def test_openai_proxy_publishes_its_upstream_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    example = load_example("openai_proxy")
    monkeypatch.setattr(example, "PAUSE", 0)
    # The default app: its upstream is its own scripted model, at the request's address.
    with serve(example.app, lifespan="on") as base_url:
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
            events = await read_sse(client, "/turn", params={"prompt": PROXY_PROMPT})
            anthropic = await read_sse(
                client, "/turn", params={"prompt": PROXY_PROMPT, "dialect": "anthropic"}
            )
            refused = [
                await client.get("/turn"),
                await client.get("/turn", params={"prompt": "  "}),
                await client.get("/turn", params={"prompt": "x", "dialect": "other"}),
            ]

    chunks = example.scripted_chunks(
        PROXY_PROMPT, model="scripted-model", tools=True, include_usage=True
    )
    reasoning, text, calls = script_of(chunks)
    assert calls == [("search", orjson.dumps({"query": PROXY_PROMPT}).decode())]
    for received in (events, anthropic):
        assert essessey.check(received) == []
        parsed = essessey.reassemble_events(received)
        assert parsed.complete
        assert parsed.thinking == reasoning
        assert parsed.text == text
        assert [(call.name, call.arguments) for call in parsed.tool_calls] == calls
        assert parsed.tool_calls[0].params == {"query": PROXY_PROMPT}
        assert parsed.stop_reason == "tool_use"
        assert parsed.model == "scripted-model"
        assert parsed.usage["output_tokens"] == chunks[-1]["usage"]["completion_tokens"]
    assert "stream_id" in events[0].json()["message"]
    for response in refused:
        assert response.status_code == 400
        assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.anyio
async def test_openai_proxy_upstream_speaks_chat_completions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from openai import AsyncOpenAI
    from openai.types.chat import ChatCompletionChunk

    from essessey.adapters import openai as openai_adapter

    example = load_example("openai_proxy")
    monkeypatch.setattr(example, "PAUSE", 0)
    request = {
        "model": "some-model",
        "messages": [{"role": "user", "content": PROXY_PROMPT}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": example.TOOLS,
    }
    with serve(example.app, lifespan="on") as base_url:
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
            async with client.stream("POST", "/v1/chat/completions", json=request) as response:
                assert response.status_code == 200
                assert response.headers["content-type"].startswith("text/event-stream")
                decoder = SSEDecoder()
                messages = [
                    m async for piece in response.aiter_bytes() for m in decoder.feed(piece)
                ]
            refusals = [
                await client.post("/v1/chat/completions", json={**request, "stream": False}),
                await client.post("/v1/chat/completions", json={"messages": []}),
                await client.post("/v1/chat/completions", content=b"not json"),
            ]
            # The official SDK reads the endpoint, and the adapter publishes what it yields.
            async with AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused") as sdk:
                stream = await sdk.chat.completions.create(
                    model="some-model",
                    messages=[{"role": "user", "content": PROXY_PROMPT}],
                    tools=example.TOOLS,
                    stream=True,
                )
                sink = essessey.InMemorySink()
                seen = await openai_adapter.publish(
                    essessey.Publisher(sink), stream, message_id="msg_1", stream_id="conv_1"
                )

    assert messages[-1].data == "[DONE]"
    chunks = [ChatCompletionChunk.model_validate(orjson.loads(m.data)) for m in messages[:-1]]
    assert all(chunk.model == "some-model" for chunk in chunks)
    deltas = [choice.delta for chunk in chunks for choice in chunk.choices]
    assert any((delta.model_extra or {}).get("reasoning_content") for delta in deltas)
    fragments = [call for delta in deltas for call in delta.tool_calls or ()]
    assert len(fragments) > 2  # the name, then the arguments in pieces
    assert chunks[-2].choices[0].finish_reason == "tool_calls"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens_details is not None
    assert all(chunk.usage is None for chunk in chunks[:-1])

    for refusal in refusals:
        assert refusal.status_code == 400
        assert refusal.json()["error"]["type"] == "invalid_request_error"

    assert essessey.check(sink.events) == []
    assert [(call.name, call.input) for call in seen.tool_calls] == [
        ("search", {"query": PROXY_PROMPT})
    ]
    assert seen.thinking.startswith("The user asks:")
    assert seen.usage == {}  # no usage chunk: the SDK call did not ask for one


def failing_upstream() -> Starlette:
    """An OpenAI-compatible server that fails in the way the requested model names."""

    async def sse(body: list[bytes]) -> AsyncIterator[bytes]:
        for piece in body:
            yield piece

    def data(payload: object) -> bytes:
        return b"data: " + orjson.dumps(payload) + b"\n\n"

    good = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}],
    }
    error = {"error": {"message": "the model crashed", "type": "server_error"}}

    async def completions(request: Request) -> Response:
        model = (await request.json())["model"]
        if model.startswith("status-"):
            status = int(model.removeprefix("status-"))
            return JSONResponse({"error": {"message": "no", "type": "x"}}, status_code=status)
        if model == "json":
            return JSONResponse({"id": "c1", "choices": []})
        body = {
            "error-first": [data(error)],
            "error-later": [data(good), data(error)],
            "no-done": [data(good)],
            "empty": [b"data: [DONE]\n\n"],
        }[model]
        return StreamingResponse(sse(body), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


@pytest.mark.anyio
async def test_openai_proxy_reports_upstream_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    example = load_example("openai_proxy")
    with (
        serve(failing_upstream()) as upstream_url,
        serve(example.app, lifespan="on") as base_url,
    ):
        settings = example.app.state.settings

        def use(upstream: str, model: str) -> None:
            example.app.state.settings = settings._replace(upstream=upstream, model=model)

        async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
            # Before the first chunk: an HTTP error with a JSON body, no stream.
            rejected: dict[str, tuple[int, str | None]] = {}
            for model in ("status-500", "status-404", "status-429", "status-503", "json"):
                use(f"{upstream_url}/v1", model)
                with pytest.raises(essessey.StreamHTTPError) as exc:
                    await read_sse(client, "/turn", params={"prompt": "hi"})
                assert exc.value.content_type == "application/json"
                rejected[model] = (exc.value.status, exc.value.error_type)
            for model in ("error-first", "empty"):
                use(f"{upstream_url}/v1", model)
                with pytest.raises(essessey.StreamHTTPError) as exc:
                    await read_sse(client, "/turn", params={"prompt": "hi"})
                rejected[model] = (exc.value.status, exc.value.error_type)
            use(f"http://127.0.0.1:{free_port()}/v1", "any")  # nothing listens there
            with pytest.raises(essessey.StreamHTTPError) as exc:
                await read_sse(client, "/turn", params={"prompt": "hi"})
            rejected["unreachable"] = (exc.value.status, exc.value.error_type)

            # After it: the stream has begun, so an error event ends it.
            failed = {}
            for model in ("error-later", "no-done"):
                use(f"{upstream_url}/v1", model)
                failed[model] = await read_sse(client, "/turn", params={"prompt": "hi"})

    assert rejected == {
        "status-500": (502, "api_error"),
        "status-404": (502, "api_error"),
        "status-429": (429, "rate_limit_error"),
        "status-503": (503, "overloaded_error"),
        "json": (502, "api_error"),
        "error-first": (502, "api_error"),
        "empty": (502, "api_error"),
        "unreachable": (502, "api_error"),
    }
    for events in failed.values():
        assert essessey.check(events) == []
        assert events[0].event == "message_start"
        assert events[-1].event == "error"
        assert events[-1].json()["error"]["type"] == "api_error"
        assert "crashed" not in events[-1].data.decode()  # the upstream's text stays there
        assert essessey.reassemble_events(events).text == "Hel"


# -- both, as scripts ---------------------------------------------------------------------


@contextmanager
def run_script(name: str) -> Iterator[str]:
    """Start ``python examples/<name>.py --port <free port>``; yield its base URL; stop it."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(EXAMPLES / f"{name}.py"), "--port", str(port)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        wait_for_port(port, process, name)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(process)


@pytest.mark.anyio
async def test_fastapi_app_runs_as_a_script() -> None:
    with run_script("fastapi_app") as base_url:
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
            stream_id = await start_chat(client)
            events = await read_sse(client, f"/chat/{stream_id}")
    assert essessey.check(events) == []
    assert texts(essessey.reassemble_events(events))[-1] == ANSWER


@pytest.mark.anyio
async def test_openai_proxy_runs_as_a_script() -> None:
    with run_script("openai_proxy") as base_url:
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
            events = await read_sse(client, "/turn", params={"prompt": "Hello"})
    assert essessey.check(events) == []
    parsed = essessey.reassemble_events(events)
    assert parsed.text == "Let me search for that."
    assert parsed.tool_calls[0].params == {"query": "Hello"}


@pytest.mark.anyio
async def test_dialects_app_serves_one_turn_in_every_dialect() -> None:
    import openai

    answer = load_example("dialects_app").ANSWER
    with run_script("dialects_app") as base_url:
        async with openai.AsyncOpenAI(
            base_url=f"{base_url}/v1", api_key="unused", max_retries=0
        ) as client:
            completion = await client.chat.completions.create(
                model="any", messages=[{"role": "user", "content": "Hi"}]
            )
            response = await client.responses.create(model="any", input="Hi")
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
            run = {"threadId": "t", "runId": "r", "messages": []}
            agui = await http.post("/agui", json=run)
            chat = {"id": "c1", "messages": [{"role": "user", "parts": []}]}
            ui = await http.post("/api/chat", json=chat)
            stream_id = completion.id
            events = await read_sse(http, f"/streams/{stream_id}")
    assert (completion.choices[0].message.content or "").strip() == answer
    assert response.output_text.strip() == answer
    agui_text = "".join(
        json.loads(m.data).get("delta", "")
        for m in SSEDecoder().feed(agui.content)
        if json.loads(m.data)["type"] == "TEXT_MESSAGE_CONTENT"
    )
    assert agui_text.strip() == answer
    ui_text = "".join(
        json.loads(m.data).get("delta", "")
        for m in SSEDecoder().feed(ui.content)
        if m.data != "[DONE]" and json.loads(m.data)["type"] == "text-delta"
    )
    assert ui_text.strip() == answer
    assert essessey.check(events) == []
    assert essessey.reassemble_events(events).text.strip() == answer


# -- the README's "A FastAPI backend in 20 lines" -----------------------------------------

README_BACKEND_HEADING = "## A FastAPI backend in 20 lines"


def readme_backend() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index(README_BACKEND_HEADING) :]
    start = section.index("```python\n") + len("```python\n")
    return section[start : section.index("```", start)]


def test_the_readme_backend_is_as_short_as_its_heading_says() -> None:
    lines = [line for line in readme_backend().splitlines() if line.strip()]
    assert len(lines) <= 20, len(lines)


@pytest.mark.anyio
async def test_the_readme_backend_serves_a_turn_and_resumes_it() -> None:
    namespace: dict[str, Any] = {"__name__": "readme_backend"}
    exec(compile(readme_backend(), "README.md", "exec"), namespace)
    with serve(namespace["app"], lifespan="on") as base_url:
        async with httpx.AsyncClient(timeout=10.0) as client:
            started = await client.post(f"{base_url}/turns")
            assert started.status_code == 200
            stream_id = started.json()["stream_id"]
            whole = await read_sse(client, f"{base_url}/turns/{stream_id}")
            parsed = essessey.reassemble_events(whole)
            assert texts(parsed) == ["Hello, world."]
            assert parsed.stop_reason == "end_turn"
            assert essessey.check(whole) == []
            # A resume from the first text delta gets what came after it, and nothing more.
            delta = next(e for e in whole if e.event == "content_block_delta")
            rest = await read_sse(
                client, f"{base_url}/turns/{stream_id}", headers={"Last-Event-ID": delta.id}
            )
            assert rest == whole[whole.index(delta) + 1 :]


# -- examples/approval_app.py ------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "said", "sent"), [("approve", "Sent.", 1), ("deny", "I did not send it.", 0)]
)
def test_approval_app_asks_before_sending_and_use_chat_decides(
    node_client: Path, action: str, said: str, sent: int
) -> None:
    from tests.test_ui_asking import parts_of, run_chat

    example = load_example("approval_app")
    with serve(example.app, lifespan="on") as base_url:
        result = run_chat(base_url, f"mail-{action}", "send", "Mail ada@example.com", action)
    assert (result["status"], result["errors"]) == ("ready", [])
    _, answer = result["messages"]  # one assistant message, continued after the decision
    parts = parts_of(answer)
    call = next(part for part in parts if part["type"] == "tool-send_email")
    assert call["input"] == {"to": "ada@example.com", "subject": "Hi"}
    assert call["state"] == ("output-available" if action == "approve" else "output-denied")
    assert parts[-1] == {"type": "text", "text": said, "state": "done"}
    assert len(example.OUTBOX) == sent
