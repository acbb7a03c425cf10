"""Many replicas and faults, over real processes.

One nats-server (the ``nats`` fixture: JetStream, file storage) or one redis-server (the
``broker`` fixture runs the shared tests on both), and two uvicorn processes, A and B, of
:mod:`tests.replica_app`: each keeps its streams in a
:class:`~essessey.stores.jetstream.JetStreamEventStore` on the same JetStream stream (or a
:class:`~essessey.stores.redis.RedisEventStore` on the same redis-server) and runs
its own hub. A turn is the seeded turn of :mod:`tests.chaos_app`, produced on A, paced so
that it lasts a few seconds. Clients read over SSE with :func:`connect` and, whenever a
connection ends before the turn does, reconnect with the last id they got
(``Last-Event-ID``), on the same replica or on the other, a bounded number of times.

Every test checks the same thing at the end: the client's events, concatenated over all
its connections, are exactly the turn the seed describes (names and data bytes), their
ids are unique and increase, they are the ids the store holds (0 lost, 0 duplicated), and
``check()`` finds nothing wrong.

1. Resume on another replica: a client drops from A mid-turn and resumes on B.
2. Live across replicas: a client on B from the start sees A's turn as it is produced.
3. nats-server restarted mid-turn (stop, start on the same port and store): A's failed
   publishes are retried with the same ``Nats-Msg-Id`` until ``publish_timeout``, so the
   turn completes, stored once; subscribers on A and on B lose and repeat nothing, by
   their consumers recovering or by reconnecting with their last id.
4. A replica killed mid-turn (SIGKILL B while a client reads from it): the client
   resumes on A.
5. Leases, on both: a turn runs on one replica (a start on the other gets 409), a cancel
   through the other replica stops it there; the producer's replica killed: the reader
   gets the turn's end, an error event, once the lease runs out.
6. Redis only: redis-server restarted mid-turn with persistence on (the turn completes,
   exactly) and off (the reader is told its stream was reset, a resume gets 404, the
   producer's writes are refused).
7. Chaos on both: 10 turns produced on A and B, each client dropping 4-6 times at seeded
   points and resuming by id on the other replica every time.

Every process a test starts is stopped (uvicorn by ``serve_processes``, nats-server by the
fixture) and every wait is bounded.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from essessey import Event, EventType, check, reassemble_events
from essessey.bindings.sse import connect
from essessey.errors import StreamHTTPError
from tests.chaos_app import build_script, expected_events
from tests.nats_server import NatsServer
from tests.processes import WAIT
from tests.redis_server import RedisServer, redis_server
from tests.servers import ServerProcess, serve_processes
from tests.test_ui_node import WHOLE_TURN, chat, parts_of

pytestmark = pytest.mark.anyio

APP = "tests.replica_app:app"
EVENTS = 250
DELAY_MS = 6  # after every event: a turn lasts about 1.5 s
MAX_CONNECTIONS = 30  # per client: bounds the reconnect loop
RETRY_DELAY = 0.2
MID_TURN = 80  # events a client has when the test drops it, or breaks something
OUTAGE = 6.0  # seconds nats-server stays down: longer than a publish request's 5 s timeout


@dataclass
class Client:
    """One SSE client reading a turn over as many connections as it takes."""

    name: str
    events: list[Event] = field(default_factory=list)
    connections: list[str] = field(default_factory=list)  # the replica of each one
    breaks: list[str] = field(default_factory=list)  # why a connection ended early
    server_errors: list[bytes] = field(default_factory=list)  # the replicas' own errors
    first_delta_at: float | None = None  # time.time(), comparable with the replicas'
    last_event_at: float | None = None
    got_delta: anyio.Event = field(default_factory=anyio.Event)
    mid_turn: anyio.Event = field(default_factory=anyio.Event)  # set at MID_TURN events

    @property
    def last_id(self) -> str | None:
        return self.events[-1].id if self.events else None

    @property
    def ended(self) -> bool:
        return bool(self.events) and self.events[-1].event in (
            EventType.MESSAGE_STOP,
            EventType.ERROR,
        )


async def read_once(
    http: httpx.AsyncClient,
    base: str,
    stream_id: str,
    client: Client,
    until: Callable[[Client], bool] | None = None,
) -> str:
    """One connection to ``base``, resuming after the client's last id: read until the
    turn ends (``"ended"``), ``until(client)`` holds (``"dropped"``: the client closes
    the connection) or the connection ends or fails first (the reason)."""
    client.connections.append(base)
    try:
        async with connect(
            http, "GET", f"{base}/streams/{stream_id}", last_event_id=client.last_id
        ) as stream:
            async for event in stream:
                if event.event == EventType.ERROR and event.id in (None, client.last_id):
                    # Not an event of the turn: the replica's own error event, written
                    # without an id line when it cannot go on following the store, which
                    # SSE gives the last id. The response ends after it; the client
                    # resumes by id. Any other event with the last id again is a repeat,
                    # kept, so that assert_exact counts it as a duplicate.
                    client.server_errors.append(event.data)
                    continue
                now = time.time()
                if event.event == EventType.CONTENT_BLOCK_DELTA and not client.first_delta_at:
                    client.first_delta_at = now
                    client.got_delta.set()
                client.last_event_at = now
                client.events.append(event)
                if len(client.events) >= MID_TURN:
                    client.mid_turn.set()
                if client.ended:
                    return "ended"
                if until is not None and until(client):
                    return "dropped"
        return "cut: the response ended before the turn did"
    except (httpx.HTTPError, StreamHTTPError) as exc:
        return f"failed: {exc!r}"


async def read_to_end(
    http: httpx.AsyncClient,
    bases: list[str],
    stream_id: str,
    client: Client,
) -> None:
    """Read until the turn ends, reconnecting with the last id after every early end:
    on ``bases[0]`` first, moving to the next replica whenever a connection fails."""
    at = 0
    while len(client.connections) < MAX_CONNECTIONS:
        outcome = await read_once(http, bases[at], stream_id, client)
        if outcome == "ended":
            return
        client.breaks.append(f"{bases[at]}: {outcome}")
        if outcome.startswith("failed") and len(bases) > 1:
            at = (at + 1) % len(bases)
        await anyio.sleep(RETRY_DELAY)
    pytest.fail(f"{client.name}: no end after {MAX_CONNECTIONS} connections: {client.breaks}")


def seq(event_id: str | None) -> int:
    assert event_id is not None
    return int(event_id.rpartition("-")[2])


async def assert_exact(client: Client, seed: int, stream_id: str, stored: list[Event]) -> None:
    """The client's events are exactly the seeded turn, with the ids the store holds."""
    expected = await expected_events(seed, stream_id, EVENTS)
    ids = [event.id for event in client.events]
    counts = Counter(ids)
    duplicated = sum(count - 1 for count in counts.values())
    lost = sum(1 for event in stored if event.id not in counts)
    print(
        f"{client.name}: events={len(client.events)} lost={lost} duplicated={duplicated} "
        f"connections={len(client.connections)} breaks={client.breaks} "
        f"server_errors={len(client.server_errors)}"
    )
    assert (lost, duplicated) == (0, 0)
    assert [(e.event, e.data) for e in client.events] == [(e.event, e.data) for e in expected]
    assert None not in ids
    assert len({event_id.rpartition("-")[0] for event_id in ids if event_id}) == 1  # one epoch
    sequences = [seq(event_id) for event_id in ids]
    assert sequences == sorted(set(sequences)), "ids not unique and increasing"
    assert client.events == stored  # names, bytes and ids: what the store holds
    assert check(client.events) == []
    parsed = reassemble_events(client.events)
    script = build_script(seed, EVENTS)
    assert parsed.complete
    assert parsed.text == script.text
    assert parsed.thinking == "".join(script.thinking)


def broker_env(server: NatsServer | RedisServer) -> dict[str, str]:
    if isinstance(server, RedisServer):
        return {"REDIS_URL": server.url}
    return {"NATS_URL": server.url}


@contextmanager
def replicas(
    server: NatsServer | RedisServer, **env: str
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """Replicas A and B of the app on ``server``'s store, both stopped on exit."""
    environment = {**broker_env(server), "ESSESSEY_STREAM": "REPLICAS", **env}
    with serve_processes(APP, 2, environment) as (a, b):
        yield a, b


async def start_turn(http: httpx.AsyncClient, base: str, stream_id: str, seed: int) -> None:
    response = await http.post(
        f"{base}/turns/{stream_id}", params={"seed": seed, "delay_ms": DELAY_MS, "events": EVENTS}
    )
    assert response.status_code == 202, response.text


async def turn_status(http: httpx.AsyncClient, base: str, stream_id: str) -> dict[str, Any]:
    response = await http.get(f"{base}/turns/{stream_id}")
    assert response.status_code == 200, response.text
    status: dict[str, Any] = response.json()
    return status


async def wait_finished(http: httpx.AsyncClient, base: str, stream_id: str) -> dict[str, Any]:
    """The producer's status once its turn has finished (bounded)."""
    with anyio.fail_after(WAIT):
        while True:
            status = await turn_status(http, base, stream_id)
            if not status["running"]:
                return status
            await anyio.sleep(0.05)


async def stored_turn(http: httpx.AsyncClient, base: str, stream_id: str) -> list[Event]:
    """The whole turn as ``base`` replays it now, from the start."""
    reader = Client(f"replay via {base}")
    with anyio.fail_after(WAIT):
        await read_to_end(http, [base], stream_id, reader)
    return reader.events


# -- 1. resume on another replica ------------------------------------------------------


async def test_a_client_dropped_from_a_resumes_on_b_exactly(
    broker: NatsServer | RedisServer,
) -> None:
    seed, stream_id = 5_001, "turn-resume"
    with replicas(broker) as (a, b):
        async with httpx.AsyncClient(timeout=10.0) as http:
            await start_turn(http, a.url, stream_id, seed)
            client = Client("dropped A -> B")
            with anyio.fail_after(WAIT):
                outcome = await read_once(
                    http, a.url, stream_id, client, until=lambda c: len(c.events) >= MID_TURN
                )
                assert outcome == "dropped"
                # Mid-turn: the producer is still going when the client leaves A.
                status = await turn_status(http, a.url, stream_id)
                assert status["running"], status
                await read_to_end(http, [b.url], stream_id, client)
            await wait_finished(http, a.url, stream_id)
            stored = await stored_turn(http, a.url, stream_id)
            assert await stored_turn(http, b.url, stream_id) == stored
    assert client.connections == [a.url, b.url]
    assert client.breaks == []
    await assert_exact(client, seed, stream_id, stored)


# -- 2. live across replicas -----------------------------------------------------------


async def test_a_client_on_b_sees_the_turn_of_a_live(broker: NatsServer | RedisServer) -> None:
    seed, stream_id = 5_002, "turn-live"
    with replicas(broker) as (a, b):
        async with httpx.AsyncClient(timeout=10.0) as http:
            await start_turn(http, a.url, stream_id, seed)
            client = Client("live on B")
            with anyio.fail_after(WAIT):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(read_to_end, http, [b.url], stream_id, client)
                    await client.got_delta.wait()
                    # The first delta came through B while A was still producing: A says
                    # its turn is running, and not near its end.
                    at_first_delta = await turn_status(http, a.url, stream_id)
            finished = await wait_finished(http, a.url, stream_id)
            stored = await stored_turn(http, b.url, stream_id)
    assert client.first_delta_at is not None
    assert client.last_event_at is not None
    print(
        f"live: A at {at_first_delta['progress']}/{EVENTS} when B's client had its first "
        f"delta, {finished['finished_at'] - client.first_delta_at:.2f} s before A finished; "
        f"A ran {finished['finished_at'] - finished['started_at']:.2f} s"
    )
    assert at_first_delta["running"], at_first_delta
    assert at_first_delta["progress"] < EVENTS // 2, at_first_delta
    assert client.first_delta_at < finished["finished_at"]
    assert client.connections == [b.url]  # one connection, from the start to the end
    assert client.breaks == []
    await assert_exact(client, seed, stream_id, stored)


# -- 3. nats-server restarted mid-turn -------------------------------------------------


async def test_a_nats_server_restart_mid_turn_loses_and_repeats_nothing(
    nats: NatsServer,
) -> None:
    seed, stream_id = 5_003, "turn-restart"
    with replicas(nats) as (a, b):
        async with httpx.AsyncClient(timeout=10.0) as http:
            await start_turn(http, a.url, stream_id, seed)
            on_a, on_b = Client("restart, on A"), Client("restart, on B")
            # A third client leaves B when the server goes away and reconnects (by id)
            # while it is still away: to B first, then A, then B...
            on_c = Client("restart, reconnecting during the outage")
            leave = anyio.CancelScope()

            async def reconnect_during_outage() -> None:
                with leave:
                    await read_once(http, b.url, stream_id, on_c)
                on_c.breaks.append("left by the client while nats-server was away")
                await read_to_end(http, [b.url, a.url], stream_id, on_c)

            with anyio.fail_after(WAIT):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(read_to_end, http, [a.url], stream_id, on_a)
                    tasks.start_soon(read_to_end, http, [b.url], stream_id, on_b)
                    tasks.start_soon(reconnect_during_outage)
                    for client in (on_a, on_b, on_c):
                        await client.mid_turn.wait()
                    before = await turn_status(http, a.url, stream_id)
                    assert before["running"], before
                    started = time.monotonic()
                    await anyio.to_thread.run_sync(nats.stop)
                    leave.cancel()
                    await anyio.sleep(OUTAGE)
                    await anyio.to_thread.run_sync(nats.start)
                    outage = time.monotonic() - started
            finished = await wait_finished(http, a.url, stream_id)
            stored = await stored_turn(http, a.url, stream_id)
            assert await stored_turn(http, b.url, stream_id) == stored
            health_a = (await http.get(f"{a.url}/healthz")).json()
            health_b = (await http.get(f"{b.url}/healthz")).json()
    print(f"restart: A {health_a}, B {health_b}")
    print(
        f"restart: nats-server away {outage:.2f} s with A at {before['progress']}/{EVENTS}; "
        f"A's turn failed={finished['failed']}"
    )
    # The producer's publishes were retried (same Nats-Msg-Id) and the turn completed,
    # each event stored once (assert_exact compares the store's replay with the seed).
    assert health_a.get("store_publish_retries", 0) >= 1, health_a
    assert finished["failed"] is None
    # No subscriber saw an error: a follower rides out the outage, and one that attaches
    # during it waits for the server (its requests are retried as publishes are).
    assert on_a.server_errors == on_b.server_errors == on_c.server_errors == []
    assert stored[-1].event == EventType.MESSAGE_STOP
    await assert_exact(on_a, seed, stream_id, stored)
    await assert_exact(on_b, seed, stream_id, stored)
    await assert_exact(on_c, seed, stream_id, stored)


# -- 4. a replica killed mid-turn ------------------------------------------------------


async def test_a_client_of_a_killed_replica_resumes_on_the_other(
    broker: NatsServer | RedisServer,
) -> None:
    seed, stream_id = 5_004, "turn-kill"
    with replicas(broker) as (a, b):
        async with httpx.AsyncClient(timeout=10.0) as http:
            await start_turn(http, a.url, stream_id, seed)
            client = Client("on B, killed")
            with anyio.fail_after(WAIT):
                async with anyio.create_task_group() as tasks:
                    # On B until it fails, then on A.
                    tasks.start_soon(read_to_end, http, [b.url, a.url], stream_id, client)
                    await client.mid_turn.wait()
                    await anyio.to_thread.run_sync(lambda: b.stop(kill=True))  # SIGKILL
                    at_kill = len(client.events)
                    before = await turn_status(http, a.url, stream_id)
            finished = await wait_finished(http, a.url, stream_id)
            stored = await stored_turn(http, a.url, stream_id)
    print(
        f"kill: B killed with its client at {at_kill}/{EVENTS} events and A at "
        f"{before['progress']}/{EVENTS}; the client's breaks: {client.breaks}"
    )
    assert before["running"], before  # killed mid-turn
    assert finished["failed"] is None
    assert client.connections[0] == b.url
    assert client.connections[-1] == a.url
    assert client.breaks, "the kill did not break the client's connection"
    await assert_exact(client, seed, stream_id, stored)


# -- 5. a turn runs once, stops from anywhere, ends when its replica dies -----------------

LEASE = 2.0  # ESSESSEY_RUNNING_TTL in the lease tests: seconds a dead replica's lease lasts


async def test_a_turn_runs_on_one_replica_and_stops_from_the_other(
    broker: NatsServer | RedisServer,
) -> None:
    seed, stream_id = 5_006, "turn-lease"
    with replicas(broker) as (a, b):
        async with httpx.AsyncClient(timeout=10.0) as http:
            await start_turn(http, a.url, stream_id, seed)
            busy = await http.post(
                f"{b.url}/turns/{stream_id}", params={"seed": seed, "events": EVENTS}
            )
            client = Client("on B, cancelled from B")
            with anyio.fail_after(WAIT):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(read_to_end, http, [b.url], stream_id, client)
                    await client.mid_turn.wait()
                    asked = time.monotonic()
                    cancelled = (await http.post(f"{b.url}/turns/{stream_id}/cancel")).json()
                    took = time.monotonic() - asked
            status = await turn_status(http, a.url, stream_id)
            # Asked again once the turn has ended in the store too (A's lease released),
            # not only in its producer: until then a cancel can still reach it.
            with anyio.fail_after(WAIT):
                # Polled: another process's state, over HTTP; there is no event to await.
                while (await turn_status(http, a.url, stream_id))["held"]:  # noqa: ASYNC110
                    await anyio.sleep(0.02)
            again = (await http.post(f"{b.url}/turns/{stream_id}/cancel")).json()
            stored = await stored_turn(http, b.url, stream_id)
    print(f"lease: B's start got {busy.status_code}; B's cancel took {took:.2f} s")
    assert busy.status_code == 409  # StreamBusy: A holds the stream
    assert cancelled == {"cancelled": True}
    assert again == {"cancelled": False}  # nothing runs there now
    assert not status["running"]
    assert client.events == stored
    assert check(stored) == []
    assert reassemble_events(stored).stop_reason == "cancelled"
    assert MID_TURN <= len(stored) < EVENTS  # cut short mid-turn, ended properly


async def test_the_turn_of_a_killed_replica_ends_with_an_error_readers_see(
    broker: NatsServer | RedisServer,
) -> None:
    seed, stream_id = 5_007, "turn-orphan"
    env = {"ESSESSEY_RUNNING_TTL": str(LEASE)}
    with replicas(broker, **env) as (a, b):
        async with httpx.AsyncClient(timeout=10.0) as http:
            await start_turn(http, a.url, stream_id, seed)
            client = Client("on B, producer killed")
            with anyio.fail_after(WAIT):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(read_to_end, http, [b.url], stream_id, client)
                    await client.mid_turn.wait()
                    await anyio.to_thread.run_sync(lambda: a.stop(kill=True))  # SIGKILL
                    killed_at = time.monotonic()
                ended_after = time.monotonic() - killed_at
            stored = await stored_turn(http, b.url, stream_id)
            restarted = await http.post(
                f"{b.url}/turns/{stream_id}", params={"seed": seed, "events": EVENTS}
            )
    print(
        f"orphan: the reader on B got the end {ended_after:.2f} s after the kill "
        f"(lease {LEASE} s), with {len(client.events)} events"
    )
    assert client.ended
    assert client.events[-1].event == EventType.ERROR
    assert b"the replica running the turn stopped" in client.events[-1].data
    assert client.events == stored  # exactly what the store holds, the error included
    assert check(stored) == []
    # The lease runs out, then the reader's next quiet check ends it (Redis: every
    # heartbeat, 1 s; NATS: every two heartbeats, 2 s).
    assert ended_after < LEASE + 4.0
    assert restarted.status_code == 202  # the stream is free for a new turn


@pytest.mark.parametrize("appendonly", [False, True], ids=["persistence-off", "persistence-on"])
async def test_redis_restarted_mid_turn(appendonly: bool) -> None:
    # Persistence off: the restart loses every stream; readers and resumes are told so
    # (a reset, then 404), never given a silent gap. On: the turn completes, exactly.
    seed, stream_id = 5_008, "turn-redis-restart"
    with redis_server(appendonly=appendonly) as redis, replicas(redis) as (a, b):
        async with httpx.AsyncClient(timeout=10.0) as http:
            await start_turn(http, a.url, stream_id, seed)
            client = Client(f"on B, redis restarted ({'aof' if appendonly else 'no aof'})")
            outcome = ""

            async def read() -> None:
                nonlocal outcome
                if appendonly:
                    await read_to_end(http, [b.url, a.url], stream_id, client)
                    outcome = "ended"
                else:
                    outcome = await read_once(http, b.url, stream_id, client)

            with anyio.fail_after(WAIT):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(read)
                    await client.mid_turn.wait()
                    await anyio.to_thread.run_sync(redis.restart)
            finished = await wait_finished(http, a.url, stream_id)
            resume = await http.get(
                f"{b.url}/streams/{stream_id}", headers={"last-event-id": client.last_id or ""}
            )
            stored = await stored_turn(http, b.url, stream_id) if appendonly else []
    print(
        f"redis restart: outcome {outcome!r}, {len(client.events)} events, server errors "
        f"{client.server_errors}, producer failed={finished['failed']}, resume "
        f"{resume.status_code}"
    )
    if appendonly:
        assert finished["failed"] is None
        assert client.server_errors == []
        await assert_exact(client, seed, stream_id, stored)
    else:
        # Every key is gone: the reader is told its stream was reset and a resume by id
        # gets 404, never a silent gap; the producer's next append is refused (its lease
        # went with the keys), so no message's tail starts a new epoch.
        assert outcome.startswith("cut")
        assert len(client.server_errors) == 1
        assert b'"resume_unavailable"' in client.server_errors[0]
        assert resume.status_code == 404
        assert finished["failed"] is not None
        assert "LeaseLost" in finished["failed"]


# -- 7. chaos across replicas ----------------------------------------------------------

CHAOS_TURNS = 10
CHAOS_SEED = 20_261_202


async def test_chaos_every_reconnect_goes_to_the_other_replica(
    broker: NatsServer | RedisServer,
) -> None:
    # Turns produced on A and B alike; each client drops at seeded random points and
    # resumes by id on the other replica every time.
    rng = random.Random(CHAOS_SEED)
    plans = {
        f"chaos-{k}": sorted(rng.sample(range(5, EVENTS - 5), rng.randint(4, 6)))
        for k in range(CHAOS_TURNS)
    }
    clients = {stream_id: Client(stream_id) for stream_id in plans}
    with replicas(broker) as (a, b):
        bases = [a.url, b.url]
        async with httpx.AsyncClient(timeout=10.0) as http:
            for k, stream_id in enumerate(plans):
                await start_turn(http, bases[k % 2], stream_id, 6_000 + k)

            async def chaos_client(k: int, stream_id: str) -> None:
                client, drops = clients[stream_id], plans[stream_id]
                at = k % 2
                for drop_at in drops:
                    outcome = await read_once(
                        http,
                        bases[at],
                        stream_id,
                        client,
                        until=lambda c, n=drop_at: len(c.events) >= n,
                    )
                    if outcome == "ended":
                        return
                    at = 1 - at  # the other replica, every time
                while len(client.connections) < MAX_CONNECTIONS:
                    if await read_once(http, bases[at], stream_id, client) == "ended":
                        return
                    at = 1 - at

            with anyio.fail_after(WAIT * 2):
                async with anyio.create_task_group() as tasks:
                    for k, stream_id in enumerate(plans):
                        tasks.start_soon(chaos_client, k, stream_id)
            stored = {}
            for k, stream_id in enumerate(plans):
                await wait_finished(http, bases[k % 2], stream_id)
                stored[stream_id] = await stored_turn(http, bases[1 - k % 2], stream_id)
    drops = sum(len(c.connections) - 1 for c in clients.values())
    print(f"chaos ({type(broker).__name__}): {CHAOS_TURNS} turns, {drops} reconnects")
    assert drops >= 4 * CHAOS_TURNS
    for k, (stream_id, client) in enumerate(clients.items()):
        assert len(set(client.connections)) == 2  # it read from both replicas
        await assert_exact(client, 6_000 + k, stream_id, stored[stream_id])


def test_use_chat_reconnects_to_a_turn_on_the_other_replica(
    broker: NatsServer | RedisServer, node_client: Path
) -> None:
    # The turn runs on A; its first connection drops mid-turn; useChat's reconnect goes
    # to B, which finds the chat's turn in the shared store and replays it whole.
    with replicas(broker) as (a, b):
        body = {"id": "shared-chat", "messages": [], "trigger": "submit-message"}
        body["delay_ms"] = 150
        message_id = None
        with httpx.stream("POST", a.url + "/api/chat", json=body, timeout=WAIT) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line.removeprefix("data: "))
                    message_id = chunk.get("messageId", message_id)
                    if chunk["type"] == "text-delta":
                        break
        persisted = [
            {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi"}]},
            {"id": message_id, "role": "assistant", "parts": []},
        ]
        result = chat(node_client, b.url, "resume", "shared-chat", persisted)
    assert (result["status"], result["errors"]) == ("ready", [])
    assert [m["id"] for m in result["messages"]] == ["u1", message_id]
    assert parts_of(result["messages"][1]) == WHOLE_TURN


def test_a_chat_whose_turn_runs_on_a_refuses_a_new_turn_on_b(
    broker: NatsServer | RedisServer,
) -> None:
    # The chat's turn runs on A; a new message for the same chat sent to B is refused
    # while it runs (two turns of one chat would answer at once), taken once it is over.
    with replicas(broker) as (a, b):
        body = {"id": "busy-chat", "messages": [], "trigger": "submit-message"}
        with httpx.stream(
            "POST", a.url + "/api/chat", json={**body, "delay_ms": 150}, timeout=WAIT
        ) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            for line in lines:
                if line.startswith("data: {") and '"text-delta"' in line:
                    break
            busy = httpx.post(b.url + "/api/chat", json=body, timeout=WAIT)
            assert busy.status_code == 409, busy.text
            assert busy.json()["error"]["message"] == "a turn is running on this chat"
            assert sum(1 for line in lines if '"finish"' in line) == 1  # A's turn ends
        again = httpx.post(b.url + "/api/chat", json=body, timeout=WAIT)
        assert again.status_code == 200, again.text
        assert '"finish"' in again.text


# -- 8. a turn that asks: asked on A, answered on B ----------------------------------------


async def test_a_question_asked_on_a_is_answered_on_b_once(
    broker: NatsServer | RedisServer,
) -> None:
    # The turn asks on A and ends waiting; readers on A and on B read it, the same answer
    # goes to A and B at once, and the turn goes on once, on one of them; each reader
    # resumes after its last id and reads the continuation: the whole log, once.
    with replicas(broker) as (a, b):
        async with httpx.AsyncClient(timeout=WAIT) as http:
            response = await http.post(f"{a.url}/asking/ask1")
            assert response.status_code == 202, response.text
            readers = [Client("on A"), Client("on B")]
            with anyio.fail_after(WAIT):
                await read_to_end(http, [a.url], "ask1", readers[0])
                await read_to_end(http, [b.url], "ask1", readers[1])
            for reader in readers:
                parsed = reassemble_events(reader.events)
                assert [r.id for r in parsed.pending] == ["apr_ask1"]
            body = {"answers": [{"id": "apr_ask1", "approved": True}]}
            answers: list[httpx.Response] = []

            async def answer(base: str) -> None:
                answers.append(await http.post(f"{base}/streams/ask1/answer", json=body))

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(answer, a.url)
                tasks.start_soon(answer, b.url)
            assert [r.status_code for r in answers] == [200, 200], [r.text for r in answers]
            outcomes = [r.json() for r in answers]
            assert sorted(o["started"] for o in outcomes) == [False, True]
            assert {o["after"] for o in outcomes} == {readers[0].last_id}
            for reader in readers:
                with anyio.fail_after(WAIT):
                    await read_to_end(http, [a.url, b.url], "ask1", reader)
            replay = Client("replay via B")
            with anyio.fail_after(WAIT):
                for _ in range(2):  # the asking message, then the continuation
                    await read_to_end(http, [b.url], "ask1", replay)
            stored = replay.events
            other = {"answers": [{"id": "apr_ask1", "approved": False}]}
            refused = await http.post(f"{a.url}/streams/ask1/answer", json=other)
            unknown = await http.post(
                f"{b.url}/streams/ask1/answer", json={"answers": [{"id": "x", "value": 1}]}
            )
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["type"] == "conflict_error"
    assert unknown.status_code == 400  # names no request of the stream
    assert check(stored) == []
    parsed = reassemble_events(stored)
    assert len(parsed.messages) == 2
    assert parsed.pending == ()
    [execution] = parsed.executions
    assert execution.result == '{"sent":true}'
    assert parsed.messages[1].text.startswith("sent by replica ")
    for reader in readers:
        assert [(e.id, e.event, e.data) for e in reader.events] == [
            (e.id, e.event, e.data) for e in stored
        ]
