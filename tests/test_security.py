"""Security, on real servers: the ``authorize`` hook guards every way in (SSE read and
resume, WebSocket read and resume, cancel) and a refusal sends no event; a hook that
raises is a 503 / 1013 that never logs the token; no log record at any level carries
payload content, whichever part of the library the payload went through; CORS is off
unless an app or the demo turns it on for named origins."""

from __future__ import annotations

import logging
import secrets
import traceback
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest
import websockets
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import HTTPConnection, Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed
from websockets.frames import Close

from essessey import (
    Event,
    InMemoryEventStore,
    Publisher,
    StopReason,
    StreamHub,
    check,
    reassemble_events,
    stream_turn,
)
from essessey.adapters import ToolCallRequest, stream_rounds
from essessey.adapters import anthropic as anthropic_adapter
from essessey.adapters import openai as openai_adapter
from essessey.bindings.sse import SSESource, connect, encode_many, hub_routes
from essessey.bindings.ws import CloseCode, WebSocketSource, ws_route
from essessey.cli import main as cli_main
from essessey.demo import create_app
from essessey.hub import Access
from tests.nats_server import NatsServer
from tests.processes import WAIT
from tests.servers import serve

pytestmark = pytest.mark.anyio

"""Seconds any one wait of these tests may take before the test fails."""


# -- capturing every log record ---------------------------------------------------------------

LOGGERS = ("", "essessey", "uvicorn", "uvicorn.error", "uvicorn.access", "nats")


class _Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        # A record reaches the handler once per logger it propagates through.
        if not any(record is seen for seen in self.records[-8:]):
            self.records.append(record)


@pytest.fixture
def all_logs() -> Iterator[list[logging.LogRecord]]:
    """Every record of every logger at DEBUG and above: root, essessey, uvicorn's and
    nats-py's (uvicorn's own loggers do not propagate, so the handler sits on each)."""
    recorder = _Recorder()
    saved = []
    for name in LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, logger.level, logger.disabled))
        logger.setLevel(logging.DEBUG)
        logger.disabled = False
        logger.addHandler(recorder)
    try:
        yield recorder.records
    finally:
        for logger, level, disabled in saved:
            logger.removeHandler(recorder)
            logger.setLevel(level)
            logger.disabled = disabled


class AppError(Exception):
    """What the app's own code raises, with a message of its choosing."""


CLIENT_LOGGERS = ("websockets.client", "httpcore", "httpx")
"""The test's own HTTP and WebSocket clients, which log what they send at DEBUG."""

_WEBSOCKETS_DIR = str(Path(websockets.__file__).parent)


def _wire_trace(record: logging.LogRecord) -> bool:
    """A wire trace of the ``websockets`` library: at DEBUG it logs every handshake's
    headers and the start of every frame, on the logger it is given, and uvicorn gives it
    ``uvicorn.error``. Third-party tracing, which docs/websocket.md warns about and the
    demo filters out (see the last test of this section)."""
    return record.levelno == logging.DEBUG and record.pathname.startswith(_WEBSOCKETS_DIR)


def leaks(records: list[logging.LogRecord], secret: str) -> list[str]:
    """The records that carry ``secret``: in the formatted message, in an argument, or in
    a traceback. Records of :data:`CLIENT_LOGGERS` are not the server's and are left
    out."""
    found = []
    for record in records:
        if record.name.startswith(CLIENT_LOGGERS) or _wire_trace(record):
            continue
        texts = [record.getMessage(), repr(record.args), str(record.msg)]
        if record.exc_info:
            texts.append("".join(traceback.format_exception(*record.exc_info)))
        if record.stack_info:
            texts.append(record.stack_info)
        if any(secret in text for text in texts):
            found.append(f"{record.name} {record.levelname}: {record.getMessage()[:200]}")
    return found


# -- an app whose authorize hook allows one token per stream -------------------------------------


@dataclass
class GuardedApp:
    hub: StreamHub
    app: Starlette
    tokens: dict[str, str] = field(default_factory=dict)
    asked: list[tuple[str, Access, bool]] = field(default_factory=list)
    released: dict[str, anyio.Event] = field(default_factory=dict)


def make_guarded_app(*, raising: bool = False) -> GuardedApp:
    """A hub whose hook allows a stream to the request bearing its token (``Authorization:
    Bearer <token>``), served by hub_routes and ws_route (with the first-message form of
    resume), plus ``POST /turns/{id}`` (returns the token) and ``POST /release/{id}``.

    With ``raising``, the hook raises for a request bearing a wrong token, with the token
    in the exception's message (as a careless hook's KeyError would)."""

    def authorize(request: HTTPConnection, stream_id: str, access: Access) -> bool:
        given = request.headers.get("authorization", "").removeprefix("Bearer ")
        expected = guarded.tokens.get(stream_id)
        allowed = expected is not None and secrets.compare_digest(given, expected)
        guarded.asked.append((stream_id, access, allowed))
        if raising and not allowed:
            raise AppError(f"no session for token {given}")
        return allowed

    hub = StreamHub(InMemoryEventStore(), authorize=authorize)

    async def start(request: Request) -> Response:
        stream_id = request.path_params["stream_id"]
        guarded.tokens[stream_id] = "tok_" + secrets.token_hex(16)
        release = guarded.released[stream_id] = anyio.Event()

        async def produce(publisher: Publisher) -> None:
            async with stream_turn(
                publisher, message_id="msg_1", stream_id=stream_id, model="m"
            ) as turn:
                text = await turn.text()
                await text.write("before ")
                await release.wait()
                await text.write("after")

        await hub.start(stream_id, produce)
        return Response(orjson.dumps({"token": guarded.tokens[stream_id]}), 201)

    async def release(request: Request) -> Response:
        guarded.released[request.path_params["stream_id"]].set()
        return Response(status_code=204)

    async def running(request: Request) -> Response:
        return Response(orjson.dumps(hub.running(request.path_params["stream_id"])))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with hub:
            yield

    routes = [
        *hub_routes(hub),
        ws_route(hub, resume_message_timeout=WAIT),
        Route("/turns/{stream_id}", start, methods=["POST"]),
        Route("/release/{stream_id}", release, methods=["POST"]),
        Route("/running/{stream_id}", running),
    ]
    guarded = GuardedApp(hub, Starlette(routes=routes, lifespan=lifespan))
    return guarded


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@dataclass
class Answer:
    status: int
    content_type: str
    body: bytes

    def error(self) -> dict[str, Any]:
        assert self.content_type == "application/json", self
        error: dict[str, Any] = orjson.loads(self.body)["error"]
        return error


async def get(http: httpx.AsyncClient, url: str, **options: Any) -> Answer:
    """A GET read whole (the refusals end at once)."""
    with anyio.fail_after(WAIT):
        response = await http.get(url, **options)
    return Answer(response.status_code, response.headers.get("content-type", ""), response.content)


@dataclass
class WSReading:
    frames: list[str]
    code: int
    reason: str


async def ws_read(
    base: str,
    path: str,
    *,
    headers: dict[str, str] | None = None,
    first: str | None = None,
    stop_after: int | None = None,
) -> WSReading:
    frames: list[str] = []
    closed: Close | None = None
    url = "ws" + base.removeprefix("http") + path
    with anyio.fail_after(WAIT):
        async with ws_connect(url, additional_headers=headers or {}) as websocket:
            if first is not None:
                with suppress(ConnectionClosed):
                    await websocket.send(first)
            try:
                while stop_after is None or len(frames) < stop_after:
                    frame = await websocket.recv()
                    assert isinstance(frame, str)
                    frames.append(frame)
            except ConnectionClosed as exc:
                closed = exc.rcvd
    if stop_after is not None and closed is None:
        return WSReading(frames, 0, "")
    if closed is None:
        pytest.fail("the server closed without a close frame")
    return WSReading(frames, closed.code, closed.reason)


def no_event_data(answer: Answer) -> None:
    assert answer.content_type == "application/json"
    assert b"event:" not in answer.body
    assert b"data:" not in answer.body
    assert b"before" not in answer.body


# -- (a) the authorize hook on every way in ------------------------------------------------------


async def test_every_access_without_the_token_is_refused_with_no_event_and_cancel_stops_nothing(
    all_logs: list[logging.LogRecord],
) -> None:
    guarded = make_guarded_app()
    with serve(guarded.app, lifespan="on") as base:
        async with httpx.AsyncClient(base_url=base, timeout=WAIT) as http:
            token = (await http.post("/turns/s")).json()["token"]
            mine = await ws_read(
                base, "/streams/s/ws", headers=bearer(token), first="{}", stop_after=3
            )
            last_id = orjson.loads(mine.frames[-1])["id"]
            wrong = bearer("tok_" + secrets.token_hex(16))
            resume_message = orjson.dumps({"last_event_id": last_id}).decode()
            sse = {
                "read": await get(http, "/streams/s", headers=wrong),
                "read without a token": await get(http, "/streams/s"),
                "resume by header": await get(
                    http, "/streams/s", headers={**wrong, "last-event-id": last_id}
                ),
                "resume by query": await get(
                    http, "/streams/s", headers=wrong, params={"last_event_id": last_id}
                ),
            }
            ws = {
                "read": await ws_read(base, "/streams/s/ws", headers=wrong, first="{}"),
                "resume by query": await ws_read(
                    base, f"/streams/s/ws?last_event_id={last_id}", headers=wrong
                ),
                "resume by first message": await ws_read(
                    base, "/streams/s/ws", headers=wrong, first=resume_message
                ),
            }
            with anyio.fail_after(WAIT):
                cancel = await http.post("/streams/s/cancel", headers=wrong)
            still_running = (await http.get("/running/s")).json()
            # The owner reads on, and the turn ends as it would have.
            await http.post("/release/s")
            async with connect(
                http, "GET", "/streams/s", headers=bearer(token), last_event_id=last_id
            ) as events:
                rest = [event async for event in events]
    for how, answer in sse.items():
        assert answer.status == 403, how
        assert answer.error()["type"] == "permission_error", how
        no_event_data(answer)
    for how, reading in ws.items():
        assert (reading.code, reading.frames) == (CloseCode.FORBIDDEN, []), how
    assert cancel.status_code == 403
    assert cancel.json()["error"]["type"] == "permission_error"
    assert still_running is True
    parsed = reassemble_events([Event(*_frame_event(f)) for f in mine.frames] + rest)
    assert parsed.stop_reason == StopReason.END_TURN
    assert parsed.text == "before after"
    refused = [(access, allowed) for stream, access, allowed in guarded.asked if not allowed]
    assert refused == [
        ("read", False),
        ("read", False),
        ("resume", False),
        ("resume", False),
        ("read", False),
        ("resume", False),
        ("resume", False),
        ("cancel", False),
    ]
    assert leaks(all_logs, token) == []


def _frame_event(frame: str) -> tuple[str, bytes, str | None]:
    parsed = orjson.loads(frame)
    return parsed["event"], orjson.dumps(parsed["data"]), parsed.get("id")


async def test_the_token_opens_every_way_in_and_cancels() -> None:
    guarded = make_guarded_app()
    with serve(guarded.app, lifespan="on") as base:
        async with httpx.AsyncClient(base_url=base, timeout=WAIT) as http:
            token = (await http.post("/turns/s")).json()["token"]
            auth = bearer(token)
            read = await ws_read(base, "/streams/s/ws", headers=auth, first="{}", stop_after=3)
            last_id = orjson.loads(read.frames[-1])["id"]
            resumed = await ws_read(
                base, f"/streams/s/ws?last_event_id={last_id}", headers=auth, stop_after=1
            )
            with anyio.fail_after(WAIT):
                cancel = await http.post("/streams/s/cancel", headers=auth)
            async with connect(http, "GET", "/streams/s", headers=auth) as events:
                whole = [event async for event in events]
    assert len(resumed.frames) == 1
    assert cancel.json() == {"cancelled": True}
    assert reassemble_events(whole).stop_reason == StopReason.CANCELLED
    assert {access for _, access, allowed in guarded.asked if allowed} == {
        "read",
        "resume",
        "cancel",
    }


async def test_a_raising_hook_is_503_or_1013_with_no_event_and_the_token_is_never_logged(
    all_logs: list[logging.LogRecord],
) -> None:
    guarded = make_guarded_app(raising=True)
    with serve(guarded.app, lifespan="on", log_config=None, log_level="trace") as base:
        async with httpx.AsyncClient(base_url=base, timeout=WAIT) as http:
            await http.post("/turns/s")
            wrong_token = "tok_" + secrets.token_hex(16)
            wrong = bearer(wrong_token)
            sse = [
                await get(http, "/streams/s", headers=wrong),
                await get(http, "/streams/s", headers={**wrong, "last-event-id": "x-1"}),
            ]
            with anyio.fail_after(WAIT):
                cancel = await http.post("/streams/s/cancel", headers=wrong)
            ws = [
                await ws_read(base, "/streams/s/ws", headers=wrong, first="{}"),
                await ws_read(base, "/streams/s/ws?last_event_id=x-1", headers=wrong),
            ]
            still_running = (await http.get("/running/s")).json()
            await http.post("/release/s")
    for answer in [
        *sse,
        Answer(cancel.status_code, cancel.headers["content-type"], cancel.content),
    ]:
        assert answer.status == 503
        assert answer.error() == {
            "type": "api_error",
            "message": "could not check access to this stream; try again later",
        }
        no_event_data(answer)
    for reading in ws:
        assert (reading.code, reading.frames) == (CloseCode.TRY_AGAIN_LATER, [])
    assert still_running is True
    # Logged: the class and where it was raised; never the text, which holds the token.
    hook_lines = [r for r in all_logs if "authorize hook raised" in r.getMessage()]
    assert len(hook_lines) == 5
    assert all("AppError at " in r.getMessage() and r.exc_info is None for r in hook_lines)
    for record in all_logs:
        if record.name.startswith(CLIENT_LOGGERS) or _wire_trace(record):
            continue
        assert wrong_token not in record.getMessage()
        assert wrong_token not in repr(record.args)
        if record.exc_info:  # even the app's own exception's text is not logged here
            assert wrong_token not in "".join(traceback.format_exception(*record.exc_info))
    # Nothing reached uvicorn as an unhandled exception (which it would log as a 500).
    assert not [r for r in all_logs if r.name.startswith("uvicorn") and r.levelno >= logging.ERROR]


# -- (b) no payload content in any log record ----------------------------------------------------

MARKER = "PAYLOAD-7c41-MARKER"
"""Stands for content: model text, thinking, tool arguments and results, error messages."""


def _openai_chunks() -> list[Any]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "model": "gpt-test",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    return [
        chunk({"role": "assistant", "reasoning_content": f"thinking {MARKER}"}),
        chunk({"content": f"openai text {MARKER}"}),
        # Malformed: skipped with a warning that names the field, never the value.
        {"model": "gpt-test", "choices": [{"index": 0, "delta": {"content": {MARKER: MARKER}}}]},
        {"choices": [{"index": MARKER, "delta": {"content": MARKER}}]},
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_1",
                        "function": {"name": "lookup", "arguments": '{"q": "'},
                    }
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": f'{MARKER}"}}'}}]}),
        # Text after the calls began: dropped with a count.
        chunk({"content": f"late {MARKER}"}),
        # A call that never gets a name: dropped with a count.
        chunk({"tool_calls": [{"index": 1, "function": {"arguments": MARKER}}]}),
        chunk({}, "tool_calls"),
    ]


def _anthropic_events() -> list[dict[str, Any]]:
    return [
        {
            "type": "message_start",
            "message": {
                "id": "msg_provider",
                "type": "message",
                "role": "assistant",
                "model": "claude-test",
                "content": [],
                "stop_reason": None,
                "usage": {"input_tokens": 3, "output_tokens": 1},
            },
        },
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": MARKER},
        },
        # Malformed: skipped with a warning giving the reason, never the content.
        {
            "type": "content_block_delta",
            "index": 7,
            "delta": {"type": "text_delta", "text": MARKER},
        },
        {"type": "content_block_delta", "index": 0, "delta": {"type": MARKER, MARKER: MARKER}},
        {
            "type": "error",
            "error": {"type": "overloaded_error", "message": f"provider says {MARKER}"},
        },
    ]


async def _content_turn(publisher: Publisher) -> None:
    """Every kind of content, each carrying MARKER: a streamed turn, a turn of rounds, an
    OpenAI-format response and an Anthropic stream that ends with a provider error."""
    async with stream_turn(publisher, message_id="msg_1", stream_id="s", model="m") as turn:
        thinking = await turn.thinking()
        await thinking.write(f"thinking {MARKER}")
        await thinking.write_signature(f"sig{MARKER}")
        await (await turn.text()).write(f"text {MARKER}")
        await (await turn.lines()).write(f"a line {MARKER}\nanother {MARKER}")
        tools = await turn.tools()
        await tools.start_call("toolu_1", "lookup", f'{{"q": "{MARKER}"}}')
        # A call left without a result: answered with an error result, and a warning.
        await tools.start_call("toolu_2", "lookup", f'{{"q": "{MARKER}"}}')
        await tools.write_result("toolu_1", f"result {MARKER}")
    async with stream_rounds(publisher, message_id="msg_2", stream_id="s", model="m") as rounds:
        await rounds.round_start()
        await rounds.delta(reasoning=f"reason {MARKER}", text=f"round text {MARKER}")
        calls = [
            ToolCallRequest("toolu_3", "lookup", f'{{"q": "{MARKER}"}}'),
            ToolCallRequest("toolu_4", "lookup", f'{{"q": "{MARKER}", "n": 2}}'),
        ]
        await rounds.assistant_message(calls)
        await rounds.tool_call_start(0, calls[0])
        await rounds.tool_call_start(1, calls[1])
        await rounds.tool_result(0, {"answer": MARKER})
        # Call 1 gets no result: round_end answers it with an error, and warns.
    await openai_adapter.publish(publisher, _openai_chunks(), message_id="msg_3", stream_id="s")
    await anthropic_adapter.publish(publisher, _anthropic_events(), stream_id="s")


_APP_MESSAGE = f"the app failed on {MARKER}"


async def _failing_turn(publisher: Publisher) -> None:
    async with stream_turn(publisher, message_id="msg_f", stream_id="f", model="m") as turn:
        await (await turn.text()).write(f"partial {MARKER}")
        raise AppError(_APP_MESSAGE)


async def _malformed_ws(websocket: WebSocket) -> None:
    await websocket.accept()
    await websocket.send_text(f'{{"event": "content_block_delta", "data": {{"text": "{MARKER}"')
    await websocket.send_text(f'["{MARKER}"]')
    await websocket.send_text(f'{{"id": 7, "event": "x", "data": "{MARKER}"}}')
    await websocket.send_bytes(b"\xff" + MARKER.encode())
    await websocket.send_text('{"event": "ping", "data": {"type": "ping"}}')
    await websocket.close(1000)


def _content_app() -> Starlette:
    hub = StreamHub()

    async def start(request: Request) -> Response:
        await hub.start("s", _content_turn)
        await hub.start("f", _failing_turn)
        with anyio.fail_after(WAIT):
            await hub.wait("s")
            await hub.wait("f")
        return Response(status_code=204)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with hub:
            yield

    routes = [
        *hub_routes(hub),
        ws_route(hub),
        Route("/start", start, methods=["POST"]),
        WebSocketRoute("/malformed/ws", _malformed_ws),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


async def test_no_log_record_at_any_level_carries_payload_content(
    all_logs: list[logging.LogRecord], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    app = _content_app()
    with serve(app, lifespan="on", log_config=None, log_level="trace") as base:
        async with httpx.AsyncClient(base_url=base, timeout=WAIT) as http:
            assert (await http.post("/start")).status_code == 204
            async with connect(http, "GET", "/streams/s") as events:
                sse_events = [event async for event in events]
            async with connect(http, "GET", "/streams/f") as events:
                failed_events = [event async for event in events]
            ws = await ws_read(base, "/streams/s/ws")
            url = "ws" + base.removeprefix("http") + "/malformed/ws"
            async with ws_connect(url) as websocket:
                malformed_ws = [event async for event in WebSocketSource(websocket)]
        # The CLI, in process: tail (its rendering goes to stdout: its feature, not a log).
        tail_code = await anyio.to_thread.run_sync(cli_main, ["tail", f"{base}/streams/s"])
        tail_raw = await anyio.to_thread.run_sync(
            cli_main, ["tail", "--raw", "--check", f"{base}/streams/f"]
        )
    # Whatever went through, went through whole (so the marker was there to leak).
    assert ws.code == CloseCode.NORMAL
    assert [_frame_event(f)[0] for f in ws.frames] == [e.event for e in sse_events]
    parsed = reassemble_events(sse_events)
    assert MARKER in parsed.text
    assert sum(MARKER in (m.text + m.thinking) for m in parsed.messages) >= 3
    assert MARKER in reassemble_events(failed_events).text
    assert [event.event for event in malformed_ws] == ["ping"]
    out = capsys.readouterr().out
    assert MARKER in out
    assert tail_code == 4  # the stream ends with the provider's error event
    assert tail_raw == 4

    # reassemble and check over malformed events carrying the marker, and an SSE stream
    # cut inside an event.
    bad = [
        Event(
            "content_block_delta",
            orjson.dumps(
                {
                    "type": "content_block_delta",
                    "index": 99,
                    "delta": {"type": "text_delta", "text": MARKER},
                }
            ),
        ),
        Event("content_block_delta", f'{{"{MARKER}'.encode()),
        Event(
            "content_block_start",
            f'{{"type": "content_block_start", "index": 0, "content_block": "{MARKER}"}}'.encode(),
        ),
        Event(MARKER, MARKER.encode()),
    ]
    broken = sse_events[:5] + bad + sse_events[5:]
    assert MARKER in reassemble_events(broken).text
    assert check(broken) != []

    async def cut() -> AsyncIterator[bytes]:
        yield encode_many(sse_events[:3]) + f"event: x\ndata: {MARKER}".encode()

    assert len([event async for event in SSESource(cut())]) == 3
    recording = tmp_path / "stream.sse"
    recording.write_bytes(encode_many(broken))
    check_code = await anyio.to_thread.run_sync(cli_main, ["check", str(recording)])
    check_json = await anyio.to_thread.run_sync(cli_main, ["check", "--json", str(recording)])
    assert check_code == check_json == 1
    capsys.readouterr()

    assert leaks(all_logs, MARKER) == []
    # The app's own failure is logged with its traceback, its message withheld: a
    # failure's words may quote the turn (a framework's validation error does).
    [failed] = [r for r in all_logs if "the turn on stream f failed" in r.getMessage()]
    logged = failed.getMessage()
    assert "_failing_turn" in logged
    assert f"{AppError.__module__}.AppError (message withheld, {len(_APP_MESSAGE)} chars)" in (
        logged
    )
    # And the warnings that were due were logged (so the paths above were taken).
    messages = [r.getMessage() for r in all_logs if r.name.startswith("essessey")]
    for expected in ("skipping chat completion chunk", "got no result", "skipping", "frame"):
        assert any(expected in m for m in messages), expected


async def test_the_demo_drops_the_wire_traces_of_uvicorns_websocket_layer(
    all_logs: list[logging.LogRecord],
) -> None:
    from essessey.demo._app import _hide_wire_traces, _WireTraceFilter

    secret = "tok_" + secrets.token_hex(8)
    uvicorn_error = logging.getLogger("uvicorn.error")
    with serve(create_app(), lifespan="on", log_config=None, log_level="debug") as base:
        _hide_wire_traces()
        try:
            async with httpx.AsyncClient(base_url=base, timeout=WAIT) as http:
                stream = (await http.post("/streams", json={"deltas": 3})).json()["stream_id"]
            reading = await ws_read(base, f"/streams/{stream}/ws", headers=bearer(secret))
        finally:
            for installed in [f for f in uvicorn_error.filters if isinstance(f, _WireTraceFilter)]:
                uvicorn_error.removeFilter(installed)
    assert reading.code == CloseCode.NORMAL
    server_side = [r for r in all_logs if r.name == "uvicorn.error"]
    assert server_side  # uvicorn did log, at DEBUG: only the traces were dropped
    assert not [r for r in server_side if _wire_trace(r)]
    assert not [r for r in server_side if secret in r.getMessage()]


async def test_nats_and_jetstream_log_no_payload_content(
    all_logs: list[logging.LogRecord], nats: NatsServer
) -> None:
    import nats as nats_py

    from essessey._nats_py import flush_connection
    from essessey.bindings.nats import NATSSink, NATSSource
    from essessey.stores.jetstream import JetStreamEventStore

    nc = await nats_py.connect(nats.url)
    try:
        # Wider than the layout, so that messages which do not fit it arrive too.
        source = NATSSource(await nc.subscribe("essessey.>"))
        await flush_connection(nc)
        sink = NATSSink(nc, "s")
        await _content_turn(Publisher(sink))
        # Messages that do not fit the layout: skipped with the reason and a length.
        await nc.publish(f"essessey.{MARKER}", MARKER.encode())
        await nc.publish(f"essessey.s.x.{MARKER}", MARKER.encode())
        await nc.publish(
            "essessey.s.message_stop",
            b'{"type":"message_stop"}',
            headers={"Essessey-Event-Id": "last"},
        )
        await sink.flush()
        received: list[Event] = []
        with anyio.fail_after(WAIT):
            async for event in source:
                received.append(event)
                if event.id == "last":
                    break
        await source.aclose()

        store = JetStreamEventStore(nc, stream="SECURITY_TEST")
        await store.setup()
        async with StreamHub(store) as hub:
            await hub.start("s", _content_turn)
            await hub.start("f", _failing_turn)
            await hub.wait("s")
            await hub.wait("f")
            replayed = [event async for event in hub.subscribe("s")]
    finally:
        await nc.close()
    assert MARKER in reassemble_events(received).text
    assert MARKER in reassemble_events(replayed).text
    assert leaks(all_logs, MARKER) == []
    assert any("skipped a NATS message" in r.getMessage() for r in all_logs)


# -- (c) CORS ------------------------------------------------------------------------------------

ORIGIN = "https://app.example"
OTHER = "https://evil.example"


def _preflight(method: str, origin: str = OTHER, headers: str = "") -> dict[str, str]:
    asked = {"origin": origin, "access-control-request-method": method}
    if headers:
        asked["access-control-request-headers"] = headers
    return asked


def _allows(response: httpx.Response, origin: str) -> bool:
    return 200 <= response.status_code < 300 and response.headers.get(
        "access-control-allow-origin"
    ) in {origin, "*"}


def _no_cors(response: httpx.Response) -> None:
    assert not any(name.lower().startswith("access-control-") for name in response.headers), (
        response.headers
    )


async def test_the_library_routes_send_no_cors_header_and_refuse_a_preflight() -> None:
    guarded = make_guarded_app()
    with serve(guarded.app, lifespan="on") as base:
        async with httpx.AsyncClient(base_url=base, timeout=WAIT) as http:
            token = (await http.post("/turns/s")).json()["token"]
            await http.post("/release/s")
            auth = {**bearer(token), "origin": OTHER}
            answers = [
                await http.get("/streams/s", headers=auth),
                await http.get("/streams/s", headers={"origin": OTHER}),
                await http.post("/streams/s/cancel", headers=auth),
                await http.options(
                    "/streams/s", headers=_preflight("GET", headers="last-event-id")
                ),
                await http.options(
                    "/streams/s/cancel", headers=_preflight("POST", headers="authorization")
                ),
                await http.options("/streams/s/ws", headers=_preflight("GET")),
            ]
            url = "ws" + base.removeprefix("http") + "/streams/s/ws"
            async with ws_connect(url, additional_headers=bearer(token), origin=OTHER) as websocket:
                handshake = websocket.response
                assert handshake is not None
                ws_headers = dict(handshake.headers.raw_items())
    for response in answers:
        _no_cors(response)
        assert not _allows(response, OTHER)
        assert response.status_code != 500
    assert not any(name.lower().startswith("access-control-") for name in ws_headers)


async def test_the_demo_sends_no_cors_header_by_default() -> None:
    with serve(create_app(), lifespan="on") as base:
        async with httpx.AsyncClient(base_url=base, timeout=WAIT) as http:
            created = await http.post("/streams", json={"deltas": 2}, headers={"origin": OTHER})
            stream = created.json()["stream_id"]
            answers = [
                created,
                await http.get(f"/streams/{stream}", headers={"origin": OTHER}),
                await http.options("/streams", headers=_preflight("POST", headers="content-type")),
                await http.options(
                    f"/streams/{stream}", headers=_preflight("GET", headers="last-event-id")
                ),
                await http.options(f"/streams/{stream}/cancel", headers=_preflight("POST")),
                await http.options("/v1/messages", headers=_preflight("POST", headers="x-api-key")),
                await http.get("/", headers={"origin": OTHER}),
            ]
    for response in answers:
        _no_cors(response)
        assert not _allows(response, OTHER)


async def test_the_demo_allows_the_origins_it_is_given_and_no_other() -> None:
    app = create_app(cors_origins=[ORIGIN, "http://localhost:3000"])
    with serve(app, lifespan="on") as base:
        async with httpx.AsyncClient(base_url=base, timeout=WAIT) as http:
            preflight = await http.options(
                "/streams", headers=_preflight("POST", ORIGIN, headers="content-type")
            )
            created = await http.post("/streams", json={"deltas": 2}, headers={"origin": ORIGIN})
            stream = created.json()["stream_id"]
            resume_preflight = await http.options(
                f"/streams/{stream}", headers=_preflight("GET", ORIGIN, headers="last-event-id")
            )
            async with connect(
                http, "GET", f"/streams/{stream}", headers={"origin": ORIGIN}
            ) as events:
                allowed_headers = events.response.headers
                read = [event async for event in events]
            refused = [
                await http.options(
                    "/streams", headers=_preflight("POST", OTHER, headers="content-type")
                ),
                await http.options(f"/streams/{stream}", headers=_preflight("GET", OTHER)),
            ]
            other_read = await http.get(f"/streams/{stream}", headers={"origin": OTHER})
            messages_preflight = await http.options(
                "/v1/messages",
                headers=_preflight(
                    "POST", "http://localhost:3000", headers="x-api-key,anthropic-version"
                ),
            )
    assert _allows(preflight, ORIGIN)
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert created.headers["access-control-allow-origin"] == ORIGIN
    assert "location" in created.headers["access-control-expose-headers"].lower()
    assert _allows(resume_preflight, ORIGIN)
    assert "last-event-id" in resume_preflight.headers["access-control-allow-headers"].lower()
    assert allowed_headers["access-control-allow-origin"] == ORIGIN
    assert reassemble_events(read).complete
    assert "access-control-allow-credentials" not in preflight.headers
    for response in refused:
        assert not _allows(response, OTHER)
        assert "access-control-allow-origin" not in response.headers
    assert other_read.status_code == 200
    assert "access-control-allow-origin" not in other_read.headers  # the browser hides it
    assert _allows(messages_preflight, "http://localhost:3000")


async def test_an_app_turns_cors_on_with_starlettes_middleware_as_documented() -> None:
    # What docs/sse.md shows: CORSMiddleware around hub_routes.
    guarded = make_guarded_app()
    guarded.app.user_middleware.insert(
        0,
        Middleware(
            CORSMiddleware,
            allow_origins=[ORIGIN],
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Last-Event-ID"],
        ),
    )
    with serve(guarded.app, lifespan="on") as base:
        async with httpx.AsyncClient(base_url=base, timeout=WAIT) as http:
            token = (await http.post("/turns/s")).json()["token"]
            await http.post("/release/s")
            resume = await http.options(
                "/streams/s",
                headers=_preflight("GET", ORIGIN, headers="authorization,last-event-id"),
            )
            cancel = await http.options(
                "/streams/s/cancel", headers=_preflight("POST", ORIGIN, headers="authorization")
            )
            other = await http.options(
                "/streams/s", headers=_preflight("GET", OTHER, headers="last-event-id")
            )
            read = await http.get("/streams/s", headers={**bearer(token), "origin": ORIGIN})
            # The hook still decides: CORS only lets the browser read what is answered.
            refused = await http.get("/streams/s", headers={"origin": ORIGIN})
    assert _allows(resume, ORIGIN)
    assert _allows(cancel, ORIGIN)
    assert not _allows(other, OTHER)
    assert read.status_code == 200
    assert read.headers["access-control-allow-origin"] == ORIGIN
    assert refused.status_code == 403
    assert refused.headers["access-control-allow-origin"] == ORIGIN


async def test_a_framework_error_quoting_tool_arguments_is_logged_without_them(
    all_logs: list[logging.LogRecord],
) -> None:
    # Pydantic's ValidationError quotes the value it refused: here the model's arguments
    # of the output tool. The hub logged the failed turn with the whole exception.
    from pydantic import BaseModel
    from pydantic_ai import Agent
    from pydantic_ai.models.function import DeltaToolCall, FunctionModel

    from essessey.adapters.pydantic_ai import AgentTurns
    from essessey.dialects.chat_completions import ChatCompletionRequest

    class Invoice(BaseModel):
        amount: int

    async def script(messages: object, info: object) -> AsyncIterator[Any]:
        arguments = orjson.dumps({"amount": MARKER}).decode()
        yield {0: DeltaToolCall(name="final_result", json_args=arguments, tool_call_id="c1")}

    agent = Agent(FunctionModel(stream_function=script), output_type=Invoice, retries=0)
    turns = AgentTurns(agent)
    request = ChatCompletionRequest(id="s", model="m", messages=[{"role": "user", "content": "go"}])
    async with StreamHub() as hub:
        await hub.start("s", turns(request))
        with anyio.fail_after(WAIT):
            await hub.wait("s")
        events, _ = await hub.store.since("s", None)
    assert [e.event for e in events][-1] == "error"
    assert leaks(all_logs, MARKER) == []
    [failed] = [r for r in all_logs if "the turn on stream s failed" in r.getMessage()]
    assert "(message withheld, " in failed.getMessage()


def test_a_withheld_traceback_keeps_the_chain_frames_and_groups_but_no_message() -> None:
    from essessey._logsafe import withheld_traceback

    def inner() -> None:
        raise KeyError(MARKER)

    try:
        try:
            inner()
        except KeyError as exc:
            raise ExceptionGroup(MARKER, [ValueError(MARKER), exc]) from exc
    except ExceptionGroup as exc:
        text = withheld_traceback(exc)
    assert MARKER not in text
    assert "in inner" in text  # the frame where the cause was raised
    assert "direct cause" in text
    assert f"KeyError (message withheld, {len(repr(MARKER))} chars)" in text
    assert "ValueError (message withheld" in text
    assert "ExceptionGroup (message withheld" in text


# -- answers that name only their requests, from a stranger ----------------------------------


def _owner_only_dialects() -> Starlette:
    """Every dialect's routes; a stream is its starter's (the x-token that started it)."""
    from essessey import Answered, StreamHub, continue_turn, stream_turn
    from essessey.dialects import DialectRequest, dialect_routes

    owners: dict[str, str] = {}

    def authorize(connection: HTTPConnection, stream_id: str, access: Access) -> bool:
        token = connection.headers.get("x-token", "")
        owner = owners.setdefault(stream_id, token)
        return bool(token) and secrets.compare_digest(owner, token)

    async def go_on(publisher: Publisher, answered: Answered) -> None:
        async with continue_turn(publisher, answered) as turn:
            await (await turn.text()).write("went on")

    def asking(request: DialectRequest) -> Any:
        async def produce(publisher: Publisher) -> None:
            async with stream_turn(publisher, message_id="m1", stream_id="s", model="m") as turn:
                tools = await turn.tools()
                await tools.start_call("call_1", "send_email", "{}")
                await turn.ask_approval("call_1", request_id="apr_1")

        return produce

    hub = StreamHub(authorize=authorize, on_answer=go_on)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with hub:
            yield

    return Starlette(routes=dialect_routes(hub, asking), lifespan=lifespan)


async def test_a_stranger_s_answer_by_request_id_learns_nothing_of_another_owner_s_turn() -> None:
    # Chat Completions tool messages and AG-UI resume entries find the turn by the ids
    # they answer: one that another owner's turn waits for is answered as one nobody
    # asked (no 403 that would say such a turn exists), and a stranger's AG-UI run whose
    # messages end with a tool message for that id is served as a run of its own.
    owner, stranger = {"x-token": "alice"}, {"x-token": "bob"}

    def tool_answer(call_id: str) -> dict[str, Any]:
        call = {"id": call_id, "type": "function", "function": {"name": "f", "arguments": "{}"}}
        messages = [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "content": '{"approved": true}'},
        ]
        return {"model": "m", "messages": messages}

    def agui_resume(interrupt_id: str, run: str) -> dict[str, Any]:
        return {
            "threadId": f"thread_{run}",
            "runId": run,
            "tools": [],
            "context": [],
            "state": {},
            "forwardedProps": {},
            "messages": [{"id": "u1", "role": "user", "content": "go"}],
            "resume": [{"interruptId": interrupt_id, "status": "resolved", "payload": {}}],
        }

    with serve(_owner_only_dialects(), lifespan="on") as base:
        async with httpx.AsyncClient(base_url=base, timeout=WAIT) as http:
            started = await http.post(
                "/v1/responses", json={"model": "m", "input": "go"}, headers=owner
            )
            assert started.status_code == 200
            asked = await http.post(
                "/v1/chat/completions", json=tool_answer("apr_1"), headers=stranger
            )
            nobody = await http.post(
                "/v1/chat/completions", json=tool_answer("apr_none"), headers=stranger
            )
            agui_asked = await http.post("/agui", json=agui_resume("apr_1", "r1"), headers=stranger)
            agui_nobody = await http.post(
                "/agui", json=agui_resume("apr_none", "r2"), headers=stranger
            )
    assert (asked.status_code, asked.json()) == (nobody.status_code, nobody.json())
    assert asked.status_code == 400
    assert (agui_asked.status_code, agui_asked.text) == (agui_nobody.status_code, agui_nobody.text)


@pytest.mark.parametrize("suffix", ["a%01b", "a%0Ab", "x" * 300, ""])
async def test_a_continuation_id_s_event_part_is_checked_as_a_last_event_id(suffix: str) -> None:
    with serve(_owner_only_dialects(), lifespan="on") as base:
        async with httpx.AsyncClient(base_url=base, timeout=WAIT) as http:
            owner = {"x-token": "alice"}
            response = await http.post(
                "/v1/responses", json={"model": "m", "input": "go"}, headers=owner
            )
            stream_id = response.json()["id"]
            retrieve = await http.get(f"/v1/responses/{stream_id}.{suffix}", headers=owner)
            completion = await http.get(
                f"/v1/chat/completions/{stream_id}.{suffix}",
                headers={**owner, "accept": "application/json"},
            )
    assert retrieve.status_code == completion.status_code == 400
    assert retrieve.json()["error"]["type"] == "invalid_request_error"
