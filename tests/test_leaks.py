"""Leaks (the reliability issue, point 3): thousands of clients that connect and drop.

The load app (``tests/load_app.py``) runs under uvicorn in a subprocess. Against its SSE
endpoint, and then its WebSocket endpoint, 5,000 clients (32 at a time) connect to a
finished stream or a running one and drop at varied points: right after connecting,
halfway through the request, after the whole request but before the response headers,
after the headers, and after the first bytes of the body; half of them close with a FIN,
half with a reset. After a warm-up of 200 such cycles the server's figures (debug route)
are the baseline; after the 5,000 its asyncio task count and open file descriptors must
come back to exactly that baseline, the hub's subscriber count to 0, and its resident
memory must have grown by less than 10 MiB. Every wait is bounded.

Run with ``pytest -s`` to see the figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

import pytest

from tests.load_app import LoadServer, load_server
from tests.raw_clients import sse_request, ws_request

CYCLES: Final = 5_000
WARM_UP: Final = 200
CONCURRENCY: Final = 32
MAX_RSS_GROWTH: Final = 10 * 1024 * 1024
CYCLE_TIMEOUT: Final = 10.0  # one connection, from connect to close
RUN_TIMEOUT: Final = 90.0  # all the cycles of one run
SETTLE_TIMEOUT: Final = 30.0

FINISHED: Final = "leak-finished"
RUNNING: Final = "leak-running"
DROPS: Final = ("connect", "partial-request", "before-headers", "after-headers", "mid-body")


@dataclass(frozen=True)
class Endpoint:
    name: str
    request: Callable[[str], bytes]
    status: bytes


ENDPOINTS: Final = [
    Endpoint("sse", sse_request, b"HTTP/1.1 200"),
    Endpoint("websocket", ws_request, b"HTTP/1.1 101"),
]


async def connect_and_drop(port: int, endpoint: Endpoint, index: int) -> str:
    """One cycle, its stream, drop point and way of closing chosen by ``index``; returns
    the drop point, or "refused" when the response was not the expected one."""
    stream_id = (FINISHED, RUNNING)[index % 2]
    drop = DROPS[(index // 2) % len(DROPS)]
    reset = (index // (2 * len(DROPS))) % 2 == 1
    request = endpoint.request(stream_id)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    outcome = drop
    try:
        if drop == "partial-request":
            writer.write(request[: len(request) // 2])
            await writer.drain()
        elif drop != "connect":
            writer.write(request)
            await writer.drain()
            if drop in ("after-headers", "mid-body"):
                head = await reader.readuntil(b"\r\n\r\n")
                if not head.startswith(endpoint.status):
                    outcome = "refused"
                elif drop == "mid-body":
                    await reader.readexactly(2)  # the body's (or first frame's) first bytes
    finally:
        if reset:
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return outcome


async def run_cycles(port: int, endpoint: Endpoint, start: int, count: int) -> Counter[str]:
    """``count`` cycles, CONCURRENCY at a time; the outcomes counted."""
    outcomes: Counter[str] = Counter()
    next_index = start

    async def worker() -> None:
        nonlocal next_index
        while next_index < start + count:
            index = next_index
            next_index += 1
            outcome = await asyncio.wait_for(connect_and_drop(port, endpoint, index), CYCLE_TIMEOUT)
            outcomes[outcome] += 1

    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(CONCURRENCY))), RUN_TIMEOUT)
    return outcomes


@pytest.fixture
def server() -> Iterator[LoadServer]:
    with load_server(LOAD_SEND_TIMEOUT="5", LOAD_MAX_QUEUE="64") as started:
        # A finished stream, replayed whole to each client, and a running one whose turn
        # waits (after 20 deltas) until the server stops.
        started.start_turn(FINISHED, deltas=50, size=100)
        started.start_turn(RUNNING, deltas=20, size=100, hold=1)
        started.wait_until(lambda f: f["running"] == 1, SETTLE_TIMEOUT)
        yield started


def settled(baseline: dict[str, int]) -> Callable[[dict[str, int]], bool]:
    def check(figures: dict[str, int]) -> bool:
        return (
            figures["tasks"] == baseline["tasks"]
            and figures["fds"] == baseline["fds"]
            and figures["subscribers"] == 0
        )

    return check


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=[e.name for e in ENDPOINTS])
def test_connect_and_drop_cycles_leave_no_task_socket_or_memory_behind(
    server: LoadServer, endpoint: Endpoint
) -> None:
    warm_up = asyncio.run(run_cycles(server.port, endpoint, 0, WARM_UP))
    assert warm_up["refused"] == 0, warm_up
    # After the warm-up (caches, allocator arenas, the first of every kind of
    # connection): what the server holds with no client connected.
    before = server.settle(SETTLE_TIMEOUT)
    started = time.monotonic()
    outcomes = asyncio.run(run_cycles(server.port, endpoint, WARM_UP, CYCLES))
    elapsed = time.monotonic() - started
    # The leak check itself: the tasks, file descriptors and subscribers come back to
    # what they were, or this raises with the figures they stayed at.
    after = server.wait_until(settled(before), SETTLE_TIMEOUT, collect=True)
    growth = after["rss"] - before["rss"]
    print(
        f"\n{endpoint.name}: {sum(outcomes.values())} cycles after {WARM_UP} to warm up "
        f"({elapsed:.1f} s; {dict(sorted(outcomes.items()))}); tasks {before['tasks']} -> "
        f"{after['tasks']}; fds {before['fds']} -> {after['fds']}; subscribers -> "
        f"{after['subscribers']}; RSS {before['rss'] / 2**20:.2f} MiB -> "
        f"{after['rss'] / 2**20:.2f} MiB ({growth / 2**20:+.2f} MiB)"
    )
    assert sum(outcomes.values()) == CYCLES
    assert outcomes["refused"] == 0, outcomes
    assert growth < MAX_RSS_GROWTH
    errors = [line for line in server.log().splitlines() if line.startswith("ERROR")]
    assert errors == [], errors[:5]
