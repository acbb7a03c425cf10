"""What the in-memory event store keeps per event, how fast the hub fans one stream out
to many subscribers, and how soon a resume gets its first replayed event.

Run ``python benchmarks/bench_store.py [--json]`` (30-40 s). Three measurements:

- retention: 100,000 text-turn events over 1,000 streams, published through a Publisher
  into a StreamHub's InMemoryEventStore; bytes per retained event (tracemalloc) beside
  the payload bytes, against the target "at most 2 x the payload + 200 bytes";
- fan-out: one turn of 2,000 events followed by 1,000 in-process subscribers; events/s
  delivered (all deliveries / wall time) and memory per subscriber;
- resume latency: from ``subscribe(stream_id, last_id)`` on a finished 10,000-event
  stream (last id in the middle) to the first replayed event, in process and over HTTP
  (a uvicorn server process serving ``hub_routes``, a GET with ``Last-Event-ID``).

See benchmarks/README.md for what is measured and how to read it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import linecache
import os
import platform
import random
import statistics
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib.metadata import version
from typing import Any

import anyio
import anyio.lowlevel
import httpx
import orjson
from _cli import add_json_option, json_only, write_json
from _server import ServerProcess, run_until_stdin_closes
from starlette.applications import Starlette

import essessey
from essessey.bindings.sse import SSEDecoder, hub_routes

TARGET_FACTOR = 2.0
TARGET_OVERHEAD = 200
"""Retention target: bytes per retained event <= 2 x payload bytes per event + 200."""

STARTUP_TIMEOUT = 60.0
RESUME_STREAM = "resume_bench"
RESUME_CAPACITY = 10_000
"""InMemoryEventStore's default max_events_per_stream: a longer turn would lose its start."""

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The words of the turns' text (picked at random, with a fixed seed).
_WORDS = (
    *("the", "model", "streams", "a", "reply", "token", "by", "while", "client", "renders"),
    *("each", "delta", "as", "it", "arrives", "and", "keeps", "id", "of", "last", "event"),
    *("saw", "so", "dropped", "connection", "can", "pick", "up", "exactly", "where"),
    *("stopped", "without", "gap", "or", "duplicate"),
)


# -- the turns -------------------------------------------------------------------------


def make_chunks(rng: random.Random, count: int) -> list[str]:
    """``count`` text chunks of 30-110 characters: delta payloads of 110-190 bytes."""
    chunks = []
    for _ in range(count):
        size = rng.randint(30, 110)
        words: list[str] = []
        length = 0
        while length < size:
            word = rng.choice(_WORDS)
            words.append(word)
            length += len(word) + 1
        chunks.append(" ".join(words)[:size])
    return chunks


def text_turn(
    message_id: str, chunks: list[str], *, burst: int = 0
) -> Callable[[essessey.Publisher], Awaitable[None]]:
    """A producer publishing one text turn: preamble, one text block of the chunks,
    epilogue (len(chunks) + 6 events). With ``burst`` it lets other tasks run after every
    ``burst`` deltas, as a producer waiting on a model does."""

    async def produce(publisher: essessey.Publisher) -> None:
        await publisher.send_stream_preamble(message_id, message_id, "bench-model")
        await publisher.send_content_block_start_text(0)
        send_delta = publisher.send_content_block_delta_text
        for n, chunk in enumerate(chunks, 1):
            await send_delta(0, chunk)
            if burst and n % burst == 0:
                await anyio.lowlevel.checkpoint()
        await publisher.send_content_block_stop(0)
        await publisher.send_stream_epilogue(essessey.StopReason.END_TURN, len(chunks))

    return produce


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


# -- (a) retention ---------------------------------------------------------------------


async def measure_retention(streams: int, events_per_stream: int) -> dict[str, Any]:
    rng = random.Random(1)
    # The chunks are made before tracing starts: only what the store keeps is counted.
    turns = [(f"conv_{n:05d}", make_chunks(rng, events_per_stream - 6)) for n in range(streams)]
    # A throwaway turn first: imports done on first use are not the store's memory.
    async with essessey.StreamHub() as warm_up:
        await warm_up.start("warm_up", text_turn("warm_up", make_chunks(rng, 10)))
        await warm_up.wait("warm_up")
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    store = essessey.InMemoryEventStore()
    async with essessey.StreamHub(store) as hub:
        for stream_id, chunks in turns:
            await hub.start(stream_id, text_turn(stream_id, chunks))
            await hub.wait(stream_id)
    gc.collect()
    retained_bytes = tracemalloc.get_traced_memory()[0] - before
    snapshot = tracemalloc.take_snapshot()
    tracemalloc.stop()

    events = 0
    payload = 0
    for stream_id, _chunks in turns:
        retained, known = await store.since(stream_id, None)
        if not known:
            raise SystemExit(f"stream {stream_id} was not retained")
        events += len(retained)
        payload += sum(len(event.data) for event in retained)
    if events != streams * events_per_stream:
        raise SystemExit(f"{events} events retained, {streams * events_per_stream} published")

    sites = allocation_sites(snapshot, events)
    per_event = retained_bytes / events
    payload_per_event = payload / events
    limit = TARGET_FACTOR * payload_per_event + TARGET_OVERHEAD
    return {
        "streams": streams,
        "events": events,
        "retained_bytes": retained_bytes,
        "payload_bytes": payload,
        "bytes_per_event": per_event,
        "payload_bytes_per_event": payload_per_event,
        "overhead_bytes_per_event": per_event - payload_per_event,
        "top_allocation_sites": sites,
        "orjson_dumps_probe": orjson_buffer_probe(),
        "target": {
            "rule": f"bytes/event <= {TARGET_FACTOR:g} x payload + {TARGET_OVERHEAD}",
            "limit_bytes_per_event": limit,
            "met": per_event <= limit,
        },
    }


def allocation_sites(snapshot: tracemalloc.Snapshot, events: int) -> list[dict[str, Any]]:
    """What the retained bytes are made of, by the line that allocated them."""
    sites = []
    for stat in snapshot.statistics("lineno")[:6]:
        frame = stat.traceback[0]
        if frame.filename.startswith(ROOT + os.sep):
            where = os.path.relpath(frame.filename, ROOT)
        else:  # the standard library or a dependency: its last two path parts say enough
            where = os.path.join(*frame.filename.split(os.sep)[-2:])
        sites.append(
            {
                "site": f"{where}:{frame.lineno}",
                "code": linecache.getline(frame.filename, frame.lineno).strip(),
                "bytes": stat.size,
                "bytes_per_event": stat.size / events,
                "blocks": stat.count,
            }
        )
    return sites


def orjson_buffer_probe(count: int = 1_000) -> dict[str, Any]:
    """What one kept ``orjson.dumps`` result of a small payload costs (tracemalloc),
    next to its length: the Publisher serialises every event but a delta this way."""
    payloads = [{"type": "content_block_stop", "index": n} for n in range(count)]
    kept: list[bytes] = [b""] * count
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for n, payload in enumerate(payloads):
        kept[n] = orjson.dumps(payload)
    kept_bytes = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return {
        "orjson": orjson.__version__,
        "length": sum(map(len, kept)) / count,
        "bytes_kept": kept_bytes / count,
    }


# -- (b) fan-out -----------------------------------------------------------------------


async def fanout_run(
    subscribers: int, chunks: list[str], burst: int, *, trace: bool
) -> dict[str, Any]:
    stream_id = "fanout"
    gate = anyio.Event()
    turn = text_turn(stream_id, chunks, burst=burst)

    async def produce(publisher: essessey.Publisher) -> None:
        await gate.wait()  # every subscriber attaches before the first event
        await turn(publisher)

    counts = [0] * subscribers
    last_ids: list[str | None] = [None] * subscribers
    hub = essessey.StreamHub(max_subscribers=subscribers)

    async def consume(n: int) -> None:
        count = 0
        last: str | None = None
        async for event in hub.subscribe(stream_id):
            count += 1
            last = event.id
        counts[n] = count
        last_ids[n] = last

    async with hub:
        await hub.start(stream_id, produce)
        gc.collect()
        if trace:
            tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0] if trace else 0
        async with anyio.create_task_group() as tasks:
            for n in range(subscribers):
                tasks.start_soon(consume, n)
            # A subscriber is counted when it starts, and it runs on until it waits
            # for the first event: once all are counted, all are parked.
            while hub.subscriber_count(stream_id) < subscribers:
                await anyio.lowlevel.checkpoint()
            attached_bytes = tracemalloc.get_traced_memory()[0] - before if trace else 0
            if trace:
                tracemalloc.stop()
            gc.collect()
            start = time.perf_counter()
            gate.set()
        elapsed = time.perf_counter() - start
        retained, _known = await hub.store.since(stream_id, None)

    expected = len(chunks) + 6
    final_id = retained[-1].id
    if len(retained) != expected or any(c != expected for c in counts):
        raise SystemExit(f"fan-out: a subscriber did not get all {expected} events")
    if any(last != final_id for last in last_ids):
        raise SystemExit("fan-out: a subscriber did not end at the last event")
    return {
        "seconds": elapsed,
        "deliveries": sum(counts),
        "bytes_per_subscriber": attached_bytes / subscribers if trace else None,
    }


async def measure_fanout(
    subscribers: int, events: int, bursts: list[int], repeat: int
) -> list[dict[str, Any]]:
    chunks = make_chunks(random.Random(2), events - 6)
    rows = []
    for burst in bursts:
        best: dict[str, Any] | None = None
        memory: float | None = None
        for attempt in range(repeat):
            run = await fanout_run(subscribers, chunks, burst, trace=attempt == 0)
            if attempt == 0:
                memory = run["bytes_per_subscriber"]
            if best is None or run["seconds"] < best["seconds"]:
                best = run
        assert best is not None
        rows.append(
            {
                "subscribers": subscribers,
                "events": events,
                "burst": burst,
                "best_seconds": best["seconds"],
                "deliveries": best["deliveries"],
                "deliveries_per_second": best["deliveries"] / best["seconds"],
                "bytes_per_subscriber": memory,
            }
        )
    return rows


# -- (c) resume latency ----------------------------------------------------------------


def resume_chunks(events: int) -> list[str]:
    return make_chunks(random.Random(3), events - 6)


async def measure_resume_in_process(events: int, resumes: int) -> dict[str, Any]:
    async with essessey.StreamHub() as hub:
        await hub.start(RESUME_STREAM, text_turn(RESUME_STREAM, resume_chunks(events)))
        await hub.wait(RESUME_STREAM)
        retained, _known = await hub.store.since(RESUME_STREAM, None)
        if len(retained) != events:
            raise SystemExit(f"resume: {len(retained)} events retained, {events} published")
        middle = retained[events // 2 - 1].id
        expected = retained[events // 2].id
        samples = []
        for _ in range(resumes):
            start = time.perf_counter()
            subscription = hub.subscribe(RESUME_STREAM, middle)
            async with contextlib.aclosing(subscription):
                first = await anext(subscription)
                samples.append(time.perf_counter() - start)
            if first.id != expected:
                raise SystemExit(f"resume: got {first.id}, expected {expected}")
    return {
        "events": events,
        "resumes": resumes,
        "median_us": statistics.median(samples) * 1e6,
        "p99_us": percentile(samples, 0.99) * 1e6,
    }


def build_app(events: int) -> Starlette:
    """The server: a hub whose lifespan runs one finished turn of ``events`` events."""
    hub = essessey.StreamHub()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with hub:
            await hub.start(RESUME_STREAM, text_turn(RESUME_STREAM, resume_chunks(events)))
            await hub.wait(RESUME_STREAM)
            yield

    return Starlette(routes=list(hub_routes(hub)), lifespan=lifespan)


def serve(port: int, events: int) -> int:
    """The server process: uvicorn on 127.0.0.1:port until its stdin closes. It accepts
    connections once the lifespan (the whole turn) has run."""
    return run_until_stdin_closes(build_app(events), port, lifespan="on")


async def read_whole_stream(port: int, events: int) -> list[essessey.Event]:
    """Read the finished stream once, check it, and return its events."""
    async with httpx.AsyncClient(timeout=60) as client:
        response = await client.get(f"http://127.0.0.1:{port}/streams/{RESUME_STREAM}")
        response.raise_for_status()
    decoder = SSEDecoder()
    messages = decoder.feed(response.content) + decoder.close()
    received = [essessey.Event(m.event, m.data.encode(), m.id) for m in messages]
    if len(received) != events or essessey.check(received):
        raise SystemExit("resume: the served stream is not the whole, valid turn")
    return received


async def one_http_resume(port: int, last_id: str, expected: str) -> tuple[float, float]:
    """One reconnect: (seconds from sending the GET to the first whole event, seconds
    from starting the TCP connect to it). A bare socket keeps client overhead out."""
    connect_start = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = (
        f"GET /streams/{RESUME_STREAM} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Accept: text/event-stream\r\nLast-Event-ID: {last_id}\r\n\r\n"
    ).encode()
    try:
        start = time.perf_counter()
        writer.write(request)
        received = b""
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                raise SystemExit("resume: the server closed the connection before an event")
            received += chunk
            head, separator, body = received.partition(b"\r\n\r\n")
            # The body is chunked: a size line, then the SSE frames.
            if separator and b"\n\n" in body:
                break
        end = time.perf_counter()
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    if not head.startswith(b"HTTP/1.1 200"):
        raise SystemExit(f"resume: {head.splitlines()[0]!r}")
    first_frame = body.split(b"\n\n", 1)[0]
    if f"id: {expected}\n".encode() not in first_frame + b"\n":
        raise SystemExit(f"resume: the first event is not {expected}: {first_frame[:80]!r}")
    return end - start, end - connect_start


async def measure_resume_http(events: int, resumes: int) -> dict[str, Any]:
    server = ServerProcess(
        __file__, ["--resume-events", str(events)], startup_timeout=STARTUP_TIMEOUT
    )
    try:
        server.wait_until_ready()
        received = await read_whole_stream(server.port, events)
        middle = received[events // 2 - 1].id
        expected = received[events // 2].id
        assert middle is not None
        assert expected is not None
        await one_http_resume(server.port, middle, expected)  # warm-up, not counted
        samples = [await one_http_resume(server.port, middle, expected) for _ in range(resumes)]
    finally:
        server.stop()
    after_get = [sample[0] for sample in samples]
    after_connect = [sample[1] for sample in samples]
    return {
        "events": events,
        "resumes": resumes,
        "median_ms": statistics.median(after_get) * 1e3,
        "p99_ms": percentile(after_get, 0.99) * 1e3,
        "with_connect_median_ms": statistics.median(after_connect) * 1e3,
        "with_connect_p99_ms": percentile(after_connect, 0.99) * 1e3,
    }


# -- the report ------------------------------------------------------------------------


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    retention = await measure_retention(args.streams, args.events_per_stream)
    fanout = await measure_fanout(args.subscribers, args.fanout_events, args.bursts, args.repeat)
    in_process = await measure_resume_in_process(args.resume_events, args.resumes)
    over_http = await measure_resume_http(args.resume_events, args.http_resumes)
    return {
        "python": platform.python_version(),
        "versions": {name: version(name) for name in ("anyio", "starlette", "uvicorn")},
        "retention": retention,
        "fanout": fanout,
        "resume": {"in_process": in_process, "http": over_http},
    }


def print_table(report: dict[str, Any]) -> None:
    versions = ", ".join(f"{name} {v}" for name, v in report["versions"].items())
    print(f"Python {report['python']}, {versions}")

    r = report["retention"]
    print()
    print(
        f"retention: {r['events']:,} events over {r['streams']:,} streams "
        "(InMemoryEventStore, via StreamHub and Publisher)"
    )
    print(f"  {'bytes/event (tracemalloc)':<34} {r['bytes_per_event']:>10,.1f}")
    print(f"  {'payload bytes/event':<34} {r['payload_bytes_per_event']:>10,.1f}")
    print(f"  {'overhead bytes/event':<34} {r['overhead_bytes_per_event']:>10,.1f}")
    target = r["target"]
    verdict = "met" if target["met"] else "NOT met"
    print(
        f"  target: {target['rule']} = {target['limit_bytes_per_event']:,.1f}"
        f" (measured {r['bytes_per_event']:,.1f}: {verdict})"
    )
    print("  largest allocation sites (bytes/event):")
    for site in r["top_allocation_sites"]:
        print(f"    {site['bytes_per_event']:>8,.1f}  {site['site']}  {site['code'][:60]}")
    probe = r["orjson_dumps_probe"]
    print(
        f"  orjson {probe['orjson']}: one kept orjson.dumps() result of {probe['length']:.0f}"
        f" bytes holds {probe['bytes_kept']:,.0f} bytes"
    )

    print()
    print("fan-out: one stream, in-process subscribers (StreamHub.subscribe tasks)")
    print(
        f"  {'subscribers':>11} {'events':>7} {'burst':>6} {'deliveries/s':>14}"
        f" {'best s':>8} {'bytes/subscriber':>17}"
    )
    for row in report["fanout"]:
        memory = row["bytes_per_subscriber"]
        print(
            f"  {row['subscribers']:>11,} {row['events']:>7,} {row['burst']:>6}"
            f" {row['deliveries_per_second']:>14,.0f} {row['best_seconds']:>8.3f}"
            f" {memory:>17,.0f}"
        )

    ip = report["resume"]["in_process"]
    http = report["resume"]["http"]
    print()
    print(f"resume latency: finished stream of {ip['events']:,} events, last id in the middle")
    print(f"  {'path':<46} {'median':>10} {'p99':>10}")
    print(
        f"  {'in process: subscribe() -> first event':<46}"
        f" {ip['median_us']:>7.1f} us {ip['p99_us']:>7.1f} us   ({ip['resumes']} resumes)"
    )
    print(
        f"  {'HTTP: GET with Last-Event-ID -> first event':<46}"
        f" {http['median_ms']:>7.2f} ms {http['p99_ms']:>7.2f} ms   ({http['resumes']} resumes)"
    )
    print(
        f"  {'HTTP: TCP connect + GET -> first event':<46}"
        f" {http['with_connect_median_ms']:>7.2f} ms {http['with_connect_p99_ms']:>7.2f} ms"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Memory per retained event, fan-out and resume latency of the hub."
    )
    parser.add_argument("--streams", type=int, default=1_000, help="retention: streams")
    parser.add_argument(
        "--events-per-stream", type=int, default=100, help="retention: events per stream"
    )
    parser.add_argument("--subscribers", type=int, default=1_000, help="fan-out: subscribers")
    parser.add_argument("--fanout-events", type=int, default=2_000, help="fan-out: turn events")
    parser.add_argument(
        "--bursts",
        default="1,10,100",
        help="fan-out: deltas the producer publishes between yields, comma-separated",
    )
    parser.add_argument("--repeat", type=int, default=2, help="fan-out: runs, the best counts")
    parser.add_argument(
        "--resume-events", type=int, default=10_000, help="resume: events in the stream"
    )
    parser.add_argument("--resumes", type=int, default=1_000, help="resume: in-process resumes")
    parser.add_argument("--http-resumes", type=int, default=200, help="resume: HTTP resumes")
    add_json_option(parser)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return serve(args.port, args.resume_events)
    try:
        args.bursts = [int(part) for part in args.bursts.split(",")]
    except ValueError:
        parser.error("--bursts takes comma-separated integers")
    counts = (args.streams, args.subscribers, args.repeat, args.resumes, args.http_resumes)
    if min(counts) < 1 or min(args.bursts) < 1:
        parser.error("counts and bursts must be at least 1")
    if args.events_per_stream < 7 or args.fanout_events < 7 or args.resume_events < 8:
        parser.error("a turn needs at least 7 events (8 to resume from its middle)")
    if args.resume_events > RESUME_CAPACITY or args.events_per_stream > RESUME_CAPACITY:
        parser.error(f"a stream holds at most {RESUME_CAPACITY:,} events (the store's default)")

    report = asyncio.run(measure(args))
    if not json_only(args.json):
        print_table(report)
    if args.json:
        write_json(args.json, report, __file__)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
