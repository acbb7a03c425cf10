"""Fuzzing the readers and the provider adapters.

For now, the regression tests of what the fuzzing found; the fuzz targets follow.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import orjson
import pytest

from essessey import Event, InMemorySink, Publisher, check
from essessey.adapters import anthropic as anthropic_adapter
from essessey.adapters import openai as openai_adapter
from essessey.bindings.ws import decode_frame
from essessey.protocol import DIALECTS, EventType
from essessey.reassemble import Reassembler


def test_ws_decode_frame_refuses_data_nested_deeper_than_it_can_write() -> None:
    # orjson parses 1024 levels but writes 255: the frame parsed, then re-serialising its
    # data raised orjson's JSONEncodeError (a TypeError), which WebSocketSource does not
    # catch, so one such frame ended the whole stream.
    for depth in (255, 256, 1000):
        frame = '{"event":"x","data":' + "[" * depth + "]" * depth + "}"
        with pytest.raises(ValueError, match="nested too deeply"):
            decode_frame(frame)
    assert decode_frame('{"event":"x","data":' + "[" * 254 + "]" * 254 + "}").event == "x"


def payload_event(payload: dict[str, Any]) -> Event:
    return Event(payload["type"], orjson.dumps(payload))


def test_reassembler_reads_a_tool_input_nested_deeper_than_orjson_writes() -> None:
    # A tool_use start whose input is nested 300 levels (valid JSON: orjson parses up to
    # 1024) made the reassembler raise orjson's JSONEncodeError at the block's stop, when
    # it wrote the input back out as the call's arguments.
    for depth, writable in ((300, True), (1000, False)):
        deep = "[" * depth + "]" * depth
        events = [
            payload_event({"type": "message_start", "message": {"id": "m"}}),
            Event(
                "content_block_start",
                b'{"type":"content_block_start","index":0,"content_block":'
                b'{"type":"tool_use","id":"t","name":"n","input":{"a":' + deep.encode() + b"}}}",
            ),
            payload_event({"type": "content_block_stop", "index": 0}),
            payload_event({"type": "message_stop"}),
        ]
        reassembler = Reassembler()
        for event in events:
            reassembler.feed(event)
        (call,) = reassembler.result().tool_calls
        if writable:
            assert call.params == {"a": json.loads(deep)}
            assert json.loads(call.arguments) == call.params
            assert call.parse_error is None
        else:
            # Past what the standard library writes too: no text, and the reason why.
            assert (call.arguments, call.params) == ("", None)
            assert call.parse_error == "the block's input is nested too deeply to write as JSON"


# Put into content (text, reasoning, arguments, data): it must never reach a log line.
# Upper case and a dash: no reader mistakes it for an identifier it may log as a name.
MARKER = "ZQX-SECRET-QXZ"


def nested(depth: int, kind: str = "list") -> Any:
    """A value nested ``depth`` levels deep, built without recursion."""
    value: Any = MARKER
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value}
    return value


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def captured_logs(name: str = "essessey") -> Iterator[list[logging.LogRecord]]:
    """Every record of ``name``'s loggers, DEBUG included, while the block runs.

    A handler of our own rather than pytest's caplog: caplog is a function-scoped
    fixture, shared by every example Hypothesis runs in one test.
    """
    handler = _Records()
    logger = logging.getLogger(name)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def assert_no_content(records: Sequence[logging.LogRecord]) -> None:
    for record in records:
        line = record.getMessage()
        assert MARKER not in line, f"{record.name} {record.levelname} logged content: {line!r}"


def warnings_of(records: Sequence[logging.LogRecord]) -> list[logging.LogRecord]:
    return [record for record in records if record.levelno >= logging.WARNING]


class Broken(Exception):
    """What a provider's stream raises when its transport fails."""


async def _raising(items: list[Any], after: int) -> AsyncIterator[Any]:
    for item in items[:after]:
        yield item
    raise Broken(MARKER)


def _publish(
    run: Callable[[Publisher, Any], Any], items: list[Any], dialect: str, fails_after: int | None
) -> tuple[list[Event], list[logging.LogRecord], Any]:
    """Run an adapter's ``publish`` into a strict Publisher: the events, the logs, and
    what it returned (or the exception it raised)."""
    sink = InMemorySink()
    publisher = Publisher(sink, dialect=dialect, strict=True)  # type: ignore[arg-type]
    source: Any = items if fails_after is None else _raising(items, fails_after)
    with captured_logs() as records:
        try:
            outcome: Any = asyncio.run(run(publisher, source))
        except Broken as exc:
            outcome = exc
    return sink.events, records, outcome


ANTHROPIC_START = {
    "type": "message_start",
    "message": {"id": "msg_1", "model": "claude-x", "usage": {"input_tokens": 1}},
}


ANTHROPIC_END = [
    {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {"output_tokens": 2},
    },
    {"type": "message_stop"},
]


def _anthropic_publish(events: list[Any], dialect: str) -> tuple[list[Event], Any, list[str]]:
    def run(publisher: Publisher, source: Any) -> Any:
        return anthropic_adapter.publish(publisher, source, stream_id="s_1")

    published, records, outcome = _publish(run, events, dialect, None)
    assert_no_content(records)
    assert check(published) == []
    return published, outcome, [r.getMessage() for r in warnings_of(records)]


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
@pytest.mark.parametrize("index", [MARKER, [MARKER], {"k": MARKER}, None, 1.5])
def test_anthropic_adapter_does_not_log_a_stop_index_that_is_not_an_integer(
    index: Any, dialect: str
) -> None:
    # A content_block_stop whose index was not an integer was logged with repr(index):
    # the provider's value, whatever it held, reached a WARNING.
    events = [
        ANTHROPIC_START,
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "a"}},
        {"type": "content_block_stop", "index": index},
        {"type": "content_block_stop", "index": 0},
        *ANTHROPIC_END,
    ]
    _, outcome, warned = _anthropic_publish(events, dialect)
    assert outcome.text == "a"
    shown = f"<{type(index).__name__}>" if not isinstance(index, str) else f"<{len(index)} chars>"
    assert warned == [
        f"skipping provider event #3 (content_block_stop): stop for block {shown}, "
        "but the open block is 0"
    ]


def _text_block(index: int, *parts: str) -> list[dict[str, Any]]:
    return [
        {"type": "content_block_start", "index": index, "content_block": {"type": "text"}},
        *(
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "text_delta", "text": p},
            }
            for p in parts
        ),
        {"type": "content_block_stop", "index": index},
    ]


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_anthropic_adapter_skips_values_orjson_cannot_write(dialect: str) -> None:
    # Values Python's json module reads but orjson will not write ended the turn: a
    # tool_use input nested 300 levels raised orjson's JSONEncodeError, a passed-through
    # block holding one raised SerializationError, and a text chunk with a lone surrogate
    # opened its block, could not fill it, and left it open empty, so every later event
    # was refused and the message ended in an error.
    tool = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"q": nested(300)}}
    other = {"type": "redacted_thinking", "data": nested(300)}
    events = [
        ANTHROPIC_START,
        *_text_block(0, MARKER + "\ud800"),
        *_text_block(1, "a"),
        {"type": "content_block_start", "index": 2, "content_block": other},
        {"type": "content_block_stop", "index": 2},
        {"type": "content_block_start", "index": 3, "content_block": tool},
        {"type": "content_block_stop", "index": 3},
        *ANTHROPIC_END,
    ]
    published, outcome, warned = _anthropic_publish(events, dialect)
    assert outcome.error is None
    assert (outcome.text, outcome.tool_calls) == ("a", [])
    assert published[-1].event == EventType.MESSAGE_STOP
    assert warned == [
        "skipping provider event #2 (content_block_delta): text_delta for block 0 holds a "
        "lone surrogate",
        "skipping provider event #7 (content_block_start): refused (SerializationError)",
        "skipping provider event #9 (content_block_start): tool_use block 3 has an input not "
        "writable as JSON",
    ]


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_anthropic_adapter_drops_a_count_past_64_bits(dialect: str) -> None:
    # A usage count past 64 bits made message_delta fail with SerializationError, which
    # ended the whole turn.
    events = [
        ANTHROPIC_START,
        *_text_block(0, "a"),
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 2**64, "cache_read_input_tokens": 3},
        },
        {"type": "message_stop"},
    ]
    published, outcome, _ = _anthropic_publish(events, dialect)
    assert outcome.text == "a"
    assert "output_tokens" not in outcome.usage
    if dialect == "essessey":
        # The dialect's own frame events carry the counts that fit.
        assert outcome.error is None
        assert outcome.usage["cache_read_input_tokens"] == 3
        assert published[-1].event == EventType.MESSAGE_STOP
    else:
        # The provider's payloads go out as they are: one that cannot be written is
        # skipped, and a stream left without its end says so in an error event.
        assert outcome.error is not None
        assert published[-1].event == EventType.ERROR


def _openai_chunk(delta: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"model": "gpt-x", "choices": [{"index": 0, "delta": delta}], **fields}


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_openai_adapter_skips_a_chunk_orjson_cannot_write(dialect: str) -> None:
    # A lone surrogate in the text (Python's json module makes one of a "\ud800" escape)
    # or a count past 64 bits was read as valid; publishing it then raised
    # SerializationError and ended the turn (for the count, at the epilogue, which left
    # the stream open with no error event).
    chunks = [
        _openai_chunk({"content": "a"}),
        _openai_chunk({"content": MARKER + "\ud800"}),
        _openai_chunk({"reasoning": "\udc00"}),
        _openai_chunk({"content": "b"}),
        {"choices": [], "usage": {"prompt_tokens": 2**64, "completion_tokens": 1}},
        {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2**63}},
    ]

    def run(publisher: Publisher, source: Any) -> Any:
        return openai_adapter.publish(publisher, source, message_id="m", stream_id="s")

    published, records, outcome = _publish(run, chunks, dialect, None)
    assert_no_content(records)
    assert check(published) == []
    assert published[-1].event == EventType.MESSAGE_STOP
    assert (outcome.text, outcome.thinking, outcome.usage) == ("ab", "", {})
    assert [r.getMessage() for r in warnings_of(records)] == [
        "skipping chat completion chunk 1: choices[0].delta.content holds a lone surrogate",
        "skipping chat completion chunk 2: choices[0].delta.reasoning holds a lone surrogate",
        "skipping chat completion chunk 4: usage.prompt_tokens does not fit in 64 bits",
        "skipping chat completion chunk 5: usage.completion_tokens does not fit in 64 bits",
    ]


class _FailsOnce:
    """A sink whose ``emit`` fails once, at the first event named ``name``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.failed = False
        self.events: list[Event] = []

    async def emit(self, event: Event) -> None:
        if event.event == self.name and not self.failed:
            self.failed = True
            raise ConnectionResetError("the connection dropped")
        self.events.append(event)


def test_openai_adapter_ends_the_stream_with_an_error_when_the_epilogue_fails() -> None:
    # The epilogue (message_delta, message_stop) went out after the try that turns a
    # failure into an error event: a failure there left the stream open, with neither
    # message_stop nor an error event, and clients waiting for its end.
    sink = _FailsOnce(EventType.MESSAGE_DELTA)
    chunks = [_openai_chunk({"content": "a"})]
    with pytest.raises(ConnectionResetError):
        asyncio.run(openai_adapter.publish(Publisher(sink), chunks, message_id="m", stream_id="s"))
    assert sink.events[-1].event == EventType.ERROR
    assert check(sink.events) == []


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_anthropic_adapter_publishes_a_provider_error_orjson_cannot_write(dialect: str) -> None:
    # A provider error event holding a lone surrogate (or, passed through in the anthropic
    # dialect, any value orjson cannot write) made publish() raise SerializationError,
    # where it promises to publish the error and return.
    error = {"type": "overloaded_error\ud800", "message": MARKER + "\udc00", "at": nested(300)}
    events = [ANTHROPIC_START, *_text_block(0, "a"), {"type": "error", "error": error}]
    events[-1]["request_id"] = "req_\ud800"
    published, outcome, _ = _anthropic_publish(events, dialect)
    assert outcome.error == {"type": "overloaded_error\ufffd", "message": MARKER + "\ufffd"}
    assert outcome.text == "a"
    assert orjson.loads(published[-1].data) == {"type": "error", "error": outcome.error}
