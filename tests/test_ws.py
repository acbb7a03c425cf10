"""The WebSocket binding on a real uvicorn server, read with the ``websockets`` client: a
hub served by ws_route (frames, resume by query parameter or first message, close
codes, authorization, keep-alive, disconnects), WebSocketSink inside a route, and
WebSocketSource on both ends. The slow-client policies run against a fake socket, where
a stalled send can be made deterministic."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.lowlevel
import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.datastructures import QueryParams
from starlette.routing import BaseRoute, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketState
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from essessey import (
    Event,
    EventType,
    InMemoryEventStore,
    InMemorySink,
    Publisher,
    StopReason,
    StoreUnavailable,
    StreamHub,
    WebSocketClosed,
    check,
    reassemble_events,
    stream_turn,
)
from essessey.bindings.sse import MAX_ID_LENGTH
from essessey.bindings.ws import (
    PING_FRAME,
    CloseCode,
    WebSocketSink,
    WebSocketSource,
    decode_frame,
    encode_frame,
    websocket_subscription,
    ws_route,
)
from tests.hub_app import HubApp, make_hub_app
from tests.processes import WAIT
from tests.servers import serve

pytestmark = pytest.mark.anyio

OWNER = {"x-user": "owner"}
MALLORY = {"x-user": "mallory"}


# -- the app ----------------------------------------------------------------------------------


def make_app(
    *,
    store: InMemoryEventStore | None = None,
    max_subscribers: int = 1000,
    extra_routes: list[BaseRoute] | None = None,
    snapshot_after: int | None = None,
    **options: Any,
) -> HubApp:
    return make_hub_app(
        lambda hub: [ws_route(hub, **options)],
        store=store,
        max_subscribers=max_subscribers,
        extra_routes=extra_routes or (),
        snapshot_after=snapshot_after,
    )


# -- the client -------------------------------------------------------------------------------


@dataclass
class Reading:
    """What one WebSocket connection gave the client: its frames and how it closed
    (``code`` is None when the client left first)."""

    frames: list[str]
    code: int | None
    reason: str

    @property
    def events(self) -> list[Event]:
        return [decode_frame(frame) for frame in self.frames]

    @property
    def last_id(self) -> str:
        event_id = self.events[-1].id
        assert event_id
        return event_id


def ws_url(base: str, path: str) -> str:
    return "ws" + base.removeprefix("http") + path


@asynccontextmanager
async def open_ws(
    base: str, path: str, headers: dict[str, str] | None = None
) -> AsyncIterator[ClientConnection]:
    async with connect(
        ws_url(base, path), additional_headers={**OWNER, **(headers or {})}, open_timeout=WAIT
    ) as websocket:
        yield websocket


async def read(
    base: str,
    path: str,
    *,
    headers: dict[str, str] | None = None,
    first: str | None = None,
    stop_after: int | None = None,
    drop: bool = False,
) -> Reading:
    """Read a WebSocket until the server closes it, or, with ``stop_after``, keep the
    first frames and leave: a normal close, or with ``drop`` the connection cut without
    a close frame (frames already in flight are lost, as by a client that crashed)."""
    frames: list[str] = []
    code: int | None = None
    reason = ""
    with anyio.fail_after(WAIT):
        async with open_ws(base, path, headers) as websocket:
            if first is not None:
                # The server may have sent the whole stream and closed already (when it
                # does not wait for a first message): the frames are still to be read.
                with suppress(ConnectionClosed):
                    await websocket.send(first)
            try:
                while stop_after is None or len(frames) < stop_after:
                    frame = await websocket.recv()
                    assert isinstance(frame, str)  # text frames only
                    frames.append(frame)
            except ConnectionClosed as exc:
                if exc.rcvd is None:
                    pytest.fail("the server closed without a close frame")
                code, reason = exc.rcvd.code, exc.rcvd.reason
            if drop:
                websocket.transport.abort()
    return Reading(frames, code, reason)


def client(base: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(WAIT))


async def start_turn(http: httpx.AsyncClient, stream_id: str, **query: Any) -> None:
    params = {key: str(value) for key, value in query.items()}
    response = await http.post(f"/turns/{stream_id}", params=params)
    assert response.status_code == 202


async def published(http: httpx.AsyncClient, stream_id: str) -> list[Event]:
    """Every event of the stream, once its turn has ended (read inside the server)."""
    response = await http.get(f"/published/{stream_id}")
    assert response.status_code == 200
    return [Event(name, data.encode(), event_id) for name, data, event_id in response.json()]


async def state(http: httpx.AsyncClient, stream_id: str) -> dict[str, Any]:
    result = (await http.get(f"/state/{stream_id}")).json()
    assert isinstance(result, dict)
    return result


async def wait_for(event: threading.Event) -> None:
    for _ in range(int(WAIT / 0.002)):
        if event.is_set():
            return
        await anyio.sleep(0.002)
    pytest.fail("timed out waiting for the producer")


async def wait_until_state(
    http: httpx.AsyncClient, stream_id: str, condition: Callable[[dict[str, Any]], bool]
) -> None:
    for _ in range(int(WAIT / 0.01)):
        if condition(await state(http, stream_id)):
            return
        await anyio.sleep(0.01)
    pytest.fail(f"timed out waiting for the state of {stream_id}")


async def receive_all(websocket: ClientConnection, frames: list[str]) -> None:
    """Append every frame to ``frames`` until the connection closes (which raises)."""
    while True:
        frames.append(str(await websocket.recv()))


async def collect(
    source: WebSocketSource,
    received: list[Event],
    *,
    abort: ClientConnection | None = None,
    abort_after: int = 0,
) -> None:
    """Append the source's events to ``received``; with ``abort``, cut that connection
    (no close frame) after ``abort_after`` events."""
    async for event in source:
        received.append(event)
        if abort is not None and len(received) == abort_after:
            abort.transport.abort()


def turn_text(chunks: int) -> str:
    return "".join(f"w{i} " for i in range(chunks))


# -- a whole turn, resume ---------------------------------------------------------------------


async def test_a_whole_turn_arrives_as_exactly_the_published_frames_then_1000() -> None:
    hub_app = make_app()
    with serve(hub_app.app, lifespan="on") as base:
        async with client(base) as http:
            await start_turn(http, "s", chunks=40, hold_at=3)
            await wait_for(hub_app.reached["s"])
            readings: list[Reading] = []
            async with anyio.create_task_group() as tasks:

                async def subscriber() -> None:
                    readings.append(await read(base, "/streams/s/ws"))

                tasks.start_soon(subscriber)
                await wait_until_state(http, "s", lambda s: s["subscribers"] == 1)
                hub_app.release["s"].set()
            events = await published(http, "s")
            await wait_until_state(http, "s", lambda s: s["subscribers"] == 0)
    [reading] = readings
    assert (reading.code, reading.reason) == (CloseCode.NORMAL, "the turn ended")
    assert reading.frames == [encode_frame(event) for event in events]  # byte for byte
    assert reading.events == events  # ids included
    assert all(event.id for event in reading.events)
    assert len({event.id for event in events}) == len(events)
    assert check(events) == []
    parsed = reassemble_events(reading.events)
    assert parsed.complete
    assert parsed.text == turn_text(40)
    assert [access for _, _, access in hub_app.asked] == ["read"]


async def test_a_finished_turn_is_replayed_whole_and_an_id_at_its_end_gets_nothing() -> None:
    hub_app = make_app()
    with serve(hub_app.app, lifespan="on") as base:
        async with client(base) as http:
            await start_turn(http, "s", chunks=10)
            events = await published(http, "s")
            late = await read(base, "/streams/s/ws")
            at_end = await read(base, f"/streams/s/ws?last_event_id={events[-1].id}")
            empty = await read(base, "/streams/s/ws?last_event_id=")
    assert late.events == events
    assert late.code == CloseCode.NORMAL
    assert at_end.frames == []
    assert at_end.code == CloseCode.NORMAL
    assert empty.events == events  # an empty id means from the start
    assert [access for _, _, access in hub_app.asked] == ["read", "resume", "read"]


async def test_a_replay_stops_when_its_client_drops_the_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # With permessage-deflate (the websockets client's default, and browsers') frames go
    # through ASGI, whose send never waits: a dropped client's replay was written whole
    # into the dead transport, asyncio logging each write (about 130 lines a client).
    caplog.set_level(logging.WARNING, logger="asyncio")
    hub_app = make_app()
    with serve(hub_app.app, lifespan="on", http="h11", loop="asyncio") as base:
        async with client(base) as http:
            await start_turn(http, "s", chunks=3000)
            await published(http, "s")
        for _ in range(5):
            async with connect(ws_url(base, "/streams/s/ws"), close_timeout=1) as ws:
                for _ in range(20):
                    await ws.recv()
                ws.transport.abort()  # the connection drops
            await anyio.sleep(0.2)
    dead = [r for r in caplog.records if "socket.send() raised exception" in r.getMessage()]
    assert dead == []


async def test_a_late_reader_gets_a_snapshot_and_resumes_by_its_last_id_exactly() -> None:
    hub_app = make_app(snapshot_after=10)
    with serve(hub_app.app, lifespan="on") as base:
        async with client(base) as http:
            await start_turn(http, "s", chunks=60)
            events = await published(http, "s")
            late = await read(base, "/streams/s/ws")
            first = await read(base, "/streams/s/ws", stop_after=3)
            rest = await read(base, f"/streams/s/ws?last_event_id={first.last_id}")
    assert len(late.events) < len(events) // 4  # the 60 deltas arrive as one
    assert reassemble_events(late.events).text == reassemble_events(events).text
    assert check(late.events) == []
    assert late.events[-1] == events[-1]
    whole = first.events + rest.events
    assert reassemble_events(whole).text == reassemble_events(events).text
    assert check(whole) == []
    ids = [event.id for event in whole]
    assert len(set(ids)) == len(ids)  # nothing twice


@pytest.mark.parametrize("how", ["query", "first-message"])
@pytest.mark.parametrize("leave", ["close", "drop"])
@pytest.mark.parametrize("seen", [1, 5])
async def test_a_resume_after_leaving_mid_turn_gets_exactly_the_rest(
    how: str, leave: str, seen: int
) -> None:
    hub_app = make_app(resume_message_timeout=WAIT)
    with serve(hub_app.app, lifespan="on") as base:
        async with client(base) as http:
            await start_turn(http, "s", chunks=60, hold_at=12)
            await wait_for(hub_app.reached["s"])
            first = await read(
                base, "/streams/s/ws", first="{}", stop_after=seen, drop=leave == "drop"
            )
            assert len(first.frames) == seen
            assert first.code is None
            await wait_until_state(http, "s", lambda s: s["subscribers"] == 0)
            if how == "query":
                options: dict[str, Any] = {"path": f"/streams/s/ws?last_event_id={first.last_id}"}
            else:
                message = orjson.dumps({"last_event_id": first.last_id}).decode()
                options = {"path": "/streams/s/ws", "first": message}
            readings: list[Reading] = []
            async with anyio.create_task_group() as tasks:

                async def resume() -> None:
                    readings.append(await read(base, **options))

                tasks.start_soon(resume)
                await wait_until_state(http, "s", lambda s: s["subscribers"] == 1)
                hub_app.release["s"].set()
            events = await published(http, "s")
    [rest] = readings
    assert rest.code == CloseCode.NORMAL
    assert first.events + rest.events == events  # 0 lost, 0 duplicated
    assert check(first.events + rest.events) == []
    assert reassemble_events(first.events + rest.events).text == turn_text(60)
    assert [access for _, _, access in hub_app.asked] == ["read", "resume"]


async def test_the_first_message_form_is_bounded_and_the_query_parameter_wins() -> None:
    window = 0.5
    hub_app = make_app(resume_message_timeout=window)
    with serve(hub_app.app, lifespan="on") as base:
        async with client(base) as http:
            await start_turn(http, "s", chunks=8)
            events = await published(http, "s")
            started = time.monotonic()
            silent = await read(base, "/streams/s/ws")  # sends nothing: waits the window
            waited = time.monotonic() - started
            started = time.monotonic()
            null = await read(base, "/streams/s/ws", first='{"last_event_id": null}')
            prompt = time.monotonic() - started
            both = await read(
                base,
                f"/streams/s/ws?last_event_id={events[5].id}",
                first=orjson.dumps({"last_event_id": events[2].id}).decode(),
            )
            by_message = await read(
                base, "/streams/s/ws", first=orjson.dumps({"last_event_id": events[2].id}).decode()
            )
    assert silent.events == events
    assert waited >= window
    assert null.events == events
    assert prompt < window  # a first message ends the wait at once
    assert both.events == events[6:]  # the query parameter is used; the message ignored
    assert by_message.events == events[3:]
    assert [access for _, _, access in hub_app.asked] == ["read", "read", "resume", "resume"]


async def test_without_the_option_a_first_message_is_ignored() -> None:
    hub_app = make_app()
    with serve(hub_app.app, lifespan="on") as base:
        async with client(base) as http:
            await start_turn(http, "s", chunks=5)
            events = await published(http, "s")
            reading = await read(
                base, "/streams/s/ws", first=orjson.dumps({"last_event_id": events[2].id}).decode()
            )
    assert reading.events == events
    assert hub_app.asked == [("owner", "s", "read")]


# -- close codes before any event -------------------------------------------------------------


def assert_refused(reading: Reading, code: int) -> None:
    assert reading.frames == []  # no event frame
    assert reading.code == code
    assert reading.reason  # a short reason the browser can read


async def test_an_unknown_stream_is_4404_and_an_unknown_last_id_4410() -> None:
    hub_app = make_app()
    with serve(hub_app.app, lifespan="on") as base:
        async with client(base) as http:
            await start_turn(http, "s", chunks=5)
            events = await published(http, "s")
            nowhere = await read(base, "/streams/nowhere/ws")
            epoch = str(events[0].id).rpartition("-")[0]
            unknown = [
                await read(base, f"/streams/s/ws?last_event_id={bogus}")
                for bogus in ("nonsense", f"{epoch}-999", "00000000-1")
            ]
    assert_refused(nowhere, CloseCode.NOT_FOUND)
    for reading in unknown:
        assert_refused(reading, CloseCode.RESUME_UNAVAILABLE)


@pytest.mark.parametrize(
    ("path", "first"),
    [
        ("/streams/" + "s" * (MAX_ID_LENGTH + 1) + "/ws", None),
        ("/streams/bell%07/ws", None),
        ("/streams/s/ws?last_event_id=" + "i" * (MAX_ID_LENGTH + 1), None),
        ("/streams/s/ws?last_event_id=a%09b", None),
        ("/streams/s/ws", "not json"),
        ("/streams/s/ws", '{"last_event_id": 7}'),
        ("/streams/s/ws", orjson.dumps({"last_event_id": "i" * (MAX_ID_LENGTH + 1)}).decode()),
        ("/streams/s/ws", "x" * (8 * MAX_ID_LENGTH)),
    ],
    ids=[
        "long-stream-id",
        "unprintable-stream-id",
        "long-last-id",
        "tab-id",
        "first-not-json",
        "first-id-not-a-string",
        "first-long-id",
        "first-too-long",
    ],
)
async def test_an_invalid_id_or_first_message_is_4400(path: str, first: str | None) -> None:
    hub_app = make_app(resume_message_timeout=WAIT)
    with serve(hub_app.app, lifespan="on") as base:
        async with client(base) as http:
            await start_turn(http, "s", chunks=3)
            await published(http, "s")
            reading = await read(base, path, first=first or "{}")
    assert_refused(reading, CloseCode.BAD_REQUEST)
    assert hub_app.asked == []  # refused before the hook is asked


async def test_a_denied_client_gets_4403_and_no_event_on_read_and_resume() -> None:
    hub_app = make_app(resume_message_timeout=WAIT)
    with serve(hub_app.app, lifespan="on") as base:
        async with client(base) as http:
            await start_turn(http, "s", chunks=30, hold_at=5)
            await wait_for(hub_app.reached["s"])
            mine = await read(base, "/streams/s/ws", first="{}", stop_after=3)
            resume_message = orjson.dumps({"last_event_id": mine.last_id}).decode()
            denied = [
                await read(base, "/streams/s/ws", headers=MALLORY, first="{}"),
                await read(base, f"/streams/s/ws?last_event_id={mine.last_id}", headers=MALLORY),
                await read(base, "/streams/s/ws", headers=MALLORY, first=resume_message),
                # A stream that does not exist is refused the same way: no existence leak.
                await read(base, "/streams/nowhere/ws", headers=MALLORY, first="{}"),
            ]
            assert (await state(http, "s"))["running"]
            hub_app.release["s"].set()
            events = await published(http, "s")
    for reading in denied:
        assert_refused(reading, CloseCode.FORBIDDEN)
    assert denied[0].reason == "not allowed to read this stream"
    assert denied[1].reason == "not allowed to resume this stream"
    mallory_asked = [(s, access) for user, s, access in hub_app.asked if user == "mallory"]
    assert mallory_asked == [("s", "read"), ("s", "resume"), ("s", "resume"), ("nowhere", "read")]
    assert reassemble_events(events).stop_reason == StopReason.END_TURN


async def test_a_failing_hook_and_too_many_subscribers_are_1013(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hub_app = make_app(max_subscribers=1)
    with (
        caplog.at_level(logging.ERROR, logger="essessey.ws"),
        serve(hub_app.app, lifespan="on") as base,
    ):
        async with client(base) as http:
            await start_turn(http, "s", chunks=10, hold_at=2)
            await wait_for(hub_app.reached["s"])
            crashed = await read(base, "/streams/s/ws", headers={"x-user": "crasher"})
            async with open_ws(base, "/streams/s/ws") as holding:
                await holding.recv()
                await wait_until_state(http, "s", lambda s: s["subscribers"] == 1)
                crowded = await read(base, "/streams/s/ws")
            hub_app.release["s"].set()
            await published(http, "s")
    assert_refused(crashed, CloseCode.TRY_AGAIN_LATER)
    assert_refused(crowded, CloseCode.TRY_AGAIN_LATER)
    assert any("authorize hook raised" in record.getMessage() for record in caplog.records)


class _FlakyStore(InMemoryEventStore):
    """A store whose followers lose it (StoreUnavailable) after a few events."""

    def __init__(self, fail_after: int) -> None:
        super().__init__()
        self.fail_after = fail_after

    async def follow(
        self, stream_id: str, last_event_id: str | None = None, *, max_lag: int | None = None
    ) -> AsyncIterator[Event]:
        count = 0
        async for event in super().follow(stream_id, last_event_id, max_lag=max_lag):
            if count == self.fail_after:
                raise StoreUnavailable("the broker is down")
            count += 1
            yield event


async def test_a_store_outage_closes_1013_after_the_events_already_read() -> None:
    hub_app = make_app(store=_FlakyStore(fail_after=3))
    with serve(hub_app.app, lifespan="on") as base:
        async with client(base) as http:
            await start_turn(http, "s", chunks=5)
            events = await published(http, "s")
            reading = await read(base, "/streams/s/ws")
    assert reading.events == events[:3]
    assert reading.code == CloseCode.TRY_AGAIN_LATER


# -- keep-alive and disconnects ---------------------------------------------------------------


async def test_a_quiet_stream_gets_ping_frames_without_ids() -> None:
    hub_app = make_app(ping_interval=0.05)
    with serve(hub_app.app, lifespan="on") as base:
        async with client(base) as http:
            await start_turn(http, "s", chunks=10, hold_at=4)
            await wait_for(hub_app.reached["s"])
            frames: list[str] = []
            with anyio.fail_after(WAIT):
                async with open_ws(base, "/streams/s/ws") as websocket:
                    while frames.count(PING_FRAME) < 3:
                        frames.append(str(await websocket.recv()))
                    hub_app.release["s"].set()
                    with pytest.raises(ConnectionClosed) as closed:
                        await receive_all(websocket, frames)
            events = await published(http, "s")
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == CloseCode.NORMAL
    assert PING_FRAME == '{"event":"ping","data":{"type":"ping"}}'
    pings = [frame for frame in frames if frame == PING_FRAME]
    assert len(pings) >= 3
    assert decode_frame(PING_FRAME) == Event(EventType.PING, b'{"type":"ping"}')
    # The keep-alive goes between events and is never stored: the rest is the turn.
    assert [decode_frame(frame) for frame in frames if frame != PING_FRAME] == events


async def test_a_client_that_leaves_mid_turn_ends_its_subscription_not_the_turn() -> None:
    hub_app = make_app()
    with serve(hub_app.app, lifespan="on") as base:
        async with client(base) as http:
            await start_turn(http, "s", chunks=50, hold_at=5)
            await wait_for(hub_app.reached["s"])
            gone = await read(base, "/streams/s/ws", stop_after=4)
            dropped = await read(base, "/streams/s/ws", stop_after=2, drop=True)
            # The server notices both and drops their subscriptions at once.
            await wait_until_state(http, "s", lambda s: s["subscribers"] == 0)
            assert (await state(http, "s"))["running"]
            hub_app.release["s"].set()
            events = await published(http, "s")
            later = await read(base, "/streams/s/ws")
    assert gone.events == events[:4]
    assert dropped.events == events[:2]
    assert later.events == events
    parsed = reassemble_events(later.events)
    assert parsed.complete
    assert parsed.stop_reason == StopReason.END_TURN
    assert parsed.text == turn_text(50)


# -- the slow-client policy, on a fake socket -------------------------------------------------


class FakeWebSocket:
    """What websocket_subscription uses of a Starlette WebSocket. ``send_text`` takes
    ``send_delay`` seconds, and blocks for good after ``block_after`` frames; the client
    never sends anything nor leaves."""

    def __init__(
        self, query: str = "", *, send_delay: float = 0.0, block_after: int | None = None
    ) -> None:
        self.application_state = WebSocketState.CONNECTING
        self.query_params = QueryParams(query)
        self.send_delay = send_delay
        self.block_after = block_after
        self.sent: list[str] = []
        self.sent_one = anyio.Event()
        self.closed: tuple[int, str | None] | None = None

    async def accept(self) -> None:
        self.application_state = WebSocketState.CONNECTED

    async def receive(self) -> dict[str, Any]:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def send_text(self, data: str) -> None:
        if self.block_after is not None and len(self.sent) >= self.block_after:
            await anyio.sleep_forever()
        await anyio.sleep(self.send_delay)
        self.sent.append(data)
        self.sent_one.set()

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        self.closed = (code, reason)


async def _turn(publisher: Publisher, chunks: int, go: anyio.Event | None = None) -> None:
    async with stream_turn(publisher, message_id="m", stream_id="s", model="x") as turn:
        text = await turn.text()
        if go is not None:
            await go.wait()
        for i in range(chunks):
            await text.write(f"w{i} ")
            await anyio.lowlevel.checkpoint()


async def test_a_stalled_send_closes_1013_with_a_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    socket = FakeWebSocket(block_after=2)
    with caplog.at_level(logging.WARNING, logger="essessey.ws"), anyio.fail_after(WAIT):
        async with StreamHub() as hub:
            await hub.start("s", lambda publisher: _turn(publisher, 5))
            await hub.wait("s")
            started = time.monotonic()
            await websocket_subscription(hub, socket, "s", send_timeout=0.2)  # type: ignore[arg-type]
            assert time.monotonic() - started < 2.0
            assert hub.subscriber_count("s") == 0
            events, _ = await hub.store.since("s", None)
    assert socket.closed == (CloseCode.TRY_AGAIN_LATER, "send timed out")
    assert socket.sent == [encode_frame(event) for event in events[:2]]
    assert any("stalled" in record.getMessage() for record in caplog.records)


async def test_a_lagging_client_is_closed_1013_and_resumes_by_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    slow = FakeWebSocket(send_delay=0.005)
    with caplog.at_level(logging.WARNING), anyio.fail_after(WAIT):
        async with StreamHub(max_lag=10) as hub:
            # The turn goes on once the subscriber has its first frame: it is attached.
            await hub.start("s", lambda publisher: _turn(publisher, 300, slow.sent_one))
            await websocket_subscription(hub, slow, "s", max_queue=1)  # type: ignore[arg-type]
            await hub.wait("s")
            first = [decode_frame(frame) for frame in slow.sent]
            again = FakeWebSocket(f"last_event_id={first[-1].id}")
            await websocket_subscription(hub, again, "s")  # type: ignore[arg-type]
            events, _ = await hub.store.since("s", None)
    assert slow.closed == (CloseCode.TRY_AGAIN_LATER, "reconnect with the last event id")
    assert 0 < len(first) < len(events)
    assert again.closed == (CloseCode.NORMAL, "the turn ended")
    assert first + [decode_frame(frame) for frame in again.sent] == events
    messages = [record.getMessage() for record in caplog.records]
    assert any("fell behind" in message for message in messages)
    assert any("SubscriberLagged" in message for message in messages)


def test_options_and_the_route_path_are_checked() -> None:
    hub = StreamHub()
    for options in (
        {"ping_interval": -1},
        {"send_timeout": 0},
        {"max_queue": 0},
        {"resume_message_timeout": 0},
    ):
        with pytest.raises(ValueError, match="must be"):
            ws_route(hub, **options)
    with pytest.raises(ValueError, match="stream_id"):
        ws_route(hub, "/streams/ws")
    route = ws_route(hub, "/chat/{stream_id}")
    assert isinstance(route, WebSocketRoute)
    assert route.path == "/chat/{stream_id}"


# -- WebSocketSink inside a route -------------------------------------------------------------


async def sink_turn(publisher: Publisher) -> None:
    async with stream_turn(publisher, message_id="msg_w", stream_id="st_w", model="m") as t:
        thinking = await t.thinking()
        await thinking.write("Planning.")
        text = await t.text()
        await text.write("Hello, ")
        await text.write("socket! Ünïcödé 🎉\nsecond line")
        tools = await t.tools()
        await tools.start_call("toolu_w", "lookup", '{"q": "ws"}')
        await tools.write_result("toolu_w", '{"hits": 3}')
        t.stop_reason = "tool_use"


TASKS, PER_TASK = 8, 50


def sink_routes() -> list[BaseRoute]:
    async def turn_route(websocket: WebSocket) -> None:
        await websocket.accept()
        await sink_turn(Publisher(WebSocketSink(websocket)))
        await websocket.close()

    async def concurrent_route(websocket: WebSocket) -> None:
        await websocket.accept()
        sink = WebSocketSink(websocket)

        async def emitter(task: int) -> None:
            for n in range(PER_TASK):
                data = orjson.dumps({"task": task, "n": n, "pad": "x" * (n * 97)})
                await sink.emit(Event(f"t{task}", data, f"{task}-{n}"))
                if n % 7 == 0:
                    await anyio.lowlevel.checkpoint()

        async with anyio.create_task_group() as tasks:
            for task in range(TASKS):
                tasks.start_soon(emitter, task)
        await websocket.close()

    async def abnormal_route(websocket: WebSocket) -> None:
        await websocket.accept()
        sink = WebSocketSink(websocket)
        for i in range(2):
            await sink.emit(Event("custom", b'{"n":%d}' % i, f"e-{i}"))
        await websocket.close(1011, "boom")

    async def drop_route(websocket: WebSocket) -> None:
        await websocket.accept()
        for i in range(2):
            await websocket.send_text(encode_frame(Event("custom", b'{"n":%d}' % i, f"e-{i}")))
        raise RuntimeError("the app crashed: uvicorn drops the connection")

    async def malformed_route(websocket: WebSocket) -> None:
        await websocket.accept()
        good = [Event("custom", b'{"n":%d}' % i, f"e-{i}") for i in range(3)]
        await websocket.send_text(encode_frame(good[0]))
        await websocket.send_text("SECRET model output, not json")
        await websocket.send_bytes(b"\xff\xfeSECRET binary")
        await websocket.send_text(encode_frame(good[1]))
        await websocket.send_text('{"event":"SECRET-no-data"}')
        await websocket.send_text('{"id":7,"event":"x","data":"SECRET"}')
        await websocket.send_bytes(encode_frame(good[2]).encode())  # binary but valid: kept
        await websocket.close()

    return [
        WebSocketRoute("/sink/turn", turn_route),
        WebSocketRoute("/sink/concurrent", concurrent_route),
        WebSocketRoute("/sink/abnormal", abnormal_route),
        WebSocketRoute("/sink/drop", drop_route),
        WebSocketRoute("/sink/malformed", malformed_route),
    ]


async def test_a_route_publishes_a_turn_with_websocket_sink() -> None:
    expected = InMemorySink()
    await sink_turn(Publisher(expected))
    with serve(Starlette(routes=sink_routes())) as base:
        reading = await read(base, "/sink/turn")
    assert reading.code == CloseCode.NORMAL
    assert reading.frames == [encode_frame(event) for event in expected.events]
    assert reading.events == expected.events
    assert check(reading.events) == []
    blocks = [
        orjson.loads(e.data)["content_block"]["type"]
        for e in reading.events
        if e.event == "content_block_start"
    ]
    assert blocks == ["thinking", "text", "tool_use", "tool_result"]


async def test_concurrent_emits_on_one_sink_all_arrive_intact() -> None:
    with serve(Starlette(routes=sink_routes())) as base:
        reading = await read(base, "/sink/concurrent")
    assert reading.code == CloseCode.NORMAL
    assert len(reading.frames) == TASKS * PER_TASK
    seen: dict[int, list[int]] = {task: [] for task in range(TASKS)}
    for event in reading.events:  # every frame decodes: none interleaved with another
        payload = orjson.loads(event.data)
        assert event.event == f"t{payload['task']}"
        assert event.id == f"{payload['task']}-{payload['n']}"
        assert payload["pad"] == "x" * (payload["n"] * 97)
        seen[payload["task"]].append(payload["n"])
    assert all(order == list(range(PER_TASK)) for order in seen.values())


# -- WebSocketSource over a websockets client -------------------------------------------------


async def test_the_source_ends_at_a_normal_close_with_every_event() -> None:
    hub_app = make_app()
    with serve(hub_app.app, lifespan="on") as base:
        async with client(base) as http:
            await start_turn(http, "s", chunks=12)
            events = await published(http, "s")
            with anyio.fail_after(WAIT):
                async with open_ws(base, "/streams/s/ws") as websocket:
                    source = WebSocketSource(websocket)
                    received = [event async for event in source]
                    with pytest.raises(RuntimeError, match="only once"):
                        aiter(source)
    assert received == events
    assert source.close_code == CloseCode.NORMAL
    assert source.close_reason == "the turn ended"
    assert source.last_event_id == events[-1].id


@pytest.mark.parametrize(
    ("path", "code", "reason"),
    [("/sink/abnormal", 1011, "boom"), ("/sink/drop", 1006, None)],
    ids=["server-closes-1011", "server-drops-the-connection"],
)
async def test_the_source_raises_websocket_closed_at_an_abnormal_close(
    path: str, code: int, reason: str | None
) -> None:
    received: list[Event] = []
    with serve(Starlette(routes=sink_routes())) as base, anyio.fail_after(WAIT):
        async with open_ws(base, path) as websocket:
            source = WebSocketSource(websocket)
            with pytest.raises(WebSocketClosed) as closed:
                await collect(source, received)
    assert closed.value.code == code
    assert source.close_code == code
    if reason is not None:
        assert closed.value.reason == reason
    assert [event.id for event in received] == ["e-0", "e-1"]
    assert source.last_event_id == "e-1"  # where a reconnect resumes from


async def test_the_source_raises_1006_when_its_own_transport_drops() -> None:
    hub_app = make_app()
    with serve(hub_app.app, lifespan="on") as base:
        async with client(base) as http:
            await start_turn(http, "s", chunks=20, hold_at=5)
            await wait_for(hub_app.reached["s"])
            received: list[Event] = []
            with anyio.fail_after(WAIT):
                async with open_ws(base, "/streams/s/ws") as websocket:
                    source = WebSocketSource(websocket)
                    with pytest.raises(WebSocketClosed) as closed:
                        await collect(source, received, abort=websocket, abort_after=3)
            hub_app.release["s"].set()
            events = await published(http, "s")
    assert closed.value.code == CloseCode.ABNORMAL
    # Frames that had arrived before the cut are still handed out, then it raises.
    assert len(received) >= 3
    assert received == events[: len(received)]


async def test_a_malformed_frame_is_skipped_with_a_warning_and_no_content(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with (
        caplog.at_level(logging.WARNING, logger="essessey.ws"),
        serve(Starlette(routes=sink_routes())) as base,
        anyio.fail_after(WAIT),
    ):
        async with open_ws(base, "/sink/malformed") as websocket:
            received = [event async for event in WebSocketSource(websocket)]
    assert [event.id for event in received] == ["e-0", "e-1", "e-2"]
    warnings = [r for r in caplog.records if r.name == "essessey.ws"]
    assert len(warnings) == 4
    assert all(record.levelno == logging.WARNING for record in warnings)
    messages = [record.getMessage() for record in warnings]
    assert all("malformed WebSocket frame (length " in message for message in messages)
    assert "not JSON" in messages[0]
    assert "not valid UTF-8" in messages[1]
    assert "no data" in messages[2]
    assert "id is not a string" in messages[3]
    assert not any("SECRET" in record.getMessage() for record in caplog.records)
    assert "SECRET" not in caplog.text


async def test_a_frame_over_max_frame_size_is_skipped() -> None:
    class Frames:
        def __init__(self, frames: list[str]) -> None:
            self.frames = frames

        async def recv(self) -> str:
            if not self.frames:
                raise WebSocketClosed(1000)
            return self.frames.pop(0)

    small = encode_frame(Event("x", b"{}", "1"))
    big = encode_frame(Event("x", b'"' + b"y" * 200 + b'"', "2"))
    source = WebSocketSource(Frames([small, big, small]), max_frame_size=100)
    assert [event.id async for event in source] == ["1", "1"]
    assert source.close_code == 1000
    empty = WebSocketSource(Frames([]))
    with pytest.raises(TypeError, match="recv"):
        WebSocketSource(object())  # type: ignore[arg-type]
    assert [event async for event in empty] == []


# -- WebSocketSource over a Starlette WebSocket (the server reads) ----------------------------


async def test_a_route_reads_client_frames_with_websocket_source() -> None:
    results: dict[str, Any] = {}
    done: dict[str, threading.Event] = {name: threading.Event() for name in ("ok", "bad")}

    async def collect(websocket: WebSocket) -> None:
        name = websocket.path_params["name"]
        await websocket.accept()
        source = WebSocketSource(websocket)
        received: list[Event] = []
        try:
            async for event in source:
                received.append(event)
        except WebSocketClosed as exc:
            results[name + ":error"] = exc.code
        results[name] = received
        results[name + ":code"] = source.close_code
        done[name].set()

    app = Starlette(routes=[WebSocketRoute("/collect/{name}", collect)])
    sent = [Event("custom", orjson.dumps({"n": i, "text": "ü" * i}), f"c-{i}") for i in range(20)]
    with serve(app) as base:
        with anyio.fail_after(WAIT):
            async with open_ws(base, "/collect/ok") as websocket:
                for i, event in enumerate(sent):
                    await websocket.send(encode_frame(event))
                    if i == 10:
                        await websocket.send("not a frame")
            async with open_ws(base, "/collect/bad") as websocket:
                await websocket.send(encode_frame(sent[0]))
                await websocket.close(4000, "client trouble")
        await wait_for(done["ok"])
        await wait_for(done["bad"])
    assert results["ok"] == sent
    assert results["ok:code"] == CloseCode.NORMAL
    assert "ok:error" not in results
    assert results["bad"] == sent[:1]
    assert results["bad:error"] == 4000
