"""Every stop reason providers send today reaches each dialect as the dialect's own finish
(docs/protocol.md, "Stop reasons": the table this test holds each dialect to)."""

from __future__ import annotations

from typing import Any

import openai.types.responses
import orjson
import pytest

from essessey import Event, InMemorySink, Publisher, StopReason, check, reassemble_events
from essessey.adapters import anthropic as anthropic_adapter
from essessey.dialects.agui import AGUIEncoder
from essessey.dialects.chat_completions import ChatCompletionsEncoder
from essessey.dialects.responses import ResponsesEncoder
from essessey.dialects.ui import UIMessageEncoder

pytestmark = pytest.mark.anyio

# stop reason -> (Chat Completions finish_reason, AI SDK finish, Responses status and
# incomplete reason)
TABLE: dict[str, tuple[str, str, tuple[str, str | None]]] = {
    StopReason.END_TURN: ("stop", "stop", ("completed", None)),
    StopReason.TOOL_USE: ("tool_calls", "tool-calls", ("completed", None)),
    StopReason.MAX_TOKENS: ("length", "length", ("incomplete", "max_output_tokens")),
    StopReason.STOP_SEQUENCE: ("stop", "stop", ("completed", None)),
    StopReason.PAUSE_TURN: ("stop", "other", ("completed", None)),
    StopReason.REFUSAL: ("content_filter", "content-filter", ("incomplete", "content_filter")),
    StopReason.MODEL_CONTEXT_WINDOW_EXCEEDED: (
        "length",
        "length",
        ("incomplete", "max_output_tokens"),
    ),
    StopReason.CANCELLED: ("stop", "abort", ("cancelled", None)),
    "a_reason_from_next_year": ("stop", "other", ("completed", None)),
}


async def turn(stop_reason: str) -> list[Event]:
    sink = InMemorySink()
    p = Publisher(sink)
    await p.send_stream_preamble("msg_1", "s", "m")
    await p.send_content_block_start_text(0)
    await p.send_content_block_delta_text(0, "hi")
    await p.send_content_block_stop(0)
    await p.send_stream_epilogue(stop_reason, 1)
    return sink.events


def data_of(encoder: Any, events: list[Event]) -> list[dict[str, Any]]:
    body = b"".join(encoder.encode(event) for event in events) + encoder.finish()
    return [
        orjson.loads(line[6:])
        for frame in body.split(b"\n\n")
        for line in frame.split(b"\n")
        if line.startswith(b"data: {")
    ]


@pytest.mark.parametrize("stop_reason", list(TABLE))
async def test_chat_completions_finish_reason(stop_reason: str) -> None:
    chunks = data_of(ChatCompletionsEncoder("c"), await turn(stop_reason))
    reasons = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert [r for r in reasons if r] == [TABLE[stop_reason][0]]


@pytest.mark.parametrize("stop_reason", list(TABLE))
async def test_ai_sdk_finish(stop_reason: str) -> None:
    chunks = data_of(UIMessageEncoder(usage_metadata=False), await turn(stop_reason))
    last = chunks[-1]
    expected = TABLE[stop_reason][1]
    if expected == "abort":
        assert last == {"type": "abort"}
    else:
        assert last == {"type": "finish", "finishReason": expected}


@pytest.mark.parametrize("stop_reason", list(TABLE))
async def test_responses_status(stop_reason: str) -> None:
    chunks = data_of(ResponsesEncoder("r"), await turn(stop_reason))
    response = chunks[-1]["response"]
    status, reason = TABLE[stop_reason][2]
    assert response["status"] == status
    details = response["incomplete_details"]
    assert (details or {}).get("reason") == reason
    parsed = openai.types.responses.Response.model_validate(response)
    assert parsed.status == status


@pytest.mark.parametrize("stop_reason", list(TABLE))
async def test_agui_carries_the_stop_reason(stop_reason: str) -> None:
    chunks = data_of(AGUIEncoder("t", "r"), await turn(stop_reason))
    step = next(c for c in chunks if c["type"] == "STEP_FINISHED")
    assert step["rawEvent"]["delta"]["stop_reason"] == stop_reason
    last = chunks[-1]
    if stop_reason == StopReason.CANCELLED:
        assert (last["type"], last["code"]) == ("RUN_ERROR", "CANCELLED")
    else:
        assert last["type"] == "RUN_FINISHED"


@pytest.mark.parametrize("dialect", ["essessey", "anthropic"])
async def test_anthropic_stop_details_reach_the_reader(dialect: str) -> None:
    details = {"type": "refusal", "category": "cyber", "explanation": None}
    message = {
        "id": "msg_a",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 3, "output_tokens": 0},
    }
    events = [
        {"type": "message_start", "message": message},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "I"}},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "refusal", "stop_sequence": None, "stop_details": details},
            "usage": {"output_tokens": 1},
        },
        {"type": "message_stop"},
    ]
    sink = InMemorySink()
    await anthropic_adapter.publish(Publisher(sink, dialect=dialect), events, stream_id="s")
    assert check(sink.events) == []
    parsed = reassemble_events(sink.events)
    assert (parsed.stop_reason, parsed.stop_details) == ("refusal", details)
    assert parsed.messages[0].stop_details == details
    chunks = data_of(ChatCompletionsEncoder("c"), sink.events)
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == (
        "content_filter"
    )
