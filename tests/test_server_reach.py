"""What reaches past ASGI into uvicorn (essessey/bindings/_uvicorn.py), on a real uvicorn.

uvicorn has no public API for a request's transport, which the stalled-connection abort
and the direct body writes need: these tests fail loudly, under every HTTP and WebSocket
implementation uvicorn is run with here, when that stops working (a direct write not
found is no error, only a slower stream, so only these tests would notice).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
from typing import Any

import anyio
import httpx
import pytest
import websockets
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket

from essessey import Publisher, check, reassemble_events
from essessey.bindings import _starlette, _uvicorn
from essessey.bindings._uvicorn import body_writer, connection_aborter, frame_writer
from essessey.bindings.sse import EventStreamResponse, SSEDecoder
from essessey.bindings.ws import decode_frame
from essessey.demo import create_app
from essessey.event import Event
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
        found = {"found": abort.__name__ != "_no_abort", "aborted": abort()}
        await websocket.send_json(found | {"limit": _uvicorn.limit_unacknowledged(2.5)})  # + 5 s
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
        async with websockets.connect(base.replace("http", "ws") + "/ws") as client:
            answer = json.loads(await client.recv())
    # The connection's limit on unacknowledged bytes, where the platform has one.
    limit = 7500 if hasattr(socket, "TCP_USER_TIMEOUT") else None
    assert answer == {"found": True, "aborted": False, "limit": limit}


def _server_socket() -> Any:
    """The server's socket of the current request, found as essessey finds it."""
    transport = _uvicorn._transport_of(_uvicorn._current_cycle())
    return transport.get_extra_info("socket")


def _unacknowledged_ms(sock: Any) -> int:
    return int(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT))


@pytest.mark.skipif(not hasattr(socket, "TCP_USER_TIMEOUT"), reason="Linux's TCP option")
@pytest.mark.parametrize("http", HTTP_IMPLEMENTATIONS)
def test_an_event_stream_bounds_how_long_its_bytes_may_go_unacknowledged(http: str) -> None:
    # A client gone without a FIN (its network dropped) takes writes into the kernel's
    # buffer for about fifteen minutes of retransmissions; TCP_USER_TIMEOUT, set from the
    # response's send_timeout, ends the connection after that long without an ACK.
    async def stream(request: Request) -> Response:
        sock = _server_socket()
        before = _unacknowledged_ms(sock)

        async def produce(publisher: Publisher) -> None:
            after = _unacknowledged_ms(sock)
            await publisher.send_stream_preamble("msg_1", "s", "m")
            await publisher.send_content_block_start_text(0)
            await publisher.send_content_block_delta_text(0, f"{before} {after}")
            await publisher.send_content_block_stop(0)
            await publisher.send_stream_epilogue("end_turn", 1)

        return EventStreamResponse(produce, send_timeout=4.25)

    async def plain(request: Request) -> JSONResponse:
        return JSONResponse({"limit": _uvicorn.limit_unacknowledged(None)})

    app = Starlette(routes=[Route("/stream", stream), Route("/plain", plain)])
    with serve(app, http=http) as base, httpx.Client(base_url=base, timeout=10) as client:
        body = client.get("/stream").text
        assert client.get("/plain").json() == {"limit": None}  # None: left as it is
    parsed = reassemble_events(list(SSEDecoder().feed(body.encode())))
    assert parsed.text == "0 9250", (  # send_timeout, and 5 s for the send watch to act
        "limit_unacknowledged no longer reaches uvicorn's socket: a client gone without "
        "a word would hold its stream for the kernel's retransmissions"
    )


def test_outside_uvicorn_the_aborter_does_nothing() -> None:
    async def main() -> Any:
        return connection_aborter()()

    assert anyio.run(main) is False


class _DirectProbe(Response):
    """Writes its body as direct chunks around an ASGI one: what reaches the client says
    which went out (the ASGI chunk always does)."""

    def __init__(self, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        super().__init__()
        self.probe_headers = headers or [(b"content-type", b"text/plain")]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        writer = body_writer(send, scope["method"], 200, self.probe_headers)
        # Refused before the start and after the end: bytes there would break the
        # status line or follow the body's end, which both checks below would see.
        if writer is not None:
            writer.write(b"too early ")
        await send({"type": "http.response.start", "status": 200, "headers": self.probe_headers})
        if writer is not None:
            writer.write(b"direct ")
        await send({"type": "http.response.body", "body": b"asgi", "more_body": True})
        if writer is not None:
            writer.write(b" direct")
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        if writer is not None:
            writer.write(b" too late")


async def _probe(request: Request) -> Response:
    return _DirectProbe()


async def _bare(scope: Scope, receive: Receive, send: Send) -> None:
    await _DirectProbe()(scope, receive, send)


def _fastapi() -> FastAPI:
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    app.add_api_route("/", _probe)
    return app


APPS = {
    "bare-asgi": lambda: _bare,
    "starlette-route": lambda: Starlette(routes=[Route("/", _probe)]),
    "fastapi-route": _fastapi,
}


def _raw_get(base: str, version: str = "1.1") -> bytes:
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"GET / HTTP/{version}\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


@pytest.mark.parametrize("http", HTTP_IMPLEMENTATIONS)
@pytest.mark.parametrize("app", sorted(APPS))
def test_direct_body_writes_reach_the_client_framed_as_uvicorn_frames_them(
    http: str, app: str
) -> None:
    with serve(APPS[app](), http=http) as base:
        response = httpx.get(base + "/", timeout=10)
        raw = _raw_get(base)
    assert response.text == "direct asgi direct", (
        f"body_writer is not found under uvicorn's {http} in a {app} app: SSE events go "
        "through ASGI sends, at several times the cost (see essessey/bindings/_uvicorn.py)"
    )
    # The chunks as the server itself frames them, the end included.
    assert raw.split(b"\r\n\r\n", 1)[1] == b"7\r\ndirect \r\n4\r\nasgi\r\n7\r\n direct\r\n0\r\n\r\n"


@pytest.mark.parametrize("http", HTTP_IMPLEMENTATIONS)
def test_a_middleware_that_wraps_send_keeps_every_chunk_on_asgi(http: str) -> None:
    app = Starlette(
        routes=[Route("/", _probe)], middleware=[Middleware(GZipMiddleware, minimum_size=1)]
    )
    with serve(app, http=http) as base:
        response = httpx.get(base + "/", headers={"accept-encoding": "gzip"}, timeout=10)
    assert response.headers["content-encoding"] == "gzip"
    assert response.text == "asgi"  # compressed by the middleware, no direct chunk


def test_an_http_10_client_is_not_sent_chunks_under_h11() -> None:
    # h11 frames a lengthless body to an HTTP/1.0 peer by closing the connection.
    with serve(_bare, http="h11") as base:
        raw = _raw_get(base, version="1.0")
    assert raw.split(b"\r\n\r\n", 1)[1] == b"asgi"


@pytest.mark.anyio
async def test_a_response_with_its_own_framing_or_without_a_body_is_left_to_asgi() -> None:
    async def none(_: Any) -> None:
        raise AssertionError("not called")

    assert body_writer(none, "HEAD", 200, []) is None
    assert body_writer(none, "GET", 204, []) is None
    assert body_writer(none, "GET", 200, [(b"Content-Length", b"3")]) is None
    assert body_writer(none, "GET", 200, [(b"transfer-encoding", b"chunked")]) is None
    assert body_writer(none, "GET", 200, []) is None  # not in a uvicorn request's task


async def _frame_probe(websocket: WebSocket) -> None:
    await websocket.accept()
    writer = frame_writer()
    if writer is not None:
        writer.write(b'"direct"')
    await websocket.send_text('"asgi"')
    if writer is not None:
        writer.write(('"direct, with a multi-byte character: \u00e9 ' + "x" * 200 + '"').encode())
        writer.write_joined([b'"joined 1"', ("x" * 70000).encode(), b'"joined 2"'])
    await websocket.close()


async def _frames(base: str, compression: str | None) -> list[str]:
    url = base.replace("http", "ws") + "/ws"
    frames: list[str] = []
    async with websockets.connect(url, compression=compression) as socket:
        with contextlib.suppress(websockets.ConnectionClosedOK):
            while True:
                frames.append(str(await socket.recv()))
    return frames


@pytest.mark.anyio
async def test_direct_frames_reach_the_client_under_websockets_sansio() -> None:
    app = Starlette(routes=[WebSocketRoute("/ws", _frame_probe)])
    with serve(app, ws="websockets-sansio") as base:
        frames = await _frames(base, compression=None)
    assert frames[:2] == ['"direct"', '"asgi"'], (
        "frame_writer is not found under uvicorn's websockets-sansio: hub frames go "
        "through ASGI sends (see essessey/bindings/_uvicorn.py)"
    )
    assert len(frames) == 6
    assert frames[2].startswith('"direct, with a multi-byte character: \u00e9')
    assert frames[3:] == ['"joined 1"', "x" * 70000, '"joined 2"']


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("ws", "compression"),
    [("websockets-sansio", "deflate"), ("websockets", None), ("websockets", "deflate")],
)
async def test_frames_stay_on_asgi_with_an_extension_or_another_implementation(
    ws: str, compression: str | None
) -> None:
    # permessage-deflate (browsers ask for it) would have to compress each frame; the
    # legacy implementation is not read at all.
    app = Starlette(routes=[WebSocketRoute("/ws", _frame_probe)])
    with serve(app, ws=ws) as base:
        frames = await _frames(base, compression=compression)
    assert frames == ['"asgi"']


# -- the switches ----------------------------------------------------------------------------


_SWITCHES = {
    "ESSESSEY_UVICORN_INTERNALS": "essessey.bindings._uvicorn",
    "ESSESSEY_STARLETTE_INTERNALS": "essessey.bindings._starlette",
    "ESSESSEY_NATS_INTERNALS": "essessey._nats_py",
}


@pytest.mark.parametrize(
    ("value", "enabled"), [(None, True), ("on", True), ("off", False), ("0", False), ("NO", False)]
)
def test_each_switch_is_read_from_the_environment(value: str | None, enabled: bool) -> None:
    env = {k: v for k, v in os.environ.items() if k not in _SWITCHES}
    if value is not None:
        env.update(dict.fromkeys(_SWITCHES, value))
    modules = ", ".join(_SWITCHES.values())
    script = f"import {modules}; print([m.ENABLED for m in ({modules})])"
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == str([enabled] * 3)


@pytest.mark.parametrize("http", HTTP_IMPLEMENTATIONS)
def test_with_uvicorns_switch_off_nothing_is_reached(
    http: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_uvicorn, "ENABLED", False)
    with serve(_probe_app(), http=http) as base:
        answer = httpx.get(f"{base}/http", timeout=10).json()
    assert answer == {"found": False, "aborted": False}
    with serve(APPS["bare-asgi"](), http=http) as base:
        assert httpx.get(base + "/", timeout=10).text == "asgi"


@pytest.mark.anyio
async def test_with_uvicorns_switch_off_frames_go_through_asgi(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_uvicorn, "ENABLED", False)
    app = Starlette(routes=[WebSocketRoute("/ws", _frame_probe)])
    with serve(app, ws="websockets-sansio") as base:
        frames = await _frames(base, compression=None)
    assert frames == ['"asgi"']


def test_with_starlettes_switch_off_a_route_keeps_every_chunk_on_asgi(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_starlette, "ENABLED", False)
    with serve(APPS["starlette-route"]()) as base:
        assert httpx.get(base + "/", timeout=10).text == "asgi"
    # A bare ASGI app has no wrapper to look through: still written directly.
    with serve(APPS["bare-asgi"]()) as base:
        assert httpx.get(base + "/", timeout=10).text == "direct asgi direct"


@pytest.mark.anyio
@pytest.mark.parametrize("switch", ["uvicorn", "starlette"])
async def test_with_a_switch_off_a_turn_still_streams_whole(
    switch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_uvicorn if switch == "uvicorn" else _starlette, "ENABLED", False)
    with serve(create_app(), lifespan="on", ws="websockets-sansio") as base:
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            started = await http.post("/streams", json={"deltas": 40, "delay_ms": 1})
            stream_id = started.json()["stream_id"]
            body = (await http.get(f"/streams/{stream_id}")).content
        url = base.replace("http", "ws") + f"/streams/{stream_id}/ws"
        frames: list[str] = []
        async with websockets.connect(url) as socket:
            with contextlib.suppress(websockets.ConnectionClosedOK):
                while True:
                    frames.append(str(await socket.recv()))
    decoder = SSEDecoder()
    over_sse = [
        Event(m.event, m.data.encode(), m.id) for m in decoder.feed(body) if m.event != "ping"
    ]
    over_ws = [e for e in map(decode_frame, frames) if e.event != "ping"]
    assert check(over_sse) == []
    assert over_sse[-1].event == "message_stop"
    assert [e.id for e in over_ws] == [e.id for e in over_sse]
