"""Publisher: payload shapes in both dialects, strict mode, failures, logging, SDK reading."""

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import hypothesis
import orjson
import pytest
from hypothesis import strategies as st

from essessey import (
    EssesseyError,
    Event,
    InMemorySink,
    ProtocolError,
    Publisher,
    SerializationError,
    check,
)
from essessey.check import Rule
from essessey.protocol import TEXT_DELTA_HEADS, TEXT_DELTA_PAYLOAD, TEXT_DELTA_TAIL, text_delta_head
from tests.anthropic_sdk import read_message

MARKER = "SECRET-PAYLOAD-7f3a"

Action = Callable[[Publisher], Awaitable[None]]


def _make(dialect: Any = "essessey", *, strict: bool = True) -> tuple[Publisher, InMemorySink]:
    sink = InMemorySink()
    return Publisher(sink, dialect=dialect, strict=strict), sink


def _payloads(sink: InMemorySink) -> list[tuple[str, Any]]:
    return [(event.event, orjson.loads(event.data)) for event in sink.events]


class FailOn:
    """A sink that records events and raises on the first event with a given name."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.events: list[Event] = []

    async def emit(self, event: Event) -> None:
        if event.event == self.name:
            raise ConnectionResetError("the client went away")
        self.events.append(event)


# -- construction -------------------------------------------------------------------


def test_unknown_dialect_raises_value_error() -> None:
    with pytest.raises(ValueError, match="dialect"):
        Publisher(InMemorySink(), dialect="openai")  # type: ignore[arg-type]


def test_properties_reflect_the_constructor() -> None:
    sink = InMemorySink()
    publisher = Publisher(sink, dialect="anthropic", strict=False)
    assert publisher.sink is sink
    assert publisher.dialect == "anthropic"
    assert publisher.strict is False
    assert Publisher(sink).strict is True
    assert Publisher(sink).dialect == "essessey"


# -- payload shapes in both dialects --------------------------------------------------

MESSAGE: dict[str, Any] = {
    "id": "msg_1",
    "stream_id": "conv_1",
    "type": "message",
    "role": "assistant",
    "content": [],
    "model": "some-model",
    "stop_reason": None,
    "stop_sequence": None,
    "usage": {"input_tokens": 0, "output_tokens": 0},
}

# (name, call, essessey payload, anthropic payload). Non-strict, so each call stands alone.
SHAPES: list[tuple[str, Action, dict[str, Any], dict[str, Any]]] = [
    (
        "message_start",
        lambda p: p.send_message_start("msg_1", "conv_1", "some-model"),
        {"type": "message_start", "message": MESSAGE},
        {"type": "message_start", "message": MESSAGE},
    ),
    ("ping", lambda p: p.send_ping(), {"type": "ping"}, {"type": "ping"}),
    (
        "start_text",
        lambda p: p.send_content_block_start_text(0),
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "text", "text": ""},
        },
    ),
    (
        "delta_text",
        lambda p: p.send_content_block_delta_text(4, "hi"),
        {"type": "content_block_delta", "index": 4, "delta": {"type": "text_delta", "text": "hi"}},
        {"type": "content_block_delta", "index": 4, "delta": {"type": "text_delta", "text": "hi"}},
    ),
    (
        "start_thinking",
        lambda p: p.send_content_block_start_thinking(1),
        {"type": "content_block_start", "index": 1, "content_block": {"type": "thinking"}},
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "thinking", "thinking": ""},
        },
    ),
    (
        "delta_thinking",
        lambda p: p.send_content_block_delta_thinking(1, "hmm"),
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "thinking_delta", "text": "hmm"},
        },
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "thinking_delta", "thinking": "hmm"},
        },
    ),
    (
        "signature",
        lambda p: p.send_signature_delta(1, "sig_1"),
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "signature_delta", "signature": "sig_1"},
        },
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "signature_delta", "signature": "sig_1"},
        },
    ),
    (
        "stop",
        lambda p: p.send_content_block_stop(2),
        {"type": "content_block_stop", "index": 2},
        {"type": "content_block_stop", "index": 2},
    ),
    (
        "tool_use_start",
        lambda p: p.send_tool_use_start(3, "call_9", "lookup"),
        {
            "type": "content_block_start",
            "index": 3,
            "content_block": {"type": "tool_use", "id": "call_9", "name": "lookup", "input": {}},
        },
        {
            "type": "content_block_start",
            "index": 3,
            "content_block": {"type": "tool_use", "id": "call_9", "name": "lookup", "input": {}},
        },
    ),
    (
        "tool_input_delta",
        lambda p: p.send_tool_input_delta(3, '{"q":'),
        {
            "type": "content_block_delta",
            "index": 3,
            "delta": {"type": "input_json_delta", "partial_json": '{"q":'},
        },
        {
            "type": "content_block_delta",
            "index": 3,
            "delta": {"type": "input_json_delta", "partial_json": '{"q":'},
        },
    ),
    (
        "tool_result_start",
        lambda p: p.send_tool_result_start(4, "call_9"),
        {
            "type": "content_block_start",
            "index": 4,
            "content_block": {"type": "tool_result", "tool_use_id": "call_9"},
        },
        {
            "type": "content_block_start",
            "index": 4,
            "content_block": {"type": "tool_result", "tool_use_id": "call_9"},
        },
    ),
    (
        "tool_result_start_error",
        lambda p: p.send_tool_result_start(4, "call_9", is_error=True),
        {
            "type": "content_block_start",
            "index": 4,
            "content_block": {"type": "tool_result", "tool_use_id": "call_9", "is_error": True},
        },
        {
            "type": "content_block_start",
            "index": 4,
            "content_block": {"type": "tool_result", "tool_use_id": "call_9", "is_error": True},
        },
    ),
    (
        "tool_result_delta",
        lambda p: p.send_tool_result_delta(4, "42"),
        {
            "type": "content_block_delta",
            "index": 4,
            "delta": {"type": "json_partial", "text": "42"},
        },
        {
            "type": "content_block_delta",
            "index": 4,
            "delta": {"type": "json_partial", "text": "42"},
        },
    ),
    (
        "message_delta",
        lambda p: p.send_message_delta("end_turn", 5),
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 5},
        },
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"input_tokens": 0, "output_tokens": 5},
        },
    ),
    (
        "message_stop",
        lambda p: p.send_message_stop(),
        {"type": "message_stop"},
        {"type": "message_stop"},
    ),
    (
        "error",
        lambda p: p.send_error("overloaded_error", "Overloaded"),
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
    ),
    (
        "error_request_id",
        lambda p: p.send_error("api_error", "boom", request_id="req_1"),
        {"type": "error", "error": {"type": "api_error", "message": "boom"}, "request_id": "req_1"},
        {"type": "error", "error": {"type": "api_error", "message": "boom"}, "request_id": "req_1"},
    ),
    (
        "publish_custom",
        lambda p: p.publish("progress", {"percent": 40}),
        {"type": "progress", "percent": 40},
        {"type": "progress", "percent": 40},
    ),
]


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", ["essessey", "anthropic"])
@pytest.mark.parametrize(
    ("call", "essessey_payload", "anthropic_payload"),
    [pytest.param(call, e, a, id=name) for name, call, e, a in SHAPES],
)
async def test_payload_shape(
    dialect: str,
    call: Action,
    essessey_payload: dict[str, Any],
    anthropic_payload: dict[str, Any],
) -> None:
    publisher, sink = _make(dialect, strict=False)
    await call(publisher)
    expected = essessey_payload if dialect == "essessey" else anthropic_payload
    [(name, payload)] = _payloads(sink)
    assert payload == expected
    assert name == expected["type"]


@pytest.mark.anyio
async def test_message_start_carries_input_tokens() -> None:
    publisher, sink = _make()
    await publisher.send_message_start("m", "s", "x", input_tokens=12)
    [(_, payload)] = _payloads(sink)
    assert payload["message"]["usage"] == {"input_tokens": 12, "output_tokens": 0}


@pytest.mark.anyio
async def test_anthropic_message_delta_takes_input_tokens_from_message_start() -> None:
    publisher, sink = _make("anthropic")
    await publisher.send_message_start("m", "s", "x", input_tokens=12)
    await publisher.send_message_delta("end_turn", 3)
    usage = _payloads(sink)[-1][1]["usage"]
    assert usage == {"input_tokens": 12, "output_tokens": 3}


@pytest.mark.anyio
async def test_anthropic_message_delta_reports_given_counts() -> None:
    publisher, sink = _make("anthropic")
    await publisher.send_message_start("m", "s", "x", input_tokens=12)
    await publisher.send_message_delta(
        "max_tokens",
        9,
        input_tokens=30,
        cache_read_input_tokens=4,
        cache_creation_input_tokens=2,
    )
    payload = _payloads(sink)[-1][1]
    assert payload["usage"] == {
        "input_tokens": 30,
        "cache_read_input_tokens": 4,
        "cache_creation_input_tokens": 2,
        "output_tokens": 9,
    }
    assert payload["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}


@pytest.mark.anyio
async def test_anthropic_message_delta_omits_cache_counts_not_given() -> None:
    publisher, sink = _make("anthropic")
    await publisher.send_message_start("m", "s", "x")
    await publisher.send_message_delta("end_turn", 1, cache_read_input_tokens=0)
    assert _payloads(sink)[-1][1]["usage"] == {
        "input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 1,
    }


@pytest.mark.anyio
async def test_essessey_message_delta_adds_only_the_counts_given() -> None:
    publisher, sink = _make()
    await publisher.send_message_start("m", "s", "x", input_tokens=12)
    await publisher.send_message_delta(
        "stop_sequence", 3, stop_sequence="###", cache_read_input_tokens=5
    )
    payload = _payloads(sink)[-1][1]
    assert payload["usage"] == {"output_tokens": 3, "cache_read_input_tokens": 5}
    assert payload["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "###"}


@pytest.mark.anyio
async def test_refused_message_start_keeps_the_open_message_input_tokens() -> None:
    publisher, sink = _make("anthropic")
    await publisher.send_message_start("m", "s", "x", input_tokens=12)
    with pytest.raises(ProtocolError):
        await publisher.send_message_start("m2", "s", "x", input_tokens=99)
    await publisher.send_message_delta("end_turn", 1)
    assert _payloads(sink)[-1][1]["usage"]["input_tokens"] == 12


@pytest.mark.anyio
@pytest.mark.parametrize("bad", [1.5, True, "3"])
async def test_message_delta_usage_must_be_int(bad: Any) -> None:
    publisher, sink = _make()
    await publisher.send_message_start("m", "s", "x")
    with pytest.raises(TypeError, match="cache_read_input_tokens"):
        await publisher.send_message_delta("end_turn", 1, cache_read_input_tokens=bad)
    assert len(sink) == 1


@pytest.mark.anyio
async def test_publish_keeps_a_given_type_and_checks_protocol_events() -> None:
    publisher, sink = _make()
    await publisher.publish("message_start", {"message": dict(MESSAGE)})
    assert _payloads(sink)[0] == ("message_start", {"type": "message_start", "message": MESSAGE})
    with pytest.raises(ProtocolError) as info:
        await publisher.publish(
            "content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "x"}}
        )
    assert info.value.violations[0].rule == Rule.BLOCK_NOT_OPEN
    with pytest.raises(ProtocolError) as info:
        await publisher.publish("ping", {"type": "pong"})
    assert info.value.violations[0].rule == Rule.PAYLOAD
    assert len(sink) == 1


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["", "a\nb", "a\rb", "a\0b"])
async def test_publish_rejects_event_names_that_break_framing(name: str) -> None:
    publisher, sink = _make()
    with pytest.raises(ValueError, match="event_type"):
        await publisher.publish(name, {})
    assert len(sink) == 0


@pytest.mark.anyio
async def test_publish_does_not_change_the_callers_mapping() -> None:
    publisher, _ = _make()
    payload = {"percent": 1}
    await publisher.publish("progress", payload)
    assert payload == {"percent": 1}


# -- serialisation failures -------------------------------------------------------------


class Opaque:
    def __repr__(self) -> str:
        return MARKER


@pytest.mark.anyio
async def test_unserialisable_publish_raises_and_emits_nothing() -> None:
    publisher, sink = _make()
    with pytest.raises(SerializationError) as info:
        await publisher.publish("custom", {"x": object()})
    assert isinstance(info.value, TypeError)
    assert isinstance(info.value, EssesseyError)
    assert len(sink) == 0


@pytest.mark.anyio
async def test_serialisation_error_does_not_quote_the_value() -> None:
    publisher, _ = _make()
    with pytest.raises(SerializationError) as info:
        await publisher.publish("custom", {"x": Opaque()})
    assert MARKER not in str(info.value)


@pytest.mark.anyio
async def test_unserialisable_tool_input_emits_nothing_and_leaves_state() -> None:
    publisher, sink = _make()
    await publisher.send_message_start("m", "s", "x")
    with pytest.raises(SerializationError) as info:
        await publisher.send_tool_use_block(0, "call_1", "f", {"when": object()})
    assert len(sink) == 1
    assert any("send_tool_use_block" in note for note in info.value.__notes__)
    # The checker saw nothing either: index 0 is still the next block.
    await publisher.send_tool_use_block(0, "call_1", "f", {"when": "now"})
    assert [payload.get("index") for _, payload in _payloads(sink)[1:]] == [0, 0, 0]


@pytest.mark.anyio
async def test_unserialisable_event_leaves_the_strict_checker_untouched() -> None:
    publisher, sink = _make()
    await publisher.send_message_start("m", "s", "x")
    await publisher.send_content_block_start_text(0)
    with pytest.raises(SerializationError):
        await publisher.send_content_block_delta_text(0, "\ud800")  # lone surrogate
    await publisher.send_content_block_delta_text(0, "ok")
    await publisher.send_content_block_stop(0)
    await publisher.send_stream_epilogue("end_turn", 1)
    assert check(sink.events) == []


@pytest.mark.anyio
@pytest.mark.parametrize("strict", [True, False], ids=["strict", "unchecked"])
@pytest.mark.parametrize("value", [5, 1.5, None, ["a"], {"t": "a"}, b"a"], ids=repr)
async def test_a_delta_whose_text_is_no_str_is_refused_before_any_sink(
    strict: bool, value: object
) -> None:
    # Serialised as it is, a number or a list reached readers as a JSON value where each
    # expects text: the dialects wrote it one way live and another replayed, and the
    # Responses encoder failed the stream.
    for sink in (_TextSink(), InMemorySink()):
        publisher = Publisher(sink, strict=strict)
        await publisher.send_stream_preamble("msg_1", "conv_1", "m")
        await publisher.send_content_block_start_text(0)
        sent = len(sink.via_emit if isinstance(sink, _TextSink) else sink.events)
        sends: list[tuple[str, object]] = [
            ("send_content_block_delta_text", value),
            ("send_content_block_deltas_text", ["ok", value]),
            ("send_content_block_delta_thinking", value),
            ("send_signature_delta", value),
            ("send_tool_input_delta", value),
            ("send_tool_result_delta", value),
        ]
        for method, given in sends:
            with pytest.raises(SerializationError, match="text is a str, not a"):
                await getattr(publisher, method)(0, given)
        if isinstance(sink, _TextSink):
            assert (sink.calls, len(sink.via_emit)) == (0, sent)
        else:
            assert len(sink.events) == sent


@pytest.mark.anyio
@pytest.mark.parametrize("index", ["0", None, [0], 0.5], ids=repr)
async def test_an_unchecked_publisher_refuses_a_text_delta_index_that_is_no_int(
    index: object,
) -> None:
    # Unchecked, nothing else looks at the index before it is written into the payload.
    text_sink, plain = _TextSink(), InMemorySink()
    for sink in (text_sink, plain):
        publisher = Publisher(sink, strict=False)
        with pytest.raises(SerializationError, match="block index is an int"):
            await publisher.send_content_block_delta_text(index, "hi")  # type: ignore[arg-type]
        for strict in (False, True):  # batched, the template was filled before any check
            batched = Publisher(sink, strict=strict)
            with pytest.raises(SerializationError, match="block index is an int"):
                await batched.send_content_block_deltas_text(index, ["a", "b"])  # type: ignore[arg-type]
    assert (text_sink.calls, text_sink.via_emit, plain.events) == (0, [], [])


# -- strict mode --------------------------------------------------------------------------


async def _open_message(p: Publisher) -> None:
    await p.send_message_start("m", "s", "x")


async def _thinking_open(p: Publisher) -> None:
    await _open_message(p)
    await p.send_content_block_start_thinking(0)
    await p.send_content_block_delta_thinking(0, "hmm")


async def _text_open(p: Publisher) -> None:
    await _open_message(p)
    await p.send_content_block_start_text(0)
    await p.send_content_block_delta_text(0, "hi")


async def _text_closed(p: Publisher) -> None:
    await _text_open(p)
    await p.send_content_block_stop(0)


async def _nothing(p: Publisher) -> None:
    return None


async def _empty_text(p: Publisher) -> None:
    await _open_message(p)
    await p.send_content_block_start_text(0)
    await p.send_content_block_delta_text(0, "")


# (id, events before, the offending call, the rule it breaks)
BREAKS: list[tuple[str, Action, Action, str]] = [
    (
        "delta-before-start",
        _open_message,
        lambda p: p.send_content_block_delta_text(0, "x"),
        Rule.BLOCK_NOT_OPEN,
    ),
    (
        "delta-wrong-index",
        _text_open,
        lambda p: p.send_content_block_delta_text(1, "x"),
        Rule.BLOCK_NOT_OPEN,
    ),
    ("stop-wrong-index", _text_open, lambda p: p.send_content_block_stop(1), Rule.BLOCK_NOT_OPEN),
    (
        "start-skips-index",
        _text_closed,
        lambda p: p.send_content_block_start_text(2),
        Rule.INDEX_SEQUENCE,
    ),
    (
        "start-reuses-index",
        _text_closed,
        lambda p: p.send_content_block_start_text(0),
        Rule.INDEX_SEQUENCE,
    ),
    (
        "second-open-block",
        _text_open,
        lambda p: p.send_tool_use_start(1, "call_1", "f"),
        Rule.ONE_OPEN_BLOCK,
    ),
    (
        "text-while-thinking-open",
        _thinking_open,
        lambda p: p.send_content_block_start_text(1),
        Rule.THINKING_BEFORE_TEXT,
    ),
    (
        "text-delta-into-thinking",
        _thinking_open,
        lambda p: p.send_content_block_delta_text(0, "answer"),
        Rule.DELTA_TYPE,
    ),
    (
        "message-stop-with-block-open",
        _text_open,
        lambda p: p.send_message_stop(),
        Rule.UNCLOSED_BLOCK,
    ),
    (
        "message-delta-with-block-open",
        _text_open,
        lambda p: p.send_message_delta("end_turn", 1),
        Rule.UNCLOSED_BLOCK,
    ),
    (
        "block-before-message",
        _nothing,
        lambda p: p.send_content_block_start_text(0),
        Rule.MESSAGE_START_FIRST,
    ),
    (
        "nested-message",
        _open_message,
        lambda p: p.send_message_start("m2", "s", "x"),
        Rule.NESTED_MESSAGE,
    ),
    (
        "empty-text-block",
        _empty_text,
        lambda p: p.send_content_block_stop(0),
        Rule.EMPTY_BLOCK,
    ),
    (
        "result-for-unknown-call",
        _open_message,
        lambda p: p.send_tool_result_start(0, "call_x"),
        Rule.TOOL_RESULT_UNKNOWN_USE,
    ),
]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("before", "offence", "rule"),
    [pytest.param(before, offence, rule, id=name) for name, before, offence, rule in BREAKS],
)
async def test_strict_refuses_and_emits_nothing(before: Action, offence: Action, rule: str) -> None:
    publisher, sink = _make()
    await before(publisher)
    emitted = len(sink)
    with pytest.raises(ProtocolError) as info:
        await offence(publisher)
    assert len(sink) == emitted
    assert info.value.violations[0].rule == rule
    assert rule in str(info.value)
    assert isinstance(info.value, EssesseyError)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("before", "offence", "rule"),
    [pytest.param(before, offence, rule, id=name) for name, before, offence, rule in BREAKS],
)
async def test_non_strict_emits_anyway(before: Action, offence: Action, rule: str) -> None:
    publisher, sink = _make(strict=False)
    await before(publisher)
    emitted = len(sink)
    await offence(publisher)
    assert len(sink) == emitted + 1
    # The recorded stream does break the rule the strict Publisher would have refused.
    assert rule in {v.rule for v in check(sink.events)}


@pytest.mark.anyio
async def test_a_refused_event_does_not_advance_the_checker() -> None:
    publisher, sink = _make()
    await _text_closed(publisher)
    with pytest.raises(ProtocolError):
        await publisher.send_content_block_start_text(2)
    # Had the refused start been recorded, index 1 would now be out of sequence.
    await publisher.send_content_block_start_text(1)
    await publisher.send_content_block_delta_text(1, "hi")
    await publisher.send_content_block_stop(1)
    await publisher.send_stream_epilogue("end_turn", 1)
    assert check(sink.events) == []


@pytest.mark.anyio
async def test_strict_accepts_several_messages_and_pings_anywhere() -> None:
    publisher, sink = _make()
    await publisher.send_ping()
    for n in range(2):
        await publisher.send_stream_preamble(f"m{n}", "s", "x")
        await publisher.send_content_block_start_text(0)
        await publisher.send_ping()
        await publisher.send_content_block_delta_text(0, "hi")
        await publisher.send_content_block_stop(0)
        await publisher.send_stream_epilogue("end_turn", 1)
        await publisher.send_ping()
    assert check(sink.events) == []


@pytest.mark.anyio
async def test_strict_allows_an_error_mid_block_and_a_new_message_after() -> None:
    publisher, sink = _make()
    await publisher.send_message_start("m", "s", "x")
    await publisher.send_content_block_start_text(0)
    await publisher.send_content_block_delta_text(0, "par")
    await publisher.send_error("overloaded_error", "try later")
    with pytest.raises(ProtocolError) as info:
        await publisher.send_content_block_delta_text(0, "tial")
    assert info.value.violations[0].rule == Rule.AFTER_MESSAGE_STOP
    await publisher.send_stream_preamble("m2", "s", "x")
    await publisher.send_stream_epilogue("end_turn", 0)
    assert check(sink.events) == []


# -- composites ---------------------------------------------------------------------------


def _notes(exc: BaseException) -> list[str]:
    return list(getattr(exc, "__notes__", []))


@pytest.mark.anyio
async def test_preamble_failing_at_ping_keeps_type_and_names_the_step() -> None:
    sink = FailOn("ping")
    publisher = Publisher(sink)
    with pytest.raises(ConnectionResetError) as info:
        await publisher.send_stream_preamble("m", "s", "x")
    assert [event.event for event in sink.events] == ["message_start"]
    [note] = _notes(info.value)
    assert "send_stream_preamble" in note
    assert "ping" in note


@pytest.mark.anyio
async def test_preamble_refused_at_message_start_emits_nothing() -> None:
    publisher, sink = _make()
    await publisher.send_message_start("m", "s", "x")
    with pytest.raises(ProtocolError) as info:
        await publisher.send_stream_preamble("m2", "s", "x")
    assert len(sink) == 1
    [note] = _notes(info.value)
    assert "send_stream_preamble" in note
    assert "message_start" in note


@pytest.mark.anyio
async def test_epilogue_refused_at_message_delta_emits_nothing() -> None:
    publisher, sink = _make()
    await _text_open(publisher)
    with pytest.raises(ProtocolError) as info:
        await publisher.send_stream_epilogue("end_turn", 1)
    assert len(sink) == 3
    assert info.value.violations[0].rule == Rule.UNCLOSED_BLOCK
    [note] = _notes(info.value)
    assert "send_stream_epilogue" in note
    assert "message_delta" in note


@pytest.mark.anyio
async def test_epilogue_failing_at_message_stop_emitted_only_message_delta() -> None:
    sink = FailOn("message_stop")
    publisher = Publisher(sink)
    await publisher.send_message_start("m", "s", "x")
    with pytest.raises(ConnectionResetError) as info:
        await publisher.send_stream_epilogue("end_turn", 1)
    assert [event.event for event in sink.events] == ["message_start", "message_delta"]
    [note] = _notes(info.value)
    assert "send_stream_epilogue" in note
    assert "message_stop" in note


@pytest.mark.anyio
async def test_tool_use_block_with_arguments_no_delta_can_write_emits_nothing() -> None:
    # Checked before the block opens: a start with no delta and no stop would be a
    # block no end could close.
    publisher, sink = _make()
    await publisher.send_message_start("m", "s", "x")
    with pytest.raises(SerializationError) as info:
        await publisher.send_tool_use_block(0, "call_1", "f", '{"q":"\ud800"}')
    assert [event.event for event in sink.events] == ["message_start"]
    [note] = _notes(info.value)
    assert "send_tool_use_block" in note
    assert "input_json" in note


@pytest.mark.anyio
async def test_tool_use_block_refused_at_start_emits_nothing() -> None:
    publisher, sink = _make()
    await _text_closed(publisher)
    with pytest.raises(ProtocolError) as info:
        await publisher.send_tool_use_block(5, "call_1", "f", "{}")
    assert len(sink) == 4
    assert info.value.violations[0].rule == Rule.INDEX_SEQUENCE
    [note] = _notes(info.value)
    assert "send_tool_use_block" in note
    assert "content_block_start" in note


@pytest.mark.anyio
async def test_tool_result_block_failing_at_stop_stops_there() -> None:
    sink = FailOn("content_block_stop")
    publisher = Publisher(sink, strict=False)
    with pytest.raises(ConnectionResetError) as info:
        await publisher.send_tool_result_block(0, "call_1", "42", is_error=True)
    assert [orjson.loads(e.data)["type"] for e in sink.events] == [
        "content_block_start",
        "content_block_delta",
    ]
    [note] = _notes(info.value)
    assert "send_tool_result_block" in note
    assert "content_block_stop" in note


@pytest.mark.anyio
async def test_tool_result_block_for_an_unknown_call_is_refused_at_start() -> None:
    publisher, sink = _make()
    await publisher.send_message_start("m", "s", "x")
    with pytest.raises(ProtocolError) as info:
        await publisher.send_tool_result_block(0, "call_x", "42")
    assert len(sink) == 1
    assert info.value.violations[0].rule == Rule.TOOL_RESULT_UNKNOWN_USE
    [note] = _notes(info.value)
    assert "send_tool_result_block" in note
    assert "content_block_start" in note


@pytest.mark.anyio
async def test_composite_blocks_skip_empty_deltas() -> None:
    publisher, sink = _make()
    await publisher.send_message_start("m", "s", "x")
    await publisher.send_tool_use_block(0, "call_1", "f", "")
    await publisher.send_tool_result_block(1, "call_1", "")
    assert [(name, payload.get("index")) for name, payload in _payloads(sink)[1:]] == [
        ("content_block_start", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_stop", 1),
    ]


@pytest.mark.anyio
async def test_tool_use_block_serialises_a_mapping_compactly() -> None:
    publisher, sink = _make()
    await publisher.send_message_start("m", "s", "x")
    await publisher.send_tool_use_block(0, "call_1", "f", {"city": "Paris", "days": 2})
    delta = _payloads(sink)[2][1]["delta"]
    assert delta == {"type": "input_json_delta", "partial_json": '{"city":"Paris","days":2}'}


# -- logging ---------------------------------------------------------------------------------


async def _marked_turn(publisher: Publisher) -> None:
    await publisher.send_stream_preamble("msg_1", "conv_1", "some-model", input_tokens=3)
    await publisher.send_content_block_start_thinking(0)
    await publisher.send_content_block_delta_thinking(0, MARKER + "-think")
    await publisher.send_signature_delta(0, MARKER)
    await publisher.send_content_block_stop(0)
    await publisher.send_content_block_start_text(1)
    await publisher.send_content_block_delta_text(1, MARKER)
    await publisher.send_content_block_stop(1)
    await publisher.send_tool_use_block(2, "call_1", "get_weather", {"city": MARKER})
    await publisher.send_tool_result_block(3, "call_1", MARKER, is_error=True)
    await publisher.send_stream_epilogue("tool_use", 42)
    await publisher.publish("custom", {"note": MARKER})
    await publisher.send_error("api_error", MARKER, request_id=MARKER)


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", ["essessey", "anthropic"])
async def test_one_debug_record_per_event_without_payload(
    dialect: str, caplog: pytest.LogCaptureFixture
) -> None:
    publisher, sink = _make(dialect)
    with caplog.at_level(logging.DEBUG, logger="essessey.publisher"):
        await _marked_turn(publisher)
    records = [r for r in caplog.records if r.name == "essessey.publisher"]
    events = sink.events
    assert len(records) == len(events)
    for record, event in zip(records, events, strict=True):
        assert record.levelno == logging.DEBUG
        message = record.getMessage()
        assert event.event in message
        assert MARKER not in message
        assert MARKER not in repr(record.args)
        payload = orjson.loads(event.data)
        if "index" in payload:
            assert f"index={payload['index']}" in message
    # Block type and delta length of each delta, from the thinking delta onwards.
    messages = [r.getMessage() for r in records]
    assert "index=0 block=thinking delta_len=" + str(len(MARKER) + 6) in messages[3]
    assert "index=0 block=thinking delta_len=" + str(len(MARKER)) in messages[4]
    assert "index=1 block=text delta_len=" + str(len(MARKER)) in messages[7]
    assert "index=2 block=tool_use delta_len=" in messages[10]
    assert "index=3 block=tool_result delta_len=" + str(len(MARKER)) in messages[13]
    assert "index=3 block=tool_result" in messages[14]


@pytest.mark.anyio
async def test_no_records_above_debug(caplog: pytest.LogCaptureFixture) -> None:
    publisher, _ = _make()
    with caplog.at_level(logging.INFO, logger="essessey.publisher"):
        await _marked_turn(publisher)
    assert [r for r in caplog.records if r.name == "essessey.publisher"] == []


# -- the Anthropic SDK reads the anthropic dialect -----------------------------------------


@pytest.mark.anyio
async def test_anthropic_sdk_accumulates_an_anthropic_turn() -> None:
    publisher, sink = _make("anthropic")
    await publisher.send_stream_preamble("msg_1", "conv_1", "some-model", input_tokens=11)
    await publisher.send_content_block_start_thinking(0)
    await publisher.send_content_block_delta_thinking(0, "Need the ")
    await publisher.send_content_block_delta_thinking(0, "weather.")
    await publisher.send_signature_delta(0, "sig_abc")
    await publisher.send_content_block_stop(0)
    await publisher.send_content_block_start_text(1)
    await publisher.send_ping()
    await publisher.send_content_block_delta_text(1, "Check")
    await publisher.send_content_block_delta_text(1, "ing.")
    await publisher.send_content_block_stop(1)
    await publisher.send_tool_use_start(2, "call_1", "get_weather")
    await publisher.send_tool_input_delta(2, "")
    await publisher.send_tool_input_delta(2, '{"city": "Pa')
    await publisher.send_tool_input_delta(2, 'ris"}')
    await publisher.send_content_block_stop(2)
    await publisher.send_tool_result_block(3, "call_1", '{"temp_c":18}')
    await publisher.send_tool_use_block(4, "call_2", "get_time", {"tz": "CET"})
    await publisher.send_tool_result_block(5, "call_2", "no clock", is_error=True)
    await publisher.send_stream_epilogue("tool_use", 42, cache_read_input_tokens=5)

    message = read_message(sink.events)
    thinking, text, tool, _, tool_2, _ = message.content
    assert thinking.type == "thinking"
    assert thinking.thinking == "Need the weather."
    assert thinking.signature == "sig_abc"
    assert text.type == "text"
    assert text.text == "Checking."
    assert tool.type == "tool_use"
    assert (tool.id, tool.name, tool.input) == ("call_1", "get_weather", {"city": "Paris"})
    assert tool_2.input == {"tz": "CET"}
    assert [block.type for block in message.content] == [
        "thinking",
        "text",
        "tool_use",
        "tool_result",
        "tool_use",
        "tool_result",
    ]
    assert message.stop_reason == "tool_use"
    assert message.usage.input_tokens == 11
    assert message.usage.output_tokens == 42
    assert message.usage.cache_read_input_tokens == 5
    assert check(sink.events) == []


@pytest.mark.anyio
async def test_anthropic_sdk_reads_several_messages() -> None:
    publisher, sink = _make("anthropic")
    for n in range(2):
        await publisher.send_stream_preamble(f"msg_{n}", "conv_1", "some-model")
        await publisher.send_content_block_start_text(0)
        await publisher.send_content_block_delta_text(0, f"answer {n}")
        await publisher.send_content_block_stop(0)
        await publisher.send_stream_epilogue("end_turn", 2)
    events = sink.events
    half = len(events) // 2
    assert read_message(events[:half]).content[0].text == "answer 0"
    assert read_message(events[half:]).content[0].text == "answer 1"


class _TextSink:
    """A sink that takes text deltas as index, text and the text's JSON: every other one
    at once (None), the rest through the awaitable it returns, which runs only when
    awaited."""

    def __init__(self) -> None:
        self.via_text: list[tuple[int, str, bytes]] = []
        self.via_emit: list[str] = []
        self.calls = 0

    async def emit(self, event: Event) -> None:
        self.via_emit.append(event.event)

    def emit_text(self, index: int, text: str, text_json: bytes) -> Awaitable[None] | None:
        self.calls += 1
        # The payload as the sink makes it: the very bytes a plain sink's event carries.
        data = TEXT_DELTA_PAYLOAD % (index, text_json)
        if self.calls % 2:
            self.via_text.append((index, text, data))
            return None
        return self._later(index, text, data)

    async def _later(self, index: int, text: str, data: bytes) -> None:
        self.via_text.append((index, text, data))


@pytest.mark.anyio
async def test_text_deltas_reach_emit_text_and_every_other_event_emit_once() -> None:
    sink = _TextSink()
    plain = InMemorySink()
    for publisher in (Publisher(sink), Publisher(plain)):
        await publisher.send_stream_preamble("msg_1", "conv_1", "m")
        await publisher.send_content_block_start_text(0)
        for chunk in ("a", 'b "q"', "", "d\n"):
            await publisher.send_content_block_delta_text(0, chunk)
        await publisher.send_content_block_stop(0)
        await publisher.send_content_block_start_thinking(1)
        await publisher.send_content_block_delta_thinking(1, "hm")
        await publisher.send_content_block_stop(1)
    # Taken at once or through the awaitable, each in order and once, with the payload
    # the event of a plain sink carries.
    texts = [e.data for e in plain.events if b'"text_delta"' in e.data]
    assert sink.via_text == [
        (0, "a", texts[0]),
        (0, 'b "q"', texts[1]),
        (0, "", texts[2]),
        (0, "d\n", texts[3]),
    ]
    assert sink.via_emit == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
    ]


@pytest.mark.anyio
async def test_a_refused_text_delta_reaches_no_sink_method() -> None:
    sink = _TextSink()
    publisher = Publisher(sink)
    await publisher.send_stream_preamble("msg_1", "conv_1", "m")
    with pytest.raises(ProtocolError):
        await publisher.send_content_block_delta_text(0, "no block is open")
    with pytest.raises(SerializationError):
        await publisher.send_content_block_delta_text(0, "\ud800")
    assert sink.calls == 0
    assert sink.via_emit == ["message_start", "ping"]


@pytest.mark.anyio
async def test_a_pass_through_block_type_is_logged_only_as_a_word(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = InMemorySink()
    publisher = Publisher(sink)
    await publisher.send_stream_preamble("m", "s", "x")
    with caplog.at_level(logging.DEBUG, logger="essessey"):
        for index, block_type in enumerate((MARKER, "server_tool_use")):
            await publisher.publish(
                "content_block_start",
                {"index": index, "content_block": {"type": block_type}},
            )
            await publisher.send_content_block_stop(index)
    logged = [record.getMessage() for record in caplog.records]
    assert not any(MARKER in line for line in logged)
    assert any(f"block=<{len(MARKER)} chars>" in line for line in logged)
    assert any("block=server_tool_use" in line for line in logged)


# -- many deltas at once ---------------------------------------------------------------------


class _OneByOne:
    """A sink without emit_many (nor emit_text): the batched call emits one by one."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    async def emit(self, event: Event) -> None:
        self.events.append(event)


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", ["essessey", "anthropic"])
@pytest.mark.parametrize("strict", [True, False])
async def test_many_text_deltas_at_once_are_the_single_calls_events(
    dialect: Any, strict: bool
) -> None:
    chunks = ["Hel", "lo, ", "", 'a "quote" \u2603', "\n"]
    single, single_sink = _make(dialect, strict=strict)
    batched, batched_sink = _make(dialect, strict=strict)
    other = _OneByOne()
    plain = Publisher(other, dialect=dialect, strict=strict)
    for publisher in (single, batched, plain):
        await publisher.send_message_start("m", "s", "x")
        await publisher.send_content_block_start_text(0)
    for chunk in chunks:
        await single.send_content_block_delta_text(0, chunk)
    await batched.send_content_block_deltas_text(0, chunks)
    await plain.send_content_block_deltas_text(0, iter(chunks))
    for publisher in (single, batched, plain):
        await publisher.send_content_block_stop(0)
        await publisher.send_message_delta("end_turn", 1)
        await publisher.send_message_stop()
    assert batched_sink.events == single_sink.events == other.events
    assert check(batched_sink.events) == []


@pytest.mark.anyio
async def test_many_deltas_refused_or_unserialisable_emit_nothing() -> None:
    publisher, sink = _make()
    await publisher.send_message_start("m", "s", "x")
    before = sink.events
    with pytest.raises(ProtocolError):
        await publisher.send_content_block_deltas_text(0, ["no", "block"])  # none is open
    assert sink.events == before
    await publisher.send_content_block_start_text(0)
    before = sink.events
    with pytest.raises(SerializationError):
        await publisher.send_content_block_deltas_text(0, ["ok", "\ud800"])
    assert sink.events == before
    await publisher.send_content_block_deltas_text(0, [])
    assert sink.events == before


# -- the sink's declared capabilities -----------------------------------------------------


def test_the_sinks_declare_their_capabilities_as_protocols() -> None:
    from essessey.event import BatchSink, TextDeltaSink

    assert isinstance(InMemorySink(), BatchSink)
    assert not isinstance(InMemorySink(), TextDeltaSink)
    assert isinstance(_TextSink(), TextDeltaSink)
    assert not isinstance(_TextSink(), BatchSink)
    assert not isinstance(_OneByOne(), TextDeltaSink)
    assert not isinstance(_OneByOne(), BatchSink)


@pytest.mark.anyio
async def test_a_capability_is_learnt_once_from_the_sink_s_class() -> None:
    """The Publisher binds ``emit_text``/``emit_many`` when it is built, from the
    class: an attribute set on one instance later (or before) is not a declared
    capability, and no event pays for looking it up."""
    sink = _OneByOne()
    taken: list[Event] = []
    sink.emit_many = lambda events: taken.extend(events)  # type: ignore[attr-defined]
    publisher = Publisher(sink)
    await publisher.send_stream_preamble("msg_1", "conv_1", "m")
    await publisher.send_content_block_start_text(0)
    await publisher.send_content_block_deltas_text(0, ["a", "b"])
    assert taken == []
    assert [e.event for e in sink.events[-2:]] == ["content_block_delta"] * 2


@hypothesis.given(index=st.integers(min_value=-5, max_value=5000), text=st.text())
def test_a_text_delta_s_head_and_tail_around_its_text_are_its_payload(
    index: int, text: str
) -> None:
    # The store writes a text delta's payload from a head made once per index: the same
    # bytes as the template filled.
    text_json = orjson.dumps(text)
    head = TEXT_DELTA_HEADS[index] if index in TEXT_DELTA_HEADS else text_delta_head(index)
    assert head + text_json + TEXT_DELTA_TAIL == TEXT_DELTA_PAYLOAD % (index, text_json)
    assert orjson.loads(head + text_json + TEXT_DELTA_TAIL)["delta"]["text"] == text
    assert (index in TEXT_DELTA_HEADS) == (0 <= index < 256)
