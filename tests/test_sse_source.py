"""SSESource and connect: SSE read back into events, against real servers (uvicorn, and a
raw socket server for broken framing), plus SSESource over plain byte generators."""

from __future__ import annotations

import gzip
import logging
import random
import subprocess
import sys
import threading
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from itertools import pairwise
from typing import Any

import anyio
import httpx
import orjson
import pytest
from anyio.abc import SocketAttribute, SocketStream
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from essessey import Event
from essessey.bindings.sse import MAX_ERROR_BODY, SSEEventStream, SSESource, connect
from essessey.bindings.sse._inflate import Inflater
from essessey.errors import SSEDecodeError, StreamHTTPError
from tests.servers import serve
from tests.sse_fixture import FIXTURES, load_fixture

pytestmark = pytest.mark.anyio

SEED004 = (FIXTURES / "seed004_turn.sse").read_bytes()

# A BOM, CRLF, lone CR and LF line endings, a comment, ids, a retry hint and multi-byte
# UTF-8: what a chunk boundary can land in the middle of.
MIXED = (
    b"\xef\xbb\xbfretry: 1500\r\nid: e1\r\nevent: content_block_delta\r\n"
    b'data: {"text":"h\xc3\xa9llo \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80"}\r\n\r\n'
    b": keep-alive\r\r"
    b"id: e2\rdata: line one\rdata: line two\r\r"
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)
MIXED_EVENTS = [
    Event("content_block_delta", '{"text":"héllo 日本 😀"}'.encode(), "e1"),
    Event("message", b"line one\nline two", "e2"),
    Event("message_stop", b'{"type":"message_stop"}', "e2"),
]

IDS = b"retry: 2500\n\nid: 1\nevent: first\ndata: one\n\nid: 2\ndata: two\n\ndata: three\n\n"

ERRORS: dict[int, dict[str, Any]] = {
    401: {"message": "API key has been revoked or does not exist.", "error": "token_revoked"},
    402: {
        "type": "error",
        "error": {"type": "insufficient_quota", "message": "The project balance is exhausted."},
    },
    403: {
        "type": "error",
        "error": {"type": "permission_denied", "message": "This project may not use the model."},
    },
}


def odd_chunks(body: bytes, seed: int) -> Iterator[bytes]:
    """``body`` cut into pieces of 1 to 7 bytes, at places a seeded RNG picks."""
    rng = random.Random(seed)
    position = 0
    while position < len(body):
        size = rng.randint(1, 7)
        yield body[position : position + size]
        position += size


async def stream_bytes(body: bytes, *, seed: int | None = None) -> AsyncIterator[bytes]:
    if seed is None:
        yield body
        return
    for piece in odd_chunks(body, seed):
        yield piece
        # Give each piece its own write on the socket, so the client sees small reads.
        await anyio.sleep(0.0005)


def sse(body: bytes, *, seed: int | None = None) -> StreamingResponse:
    return StreamingResponse(stream_bytes(body, seed=seed), media_type="text/event-stream")


async def fixture_route(request: Request) -> Response:
    body = {"seed004": SEED004, "mixed": MIXED, "ids": IDS}[request.path_params["name"]]
    seed = request.query_params.get("seed")
    return sse(body, seed=int(seed) if seed is not None else None)


async def error_route(request: Request) -> Response:
    status = int(request.path_params["status"])
    if status in ERRORS:
        return JSONResponse(ERRORS[status], status_code=status)
    return PlainTextResponse("upstream exploded\n", status_code=status)


async def json_route(request: Request) -> Response:
    return JSONResponse({"ok": True})


async def no_content_route(request: Request) -> Response:
    return Response(status_code=204)


async def echo_route(request: Request) -> Response:
    seen = {
        name: request.headers.get(name)
        for name in ("accept", "accept-encoding", "cache-control", "last-event-id", "x-trace")
    }
    return sse(b"event: headers\ndata: " + orjson.dumps(seen) + b"\n\n")


async def stream_204_route(request: Request) -> Response:
    # A 204 that names the stream's type: the spec's "do not reconnect" all the same.
    return Response(status_code=204, media_type="text/event-stream")


async def moved_route(request: Request) -> Response:
    return Response(status_code=307, headers={"location": "/echo"})


async def broken_route(request: Request) -> Response:
    async def body() -> AsyncIterator[bytes]:
        yield b"event: a\ndata: 1\n\n"
        yield b"event: b\ndata: 2\n\n"
        await anyio.sleep(0.05)
        yield b"event: c\ndata: par"
        await anyio.sleep(0.05)
        raise RuntimeError("the producer failed mid-stream")

    return StreamingResponse(body(), media_type="text/event-stream")


APP = Starlette(
    routes=[
        Route("/sse/{name}", fixture_route),
        Route("/error/{status:int}", error_route),
        Route("/json", json_route),
        Route("/empty", no_content_route),
        Route("/echo", echo_route),
        Route("/empty-stream", stream_204_route),
        Route("/moved", moved_route),
        Route("/broken", broken_route),
    ]
)


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with serve(APP) as url:
        yield url


async def read_all(client: httpx.AsyncClient, url: str, **kwargs: Any) -> list[Event]:
    async with connect(client, "GET", url, **kwargs) as stream:
        return [event async for event in stream]


async def read_into(events: list[Event], client: httpx.AsyncClient, url: str) -> None:
    """Like :func:`read_all`, keeping what arrived before a failure in ``events``."""
    async with connect(client, "GET", url) as stream:
        async for event in stream:
            events.append(event)


async def from_list(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


async def from_chunks(chunks: list[bytes], **kwargs: Any) -> tuple[list[Event], SSESource]:
    source = SSESource(from_list(chunks), **kwargs)
    return [event async for event in source], source


# --- reading real streams ---------------------------------------------------------------


async def test_seed004_turn_read_back_event_by_event(base_url: str) -> None:
    expected = load_fixture("seed004_turn.sse")
    async with (
        httpx.AsyncClient() as client,
        connect(client, "GET", f"{base_url}/sse/seed004") as stream,
    ):
        assert isinstance(stream, SSEEventStream)
        assert stream.response.status_code == 200
        assert stream.response.headers["content-type"].startswith("text/event-stream")
        events = [event async for event in stream]
    assert len(events) == 16
    assert events == expected
    assert [event.event for event in events[:2]] == ["message_start", "ping"]
    assert events[-1] == Event("message_stop", b'{"type":"message_stop"}')
    assert all(event.id is None for event in events)
    assert stream.last_event_id == ""
    assert stream.retry is None


async def test_ids_and_retry_are_exposed(base_url: str) -> None:
    async with (
        httpx.AsyncClient() as client,
        connect(client, "GET", f"{base_url}/sse/ids") as stream,
    ):
        seen: list[tuple[Event, str, int | None]] = []
        async for event in stream:
            seen.append((event, stream.last_event_id, stream.retry))
    assert seen == [
        (Event("first", b"one", "1"), "1", 2500),
        (Event("message", b"two", "2"), "2", 2500),
        # An id persists across events until the stream sets another.
        (Event("message", b"three", "2"), "2", 2500),
    ]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    ("name", "expected"),
    [("seed004", load_fixture("seed004_turn.sse")), ("mixed", MIXED_EVENTS)],
)
async def test_chunk_boundaries_anywhere(
    base_url: str, name: str, expected: list[Event], seed: int
) -> None:
    reads: list[int] = []
    async with httpx.AsyncClient() as client:
        async with client.stream("GET", f"{base_url}/sse/{name}?seed={seed}") as response:

            async def counted() -> AsyncIterator[bytes]:
                async for chunk in response.aiter_bytes():
                    reads.append(len(chunk))
                    yield chunk

            source = SSESource(counted())
            events = [event async for event in source]
        # The same bytes straight from the route, to check the cuts were really made.
        async with connect(client, "GET", f"{base_url}/sse/{name}") as stream:
            whole = [event async for event in stream]
    assert events == expected
    assert whole == expected
    assert sum(reads) == len(SEED004 if name == "seed004" else MIXED)
    assert len(reads) > 1
    if name == "mixed":
        assert source.last_event_id == "e2"
        assert source.retry == 1500


# --- errors before the stream ---------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "error_type", "message"),
    [
        (401, "token_revoked", "API key has been revoked or does not exist."),
        (402, "insufficient_quota", "The project balance is exhausted."),
        (403, "permission_denied", "This project may not use the model."),
    ],
)
async def test_error_shapes_raise_stream_http_error(
    base_url: str, status: int, error_type: str, message: str
) -> None:
    async with httpx.AsyncClient() as client:
        with pytest.raises(StreamHTTPError) as caught:
            await read_all(client, f"{base_url}/error/{status}")
    error = caught.value
    assert error.status == status
    assert error.error_type == error_type
    assert error.message == message
    assert error.body == ERRORS[status]
    assert error.content_type == "application/json"
    assert str(error) == f"HTTP {status}: {error_type}: {message}"


async def test_plain_text_error_keeps_the_text(base_url: str) -> None:
    async with httpx.AsyncClient() as client:
        with pytest.raises(StreamHTTPError) as caught:
            await read_all(client, f"{base_url}/error/500")
    error = caught.value
    assert error.status == 500
    assert error.error_type is None
    assert error.message == "upstream exploded"
    assert error.body == "upstream exploded\n"
    assert error.content_type is not None
    assert error.content_type.startswith("text/plain")


async def test_200_with_json_is_not_a_stream(base_url: str) -> None:
    async with httpx.AsyncClient() as client:
        with pytest.raises(StreamHTTPError) as caught:
            await read_all(client, f"{base_url}/json")
        with pytest.raises(StreamHTTPError) as no_content:
            await read_all(client, f"{base_url}/empty")
    error = caught.value
    assert error.status == 200
    assert error.content_type == "application/json"
    assert error.body == {"ok": True}
    assert error.error_type is None
    assert error.message == "expected text/event-stream, got application/json"
    assert no_content.value.status == 204
    assert no_content.value.content_type is None


async def test_oversized_error_body_is_read_only_up_to_the_cap() -> None:
    chunk = b"x" * 65536
    total_chunks = 4096  # 256 MiB: far more than socket buffers can hold
    sent_per_request: list[int] = []
    both_done = threading.Event()  # set in uvicorn's thread

    async def huge(request: Request) -> Response:
        async def body() -> AsyncIterator[bytes]:
            sent = 0
            try:
                for _ in range(total_chunks):
                    # uvicorn drops writes to a closed connection silently; stop then,
                    # so the count shows when the client hung up.
                    if await request.is_disconnected():
                        break
                    yield chunk
                    sent += 1
            finally:
                sent_per_request.append(sent)
                if len(sent_per_request) == 2:
                    both_done.set()

        return StreamingResponse(body(), status_code=500, media_type="text/plain")

    with serve(Starlette(routes=[Route("/", huge)])) as url:
        async with httpx.AsyncClient() as client:
            with pytest.raises(StreamHTTPError) as default_cap:
                await read_all(client, url)
            with pytest.raises(StreamHTTPError) as small_cap:
                await read_all(client, url, max_error_body=1000)
        # Each client hung up long before the body's end.
        assert await anyio.to_thread.run_sync(both_done.wait, 10)
    # Socket buffers hold a few MiB at most; 16 MiB sent would mean the body was read.
    assert all(sent < total_chunks // 16 for sent in sent_per_request), sent_per_request
    assert default_cap.value.status == 500
    assert default_cap.value.body == "x" * MAX_ERROR_BODY
    assert default_cap.value.message == "x" * 1024 + "…"
    assert small_cap.value.body == "x" * 1000


# --- the transport failing mid-stream --------------------------------------------------


async def test_app_failing_mid_stream_raises_not_a_clean_end(base_url: str) -> None:
    events: list[Event] = []
    async with httpx.AsyncClient() as client:
        # uvicorn drops the connection without the chunked body's terminator.
        with pytest.raises(httpx.RemoteProtocolError, match="incomplete chunked read"):
            await read_into(events, client, f"{base_url}/broken")
    assert events == [Event("a", b"1"), Event("b", b"2")]


@asynccontextmanager
async def raw_server(answer: bytes) -> AsyncIterator[str]:
    """A socket server that reads a request head, writes ``answer`` and hangs up."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(SocketAttribute.local_port)

    async def handle(client: SocketStream) -> None:
        async with client:
            head = b""
            for _ in range(64):
                if b"\r\n\r\n" in head:
                    break
                head += await client.receive()
            await client.send(answer)

    async with listener, anyio.create_task_group() as group:
        group.start_soon(listener.serve, handle)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            group.cancel_scope.cancel()


FIRST = b"event: a\ndata: 1\n\n"
CHUNKED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
    + f"{len(FIRST):x}\r\n".encode()
    + FIRST
    + b"\r\n40\r\nevent: b\ndata: pa"
)
SHORT_CONTENT_LENGTH = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 500\r\n\r\n"
    + FIRST
    + b"event: b\ndata: pa"
)


@pytest.mark.parametrize("answer", [CHUNKED, SHORT_CONTENT_LENGTH], ids=["chunked", "length"])
async def test_connection_closed_mid_body_raises(answer: bytes) -> None:
    events: list[Event] = []
    async with raw_server(answer) as url, httpx.AsyncClient() as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await read_into(events, client, url)
    assert events == [Event("a", b"1")]


# --- request headers --------------------------------------------------------------------


async def test_request_headers_and_last_event_id(base_url: str) -> None:
    async with httpx.AsyncClient() as client:
        async with connect(
            client, "GET", f"{base_url}/echo", last_event_id="42", headers={"X-Trace": "t1"}
        ) as stream:
            assert stream.last_event_id == "42"
            resumed = [event async for event in stream]
        fresh = await read_all(client, f"{base_url}/echo")
        with pytest.raises(ValueError, match="CR, LF or NUL"):
            await read_all(client, f"{base_url}/echo", last_event_id="4\n2")
    assert len(resumed) == 1
    # Until the stream sets an id, events carry the one the client resumed from.
    assert resumed[0].id == "42"
    # Identity: a compressed stream is held back by its compressor, and a small
    # compressed body can inflate to gigabytes.
    assert resumed[0].json() == {
        "accept": "text/event-stream",
        "accept-encoding": "identity",
        "cache-control": "no-cache",
        "last-event-id": "42",
        "x-trace": "t1",
    }
    assert fresh[0].id is None
    assert fresh[0].json()["last-event-id"] is None
    assert fresh[0].json()["accept"] == "text/event-stream"


async def test_a_compressed_stream_the_server_sends_anyway_reaches_the_decoder_in_pieces() -> None:
    # Inflated at once, 16 KB of gzip was 8 MiB in one chunk, and the decoder made its
    # 800,000 events in one list (465 MiB for the CLI's tail).
    from essessey.bindings.sse._client import _bounded

    async def one(chunk: bytes) -> AsyncIterator[bytes]:
        yield chunk

    whole = b"data: {}\n\n" * 100_000
    pieces = [piece async for piece in _bounded(one(whole))]
    assert b"".join(pieces) == whole
    assert max(len(piece) for piece in pieces) == 64 * 1024
    answer = _compressed_answer(gzip.compress(whole), "gzip")
    async with (
        raw_server(answer) as url,
        httpx.AsyncClient() as client,
        connect(client, "GET", url) as stream,
    ):
        assert sum([1 async for _ in stream]) == 100_000


def _compressed_answer(body: bytes, codings: str) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    head += b"content-encoding: %s\r\ncontent-length: %d\r\n\r\n" % (codings.encode(), len(body))
    return head + body


def _gzip_stream(pieces: Iterator[bytes]) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return b"".join(compressor.compress(piece) for piece in pieces) + compressor.flush()


async def test_a_body_compressed_twice_that_inflates_past_every_limit_is_refused_bounded() -> None:
    # 64 MiB of one data line, compressed twice: a few hundred bytes. Inflated a network
    # read at a time (httpx's way) it was one 64 MiB chunk before any limit applied; a
    # piece at a time, the decoder's line limit ends it with the client holding little.
    inner = _gzip_stream(iter([b"data: ", *([b"a" * (1 << 20)] * 64)]))
    answer = _compressed_answer(gzip.compress(inner, 9), "gzip, gzip")
    assert len(answer) < 2048
    tracemalloc.start()
    try:
        async with raw_server(answer) as url, httpx.AsyncClient() as client:
            with pytest.raises(SSEDecodeError, match="max_line_length"):
                await read_all(client, url)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 40 << 20, peak


@pytest.mark.parametrize("codings", ["gzip", "deflate", "gzip, gzip", "deflate, gzip"])
async def test_a_stream_compressed_anyway_reads_as_sent(codings: str) -> None:
    whole = b"".join(b'id: %d\ndata: {"n": %d}\n\n' % (n, n) for n in range(20_000))
    body = whole
    for coding in [part.strip() for part in codings.split(",")]:
        body = gzip.compress(body) if coding == "gzip" else zlib.compress(body)
    async with raw_server(_compressed_answer(body, codings)) as url, httpx.AsyncClient() as client:
        events = await read_all(client, url)
    assert [event.json() for event in events] == [{"n": n} for n in range(20_000)]
    assert events[-1].id == "19999"


@settings(max_examples=60, deadline=None)
@given(
    data=st.binary(max_size=20_000),
    codings=st.lists(st.sampled_from(["gzip", "deflate", "raw-deflate"]), min_size=1, max_size=3),
    cuts=st.lists(st.integers(min_value=0, max_value=30_000), max_size=8),
    piece=st.integers(min_value=1, max_value=4096),
)
def test_the_inflater_gives_back_the_body_in_bounded_pieces_at_every_split(
    data: bytes, codings: list[str], cuts: list[int], piece: int
) -> None:
    body = data
    for coding in codings:
        if coding == "gzip":
            body = gzip.compress(body)
        elif coding == "deflate":
            body = zlib.compress(body)
        else:  # "deflate" sent without zlib's wrapper, which clients read too
            compressor = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
            body = compressor.compress(body) + compressor.flush()
    named = ["deflate" if coding == "raw-deflate" else coding for coding in codings]
    inflater = Inflater(named, piece)
    bounds = sorted({0, len(body), *(min(cut, len(body)) for cut in cuts)})
    out = [decoded for start, end in pairwise(bounds) for decoded in inflater.feed(body[start:end])]
    out += list(inflater.flush())
    assert b"".join(out) == data
    assert all(len(decoded) <= piece for decoded in out)


async def test_leaving_early_closes_the_response(base_url: str) -> None:
    async with httpx.AsyncClient() as client:
        async with connect(client, "GET", f"{base_url}/sse/seed004") as stream:
            async for event in stream:
                assert event.event == "message_start"
                break
            assert not stream.response.is_closed
        assert stream.response.is_closed
        # The client is still usable afterwards.
        assert len(await read_all(client, f"{base_url}/sse/seed004")) == 16


# --- SSESource over plain byte iterators -----------------------------------------------


async def test_unterminated_event_is_discarded_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tail = b"event: b\ndata: secret-payload"
    caplog.set_level(logging.WARNING, logger="essessey.sse")
    events, source = await from_chunks([b"id: 7\nevent: a\ndata: one\n\n", tail])
    assert events == [Event("a", b"one", "7")]
    assert source.last_event_id == "7"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert f"discarded {len(tail)} bytes" in warnings[0].getMessage()
    assert "secret" not in caplog.text
    assert "payload" not in caplog.text


async def test_keep_alive_comments_after_the_last_event_discard_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # How the hub's routes end a subscription cut short: keep-alives, then the end. A
    # warning said bytes of an event were discarded; nothing was.
    caplog.set_level(logging.WARNING, logger="essessey.sse")
    events, _ = await from_chunks([b"data: one\n\n: ping\n", b": ping\n"])
    assert events == [Event("message", b"one")]
    assert [r for r in caplog.records if r.levelno == logging.WARNING] == []


COMPLETE = [
    b"data: a\n\n: keep-alive\n",  # comments after the last event: nothing cut short
    b"data: a\n\n",
    b"data: a\r\r",
    b"data: a\r\n\r\n",
    b"data: a\n\r\n",
    b"data: a\r\n\n",
    b"data: a\r\r\n",
    b"data: a\n\r",
    b": comment\n\nid: 3\ndata: a\r\n\r\n",
    b"\n",
    b"\r\n",
]
UNTERMINATED = [
    (b"data: a\r\n\r\ndata: b", 7),
    (b"data: a\n\ndata: b\n", 8),
    (b"data: a\r\rdata: b\r", 8),
    (b"data: a\r\n\r\ndata: b\r\n", 9),
    (b"data: b", 7),
]


def splits(body: bytes) -> Iterator[list[bytes]]:
    """``body`` whole, and cut in two and in three pieces at every pair of places."""
    yield [body]
    for i in range(1, len(body)):
        yield [body[:i], body[i:]]
        for j in range(i + 1, len(body)):
            yield [body[:i], body[i:j], body[j:]]


@pytest.mark.parametrize("body", COMPLETE)
async def test_complete_streams_never_warn_at_any_split(
    body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="essessey.sse")
    expected, _ = await from_chunks([body])
    for chunks in splits(body):
        events, _ = await from_chunks(chunks)
        assert events == expected, chunks
    assert caplog.records == []


@pytest.mark.parametrize(("body", "discarded"), UNTERMINATED)
async def test_discarded_size_is_right_at_any_split(
    body: bytes, discarded: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="essessey.sse")
    for chunks in splits(body):
        caplog.clear()
        await from_chunks(chunks)
        assert [r.args for r in caplog.records] == [(discarded,)], chunks


async def test_transport_failure_propagates_as_it_is() -> None:
    failure = ConnectionResetError("peer reset")
    closed = []

    async def flaky() -> AsyncIterator[bytes]:
        try:
            yield b"event: a\ndata: 1\n\nevent: b\nda"
            raise failure
        finally:
            closed.append(True)

    events: list[Event] = []

    async def drain() -> None:
        async for event in SSESource(flaky()):
            events.append(event)

    with pytest.raises(ConnectionResetError) as caught:
        await drain()
    assert caught.value is failure
    assert events == [Event("a", b"1")]
    assert closed == [True]


async def test_limits_raise_decode_error() -> None:
    with pytest.raises(SSEDecodeError):
        await from_chunks([b"data: " + b"x" * 100 + b"\n\n"], max_line_length=64)
    with pytest.raises(SSEDecodeError):
        await from_chunks([b"data: x\n" * 40 + b"\n"], max_event_size=64)
    events, _ = await from_chunks([b"data: " + b"x" * 50 + b"\n\n"], max_line_length=64)
    assert events == [Event("message", b"x" * 50)]


async def test_a_source_is_iterated_once_and_closes_its_iterator() -> None:
    closed = []

    async def endless() -> AsyncIterator[bytes]:
        try:
            for number in range(1000):
                yield f"data: {number}\n\n".encode()
        finally:
            closed.append(True)

    source = SSESource(endless())
    async for event in source:
        assert event == Event("message", b"0")
        break
    with pytest.raises(RuntimeError, match="once"):
        aiter(source)
    await source.aclose()
    assert closed == [True]

    for started in (False, True):
        unread = endless()
        source = SSESource(unread)
        if started:
            aiter(source)
        await source.aclose()
        with pytest.raises(StopAsyncIteration):
            await anext(unread)


def test_imports_without_httpx() -> None:
    code = (
        "import sys\n"
        "sys.modules['httpx'] = None\n"
        "from essessey.bindings.sse import SSESource, connect\n"
        "import anyio\n"
        "async def main():\n"
        "    async def body():\n"
        "        yield b'data: hi\\n\\n'\n"
        "    print([e.data for e in [e async for e in SSESource(body())]])\n"
        "anyio.run(main)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[b'hi']"


async def test_resume_point_follows_the_events_handed_out() -> None:
    body = b"id: 1\ndata: a\n\nid: 2\ndata: b\n\nid: 3\n\n"
    source = SSESource(from_list([body]))
    async for event in source:
        # The decoder has read the whole chunk; the resume point must not run ahead.
        assert event == Event("message", b"a", "1")
        assert source.last_event_id == "1"
        break
    await source.aclose()

    events, whole = await from_chunks([body])
    assert [event.id for event in events] == ["1", "2"]
    # An id-only event moves the resume point without a message.
    assert whole.last_event_id == "3"

    resumed, source = await from_chunks([b"data: c\n\n"], last_event_id="3")
    assert resumed == [Event("message", b"c", "3")]
    assert source.last_event_id == "3"


async def test_a_redirect_is_followed_a_204_ends_and_an_id_goes_as_utf8(base_url: str) -> None:
    # As EventSource: a redirect is followed, a 204 is "do not reconnect" whatever its
    # type, and the last event id (which a stream may set to any text) is sent as UTF-8.
    async with httpx.AsyncClient() as client:
        moved = await read_all(client, f"{base_url}/moved", last_event_id="é-1")
        with pytest.raises(StreamHTTPError) as no_content:
            await read_all(client, f"{base_url}/empty-stream")
        with pytest.raises(ValueError, match="whitespace"):
            await read_all(client, f"{base_url}/echo", last_event_id=" x")
        with pytest.raises(StreamHTTPError) as refused:
            await read_all(client, f"{base_url}/moved", follow_redirects=False)
    assert moved[0].json()["last-event-id"] == "é-1".encode().decode("latin-1")
    assert no_content.value.status == 204
    assert refused.value.status == 307
