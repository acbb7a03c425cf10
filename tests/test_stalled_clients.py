"""Stalled clients (the reliability issue, point 2), over SSE and over WebSocket.

The load app (``tests/load_app.py``) runs under uvicorn in a subprocess, so its figures
(tasks, resident memory, file descriptors) are the server's alone. One turn of 20,000
text deltas of 100 characters goes to 200 stalled clients and one healthy client:

- a stalled client is a raw socket with a small receive buffer that sends the request
  (the SSE GET, or the WebSocket upgrade done by hand), reads the response headers and a
  little of the body, then stops reading and keeps the socket open. Nothing in the test
  process reads for it, so the server's sends to it truly stall;
- the healthy client reads the whole turn (httpx and ``connect`` for SSE, the
  ``websockets`` client for WebSocket).

What must hold: the healthy client gets every event exactly once and ``check()`` finds
nothing; the server ends every stalled response after its send timeout with one WARNING
line each, and resets the connection (the client's socket leaves ESTABLISHED without the
client reading a byte: a graceful close would wait for it to read first); the server's
resident memory stays under a bound derived from the queue size (see ``rss_bound``);
and afterwards its task count, file descriptors and subscribers return to where they
were. Every wait is bounded; nothing asserts how long anything took.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
import httpx
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosedOK

from essessey import Event, EventType, check
from essessey.bindings.sse import connect as sse_connect
from essessey.bindings.sse import encode
from essessey.bindings.ws import decode_frame, encode_frame
from tests.load_app import LoadServer, delta_text, load_server
from tests.raw_clients import sse_request, ws_request

STALLED: Final = 200
DELTAS: Final = 20_000
DELTA_SIZE: Final = 100
SEND_TIMEOUT: Final = 2.0
MAX_QUEUE: Final = 64
# The server's kernel send buffer per connection (see LOAD_SNDBUF in load_app): with the
# kernel's autotuning, a connection could absorb up to the host's tcp_wmem maximum
# (4 MiB here) before the app's sends stall, so whether and when a send stalls would
# depend on the host. The kernel doubles the value it is given.
SNDBUF: Final = 64 * 1024
CLIENT_RCVBUF: Final = 4096

TURN_TIMEOUT: Final = 90.0  # the healthy client's whole read
ATTACH_TIMEOUT: Final = 10.0  # one stalled client's headers
END_TIMEOUT: Final = SEND_TIMEOUT + 45.0  # every stalled connection ended
SETTLE_TIMEOUT: Final = 30.0  # the server's figures back to their baseline

# What the server may hold for one stalled response, in its own memory (the kernel's
# buffers are not part of its RSS):
# - uvicorn's transport write buffer: it pauses the app once the buffer is over the
#   high-water mark, 64 KiB, so the buffer holds at most that plus the write that went
#   over it;
# - that write, a batch of at most max_queue + 1 events (the writer takes one event, then
#   whatever is queued), three times over while it is being sent: the frames, their join,
#   and h11's chunk around it (a WebSocket subscription writes one frame per send, so less);
# - the queue itself: max_queue references to events the store holds anyway;
# - the connection's objects (protocol, parser, request, its tasks, the queue and the
#   subscription): CONNECTION_ALLOWANCE.
# Plus, once: the store's copy of the turn (STORE_EVENT_BYTES per event) and a fixed
# allowance for the interpreter's allocator and the healthy client's response. Without
# the bounded queue a stalled response would hold the rest of the turn: 200 x ~5 MB.
HIGH_WATER: Final = 64 * 1024
CONNECTION_ALLOWANCE: Final = 48 * 1024
STORE_EVENT_BYTES: Final = 400
FIXED_ALLOWANCE: Final = 16 * 1024 * 1024


def frame_size() -> int:
    """The bytes of one delta as the SSE response writes it (the WebSocket frame is
    about the same): the event size the memory bound is computed from."""
    payload = (
        b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"'
        + delta_text(DELTAS - 1, DELTA_SIZE).encode()
        + b'"}}'
    )
    event = Event(EventType.CONTENT_BLOCK_DELTA, payload, "0123abcd-20006")
    return max(len(encode(event)), len(encode_frame(event)))


def rss_bound() -> int:
    """The most the server's RSS may grow by while the stalled clients are attached."""
    batch = (MAX_QUEUE + 1) * frame_size()
    per_response = HIGH_WATER + 3 * batch + CONNECTION_ALLOWANCE
    return STALLED * per_response + (DELTAS + 6) * STORE_EVENT_BYTES + FIXED_ALLOWANCE


# -- clients ----------------------------------------------------------------------------


def stalled_client(port: int, request: bytes, status: bytes) -> socket.socket:
    """A connected socket that sent ``request``, read the response headers (which must
    start with ``status``) and a little of the body, and reads no more."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CLIENT_RCVBUF)
        sock.settimeout(ATTACH_TIMEOUT)
        sock.connect(("127.0.0.1", port))
        sock.sendall(request)
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = sock.recv(4096)
            if not chunk:
                raise AssertionError("the server closed before its response headers")
            received += chunk
        head, _, body = received.partition(b"\r\n\r\n")
        assert head.startswith(status), head[:80]
        if not body:
            sock.recv(512)  # a little of the body: the turn's first events
    except BaseException:
        sock.close()
        raise
    return sock


def tcp_state(sock: socket.socket) -> int:
    """The kernel's TCP state of ``sock`` (Linux ``tcp_info.tcpi_state``), read without
    reading the socket: 1 is ESTABLISHED."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]


TCP_ESTABLISHED: Final = 1


@contextmanager
def stalled_clients(
    count: int, connect: Callable[[], socket.socket]
) -> Iterator[list[socket.socket]]:
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sockets.append(connect())
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


def wait_until_all_ended(sockets: list[socket.socket], timeout: float) -> None:
    """Wait (bounded) until the server has ended every connection in ``sockets``."""

    def open_ones() -> int:
        return sum(tcp_state(sock) == TCP_ESTABLISHED for sock in sockets)

    deadline = time.monotonic() + timeout
    while open_ones() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert open_ones() == 0, f"{open_ones()} of {len(sockets)} stalled connections still open"


async def read_sse(url: str) -> list[Event]:
    events: list[Event] = []
    async with (
        httpx.AsyncClient(timeout=httpx.Timeout(30.0)) as client,
        sse_connect(client, "GET", url) as stream,
    ):
        async for event in stream:
            events.append(event)
    return events


async def read_ws(url: str) -> list[Event]:
    events: list[Event] = []
    async with ws_connect(url, max_size=None) as websocket:
        try:
            while True:
                events.append(decode_frame(await websocket.recv()))
        except ConnectionClosedOK:
            pass
    return events


def assert_whole_turn(events: list[Event]) -> None:
    """Every delta exactly once and in order, every id once, and a valid protocol."""
    assert check(events) == []
    deltas = [e for e in events if e.event == EventType.CONTENT_BLOCK_DELTA]
    texts = [e.json()["delta"]["text"] for e in deltas]
    assert len(texts) == DELTAS
    assert texts == [delta_text(index, DELTA_SIZE) for index in range(DELTAS)]
    ids = [e.id for e in events]
    assert None not in ids
    assert len(set(ids)) == len(ids)
    assert events[-1].event == EventType.MESSAGE_STOP


# -- the server's figures ---------------------------------------------------------------


@dataclass
class RssSampler:
    """Polls the server's debug route in a thread and keeps the largest RSS seen."""

    server: LoadServer
    peak: int = 0
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> RssSampler:
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
        self.sample()

    def sample(self) -> None:
        self.peak = max(self.peak, self.server.debug()["rss"])
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.sample()


@dataclass
class Case:
    transport: str
    stream_id: str
    request: Callable[[str], bytes]
    status: bytes
    url: Callable[[LoadServer, str], str]
    read: Callable[[str], Any]
    warning: str


CASES: Final = [
    Case(
        "sse",
        "stalled-sse",
        sse_request,
        b"HTTP/1.1 200",
        lambda server, stream_id: f"{server.url}/streams/{stream_id}",
        read_sse,
        "WARNING:essessey.sse:a send stalled for more than",
    ),
    Case(
        "websocket",
        "stalled-ws",
        ws_request,
        b"HTTP/1.1 101",
        lambda server, stream_id: f"{server.ws_url}/streams/{stream_id}/ws",
        read_ws,
        "WARNING:essessey.ws:a WebSocket send stalled for more than",
    ),
]


@pytest.fixture
def server() -> Iterator[LoadServer]:
    env = {
        "LOAD_SEND_TIMEOUT": str(SEND_TIMEOUT),
        "LOAD_MAX_QUEUE": str(MAX_QUEUE),
        # Far above the turn: it is the send timeout, not the lag policy, that must end
        # the stalled clients (a response whose queue is full pulls nothing more from its
        # subscription, so the lag policy never sees it anyway; this keeps a stalled
        # client that is still being written to from being ended for lag first).
        "LOAD_MAX_LAG": "1000000",
        "LOAD_SNDBUF": str(SNDBUF),
        "LOAD_PING_INTERVAL": "15",
    }
    with load_server(**env) as started:
        yield started


@pytest.mark.parametrize("case", CASES, ids=[case.transport for case in CASES])
def test_stalled_clients_are_reset_and_the_healthy_one_gets_every_event(
    server: LoadServer, case: Case
) -> None:
    before = server.settle(SETTLE_TIMEOUT)
    # The producer publishes the preamble, then waits for every client before the deltas.
    server.start_turn(
        case.stream_id,
        deltas=DELTAS,
        size=DELTA_SIZE,
        every=200,
        pause=0.002,
        wait_for=STALLED + 1,
        wait_timeout=60,
    )
    request = case.request(case.stream_id)

    def attach() -> socket.socket:
        return stalled_client(server.port, request, case.status)

    with RssSampler(server) as rss, stalled_clients(STALLED, attach) as sockets:
        attached = server.debug()
        assert attached["subscribers"] == STALLED

        async def healthy() -> list[Event]:
            with anyio.fail_after(TURN_TIMEOUT):
                result: list[Event] = await case.read(case.url(server, case.stream_id))
                return result

        events = anyio.run(healthy)
        assert_whole_turn(events)
        wait_until_all_ended(sockets, END_TIMEOUT)
        # The server's side of every stalled connection is gone while the clients still
        # hold theirs open: no socket, task or subscription is left behind.
        after = server.wait_until(
            lambda f: (
                f["tasks"] == before["tasks"]
                and f["fds"] == before["fds"]
                and f["subscribers"] == 0
                and f["running"] == 0
            ),
            SETTLE_TIMEOUT,
        )
    log = server.log()
    stall_lines = [line for line in log.splitlines() if line.startswith(case.warning)]
    growth = rss.peak - before["rss"]
    print(
        f"\n{case.transport}: {STALLED} stalled clients ended, {len(stall_lines)} stall "
        f"warnings; healthy client got {len(events)} events; tasks {before['tasks']} -> "
        f"{attached['tasks']} (attached) -> {after['tasks']}; fds {before['fds']} -> "
        f"{attached['fds']} -> {after['fds']}; RSS {before['rss'] / 2**20:.1f} MiB, peak "
        f"{rss.peak / 2**20:.1f} MiB (+{growth / 2**20:.1f} MiB over {rss.samples} samples, "
        f"bound +{rss_bound() / 2**20:.1f} MiB), after {after['rss'] / 2**20:.1f} MiB"
    )
    assert len(stall_lines) == STALLED, log[-2000:]
    errors = [line for line in log.splitlines() if line.startswith("ERROR")]
    assert errors == [], errors[:5]
    assert growth < rss_bound()
