"""Smoke tests of the examples: each one runs as documented and streams a valid turn."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import anyio
import httpx
import orjson
import pytest

import essessey
from essessey.bindings.sse import SSEDecoder, connect
from tests.browser import CHROMIUM, CHROMIUM_ARGS, MISSING_REASON
from tests.browser import MISSING as CHROMIUM_MISSING
from tests.nats_server import NatsServer
from tests.processes import free_port
from tests.servers import serve

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load_example(name: str) -> ModuleType:
    # examples/ is not a package: load the file the way `python examples/<name>` would
    # see it, without running its __main__ block.
    path = EXAMPLES / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quickstart_prints_a_valid_turn() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.startswith("event: message_start\ndata: ")
    assert "event: content_block_delta\n" in result.stdout
    assert result.stdout.rstrip().endswith("0 protocol violations")


@pytest.mark.anyio
async def test_fastapi_example_streams_a_valid_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    example = load_example("fastapi_sse")
    # The pacing is for people watching, not for tests.
    monkeypatch.setattr(example, "PAUSE", 0)

    with serve(example.app) as base_url:
        async with (
            httpx.AsyncClient(base_url=base_url, timeout=30) as client,
            client.stream("GET", "/turn") as response,
        ):
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            decoder = SSEDecoder()
            messages = []
            async for chunk in response.aiter_bytes():
                messages.extend(decoder.feed(chunk))
            messages.extend(decoder.close())

    events = [essessey.Event(m.event, m.data.encode()) for m in messages]
    assert essessey.check(events) == []
    names = [event.event for event in events]
    assert names[0] == "message_start"
    assert names[-1] == "message_stop"

    blocks = [e.json()["content_block"]["type"] for e in events if e.event == "content_block_start"]
    assert blocks == ["thinking", "text", "tool_use", "tool_result"]

    parsed = essessey.reassemble_events(events)
    assert parsed.complete
    assert parsed.thinking == "The user asks about the weather; I should call the tool."
    assert parsed.text == "Let me check the weather in Paris."
    assert [(call.name, call.params) for call in parsed.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert [result.text for result in parsed.tool_results] == ['{"temp_c": 18, "sky": "clear"}']
    assert parsed.stop_reason == "tool_use"


@pytest.mark.anyio
async def test_resume_example_resumes_a_dropped_turn_exactly_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    example = load_example("resume_app")
    # Fast, but not instant: the first read drops the connection mid-turn.
    monkeypatch.setattr(example, "PAUSE", 0.002)

    with serve(example.app, lifespan="on") as base_url:
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
            page = await client.get("/")
            assert page.status_code == 200
            assert "new EventSource(" in page.text
            assert "last_event_id" in page.text

            created = await client.post("/streams")
            assert created.status_code == 201
            stream_id = created.json()["stream_id"]
            token = created.json()["token"]
            url = f"/streams/{stream_id}"
            auth = {"authorization": f"Bearer {token}"}

            # Read part of the turn, then drop the connection (leaving the block closes it).
            first_part: list[essessey.Event] = []
            async with connect(client, "GET", url, headers=auth) as events:
                async for event in events:
                    first_part.append(event)
                    if len(first_part) == 10:
                        break
            assert len(first_part) == 10

            # Resume with Last-Event-ID, as an EventSource does after a drop.
            async with connect(
                client, "GET", url, headers=auth, last_event_id=first_part[-1].id
            ) as events:
                rest = [event async for event in events]

            # And as the page does after a reload: ?last_event_id= and ?token=.
            middle = first_part + rest[: len(rest) // 2]
            async with connect(
                client,
                "GET",
                url,
                params={"token": token, "last_event_id": middle[-1].id or ""},
            ) as events:
                after_reload = [event async for event in events]

            # The whole turn, read again from the start once it has finished.
            async with connect(client, "GET", url, headers=auth) as events:
                whole = [event async for event in events]

    turn = first_part + rest
    assert turn == whole
    assert middle + after_reload == whole
    ids = [event.id for event in turn]
    assert all(ids)
    assert len(set(ids)) == len(ids)  # each event exactly once
    assert essessey.check(turn) == []
    assert turn[0].event == "message_start"
    assert turn[-1].event == "message_stop"
    parsed = essessey.reassemble_events(turn)
    assert parsed.complete
    assert parsed.text == example.REPLY
    assert parsed.stop_reason == "end_turn"


@pytest.mark.anyio
async def test_resume_example_checks_the_stream_token(monkeypatch: pytest.MonkeyPatch) -> None:
    example = load_example("resume_app")
    monkeypatch.setattr(example, "PAUSE", 0.05)  # the turn still runs when it is cancelled

    with serve(example.app, lifespan="on") as base_url:
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
            first = (await client.post("/streams")).json()
            other = (await client.post("/streams")).json()
            url = f"/streams/{first['stream_id']}"
            for headers in ({}, {"authorization": f"Bearer {other['token']}"}):
                # Read, resume, cancel: 403 and not a single event.
                read = await client.get(url, headers=headers)
                resume = await client.get(url, headers={**headers, "last-event-id": "x-1"})
                cancel = await client.post(url + "/cancel", headers=headers)
                for response in (read, resume, cancel):
                    assert response.status_code == 403
                    assert response.headers["content-type"] == "application/json"
                    assert response.json()["error"]["type"] == "permission_error"

            auth = {"authorization": f"Bearer {first['token']}"}
            cancelled = await client.post(url + "/cancel", headers=auth)
            assert cancelled.status_code == 200
            assert cancelled.json() == {"cancelled": True}
            async with connect(client, "GET", url, headers=auth) as events:
                received = [event async for event in events]

    assert essessey.check(received) == []
    parsed = essessey.reassemble_events(received)
    assert parsed.stop_reason == "cancelled"
    assert example.REPLY.startswith(parsed.text)
    assert parsed.text != example.REPLY


@pytest.mark.anyio
@pytest.mark.skipif(CHROMIUM_MISSING, reason=MISSING_REASON)
async def test_resume_example_page_resumes_after_a_reload(monkeypatch: pytest.MonkeyPatch) -> None:
    from playwright.async_api import async_playwright

    example = load_example("resume_app")
    monkeypatch.setattr(example, "PAUSE", 0.03)  # about 2 s: time to reload in the middle
    wait_ms = 15_000
    text_js = "document.getElementById('text').textContent"
    status_js = "document.getElementById('status').textContent"

    with serve(example.app, lifespan="on") as base_url:
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(
                executable_path=str(CHROMIUM),
                headless=True,
                args=CHROMIUM_ARGS,
            )
            try:
                tab = await browser.new_page()
                await tab.goto(base_url + "/", timeout=wait_ms)
                await tab.click("#start")
                await tab.wait_for_function(f"{text_js}.length > 40", timeout=wait_ms)
                assert not (await tab.evaluate(status_js)).startswith("done")
                await tab.reload()
                await tab.wait_for_function(f"{status_js}.startsWith('done')", timeout=wait_ms)
                text: str = await tab.evaluate(text_js)
                status: str = await tab.evaluate(status_js)
            finally:
                await browser.close()

    # Every word once: the text before the reload, then the rest from the last id.
    assert text == example.REPLY
    assert status == "done (end_turn)"


def run_nats_fanout(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / "nats_fanout.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "NATS_URL": url},
    )


def test_nats_fanout_example_reads_the_turn_back_every_way(nats: NatsServer) -> None:
    result = run_nats_fanout(nats.url)
    assert result.returncode == 0, result.stderr
    text = repr("".join(load_example("nats_fanout").WORDS))
    events = 6 + len(load_example("nats_fanout").WORDS)  # preamble, one block, epilogue
    lines = [line.strip() for line in result.stdout.splitlines()]
    assert lines[0].startswith("core NATS: stream conv_")
    # Both core readers got the whole turn, ids from the header included.
    for reader in ("subscribe_stream:", "subscribe_all:"):
        line = next(line for line in lines if line.startswith(reader))
        assert line.endswith(f"{events} events, ids 1..{events}, text {text}")
    # JetStream: live on one replica, replayed on the other, resumed exactly.
    assert any(line.startswith("JetStream: stream conv_") for line in lines)
    for reader in ("live reader (replica A):", "late reader (replica B):"):
        line = next(line for line in lines if line.startswith(reader))
        assert f" {events} events, ids " in line
        assert line.endswith(f"text {text}")
    assert "same events and ids: True" in lines
    resumed = next(line for line in lines if line.startswith("resumed after "))
    assert resumed.endswith(f"{events - events // 2} events, exactly the rest: True")


def test_nats_fanout_example_says_when_no_server_answers() -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    result = run_nats_fanout(url)
    assert result.returncode == 1
    assert result.stdout == ""
    assert f"cannot reach a NATS server at {url}" in result.stderr
    assert "nats-server -js" in result.stderr


@pytest.mark.anyio
async def test_ws_example_resumes_a_dropped_turn_exactly_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from urllib.parse import urlencode

    from websockets.asyncio.client import connect as ws_connect

    from essessey import WebSocketClosed
    from essessey.bindings.ws import WebSocketSource

    example = load_example("ws_app")
    # Fast, but not instant: the first read drops the connection mid-turn.
    monkeypatch.setattr(example, "PAUSE", 0.002)

    with serve(example.app, lifespan="on") as base_url:
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
            page = await client.get("/")
            assert page.status_code == 200
            assert "new WebSocket(" in page.text
            assert "last_event_id" in page.text

            created = await client.post("/streams")
            assert created.status_code == 201
            stream_id = created.json()["stream_id"]
            token = created.json()["token"]
            # The page's token: a cookie sent only to this stream's path.
            cookie = created.headers["set-cookie"]
            assert f"{example.cookie_name(stream_id)}={token}" in cookie
            assert f"Path=/streams/{stream_id}" in cookie
            assert "HttpOnly" in cookie

        url = f"ws{base_url.removeprefix('http')}/streams/{stream_id}/ws"
        auth = {"Authorization": f"Bearer {token}"}

        # Read part of the turn, then drop the connection (leaving the block closes it).
        first_part: list[essessey.Event] = []
        async with ws_connect(url, additional_headers=auth) as socket:
            async for event in WebSocketSource(socket):
                first_part.append(event)
                if len(first_part) == 10:
                    break
        assert len(first_part) == 10

        # Resume with ?last_event_id=, as the page does: the rest, then a normal close.
        resume_url = f"{url}?{urlencode({'last_event_id': first_part[-1].id})}"
        async with ws_connect(resume_url, additional_headers=auth) as socket:
            source = WebSocketSource(socket)
            rest = [event async for event in source]
        assert source.close_code == 1000

        # Without the token: closed with 4403 before a single event.
        async with ws_connect(url) as socket:
            with pytest.raises(WebSocketClosed) as closed:
                await anext(aiter(WebSocketSource(socket)))
        assert closed.value.code == 4403

        # The whole turn, read again from the start with the cookie, as the page sends it.
        cookie_header = {"Cookie": f"{example.cookie_name(stream_id)}={token}"}
        async with ws_connect(url, additional_headers=cookie_header) as socket:
            whole = [event async for event in WebSocketSource(socket)]

    turn = first_part + rest
    assert turn == whole
    ids = [event.id for event in turn]
    assert all(ids)
    assert len(set(ids)) == len(ids)  # each event exactly once
    assert essessey.check(turn) == []
    assert turn[0].event == "message_start"
    assert turn[-1].event == "message_stop"
    parsed = essessey.reassemble_events(turn)
    assert parsed.complete
    assert parsed.text == example.REPLY
    assert parsed.stop_reason == "end_turn"


def test_agent_loop_runs_its_rounds_into_one_valid_message() -> None:
    example = load_example("agent_loop")
    events = anyio.run(example.main)
    assert essessey.check(events) == []
    parsed = essessey.reassemble_events(events)
    assert [(e.call.name, e.call.params, e.result, e.is_error) for e in parsed.executions] == [
        ("get_weather", {"city": "Paris"}, '{"city":"Paris","sky":"sunny","celsius":21}', False),
        ("get_weather", {"city": "Oslo"}, '{"city":"Oslo","sky":"snow","celsius":-3}', False),
        ("convert", {"celsius": -3}, '{"fahrenheit":26.6}', False),
    ]
    assert parsed.text.endswith(example.FINAL_ANSWER)
    assert parsed.stop_reason == "end_turn"
    layout = [
        (payload["index"], payload["content_block"]["type"])
        for payload in (orjson.loads(e.data) for e in events if e.event == "content_block_start")
    ]
    # Round 1: thinking, text, two calls, two results; round 2: thinking, a call, its
    # result; round 3: the answer.
    assert layout == [
        (0, "thinking"),
        (1, "text"),
        (2, "tool_use"),
        (3, "tool_use"),
        (4, "tool_result"),
        (5, "tool_result"),
        (6, "thinking"),
        (7, "tool_use"),
        (8, "tool_result"),
        (9, "text"),
    ]


def test_agent_loop_as_a_script() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "agent_loop.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    example = load_example("agent_loop")
    # One line per round's text and per call: the rounds never run together.
    assert result.stdout.splitlines() == [
        f"model: {example.FIRST_ROUND_TEXT}",
        'get_weather({"city": "Paris"}) -> {"city":"Paris","sky":"sunny","celsius":21}',
        'get_weather({"city": "Oslo"}) -> {"city":"Oslo","sky":"snow","celsius":-3}',
        'convert({"celsius": -3}) -> {"fahrenheit":26.6}',
        f"answer: {example.FINAL_ANSWER}",
        "39 events, 0 protocol violations",
    ]


def test_agent_loop_with_the_responses_api_publishes_the_same_turn() -> None:
    import pydantic
    from openai.types.responses import ResponseStreamEvent

    example = load_example("agent_loop")
    # The scripted Responses API events have the shape the API sends.
    adapter = pydantic.TypeAdapter(ResponseStreamEvent)
    for round_events in example.RESPONSES_SCRIPT:
        for event in round_events:
            adapter.validate_python(event)
    chat = anyio.run(example.main)
    responses = anyio.run(example.main, "responses")
    assert essessey.check(responses) == []
    # The same rounds through the other adapter: the same message, event for event, but
    # that the Responses API's reasoning is a summary, and its thinking block says so.
    summary_start = b'"content_block":{"type":"thinking","summary":true}'
    assert sum(summary_start in e.data for e in responses) == 2
    unmarked = [e.data.replace(b',"summary":true', b"") for e in responses]
    assert list(zip([e.event for e in responses], unmarked, strict=True)) == [
        (e.event, e.data) for e in chat
    ]


def test_agent_loop_as_a_script_with_the_responses_api() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "agent_loop.py"), "--api", "responses"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    chat = subprocess.run(
        [sys.executable, str(EXAMPLES / "agent_loop.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout == chat.stdout
    assert result.stdout.rstrip().endswith("events, 0 protocol violations")
