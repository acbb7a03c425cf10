"""Snapshots for late readers (essessey.snapshot, and the hub's ``snapshot_after``).

A snapshot is the turn's events with each run of one block's deltas merged; the checks:
it reassembles into the same turn, the checker finds nothing in it, and a reader that
drops anywhere in it and resumes by the last id it got has the whole turn, nothing twice.
The hub's snapshots are tested on the in-memory store here and on Redis and JetStream in
tests/test_snapshot_stores.py.
"""

from __future__ import annotations

from typing import Any

import anyio
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from essessey import Event, InMemoryEventStore, InMemorySink, Publisher, StreamHub, check
from essessey import reassemble_events as reassemble
from essessey.snapshot import Compactor, SnapshotCache, compact
from tests.processes import WAIT
from tests.scripted_turn import ANSWER, THINKING, scripted_turn

pytestmark = pytest.mark.anyio


def summary(events: list[Event]) -> tuple[Any, ...]:
    """What a reader makes of a turn: per message its text, thinking, tool calls and
    results, stop reason; and whether it is whole."""
    parsed = reassemble(events)
    return (
        parsed.complete,
        [
            (m.text, m.thinking, m.tool_calls, m.tool_results, m.stop_reason, m.signature)
            for m in parsed.messages
        ],
    )


def with_ids(events: list[Event]) -> list[Event]:
    return [Event(e.event, e.data, f"ep-{n + 1}") for n, e in enumerate(events)]


async def recorded(produce: Any) -> list[Event]:
    sink = InMemorySink()
    await produce(Publisher(sink))
    return with_ids(sink.events)


def after(events: list[Event], event_id: str | None) -> list[Event]:
    """What a resume by ``event_id`` gets: the events after it."""
    if event_id is None:
        return list(events)
    ids = [e.id for e in events]
    return events[ids.index(event_id) + 1 :]


# -- compact ----------------------------------------------------------------------------


async def test_a_snapshot_of_the_scripted_turn_is_the_same_turn_in_fewer_events() -> None:
    events = await recorded(scripted_turn("s"))
    snapshot = compact(events)
    assert summary(snapshot) == summary(events)
    assert reassemble(snapshot).text == ANSWER
    assert reassemble(snapshot).thinking == THINKING
    assert check(snapshot) == []
    # Each text run is one delta now: the four words of each round, and the tool call's
    # two argument fragments, are one delta each.
    assert len(snapshot) == len(events) - 3 - 1 - 3
    ids = [e.id for e in snapshot]
    assert ids == sorted(set(ids), key=ids.index)  # unique, in the stream's order
    assert set(ids) <= {e.id for e in events}  # every id is a real event's


def text_turn(pieces: list[list[str]]) -> Any:
    """A message per element of ``pieces``: a thinking block then a text block of the
    given deltas (the first list thinking, the rest text), and a tool call."""

    async def produce(p: Publisher) -> None:
        for n, deltas in enumerate(pieces):
            await p.send_stream_preamble(f"m{n}", "s", "model")
            await p.send_content_block_start_thinking(0)
            for piece in deltas[: len(deltas) // 2]:
                await p.send_content_block_delta_thinking(0, piece)
            await p.send_signature_delta(0, "sig")
            await p.send_content_block_stop(0)
            await p.send_content_block_start_text(1)
            for piece in deltas[len(deltas) // 2 :]:
                await p.send_content_block_delta_text(1, piece)
            await p.send_content_block_stop(1)
            await p.send_tool_use_start(2, f"call_{n}", "tool")
            for piece in deltas:
                await p.send_tool_input_delta(2, orjson.dumps(piece).decode())
            await p.send_content_block_stop(2)
            await p.send_stream_epilogue("tool_use", 5)

    return produce


turns = st.lists(
    st.lists(st.text(min_size=1, max_size=12), min_size=2, max_size=12), min_size=1, max_size=3
)


@settings(max_examples=60, deadline=None)
@given(pieces=turns, limit=st.integers(min_value=1, max_value=40), data=st.data())
def test_a_reader_that_drops_anywhere_in_a_snapshot_resumes_exactly(
    pieces: list[list[str]], limit: int, data: st.DataObject
) -> None:
    events = anyio.run(recorded, text_turn(pieces))
    snapshot = compact(events, max_delta_chars=limit)
    assert check(snapshot) == []
    assert summary(snapshot) == summary(events)
    # Dropped after any number of the snapshot's events, resumed by the last id it got:
    cut = data.draw(st.integers(min_value=0, max_value=len(snapshot)))
    received = snapshot[:cut]
    last_id = received[-1].id if received else None
    whole = received + after(events, last_id)
    assert summary(whole) == summary(events)  # nothing missing, nothing twice
    assert check(whole) == []


@settings(max_examples=40, deadline=None)
@given(pieces=turns, data=st.data())
def test_a_compactor_fed_in_steps_gives_what_compact_gives(
    pieces: list[list[str]], data: st.DataObject
) -> None:
    events = anyio.run(recorded, text_turn(pieces))
    compactor = Compactor()
    fed = 0
    while fed < len(events):
        step = data.draw(st.integers(min_value=1, max_value=len(events) - fed))
        for event in events[fed : fed + step]:
            compactor.add(event)
        fed += step
        # A snapshot taken part-way is the snapshot of what was added so far.
        assert compactor.events() == compact(events[:fed])
    assert compactor.last_id == events[-1].id
    assert compactor.events_added == len(events)


def test_a_long_run_is_cut_between_deltas_each_part_with_its_own_id() -> None:
    deltas = [
        Event(
            "content_block_delta",
            orjson.dumps(
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": t},
                }
            ),
            f"e-{n}",
        )
        for n, t in enumerate(["abc", "defg", "hi", "jklmno", "p"])
    ]
    parts = compact(deltas, max_delta_chars=7)
    texts = [orjson.loads(p.data)["delta"]["text"] for p in parts]
    assert texts == ["abcdefg", "hi", "jklmnop"]  # "hi" + "jklmno" would be 8
    assert [p.id for p in parts] == ["e-1", "e-2", "e-4"]


def test_what_cannot_be_merged_passes_through_whole() -> None:
    def delta(body: dict[str, Any], n: int) -> Event:
        payload = {"type": "content_block_delta", "index": 0, "delta": body}
        return Event("content_block_delta", orjson.dumps(payload), f"e-{n}")

    events = [
        delta({"type": "citations_delta", "citation": {"cited_text": "a"}}, 1),
        delta({"type": "citations_delta", "citation": {"cited_text": "b"}}, 2),
        delta({"type": "signature_delta", "signature": "s1"}, 3),
        delta({"type": "text_delta", "text": "x", "extra": 1}, 4),  # more than its text
        delta({"type": "future_delta", "text": "y"}, 5),
        Event("content_block_delta", b"not json", "e-6"),
        Event("custom", b'{"type":"custom"}', "e-7"),
    ]
    assert compact(events) == events


# -- the hub ----------------------------------------------------------------------------

DELTAS = 400


def long_turn(gate: anyio.Event, produced: anyio.Event | None = None) -> Any:
    """A text block of DELTAS deltas (then ``produced`` is set), a wait on ``gate`` (the
    turn still running when late readers join), then the rest of the message."""

    async def produce(p: Publisher) -> None:
        await p.send_stream_preamble("m", "s", "model")
        await p.send_content_block_start_text(0)
        for n in range(DELTAS):
            await p.send_content_block_delta_text(0, f"{n} ")
        if produced is not None:
            produced.set()
        await gate.wait()
        for n in range(DELTAS, DELTAS + 5):
            await p.send_content_block_delta_text(0, f"{n} ")
        await p.send_content_block_stop(0)
        await p.send_stream_epilogue("end_turn", 1)

    return produce


WHOLE = "".join(f"{n} " for n in range(DELTAS + 5))


async def read(hub: StreamHub, last_id: str | None, *, keep: int | None = None) -> list[Event]:
    got: list[Event] = []
    async for event in hub.subscribe("s", last_id):
        got.append(event)
        if keep is not None and len(got) >= keep:
            break
    return got


async def test_a_late_reader_gets_a_snapshot_then_the_live_tail_and_resumes_exactly() -> None:
    store = InMemoryEventStore()
    gate, produced = anyio.Event(), anyio.Event()
    async with StreamHub(store, snapshot_after=50) as hub:
        await hub.start("s", long_turn(gate, produced))
        with anyio.fail_after(WAIT):
            await produced.wait()
            async with anyio.create_task_group() as tasks:
                late: list[Event] = []

                async def late_reader() -> None:
                    late.extend(await read(hub, None))

                tasks.start_soon(late_reader)
                dropped = await read(hub, None, keep=2)  # message_start, block start
                await anyio.sleep(0.05)
                gate.set()
            resumed = await read(hub, dropped[-1].id)
        stored = (await store.since("s", None))[0]
    # message_start, the preamble's ping, the block's start, DELTAS + 5 deltas, its stop,
    # message_delta, message_stop.
    assert len(stored) == 3 + DELTAS + 5 + 3
    # The snapshot: what came before the block's deltas, then one delta of the text so
    # far; then what came after, one event at a time.
    assert late[:3] == stored[:3]
    assert orjson.loads(late[3].data)["delta"]["text"] == "".join(f"{n} " for n in range(DELTAS))
    assert late[3].id == stored[3 + DELTAS - 1].id  # the id of the last delta it holds
    assert late[4:] == stored[3 + DELTAS :]
    assert len(late) == 4 + 5 + 3
    assert reassemble(late).text == WHOLE
    assert check(late) == []
    # Dropped inside the snapshot, resumed by its last id: the rest, exactly.
    assert summary(dropped + resumed) == summary(stored)
    assert reassemble(dropped + resumed).text == WHOLE


async def test_a_reader_far_behind_gets_what_it_missed_compacted_and_a_near_one_exactly() -> None:
    store = InMemoryEventStore()
    gate = anyio.Event()
    gate.set()
    async with StreamHub(store, snapshot_after=50) as hub:
        await hub.start("s", long_turn(gate))
        await hub.wait("s")
        stored = (await store.since("s", None))[0]
        far = await read(hub, stored[2].id)  # 400+ events behind
        near = await read(hub, stored[-20].id)  # 19 behind: under the threshold
    assert len(far) == 1 + 3  # one delta of all the text, then stop, delta, message_stop
    assert summary(stored[:3] + far) == summary(stored)
    assert near == stored[-19:]  # exactly the stored events


async def test_without_snapshot_after_every_reader_gets_every_event() -> None:
    store = InMemoryEventStore()
    gate = anyio.Event()
    gate.set()
    async with StreamHub(store) as hub:
        await hub.start("s", long_turn(gate))
        await hub.wait("s")
        assert await read(hub, None) == (await store.since("s", None))[0]


async def test_the_cache_reads_only_what_was_appended_since_the_last_reader() -> None:
    store = InMemoryEventStore()
    for _ in range(3):
        await store.append("s", Event("ping", b'{"type":"ping"}'))  # before any message
    events = await recorded(scripted_turn("s"))
    for event in events[:10]:
        await store.append("s", Event(event.event, event.data))
    cache = SnapshotCache(store)
    first, covered = await cache.snapshot("s")
    assert covered == 10  # from the first message_start: the pings before it are left out
    asked: list[str | None] = []
    since = store.since

    async def counting(stream_id: str, last_event_id: str | None) -> Any:
        asked.append(last_event_id)
        return await since(stream_id, last_event_id)

    store.since = counting  # type: ignore[method-assign]
    for event in events[10:]:
        await store.append("s", Event(event.event, event.data))
    second, covered = await cache.snapshot("s")
    assert asked == [first[-1].id]  # read from where the first snapshot ended
    assert covered == len(events)
    assert summary(second) == summary(events)
    await store.clear("s")
    for event in events[:4]:
        await store.append("s", Event(event.event, event.data))
    third, covered = await cache.snapshot("s")  # cleared: read again from its start
    assert covered == 4
    assert [e.event for e in third] == [e.event for e in compact(events[:4])]
