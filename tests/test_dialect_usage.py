"""Every token count a provider gives reaches every dialect, in the dialect's own field:
cache reads and writes and reasoning tokens, whether the provider put them in
``message_start`` or ``message_delta``, summed over a turn's rounds (docs/protocol.md,
"Usage")."""

from __future__ import annotations

from typing import Any

import openai.types.chat
import openai.types.responses
import orjson
import pytest
from ag_ui.core import RunFinishedEvent

from essessey import Event, EventType, InMemorySink, Publisher, StopReason, reassemble_events
from essessey.adapters import anthropic as anthropic_adapter
from essessey.adapters import openai as openai_adapter
from essessey.dialects.agui import AGUIEncoder
from essessey.dialects.chat_completions import ChatCompletionsEncoder, completion
from essessey.dialects.responses import ResponsesEncoder
from essessey.dialects.ui import UIMessageEncoder

pytestmark = pytest.mark.anyio

# Two rounds. Round 1's cache counts come only in its message_start (as several Anthropic
# streams send them); round 2's delta repeats a count the start gave, and wins.
ROUNDS: list[tuple[dict[str, int], dict[str, int]]] = [
    (
        {"input_tokens": 10, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 5},
        {"output_tokens": 20, "reasoning_tokens": 4},
    ),
    (
        {"input_tokens": 3, "cache_read_input_tokens": 7},
        {"output_tokens": 7, "cache_read_input_tokens": 110},
    ),
]
PROMPT = (10 + 100 + 5) + (3 + 110)  # all input, as OpenAI's formats and AG-UI count it
OUTPUT = 27
CACHE_READ = 210
CACHE_WRITE = 5
REASONING = 4


async def two_round_turn() -> list[Event]:
    sink = InMemorySink()
    p = Publisher(sink)
    for n, (start, delta) in enumerate(ROUNDS, 1):
        message = {
            "id": f"msg_{n}",
            "stream_id": "s",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": "m",
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {**start, "output_tokens": 0},
        }
        await p.publish(EventType.MESSAGE_START, {"message": message})
        await p.send_content_block_start_text(0)
        await p.send_content_block_delta_text(0, f"round {n}")
        await p.send_content_block_stop(0)
        stop = StopReason.TOOL_USE if n == 1 else StopReason.END_TURN
        await p.send_message_delta(
            stop, delta["output_tokens"], **{k: v for k, v in delta.items() if k != "output_tokens"}
        )
        await p.send_message_stop()
    return sink.events


def data_of(body: bytes) -> list[dict[str, Any]]:
    found = []
    for frame in body.split(b"\n\n"):
        for line in frame.split(b"\n"):
            if line.startswith(b"data: {"):
                found.append(orjson.loads(line[6:]))
    return found


def encoded(encoder: Any, events: list[Event]) -> list[dict[str, Any]]:
    return data_of(b"".join(encoder.encode(event) for event in events) + encoder.finish())


async def test_chat_completions_usage() -> None:
    events = await two_round_turn()
    chunks = encoded(ChatCompletionsEncoder("c", include_usage=True), events)
    usage = chunks[-1]["usage"]
    assert usage == {
        "prompt_tokens": PROMPT,
        "completion_tokens": OUTPUT,
        "total_tokens": PROMPT + OUTPUT,
        "prompt_tokens_details": {"cached_tokens": CACHE_READ},
        "completion_tokens_details": {"reasoning_tokens": REASONING},
    }
    chunk = openai.types.chat.ChatCompletionChunk.model_validate(chunks[-1])
    assert chunk.usage is not None
    assert chunk.usage.prompt_tokens_details is not None
    assert chunk.usage.prompt_tokens_details.cached_tokens == CACHE_READ
    whole = openai.types.chat.ChatCompletion.model_validate(completion(events, "c"))
    assert whole.usage is not None
    assert whole.usage.model_dump(exclude_none=True) == usage


async def test_responses_usage() -> None:
    chunks = encoded(ResponsesEncoder("r"), await two_round_turn())
    done = next(c for c in chunks if c["type"] == "response.completed")
    event = openai.types.responses.ResponseCompletedEvent.model_validate(done)
    usage = event.response.usage
    assert usage is not None
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (
        PROMPT,
        OUTPUT,
        PROMPT + OUTPUT,
    )
    assert usage.input_tokens_details.cached_tokens == CACHE_READ
    assert done["response"]["usage"]["input_tokens_details"]["cache_write_tokens"] == CACHE_WRITE
    assert usage.output_tokens_details.reasoning_tokens == REASONING


async def test_agui_usage() -> None:
    chunks = encoded(AGUIEncoder("t", "r"), await two_round_turn())
    finished = RunFinishedEvent.model_validate(chunks[-1])
    assert finished.usage is not None
    (usage,) = finished.usage
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (
        PROMPT,
        OUTPUT,
        PROMPT + OUTPUT,
    )
    assert (usage.cached_input_tokens, usage.cache_write_input_tokens) == (CACHE_READ, CACHE_WRITE)
    assert usage.reasoning_tokens == REASONING


async def test_ui_message_stream_usage() -> None:
    events = await two_round_turn()
    finish = next(c for c in encoded(UIMessageEncoder(), events) if c["type"] == "finish")
    assert finish["messageMetadata"] == {
        "usage": {
            "inputTokens": PROMPT,
            "inputTokenDetails": {
                "noCacheTokens": PROMPT - CACHE_READ - CACHE_WRITE,
                "cacheReadTokens": CACHE_READ,
                "cacheWriteTokens": CACHE_WRITE,
            },
            "outputTokens": OUTPUT,
            "outputTokenDetails": {"textTokens": OUTPUT - REASONING, "reasoningTokens": REASONING},
            "totalTokens": PROMPT + OUTPUT,
        }
    }
    off = encoded(UIMessageEncoder(usage_metadata=False), events)
    finish = next(c for c in off if c["type"] == "finish")
    assert finish == {"type": "finish", "finishReason": "stop"}


async def test_reassemble_sums_the_rounds_with_the_start_s_counts() -> None:
    usage = reassemble_events(await two_round_turn()).usage
    assert usage["cache_read_input_tokens"] == CACHE_READ
    assert usage["cache_creation_input_tokens"] == CACHE_WRITE
    assert usage["reasoning_tokens"] == REASONING
    assert usage["output_tokens"] == OUTPUT


def anthropic_message(start: dict[str, int], delta: dict[str, int]) -> list[dict[str, Any]]:
    message = {
        "id": "msg_a",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": start,
    }
    return [
        {"type": "message_start", "message": message},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": delta,
        },
        {"type": "message_stop"},
    ]


async def test_anthropic_cache_counts_given_only_at_the_start_reach_the_essessey_dialect() -> None:
    start = {"input_tokens": 4, "cache_read_input_tokens": 900, "cache_creation_input_tokens": 30}
    sink = InMemorySink()
    await anthropic_adapter.publish(
        Publisher(sink), anthropic_message(start, {"output_tokens": 12}), stream_id="s"
    )
    delta = next(e for e in sink.events if e.event == EventType.MESSAGE_DELTA)
    assert orjson.loads(delta.data)["usage"] == {
        "output_tokens": 12,
        "cache_read_input_tokens": 900,
        "cache_creation_input_tokens": 30,
    }
    assert reassemble_events(sink.events).usage == {**start, "output_tokens": 12}
    usage = encoded(ChatCompletionsEncoder("c", include_usage=True), sink.events)[-1]["usage"]
    assert usage["prompt_tokens"] == 934
    assert usage["prompt_tokens_details"] == {"cached_tokens": 900}


async def test_openai_cached_and_reasoning_tokens_make_the_round_trip() -> None:
    given = {
        "prompt_tokens": 1200,
        "completion_tokens": 80,
        "total_tokens": 1280,
        "prompt_tokens_details": {"cached_tokens": 1024},
        "completion_tokens_details": {"reasoning_tokens": 64},
    }
    chunks = [
        {
            "id": "c1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "gpt-x",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"}}],
        },
        {
            "id": "c1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "gpt-x",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        },
        {
            "id": "c1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "gpt-x",
            "choices": [],
            "usage": given,
        },
    ]
    sink = InMemorySink()
    await openai_adapter.publish(
        Publisher(sink), chunks, message_id="msg_o", stream_id="s", model="gpt-x"
    )
    usage = encoded(ChatCompletionsEncoder("c", include_usage=True), sink.events)[-1]["usage"]
    assert usage == given
