"""A StreamHub served over SSE (hub_routes) on a real uvicorn server, read with httpx:
ids on every event, resume by header or query parameter, the HTTP errors before a
stream, authorization, disconnects, cancel and the lag policy."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.lowlevel
import httpx
import orjson
import pytest
from starlette.applications import Starlette

from essessey import (
    Event,
    EventType,
    InMemoryEventStore,
    Publisher,
    StopReason,
    StoreUnavailable,
    StreamHub,
    check,
    reassemble_events,
    stream_turn,
)
from essessey.bindings.sse import MAX_ID_LENGTH, SSEDecoder, encode_many, hub_routes
from tests.hub_app import HubApp, make_hub_app
from tests.processes import WAIT
from tests.servers import serve

pytestmark = pytest.mark.anyio

SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"
OWNER = {"x-user": "owner"}
MALLORY = {"x-user": "mallory"}


# -- the app --------------------------------------------------------------------------------


def make_app(*, max_lag: int = 1000, **options: Any) -> HubApp:
    return make_hub_app(lambda hub: hub_routes(hub, **options), max_lag=max_lag)


# -- the client -----------------------------------------------------------------------------


@dataclass
class Reading:
    """What one GET of a stream gave the client."""

    status: int
    content_type: str
    body: bytes
    events: list[Event]

    @property
    def last_id(self) -> str:
        event_id = self.events[-1].id
        assert event_id
        return event_id

    def error(self) -> dict[str, Any]:
        parsed = orjson.loads(self.body)
        assert isinstance(parsed, dict)
        assert parsed["type"] == "error"
        error = parsed["error"]
        assert isinstance(error, dict)
        return error


def client(base: str, **options: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(WAIT), **options)


async def read(
    http: httpx.AsyncClient,
    path: str,
    *,
    headers: dict[str, str] | None = None,
    params: dict[str, str] | None = None,
    stop_after: int | None = None,
) -> Reading:
    """GET a stream and decode it to the end, or, with ``stop_after``, keep the first
    ``stop_after`` events and disconnect (events already in flight are dropped, as by a
    client that had not processed them)."""
    decoder = SSEDecoder()
    body = bytearray()
    events: list[Event] = []
    with anyio.fail_after(WAIT):
        async with http.stream(
            "GET", path, headers={**OWNER, **(headers or {})}, params=params
        ) as response:
            async for chunk in response.aiter_raw():
                body += chunk
                events += [
                    Event(m.event, m.data.encode(), m.id or None) for m in decoder.feed(chunk)
                ]
                if stop_after is not None and len(events) >= stop_after:
                    events = events[:stop_after]
                    break
    content_type = response.headers.get("content-type", "")
    return Reading(response.status_code, content_type, bytes(body), events)


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
    response = await http.get(f"/state/{stream_id}")
    result = response.json()
    assert isinstance(result, dict)
    return result


@asynccontextmanager
async def held_turn() -> AsyncIterator[tuple[HubApp, httpx.AsyncClient, Reading]]:
    """A served hub app whose turn ``s`` (30 chunks) is held before its 5th chunk, a
    client of it, and the owner's reading of the turn's first 3 events."""
    hub_app = make_app()
    with serve(hub_app.app, lifespan="on") as base:
        async with client(base) as http:
            await start_turn(http, "s", chunks=30, hold_at=5)
            await wait_for(hub_app.reached["s"])
            yield hub_app, http, await read(http, "/streams/s", stop_after=3)


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


def id_lines(body: bytes) -> int:
    return sum(1 for line in body.split(b"\n") if line.startswith(b"id: "))


def assert_no_event(reading: Reading) -> None:
    assert reading.events == []
    assert b"event:" not in reading.body


def turn_text(chunks: int, padding: int = 0) -> str:
    return "".join(f"w{i} {'x' * padding}" for i in range(chunks))


# -- streaming and resuming -------------------------------------------------------------------


async def test_a_subscription_streams_the_turn_with_an_id_on_every_event() -> None:
    hub_app = make_app()
    with serve(hub_app.app, lifespan="on") as base:
        async with client(base) as http:
            await start_turn(http, "s", chunks=40, hold_at=3)
            await wait_for(hub_app.reached["s"])
            async with anyio.create_task_group() as tasks:
                readings: list[Reading] = []

                async def subscriber() -> None:
                    readings.append(await read(http, "/streams/s"))

                tasks.start_soon(subscriber)
                await wait_until_state(http, "s", lambda s: s["subscribers"] == 1)
                hub_app.release["s"].set()
            events = await published(http, "s")
    [reading] = readings
    assert reading.status == 200
    assert reading.content_type == SSE_CONTENT_TYPE
    assert reading.events == events
    assert id_lines(reading.body) == len(events)
    assert all(event.id for event in reading.events)
    assert len({event.id for event in reading.events}) == len(events)
    # Byte for byte what a replay writes, the live deltas taken in the turn's appends
    # included.
    assert reading.body == encode_many(events)
    assert check(events) == []
    parsed = reassemble_events(reading.events)
    assert parsed.complete
    assert parsed.text == turn_text(40)


@pytest.mark.parametrize("how", ["last-event-id-header", "last_event_id-query-parameter"])
@pytest.mark.parametrize("seen", [1, 3, 10])
async def test_a_resume_mid_turn_gets_exactly_the_rest(how: str, seen: int) -> None:
    hub_app = make_app()
    with serve(hub_app.app, lifespan="on") as base:
        async with client(base) as http:
            await start_turn(http, "s", chunks=60, hold_at=12)
            await wait_for(hub_app.reached["s"])
            first = await read(http, "/streams/s", stop_after=seen)
            assert len(first.events) == seen
            if how == "last-event-id-header":
                options: dict[str, Any] = {"headers": {"Last-Event-ID": first.last_id}}
            else:
                options = {"params": {"last_event_id": first.last_id}}
            readings: list[Reading] = []
            async with anyio.create_task_group() as tasks:

                async def resume() -> None:
                    readings.append(await read(http, "/streams/s", **options))

                tasks.start_soon(resume)
                await wait_until_state(http, "s", lambda s: s["subscribers"] == 1)
                hub_app.release["s"].set()
            events = await published(http, "s")
    [rest] = readings
    assert rest.status == 200
    assert first.events + rest.events == events  # 0 lost, 0 duplicated
    assert id_lines(rest.body) == len(rest.events)
    assert reassemble_events(first.events + rest.events).text == turn_text(60)


async def test_a_resume_that_lands_in_a_pause_gets_its_headers_at_once() -> None:
    """A proxy with an idle timeout shorter than the keep-alive would answer a resume whose
    headers wait for the next event with a 504, on which an EventSource gives up: the
    headers come within RESUME_HEADERS_WITHIN, the events when the turn goes on."""
    hub_app = make_app(ping_interval=60.0)  # no keep-alive to start the body early
    with serve(hub_app.app, lifespan="on") as base:
        async with client(base) as http:
            await start_turn(http, "s", chunks=20, hold_at=5)
            await wait_for(hub_app.reached["s"])
            # message_start, ping, the block's start and 5 deltas: all there is so far.
            first = await read(http, "/streams/s", stop_after=8)
            assert first.events[-1].event == EventType.CONTENT_BLOCK_DELTA
            headers = {**OWNER, "Last-Event-ID": first.last_id}
            decoder = SSEDecoder()
            rest: list[Event] = []
            with anyio.fail_after(WAIT):
                async with http.stream("GET", "/streams/s", headers=headers) as response:
                    # The turn is still held: these came without an event.
                    assert response.status_code == 200
                    assert response.headers["content-type"] == SSE_CONTENT_TYPE
                    hub_app.release["s"].set()
                    async for chunk in response.aiter_raw():
                        rest += [
                            Event(m.event, m.data.encode(), m.id or None)
                            for m in decoder.feed(chunk)
                        ]
            events = await published(http, "s")
    assert first.events + rest == events  # 0 lost, 0 duplicated


async def test_a_refused_or_finished_resume_still_answers_before_its_headers() -> None:
    """Within the wait for the headers, an unknown id is still a 410 and a finished turn
    with nothing after the id still a 204 (an EventSource stops on both)."""
    hub_app = make_app(ping_interval=60.0)
    with serve(hub_app.app, lifespan="on") as base:
        async with client(base) as http:
            await start_turn(http, "s", chunks=3)
            events = await published(http, "s")
            unknown = await read(http, "/streams/s", headers={"Last-Event-ID": "nope-1"})
            finished = await read(
                http, "/streams/s", headers={"Last-Event-ID": events[-1].id or ""}
            )
    assert unknown.status == 410
    assert finished.status == 204
    assert finished.body == b""


async def test_the_last_event_id_header_wins_over_the_query_parameter() -> None:
    hub_app = make_app()
    with serve(hub_app.app, lifespan="on") as base:
        async with client(base) as http:
            await start_turn(http, "s", chunks=10)
            events = await published(http, "s")
            reading = await read(
                http,
                "/streams/s",
                headers={"Last-Event-ID": str(events[5].id)},
                params={"last_event_id": str(events[2].id)},
            )
            assert reading.events == events[6:]
            # Either alone works, and an empty value means "from the start".
            by_query = await read(http, "/streams/s", params={"last_event_id": str(events[2].id)})
            assert by_query.events == events[3:]
            empty = await read(http, "/streams/s", params={"last_event_id": ""})
            assert empty.events == events
    assert [access for _, _, access in hub_app.asked] == ["resume", "resume", "read"]


async def test_a_finished_turn_is_replayed_whole_to_a_late_client() -> None:
    hub_app = make_app()
    with serve(hub_app.app, lifespan="on") as base:
        async with client(base) as http:
            await start_turn(http, "s", chunks=25)
            events = await published(http, "s")
            late = await read(http, "/streams/s")
            at_end = await read(http, "/streams/s", headers={"Last-Event-ID": str(events[-1].id)})
    assert late.events == events
    # Nothing after the last event and the turn over: 204, on which an EventSource stops
    # instead of reconnecting every second.
    assert (at_end.status, at_end.body, at_end.events) == (204, b"", [])


# -- errors before the stream -------------------------------------------------------------------


async def test_an_unknown_last_id_is_410_resume_unavailable_with_no_event() -> None:
    hub_app = make_app()
    with serve(hub_app.app, lifespan="on") as base:
        async with client(base) as http:
            await start_turn(http, "s", chunks=5)
            events = await published(http, "s")
            epoch = str(events[0].id).rpartition("-")[0]
            for bogus in ("nonsense", f"{epoch}-999", f"{epoch}-0", "00000000-1"):
                for options in (
                    {"headers": {"Last-Event-ID": bogus}},
                    {"params": {"last_event_id": bogus}},
                ):
                    reading = await read(http, "/streams/s", **options)  # type: ignore[arg-type]
                    assert reading.status == 410
                    assert reading.content_type == "application/json"
                    assert reading.error()["type"] == "resume_unavailable"
                    assert_no_event(reading)


async def test_an_unknown_stream_is_404() -> None:
    hub_app = make_app()
    with serve(hub_app.app, lifespan="on") as base:
        async with client(base) as http:
            reading = await read(http, "/streams/nowhere")
            cancel = await http.post("/streams/nowhere/cancel", headers=OWNER)
    assert reading.status == 404
    assert reading.error()["type"] == "not_found_error"
    assert_no_event(reading)
    assert cancel.status_code == 404
    assert cancel.json()["error"]["type"] == "not_found_error"


async def test_a_head_answers_the_status_a_get_starts_with_and_never_waits() -> None:
    async with held_turn() as (hub_app, http, mine):
        epoch = str(mine.last_id).rpartition("-")[0]
        asked = {
            # Live, and at the head of the held turn: a GET would wait for the next event.
            "live": {},
            "live resume": {"headers": {"Last-Event-ID": mine.last_id}},
            "unknown id": {"headers": {"Last-Event-ID": f"{epoch}-999"}},
            "unknown id, query": {"params": {"last_event_id": "nonsense"}},
            "denied": {"headers": MALLORY},
        }
        with anyio.fail_after(WAIT):
            heads = {name: await http.head("/streams/s", **o) for name, o in asked.items()}
            nowhere = await http.head("/streams/nowhere")
            bad = await http.head("/streams/bell%07")
        hub_app.release["s"].set()
        gets = {
            name: await read(http, "/streams/s", stop_after=1, **o)  # type: ignore[arg-type]
            for name, o in asked.items()
        }
        get_nowhere = await read(http, "/streams/nowhere")
    statuses = {name: head.status_code for name, head in heads.items()}
    assert statuses == {
        "live": 200,
        "live resume": 200,
        "unknown id": 410,
        "unknown id, query": 410,
        "denied": 403,
    }
    assert statuses == {name: got.status for name, got in gets.items()}
    assert (nowhere.status_code, get_nowhere.status, bad.status_code) == (404, 404, 400)
    for head in [*heads.values(), nowhere, bad]:
        assert head.content == b""
    assert heads["live"].headers["content-type"] == SSE_CONTENT_TYPE
    assert heads["unknown id"].headers["content-type"] == "application/json"
    assert nowhere.headers["content-type"] == "application/json"


async def test_every_refusal_of_the_hub_routes_keeps_the_app_s_headers() -> None:
    cors = {"access-control-allow-origin": "https://app.example"}
    hub_app = make_app(headers=cors)
    with serve(hub_app.app, lifespan="on") as base:
        async with client(base) as http:
            await start_turn(http, "s", chunks=5)
            events = await published(http, "s")
            epoch = str(events[0].id).rpartition("-")[0]
            answers = {
                400: await http.get("/streams/bell%07"),
                403: await http.get("/streams/s", headers=MALLORY),
                404: await http.get("/streams/nowhere"),
                410: await http.get("/streams/s", headers={"Last-Event-ID": f"{epoch}-99"}),
                204: await http.get("/streams/s", headers={"Last-Event-ID": str(events[-1].id)}),
                200: await http.get("/streams/s"),
                -404: await http.head("/streams/nowhere"),
            }
    assert {status: answer.status_code for status, answer in answers.items()} == {
        400: 400,
        403: 403,
        404: 404,
        410: 410,
        204: 204,
        200: 200,
        -404: 404,
    }
    for answer in answers.values():
        assert answer.headers["access-control-allow-origin"] == "https://app.example"


@pytest.mark.parametrize(
    ("path", "options"),
    [
        ("/streams/" + "s" * (MAX_ID_LENGTH + 1), {}),
        ("/streams/bell%07", {}),
        ("/streams/s", {"headers": {"Last-Event-ID": "i" * (MAX_ID_LENGTH + 1)}}),
        ("/streams/s", {"params": {"last_event_id": "i" * (MAX_ID_LENGTH + 1)}}),
        ("/streams/s", {"params": {"last_event_id": "a\tb"}}),
    ],
    ids=["long-stream-id", "unprintable-stream-id", "long-header-id", "long-query-id", "tab-id"],
)
async def test_an_invalid_stream_id_or_last_id_is_400(path: str, options: dict[str, Any]) -> None:
    hub_app = make_app()
    with serve(hub_app.app, lifespan="on") as base:
        async with client(base) as http:
            await start_turn(http, "s", chunks=3)
            await published(http, "s")
            reading = await read(http, path, **options)
    assert reading.status == 400
    assert reading.error()["type"] == "invalid_request_error"
    assert_no_event(reading)
    assert hub_app.asked == []  # refused before the hook is asked


async def test_a_cancel_with_an_invalid_stream_id_is_400() -> None:
    hub_app = make_app()
    with serve(hub_app.app, lifespan="on") as base:
        async with client(base) as http:
            response = await http.post(f"/streams/{'s' * (MAX_ID_LENGTH + 1)}/cancel")
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


# -- authorization --------------------------------------------------------------------------------


async def test_a_denied_client_gets_403_and_no_event_on_read_resume_and_cancel() -> None:
    async with held_turn() as (hub_app, http, mine):
        denied = [
            await read(http, "/streams/s", headers=MALLORY),
            await read(http, "/streams/s", headers={**MALLORY, "Last-Event-ID": mine.last_id}),
            await read(http, "/streams/s", headers=MALLORY, params={"last_event_id": mine.last_id}),
        ]
        cancel = await http.post("/streams/s/cancel", headers=MALLORY)
        # A stream that does not exist is refused the same way: no existence leak.
        elsewhere = await read(http, "/streams/nowhere", headers=MALLORY)
        assert (await state(http, "s"))["running"]
        hub_app.release["s"].set()
        events = await published(http, "s")
    for reading in [*denied, elsewhere]:
        assert reading.status == 403
        assert reading.content_type == "application/json"
        assert reading.error()["type"] == "permission_error"
        assert_no_event(reading)
    assert cancel.status_code == 403
    assert cancel.json()["error"]["type"] == "permission_error"
    mallory_asked = [
        (stream, access) for user, stream, access in hub_app.asked if user == "mallory"
    ]
    assert mallory_asked == [
        ("s", "read"),
        ("s", "resume"),
        ("s", "resume"),
        ("s", "cancel"),
        ("nowhere", "read"),
    ]
    # The denied cancel stopped nothing: the turn ran to its end.
    parsed = reassemble_events(events)
    assert parsed.complete
    assert parsed.stop_reason == StopReason.END_TURN
    assert parsed.text == turn_text(30)


async def test_an_allowed_cancel_ends_the_stream_with_stop_reason_cancelled() -> None:
    hub_app = make_app()
    with serve(hub_app.app, lifespan="on") as base:
        async with client(base) as http:
            await start_turn(http, "s", chunks=30, hold_at=6, hang="")
            await wait_for(hub_app.reached["s"])
            readings: list[Reading] = []
            async with anyio.create_task_group() as tasks:

                async def subscriber() -> None:
                    readings.append(await read(http, "/streams/s"))

                tasks.start_soon(subscriber)
                await wait_until_state(http, "s", lambda s: s["subscribers"] == 1)
                cancel = await http.post("/streams/s/cancel", headers=OWNER)
            again = await http.post("/streams/s/cancel", headers=OWNER)
            events = await published(http, "s")
    assert cancel.status_code == 200
    assert cancel.json() == {"cancelled": True}
    assert again.status_code == 404  # no turn running any more
    [reading] = readings
    assert reading.events == events
    assert check(events) == []
    parsed = reassemble_events(reading.events)
    assert parsed.complete
    assert parsed.stop_reason == StopReason.CANCELLED
    assert parsed.text == turn_text(6)
    assert parsed.error is None
    assert hub_app.asked[-2:] == [("owner", "s", "cancel"), ("owner", "s", "cancel")]


# -- disconnects and lag ------------------------------------------------------------------------


async def test_a_client_that_disconnects_mid_turn_does_not_stop_the_turn() -> None:
    hub_app = make_app()
    with serve(hub_app.app, lifespan="on") as base:
        async with client(base) as http:
            await start_turn(http, "s", chunks=50, hold_at=5)
            await wait_for(hub_app.reached["s"])
            gone = await read(http, "/streams/s", stop_after=4)
            # The server notices the disconnect and drops the subscription.
            await wait_until_state(http, "s", lambda s: s["subscribers"] == 0)
            assert (await state(http, "s"))["running"]
            hub_app.release["s"].set()
            events = await published(http, "s")
            later = await read(http, "/streams/s")
    assert gone.events == events[:4]
    assert later.events == events
    assert later.events[-1].event == EventType.MESSAGE_STOP
    parsed = reassemble_events(later.events)
    assert parsed.complete
    assert parsed.stop_reason == StopReason.END_TURN
    assert parsed.text == turn_text(50)


async def test_a_lagging_client_is_ended_without_an_error_and_resumes_by_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Big events, a one-event queue and a small client receive buffer: once the socket
    # buffers are full the server's subscription stops moving while the producer goes on,
    # so it falls more than max_lag behind.
    chunks, padding = 600, 32 * 1024
    hub_app = make_app(max_lag=20, max_queue=1)
    small_buffer = httpx.AsyncHTTPTransport(
        socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)]
    )
    with (
        caplog.at_level(logging.WARNING, logger="essessey.hub"),
        serve(hub_app.app, lifespan="on") as base,
    ):
        async with client(base) as http, client(base, transport=small_buffer) as slow:
            await start_turn(http, "s", chunks=chunks, hold_at=2, size=padding)
            await wait_for(hub_app.reached["s"])
            decoder = SSEDecoder()
            first: list[Event] = []
            with anyio.fail_after(WAIT * 2):
                async with slow.stream("GET", "/streams/s", headers=OWNER) as response:
                    assert response.status_code == 200
                    raw = response.aiter_raw()
                    while len(first) < 3:
                        chunk = await anext(raw)
                        first += [
                            Event(m.event, m.data.encode(), m.id) for m in decoder.feed(chunk)
                        ]
                    # Stop reading while the whole turn is produced.
                    hub_app.release["s"].set()
                    events = await published(http, "s")
                    async for chunk in raw:
                        first += [
                            Event(m.event, m.data.encode(), m.id) for m in decoder.feed(chunk)
                        ]
            # The stream was closed early, cleanly: no error event, no message_stop.
            assert 3 <= len(first) < len(events)
            assert EventType.ERROR not in [event.event for event in first]
            assert first == events[: len(first)]
            rest = await read(http, "/streams/s", headers={"Last-Event-ID": str(first[-1].id)})
            assert (await state(http, "s"))["subscribers"] == 0
    assert rest.status == 200
    assert first + rest.events == events  # 0 lost, 0 duplicated
    assert reassemble_events(first + rest.events).text == turn_text(chunks, padding)
    assert any(
        record.name == "essessey.hub" and "fell behind" in record.getMessage()
        for record in caplog.records
    )


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


@pytest.mark.anyio
async def test_a_store_outage_ends_the_subscription_without_an_error_event() -> None:
    hub = StreamHub(_FlakyStore(fail_after=3))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with hub:
            await hub.start("s1", _short_turn)
            await hub.wait("s1")
            yield

    app = Starlette(routes=list(hub_routes(hub)), lifespan=lifespan)
    with serve(app, lifespan="on") as url:
        async with httpx.AsyncClient() as client:
            response = await client.get(f"{url}/streams/s1")
    assert response.status_code == 200
    decoded = SSEDecoder().feed(response.content)
    events = [Event(m.event, m.data.encode(), m.id) for m in decoded]
    # Three events with ids, then the end: no error event a client would read as the end
    # of the turn, so it reconnects by its last id instead.
    assert len(events) == 3
    assert all(event.id for event in events)
    assert "error" not in [event.event for event in events]


async def _short_turn(publisher: Publisher) -> None:
    async with stream_turn(publisher, message_id="m", stream_id="s1", model="x") as turn:
        text = await turn.text()
        for chunk in ("a", "b", "c", "d"):
            await text.write(chunk)
