"""How many events/s essessey's SSE response delivers over real HTTP, next to sse-starlette
and a raw ASGI app that sends one pre-framed event per send.

Run ``python benchmarks/bench_sse_e2e.py [--events N] [--clients 1,8] [--repeat R] [--json]``.
One uvicorn server process on loopback serves three endpoints that stream the same turn
(preamble, one text block of N deltas, epilogue); httpx clients read each whole stream, 1
at a time and then several at once. Variants are interleaved and the best of R runs counts;
a dialect's server CPU is compared with the protocol's round by round (median of R).
See benchmarks/README.md for what the variants mean and how to read the ratios.

``--profile-server PATH`` runs the server under cProfile, writes the stats to PATH and
prints the hottest functions (profiling slows the server: its events/s mean nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib.metadata import version
from typing import Any

import httpx
import orjson
from _cli import add_json_option, json_only, parse_clients, print_profile, write_json
from _server import ServerProcess, run_until_stdin_closes
from _turn import make_chunks, publish_turn, recorded_turn
from sse_starlette import EventSourceResponse
from starlette.types import Receive, Scope, Send

import essessey
from essessey.bindings.sse import EventStreamResponse, FrameEncoder, SSEDecoder
from essessey.dialects.agui import AGUIEncoder
from essessey.dialects.chat_completions import ChatCompletionsEncoder
from essessey.dialects.responses import ResponsesEncoder
from essessey.dialects.ui import UIMessageEncoder

ESSESSEY = "essessey"
STARLETTE = "sse-starlette"
RAW = "raw per-event"
# The same turn in the other wire dialects, through the same response (docs/dialects.md).
DIALECTS: dict[str, tuple[Callable[[], FrameEncoder], bytes]] = {
    "ui": (lambda: UIMessageEncoder(message_id="turn"), b"data: [DONE]"),
    "agui": (lambda: AGUIEncoder("thread", "run"), b'"RUN_FINISHED"'),
    "chat-completions": (lambda: ChatCompletionsEncoder("chatcmpl-1"), b"data: [DONE]"),
    "responses": (lambda: ResponsesEncoder("resp_1"), b"response.completed"),
}
VARIANTS: dict[str, str] = {
    ESSESSEY: "/essessey",
    STARLETTE: "/sse-starlette",
    RAW: "/raw",
    **{name: "/" + name for name in DIALECTS},
}
# sse-starlette ends its lines with CRLF by default; the others write LF.
SEPARATORS: dict[str, bytes] = {
    ESSESSEY: b"\n\n",
    STARLETTE: b"\r\n\r\n",
    RAW: b"\n\n",
    **dict.fromkeys(DIALECTS, b"\n\n"),
}
LABELS: dict[str, str] = {
    ESSESSEY: "essessey EventStreamResponse",
    STARLETTE: "sse-starlette EventSourceResponse",
    RAW: "raw ASGI, one event per send",
    "ui": "essessey, as the UI message stream",
    "agui": "essessey, as AG-UI events",
    "chat-completions": "essessey, as Chat Completions chunks",
    "responses": "essessey, as Responses events",
}
TARGET_DIALECT_VS_ESSESSEY = 1.3
"""A dialect's server CPU per protocol event, at most this many times the protocol's."""

TARGET_VS_STARLETTE = 5.0
TARGET_VS_RAW = 1.0
CPU_PATH = "/cpu"
"""The server's own CPU time so far, in seconds: read by the clock a process has
(nanoseconds), not from /proc (10 ms ticks, a tenth of one short run)."""
STARTUP_TIMEOUT = 30.0
REQUEST_TIMEOUT = 300.0

Payloads = list[tuple[str, dict[str, Any]]]


# -- the server side -------------------------------------------------------------------


def build_app(deltas: int) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """One ASGI app, routed by path, so every variant pays the same dispatch."""
    chunks = make_chunks(deltas)
    events = asyncio.run(recorded_turn(chunks))
    payloads: Payloads = [(event.event, event.json()) for event in events]
    # Framed before any request: the raw app does nothing per event but send.
    frames = [b"event: " + e.event.encode() + b"\ndata: " + e.data + b"\n\n" for e in events]

    async def produce(publisher: essessey.Publisher) -> None:
        await publish_turn(publisher, chunks)

    async def starlette_events() -> AsyncIterator[dict[str, str]]:
        dumps = json.dumps
        for name, payload in payloads:
            yield {"event": name, "data": dumps(payload, separators=(",", ":"))}

    async def raw(send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                ],
            }
        )
        for frame in frames:
            await send({"type": "http.response.body", "body": frame, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path == VARIANTS[ESSESSEY]:
            await EventStreamResponse(produce)(scope, receive, send)
        elif path[1:] in DIALECTS:
            encoder = DIALECTS[path[1:]][0]()
            await EventStreamResponse(produce, encoder=encoder)(scope, receive, send)
        elif path == VARIANTS[STARLETTE]:
            await EventSourceResponse(starlette_events())(scope, receive, send)
        elif path == VARIANTS[RAW]:
            await raw(send)
        elif path == CPU_PATH:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"%.9f" % time.process_time()})
        else:
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b"not found"})

    return app


def serve(port: int, deltas: int, profile_path: str | None) -> int:
    """The server process: uvicorn on 127.0.0.1:port until its stdin closes."""
    return run_until_stdin_closes(
        build_app(deltas), port, lifespan="off", profile_path=profile_path
    )


# -- the client side -------------------------------------------------------------------


async def read_stream(client: httpx.AsyncClient, url: str, separator: bytes) -> tuple[int, int]:
    """Read one whole stream; return (events, bytes). Counting frame ends is all the
    parsing done here, so the client's CPU stays out of the server's way."""
    frames = 0
    size = 0
    keep = len(separator) - 1
    tail = b""
    async with client.stream("GET", url) as response:
        response.raise_for_status()
        async for chunk in response.aiter_raw():
            size += len(chunk)
            frames += chunk.count(separator)
            # A frame end split across two chunks is in neither count above.
            frames += (tail + chunk[:keep]).count(separator)
            tail = chunk[-keep:]
    return frames, size


async def verify(
    client: httpx.AsyncClient, base_url: str, deltas: int
) -> tuple[int, dict[str, int]]:
    """Check, before timing, that every endpoint streams the same events (each dialect
    its whole turn, to its own end); the turn's events, and each dialect's frames."""
    expected = [(e.event, e.json()) for e in await recorded_turn(make_chunks(deltas))]
    frames: dict[str, int] = {}
    for variant, path in VARIANTS.items():
        response = await client.get(base_url + path)
        response.raise_for_status()
        if variant in DIALECTS:
            body = response.content
            if DIALECTS[variant][1] not in body.rstrip().rsplit(b"\n\n", 1)[-1]:
                raise SystemExit(f"{variant} did not stream the turn to its end")
            frames[variant] = body.count(b"\n\n")
            continue
        decoder = SSEDecoder()
        messages = decoder.feed(response.content) + decoder.close()
        got = [(message.event, orjson.loads(message.data)) for message in messages]
        if got != expected:
            raise SystemExit(f"{variant} streamed different events from the recorded turn")
        if essessey.check([essessey.Event(name, orjson.dumps(data)) for name, data in got]):
            raise SystemExit(f"{variant} streamed events that break the protocol")
    return len(expected), frames


async def timed_run(
    client: httpx.AsyncClient, url: str, separator: bytes, clients: int, expected: int
) -> tuple[float, int, int]:
    start = time.perf_counter()
    results = await asyncio.gather(*(read_stream(client, url, separator) for _ in range(clients)))
    elapsed = time.perf_counter() - start
    for events, _size in results:
        if events != expected:
            raise SystemExit(f"{url}: {events} events received, {expected} expected")
    return elapsed, sum(r[0] for r in results), sum(r[1] for r in results)


async def server_cpu_seconds(client: httpx.AsyncClient, base_url: str) -> float:
    """The bench server's CPU time so far (its ``/cpu`` route)."""
    response = await client.get(base_url + CPU_PATH)
    response.raise_for_status()
    return float(response.text)


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process so far (Linux; None elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            # The command name (field 2) may hold spaces; the fields after it do not.
            fields = stat.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


async def measure(
    server: ServerProcess, deltas: int, client_counts: list[int], repeat: int, variants: list[str]
) -> dict[str, Any]:
    base_url = server.http_url
    limits = httpx.Limits(max_connections=max(client_counts), max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT, limits=limits) as client:
        expected, dialect_frames = await verify(client, base_url, deltas)
        best: dict[tuple[str, int], tuple[float, int, int]] = {}
        # Server CPU summed over every run, against a noisy neighbour's burst on one.
        # It shows which side a variant is limited by.
        server_cpu: dict[tuple[str, int], float] = {}
        # And each round's alone: a dialect's ratio to the protocol is taken round by
        # round (the two ran seconds apart) and the median kept, so one round a noisy
        # neighbour hit moves it less than it moves the sums.
        rounds: dict[tuple[str, int], list[float]] = {}
        for _ in range(repeat):
            # Interleaved rounds spread a noisy neighbour's burst over every variant
            # instead of letting it land on one.
            for clients in client_counts:
                for variant in variants:
                    gc.collect()
                    url = base_url + VARIANTS[variant]
                    cpu_before = await server_cpu_seconds(client, base_url)
                    frames = dialect_frames.get(variant, expected)
                    run = await timed_run(client, url, SEPARATORS[variant], clients, frames)
                    cpu_after = await server_cpu_seconds(client, base_url)
                    key = (variant, clients)
                    server_cpu[key] = server_cpu.get(key, 0.0) + cpu_after - cpu_before
                    rounds.setdefault(key, []).append(cpu_after - cpu_before)
                    if key not in best or run[0] < best[key][0]:
                        best[key] = run

    # Per event of the turn (a dialect writes frames of its own, more or fewer): every
    # variant streams the same turn, so the figures compare.
    results = [
        {
            "variant": variant,
            "clients": clients,
            "best_seconds": seconds,
            "events": expected * clients,
            "bytes": size,
            "events_per_second": expected * clients / seconds,
            "server_cpu_us_per_event": _per_event_us(
                server_cpu[variant, clients], expected * clients, repeat
            ),
        }
        for (variant, clients), (seconds, _frames, size) in best.items()
    ]
    rate = {key: expected * key[1] / seconds for key, (seconds, _f, _s) in best.items()}
    targets = []
    for clients in client_counts:
        for other, minimum in ((STARLETTE, TARGET_VS_STARLETTE), (RAW, TARGET_VS_RAW)):
            if (ESSESSEY, clients) in rate and (other, clients) in rate:
                ratio = rate[(ESSESSEY, clients)] / rate[(other, clients)]
                targets.append(
                    {
                        "clients": clients,
                        "versus": other,
                        "min_ratio": minimum,
                        "ratio": ratio,
                        "met": ratio >= minimum,
                    }
                )
    dialect_targets = []
    for clients in client_counts:
        base_rounds = rounds.get((ESSESSEY, clients))
        for variant in DIALECTS:
            own_rounds = rounds.get((variant, clients))
            if not base_rounds or not own_rounds or not all(base_rounds):
                continue
            # Per event: a dialect's frames are not the protocol's, but the turn is.
            ratios = [own / base for own, base in zip(own_rounds, base_rounds, strict=True)]
            ratio = statistics.median(ratios)
            dialect_targets.append(
                {
                    "clients": clients,
                    "variant": variant,
                    "ratio": ratio,
                    "round_ratios": ratios,
                    "max_ratio": TARGET_DIALECT_VS_ESSESSEY,
                    "met": ratio <= TARGET_DIALECT_VS_ESSESSEY,
                }
            )
    return {
        "dialect_targets": dialect_targets,
        "deltas": deltas,
        "events_per_stream": expected,
        "repeat": repeat,
        "python": platform.python_version(),
        "versions": {
            name: version(name)
            for name in ("essessey", "uvicorn", "h11", "httpx", "starlette", "sse-starlette")
        },
        "cpus": os.cpu_count(),
        "results": results,
        "targets": targets,
    }


def _per_event_us(cpu_seconds: float | None, events: int, repeat: int) -> float | None:
    return None if cpu_seconds is None else cpu_seconds / (events * repeat) * 1e6


def print_table(report: dict[str, Any]) -> None:
    versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items())
    print(
        f"{report['events_per_stream']:,} events per stream ({report['deltas']:,} text "
        f"deltas), best of {report['repeat']}, Python {report['python']}, "
        f"{report['cpus']} CPUs"
    )
    print(versions)
    print()
    print(
        f"{'clients':>7}  {'variant':<34} {'events/s':>11} {'best s':>8} {'MB/s':>7} "
        f"{'server us/event':>15}"
    )
    for row in sorted(
        report["results"], key=lambda r: (r["clients"], list(VARIANTS).index(r["variant"]))
    ):
        us = row["server_cpu_us_per_event"]
        cpu = "n/a" if us is None else f"{us:.2f}"
        print(
            f"{row['clients']:>7}  {LABELS[row['variant']]:<34} "
            f"{row['events_per_second']:>11,.0f} {row['best_seconds']:>8.3f} "
            f"{row['bytes'] / row['best_seconds'] / 1e6:>7.1f} {cpu:>15}"
        )
    print()
    for target in report["targets"]:
        verdict = "met" if target["met"] else "NOT met"
        print(
            f"{target['clients']} client(s): essessey / {target['versus']} = "
            f"{target['ratio']:.2f} (target >= {target['min_ratio']:g}: {verdict})"
        )
    for target in report["dialect_targets"]:
        verdict = "met" if target["met"] else "NOT met"
        spread = target["round_ratios"]
        print(
            f"{target['clients']} client(s): server CPU per event, {target['variant']} / "
            f"essessey = {target['ratio']:.2f}, median of {len(spread)} rounds "
            f"({min(spread):.2f}-{max(spread):.2f}) (target <= {target['max_ratio']:g}: "
            f"{verdict})"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Events/s of essessey's SSE response over HTTP, against sse-starlette "
        "and a raw per-event ASGI app."
    )
    parser.add_argument("--events", type=int, default=20_000, help="text deltas per stream")
    parser.add_argument(
        "--clients", type=parse_clients, default=[1, 8], help="concurrent clients, e.g. 1,8"
    )
    parser.add_argument("--repeat", type=int, default=7, help="timed runs per variant")
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"comma-separated subset of: {', '.join(VARIANTS)}",
    )
    add_json_option(parser)
    parser.add_argument(
        "--profile-server", metavar="PATH", help="run the server under cProfile, stats to PATH"
    )
    # The server process is this script again, started with --serve.
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.events < 1 or args.repeat < 1:
        parser.error("--events and --repeat must be at least 1")
    if args.serve:
        return serve(args.port, args.events, args.profile_server)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = set(variants) - set(VARIANTS)
    if unknown or not variants:
        parser.error(f"unknown variants {sorted(unknown)}; expected some of {list(VARIANTS)}")

    profile = ["--profile-server", args.profile_server] if args.profile_server else []
    server = ServerProcess(
        __file__, ["--events", str(args.events), *profile], startup_timeout=STARTUP_TIMEOUT
    )
    try:
        server.wait_until_ready()
        report = asyncio.run(measure(server, args.events, args.clients, args.repeat, variants))
    finally:
        server.stop()
    if not json_only(args.json):
        print_table(report)
    if args.json:
        write_json(args.json, report, __file__)
    if args.profile_server:
        print_profile(args.profile_server)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
