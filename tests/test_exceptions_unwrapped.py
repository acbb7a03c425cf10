"""Exceptions as users catch them: what the app's own code raises inside an essessey
context manager, response, route or endpoint comes out as itself, never inside an
``ExceptionGroup`` (an ``except Boom:`` must match it, and a log line must name it).

Each case puts ``Boom``, the app's own exception, where the app's code runs: a producer
or a source, a store of its own, its middleware's ``receive`` or ``send``, a background
task, the body of a ``connect`` or a ``stream_turn``, a chat turn factory. The servers are
real (uvicorn on loopback, read with httpx and websockets, a nats-server); what the
server is handed is seen by :class:`Outermost`, the ASGI callable uvicorn runs, which is
where a server (or the app's outermost middleware) meets what the app raised. The hub's
own ``async with`` is tested in tests/test_hub.py.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest
from nats.aio.client import Client
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.routing import Route, WebSocketRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from essessey import (
    Event,
    InMemoryEventStore,
    InMemorySink,
    MultiSink,
    Publisher,
    StreamHub,
    TurnProducer,
    stream_turn,
)
from essessey.adapters import stream_rounds
from essessey.bindings.nats import NATSSink, subscribe_stream
from essessey.bindings.sse import EventStreamResponse, SSESource, connect, hub_routes
from essessey.bindings.ws import WebSocketSink, ws_route
from essessey.dialects.ui import ChatRequest, ui_chat_routes
from essessey.hub import Access
from essessey.shutdown import begin_shutdown, on_shutdown
from essessey.stores import Taker
from tests.nats_server import NatsServer
from tests.processes import WAIT
from tests.servers import serve

pytestmark = pytest.mark.anyio


class Boom(Exception):
    """What the app's own code raises."""


def assert_itself(exc: BaseException | None) -> None:
    """``exc`` is the app's ``Boom``, not a group holding it."""
    assert not isinstance(exc, BaseExceptionGroup), repr(exc)
    assert type(exc) is Boom, repr(exc)


def assert_logged_as_itself(logged: str | None) -> None:
    """The failure ``logged`` is the app's ``Boom``, not a group holding it."""
    assert logged is not None
    assert "ExceptionGroup" not in logged, logged
    assert logged.splitlines()[-1].startswith(f"{Boom.__module__}.Boom ("), logged


class Outermost:
    """The ASGI callable the server runs, around the app under test: each exception that
    came out of the app, as the server (or the app's outermost middleware) got it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.raised: list[BaseException] = []
        self._came_out = threading.Event()  # the server runs in a thread of its own

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        except BaseException as exc:
            if scope["type"] != "lifespan":
                self.raised.append(exc)
                self._came_out.set()
            raise

    async def first_raised(self) -> BaseException:
        """The first exception that came out of the app, once one has."""
        assert await anyio.to_thread.run_sync(self._came_out.wait, WAIT)
        return self.raised[0]


def failing_receive(app: ASGIApp, *, after: int) -> ASGIApp:
    """``app`` behind a middleware of the app's own whose ``receive`` raises Boom from
    its call number ``after + 1`` on."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        calls = 0

        async def receive_or_fail() -> Message:
            nonlocal calls
            calls += 1
            if calls > after and scope["type"] != "lifespan":
                raise Boom("the middleware's receive")
            return await receive()

        await app(scope, receive_or_fail, send)

    return middleware


def failing_send(app: ASGIApp, *, kind: str) -> ASGIApp:
    """``app`` behind a middleware of the app's own whose ``send`` raises Boom for each
    message of type ``kind``."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        async def send_or_fail(message: Message) -> None:
            if message["type"] == kind:
                raise Boom("the middleware's send")
            await send(message)

        await app(scope, receive, send_or_fail)

    return middleware


@asynccontextmanager
async def hub_lifespan(hub: StreamHub, *streams: tuple[str, TurnProducer]) -> AsyncIterator[None]:
    """Run ``hub`` for the app's life, with ``streams``' turns started in it."""
    async with hub:
        for stream_id, producer in streams:
            await hub.start(stream_id, producer)
        yield


async def endless_turn(publisher: Publisher) -> None:
    """A turn that writes a word, then runs until cancelled."""
    async with stream_turn(publisher, message_id="msg_1", stream_id="s1", model="m") as turn:
        await (await turn.text()).write("thinking")
        await anyio.sleep_forever()


async def short_turn(publisher: Publisher) -> None:
    """A turn of two words."""
    async with stream_turn(publisher, message_id="msg_1", stream_id="s1", model="m") as turn:
        text = await turn.text()
        await text.write("two ")
        await text.write("words")


async def _boom_events() -> AsyncIterator[Event]:
    raise Boom("the store's reading")
    yield  # pragma: no cover - an async generator that fails on its first step


class ReadingFails(InMemoryEventStore):
    """A store of the app's own that keeps turns but cannot read them back (its database
    went away, say): every follower fails with Boom."""

    def follow(
        self, stream_id: str, last_event_id: str | None = None, *, max_lag: int | None = None
    ) -> AsyncIterator[Event]:
        return _boom_events()

    def follow_delivering(
        self,
        stream_id: str,
        last_event_id: str | None = None,
        *,
        max_lag: int | None = None,
        taker: Taker | None = None,
    ) -> AsyncIterator[Event]:
        return _boom_events()


def logged_failure(caplog: pytest.LogCaptureFixture, logger: str) -> str | None:
    """What the first failure ``logger`` logged says: its line and its traceback."""
    for record in caplog.records:
        if record.name == logger and "Traceback (most recent call last):" in record.getMessage():
            return record.getMessage()
    return None


@pytest.fixture
def errors_logged(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.ERROR, logger="essessey"):
        yield caplog


# -- the SSE response ---------------------------------------------------------------------


async def _boom_before_anything(publisher: Publisher) -> None:
    raise Boom("the producer")


async def _boom_after_an_event(publisher: Publisher) -> None:
    async with stream_turn(publisher, message_id="msg_1", stream_id="s1", model="m") as turn:
        await (await turn.text()).write("a word")
        raise Boom("the producer")


async def _boom_source() -> AsyncIterator[Event]:
    yield Event("ping", b'{"type":"ping"}')
    raise Boom("the source")


@pytest.mark.parametrize(
    ("content", "status", "last"),
    [
        (lambda: _boom_before_anything, 500, None),
        (lambda: _boom_after_an_event, 200, "error"),
        (_boom_source, 200, "error"),
    ],
    ids=["producer-before-the-first-event", "producer-after-it", "source"],
)
async def test_an_sse_response_logs_its_content_s_exception_as_itself(
    errors_logged: pytest.LogCaptureFixture,
    content: Callable[[], Any],
    status: int,
    last: str | None,
) -> None:
    async def endpoint(request: Request) -> EventStreamResponse:
        return EventStreamResponse(content())

    outer = Outermost(Starlette(routes=[Route("/s", endpoint)]))
    with serve(outer) as url:
        async with httpx.AsyncClient() as client:
            response = await client.get(f"{url}/s")
    assert response.status_code == status
    if last is not None:
        assert b"event: " + last.encode() in response.content.rsplit(b"\n\n", 2)[-2]
    assert_logged_as_itself(logged_failure(errors_logged, "essessey.sse"))
    assert outer.raised == []  # answered (an error status or event), not raised


async def test_an_sse_response_raises_its_middleware_s_receive_failure_as_itself() -> None:
    # The response's disconnect watch (a helper task) is what calls receive here.
    async def endpoint(request: Request) -> EventStreamResponse:
        return EventStreamResponse(endless_turn)

    outer = Outermost(failing_receive(Starlette(routes=[Route("/s", endpoint)]), after=1))
    with serve(outer) as url:
        async with httpx.AsyncClient() as client:
            with anyio.fail_after(WAIT), pytest.raises(httpx.HTTPError):
                await client.get(f"{url}/s")  # the body cut short
        assert_itself(await outer.first_raised())


async def test_an_sse_response_raises_its_middleware_s_send_failure_as_itself() -> None:
    async def endpoint(request: Request) -> EventStreamResponse:
        return EventStreamResponse(short_turn)

    app = Starlette(routes=[Route("/s", endpoint)])
    outer = Outermost(failing_send(app, kind="http.response.body"))
    with serve(outer) as url:
        async with httpx.AsyncClient() as client:
            with anyio.fail_after(WAIT), pytest.raises(httpx.HTTPError):
                await client.get(f"{url}/s")
        assert_itself(await outer.first_raised())


async def test_an_sse_response_raises_its_background_task_s_failure_as_itself() -> None:
    def cleanup() -> None:
        raise Boom("the background task")

    async def endpoint(request: Request) -> EventStreamResponse:
        return EventStreamResponse(short_turn, background=BackgroundTask(cleanup))

    outer = Outermost(Starlette(routes=[Route("/s", endpoint)]))
    with serve(outer) as url:
        async with httpx.AsyncClient() as client:
            response = await client.get(f"{url}/s")
        assert response.status_code == 200  # the stream went out whole first
        assert_itself(await outer.first_raised())


async def test_a_hub_route_logs_its_store_s_failure_as_itself(
    errors_logged: pytest.LogCaptureFixture,
) -> None:
    hub = StreamHub(ReadingFails())
    app = Starlette(
        routes=list(hub_routes(hub)),
        lifespan=lambda app: hub_lifespan(hub, ("s1", short_turn)),
    )
    with serve(Outermost(app), lifespan="on") as url:
        async with httpx.AsyncClient() as client:
            response = await client.get(f"{url}/streams/s1")
    assert response.status_code == 500
    assert_logged_as_itself(logged_failure(errors_logged, "essessey.sse"))


async def test_a_hub_route_names_its_authorize_hook_s_exception_itself(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def authorize(request: Any, stream_id: str, access: Access) -> bool:
        raise Boom("the hook")

    hub = StreamHub(authorize=authorize)
    app = Starlette(routes=list(hub_routes(hub)), lifespan=lambda app: hub_lifespan(hub))
    with caplog.at_level(logging.ERROR, logger="essessey"), serve(app, lifespan="on") as url:
        async with httpx.AsyncClient() as client:
            response = await client.get(f"{url}/streams/s1")
    assert response.status_code == 503
    # The log line names the class only (its text may hold the token being checked).
    assert any("the authorize hook raised Boom " in r.getMessage() for r in caplog.records)


async def test_the_hub_s_lifespan_raises_the_app_s_exception_as_itself() -> None:
    hub = StreamHub()

    async def run_the_app() -> None:
        async with hub.lifespan(None):
            await hub.start("s1", endless_turn)
            raise Boom("the app's startup")

    with pytest.raises(Boom) as caught:
        await run_the_app()
    assert_itself(caught.value)
    assert not hub.running("s1")


# -- the SSE client -----------------------------------------------------------------------


async def test_connect_raises_its_body_s_exception_as_itself() -> None:
    async def endpoint(request: Request) -> EventStreamResponse:
        return EventStreamResponse(endless_turn)

    async def read(client: httpx.AsyncClient, url: str) -> None:
        async with connect(client, "GET", url) as events:
            async for event in events:
                if event.event == "content_block_delta":
                    raise Boom("the reader")

    with serve(Starlette(routes=[Route("/s", endpoint)])) as url:
        async with httpx.AsyncClient() as client:
            with anyio.fail_after(WAIT), pytest.raises(Boom) as caught:
                await read(client, f"{url}/s")
    assert_itself(caught.value)


async def test_an_sse_source_raises_its_byte_iterator_s_exception_as_itself() -> None:
    async def the_app_s_bytes() -> AsyncIterator[bytes]:
        yield b'event: ping\ndata: {"type":"ping"}\n\n'
        raise Boom("the app's byte stream")

    received: list[str] = []

    async def read() -> None:
        async for event in SSESource(the_app_s_bytes()):
            received.append(event.event)

    with pytest.raises(Boom) as caught:
        await read()
    assert_itself(caught.value)
    assert received == ["ping"]


# -- the WebSocket endpoint and sink ------------------------------------------------------


def _ws_url(url: str, path: str) -> str:
    return url.replace("http://", "ws://") + path


async def _read_until_closed(url: str) -> int | None:
    """Read the socket at ``url`` to its close; the close code (None without one)."""
    with anyio.fail_after(WAIT):
        async with ws_connect(url) as socket:
            try:
                while True:
                    await socket.recv()
            except ConnectionClosed as closed:
                return closed.rcvd.code if closed.rcvd is not None else None


async def test_a_ws_subscription_raises_its_middleware_s_receive_failure_as_itself() -> None:
    # The first receive is the handshake; the second is the endpoint's disconnect watch
    # (a helper task), while the subscription follows a turn that runs on.
    hub = StreamHub(shutdown_grace=0)
    app = Starlette(
        routes=[ws_route(hub)], lifespan=lambda app: hub_lifespan(hub, ("s1", endless_turn))
    )
    outer = Outermost(failing_receive(app, after=1))
    with serve(outer, lifespan="on") as url:
        await _read_until_closed(_ws_url(url, "/streams/s1/ws"))
        assert_itself(await outer.first_raised())


async def test_a_ws_subscription_logs_its_store_s_failure_as_itself(
    errors_logged: pytest.LogCaptureFixture,
) -> None:
    hub = StreamHub(ReadingFails())
    app = Starlette(
        routes=[ws_route(hub)], lifespan=lambda app: hub_lifespan(hub, ("s1", short_turn))
    )
    with serve(Outermost(app), lifespan="on") as url:
        code = await _read_until_closed(_ws_url(url, "/streams/s1/ws"))
    assert code == 1011
    assert_logged_as_itself(logged_failure(errors_logged, "essessey.ws"))


async def test_a_ws_producer_raises_its_middleware_s_send_failure_as_itself() -> None:
    # A route of the app's own publishing a turn into the socket (WebSocketSink).
    async def produce(websocket: WebSocket) -> None:
        await websocket.accept()
        await short_turn(Publisher(WebSocketSink(websocket)))
        await websocket.close()

    app = Starlette(routes=[WebSocketRoute("/ws", produce)])
    outer = Outermost(failing_send(app, kind="websocket.send"))
    with serve(outer) as url:
        await _read_until_closed(_ws_url(url, "/ws"))
        assert_itself(await outer.first_raised())


# -- the UI message stream routes ----------------------------------------------------------


def _chat(chat_id: str) -> dict[str, Any]:
    return {"id": chat_id, "messages": [{"role": "user", "parts": []}]}


async def test_a_ui_chat_route_raises_its_turn_factory_s_exception_as_itself() -> None:
    def turn(chat: ChatRequest) -> TurnProducer:
        raise Boom("the turn factory")

    hub = StreamHub()
    app = Starlette(routes=list(ui_chat_routes(hub, turn)), lifespan=lambda app: hub_lifespan(hub))
    outer = Outermost(app)
    with serve(outer, lifespan="on") as url:
        async with httpx.AsyncClient() as client:
            response = await client.post(f"{url}/api/chat", json=_chat("c1"))
        assert response.status_code == 500
        assert_itself(await outer.first_raised())


async def test_a_ui_chat_stream_logs_its_store_s_failure_as_itself(
    errors_logged: pytest.LogCaptureFixture,
) -> None:
    # The UI stream is delivered by the SSE response: a store that fails before the first
    # event is a 500 answer, and the failure is logged as itself.
    hub = StreamHub(ReadingFails())
    app = Starlette(
        routes=list(ui_chat_routes(hub, lambda chat: short_turn)),
        lifespan=lambda app: hub_lifespan(hub),
    )
    with serve(Outermost(app), lifespan="on") as url:
        async with httpx.AsyncClient(timeout=WAIT) as client:
            response = await client.post(f"{url}/api/chat", json=_chat("c1"))
    assert response.status_code == 500
    assert_logged_as_itself(logged_failure(errors_logged, "essessey.sse"))


# -- publishing: the turn and round helpers, the Publisher's sinks -------------------------


async def _failing_turn(publisher: Publisher, stream_id: str) -> None:
    async with stream_turn(publisher, message_id="m", stream_id=stream_id, model="x") as turn:
        await (await turn.text()).write("a word")
        raise Boom("the turn's body")


async def test_stream_turn_raises_its_body_s_exception_as_itself() -> None:
    sink = InMemorySink()
    with pytest.raises(Boom) as caught:
        await _failing_turn(Publisher(sink), "s")
    assert_itself(caught.value)
    assert sink.events[-1].event == "error"


async def test_stream_rounds_raises_its_body_s_exception_as_itself() -> None:
    sink = InMemorySink()

    async def produce() -> None:
        async with stream_rounds(
            Publisher(sink), message_id="m", stream_id="s", model="x"
        ) as rounds:
            await rounds.round_start()
            await rounds.delta(text="a word")
            raise Boom("the rounds' body")

    with pytest.raises(Boom) as caught:
        await produce()
    assert_itself(caught.value)
    assert sink.events[-1].event == "error"


class _FailingSink:
    """A sink of the app's own whose client went away."""

    async def emit(self, event: Event) -> None:
        raise Boom("the app's sink")


async def test_a_publisher_raises_its_sink_s_exception_as_itself() -> None:
    # One failing sink of several: MultiSink hands on that one exception as it is.
    kept = InMemorySink()
    publisher = Publisher(MultiSink(kept, _FailingSink()))
    with pytest.raises(Boom) as caught:
        await publisher.send_stream_preamble("msg_1", "s", "m")
    assert_itself(caught.value)
    assert [event.event for event in kept.events] == ["message_start"]


async def test_the_nats_binding_raises_the_app_s_exceptions_as_themselves(
    nats: NatsServer,
) -> None:
    producer, reader = Client(), Client()
    await producer.connect(nats.url)
    await reader.connect(nats.url)
    try:
        source = await subscribe_stream(reader, "s1")
        with pytest.raises(Boom) as in_the_turn:
            await _failing_turn(Publisher(NATSSink(producer, "s1")), "s1")
        assert_itself(in_the_turn.value)
        await producer.flush()

        async def read() -> None:
            async for event in source:
                if event.event == "error":  # the turn's end, sent by stream_turn
                    raise Boom("the reader")

        with anyio.fail_after(WAIT), pytest.raises(Boom) as in_the_reader:
            await read()
        assert_itself(in_the_reader.value)
        await source.aclose()
    finally:
        await producer.close()
        await reader.close()


# -- shutdown --------------------------------------------------------------------------------


def test_a_shutdown_callback_s_exception_is_logged_as_itself_and_the_others_run(
    errors_logged: pytest.LogCaptureFixture,
) -> None:
    called: list[str] = []

    def failing() -> None:
        raise Boom("the app's callback")

    async def main() -> None:
        # A loop of its own: the shutdown, once fired, stays fired for its loop.
        on_shutdown(failing)
        on_shutdown(lambda: called.append("after"))
        begin_shutdown()

    asyncio.run(main())
    assert called == ["after"]
    assert_logged_as_itself(logged_failure(errors_logged, "essessey.shutdown"))
