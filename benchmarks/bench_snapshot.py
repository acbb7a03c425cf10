"""Late readers of a long turn, with and without snapshots (``StreamHub(snapshot_after=N)``,
docs/resume.md "Snapshots for late readers"): what each costs the server and receives, and
how late a live turn's deltas arrive meanwhile.

Run ``python benchmarks/bench_snapshot.py [--deltas 100000] [--late-readers 40]
[--rounds 3] [--pace-ms 20] [--snapshot-after 1000] [--server h11|standard] [--json]``.
The defaults take a minute or two; ``--deltas 3000 --late-readers 4 --rounds 1`` is a smoke
run of a few seconds.

One uvicorn server process (this script with ``--serve``) holds two hubs, each on an
in-memory store of its own and each served by ``hub_routes``: ``/plain`` (``StreamHub()``)
and ``/snap`` (``StreamHub(snapshot_after=N)``). A live turn runs on each for the whole
measurement: one text delta every ``--pace-ms``, its text the time it was due and the time
it was sent (``time.time_ns()``). A second process (this script with ``--live-reader``)
follows both live turns and notes when each delta arrives. It is a separate process so
that this process's reading of the late readers never delays those notes.

Each round, for each hub in turn (the order alternates from round to round), a long turn of
``--deltas`` text deltas is published at once and left open (its message not ended, like a
turn still running). Each round uses a new stream, so the snapshot hub's cache starts cold,
as it would for a new turn. After ``--quiet-seconds`` with nothing else happening (which
gives the live turn's quiet latency and the server's background CPU), ``--late-readers``
readers join the long turn at once without a ``Last-Event-ID``. Each reads until it has the
event carrying the long turn's last id, then closes.

Per round and hub, the script records:

- the server's CPU over the burst (its ``/cpu`` route: ``time.process_time()``, read
  again once every late reader's subscription has ended) per late reader;
- the bytes and events each late reader received, and the burst's wall time;
- the live turn's latency (arrival minus due time, so a delta that the server's loop sent
  late counts from when it was due), p50/p99/max over the deltas in flight during the
  burst and the first one due after it.

It then prints every round, the median of the rounds, and the ratios snap / plain (the
median of the rounds' ratios).

Before timing, one late reader of each hub reads a long turn up to its last event. The
script checks that those events reassemble to the turn's text (``SSEDecoder``,
``reassemble_events``) and that the snapshot hub's reader got far fewer of them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import math
import os
import platform
import select
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Coroutine
from importlib.metadata import PackageNotFoundError, version
from typing import Any, NamedTuple

import httpx
import orjson
import uvicorn
from _cli import add_json_option, json_only, write_json
from _server import ServerProcess
from _turn import make_chunks
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

import essessey
from essessey.bindings.sse import SSEDecoder, hub_routes
from tests.processes import spawn

try:
    import uvloop
except ImportError:  # the client falls back to asyncio; --server standard needs it
    uvloop = None  # type: ignore[assignment]

HOST = "127.0.0.1"
PLAIN = "plain"
SNAP = "snap"
VARIANTS = (PLAIN, SNAP)
LABELS = {PLAIN: "StreamHub()", SNAP: "StreamHub(snapshot_after=N)"}
LIVE_STREAM = "live"
CPU_PATH = "/cpu"
"""The server's own CPU time so far, in seconds (``time.process_time()``, as in
bench_sse_e2e.py); with ``?variant=V&round=R``, once that round's long turn has no
subscriber left, so what ending each late reader's subscription costs counts in it."""
SETTLE_TIMEOUT = 30.0
FLAVOURS = {"h11": ("h11", "asyncio"), "standard": ("httptools", "uvloop")}
"""--server: uvicorn's (http, loop), as bench_paced.py names them."""

STARTUP_TIMEOUT = 30.0
REQUEST_TIMEOUT = 120.0
"""Seconds any one request, or any one read of a stream, may take."""
PRODUCE_TIMEOUT = 120.0
"""Seconds the server may take to publish a long turn, or to end one."""
BURST_TIMEOUT = 900.0
"""Seconds one burst of late readers may take, all of them together."""
LIVE_READER_TIMEOUT = 30.0
LIVE_RECONNECTS = 10
"""Times the live reader follows a live turn again (by its last id) if its stream ends."""
STORE_BYTES = 1 << 36
"""The stores' byte budgets: a bound nothing here reaches (the long turns are cleared)."""
LIVE_HEADROOM = 100_000
"""Events of a stream beyond the long turn's: the live turn's share (50/s for half an hour
before its oldest are evicted, which its caught-up reader never notices)."""
SNAPSHOT_FEWER = 10
"""Verification: the snapshot's late reader gets at most 1/this of the plain one's events."""
DATA_MARK = b"\ndata: "
"""Once per event: each frame is ``id:``, ``event:``, then its one ``data:`` line (JSON
has no raw newline), and the keep-alive comments have none."""


# -- the server side -------------------------------------------------------------------


def long_turn(
    chunks: list[str], produced: asyncio.Event, finish: asyncio.Event
) -> essessey.TurnProducer:
    """A turn of ``chunks`` as text deltas, published at once (``produced`` set once they
    are in the store), then left open until ``finish``: a long turn still running."""

    async def produce(publisher: essessey.Publisher) -> None:
        await publisher.send_stream_preamble("msg_long", "long", "bench-model")
        await publisher.send_content_block_start_text(0)
        await publisher.send_content_block_deltas_text(0, chunks)
        produced.set()
        await finish.wait()
        await publisher.send_content_block_stop(0)
        await publisher.send_stream_epilogue(essessey.StopReason.END_TURN, len(chunks))

    return produce


def live_turn(pace_ns: int, stop: asyncio.Event) -> essessey.TurnProducer:
    """A text delta every ``pace_ns`` until ``stop``. Each one's text is ``"<due> <sent>"``
    (``time.time_ns()``): due by the schedule, and sent. A loop woken late sends at once,
    to catch up, so the lateness shows from the due time."""

    async def produce(publisher: essessey.Publisher) -> None:
        await publisher.send_stream_preamble("msg_live", LIVE_STREAM, "bench-model")
        await publisher.send_content_block_start_text(0)
        send_delta = publisher.send_content_block_delta_text
        start = time.time_ns()
        sent = 0
        while not stop.is_set():
            sent += 1
            due = start + sent * pace_ns
            delay = (due - time.time_ns()) / 1e9
            if delay > 0:
                await asyncio.sleep(delay)
            await send_delta(0, f"{due} {time.time_ns()}")
        await publisher.send_content_block_stop(0)
        await publisher.send_stream_epilogue(essessey.StopReason.END_TURN, sent)

    return produce


def build_app(deltas: int, pace_ns: int, snapshot_after: int) -> Starlette:
    """The two hubs' routes (``/plain/streams/{id}``, ``/snap/streams/{id}``), a long
    turn's start and end (``POST /{variant}/long?round=R``, ``.../long/finish?round=R``),
    and ``/cpu``. The live turns start with the app and end with it."""
    chunks = make_chunks(deltas)

    def store() -> essessey.InMemoryEventStore:
        return essessey.InMemoryEventStore(
            max_events_per_stream=deltas + LIVE_HEADROOM,
            max_bytes_per_stream=STORE_BYTES,
            max_bytes=STORE_BYTES,
        )

    hubs = {
        PLAIN: essessey.StreamHub(store(), shutdown_grace=2.0),
        SNAP: essessey.StreamHub(store(), snapshot_after=snapshot_after, shutdown_grace=2.0),
    }
    finishes: dict[tuple[str, str], asyncio.Event] = {}
    stop_live = asyncio.Event()

    def target(variant: str, request: Request) -> tuple[essessey.StreamHub, str] | None:
        """The hub of ``variant`` and the stream of the request's round's long turn."""
        hub = hubs.get(variant)
        if hub is None:
            return None
        return hub, "long_" + request.query_params.get("round", "0")

    async def start_long(request: Request) -> Response:
        variant = request.path_params["variant"]
        found = target(variant, request)
        if found is None:
            return JSONResponse({"error": "no such hub"}, 404)
        hub, stream_id = found
        produced, finish = asyncio.Event(), asyncio.Event()
        finishes[variant, stream_id] = finish
        await hub.start(stream_id, long_turn(chunks, produced, finish))
        async with asyncio.timeout(PRODUCE_TIMEOUT):
            await produced.wait()
        events = (await hub.store.since(stream_id, None))[0]
        last_id, count = events[-1].id, len(events)
        del events
        gc.collect()  # the turn's garbage now, not during the burst
        return JSONResponse({"stream_id": stream_id, "last_id": last_id, "events": count})

    async def finish_long(request: Request) -> Response:
        variant = request.path_params["variant"]
        found = target(variant, request)
        if found is None:
            return JSONResponse({"error": "no such hub"}, 404)
        hub, stream_id = found
        finish = finishes.pop((variant, stream_id), None)
        if finish is not None:
            finish.set()
        async with asyncio.timeout(PRODUCE_TIMEOUT):
            await hub.wait(stream_id)
        await hub.store.clear(stream_id)  # the next round's turn starts on a fresh stream
        gc.collect()
        return JSONResponse({"finished": stream_id})

    async def cpu(request: Request) -> Response:
        variant = request.query_params.get("variant")
        if variant is not None:
            found = target(variant, request)
            if found is None:
                return JSONResponse({"error": "no such hub"}, 404)
            hub, stream_id = found
            async with asyncio.timeout(SETTLE_TIMEOUT):
                # Polled: a count the closing responses lower, not an event to wait on.
                while hub.subscriber_count(stream_id):  # noqa: ASYNC110
                    await asyncio.sleep(0.002)
        return PlainTextResponse(b"%.9f" % time.process_time())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            for hub in hubs.values():
                await stack.enter_async_context(hub)
            for hub in hubs.values():
                await hub.start(LIVE_STREAM, live_turn(pace_ns, stop_live))
            try:
                yield
            finally:
                # Every turn ends by itself before the hubs are left.
                stop_live.set()
                for finish in finishes.values():
                    finish.set()

    routes: list[BaseRoute] = [
        Route(CPU_PATH, cpu, methods=["GET"]),
        Route("/{variant}/long", start_long, methods=["POST"]),
        Route("/{variant}/long/finish", finish_long, methods=["POST"]),
    ]
    for variant, hub in hubs.items():
        routes.extend(hub_routes(hub, f"/{variant}/streams"))
    return Starlette(routes=routes, lifespan=lifespan)


def serve(port: int, flavour: str, deltas: int, pace_ns: int, snapshot_after: int) -> int:
    """The server process: uvicorn on 127.0.0.1:port until its stdin closes."""
    http, loop = FLAVOURS[flavour]
    config = uvicorn.Config(
        build_app(deltas, pace_ns, snapshot_after),
        host=HOST,
        port=port,
        http=http,
        loop=loop,
        log_level="warning",
        lifespan="on",
    )
    server = uvicorn.Server(config)

    def stop_when_stdin_closes() -> None:
        sys.stdin.buffer.read()
        server.should_exit = True

    threading.Thread(target=stop_when_stdin_closes, daemon=True).start()
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    return 0


# -- the live reader process -----------------------------------------------------------

Sample = tuple[int, int, int]
"""One live delta: when it arrived, when it was due, when it was sent (time.time_ns())."""


async def follow_live(
    base_url: str, variant: str, samples: list[Sample], ready: asyncio.Event
) -> int:
    """Follow the live turn of ``variant``'s hub, noting each delta; if its stream ends,
    follow it again from the last id (at most LIVE_RECONNECTS times). Returns how many
    times it did."""
    url = f"{base_url}/{variant}/streams/{LIVE_STREAM}"
    last_id = ""
    timeout = httpx.Timeout(REQUEST_TIMEOUT)
    async with httpx.AsyncClient(timeout=timeout) as client:
        for attempt in range(LIVE_RECONNECTS + 1):
            headers = {"Last-Event-ID": last_id} if last_id else {}
            async with client.stream("GET", url, headers=headers) as response:
                if response.status_code == 204:
                    return attempt  # the turn is over: the server is stopping
                response.raise_for_status()
                ready.set()
                decoder = SSEDecoder(last_id)
                async for chunk in response.aiter_raw():
                    now = time.time_ns()
                    for message in decoder.feed(chunk):
                        last_id = message.id
                        if message.event == "content_block_delta":
                            due, sent = orjson.loads(message.data)["delta"]["text"].split()
                            samples.append((now, int(due), int(sent)))
        return LIVE_RECONNECTS


async def live_reader(port: int) -> dict[str, Any]:
    """Follow both live turns; say ``ready`` on stdout once both answered, and when stdin
    closes return every sample taken."""
    base_url = f"http://{HOST}:{port}"
    samples: dict[str, list[Sample]] = {variant: [] for variant in VARIANTS}
    readies = {variant: asyncio.Event() for variant in VARIANTS}
    tasks = {
        variant: asyncio.create_task(
            follow_live(base_url, variant, samples[variant], readies[variant])
        )
        for variant in VARIANTS
    }
    async with asyncio.timeout(STARTUP_TIMEOUT):
        for variant, ready in readies.items():
            waiting = asyncio.create_task(ready.wait())
            await asyncio.wait({waiting, tasks[variant]}, return_when=asyncio.FIRST_COMPLETED)
            if not ready.is_set():
                waiting.cancel()
                tasks[variant].result()  # raises what stopped it
                raise RuntimeError(f"the {variant} live stream ended before it started")
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    await asyncio.to_thread(sys.stdin.buffer.read)  # until the parent closes it
    reconnects: dict[str, int] = {}
    errors: dict[str, str] = {}
    for variant, task in tasks.items():
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            try:
                reconnects[variant] = await task
            except Exception as exc:
                errors[variant] = f"{type(exc).__name__}: {exc}"
    return {"samples": samples, "reconnects": reconnects, "errors": errors}


def live_reader_main(port: int) -> int:
    """The live reader process: its samples as JSON on stdout once its stdin closes."""
    result = run_client(live_reader(port))
    sys.stdout.buffer.write(orjson.dumps(result))
    sys.stdout.flush()
    return 0


class LiveReaderProcess:
    """``python <this script> --live-reader --port N``: started, waited for, its samples
    collected, always stopped."""

    def __init__(self, port: int) -> None:
        command = [sys.executable, os.path.abspath(__file__), "--live-reader", "--port", str(port)]
        self.process = spawn(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def wait_until_ready(self) -> None:
        """Wait for its ``ready`` line; raise if it exits first or times out."""
        stdout = self.process.stdout
        assert stdout is not None
        readable, _, _ = select.select([stdout], [], [], STARTUP_TIMEOUT)
        line = stdout.readline() if readable else b""
        if line.strip() != b"ready":
            raise RuntimeError("the live reader did not start following the live turns")

    def collect(self) -> dict[str, Any]:
        """Close its stdin, and return the samples it prints as it ends."""
        out, _ = self.process.communicate(timeout=LIVE_READER_TIMEOUT)
        if self.process.returncode != 0:
            raise RuntimeError(f"the live reader exited with status {self.process.returncode}")
        result: dict[str, Any] = orjson.loads(out)
        return result

    def stop(self) -> None:
        """Kill it if it is still running."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


# -- the client side -------------------------------------------------------------------


class MarkCounter:
    """Counts a mark in a body read in chunks of any size, across their boundaries."""

    __slots__ = ("count", "mark", "tail")

    def __init__(self, mark: bytes) -> None:
        self.mark = mark
        self.tail = b""
        self.count = 0

    def feed(self, chunk: bytes) -> None:
        keep = len(self.mark) - 1
        # Neither the tail nor the chunk's head is long enough to hold a whole mark: what
        # their join holds spans the boundary, and is in no other count.
        self.count += chunk.count(self.mark) + (self.tail + chunk[:keep]).count(self.mark)
        self.tail = (self.tail + chunk[-keep:])[-keep:]


class FrameEnd:
    """Watches a body, read in chunks, for the end of the frame whose ``id:`` line is
    ``id_line`` (its ``\\n\\n``)."""

    __slots__ = ("id_line", "seen", "tail")

    def __init__(self, id_line: bytes) -> None:
        self.id_line = id_line
        self.tail = b""
        self.seen = False

    def feed(self, chunk: bytes) -> bool:
        """True once the frame has ended, in this chunk or before it."""
        window = self.tail + chunk
        if not self.seen:
            at = window.find(self.id_line)
            if at < 0:
                self.tail = window[-(len(self.id_line) - 1) :]
                return False
            self.seen = True
            window = window[at + len(self.id_line) :]
        if b"\n\n" in window:
            return True
        self.tail = window[-1:]
        return False


async def server_cpu(
    client: httpx.AsyncClient, base_url: str, settled: tuple[str, str] | None = None
) -> float:
    """The server's CPU seconds so far; with ``settled`` (variant, round), once that
    round's long turn has no subscriber left."""
    params = {"variant": settled[0], "round": settled[1]} if settled else None
    response = await client.get(base_url + CPU_PATH, params=params)
    response.raise_for_status()
    return float(response.text)


class LateRead(NamedTuple):
    """What one late reader received: body bytes, events, and the body when kept."""

    size: int
    events: int
    body: bytes | None


async def read_late(
    client: httpx.AsyncClient, url: str, last_id: str, *, keep: bool = False
) -> LateRead:
    """Join ``url`` without a Last-Event-ID and read until the event whose id is
    ``last_id`` has arrived whole, then close. Counting is all the parsing done here, so
    this process's CPU stays out of the server's way."""
    size = 0
    events = MarkCounter(DATA_MARK)
    end = FrameEnd(b"id: " + last_id.encode() + b"\n")
    body = bytearray()
    async with client.stream("GET", url) as response:
        response.raise_for_status()
        async for chunk in response.aiter_raw():
            size += len(chunk)
            events.feed(chunk)
            if keep:
                body += chunk
            if end.feed(chunk):
                break
        else:
            raise RuntimeError(f"{url}: the stream ended before the long turn's last event")
    return LateRead(size, events.count, bytes(body) if keep else None)


async def start_long(
    client: httpx.AsyncClient, base_url: str, variant: str, round_name: str
) -> dict[str, Any]:
    """Have the server publish a long turn on ``variant``'s hub: its stream id, last id
    and event count."""
    response = await client.post(f"{base_url}/{variant}/long", params={"round": round_name})
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result


async def finish_long(
    client: httpx.AsyncClient, base_url: str, variant: str, round_name: str
) -> None:
    """End the round's long turn on ``variant``'s hub, and clear its stream."""
    response = await client.post(f"{base_url}/{variant}/long/finish", params={"round": round_name})
    response.raise_for_status()


async def verify(client: httpx.AsyncClient, base_url: str, deltas: int) -> dict[str, Any]:
    """Before timing: a late reader of each hub reassembles the long turn's text from what
    it received, and the snapshot hub's gets far fewer events. Its figures, per hub."""
    expected = "".join(make_chunks(deltas))
    found: dict[str, Any] = {}
    for variant in VARIANTS:
        long = await start_long(client, base_url, variant, "verify")
        try:
            url = f"{base_url}/{variant}/streams/{long['stream_id']}"
            read = await read_late(client, url, long["last_id"], keep=True)
        finally:
            await finish_long(client, base_url, variant, "verify")
        assert read.body is not None
        decoder = SSEDecoder()
        messages = decoder.feed(read.body) + decoder.close()
        events = [essessey.Event(m.event, m.data.encode(), m.id or None) for m in messages]
        parsed = essessey.reassemble_events(events)
        found[variant] = {
            "events": len(events),
            "bytes": read.size,
            "stored_events": long["events"],
            "text_matches": parsed.text == expected,
            "ends_at_last_id": bool(events) and events[-1].id == long["last_id"],
        }
        if not found[variant]["text_matches"]:
            raise SystemExit(f"{variant}: the late reader's events reassemble to another text")
        if not found[variant]["ends_at_last_id"]:
            raise SystemExit(f"{variant}: the late reader's last event is not the turn's last")
        if read.events != len(events):
            raise SystemExit(f"{variant}: {read.events} events counted, {len(events)} decoded")
    if found[SNAP]["events"] * SNAPSHOT_FEWER > found[PLAIN]["events"]:
        raise SystemExit(
            f"the snapshot hub's late reader got {found[SNAP]['events']} events, the plain "
            f"one's {found[PLAIN]['events']}: not {SNAPSHOT_FEWER} times fewer"
        )
    return found


async def burst(
    client: httpx.AsyncClient,
    base_url: str,
    variant: str,
    round_name: str,
    late_readers: int,
    quiet_seconds: float,
) -> dict[str, Any]:
    """One round on one hub: a new long turn, a quiet wait, then ``late_readers`` readers
    of it at once. The live turn's figures are added later, from the windows noted."""
    long = await start_long(client, base_url, variant, round_name)
    try:
        url = f"{base_url}/{variant}/streams/{long['stream_id']}"
        gc.collect()
        quiet_cpu = await server_cpu(client, base_url)
        quiet_start = time.time_ns()
        await asyncio.sleep(quiet_seconds)
        quiet_end = time.time_ns()
        cpu_before = await server_cpu(client, base_url)
        start = time.time_ns()
        # A group: one reader failing stops the others, and the burst ends with it.
        async with asyncio.timeout(BURST_TIMEOUT), asyncio.TaskGroup() as group:
            tasks = [
                group.create_task(read_late(client, url, long["last_id"]))
                for _ in range(late_readers)
            ]
        end = time.time_ns()
        cpu_after = await server_cpu(client, base_url, (variant, round_name))
    finally:
        await finish_long(client, base_url, variant, round_name)
    reads = [task.result() for task in tasks]
    sizes = [read.size for read in reads]
    events = [read.events for read in reads]
    quiet = max(quiet_end - quiet_start, 1) / 1e9
    background = (cpu_before - quiet_cpu) / quiet  # CPU seconds per second
    cpu = cpu_after - cpu_before
    net = max(cpu - background * (end - start) / 1e9, 0.0)
    return {
        "round": round_name,
        "variant": variant,
        "late_readers": late_readers,
        "stored_events": long["events"],
        "burst_seconds": (end - start) / 1e9,
        "server_cpu_ms": cpu * 1e3,
        "cpu_ms_per_reader": cpu * 1e3 / late_readers,
        # Less what the live turns cost at the quiet window's rate.
        "net_cpu_ms_per_reader": net * 1e3 / late_readers,
        "kib_per_reader": statistics.mean(sizes) / 1024,
        "bytes_per_reader_min_max": [min(sizes), max(sizes)],
        "events_per_reader": statistics.mean(events),
        "events_per_reader_min_max": [min(events), max(events)],
        "background_cpu_ms_per_second": background * 1e3,
        "quiet_window_ns": [quiet_start, quiet_end],
        "burst_window_ns": [start, end],
    }


async def measure(
    base_url: str, deltas: int, late_readers: int, rounds: int, quiet_seconds: float
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The verification, then every round of both hubs, interleaved."""
    limits = httpx.Limits(max_connections=late_readers + 4, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT, limits=limits) as client:
        verification = await verify(client, base_url, deltas)
        results = []
        for number in range(1, rounds + 1):
            # Alternated, so neither hub always runs right after the other's burst.
            order = VARIANTS if number % 2 else VARIANTS[::-1]
            for variant in order:
                results.append(
                    await burst(
                        client, base_url, variant, f"r{number}", late_readers, quiet_seconds
                    )
                )
    return verification, results


# -- the figures -----------------------------------------------------------------------


def percentile(ordered: list[int], share: float) -> int:
    """The nearest-rank percentile of sorted values (``share`` in 0..1)."""
    return ordered[min(len(ordered) - 1, max(0, math.ceil(len(ordered) * share) - 1))]


def live_figures(samples: list[Sample], window: list[int], pace_ns: int) -> dict[str, Any]:
    """The live turn's latency over a window: the deltas in flight during it (due before
    it ended, arrived after it began) and the first one due after it, so a burst shorter
    than one pace still has one."""
    start, end = window
    chosen = [s for s in samples if s[1] <= end + pace_ns and s[0] >= start]
    if not chosen:
        return {"deltas": 0, "p50_ms": None, "p99_ms": None, "max_ms": None, "sent_p99_ms": None}
    late = sorted(arrived - due for arrived, due, _sent in chosen)
    since_sent = sorted(arrived - sent for arrived, _due, sent in chosen)
    return {
        "deltas": len(chosen),
        "p50_ms": percentile(late, 0.50) / 1e6,
        "p99_ms": percentile(late, 0.99) / 1e6,
        "max_ms": late[-1] / 1e6,
        # From when the server's producer actually sent: the delivery alone.
        "sent_p99_ms": percentile(since_sent, 0.99) / 1e6,
    }


RATIO_KEYS = {
    "cpu_ms_per_reader": "server CPU per late reader",
    "kib_per_reader": "bytes per late reader",
    "events_per_reader": "events per late reader",
    "burst_seconds": "burst wall time",
    "live_p99_ms": "live p99 during the burst",
    "live_max_ms": "live max during the burst",
}
MEDIAN_KEYS = [
    "cpu_ms_per_reader",
    "net_cpu_ms_per_reader",
    "kib_per_reader",
    "events_per_reader",
    "burst_seconds",
    "live_p50_ms",
    "live_p99_ms",
    "live_max_ms",
    "quiet_p99_ms",
    "background_cpu_ms_per_second",
]


def flat(result: dict[str, Any]) -> dict[str, Any]:
    """A round's figures with the live ones at the top level, for medians and ratios."""
    return {
        **result,
        "live_p50_ms": result["live"]["p50_ms"],
        "live_p99_ms": result["live"]["p99_ms"],
        "live_max_ms": result["live"]["max_ms"],
        "quiet_p99_ms": result["quiet"]["p99_ms"],
    }


def median_of(values: list[Any]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarise(results: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each hub's median of the rounds, and snap / plain as the median of the rounds'
    ratios (the two ran seconds apart: a noisy neighbour moves one round less)."""
    rows = [flat(r) for r in results]
    medians = {
        variant: {
            key: median_of([r[key] for r in rows if r["variant"] == variant]) for key in MEDIAN_KEYS
        }
        for variant in VARIANTS
    }
    ratios: dict[str, Any] = {}
    by_round: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        by_round.setdefault(row["round"], {})[row["variant"]] = row
    for key in RATIO_KEYS:
        each = [
            pair[SNAP][key] / pair[PLAIN][key]
            for pair in by_round.values()
            if pair[SNAP][key] is not None and pair[PLAIN][key]
        ]
        ratios[key] = {"median": median_of(each), "rounds": each}
    return medians, ratios


def package_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def environment(flavour: str) -> dict[str, Any]:
    names = ["essessey", "uvicorn", FLAVOURS[flavour][0], "httpx", "starlette"]
    if flavour == "standard":
        names.append("uvloop")
    return {
        "python": platform.python_version(),
        "versions": {name: package_version(name) for name in names},
        "cpus": os.cpu_count(),
    }


def fmt(value: float | None, digits: int) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def print_table(report: dict[str, Any]) -> None:
    config, env = report["config"], report["environment"]
    versions = ", ".join(f"{k} {v}" for k, v in env["versions"].items())
    snap = LABELS[SNAP].replace("N", str(config["snapshot_after"]))
    print(
        f"{config['late_readers']} late readers of a {config['deltas']:,}-delta turn, "
        f"plain {LABELS[PLAIN]} vs snap {snap}, "
        f"beside a live turn of a delta every {config['pace_ms']:g} ms; "
        f"{config['rounds']} round(s), {config['server']}, Python {env['python']}, "
        f"{env['cpus']} CPUs"
    )
    print(versions)
    checked = report["verification"]
    print(
        "verified: the long turn reassembles the same from a late reader of each hub "
        f"(plain {checked[PLAIN]['events']:,} events, {checked[PLAIN]['bytes'] / 1024:,.0f} KiB; "
        f"snap {checked[SNAP]['events']:,} events, {checked[SNAP]['bytes'] / 1024:,.0f} KiB)"
    )
    if report["live_reader"]["errors"] or any(report["live_reader"]["reconnects"].values()):
        print(f"live reader: {report['live_reader']}")
    print()
    print(
        "live ms: arrival minus due time of the live turn's deltas in flight during the "
        "burst; quiet p99: the same before it; bg: the server's CPU before the burst"
    )
    print(
        f"{'round':<6} {'variant':<7} {'CPU ms/reader':>13} {'KiB/reader':>11} "
        f"{'events/reader':>13} {'burst s':>8} {'live p50':>8} {'p99':>7} {'max':>7} "
        f"{'(n)':>5} {'quiet p99':>9} {'bg ms/s':>7}"
    )

    def row(label: str, variant: str, figures: dict[str, Any], n: str) -> None:
        print(
            f"{label:<6} {variant:<7} {fmt(figures['cpu_ms_per_reader'], 2):>13} "
            f"{fmt(figures['kib_per_reader'], 1):>11} {fmt(figures['events_per_reader'], 0):>13} "
            f"{fmt(figures['burst_seconds'], 3):>8} {fmt(figures['live_p50_ms'], 1):>8} "
            f"{fmt(figures['live_p99_ms'], 1):>7} {fmt(figures['live_max_ms'], 1):>7} {n:>5} "
            f"{fmt(figures['quiet_p99_ms'], 1):>9} "
            f"{fmt(figures['background_cpu_ms_per_second'], 1):>7}"
        )

    for result in report["rounds"]:
        row(result["round"], result["variant"], flat(result), str(result["live"]["deltas"]))
    for variant in VARIANTS:
        row("median", variant, report["medians"][variant], "")
    print()
    for key, label in RATIO_KEYS.items():
        ratio = report["ratios"][key]
        spread = ratio["rounds"]
        detail = f" ({min(spread):.3g}-{max(spread):.3g})" if len(spread) > 1 else ""
        median = ratio["median"]
        shown = "n/a" if median is None else f"{median:.3g}"
        print(f"snap / plain, {label}: {shown}{detail}, median of {len(spread)} round(s)")


# -- running it ------------------------------------------------------------------------


def run_client(coro: Coroutine[Any, Any, Any]) -> Any:
    """The client's event loop: uvloop when installed."""
    if uvloop is not None:
        return uvloop.run(coro)
    return asyncio.run(coro)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Late readers of a long open turn beside a live paced turn: server CPU, "
        "bytes and events per late reader and the live turn's latency, on a hub without "
        "and with snapshots (snapshot_after)."
    )
    parser.add_argument("--deltas", type=int, default=100_000, help="text deltas of the long turn")
    parser.add_argument(
        "--late-readers", type=int, default=40, help="readers joining the long turn at once"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each hub, interleaved")
    parser.add_argument(
        "--pace-ms", type=float, default=20.0, help="ms between the live turn's deltas"
    )
    parser.add_argument(
        "--snapshot-after", type=int, default=1000, help="the snap hub's snapshot_after"
    )
    parser.add_argument(
        "--quiet-seconds",
        type=float,
        default=1.0,
        help="seconds of the live turn alone before each burst (its quiet latency)",
    )
    parser.add_argument(
        "--server",
        choices=sorted(FLAVOURS),
        default="h11",
        help="uvicorn flavour: h11 (asyncio loop) or standard (httptools, uvloop)",
    )
    add_json_option(parser)
    # The server and live reader processes are this script again.
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--live-reader", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.deltas, args.late_readers, args.rounds) < 1:
        parser.error("--deltas, --late-readers and --rounds must be at least 1")
    if not args.pace_ms > 0 or args.quiet_seconds < 0 or args.snapshot_after < 0:
        parser.error("--pace-ms must be > 0, --quiet-seconds and --snapshot-after >= 0")
    if args.deltas <= args.snapshot_after:
        parser.error("--deltas must be more than --snapshot-after, or nothing is snapshotted")
    if args.server == "standard" and uvloop is None:
        parser.error("--server standard needs uvloop")
    pace_ns = round(args.pace_ms * 1e6)
    if args.serve:
        return serve(args.port, args.server, args.deltas, pace_ns, args.snapshot_after)
    if args.live_reader:
        return live_reader_main(args.port)

    server_args = [
        "--server",
        args.server,
        "--deltas",
        str(args.deltas),
        "--pace-ms",
        repr(args.pace_ms),
        "--snapshot-after",
        str(args.snapshot_after),
    ]
    server = ServerProcess(__file__, server_args, startup_timeout=STARTUP_TIMEOUT)
    try:
        server.wait_until_ready()
        reader = LiveReaderProcess(server.port)
        try:
            reader.wait_until_ready()
            verification, results = run_client(
                measure(
                    server.http_url,
                    args.deltas,
                    args.late_readers,
                    args.rounds,
                    args.quiet_seconds,
                )
            )
            live = reader.collect()
        finally:
            reader.stop()
    finally:
        server.stop()

    for result in results:
        samples = live["samples"][result["variant"]]
        result["live"] = live_figures(samples, result["burst_window_ns"], pace_ns)
        result["quiet"] = live_figures(samples, result["quiet_window_ns"], pace_ns)
    medians, ratios = summarise(results)
    report = {
        "config": {
            "deltas": args.deltas,
            "late_readers": args.late_readers,
            "rounds": args.rounds,
            "pace_ms": args.pace_ms,
            "snapshot_after": args.snapshot_after,
            "quiet_seconds": args.quiet_seconds,
            "server": args.server,
        },
        "environment": environment(args.server),
        "verification": verification,
        "live_reader": {
            "deltas": {variant: len(live["samples"][variant]) for variant in VARIANTS},
            "reconnects": live["reconnects"],
            "errors": live["errors"],
        },
        "rounds": results,
        "medians": medians,
        "ratios": ratios,
    }
    if not json_only(args.json):
        print_table(report)
    if args.json:
        write_json(args.json, report, __file__)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
