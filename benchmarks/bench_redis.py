"""The three event stores side by side: the in-memory store, Redis and NATS JetStream.

Run ``python benchmarks/bench_redis.py [--json PATH]`` (about a minute; it starts a
redis-server and a nats-server of its own on free loopback ports, in temporary
directories, and stops them). Four measurements, each on every backend in one run:

- append: one turn of 2,000 text deltas published through a Publisher into a hub on the
  store, events/s (the writer waits for each append, as a turn does);
- fan-out: 1,000 subscribers following one 500-event turn, split over two store
  instances with connections of their own (two replicas' worth), the turn written by a
  third: deliveries/s (subscribers x events / the time from the first append to the last
  delivery). The in-memory store has no second replica: its 1,000 follow one store;
- resume over HTTP: a uvicorn process serving ``hub_routes`` on the store, a finished
  10,000-event turn resumed from its middle with ``Last-Event-ID``, the time from the GET
  to the first whole event (median and p99 of 200); target for Redis: within 2x of the
  in-memory store;
- Redis memory per retained event: 100 streams of 1,000 text-turn events, ``MEMORY
  USAGE`` of every key a stream has, divided by the events, beside the mean payload;
  target: at most 2 x payload + 200 bytes.

See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import nats
import redis.asyncio as aioredis
from _cli import add_json_option, json_only, write_json
from _server import ServerProcess, nats_server, redis_server, run_until_stdin_closes
from bench_store import (
    RESUME_STREAM,
    make_chunks,
    one_http_resume,
    percentile,
    read_whole_stream,
    resume_chunks,
    text_turn,
)
from starlette.applications import Starlette

import essessey
from essessey.bindings.sse import hub_routes
from essessey.stores.jetstream import JetStreamEventStore
from essessey.stores.redis import RedisEventStore

BACKENDS = ("memory", "redis", "jetstream")
STARTUP_TIMEOUT = 60.0
TARGET_FACTOR, TARGET_OVERHEAD = 2.0, 200
RESUME_TARGET = 2.0


# -- the servers ---------------------------------------------------------------------------


class Urls:
    redis = ""
    nats = ""


_names = iter(range(1, 1_000_000))


@contextlib.asynccontextmanager
async def open_store(backend: str, urls: type[Urls], name: str = "") -> AsyncIterator[Any]:
    """A store of ``backend``; ``name`` shares one (a Redis prefix, a JetStream stream)."""
    name = name or f"b{next(_names)}"
    if backend == "memory":
        yield essessey.InMemoryEventStore()
    elif backend == "redis":
        async with RedisEventStore.from_url(urls.redis, prefix=name) as store:
            yield store
    else:
        nc = await nats.connect(urls.nats)
        try:
            yield await JetStreamEventStore.connect(
                nc, stream=name.upper(), prefix=name, max_msgs=-1, storage="memory"
            )
        finally:
            await nc.close()


# -- (a) append ------------------------------------------------------------------------------


async def measure_append(backend: str, urls: type[Urls], events: int) -> dict[str, Any]:
    chunks = make_chunks(random.Random(1), events)
    async with open_store(backend, urls) as store, essessey.StreamHub(store) as hub:
        start = time.perf_counter()
        await hub.start("append", text_turn("append", chunks))
        await hub.wait("append")
        seconds = time.perf_counter() - start
        stored, _ = await store.since("append", None)
    if len(stored) != events + 6:
        raise SystemExit(f"append on {backend}: {len(stored)} stored of {events + 6}")
    return {"events": events + 6, "events_per_s": (events + 6) / seconds}


# -- (b) fan-out ------------------------------------------------------------------------------


async def measure_fanout(
    backend: str, urls: type[Urls], subscribers: int, events: int
) -> dict[str, Any]:
    chunks = make_chunks(random.Random(2), events - 6)
    name = f"f{next(_names)}"
    replicas = 1 if backend == "memory" else 2
    async with contextlib.AsyncExitStack() as stack:
        writer = await stack.enter_async_context(open_store(backend, urls, name))
        readers = (
            [writer]
            if backend == "memory"
            else [
                await stack.enter_async_context(open_store(backend, urls, name))
                for _ in range(replicas)
            ]
        )
        await writer.open_stream("fan")
        counts = [0] * subscribers
        ready = anyio.Event()
        attached = [0]
        done_at = [0.0]

        async def follow(k: int) -> None:
            events_seen = 0
            stream = readers[k % len(readers)].follow("fan")
            async with contextlib.aclosing(stream):
                attached[0] += 1
                if attached[0] == subscribers:
                    ready.set()
                async for _ in stream:
                    events_seen += 1
            counts[k] = events_seen
            done_at[0] = max(done_at[0], time.perf_counter())

        with anyio.fail_after(300):
            async with anyio.create_task_group() as tasks:
                for k in range(subscribers):
                    tasks.start_soon(follow, k)
                await ready.wait()
                await anyio.sleep(0.5)  # every follower subscribed and waiting
                start = time.perf_counter()
                publisher = essessey.Publisher(_StoreSink(writer, "fan"))
                await text_turn("fan", chunks)(publisher)
                await writer.close_stream("fan")
    if set(counts) != {events}:
        raise SystemExit(f"fan-out on {backend}: counts {sorted(set(counts))}, expected {events}")
    seconds = done_at[0] - start
    return {
        "subscribers": subscribers,
        "replicas": replicas,
        "events": events,
        "seconds": seconds,
        "deliveries_per_s": subscribers * events / seconds,
    }


class _StoreSink:
    def __init__(self, store: Any, stream_id: str) -> None:
        self.store, self.stream_id = store, stream_id

    async def emit(self, event: essessey.Event) -> None:
        await self.store.append(self.stream_id, event)


# -- (c) resume over HTTP ----------------------------------------------------------------------


def build_app(backend: str, url: str, events: int) -> Starlette:
    urls = type("ServeUrls", (Urls,), {"redis": url, "nats": url})
    stack = contextlib.AsyncExitStack()
    holder: dict[str, essessey.StreamHub] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with stack:
            store = await stack.enter_async_context(open_store(backend, urls))
            hub = await stack.enter_async_context(essessey.StreamHub(store))
            holder["hub"] = hub
            await hub.start(RESUME_STREAM, text_turn(RESUME_STREAM, resume_chunks(events)))
            await hub.wait(RESUME_STREAM)
            yield

    class LateHub:
        """The routes are built before the lifespan has made the hub."""

        def __getattr__(self, name: str) -> Any:
            return getattr(holder["hub"], name)

    return Starlette(routes=list(hub_routes(LateHub())), lifespan=lifespan)  # type: ignore[arg-type]


async def measure_resume(backend: str, url: str, events: int, resumes: int) -> dict[str, Any]:
    server = ServerProcess(
        __file__,
        ["--backend", backend, "--url", url, "--resume-events", str(events)],
        startup_timeout=STARTUP_TIMEOUT,
    )
    try:
        server.wait_until_ready()
        received = await read_whole_stream(server.port, events)
        middle, expected = received[events // 2 - 1].id, received[events // 2].id
        assert middle is not None
        assert expected is not None
        await one_http_resume(server.port, middle, expected)  # warm-up
        samples = [
            (await one_http_resume(server.port, middle, expected))[0] for _ in range(resumes)
        ]
    finally:
        server.stop()
    return {
        "resumes": resumes,
        "median_ms": statistics.median(samples) * 1e3,
        "p99_ms": percentile(samples, 0.99) * 1e3,
    }


# -- (d) Redis memory per event ------------------------------------------------------------------


async def measure_redis_memory(url: str, streams: int, per_stream: int) -> dict[str, Any]:
    rng = random.Random(4)
    prefix = f"m{next(_names)}"
    payload = 0
    async with RedisEventStore.from_url(url, prefix=prefix) as store:
        for s in range(streams):
            sink = essessey.InMemorySink()
            await text_turn(f"s{s}", make_chunks(rng, per_stream - 6))(essessey.Publisher(sink))
            for event in sink.events:
                await store.append(f"s{s}", event)
                payload += len(event.data)
        client = aioredis.Redis.from_url(url)
        try:
            used = 0
            for s in range(streams):
                for kind in ("m", "e"):
                    used += int(await client.memory_usage(f"{prefix}:s{s}:{kind}", samples=0) or 0)
        finally:
            await client.aclose()
    events = streams * per_stream
    per_event, payload_per_event = used / events, payload / events
    target = TARGET_FACTOR * payload_per_event + TARGET_OVERHEAD
    return {
        "events": events,
        "bytes_per_event": per_event,
        "payload_per_event": payload_per_event,
        "target": target,
        "met": per_event <= target,
    }


# -- the run ----------------------------------------------------------------------------------


async def run(args: argparse.Namespace, urls: type[Urls]) -> dict[str, Any]:
    report: dict[str, Any] = {}
    wanted = {args.only} if args.only else {"append", "fanout", "resume", "memory"}
    for backend in BACKENDS:
        if "append" in wanted:
            figures = await measure_append(backend, urls, args.append_events)
            report.setdefault("append", {})[backend] = figures
            print(f"append {backend}: {figures}", file=sys.stderr)
        if "fanout" in wanted:
            figures = await measure_fanout(backend, urls, args.subscribers, args.fanout_events)
            report.setdefault("fanout", {})[backend] = figures
            print(f"fan-out {backend}: {figures}", file=sys.stderr)
        if "resume" in wanted:
            url = urls.redis if backend == "redis" else urls.nats
            figures = await measure_resume(backend, url, args.resume_events, args.resumes)
            report.setdefault("resume", {})[backend] = figures
            print(f"resume {backend}: {figures}", file=sys.stderr)
    if "memory" in wanted:
        report["redis_memory"] = await measure_redis_memory(urls.redis, 100, 1_000)
    return report


def print_report(report: dict[str, Any]) -> None:
    if set(report) != {"append", "fanout", "resume", "redis_memory", "seconds"}:
        print(json.dumps(report, indent=2))
        return
    memory_resume = report["resume"]["memory"]["median_ms"]
    print(
        f"{'backend':<10} {'append ev/s':>12} {'fan-out deliveries/s':>21} "
        f"{'resume median ms':>17} {'p99 ms':>7} {'x memory':>8}"
    )
    for backend in BACKENDS:
        resume = report["resume"][backend]
        print(
            f"{backend:<10} {report['append'][backend]['events_per_s']:>12,.0f} "
            f"{report['fanout'][backend]['deliveries_per_s']:>21,.0f} "
            f"{resume['median_ms']:>17.2f} {resume['p99_ms']:>7.2f} "
            f"{resume['median_ms'] / memory_resume:>8.2f}"
        )
    m = report["redis_memory"]
    print(
        f"Redis memory: {m['bytes_per_event']:.0f} bytes per retained event, payload "
        f"{m['payload_per_event']:.0f}; target <= {m['target']:.0f} "
        f"({'met' if m['met'] else 'MISSED'})"
    )
    ratio = report["resume"]["redis"]["median_ms"] / memory_resume
    print(
        f"resume over HTTP, Redis / memory: {ratio:.2f}x (target <= {RESUME_TARGET:g}x: "
        f"{'met' if ratio <= RESUME_TARGET else 'MISSED'})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--append-events", type=int, default=2_000)
    parser.add_argument("--subscribers", type=int, default=1_000)
    parser.add_argument("--fanout-events", type=int, default=500)
    parser.add_argument("--resume-events", type=int, default=10_000)
    parser.add_argument("--resumes", type=int, default=200)
    parser.add_argument(
        "--only", choices=["append", "fanout", "resume", "memory"], help="one measurement"
    )
    add_json_option(parser)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="memory", help=argparse.SUPPRESS)
    parser.add_argument("--url", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        app = build_app(args.backend, args.url, args.resume_events)
        return run_until_stdin_closes(app, args.port, lifespan="on")
    with redis_server() as redis, nats_server() as broker:
        urls = type("RunUrls", (Urls,), {"redis": redis.url, "nats": broker.url})
        started = time.monotonic()
        report = asyncio.run(run(args, urls))
    report["seconds"] = time.monotonic() - started
    if not json_only(args.json):
        print_report(report)
    if args.json:
        write_json(args.json, report, __file__)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
