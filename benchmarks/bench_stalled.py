"""What stalled clients cost a healthy one: its delivery rate with 0, 50 and 200 clients
that stopped reading, over SSE and over WebSocket, measured two ways.

Run ``python benchmarks/bench_stalled.py [--events N] [--steady-events M] [--stalled
0,50,200] [--repeat R] [--sndbuf BYTES] [--json]``. One uvicorn server process on loopback
serves a StreamHub over SSE (``hub_routes``) and WebSocket (``ws_route``), library
defaults but a send timeout (SEND_TIMEOUT) longer than any run. The healthy client reads
every event (httpx for SSE, the ``websockets`` client for WebSocket) and is timed from
its request to its last event. A stalled client is a raw socket with a small receive
buffer that sends the request, reads the response headers and stops reading.

Burst rows (``--events N``, 0 for none): each run starts a turn of N text deltas on a new
stream; its producer publishes the preamble, waits until the other clients and the
healthy one follow the stream, then publishes the deltas as fast as it can. The others
are stalled clients or, in the rival rows, raw sockets that a thread drains as fast as
the server sends: the healthy client is timed while the server is still feeding the
others, so these rows mostly show what many clients on a stream cost.

Steady-state rows (``--steady-events M``, 0 for none): each run first attaches the
stalled clients to a held stream (a turn that publishes a fill of large deltas, more than
their buffers hold, and then waits, still running) and waits until no byte has moved on
any of their connections for a second while the server idles, checked in
``/proc/net/tcp``: the server's send queue for each and the client's unread bytes. Only
then is the healthy client timed, reading M deltas either of a new turn on another
stream or of the held stream itself, from the fill's last event id (resumed there, once
it follows the stream). Afterwards the script checks that no byte moved on the stalled
connections and that they are all still attached.

Rows and transports are interleaved, the best of R runs counts, and each is reported as a
ratio to the healthy client with no other client. See benchmarks/README.md for how to
read the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import ctypes
import gc
import os
import platform
import selectors
import socket
import struct
import sys
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Any

import anyio
import httpx
import uvicorn
from _cli import add_json_option, json_only, parse_counts, write_json
from _server import ServerProcess
from anyio.streams.memory import MemoryObjectSendStream
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosedOK

import essessey
from essessey.bindings.sse import connect as sse_connect
from essessey.bindings.sse import hub_routes
from essessey.bindings.ws import decode_frame, ws_route

SSE = "sse"
WS = "websocket"
TRANSPORTS = [SSE, WS]
LABELS = {SSE: "SSE (hub_routes)", WS: "WebSocket (ws_route)"}
NONE = "none"
STALLED = "stalled"
READING = "reading"
MODES = [NONE, STALLED, READING]

STARTUP_TIMEOUT = 30.0
RUN_TIMEOUT = 300.0
ATTACH_TIMEOUT = 10.0
SETTLE_TIMEOUT = 60.0
CLIENT_RCVBUF = 4096
DELTA_SIZE = 100
# Far above any turn here: the stalled clients stay attached for the whole run (the
# test suite checks that they are ended after the send timeout).
SEND_TIMEOUT = 120.0
MAX_LAG = 10_000_000
# The steady-state rows: the stalled clients are attached to a held stream (a turn that
# publishes fill_events() text deltas of FILL_SIZE characters, then waits, still running) and
# left until nothing moves, and only then is the healthy client timed.
OTHER = "other stream"
SAME = "same stream"
VARIANTS = [OTHER, SAME]
FILL_SIZE = 4_000
MAX_QUEUE = 1024  # the SSE and WebSocket default: events a subscription queues
APP_BUFFERS = 2**20  # above one SSE batch (256 KiB) plus uvicorn's write buffer (64 KiB)
STALL_POLL = 0.2
STALL_QUIET = 1.0  # seconds with no byte moving on any stalled connection
IDLE_CPU = 0.05  # and the server using at most this share of a core meanwhile
STALL_TIMEOUT = 90.0  # well below SEND_TIMEOUT: the stalled clients outlive the rows
ESTABLISHED = "01"  # the TCP state in /proc/net/tcp
WARM_UP = 2_000  # deltas of an untimed read before the timed ones


# -- the server side -------------------------------------------------------------------


def rss_bytes() -> int:
    """This process's resident memory, from ``/proc/self/statm`` (Linux)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def release_free_memory() -> None:
    """Give the memory malloc holds free back to the system (glibc's ``malloc_trim``;
    nothing elsewhere), so that RSS shows what is in use, not what earlier rows left."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)


@dataclass
class Held:
    """A held stream's requests (deltas, subscribers to wait for) and its fill's end."""

    requests: MemoryObjectSendStream[tuple[int, int]]
    filled: anyio.Event = field(default_factory=anyio.Event)


def build_app(capacity: int) -> Starlette:
    store = essessey.InMemoryEventStore(max_events_per_stream=capacity)
    hub = essessey.StreamHub(store, max_lag=MAX_LAG)
    streams: set[str] = set()
    held: dict[str, Held] = {}

    async def wait_for_subscribers(stream_id: str, count: int) -> None:
        with anyio.move_on_after(ATTACH_TIMEOUT * 10):
            while hub.subscriber_count(stream_id) < count:  # noqa: ASYNC110
                await anyio.sleep(0.005)

    async def start_turn(request: Request) -> Response:
        stream_id = request.path_params["stream_id"]
        deltas = int(request.query_params["deltas"])
        wait_for = int(request.query_params["wait_for"])
        chunk = "x" * DELTA_SIZE

        async def produce(publisher: essessey.Publisher) -> None:
            await publisher.send_stream_preamble(f"msg_{stream_id}", stream_id, "bench")
            await wait_for_subscribers(stream_id, wait_for)
            await publisher.send_content_block_start_text(0)
            send_delta = publisher.send_content_block_delta_text
            for _ in range(deltas):
                await send_delta(0, chunk)
            await publisher.send_content_block_stop(0)
            await publisher.send_stream_epilogue(essessey.StopReason.END_TURN, deltas)

        streams.add(stream_id)
        await hub.start(stream_id, produce)
        return Response(status_code=202)

    async def start_held(request: Request) -> Response:
        """A turn that publishes ``fill`` deltas of ``size`` characters (answered once it
        has), then, for each ``go``, ``deltas`` deltas of DELTA_SIZE characters once
        ``wait_for`` subscribers follow it; it runs until cancelled."""
        stream_id = request.path_params["stream_id"]
        fill = int(request.query_params["fill"])
        size = int(request.query_params["size"])
        sender, receiver = anyio.create_memory_object_stream[tuple[int, int]](16)
        state = held[stream_id] = Held(sender)

        async def produce(publisher: essessey.Publisher) -> None:
            with receiver:
                await publisher.send_stream_preamble(f"msg_{stream_id}", stream_id, "bench")
                await publisher.send_content_block_start_text(0)
                send_delta = publisher.send_content_block_delta_text
                filler = "y" * size
                for _ in range(fill):
                    await send_delta(0, filler)
                state.filled.set()
                chunk = "x" * DELTA_SIZE
                async for deltas, count in receiver:
                    await wait_for_subscribers(stream_id, count)
                    for _ in range(deltas):
                        await send_delta(0, chunk)

        await hub.start(stream_id, produce)
        await state.filled.wait()
        return Response(status_code=202)

    async def go(request: Request) -> Response:
        """Ask a held stream for ``deltas`` more; returns the id they follow (``mark``)."""
        stream_id = request.path_params["stream_id"]
        state = held[stream_id]
        await state.filled.wait()
        events, _ = await store.since(stream_id, None)
        state.requests.send_nowait(
            (int(request.query_params["deltas"]), int(request.query_params["wait_for"]))
        )
        return JSONResponse({"mark": events[-1].id})

    async def held_status(request: Request) -> Response:
        stream_id = request.path_params["stream_id"]
        return JSONResponse(
            {"subscribers": hub.subscriber_count(stream_id), "running": hub.running(stream_id)}
        )

    async def end_held(request: Request) -> Response:
        stream_id = request.path_params["stream_id"]
        await hub.cancel(stream_id)
        await hub.wait(stream_id)
        held.pop(stream_id).requests.close()
        return Response(status_code=204)

    async def clear(request: Request) -> Response:
        # Each run's turn is dropped once its clients are gone, so the RSS figures show
        # what the clients hold, not the store filling up with earlier runs.
        stream_id = request.path_params["stream_id"]
        streams.discard(stream_id)
        await store.clear(stream_id)
        return Response(status_code=204)

    async def debug(request: Request) -> Response:
        gc.collect()
        if request.query_params.get("trim") == "1":
            release_free_memory()
        return JSONResponse(
            {
                "rss": rss_bytes(),
                "tasks": len(asyncio.all_tasks()),
                "subscribers": sum(hub.subscriber_count(s) for s in streams),
            }
        )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with hub:
            yield

    options: dict[str, Any] = {"send_timeout": SEND_TIMEOUT}
    routes = [
        *hub_routes(hub, **options),
        ws_route(hub, **options),
        Route("/turns/{stream_id}", start_turn, methods=["POST"]),
        Route("/turns/{stream_id}/clear", clear, methods=["POST"]),
        Route("/held/{stream_id}", start_held, methods=["POST"]),
        Route("/held/{stream_id}", held_status),
        Route("/held/{stream_id}/go", go, methods=["POST"]),
        Route("/held/{stream_id}/end", end_held, methods=["POST"]),
        Route("/debug", debug),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def serve(port: int, capacity: int, sndbuf: int) -> int:
    """The server process: uvicorn on 127.0.0.1:port until its stdin closes."""
    # IPPROTO_TCP, not 0: the accepted sockets inherit it, and asyncio turns Nagle's
    # algorithm off (TCP_NODELAY, as uvicorn's own sockets have) only on sockets that say
    # TCP. With it on, a response's last small write waited for the client's delayed ACK
    # (40 ms) on some runs.
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if sndbuf:
        # Inherited by the accepted connections; a fixed size turns autotuning off.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    listener.bind(("127.0.0.1", port))
    listener.listen(2048)
    config = uvicorn.Config(build_app(capacity), log_level="warning", lifespan="on")
    server = uvicorn.Server(config)

    def stop_when_stdin_closes() -> None:
        sys.stdin.buffer.read()
        server.should_exit = True

    # As benchmarks/_server.py does, on a socket made here (for --sndbuf).
    threading.Thread(target=stop_when_stdin_closes, daemon=True).start()
    with suppress(KeyboardInterrupt):
        server.run(sockets=[listener])
    return 0


# -- the client side -------------------------------------------------------------------


def request_bytes(transport: str, stream_id: str) -> bytes:
    if transport == SSE:
        return (
            f"GET /streams/{stream_id} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            "Accept: text/event-stream\r\n\r\n"
        ).encode()
    key = base64.b64encode(os.urandom(16)).decode()
    return (
        f"GET /streams/{stream_id}/ws HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode()


def stalled_client(port: int, request: bytes) -> socket.socket:
    """A socket that sent ``request``, read the response headers and reads no more."""
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
                raise RuntimeError("the server closed a stalled client before its headers")
            received += chunk
        if not received.startswith((b"HTTP/1.1 200", b"HTTP/1.1 101")):
            raise RuntimeError(f"a stalled client was refused: {received[:60]!r}")
    except BaseException:
        sock.close()
        raise
    return sock


def reading_client(port: int, request: bytes) -> socket.socket:
    """A socket (default buffers) that sent ``request``; a Drainer reads it."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=ATTACH_TIMEOUT)
    sock.sendall(request)
    sock.setblocking(False)
    return sock


class Drainer:
    """Reads and discards everything ``sockets`` receive, in a thread, until each ends
    or ``stop`` is called: clients that keep up, for the rival rows."""

    def __init__(self, sockets: list[socket.socket]) -> None:
        self._selector = selectors.DefaultSelector()
        for sock in sockets:
            self._selector.register(sock, selectors.EVENT_READ)
        self._open = len(sockets)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="drainer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        buffer = bytearray(256 * 1024)
        while self._open and not self._stopping.is_set():
            for key, _ in self._selector.select(timeout=0.1):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    ended = sock.recv_into(buffer) == 0
                except BlockingIOError:
                    continue
                except OSError:
                    ended = True
                if ended:
                    self._selector.unregister(sock)
                    self._open -= 1

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=30)
        self._selector.close()


def drop(sockets: list[socket.socket]) -> None:
    for sock in sockets:
        # A reset: the server sees the client gone at once, whatever it had buffered.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()


async def read_sse_counting(client: httpx.AsyncClient, url: str, limit: int = 0) -> int:
    """Read one whole SSE stream, or its first ``limit`` events; return the number of
    events (frame ends counted, so the client's CPU stays out of the server's way)."""
    frames = 0
    tail = b""
    async with client.stream("GET", url) as response:
        response.raise_for_status()
        async for chunk in response.aiter_raw():
            frames += chunk.count(b"\n\n") + (tail + chunk[:1]).count(b"\n\n")
            tail = chunk[-1:]
            if limit and frames >= limit:
                break
    return frames


async def read_ws_counting(url: str, limit: int = 0) -> int:
    frames = 0
    async with ws_connect(url, max_size=None) as websocket:
        try:
            while frames != limit or not limit:
                await websocket.recv()
                frames += 1
        except ConnectionClosedOK:
            pass
    return frames


def tcp_table() -> dict[tuple[int, int], tuple[str, int, int]]:
    """Every IPv4 TCP socket of this host, from ``/proc/net/tcp`` (Linux): (local port,
    remote port) -> (state, bytes in its send queue, bytes received and not yet read)."""
    table: dict[tuple[int, int], tuple[str, int, int]] = {}
    with open("/proc/net/tcp") as proc:
        next(proc)
        for line in proc:
            fields = line.split()
            local = int(fields[1].rsplit(":", 1)[1], 16)
            remote = int(fields[2].rsplit(":", 1)[1], 16)
            sent, unread = (int(value, 16) for value in fields[4].split(":"))
            table[(local, remote)] = (fields[3], sent, unread)
    return table


def connection_queues(server_port: int, client_ports: list[int]) -> list[tuple[int, int]]:
    """For each stalled client: the bytes in the server's send queue for it and the bytes
    it has not read. Raises if a connection is no longer established on both sides."""
    table = tcp_table()
    queues = []
    for port in client_ports:
        server_side = table.get((server_port, port))
        client_side = table.get((port, server_port))
        if server_side is None or client_side is None:
            raise SystemExit(f"the stalled connection from port {port} is gone")
        if server_side[0] != ESTABLISHED or client_side[0] != ESTABLISHED:
            raise SystemExit(f"the stalled connection from port {port} is closing")
        queues.append((server_side[1], client_side[2]))
    return queues


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system) process ``pid`` has used, from ``/proc`` (Linux)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_of(pid: int) -> int:
    """The resident memory of process ``pid``, read from ``/proc`` (nothing asked of it)."""
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def kernel_send_buffer(sndbuf: int) -> int:
    """The most a server connection's kernel send buffer can hold: twice ``sndbuf`` when
    it is fixed (Linux doubles it), else ``net.ipv4.tcp_wmem``'s maximum (autotuning)."""
    if sndbuf:
        return 2 * sndbuf
    try:
        with open("/proc/sys/net/ipv4/tcp_wmem") as wmem:
            return int(wmem.read().split()[2])
    except (OSError, ValueError, IndexError):
        return 4 * 2**20


def fill_events(sndbuf: int) -> int:
    """Fill deltas that are sure to stall a client: the subscription's queue, then twice
    what the kernel and the app's buffers can hold."""
    room = kernel_send_buffer(sndbuf) + APP_BUFFERS
    return MAX_QUEUE + 2 * -(-room // FILL_SIZE)


@dataclass
class Stall:
    """How a set of stalled clients came to a stop, and what moved afterwards."""

    seconds: float  # from the first one's request until no byte moved on any of them
    queues: list[tuple[int, int]]  # per connection: server send queue, client unread
    accepted: int = 0  # bytes that moved on them during the measurements (0: none)
    held: int = 0  # the server's RSS, trimmed, over what it was before they attached


async def wait_until_stalled(
    pid: int, server_port: int, ports: list[int], fill: int, start: float
) -> Stall:
    """Poll until no byte moves on any of the stalled connections for STALL_QUIET
    seconds while the server process idles (below IDLE_CPU of a core), then check that
    each connection holds less than its fill's text: the server has the rest, waiting for
    room. Bounded by STALL_TIMEOUT."""
    last: list[tuple[int, int]] | None = None
    since = start
    cpu_since = cpu_seconds(pid)
    with anyio.fail_after(STALL_TIMEOUT):
        while True:
            await anyio.sleep(STALL_POLL)
            queues = connection_queues(server_port, ports)
            now = time.monotonic()
            cpu = cpu_seconds(pid)
            if queues != last:
                last, since, cpu_since = queues, now, cpu
            elif now - since >= STALL_QUIET:
                if (cpu - cpu_since) / (now - since) <= IDLE_CPU:
                    break
                cpu_since, since = cpu, now  # still busy (queues filling): again
    assert last is not None
    stall = Stall(seconds=since - start, queues=last)
    most = max(sent + unread for sent, unread in last)
    if most >= fill * FILL_SIZE:
        raise SystemExit(
            f"a connection took {most:,} bytes, the whole fill: it is not stalled (raise "
            "FILL_SIZE or APP_BUFFERS)"
        )
    return stall


async def debug(client: httpx.AsyncClient, base: str, trim: bool = False) -> dict[str, int]:
    response = await client.get(f"{base}/debug", params={"trim": 1} if trim else None)
    response.raise_for_status()
    figures: dict[str, int] = response.json()
    return figures


async def settle(client: httpx.AsyncClient, base: str, quiet: float = 0.0) -> dict[str, int]:
    """The server's figures once no client follows a stream (and, with ``quiet``, its
    task count has not changed for that many seconds)."""
    with anyio.fail_after(SETTLE_TIMEOUT):
        last: dict[str, int] | None = None
        since = time.monotonic()
        while True:
            figures = await debug(client, base)
            now = time.monotonic()
            if last is None or figures["tasks"] != last["tasks"]:
                last, since = figures, now
            if figures["subscribers"] == 0 and now - since >= quiet:
                return figures
            await anyio.sleep(0.05)


@dataclass
class Timed:
    """One timed read by the healthy client."""

    seconds: float  # from its request to its last event
    cpu: float  # the server's CPU time meanwhile
    rss: int  # the server's resident memory just after its last event


@dataclass
class Steady:
    """One steady-state run: the stalled clients, then the healthy client's reads."""

    stall: Stall | None
    rss_before: int  # the server's RSS before the stalled clients attached
    timed: dict[str, Timed]  # by variant


class Runner:
    def __init__(self, server: ServerProcess, deltas: int, steady: int, fill: int) -> None:
        self.server = server
        self.deltas = deltas
        self.expected = deltas + 6
        self.steady = steady
        self.fill = fill
        self.counter = 0

    def stream_id(self) -> str:
        self.counter += 1
        return f"bench-{self.counter}"

    async def start(
        self, client: httpx.AsyncClient, stream_id: str, wait_for: int, deltas: int = 0
    ) -> None:
        response = await client.post(
            f"{self.server.http_url}/turns/{stream_id}",
            params={"deltas": deltas or self.deltas, "wait_for": wait_for},
        )
        if response.status_code != 202:
            raise SystemExit(f"starting a turn: HTTP {response.status_code}")

    async def verify(self, client: httpx.AsyncClient) -> None:
        """Before timing: both transports deliver the whole turn, valid, ids in order."""
        deltas = self.deltas or self.steady
        for transport in TRANSPORTS:
            stream_id = self.stream_id()
            await self.start(client, stream_id, 1, deltas)
            events: list[essessey.Event] = []
            if transport == SSE:
                url = f"{self.server.http_url}/streams/{stream_id}"
                async with sse_connect(client, "GET", url) as stream:
                    events = [event async for event in stream]
            else:
                url = f"{self.server.ws_url}/streams/{stream_id}/ws"
                async with ws_connect(url, max_size=None) as websocket:
                    try:
                        while True:
                            events.append(decode_frame(await websocket.recv()))
                    except ConnectionClosedOK:
                        pass
            problems = essessey.check(events)
            ids = [event.id for event in events]
            if len(events) != deltas + 6 or problems or len(set(ids)) != len(ids):
                raise SystemExit(f"{transport}: {len(events)} events, problems {problems[:3]}")
            if self.steady:
                await self.verify_held(client, transport)

    async def verify_held(self, client: httpx.AsyncClient, transport: str) -> None:
        """Before timing: read from a held stream's mark, the healthy client gets exactly
        the deltas asked for after it, and nothing of the fill."""
        held_id, deltas = self.stream_id(), 50
        await self.post(client, f"/held/{held_id}", fill=3, size=FILL_SIZE)
        response = await self.post(client, f"/held/{held_id}/go", deltas=deltas, wait_for=1)
        url = self.url(transport, held_id, f"?last_event_id={response.json()['mark']}")
        events: list[essessey.Event] = []
        if transport == SSE:
            async with sse_connect(client, "GET", url) as stream:
                async for event in stream:
                    events.append(event)
                    if len(events) == deltas:
                        break
        else:
            async with ws_connect(url, max_size=None) as websocket:
                while len(events) < deltas:
                    events.append(decode_frame(await websocket.recv()))
        chunk = "x" * DELTA_SIZE
        if len({event.id for event in events}) != deltas or any(
            event.event != "content_block_delta" or event.json()["delta"]["text"] != chunk
            for event in events
        ):
            raise SystemExit(f"{transport}: reading from the mark gave other events")
        await self.wait_for_held(client, held_id, 0)
        await self.post(client, f"/held/{held_id}/end")
        await client.post(f"{self.server.http_url}/turns/{held_id}/clear")

    async def run(
        self, client: httpx.AsyncClient, transport: str, mode: str, count: int
    ) -> tuple[float, int]:
        """One run: ``count`` other clients (``mode``: stalled or reading) and the healthy
        one on a new stream. Returns the healthy client's time to its last event and the
        server's RSS just after it, the other clients still attached."""
        stream_id = self.stream_id()
        await self.start(client, stream_id, count + 1)
        request = request_bytes(transport, stream_id)
        attach = stalled_client if mode == STALLED else reading_client
        sockets: list[socket.socket] = []
        drainer: Drainer | None = None
        try:
            for _ in range(count):
                sockets.append(await anyio.to_thread.run_sync(attach, self.server.port, request))
            if mode == READING:
                drainer = Drainer(sockets)
            gc.collect()
            start = time.perf_counter()
            if transport == SSE:
                url = f"{self.server.http_url}/streams/{stream_id}"
                received = await read_sse_counting(client, url)
            else:
                received = await read_ws_counting(f"{self.server.ws_url}/streams/{stream_id}/ws")
            elapsed = time.perf_counter() - start
            if received != self.expected:
                raise SystemExit(f"{transport}: {received} events, {self.expected} expected")
            rss = (await debug(client, self.server.http_url))["rss"]
        finally:
            if drainer is not None:
                drainer.stop()
            drop(sockets)
        await settle(client, self.server.http_url)
        await client.post(f"{self.server.http_url}/turns/{stream_id}/clear")
        return elapsed, rss

    # -- steady state ------------------------------------------------------------------

    async def post(self, client: httpx.AsyncClient, path: str, **params: int) -> httpx.Response:
        response = await client.post(f"{self.server.http_url}{path}", params=params)
        if response.is_error:
            raise SystemExit(f"POST {path}: HTTP {response.status_code}")
        return response

    async def held_subscribers(self, client: httpx.AsyncClient, stream_id: str) -> int:
        response = await client.get(f"{self.server.http_url}/held/{stream_id}")
        response.raise_for_status()
        count: int = response.json()["subscribers"]
        return count

    async def wait_for_held(self, client: httpx.AsyncClient, stream_id: str, count: int) -> None:
        """Until the held stream has exactly ``count`` subscribers (bounded)."""
        with anyio.fail_after(SETTLE_TIMEOUT):
            while (found := await self.held_subscribers(client, stream_id)) != count:
                if found < count:
                    raise SystemExit(f"{stream_id}: {found} subscribers, {count} expected")
                await anyio.sleep(0.02)

    def url(self, transport: str, stream_id: str, query: str = "") -> str:
        if transport == SSE:
            return f"{self.server.http_url}/streams/{stream_id}{query}"
        return f"{self.server.ws_url}/streams/{stream_id}/ws{query}"

    async def timed_read(
        self,
        client: httpx.AsyncClient,
        transport: str,
        stream_id: str,
        query: str,
        expected: int,
        limit: int,
    ) -> Timed:
        """The healthy client reads the stream (all of it, or its first ``limit`` events),
        timed from its request to its last event."""
        pid = self.server.process.pid
        url = self.url(transport, stream_id, query)
        gc.collect()
        cpu = cpu_seconds(pid)
        start = time.perf_counter()
        if transport == SSE:
            received = await read_sse_counting(client, url, limit)
        else:
            received = await read_ws_counting(url, limit)
        seconds = time.perf_counter() - start
        timed = Timed(seconds, cpu_seconds(pid) - cpu, rss_of(pid))
        if received != expected:
            raise SystemExit(f"{transport}: {received} events, {expected} expected")
        return timed

    async def read_other(self, client: httpx.AsyncClient, transport: str, deltas: int = 0) -> Timed:
        """Variant OTHER: a turn of ``steady`` (or ``deltas``) deltas on a new stream,
        read whole."""
        deltas = deltas or self.steady
        stream_id = self.stream_id()
        await self.start(client, stream_id, 1, deltas)
        timed = await self.timed_read(client, transport, stream_id, "", deltas + 6, 0)
        await settle(client, self.server.http_url)
        await client.post(f"{self.server.http_url}/turns/{stream_id}/clear")
        return timed

    async def read_same(
        self, client: httpx.AsyncClient, transport: str, held_id: str, count: int
    ) -> Timed:
        """Variant SAME: ``steady`` more deltas on the held stream, read from where the
        fill ends (its last event id), once the healthy client follows it."""
        response = await self.post(
            client, f"/held/{held_id}/go", deltas=self.steady, wait_for=count + 1
        )
        query = f"?last_event_id={response.json()['mark']}"
        timed = await self.timed_read(client, transport, held_id, query, self.steady, self.steady)
        await self.wait_for_held(client, held_id, count)
        return timed

    async def run_steady(
        self, client: httpx.AsyncClient, transport: str, count: int, order: list[str]
    ) -> Steady:
        """``count`` stalled clients on a held stream, waited for until nothing moves on
        their connections; then the healthy client's reads (``order``); then a check
        that they took nothing meanwhile and are all still attached."""
        pid, port = self.server.process.pid, self.server.port
        held_id = self.stream_id()
        await self.post(client, f"/held/{held_id}", fill=self.fill, size=FILL_SIZE)
        trimmed = (await debug(client, self.server.http_url, trim=True))["rss"]
        rss_before = rss_of(pid)
        request = request_bytes(transport, held_id)
        sockets: list[socket.socket] = []
        stall: Stall | None = None
        timed: dict[str, Timed] = {}
        try:
            start = time.monotonic()
            for _ in range(count):
                sockets.append(await anyio.to_thread.run_sync(stalled_client, port, request))
            ports = [sock.getsockname()[1] for sock in sockets]
            if count:
                stall = await wait_until_stalled(pid, port, ports, self.fill, start)
            rss = (await debug(client, self.server.http_url, trim=True))["rss"]
            if stall is not None:
                stall.held = rss - trimmed
            # Untimed: the first read after the trim would pay for the pages it gave back.
            await self.read_other(client, transport, WARM_UP)
            for variant in order:
                if variant == OTHER:
                    timed[variant] = await self.read_other(client, transport)
                else:
                    timed[variant] = await self.read_same(client, transport, held_id, count)
            await self.wait_for_held(client, held_id, count)
            if stall is not None:
                after = connection_queues(port, ports)
                stall.accepted = sum(
                    abs(sent - sent_then) + abs(unread - unread_then)
                    for (sent, unread), (sent_then, unread_then) in zip(
                        after, stall.queues, strict=True
                    )
                )
        finally:
            drop(sockets)
        await self.post(client, f"/held/{held_id}/end")
        await self.wait_for_held(client, held_id, 0)
        await client.post(f"{self.server.http_url}/turns/{held_id}/clear")
        return Steady(stall, rss_before, timed)


async def measure(
    server: ServerProcess,
    deltas: int,
    steady: int,
    counts: list[int],
    repeat: int,
    sndbuf: int,
) -> dict[str, Any]:
    runner = Runner(server, deltas, steady, fill_events(sndbuf))
    limits = httpx.Limits(max_connections=4)
    async with httpx.AsyncClient(timeout=RUN_TIMEOUT, limits=limits) as client:
        await runner.verify(client)
        before = await settle(client, server.http_url, quiet=1.0)
        rows = [(NONE, 0)] + [(mode, n) for n in counts if n for mode in (STALLED, READING)]
        if not deltas:
            rows = []
        steady_counts = sorted({0, *counts}) if steady else []
        best: dict[tuple[str, str, int], float] = {}
        peak_rss = before["rss"]
        best_steady: dict[tuple[str, str, int], Timed] = {}
        all_steady: dict[tuple[str, str, int], list[float]] = {}
        peak_steady: dict[tuple[str, str, int], tuple[int, int]] = {}  # RSS, added
        stalls: dict[tuple[str, int], list[Stall]] = {}
        for round_index in range(repeat):
            # Interleaved: a neighbour's burst lands on any row, not on one.
            for mode, count in rows:
                for transport in TRANSPORTS:
                    elapsed, rss = await runner.run(client, transport, mode, count)
                    key = (transport, mode, count)
                    best[key] = min(best.get(key, elapsed), elapsed)
                    peak_rss = max(peak_rss, rss)
            order = VARIANTS if round_index % 2 == 0 else VARIANTS[::-1]
            for count in steady_counts:
                for transport in TRANSPORTS:
                    run = await runner.run_steady(client, transport, count, order)
                    if run.stall is not None:
                        stalls.setdefault((transport, count), []).append(run.stall)
                    for variant, timed in run.timed.items():
                        key = (transport, variant, count)
                        all_steady.setdefault(key, []).append(timed.seconds)
                        if key not in best_steady or timed.seconds < best_steady[key].seconds:
                            best_steady[key] = timed
                        rss, added = peak_steady.get(key, (0, 0))
                        peak_steady[key] = (
                            max(rss, timed.rss),
                            max(added, timed.rss - run.rss_before),
                        )
        after = await settle(client, server.http_url, quiet=1.0)
    results = []
    for (transport, mode, count), seconds in best.items():
        base = best[(transport, NONE, 0)]
        results.append(
            {
                "transport": transport,
                "others": mode,
                "count": count,
                "best_seconds": seconds,
                "events_per_second": runner.expected / seconds,
                "ratio_to_alone": base / seconds,
            }
        )
    steady_results = []
    for (transport, variant, count), timed in best_steady.items():
        alone = best_steady[(transport, variant, 0)]
        rss, added = peak_steady[(transport, variant, count)]
        events = steady + 6 if variant == OTHER else steady
        steady_results.append(
            {
                "transport": transport,
                "healthy_reads": variant,
                "stalled": count,
                "events": events,
                "best_seconds": timed.seconds,
                "runs_seconds": all_steady[(transport, variant, count)],
                "events_per_second": events / timed.seconds,
                "ratio_to_none": alone.seconds / timed.seconds,
                "server_cpu_seconds": timed.cpu,
                "server_rss_during": rss,
                "server_rss_added": added,
            }
        )
    stall_results = [
        {
            "transport": transport,
            "stalled": count,
            "runs": len(runs),
            "seconds_to_stall_max": max(stall.seconds for stall in runs),
            "server_send_queue_mean": sum(q[0] for r in runs for q in r.queues)
            / sum(len(r.queues) for r in runs),
            "server_send_queue_min": min(q[0] for r in runs for q in r.queues),
            "client_unread_max": max(q[1] for r in runs for q in r.queues),
            "kernel_held_max": max(sum(q) for r in runs for q in r.queues),
            "fill_text_bytes": runner.fill * FILL_SIZE,
            "bytes_moved_during_measurements": sum(stall.accepted for stall in runs),
            "server_rss_held_per_client": max(stall.held for stall in runs) / count,
        }
        for (transport, count), runs in stalls.items()
    ]
    return {
        "deltas": deltas,
        "events_per_stream": runner.expected,
        "repeat": repeat,
        "server_sndbuf": sndbuf or "system (autotuned)",
        "python": platform.python_version(),
        "versions": {
            name: version(name)
            for name in ("essessey", "uvicorn", "h11", "httpx", "starlette", "websockets")
        },
        "cpus": os.cpu_count(),
        "server_rss_before": before["rss"],
        "server_rss_peak": peak_rss,
        "server_rss_after": after["rss"],
        "server_tasks_before": before["tasks"],
        "server_tasks_after": after["tasks"],
        "results": results,
        "steady": {
            "deltas": steady,
            "fill_deltas": runner.fill,
            "fill_size": FILL_SIZE,
            "results": steady_results,
            "stalls": stall_results,
        },
    }


def print_table(report: dict[str, Any]) -> None:
    versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items())
    print(
        f"best of {report['repeat']}, server send buffer {report['server_sndbuf']}, Python "
        f"{report['python']}, {report['cpus']} CPUs"
    )
    print(versions)
    if report["results"]:
        print_burst(report)
    if report["steady"]["results"]:
        print_steady(report["steady"])
    print()
    print(
        f"server RSS before the runs {report['server_rss_before'] / 2**20:.1f} MiB, after "
        f"them {report['server_rss_after'] / 2**20:.1f} MiB; tasks "
        f"{report['server_tasks_before']} -> {report['server_tasks_after']}"
    )


def print_burst(report: dict[str, Any]) -> None:
    print()
    print(
        f"Burst: the other clients attach with the healthy one and are fed the same turn "
        f"of {report['events_per_stream']:,} events ({report['deltas']:,} deltas of "
        f"{DELTA_SIZE} characters)"
    )
    print(
        f"{'transport':<22} {'other clients':<13} {'events/s':>11} {'last event s':>12} "
        f"{'x alone':>7}"
    )
    for row in sorted(
        report["results"],
        key=lambda r: (TRANSPORTS.index(r["transport"]), r["count"], MODES.index(r["others"])),
    ):
        others = "none" if not row["count"] else f"{row['count']} {row['others']}"
        print(
            f"{LABELS[row['transport']]:<22} {others:<13} "
            f"{row['events_per_second']:>11,.0f} {row['best_seconds']:>12.3f} "
            f"{row['ratio_to_alone']:>7.2f}"
        )
    print(
        f"server RSS peak {report['server_rss_peak'] / 2**20:.1f} MiB (just after a healthy "
        f"client's last event, the other clients attached)"
    )


def print_steady(steady: dict[str, Any]) -> None:
    print()
    print(
        "Steady state: the stalled clients attach to a held stream first "
        f"({steady['fill_deltas']:,} deltas of {steady['fill_size']:,} characters) and are "
        "waited for until nothing moves; then the healthy client reads "
        f"{steady['deltas']:,} deltas of {DELTA_SIZE} characters"
    )
    print(
        f"{'transport':<22} {'stalled':>7} {'healthy reads':<13} {'events/s':>9} "
        f"{'last event s':>12} {'x none':>6} {'server CPU s':>12} {'RSS MiB':>8} {'+MiB':>6}"
    )
    for row in sorted(
        steady["results"],
        key=lambda r: (
            TRANSPORTS.index(r["transport"]),
            VARIANTS.index(r["healthy_reads"]),
            r["stalled"],
        ),
    ):
        print(
            f"{LABELS[row['transport']]:<22} {row['stalled']:>7} {row['healthy_reads']:<13} "
            f"{row['events_per_second']:>9,.0f} {row['best_seconds']:>12.3f} "
            f"{row['ratio_to_none']:>6.2f} {row['server_cpu_seconds']:>12.2f} "
            f"{row['server_rss_during'] / 2**20:>8.1f} {row['server_rss_added'] / 2**20:>6.1f}"
        )
    print(
        "(server CPU s: of the best run; RSS: the server's just after the healthy client's "
        "last event, the most of any run; +MiB: over its RSS before the stalled clients "
        "attached, free memory given back then)"
    )
    print()
    print(
        f"{'transport':<22} {'stalled':>7} {'s to stall':>10} {'send queue KiB':>14} "
        f"{'min KiB':>7} {'unread B':>8} {'in kernel / fill':>16} {'held KiB':>8} "
        f"{'moved during runs B':>19}"
    )
    for row in sorted(
        steady["stalls"], key=lambda r: (TRANSPORTS.index(r["transport"]), r["stalled"])
    ):
        share = row["kernel_held_max"] / row["fill_text_bytes"]
        print(
            f"{LABELS[row['transport']]:<22} {row['stalled']:>7} "
            f"{row['seconds_to_stall_max']:>10.1f} {row['server_send_queue_mean'] / 1024:>14,.0f} "
            f"{row['server_send_queue_min'] / 1024:>7,.0f} {row['client_unread_max']:>8,} "
            f"{share:>16.2f} {row['server_rss_held_per_client'] / 1024:>8,.0f} "
            f"{row['bytes_moved_during_measurements']:>19,}"
        )
    print(
        "(per stalled connection: the server's kernel send queue (mean, min) and the client's "
        "unread bytes once nothing moved; in kernel / fill: the most both held, over the "
        "fill's text; held: the server's RSS it added, free memory given back, the most of "
        "any run; moved: bytes taken by all of them during the healthy client's reads)"
    )


def parse_stall_counts(value: str) -> list[int]:
    return sorted(set(parse_counts(value, minimum=0, what="stall counts")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="A healthy client's delivery rate with stalled clients on the same stream."
    )
    parser.add_argument(
        "--events", type=int, default=5_000, help="text deltas per burst turn (0: no burst rows)"
    )
    parser.add_argument(
        "--steady-events",
        type=int,
        default=20_000,
        help="text deltas the healthy client reads in steady state (0: no steady rows)",
    )
    parser.add_argument(
        "--stalled",
        type=parse_stall_counts,
        default=[0, 50, 200],
        help="stall counts, e.g. 0,50,200",
    )
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per row")
    parser.add_argument(
        "--sndbuf",
        type=int,
        default=0,
        help="the server's kernel send buffer per connection, bytes (0: the system's)",
    )
    add_json_option(parser)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--capacity", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.events, args.steady_events, args.sndbuf) < 0 or args.repeat < 1:
        parser.error("--repeat must be at least 1, the others at least 0")
    if not args.events and not args.steady_events:
        parser.error("nothing to measure: --events and --steady-events are both 0")
    if args.serve:
        return serve(args.port, args.capacity, args.sndbuf)
    # A stream's events: a burst turn, or a held one's fill and one read after it.
    capacity = max(args.events, fill_events(args.sndbuf) + args.steady_events) + 64
    server = ServerProcess(
        __file__,
        ["--capacity", str(capacity), "--sndbuf", str(args.sndbuf)],
        startup_timeout=STARTUP_TIMEOUT,
    )
    try:
        server.wait_until_ready()
        report = asyncio.run(
            measure(server, args.events, args.steady_events, args.stalled, args.repeat, args.sndbuf)
        )
    finally:
        server.stop()
    if not json_only(args.json):
        print_table(report)
    if args.json:
        write_json(args.json, report, __file__)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
