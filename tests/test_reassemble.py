"""Reassembly: seed transcripts, both dialects, several messages, malformed input, errors,
the incremental API, and tool input assembly that stays linear in its size."""

from __future__ import annotations

import importlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from sse_fixture import FIXTURES, load_fixture, parse_sse

from essessey import (
    Event,
    InMemorySink,
    ParsedStream,
    Publisher,
    check,
    reassemble,
    reassemble_events,
    stream_turn,
)
from essessey.reassemble import (
    OtherItem,
    ParsedError,
    Reassembler,
    TextItem,
    ThinkingItem,
    ToolResultItem,
    ToolUseItem,
)
from essessey.streamers import NO_RESULT_TEXT
from tests.anthropic_sdk import read_message

SECRET = "SECRET-PAYLOAD-c41b"

# ``essessey.reassemble`` is the function once the package is imported; the module
# itself is reached through the import system.
reassemble_module = importlib.import_module("essessey.reassemble")

SEED004_TEXT = """\
event: message_start
data: {"type":"message_start","message":{"id":"msg_1","stream_id":"conv_1","type":"message","role":"assistant","content":[],"model":"some-model","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0}}}

event: ping
data: {"type":"ping"}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"thinking"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","text":"Need the weather."}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"text"}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Checking."}}

event: content_block_stop
data: {"type":"content_block_stop","index":1}

event: content_block_start
data: {"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"call_1","name":"get_weather","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\\"city\\":\\"Paris\\"}"}}

event: content_block_stop
data: {"type":"content_block_stop","index":2}

event: content_block_start
data: {"type":"content_block_start","index":3,"content_block":{"type":"tool_result","tool_use_id":"call_1"}}

event: content_block_delta
data: {"type":"content_block_delta","index":3,"delta":{"type":"json_partial","text":"{\\"temp_c\\":18}"}}

event: content_block_stop
data: {"type":"content_block_stop","index":3}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":42}}

event: message_stop
data: {"type":"message_stop"}
"""  # noqa: E501


def _seed004_events() -> list[Event]:
    path = FIXTURES / "seed004_turn.sse"
    if not path.exists():
        # Another suite may have written it first; only create it when it is missing.
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with path.open("x", encoding="utf-8", newline="\n") as handle:
                handle.write(SEED004_TEXT)
        except FileExistsError:
            pass
    return parse_sse(path.read_text(encoding="utf-8"))


def ev(name: str, payload: Any) -> Event:
    return Event(name, orjson.dumps(payload))


def start(message_id: str = "msg_1", stream_id: str = "s_1", **usage: int) -> Event:
    return ev(
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": message_id,
                "stream_id": stream_id,
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": "m",
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 0, "output_tokens": 0, **usage},
            },
        },
    )


def block_start(index: int, block: dict[str, Any]) -> Event:
    return ev(
        "content_block_start",
        {"type": "content_block_start", "index": index, "content_block": block},
    )


def delta(index: int, body: dict[str, Any]) -> Event:
    return ev("content_block_delta", {"type": "content_block_delta", "index": index, "delta": body})


def text_delta(index: int, text: str) -> Event:
    return delta(index, {"type": "text_delta", "text": text})


def block_stop(index: int) -> Event:
    return ev("content_block_stop", {"type": "content_block_stop", "index": index})


def message_delta(stop_reason: str | None = "end_turn", **usage: int) -> Event:
    return ev(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": 1, **usage},
        },
    )


STOP = ev("message_stop", {"type": "message_stop"})


def text_message(text: str, message_id: str = "msg_1") -> list[Event]:
    return [
        start(message_id),
        block_start(0, {"type": "text"}),
        text_delta(0, text),
        block_stop(0),
        message_delta(),
        STOP,
    ]


# -- fixtures/seed004_turn.sse: the whole turn docs/protocol.md shows ----------------


def test_seed004_turn_is_reassembled_whole() -> None:
    events = _seed004_events()
    assert check(events) == []
    parsed = reassemble_events(events)

    assert parsed.thinking == "Need the weather."
    assert parsed.text == "Checking."
    assert parsed.signature is None
    assert parsed.stream_id == "conv_1"
    assert parsed.message_id == "msg_1"
    assert parsed.model == "some-model"
    assert parsed.stop_reason == "tool_use"
    assert parsed.stop_sequence is None
    assert parsed.usage == {"input_tokens": 0, "output_tokens": 42}
    assert parsed.error is None
    assert parsed.complete is True

    (call,) = parsed.tool_calls
    assert (call.tool_use_id, call.name) == ("call_1", "get_weather")
    assert call.arguments == '{"city":"Paris"}'
    assert call.params == {"city": "Paris"}
    assert call.parse_error is None
    assert call.closed is True
    (execution,) = parsed.executions
    assert execution.call is call
    assert execution.result == '{"temp_c":18}'
    assert execution.is_error is False
    assert parsed.tool_names == ("get_weather",)

    assert [item.kind for item in parsed.timeline] == [
        "thinking",
        "text",
        "tool_use",
        "tool_result",
    ]
    assert [item.index for item in parsed.timeline] == [0, 1, 2, 3]
    thinking, text, use, result = parsed.timeline
    assert isinstance(thinking, ThinkingItem)
    assert thinking.text == "Need the weather."
    assert isinstance(text, TextItem)
    assert text.text == "Checking."
    assert isinstance(use, ToolUseItem)
    assert use.call is call
    assert isinstance(result, ToolResultItem)
    assert result.result.tool_use_id == "call_1"

    (message,) = parsed.messages
    assert message.implicit is False
    assert message.complete is True
    assert message.text == parsed.text
    assert message.tool_calls == parsed.tool_calls
    assert message.usage == parsed.usage


@pytest.mark.anyio
async def test_async_reassemble_reads_a_source() -> None:
    events = _seed004_events()

    async def source() -> AsyncIterator[Event]:
        for event in events:
            yield event

    assert await reassemble(source()) == reassemble_events(events)


@pytest.mark.anyio
async def test_a_source_failure_propagates() -> None:
    async def broken() -> AsyncIterator[Event]:
        yield _seed004_events()[0]
        raise ConnectionResetError("gone")

    with pytest.raises(ConnectionResetError):
        await reassemble(broken())


# -- fixtures/seed002_*.sse: a provider's transcripts as they are --------------------


def test_seed002_text_transcript() -> None:
    events = load_fixture("seed002_text.sse")
    assert [event.event for event in events].count("ping") == 2
    assert check(events) == []
    parsed = reassemble_events(events)
    assert parsed.text == "Hi there friend!"
    assert parsed.thinking == ""
    assert parsed.message_id == "01M3F85T5YV4BEGMA014TVTC9E"
    assert parsed.model == "claude-haiku-4-5-20251001"
    assert parsed.stream_id is None
    assert parsed.stop_reason == "end_turn"
    assert parsed.stop_sequence is None
    assert parsed.complete is True
    assert parsed.tool_calls == ()
    # message_start's usage, then message_delta's counts over it; keys only in the
    # start (the nested cache object) survive.
    assert parsed.usage == {
        "input_tokens": 32,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_creation": {"ephemeral_1h_input_tokens": 0, "ephemeral_5m_input_tokens": 0},
        "output_tokens": 7,
    }
    (item,) = parsed.timeline
    assert isinstance(item, TextItem)
    assert item.text == "Hi there friend!"


def test_seed002_tool_transcript_has_no_message_start(caplog: pytest.LogCaptureFixture) -> None:
    events = load_fixture("seed002_tool.sse")
    assert events[0].event == "ping"
    assert "message_start" not in [event.event for event in events]
    with caplog.at_level(logging.WARNING, logger="essessey.reassemble"):
        parsed = reassemble_events(events)

    (message,) = parsed.messages
    assert message.implicit is True
    assert message.message_id is None
    assert message.model is None
    (call,) = parsed.tool_calls
    assert call.tool_use_id == "toolu_01PGo2evEeMN4XS8geMjN7Vs"
    assert call.name == "get_weather"
    # The first fragment is empty; the rest are joined as they came.
    assert call.arguments == '{"city": "Taipei"}'
    assert call.params == {"city": "Taipei"}
    (execution,) = parsed.executions
    assert execution.result is None
    assert execution.is_error is False
    assert parsed.stop_reason == "tool_use"
    assert parsed.usage["input_tokens"] == 672
    assert parsed.usage["output_tokens"] == 39
    assert parsed.complete is False  # no message_stop
    assert any("implicit message" in record.getMessage() for record in caplog.records)


# -- fixtures/seed000_messages.sse: three messages in one stream ----------------------


def test_seed000_three_messages() -> None:
    events = load_fixture("seed000_messages.sse")
    assert check(events) == []
    parsed = reassemble_events(events)
    first, second, third = parsed.messages

    assert first.text == "Hello, how can I help?"
    assert first.stop_reason == "end_turn"
    assert first.tool_calls == ()
    assert first.usage == {"input_tokens": 0, "output_tokens": 11, "cache_read_input_tokens": 0}

    (call,) = second.tool_calls
    assert call.params == {"location": "Seoul", "date": "2026-03-12"}
    assert call.message == 1
    assert second.stop_reason == "tool_use"
    assert second.text == ""

    assert third.thinking == "I should answer briefly."
    assert third.signature == "sig_abc123"
    assert third.text == ""

    for message in parsed.messages:
        assert message.complete is True
        assert message.model is None  # the provider leaves it out
        assert message.message_id == "msg_4b71d12c86d94e719c7e3984a7bb7941"

    # The summary across messages.
    assert parsed.text == "Hello, how can I help?"
    assert parsed.thinking == "I should answer briefly."
    assert parsed.signature == "sig_abc123"
    assert parsed.stop_reason == "end_turn"
    assert parsed.usage == {
        "input_tokens": 0,
        "output_tokens": 11 + 19 + 8,
        "cache_read_input_tokens": 0,
    }
    assert parsed.complete is True
    assert [(item.kind, item.message) for item in parsed.timeline] == [
        ("text", 0),
        ("tool_use", 1),
        ("thinking", 2),
    ]


# -- turns published by essessey, in both dialects ---------------------------------------


async def _publish_turn(dialect: Any) -> list[Event]:
    sink = InMemorySink()
    publisher = Publisher(sink, dialect=dialect)
    async with stream_turn(
        publisher, message_id="msg_9", stream_id="conv_9", model="model-x", input_tokens=12
    ) as turn:
        thinking = await turn.thinking()
        await thinking.write("Let me ")
        await thinking.write("")
        await thinking.write("look.")
        await thinking.write_signature("sig-1")
        text = await turn.text()
        await text.write("Looking ")
        await text.write("it up.")
        tools = await turn.tools()
        await tools.start_call("c1", "search")
        await tools.write_arguments("c1", '{"q": "caf')
        await tools.write_arguments("c1", 'é"}')
        await tools.start_call("c2", "fetch", '{"url": "x"}')
        await tools.start_call("c3", "broken", '{"a": ')
        await tools.write_result("c2", "page", is_error=False)
        await tools.write_result("c1", "hits")
        # c3 gets no result: closing the round answers it with an error.
        after = await turn.text()
        await after.write("Done.")
        turn.stop_reason = "end_turn"
        turn.output_tokens = 77
    return sink.events


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", ["essessey", "anthropic"])
async def test_published_turn_in_each_dialect(dialect: str) -> None:
    events = await _publish_turn(dialect)
    assert check(events) == []
    if dialect == "anthropic":
        assert b'"thinking":""' in events[2].data  # the anthropic block start
    parsed = reassemble_events(events)

    assert parsed.thinking == "Let me look."
    assert parsed.signature == "sig-1"
    assert parsed.text == "Looking it up.Done."
    assert [(c.tool_use_id, c.name) for c in parsed.tool_calls] == [
        ("c1", "search"),
        ("c2", "fetch"),
        ("c3", "broken"),
    ]
    c1, c2, c3 = parsed.tool_calls
    assert c1.arguments == '{"q": "café"}'
    assert c1.params == {"q": "café"}
    assert c2.params == {"url": "x"}
    assert c3.params is None
    assert c3.arguments == '{"a": '
    assert c3.parse_error is not None
    assert [(x.call.tool_use_id, x.result, x.is_error) for x in parsed.executions] == [
        ("c1", "hits", False),
        ("c2", "page", False),
        ("c3", NO_RESULT_TEXT, True),
    ]
    assert parsed.tool_names == ("search", "fetch", "broken")
    assert parsed.model == "model-x"
    assert parsed.stream_id == "conv_9"
    assert parsed.message_id == "msg_9"
    assert parsed.usage["input_tokens"] == 12
    assert parsed.usage["output_tokens"] == 77
    assert parsed.complete is True
    assert [item.kind for item in parsed.timeline] == [
        "thinking",
        "text",
        "tool_use",
        "tool_use",
        "tool_use",
        "tool_result",
        "tool_result",
        "tool_result",
        "text",
    ]
    # Consecutive deltas of a block are one item.
    texts = [item.text for item in parsed.timeline if isinstance(item, TextItem)]
    assert texts == ["Looking it up.", "Done."]


@pytest.mark.anyio
async def test_both_dialects_reassemble_to_the_same_turn() -> None:
    essessey_turn = reassemble_events(await _publish_turn("essessey"))
    anthropic_turn = reassemble_events(await _publish_turn("anthropic"))
    # Only the usage differs: the anthropic message_delta repeats input_tokens.
    assert essessey_turn.timeline == anthropic_turn.timeline
    assert essessey_turn.executions == anthropic_turn.executions


@pytest.mark.anyio
async def test_publisher_output_matches_the_seed_reassembly() -> None:
    sink = InMemorySink()
    publisher = Publisher(sink)
    async with stream_turn(
        publisher, message_id="msg_1", stream_id="conv_1", model="some-model"
    ) as turn:
        await (await turn.thinking()).write("Need the weather.")
        await (await turn.text()).write("Checking.")
        tools = await turn.tools()
        await tools.start_call("call_1", "get_weather", '{"city":"Paris"}')
        await tools.write_result("call_1", '{"temp_c":18}')
        turn.stop_reason = "tool_use"
        turn.output_tokens = 42
    assert reassemble_events(sink.events) == reassemble_events(_seed004_events())


# -- several messages --------------------------------------------------------------------


@pytest.mark.anyio
async def test_several_messages_stay_apart_and_are_summarised() -> None:
    sink = InMemorySink()
    publisher = Publisher(sink, dialect="anthropic")
    await publisher.send_stream_preamble("m1", "conv", "model-a", input_tokens=5)
    await publisher.send_content_block_start_text(0)
    await publisher.send_content_block_delta_text(0, "one")
    await publisher.send_content_block_stop(0)
    await publisher.send_tool_use_block(1, "t1", "lookup", {"k": 1})
    await publisher.send_stream_epilogue("tool_use", 3, cache_read_input_tokens=2)
    await publisher.send_stream_preamble("m2", "conv", "model-b", input_tokens=7)
    await publisher.send_tool_result_block(0, "t1", "found", is_error=True)
    await publisher.send_content_block_start_text(1)
    await publisher.send_content_block_delta_text(1, "two")
    await publisher.send_content_block_stop(1)
    await publisher.send_stream_epilogue("end_turn", 4, cache_read_input_tokens=1)
    events = sink.events
    assert check(events) == []

    parsed = reassemble_events(events)
    first, second = parsed.messages
    assert (first.message_id, first.model, first.text) == ("m1", "model-a", "one")
    assert (second.message_id, second.model, second.text) == ("m2", "model-b", "two")
    assert first.stop_reason == "tool_use"
    assert second.stop_reason == "end_turn"
    assert first.usage == {"input_tokens": 5, "output_tokens": 3, "cache_read_input_tokens": 2}
    assert second.usage == {"input_tokens": 7, "output_tokens": 4, "cache_read_input_tokens": 1}
    # Within its own message the call has no result; across the stream it has one.
    assert [(x.call.tool_use_id, x.result) for x in first.executions] == [("t1", None)]
    assert second.executions == ()
    assert [r.tool_use_id for r in second.tool_results] == ["t1"]

    assert parsed.text == "onetwo"
    assert parsed.message_id == "m2"
    assert parsed.model == "model-b"
    assert parsed.stop_reason == "end_turn"
    assert parsed.usage == {"input_tokens": 12, "output_tokens": 7, "cache_read_input_tokens": 3}
    (execution,) = parsed.executions
    assert (execution.call.params, execution.result, execution.is_error) == (
        {"k": 1},
        "found",
        True,
    )
    assert parsed.complete is True
    assert [item.message for item in parsed.timeline] == [0, 0, 1, 1]


def test_content_after_message_stop_opens_an_implicit_message() -> None:
    events = [
        *text_message("a"),
        block_start(0, {"type": "text"}),
        text_delta(0, "b"),
        block_stop(0),
    ]
    parsed = reassemble_events(events)
    first, second = parsed.messages
    assert first.complete
    assert not first.implicit
    assert second.implicit
    assert not second.complete
    assert parsed.text == "ab"
    assert parsed.complete is False


# -- errors ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_error_event_mid_stream() -> None:
    sink = InMemorySink()
    publisher = Publisher(sink)

    async def failing_turn() -> None:
        async with stream_turn(publisher, message_id="m", stream_id="s", model="x") as turn:
            text = await turn.text()
            await text.write("partial ")
            await text.write("answer")
            raise RuntimeError(SECRET)

    with pytest.raises(RuntimeError):
        await failing_turn()
    events = sink.events
    assert events[-1].event == "error"
    parsed = reassemble_events(events)
    assert parsed.text == "partial answer"
    assert parsed.error == ParsedError("api_error", "the turn failed: RuntimeError", None)
    assert parsed.messages[0].error == parsed.error
    assert parsed.complete is False
    assert parsed.messages[0].complete is False


def test_error_with_request_id_ends_the_message() -> None:
    error = ev(
        "error",
        {
            "type": "error",
            "error": {"type": "overloaded_error", "message": "busy"},
            "request_id": "req_1",
        },
    )
    events = [
        start(),
        block_start(0, {"type": "text"}),
        text_delta(0, "x"),
        error,
        text_delta(0, "y"),
    ]
    parsed = reassemble_events(events)
    assert parsed.error == ParsedError("overloaded_error", "busy", "req_1")
    # The error ended the message: the later delta has no message to go to.
    assert parsed.text == "x"
    assert len(parsed.messages) == 1
    assert parsed.complete is False


def test_error_after_the_last_message_stop_makes_the_stream_incomplete() -> None:
    error = ev("error", {"type": "error", "error": {"type": "api_error", "message": "late"}})
    parsed = reassemble_events([*text_message("hi"), error])
    assert parsed.messages[0].complete is True
    assert parsed.messages[0].error is None
    assert parsed.error == ParsedError("api_error", "late")
    assert parsed.complete is False


def test_an_error_in_an_earlier_message_does_not_make_a_later_one_incomplete() -> None:
    error = ev("error", {"type": "error", "error": {"type": "api_error", "message": "first"}})
    parsed = reassemble_events([start("m1"), error, *text_message("ok", "m2")])
    first, second = parsed.messages
    assert first.error is not None
    assert first.complete is False
    assert second.complete is True
    assert parsed.error == ParsedError("api_error", "first")
    assert parsed.complete is True


# -- malformed input ---------------------------------------------------------------------

_BAD_EVENTS: list[tuple[str, Event]] = [
    ("not json", Event("content_block_delta", f'{{"index":0,"delta":"{SECRET}'.encode())),
    ("array", Event("content_block_delta", orjson.dumps([SECRET]))),
    ("string", Event("message_delta", orjson.dumps(SECRET))),
    ("number", Event("content_block_stop", b"42")),
    ("index missing", ev("content_block_delta", {"delta": {"type": "text_delta", "text": SECRET}})),
    (
        "index is a string",
        ev(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": "0",
                "delta": {"type": "text_delta", "text": SECRET},
            },
        ),
    ),
    (
        "index is a bool",
        ev(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": False,
                "delta": {"type": "text_delta", "text": SECRET},
            },
        ),
    ),
    (
        "negative index",
        ev(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": -1,
                "delta": {"type": "text_delta", "text": SECRET},
            },
        ),
    ),
    ("delta is a string", ev("content_block_delta", {"index": 0, "delta": SECRET})),
    ("text is a number", delta(0, {"type": "text_delta", "value": SECRET, "text": 5})),
    ("delta without type", delta(0, {"text": SECRET})),
    ("tool_use id is a number", block_start(1, {"type": "tool_use", "id": 5, "name": SECRET})),
    (
        "tool_result is_error",
        block_start(1, {"type": "tool_result", "tool_use_id": "t", "is_error": SECRET}),
    ),
    ("block without type", block_start(1, {"text": SECRET})),
    ("content_block missing", ev("content_block_start", {"index": 1, "x": SECRET})),
    ("message is a list", ev("message_start", {"type": "message_start", "message": [SECRET]})),
    ("model is a number", ev("message_start", {"message": {"id": SECRET, "model": 1}})),
    ("stop_reason is a number", ev("message_delta", {"delta": {"stop_reason": 3}, "x": SECRET})),
    ("usage is a string", ev("message_delta", {"delta": {}, "usage": SECRET})),
    ("error without message", ev("error", {"type": "error", "error": {"type": SECRET}})),
    (
        "request_id is a number",
        ev("error", {"error": {"type": "a", "message": SECRET}, "request_id": 1}),
    ),
    ("text delta in a tool block", text_delta(0, SECRET)),
    ("never-started index", text_delta(7, SECRET)),
]


@pytest.mark.parametrize(("case", "bad"), _BAD_EVENTS, ids=[case for case, _ in _BAD_EVENTS])
def test_a_malformed_event_is_skipped_with_one_warning(
    case: str, bad: Event, caplog: pytest.LogCaptureFixture
) -> None:
    block = (
        {"type": "text"}
        if case != "text delta in a tool block"
        else {
            "type": "tool_use",
            "id": "t0",
            "name": "f",
            "input": {},
        }
    )
    before = [start(), block_start(0, block)]
    after = [block_stop(0), message_delta(), STOP]
    if block["type"] == "text":
        before.append(text_delta(0, "kept"))
    with caplog.at_level(logging.WARNING, logger="essessey.reassemble"):
        parsed = reassemble_events([*before, bad, *after])

    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    message = warnings[0].getMessage()
    assert f"#{len(before)}" in message  # the event's position
    assert SECRET not in caplog.text
    assert parsed.complete is True
    assert SECRET not in parsed.text
    if block["type"] == "text":
        assert parsed.text == "kept"
    assert parsed.error is None


def test_bad_json_warning_gives_a_length_not_the_content(caplog: pytest.LogCaptureFixture) -> None:
    bad = Event("content_block_delta", f"{{{SECRET}".encode())
    with caplog.at_level(logging.WARNING, logger="essessey.reassemble"):
        reassemble_events([bad])
    (record,) = caplog.records
    assert "not valid JSON" in record.getMessage()
    assert f"{len(bad.data)} bytes" in record.getMessage()
    assert SECRET not in caplog.text


def test_deltas_for_a_stopped_or_unstarted_block_are_skipped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    events = [
        start(),
        text_delta(0, "early"),  # block 0 not started yet
        block_start(0, {"type": "text"}),
        text_delta(0, "in"),
        block_stop(0),
        text_delta(0, "late"),  # block 0 already stopped
        block_stop(3),  # never started
        message_delta(),
        STOP,
    ]
    with caplog.at_level(logging.WARNING, logger="essessey.reassemble"):
        parsed = reassemble_events(events)
    assert parsed.text == "in"
    reasons = [record.getMessage() for record in caplog.records]
    assert len(reasons) == 3
    assert "#1" in reasons[0]
    assert "never started" in reasons[0]
    assert "#5" in reasons[1]
    assert "already stopped" in reasons[1]
    assert "#6" in reasons[2]
    assert "never started" in reasons[2]


def test_a_duplicate_block_start_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    events = [start(), block_start(0, {"type": "text"}), text_delta(0, "a")]
    events += [block_start(0, {"type": "thinking"}), text_delta(0, "b"), block_stop(0)]
    with caplog.at_level(logging.WARNING, logger="essessey.reassemble"):
        parsed = reassemble_events(events)
    assert parsed.text == "ab"
    assert parsed.thinking == ""
    assert "already started" in caplog.records[0].getMessage()


def test_unknown_events_blocks_and_deltas_are_kept_as_other_items(
    caplog: pytest.LogCaptureFixture,
) -> None:
    custom = ev("progress", {"type": "progress", "percent": 50})
    citation = {"type": "citations_delta", "citation": {"url": "u"}}
    events = [
        custom,
        start(),
        block_start(0, {"type": "server_tool_use", "id": "s1", "name": "web"}),
        delta(0, {"type": "input_json_delta", "partial_json": "{}"}),
        block_stop(0),
        block_start(1, {"type": "text"}),
        text_delta(1, "a"),
        delta(1, citation),
        text_delta(1, "b"),
        block_stop(1),
        custom,
        message_delta(),
        STOP,
    ]
    with caplog.at_level(logging.WARNING, logger="essessey.reassemble"):
        parsed = reassemble_events(events)
    assert caplog.records == []
    assert parsed.text == "ab"
    assert parsed.tool_calls == ()
    assert parsed.complete is True
    kinds = [(item.kind, item.message, item.index) for item in parsed.timeline]
    assert kinds == [
        ("other", None, None),
        ("other", 0, 0),
        ("text", 0, 1),
        ("other", 0, 1),
        ("text", 0, 1),
        ("other", 0, None),
    ]
    server_block = parsed.timeline[1]
    assert isinstance(server_block, OtherItem)
    assert server_block.block_type == "server_tool_use"
    assert [p["type"] for p in server_block.payloads] == [
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
    ]
    cite = parsed.timeline[3]
    assert isinstance(cite, OtherItem)
    assert cite.payloads[0]["delta"] == citation
    assert isinstance(parsed.timeline[0], OtherItem)
    assert parsed.timeline[0].event == "progress"
    # The stream-level timeline has the custom event outside a message; the message's does not.
    assert len(parsed.messages[0].timeline) == len(parsed.timeline) - 1


def test_pings_may_carry_nothing(caplog: pytest.LogCaptureFixture) -> None:
    events = [Event("ping", b""), *text_message("x")]
    events.insert(3, Event("ping", b"not json at all"))
    with caplog.at_level(logging.WARNING, logger="essessey.reassemble"):
        parsed = reassemble_events(events)
    assert caplog.records == []
    assert parsed.text == "x"
    assert parsed.complete


def test_frames_without_an_event_name_are_read_by_their_type() -> None:
    events = [Event("message", event.data) for event in text_message("via type")]
    parsed = reassemble_events(events)
    assert parsed.text == "via type"
    assert parsed.complete is True


# -- tool input ----------------------------------------------------------------------------


def _tool_events(fragments: list[str], *, stop: bool = True) -> list[Event]:
    events = [start(), block_start(0, {"type": "tool_use", "id": "t", "name": "f", "input": {}})]
    events += [delta(0, {"type": "input_json_delta", "partial_json": f}) for f in fragments]
    if stop:
        events.append(block_stop(0))
    return events


def test_tool_input_from_200000_fragments_is_joined_and_parsed_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    value = "".join(chr(ord("a") + i % 26) for i in range(200_000))
    arguments = orjson.dumps({"v": value}).decode()
    fragments = list(arguments)  # one character per fragment
    assert len(fragments) > 200_000

    parses: list[int] = []
    real_parse = reassemble_module._parse_arguments

    def counting_parse(text: str) -> tuple[Any, str | None]:
        parses.append(len(text))
        return real_parse(text)

    monkeypatch.setattr(reassemble_module, "_parse_arguments", counting_parse)
    reassembler = Reassembler()
    for event in _tool_events(fragments):
        reassembler.feed(event)
    # Parsing happens once, at the block's stop, over the whole input.
    assert parses == [len(arguments)]
    parsed = reassembler.result()
    (call,) = parsed.tool_calls
    assert call.arguments == arguments
    assert call.params == {"v": value}
    assert parses == [len(arguments)]  # the snapshot reuses the stop's work


def test_unparsable_arguments_are_kept_with_the_error() -> None:
    parsed = reassemble_events([*_tool_events(['{"a": ', SECRET]), message_delta(), STOP])
    (call,) = parsed.tool_calls
    assert call.params is None
    assert call.arguments == '{"a": ' + SECRET
    assert call.parse_error is not None
    assert SECRET not in call.parse_error


@pytest.mark.parametrize(
    ("arguments", "params"),
    [
        ("[1, 2]", [1, 2]),
        ("123456789012345678901234567890", 123456789012345678901234567890),
        ("null", None),
    ],
)
def test_arguments_may_be_any_json_value(arguments: str, params: Any) -> None:
    (call,) = reassemble_events(_tool_events([arguments])).tool_calls
    assert call.params == params
    assert call.parse_error is None


@pytest.mark.parametrize("arguments", ["NaN", "[Infinity]", "[" * 100_000])
def test_arguments_that_json_refuses_do_not_parse(arguments: str) -> None:
    (call,) = reassemble_events(_tool_events([arguments])).tool_calls
    assert call.params is None
    assert call.parse_error


def test_a_call_without_fragments_takes_its_start_input() -> None:
    events = _tool_events([])
    (call,) = reassemble_events(events).tool_calls
    assert call.arguments == ""
    assert call.params == {}
    given = [
        start(),
        block_start(0, {"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1}}),
    ]
    (call,) = reassemble_events([*given, block_stop(0)]).tool_calls
    assert call.params == {"a": 1}
    assert call.arguments == '{"a":1}'


def test_a_block_left_open_is_assembled_when_its_message_ends() -> None:
    events = [*_tool_events(['{"x"', ": 1}"], stop=False), message_delta("tool_use"), STOP]
    (call,) = reassemble_events(events).tool_calls
    assert call.params == {"x": 1}
    assert call.closed is False


# -- the incremental API ---------------------------------------------------------------


def test_feed_returns_what_each_event_added() -> None:
    reassembler = Reassembler()
    fragments = [reassembler.feed(event) for event in _seed004_events()]
    content = [f for f in fragments if f is not None]
    assert all(f.message == 0 for f in content)
    assert [(f.kind, f.event, f.text) for f in content if f.text] == [
        ("thinking", "content_block_delta", "Need the weather."),
        ("text", "content_block_delta", "Checking."),
        ("tool_use", "content_block_delta", '{"city":"Paris"}'),
        ("tool_result", "content_block_delta", '{"temp_c":18}'),
    ]
    tool_start = next(f for f in content if f.kind == "tool_use")
    assert (tool_start.event, tool_start.tool_use_id, tool_start.name) == (
        "content_block_start",
        "call_1",
        "get_weather",
    )
    assert fragments[0] is None
    assert fragments[1] is None
    assert reassembler.position == 16


def test_a_snapshot_mid_stream_shows_open_blocks_so_far() -> None:
    reassembler = Reassembler()
    for event in [start(), block_start(0, {"type": "text"}), text_delta(0, "Hel")]:
        reassembler.feed(event)
    early = reassembler.result()
    assert early.text == "Hel"
    assert early.complete is False
    for event in [text_delta(0, "lo"), block_stop(0), message_delta(), STOP]:
        reassembler.feed(event)
    late = reassembler.result()
    assert (late.text, late.complete) == ("Hello", True)
    assert early.text == "Hel"  # a snapshot does not change afterwards

    reassembler = Reassembler()
    for event in _tool_events(['{"a"', ": 1"], stop=False):
        reassembler.feed(event)
    (call,) = reassembler.result().tool_calls
    assert call.closed is False
    assert call.arguments == '{"a": 1'
    assert call.params is None


def test_an_empty_stream() -> None:
    parsed = reassemble_events([])
    assert parsed == ParsedStream()
    assert parsed.complete is False
    assert parsed.messages == ()


def test_fixture_helper_reads_the_seed_file_as_written() -> None:
    path: Path = FIXTURES / "seed004_turn.sse"
    events = _seed004_events()
    assert path.read_text(encoding="utf-8").endswith("\n")
    assert len(events) == 16
    assert events[0].event == "message_start"
    assert orjson.loads(events[-1].data) == {"type": "message_stop"}


def test_a_later_signature_replaces_an_earlier_one() -> None:
    events = [
        start(),
        block_start(0, {"type": "thinking", "thinking": "", "signature": "s0"}),
        delta(0, {"type": "thinking_delta", "thinking": "hm"}),
        delta(0, {"type": "signature_delta", "signature": "s1"}),
        delta(0, {"type": "signature_delta", "signature": "s2"}),
        block_stop(0),
        message_delta(),
        STOP,
    ]
    parsed = reassemble_events(events)
    assert parsed.signature == "s2"
    (item,) = parsed.timeline
    assert isinstance(item, ThinkingItem)
    assert (item.text, item.signature) == ("hm", "s2")


def test_content_in_a_block_start_is_kept() -> None:
    # A provider may start a block with content, as the Anthropic SDK allows.
    events = [
        start(),
        block_start(0, {"type": "thinking", "thinking": "pre-"}),
        delta(0, {"type": "thinking_delta", "thinking": "think"}),
        block_stop(0),
        block_start(1, {"type": "text", "text": "Hello"}),
        text_delta(1, ", world"),
        block_stop(1),
    ]
    reassembler = Reassembler()
    fragments = [reassembler.feed(event) for event in events]
    parsed = reassembler.result()
    assert parsed.thinking == "pre-think"
    assert parsed.text == "Hello, world"
    assert [f.text for f in fragments if f is not None and f.text] == [
        "pre-",
        "think",
        "Hello",
        ", world",
    ]


def test_both_thinking_spellings_are_read() -> None:
    essessey_style = delta(0, {"type": "thinking_delta", "text": "a"})
    anthropic_style = delta(0, {"type": "thinking_delta", "thinking": "b"})
    events = [start(), block_start(0, {"type": "thinking"}), essessey_style, anthropic_style]
    assert reassemble_events(events).thinking == "ab"


def test_a_tool_result_may_arrive_in_fragments() -> None:
    events = [
        start(),
        block_start(0, {"type": "tool_use", "id": "t", "name": "f", "input": {}}),
        block_stop(0),
        block_start(1, {"type": "tool_result", "tool_use_id": "t", "is_error": True}),
        delta(1, {"type": "json_partial", "text": "par"}),
        delta(1, {"type": "json_partial", "text": "tial"}),
        block_stop(1),
        message_delta("tool_use"),
        STOP,
    ]
    parsed = reassemble_events(events)
    (execution,) = parsed.executions
    assert (execution.result, execution.is_error) == ("partial", True)
    (result,) = parsed.tool_results
    assert (result.tool_use_id, result.text, result.closed) == ("t", "partial", True)


def test_a_result_naming_no_call_is_kept_but_matches_nothing() -> None:
    events = [
        start(),
        block_start(0, {"type": "tool_result", "tool_use_id": "ghost"}),
        delta(0, {"type": "json_partial", "text": "x"}),
        block_stop(0),
        message_delta(),
        STOP,
    ]
    parsed = reassemble_events(events)
    assert parsed.executions == ()
    assert [r.tool_use_id for r in parsed.tool_results] == ["ghost"]


# -- agreement with the Anthropic SDK ---------------------------------------------------


@pytest.mark.anyio
async def test_the_anthropic_sdk_reads_the_same_turn() -> None:
    sink = InMemorySink()
    publisher = Publisher(sink, dialect="anthropic")
    await publisher.send_stream_preamble("m", "s", "x")
    await publisher.send_content_block_start_thinking(0)
    await publisher.send_content_block_delta_thinking(0, "step one, ")
    await publisher.send_content_block_delta_thinking(0, "step two")
    await publisher.send_signature_delta(0, "sig")
    await publisher.send_content_block_stop(0)
    await publisher.send_content_block_start_text(1)
    await publisher.send_content_block_delta_text(1, "answer ")
    await publisher.send_content_block_delta_text(1, "text")
    await publisher.send_content_block_stop(1)
    # The SDK's content types have no tool_result block, so the turn ends at the call.
    await publisher.send_tool_use_start(2, "c1", "lookup")
    await publisher.send_tool_input_delta(2, '{"a": [1, ')
    await publisher.send_tool_input_delta(2, '2], "b": "é"}')
    await publisher.send_content_block_stop(2)
    await publisher.send_stream_epilogue("tool_use", 9)
    events = sink.events
    snapshot = read_message(events)
    parsed = reassemble_events(events)

    sdk_text = "".join(b.text for b in snapshot.content if b.type == "text")
    sdk_thinking = "".join(b.thinking for b in snapshot.content if b.type == "thinking")
    sdk_calls = [(b.id, b.name, b.input) for b in snapshot.content if b.type == "tool_use"]
    assert parsed.text == sdk_text == "answer text"
    assert parsed.thinking == sdk_thinking == "step one, step two"
    assert parsed.signature == snapshot.content[0].signature == "sig"
    assert [(c.tool_use_id, c.name, c.params) for c in parsed.tool_calls] == sdk_calls
    assert sdk_calls == [("c1", "lookup", {"a": [1, 2], "b": "é"})]
    assert parsed.stop_reason == snapshot.stop_reason == "tool_use"
