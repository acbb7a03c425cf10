"""useChat over one WebSocket: the AI SDK's own WebSocketChatTransport (Node's ``ai``,
tests/node/chat.mjs) and the transport's frames read by hand, against ``ui_chat_routes``'
WebSocket endpoint on a real uvicorn server. The turns that ask are in
tests/test_ui_asking.py, run over both transports."""

from __future__ import annotations

import json
import logging
import socket as sockets
import struct
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from essessey import Publisher, StreamHub
from essessey.dialects.ui import ChatRequest, ui_chat_routes
from tests.processes import WAIT, node_json
from tests.redis_server import store_out_of_reach
from tests.servers import serve
from tests.test_stalled_clients import TCP_ESTABLISHED, tcp_state
from tests.test_ui_node import WHOLE_TURN, parts_of
from tests.ui_app import agent_turn, create_app

USER = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "weather?"}]}


@pytest.fixture
def base_url() -> Iterator[str]:
    with serve(create_app(), lifespan="on") as url:
        yield url


def ws_url(base: str) -> str:
    return base.replace("http://", "ws://") + "/api/chat/ws"


def node_chat(script: Path, base: str, mode: str, chat_id: str, arg: Any) -> dict[str, Any]:
    # script: the node_client fixture's, which installs the AI SDK (and marks the test slow).
    given = json.dumps(arg)
    result: dict[str, Any] = node_json(script, base, mode, chat_id, given, "ws", websocket=True)
    return result


def send_frame(request_id: str, chat_id: str, **body: Any) -> str:
    frame = {"type": "send", "requestId": request_id, "id": chat_id}
    frame.update(trigger="submit-message", messages=[USER], headers={}, body=body)
    return json.dumps(frame)


def resume_frame(request_id: str, chat_id: str, last_sequence: int | None = None) -> str:
    frame: dict[str, Any] = {"type": "resume", "requestId": request_id, "id": chat_id}
    frame.update(headers={}, body={})
    if last_sequence is not None:
        frame["lastSequence"] = last_sequence
    return json.dumps(frame)


async def frames_until_done(
    socket: ClientConnection, request_ids: set[str]
) -> dict[str, list[dict[str, Any]]]:
    """Every frame of each request, in order, until each has ended (``end``, ``error``,
    ``no-active``)."""
    seen: dict[str, list[dict[str, Any]]] = {rid: [] for rid in request_ids}
    open_ids = set(request_ids)
    while open_ids:
        frame = json.loads(await socket.recv())
        if frame["requestId"] not in seen:
            continue  # an aborted request's, sent before the abort took effect
        seen[frame["requestId"]].append(frame)
        if frame["type"] in ("end", "error", "no-active"):
            open_ids.discard(frame["requestId"])
    return seen


async def refused_then_served(socket: ClientConnection, raw: str, rid: str, told: str) -> None:
    """``raw`` (a frame of request ``rid``) gets one error saying ``told``, and the
    connection then serves a request as any other."""
    await socket.send(raw)
    (error,) = (await frames_until_done(socket, {rid}))[rid]
    assert error["type"] == "error"
    assert told in error["errorText"]
    await socket.send(send_frame("next", rid + "-next"))
    assert (await frames_until_done(socket, {"next"}))["next"][-1]["type"] == "end"


def chunks(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f["chunk"] for f in frames if f["type"] == "chunk"]


def sse_chunks(base: str, chat_id: str) -> list[dict[str, Any]]:
    """A turn of the chat as the SSE route streams it to a POST."""
    body = {"id": chat_id, "messages": [USER], "trigger": "submit-message"}
    text = httpx.post(f"{base}/api/chat", json=body, timeout=WAIT).text
    return [orjson.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def without_message_id(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chunks with the turn's own id (each turn has one) left out."""
    return [{k: v for k, v in c.items() if k != "messageId"} for c in chunks]


# -- the AI SDK's own WebSocketChatTransport ---------------------------------------------------


def test_use_chat_over_a_websocket_receives_the_whole_turn(
    node_client: Path, base_url: str
) -> None:
    result = node_chat(node_client, base_url, "send", "ws-1", {})
    assert (result["status"], result["error"], result["errors"]) == ("ready", None, [])
    assert [f["finishReason"] for f in result["finishes"]] == ["stop"]
    _, answer = result["messages"]
    assert answer["id"].startswith("ws-1~")
    assert parts_of(answer) == WHOLE_TURN


def test_use_chat_over_a_websocket_resumes_a_running_turn(node_client: Path, base_url: str) -> None:
    # A turn started over HTTP, its connection dropped at once; the WebSocket transport's
    # resume replays it whole and follows it to its end.
    body = {"id": "ws-2", "messages": [USER], "trigger": "submit-message", "delay_ms": 100}
    body["hold_for_resume"] = True  # the turn waits for Node's resume before its second round
    with httpx.stream("POST", base_url + "/api/chat", json=body, timeout=WAIT) as response:
        assert response.status_code == 200
    result = node_chat(node_client, base_url, "resume", "ws-2", [USER])
    assert (result["status"], result["errors"]) == ("ready", [])
    assert [m["role"] for m in result["messages"]] == ["user", "assistant"]
    assert parts_of(result["messages"][1]) == WHOLE_TURN
    assert result["finishes"][0]["finishReason"] == "stop"


def test_use_chat_over_a_websocket_resumes_nothing_without_a_turn(
    node_client: Path, base_url: str
) -> None:
    result = node_chat(node_client, base_url, "resume", "ws-nobody", [USER])
    assert (result["status"], result["finishes"], result["messages"]) == ("ready", [], [USER])


# -- the transport's frames --------------------------------------------------------------------

pytestmark_anyio = pytest.mark.anyio


@pytest.fixture
async def socket(base_url: str) -> AsyncIterator[ClientConnection]:
    async with ws_connect(ws_url(base_url), open_timeout=WAIT) as connection:
        yield connection


@pytestmark_anyio
async def test_a_request_streams_numbered_chunks_the_sse_route_writes(
    socket: ClientConnection, base_url: str
) -> None:
    await socket.send(send_frame("r1", "frames-1"))
    frames = (await frames_until_done(socket, {"r1"}))["r1"]
    assert frames[0] == {"type": "start", "requestId": "r1"}
    assert frames[-1] == {"type": "end", "requestId": "r1"}
    numbered = [f["sequence"] for f in frames if f["type"] == "chunk"]
    assert numbered == list(range(len(numbered)))
    # The same chunks as the SSE route writes for the same request.
    sent = chunks(frames)
    assert sent[0]["messageId"].startswith("frames-1~")
    assert without_message_id(sent) == without_message_id(sse_chunks(base_url, "frames-1-sse"))
    await socket.send(resume_frame("r2", "frames-1"))
    assert (await frames_until_done(socket, {"r2"}))["r2"] == [
        {"type": "no-active", "requestId": "r2"}
    ]


@pytestmark_anyio
async def test_requests_of_two_chats_share_one_connection(socket: ClientConnection) -> None:
    await socket.send(send_frame("a", "pair-a", delay_ms=5))
    await socket.send(send_frame("b", "pair-b", delay_ms=5))
    seen = await frames_until_done(socket, {"a", "b"})
    assert [c["type"] for c in chunks(seen["a"])] == [c["type"] for c in chunks(seen["b"])]
    assert chunks(seen["a"])[0]["messageId"].startswith("pair-a~")
    assert chunks(seen["b"])[0]["messageId"].startswith("pair-b~")


@pytestmark_anyio
async def test_a_resume_after_a_sequence_sends_only_what_follows(socket: ClientConnection) -> None:
    await socket.send(send_frame("first", "seq-1", delay_ms=50))
    # Drop the request after a few chunks: the turn goes on, and the resume replays it.
    got = 0
    while got < 4:
        frame = json.loads(await socket.recv())
        got += frame["type"] == "chunk"
    await socket.send(json.dumps({"type": "abort", "requestId": "first"}))
    await socket.send(resume_frame("whole", "seq-1"))
    await socket.send(resume_frame("rest", "seq-1", last_sequence=3))
    seen = await frames_until_done(socket, {"whole", "rest"})
    whole, rest = seen["whole"], seen["rest"]
    assert next(f["sequence"] for f in rest if f["type"] == "chunk") == 4
    assert chunks(rest) == chunks(whole)[4:]
    assert chunks(whole)[-1]["type"] == "finish"


@pytestmark_anyio
async def test_an_aborted_request_gets_nothing_more_and_its_turn_goes_on(
    socket: ClientConnection, base_url: str
) -> None:
    await socket.send(send_frame("gone", "abort-1", delay_ms=30))
    while json.loads(await socket.recv())["type"] != "chunk":
        pass
    await socket.send(json.dumps({"type": "abort", "requestId": "gone"}))
    # Another request on the same connection runs to its end; none of the aborted
    # request's frames come after the abort took effect (at most those already sent).
    await socket.send(resume_frame("again", "abort-1"))
    seen: list[dict[str, Any]] = []
    while True:
        frame = json.loads(await socket.recv())
        seen.append(frame)
        if frame["requestId"] == "again" and frame["type"] == "end":
            break
    again = [f for f in seen if f["requestId"] == "again"]
    assert chunks(again)[-1]["type"] == "finish"  # the turn went on to its end
    first_again = seen.index(again[0])
    assert all(f["requestId"] == "again" for f in seen[first_again:])


@pytestmark_anyio
@pytest.mark.parametrize(
    ("frame", "message"),
    [
        ({"id": "x y"}, "id must be"),
        ({"messages": "no"}, "messages must be"),
        ({"trigger": "nope"}, "trigger must be"),
        ({"headers": {"a": 1}}, "headers must be"),
        ({"body": []}, "body must be"),
    ],
)
async def test_a_bad_request_is_its_own_error_and_the_connection_stays(
    socket: ClientConnection, frame: dict[str, Any], message: str
) -> None:
    bad = json.loads(send_frame("bad", "bad-1"))
    bad.update(frame)
    await refused_then_served(socket, json.dumps(bad), "bad", message)


@pytestmark_anyio
async def test_a_request_id_streaming_already_is_refused(socket: ClientConnection) -> None:
    await socket.send(send_frame("same", "dup-1", delay_ms=20))
    await socket.send(send_frame("same", "dup-2"))
    errors = []
    while True:
        frame = json.loads(await socket.recv())
        if frame["type"] == "error":
            errors.append(frame["errorText"])
        if frame["type"] == "end":
            break
    assert errors == ["a request with this requestId is streaming"]


@pytestmark_anyio
@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ("not json", 4400),
        (json.dumps({"type": "send"}), 4400),  # no requestId
        (json.dumps({"type": "other", "requestId": "r"}), 4400),
        # A lone surrogate's escape: an error in the reader, the socket dropped (1006).
        ('{"type": "send", "requestId": "\\ud800", "id": "c1", "messages": []}', 4400),
        (json.dumps({"type": "send", "requestId": "r", "pad": "x" * 5000}), 1009),
    ],
)
async def test_a_frame_of_no_request_closes_the_connection(raw: str, code: int) -> None:
    hub = StreamHub()
    app = Starlette(routes=list(ui_chat_routes(hub, agent_turn, max_body=4096)))
    app.router.lifespan_context = hub.lifespan
    with serve(app, lifespan="on") as url:
        async with ws_connect(ws_url(url), open_timeout=WAIT) as connection:
            await connection.send(raw)
            with pytest.raises(ConnectionClosed) as closed:
                await connection.recv()
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == code


@pytestmark_anyio
async def test_a_store_out_of_reach_is_each_requests_error() -> None:
    # Redis with nothing behind it: each request is told what the HTTP route's 503 says,
    # and the connection stays for the next.
    hub = StreamHub(store_out_of_reach())
    app = Starlette(routes=list(ui_chat_routes(hub, agent_turn)), lifespan=hub.lifespan)
    with serve(app, lifespan="on") as url:
        async with ws_connect(ws_url(url), open_timeout=WAIT) as connection:
            await connection.send(send_frame("r", "down-1"))
            await connection.send(resume_frame("s", "down-1"))
            got = await frames_until_done(connection, {"r", "s"})
    for rid in ("r", "s"):
        assert got[rid] == [
            {
                "type": "error",
                "requestId": rid,
                "errorText": "the event store is unavailable; try again",
            }
        ]


@pytestmark_anyio
async def test_authorize_is_asked_with_the_socket_and_the_chat_id() -> None:
    asked: list[tuple[str, str, str]] = []

    def authorize(connection: Any, stream_id: str, access: str) -> bool:
        asked.append((type(connection).__name__, stream_id, access))
        return connection.query_params.get("token") == "ok"

    hub = StreamHub(authorize=authorize)
    app = Starlette(routes=list(ui_chat_routes(hub, agent_turn)), lifespan=hub.lifespan)
    with serve(app, lifespan="on") as url:
        async with ws_connect(ws_url(url) + "?token=no", open_timeout=WAIT) as connection:
            await connection.send(send_frame("r", "auth-1"))
            (refused,) = (await frames_until_done(connection, {"r"}))["r"]
            await connection.send(resume_frame("s", "auth-1"))
            (refused_resume,) = (await frames_until_done(connection, {"s"}))["s"]
        async with ws_connect(ws_url(url) + "?token=ok", open_timeout=WAIT) as connection:
            await connection.send(send_frame("r", "auth-1"))
            allowed = (await frames_until_done(connection, {"r"}))["r"]
    assert refused == {
        "type": "error",
        "requestId": "r",
        "errorText": "not allowed to read this stream",
    }
    assert refused_resume["errorText"] == "not allowed to resume this stream"
    assert allowed[-1]["type"] == "end"
    assert asked[:2] == [("WebSocket", "auth-1", "read"), ("WebSocket", "auth-1", "resume")]


@pytestmark_anyio
async def test_the_frame_headers_and_body_reach_the_turn() -> None:
    seen: list[Any] = []

    def turn(chat: Any) -> Any:
        seen.append((chat.headers, chat.body.get("delay_ms"), chat.body.get("custom")))
        return agent_turn(chat)

    hub = StreamHub()
    app = Starlette(routes=list(ui_chat_routes(hub, turn)), lifespan=hub.lifespan)
    with serve(app, lifespan="on") as url:
        async with ws_connect(ws_url(url), open_timeout=WAIT) as connection:
            frame = json.loads(send_frame("r", "hdr-1", custom="yes"))
            frame["headers"] = {"X-Tenant": "acme"}
            await connection.send(json.dumps(frame))
            await frames_until_done(connection, {"r"})
    assert seen == [({"x-tenant": "acme"}, None, "yes")]


def test_the_endpoint_can_be_left_out() -> None:
    routes = ui_chat_routes(StreamHub(), agent_turn, websocket=False)
    # Each path twice: its route, and the 405 of the methods it does not take.
    assert list(dict.fromkeys(getattr(route, "path", None) for route in routes)) == [
        "/api/chat",
        "/api/chat/{chat_id}/stream",
        "/api/chat/{chat_id}/stop",
    ]
    assert not any(isinstance(route, WebSocketRoute) for route in routes)


# -- what a careless or hostile client does ----------------------------------------------------


def burst_or_scripted(chat: Any) -> Any:
    """The scripted turn; with ``burst`` in the body, ``burst`` text deltas published a
    few at a time between turns of the event loop; with ``boom``, a factory that fails."""
    if chat.body.get("boom"):
        raise TypeError("the app's own bug")
    count = chat.body.get("burst")
    if not count:
        return agent_turn(chat)

    async def produce(publisher: Any) -> None:
        await publisher.send_stream_preamble("msg_burst", chat.id, "m")
        await publisher.send_content_block_start_text(0)
        for n in range(count):
            await publisher.send_content_block_delta_text(0, f"{n} ")
            if n % 10 == 9:
                await anyio.lowlevel.checkpoint()
        await publisher.send_content_block_stop(0)
        await publisher.send_stream_epilogue("end_turn", count)

    return produce


@pytest.fixture
def hostile_url() -> Iterator[str]:
    hub = StreamHub()
    routes = list(ui_chat_routes(hub, burst_or_scripted))
    with serve(Starlette(routes=routes, lifespan=hub.lifespan), lifespan="on") as url:
        yield url


@pytestmark_anyio
async def test_a_turn_published_in_bursts_reaches_the_socket_whole(hostile_url: str) -> None:
    async with ws_connect(ws_url(hostile_url), open_timeout=WAIT) as connection:
        await connection.send(send_frame("r", "burst-1", burst=3000))
        frames = (await frames_until_done(connection, {"r"}))["r"]
    assert frames[-1]["type"] == "end"
    deltas = [c["delta"] for c in chunks(frames) if c["type"] == "text-delta"]
    assert deltas == [f"{n} " for n in range(3000)]
    numbered = [f["sequence"] for f in frames if f["type"] == "chunk"]
    assert numbered == list(range(len(numbered)))


@pytestmark_anyio
@pytest.mark.parametrize(
    ("text", "told"),
    [
        ('"cut \\ud83d"', "JSON this server does not read"),  # a lone surrogate's escape
        ("1e400", "JSON this server does not read"),  # past a double
        ("[" * 300 + "1" + "]" * 300, "nested too deeply"),
    ],
)
async def test_json_the_server_cannot_serve_is_its_requests_error(
    socket: ClientConnection, text: str, told: str
) -> None:
    frame = send_frame("odd", "odd-1")
    await refused_then_served(socket, frame[:-1] + ', "metadata": ' + text + "}", "odd", told)


@pytestmark_anyio
async def test_a_failing_turn_factory_is_its_requests_error(hostile_url: str) -> None:
    async with ws_connect(ws_url(hostile_url), open_timeout=WAIT) as connection:
        await connection.send(send_frame("bad", "boom-1", boom=True))
        (error,) = (await frames_until_done(connection, {"bad"}))["bad"]
        assert error == {
            "type": "error",
            "requestId": "bad",
            "errorText": "the server failed; resume later",
        }
        await connection.send(send_frame("good", "boom-2"))
        assert (await frames_until_done(connection, {"good"}))["good"][-1]["type"] == "end"


@pytestmark_anyio
async def test_a_client_leaving_mid_stream_is_no_server_error(hostile_url: str) -> None:
    errors: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.ERROR:
                errors.append(record)

    keep = Keep()
    for name in ("uvicorn.error", "essessey"):
        logging.getLogger(name).addHandler(keep)
    try:
        for n in range(40):
            # Closed without waiting long for the server's answer to the close.
            async with ws_connect(
                ws_url(hostile_url), open_timeout=WAIT, close_timeout=0.2
            ) as connection:
                await connection.send(send_frame("r", f"leave-{n}", delay_ms=2))
                for _ in range(3):
                    await connection.recv()
                if n % 2:
                    # Closed while the reader itself still writes: many requests refused
                    # (this one streams already), then the close, before their answers.
                    for _ in range(2000):
                        await connection.send(send_frame("r", f"leave-{n}"))
                elif n % 4 == 2:
                    connection.transport.abort()  # gone without a close frame
        await anyio.sleep(0.3)
    finally:
        for name in ("uvicorn.error", "essessey"):
            logging.getLogger(name).removeHandler(keep)
    assert [r.getMessage() for r in errors] == []


@pytestmark_anyio
async def test_a_resume_s_replay_stops_when_its_client_drops_the_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # uvicorn's send never waits: a replay was written into a connection the client
    # dropped, 64 chunks between two turns of the loop, asyncio logging each write after
    # the fifth ("socket.send() raised exception").
    import threading

    from essessey import stream_turn

    done = threading.Event()  # the turn runs in the server's thread

    def long_turn(chat: ChatRequest) -> Any:
        async def produce(publisher: Publisher) -> None:
            async with stream_turn(
                publisher, message_id="m1", stream_id=chat.id, model="m"
            ) as turn:
                text = await turn.text()
                for n in range(1500):
                    await text.write(f"w{n} ")
                await anyio.to_thread.run_sync(done.wait, WAIT)

        return produce

    caplog.set_level(logging.WARNING, logger="asyncio")
    hub = StreamHub()
    app = Starlette(routes=ui_chat_routes(hub, long_turn), lifespan=hub.lifespan)
    with serve(app, lifespan="on", http="h11", loop="asyncio") as base:
        try:
            async with ws_connect(ws_url(base), open_timeout=WAIT) as first:
                await first.send(send_frame("r1", "long"))
                for _ in range(3):
                    await first.recv()
            await anyio.sleep(0.5)  # the turn's backlog written
            for n in range(5):
                async with ws_connect(ws_url(base), open_timeout=WAIT, close_timeout=1) as ws:
                    await ws.send(resume_frame(f"x{n}", "long"))
                    await ws.recv()
                    ws.transport.abort()  # the connection drops
                await anyio.sleep(0.3)
        finally:
            done.set()  # the turn ends before the server stops
    dead = [r for r in caplog.records if "socket.send() raised exception" in r.getMessage()]
    assert dead == []


def test_a_chat_client_that_stops_reading_is_reset_when_a_send_stalls() -> None:
    # A close frame cannot reach a client that reads nothing: the server would hold the
    # socket, its buffers and megabytes of unsent frames until the client left. Under
    # uvicorn the connection is reset once a send stalls past send_timeout.
    def big_turn(chat: ChatRequest) -> Any:
        async def produce(publisher: Publisher) -> None:
            await publisher.send_stream_preamble("msg_1", chat.id, "m")
            await publisher.send_content_block_start_text(0)
            for _ in range(600):
                await publisher.send_content_block_delta_text(0, "x" * 20_000)
            await publisher.send_content_block_stop(0)
            await publisher.send_stream_epilogue("end_turn", 1)

        return produce

    hub = StreamHub()
    app = Starlette(
        routes=list(ui_chat_routes(hub, big_turn, send_timeout=0.5)), lifespan=hub.lifespan
    )
    with serve(app, lifespan="on") as url:
        port = int(url.rsplit(":", 1)[1])
        sock = sockets.socket(sockets.AF_INET, sockets.SOCK_STREAM)
        sock.setsockopt(sockets.SOL_SOCKET, sockets.SO_RCVBUF, 4096)
        sock.settimeout(WAIT)
        try:
            sock.connect(("127.0.0.1", port))
            sock.sendall(
                b"GET /api/chat/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                b"Sec-WebSocket-Version: 13\r\n\r\n"
            )
            assert sock.recv(4096).startswith(b"HTTP/1.1 101")
            payload = send_frame("r1", "stalled").encode()
            # A masked text frame (a zero mask leaves the payload as it is).
            header = bytes([0x81, 0xFE]) + struct.pack("!H", len(payload)) + b"\0\0\0\0"
            sock.sendall(header + payload)
            deadline = time.monotonic() + 15
            while tcp_state(sock) == TCP_ESTABLISHED and time.monotonic() < deadline:
                time.sleep(0.1)
            assert tcp_state(sock) != TCP_ESTABLISHED, "the stalled connection is still open"
        finally:
            sock.close()
