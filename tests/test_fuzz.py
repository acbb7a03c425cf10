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
from essessey.bindings.ws import decode_frame
from essessey.protocol import DIALECTS
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
