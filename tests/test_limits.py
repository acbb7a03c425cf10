"""Every size or value a request brings, checked against its limit on a real uvicorn
server: stream ids (one rule for SSE, WebSocket and NATS), last event ids in a header, a
query parameter or a first WebSocket message, header bytes, request bodies (the library's
cancel route never reads one; the demo's routes cap theirs), subscribers per stream,
WebSocket message sizes, and the limits of the SSE client. A bad request gets a 4xx with
a JSON error that says what was wrong (or a 44xx close code), never a 500."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import anyio
import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed
from websockets.frames import Close

from essessey import Event, Publisher, SSEDecodeError, StreamHTTPError, StreamHub, stream_turn
from essessey._ids import MAX_ID_LENGTH, is_event_id, is_stream_id
from essessey.bindings.nats import check_token
from essessey.bindings.sse import EventStreamResponse, connect, hub_routes
from essessey.bindings.ws import CloseCode, ws_route
from essessey.demo import create_app
from tests.nats_server import NatsServer
from tests.processes import WAIT
from tests.servers import serve

pytestmark = pytest.mark.anyio

"""Seconds any one wait of these tests may take before the test fails."""

# Stream ids every binding refuses, and how each one is written in a URL path.
BAD_STREAM_IDS = {
    "too-long": "s" * (MAX_ID_LENGTH + 1),
    "dot-dot": "..",
    "dot": "conv.1",
    "star": "conv*",
    "gt": "conv>",
    "space": "conv 1",
    "tab": "conv\t1",
    "nul": "conv\x001",
    "bell": "conv\x07",
    "del": "conv\x7f",
    "zero-width-space": "conv\u200b",
    "line-separator": "conv\u2028",
}
GOOD_STREAM_IDS = ["s" * MAX_ID_LENGTH, "conv_1", "turn-3f2a", "Zürich-1", "a", "~!@$"]


# -- the app --------------------------------------------------------------------------------


@dataclass
class LimitsApp:
    hub: StreamHub
    app: Starlette


def make_app(*, max_subscribers: int = 1000, **ws_options: Any) -> LimitsApp:
    """A hub (no authorize hook) served by hub_routes and ws_route, plus
    ``POST /turns/{id}``, which starts a turn that writes one delta and then waits to be
    cancelled."""
    hub = StreamHub(max_subscribers=max_subscribers)

    async def start(request: Request) -> Response:
        stream_id = request.path_params["stream_id"]

        async def produce(publisher: Publisher) -> None:
            async with stream_turn(
                publisher, message_id="msg_1", stream_id=stream_id, model="m"
            ) as turn:
                await (await turn.text()).write("first")
                await anyio.sleep_forever()

        await hub.start(stream_id, produce)
        return Response(status_code=202)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with hub:
            yield

    routes = [
        *hub_routes(hub),
        ws_route(hub, **ws_options),
        Route("/turns/{stream_id}", start, methods=["POST"]),
    ]
    return LimitsApp(hub, Starlette(routes=routes, lifespan=lifespan))


@contextmanager
def running(app: LimitsApp, **config: Any) -> Iterator[str]:
    with serve(app.app, lifespan="on", **config) as base:
        yield base


def client(base: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(WAIT))


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def error(self) -> dict[str, Any]:
        assert self.headers.get("content-type") == "application/json", self
        parsed = orjson.loads(self.body)
        assert parsed["type"] == "error"
        assert set(parsed["error"]) == {"type", "message"}
        error: dict[str, Any] = parsed["error"]
        return error


async def raw_request(base: str, head: bytes, body: bytes = b"") -> RawResponse:
    """Send ``head`` (a request line and headers, bytes exactly as given, no final blank
    line) and ``body`` over a fresh connection; the answer, read to the connection's end.
    For what httpx will not send: path tricks it would normalise, bytes it would refuse."""
    host, _, port = base.removeprefix("http://").partition(":")
    request = head + b"\r\nHost: test\r\nConnection: close\r\n\r\n" + body
    with anyio.fail_after(WAIT):
        async with await anyio.connect_tcp(host, int(port)) as stream:
            await stream.send(request)
            received = bytearray()
            with suppress(anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
                while True:
                    received += await stream.receive()
    head_part, _, payload = bytes(received).partition(b"\r\n\r\n")
    lines = head_part.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return RawResponse(int(lines[0].split()[1]), headers, payload)


@dataclass
class WSReading:
    frames: list[str]
    code: int | None
    reason: str


async def ws_read(
    base: str, path: str, *, first: str | bytes | None = None, **options: Any
) -> WSReading:
    frames: list[str] = []
    closed: Close | None = None
    url = "ws" + base.removeprefix("http") + path
    with anyio.fail_after(WAIT):
        async with ws_connect(url, open_timeout=WAIT, **options) as websocket:
            if first is not None:
                with suppress(ConnectionClosed):
                    await websocket.send(first)
            try:
                while True:
                    frame = await websocket.recv()
                    assert isinstance(frame, str)
                    frames.append(frame)
            except ConnectionClosed as exc:
                closed = exc.rcvd
    if closed is None:
        pytest.fail("the server closed without a close frame")
    return WSReading(frames, closed.code, closed.reason)


# -- stream ids: one rule everywhere --------------------------------------------------------------


def test_the_rule_for_stream_ids_and_last_ids() -> None:
    for bad in [*BAD_STREAM_IDS.values(), ""]:
        assert not is_stream_id(bad), repr(bad)
        with pytest.raises(ValueError, match="NATS subject token"):
            check_token(bad, "stream id")
    for good in GOOD_STREAM_IDS:
        assert is_stream_id(good)
        assert check_token(good, "stream id") == good
    # A last id is opaque: anything printable, "." and spaces included, up to the limit.
    assert is_event_id("9c1d03aa-41")
    assert is_event_id("a b.c*>")
    assert is_event_id("i" * MAX_ID_LENGTH)
    for bad in ["", "i" * (MAX_ID_LENGTH + 1), "a\tb", "a\x00b", "a\nb", "\x85"]:
        assert not is_event_id(bad), repr(bad)


@pytest.mark.parametrize("name", list(BAD_STREAM_IDS))
async def test_a_bad_stream_id_is_refused_alike_by_sse_cancel_and_websocket(name: str) -> None:
    stream_id = BAD_STREAM_IDS[name]
    path = "/streams/" + quote(stream_id, safe="")
    if name == "dot-dot":
        path = "/streams/%2E%2E"  # a client would resolve a literal ".." away
    with running(make_app()) as base:
        sse = await raw_request(base, b"GET " + path.encode() + b" HTTP/1.1")
        cancel = await raw_request(base, b"POST " + path.encode() + b"/cancel HTTP/1.1")
        ws = await ws_read(base, path + "/ws")
    for answer in (sse, cancel):
        assert answer.status == 400, answer
        assert answer.error() == {"type": "invalid_request_error", "message": "invalid stream id"}
    assert ws.frames == []
    assert (ws.code, ws.reason) == (CloseCode.BAD_REQUEST, "invalid stream id")


async def test_a_stream_id_at_the_limit_is_served() -> None:
    stream_id = "s" * MAX_ID_LENGTH
    with running(make_app()) as base:
        async with client(base) as http:
            # Not there yet: 404 and 4404, not 400.
            assert (await http.get(f"/streams/{stream_id}")).status_code == 404
            assert (await ws_read(base, f"/streams/{stream_id}/ws")).code == CloseCode.NOT_FOUND
            assert (await http.post(f"/turns/{stream_id}")).status_code == 202
            ws = await ws_read_some(base, f"/streams/{stream_id}/ws", 1)
            assert (await http.post(f"/streams/{stream_id}/cancel")).json() == {"cancelled": True}
    assert orjson.loads(ws[0])["event"] == "message_start"


async def ws_read_some(base: str, path: str, count: int) -> list[str]:
    url = "ws" + base.removeprefix("http") + path
    frames: list[str] = []
    with anyio.fail_after(WAIT):
        async with ws_connect(url, open_timeout=WAIT) as websocket:
            while len(frames) < count:
                frame = await websocket.recv()
                assert isinstance(frame, str)
                frames.append(frame)
    return frames


# -- last event ids ---------------------------------------------------------------------------


async def test_a_last_id_is_checked_in_the_header_the_query_and_the_first_message() -> None:
    at_limit = "i" * MAX_ID_LENGTH
    over = "i" * (MAX_ID_LENGTH + 1)
    first_over = orjson.dumps({"last_event_id": over}).decode()
    first_at = orjson.dumps({"last_event_id": at_limit}).decode()
    with running(make_app(resume_message_timeout=WAIT)) as base:
        async with client(base) as http:
            await http.post("/turns/s")
            header = [
                await http.get("/streams/s", headers={"last-event-id": value})
                for value in (over, at_limit)
            ]
            query = [
                await http.get("/streams/s", params={"last_event_id": value})
                for value in (over, at_limit)
            ]
            ws_query = [
                await ws_read(base, f"/streams/s/ws?last_event_id={value}")
                for value in (over, at_limit)
            ]
            ws_first = [
                await ws_read(base, "/streams/s/ws", first=f) for f in (first_over, first_at)
            ]
            await http.post("/streams/s/cancel")
    for too_long, unknown in (header, query):
        assert too_long.status_code == 400
        assert too_long.json()["error"]["message"] == "invalid last event id"
        # At the limit it is a well-formed id this store never issued.
        assert unknown.status_code == 410
        assert unknown.json()["error"]["type"] == "resume_unavailable"
    for too_long_ws, unknown_ws in (ws_query, ws_first):
        assert (too_long_ws.code, too_long_ws.frames) == (CloseCode.BAD_REQUEST, [])
        assert (unknown_ws.code, unknown_ws.frames) == (CloseCode.RESUME_UNAVAILABLE, [])


@pytest.mark.parametrize(
    ("value", "status"),
    [
        (b"\x80\x81", 400),  # latin-1 C1 controls: not printable
        (b"a\x7fb", 400),  # DEL
        (b"\xff\xfe", 410),  # printable once decoded as latin-1: just an unknown id
        (b"caf\xc3\xa9-1", 410),  # UTF-8 bytes, as a browser sends a non-ASCII id
    ],
    ids=["c1-controls", "del", "high-latin-1", "utf-8"],
)
async def test_header_bytes_outside_ascii_are_a_4xx_json_error(value: bytes, status: int) -> None:
    # h11 hands these bytes to the app, which answers them (httptools: see below).
    with running(make_app(), http="h11") as base:
        async with client(base) as http:
            await http.post("/turns/s")
            answer = await raw_request(base, b"GET /streams/s HTTP/1.1\r\nLast-Event-ID: " + value)
            await http.post("/streams/s/cancel")
    assert answer.status == status
    assert answer.error()["type"] in {"invalid_request_error", "resume_unavailable"}


@pytest.mark.parametrize("value", [b"\x01\x1f", b"a\x7fb", b"\xff\xfe", b"caf\xc3\xa9-1"])
async def test_under_httptools_odd_header_bytes_are_a_4xx_never_a_500(value: bytes) -> None:
    # httptools (uvicorn[standard], the server extra) refuses some of these itself, with
    # its plain-text 400, before the app; the others reach the app as under h11.
    with running(make_app(), http="httptools") as base:
        async with client(base) as http:
            await http.post("/turns/s")
            answer = await raw_request(base, b"GET /streams/s HTTP/1.1\r\nLast-Event-ID: " + value)
            await http.post("/streams/s/cancel")
    assert 400 <= answer.status < 500


async def test_a_header_uvicorn_cannot_parse_is_its_own_400_never_a_500() -> None:
    # NUL in a header value, and headers over h11's 16 KiB: refused by uvicorn before
    # the app (plain text, not the Anthropic shape: the app never sees the request).
    with running(make_app(), http="h11") as base:
        nul = await raw_request(base, b"GET /streams/s HTTP/1.1\r\nLast-Event-ID: a\x00b")
        huge = await _slow_headers(base, 17 * 1024)
    for answer in (nul, huge):
        assert answer.status == 400
        assert answer.headers["content-type"].startswith("text/plain")


async def _slow_headers(base: str, size: int) -> RawResponse:
    """Headers of ``size`` bytes sent in pieces, so they wait incomplete in the server."""
    host, _, port = base.removeprefix("http://").partition(":")
    received = bytearray()
    with anyio.fail_after(WAIT):
        async with await anyio.connect_tcp(host, int(port)) as stream:
            await stream.send(b"GET /streams/s HTTP/1.1\r\nHost: test\r\n")
            for n in range(size // 1024):
                await stream.send(b"X-Pad-%d: " % n + b"p" * 1000 + b"\r\n")
                await anyio.sleep(0.01)
            with suppress(anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
                while True:
                    received += await stream.receive()
    head, _, body = bytes(received).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    return RawResponse(int(lines[0].split()[1]), headers, body)


# -- request bodies ---------------------------------------------------------------------------


async def test_cancel_never_reads_the_request_body() -> None:
    # A body of a terabyte is announced; the answer comes at once all the same, since the
    # route does not read it.
    huge = b"\r\nContent-Type: application/json\r\nContent-Length: 1000000000000"
    with running(make_app()) as base:
        async with client(base) as http:
            missing = await raw_request(base, b"POST /streams/s/cancel HTTP/1.1" + huge, b"{")
            await http.post("/turns/s")
            done = await raw_request(base, b"POST /streams/s/cancel HTTP/1.1" + huge, b"{")
    assert missing.status == 404
    assert missing.error()["type"] == "not_found_error"
    assert done.status == 200
    assert orjson.loads(done.body) == {"cancelled": True}


async def test_a_cancel_whose_small_body_never_comes_cancels_and_answers() -> None:
    # 500 bytes announced, one sent: the turn is cancelled at once and the answer comes
    # after a short wait for the rest, not never.
    small = b"\r\nContent-Type: application/json\r\nContent-Length: 500"
    with running(make_app()) as base:
        async with client(base) as http:
            await http.post("/turns/s")
            with anyio.fail_after(10):
                done = await raw_request(base, b"POST /streams/s/cancel HTTP/1.1" + small, b"{")
            again = await http.post("/streams/s/cancel")
    assert done.status == 200
    assert orjson.loads(done.body) == {"cancelled": True}
    assert again.status_code == 404


@pytest.mark.parametrize(
    ("path", "limit", "status", "error_type"),
    [
        ("/streams", 64 * 1024, 413, "request_too_large"),
        ("/v1/messages", 1024 * 1024, 413, "request_too_large"),
    ],
)
async def test_the_demo_caps_its_request_bodies(
    path: str, limit: int, status: int, error_type: str
) -> None:
    over = b'{"x": "' + b"a" * limit + b'"}'
    with serve(create_app(), lifespan="on") as base:
        async with client(base) as http:
            declared = await http.post(path, content=over)
            # A length announced and never sent is refused before any of it is read.
            announced = await raw_request(
                base, b"POST " + path.encode() + b" HTTP/1.1\r\nContent-Length: 1000000000000"
            )
            malformed = [
                await http.post(path, content=body)
                for body in (b"{", b"[1]", b'"text"', b"\xff\xfe", b'{"a": 1} trailing')
            ]
    for answer in (declared.status_code, announced.status):
        assert answer == status
    assert declared.json()["error"]["type"] == error_type
    assert announced.error()["type"] == error_type
    for response in malformed:
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert error["message"] in {
            "the request body is not valid JSON",
            "the request body must be a JSON object",
        }


async def test_a_client_leaving_mid_body_is_not_a_server_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # log_config=None: uvicorn's records reach the root logger, where caplog listens.
    with (
        caplog.at_level(logging.INFO),
        serve(create_app(), lifespan="on", log_config=None, log_level="info") as base,
    ):
        host, _, port = base.removeprefix("http://").partition(":")
        with anyio.fail_after(WAIT):
            async with await anyio.connect_tcp(host, int(port)) as stream:
                await stream.send(
                    b"POST /streams HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{"
                )
                await anyio.sleep(0.2)
        await anyio.sleep(0.3)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]


# -- subscribers per stream ------------------------------------------------------------------


async def test_too_many_subscribers_is_503_over_sse_and_1013_over_websocket() -> None:
    with running(make_app(max_subscribers=1)) as base:
        async with client(base) as http:
            await http.post("/turns/s")
            async with connect(http, "GET", "/streams/s") as events:
                first = await anext(aiter(events))
                crowded_sse = await http.get("/streams/s")
                crowded_ws = await ws_read(base, "/streams/s/ws")
            await http.post("/streams/s/cancel")
    assert first.event == "message_start"
    assert crowded_sse.status_code == 503
    assert crowded_sse.json()["error"] == {
        "type": "overloaded_error",
        "message": "too many subscribers",
    }
    assert (crowded_ws.code, crowded_ws.reason) == (
        CloseCode.TRY_AGAIN_LATER,
        "too many subscribers",
    )
    assert crowded_ws.frames == []


# -- WebSocket message sizes ----------------------------------------------------------------


async def test_ws_messages_are_bounded_by_uvicorn_and_a_first_message_by_the_route() -> None:
    with running(make_app(resume_message_timeout=WAIT), ws_max_size=4096) as base:
        async with client(base) as http:
            await http.post("/turns/s")
            # Over uvicorn's ws_max_size: closed by the server's WebSocket layer (1009).
            too_big = await ws_read(base, "/streams/s/ws", first="x" * 5000)
            # Within it, but longer than a first message with an id can be: 4400.
            too_long = await ws_read(base, "/streams/s/ws", first=" " * 2000)
            not_json = await ws_read(base, "/streams/s/ws", first="last_event_id")
            not_object = await ws_read(base, "/streams/s/ws", first='["9c1d03aa-1"]')
            binary = await ws_read(base, "/streams/s/ws", first=b"\xff\xfe")
            await http.post("/streams/s/cancel")
    assert too_big.code == 1009  # message too big
    assert too_big.frames == []
    for reading, reason in [
        (too_long, "first message too long"),
        (not_json, "first message is not JSON"),
        (not_object, "first message is not a JSON object"),
        (binary, "first message is not JSON"),
    ]:
        assert (reading.code, reading.reason, reading.frames) == (
            CloseCode.BAD_REQUEST,
            reason,
            [],
        )


# -- the SSE client's limits, against a real server ---------------------------------------------


def _client_limits_app() -> Starlette:
    async def long_line(request: Request) -> Response:
        async def produce(publisher: Publisher) -> None:
            await publisher.publish("note", {"text": "x" * 4096})

        return EventStreamResponse(produce)

    async def error_page(request: Request) -> Response:
        return Response(b"<html>" + b"z" * (1 << 20) + b"</html>", 502, media_type="text/html")

    return Starlette(
        routes=[
            Route("/long-line", long_line),
            Route("/big-event", _BigEvent()),
            Route("/error", error_page),
        ]
    )


class _BigEvent:
    """An ASGI app streaming one SSE event of eight 1,000-byte data lines: each line is
    short, the event is not."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        event = b"event: note\n" + b"".join(b"data: " + b"y" * 1000 + b"\n" for _ in range(8))
        await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"\n"})


async def test_the_sse_client_enforces_its_line_event_and_error_body_limits() -> None:
    with serve(_client_limits_app()) as base:
        async with client(base) as http:
            with pytest.raises(SSEDecodeError, match="max_line_length"):
                async with connect(http, "GET", "/long-line", max_line_length=1024) as events:
                    [event async for event in events]
            with pytest.raises(SSEDecodeError, match="max_event_size"):
                async with connect(http, "GET", "/big-event", max_event_size=4096) as events:
                    [event async for event in events]
            # Within the limits, the same streams read fine.
            async with connect(http, "GET", "/big-event") as events:
                assert len([event async for event in events]) == 1
            with pytest.raises(StreamHTTPError) as caught:
                async with connect(http, "GET", "/error", max_error_body=2000):
                    pass
    error = caught.value
    assert error.status == 502
    assert isinstance(error.body, str)
    assert len(error.body) <= 2000  # read no further than max_error_body
    assert error.message is not None
    assert len(error.message) <= 1025  # and the message cut to 1,024 characters and "…"


# -- NATS ---------------------------------------------------------------------------------------


async def test_nats_refuses_an_overlong_token_before_it_can_close_the_connection(
    nats: NatsServer,
) -> None:
    import nats as nats_py

    from essessey.bindings.nats import NATSSink, event_subject
    from essessey.stores.jetstream import JetStreamEventStore

    too_long = "s" * (MAX_ID_LENGTH + 1)
    with pytest.raises(ValueError, match="1 to 256"):
        event_subject(too_long, "ping")
    with pytest.raises(ValueError, match="1 to 256"):
        event_subject("s", "e" * (MAX_ID_LENGTH + 1))
    nc = await nats_py.connect(nats.url, allow_reconnect=False)
    try:
        with pytest.raises(ValueError, match="invalid stream id"):
            NATSSink(nc, too_long)
        sink = NATSSink(nc, "s" * MAX_ID_LENGTH)
        with pytest.raises(ValueError, match="invalid event name"):
            await sink.emit(Event("e" * (MAX_ID_LENGTH + 1), b"{}"))
        store = JetStreamEventStore(nc, stream="LIMITS_TEST")
        await store.setup()
        with pytest.raises(ValueError, match="invalid stream id"):
            await store.append(too_long, Event("ping", b"{}"))
        # The connection survived all of it: a 5,000-character stream id would have made
        # nats-server close it ("maximum control line exceeded").
        await sink.emit(Event("ping", b'{"type":"ping"}'))
        await sink.flush()
        assert nc.is_connected
    finally:
        await nc.close()
