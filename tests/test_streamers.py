"""Streamers keep the block index rules; try to break each of them and fail."""

import logging
from typing import Any

import anyio
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from essessey import (
    BlockStreamer,
    Event,
    InMemorySink,
    LineStreamer,
    ProtocolError,
    Publisher,
    TextStreamer,
    ThinkingStreamer,
    ToolStreamer,
    check,
    reassemble_events,
    stream_turn,
)
from essessey.streamers import NO_RESULT_TEXT

MARKER = "SECRET-PAYLOAD-7f3a"


def _make(*, strict: bool = True) -> tuple[Publisher, InMemorySink]:
    sink = InMemorySink()
    return Publisher(sink, strict=strict), sink


async def _opened(*, strict: bool = True) -> tuple[Publisher, InMemorySink]:
    publisher, sink = _make(strict=strict)
    await publisher.send_stream_preamble("msg_1", "conv_1", "m")
    sink.clear()
    return publisher, sink


def _shape(events: list[Event]) -> list[tuple[Any, ...]]:
    """Each event as (name, index or block type or delta content) for compact asserts."""
    shaped: list[tuple[Any, ...]] = []
    for event in events:
        payload = orjson.loads(event.data)
        if event.event == "content_block_start":
            shaped.append(("start", payload["index"], payload["content_block"]["type"]))
        elif event.event == "content_block_delta":
            body = {k: v for k, v in payload["delta"].items() if k != "type"}
            [value] = body.values()
            shaped.append(("delta", payload["index"], value))
        elif event.event == "content_block_stop":
            shaped.append(("stop", payload["index"]))
        else:
            shaped.append((event.event,))
    return shaped


# -- rule 2: a block opens on its first non-empty chunk -------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("kind", [TextStreamer, ThinkingStreamer, LineStreamer])
async def test_empty_chunks_open_nothing_and_use_no_index(
    kind: type[TextStreamer | ThinkingStreamer | LineStreamer],
) -> None:
    publisher, sink = await _opened()
    streamer = kind(publisher, 3)
    await streamer.write("")
    await streamer.write("")
    assert not streamer.is_open
    await streamer.close()
    assert sink.events == []
    assert streamer.next_index == 3
    assert streamer.text == ""


@pytest.mark.anyio
async def test_empty_signature_and_arguments_emit_nothing() -> None:
    publisher, sink = await _opened()
    thinking = ThinkingStreamer(publisher)
    await thinking.write_signature("")
    await thinking.close()
    assert sink.events == []
    assert thinking.signature is None
    tools = ToolStreamer(publisher)
    await tools.start_call("call_1", "f")
    await tools.write_arguments("call_1", "")
    assert _shape(sink.events) == [("start", 0, "tool_use")]


@pytest.mark.anyio
async def test_a_turn_with_an_empty_thinking_round_starts_text_at_zero() -> None:
    publisher, sink = _make()
    async with stream_turn(publisher, message_id="m", stream_id="s", model="x") as turn:
        thinking = await turn.thinking()
        await thinking.write("")
        text = await turn.text()
        await text.write("Hello")
        lines = await turn.lines()
        await lines.write("")
        tools = await turn.tools()
    assert tools.calls == []
    assert _shape(sink.events)[2:-2] == [
        ("start", 0, "text"),
        ("delta", 0, "Hello"),
        ("stop", 0),
    ]
    assert check(sink.events) == []


@pytest.mark.anyio
async def test_a_signature_alone_opens_the_thinking_block() -> None:
    publisher, sink = await _opened()
    thinking = ThinkingStreamer(publisher)
    await thinking.write_signature("sig_1")
    await thinking.close()
    assert _shape(sink.events) == [
        ("start", 0, "thinking"),
        ("delta", 0, "sig_1"),
        ("stop", 0),
    ]
    assert thinking.signature == "sig_1"
    assert thinking.text == ""
    assert thinking.next_index == 1


# -- rule 3: the index advances only when an opened block closes -----------------------------


@pytest.mark.anyio
async def test_next_index_advances_only_when_an_opened_block_closes() -> None:
    publisher, sink = await _opened()
    text = TextStreamer(publisher, 2)
    assert text.next_index == 2
    await text.write("a")
    assert text.is_open
    assert text.next_index == 2
    await text.write("b")
    assert text.next_index == 2
    await text.close()
    assert not text.is_open
    assert text.next_index == 3
    await text.close()
    assert text.next_index == 3
    assert text.text == "ab"
    assert _shape(sink.events) == [
        ("start", 2, "text"),
        ("delta", 2, "a"),
        ("delta", 2, "b"),
        ("stop", 2),
    ]


def test_negative_start_index_is_refused() -> None:
    with pytest.raises(ValueError, match="start_index"):
        TextStreamer(None, -1)
    with pytest.raises(ValueError, match="start_index"):
        ToolStreamer(None, -1)


# -- rule 4 and one open block: the Turn closes one streamer before the next ----------------


@pytest.mark.anyio
async def test_text_after_thinking_closes_thinking_first() -> None:
    publisher, sink = _make()
    async with stream_turn(publisher, message_id="m", stream_id="s", model="x") as turn:
        thinking = await turn.thinking()
        await thinking.write("Let me see.")
        assert turn.next_index == 0
        text = await turn.text()
        assert not thinking.is_open
        assert turn.next_index == 1
        await text.write("Done.")
    assert _shape(sink.events)[2:-2] == [
        ("start", 0, "thinking"),
        ("delta", 0, "Let me see."),
        ("stop", 0),
        ("start", 1, "text"),
        ("delta", 1, "Done."),
        ("stop", 1),
    ]
    assert check(sink.events) == []


@pytest.mark.anyio
@pytest.mark.parametrize("strict", [True, False])
async def test_a_streamer_the_turn_moved_past_cannot_open_a_block(strict: bool) -> None:
    publisher, sink = _make(strict=strict)
    async with stream_turn(publisher, message_id="m", stream_id="s", model="x") as turn:
        thinking = await turn.thinking()
        await thinking.write("hmm")
        text = await turn.text()
        await text.write("answer")
        before = len(sink)
        # Writing to the old streamer would reopen a block at index 1, inside the text block.
        with pytest.raises(ProtocolError):
            await thinking.write("more")
        with pytest.raises(ProtocolError):
            await thinking.write_signature("sig")
        old_tools = await turn.tools()
        await turn.text()
        with pytest.raises(ProtocolError):
            await old_tools.start_call("call_1", "f")
        assert len(sink) == before + 1  # only the text block's stop
    assert check(sink.events) == []


@pytest.mark.anyio
async def test_two_standalone_streamers_cannot_overlap_on_a_strict_publisher() -> None:
    publisher, sink = await _opened()
    first = TextStreamer(publisher, 0)
    second = ThinkingStreamer(publisher, 1)
    await first.write("a")
    with pytest.raises(ProtocolError):
        await second.write("b")
    assert not second.is_open
    assert second.next_index == 1
    assert len(sink) == 2


# -- rule 5: all tool_use blocks before all tool_result blocks -------------------------------


@pytest.mark.anyio
async def test_parallel_calls_then_results() -> None:
    publisher, sink = await _opened()
    tools = ToolStreamer(publisher, 1)
    await tools.start_call("call_a", "get_weather", '{"city":')
    await tools.write_arguments("call_a", '"Paris"}')
    await tools.start_call("call_b", "get_time")
    await tools.write_result("call_b", "12:00")
    await tools.write_result("call_a", '{"temp_c":18}')
    await tools.close()
    assert tools.next_index == 5
    assert _shape(sink.events) == [
        ("start", 1, "tool_use"),
        ("delta", 1, '{"city":'),
        ("delta", 1, '"Paris"}'),
        ("stop", 1),
        ("start", 2, "tool_use"),
        ("stop", 2),
        ("start", 3, "tool_result"),
        ("delta", 3, "12:00"),
        ("stop", 3),
        ("start", 4, "tool_result"),
        ("delta", 4, '{"temp_c":18}'),
        ("stop", 4),
    ]
    assert [(c.tool_use_id, c.arguments, c.result) for c in tools.calls] == [
        ("call_a", '{"city":"Paris"}', '{"temp_c":18}'),
        ("call_b", "", "12:00"),
    ]
    assert tools.pending == []


@pytest.mark.anyio
async def test_a_call_cannot_start_after_the_first_result() -> None:
    publisher, sink = await _opened()
    tools = ToolStreamer(publisher)
    await tools.start_call("call_a", "f")
    await tools.start_call("call_b", "f")
    await tools.write_result("call_a", "1")
    before = len(sink)
    with pytest.raises(ProtocolError, match="after the round's first result"):
        await tools.start_call("call_c", "f", '{"x":1}')
    assert len(sink) == before
    assert [c.tool_use_id for c in tools.calls] == ["call_a", "call_b"]
    assert tools.pending == ["call_b"]


@pytest.mark.anyio
async def test_arguments_only_for_the_open_call() -> None:
    publisher, sink = await _opened()
    tools = ToolStreamer(publisher)
    with pytest.raises(ProtocolError):
        await tools.write_arguments("call_a", "{}")
    await tools.start_call("call_a", "f")
    await tools.start_call("call_b", "f")
    before = len(sink)
    with pytest.raises(ProtocolError, match="call_a"):
        await tools.write_arguments("call_a", "{}")
    with pytest.raises(ProtocolError, match="call_x"):
        await tools.write_arguments("call_x", "{}")
    await tools.write_result("call_b", "ok")
    with pytest.raises(ProtocolError):
        await tools.write_arguments("call_b", "{}")
    assert len(sink) == before + 4  # call_b's stop, then its result block
    assert tools.calls[0].arguments == ""


@pytest.mark.anyio
async def test_bad_call_ids_and_results_are_refused() -> None:
    publisher, sink = await _opened()
    tools = ToolStreamer(publisher)
    with pytest.raises(ProtocolError):
        await tools.start_call("", "f")
    with pytest.raises(ProtocolError, match="no tool name"):
        await tools.start_call("call_a", "")  # the same rule as RoundStream's
    await tools.start_call("call_a", "f")
    with pytest.raises(ProtocolError):
        await tools.start_call("call_a", "f")
    with pytest.raises(ProtocolError):
        await tools.write_result("call_x", "1")
    await tools.write_result("call_a", "1")
    with pytest.raises(ProtocolError):
        await tools.write_result("call_a", "2")
    assert len(sink) == 5  # call_a's start and stop, then its result's start, delta, stop
    assert tools.calls[0].result == "1"


@pytest.mark.anyio
async def test_close_answers_owed_calls_with_error_results(
    caplog: pytest.LogCaptureFixture,
) -> None:
    publisher, sink = await _opened()
    tools = ToolStreamer(publisher)
    await tools.start_call("call_a", "f", MARKER)
    await tools.start_call("call_b", "f")
    await tools.start_call("call_c", "f")
    await tools.write_result("call_b", "ok")
    with caplog.at_level(logging.WARNING, logger="essessey.streamers"):
        await tools.close()
    assert tools.pending == []
    results = [
        orjson.loads(e.data)["content_block"]
        for e in sink.events
        if e.event == "content_block_start" and b"tool_result" in e.data
    ]
    assert results == [
        {"type": "tool_result", "tool_use_id": "call_b"},
        {"type": "tool_result", "tool_use_id": "call_a", "is_error": True},
        {"type": "tool_result", "tool_use_id": "call_c", "is_error": True},
    ]
    by_id = {c.tool_use_id: c for c in tools.calls}
    assert (by_id["call_a"].result, by_id["call_a"].is_error) == (NO_RESULT_TEXT, True)
    assert (by_id["call_b"].result, by_id["call_b"].is_error) == ("ok", False)
    messages = [r.getMessage() for r in caplog.records if r.name == "essessey.streamers"]
    assert len(messages) == 2
    assert "call_a" in messages[0]
    assert all(MARKER not in m for m in messages)
    await tools.close()
    assert len([e for e in sink.events if e.event == "content_block_start"]) == 6


@pytest.mark.anyio
async def test_a_turn_answers_owed_calls_when_it_moves_on() -> None:
    publisher, sink = _make()
    async with stream_turn(publisher, message_id="m", stream_id="s", model="x") as turn:
        tools = await turn.tools()
        await tools.start_call("call_1", "f", "{}")
        text = await turn.text()
        await text.write("gave up")
    assert _shape(sink.events)[2:-2] == [
        ("start", 0, "tool_use"),
        ("delta", 0, "{}"),
        ("stop", 0),
        ("start", 1, "tool_result"),
        ("delta", 1, NO_RESULT_TEXT),
        ("stop", 1),
        ("start", 2, "text"),
        ("delta", 2, "gave up"),
        ("stop", 2),
    ]
    assert check(sink.events) == []


@pytest.mark.anyio
async def test_a_second_round_of_tools_in_one_turn() -> None:
    publisher, sink = _make()
    async with stream_turn(publisher, message_id="m", stream_id="s", model="x") as turn:
        first = await turn.tools()
        await first.start_call("call_1", "f")
        await first.write_result("call_1", "1")
        second = await turn.tools()
        assert turn.next_index == 2
        await second.start_call("call_2", "f")
        await second.write_result("call_2", "2")
    assert [e for e in _shape(sink.events) if e[0] == "start"] == [
        ("start", 0, "tool_use"),
        ("start", 1, "tool_result"),
        ("start", 2, "tool_use"),
        ("start", 3, "tool_result"),
    ]
    assert check(sink.events) == []


# -- LineStreamer ---------------------------------------------------------------------------


@pytest.mark.anyio
async def test_line_streamer_emits_whole_lines_only() -> None:
    publisher, sink = await _opened()
    lines = LineStreamer(publisher)
    await lines.write("a|b")
    assert sink.events == []
    await lines.write("c\nd")
    await lines.write("e\nf\n\ng")
    assert [s[2] for s in _shape(sink.events) if s[0] == "delta"] == [
        "a|bc\n",
        "de\n",
        "f\n",
        "\n",
    ]
    await lines.close()
    assert _shape(sink.events)[-2:] == [("delta", 0, "g"), ("stop", 0)]
    assert lines.text == "a|bc\nde\nf\n\ng"
    assert lines.next_index == 1


@pytest.mark.anyio
async def test_line_streamer_transform_sees_each_line_without_its_ending() -> None:
    publisher, sink = await _opened()
    seen: list[str] = []

    def shout(line: str) -> str:
        seen.append(line)
        return line.upper()

    lines = LineStreamer(publisher, 0, shout)
    await lines.write("one\r\ntwo\nthr")
    await lines.write("ee\r")
    await lines.write("\nfour")
    await lines.close()
    assert seen == ["one", "two", "three", "four"]
    assert [s[2] for s in _shape(sink.events) if s[0] == "delta"] == [
        "ONE\r\n",
        "TWO\n",
        "THREE\r\n",
        "FOUR",
    ]
    assert lines.text == "ONE\r\nTWO\nTHREE\r\nFOUR"


@pytest.mark.anyio
async def test_line_streamer_without_transform_keeps_crlf_as_written() -> None:
    publisher, _ = await _opened()
    lines = LineStreamer(publisher)
    source = "a\r\nb\r\n\r\nc\rd\n"
    for char in source:
        await lines.write(char)
    await lines.close()
    assert lines.text == source


@pytest.mark.anyio
async def test_line_streamer_drops_a_partial_line_the_transform_empties() -> None:
    publisher, sink = await _opened()
    lines = LineStreamer(publisher, 0, lambda line: "" if line.startswith("#") else line)
    await lines.write("#comment")
    await lines.close()
    assert sink.events == []
    assert lines.next_index == 0
    await lines.write("#x\nkeep")
    await lines.close()
    assert [s[2] for s in _shape(sink.events) if s[0] == "delta"] == ["\n", "keep"]


@pytest.mark.anyio
async def test_line_streamer_close_flushes_the_trailing_partial_line() -> None:
    publisher, sink = _make()
    async with stream_turn(publisher, message_id="m", stream_id="s", model="x") as turn:
        lines = await turn.lines(str.strip)
        await lines.write("  row 1 \n  row 2 ")
    assert [s[2] for s in _shape(sink.events) if s[0] == "delta"] == ["row 1\n", "row 2"]
    assert check(sink.events) == []


# -- publisher=None: accumulate only --------------------------------------------------------


@pytest.mark.anyio
async def test_streamers_without_a_publisher_only_accumulate() -> None:
    text = TextStreamer(None)
    await text.write("a")
    await text.write("")
    await text.write("b")
    await text.close()
    assert text.text == "ab"
    assert text.next_index == 0

    thinking = ThinkingStreamer(None)
    await thinking.write("hmm")
    await thinking.write_signature("sig")
    assert (thinking.text, thinking.signature) == ("hmm", "sig")

    lines = LineStreamer(None, 0, str.upper)
    await lines.write("x\ny")
    await lines.close()
    assert lines.text == "X\nY"

    tools = ToolStreamer(None)
    await tools.start_call("call_1", "f", '{"a":')
    await tools.write_arguments("call_1", "1}")
    await tools.start_call("call_2", "g")
    await tools.write_result("call_1", "done")
    await tools.close()
    assert [(c.tool_use_id, c.arguments, c.result, c.is_error) for c in tools.calls] == [
        ("call_1", '{"a":1}', "done", False),
        ("call_2", "", NO_RESULT_TEXT, True),
    ]


# -- stream_turn ----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_stream_turn_shapes_the_epilogue() -> None:
    publisher, sink = _make()
    async with stream_turn(
        publisher, message_id="m", stream_id="s", model="x", input_tokens=9
    ) as turn:
        text = await turn.text()
        await text.write("cut")
        turn.stop_reason = "max_tokens"
        turn.output_tokens = 100
        turn.usage = {"cache_read_input_tokens": 4}
    events = sink.events
    assert orjson.loads(events[0].data)["message"]["usage"]["input_tokens"] == 9
    assert orjson.loads(events[-2].data) == {
        "type": "message_delta",
        "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
        "usage": {"output_tokens": 100, "cache_read_input_tokens": 4},
    }
    assert events[-1].event == "message_stop"


@pytest.mark.anyio
async def test_stream_turn_body_failure_sends_an_error_ends_and_reraises() -> None:
    publisher, sink = _make()
    boom = RuntimeError(MARKER)

    async def run() -> None:
        async with stream_turn(
            publisher, message_id="m", stream_id="s", model="x", error_type="overloaded_error"
        ) as turn:
            text = await turn.text()
            await text.write("partial answer")
            raise boom

    with pytest.raises(RuntimeError) as info:
        await run()
    assert info.value is boom
    events = sink.events
    assert events[-1].event == "error"
    error = orjson.loads(events[-1].data)
    assert error["error"]["type"] == "overloaded_error"
    assert "RuntimeError" in error["error"]["message"]
    assert MARKER not in error["error"]["message"]
    assert "partial answer" not in error["error"]["message"]
    assert all(MARKER.encode() not in e.data for e in events)
    assert "message_delta" not in [e.event for e in events]
    # The error ends the message, so the recorded stream is complete and valid.
    assert check(events) == []


@pytest.mark.anyio
async def test_stream_turn_failure_while_closing_the_last_streamer_still_ends() -> None:
    publisher, sink = _make()

    def bad(line: str) -> str:
        raise ValueError(MARKER)

    async def run() -> None:
        async with stream_turn(publisher, message_id="m", stream_id="s", model="x") as turn:
            lines = await turn.lines(bad)
            await lines.write("pending")  # no newline: the transform runs at close

    with pytest.raises(ValueError, match=MARKER):
        await run()
    assert sink.events[-1].event == "error"
    assert check(sink.events) == []


@pytest.mark.anyio
async def test_stream_turn_reraises_the_body_error_when_the_error_event_fails(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Breaks:
        def __init__(self) -> None:
            self.events: list[Event] = []

        async def emit(self, event: Event) -> None:
            if event.event == "error":
                raise ConnectionResetError("gone")
            self.events.append(event)

    sink = Breaks()

    async def run() -> None:
        async with stream_turn(Publisher(sink), message_id="m", stream_id="s", model="x"):
            raise KeyError(MARKER)

    with caplog.at_level(logging.ERROR, logger="essessey.streamers"), pytest.raises(KeyError):
        await run()
    assert [e.event for e in sink.events] == ["message_start", "ping"]
    assert any("ConnectionResetError" in r.getMessage() for r in caplog.records)


# -- every streamer-produced stream passes check() ------------------------------------------

_chunks = st.lists(st.sampled_from(["", "a", "b c", "\n", "x\r\n", "é"]), max_size=4)
_call = st.tuples(
    st.lists(st.sampled_from(["", '{"a":', "1}"]), max_size=3),
    st.booleans(),  # whether a result is written
    st.sampled_from(["", "42"]),
)
_round = st.one_of(
    st.tuples(st.just("text"), _chunks),
    st.tuples(st.just("thinking"), _chunks),
    st.tuples(st.just("lines"), _chunks),
    st.tuples(st.just("signature"), st.sampled_from(["", "sig"])),
    st.tuples(st.just("tools"), st.lists(_call, max_size=3)),
)


async def _run_turn(rounds: list[tuple[str, Any]], dialect: Any) -> list[Event]:
    sink = InMemorySink()
    publisher = Publisher(sink, dialect=dialect)
    async with stream_turn(publisher, message_id="m", stream_id="s", model="x") as turn:
        for number, (kind, spec) in enumerate(rounds):
            if kind == "text":
                text = await turn.text()
                for chunk in spec:
                    await text.write(chunk)
            elif kind == "thinking":
                thinking = await turn.thinking()
                for chunk in spec:
                    await thinking.write(chunk)
            elif kind == "signature":
                signed = await turn.thinking()
                await signed.write_signature(spec)
            elif kind == "lines":
                lines = await turn.lines(str.strip)
                for chunk in spec:
                    await lines.write(chunk)
            else:
                tools = await turn.tools()
                for n, (arguments, _, _) in enumerate(spec):
                    await tools.start_call(f"call_{number}_{n}", "f")
                    for part in arguments:
                        await tools.write_arguments(f"call_{number}_{n}", part)
                for n, (_, answered, result) in enumerate(spec):
                    if answered:
                        await tools.write_result(f"call_{number}_{n}", result)
    return sink.events


@settings(max_examples=150, deadline=None)
@given(rounds=st.lists(_round, max_size=6), dialect=st.sampled_from(["essessey", "anthropic"]))
def test_every_streamer_produced_stream_passes_check(
    rounds: list[tuple[str, Any]], dialect: str
) -> None:
    events = anyio.run(_run_turn, rounds, dialect)
    assert check(events) == []
    starts = [orjson.loads(e.data)["index"] for e in events if e.event == "content_block_start"]
    assert starts == list(range(len(starts)))


@pytest.mark.anyio
async def test_tool_arguments_from_many_fragments_join_exactly() -> None:
    tools = ToolStreamer(None)
    await tools.start_call("call_1", "f")
    fragments = ["[", *(f"{i}," for i in range(50_000)), "0]"]
    for fragment in fragments:
        await tools.write_arguments("call_1", fragment)
    # Visible while the call is still open, and unchanged once its block closes.
    assert tools.calls[0].arguments == "".join(fragments)
    await tools.write_result("call_1", "ok")
    assert tools.calls[0].arguments == "".join(fragments)


@pytest.mark.anyio
async def test_a_pass_through_block_takes_the_next_index_between_the_others() -> None:
    publisher, sink = _make()
    async with stream_turn(publisher, message_id="m", stream_id="s", model="x") as turn:
        await (await turn.text()).write("Searching.")
        block = await turn.block()
        await block.start({"type": "server_tool_use", "id": "srv_1", "name": "search"})
        await block.write({"type": "input_json_delta", "partial_json": '{"q": "x"}'})
        with pytest.raises(ProtocolError):
            await block.start({"type": "again"})
        await (await turn.text()).write("Found it.")
        with pytest.raises(ProtocolError):
            await block.write({"type": "input_json_delta", "partial_json": "{}"})
    events = sink.events
    assert check(events) == []
    starts = [
        (p["index"], p["content_block"]["type"])
        for p in (orjson.loads(e.data) for e in events)
        if p["type"] == "content_block_start"
    ]
    assert starts == [(0, "text"), (1, "server_tool_use"), (2, "text")]
    assert reassemble_events(events).text == "Searching.Found it."


@pytest.mark.anyio
async def test_a_turn_s_streamers_share_one_index_a_standalone_one_has_its_own() -> None:
    publisher, sink = _make()
    async with stream_turn(publisher, message_id="m", stream_id="s", model="x") as turn:
        text = await turn.text()
        await text.write("a")
        # A standalone streamer has its own BlockIndex; the Turn's share one, so a block
        # cannot open while another of the same message is open.
        block = BlockStreamer(publisher, 5)
        assert block.next_index == 5
        tools = await turn.tools()
        assert tools.next_index == 1
        await tools.start_call("c1", "f")
        await tools.end_call()
        assert tools.next_index == 2
        await tools.write_result("c1", "ok")
    assert check(sink.events) == []


@pytest.mark.anyio
async def test_one_block_index_holds_one_open_block() -> None:
    from essessey.streamers import BlockIndex

    publisher, sink = await _opened()
    shared = BlockIndex(publisher)
    first = TextStreamer(publisher, shared_index=shared)
    second = ThinkingStreamer(publisher, shared_index=shared)
    await first.write("a")
    before = list(sink.events)
    with pytest.raises(ProtocolError, match="block 0 is still open"):
        await second.write("b")
    assert sink.events == before  # refused before anything went out
    await first.close()
    await second.write("b")
    await second.close()
    assert [i for _, i in (_shape(sink.events)[k][:2] for k in (0, 3))] == [0, 1]


class _HeldStart:
    """A sink that holds the first content_block_start until released, as a slow store
    holds an append: the moment a cancellation can land between a block's start and its
    first delta."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.reached = anyio.Event()
        self.release = anyio.Event()

    async def emit(self, event: Event) -> None:
        self.events.append(event)
        if event.event == "content_block_start" and not self.reached.is_set():
            self.reached.set()
            await self.release.wait()


@pytest.mark.anyio
async def test_a_block_opens_with_its_first_delta_even_when_cancelled_in_between() -> None:
    sink = _HeldStart()
    publisher = Publisher(sink)
    wrote: list[str] = []

    async def turn() -> None:
        text = TextStreamer(publisher)
        await text.write("first")
        wrote.append("first")
        await anyio.sleep_forever()  # cancelled here, after the delta, not before it

    await publisher.send_stream_preamble("msg_1", "conv_1", "m")
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(turn)
        await sink.reached.wait()
        tasks.cancel_scope.cancel()  # while the start is held
        sink.release.set()
    assert wrote == ["first"]
    names = [event.event for event in sink.events]
    assert names[-2:] == ["content_block_start", "content_block_delta"]
    # The open block has content: the turn can be ended properly.
    await publisher.send_content_block_stop(0)
    await publisher.send_stream_epilogue("cancelled", 0)
    assert check(sink.events) == []
