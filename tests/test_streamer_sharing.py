"""The streamers' declared sharing surface: a BlockIndex several streamers write through,
a text or thinking block opened with a given start object, and the tool streamer's calls
read without a copy. RoundStream is built on these alone."""

from collections.abc import Mapping, Sequence

import orjson
import pytest

from essessey import (
    InMemorySink,
    ProtocolError,
    Publisher,
    TextStreamer,
    ThinkingStreamer,
    ToolStreamer,
    check,
)
from essessey.adapters import RoundStream, ToolCallRequest
from essessey.protocol import Dialect
from essessey.streamers import BlockIndex, BlockStreamer, LineStreamer


async def _opened(dialect: Dialect = "essessey") -> tuple[Publisher, InMemorySink]:
    sink = InMemorySink()
    publisher = Publisher(sink, dialect=dialect)
    await publisher.send_stream_preamble("msg_1", "conv_1", "m")
    return publisher, sink


def _blocks(sink: InMemorySink) -> list[tuple[str, int]]:
    """(event, index) of every block event, in order."""
    return [
        (event.event, orjson.loads(event.data)["index"])
        for event in sink.events
        if event.event.startswith("content_block_")
    ]


async def _end(publisher: Publisher, sink: InMemorySink) -> None:
    await publisher.send_stream_epilogue("end_turn", 1)
    assert check(sink.events) == []


# -- BlockIndex -----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_streamers_sharing_one_index_get_consecutive_indexes() -> None:
    publisher, sink = await _opened()
    shared = BlockIndex(publisher)
    thinking = ThinkingStreamer(publisher, shared_index=shared)
    text = TextStreamer(publisher, shared_index=shared)
    lines = LineStreamer(publisher, transform=str.upper, shared_index=shared)
    tools = ToolStreamer(publisher, shared_index=shared)
    other = BlockStreamer(publisher, shared_index=shared)

    assert (shared.index, shared.is_open) == (0, False)
    await thinking.write("hmm")
    assert (shared.index, shared.is_open) == (0, True)
    await thinking.close()
    assert (shared.index, shared.is_open) == (1, False)
    await text.write("hi")
    await text.close()
    await lines.write("a line\n")
    await lines.close()
    await tools.start_call("c1", "f", "{}")
    await tools.write_result("c1", "ok")
    await other.start({"type": "server_tool_use", "id": "s1", "name": "search"})
    await other.close()

    assert _blocks(sink) == [
        *[("content_block_start", 0), ("content_block_delta", 0), ("content_block_stop", 0)],
        *[("content_block_start", 1), ("content_block_delta", 1), ("content_block_stop", 1)],
        *[("content_block_start", 2), ("content_block_delta", 2), ("content_block_stop", 2)],
        *[("content_block_start", 3), ("content_block_delta", 3), ("content_block_stop", 3)],
        *[("content_block_start", 4), ("content_block_delta", 4), ("content_block_stop", 4)],
        *[("content_block_start", 5), ("content_block_stop", 5)],
    ]
    # Every sharer sees the one index.
    assert {s.next_index for s in (thinking, text, lines, tools, other)} == {6}
    assert shared.index == 6
    await _end(publisher, sink)


@pytest.mark.anyio
async def test_a_shared_index_starts_where_it_was_made_to() -> None:
    publisher, sink = await _opened()
    shared = BlockIndex(publisher, 3)
    text = TextStreamer(publisher, shared_index=shared)
    assert text.next_index == 3
    await text.write("x")
    await text.close()
    assert _blocks(sink)[0] == ("content_block_start", 3)
    assert shared.index == 4


@pytest.mark.anyio
async def test_a_standalone_streamer_does_not_move_a_shared_index() -> None:
    publisher, _ = await _opened()
    shared = BlockIndex(publisher)
    alone = TextStreamer(publisher)
    await alone.write("x")
    await alone.close()
    assert (alone.next_index, shared.index) == (1, 0)


def test_a_shared_index_refuses_a_second_start_index_or_another_publisher() -> None:
    publisher = Publisher(InMemorySink())
    shared = BlockIndex(publisher, 2)
    with pytest.raises(ValueError, match="give start_index to the BlockIndex"):
        TextStreamer(publisher, 2, shared_index=shared)
    with pytest.raises(ValueError, match="same publisher"):
        ToolStreamer(Publisher(InMemorySink()), shared_index=shared)
    with pytest.raises(ValueError, match="same publisher"):
        ThinkingStreamer(None, shared_index=shared)
    with pytest.raises(ValueError, match="start_index must be >= 0"):
        BlockIndex(publisher, -1)
    # Without a publisher, streamers only accumulate and still share the indexes.
    quiet = BlockIndex(None)
    assert TextStreamer(None, shared_index=quiet).next_index == 0


@pytest.mark.anyio
async def test_raw_delta_goes_to_the_open_block_of_whichever_streamer() -> None:
    publisher, sink = await _opened()
    shared = BlockIndex(publisher, 1)
    before = list(sink.events)
    with pytest.raises(ProtocolError, match="needs an open block"):
        await shared.raw_delta({"type": "citations_delta", "citation": {}})
    assert sink.events == before  # refused before anything went out

    text = TextStreamer(publisher, shared_index=shared)
    await text.write("cited")
    await shared.raw_delta({"type": "citations_delta", "citation": {"n": 1}})
    assert sink.events[-1].event == "content_block_delta"
    assert sink.events[-1].data == (
        b'{"type":"content_block_delta","index":1,'
        b'"delta":{"type":"citations_delta","citation":{"n":1}}}'
    )
    assert text.text == "cited"  # a raw delta adds nothing to the streamer's content


# -- a text or thinking block opened with a given start object ------------------------------


@pytest.mark.anyio
async def test_start_writes_the_given_start_object_and_the_block_continues() -> None:
    publisher, sink = await _opened()
    text = TextStreamer(publisher)
    await text.start({"type": "text", "text": "", "citations": None})
    assert text.is_open
    await text.write("Hello")
    await text.close()
    assert [event.data for event in sink.events[2:]] == [
        b'{"type":"content_block_start","index":0,'
        b'"content_block":{"type":"text","text":"","citations":null}}',
        b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}',
        b'{"type":"content_block_stop","index":0}',
    ]
    await _end(publisher, sink)


@pytest.mark.anyio
async def test_a_thinking_block_keeps_the_provider_s_start_object() -> None:
    publisher, sink = await _opened("anthropic")
    shared = BlockIndex(publisher, 2)
    thinking = ThinkingStreamer(publisher, shared_index=shared)
    await thinking.start({"type": "thinking", "thinking": "", "signature": ""})
    await thinking.write("step")
    await thinking.write_signature("sig")
    await thinking.close()
    assert [event.data for event in sink.events[2:]] == [
        b'{"type":"content_block_start","index":2,'
        b'"content_block":{"type":"thinking","thinking":"","signature":""}}',
        b'{"type":"content_block_delta","index":2,'
        b'"delta":{"type":"thinking_delta","thinking":"step"}}',
        b'{"type":"content_block_delta","index":2,"delta":{"type":"signature_delta","signature":"sig"}}',
        b'{"type":"content_block_stop","index":2}',
    ]
    assert (thinking.text, thinking.signature, shared.index) == ("step", "sig", 3)


@pytest.mark.anyio
async def test_start_refuses_another_block_type_or_an_open_block_and_emits_nothing() -> None:
    publisher, sink = await _opened()
    text = TextStreamer(publisher)
    before = list(sink.events)
    with pytest.raises(ValueError, match="'text' block"):
        await text.start({"type": "thinking"})
    with pytest.raises(ValueError, match="'thinking' block"):
        await ThinkingStreamer(publisher).start({"type": "text"})
    assert sink.events == before
    await text.write("x")
    with pytest.raises(ProtocolError, match="already open"):
        await text.start({"type": "text"})
    assert len(sink.events) == len(before) + 2  # the write's start and delta only


# -- the tool streamer's calls, read without a copy -----------------------------------------


@pytest.mark.anyio
async def test_the_tool_streamer_s_calls_are_live_read_only_views() -> None:
    publisher, sink = await _opened()
    tools = ToolStreamer(publisher)
    started, by_id = tools.started_calls, tools.calls_by_id
    assert isinstance(started, Sequence)
    assert isinstance(by_id, Mapping)
    assert (len(started), len(by_id)) == (0, 0)

    await tools.start_call("c1", "get_weather", '{"city":')
    await tools.write_arguments("c1", '"Paris"}')
    await tools.start_call("c2", "get_time")
    # Read before the calls started, the views show them.
    assert [call.tool_use_id for call in started] == ["c1", "c2"]
    assert list(by_id) == ["c1", "c2"]
    assert "c2" in by_id
    assert "c3" not in by_id
    assert by_id["c1"] is started[0]
    # A closed call's arguments are whole; the open call's fill in when its block closes.
    assert (started[0].arguments, started[1].arguments) == ('{"city":"Paris"}', "")
    await tools.write_arguments("c2", "{}")
    await tools.end_call()
    assert started[1].arguments == "{}"

    with pytest.raises(TypeError):
        tools.calls_by_id["c3"] = started[0]  # type: ignore[index]
    assert "c3" not in tools.calls_by_id

    await tools.write_result("c2", "14:05")
    assert (by_id["c2"].result, by_id["c1"].result) == ("14:05", None)
    await tools.close()
    assert [call.tool_use_id for call in tools.calls] == ["c1", "c2"]
    await _end(publisher, sink)


# -- RoundStream on that surface --------------------------------------------------------------


@pytest.mark.anyio
async def test_a_round_s_blocks_share_its_index_and_keep_a_given_start_object() -> None:
    publisher, sink = await _opened("anthropic")
    rounds = RoundStream(publisher, start_index=1)
    await rounds.round_start()
    await rounds.open_content({"type": "thinking", "thinking": "", "signature": ""})
    await rounds.delta(reasoning="plan")
    await rounds.delta(text="ok")
    await rounds.tool_call_start(0, ToolCallRequest("c1", "f"))
    await rounds.tool_call_delta(0, "{}")
    await rounds.assistant_message([ToolCallRequest("c1", "f"), ToolCallRequest("c2", "g")])
    await rounds.tool_result(1, "second")
    await rounds.tool_result(0, "first")
    summary = await rounds.round_end()

    starts = [orjson.loads(e.data) for e in sink.events if e.event == "content_block_start"]
    assert [(s["index"], s["content_block"]["type"]) for s in starts] == [
        (1, "thinking"),
        (2, "text"),
        (3, "tool_use"),
        (4, "tool_use"),
        (5, "tool_result"),
        (6, "tool_result"),
    ]
    assert starts[0]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert [s["content_block"]["tool_use_id"] for s in starts[4:]] == ["c1", "c2"]
    assert (summary.start_index, summary.end_index, rounds.next_index) == (1, 7, 7)
    assert [(c.tool_use_id, c.arguments, c.result) for c in summary.tool_calls] == [
        ("c1", "{}", "first"),
        ("c2", "", "second"),
    ]
