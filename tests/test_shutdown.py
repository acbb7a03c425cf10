"""Graceful shutdown, on real servers: open streams end with a reconnect hint, and a
replica's clients resume on another with nothing lost.

When the server shuts down, an open SSE response sends ``retry: 1000`` after its last
whole event and ends; a WebSocket subscription closes with 1012; the hub lets its running
turns finish within its ``shutdown_grace`` and cancels the rest.

1. The signal itself: :func:`begin_shutdown` reaches every open stream of a uvicorn
   running in a thread (SSE of a hub subscription, SSE of a producer, WebSocket), leaves
   the turn running, and ends at once a stream opened afterwards; from another thread it
   takes the loop. One watcher task runs while streams wait, none when none do.
2. uvicorn's own shutdown, detected: in this process (``uvicorn.Server.serve()`` on the
   test's loop, ``should_exit`` set as its signal handler sets it; with the detection
   off nothing ends until :func:`begin_shutdown`), and in a subprocess, for the
   ``uvicorn`` command with SIGTERM and ``Server.serve()`` with SIGINT: the streams end,
   the process exits, its hub having finished the short turn and cancelled the endless
   one at the grace. Without the detection (the control) SIGTERM leaves the process up,
   held by its open stream. (Before that, the hub's grace on its own: turns finish
   within it, the rest are cancelled at its end, no turn starts meanwhile; an exception
   or a cancellation cancels at once.)
3. Two replicas on one nats-server (JetStream): SIGTERM to A mid-turn; its SSE and
   WebSocket clients get the hint and the close, reconnect to B with their last id, and
   get exactly the rest of the turn, which A finishes before it exits.

Every wait is bounded; every process a test starts is stopped.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import anyio
import httpx
import orjson
import pytest
import uvicorn
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from essessey import (
    Event,
    EventType,
    InMemoryEventStore,
    Publisher,
    StreamHub,
    TurnProducer,
    check,
    reassemble_events,
    stream_turn,
)
from essessey.bindings.sse import SSEDecoder
from essessey.bindings.ws import decode_frame
from essessey.shutdown import (
    begin_shutdown,
    detect_uvicorn_shutdown,
    shutting_down,
    wait_for_shutdown,
)
from tests.chaos_app import expected_events
from tests.nats_server import NatsServer
from tests.processes import WAIT, free_port
from tests.servers import ServerProcess, serve
from tests.shutdown_app import create_app
from tests.test_replicas import EVENTS, MID_TURN, Client, assert_exact, replicas, start_turn
from tests.test_replicas import stored_turn as stored_turn_of

pytestmark = pytest.mark.anyio

EXIT_BOUND = 20.0  # seconds a server may take to exit after the signal (it hangs without)
RETRY_TAIL = b"retry: 1000\n"  # what an SSE response ends with at shutdown (the field alone)
LONG_TURN = 20_000  # events, 10 ms apart: a turn that outlasts every test
SHORT_TURN = 150  # events, 10 ms apart: a turn that ends within a shutdown's grace
WATCHER = "essessey-shutdown-watcher"


# -- clients --------------------------------------------------------------------------


@dataclass
class SSEReading:
    """One SSE response, as bytes and as the events a browser would dispatch."""

    name: str
    body: bytearray = field(default_factory=bytearray)
    events: list[Event] = field(default_factory=list)
    decoder: SSEDecoder = field(default_factory=SSEDecoder)
    status: int | None = None
    ended: bool = False  # the body ended without a transport error
    enough: anyio.Event = field(default_factory=anyio.Event)


async def read_sse(
    http: httpx.AsyncClient,
    url: str,
    reading: SSEReading,
    *,
    last_event_id: str | None = None,
    enough: int = 1,
) -> None:
    """Read ``url`` to its end; ``reading.enough`` is set at ``enough`` events."""
    headers = {"Accept": "text/event-stream"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    reading.decoder = SSEDecoder(last_event_id or "")
    try:
        async with http.stream("GET", url, headers=headers) as response:
            reading.status = response.status_code
            async for chunk in response.aiter_raw():
                reading.body += chunk
                for message in reading.decoder.feed(chunk):
                    event_id = message.id or None
                    reading.events.append(Event(message.event, message.data.encode(), event_id))
                if len(reading.events) >= enough:
                    reading.enough.set()
        reading.ended = True
    finally:
        reading.enough.set()


def assert_ended_with_retry(reading: SSEReading) -> None:
    """The response ended cleanly with the retry hint right after a whole event, and the
    client's last event id is that of the last event it has."""
    body = bytes(reading.body)
    assert reading.status == 200, reading.name
    assert reading.ended, f"{reading.name}: the response failed instead of ending"
    assert body.endswith(RETRY_TAIL), f"{reading.name}: ends with {body[-80:]!r}"
    before = body[: -len(RETRY_TAIL)]
    assert before == b"" or before.endswith(b"\n\n"), f"{reading.name}: an event was cut"
    assert reading.decoder.retry == 1000
    ids = [event.id for event in reading.events if event.id]
    if ids:
        assert reading.decoder.last_event_id == ids[-1]


@dataclass
class WSReading:
    """One WebSocket subscription: its events (ping frames left out) and close code."""

    name: str
    events: list[Event] = field(default_factory=list)
    code: int | None = None
    enough: anyio.Event = field(default_factory=anyio.Event)


async def read_ws(
    base: str,
    stream_id: str,
    reading: WSReading,
    *,
    last_event_id: str | None = None,
    enough: int = 1,
) -> None:
    url = "ws" + base.removeprefix("http") + f"/streams/{stream_id}/ws"
    if last_event_id is not None:
        url += f"?last_event_id={quote(last_event_id)}"
    try:
        async with ws_connect(url, open_timeout=WAIT) as websocket:
            try:
                while True:
                    frame = await websocket.recv()
                    assert isinstance(frame, str)
                    event = decode_frame(frame)
                    if event.id is not None:  # not a keep-alive frame
                        reading.events.append(event)
                    if len(reading.events) >= enough:
                        reading.enough.set()
            except ConnectionClosed as exc:
                reading.code = exc.rcvd.code if exc.rcvd is not None else None
    finally:
        reading.enough.set()


async def start_long_turn(
    http: httpx.AsyncClient, stream_id: str, seed: int, events: int = LONG_TURN
) -> None:
    response = await http.post(
        f"/turns/{stream_id}", params={"seed": seed, "events": events, "delay_ms": 10}
    )
    assert response.status_code == 202, response.text


_expected: dict[tuple[int, str, int], list[Event]] = {}


async def assert_prefix_of_turn(
    events: list[Event], seed: int, stream_id: str, total: int, start: int = 0
) -> None:
    """``events`` are the turn's events ``start`` to ``start + len(events)``, with
    unique increasing ids."""
    key = (seed, stream_id, total)
    expected = _expected.get(key)
    if expected is None:
        expected = _expected[key] = await expected_events(seed, stream_id, total)
    got = [(event.event, event.data) for event in events]
    assert got == [(e.event, e.data) for e in expected[start : start + len(events)]]
    sequences = [int((event.id or "").rpartition("-")[2]) for event in events]
    assert sequences == sorted(set(sequences))


async def until(condition: Callable[[], bool]) -> None:
    """Return once ``condition()`` holds; TimeoutError after WAIT seconds."""
    for _ in range(int(WAIT / 0.02)):
        if condition():
            return
        await anyio.sleep(0.02)
    raise TimeoutError


def watchers() -> list[asyncio.Task[object]]:
    return [task for task in asyncio.all_tasks() if task.get_name() == WATCHER]


# -- 1. the signal --------------------------------------------------------------------


async def test_begin_shutdown_ends_every_open_stream_and_leaves_the_turn_running() -> None:
    seed, stream_id = 7_101, "turn-explicit"
    with serve(create_app(grace=0.5), lifespan="on") as base:
        async with httpx.AsyncClient(base_url=base, timeout=WAIT) as http:
            await start_long_turn(http, stream_id, seed)
            url = f"/streams/{stream_id}"
            first = SSEReading("SSE from the start")
            resumed = SSEReading("SSE resumed after the 10th event")
            producer = SSEReading("SSE of a producer")
            ws_first, ws_resumed = WSReading("WS from the start"), WSReading("WS resumed")
            with anyio.fail_after(WAIT):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(lambda: read_sse(http, url, first, enough=20))
                    await first.enough.wait()
                    tenth = first.events[9].id
                    tasks.start_soon(
                        lambda: read_sse(http, url, resumed, last_event_id=tenth, enough=10)
                    )
                    tasks.start_soon(lambda: read_sse(http, "/forever", producer, enough=5))
                    tasks.start_soon(lambda: read_ws(base, stream_id, ws_first, enough=20))
                    tasks.start_soon(
                        lambda: read_ws(base, stream_id, ws_resumed, last_event_id=tenth, enough=10)
                    )
                    for reading in (resumed, producer, ws_first, ws_resumed):
                        await reading.enough.wait()
                    response = await http.post("/shutdown")
                    assert response.json() == {"shutting_down": True}
                # Every reader has ended by now (the task group waited for them).
                state = (await http.get("/state")).json()
                late = SSEReading("SSE opened after the shutdown")
                await read_sse(http, url, late)
                late_ws = WSReading("WS opened after the shutdown")
                await read_ws(base, stream_id, late_ws)
    print(
        "explicit: "
        + ", ".join(
            f"{r.name} {len(r.events)} events"
            for r in (first, resumed, producer, ws_first, ws_resumed)
        )
    )
    for reading in (first, resumed, producer):
        assert_ended_with_retry(reading)
    await assert_prefix_of_turn(first.events, seed, stream_id, LONG_TURN)
    await assert_prefix_of_turn(resumed.events, seed, stream_id, LONG_TURN, start=10)
    assert {event.event for event in producer.events} == {EventType.PING}
    assert ws_first.code == ws_resumed.code == 1012
    await assert_prefix_of_turn(ws_first.events, seed, stream_id, LONG_TURN)
    await assert_prefix_of_turn(ws_resumed.events, seed, stream_id, LONG_TURN, start=10)
    # Ending the subscriptions ended no turn; a stream opened later ends at once.
    assert state == {"shutting_down": True, "running": [stream_id]}
    assert bytes(late.body) == RETRY_TAIL
    assert late.ended
    assert late_ws.events == []
    assert late_ws.code == 1012


async def test_one_watcher_polls_while_streams_wait_and_none_when_none_do() -> None:
    assert watchers() == []
    async with anyio.create_task_group() as tasks:
        for _ in range(3):
            tasks.start_soon(wait_for_shutdown)
        await anyio.sleep(0.1)
        [watcher] = watchers()  # one for the loop, not one per stream
        tasks.cancel_scope.cancel()
    with anyio.fail_after(5):
        await watcher  # it ends by itself, within one interval of the last stream's end
    assert watchers() == []
    # With the detection off, nothing polls at all.
    detect_uvicorn_shutdown(False)
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(wait_for_shutdown)
            await anyio.sleep(0.1)
            assert watchers() == []
            tasks.cancel_scope.cancel()
    finally:
        detect_uvicorn_shutdown(True)
    assert not shutting_down()
    # The trigger, from another thread, reaches every waiter; a later one returns at once.
    woken: list[int] = []

    async def wait(number: int) -> None:
        await wait_for_shutdown()
        woken.append(number)

    loop = asyncio.get_running_loop()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tasks:
            for number in range(3):
                tasks.start_soon(wait, number)
            await anyio.sleep(0.1)
            await anyio.to_thread.run_sync(begin_shutdown, loop)
        await wait_for_shutdown()
    assert sorted(woken) == [0, 1, 2]
    assert shutting_down()
    with pytest.raises(ValueError, match="interval"):
        detect_uvicorn_shutdown(interval=0)


# -- the hub's grace ----------------------------------------------------------------


def _turn(
    stream_id: str, chunks: str, *, hang: bool = False, written: anyio.Event | None = None
) -> TurnProducer:
    """A turn writing ``chunks`` (one a tick), then ending, or hanging until cancelled;
    ``written`` is set once every chunk is written."""

    async def produce(publisher: Publisher) -> None:
        async with stream_turn(
            publisher, message_id=f"msg_{stream_id}", stream_id=stream_id, model="m"
        ) as turn:
            text = await turn.text()
            for chunk in chunks:
                await anyio.sleep(0.2)
                await text.write(chunk)
            if written is not None:
                written.set()
            if hang:
                await anyio.sleep_forever()

    return produce


async def ending(store: InMemoryEventStore, stream_id: str) -> tuple[str | None, str]:
    """How the stored turn ended (its stop reason) and its text; it must be whole."""
    events, _ = await store.since(stream_id, None)
    assert check(events) == []
    parsed = reassemble_events(events)
    assert parsed.complete
    return parsed.stop_reason, parsed.text


async def test_leaving_the_hub_lets_turns_finish_within_the_grace_then_cancels() -> None:
    store = InMemoryEventStore()
    hub = StreamHub(store, shutdown_grace=1.0)
    refused: list[str] = []
    quick = _turn("quick", "abc")  # about 0.6 s

    async def quick_then_start(publisher: Publisher) -> None:
        await quick(publisher)
        try:  # the hub is being left by now
            await hub.start("late", _turn("late", "x"))
        except RuntimeError as exc:
            refused.append(str(exc))

    endless_wrote = anyio.Event()
    with anyio.fail_after(WAIT):
        async with hub:
            await hub.start("quick", quick_then_start)
            await hub.start("endless", _turn("endless", "x", hang=True, written=endless_wrote))
            await endless_wrote.wait()  # the quick turn is still writing: about 0.4 s to go
            left = anyio.current_time()
        waited = anyio.current_time() - left
    print(f"hub grace 1 s: left after {waited:.2f} s")
    assert await ending(store, "quick") == ("end_turn", "abc")
    assert await ending(store, "endless") == ("cancelled", "x")
    assert refused == ["the StreamHub is shutting down; no new turn starts"]
    assert not await store.exists("late")
    assert waited >= 1.0  # the endless turn had the whole grace


async def test_a_hub_left_by_an_exception_or_cancelled_in_its_grace_cancels_at_once() -> None:
    store = InMemoryEventStore()

    async def fail() -> None:
        async with StreamHub(store, shutdown_grace=60) as hub:
            wrote = anyio.Event()
            await hub.start("raised", _turn("raised", "x", hang=True, written=wrote))
            await wrote.wait()
            raise KeyError("the app failed")

    started = anyio.current_time()
    with anyio.fail_after(WAIT):
        # The app's exception comes out as itself, so an ``except KeyError:`` catches it.
        with pytest.raises(KeyError, match="the app failed"):
            await fail()
        with anyio.CancelScope() as waiting:
            async with StreamHub(store, shutdown_grace=60) as hub:
                wrote = anyio.Event()
                await hub.start("interrupted", _turn("interrupted", "y", hang=True, written=wrote))
                await wrote.wait()
                # Left normally, just below: the hub waits out its grace, and this scope
                # cancels it 0.2 s into it.
                waiting.deadline = anyio.current_time() + 0.2
        assert waiting.cancelled_caught
    took = anyio.current_time() - started
    assert await ending(store, "raised") == ("cancelled", "x")
    assert await ending(store, "interrupted") == ("cancelled", "y")
    assert took < 30  # not the 60 s grace
    with pytest.raises(ValueError, match="shutdown_grace"):
        StreamHub(shutdown_grace=-1)


# -- 2. uvicorn's shutdown, detected --------------------------------------------------


@contextmanager
def no_detection() -> Iterator[None]:
    detect_uvicorn_shutdown(False)
    try:
        yield
    finally:
        detect_uvicorn_shutdown(True)


@pytest.mark.parametrize("detect", [True, False], ids=["detected", "detection off"])
async def test_uvicorn_serve_in_this_process_ends_its_streams_on_shutdown(detect: bool) -> None:
    seed, stream_id = 7_201, "turn-in-process"
    port = free_port()
    config = uvicorn.Config(
        create_app(grace=0.5), host="127.0.0.1", port=port, log_level="warning", lifespan="on"
    )
    server = uvicorn.Server(config)
    base = f"http://127.0.0.1:{port}"
    subscription, producer = SSEReading("SSE subscription"), SSEReading("SSE of a producer")
    still_open = 0
    with anyio.fail_after(WAIT), no_detection() if not detect else _nothing():
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(server.serve)
            await until(lambda: server.started)
            # What the detection reads: the signal handler is a method of the server.
            assert getattr(signal.getsignal(signal.SIGTERM), "__self__", None) is server
            async with httpx.AsyncClient(base_url=base, timeout=WAIT) as http:
                await start_long_turn(http, stream_id, seed)
                async with anyio.create_task_group() as readers:
                    readers.start_soon(
                        lambda: read_sse(http, f"/streams/{stream_id}", subscription, enough=5)
                    )
                    readers.start_soon(lambda: read_sse(http, "/forever", producer, enough=5))
                    await subscription.enough.wait()
                    await producer.enough.wait()
                    assert not shutting_down()
                    server.should_exit = True  # what its SIGTERM and SIGINT handler does
                    if not detect:
                        count = len(producer.events)
                        await anyio.sleep(1.5)
                        # Held open: uvicorn would wait for it forever.
                        assert not producer.ended
                        assert not subscription.ended
                        still_open = len(producer.events) - count
                        assert still_open > 0
                        begin_shutdown()
        # serve() has returned: the task group is done.
    print(f"in process ({'detected' if detect else 'detection off'}): after should_exit the")
    print(f"  producer's stream sent {still_open} more events until begin_shutdown()")
    assert shutting_down()
    assert_ended_with_retry(subscription)
    assert_ended_with_retry(producer)
    await assert_prefix_of_turn(subscription.events, seed, stream_id, LONG_TURN)


@contextmanager
def _nothing() -> Iterator[None]:
    yield


class ProgrammaticServer(ServerProcess):
    """``python -m tests.shutdown_app PORT``: ``uvicorn.Server(config).serve()``."""

    def command(self) -> list[str]:
        return [sys.executable, "-m", self.app, str(self.port)]


@contextmanager
def shutdown_server(how: str, env: dict[str, str]) -> Iterator[ServerProcess]:
    if how == "command":
        server = ServerProcess("tests.shutdown_app:app", env)
    else:
        server = ProgrammaticServer("tests.shutdown_app", env)
    server.start()
    try:
        yield server
    finally:
        server.stop(kill=True)


def wait_exit(process: subprocess.Popen[bytes]) -> int | None:
    try:
        return process.wait(timeout=EXIT_BOUND)
    except subprocess.TimeoutExpired:
        return None


@pytest.mark.parametrize(
    ("how", "sig"),
    [("command", signal.SIGTERM), ("serve", signal.SIGINT)],
    ids=["uvicorn command, SIGTERM", "Server.serve(), SIGINT"],
)
async def test_a_signal_ends_the_open_streams_and_the_server_exits(
    how: str, sig: signal.Signals, tmp_path: Path
) -> None:
    seed, endless, short = 7_202, "turn-endless", "turn-short"
    report = tmp_path / "report.json"
    # The grace is twice what the short turn needs: it finishes in it, the endless one
    # is cancelled at its end.
    env = {"SHUTDOWN_GRACE": "3", "SHUTDOWN_REPORT": str(report)}
    with shutdown_server(how, env) as server:
        process = server.process
        assert process is not None
        async with httpx.AsyncClient(base_url=server.url, timeout=WAIT) as http:
            await start_long_turn(http, endless, seed)
            await start_long_turn(http, short, seed, events=SHORT_TURN)  # about 1.5 s
            on_endless = SSEReading("SSE, endless turn")
            on_short = SSEReading("SSE, short turn")
            producer = SSEReading("SSE of a producer")
            on_ws = WSReading("WS, endless turn")
            with anyio.fail_after(WAIT):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(lambda: read_sse(http, f"/streams/{endless}", on_endless))
                    tasks.start_soon(lambda: read_sse(http, f"/streams/{short}", on_short))
                    tasks.start_soon(lambda: read_sse(http, "/forever", producer))
                    tasks.start_soon(lambda: read_ws(server.url, endless, on_ws))
                    for reading in (on_endless, on_short, producer, on_ws):
                        await reading.enough.wait()
                    signalled = time.monotonic()
                    process.send_signal(sig)
                ended_after = time.monotonic() - signalled
        code = await anyio.to_thread.run_sync(wait_exit, process)
        exited_after = time.monotonic() - signalled
    print(
        f"{how}: streams ended {ended_after:.2f} s after {sig.name}, the process exited "
        f"({code}) after {exited_after:.2f} s; turns: {report.read_text()}"
    )
    assert code is not None, f"the server did not exit within {EXIT_BOUND} s"
    for reading in (on_endless, on_short, producer):
        assert_ended_with_retry(reading)
    assert on_ws.code == 1012
    await assert_prefix_of_turn(on_endless.events, seed, endless, LONG_TURN)
    await assert_prefix_of_turn(on_short.events, seed, short, SHORT_TURN)
    # The hub drained: the short turn finished within the grace, the endless one was
    # cancelled at its end (and ended properly).
    turns = orjson.loads(report.read_bytes())
    assert turns[short] == {"events": SHORT_TURN, "ending": "end_turn"}
    assert turns[endless]["ending"] == "cancelled"


async def test_without_the_detection_an_open_stream_holds_the_server_up() -> None:
    # The control: what every SSE stream did before, and still does with the detection
    # off (and no begin_shutdown): uvicorn waits for it, and does not exit.
    seed, stream_id = 7_203, "turn-held"
    with shutdown_server("command", {"SHUTDOWN_DETECT": "0"}) as server:
        process = server.process
        assert process is not None
        async with httpx.AsyncClient(base_url=server.url, timeout=WAIT) as http:
            await start_long_turn(http, stream_id, seed)
            reading = SSEReading("SSE, detection off")
            with anyio.fail_after(WAIT):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(lambda: read_sse(http, f"/streams/{stream_id}", reading))
                    await reading.enough.wait()
                    process.send_signal(signal.SIGTERM)
                    at_signal = len(reading.events)
                    await anyio.sleep(3.0)
                    alive = process.poll() is None
                    after = len(reading.events) - at_signal
                    tasks.cancel_scope.cancel()
    print(f"control: 3 s after SIGTERM the server is up: {alive}; the stream got {after} more")
    assert alive
    assert not reading.ended
    assert after > 0
    assert RETRY_TAIL not in reading.body


# -- 3. two replicas on one nats-server -----------------------------------------------


async def test_a_replica_shut_down_mid_turn_hands_its_clients_to_the_other(
    nats: NatsServer,
) -> None:
    seed, stream_id = 7_301, "turn-shutdown"
    with replicas(nats) as (a, b):
        process = a.process
        assert process is not None
        async with httpx.AsyncClient(timeout=10.0) as http:
            await start_turn(http, a.url, stream_id, seed)
            sse_a, ws_a = SSEReading("SSE on A"), WSReading("WS on A")
            sse_b, ws_b = SSEReading("SSE resumed on B"), WSReading("WS resumed on B")
            url_a, url_b = f"{a.url}/streams/{stream_id}", f"{b.url}/streams/{stream_id}"
            with anyio.fail_after(WAIT):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(lambda: read_sse(http, url_a, sse_a, enough=MID_TURN))
                    tasks.start_soon(lambda: read_ws(a.url, stream_id, ws_a, enough=MID_TURN))
                    await sse_a.enough.wait()
                    await ws_a.enough.wait()
                    signalled = time.monotonic()
                    process.send_signal(signal.SIGTERM)
                ended_after = time.monotonic() - signalled
                at_shutdown = (len(sse_a.events), len(ws_a.events))
                # Each client reconnects to B with the last id it got.
                await read_sse(http, url_b, sse_b, last_event_id=sse_a.events[-1].id)
                await read_ws(b.url, stream_id, ws_b, last_event_id=ws_a.events[-1].id)
            code = await anyio.to_thread.run_sync(wait_exit, process)
            exited_after = time.monotonic() - signalled
            stored = await stored_turn_of(http, b.url, stream_id)
    print(
        f"replicas: SIGTERM to A with its clients at {at_shutdown} of {EVENTS} events; they "
        f"ended {ended_after:.2f} s later; A exited ({code}) after {exited_after:.2f} s"
    )
    assert code is not None, f"A did not exit within {EXIT_BOUND} s"
    assert_ended_with_retry(sse_a)
    assert ws_a.code == 1012
    assert all(count < EVENTS for count in at_shutdown)  # mid-turn
    assert sse_b.ended  # a normal end on B, after message_stop
    assert b"retry:" not in sse_b.body
    assert ws_b.code == 1000
    # A finished the turn before exiting: it is whole in the store, ended by end_turn.
    assert len(stored) == EVENTS
    assert stored[-1].event == EventType.MESSAGE_STOP
    assert orjson.loads(stored[-2].data)["delta"]["stop_reason"] == "end_turn"
    for name, first, then in (("SSE", sse_a, sse_b), ("WS", ws_a, ws_b)):
        client = Client(f"{name} A -> B", events=[*first.events, *then.events])
        client.connections = [a.url, b.url]
        await assert_exact(client, seed, stream_id, stored)
