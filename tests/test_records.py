"""Reading events (essessey.protocol.read): the record of every protocol event in both
payload dialects, bad input that never raises, the bounded memo, and "parsed once": however
many readers read an event (the hub, the checker, the reassembler, the snapshot compactor,
the dialects' encoders), its JSON is parsed once."""

from __future__ import annotations

import time

import anyio
import anyio.lowlevel
import httpx
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from essessey import Event, InMemorySink, Publisher, StreamHub, check, stream_turn
from essessey.bindings.sse import FrameEncoder, stream_response
from essessey.dialects.agui import AGUIEncoder
from essessey.dialects.chat_completions import ChatCompletionsEncoder
from essessey.dialects.responses import ResponsesEncoder
from essessey.dialects.ui import UIMessageEncoder
from essessey.protocol import (
    BlockStart,
    BlockStop,
    Delta,
    ErrorRecord,
    EventType,
    MessageDelta,
    MessageStart,
    MessageStop,
    OtherEvent,
    Ping,
    Unreadable,
    read,
)
from essessey.protocol import records as records_module
from essessey.protocol.records import published_text
from essessey.reassemble import reassemble_events
from essessey.snapshot import compact
from tests.processes import WAIT
from tests.servers import serve

pytestmark = pytest.mark.anyio


async def _turn(publisher: Publisher) -> None:
    await publisher.send_stream_preamble("msg_1", "s", "model-x", input_tokens=7)
    await publisher.send_content_block_start_thinking(0)
    await publisher.send_content_block_delta_thinking(0, "hmm")
    await publisher.send_signature_delta(0, "sig")
    await publisher.send_content_block_stop(0)
    await publisher.send_content_block_start_text(1)
    await publisher.send_content_block_delta_text(1, "Hello")
    await publisher.send_content_block_stop(1)
    await publisher.send_tool_use_block(2, "call_1", "get_weather", '{"city":"Paris"}')
    await publisher.send_tool_result_block(3, "call_1", "sunny", is_error=True)
    await publisher.send_stream_epilogue("tool_use", 12, cache_read_input_tokens=3)


@pytest.mark.parametrize("dialect", ["essessey", "anthropic"])
async def test_every_protocol_event_reads_to_its_record(dialect: str) -> None:
    sink = InMemorySink()
    await _turn(Publisher(sink, dialect=dialect))  # type: ignore[arg-type]
    records = [read(event) for event in sink.events]
    kinds = [type(record) for record in records]
    assert kinds == [
        MessageStart,
        Ping,
        BlockStart,
        Delta,
        Delta,
        BlockStop,
        BlockStart,
        Delta,
        BlockStop,
        BlockStart,
        Delta,
        BlockStop,
        BlockStart,
        Delta,
        BlockStop,
        MessageDelta,
        MessageStop,
    ]
    start = records[0]
    assert isinstance(start, MessageStart)
    assert (start.message_id, start.stream_id, start.model, start.input_tokens) == (
        "msg_1",
        "s",
        "model-x",
        7,
    )
    deltas = [r for r in records if isinstance(r, Delta)]
    # The content of each delta, whichever field the dialect puts it in.
    assert [(d.index, d.delta_type, d.text) for d in deltas] == [
        (0, "thinking_delta", "hmm"),
        (0, "signature_delta", "sig"),
        (1, "text_delta", "Hello"),
        (2, "input_json_delta", '{"city":"Paris"}'),
        (3, "json_partial", "sunny"),
    ]
    tool_use, tool_result = (r for r in records if isinstance(r, BlockStart) and r.index >= 2)
    assert (tool_use.block_type, tool_use.tool_use_id, tool_use.tool_name) == (
        "tool_use",
        "call_1",
        "get_weather",
    )
    assert (tool_result.block_type, tool_result.tool_use_id, tool_result.is_error) == (
        "tool_result",
        "call_1",
        True,
    )
    end = records[-2]
    assert isinstance(end, MessageDelta)
    assert (end.stop_reason, end.stop_sequence, end.output_tokens) == ("tool_use", None, 12)
    assert end.usage["cache_read_input_tokens"] == 3
    for record, event in zip(records, sink.events, strict=True):
        assert record.name == event.event
        assert record.payload == orjson.loads(event.data)


async def test_an_error_and_a_custom_event_read_to_theirs() -> None:
    sink = InMemorySink()
    publisher = Publisher(sink, strict=False)
    await publisher.send_error("overloaded_error", "busy", request_id="req_1")
    await publisher.publish("progress", {"step": 3})
    error, custom = (read(event) for event in sink.events)
    assert error == ErrorRecord("overloaded_error", "busy", "req_1", error.payload)
    assert custom == OtherEvent("progress", {"type": "progress", "step": 3})


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON list, not an object"),
        (b'"text"', "JSON str, not an object"),
        (b'{"type":"content_block_delta","index":"0","delta":{"type":"text_delta"}}', "laid out"),
        (b'{"type":"content_block_delta","index":0}', "laid out"),
        (b'{"type":"content_block_delta","index":0,"delta":[]}', "laid out"),
    ],
)
def test_a_delta_that_is_not_laid_out_as_the_protocol_says_is_unreadable(
    data: bytes, reason: str
) -> None:
    record = read(Event(EventType.CONTENT_BLOCK_DELTA, data))
    assert isinstance(record, Unreadable)
    assert reason in record.reason
    assert "text_delta" not in record.reason  # types and lengths, never the content


@given(
    name=st.sampled_from([*sorted(EventType.ALL), "custom", ""]),
    data=st.one_of(
        st.binary(max_size=64),
        st.recursive(
            st.none()
            | st.booleans()
            | st.integers(-(2**63), 2**63 - 1)
            | st.floats(allow_nan=False, allow_infinity=False)
            | st.text(),
            lambda inner: (
                st.lists(inner, max_size=4)
                | st.dictionaries(
                    st.sampled_from(
                        ["type", "index", "delta", "text", "message", "error", "usage"]
                    ),
                    inner,
                    max_size=5,
                )
            ),
            max_leaves=12,
        ).map(orjson.dumps),
    ),
)
def test_any_bytes_under_any_name_read_to_a_record_without_raising(name: str, data: bytes) -> None:
    record = read(Event(name, data))
    assert record.name == name
    if isinstance(record, Unreadable):
        assert record.reason


def test_the_memo_is_bounded() -> None:
    for i in range(records_module.MEMO_SIZE + 100):
        read(Event("custom", b'{"i":%d}' % i))
    assert len(records_module._memo) <= records_module.MEMO_SIZE


def test_a_key_two_threads_put_in_the_ring_at_once_leaves_reads_working() -> None:
    # Two threads that miss on equal bytes at once may both put them in the ring: the
    # second slot's eviction finds them gone, and read() must go on (it never raises).
    data = b'{"twice":true}'
    read(Event("custom", data))
    ring = records_module._ring
    # What the second thread does: the slot's key out, then the same bytes in again.
    slot = records_module._cursor.position
    evicted = ring[slot]
    if evicted is not None:
        records_module._memo.pop(evicted, None)
    ring[slot] = data
    records_module._cursor.position = (slot + 1) % len(ring)
    for i in range(2 * records_module.MEMO_SIZE):
        assert read(Event("custom", b'{"after":%d}' % i)).name == "custom"
    assert len(records_module._memo) <= records_module.MEMO_SIZE


def test_an_event_read_by_every_reader_is_parsed_once() -> None:
    events = [
        Event("message_start", orjson.dumps(_message_start("m-once"))),
        _event("content_block_start", index=0, content_block={"type": "text"}),
        _event("content_block_delta", index=0, delta={"type": "text_delta", "text": "once"}),
        _event("content_block_stop", index=0),
        _event(
            "message_delta",
            delta={"stop_reason": "end_turn", "stop_sequence": None},
            usage={"output_tokens": 1},
        ),
        _event("message_stop"),
    ]
    events = [event.with_id(f"1-{i}") for i, event in enumerate(events)]
    before = records_module.reads.parsed
    assert check(events) == []
    assert reassemble_events(events).text == "once"
    compact(events)
    for encoder in _encoders():
        for event in events:
            encoder.encode(event)
    # Six events, six readers of each: six parses (the memo may have held some already).
    assert records_module.reads.parsed - before <= len(events)


def _event(name: str, **fields: object) -> Event:
    return Event(name, orjson.dumps({"type": name, **fields}))


def _encoders() -> list[FrameEncoder]:
    return [
        UIMessageEncoder(),
        AGUIEncoder("thread", "run"),
        # Their times given: encoders made a second apart would stamp different ones.
        ChatCompletionsEncoder("chatcmpl-1", created=1_700_000_000),
        ResponsesEncoder("resp_1", created_at=1_700_000_000),
    ]


def _message_start(message_id: str) -> dict[str, object]:
    return {
        "type": "message_start",
        "message": {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": "m",
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        },
    }


@pytest.mark.parametrize("position", range(4))
async def test_a_dialect_response_following_a_hub_turn_parses_none_of_its_text_deltas(
    position: int,
) -> None:
    """The real path, a hub turn served in a dialect (``stream_response``) on a server:
    each text delta reaches the response in the turn's append with its index and text,
    so only the turn's other events are parsed (five), not its thirty deltas; and the
    response is byte for byte what a late reader of the finished turn gets."""
    hub = StreamHub()
    nonce = time.monotonic_ns()  # events whose bytes no earlier test memoised

    async def produce(publisher: Publisher) -> None:
        async with stream_turn(publisher, message_id=f"m{nonce}", stream_id="s", model="m") as turn:
            text = await turn.text()
            for i in range(30):
                await anyio.sleep(0.005)  # a model's pace: each delta taken in the append
                await text.write(f"w{i}.{nonce} ")

    async def route(request: Request) -> Response:
        if request.query_params.get("start"):
            await hub.start("s", produce)
        return stream_response(hub, "s", None, encoder=_encoders()[position])

    app = Starlette(routes=[Route("/", route)], lifespan=hub.lifespan)
    with serve(app, lifespan="on") as url:
        async with httpx.AsyncClient(timeout=WAIT) as client:
            before = records_module.reads.parsed
            response = await client.get(url + "/?start=1")
            parsed = records_module.reads.parsed - before
            # A late reader: the finished turn replayed, every event read and encoded.
            late = await client.get(url + "/")
    assert response.status_code == 200
    assert all(f"w{i}.{nonce} ".encode() in response.content for i in range(30))
    assert parsed <= 5
    # Written from the deltas' fields, the frames are the ones encoding the events makes.
    assert late.status_code == 200
    assert response.content == late.content


async def test_a_hub_turn_read_by_several_dialect_subscribers_parses_each_event_once() -> None:
    """The hub-to-dialect path: the parses per delivered event, with four dialect readers
    of one turn, are at most one per event (each encoder used to parse every event); the
    text deltas, whose records each reader notes as it takes them, are not parsed at all,
    and every reader writes what it writes for the same events parsed."""
    events: list[Event] = []
    async with StreamHub() as hub:
        gate = anyio.Event()

        async def produce(publisher: Publisher) -> None:
            await gate.wait()
            async with stream_turn(publisher, message_id="m-hub", stream_id="s", model="m") as turn:
                text = await turn.text()
                for i in range(50):
                    await text.write(f"word{i} ")

        await hub.start("s", produce)
        encoders = _encoders()
        written: list[list[bytes]] = [[] for _ in encoders]

        class Taker:
            # What essessey's SSE and WebSocket endpoints do: live events taken in the
            # turn's own append.
            def __init__(self, position: int) -> None:
                self.position = position

            def write(self, event: Event) -> bool:
                written[self.position].append(encoders[self.position].encode(event))
                if self.position == 0:
                    events.append(event)
                return True

            def take(self, name: str, data: bytes, event_id: str) -> bool:
                return self.write(Event(name, data, event_id))

            def take_text(
                self,
                data: bytes,
                id_head: bytes,
                seq: int,
                index: int,
                text: str,
                text_json: bytes,
            ) -> bool:
                published_text(data, index, text)  # what essessey's dialect responses do
                return self.take("content_block_delta", data, f"{id_head.decode()}{seq}")

        async def follow(position: int) -> None:
            subscription = await hub.open("s")
            taker = Taker(position)
            subscription.deliver_live(taker)
            async for event in subscription:
                taker.write(event)

        before = records_module.reads.parsed
        async with anyio.create_task_group() as readers:
            for position in range(len(encoders)):
                readers.start_soon(follow, position)
            await anyio.lowlevel.checkpoint()
            gate.set()
    parsed = records_module.reads.parsed - before
    delivered = [len(frames) for frames in written]
    assert delivered[0] > 50
    assert all(count == delivered[0] for count in delivered)
    # One parse per distinct event at most, for four readers of each; none for the 50
    # text deltas.
    assert parsed <= delivered[0] - 50
    share = parsed / sum(delivered)
    print(f"{parsed} parses for {sum(delivered)} delivered events ({share:.2f} each)")
    # The same events as new bytes (nothing noted, nothing in the memo) read by new
    # encoders: the same frames.
    copies = [Event(e.event, b" " + e.data, e.id) for e in events]
    for encoder, frames in zip(_encoders(), written, strict=True):
        assert [encoder.encode(event) for event in copies] == frames


_TEXTS = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


@given(index=st.integers(0, 2**63 - 1), text=_TEXTS)
def test_a_noted_text_delta_reads_to_the_record_its_bytes_parse_to(index: int, text: str) -> None:
    data = _TEXT_DELTA % (index, orjson.dumps(text))
    records_module.published_text(data, index, text)
    before = records_module.reads.parsed
    noted = read(Event(EventType.CONTENT_BLOCK_DELTA, data))
    assert records_module.reads.parsed == before
    # A leading space: other bytes, the same JSON, read by a parse.
    parsed = read(Event(EventType.CONTENT_BLOCK_DELTA, b" " + data))
    assert type(noted) is Delta
    assert noted == parsed
    assert list(noted.payload) == list(parsed.payload)


def test_a_note_serves_only_its_own_bytes_under_the_delta_name() -> None:
    data = _TEXT_DELTA % (3, b'"noted"')
    records_module.published_text(data, 3, "noted")
    other = read(Event("custom", data))
    assert isinstance(other, OtherEvent)
    assert other.payload == orjson.loads(data)
    before = records_module.reads.parsed
    equal = read(Event(EventType.CONTENT_BLOCK_DELTA, bytes(bytearray(data))))
    assert records_module.reads.parsed == before + 1  # equal bytes, another object: parsed
    assert equal == Delta(3, "text_delta", "noted", orjson.loads(data))
    records_module.published_text(_TEXT_DELTA % (3, b'"next"'), 3, "next")
    before = records_module.reads.parsed
    again = read(Event(EventType.CONTENT_BLOCK_DELTA, data))  # no longer the last noted
    assert again == equal
    assert records_module.reads.parsed <= before + 1


_TEXT_DELTA = b'{"type":"content_block_delta","index":%d,"delta":{"type":"text_delta","text":%s}}'
