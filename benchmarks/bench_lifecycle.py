"""What a streamed response costs in-process: its start and end, and its deltas when many
connections take turns.

Run ``python benchmarks/bench_lifecycle.py [--connections N] [--deltas M] [--interval S]
[--repeat R] [--gc]``. Opens N responses at once on uvloop (asyncio when uvloop is
missing), each streaming a whole turn with M text deltas S seconds apart, to an ASGI
``send`` that drops what it is given, and reads the process's CPU time per connection;
beside it a raw ASGI handler sends one body chunk per delta. With one delta (the default)
it is the cost of a response's start and end; with many, the per-delta cost when the
connections' state does not stay in the CPU's caches (each delta of each connection
touches it again), which a loop over one connection does not show. The garbage collector
is off unless ``--gc`` is given: with thousands of connections open, its full
collections would dominate either side.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from _cli import add_json_option, write_json

import essessey
from essessey.bindings.sse import EventStreamResponse

SCOPE: dict[str, Any] = {
    "type": "http",
    "method": "GET",
    "path": "/",
    "headers": [],
    "query_string": b"",
}


async def _send(message: Any) -> None:
    return None


async def _receive() -> Any:
    await asyncio.Event().wait()  # no disconnect: the response ends by itself


Variant = Callable[[int, float], Awaitable[None]]


async def essessey_response(deltas: int, interval: float) -> None:
    async def produce(publisher: essessey.Publisher) -> None:
        await publisher.send_stream_preamble("msg_bench", "stream_bench", "bench-model")
        await publisher.send_content_block_start_text(0)
        send_delta = publisher.send_content_block_delta_text
        for _ in range(deltas):
            await asyncio.sleep(interval)
            await send_delta(0, str(time.time_ns()))
        await publisher.send_content_block_stop(0)
        await publisher.send_stream_epilogue(essessey.StopReason.END_TURN, deltas)

    await EventStreamResponse(produce)(SCOPE, _receive, _send)


async def raw_asgi(deltas: int, interval: float) -> None:
    await _send({"type": "http.response.start", "status": 200, "headers": []})
    for _ in range(deltas):
        await asyncio.sleep(interval)
        body = b"data: " + str(time.time_ns()).encode() + b"\n\n"
        await _send({"type": "http.response.body", "body": body, "more_body": True})
    await _send({"type": "http.response.body", "body": b"", "more_body": False})


VARIANTS: dict[str, Variant] = {
    "raw ASGI": raw_asgi,
    "essessey EventStreamResponse": essessey_response,
}


async def measure(
    connections: int, deltas: int, interval: float, repeat: int
) -> dict[str, list[float]]:
    """CPU microseconds per connection, each variant timed ``repeat`` times, interleaved."""
    results: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for variant in VARIANTS.values():  # warm up: imports, caches, the shutdown watch
        await asyncio.gather(*[variant(1, 0) for _ in range(100)])
    for _ in range(repeat):
        for name, variant in VARIANTS.items():
            before = time.process_time()
            await asyncio.gather(*[variant(deltas, interval) for _ in range(connections)])
            results[name].append((time.process_time() - before) / connections * 1e6)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=3000)
    parser.add_argument("--deltas", type=int, default=1, help="text deltas per response")
    parser.add_argument("--interval", type=float, default=0.0, help="seconds between deltas")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--gc", action="store_true", help="leave the garbage collector on")
    add_json_option(parser)
    args = parser.parse_args()
    if not args.gc:
        gc.disable()
    try:
        import uvloop

        runner: Callable[[Any], Any] = uvloop.run
        loop = "uvloop"
    except ImportError:  # pragma: no cover - uvloop is in the server extra
        runner, loop = asyncio.run, "asyncio"
    results = runner(measure(args.connections, args.deltas, args.interval, args.repeat))
    raw = statistics.median(results["raw ASGI"])
    print(
        f"{args.connections} connections at once, {args.deltas} deltas each "
        f"{args.interval * 1e3:g} ms apart, {loop}, gc {'on' if args.gc else 'off'}"
    )
    print(f"{'variant':<30} {'CPU us per connection (median; all)':<40} x raw")
    for name, values in results.items():
        middle = statistics.median(values)
        shown = ", ".join(f"{value:.1f}" for value in values)
        print(f"{name:<30} {middle:>6.1f}; {shown:<31} {middle / raw:5.1f}")
    if args.json:
        figures = {
            "connections": args.connections,
            "deltas": args.deltas,
            "interval": args.interval,
            "loop": loop,
            "gc": args.gc,
        }
        write_json(args.json, {**figures, "cpu_us_per_connection": results}, __file__)


if __name__ == "__main__":
    main()
