"""A live turn beside N clients replaying a long stream: does the replay starve it?

One uvicorn process serves a StreamHub. At startup it fills a finished stream ("long",
``--backlog`` deltas). For each N (0, 40, 200 by default) this process opens N replaying
clients, each reading ``/streams/long`` from the start to its end over and over (raw
sockets, the bytes read and dropped), and, once they are all reading, starts a live turn
(``--deltas`` text deltas, one every ``--interval`` seconds, each carrying its publish
time) and reads it over SSE. Reported per N: the live turn's time to first event (from
its GET being sent), the p50/p99 delivery latency of its deltas, and what the replaying
clients read meanwhile (MiB: their throughput). The target: at N = 200 the live p99 is
within 2x of N = 0.

Run ``python benchmarks/bench_fairness.py`` (about 40 s); ``--replayers 0,40,200``,
``--backlog``, ``--deltas``, ``--interval`` change the case.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
from _cli import add_json_option, json_only, write_json
from _server import ServerProcess, run_until_stdin_closes
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import essessey
from essessey.bindings.sse import hub_routes

STARTUP_TIMEOUT = 60.0


def build_app(backlog: int) -> Starlette:
    """The hub, its long finished stream, and ``POST /live?n=&i=`` to start a live turn."""
    hub = essessey.StreamHub(essessey.InMemoryEventStore(max_events_per_stream=backlog + 100))

    async def fill(publisher: essessey.Publisher) -> None:
        await publisher.send_stream_preamble("msg_long", "long", "bench")
        await publisher.send_content_block_start_text(0)
        chunks = [f"word {n} " for n in range(backlog)]
        await publisher.send_content_block_deltas_text(0, chunks)
        await publisher.send_content_block_stop(0)
        await publisher.send_stream_epilogue(essessey.StopReason.END_TURN, backlog)

    async def live(request: Request) -> Response:
        deltas, interval = int(request.query_params["n"]), float(request.query_params["i"])
        stream_id = request.query_params["id"]

        async def produce(publisher: essessey.Publisher) -> None:
            await publisher.send_stream_preamble("msg_" + stream_id, stream_id, "bench")
            await publisher.send_content_block_start_text(0)
            for j in range(deltas):
                if j:
                    await asyncio.sleep(interval)
                await publisher.send_content_block_delta_text(0, str(time.time_ns()))
            await publisher.send_content_block_stop(0)
            await publisher.send_stream_epilogue(essessey.StopReason.END_TURN, deltas)

        await hub.start(stream_id, produce)
        return Response(status_code=202)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with hub:
            await hub.start("long", fill)
            await hub.wait("long")
            yield

    routes = [*hub_routes(hub), Route("/live", live, methods=["POST"])]
    return Starlette(routes=routes, lifespan=lifespan)


async def request(port: int, head: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
    writer.write(head.encode())
    await writer.drain()
    return reader, writer


async def replay_forever(port: int, done: list[int], started: asyncio.Event) -> None:
    """Read ``/streams/long`` to its end, again and again (one connection at a time),
    counting the bytes read in ``done``."""
    first = True
    while True:
        reader, writer = await request(
            port, "GET /streams/long HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        try:
            if first:
                await reader.read(1)
                started.set()
                first = False
            while data := await reader.read(1 << 16):
                done[0] += len(data)
        finally:
            writer.close()


async def live_turn(port: int, stream_id: str, deltas: int, interval: float) -> dict[str, Any]:
    """Start the live turn, read it; its time to first event and delivery latencies."""
    reader, writer = await request(
        port,
        f"POST /live?n={deltas}&i={interval}&id={stream_id} HTTP/1.1\r\nHost: x\r\n"
        "Content-Length: 0\r\n\r\n",
    )
    await reader.readuntil(b"\r\n\r\n")
    writer.close()
    sent = time.monotonic()
    reader, writer = await request(
        port, f"GET /streams/{stream_id} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    first_event: float | None = None
    latencies: list[float] = []
    raw = b""  # the chunked body as read
    body = b""  # its chunks' data
    await reader.readuntil(b"\r\n\r\n")  # the status line and headers
    try:
        while True:
            chunk = await reader.read(1 << 16)
            if not chunk:
                break
            now_ns = time.time_ns()
            raw += chunk
            while True:  # HTTP/1.1 chunked framing: "<hex size>\r\n<data>\r\n"
                line_end = raw.find(b"\r\n")
                if line_end < 0:
                    break
                size = int(raw[:line_end], 16)
                if len(raw) < line_end + 2 + size + 2:
                    break
                body += raw[line_end + 2 : line_end + 2 + size]
                raw = raw[line_end + 2 + size + 2 :]
            if first_event is None and b"event: " in body:
                first_event = time.monotonic() - sent
            while b"\n\n" in body:
                frame, body = body.split(b"\n\n", 1)
                if b"text_delta" in frame:
                    data = frame.split(b"data: ", 1)[1]
                    text = orjson.loads(data)["delta"]["text"]
                    latencies.append((now_ns - int(text)) / 1e6)
    finally:
        writer.close()
    latencies.sort()
    return {
        "first_event_ms": None if first_event is None else first_event * 1e3,
        "p50_ms": statistics.median(latencies) if latencies else None,
        "p99_ms": latencies[int(len(latencies) * 0.99) - 1] if latencies else None,
        "deltas": len(latencies),
    }


async def one_case(port: int, replayers: int, args: argparse.Namespace) -> dict[str, Any]:
    done = [0]
    tasks: list[asyncio.Task[None]] = []
    started = [asyncio.Event() for _ in range(replayers)]
    for n in range(replayers):
        tasks.append(asyncio.create_task(replay_forever(port, done, started[n])))
    try:
        async with asyncio.timeout(60):
            for event in started:
                await event.wait()
        result = await live_turn(port, f"live{replayers}", args.deltas, args.interval)
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(*tasks, return_exceptions=True)
    result["replayers"] = replayers
    result["replayed_mib"] = done[0] / 2**20
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replayers", default="0,40,200", help="the Ns, comma-separated")
    parser.add_argument("--backlog", type=int, default=20_000, help="deltas in the long stream")
    parser.add_argument("--deltas", type=int, default=100, help="deltas of the live turn")
    parser.add_argument("--interval", type=float, default=0.02, help="seconds between them")
    add_json_option(parser)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return run_until_stdin_closes(build_app(args.backlog), args.port, lifespan="on")
    counts = [int(n) for n in args.replayers.split(",")]
    server = ServerProcess(
        __file__, ["--backlog", str(args.backlog)], startup_timeout=STARTUP_TIMEOUT
    )
    try:
        server.wait_until_ready()
        results = [asyncio.run(one_case(server.port, n, args)) for n in counts]
    finally:
        server.stop()
    figures = {"deltas": args.deltas, "interval": args.interval, "backlog": args.backlog}
    if args.json:
        write_json(args.json, {**figures, "cases": results}, __file__)
    if json_only(args.json):
        return 0
    print(
        f"a live turn of {args.deltas} deltas every {args.interval * 1e3:g} ms beside N "
        f"clients replaying a {args.backlog}-delta stream (h11, one uvicorn process)"
    )
    print(f"{'N':>5} {'first event ms':>15} {'p50 ms':>8} {'p99 ms':>8} {'replayed MiB':>13}")
    for r in results:
        first = "-" if r["first_event_ms"] is None else f"{r['first_event_ms']:.1f}"
        p50 = "-" if r["p50_ms"] is None else f"{r['p50_ms']:.2f}"
        p99 = "-" if r["p99_ms"] is None else f"{r['p99_ms']:.2f}"
        mib = f"{r['replayed_mib']:.1f}"
        print(f"{r['replayers']:>5} {first:>15} {p50:>8} {p99:>8} {mib:>13}")
    base, last = results[0].get("p99_ms"), results[-1].get("p99_ms")
    if base and last and counts[0] == 0:
        verdict = "met" if last <= 2 * base else "missed"
        print(
            f"N={counts[-1]} live p99 / N=0 live p99 = {last / base:.2f} (target <= 2: {verdict})"
        )
    print(f"Python {sys.version.split()[0]}, essessey {essessey.__version__}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
