"""The servers users deploy on, each a real process serving the demo app from its factory:
uvicorn (h11 on asyncio, httptools on uvloop), hypercorn (HTTP/1.1, and HTTP/2 with prior
knowledge) and granian. On each: a whole turn, a resume by Last-Event-ID, a cancel, a
WebSocket subscription, and what a reader of an open stream gets when the server is told to
stop (docs/servers.md)."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest
import websockets

from essessey import Event, check, reassemble_events
from essessey.bindings.sse import SSEDecoder
from tests.processes import WAIT, free_port, spawn, stop_process, wait_for_port

pytestmark = pytest.mark.anyio

FACTORY = "essessey.demo:create_app"
HYPERCORN_SERVE = Path(__file__).resolve().parent.parent / "examples" / "hypercorn_serve.py"


@dataclass(frozen=True)
class Server:
    """How to start one server on a port, and how its clients talk to it."""

    name: str
    argv: tuple[str, ...]
    http2: bool = False
    # How it is run to hand its readers over on SIGTERM, when its command does not.
    stopping_argv: tuple[str, ...] | None = None

    def command(self, port: int, *, stopping: bool = False) -> list[str]:
        argv = self.stopping_argv if stopping and self.stopping_argv else ("-m", *self.argv)
        return [sys.executable, *(arg.format(port=port) for arg in argv)]


SERVERS = [
    Server(
        "uvicorn-h11",
        ("uvicorn", "--factory", FACTORY, "--port", "{port}", "--http", "h11", "--loop", "asyncio"),
    ),
    Server(
        "uvicorn-httptools",
        (
            "uvicorn",
            "--factory",
            FACTORY,
            "--port",
            "{port}",
            "--http",
            "httptools",
            "--loop",
            "uvloop",
        ),
    ),
    Server(
        "hypercorn-h1",
        ("hypercorn", f"{FACTORY}()", "-b", "127.0.0.1:{port}"),
        stopping_argv=(str(HYPERCORN_SERVE), "127.0.0.1:{port}"),
    ),
    Server(
        "hypercorn-h2",
        ("hypercorn", f"{FACTORY}()", "-b", "127.0.0.1:{port}"),
        http2=True,
        stopping_argv=(str(HYPERCORN_SERVE), "127.0.0.1:{port}"),
    ),
    Server(
        "granian",
        (
            "granian",
            "--interface",
            "asgi",
            "--factory",
            FACTORY,
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
        ),
    ),
]


@dataclass
class Running:
    server: Server
    process: subprocess.Popen[bytes]
    base: str

    def client(self) -> httpx.AsyncClient:
        if self.server.http2:
            # Prior knowledge over cleartext: what a proxy speaking h2c to its upstream does.
            return httpx.AsyncClient(base_url=self.base, http1=False, http2=True, timeout=WAIT)
        return httpx.AsyncClient(base_url=self.base, timeout=WAIT)


def _start(server: Server, *, stopping: bool = False) -> Running:
    port = free_port()
    process = spawn(
        server.command(port, stopping=stopping),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, process, server.name)
    except BaseException:
        stop_process(process, kill=True)
        raise
    return Running(server, process, f"http://127.0.0.1:{port}")


@pytest.fixture(scope="module", params=SERVERS, ids=[s.name for s in SERVERS])
def running(request: pytest.FixtureRequest) -> Iterator[Running]:
    served = _start(request.param)
    try:
        yield served
    finally:
        stop_process(served.process, kill=True)


async def _start_turn(http: httpx.AsyncClient, **options: Any) -> str:
    response = await http.post("/streams", json=options)
    assert response.status_code == 201, response.text
    stream_id = response.json()["stream_id"]
    assert isinstance(stream_id, str)
    return stream_id


async def _read(
    http: httpx.AsyncClient, stream_id: str, headers: dict[str, str] | None = None
) -> tuple[int, list[Event], bytes]:
    decoder = SSEDecoder()
    events: list[Event] = []
    body = bytearray()
    with anyio.fail_after(WAIT):
        async with http.stream("GET", f"/streams/{stream_id}", headers=headers) as response:
            async for chunk in response.aiter_raw():
                body += chunk
                events += [
                    Event(m.event, m.data.encode(), m.id or None) for m in decoder.feed(chunk)
                ]
    return response.status_code, events, bytes(body)


def _stop_reason(events: list[Event]) -> str | None:
    deltas = [e for e in events if e.event == "message_delta"]
    reason = orjson.loads(deltas[-1].data)["delta"]["stop_reason"] if deltas else None
    return reason if isinstance(reason, str) else None


async def test_a_whole_turn_then_a_resume_by_last_event_id(running: Running) -> None:
    async with running.client() as http:
        stream_id = await _start_turn(http, deltas=40, delay_ms=0)
        status, events, _ = await _read(http, stream_id)
        assert status == 200
        assert check(events) == []
        assert events[-1].event == "message_stop"
        assert reassemble_events(events).complete
        # A reader that had the first 7 events gets exactly the rest.
        status, rest, _ = await _read(http, stream_id, {"Last-Event-ID": events[6].id or ""})
    assert status == 200
    assert rest == events[7:]


async def test_a_cancel_ends_the_turn_for_its_reader(running: Running) -> None:
    async with running.client() as http:
        stream_id = await _start_turn(http, deltas=2000, delay_ms=20)
        cancelled = await http.post(f"/streams/{stream_id}/cancel")
        assert cancelled.status_code == 200
        status, events, _ = await _read(http, stream_id)
    assert status == 200
    assert _stop_reason(events) == "cancelled"
    assert check(events) == []


async def test_a_websocket_subscription_reads_the_same_turn(running: Running) -> None:
    async with running.client() as http:
        stream_id = await _start_turn(http, deltas=30, delay_ms=0)
        _, events, _ = await _read(http, stream_id)
    url = running.base.replace("http://", "ws://") + f"/streams/{stream_id}/ws"
    frames: list[Event] = []
    with anyio.fail_after(WAIT):
        async with websockets.connect(url) as ws:
            async for message in ws:
                frame = orjson.loads(message)
                frames.append(Event(frame["event"], orjson.dumps(frame["data"]), frame.get("id")))
    assert [(e.event, e.id) for e in frames] == [(e.event, e.id) for e in events]


async def test_a_reader_of_an_open_stream_is_handed_over_when_the_server_stops(
    running: Running,
) -> None:
    """SIGTERM with a turn in progress: the reader gets whole events only, then the retry
    hint, and the body ends well before the turn would have (hypercorn run as
    examples/hypercorn_serve.py shows: its command tells the app nothing)."""
    served = _start(running.server, stopping=True)
    try:
        async with served.client() as http:
            stream_id = await _start_turn(http, deltas=5000, delay_ms=20)
            decoder = SSEDecoder()
            events: list[Event] = []
            body = bytearray()
            signalled = False
            with anyio.fail_after(WAIT):
                async with http.stream("GET", f"/streams/{stream_id}") as response:
                    async for chunk in response.aiter_raw():
                        body += chunk
                        events += [
                            Event(m.event, m.data.encode(), m.id or None)
                            for m in decoder.feed(chunk)
                        ]
                        if len(events) >= 10 and not signalled:
                            signalled = True
                            served.process.send_signal(signal.SIGTERM)
    finally:
        stop_process(served.process, kill=True)
    assert len(events) < 1000  # ended at the shutdown, not with the turn
    assert body.endswith(b"\n")  # whole events: nothing cut mid-line
    assert all(e.id for e in events)  # each one whole, with its id to resume from
    assert body.endswith(b"retry: 1000\n")


async def test_workers_with_an_in_memory_store_warn_when_a_stream_is_not_found() -> None:
    """Two workers, each with a store of its own: a client that reaches the other worker
    gets 404, and the log says why (once per worker)."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        "--factory",
        FACTORY,
        "--port",
        str(port),
        "--workers",
        "2",
    ]
    process = spawn(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for_port(port, process, "uvicorn --workers 2")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=WAIT) as http:
            for _ in range(20):
                response = await http.get("/streams/held_by_another_worker")
                assert response.status_code == 404
    finally:
        stop_process(process)
    assert process.stderr is not None
    log = process.stderr.read().decode()
    assert 1 <= log.count("in-memory store") <= 2
    assert "shared store" in log


async def test_a_websocket_reader_is_handed_over_when_the_server_stops(running: Running) -> None:
    """SIGTERM with a WebSocket subscription open: whole frames, then a close with 1012
    (service restart: the client resumes elsewhere with its last id)."""
    served = _start(running.server, stopping=True)
    frames: list[dict[str, Any]] = []
    closed: websockets.ConnectionClosed | None = None
    try:
        async with served.client() as http:
            stream_id = await _start_turn(http, deltas=5000, delay_ms=20)
        url = served.base.replace("http://", "ws://") + f"/streams/{stream_id}/ws"
        with anyio.fail_after(WAIT):
            async with websockets.connect(url) as ws:
                try:
                    while True:
                        frames.append(orjson.loads(await ws.recv()))
                        if len(frames) == 10:
                            served.process.send_signal(signal.SIGTERM)
                except websockets.ConnectionClosed as exc:
                    closed = exc
    finally:
        stop_process(served.process, kill=True)
    assert closed is not None
    if running.server.name == "granian" and closed.rcvd is None:
        # granian, with the machine loaded, has cut the connection without a close frame
        # (1006) after essessey began its close; docs/servers.md says so. The frames that
        # came are whole and the reader resumes by its last id all the same.
        pass
    else:
        assert closed.rcvd is not None
        assert closed.rcvd.code == 1012
    assert 10 <= len(frames) < 1000
    assert all(frame.get("id") for frame in frames)
