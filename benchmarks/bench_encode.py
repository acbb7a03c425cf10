"""How fast essessey publishes a long text turn as SSE, next to the bare limit and
sse-starlette.

Run ``python benchmarks/bench_encode.py [--deltas N] [--repeat R] [--json]``. Every
variant encodes the same events (preamble, one text block of N deltas, epilogue) into
SSE frames; each is timed R times, interleaved, and the best time counts. See
benchmarks/README.md for what the variants mean and how to read the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import platform
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import orjson
from _cli import add_json_option, json_only, write_json
from _turn import make_chunks, publish_turn, recorded_turn
from sse_starlette import ServerSentEvent

import essessey
from essessey.event import EventBatch

TARGET_RATIO = 0.6
"""essessey strict must reach this share of the bare limit's events/s, on the batched
path (many events ready at once, as in the bare loop that has them all in hand)."""

BARE = "bare (orjson + framing)"
STRICT = "essessey strict=True"
BATCHED = "essessey strict, batched"

Payloads = list[tuple[str, dict[str, Any]]]

# Event names are few and fixed: encoding each once keeps str.encode out of the timed
# loops of every variant alike.
_NAME_BYTES: dict[str, bytes] = {name: name.encode() for name in essessey.EventType.ALL}


class FramingSink:
    """Frames every event as SSE the moment it is emitted, like a streaming response."""

    __slots__ = ("frames",)

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    async def emit(self, event: essessey.Event) -> None:
        self.frames.append(
            b"event: " + _NAME_BYTES[event.event] + b"\ndata: " + event.data + b"\n\n"
        )

    def emit_nowait(self, event: essessey.Event) -> bool:
        self.frames.append(
            b"event: " + _NAME_BYTES[event.event] + b"\ndata: " + event.data + b"\n\n"
        )
        return True

    async def emit_many(self, events: Sequence[essessey.Event]) -> None:
        # As the SSE response frames a Publisher's batch: one name, so one frame head.
        if isinstance(events, EventBatch):
            head = b"event: " + _NAME_BYTES[events.name] + b"\ndata: "
            self.frames.extend([head + data + b"\n\n" for data in events.datas])
            return
        names = _NAME_BYTES
        self.frames.extend(
            [b"event: " + names[e.event] + b"\ndata: " + e.data + b"\n\n" for e in events]
        )


async def run_essessey(
    chunks: list[str], *, strict: bool, batched: bool = False
) -> tuple[float, list[bytes]]:
    sink = FramingSink()
    publisher = essessey.Publisher(sink, strict=strict)
    start = time.perf_counter()
    await publish_turn(publisher, chunks, batched=batched)
    return time.perf_counter() - start, sink.frames


def run_bare(payloads: Payloads) -> tuple[float, list[bytes]]:
    frames: list[bytes] = []
    append = frames.append
    dumps = orjson.dumps
    names = _NAME_BYTES
    start = time.perf_counter()
    for name, payload in payloads:
        append(b"event: " + names[name] + b"\ndata: " + dumps(payload) + b"\n\n")
    return time.perf_counter() - start, frames


def run_bare_building(chunks: list[str], payloads: Payloads) -> tuple[float, list[bytes]]:
    frames: list[bytes] = []
    append = frames.append
    dumps = orjson.dumps
    name = _NAME_BYTES["content_block_delta"]
    head, tail = payloads[:3], payloads[-3:]
    start = time.perf_counter()
    for event_name, payload in head:
        append(b"event: " + _NAME_BYTES[event_name] + b"\ndata: " + dumps(payload) + b"\n\n")
    for chunk in chunks:
        payload = {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": chunk},
        }
        append(b"event: " + name + b"\ndata: " + dumps(payload) + b"\n\n")
    for event_name, payload in tail:
        append(b"event: " + _NAME_BYTES[event_name] + b"\ndata: " + dumps(payload) + b"\n\n")
    return time.perf_counter() - start, frames


async def run_async_floor(chunks: list[str], payloads: Payloads) -> tuple[float, list[bytes]]:
    # What any async publisher must do per event at least: build the payload, serialise
    # it, wrap it in an Event, await the sink. No checks, no method layers.
    sink = FramingSink()
    emit = sink.emit
    dumps = orjson.dumps
    event_type = essessey.Event
    head, tail = payloads[:3], payloads[-3:]
    start = time.perf_counter()
    for event_name, payload in head:
        await emit(event_type(event_name, dumps(payload)))
    for chunk in chunks:
        payload = {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": chunk},
        }
        await emit(event_type("content_block_delta", dumps(payload)))
    for event_name, payload in tail:
        await emit(event_type(event_name, dumps(payload)))
    return time.perf_counter() - start, sink.frames


def run_sse_starlette(payloads: Payloads) -> tuple[float, list[bytes]]:
    frames: list[bytes] = []
    append = frames.append
    dumps = json.dumps
    start = time.perf_counter()
    for name, payload in payloads:
        append(ServerSentEvent(data=dumps(payload), event=name).encode())
    return time.perf_counter() - start, frames


async def recorded_payloads(chunks: list[str]) -> Payloads:
    # The other variants encode exactly what the Publisher builds, parsed back from a
    # recorded run, so every row does the same work.
    return [(event.event, event.json()) for event in await recorded_turn(chunks)]


async def measure(deltas: int, repeat: int) -> dict[str, Any]:
    chunks = make_chunks(deltas)
    payloads = await recorded_payloads(chunks)

    async def strict() -> tuple[float, list[bytes]]:
        return await run_essessey(chunks, strict=True)

    async def lax() -> tuple[float, list[bytes]]:
        return await run_essessey(chunks, strict=False)

    async def batched() -> tuple[float, list[bytes]]:
        return await run_essessey(chunks, strict=True, batched=True)

    async def bare() -> tuple[float, list[bytes]]:
        return run_bare(payloads)

    async def building() -> tuple[float, list[bytes]]:
        return run_bare_building(chunks, payloads)

    async def floor() -> tuple[float, list[bytes]]:
        return await run_async_floor(chunks, payloads)

    async def starlette() -> tuple[float, list[bytes]]:
        return run_sse_starlette(payloads)

    variants: dict[str, Callable[[], Awaitable[tuple[float, list[bytes]]]]] = {
        BARE: bare,
        "bare, dicts built per event": building,
        "async floor (dict+Event+await)": floor,
        STRICT: strict,
        "essessey strict=False": lax,
        BATCHED: batched,
        "sse-starlette ServerSentEvent": starlette,
    }

    # Same bytes or the comparison means nothing (sse-starlette's json.dumps spacing
    # and CRLF line ends differ by design, so it is left out).
    reference = (await bare())[1]
    for name, run in variants.items():
        if run is not starlette and (await run())[1] != reference:
            raise SystemExit(f"{name} produced different bytes from the bare loop")

    best = dict.fromkeys(variants, float("inf"))
    for _ in range(repeat):
        # Interleaved rounds spread a noisy neighbour's burst over every variant
        # instead of letting it land on one.
        for name, run in variants.items():
            gc.collect()
            elapsed, _frames = await run()
            best[name] = min(best[name], elapsed)

    events = len(payloads)
    bare_rate = events / best[BARE]
    results: list[dict[str, Any]] = [
        {
            "variant": name,
            "best_seconds": seconds,
            "events_per_second": events / seconds,
            "ratio_to_bare": (events / seconds) / bare_rate,
        }
        for name, seconds in best.items()
    ]
    strict_ratio = next(r["ratio_to_bare"] for r in results if r["variant"] == BATCHED)
    return {
        "deltas": deltas,
        "events": events,
        "repeat": repeat,
        "python": platform.python_version(),
        "orjson": orjson.__version__,
        "results": results,
        "target": {
            "variant": BATCHED,
            "min_ratio_to_bare": TARGET_RATIO,
            "ratio": strict_ratio,
            "met": strict_ratio >= TARGET_RATIO,
        },
    }


def print_table(report: dict[str, Any]) -> None:
    print(
        f"{report['events']} events per turn ({report['deltas']} text deltas), "
        f"best of {report['repeat']}, Python {report['python']}, orjson {report['orjson']}"
    )
    print()
    print(f"{'variant':<32} {'events/s':>12} {'best ms':>9} {'x bare':>7}")
    for row in report["results"]:
        print(
            f"{row['variant']:<32} {row['events_per_second']:>12,.0f} "
            f"{row['best_seconds'] * 1000:>9.2f} {row['ratio_to_bare']:>7.2f}"
        )
    target = report["target"]
    verdict = "met" if target["met"] else "NOT met"
    print()
    print(
        f"target: {target['variant']} >= {target['min_ratio_to_bare']} x bare "
        f"(measured {target['ratio']:.2f}: {verdict})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Events/s of essessey's Publisher against the bare limit and sse-starlette."
    )
    parser.add_argument("--deltas", type=int, default=10_000, help="text deltas per turn")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per variant")
    add_json_option(parser)
    args = parser.parse_args(argv)
    if args.deltas < 1 or args.repeat < 1:
        parser.error("--deltas and --repeat must be at least 1")

    report = asyncio.run(measure(args.deltas, args.repeat))
    if not json_only(args.json):
        print_table(report)
    if args.json:
        write_json(args.json, report, __file__)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
