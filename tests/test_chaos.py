"""Acceptance tests of resume (issue 4, point 5): chaos over a real server, and the seam.

1. Chaos: 50 turns of 500 events run at once on a hub served by uvicorn. One client per
   turn reads it over SSE, drops its connection at seeded random points (200 drops or
   more in all) and reconnects with the last id it saw, alternating the
   ``Last-Event-ID`` header and the ``?last_event_id=`` query parameter. Every client's
   events, concatenated, must be exactly what its producer published: 0 lost, 0
   duplicated, the same names, bytes and ids.
2. Seam: 1,000 times, ``hub.subscribe`` races a producer emitting as fast as it can;
   the subscriber must get exactly the producer's events after its starting point.

Both are bounded in time (the chaos test reports where each unfinished client was) and
stop every task and server they start.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any, cast

import anyio
import anyio.lowlevel
import httpx
import pytest

from essessey import (
    Event,
    EventType,
    Publisher,
    StreamHub,
    TurnProducer,
    check,
    reassemble_events,
    stream_turn,
)
from essessey.bindings.sse import connect
from tests.chaos_app import (
    RecordingStore,
    build_script,
    expected_events,
    make_app,
)
from tests.servers import serve

pytestmark = pytest.mark.anyio

TURNS = 50
EVENTS_PER_TURN = 300
DROPS_PER_CLIENT = (4, 6)  # each client drops between 4 and 6 times
MIN_DROPS = 200
CHAOS_SEED = 20_240_604
CHAOS_TIMEOUT = 60.0
# Small, so that a client that falls behind a fast turn is ended by the server (the
# documented lag policy) and has to resume by id as well.
CHAOS_MAX_LAG = 40

SEAM_ITERATIONS = 1000
SEAM_SEED = 4_004
SEAM_TIMEOUT = 30.0
SEAM_MAX_YIELDS = 150


# -- chaos over a real server ---------------------------------------------------------


@dataclass
class ClientRun:
    """What one client saw while reading its turn."""

    stream_id: str
    events: list[Event] = field(default_factory=list)
    connections: int = 0
    drops: int = 0
    empty_drops: int = 0  # dropped right after connecting, before any event
    header_resumes: int = 0
    query_resumes: int = 0
    live_resumes: int = 0  # resumed while the producer was still running
    finished_resumes: int = 0  # resumed after the turn had ended
    server_ends: int = 0  # the server ended the response before message_stop
    phase: str = "starting"  # where the client is now, for a report on a timeout


async def _read_turn(
    client: httpx.AsyncClient, base: str, hub: StreamHub, run: ClientRun, seed: int
) -> None:
    """Start the turn, then read it to its end, dropping and resuming on the way."""
    rng = random.Random(seed)
    stream_id = run.stream_id
    # Drop once this many events have been received in all; a repeated count drops a
    # connection before it delivers anything (a resume from the same id twice).
    low, high = DROPS_PER_CLIENT
    drop_at = [rng.randint(1, EVENTS_PER_TURN - 1) for _ in range(rng.randint(low, high))]
    if rng.random() < 0.25:
        drop_at[-1] = drop_at[0]
    drop_at.sort()
    url = f"{base}/streams/{stream_id}"

    response = await client.post(f"{base}/turns/{stream_id}", params={"seed": seed})
    assert response.status_code == 202, response.text

    last_id: str | None = None
    while True:
        run.connections += 1
        options: dict[str, Any] = {}
        if last_id is not None:
            if hub.running(stream_id):
                run.live_resumes += 1
            else:
                run.finished_resumes += 1
            if run.connections % 2:
                options["last_event_id"] = last_id
                run.header_resumes += 1
            else:
                options["params"] = {"last_event_id": last_id}
                run.query_resumes += 1
        dropped = False
        run.phase = f"connecting (connection {run.connections})"
        async with connect(client, "GET", url, **options) as stream:
            run.phase = f"reading (connection {run.connections})"
            if drop_at and drop_at[0] <= len(run.events):
                drop_at.pop(0)
                run.empty_drops += 1
                dropped = True
            else:
                async for event in stream:
                    assert event.id, f"{stream_id}: an event without an id: {event}"
                    run.events.append(event)
                    last_id = event.id
                    if drop_at and drop_at[0] <= len(run.events):
                        drop_at.pop(0)
                        dropped = True
                        break  # leaving the block closes the response mid-stream
            run.phase = f"closing (connection {run.connections})"
        if dropped:
            run.drops += 1
            if rng.random() < 0.3:  # sometimes let the producer run ahead meanwhile
                await anyio.sleep(rng.uniform(0, 0.02))
            continue
        if run.events and run.events[-1].event in (EventType.MESSAGE_STOP, EventType.ERROR):
            run.phase = "done"
            return
        run.server_ends += 1  # ended early (a lagging subscriber): resume by id


def _stuck(runs: list[ClientRun], hub: StreamHub, store: RecordingStore) -> str:
    """Where the clients that did not finish are, and how far their turns got."""
    lines = []
    for run in runs:
        if run.phase != "done":
            last = run.events[-1].event if run.events else None
            lines.append(
                f"{run.stream_id}: {run.phase}, {len(run.events)} events read (last {last}), "
                f"{len(store.published[run.stream_id])} published, "
                f"running={hub.running(run.stream_id)}, "
                f"subscribers={hub.subscriber_count(run.stream_id)}"
            )
    return "\n".join(lines)


def _ids(events: list[Event]) -> list[str]:
    return [event.id for event in events if event.id is not None]


async def test_chaos_drops_and_resumes_lose_and_repeat_nothing() -> None:
    store = RecordingStore()
    app, hub = make_app(store, EVENTS_PER_TURN, max_lag=CHAOS_MAX_LAG)
    seeds = {f"turn-{n:02d}": CHAOS_SEED + n for n in range(TURNS)}
    runs = [ClientRun(stream_id) for stream_id in seeds]

    started = time.monotonic()
    with serve(app, lifespan="on") as base:
        limits = httpx.Limits(max_connections=2 * TURNS, max_keepalive_connections=TURNS)
        async with httpx.AsyncClient(limits=limits, timeout=30.0) as client:
            with anyio.move_on_after(CHAOS_TIMEOUT) as bound:
                async with anyio.create_task_group() as tasks:
                    for run in runs:
                        tasks.start_soon(_read_turn, client, base, hub, run, seeds[run.stream_id])
            if bound.cancelled_caught:
                pytest.fail(f"the chaos test timed out:\n{_stuck(runs, hub, store)}")
        # Every turn has ended: its client saw message_stop, and the hub let it go.
        deadline = time.monotonic() + 5
        while any(hub.running(stream_id) for stream_id in seeds):
            assert time.monotonic() < deadline, "a turn is still running after its end"
            await anyio.sleep(0.01)
    elapsed = time.monotonic() - started

    # Count first, so that a failure still prints the figures.
    delivered = lost = duplicated = 0
    for run in runs:
        counts = Counter(_ids(run.events))
        duplicated += sum(count - 1 for count in counts.values())
        lost += sum(
            1 for event_id in _ids(store.published[run.stream_id]) if event_id not in counts
        )
        delivered += len(run.events)
    drops = sum(run.drops for run in runs)
    summary = {
        "turns": len(runs),
        "events_per_turn": EVENTS_PER_TURN,
        "connections": sum(run.connections for run in runs),
        "drops": drops,
        "drops_before_any_event": sum(run.empty_drops for run in runs),
        "resumes_by_header": sum(run.header_resumes for run in runs),
        "resumes_by_query": sum(run.query_resumes for run in runs),
        "resumes_while_live": sum(run.live_resumes for run in runs),
        "resumes_after_end": sum(run.finished_resumes for run in runs),
        "server_ended_early": sum(run.server_ends for run in runs),
        "events_delivered": delivered,
        "lost": lost,
        "duplicated": duplicated,
        "seconds": round(elapsed, 2),
    }
    print("chaos:", " ".join(f"{key}={value}" for key, value in summary.items()))
    assert len(runs) == TURNS
    assert drops >= MIN_DROPS
    assert summary["resumes_by_header"] > 0
    assert summary["resumes_by_query"] > 0
    assert lost == 0
    assert duplicated == 0
    assert delivered == TURNS * EVENTS_PER_TURN

    for run in runs:
        published = store.published[run.stream_id]
        expected = await expected_events(seeds[run.stream_id], run.stream_id, EVENTS_PER_TURN)
        assert len(expected) == EVENTS_PER_TURN
        # The producer published the seeded turn, and the store gave each event its own id.
        assert [(e.event, e.data) for e in published] == [(e.event, e.data) for e in expected]
        assert len(set(_ids(published))) == len(published)
        # The client's events, concatenated across its connections, are exactly the
        # published ones: names, bytes and ids, in order.
        assert run.events == published, f"{run.stream_id}: the events differ"
        assert check(run.events) == []
        parsed = reassemble_events(run.events)
        assert parsed == reassemble_events(expected)
        script = build_script(seeds[run.stream_id], EVENTS_PER_TURN)
        assert parsed.complete
        assert parsed.thinking == "".join(script.thinking)
        assert parsed.signature == script.signature
        assert parsed.text == script.text
        [call] = parsed.tool_calls
        assert (call.tool_use_id, call.name) == (script.tool_use_id, script.tool_name)
        assert call.arguments == "".join(script.arguments)
        [result] = parsed.tool_results
        assert (result.tool_use_id, result.text) == (script.tool_use_id, script.result)


# -- the seam: subscribe racing a fast producer --------------------------------------


def _seam_producer(rng: random.Random, stream_id: str, deltas: int) -> TurnProducer:
    """A turn of ``deltas`` text deltas that yields to the scheduler only now and then:
    bursts of events with no await point between them, as fast as the hub takes them."""
    yield_chance = rng.uniform(0.3, 1.0)
    # Sometimes the turn yields before its first event, so that a subscriber can attach
    # to a stream that is open but still empty.
    late_start = rng.random() < 0.3
    chunks = [f"{n}:{rng.getrandbits(32):08x} " for n in range(deltas)]

    async def produce(publisher: Publisher) -> None:
        if late_start:
            await anyio.lowlevel.checkpoint()
        async with stream_turn(
            publisher, message_id=f"msg-{stream_id}", stream_id=stream_id, model="seam"
        ) as turn:
            text = await turn.text()
            for chunk in chunks:
                await text.write(chunk)
                if rng.random() < yield_chance:
                    await anyio.lowlevel.checkpoint()

    return produce


async def _yields(rng: random.Random) -> None:
    """Yield to the scheduler a random number of times, often none or a few."""
    count = rng.choice((0, 1, 2, rng.randint(0, 10), rng.randint(0, SEAM_MAX_YIELDS)))
    for _ in range(count):
        await anyio.lowlevel.checkpoint()


async def _take(events: AsyncIterator[Event], count: int, rng: random.Random) -> list[Event]:
    """Up to ``count`` events from ``events``, yielding now and then; then close it."""
    taken: list[Event] = []
    try:
        async for event in events:
            taken.append(event)
            if len(taken) >= count:
                break
            if rng.random() < 0.2:
                await anyio.lowlevel.checkpoint()
    finally:
        # hub.subscribe is an async generator, typed as the iterator it returns.
        await cast(AsyncGenerator[Event, None], events).aclose()
    return taken


async def test_subscribe_races_a_fast_producer_without_gap_or_duplicate() -> None:
    rng = random.Random(SEAM_SEED)
    store = RecordingStore()
    positions: Counter[str] = Counter()
    modes: Counter[str] = Counter()
    started = time.monotonic()
    with anyio.fail_after(SEAM_TIMEOUT):
        async with StreamHub(store) as hub:
            for iteration in range(SEAM_ITERATIONS):
                stream_id = f"seam-{iteration}"
                deltas = rng.randint(20, 120)
                await hub.start(stream_id, _seam_producer(rng, stream_id, deltas))
                last_id: str | None = None
                if rng.random() < 0.5:
                    # Resume from an id read mid-stream by an earlier subscription.
                    await _yields(rng)
                    early = await _take(hub.subscribe(stream_id), rng.randint(1, deltas), rng)
                    assert early == store.published[stream_id][: len(early)]
                    last_id = early[-1].id
                    modes["by_id"] += 1
                else:
                    modes["from_start"] += 1
                await _yields(rng)

                published_before = len(store.published[stream_id])
                running = hub.running(stream_id)
                received = await _take(hub.subscribe(stream_id, last_id), 1 << 30, rng)
                await hub.wait(stream_id)

                published = store.published[stream_id]
                # The preamble, the text block's start and stop, the epilogue: 6 events.
                assert len(published) == deltas + 6
                start = 0 if last_id is None else _ids(published).index(last_id) + 1
                # Exactly the events after the start point: contiguous, none twice.
                assert received == published[start:], f"seam broken in {stream_id}"
                if not running:
                    positions["after_the_end"] += 1
                elif published_before == 0:
                    positions["before_the_first_event"] += 1
                elif published_before == start:
                    positions["at_the_head"] += 1
                else:
                    positions["mid_stream"] += 1
                await store.clear(stream_id)
    elapsed = time.monotonic() - started
    print(
        f"seam: iterations={SEAM_ITERATIONS} {dict(modes)} {dict(positions)} seconds={elapsed:.2f}"
    )
    # The race was really run: subscriptions landed at every kind of point.
    assert positions["mid_stream"] >= 100
    assert positions["after_the_end"] >= 20
    assert positions["before_the_first_event"] >= 10
    assert positions["at_the_head"] >= 10
