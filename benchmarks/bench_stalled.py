"""What stalled clients cost a healthy one: its delivery rate with 0, 50 and 200 clients
that stopped reading attached to the same stream, over SSE and over WebSocket, next to
the same numbers of clients that read everything.

Run ``python benchmarks/bench_stalled.py [--events N] [--stalled 0,50,200] [--repeat R]
[--sndbuf BYTES] [--json]``. One uvicorn server process on loopback serves a StreamHub
over SSE (``hub_routes``) and WebSocket (``ws_route``), library defaults. Each run starts
a turn of N text deltas on a new stream; its producer publishes the preamble, waits until
the other clients and the healthy one follow the stream, then publishes the deltas as
fast as it can. A stalled client is a raw socket with a small receive buffer that sends
the request, reads the response headers and stops reading; a reading client (the rival
rows) is a raw socket that a thread drains as fast as the server sends. The healthy
client reads every event (httpx for SSE, the ``websockets`` client for WebSocket) and is
timed from its request to its last event. Rows and transports are interleaved, the best
of R runs counts, and each is reported as a ratio to the healthy client alone. See
benchmarks/README.md for how to read the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gc
import json
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
from importlib.metadata import version
from typing import Any

import anyio
import httpx
import uvicorn
from _server import ServerProcess
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


# -- the server side -------------------------------------------------------------------


def rss_bytes() -> int:
    """This process's resident memory, from ``/proc/self/statm`` (Linux)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def build_app(deltas_cap: int) -> Starlette:
    store = essessey.InMemoryEventStore(max_events_per_stream=deltas_cap + 16)
    hub = essessey.StreamHub(store, max_lag=MAX_LAG)
    streams: set[str] = set()

    async def start_turn(request: Request) -> Response:
        stream_id = request.path_params["stream_id"]
        deltas = int(request.query_params["deltas"])
        wait_for = int(request.query_params["wait_for"])
        chunk = "x" * DELTA_SIZE

        async def produce(publisher: essessey.Publisher) -> None:
            await publisher.send_stream_preamble(f"msg_{stream_id}", stream_id, "bench")
            with anyio.move_on_after(ATTACH_TIMEOUT * 10):
                while hub.subscriber_count(stream_id) < wait_for:  # noqa: ASYNC110
                    await anyio.sleep(0.005)
            await publisher.send_content_block_start_text(0)
            send_delta = publisher.send_content_block_delta_text
            for _ in range(deltas):
                await send_delta(0, chunk)
            await publisher.send_content_block_stop(0)
            await publisher.send_stream_epilogue(essessey.StopReason.END_TURN, deltas)

        streams.add(stream_id)
        await hub.start(stream_id, produce)
        return Response(status_code=202)

    async def clear(request: Request) -> Response:
        # Each run's turn is dropped once its clients are gone, so the RSS figures show
        # what the clients hold, not the store filling up with earlier runs.
        stream_id = request.path_params["stream_id"]
        streams.discard(stream_id)
        await store.clear(stream_id)
        return Response(status_code=204)

    async def debug(request: Request) -> Response:
        gc.collect()
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
        Route("/debug", debug),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def serve(port: int, deltas: int, sndbuf: int) -> int:
    """The server process: uvicorn on 127.0.0.1:port until its stdin closes."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if sndbuf:
        # Inherited by the accepted connections; a fixed size turns autotuning off.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    listener.bind(("127.0.0.1", port))
    listener.listen(2048)
    config = uvicorn.Config(build_app(deltas), log_level="warning", lifespan="on")
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


async def read_sse_counting(client: httpx.AsyncClient, url: str) -> int:
    """Read one whole SSE stream; return the number of events (frame ends counted, so
    the client's CPU stays out of the server's way)."""
    frames = 0
    tail = b""
    async with client.stream("GET", url) as response:
        response.raise_for_status()
        async for chunk in response.aiter_raw():
            frames += chunk.count(b"\n\n") + (tail + chunk[:1]).count(b"\n\n")
            tail = chunk[-1:]
    return frames


async def read_ws_counting(url: str) -> int:
    frames = 0
    async with ws_connect(url, max_size=None) as websocket:
        try:
            while True:
                await websocket.recv()
                frames += 1
        except ConnectionClosedOK:
            pass
    return frames


async def debug(client: httpx.AsyncClient, base: str) -> dict[str, int]:
    response = await client.get(f"{base}/debug")
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


class Runner:
    def __init__(self, server: ServerProcess, deltas: int) -> None:
        self.server = server
        self.deltas = deltas
        self.expected = deltas + 6
        self.counter = 0

    def stream_id(self) -> str:
        self.counter += 1
        return f"bench-{self.counter}"

    async def start(self, client: httpx.AsyncClient, stream_id: str, wait_for: int) -> None:
        response = await client.post(
            f"{self.server.http_url}/turns/{stream_id}",
            params={"deltas": self.deltas, "wait_for": wait_for},
        )
        if response.status_code != 202:
            raise SystemExit(f"starting a turn: HTTP {response.status_code}")

    async def verify(self, client: httpx.AsyncClient) -> None:
        """Before timing: both transports deliver the whole turn, valid, ids in order."""
        for transport in TRANSPORTS:
            stream_id = self.stream_id()
            await self.start(client, stream_id, 1)
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
            if len(events) != self.expected or problems or len(set(ids)) != len(ids):
                raise SystemExit(f"{transport}: {len(events)} events, problems {problems[:3]}")

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


async def measure(
    server: ServerProcess, deltas: int, counts: list[int], repeat: int, sndbuf: int
) -> dict[str, Any]:
    runner = Runner(server, deltas)
    limits = httpx.Limits(max_connections=4)
    async with httpx.AsyncClient(timeout=RUN_TIMEOUT, limits=limits) as client:
        await runner.verify(client)
        before = await settle(client, server.http_url, quiet=1.0)
        rows = [(NONE, 0)] + [(mode, n) for n in counts if n for mode in (STALLED, READING)]
        best: dict[tuple[str, str, int], float] = {}
        peak_rss = before["rss"]
        for _ in range(repeat):
            # Interleaved: a neighbour's burst lands on any row, not on one.
            for mode, count in rows:
                for transport in TRANSPORTS:
                    elapsed, rss = await runner.run(client, transport, mode, count)
                    key = (transport, mode, count)
                    best[key] = min(best.get(key, elapsed), elapsed)
                    peak_rss = max(peak_rss, rss)
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
    }


def print_table(report: dict[str, Any]) -> None:
    versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items())
    print(
        f"{report['events_per_stream']:,} events per stream ({report['deltas']:,} deltas of "
        f"{DELTA_SIZE} characters), best of {report['repeat']}, server send buffer "
        f"{report['server_sndbuf']}, Python {report['python']}, {report['cpus']} CPUs"
    )
    print(versions)
    print()
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
    print()
    print(
        f"server RSS before the runs {report['server_rss_before'] / 2**20:.1f} MiB, peak "
        f"{report['server_rss_peak'] / 2**20:.1f} MiB (just after a healthy client's last "
        f"event, the other clients attached), after them "
        f"{report['server_rss_after'] / 2**20:.1f} MiB; tasks "
        f"{report['server_tasks_before']} -> {report['server_tasks_after']}"
    )


def parse_counts(value: str) -> list[int]:
    try:
        counts = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("expected a comma-separated list of integers") from None
    if not counts or min(counts) < 0:
        raise argparse.ArgumentTypeError("stall counts must be >= 0")
    return sorted(set(counts))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="A healthy client's delivery rate with stalled clients on the same stream."
    )
    parser.add_argument("--events", type=int, default=5_000, help="text deltas per stream")
    parser.add_argument(
        "--stalled", type=parse_counts, default=[0, 50, 200], help="stall counts, e.g. 0,50,200"
    )
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per row")
    parser.add_argument(
        "--sndbuf",
        type=int,
        default=0,
        help="the server's kernel send buffer per connection, bytes (0: the system's)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.events < 1 or args.repeat < 1 or args.sndbuf < 0:
        parser.error("--events and --repeat must be at least 1, --sndbuf at least 0")
    if args.serve:
        return serve(args.port, args.events, args.sndbuf)
    server = ServerProcess(
        __file__,
        ["--events", str(args.events), "--sndbuf", str(args.sndbuf)],
        startup_timeout=STARTUP_TIMEOUT,
    )
    try:
        server.wait_until_ready()
        report = asyncio.run(measure(server, args.events, args.stalled, args.repeat, args.sndbuf))
    finally:
        server.stop()
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
    else:
        print_table(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
