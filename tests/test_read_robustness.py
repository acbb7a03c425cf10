"""Read-side robustness: what a stream may hold that no writer of this library makes
(values nested past what Python's ``str()`` or a JSON writer goes into, counts whose sum
passes 64 bits, unnamed SSE frames, empty pings, events after a response's end) is read,
skipped with a log line, or bounded; never a crash, and no payload in a log line."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import orjson
import pytest

from essessey import Event, check, reassemble_events
from essessey.cli import main as cli_main
from essessey.dialects.agui import AGUIEncoder
from essessey.dialects.chat_completions import ChatCompletionsEncoder
from essessey.dialects.responses import ResponsesEncoder
from essessey.dialects.ui import UIMessageEncoder
from essessey.snapshot import compact

MESSAGE = {"id": "m1", "type": "message", "role": "assistant", "model": "x", "content": []}
MESSAGE |= {"stop_reason": None, "usage": {"input_tokens": 1, "output_tokens": 0}}
ENCODERS: list[Any] = [
    lambda: UIMessageEncoder(),
    lambda: AGUIEncoder("thread", "run"),
    lambda: ChatCompletionsEncoder("chatcmpl_1"),
    lambda: ResponsesEncoder("resp_1"),
]
ENCODER_IDS = ["ui", "agui", "chat", "responses"]


def event(name: str, **payload: Any) -> Event:
    return Event(name, orjson.dumps({"type": name, **payload}))


def nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return value


def deep_json(depth: int) -> bytes:
    return b"[" * depth + b'"x"' + b"]" * depth  # past orjson's writer (255), not its reader


def text_message(text: str, stop: str = "end_turn", **usage: int) -> list[Event]:
    counts = {"output_tokens": 1, **usage}
    return [
        event("message_start", message=MESSAGE),
        event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
        event("content_block_delta", index=0, delta={"type": "text_delta", "text": text}),
        event("content_block_stop", index=0),
        event("message_delta", delta={"stop_reason": stop, "stop_sequence": None}, usage=counts),
        event("message_stop"),
    ]


def test_check_reads_a_delta_whose_type_is_an_object() -> None:
    events = text_message("hi")
    events[2] = event("content_block_delta", index=0, delta={"type": {"a": 1}, "text": "x"})
    assert isinstance(check(events), list)  # read (a block type it does not know), no TypeError


def test_ids_nested_past_the_recursion_limit_are_read_without_a_crash() -> None:
    start = b'{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":'
    deep = Event("content_block_start", start + deep_json(1015) + b',"name":"f","input":{}}}')
    events = [*text_message("hi")[:1], deep]
    assert check(events) != []
    reassemble_events(events)  # no RecursionError
    for make in ENCODERS:
        encoder = make()
        for item in events:
            encoder.encode(item)
        encoder.finish()


@pytest.mark.parametrize("make", ENCODERS, ids=ENCODER_IDS)
def test_token_counts_whose_sum_passes_64_bits_are_bounded(make: Any) -> None:
    events = text_message("hi", input_tokens=2**63 - 1, cache_read_input_tokens=2**63 - 1)
    encoder = make()
    body = b"".join(encoder.encode(item) for item in events) + encoder.finish()
    assert b"hi" in body


def test_a_responses_block_no_json_writer_can_write_is_skipped_and_the_response_ends() -> None:
    events = text_message("hi")
    odd = b'{"type":"content_block_start","index":1,"content_block":{"type":"custom","v":'
    events[4:4] = [
        Event("content_block_start", odd + deep_json(300) + b"}}"),
        event("content_block_stop", index=1),
    ]
    encoder = ResponsesEncoder("resp_1")
    body = b"".join(encoder.encode(item) for item in events) + encoder.finish()
    assert b"response.completed" in body


@pytest.mark.parametrize("make", [ENCODERS[1], ENCODERS[3]], ids=["agui", "responses"])
def test_a_message_after_the_response_s_end_is_named_in_a_log_line(
    make: Any, caplog: pytest.LogCaptureFixture
) -> None:
    events = [*text_message("FIRST"), *text_message("SECOND")]
    encoder = make()
    with caplog.at_level(logging.INFO, logger="essessey.dialects"):
        body = b"".join(encoder.encode(item) for item in events) + encoder.finish()
    assert b"SECOND" not in body
    assert "the response has ended" in caplog.text


@pytest.mark.parametrize("make", ENCODERS, ids=ENCODER_IDS)
def test_an_event_name_is_never_logged_as_it_came(
    make: Any, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "4111-1111-1111-1111" * 100
    events = [text_message("hi")[0], Event(secret, b"not json")]
    with caplog.at_level(logging.DEBUG):
        encoder = make()
        for item in events:
            encoder.encode(item)
    assert "4111" not in caplog.text


def test_unnamed_frames_are_checked_by_the_type_their_payload_names() -> None:
    events = [Event("message", item.data) for item in text_message("hi")]
    assert check(events) == []
    broken = [Event("", item.data) for item in text_message("hi")[:3]]
    assert [v.rule for v in check(broken)][-1] == "incomplete"


def test_a_ping_with_no_data_is_a_keep_alive_for_check_too() -> None:
    events = text_message("hi")
    events.insert(1, Event("ping", b""))
    assert check(events) == []


def test_a_violation_s_detail_quotes_at_most_a_bounded_part_of_the_stream() -> None:
    events = text_message("hi")
    result = {"type": "tool_result", "tool_use_id": "x" * 100_000, "is_error": False}
    events[1] = event("content_block_start", index=0, content_block=result)
    assert max(len(v.detail) for v in check(events)) < 300


def test_the_essessey_dialect_s_thinking_deltas_are_merged_by_the_compactor() -> None:
    start = event("content_block_start", index=0, content_block={"type": "thinking"})
    deltas = [
        event("content_block_delta", index=0, delta={"type": "thinking_delta", "text": f"t{n} "})
        for n in range(50)
    ]
    events = [
        event("message_start", message=MESSAGE),
        start,
        *[Event(d.event, d.data, str(n)) for n, d in enumerate(deltas, 10)],
        event("content_block_stop", index=0),
    ]
    compacted = compact(events)
    assert len(compacted) == 4
    assert reassemble_events(compacted).thinking == reassemble_events(events).thinking


def test_tail_s_renderer_prints_values_nested_past_what_it_can_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    answer = b'{"type":"content_block_start","index":0,"content_block":{"type":"answer",'
    answer += b'"request_id":"q1","value":' + deep_json(300) + b"}}"
    frames = [
        b"event: message_start\ndata: "
        + orjson.dumps({"type": "message_start", "message": MESSAGE}),
        b"event: content_block_start\ndata: " + answer,
    ]
    path = tmp_path / "deep.sse"
    path.write_bytes(b"\n\n".join(frames) + b"\n\n")
    assert cli_main(["check", str(path)]) in (0, 1)  # read, not a traceback
