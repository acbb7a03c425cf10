"""Events/s through a real nats-server: essessey's NATS binding beside raw nats-py.

Run ``python benchmarks/bench_nats.py [--events N] [--js-events M] [--repeat R] [--json]``
(about a minute with the defaults). The script starts its own nats-server (JetStream on,
a temporary store directory, a free loopback port) and always stops it at the end. Two
parts, each timed in interleaved rounds, best of R:

- core NATS: a text turn of N deltas from a ``Publisher`` through ``NATSSink`` to
  ``NATSSource`` (``subscribe_stream``), beside raw nats-py publish/subscribe of the same
  bytes to the same subjects (a callback subscriber, the fastest raw reader and the
  baseline, and the async-iterator reader), with and without event ids in headers;
- the JetStream store: a turn of M deltas through ``JetStreamEventStore`` (a StreamHub
  turn, and direct appends) with a follower on another connection receiving it live,
  beside raw ``js.publish`` and an ordered-consumer subscriber; the same with several
  concurrent streams; and the replay rate of a finished stream (``follow`` from the
  start) beside a raw ordered consumer.

Every rate is end to end: from the first publish to the last event received. See
benchmarks/README.md for what the variants mean and how to read the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import os
import platform
import pstats
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import nats
from _cli import add_json_option, json_only, write_json
from _server import NatsServer, nats_server
from _turn import make_chunks, publish_turn, recorded_turn
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.client import JetStreamContext

import essessey

# Not exported: the one place that reaches into nats-py (see its docstring); a benchmark
# needs the same certainty that a subscription reached the server before it publishes.
from essessey._nats_py import flush_connection
from essessey.bindings.nats import HEADER_EVENT_ID, NATSSink, subscribe_stream
from essessey.stores.jetstream import JetStreamEventStore

TARGET_RATIO = 0.7
"""Each library path must reach this share of its raw nats-py baseline's events/s."""

STARTUP_TIMEOUT = 15.0
RUN_TIMEOUT = 120.0
"""Seconds one timed run may take before the benchmark gives up (events were lost)."""

CORE_PREFIX = "essessey"
CORE_STREAM = "bench"
JS_STREAM = "ESSESSEY_BENCH"
JS_PREFIX = "essessey-js"
"""The JetStream store's stream and prefix: apart from the core subjects, so the core
messages are never stored by JetStream."""

# Variant names.
LIB = "essessey Publisher -> NATSSink -> NATSSource"
LIB_SINK = "essessey NATSSink -> NATSSource (events built in advance)"
RAW_CB = "raw nats-py publish -> callback subscriber"
RAW_ITER = "raw nats-py publish -> sub.messages iterator"
JS_HUB = "essessey StreamHub turn -> hub.subscribe on another store"
JS_DIRECT = "essessey store.append -> store.follow on another store"
JS_RAW = "raw js.publish -> ordered consumer (callback)"
JS_RAW_MSGID = "raw js.publish with Nats-Msg-Id -> ordered consumer (callback)"
JS_CONC_HUB = "essessey StreamHub turns -> hub.subscribe"
JS_CONC_RAW = "raw js.publish -> ordered consumers (callback)"
JS_CONC_RAW_MSGID = "raw js.publish with Nats-Msg-Id -> ordered consumers (callback)"
REPLAY_LIB = "essessey store.follow(stream_id) from the start"
REPLAY_RAW_CB = "raw ordered consumer (callback)"
REPLAY_RAW_NEXT = "raw ordered consumer (sub.next_msg loop)"


# -- the nats-server -------------------------------------------------------------------


def server_version() -> str:
    binary = shutil.which("nats-server")
    if binary is None:
        return "n/a"
    result = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    return result.stdout.strip().removeprefix("nats-server: ") or "n/a"


# -- the turn ----------------------------------------------------------------------------


class IdSink:
    """Gives each event the next of a list of ids, as a relay of stored events would."""

    __slots__ = ("_emit", "_ids")

    def __init__(self, sink: NATSSink, ids: list[str]) -> None:
        self._emit = sink.emit
        self._ids = iter(ids)

    async def emit(self, event: essessey.Event) -> None:
        await self._emit(event.with_id(next(self._ids)))


# -- running and timing --------------------------------------------------------------------


@dataclass
class Connections:
    url: str
    server_pid: int
    pub: Client
    sub: Client
    errors: list[str] = field(default_factory=list)


@contextlib.asynccontextmanager
async def connections(server: NatsServer) -> AsyncIterator[Connections]:
    """Two connections: the producer's and the reader's (another replica, as it were)."""
    errors: list[str] = []

    async def error_cb(exc: Exception) -> None:
        # A slow consumer (messages dropped) shows up here; a run then times out.
        errors.append(repr(exc))

    pub = await nats.connect(server.url, error_cb=error_cb, allow_reconnect=False)
    try:
        sub = await nats.connect(server.url, error_cb=error_cb, allow_reconnect=False)
        try:
            yield Connections(server.url, server.pid, pub, sub, errors)
        finally:
            await sub.close()
    finally:
        await pub.close()


Run = Callable[[], Awaitable[tuple[float, int]]]
"""One timed run: (seconds from the first publish to the last event received, events)."""


async def timed(conns: Connections, name: str, run: Run) -> tuple[float, int]:
    try:
        async with asyncio.timeout(RUN_TIMEOUT):
            return await run()
    except TimeoutError:
        raise SystemExit(
            f"{name}: not every event arrived within {RUN_TIMEOUT} s "
            f"(client errors: {conns.errors or 'none'})"
        ) from None


@dataclass
class Measured:
    """The best run of a variant, and the CPU all its timed runs used."""

    seconds: float = float("inf")
    events: int = 0
    runs: int = 0
    total_events: int = 0
    client_cpu: float = 0.0
    server_cpu: float | None = 0.0


def server_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc; else None)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


async def interleave(
    conns: Connections, variants: dict[str, Run], repeat: int
) -> dict[str, Measured]:
    """Run every variant once per round, R rounds; the best time of each, and the CPU
    time this process and the nats-server used over all of them."""
    measured = {name: Measured() for name in variants}
    for _ in range(repeat):
        # Interleaved rounds spread a noisy neighbour's burst over every variant instead
        # of letting it land on one.
        for name, run in variants.items():
            gc.collect()
            entry = measured[name]
            client_before = time.process_time()
            server_before = server_cpu_seconds(conns.server_pid)
            seconds, events = await timed(conns, name, run)
            server_after = server_cpu_seconds(conns.server_pid)
            entry.client_cpu += time.process_time() - client_before
            if entry.server_cpu is not None and server_before is not None and server_after:
                entry.server_cpu += server_after - server_before
            else:
                entry.server_cpu = None
            entry.runs += 1
            entry.total_events += events
            if seconds < entry.seconds:
                entry.seconds, entry.events = seconds, events
    return measured


def rows(measured: dict[str, Measured], baseline: str) -> list[dict[str, Any]]:
    base = measured[baseline].events / measured[baseline].seconds
    results = []
    for name, entry in measured.items():
        rate = entry.events / entry.seconds
        server = entry.server_cpu
        results.append(
            {
                "variant": name,
                "events": entry.events,
                "best_seconds": entry.seconds,
                "events_per_second": rate,
                "ratio_to_baseline": rate / base,
                "client_cpu_us_per_event": entry.client_cpu / entry.total_events * 1e6,
                "server_cpu_us_per_event": (
                    None if server is None else server / entry.total_events * 1e6
                ),
            }
        )
    return results


def target(results: list[dict[str, Any]], variant: str, baseline: str) -> dict[str, Any]:
    ratio = next(r["ratio_to_baseline"] for r in results if r["variant"] == variant)
    return {
        "variant": variant,
        "baseline": baseline,
        "min_ratio": TARGET_RATIO,
        "ratio": ratio,
        "met": ratio >= TARGET_RATIO,
    }


# -- core NATS ----------------------------------------------------------------------------


class CoreBench:
    """Core NATS: one stream's subjects, a producer connection and a reader connection."""

    def __init__(self, conns: Connections, chunks: list[str], events: list[essessey.Event]):
        self.conns = conns
        self.chunks = chunks
        self.events = events
        self.total = len(events)
        self.ids = [f"3f2a9c1b-{n}" for n in range(1, self.total + 1)]
        self.subjects = [f"{CORE_PREFIX}.{CORE_STREAM}.{event.event}" for event in events]
        self.datas = [event.data for event in events]
        self.headers = [{HEADER_EVENT_ID: event_id} for event_id in self.ids]
        self.expected = events
        self.expected_with_ids = [
            event.with_id(event_id) for event, event_id in zip(events, self.ids, strict=True)
        ]
        self.received: list[Any] = []

    async def _library(self, *, ids: bool, publisher: bool) -> tuple[float, int]:
        conns, total = self.conns, self.total
        source = await subscribe_stream(conns.sub, CORE_STREAM, prefix=CORE_PREFIX)
        received: list[essessey.Event] = []
        append = received.append
        end = 0.0

        async def read() -> None:
            nonlocal end
            async for event in source:
                append(event)
                if len(received) == total:
                    end = time.perf_counter()
                    break

        reader = asyncio.create_task(read())
        await asyncio.sleep(0)  # the reader is waiting before the first publish
        sink = NATSSink(conns.pub, CORE_STREAM, prefix=CORE_PREFIX)
        start = time.perf_counter()
        if publisher:
            await publish_turn(
                essessey.Publisher(IdSink(sink, self.ids) if ids else sink), self.chunks
            )
        else:
            emit = sink.emit
            for event in self.expected_with_ids if ids else self.expected:
                await emit(event)
        await reader
        await source.aclose()
        await flush_connection(conns.sub)
        if received != (self.expected_with_ids if ids else self.expected):
            raise SystemExit("the library path delivered other events than were published")
        self.received = received
        return end - start, total

    async def _raw_callback(self, *, ids: bool) -> tuple[float, int]:
        conns, total = self.conns, self.total
        received: list[Msg] = []
        append = received.append
        done = asyncio.Event()
        end = 0.0

        async def callback(msg: Msg) -> None:
            nonlocal end
            append(msg)
            if len(received) == total:
                end = time.perf_counter()
                done.set()

        sub = await conns.sub.subscribe(f"{CORE_PREFIX}.{CORE_STREAM}.*", cb=callback)
        await flush_connection(conns.sub)
        publish = conns.pub.publish
        start = time.perf_counter()
        if ids:
            for subject, data, headers in zip(self.subjects, self.datas, self.headers, strict=True):
                await publish(subject, data, headers=headers)
        else:
            for subject, data in zip(self.subjects, self.datas, strict=True):
                await publish(subject, data)
        await done.wait()
        await sub.unsubscribe()
        await flush_connection(conns.sub)
        self.received = received
        return end - start, total

    async def _raw_iterator(self, *, ids: bool) -> tuple[float, int]:
        conns, total = self.conns, self.total
        sub = await conns.sub.subscribe(f"{CORE_PREFIX}.{CORE_STREAM}.*")
        await flush_connection(conns.sub)
        received: list[Msg] = []
        append = received.append
        end = 0.0

        async def read() -> None:
            nonlocal end
            async for msg in sub.messages:
                append(msg)
                if len(received) == total:
                    end = time.perf_counter()
                    break

        reader = asyncio.create_task(read())
        await asyncio.sleep(0)
        publish = conns.pub.publish
        start = time.perf_counter()
        if ids:
            for subject, data, headers in zip(self.subjects, self.datas, self.headers, strict=True):
                await publish(subject, data, headers=headers)
        else:
            for subject, data in zip(self.subjects, self.datas, strict=True):
                await publish(subject, data)
        await reader
        await sub.unsubscribe()
        await flush_connection(conns.sub)
        self.received = received
        return end - start, total

    def variants(self, *, ids: bool) -> dict[str, Run]:
        suffix = ", ids" if ids else ""

        async def library() -> tuple[float, int]:
            return await self._library(ids=ids, publisher=True)

        async def library_sink() -> tuple[float, int]:
            return await self._library(ids=ids, publisher=False)

        async def raw_callback() -> tuple[float, int]:
            return await self._raw_callback(ids=ids)

        async def raw_iterator() -> tuple[float, int]:
            return await self._raw_iterator(ids=ids)

        return {
            LIB + suffix: library,
            LIB_SINK + suffix: library_sink,
            RAW_CB + suffix: raw_callback,
            RAW_ITER + suffix: raw_iterator,
        }

    def check_raw(self, *, ids: bool) -> None:
        # The raw readers got the same subjects, bytes and ids the library sent.
        got = [
            (msg.subject, msg.data, (msg.headers or {}).get(HEADER_EVENT_ID))
            for msg in self.received
        ]
        want = list(
            zip(self.subjects, self.datas, self.ids if ids else [None] * self.total, strict=True)
        )
        if got != want:
            raise SystemExit("a raw reader received other messages than were published")


async def measure_core(server: NatsServer, deltas: int, repeat: int) -> dict[str, Any]:
    chunks = make_chunks(deltas)
    events = await recorded_turn(chunks)
    async with connections(server) as conns:
        bench = CoreBench(conns, chunks, events)
        variants = {**bench.variants(ids=False), **bench.variants(ids=True)}
        # One untimed run of each checks what arrives (the library runs check it every
        # time, the raw ones here).
        for name, run in variants.items():
            await timed(conns, name, run)
            if name.startswith("raw"):
                bench.check_raw(ids=name.endswith(", ids"))
        best = await interleave(conns, variants, repeat)
    results: list[dict[str, Any]] = []
    targets = []
    for suffix in ("", ", ids"):
        ids = bool(suffix)
        part = {name: value for name, value in best.items() if name.endswith(", ids") == ids}
        section = rows(part, RAW_CB + suffix)
        results.extend(section)
        targets.append(target(section, LIB + suffix, RAW_CB + suffix))
    return {
        "deltas": deltas,
        "events": len(events),
        "repeat": repeat,
        "results": results,
        "targets": targets,
    }


# -- JetStream ----------------------------------------------------------------------------


class JetStreamBench:
    """The JetStream store: producer on one connection, follower on the other."""

    def __init__(
        self,
        conns: Connections,
        writer: JetStreamEventStore,
        reader: JetStreamEventStore,
        chunks: list[str],
        events: list[essessey.Event],
        streams: int,
    ) -> None:
        self.conns = conns
        self.writer = writer
        self.reader = reader
        self.chunks = chunks
        self.events = events
        self.total = len(events)
        self.streams = streams
        self.conc_chunks = chunks[: max(1, len(chunks) // streams)]
        self.conc_events: list[essessey.Event] = []  # recorded by measure_jetstream
        self.js_pub: JetStreamContext = conns.pub.jetstream()
        self.js_sub: JetStreamContext = conns.sub.jetstream()
        self.counter = 0
        self.last_turn: tuple[str, list[essessey.Event]] = ("", [])
        self.replay_stream = ""
        self.replay_events: list[essessey.Event] = []

    def new_stream_id(self, kind: str) -> str:
        self.counter += 1
        return f"{kind}{self.counter}"

    async def hub_turn(
        self, hub_a: essessey.StreamHub, hub_b: essessey.StreamHub, chunks: list[str]
    ) -> tuple[str, list[essessey.Event], float]:
        """One turn on hub A, followed through hub B; (stream id, events, end time)."""
        stream_id = self.new_stream_id("hub")
        gate = asyncio.Event()
        total = len(chunks) + 6

        async def produce(publisher: essessey.Publisher) -> None:
            # The rest of the turn waits until the follower has the first event: it then
            # receives every later one live, as it is appended.
            await publish_turn(publisher, chunks, gate)

        await hub_a.start(stream_id, produce)
        received: list[essessey.Event] = []
        end = 0.0
        async for event in hub_b.subscribe(stream_id):
            received.append(event)
            if len(received) == 1:
                gate.set()
            elif len(received) == total:
                end = time.perf_counter()
        await hub_a.wait(stream_id)
        return stream_id, received, end

    async def js_hub(
        self, hub_a: essessey.StreamHub, hub_b: essessey.StreamHub
    ) -> tuple[float, int]:
        start = time.perf_counter()
        stream_id, received, end = await self.hub_turn(hub_a, hub_b, self.chunks)
        self.check_events(received, self.events)
        self.last_turn = stream_id, received
        return end - start, len(received)

    async def js_direct(self) -> tuple[float, int]:
        stream_id = self.new_stream_id("direct")
        writer, reader, total = self.writer, self.reader, self.total
        received: list[essessey.Event] = []
        end = 0.0
        first = asyncio.Event()

        async def follow() -> None:
            nonlocal end
            async for event in reader.follow(stream_id):
                received.append(event)
                if len(received) == 1:
                    first.set()
                elif len(received) == total:
                    end = time.perf_counter()

        start = time.perf_counter()
        await writer.open_stream(stream_id)
        follower = asyncio.create_task(follow())
        events = iter(self.events)
        await writer.append(stream_id, next(events))
        await first.wait()  # live from here on
        append = writer.append
        for event in events:
            await append(stream_id, event)
        await writer.close_stream(stream_id)
        await follower
        self.check_events(received, self.events)
        return end - start, total

    async def raw_turn(self, events: list[essessey.Event], *, msg_id: bool) -> float:
        """Raw js.publish of the events' bytes to a new stream id's subjects, read by an
        ordered consumer (callback); the time of the last message received."""
        stream_id = self.new_stream_id("raw")
        base = f"{JS_PREFIX}.{stream_id}."
        total = len(events)
        done = asyncio.Event()
        count = 0
        end = 0.0

        async def callback(msg: Msg) -> None:
            nonlocal count, end
            count += 1
            if count == total:
                end = time.perf_counter()
                done.set()

        sub = await self.js_sub.subscribe(
            base + ">", stream=JS_STREAM, cb=callback, ordered_consumer=True
        )
        publish = self.js_pub.publish
        token = f"raw-{stream_id}-"
        for n, event in enumerate(events):
            if msg_id:
                await publish(
                    base + event.event, event.data, headers={"Nats-Msg-Id": token + str(n)}
                )
            else:
                await publish(base + event.event, event.data)
        await done.wait()
        await sub.unsubscribe()
        return end

    async def js_raw(self, *, msg_id: bool) -> tuple[float, int]:
        start = time.perf_counter()
        end = await self.raw_turn(self.events, msg_id=msg_id)
        return end - start, self.total

    async def js_conc_hub(
        self, hub_a: essessey.StreamHub, hub_b: essessey.StreamHub
    ) -> tuple[float, int]:
        start = time.perf_counter()
        turns = await asyncio.gather(
            *(self.hub_turn(hub_a, hub_b, self.conc_chunks) for _ in range(self.streams))
        )
        for _stream_id, received, _end in turns:
            self.check_events(received, self.conc_events)
        end = max(turn[2] for turn in turns)
        return end - start, sum(len(turn[1]) for turn in turns)

    async def js_conc_raw(self, *, msg_id: bool) -> tuple[float, int]:
        start = time.perf_counter()
        ends = await asyncio.gather(
            *(self.raw_turn(self.conc_events, msg_id=msg_id) for _ in range(self.streams))
        )
        return max(ends) - start, self.streams * len(self.conc_events)

    async def replay_library(self) -> tuple[float, int]:
        received: list[essessey.Event] = []
        total = len(self.replay_events)
        end = 0.0
        start = time.perf_counter()
        async for event in self.reader.follow(self.replay_stream):
            received.append(event)
            if len(received) == total:
                end = time.perf_counter()
        if received != self.replay_events:
            raise SystemExit("follow() replayed other events than the turn's")
        return end - start, total

    async def replay_raw_callback(self) -> tuple[float, int]:
        done = asyncio.Event()
        count = 0
        end = 0.0

        async def callback(msg: Msg) -> None:
            nonlocal count, end
            count += 1
            if msg.metadata.num_pending == 0:
                end = time.perf_counter()
                done.set()

        start = time.perf_counter()
        sub = await self.js_sub.subscribe(
            f"{JS_PREFIX}.{self.replay_stream}.>",
            stream=JS_STREAM,
            cb=callback,
            ordered_consumer=True,
        )
        await done.wait()
        await sub.unsubscribe()
        return end - start, count

    async def replay_raw_next(self) -> tuple[float, int]:
        start = time.perf_counter()
        sub = await self.js_sub.subscribe(
            f"{JS_PREFIX}.{self.replay_stream}.>", stream=JS_STREAM, ordered_consumer=True
        )
        count = 0
        while True:
            msg = await sub.next_msg(10.0)
            count += 1
            if msg.metadata.num_pending == 0:
                break
        end = time.perf_counter()
        await sub.unsubscribe()
        return end - start, count

    def check_events(self, received: list[essessey.Event], expected: list[essessey.Event]) -> None:
        if [(e.event, e.data) for e in received] != [(e.event, e.data) for e in expected]:
            raise SystemExit(f"a follower received {len(received)} events, not the turn's")
        ids = [event.id for event in received]
        if None in ids or len(set(ids)) != len(ids):
            raise SystemExit("a follower received events without ids, or an id twice")


async def measure_jetstream(
    server: NatsServer, deltas: int, streams: int, repeat: int, profile: str | None
) -> dict[str, Any]:
    chunks = make_chunks(deltas)
    events = await recorded_turn(chunks)
    async with connections(server) as conns:
        options: dict[str, Any] = {"stream": JS_STREAM, "prefix": JS_PREFIX}
        writer = await JetStreamEventStore.connect(conns.pub, **options)
        reader = JetStreamEventStore(conns.sub, **options)
        bench = JetStreamBench(conns, writer, reader, chunks, events, streams)
        bench.conc_events = await recorded_turn(bench.conc_chunks)
        async with essessey.StreamHub(writer) as hub_a, essessey.StreamHub(reader) as hub_b:

            async def hub() -> tuple[float, int]:
                return await bench.js_hub(hub_a, hub_b)

            async def direct() -> tuple[float, int]:
                return await bench.js_direct()

            async def raw() -> tuple[float, int]:
                return await bench.js_raw(msg_id=False)

            async def raw_msg_id() -> tuple[float, int]:
                return await bench.js_raw(msg_id=True)

            async def conc_hub() -> tuple[float, int]:
                return await bench.js_conc_hub(hub_a, hub_b)

            live: dict[str, Run] = {
                JS_HUB: hub,
                JS_DIRECT: direct,
                JS_RAW: raw,
                JS_RAW_MSGID: raw_msg_id,
            }

            async def conc_raw() -> tuple[float, int]:
                return await bench.js_conc_raw(msg_id=False)

            async def conc_raw_msg_id() -> tuple[float, int]:
                return await bench.js_conc_raw(msg_id=True)

            concurrent: dict[str, Run] = {
                JS_CONC_HUB: conc_hub,
                JS_CONC_RAW: conc_raw,
                JS_CONC_RAW_MSGID: conc_raw_msg_id,
            }
            replay: dict[str, Run] = {
                REPLAY_LIB: bench.replay_library,
                REPLAY_RAW_CB: bench.replay_raw_callback,
                REPLAY_RAW_NEXT: bench.replay_raw_next,
            }
            # Untimed first runs: every check passes, and the hub turn leaves the finished
            # stream the replay variants read.
            for name, run in {**live, **concurrent}.items():
                await timed(conns, name, run)
            bench.replay_stream, bench.replay_events = bench.last_turn
            for name, run in replay.items():
                await timed(conns, name, run)
            live_best = await interleave(conns, live, repeat)
            conc_best = await interleave(conns, concurrent, repeat)
            replay_best = await interleave(conns, replay, repeat)

            if profile is not None:
                runs: dict[str, Run] = {
                    "js-live": hub,
                    "js-concurrent": conc_hub,
                    "js-replay": bench.replay_library,
                }
                if profile in runs:
                    await profile_run(profile, runs[profile])

    live_rows = rows(live_best, JS_RAW)
    conc_rows = rows(conc_best, JS_CONC_RAW)
    replay_rows = rows(replay_best, REPLAY_RAW_CB)
    return {
        "deltas": deltas,
        "events": len(events),
        "streams": streams,
        "events_per_concurrent_stream": len(bench.conc_events),
        "repeat": repeat,
        "live": live_rows,
        "concurrent": conc_rows,
        "replay": replay_rows,
        "targets": [
            target(live_rows, JS_HUB, JS_RAW),
            target(live_rows, JS_DIRECT, JS_RAW),
            target(conc_rows, JS_CONC_HUB, JS_CONC_RAW),
            target(replay_rows, REPLAY_LIB, REPLAY_RAW_CB),
        ],
    }


# -- profiling -------------------------------------------------------------------------------


async def profile_run(name: str, run: Run, limit: int = 25) -> None:
    """One more run of ``run`` under cProfile; the hottest functions to stderr."""
    profiler = cProfile.Profile()
    gc.collect()
    profiler.enable()
    try:
        await run()
    finally:
        profiler.disable()
    print(f"\nprofile of one {name} run (events/s under cProfile mean nothing):", file=sys.stderr)
    stats = pstats.Stats(profiler, stream=sys.stderr)
    stats.sort_stats(pstats.SortKey.TIME).print_stats(limit)


async def profile_core(server: NatsServer, deltas: int, name: str) -> None:
    chunks = make_chunks(deltas)
    events = await recorded_turn(chunks)
    async with connections(server) as conns:
        bench = CoreBench(conns, chunks, events)
        variants = bench.variants(ids=name == "core-ids")
        library = variants[LIB + (", ids" if name == "core-ids" else "")]
        await library()  # warm up
        await profile_run(name, library)


# -- output ----------------------------------------------------------------------------------


def print_rows(title: str, results: list[dict[str, Any]], baseline: str) -> None:
    print(title)
    print(
        f"  {'variant':<64} {'events':>6} {'events/s':>9} {'x base':>6} "
        f"{'client us/ev':>12} {'server us/ev':>12}"
    )
    for row in results:
        mark = "  (baseline)" if row["variant"] == baseline else ""
        server = row["server_cpu_us_per_event"]
        print(
            f"  {row['variant']:<64} {row['events']:>6} {row['events_per_second']:>9,.0f} "
            f"{row['ratio_to_baseline']:>6.2f} {row['client_cpu_us_per_event']:>12.1f} "
            f"{'n/a' if server is None else f'{server:.1f}':>12}{mark}"
        )
    print()


def print_report(report: dict[str, Any]) -> None:
    core, js = report["core"], report["jetstream"]
    print(
        f"nats-server {report['nats_server']}, nats-py {report['nats_py']}, "
        f"Python {report['python']}; best of {core['repeat']} interleaved runs each"
    )
    print()
    print(
        f"Core NATS: a turn of {core['events']} events ({core['deltas']} text deltas), "
        "first publish to last event received"
    )
    no_ids = [r for r in core["results"] if not r["variant"].endswith(", ids")]
    with_ids = [r for r in core["results"] if r["variant"].endswith(", ids")]
    print_rows("  without event ids", no_ids, RAW_CB)
    print_rows("  with event ids (Essessey-Event-Id header)", with_ids, RAW_CB + ", ids")
    print(
        f"JetStream store: a turn of {js['events']} events ({js['deltas']} text deltas), "
        "follower on another connection"
    )
    print_rows("  one stream, follower live", js["live"], JS_RAW)
    print_rows(
        f"  {js['streams']} concurrent streams of {js['events_per_concurrent_stream']} events",
        js["concurrent"],
        JS_CONC_RAW,
    )
    print_rows("  replay of the finished stream from its start", js["replay"], REPLAY_RAW_CB)
    print(f"targets (library >= {TARGET_RATIO} x raw):")
    for item in core["targets"] + js["targets"]:
        verdict = "met" if item["met"] else "NOT met"
        print(f"  {item['variant']}: {item['ratio']:.2f} x {item['baseline']}: {verdict}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Events/s of essessey's NATS binding beside raw nats-py, through a "
        "nats-server this script starts."
    )
    parser.add_argument("--events", type=int, default=50_000, help="text deltas, core NATS")
    parser.add_argument("--js-events", type=int, default=5_000, help="text deltas, JetStream")
    parser.add_argument("--streams", type=int, default=8, help="concurrent JetStream streams")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per variant")
    add_json_option(parser)
    parser.add_argument(
        "--profile",
        choices=["core", "core-ids", "js-live", "js-concurrent", "js-replay"],
        help="after the measurements, run that library variant once more under cProfile "
        "and print the hottest functions to stderr",
    )
    args = parser.parse_args(argv)
    if min(args.events, args.js_events, args.streams, args.repeat) < 1:
        parser.error("--events, --js-events, --streams and --repeat must be at least 1")
    if args.js_events < args.streams:
        parser.error("--js-events must be at least --streams")

    async def run(server: NatsServer) -> dict[str, Any]:
        core = await measure_core(server, args.events, args.repeat)
        js = await measure_jetstream(
            server, args.js_events, args.streams, args.repeat, args.profile
        )
        if args.profile in ("core", "core-ids"):
            await profile_core(server, args.events, args.profile)
        return {
            "python": platform.python_version(),
            "nats_py": version("nats-py"),
            "nats_server": server_version(),
            "target_ratio": TARGET_RATIO,
            "core": core,
            "jetstream": js,
        }

    with nats_server() as server:
        report = asyncio.run(run(server))
    if not json_only(args.json):
        print_report(report)
    if args.json:
        write_json(args.json, report, __file__)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
