"""How many events/s essessey's WebSocket binding delivers over a real connection, next to
a raw Starlette WebSocket loop that sends the same frames, encoded in advance.

Run ``python benchmarks/bench_ws.py [--events N] [--clients 1,8] [--repeat R] [--json]``.
One uvicorn server process on loopback serves three WebSocket endpoints (a Publisher
writing into a WebSocketSink, a StreamHub turn served by ws_route, and a raw send_text loop
of frames encoded in advance); every one of them streams the same turn (preamble, one text
block of N deltas, epilogue), one JSON text frame per event. Clients of the ``websockets``
library (asyncio) read every frame, 1 at a time and then several at once. Variants are
interleaved and the best of R runs counts. See benchmarks/README.md for what the variants
mean and how to read the ratios.

``--profile-server PATH`` runs the server under cProfile, writes the stats to PATH and
prints the hottest functions (profiling slows the server: its events/s mean nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import version
from typing import Any

import httpx
from _cli import add_json_option, json_only, parse_clients, print_profile, write_json
from _server import ServerProcess, run_until_stdin_closes
from _turn import make_chunks, publish_turn, recorded_turn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket
from websockets.asyncio.client import connect

import essessey
from essessey.bindings.ws import WebSocketSink, decode_frame, encode_frame, ws_route

ESSESSEY = "essessey"
HUB = "hub"
RAW = "raw"
PATHS: dict[str, str] = {ESSESSEY: "/essessey", HUB: "/hub/{stream_id}/ws", RAW: "/raw"}
LABELS: dict[str, str] = {
    ESSESSEY: "essessey Publisher -> WebSocketSink",
    HUB: "essessey StreamHub turn -> ws_route",
    RAW: "raw Starlette send_text, pre-encoded",
}
ORDER = [ESSESSEY, HUB, RAW]

STARTUP_TIMEOUT = 30.0
RUN_TIMEOUT = 300.0
ID_PREFIX = '{"id":'
NAME_KEY = '"event":'


# -- the server side -------------------------------------------------------------------


def build_app(deltas: int) -> Starlette:
    """One Starlette app: every variant goes through the same router."""
    chunks = make_chunks(deltas)
    # Encoded before any connection: the raw loop does nothing per event but send.
    frames = [encode_frame(event) for event in asyncio.run(recorded_turn(chunks))]

    async def essessey_endpoint(websocket: WebSocket) -> None:
        await websocket.accept()
        await publish_turn(essessey.Publisher(WebSocketSink(websocket)), chunks)
        await websocket.close()

    async def raw_endpoint(websocket: WebSocket) -> None:
        await websocket.accept()
        send_text = websocket.send_text
        for frame in frames:
            await send_text(frame)
        await websocket.close()

    # The hub keeps every event of a turn and lets no subscriber be ended for lagging:
    # the producer runs far ahead of the sockets here, which a model never does.
    events_per_turn = deltas + 6
    hub = essessey.StreamHub(
        essessey.InMemoryEventStore(max_events_per_stream=events_per_turn, max_streams=2),
        max_lag=events_per_turn,
    )

    async def produce(publisher: essessey.Publisher) -> None:
        await publish_turn(publisher, chunks)

    async def start_turn(request: Request) -> JSONResponse:
        # A new stream per run (the store drops the older ones), started before any
        # client attaches: the clients get the part already published, then the rest live.
        stream_id = f"bench_{secrets.token_hex(6)}"
        await hub.start(stream_id, produce)
        return JSONResponse({"stream_id": stream_id})

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with hub:
            yield

    routes: list[BaseRoute] = [
        WebSocketRoute(PATHS[ESSESSEY], essessey_endpoint),
        WebSocketRoute(PATHS[RAW], raw_endpoint),
        Route("/hub/turns", start_turn, methods=["POST"]),
        ws_route(hub, PATHS[HUB]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def serve(port: int, deltas: int, profile_path: str | None) -> int:
    """The server process: uvicorn on 127.0.0.1:port until its stdin closes."""
    return run_until_stdin_closes(
        build_app(deltas), port, lifespan="auto", profile_path=profile_path
    )


# -- the client side -------------------------------------------------------------------


async def read_frames(url: str, compression: str | None) -> list[str]:
    """Read every frame until the server closes normally (an abnormal close raises)."""
    received: list[str] = []
    append = received.append
    async with connect(url, compression=compression, max_size=None, proxy=None) as websocket:
        async for message in websocket:
            if not isinstance(message, str):
                raise SystemExit(f"{url}: a binary frame, text expected")
            append(message)
    return received


def without_id(frame: str) -> tuple[str, str]:
    """(the frame without its id, the id) for a frame the hub sent."""
    if not frame.startswith(ID_PREFIX):
        raise ValueError("a hub frame without an id")
    name_at = frame.index(NAME_KEY)
    return "{" + frame[name_at:], frame[len(ID_PREFIX) : name_at - 1]


def check_frames(variant: str, frames: list[str], expected: list[str]) -> None:
    """The frames are exactly the turn's (ids aside for the hub, which must set them)."""
    if variant != HUB:
        if frames != expected:
            raise SystemExit(f"{variant}: the frames differ from the recorded turn's")
        return
    stripped = [without_id(frame) for frame in frames]
    if [frame for frame, _id in stripped] != expected:
        raise SystemExit(f"{variant}: the frames differ from the recorded turn's")
    if len({event_id for _frame, event_id in stripped}) != len(frames):
        raise SystemExit(f"{variant}: an event id repeats")


class Client:
    """Connects the clients of each run to a variant's endpoint."""

    def __init__(
        self, server: ServerProcess, http: httpx.AsyncClient, compression: str | None
    ) -> None:
        self.server = server
        self.http = http
        self.compression = compression

    async def url(self, variant: str) -> str:
        path = PATHS[variant]
        if variant == HUB:
            response = await self.http.post(self.server.http_url + "/hub/turns")
            response.raise_for_status()
            path = path.format(stream_id=response.json()["stream_id"])
        return self.server.ws_url + path

    async def run(self, variant: str, clients: int) -> tuple[float, list[list[str]]]:
        """One timed run: from starting the turn (hub) or connecting, to the last frame."""
        start = time.perf_counter()
        url = await self.url(variant)
        results = await asyncio.wait_for(
            asyncio.gather(*(read_frames(url, self.compression) for _ in range(clients))),
            RUN_TIMEOUT,
        )
        return time.perf_counter() - start, results


async def verify(client: Client, deltas: int) -> list[str]:
    """Check, before timing, that every endpoint streams the recorded turn, decoded."""
    recorded = await recorded_turn(make_chunks(deltas))
    expected = [(event.event, event.json()) for event in recorded]
    for variant in PATHS:
        _seconds, (frames,) = await client.run(variant, 1)
        events = [decode_frame(frame) for frame in frames]
        if [(event.event, event.json()) for event in events] != expected:
            raise SystemExit(f"{variant} streamed different events from the recorded turn")
        if essessey.check(events):
            raise SystemExit(f"{variant} streamed events that break the protocol")
        ids = [event.id for event in events]
        if variant == HUB and (not all(ids) or len(set(ids)) != len(ids)):
            raise SystemExit(f"{variant}: every event needs an id of its own")
        if variant != HUB and any(ids):
            raise SystemExit(f"{variant}: ids where none were set")
    return [encode_frame(event) for event in recorded]


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
    server: ServerProcess,
    deltas: int,
    client_counts: list[int],
    repeat: int,
    variants: list[str],
    compression: str | None,
) -> dict[str, Any]:
    pid = server.process.pid
    async with httpx.AsyncClient(timeout=RUN_TIMEOUT) as http:
        client = Client(server, http, compression)
        expected = await verify(client, deltas)
        best: dict[tuple[str, int], float] = {}
        # Server CPU summed over every run: the clock ticks in 10 ms steps, too coarse
        # for one short run. It shows which side a variant is limited by.
        server_cpu: dict[tuple[str, int], float | None] = {}
        client_cpu: dict[tuple[str, int], float] = {}
        for _ in range(repeat):
            # Interleaved rounds spread a noisy neighbour's burst over every variant
            # instead of letting it land on one.
            for clients in client_counts:
                for variant in variants:
                    gc.collect()
                    key = (variant, clients)
                    cpu_before = process_cpu_seconds(pid)
                    own_before = time.process_time()
                    seconds, received = await client.run(variant, clients)
                    client_cpu[key] = client_cpu.get(key, 0.0) + time.process_time() - own_before
                    cpu_after = process_cpu_seconds(pid)
                    for frames in received:
                        check_frames(variant, frames, expected)
                    if cpu_before is None or cpu_after is None:
                        server_cpu[key] = None
                    elif server_cpu.get(key, 0.0) is not None:
                        server_cpu[key] = (server_cpu.get(key) or 0.0) + cpu_after - cpu_before
                    if key not in best or seconds < best[key]:
                        best[key] = seconds

    events_per_stream = len(expected)
    results: list[dict[str, Any]] = []
    for (variant, clients), seconds in best.items():
        events = events_per_stream * clients
        results.append(
            {
                "variant": variant,
                "clients": clients,
                "best_seconds": seconds,
                "events": events,
                "events_per_second": events / seconds,
                "server_cpu_us_per_event": _per_event_us(
                    server_cpu[variant, clients], events, repeat
                ),
                "client_cpu_us_per_event": _per_event_us(
                    client_cpu[variant, clients], events, repeat
                ),
            }
        )
    rate = {key: events_per_stream * key[1] / seconds for key, seconds in best.items()}
    ratios = [
        {
            "clients": clients,
            "variant": variant,
            "versus": RAW,
            "ratio": rate[variant, clients] / rate[RAW, clients],
        }
        for clients in client_counts
        for variant in (ESSESSEY, HUB)
        if (variant, clients) in rate and (RAW, clients) in rate
    ]
    return {
        "deltas": deltas,
        "events_per_stream": events_per_stream,
        "frame_bytes": sum(len(frame.encode()) for frame in expected),
        "repeat": repeat,
        "compression": compression or "none",
        "python": platform.python_version(),
        "versions": {
            name: version(name) for name in ("essessey", "uvicorn", "websockets", "starlette")
        },
        "cpus": os.cpu_count(),
        "results": results,
        "ratios": ratios,
    }


def _per_event_us(cpu_seconds: float | None, events: int, repeat: int) -> float | None:
    return None if cpu_seconds is None else cpu_seconds / (events * repeat) * 1e6


def print_table(report: dict[str, Any]) -> None:
    versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items())
    print(
        f"{report['events_per_stream']:,} events per stream ({report['deltas']:,} text "
        f"deltas, {report['frame_bytes'] / report['events_per_stream']:.0f} bytes per frame), "
        f"permessage-deflate: {report['compression']}, best of {report['repeat']}, "
        f"Python {report['python']}, {report['cpus']} CPUs"
    )
    print(versions)
    print()
    print(
        f"{'clients':>7}  {'variant':<38} {'events/s':>10} {'best s':>7} "
        f"{'server us/event':>15} {'client us/event':>15}"
    )
    for row in sorted(report["results"], key=lambda r: (r["clients"], ORDER.index(r["variant"]))):
        us = row["server_cpu_us_per_event"]
        cpu = "n/a" if us is None else f"{us:.2f}"
        print(
            f"{row['clients']:>7}  {LABELS[row['variant']]:<38} "
            f"{row['events_per_second']:>10,.0f} {row['best_seconds']:>7.3f} {cpu:>15} "
            f"{row['client_cpu_us_per_event']:>15.2f}"
        )
    print()
    for ratio in report["ratios"]:
        print(
            f"{ratio['clients']} client(s): {ratio['variant']} / {ratio['versus']} = "
            f"{ratio['ratio']:.2f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Events/s of essessey's WebSocket binding over a real connection, "
        "against a raw Starlette WebSocket loop sending pre-encoded frames."
    )
    parser.add_argument("--events", type=int, default=20_000, help="text deltas per stream")
    parser.add_argument(
        "--clients", type=parse_clients, default=[1, 8], help="concurrent clients, e.g. 1,8"
    )
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per variant")
    parser.add_argument(
        "--variants",
        default=",".join(PATHS),
        help=f"comma-separated subset of: {', '.join(PATHS)}",
    )
    parser.add_argument(
        "--no-deflate",
        action="store_true",
        help="do not offer permessage-deflate (browsers and websockets offer it by default)",
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
    unknown = set(variants) - set(PATHS)
    if unknown or not variants:
        parser.error(f"unknown variants {sorted(unknown)}; expected some of {list(PATHS)}")
    compression = None if args.no_deflate else "deflate"

    profile = ["--profile-server", args.profile_server] if args.profile_server else []
    server = ServerProcess(
        __file__, ["--events", str(args.events), *profile], startup_timeout=STARTUP_TIMEOUT
    )
    try:
        server.wait_until_ready()
        report = asyncio.run(
            measure(server, args.events, args.clients, args.repeat, variants, compression)
        )
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
