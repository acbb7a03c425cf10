"""EventStreamResponse against a real uvicorn server (read with httpx), and through its ASGI
interface called directly where a test needs to see every ``send``."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
import fastapi
import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from essessey import (
    Event,
    InMemorySink,
    Publisher,
    StreamInterrupted,
    StreamRejected,
    TurnProducer,
    stream_turn,
)
from essessey.bindings.sse import EventStreamResponse, SSEDecoder, SSEMessage, encode_many
from essessey.protocol import Dialect
from essessey.testing import wait_until
from tests.processes import WAIT
from tests.servers import serve

pytestmark = pytest.mark.anyio

SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"
PING = b": ping\n"  # a comment line alone: no blank line a decoder would dispatch on
CLIENT_TIMEOUT = httpx.Timeout(10.0)


# -- producers and what they publish ----------------------------------------------------


async def whole_turn(publisher: Publisher) -> None:
    """A turn with every kind of block: thinking (signed), text, a tool call and its result."""
    async with stream_turn(publisher, message_id="msg_1", stream_id="st_1", model="m-1") as turn:
        thinking = await turn.thinking()
        await thinking.write("Checking the weather ")
        await thinking.write("for Paris.")
        await thinking.write_signature("sig-123")
        text = await turn.text()
        await text.write("Let me look")
        await text.write(" that up.\n")
        tools = await turn.tools()
        await tools.start_call("toolu_1", "get_weather", '{"city":')
        await tools.write_arguments("toolu_1", ' "Paris"}')
        await tools.write_result("toolu_1", '{"temp_c": 21}')
        turn.stop_reason = "tool_use"
        turn.output_tokens = 17


async def published(producer: TurnProducer, *, dialect: Dialect = "essessey") -> list[Event]:
    """The events ``producer`` publishes, collected in memory."""
    sink = InMemorySink()
    await producer(Publisher(sink, dialect=dialect))
    return sink.events


def decode(body: bytes) -> list[SSEMessage]:
    decoder = SSEDecoder()
    return decoder.feed(body) + decoder.close()


def route_app(endpoint: Callable[[Request], Awaitable[EventStreamResponse]]) -> Starlette:
    return Starlette(routes=[Route("/stream", endpoint)])


async def get(base: str, path: str = "/stream") -> httpx.Response:
    async with httpx.AsyncClient(base_url=base, timeout=CLIENT_TIMEOUT) as client:
        return await client.get(path)


def assert_sse_headers(response: httpx.Response) -> None:
    assert response.headers["content-type"] == SSE_CONTENT_TYPE
    assert response.headers["cache-control"] == "no-cache"
    assert response.headers["x-accel-buffering"] == "no"


# -- a whole turn, byte for byte ---------------------------------------------------------


async def test_text_deltas_of_any_block_index_arrive_as_their_encoded_events() -> None:
    # A text delta's frame is made from a head per block index, made once for the first
    # ones: the blocks here go past them.
    async def many_blocks(publisher: Publisher) -> None:
        await publisher.send_message_start("msg_1", "s", "m")
        for index in range(300):
            await publisher.send_content_block_start_text(index)
            await publisher.send_content_block_delta_text(index, f"t{index} \u00e9\n")
            await publisher.send_content_block_stop(index)
        await publisher.send_stream_epilogue("end_turn", 1)

    async def endpoint(request: Request) -> EventStreamResponse:
        return EventStreamResponse(many_blocks)

    with serve(route_app(endpoint)) as base:
        response = await get(base)
    assert response.content == encode_many(await published(many_blocks))


@pytest.mark.parametrize("retry", [None, 2500])
async def test_a_turn_arrives_as_the_exact_encoded_bytes(retry: int | None) -> None:
    async def endpoint(request: Request) -> EventStreamResponse:
        return EventStreamResponse(whole_turn, headers={"x-request-id": "req-7"}, retry=retry)

    with serve(route_app(endpoint)) as base:
        response = await get(base)

    expected = encode_many(await published(whole_turn))
    assert response.status_code == 200
    assert_sse_headers(response)
    assert response.headers["x-request-id"] == "req-7"
    if retry is None:
        assert response.content == expected
    else:
        # The hint comes first, a field of the first event's block (a block of its own
        # would be an empty event to some decoders).
        assert response.content == b"retry: 2500\n" + expected
    names = [message.event for message in decode(response.content)]
    assert names[0] == "message_start"
    assert names[-1] == "message_stop"
    assert "content_block_delta" in names


async def test_a_user_header_overrides_a_default_one() -> None:
    async def endpoint(request: Request) -> EventStreamResponse:
        return EventStreamResponse(whole_turn, headers={"Cache-Control": "no-store"})

    with serve(route_app(endpoint)) as base:
        response = await get(base)

    assert response.headers.get_list("cache-control") == ["no-store"]
    assert response.headers["x-accel-buffering"] == "no"
    assert response.content == encode_many(await published(whole_turn))


async def test_the_anthropic_dialect_shapes_the_payloads() -> None:
    async def endpoint(request: Request) -> EventStreamResponse:
        return EventStreamResponse(whole_turn, dialect="anthropic")

    with serve(route_app(endpoint)) as base:
        response = await get(base)

    assert response.content == encode_many(await published(whole_turn, dialect="anthropic"))
    deltas = [orjson.loads(m.data) for m in decode(response.content)]
    assert {"type": "thinking_delta", "thinking": "for Paris."} in [d.get("delta") for d in deltas]


# -- source mode -------------------------------------------------------------------------


async def test_a_source_streams_its_events_with_their_ids() -> None:
    events = [e.with_id(f"7-{i}") for i, e in enumerate(await published(whole_turn))]

    async def source() -> AsyncIterator[Event]:
        for event in events:
            yield event

    async def endpoint(request: Request) -> EventStreamResponse:
        return EventStreamResponse(source())

    with serve(route_app(endpoint)) as base:
        response = await get(base)

    assert response.status_code == 200
    assert_sse_headers(response)
    assert response.content == encode_many(events)
    assert response.content.startswith(b"id: 7-0\nevent: message_start\n")
    messages = decode(response.content)
    assert [(m.event, m.data.encode(), m.id) for m in messages] == [
        (e.event, e.data, e.id) for e in events
    ]


# -- where it can be used ----------------------------------------------------------------


def starlette_app() -> tuple[ASGIApp, str]:
    async def endpoint(request: Request) -> EventStreamResponse:
        return EventStreamResponse(whole_turn)

    return route_app(endpoint), "/stream"


def fastapi_app() -> tuple[ASGIApp, str]:
    app = fastapi.FastAPI()

    @app.get("/stream")
    async def stream() -> EventStreamResponse:
        return EventStreamResponse(whole_turn)

    return app, "/stream"


def mounted_app() -> tuple[ASGIApp, str]:
    # The response instance itself is the ASGI app: each request runs the producer anew.
    return Starlette(routes=[Mount("/events", app=EventStreamResponse(whole_turn))]), "/events/"


def bare_asgi_app() -> tuple[ASGIApp, str]:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await EventStreamResponse(whole_turn)(scope, receive, send)

    return app, "/stream"


def response_as_the_app() -> tuple[ASGIApp, str]:
    return EventStreamResponse(whole_turn), "/anything"


@pytest.mark.parametrize(
    "make_app",
    [starlette_app, fastapi_app, mounted_app, bare_asgi_app, response_as_the_app],
    ids=["starlette-route", "fastapi-route", "starlette-mount", "bare-asgi", "response-is-app"],
)
async def test_it_works_wherever_an_asgi_app_or_response_goes(
    make_app: Callable[[], tuple[ASGIApp, str]],
) -> None:
    expected = encode_many(await published(whole_turn))
    app, path = make_app()
    with serve(app) as base:
        async with httpx.AsyncClient(base_url=base, timeout=CLIENT_TIMEOUT) as client:
            # Twice: nothing of one request's state may leak into the next.
            responses = [await client.get(path) for _ in range(2)]
    for response in responses:
        assert response.status_code == 200
        assert_sse_headers(response)
        assert response.content == expected


# -- keep-alive --------------------------------------------------------------------------


async def short_turn(publisher: Publisher) -> None:
    async with stream_turn(publisher, message_id="msg_2", stream_id="st_2", model="m") as turn:
        await (await turn.text()).write("finally")


async def late_turn(publisher: Publisher) -> None:
    await anyio.sleep(0.25)  # idle before the first event
    await short_turn(publisher)


async def test_an_idle_stream_gets_keep_alive_comments() -> None:
    async def endpoint(request: Request) -> EventStreamResponse:
        return EventStreamResponse(late_turn, ping_interval=0.05)

    with serve(route_app(endpoint)) as base:
        response = await get(base)

    assert response.status_code == 200
    body = response.content
    pings = 0  # the comments come while idle, i.e. before the first event
    while body.startswith(PING, pings * len(PING)):
        pings += 1
    # Bounded by the idle time (about 0.25 s / 0.05 s), whatever the machine's speed.
    assert 2 <= pings <= 10
    assert body[len(PING) * pings :] == encode_many(await published(short_turn))
    assert decode(body)[0].event == "message_start"  # comments dispatch nothing


async def test_ping_interval_zero_sends_no_keep_alive() -> None:
    async def endpoint(request: Request) -> EventStreamResponse:
        return EventStreamResponse(late_turn, ping_interval=0)

    with serve(route_app(endpoint)) as base:
        response = await get(base)

    assert b"\n" + PING not in b"\n" + response.content  # no comment line anywhere
    assert response.content == encode_many(await published(short_turn))


# -- calling the ASGI interface directly -------------------------------------------------


class Recorder:
    """An ASGI ``send`` that records every message (and when), and a ``receive`` that
    gives the request and then waits for a disconnect the test triggers."""

    def __init__(self, *, body_delay: float = 0.0) -> None:
        self.messages: list[Message] = []
        self.times: list[float] = []
        self.body_delay = body_delay
        self.receive_calls = 0
        self.disconnect = anyio.Event()
        self.sent_events = 0  # complete SSE messages whose send has returned
        self.on_body: Callable[[bytes], None] | None = None

    async def send(self, message: Message) -> None:
        self.messages.append(message)
        self.times.append(time.monotonic())
        if message["type"] == "http.response.body":
            body: bytes = message.get("body", b"")
            if self.on_body is not None:
                self.on_body(body)
            if self.body_delay:
                await anyio.sleep(self.body_delay)  # a slow client
            self.sent_events += body.count(b"\n\n")

    async def receive(self) -> Message:
        self.receive_calls += 1
        if self.receive_calls == 1:
            return {"type": "http.request", "body": b"", "more_body": False}
        await self.disconnect.wait()
        return {"type": "http.disconnect"}

    @property
    def bodies(self) -> list[bytes]:
        return [m.get("body", b"") for m in self.messages if m["type"] == "http.response.body"]

    @property
    def body_times(self) -> list[float]:
        return [
            t
            for m, t in zip(self.messages, self.times, strict=True)
            if m["type"] == "http.response.body"
        ]

    @property
    def body(self) -> bytes:
        return b"".join(self.bodies)

    @property
    def start(self) -> Message:
        assert self.messages[0]["type"] == "http.response.start"
        return self.messages[0]


def http_scope(method: str = "GET") -> Scope:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": "/stream",
        "raw_path": b"/stream",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"test")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 80),
    }


async def call(response: EventStreamResponse, recorder: Recorder, method: str = "GET") -> None:
    with anyio.fail_after(10):
        await response(http_scope(method), recorder.receive, recorder.send)


async def test_keep_alive_is_paced_by_the_interval_not_a_busy_loop() -> None:
    interval = 0.05
    recorder = Recorder()
    started = time.monotonic()
    await call(EventStreamResponse(late_turn, ping_interval=interval), recorder)

    first_event = next(i for i, b in enumerate(recorder.bodies) if b"event:" in b)
    idle_sends = recorder.bodies[:first_event]
    assert idle_sends, "no keep-alive was sent while the producer was idle"
    assert all(body == PING for body in idle_sends)
    idle = recorder.times[first_event + 1] - started  # +1: the start message comes first
    # One comment per interval of idle time, at most (plus one for the edges).
    assert len(idle_sends) <= idle / interval + 1
    assert len(idle_sends) >= 3
    # The disconnect watcher waits in receive(); it does not poll.
    assert recorder.receive_calls <= 2


async def test_a_batch_is_never_waited_for() -> None:
    # The producer waits, after its first event, until the client has that event: if the
    # response held events back to fill a batch, this would never end.
    recorder = Recorder()
    first_seen = anyio.Event()
    recorder.on_body = lambda body: first_seen.set() if b"message_start" in body else None

    async def produce(publisher: Publisher) -> None:
        await publisher.send_message_start("msg_3", "st_3", "m")
        await first_seen.wait()
        await publisher.send_message_stop()

    await call(EventStreamResponse(produce, ping_interval=0), recorder)
    assert [m.event for m in decode(recorder.body)] == ["message_start", "message_stop"]


async def test_at_a_models_pace_each_event_is_sent_at_once_by_its_producer() -> None:
    # A token every few milliseconds: nothing is held, each event goes out in a send of
    # its own, from the producer's own task (no writer task in between), at once.
    count = 20
    recorder = Recorder()
    senders: list[object] = []
    recorder.on_body = lambda body: senders.append(
        anyio.get_current_task().id if b"content_block_delta" in body else None
    )
    producer_task: list[object] = []
    emitted: list[float] = []

    async def produce(publisher: Publisher) -> None:
        producer_task.append(anyio.get_current_task().id)
        await publisher.send_stream_preamble("msg_p", "st_p", "m")
        await anyio.sleep(0.003)
        await publisher.send_content_block_start_text(0)
        for i in range(count):
            await anyio.sleep(0.003)
            emitted.append(time.monotonic())
            await publisher.send_content_block_delta_text(0, f"t{i}")
        await anyio.sleep(0.003)
        await publisher.send_content_block_stop(0)
        await anyio.sleep(0.003)
        await publisher.send_stream_epilogue("end_turn", count)

    await call(EventStreamResponse(produce, ping_interval=0), recorder)
    deltas = [
        (body, when)
        for body, when in zip(recorder.bodies, recorder.body_times, strict=True)
        if b"content_block_delta" in body
    ]
    assert len(deltas) == count
    assert all(body.count(b"\n\n") == 1 for body, _ in deltas)
    assert {sender for sender in senders if sender is not None} == set(producer_task)
    # Sent within the producer's own call, not at a later turn of the loop.
    assert max(when - at for (_, when), at in zip(deltas, emitted, strict=True)) < 0.002


async def test_queued_events_coalesce_into_few_sends_with_a_bounded_queue() -> None:
    count = 2000
    max_queue = 16
    recorder = Recorder(body_delay=0.001)
    lags: list[int] = []

    def producer(record: bool) -> TurnProducer:
        async def produce(publisher: Publisher) -> None:
            await publisher.send_stream_preamble("msg_4", "st_4", "m")
            await publisher.send_content_block_start_text(0)
            for i in range(count):
                if record:
                    # Events emitted so far (message_start, ping, block start, i deltas)
                    # minus the events whose send has completed.
                    lags.append(3 + i - recorder.sent_events)
                await publisher.send_content_block_delta_text(0, f"chunk {i} ")
            await publisher.send_content_block_stop(0)
            await publisher.send_stream_epilogue("end_turn", count)

        return produce

    expected_events = await published(producer(record=False))
    assert len(expected_events) == count + 6

    response = EventStreamResponse(producer(record=True), ping_interval=0, max_queue=max_queue)
    await call(response, recorder)

    assert recorder.body == encode_many(expected_events)  # all of them, in order
    body_sends = recorder.bodies
    assert body_sends[-1] == b""  # the end of the response
    assert len(body_sends) < count / 8
    # One write holds what was queued: at most the queue plus the sender it let in.
    assert max(body.count(b"\n\n") for body in body_sends) <= max_queue + 1
    # The producer ran ahead of the client only by the queue and the batch being sent.
    assert max(lags) <= 2 * max_queue + 1
    assert max(lags) >= max_queue  # and it did run ahead: the bound was exercised


async def test_head_sends_headers_only_and_runs_no_producer() -> None:
    ran = threading.Event()

    async def produce(publisher: Publisher) -> None:
        ran.set()
        await whole_turn(publisher)

    async def endpoint(request: Request) -> EventStreamResponse:
        return EventStreamResponse(produce, headers={"x-request-id": "req-h"})

    with serve(route_app(endpoint)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=CLIENT_TIMEOUT) as client:
            response = await client.head("/stream")
            assert not ran.is_set()
            # The same route still streams on GET: the HEAD did not break the app.
            streamed = await client.get("/stream")

    assert response.status_code == 200
    assert_sse_headers(response)
    assert response.headers["x-request-id"] == "req-h"
    assert response.content == b""
    assert streamed.content == encode_many(await published(whole_turn))
    assert ran.is_set()
    ran.clear()

    recorder = Recorder()
    await call(EventStreamResponse(produce), recorder, method="HEAD")
    assert not ran.is_set()
    assert recorder.start["status"] == 200
    assert recorder.body == b""


# -- the client leaving, and a client that stops reading ---------------------------------


async def endless_deltas(publisher: Publisher, *, size: int, pause: float) -> None:
    await publisher.send_stream_preamble("msg_5", "st_5", "m")
    await publisher.send_content_block_start_text(0)
    chunk = "x" * size
    for _ in range(100_000):  # bounded; the tests end it long before
        await publisher.send_content_block_delta_text(0, chunk)
        if pause:
            await anyio.sleep(pause)


class Outcome:
    """How a producer running in the server's thread ended."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.ended = threading.Event()
        self.other: list[BaseException] = []

    def wrap(self, produce: TurnProducer) -> TurnProducer:
        async def wrapped(publisher: Publisher) -> None:
            try:
                await produce(publisher)
            except anyio.get_cancelled_exc_class():
                self.cancelled.set()
                raise
            except BaseException as exc:
                self.other.append(exc)
                raise
            finally:
                self.ended.set()

        return wrapped

    async def wait_cancelled(self) -> None:
        ended = await anyio.to_thread.run_sync(self.ended.wait, 5.0)
        assert ended, "the producer was still running 5 s later"
        assert self.cancelled.is_set(), f"the producer was not cancelled: {self.other!r}"


async def test_the_client_leaving_cancels_the_producer() -> None:
    outcome = Outcome()

    async def produce(publisher: Publisher) -> None:
        await endless_deltas(publisher, size=10, pause=0.02)

    async def endpoint(request: Request) -> EventStreamResponse:
        return EventStreamResponse(outcome.wrap(produce))

    with serve(route_app(endpoint)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=CLIENT_TIMEOUT) as client:
            decoder = SSEDecoder()
            deltas = 0
            async with client.stream("GET", "/stream") as response:
                assert response.status_code == 200
                async for chunk in response.aiter_raw():
                    deltas += sum(m.event == "content_block_delta" for m in decoder.feed(chunk))
                    if deltas >= 3:
                        break  # leaving the block closes the connection mid-stream
            assert deltas >= 3
        with anyio.fail_after(5):
            await outcome.wait_cancelled()


async def test_a_producer_s_shielded_cleanup_finishes_when_the_client_leaves() -> None:
    # The producer runs in a task of its own; the client leaving cancels it through
    # its own scope, so a shielded cleanup (a framework's run closed, say) still runs to
    # its end, and the response waits for it before it ends.
    finished = threading.Event()
    cancelled = threading.Event()

    async def produce(publisher: Publisher) -> None:
        try:
            await endless_deltas(publisher, size=10, pause=0.02)
        except anyio.get_cancelled_exc_class():
            cancelled.set()
            with anyio.CancelScope(shield=True):
                await anyio.sleep(0.2)  # not cut short by the cancellation
                finished.set()
            raise

    async def endpoint(request: Request) -> EventStreamResponse:
        return EventStreamResponse(produce)

    with serve(route_app(endpoint)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=CLIENT_TIMEOUT) as client:
            decoder = SSEDecoder()
            deltas = 0
            async with client.stream("GET", "/stream") as response:
                async for chunk in response.aiter_raw():
                    deltas += sum(m.event == "content_block_delta" for m in decoder.feed(chunk))
                    if deltas >= 3:
                        break
        assert await anyio.to_thread.run_sync(finished.wait, 5.0)
    assert cancelled.is_set()


async def test_the_client_leaving_closes_a_source_waiting_on_a_full_queue() -> None:
    # The source is parked at a ``yield`` (the queue is full, the client does not read):
    # the response must close it when the client leaves, not leave it to the GC.
    closed = anyio.Event()
    yielded = 0

    async def source() -> AsyncIterator[Event]:
        nonlocal yielded
        try:
            for i in range(1000):
                yielded += 1
                yield Event("content_block_delta", b'{"n":%d}' % i, str(i))
        finally:
            closed.set()

    recorder = Recorder()
    stalled = anyio.Event()

    async def stalled_send(message: Message) -> None:
        recorder.messages.append(message)
        if message["type"] == "http.response.body":
            stalled.set()
            await anyio.sleep_forever()

    response = EventStreamResponse(source(), max_queue=2, send_timeout=None, ping_interval=0)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(response, http_scope(), recorder.receive, stalled_send)
            await stalled.wait()
            await anyio.sleep(0.05)
            assert not closed.is_set()
            recorder.disconnect.set()
            await closed.wait()
    assert yielded < 10  # it was held back by the bounded queue


async def test_a_send_stalled_past_send_timeout_ends_the_response(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="essessey.sse")
    outcome = Outcome()

    async def produce(publisher: Publisher) -> None:
        await endless_deltas(publisher, size=64 * 1024, pause=0)

    async def endpoint(request: Request) -> EventStreamResponse:
        return EventStreamResponse(outcome.wrap(produce), send_timeout=0.5)

    with serve(route_app(endpoint)) as base:
        port = int(base.rsplit(":", 1)[1])
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            # A small receive window, so the buffers between us and the server fill soon.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.settimeout(5)
            sock.connect(("127.0.0.1", port))
            sock.sendall(b"GET /stream HTTP/1.1\r\nHost: test\r\n\r\n")
            # ... and never read.
            with anyio.fail_after(10):
                await outcome.wait_cancelled()
        finally:
            sock.close()

    [record] = [r for r in caplog.records if r.name == "essessey.sse" and "stalled" in r.message]
    assert record.levelno == logging.WARNING
    assert "0.5" in record.getMessage()


# -- failures ----------------------------------------------------------------------------


async def rejecting(publisher: Publisher) -> None:
    raise StreamRejected(429, "rate_limit_error", "Slow down")


async def crashing(publisher: Publisher) -> None:
    raise RuntimeError("secret model output must not leak")


async def crashing_after_start(publisher: Publisher) -> None:
    await publisher.send_stream_preamble("msg_6", "st_6", "m")
    await publisher.send_content_block_start_text(0)
    await publisher.send_content_block_delta_text(0, "partial")
    raise RuntimeError("secret model output must not leak")


async def rejecting_after_start(publisher: Publisher) -> None:
    await publisher.send_stream_preamble("msg_7", "st_7", "m")
    raise StreamRejected(403, "permission_error", "Not yours")


async def turn_body_crashing(publisher: Publisher) -> None:
    async with stream_turn(publisher, message_id="msg_8", stream_id="st_8", model="m") as turn:
        await (await turn.text()).write("half an answer")
        raise RuntimeError("secret model output must not leak")


async def stream_of(producer: TurnProducer) -> httpx.Response:
    async def endpoint(request: Request) -> EventStreamResponse:
        return EventStreamResponse(producer)

    with serve(route_app(endpoint)) as base:
        return await get(base)


@pytest.mark.parametrize(
    ("producer", "status", "error"),
    [
        (rejecting, 429, {"type": "rate_limit_error", "message": "Slow down"}),
        (crashing, 500, {"type": "api_error", "message": "Internal server error"}),
    ],
    ids=["rejected", "crashed"],
)
async def test_a_failure_before_the_first_event_is_a_json_error(
    producer: TurnProducer, status: int, error: dict[str, str]
) -> None:
    response = await stream_of(producer)
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"type": "error", "error": error}
    assert b"secret" not in response.content


async def test_an_error_or_empty_answer_keeps_the_app_s_headers() -> None:
    # A CORS header on a refusal lets a cross-origin fetch read why it was refused; a
    # content type the app gave for its stream must not label the JSON error.
    app_headers = {
        "access-control-allow-origin": "https://app.example",
        "x-request-id": "req-9",
        "content-type": "text/event-stream",
    }

    async def empty() -> AsyncIterator[Event]:
        return
        yield

    async def endpoint(request: Request) -> EventStreamResponse:
        if request.query_params.get("empty"):
            return EventStreamResponse(empty(), headers=app_headers, empty_status=204)
        return EventStreamResponse(rejecting, headers=app_headers)

    with serve(route_app(endpoint)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=CLIENT_TIMEOUT) as client:
            refused = await client.get("/stream")
            nothing = await client.get("/stream", params={"empty": "1"})
    assert refused.status_code == 429
    assert refused.headers["content-type"] == "application/json"
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert nothing.status_code == 204
    assert "content-type" not in nothing.headers
    for answer in (refused, nothing):
        assert answer.headers["access-control-allow-origin"] == "https://app.example"
        assert answer.headers["x-request-id"] == "req-9"


async def test_an_interrupted_source_ends_the_body_for_a_reconnect() -> None:
    # A hub subscription whose store went out of reach: the client must come back with
    # its last id, so neither the 204 of a finished turn (an EventSource stops on it)
    # nor a dialect's end (a client takes it for the whole answer) may go out.
    from essessey.dialects.chat_completions import ChatCompletionsEncoder

    first = Event("message_start", b'{"type":"message_start","message":{"id":"m"}}', "1")

    async def cut(before_any: bool) -> AsyncIterator[Event]:
        if not before_any:
            yield first
        raise StreamInterrupted("the store went out of reach")

    async def endpoint(request: Request) -> EventStreamResponse:
        before_any = request.query_params.get("at") == "start"
        encoder = ChatCompletionsEncoder("chatcmpl-1") if request.query_params.get("chat") else None
        return EventStreamResponse(cut(before_any), empty_status=204, encoder=encoder, retry=1500)

    with serve(route_app(endpoint)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=CLIENT_TIMEOUT) as client:
            at_start = await client.get("/stream", params={"at": "start"})
            mid = await client.get("/stream")
            chat = await client.get("/stream", params={"chat": "1"})
    assert at_start.status_code == 200
    assert at_start.headers["content-type"].startswith("text/event-stream")
    assert at_start.content == b"retry: 1500\n"  # the hint, no event
    assert mid.status_code == 200
    messages = SSEDecoder().feed(mid.content)
    assert [(m.event, m.id) for m in messages] == [("message_start", "1")]  # no error event
    assert b"[DONE]" not in chat.content  # no dialect's end
    assert b"error" not in chat.content


async def test_the_background_task_runs_after_every_answer() -> None:
    # As with any Starlette response: cleanup put in `background` runs after a stream,
    # a refusal, an empty answer and a HEAD alike.
    ran: list[str] = []

    async def empty() -> AsyncIterator[Event]:
        return
        yield

    async def endpoint(request: Request) -> EventStreamResponse:
        kind = request.query_params["kind"]
        background = BackgroundTask(ran.append, kind)
        if kind == "refused":
            return EventStreamResponse(rejecting, background=background)
        if kind == "empty":
            return EventStreamResponse(empty(), background=background, empty_status=204)
        return EventStreamResponse(whole_turn, background=background)

    with serve(route_app(endpoint)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=CLIENT_TIMEOUT) as client:
            answers = {
                kind: await client.get("/stream", params={"kind": kind})
                for kind in ("stream", "refused", "empty")
            }
            answers["head"] = await client.head("/stream", params={"kind": "head"})
            # A background task runs after the body is sent.
            await wait_until(lambda: len(ran) == 4, "the four background tasks")
    assert {kind: answer.status_code for kind, answer in answers.items()} == {
        "stream": 200,
        "refused": 429,
        "empty": 204,
        "head": 200,
    }
    assert sorted(ran) == ["empty", "head", "refused", "stream"]


@pytest.mark.parametrize(
    ("producer", "error"),
    [
        (crashing_after_start, {"type": "api_error", "message": "Internal server error"}),
        (rejecting_after_start, {"type": "permission_error", "message": "Not yours"}),
    ],
    ids=["crashed", "rejected"],
)
async def test_a_failure_after_the_start_is_an_error_event_that_ends_the_stream(
    producer: TurnProducer, error: dict[str, str]
) -> None:
    response = await stream_of(producer)
    assert response.status_code == 200
    assert_sse_headers(response)
    messages = decode(response.content)
    assert messages[0].event == "message_start"
    assert messages[-1].event == "error"
    assert orjson.loads(messages[-1].data) == {"type": "error", "error": error}
    assert [m.event for m in messages].count("error") == 1
    assert response.content.endswith(b"\n\n")  # the stream ended after it, cleanly
    assert b"secret" not in response.content


async def test_a_failing_turn_gets_exactly_one_error_event() -> None:
    response = await stream_of(turn_body_crashing)
    events = await published_until_failure(turn_body_crashing)
    assert response.status_code == 200
    # stream_turn already sends the error event; the response adds none.
    assert response.content == encode_many(events)
    names = [m.event for m in decode(response.content)]
    assert names.count("error") == 1
    assert names[-1] == "error"
    assert orjson.loads(decode(response.content)[-1].data)["error"]["type"] == "api_error"


async def published_until_failure(producer: TurnProducer) -> list[Event]:
    sink = InMemorySink()
    with pytest.raises(RuntimeError):
        await producer(Publisher(sink))
    return sink.events


async def test_a_source_event_that_cannot_be_framed_fails_like_a_producer() -> None:
    # An id with a line break cannot be written without changing what the client reads.
    good = Event("message_start", b'{"type":"message_start"}', "1")
    bad = Event("ping", b'{"type":"ping"}', "2\n3")

    async def first_bad() -> AsyncIterator[Event]:
        yield bad

    for status in (500, 200):
        recorder = Recorder()

        went_out = anyio.Event()
        recorder.on_body = lambda body, went_out=went_out: went_out.set() if body else None

        async def later_bad(went_out: anyio.Event = went_out) -> AsyncIterator[Event]:
            yield good
            with anyio.fail_after(WAIT):  # until the good event has gone out on its own
                await went_out.wait()
            yield bad

        source = first_bad if status == 500 else later_bad
        await call(EventStreamResponse(source()), recorder)
        assert recorder.start["status"] == status
        assert recorder.messages[-1].get("more_body", False) is False  # a complete response
        if status == 500:
            assert orjson.loads(recorder.body)["error"]["type"] == "api_error"
        else:
            messages = decode(recorder.body)
            assert [m.event for m in messages] == ["message_start", "error"]
            assert b"2\n3" not in recorder.body


async def test_a_batch_of_deltas_is_framed_as_its_events_in_one_send() -> None:
    chunks = [f"part {i} " for i in range(50)]

    async def produce(publisher: Publisher) -> None:
        await publisher.send_stream_preamble("msg_b", "st_b", "m")
        await publisher.send_content_block_start_text(0)
        await publisher.send_content_block_deltas_text(0, chunks)
        await publisher.send_content_block_stop(0)
        await publisher.send_stream_epilogue("end_turn", 50)

    recorder = Recorder()
    await call(EventStreamResponse(produce, ping_interval=0), recorder)
    assert recorder.body == encode_many(await published(produce))
    counts = [body.count(b"event: content_block_delta") for body in recorder.bodies]
    assert max(counts) == 50  # the 50 deltas went out in one send
