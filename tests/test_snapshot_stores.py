"""Snapshots for late readers on the stores replicas share, over real processes: two
replicas of :mod:`tests.replica_app` on one nats-server (JetStream) or one redis-server,
both with ``snapshot_after``. A turn runs on A; a reader joins on B half-way through with
no id, gets a snapshot of the turn so far, drops after a few of its events and resumes by
its last id on A; another reads the finished turn whole on B. Each has the whole turn,
nothing twice (see tests/test_snapshot.py for the rules on the in-memory store).
"""

from __future__ import annotations

import anyio
import httpx
import pytest

from essessey import EventType, check
from tests.chaos_app import expected_events
from tests.nats_server import NatsServer
from tests.processes import WAIT
from tests.redis_server import RedisServer
from tests.test_replicas import (
    EVENTS,
    Client,
    read_once,
    read_to_end,
    replicas,
    seq,
    start_turn,
    turn_status,
    wait_finished,
)
from tests.test_snapshot import summary

pytestmark = pytest.mark.anyio

SNAPSHOT_AFTER = 20


def assert_whole_once(client: Client, expected: list[object]) -> None:
    ids = [seq(event.id) for event in client.events]
    assert ids == sorted(set(ids)), f"{client.name}: ids not unique and increasing"
    assert summary(client.events) == summary(expected)  # type: ignore[arg-type]
    assert check(client.events) == []


async def test_a_late_reader_on_another_replica_gets_a_snapshot_and_resumes_exactly(
    broker: NatsServer | RedisServer,
) -> None:
    seed, stream_id = 5_201, "turn-snapshot"
    with replicas(broker, ESSESSEY_SNAPSHOT_AFTER=str(SNAPSHOT_AFTER)) as (a, b):
        async with httpx.AsyncClient(timeout=10.0) as http:
            await start_turn(http, a.url, stream_id, seed)
            live, late = Client("live on A"), Client("late on B, resumed on A")
            with anyio.fail_after(WAIT):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(read_to_end, http, [a.url], stream_id, live)
                    await live.mid_turn.wait()  # MID_TURN events in: join now
                    at_join = (await turn_status(http, a.url, stream_id))["progress"]
                    outcome = await read_once(
                        http, b.url, stream_id, late, until=lambda c: len(c.events) >= 4
                    )
                    assert outcome == "dropped"
                    await read_to_end(http, [a.url], stream_id, late)
            await wait_finished(http, a.url, stream_id)
            whole = Client("the finished turn, on B")
            with anyio.fail_after(WAIT):
                await read_to_end(http, [b.url], stream_id, whole)
    expected = await expected_events(seed, stream_id, EVENTS)
    print(
        f"snapshot: joined at {at_join}/{EVENTS}; the late reader got {len(late.events)} "
        f"events over {len(late.connections)} connections, the whole turn read after its "
        f"end {len(whole.events)}, of {len(expected)}"
    )
    assert_whole_once(live, expected)
    assert_whole_once(late, expected)
    assert_whole_once(whole, expected)
    assert late.connections == [b.url, a.url]
    assert whole.events[-1].event == EventType.MESSAGE_STOP
    # Compact: the finished turn is a few events per block, not one per delta (this
    # seeded turn has many short blocks; a long answer shrinks far more).
    assert len(whole.events) < len(expected) // 2
    assert len(late.events) < len(expected)
