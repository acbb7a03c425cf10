"""The OpenAI chat-completions adapter: recorded-shape fixtures, odd servers, bad chunks."""

import itertools
import json
import logging
import subprocess
import sys
import warnings
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import anyio
import anyio.lowlevel
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletionChunk
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

from essessey import (
    Event,
    InMemorySink,
    Publisher,
    RoundOrderError,
    check,
    reassemble_events,
)
from essessey.adapters import RoundStream, ToolCallRequest, stream_rounds
from essessey.adapters.openai import CUT_STREAM, map_stop_reason, publish, stream_round
from essessey.bindings.sse import EventStreamResponse
from essessey.protocol import Dialect
from tests.adapter_views import (
    Interleaving,
    assert_each_call_whole,
    assert_published_quietly,
    chat_chunks,
    interleavings,
    mangled,
)
from tests.adapter_views import blocks as _blocks
from tests.adapter_views import log_text as _log_text
from tests.adapter_views import tool_use_blocks as _tool_use_blocks
from tests.servers import serve

MARKER = "SECRET-PAYLOAD-0a1c"
DIALECTS: list[Dialect] = ["essessey", "anthropic"]
FIXTURES = Path(__file__).parent / "fixtures" / "openai"
ROOT = Path(__file__).parent.parent
# Fixtures a strict SDK validation refuses because the server left a field out; the SDK
# itself builds streamed chunks without validating, which model_construct reproduces.
LENIENT = {"missing_index.json": ("tool_calls", "index")}


@dataclass(frozen=True)
class Expected:
    text: str = ""
    thinking: str = ""
    calls: tuple[tuple[str, str, Any], ...] = ()  # (id, name, parsed arguments)
    stop_reason: str = "end_turn"
    usage: tuple[tuple[str, int], ...] = ()
    model: str = ""


EXPECTED: dict[str, Expected] = {
    "text_only.json": Expected(
        text="Hello, world! How can I help you today? éè ☃",
        usage=(
            ("input_tokens", 15),
            ("cache_read_input_tokens", 10),
            ("output_tokens", 12),
            ("reasoning_tokens", 0),
        ),
        model="gpt-4o-mini-2024-07-18",
    ),
    "reasoning_then_text.json": Expected(
        text="2 + 2 = **4**.",
        thinking="The user asks for 2+2. That is 4.",
        usage=(
            ("input_tokens", 14),
            ("cache_read_input_tokens", 0),
            ("output_tokens", 40),
            ("reasoning_tokens", 31),
        ),
        model="deepseek-reasoner",
    ),
    "reasoning_field_then_text.json": Expected(
        text="Hi there!",
        thinking="Okay, a greeting. Reply briefly.\n",
        usage=(("input_tokens", 9), ("output_tokens", 21)),
        model="Qwen/Qwen3-8B",
    ),
    "parallel_tool_calls.json": Expected(
        text="I'll check both cities.",
        calls=(
            ("call_Vq3mP0Wk2rT9", "get_weather", {"city": "Paris", "unit": "celsius"}),
            ("call_Zl8nB4Yx1sQ6", "get_weather", {"city": "São Paulo", "unit": "celsius"}),
        ),
        stop_reason="tool_use",
        usage=(
            ("input_tokens", 82),
            ("cache_read_input_tokens", 0),
            ("output_tokens", 51),
            ("reasoning_tokens", 0),
        ),
        model="gpt-4o-2024-08-06",
    ),
    "missing_index.json": Expected(
        calls=(
            ("call_k2j9x0", "get_weather", {"city": "Paris"}),
            ("call_p7w3q1", "get_time", {"tz": "Europe/Paris"}),
        ),
        stop_reason="tool_use",  # the server said "stop" after its tool calls
        usage=(("input_tokens", 120), ("output_tokens", 38)),
        model="llama3.1:8b",
    ),
    "length_with_tools.json": Expected(
        calls=(("call_Lm4T0kEn5", "search", None),),  # cut off: not valid JSON
        stop_reason="max_tokens",
        usage=(("input_tokens", 40), ("output_tokens", 16)),
        model="gpt-4o-mini-2024-07-18",
    ),
    "content_filter.json": Expected(
        text="Here is the story: once", stop_reason="refusal", model="gpt-4o-2024-08-06"
    ),
    "late_name.json": Expected(
        calls=(("call_msg_test_0", "lookup", {"id": 7}), ("D681PevKs", "lookup", {"id": 8})),
        stop_reason="tool_use",
        model="mistral-small-latest",
    ),
    "function_call.json": Expected(
        calls=(("call_msg_test_0", "get_weather", {"city": "Oslo"}),),
        stop_reason="tool_use",
        model="gpt-3.5-turbo-0613",
    ),
}


def _load(name: str) -> list[dict[str, Any]]:
    chunks: list[dict[str, Any]] = json.loads((FIXTURES / name).read_text())
    return chunks


def _objects(name: str) -> list[ChatCompletionChunk]:
    if name in LENIENT:
        return [ChatCompletionChunk.model_construct(**chunk) for chunk in _load(name)]
    return [ChatCompletionChunk.model_validate(chunk) for chunk in _load(name)]


def _chunk(
    *,
    content: str | None = None,
    reasoning: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    finish_reason: str | None = None,
) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if content is not None:
        delta["content"] = content
    if reasoning is not None:
        delta["reasoning_content"] = reasoning
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-t",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "test-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


def _call(
    index: int | None,
    *,
    id: str | None = None,
    name: str | None = None,
    arguments: str | None = None,
) -> dict[str, Any]:
    call: dict[str, Any] = {"function": {}}
    if index is not None:
        call["index"] = index
    if id is not None:
        call["id"] = id
        call["type"] = "function"
    if name is not None:
        call["function"]["name"] = name
    if arguments is not None:
        call["function"]["arguments"] = arguments
    return call


async def _publish(
    chunks: Any, dialect: Dialect = "essessey", **kwargs: Any
) -> tuple[Any, list[Event]]:
    sink = InMemorySink()
    message = await publish(
        Publisher(sink, dialect=dialect),
        chunks,
        message_id="msg_test",
        stream_id="conv_1",
        **kwargs,
    )
    return message, sink.events


# -- the fixtures --------------------------------------------------------------------------


def test_every_fixture_has_expectations() -> None:
    assert sorted(p.name for p in FIXTURES.glob("*.json")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_chunks_are_sdk_chunks(name: str) -> None:
    refused = 0
    for chunk in _load(name):
        if name not in LENIENT:
            ChatCompletionChunk.model_validate(chunk)
            continue
        # Only the field the server leaves out may fail strict validation.
        try:
            ChatCompletionChunk.model_validate(chunk)
        except ValidationError as exc:
            refused += 1
            for error in exc.errors():
                assert error["type"] == "missing"
                assert tuple(error["loc"][-3::2]) == LENIENT[name]
    assert refused > 0 if name in LENIENT else refused == 0


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("form", ["dicts", "objects"])
@pytest.mark.parametrize("name", sorted(EXPECTED))
async def test_fixture_publishes_one_valid_message(name: str, form: str, dialect: Dialect) -> None:
    expected = EXPECTED[name]
    chunks = _load(name) if form == "dicts" else _objects(name)
    message, events = await _publish(chunks, dialect)

    assert check(events) == []
    parsed = reassemble_events(events)
    assert parsed.complete
    assert parsed.message_id == "msg_test"
    assert parsed.model == expected.model
    assert parsed.text == expected.text
    assert parsed.thinking == expected.thinking
    assert [(c.tool_use_id, c.name, c.params) for c in parsed.tool_calls] == list(expected.calls)
    assert parsed.tool_results == ()  # one model response: its calls' results come later
    assert parsed.stop_reason == expected.stop_reason
    usage = dict(expected.usage)
    assert {key: parsed.usage.get(key) for key in usage} == usage
    if "output_tokens" not in usage:
        assert parsed.usage["output_tokens"] == 0

    assert message.message_id == "msg_test"
    assert message.model == expected.model
    assert message.text == expected.text
    assert message.thinking == expected.thinking
    assert [(c.id, c.name, c.input) for c in message.tool_calls] == list(expected.calls)
    assert [c.arguments for c in message.tool_calls] == [c.arguments for c in parsed.tool_calls]
    assert message.stop_reason == expected.stop_reason
    assert message.usage == usage


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_parallel_calls_stream_each_fragment_at_its_index(dialect: Dialect) -> None:
    _, events = await _publish(_load("parallel_tool_calls.json"), dialect)
    start, delta, stop = "content_block_start", "content_block_delta", "content_block_stop"
    assert _blocks(events) == [
        (start, 0, "text"),
        *[(delta, 0, "text")] * 2,
        (stop, 0, "text"),
        (start, 1, "tool_use"),
        *[(delta, 1, "tool_use")] * 9,  # one input_json_delta per fragment, as they came
        (stop, 1, "tool_use"),
        (start, 2, "tool_use"),
        *[(delta, 2, "tool_use")] * 10,
        (stop, 2, "tool_use"),
    ]
    kinds = {orjson.loads(e.data)["delta"]["type"] for e in events if e.event == delta}
    assert kinds == {"text_delta", "input_json_delta"}
    assert [e.event for e in events[:2]] == ["message_start", "ping"]
    assert [e.event for e in events[-2:]] == ["message_delta", "message_stop"]


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["parallel_tool_calls.json", "reasoning_then_text.json"])
async def test_the_anthropic_sdk_reads_the_republished_stream(name: str) -> None:
    async def produce(publisher: Publisher) -> None:
        await publish(publisher, _objects(name), message_id="msg_sdk", stream_id="st")

    async def messages(request: Request) -> EventStreamResponse:
        return EventStreamResponse(produce, dialect="anthropic")

    expected = EXPECTED[name]
    app = Starlette(routes=[Route("/v1/messages", messages, methods=["POST"])])
    with serve(app) as base_url:
        client = anthropic.AsyncAnthropic(base_url=base_url, api_key="test", max_retries=0)
        async with client:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # not even a warning from the SDK's models
                async with client.messages.stream(
                    model="m", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
                ) as stream:
                    message = await stream.get_final_message()
    assert message.id == "msg_sdk"
    assert message.model == expected.model
    assert message.stop_reason == expected.stop_reason
    assert message.usage.output_tokens == dict(expected.usage)["output_tokens"]
    blocks = [(b.type, getattr(b, "input", None)) for b in message.content]
    assert blocks == [
        *([("thinking", None)] if expected.thinking else []),
        ("text", None),
        *[("tool_use", params) for _, _, params in expected.calls],
    ]


@pytest.mark.anyio
async def test_model_argument_overrides_the_chunks_model() -> None:
    message, events = await _publish(_load("text_only.json"), model="served-as")
    assert message.model == "served-as"
    assert orjson.loads(events[0].data)["message"]["model"] == "served-as"
    assert orjson.loads(events[0].data)["message"]["usage"]["input_tokens"] == 0


@pytest.mark.anyio
async def test_empty_stream_is_an_empty_message() -> None:
    message, events = await _publish([])
    assert check(events) == []
    assert [e.event for e in events] == ["message_start", "ping", "message_delta", "message_stop"]
    assert message.model == ""
    assert message.stop_reason == "end_turn"


# -- the stop reason -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("finish_reason", "tool_calls", "stop_reason"),
    [
        ("stop", False, "end_turn"),
        ("stop", True, "tool_use"),
        (None, False, "end_turn"),
        (None, True, "tool_use"),
        ("", False, "end_turn"),
        ("length", False, "max_tokens"),
        ("length", True, "max_tokens"),
        ("tool_calls", True, "tool_use"),
        ("tool_calls", False, "tool_use"),
        ("function_call", True, "tool_use"),
        ("content_filter", False, "refusal"),
        ("content_filter", True, "refusal"),
        ("eos", False, "eos"),
        ("abort", True, "abort"),
    ],
)
def test_map_stop_reason(finish_reason: str | None, tool_calls: bool, stop_reason: str) -> None:
    assert map_stop_reason(finish_reason, tool_calls=tool_calls) == stop_reason


def test_map_stop_reason_default_is_without_tool_calls() -> None:
    assert map_stop_reason("stop") == "end_turn"


# -- an agent's rounds -----------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_stream_round_in_an_agent_loop(dialect: Dialect) -> None:
    sink = InMemorySink()
    publisher = Publisher(sink, dialect=dialect)
    async with stream_rounds(
        publisher, message_id="msg_1", stream_id="conv_1", model="m"
    ) as rounds:
        await rounds.round_start()
        first = await stream_round(rounds, _load("parallel_tool_calls.json"))
        # Results may come in any order; they go out in call order.
        for i in reversed(range(len(first.tool_calls))):
            await rounds.tool_result(i, {"city": first.tool_calls[i].input["city"], "temp": i})
        await rounds.round_end()

        await rounds.round_start()
        second = await stream_round(rounds, _objects("late_name.json"))
        for i in range(len(second.tool_calls)):
            await rounds.tool_result(i, "ok")
        await rounds.round_end()

        await rounds.round_start()
        third = await stream_round(rounds, _load("text_only.json"))
        await rounds.round_end()
        rounds.stop_reason = third.stop_reason
        rounds.output_tokens = third.usage["output_tokens"]

    assert check(sink.events) == []
    starts = [(i, kind) for event, i, kind in _blocks(sink.events) if event.endswith("start")]
    assert starts == [
        (0, "text"),
        (1, "tool_use"),
        (2, "tool_use"),
        (3, "tool_result"),
        (4, "tool_result"),
        # the second round starts at base + 2n = 5
        (5, "tool_use"),
        (6, "tool_use"),
        (7, "tool_result"),
        (8, "tool_result"),
        (9, "text"),
    ]
    assert first.stop_reason == second.stop_reason == "tool_use"
    assert third.stop_reason == "end_turn"
    # A call without an id gets one from its round's first index: unique in the message.
    assert [c.id for c in second.tool_calls] == ["call_5", "D681PevKs"]
    parsed = reassemble_events(sink.events)
    assert [(x.call.tool_use_id, x.result) for x in parsed.executions] == [
        ("call_Vq3mP0Wk2rT9", '{"city":"Paris","temp":0}'),
        ("call_Zl8nB4Yx1sQ6", '{"city":"São Paulo","temp":1}'),
        ("call_5", "ok"),
        ("D681PevKs", "ok"),
    ]
    assert parsed.text == first.text + third.text


@pytest.mark.anyio
async def test_round_end_without_answering_missing_results() -> None:
    # RoundStream.round_end(answer_missing=False), which publish relies on.
    sink = InMemorySink()
    publisher = Publisher(sink)
    await publisher.send_stream_preamble("msg_1", "conv_1", "m")
    rounds = RoundStream(publisher)
    await rounds.round_start()
    await rounds.delta(text="calling")
    calls = [ToolCallRequest(f"toolu_{i}", "f", "{}") for i in range(3)]
    await rounds.assistant_message(calls)  # declared, none started
    await rounds.tool_result(2, "held until 0 and 1 are out")
    summary = await rounds.round_end(answer_missing=False)
    await publisher.send_stream_epilogue("tool_use", 0)
    assert check(sink.events) == []
    starts = [(i, kind) for event, i, kind in _blocks(sink.events) if event.endswith("start")]
    # The result held behind calls 0 and 1 goes out at the round's end, not dropped: the
    # calls without one wait for a later message.
    kinds = ["text", "tool_use", "tool_use", "tool_use", "tool_result"]
    assert starts == list(enumerate(kinds))
    assert [c.result for c in summary.tool_calls] == [None, None, "held until 0 and 1 are out"]
    assert rounds.next_index == 5


@pytest.mark.anyio
async def test_generated_ids_stay_unique_across_messages_of_one_stream() -> None:
    sink = InMemorySink()
    publisher = Publisher(sink)
    chunks = [_chunk(tool_calls=[_call(0, name="f", arguments="{}")])]
    first = await publish(publisher, chunks, message_id="msg_a", stream_id="conv")
    second = await publish(publisher, chunks, message_id="msg_b", stream_id="conv")
    assert [c.id for c in first.tool_calls] == ["call_msg_a_0"]
    assert [c.id for c in second.tool_calls] == ["call_msg_b_0"]
    assert check(sink.events) == []


# -- odd but valid streams ------------------------------------------------------------------


@pytest.mark.anyio
async def test_name_after_arguments_holds_the_later_calls_back() -> None:
    chunks = [
        _chunk(tool_calls=[_call(0, id="call_a", arguments='{"x":')]),
        _chunk(tool_calls=[_call(1, id="call_b", name="g", arguments='{"y":2}')]),
        _chunk(tool_calls=[_call(0, name="f", arguments="1}")]),
        _chunk(tool_calls=[_call(1, arguments="")], finish_reason="tool_calls"),
    ]
    message, events = await _publish(chunks)
    assert check(events) == []
    assert [(c.id, c.name, c.input) for c in message.tool_calls] == [
        ("call_a", "f", {"x": 1}),
        ("call_b", "g", {"y": 2}),
    ]


@pytest.mark.anyio
async def test_repeated_and_empty_ids_get_generated_ones(caplog: pytest.LogCaptureFixture) -> None:
    chunks = [
        _chunk(tool_calls=[_call(0, id="call_same", name="f", arguments="{}")]),
        _chunk(tool_calls=[_call(1, id="call_same", name="f", arguments="{}")]),
        _chunk(tool_calls=[_call(2, id="", name="f", arguments="{}")]),
    ]
    with caplog.at_level(logging.WARNING, logger="essessey.adapters.openai"):
        message, events = await _publish(chunks)
    assert check(events) == []
    assert [c.id for c in message.tool_calls] == ["call_same", "call_msg_test_1", "call_msg_test_2"]
    assert "repeats an earlier call's id" in caplog.text


@pytest.mark.anyio
async def test_index_less_fragments_continue_by_id() -> None:
    # Some servers repeat the call's id (and name) on every fragment and send no index.
    chunks = [
        _chunk(tool_calls=[_call(None, id="c1", name="f", arguments='{"a"')]),
        _chunk(tool_calls=[_call(None, id="c1", arguments=":1}")]),
        _chunk(tool_calls=[_call(None, id="c2", name="g", arguments="{}")]),
        _chunk(tool_calls=[_call(None, arguments="")]),
    ]
    message, events = await _publish(chunks)
    assert check(events) == []
    assert [(c.id, c.input) for c in message.tool_calls] == [("c1", {"a": 1}), ("c2", {})]


@pytest.mark.anyio
async def test_reasoning_after_text_opens_a_new_thinking_block() -> None:
    chunks = [
        _chunk(reasoning="a"),
        _chunk(content="b"),
        _chunk(reasoning="c"),
        _chunk(content="d"),
    ]
    message, events = await _publish(chunks)
    assert check(events) == []
    starts = [(i, kind) for event, i, kind in _blocks(events) if event.endswith("start")]
    assert starts == [(0, "thinking"), (1, "text"), (2, "thinking"), (3, "text")]
    assert (message.thinking, message.text) == ("ac", "bd")


@pytest.mark.anyio
async def test_refusal_is_published_as_text() -> None:
    chunk = _chunk()
    chunk["choices"][0]["delta"]["refusal"] = "I can't help with that."
    message, events = await _publish([chunk])
    assert check(events) == []
    assert reassemble_events(events).text == message.text == "I can't help with that."


# -- what cannot go out, and is said so ------------------------------------------------------


@pytest.mark.anyio
async def test_text_after_a_call_is_a_block_after_it(caplog: pytest.LogCaptureFixture) -> None:
    chunks = [
        _chunk(content="before "),
        _chunk(tool_calls=[_call(0, id="c1", name="f", arguments="{}")]),
        _chunk(content=MARKER),
        _chunk(content=MARKER, finish_reason="tool_calls"),
    ]
    with caplog.at_level(logging.DEBUG):
        message, events = await _publish(chunks)
    assert check(events) == []
    assert message.text == reassemble_events(events).text == "before " + 2 * MARKER
    starts = [(i, kind) for event, i, kind in _blocks(events) if event.endswith("start")]
    assert starts == [(0, "text"), (1, "tool_use"), (2, "text")]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert MARKER not in _log_text(caplog)


@pytest.mark.anyio
async def test_fragments_for_a_closed_call_are_dropped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    chunks = [
        _chunk(tool_calls=[_call(0, id="c1", name="f", arguments='{"a":1}')]),
        _chunk(tool_calls=[_call(1, id="c2", name="g", arguments="{}")]),
        _chunk(tool_calls=[_call(0, arguments=MARKER)]),
    ]
    with caplog.at_level(logging.DEBUG):
        message, events = await _publish(chunks)
    assert check(events) == []
    assert [c.arguments for c in message.tool_calls] == ['{"a":1}', "{}"]
    assert [c.arguments for c in reassemble_events(events).tool_calls] == ['{"a":1}', "{}"]
    assert "already closed" in caplog.text
    assert MARKER not in _log_text(caplog)


@pytest.mark.anyio
async def test_a_call_that_never_gets_a_name_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    chunks = [
        _chunk(tool_calls=[_call(0, id="c1", arguments=MARKER)]),
        _chunk(tool_calls=[_call(1, id="c2", name="g", arguments="{}")]),
    ]
    with caplog.at_level(logging.DEBUG):
        message, events = await _publish(chunks)
    assert check(events) == []
    assert [(c.id, c.name) for c in message.tool_calls] == [("c2", "g")]
    assert f"never got a name; dropped with {len(MARKER)} characters" in caplog.text
    assert MARKER not in _log_text(caplog)


@pytest.mark.anyio
async def test_other_choices_are_skipped_with_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    chunk = _chunk(content="a")
    chunk["choices"].append({"index": 1, "delta": {"content": MARKER}, "finish_reason": None})
    with caplog.at_level(logging.DEBUG, logger="essessey.adapters.openai"):
        message, events = await _publish([chunk, chunk, chunk, _chunk(finish_reason="stop")])
    assert check(events) == []
    assert message.text == "aaa"
    records = [r for r in caplog.records if r.name == "essessey.adapters.openai"]
    assert len(records) == 1
    assert "only choice 0" in records[0].getMessage()
    assert MARKER not in _log_text(caplog)


@pytest.mark.anyio
async def test_a_stream_cut_inside_a_call_s_arguments_ends_with_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # No finish_reason and a call's arguments not whole JSON: the connection dropped.
    # It read as a whole tool_use message, with no log line.
    call = {"index": 0, "id": "call_1", "type": "function"}
    call["function"] = {"name": "delete_files", "arguments": '{"path": "/tmp/x'}
    with caplog.at_level(logging.WARNING, logger="essessey.adapters.openai"):
        _, events = await _publish([_chunk(content=""), _chunk(tool_calls=[call])])
    assert check(events) == []
    assert [e.event for e in events][-1] == "error"
    parsed = reassemble_events(events)
    assert not parsed.complete
    assert parsed.error is not None
    assert parsed.error.message == CUT_STREAM
    assert "without a finish_reason" in caplog.text


@pytest.mark.anyio
async def test_a_stream_without_a_finish_reason_but_whole_ends_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="essessey.adapters.openai"):
        _, events = await _publish([_chunk(content="all "), _chunk(content="there")])
    assert check(events) == []
    parsed = reassemble_events(events)
    assert parsed.complete
    assert parsed.text == "all there"
    assert "ended without a finish_reason after 2 chunks" in caplog.text


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_malformed_chunks_are_skipped_with_a_warning(
    dialect: Dialect, caplog: pytest.LogCaptureFixture
) -> None:
    good = _chunk(content="ok " + MARKER)
    bad: list[tuple[int, Any, str]] = [
        (0, MARKER, "the chunk is a str, not a mapping"),
        (1, {"choices": MARKER}, "choices is a str, not a list"),
        (2, _chunk(content=5), "choices[0].delta.content is a int, not a string"),  # type: ignore[arg-type]
        (4, _chunk(tool_calls=[{"index": "0", "function": {"arguments": MARKER}}]), "index"),
        (5, _chunk(tool_calls=[{"index": 0, "function": {"arguments": [MARKER]}}]), "arguments"),
        (6, {"choices": [None]}, "choices[0] is null"),
        (7, {"choices": [], "usage": {"prompt_tokens": MARKER}}, "usage.prompt_tokens"),
        (8, 42, "the chunk is a int"),
        (9, {"choices": [{"index": 0, "delta": {"reasoning": {"text": MARKER}}}]}, "reasoning"),
        (10, {"choices": [], "usage": {"completion_tokens": -1}}, "negative"),
        (11, _chunk(finish_reason=7), "finish_reason"),  # type: ignore[arg-type]
    ]
    chunks: list[Any] = [chunk for _, chunk, _ in bad]
    chunks.insert(3, good)
    chunks.append(_chunk(content="end", finish_reason="stop"))
    with caplog.at_level(logging.DEBUG):
        message, events = await _publish(chunks, dialect)
    assert check(events) == []
    assert message.text == reassemble_events(events).text == "ok " + MARKER + "end"
    assert message.model == "test-model"  # the first readable chunk names it
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == len(bad)
    for (position, _, reason), warning in zip(bad, warnings, strict=True):
        assert f"chunk {position}:" in warning
        assert reason in warning
    assert MARKER not in _log_text(caplog)


@pytest.mark.anyio
async def test_an_unreadable_sdk_object_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def model_dump(self) -> dict[str, Any]:
            raise ValueError(MARKER)

    with caplog.at_level(logging.WARNING):
        message, events = await _publish([Broken(), _chunk(content="x")])
    assert check(events) == []
    assert message.text == "x"
    assert "chunk 0: model_dump() failed with ValueError" in caplog.text
    assert MARKER not in caplog.text


# -- sources ------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_failing_source_ends_the_stream_with_an_error(dialect: Dialect) -> None:
    def chunks() -> Iterator[dict[str, Any]]:
        yield _chunk(content="partial")
        yield _chunk(tool_calls=[_call(0, id="c1", name="f", arguments='{"a"')])
        raise RuntimeError(MARKER)

    sink = InMemorySink()
    with pytest.raises(RuntimeError, match=MARKER):
        await publish(Publisher(sink, dialect=dialect), chunks(), message_id="m", stream_id="s")
    events = sink.events
    assert check(events) == []
    assert events[-1].event == "error"
    error = orjson.loads(events[-1].data)["error"]
    assert error["type"] == "api_error"
    assert "RuntimeError" in error["message"]
    assert MARKER not in error["message"]
    parsed = reassemble_events(events)
    assert parsed.text == "partial"
    assert parsed.error is not None
    assert not parsed.complete


@pytest.mark.anyio
async def test_a_source_failing_before_its_first_chunk_sends_only_the_error() -> None:
    async def chunks() -> AsyncIterator[dict[str, Any]]:
        raise ConnectionError(MARKER)
        yield {}  # pragma: no cover

    sink = InMemorySink()
    with pytest.raises(ConnectionError):
        await publish(Publisher(sink), chunks(), message_id="m", stream_id="s")
    assert [e.event for e in sink.events] == ["error"]
    assert check(sink.events) == []
    assert MARKER.encode() not in sink.events[0].data


@pytest.mark.anyio
@pytest.mark.parametrize("form", ["dicts", "objects"])
async def test_an_async_generator_source(form: str) -> None:
    fixture = _load("parallel_tool_calls.json") if form == "dicts" else _objects("late_name.json")

    async def chunks() -> AsyncIterator[Any]:
        for chunk in fixture:
            await anyio.lowlevel.checkpoint()
            yield chunk

    message, events = await _publish(chunks())
    expected, _ = await _publish(fixture)
    assert check(events) == []
    assert message == expected


@pytest.mark.anyio
async def test_stream_round_needs_an_open_round() -> None:
    rounds = RoundStream(Publisher(InMemorySink(), strict=False))
    with pytest.raises(RoundOrderError):
        await stream_round(rounds, [_chunk(content="x")])


# -- content survives any chunking ------------------------------------------------------------

_TEXT = 'Voilà: the "answer" is\n42 ☃ — done.'
_REASONING = "First think {about} it; then reply."
_ARGS = ['{"q": "naïve \\"quote\\"", "n": [1, 2.5, null]}', '{"deep": {"a": {"b": []}}}']


def _split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts})
    bounds = [0, *points, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


_cuts = st.lists(st.integers(min_value=0, max_value=60), max_size=12)


@settings(max_examples=100, deadline=None)
@given(
    reasoning_cuts=_cuts,
    text_cuts=_cuts,
    args_cuts=st.tuples(_cuts, _cuts),
    with_index=st.booleans(),
    dialect=st.sampled_from(DIALECTS),
)
def test_any_chunk_boundaries_give_the_same_content(
    reasoning_cuts: list[int],
    text_cuts: list[int],
    args_cuts: tuple[list[int], list[int]],
    with_index: bool,
    dialect: Dialect,
) -> None:
    chunks = [_chunk(reasoning=piece) for piece in _split(_REASONING, reasoning_cuts)]
    chunks += [_chunk(content=piece) for piece in _split(_TEXT, text_cuts)]
    for n, (args, cuts) in enumerate(zip(_ARGS, args_cuts, strict=True)):
        index = n if with_index else None
        pieces = _split(args, cuts)
        chunks.append(_chunk(tool_calls=[_call(index, id=f"c{n}", name="f", arguments=pieces[0])]))
        chunks += [_chunk(tool_calls=[_call(index, arguments=p)]) for p in pieces[1:]]
    chunks.append(_chunk(finish_reason="tool_calls"))

    message, events = anyio.run(lambda: _publish(chunks, dialect))
    assert check(events) == []
    parsed = reassemble_events(events)
    assert parsed.thinking == message.thinking == _REASONING
    assert parsed.text == message.text == _TEXT
    assert [c.arguments for c in parsed.tool_calls] == _ARGS
    assert [c.input for c in message.tool_calls] == [json.loads(a) for a in _ARGS]
    assert parsed.stop_reason == "tool_use"


_MARKER = "SECRET-PAYLOAD-7f3e"
_STRAY_CHUNK = st.one_of(
    st.builds(lambda: _chunk(content=_MARKER)),
    st.builds(lambda: _chunk(reasoning=_MARKER)),
    st.builds(
        lambda i, with_id, args: _chunk(
            tool_calls=[
                _call(
                    i,
                    id=f"x{i}" if with_id else None,
                    name="g" if with_id else None,
                    arguments=args,
                )
            ]
        ),
        st.one_of(st.none(), st.integers(-1, 4)),
        st.booleans(),
        st.sampled_from(['{"', _MARKER, "}", "]", "", '"' + _MARKER + '"}']),
    ),
    st.sampled_from(["stop", "tool_calls", "length", "content_filter", None]).map(
        lambda reason: _chunk(finish_reason=reason)
    ),
    st.just({"id": "chatcmpl-t", "object": "chat.completion.chunk", "choices": []}),
    st.just({"choices": "not a list"}),
    st.just({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": "0"}]}}]}),
    st.just({"choices": [{"index": 1, "delta": {"content": _MARKER}}]}),
)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), dialect=st.sampled_from(DIALECTS))
def test_a_mangled_stream_is_published_as_a_valid_stream(
    data: st.DataObject, dialect: Dialect
) -> None:
    # A stream's chunks lost, repeated and stray ones inserted anywhere: whatever comes of
    # it goes out as a stream every reader takes, and no payload reaches a log.
    chunks = [_chunk(reasoning=_REASONING[:10]), _chunk(reasoning=_REASONING[10:])]
    chunks += [_chunk(content=_TEXT[:5]), _chunk(content=_TEXT[5:])]
    for n, args in enumerate(_ARGS):
        chunks.append(_chunk(tool_calls=[_call(n, id=f"c{n}", name="f", arguments=args[:4])]))
        chunks.append(_chunk(tool_calls=[_call(n, arguments=args[4:])]))
    chunks.append(_chunk(finish_reason="tool_calls"))
    sent = mangled(data, chunks, _STRAY_CHUNK)

    async def published() -> list[Event]:
        return (await _publish(sent, dialect))[1]

    assert_published_quietly(published, _MARKER)


# -- interleaved parallel calls ---------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_held_fragments_go_out_one_delta_each(dialect: Dialect) -> None:
    chunks = [
        _chunk(tool_calls=[_call(0, id="call_0", name="f0", arguments='{"a":')]),
        _chunk(tool_calls=[_call(1, id="call_1", name="f1", arguments='{"b":')]),
        _chunk(tool_calls=[_call(1, arguments=" 2")]),
        _chunk(tool_calls=[_call(0, arguments=" 1}")]),
        _chunk(tool_calls=[_call(1, arguments="}")], finish_reason="tool_calls"),
    ]
    message, events = await _publish(chunks, dialect)
    assert check(events) == []
    # Call 1's first two fragments waited for call 0's arguments to be whole; they go
    # out as sent, one delta each, not joined into one.
    assert _tool_use_blocks(events) == [
        (0, "call_0", "f0", ['{"a":', " 1}"]),
        (1, "call_1", "f1", ['{"b":', " 2", "}"]),
    ]
    assert [c.input for c in message.tool_calls] == [{"a": 1}, {"b": 2}]


@pytest.mark.anyio
async def test_fragments_before_the_name_go_out_one_delta_each() -> None:
    _, events = await _publish(_load("late_name.json"))
    assert check(events) == []
    assert [parts for *_, parts in _tool_use_blocks(events)] == [
        ['{"id"', ": 7", "}"],
        ['{"id": 8}'],
    ]


@settings(max_examples=150, deadline=None)
@given(calls=interleavings(), dialect=st.sampled_from(DIALECTS))
def test_any_interleaving_of_parallel_calls_reassembles_each_call(
    calls: Interleaving, dialect: Dialect
) -> None:
    message, events = anyio.run(lambda: _publish(chat_chunks(calls), dialect))
    # The same shape as the Responses adapter's for the same interleaving.
    assert_each_call_whole(calls, message, events)


# -- no SDK needed --------------------------------------------------------------------------


def test_the_module_needs_no_openai_package() -> None:
    code = """
import sys

class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name == "openai" or name.startswith("openai."):
            raise ImportError("the openai package is not installed here")
        return None

sys.meta_path.insert(0, Blocked())
import anyio
import essessey.adapters.openai as adapter
from essessey import InMemorySink, Publisher

chunks = [{"model": "m", "choices": [{"index": 0, "delta": {"content": "hi"}}]}]
message = anyio.run(
    lambda: adapter.publish(Publisher(InMemorySink()), chunks, message_id="a", stream_id="b")
)
assert message.text == "hi", message
assert "openai" not in sys.modules
"""
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)


# -- citations -----------------------------------------------------------------------------


def _cited(annotations: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    chunk = _chunk(**fields)
    chunk["choices"][0]["delta"]["annotations"] = annotations
    return chunk


def _url(url: str, start: int = 0, end: int = 0) -> dict[str, Any]:
    fields = {"url": url, "title": "T", "start_index": start, "end_index": end}
    return {"type": "url_citation", "url_citation": fields | {"content": "page text"}}


@pytest.mark.anyio
async def test_annotations_are_citations_of_the_text_block() -> None:
    # OpenRouter's web search sends its sources first, with empty content; OpenAI's search
    # models, after the text they cite, with indexes into it. Either way a citation goes
    # out in the text block, after text, as the Anthropic format's web search citation.
    chunks = [
        _cited([_url("https://a.example")], content=""),
        _chunk(reasoning="Looking."),
        _chunk(content="Pydantic AI "),
        _chunk(content="is a framework."),
        _cited([_url("https://b.example", 0, 11), {"type": "file_citation", "file_id": "f"}]),
        _chunk(finish_reason="stop"),
    ]
    message, events = await _publish(chunks)
    assert check(events) == []
    citations = [
        orjson.loads(e.data)["delta"]["citation"] for e in events if b'"citations_delta"' in e.data
    ]
    assert citations == [
        {
            "type": "web_search_result_location",
            "url": "https://a.example",
            "title": "T",
            "cited_text": "",
            "encrypted_index": "",
            "start_index": 0,
            "end_index": 0,
        },
        {
            "type": "web_search_result_location",
            "url": "https://b.example",
            "title": "T",
            "cited_text": "Pydantic AI",
            "encrypted_index": "",
            "start_index": 0,
            "end_index": 11,
        },
        {"type": "file_citation", "file_id": "f"},
    ]
    parsed = reassemble_events(events)
    assert parsed.text == message.text == "Pydantic AI is a framework."
    assert parsed.thinking == "Looking."
    # The first waited for the text it follows: after the first text delta.
    kinds = [
        orjson.loads(e.data)["delta"]["type"] for e in events if e.event == "content_block_delta"
    ]
    assert kinds == [
        "thinking_delta",
        "text_delta",
        "citations_delta",
        "text_delta",
        "citations_delta",
        "citations_delta",
    ]


@pytest.mark.anyio
async def test_an_annotation_with_no_text_after_it_is_named_in_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    chunks = [
        _chunk(content="Hi."),
        _cited([_url("https://a.example")], reasoning="more thought"),
        _cited([{"type": "url_citation"}]),  # no url_citation object: malformed
        _chunk(finish_reason="stop"),
    ]
    with caplog.at_level(logging.WARNING, logger="essessey.adapters"):
        _, events = await _publish(chunks)
    assert check(events) == []
    # The reasoning closed the text block; no text came after the citation.
    assert b"citations_delta" not in b"".join(e.data for e in events)
    text = _log_text(caplog)
    assert "1 citations came with no text after them; not published" in text
    assert "choices[0].delta.annotations[0].url_citation is missing" in text
    assert "a.example" not in text


# -- reasoning details ---------------------------------------------------------------------


def _details(*details: dict[str, Any], **fields: Any) -> dict[str, Any]:
    chunk = _chunk(**fields)
    chunk["choices"][0]["delta"]["reasoning_details"] = list(details)
    return chunk


def _detail(text: str | None = None, signature: str | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {"type": "reasoning.text", "format": "anthropic-claude-v1"}
    if text is not None:
        found["text"] = text
    if signature is not None:
        found["signature"] = signature
    return found


@pytest.mark.anyio
async def test_reasoning_details_give_the_thinking_a_server_sends_only_there_and_its_signature(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Snowflake sends a Claude model's thinking only in reasoning_details; OpenRouter sends
    # it twice (reasoning and reasoning_details, the same text), then the signature.
    chunks = [
        _details(_detail("15 * 27")),
        _details(_detail(" = 405")),
        _details(_detail("Twice."), reasoning="Twice."),
        _details(_detail(signature="c2ln")),
        _details({"type": "reasoning.encrypted", "data": "gAAA", "format": "openai"}),
        _chunk(content="405"),
        _details(_detail(signature="late")),  # no reasoning open: not published
        _chunk(finish_reason="stop"),
    ]
    with caplog.at_level(logging.INFO, logger="essessey.adapters"):
        message, events = await _publish(chunks)
    assert check(events) == []
    [parsed] = reassemble_events(events).messages
    assert parsed.thinking == message.thinking == "15 * 27 = 405Twice."
    assert parsed.signature == "c2ln"
    assert parsed.text == "405"
    text = _log_text(caplog)
    assert "skipping reasoning details of type reasoning.encrypted" in text
    assert "a reasoning signature came with no reasoning before it; skipped" in text


@pytest.mark.anyio
async def test_audio_and_logprobs_the_protocol_cannot_carry_are_named_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # An audio answer's delta.audio and a choice's logprobs have no place in the
    # protocol: each is named once in an INFO line (no content), never silently lost.
    chunks = [_chunk(content="Hi"), _chunk(content=" there"), _chunk(finish_reason="stop")]
    for chunk in chunks[:2]:
        choice = chunk["choices"][0]
        choice["delta"]["audio"] = {"id": "audio_1", "transcript": "SECRET-transcript"}
        choice["logprobs"] = {"content": [{"token": "SECRET-token", "logprob": -0.1}]}
    with caplog.at_level(logging.INFO, logger="essessey.adapters.openai"):
        message, events = await _publish(chunks)
    assert check(events) == []
    assert message.text == "Hi there"
    lines = [r.getMessage() for r in caplog.records if "not published" in r.getMessage()]
    assert len([line for line in lines if "delta.audio" in line]) == 1
    assert len([line for line in lines if "logprobs" in line]) == 1
    assert "SECRET" not in caplog.text
