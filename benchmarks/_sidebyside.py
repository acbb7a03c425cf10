"""Paths that do the same turn, measured side by side in one process: the framework
benchmarks' driver.

Each path runs in batches of turns, the paths taking turns batch by batch (their order
rotating), so a drift of the process (its heap growing, the machine's other load) touches
every path alike; a path's per-batch setup (a fresh hub, so that no store grows from batch
to batch) is left out of the time. The figure of a batch is its CPU time
(``time.process_time()``) per turn; a path's ratio is the median, over the batches, of
its batch's figure over the first path's in the same round of batches.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

Turn = Callable[[int], Awaitable[int]]
"""One turn of a path (its number given): how many events it made."""


@dataclass(frozen=True)
class SidePath:
    """A path: its name, and what opens it for a batch of turns (untimed setup and
    teardown around the turns)."""

    name: str
    open: Callable[[], AbstractAsyncContextManager[Turn]]


def plain(name: str, turn: Turn) -> SidePath:
    """A path with nothing to set up."""

    @asynccontextmanager
    async def opened() -> AsyncIterator[Turn]:
        yield turn

    return SidePath(name, opened)


def hub_paths(name: str, producer: Callable[[str], Any]) -> list[SidePath]:
    """The turns of ``producer(stream_id)`` run by a ``StreamHub`` (in-memory store, a fresh
    hub per batch): stored and not read (``name -> hub``), and stored and read to their end
    by one subscriber (``name -> hub, read``). The events counted are the stored ones."""
    from essessey import StreamHub
    from essessey.stores import InMemoryEventStore

    def path(read: bool) -> SidePath:
        @asynccontextmanager
        async def opened() -> AsyncIterator[Turn]:
            async with StreamHub() as hub:
                store = hub.store
                assert isinstance(store, InMemoryEventStore)

                async def turn(n: int) -> int:
                    stream_id = f"bench_{n}"
                    held = store.held_events
                    await hub.start(stream_id, producer(stream_id))
                    if read:
                        return sum([1 async for _ in hub.subscribe(stream_id)])
                    await hub.wait(stream_id)
                    # Counted without reading the turn back: the path stores, nothing more.
                    return store.held_events - held

                yield turn

        return SidePath(f"{name} -> hub" + (", read" if read else ""), opened)

    return [path(False), path(True)]


async def compare(paths: Sequence[SidePath], *, turns: int, batch: int) -> list[dict[str, Any]]:
    """Run every path ``turns`` times (in batches of ``batch``); a row per path: events
    and CPU per turn and per event (medians of the batches), and the ratio to the first
    path (the median of the batches' ratios, with their lowest and highest)."""
    batches = max(1, turns // batch)
    per_turn: list[list[float]] = [[] for _ in paths]
    events: list[int] = [0 for _ in paths]
    for path in paths:  # untimed: imports and first-use caches
        async with path.open() as turn:
            await turn(-1)
    number = 0
    for b in range(batches):
        order = list(range(len(paths)))
        order = order[b % len(order) :] + order[: b % len(order)]
        for i in order:
            async with paths[i].open() as turn:
                gc.collect()
                start = time.process_time()
                for _ in range(batch):
                    events[i] += await turn(number)
                    number += 1
                per_turn[i].append((time.process_time() - start) / batch * 1e6)
    rows = []
    for i, path in enumerate(paths):
        ratios = [mine / base for mine, base in zip(per_turn[i], per_turn[0], strict=True)]
        cpu = statistics.median(per_turn[i])
        count = events[i] / (batches * batch)
        rows.append(
            {
                "path": path.name,
                "turns": batches * batch,
                "events_per_turn": count,
                "cpu_us_per_turn": cpu,
                "cpu_us_per_event": cpu / count if count else 0.0,
                "ratio": statistics.median(ratios),
                "ratio_low": min(ratios),
                "ratio_high": max(ratios),
            }
        )
    return rows


def print_rows(title: str, rows: Sequence[dict[str, Any]]) -> None:
    """The rows as a table, under ``title``."""
    print(title)
    print(
        f"  {'path':40} {'events/turn':>11} {'CPU us/turn':>12} {'us/event':>9}"
        f" {'ratio':>6} {'(low-high)':>12}"
    )
    for row in rows:
        print(
            f"  {row['path']:40} {row['events_per_turn']:11.1f} {row['cpu_us_per_turn']:12.0f}"
            f" {row['cpu_us_per_event']:9.1f} {row['ratio']:6.3f}"
            f" ({row['ratio_low']:.2f}-{row['ratio_high']:.2f})"
        )
