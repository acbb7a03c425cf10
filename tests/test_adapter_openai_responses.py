"""The OpenAI Responses API adapter: SDK-validated fixtures, odd servers, bad events."""

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
import openai
import orjson
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.responses import ResponseStreamEvent
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from essessey import (
    ApprovalRequest,
    Event,
    InMemorySink,
    ProviderStreamError,
    Publisher,
    RoundOrderError,
    check,
    reassemble_events,
)
from essessey.adapters import RoundStream, stream_rounds
from essessey.adapters.openai_responses import (
    FAILED_MESSAGE,
    INCOMPLETE_MESSAGE,
    PublishedResponse,
    map_stop_reason,
    publish,
    stream_round,
)
from essessey.bindings.sse import EventStreamResponse
from essessey.protocol import Dialect
from tests.adapter_views import (
    Interleaving,
    assert_each_call_whole,
    assert_published_quietly,
    block_starts,
    interleavings,
    mangled,
    responses_events,
)
from tests.adapter_views import blocks as _blocks
from tests.adapter_views import log_text as _log_text
from tests.servers import serve

MARKER = "SECRET-PAYLOAD-7f3e"  # in the fixtures' skipped events, and in test payloads
DIALECTS: list[Dialect] = ["essessey", "anthropic"]
FIXTURES = Path(__file__).parent / "fixtures" / "openai_responses"
ROOT = Path(__file__).parent.parent
LOGGER = "essessey.adapters.openai_responses"
EVENTS = pydantic.TypeAdapter(ResponseStreamEvent)


@dataclass(frozen=True)
class Expected:
    text: str = ""
    thinking: str = ""
    calls: tuple[tuple[str, str, str], ...] = ()  # (id, name, arguments as streamed)
    stop_reason: str | None = "end_turn"
    usage: tuple[tuple[str, int], ...] = ()
    model: str = ""
    error: tuple[str, str] | None = None  # (type, message) of the error that ended it


def _usage(given: int, cached: int, output: int, reasoning: int) -> tuple[tuple[str, int], ...]:
    return (
        ("input_tokens", given),
        ("cache_read_input_tokens", cached),
        ("output_tokens", output),
        ("reasoning_tokens", reasoning),
    )


EXPECTED: dict[str, Expected] = {
    "text_only.json": Expected(
        text="Hello, world! How can I help you today? éè ☃",
        usage=_usage(15, 10, 12, 0),  # 25 input tokens, 10 of them cached
        model="gpt-4.1-mini-2025-04-14",
    ),
    "reasoning_summary_then_text.json": Expected(
        text="2 + 2 = **4**.",
        # Two summary parts (two thinking blocks), exactly as the stream has them.
        thinking=(
            "**Adding numbers**\n\nThe user asks for 2+2, which is 4."
            "**Answering**\n\nReply briefly."
        ),
        usage=_usage(14, 0, 140, 128),
        model="o4-mini-2025-04-16",
    ),
    "reasoning_text_then_text.json": Expected(
        text="Hi there!",
        thinking="We need to greet the user. Keep it short.",
        usage=_usage(30, 0, 22, 15),
        model="gpt-oss-120b",
    ),
    "parallel_function_calls.json": Expected(
        text="I'll check both cities.",
        calls=(
            ("call_Vq3mP0Wk2rT9", "get_weather", '{"city": "Paris", "unit": "celsius"}'),
            ("call_Zl8nB4Yx1sQ6", "get_weather", '{"city": "São Paulo", "unit": "celsius"}'),
        ),
        stop_reason="tool_use",
        usage=_usage(82, 0, 51, 0),
        model="gpt-4.1-2025-04-14",
    ),
    "interleaved_function_calls.json": Expected(
        calls=(
            ("call_time_a", "get_time", '{"tz": "Europe/Paris"}'),
            ("call_time_b", "get_time", '{"tz": "America/Sao_Paulo"}'),
        ),
        stop_reason="tool_use",
        usage=_usage(28, 32, 40, 0),
        model="gpt-4.1-2025-04-14",
    ),
    "incomplete_max_output_tokens.json": Expected(
        text="Once upon a time, in a land far",
        stop_reason="max_tokens",
        usage=_usage(9, 0, 16, 0),
        model="gpt-4.1-mini-2025-04-14",
    ),
    "failed.json": Expected(
        text="Let me think about",
        stop_reason=None,
        usage=_usage(40, 0, 3, 0),
        model="gpt-4.1-2025-04-14",
        error=("server_error", "The server had an error while processing your request."),
    ),
    "error_event.json": Expected(
        stop_reason=None,
        model="gpt-4.1-2025-04-14",
        error=("rate_limit_exceeded", "Rate limit reached for requests. Please try again in 20s."),
    ),
    "hosted_tool_skipped.json": Expected(
        text=f"It is sunny in Paris {MARKER}.",
        usage=_usage(300, 0, 20, 0),
        model="gpt-4.1-2025-04-14",
    ),
    "refusal.json": Expected(
        text="I'm sorry, I can't help with that.",
        usage=_usage(18, 0, 9, 0),
        model="gpt-4o-2024-08-06",
    ),
    "final_answer.json": Expected(
        text="Paris: sunny, 21 °C. São Paulo: rain, 18 °C.",
        usage=_usage(76, 64, 18, 0),
        model="gpt-4.1-2025-04-14",
    ),
}


def _load(name: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = json.loads((FIXTURES / name).read_text())
    return events


def _objects(name: str) -> list[Any]:
    """The fixture as the SDK's event objects."""
    return [EVENTS.validate_python(event) for event in _load(name)]


async def _publish(
    events: Any, dialect: Dialect = "essessey", **kwargs: Any
) -> tuple[PublishedResponse, list[Event]]:
    sink = InMemorySink()
    message = await publish(
        Publisher(sink, dialect=dialect),
        events,
        message_id="msg_test",
        stream_id="conv_1",
        **kwargs,
    )
    return message, sink.events


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# -- building events by hand (each one a valid SDK event; see the test below) -----------------

_SEQ = itertools.count()


def _event(type_: str, **fields: Any) -> dict[str, Any]:
    return {"type": type_, "sequence_number": next(_SEQ), **fields}


def _response(status: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": "resp_t",
        "object": "response",
        "created_at": 1,
        "status": status,
        "model": "test-model",
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        **extra,
    }


def _created(model: str = "test-model") -> dict[str, Any]:
    return _event("response.created", response=_response("in_progress", model=model))


def _completed(
    usage: dict[str, Any] | None = None, output: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    extra: dict[str, Any] = {"output": output or []}
    if usage is not None:
        extra["usage"] = usage
    return _event("response.completed", response=_response("completed", **extra))


def _incomplete(reason: str) -> dict[str, Any]:
    return _event(
        "response.incomplete",
        response=_response("incomplete", incomplete_details={"reason": reason}),
    )


def _text(delta: str, item: str = "msg_1", out: int = 0, part: int = 0) -> dict[str, Any]:
    return _event(
        "response.output_text.delta",
        item_id=item,
        output_index=out,
        content_index=part,
        delta=delta,
        logprobs=[],
    )


def _text_done(text: str, item: str = "msg_1", out: int = 0, part: int = 0) -> dict[str, Any]:
    return _event(
        "response.output_text.done",
        item_id=item,
        output_index=out,
        content_index=part,
        text=text,
        logprobs=[],
    )


def _summary(delta: str, item: str = "rs_1", out: int = 0, part: int = 0) -> dict[str, Any]:
    return _event(
        "response.reasoning_summary_text.delta",
        item_id=item,
        output_index=out,
        summary_index=part,
        delta=delta,
    )


def _summary_done(text: str, item: str = "rs_1", out: int = 0, part: int = 0) -> dict[str, Any]:
    return _event(
        "response.reasoning_summary_text.done",
        item_id=item,
        output_index=out,
        summary_index=part,
        text=text,
    )


def _call_item(out: int, arguments: str = "", *, name: str = "f", **fields: Any) -> dict[str, Any]:
    item = {
        "id": f"fc_{out}",
        "type": "function_call",
        "call_id": f"call_{out}",
        "name": name,
        "arguments": arguments,
        "status": "in_progress",
    }
    item.update(fields)
    return item


def _added(item: dict[str, Any], out: int) -> dict[str, Any]:
    return _event("response.output_item.added", output_index=out, item=item)


def _item_done(item: dict[str, Any], out: int) -> dict[str, Any]:
    return _event(
        "response.output_item.done", output_index=out, item={**item, "status": "completed"}
    )


def _args(out: int, delta: str) -> dict[str, Any]:
    return _event(
        "response.function_call_arguments.delta", item_id=f"fc_{out}", output_index=out, delta=delta
    )


def _args_done(out: int, arguments: str) -> dict[str, Any]:
    return _event(
        "response.function_call_arguments.done",
        item_id=f"fc_{out}",
        output_index=out,
        arguments=arguments,
    )


def _message_item(text: str, item: str = "msg_1") -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": []}
    return {
        "id": item,
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [part],
    }


def test_the_hand_built_events_are_sdk_events() -> None:
    item = _call_item(1, '{"a": 1}')
    usage = {
        "input_tokens": 1,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 2,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 3,
    }
    for event in [
        _created(),
        _completed(usage, [_message_item("x"), item]),
        _incomplete("max_output_tokens"),
        _text("a"),
        _text_done("a"),
        _summary("b"),
        _summary_done("b"),
        _added(item, 1),
        _item_done(item, 1),
        _args(1, "{"),
        _args_done(1, "{}"),
    ]:
        EVENTS.validate_python(event)


# -- the fixtures -----------------------------------------------------------------------------


def test_every_fixture_has_expectations() -> None:
    assert sorted(p.name for p in FIXTURES.glob("*.json")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_events_are_sdk_events(name: str) -> None:
    events = _load(name)
    assert events
    for event in events:
        parsed = EVENTS.validate_python(event)
        assert parsed.type == event["type"]
        # What the adapter reads of an SDK object is what the API sent.
        assert parsed.model_dump(mode="json", exclude_unset=True) == event


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("form", ["dicts", "objects"])
@pytest.mark.parametrize("name", sorted(EXPECTED))
async def test_fixture_publishes_one_valid_message(name: str, form: str, dialect: Dialect) -> None:
    expected = EXPECTED[name]
    events = _load(name) if form == "dicts" else _objects(name)
    message, published = await _publish(events, dialect)

    assert check(published) == []
    parsed = reassemble_events(published)
    assert parsed.message_id == "msg_test"
    assert parsed.model == expected.model
    assert parsed.text == expected.text
    assert parsed.thinking == expected.thinking
    assert [(c.tool_use_id, c.name, c.arguments) for c in parsed.tool_calls] == list(expected.calls)
    assert [c.params for c in parsed.tool_calls] == [json.loads(a) for _, _, a in expected.calls]
    assert parsed.tool_results == ()  # one response: its calls' results come later
    assert parsed.stop_reason == expected.stop_reason
    usage = dict(expected.usage)
    if expected.error is None:
        assert parsed.complete
        assert parsed.error is None
        assert {key: parsed.usage.get(key) for key in usage} == usage
        assert [e.event for e in published[-2:]] == ["message_delta", "message_stop"]
    else:
        # The error ends the message: not complete, no message_delta or message_stop.
        assert not parsed.complete
        assert parsed.error is not None
        assert (parsed.error.type, parsed.error.message) == expected.error
        assert published[-1].event == "error"
        assert not {"message_delta", "message_stop"} & {e.event for e in published}

    assert message.message_id == "msg_test"
    assert message.model == expected.model
    assert message.text == expected.text
    assert message.thinking == expected.thinking
    assert [(c.id, c.name, c.arguments) for c in message.tool_calls] == list(expected.calls)
    assert message.stop_reason == expected.stop_reason
    assert message.usage == usage
    assert message.response_id is not None
    assert message.response_id.startswith("resp_")
    if expected.error is None:
        assert message.error is None
    else:
        assert message.error == {"type": expected.error[0], "message": expected.error[1]}
        assert message.status == "failed"


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_function_calls_stream_each_fragment_at_its_index(dialect: Dialect) -> None:
    _, events = await _publish(_load("parallel_function_calls.json"), dialect)
    start, delta, stop = "content_block_start", "content_block_delta", "content_block_stop"
    assert _blocks(events) == [
        (start, 0, "text"),
        *[(delta, 0, "text")] * 2,
        (stop, 0, "text"),
        (start, 1, "tool_use"),
        *[(delta, 1, "tool_use")] * 4,  # one input_json_delta per fragment, as they came
        (stop, 1, "tool_use"),
        (start, 2, "tool_use"),
        *[(delta, 2, "tool_use")] * 4,
        (stop, 2, "tool_use"),
    ]
    kinds = {orjson.loads(e.data)["delta"]["type"] for e in events if e.event == delta}
    assert kinds == {"text_delta", "input_json_delta"}
    assert [e.event for e in events[:2]] == ["message_start", "ping"]


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_interleaved_calls_stream_the_first_live_and_hold_the_other(
    dialect: Dialect,
) -> None:
    fixture = _load("interleaved_function_calls.json")
    seen: list[tuple[str, int]] = []  # (what, how many events were out) as the source is read

    sink = InMemorySink()

    def source() -> Iterator[dict[str, Any]]:
        for event in fixture:
            seen.append((event["type"], len(sink.events)))
            yield event

    await publish(Publisher(sink, dialect=dialect), source(), message_id="m", stream_id="s")
    events = sink.events
    assert check(events) == []
    partial = [
        (i, orjson.loads(e.data)["delta"]["partial_json"])
        for e in events
        if e.event == "content_block_delta"
        for i in [orjson.loads(e.data)["index"]]
    ]
    # Every fragment of each call at its block, in the order it came; none merged.
    assert partial == [
        (0, '{"tz"'),
        (0, ': "Europe/'),
        (0, 'Paris"}'),
        (1, '{"tz": '),
        (1, '"America/'),
        (1, 'Sao_Paulo"'),
        (1, "}"),
    ]
    # The first call's fragments went out as they came; the second's waited until the
    # first's arguments were whole (at its last fragment).
    last_a = max(
        n
        for n, event in enumerate(fixture)
        if event["type"] == "response.function_call_arguments.delta" and event["output_index"] == 0
    )
    out = [(e.event, orjson.loads(e.data).get("index")) for e in events[: seen[last_a][1]]]
    assert ("content_block_start", 1) not in out
    assert out.count(("content_block_delta", 0)) == 2


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_later_call_done_first_waits_for_the_earlier_one(dialect: Dialect) -> None:
    a, b = _call_item(1), _call_item(2, name="g")
    events = [
        _created(),
        _added(a, 1),
        _added(b, 2),
        _args(2, '{"b":'),
        _args(1, '{"a":'),
        _args(2, " 2}"),
        _args_done(2, '{"b": 2}'),
        _item_done({**b, "arguments": '{"b": 2}'}, 2),
        _args(1, " 1}"),
        _args_done(1, '{"a": 1}'),
        _item_done({**a, "arguments": '{"a": 1}'}, 1),
        _completed(),
    ]
    message, published = await _publish(events, dialect)
    assert check(published) == []
    parsed = reassemble_events(published)
    assert [(c.tool_use_id, c.name, c.arguments) for c in parsed.tool_calls] == [
        ("call_1", "f", '{"a": 1}'),
        ("call_2", "g", '{"b": 2}'),
    ]
    assert [c.input for c in message.tool_calls] == [{"a": 1}, {"b": 2}]
    assert parsed.stop_reason == "tool_use"


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_held_calls_go_out_in_output_order(dialect: Dialect) -> None:
    a, b, c = _call_item(1), _call_item(2, name="g"), _call_item(3, name="h")
    events = [
        _added(a, 1),
        _args(1, '{"a":'),
        _added(c, 3),  # announced before b, but after it in the output
        _args(3, '{"c": 3}'),
        _added(b, 2),
        _args(2, '{"b": 2}'),
        _args(1, " 1}"),
        _completed(),
    ]
    message, published = await _publish(events, dialect)
    assert check(published) == []
    parsed = reassemble_events(published)
    assert [(c.tool_use_id, c.arguments) for c in parsed.tool_calls] == [
        ("call_1", '{"a": 1}'),
        ("call_2", '{"b": 2}'),
        ("call_3", '{"c": 3}'),
    ]
    assert [c.id for c in message.tool_calls] == ["call_1", "call_2", "call_3"]


@pytest.mark.anyio
@pytest.mark.parametrize(
    "name", ["parallel_function_calls.json", "reasoning_summary_then_text.json"]
)
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
    # One thinking block per reasoning part, first; then the answer and the calls.
    parts = [b.thinking for b in message.content if b.type == "thinking"]
    assert "".join(parts) == expected.thinking
    assert blocks[: len(parts)] == [("thinking", None)] * len(parts)
    assert blocks[len(parts) :] == [
        ("text", None),
        *[("tool_use", json.loads(arguments)) for _, _, arguments in expected.calls],
    ]


@pytest.mark.anyio
@pytest.mark.parametrize(
    "name", ["interleaved_function_calls.json", "failed.json", "error_event.json"]
)
async def test_the_openai_sdks_own_stream_is_read(name: str) -> None:
    # The SDK's AsyncStream, reading a server that sends the fixture as the API does.
    async def responses(request: Request) -> StreamingResponse:
        async def body() -> AsyncIterator[bytes]:
            for event in _load(name):
                yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()

        return StreamingResponse(body(), media_type="text/event-stream")

    expected = EXPECTED[name]
    app = Starlette(routes=[Route("/v1/responses", responses, methods=["POST"])])
    with serve(app) as base_url:
        client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="test", max_retries=0)
        async with client:
            stream = await client.responses.create(model="m", input="hi", stream=True)
            message, published = await _publish(stream)
    assert check(published) == []
    assert [(c.id, c.name, c.arguments) for c in message.tool_calls] == list(expected.calls)
    assert message.text == expected.text
    assert message.stop_reason == expected.stop_reason
    assert message.usage == dict(expected.usage)
    if expected.error is not None:
        assert message.error == {"type": expected.error[0], "message": expected.error[1]}


# -- the model name, the stop reason ----------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_the_model_argument_is_the_fallback(dialect: Dialect) -> None:
    # The response names its model: that one goes out.
    message, events = await _publish(_load("text_only.json"), dialect, model="served-as")
    assert message.model == "gpt-4.1-mini-2025-04-14"
    assert orjson.loads(events[0].data)["message"]["model"] == message.model
    assert orjson.loads(events[0].data)["message"]["usage"]["input_tokens"] == 0
    # No model in the stream: the argument, else "".
    bare = [_text("hi"), _completed()]
    message, events = await _publish(bare, dialect, model="served-as")
    assert message.model == reassemble_events(events).model == "served-as"
    message, events = await _publish(bare, dialect)
    assert message.model == reassemble_events(events).model == ""
    assert check(events) == []


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_stream_without_a_terminal_event_ends_with_an_error(
    dialect: Dialect, caplog: pytest.LogCaptureFixture
) -> None:
    # Nothing at all, or content cut off before response.completed: never a success.
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        message, events = await _publish([], dialect)
    assert check(events) == []
    assert [e.event for e in events] == ["error"]
    assert message.error == {"type": "api_error", "message": INCOMPLETE_MESSAGE}
    assert "without a terminal event" in caplog.text
    message, events = await _publish([_text("cut here")], dialect)
    assert check(events) == []
    parsed = reassemble_events(events)
    assert parsed.text == message.text == "cut here"
    assert not parsed.complete
    assert parsed.error is not None
    assert parsed.error.message == INCOMPLETE_MESSAGE


@pytest.mark.parametrize(
    ("status", "reason", "tool_calls", "stop_reason"),
    [
        ("completed", None, False, "end_turn"),
        ("completed", None, True, "tool_use"),
        (None, None, False, "end_turn"),
        (None, None, True, "tool_use"),
        ("", None, False, "end_turn"),
        ("incomplete", "max_output_tokens", False, "max_tokens"),
        ("incomplete", "max_output_tokens", True, "max_tokens"),
        ("incomplete", "content_filter", False, "refusal"),
        ("incomplete", "content_filter", True, "refusal"),
        ("incomplete", "max_messages", True, "end_turn"),
        ("incomplete", None, False, "end_turn"),
        ("cancelled", None, False, "cancelled"),
    ],
)
def test_map_stop_reason(
    status: str | None, reason: str | None, tool_calls: bool, stop_reason: str
) -> None:
    assert map_stop_reason(status, reason, tool_calls=tool_calls) == stop_reason


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_incomplete_for_a_content_filter_is_a_refusal(dialect: Dialect) -> None:
    a = _call_item(1, '{"x": 1}')
    events = [_created(), _text("Here is"), _added(a, 1), _incomplete("content_filter")]
    message, published = await _publish(events, dialect)
    assert check(published) == []
    parsed = reassemble_events(published)
    assert parsed.complete
    assert parsed.stop_reason == message.stop_reason == "refusal"  # its calls are not to run
    assert message.incomplete_reason == "content_filter"
    assert [c.arguments for c in parsed.tool_calls] == ['{"x": 1}']


# -- failures ---------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_failure_mid_call_publishes_what_waits_and_ends_with_the_error(
    dialect: Dialect,
) -> None:
    a = _call_item(1)
    events = [
        _created(),
        _text("Calling."),
        _added(a, 1),
        _args(1, '{"a"'),
        _text("held", item="msg_2", out=2),  # waits for the open call: out before the error
        _event(
            "response.failed",
            response=_response("failed", error={"code": "server_error", "message": "boom"}),
        ),
        _text("never read"),
    ]
    message, published = await _publish(events, dialect)
    assert check(published) == []
    names = [e.event for e in published]
    assert names[-2:] == ["content_block_stop", "error"]
    parsed = reassemble_events(published)
    assert not parsed.complete
    assert parsed.error is not None
    assert (parsed.error.type, parsed.error.message) == ("server_error", "boom")
    assert message.stop_reason is None
    assert message.error == {"type": "server_error", "message": "boom"}
    assert [(c.id, c.arguments) for c in message.tool_calls] == [("call_1", '{"a"')]
    assert message.text == parsed.text == "Calling.held"


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_an_error_before_anything_sends_only_the_error(dialect: Dialect) -> None:
    # No model known yet, no content: the message never started.
    events = [_event("error", code=None, message="Something went wrong.", param=None)]
    message, published = await _publish(events, dialect)
    assert check(published) == []
    assert [e.event for e in published] == ["error"]
    assert orjson.loads(published[0].data)["error"] == {
        "type": "api_error",
        "message": "Something went wrong.",
    }
    assert message.error == {"type": "api_error", "message": "Something went wrong."}


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_an_error_with_odd_fields_still_ends_the_message(dialect: Dialect) -> None:
    events = [
        _created(),
        {"type": "error", "message": "bad \ud800 text", "code": 42},  # not an SDK event
    ]
    message, published = await _publish(events, dialect)
    assert check(published) == []
    parsed = reassemble_events(published)
    assert parsed.error is not None
    assert (parsed.error.type, parsed.error.message) == ("api_error", "bad \ufffd text")
    failed = [_created(), _event("response.failed", response=_response("failed"))]
    message, published = await _publish(failed, dialect)
    assert check(published) == []
    assert message.error == {"type": "api_error", "message": FAILED_MESSAGE}


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_failing_source_ends_the_stream_with_an_error(dialect: Dialect) -> None:
    def events() -> Iterator[dict[str, Any]]:
        yield _created()
        yield _text("partial")
        raise RuntimeError(MARKER)

    sink = InMemorySink()
    with pytest.raises(RuntimeError, match=MARKER):
        await publish(Publisher(sink, dialect=dialect), events(), message_id="m", stream_id="s")
    published = sink.events
    assert check(published) == []
    error = orjson.loads(published[-1].data)["error"]
    assert error["type"] == "api_error"
    assert "RuntimeError" in error["message"]
    assert MARKER not in error["message"]
    parsed = reassemble_events(published)
    assert parsed.text == "partial"
    assert not parsed.complete


# -- done values, and servers that send only them ---------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_done_values_fill_in_what_the_deltas_left_out(
    dialect: Dialect, caplog: pytest.LogCaptureFixture
) -> None:
    a, b, c, d = _call_item(1), _call_item(2), _call_item(3), _call_item(4)
    events = [
        _created(),
        _summary("Think"),
        _summary_done("Think hard."),  # a delta went missing: the rest goes out
        _text_done("Answer."),  # no deltas at all
        _added(a, 1),
        _args_done(1, '{"a": 1}'),  # no fragments: the done value is the arguments
        _added(b, 2),
        _args(2, '{"b": 2}'),
        _args_done(2, '{"b": 3}'),  # whole JSON that differs: the fragments win
        _added(c, 3),
        _args(3, '{"c": 1'),
        _added(d, 4),  # held while c streams
        _args(4, '{"d": [1,'),
        _args_done(4, '{"d": [3]}'),  # not whole, differs, not out yet: the done value wins
        _args_done(3, '{"c": 1}'),  # a prefix: the rest is one more fragment
        _completed(),
    ]
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        message, published = await _publish(events, dialect)
    assert check(published) == []
    parsed = reassemble_events(published)
    assert parsed.thinking == message.thinking == "Think hard."
    assert parsed.text == message.text == "Answer."
    assert [(c.tool_use_id, c.arguments) for c in parsed.tool_calls] == [
        ("call_1", '{"a": 1}'),
        ("call_2", '{"b": 2}'),
        ("call_3", '{"c": 1}'),
        ("call_4", '{"d": [3]}'),
    ]
    assert [c.arguments for c in message.tool_calls] == [c.arguments for c in parsed.tool_calls]
    assert "the done value (10 characters) replaces them" in caplog.text
    assert "which are whole JSON and kept" in caplog.text


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_live_call_whose_done_value_differs_keeps_what_went_out(
    dialect: Dialect, caplog: pytest.LogCaptureFixture
) -> None:
    a = _call_item(1)
    events = [_added(a, 1), _args(1, '{"a": '), _args_done(1, '{"b": 1}'), _completed()]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        message, published = await _publish(events, dialect)
    assert check(published) == []
    assert [c.arguments for c in reassemble_events(published).tool_calls] == ['{"a": ']
    assert [(c.arguments, c.input) for c in message.tool_calls] == [('{"a": ', None)]
    assert "went out and differ from the done value" in caplog.text


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_response_sent_whole_in_its_terminal_event(dialect: Dialect) -> None:
    # A server that streams nothing but the lifecycle: the output of response.completed
    # is all there is.
    output = [
        {"id": "rs_1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "Hm."}]},
        _message_item("Calling f."),
        {**_call_item(2, '{"q": 1}'), "status": "completed"},
    ]
    usage = {
        "input_tokens": 5,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 7,
        "output_tokens_details": {"reasoning_tokens": 2},
        "total_tokens": 12,
    }
    events = [_created(), _completed(usage, output)]
    for event in events:
        EVENTS.validate_python(event)
    message, published = await _publish(events, dialect)
    assert check(published) == []
    parsed = reassemble_events(published)
    assert (parsed.thinking, parsed.text) == ("Hm.", "Calling f.")
    assert [(c.tool_use_id, c.name, c.params) for c in parsed.tool_calls] == [
        ("call_2", "f", {"q": 1})
    ]
    assert parsed.stop_reason == "tool_use"
    assert message.usage == {
        "input_tokens": 5,
        "cache_read_input_tokens": 0,
        "output_tokens": 7,
        "reasoning_tokens": 2,
    }


# -- what cannot go out, and is said so -------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_text_after_a_call_is_a_block_after_it(
    dialect: Dialect, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = _call_item(1), _call_item(3, name="g")
    events = [
        _text("before "),
        _added(a, 1),
        _args(1, '{"a":'),
        # Text while the call's arguments are not whole: held until they are.
        _text(MARKER, item="msg_2", out=2),
        _summary("thinking on", item="rs_2", out=2),
        _args(1, " 1}"),
        _args_done(1, '{"a": 1}'),
        _text_done(MARKER * 2, item="msg_2", out=2),  # the rest, from the done value
        _added(b, 3),
        _args(3, "{}"),
        _completed(),
    ]
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        message, published = await _publish(events, dialect)
    assert check(published) == []
    parsed = reassemble_events(published)
    assert parsed.text == message.text == "before " + MARKER * 2
    assert parsed.thinking == message.thinking == "thinking on"
    assert [(c.tool_use_id, c.arguments) for c in parsed.tool_calls] == [
        ("call_1", '{"a": 1}'),
        ("call_3", "{}"),
    ]
    starts = [(i, kind) for event, i, kind in _blocks(published) if event.endswith("start")]
    assert starts == [
        (0, "text"),
        (1, "tool_use"),
        (2, "text"),
        (3, "thinking"),
        (4, "text"),
        (5, "tool_use"),
    ]
    assert _warnings(caplog) == []
    assert MARKER not in _log_text(caplog)


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_fragments_for_a_done_call_are_dropped_with_a_warning(
    dialect: Dialect, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = _call_item(1), _call_item(2)
    events = [
        _added(a, 1),
        _args(1, '{"a": 1}'),
        _args_done(1, '{"a": 1}'),
        _added(b, 2),
        _args(1, MARKER),
        _args(2, "{}"),
        _completed(),
    ]
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        message, published = await _publish(events, dialect)
    assert check(published) == []
    assert [c.arguments for c in message.tool_calls] == ['{"a": 1}', "{}"]
    assert [c.arguments for c in reassemble_events(published).tool_calls] == ['{"a": 1}', "{}"]
    assert "19 characters of arguments came for function calls already closed" in caplog.text
    assert "(first in event #4); they cannot go out" in caplog.text
    assert MARKER not in _log_text(caplog)


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_calls_without_a_name_or_an_id(
    dialect: Dialect, caplog: pytest.LogCaptureFixture
) -> None:
    events = [
        _args(1, MARKER),  # a call never announced: no name
        _added(_call_item(2, "{}", call_id=""), 2),  # no call id: one is generated
        _added(_call_item(3, "{}", call_id="call_2x"), 3),
        _added(_call_item(4, "{}", call_id="call_2x"), 4),  # repeated: generated
        _completed(),
    ]
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        message, published = await _publish(events, dialect)
    assert check(published) == []
    assert [c.id for c in message.tool_calls] == ["call_msg_test_0", "call_2x", "call_msg_test_2"]
    assert [c.tool_use_id for c in reassemble_events(published).tool_calls] == [
        "call_msg_test_0",
        "call_2x",
        "call_msg_test_2",
    ]
    assert f"never got a name; dropped with {len(MARKER)} characters" in caplog.text
    assert "repeats an earlier call's id" in caplog.text
    assert MARKER not in _log_text(caplog)


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_unknown_events_are_skipped_with_one_log_line_per_type(
    dialect: Dialect, caplog: pytest.LogCaptureFixture
) -> None:
    events = _load("hosted_tool_skipped.json")
    future = {"type": "response.future_thing.delta", "delta": MARKER, "output_index": 1}
    events[3:3] = [future, future]
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        message, published = await _publish(events, dialect)
    assert check(published) == []
    assert message.text == reassemble_events(published).text == f"It is sunny in Paris {MARKER}."
    records = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    # The hosted web search is published (a server tool block and its result); its
    # progress events are read quietly, its item's done carries them whole.
    assert records == [
        "skipping Responses API events of type response.future_thing.delta (first at event #3): "
        "not published",
    ]
    assert all(r.levelno == logging.INFO for r in caplog.records if r.name == LOGGER)
    assert MARKER not in _log_text(caplog)


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_malformed_events_are_skipped_with_a_warning(
    dialect: Dialect, caplog: pytest.LogCaptureFixture
) -> None:
    bad_call = _call_item(1, name=MARKER)
    bad_call["call_id"] = 7
    bad: list[tuple[int, Any, str]] = [
        (0, MARKER, "the event is a str, not a mapping"),
        (1, {"delta": MARKER}, "(?): it has no type"),
        (2, {"type": 5, "delta": MARKER}, "type is a int, not a string"),
        (3, {**_text("x"), "delta": 5}, "delta is a int, not a string"),
        (5, {**_text("x"), "delta": None}, "delta is missing"),
        (6, _text(MARKER + "\ud800"), "delta holds a lone surrogate"),
        (7, {**_summary("x"), "summary_index": "0"}, "summary_index is a str, not an integer"),
        (8, {**_args(1, "{}"), "output_index": 2**64}, "output_index does not fit in 64 bits"),
        (9, _added(bad_call, 1), "item.call_id is a int, not a string"),
        (10, _event("response.output_item.added", output_index=1), "item is missing"),
        (11, {**_args(1, "{}"), "output_index": None, "item_id": None}, "neither output_index"),
        (12, _event("response.created", response=MARKER), "response is a str, not an object"),
        (13, 42, "the event is a int"),
        (
            14,
            _completed({"input_tokens": -1}),
            "(response.completed): response.usage.input_tokens is negative",
        ),
    ]
    events: list[Any] = [event for _, event, _ in bad]
    events.insert(4, _text("ok " + MARKER))
    events += [
        _completed(
            {"input_tokens": 2**70, "output_tokens": 1},
        ),
        _completed({"input_tokens": 3, "output_tokens": 4}),
    ]
    bad.append((15, None, "response.usage.input_tokens does not fit in 64 bits"))
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        message, published = await _publish(events, dialect)
    assert check(published) == []
    assert message.text == reassemble_events(published).text == "ok " + MARKER
    assert message.model == ""  # the only response.created was unreadable
    assert message.usage == {"input_tokens": 3, "output_tokens": 4}
    warnings = _warnings(caplog)
    assert len(warnings) == len(bad)
    for (position, _, reason), warning in zip(bad, warnings, strict=True):
        assert f"skipping Responses API event #{position} " in warning
        assert reason in warning
    assert MARKER not in _log_text(caplog)


@pytest.mark.anyio
async def test_an_unreadable_sdk_object_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def model_dump(self, **options: Any) -> dict[str, Any]:
            raise ValueError(MARKER)

    class Plain:
        def model_dump(self) -> dict[str, Any]:  # takes no options
            return _text("y")

    with caplog.at_level(logging.WARNING):
        message, events = await _publish([Broken(), _text("x"), Plain(), _completed()])
    assert check(events) == []
    assert message.text == "xy"
    assert "event #0 (?): model_dump() failed with ValueError" in caplog.text
    assert MARKER not in caplog.text


@pytest.mark.anyio
async def test_events_after_the_terminal_event_are_skipped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        message, events = await _publish([_text("a"), _completed(), _text(MARKER)])
    assert check(events) == []
    assert message.text == "a"
    assert "event #2 (response.output_text.delta): it came after the response ended" in (
        caplog.text
    )
    assert MARKER not in caplog.text


# -- reasoning --------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_each_reasoning_part_is_a_thinking_block_of_its_own(dialect: Dialect) -> None:
    events = [
        _summary("**A**", part=0),
        _summary("**B**\n", part=1),
        _summary("**C**\n\n", item="rs_2", out=1),  # another item: a new part too
        _summary("**D**", item="rs_2", out=1, part=1),
        _event(
            "response.reasoning_text.delta",
            item_id="rs_2",
            output_index=1,
            content_index=0,
            delta="raw",
        ),
        _text("answer"),
        _summary("after text", item="rs_3", out=2),  # a new thinking block: no break
        _completed(),
    ]
    message, published = await _publish(events, dialect)
    assert check(published) == []
    parsed = reassemble_events(published)
    # Nothing added to what the provider sent: each part is its own block.
    assert parsed.thinking == message.thinking == "**A****B**\n**C**\n\n**D**rawafter text"
    thinking = [item.text for item in parsed.timeline if item.kind == "thinking"]
    assert thinking == ["**A**", "**B**\n", "**C**\n\n", "**D**", "raw", "after text"]
    starts = [(i, kind) for event, i, kind in _blocks(published) if event.endswith("start")]
    assert starts == [*((i, "thinking") for i in range(5)), (5, "text"), (6, "thinking")]


# -- sources ----------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("form", ["dicts", "objects"])
async def test_an_async_generator_source(form: str, dialect: Dialect) -> None:
    name = (
        "interleaved_function_calls.json" if form == "dicts" else "reasoning_summary_then_text.json"
    )
    fixture = _load(name) if form == "dicts" else _objects(name)

    async def events() -> AsyncIterator[Any]:
        for event in fixture:
            await anyio.lowlevel.checkpoint()
            yield event

    message, published = await _publish(events(), dialect)
    expected, expected_events = await _publish(fixture, dialect)
    assert check(published) == []
    assert message == expected
    assert [e.data for e in published] == [e.data for e in expected_events]


# -- an agent's rounds ------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_stream_round_in_an_agent_loop(dialect: Dialect) -> None:
    sink = InMemorySink()
    publisher = Publisher(sink, dialect=dialect)
    async with stream_rounds(
        publisher, message_id="msg_1", stream_id="conv_1", model="m"
    ) as rounds:
        await rounds.round_start()
        first = await stream_round(rounds, _load("parallel_function_calls.json"))
        # Results may come in any order; they go out in call order.
        for i in reversed(range(len(first.tool_calls))):
            await rounds.tool_result(i, {"city": first.tool_calls[i].input["city"], "temp": i})
        await rounds.round_end()

        await rounds.round_start()
        second = await stream_round(rounds, _objects("final_answer.json"))
        await rounds.round_end()
        rounds.stop_reason = second.stop_reason
        rounds.output_tokens = first.usage["output_tokens"] + second.usage["output_tokens"]

    assert check(sink.events) == []
    starts = [(i, kind) for event, i, kind in _blocks(sink.events) if event.endswith("start")]
    assert starts == [
        (0, "text"),
        (1, "tool_use"),
        (2, "tool_use"),
        (3, "tool_result"),
        (4, "tool_result"),
        (5, "text"),
    ]
    assert (first.stop_reason, second.stop_reason) == ("tool_use", "end_turn")
    assert (first.status, second.status) == ("completed", "completed")
    assert first.model == "gpt-4.1-2025-04-14"
    assert first.response_id == "resp_tools01"
    parsed = reassemble_events(sink.events)
    assert parsed.complete
    assert [(x.call.tool_use_id, x.result) for x in parsed.executions] == [
        ("call_Vq3mP0Wk2rT9", '{"city":"Paris","temp":0}'),
        ("call_Zl8nB4Yx1sQ6", '{"city":"São Paulo","temp":1}'),
    ]
    assert parsed.text == first.text + second.text
    assert parsed.stop_reason == "end_turn"
    assert parsed.usage["output_tokens"] == 51 + 18


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_failed_response_ends_the_turn_of_stream_rounds(dialect: Dialect) -> None:
    sink = InMemorySink()
    publisher = Publisher(sink, dialect=dialect)

    async def turn() -> None:
        async with stream_rounds(
            publisher, message_id="msg_1", stream_id="conv_1", model="m"
        ) as rounds:
            await rounds.round_start()
            await stream_round(rounds, _load("text_only.json"))
            await rounds.round_end()
            await rounds.round_start()
            await stream_round(rounds, _load("failed.json"))

    with pytest.raises(ProviderStreamError) as caught:
        await turn()
    assert caught.value.error_type == "server_error"
    assert caught.value.message == EXPECTED["failed.json"].error[1]  # type: ignore[index]
    assert "server_error" in str(caught.value)
    assert check(sink.events) == []
    parsed = reassemble_events(sink.events)
    assert not parsed.complete
    assert parsed.error is not None
    assert parsed.text.startswith(EXPECTED["text_only.json"].text)


@pytest.mark.anyio
async def test_stream_round_needs_an_open_round() -> None:
    rounds = RoundStream(Publisher(InMemorySink(), strict=False))
    with pytest.raises(RoundOrderError):
        await stream_round(rounds, [_text("x")])


# -- gateways that rename items: each part published once -------------------------------------

_GW_THINKING = "**Plan**\n\nLook it up, then answer."
_GW_TEXT = "The answer is 42, as the table in section 3 shows; the rest follows from it."


def _pieces(text: str, size: int = 7) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _reasoning_item(text: str, item: str) -> dict[str, Any]:
    return {"id": item, "type": "reasoning", "summary": [{"type": "summary_text", "text": text}]}


def _gateway_renames_reasoning_in_its_output() -> list[dict[str, Any]]:
    return [
        _created(),
        *[_summary(p, item="rs_stream", out=0) for p in _pieces(_GW_THINKING)],
        _summary_done(_GW_THINKING, item="rs_stream", out=0),
        *[_text(p, item="msg_1", out=1) for p in _pieces(_GW_TEXT)],
        _text_done(_GW_TEXT, item="msg_1", out=1),
        _completed(
            output=[_reasoning_item(_GW_THINKING, "rs_final"), _message_item(_GW_TEXT, "msg_1")]
        ),
    ]


def _gateway_mints_an_id_per_event() -> list[dict[str, Any]]:
    ids = (f"id_{n}" for n in itertools.count())
    return [
        _created(),
        *[_summary(p, item=next(ids), out=0) for p in _pieces(_GW_THINKING)],
        _summary_done(_GW_THINKING, item=next(ids), out=0),
        _item_done(_reasoning_item(_GW_THINKING, next(ids)), 0),
        *[_text(p, item=next(ids), out=1) for p in _pieces(_GW_TEXT)],
        _text_done(_GW_TEXT, item=next(ids), out=1),
        _item_done(_message_item(_GW_TEXT, next(ids)), 1),
        _completed(
            output=[
                _reasoning_item(_GW_THINKING, next(ids)),
                _message_item(_GW_TEXT, next(ids)),
            ]
        ),
    ]


def _done_events_name_another_id_at_the_same_index() -> list[dict[str, Any]]:
    return [
        _created(),
        *[_summary(p, item="rs_1", out=0) for p in _pieces(_GW_THINKING)],
        _summary_done(_GW_THINKING, item="rs_other", out=0),
        *[_text(p, item="msg_1", out=1) for p in _pieces(_GW_TEXT)],
        _text_done(_GW_TEXT, item="msg_other", out=1),
        _item_done(_message_item(_GW_TEXT, "msg_third"), 1),
        _completed(),
    ]


def _deltas_without_indexes() -> list[dict[str, Any]]:
    def bare(event: dict[str, Any]) -> dict[str, Any]:
        return {
            k: v
            for k, v in event.items()
            if k not in ("output_index", "content_index", "summary_index")
        }

    return [
        _created(),
        *[bare(_summary(p, item="rs_1")) for p in _pieces(_GW_THINKING)],
        _summary_done(_GW_THINKING, item="rs_1", out=0),
        *[bare(_text(p, item="msg_1")) for p in _pieces(_GW_TEXT)],
        _text_done(_GW_TEXT, item="msg_1", out=1),
        _completed(
            output=[_reasoning_item(_GW_THINKING, "rs_1"), _message_item(_GW_TEXT, "msg_1")]
        ),
    ]


_GATEWAYS = {
    "renamed-reasoning-in-terminal-output": _gateway_renames_reasoning_in_its_output,
    "an-id-per-event": _gateway_mints_an_id_per_event,
    "done-events-name-another-id": _done_events_name_another_id_at_the_same_index,
    "deltas-without-indexes": _deltas_without_indexes,
}


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("shape", list(_GATEWAYS))
async def test_a_part_a_gateway_renames_is_published_once(
    shape: str, dialect: Dialect, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        message, published = await _publish(_GATEWAYS[shape](), dialect)
    assert check(published) == []
    parsed = reassemble_events(published)
    assert parsed.thinking == message.thinking == _GW_THINKING
    assert parsed.text == message.text == _GW_TEXT
    assert [item.kind for item in parsed.timeline] == ["thinking", "text"]
    assert _warnings(caplog) == []


@pytest.mark.anyio
async def test_a_done_text_that_disagrees_is_not_published_beside_the_streamed_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The rule: what streamed is kept; a done value that extends it adds the rest; one
    # that differs is logged by its length, and never published as a second copy.
    events = [
        _created(),
        *[_text(p, item="msg_a", out=0) for p in _pieces(_GW_TEXT)],
        _text_done(_GW_TEXT.upper(), item="msg_b", out=0),
        _completed(output=[_message_item(_GW_TEXT.upper(), "msg_c")]),
    ]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        message, published = await _publish(events)
    assert reassemble_events(published).text == message.text == _GW_TEXT
    assert [r for r in _warnings(caplog) if "differs from its deltas" in r] == [
        f"event #{len(events) - 2}: a message part's done text ({len(_GW_TEXT)} characters) "
        f"differs from its deltas ({len(_GW_TEXT)} characters); the streamed text is kept"
    ]
    assert _GW_TEXT.upper() not in caplog.text


# -- content survives any split of its deltas -------------------------------------------------

_TEXT = 'Voilà: the "answer" is\n42 ☃ — done.'
_SUMMARIES = ("**Plan**\n\nThink {about} it;", "**Reply**\n\nthen answer.")
_ARGS = ('{"q": "naïve \\"quote\\"", "n": [1, 2.5, null]}', '{"deep": {"a": {"b": []}}}')
_TAIL = " And after the calls: ☃."


def _split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts})
    bounds = [0, *points, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def _interleave(a: list[Any], b: list[Any], picks: list[bool]) -> list[Any]:
    merged, i, j = [], 0, 0
    for pick in itertools.chain(picks, itertools.repeat(True)):
        if i == len(a) and j == len(b):
            return merged
        if (pick and i < len(a)) or j == len(b):
            merged.append(a[i])
            i += 1
        else:
            merged.append(b[j])
            j += 1
    raise AssertionError("unreachable")  # pragma: no cover


_cuts = st.lists(st.integers(min_value=0, max_value=60), max_size=12)


@settings(max_examples=100, deadline=None)
@given(
    summary_cuts=st.tuples(_cuts, _cuts),
    text_cuts=_cuts,
    args_cuts=st.tuples(_cuts, _cuts),
    picks=st.lists(st.booleans(), max_size=30),
    tail_cuts=_cuts,
    tail_picks=st.lists(st.booleans(), max_size=40),
    whole_output=st.booleans(),
    dialect=st.sampled_from(DIALECTS),
)
def test_any_split_of_the_deltas_gives_the_same_content(
    summary_cuts: tuple[list[int], list[int]],
    text_cuts: list[int],
    args_cuts: tuple[list[int], list[int]],
    picks: list[bool],
    tail_cuts: list[int],
    tail_picks: list[bool],
    whole_output: bool,
    dialect: Dialect,
) -> None:
    events: list[dict[str, Any]] = [_created()]
    for part, (summary, cuts) in enumerate(zip(_SUMMARIES, summary_cuts, strict=True)):
        events += [_summary(piece, part=part) for piece in _split(summary, cuts)]
        events.append(_summary_done(summary, part=part))
    events += [_text(piece, out=1) for piece in _split(_TEXT, text_cuts)]
    events.append(_text_done(_TEXT, out=1))
    calls = [_call_item(2), _call_item(3, name="g")]
    events += [_added(calls[0], 2), _added(calls[1], 3)]
    pieces = [_split(args, cuts) for args, cuts in zip(_ARGS, args_cuts, strict=True)]
    # Both calls in flight: their fragments interleaved any way, and a message after
    # them in the output whose text comes while they stream.
    fragments = _interleave(
        [_args(2, p) for p in pieces[0]], [_args(3, p) for p in pieces[1]], picks
    )
    tail = [_text(piece, item="msg_4", out=4) for piece in _split(_TAIL, tail_cuts)]
    events += _interleave(fragments, tail, tail_picks)
    for out, args, call in zip((2, 3), _ARGS, calls, strict=True):
        events += [_args_done(out, args), _item_done({**call, "arguments": args}, out)]
    output = [_message_item(_TEXT, item="msg_1")] if whole_output else []
    events.append(_completed(output=output))

    message, published = anyio.run(lambda: _publish(events, dialect))
    assert check(published) == []
    parsed = reassemble_events(published)
    thinking = _SUMMARIES[0] + _SUMMARIES[1]
    assert parsed.thinking == message.thinking == thinking
    assert parsed.text == message.text == _TEXT + _TAIL
    assert [item.kind for item in parsed.timeline] == [
        "thinking",
        "thinking",
        "text",
        "tool_use",
        "tool_use",
        "text",
    ]
    assert [c.arguments for c in parsed.tool_calls] == list(_ARGS)
    assert [c.input for c in message.tool_calls] == [json.loads(a) for a in _ARGS]
    # Every fragment went out as it came: none merged, none dropped.
    deltas = [
        orjson.loads(e.data)["delta"]
        for e in published
        if e.event == "content_block_delta"
        and orjson.loads(e.data)["delta"]["type"] == "input_json_delta"
    ]
    assert len(deltas) == len(pieces[0]) + len(pieces[1])
    assert parsed.stop_reason == "tool_use"
    assert parsed.complete


@settings(max_examples=150, deadline=None)
@given(calls=interleavings(), dialect=st.sampled_from(DIALECTS))
def test_any_interleaving_of_parallel_calls_reassembles_each_call(
    calls: Interleaving, dialect: Dialect
) -> None:
    events = responses_events(calls)
    for event in events:
        EVENTS.validate_python(event)  # what the SDK would yield
    message, published = anyio.run(lambda: _publish(events, dialect))
    # The same shape as the chat adapter's for the same interleaving.
    assert_each_call_whole(calls, message, published)


# -- no SDK needed ----------------------------------------------------------------------------


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
import essessey.adapters.openai_responses as adapter
from essessey import InMemorySink, Publisher

events = [
    {"type": "response.output_text.delta", "delta": "hi"},
    {"type": "response.completed", "response": {"model": "m"}},
]
message = anyio.run(
    lambda: adapter.publish(Publisher(InMemorySink()), events, message_id="a", stream_id="b")
)
assert message.text == "hi", message
assert "openai" not in sys.modules
"""
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)


# -- calls the client must answer ------------------------------------------------------------


def _through_the_responses_dialect(published: list[Event], response_id: str) -> list[Any]:
    """The published events as the Responses dialect writes them, each read back by the
    openai SDK (raises when it cannot)."""
    from essessey.dialects.responses import ResponsesEncoder

    encoder = ResponsesEncoder(response_id)
    body = b"".join(encoder.encode(event) for event in published) + encoder.finish()
    return [
        EVENTS.validate_json(line[6:])
        for frame in body.split(b"\n\n")
        for line in frame.split(b"\n")
        if line.startswith(b"data: {")
    ]


_CLIENT_ITEMS: list[tuple[dict[str, Any], str, str, dict[str, Any]]] = [
    # (the item whole, the call's id, its tool_use name, its input)
    (
        {
            "type": "custom_tool_call",
            "id": "ctc_1",
            "call_id": "call_c",
            "name": "grammar",
            "input": "SELECT 1;",
        },
        "call_c",
        "grammar",
        {"input": "SELECT 1;"},
    ),
    (
        {
            "type": "apply_patch_call",
            "id": "apc_1",
            "call_id": "call_p",
            "status": "completed",
            "operation": {"type": "update_file", "path": "a.py", "diff": "@@ -1 +1 @@\n-a\n+b\n"},
        },
        "call_p",
        "apply_patch",
        {"operation": {"type": "update_file", "path": "a.py", "diff": "@@ -1 +1 @@\n-a\n+b\n"}},
    ),
    (
        {
            "type": "shell_call",
            "id": "sh_1",
            "call_id": "call_s",
            "status": "completed",
            "action": {"commands": ["ls -la"], "timeout_ms": 1000},
        },
        "call_s",
        "shell",
        {"action": {"commands": ["ls -la"], "timeout_ms": 1000}},
    ),
    (
        {
            "type": "local_shell_call",
            "id": "lsh_1",
            "call_id": "call_l",
            "status": "completed",
            "action": {"type": "exec", "command": ["echo", "hi"], "env": {}},
        },
        "call_l",
        "local_shell",
        {"action": {"type": "exec", "command": ["echo", "hi"], "env": {}}},
    ),
    (
        {
            "type": "tool_search_call",
            "id": "ts_1",
            "call_id": "call_t",
            "execution": "client",
            "arguments": {"query": "weather"},
        },
        "call_t",
        "tool_search",
        {"arguments": {"query": "weather"}},
    ),
    (
        {
            "type": "computer_call",
            "id": "cu_1",
            "call_id": "call_u",
            "status": "completed",
            "action": {"type": "click", "button": "left", "x": 10, "y": 20},
            "pending_safety_checks": [],
        },
        "call_u",
        "computer",
        {
            "action": {"type": "click", "button": "left", "x": 10, "y": 20},
            "pending_safety_checks": [],
        },
    ),
]


def _partial(item: dict[str, Any]) -> dict[str, Any]:
    """The item as output_item.added announces it: its input not there yet."""
    return {k: v for k, v in item.items() if k not in ("input", "operation", "action")}


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "terminal-only"])
async def test_calls_the_client_must_answer_are_tool_use_blocks(
    dialect: Dialect, streamed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    events: list[dict[str, Any]] = [_created(), _text("Doing it.", out=0)]
    output = [_message_item("Doing it.")]
    for out, (item, _, _, _) in enumerate(_CLIENT_ITEMS, 1):
        output.append(item)
        if streamed:
            events.append(_added(_partial(item), out))
            if item["type"] == "custom_tool_call":
                events.append(
                    _event(
                        "response.custom_tool_call_input.delta",
                        item_id=item["id"],
                        output_index=out,
                        delta=item["input"],
                    )
                )
            events.append(_event("response.output_item.done", output_index=out, item=item))
    # A hosted tool search (run by the provider) is not the client's to answer.
    output.append({"type": "tool_search_call", "id": "ts_9", "execution": "server"})
    events.append(_completed(output=output))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        message, published = await _publish(events, dialect)
    assert check(published) == []
    parsed = reassemble_events(published)
    assert parsed.text == "Doing it."
    expected = [(call_id, name, params) for _, call_id, name, params in _CLIENT_ITEMS]
    assert [(c.tool_use_id, c.name, c.params) for c in parsed.tool_calls] == expected
    assert [(c.id, c.name, c.input) for c in message.tool_calls] == expected
    assert parsed.stop_reason == message.stop_reason == "tool_use"
    assert "custom_tool_call_input" not in caplog.text
    assert _warnings(caplog) == []


@pytest.mark.anyio
async def test_calls_the_client_must_answer_go_back_out_as_the_items_they_were() -> None:
    # Responses API events -> the protocol -> the Responses dialect: each call comes back
    # as its own item type with its fields, and the openai SDK reads every event.
    output = [item for item, _, _, _ in _CLIENT_ITEMS]
    _, published = await _publish([_created(), _completed(output=output)])
    parsed = reassemble_events(published)
    assert [c.item_type for c in parsed.tool_calls] == [item["type"] for item in output]
    events = _through_the_responses_dialect(published, "resp_rt")
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [item.type for item in done] == [item["type"] for item in output]
    for written, (_, call_id, _, fields) in zip(done, _CLIENT_ITEMS, strict=True):
        back = written.model_dump(mode="json", exclude_none=True)
        assert {k: back[k] for k in fields} == fields
        assert back.get("call_id", back["id"]) == call_id
    assert not any(e.type == "response.function_call_arguments.delta" for e in events)


_MCP_APPROVAL = {
    "type": "mcp_approval_request",
    "id": "mcpr_1",
    "server_label": "deepwiki",
    "name": "ask_question",
    "arguments": '{"q":"x"}',
}


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "terminal-only"])
async def test_an_mcp_approval_request_is_the_protocol_s_approval_of_its_call(
    dialect: Dialect, streamed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    # The provider asks before it runs an MCP tool: the call is a tool_use block
    # (item_type mcp_call) and an approval_request block (the provider's request id)
    # gates it, so that an mcp_approval_response answers it (docs/asking.md).
    events: list[dict[str, Any]] = [_created(), _text("Checking.", out=0)]
    if streamed:
        events.append(_added(_MCP_APPROVAL, 1))
        events.append(_event("response.output_item.done", output_index=1, item=_MCP_APPROVAL))
    events.append(_completed(output=[_message_item("Checking."), _MCP_APPROVAL]))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        message, published = await _publish(events, dialect)
    assert check(published) == []
    parsed = reassemble_events(published)
    [call] = parsed.tool_calls
    assert (call.tool_use_id, call.name, call.arguments, call.item_type) == (
        "mcpr_1_call",
        "ask_question",
        '{"q":"x"}',
        "mcp_call",
    )
    assert parsed.pending == (
        ApprovalRequest("mcpr_1", "mcpr_1_call", "ask_question", {"q": "x"}, '{"q":"x"}'),
    )
    assert parsed.stop_reason == message.stop_reason == "tool_use"
    assert [c.id for c in message.tool_calls] == ["mcpr_1_call"]
    assert _warnings(caplog) == []


@pytest.mark.anyio
async def test_an_mcp_approval_request_goes_back_out_as_one() -> None:
    # Responses API events -> the protocol -> the Responses dialect: the approval request
    # again, answered by its own id; the call it gates is not written as a function_call.
    _, published = await _publish([_created(), _completed(output=[_MCP_APPROVAL])])
    events = _through_the_responses_dialect(published, "resp_mcp")
    done = [e.item for e in events if e.type == "response.output_item.done"]
    [item] = done
    back = item.model_dump(mode="json", exclude_none=True)
    assert {k: back[k] for k in ("type", "id", "name", "arguments")} == {
        k: _MCP_APPROVAL[k] for k in ("type", "id", "name", "arguments")
    }
    # The provider's server label is not carried by the protocol's blocks.
    assert back["server_label"] == "essessey"
    assert events[-1].type == "response.completed"


# -- hosted tools -----------------------------------------------------------------------------

_HOSTED_ITEMS = [
    {
        "id": "ws_1",
        "type": "web_search_call",
        "status": "completed",
        "action": {"type": "search", "query": "weather paris"},
    },
    {
        "id": "ci_1",
        "type": "code_interpreter_call",
        "status": "completed",
        "code": "print(1 + 1)",
        "container_id": "cntr_1",
        "outputs": [{"type": "logs", "logs": "2"}],
    },
    {
        "id": "mcp_1",
        "type": "mcp_call",
        "server_label": "wiki",
        "name": "ask",
        "arguments": '{"q":"x"}',
        "output": "an answer",
    },
]


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_hosted_tools_are_server_tool_blocks_with_their_results(
    dialect: Dialect, caplog: pytest.LogCaptureFixture
) -> None:
    events: list[dict[str, Any]] = [_created()]
    for out, item in enumerate(_HOSTED_ITEMS):
        events.append(_added({**item, "status": "in_progress"}, out))
        events.append(
            _event(f"response.{item['type']}.in_progress", item_id=item["id"], output_index=out)
        )
        events.append(_event("response.output_item.done", output_index=out, item=item))
    events += [_text("Done.", item="msg_9", out=3), _text_done("Done.", item="msg_9", out=3)]
    # The terminal output lists them again: each goes out once.
    events.append(_completed(output=[*_HOSTED_ITEMS, _message_item("Done.", "msg_9")]))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        message, published = await _publish(events, dialect)
    assert check(published) == []
    starts = block_starts(published)
    assert [(b["type"], b.get("name")) for b in starts] == [
        ("server_tool_use", "web_search"),
        ("web_search_tool_result", None),
        ("server_tool_use", "code_interpreter"),
        ("code_interpreter_tool_result", None),
        ("server_tool_use", "mcp"),
        ("mcp_tool_result", None),
        ("text", None),
    ]
    assert starts[0]["input"] == {"action": {"type": "search", "query": "weather paris"}}
    assert starts[2]["input"] == {"code": "print(1 + 1)", "container_id": "cntr_1"}
    assert starts[4]["input"] == {"server_label": "wiki", "name": "ask", "arguments": '{"q":"x"}'}
    assert [b["content"] for b in starts[1:6:2]] == _HOSTED_ITEMS
    assert [b["tool_use_id"] for b in starts[1:6:2]] == ["ws_1", "ci_1", "mcp_1"]
    assert message.text == "Done."
    assert message.stop_reason == "end_turn"
    assert "skipping" not in caplog.text


@pytest.mark.anyio
async def test_hosted_tools_go_back_out_as_the_items_they_were() -> None:
    events = [_created(), _completed(output=[*_HOSTED_ITEMS, _message_item("Done.", "msg_9")])]
    _, published = await _publish(events)
    frames = _through_the_responses_dialect(published, "resp_hosted")
    done = [e for e in frames if e.type == "response.output_item.done"]
    assert [e.output_index for e in done] == [0, 1, 2, 3]
    back = [e.item.model_dump(mode="json", exclude_none=True) for e in done[:3]]
    for written, sent in zip(back, _HOSTED_ITEMS, strict=True):
        assert {k: written[k] for k in sent} == sent
    assert done[3].item.type == "message"
    final = frames[-1]
    assert final.type == "response.completed"
    assert [item.type for item in final.response.output] == [
        "web_search_call",
        "code_interpreter_call",
        "mcp_call",
        "message",
    ]


def _compaction(encrypted: str | None, item: str = "cmp_1") -> dict[str, Any]:
    given: dict[str, Any] = {"id": item, "type": "compaction"}
    if encrypted is not None:
        given["encrypted_content"] = encrypted
    return given


def _compacted_turn(done: dict[str, Any]) -> list[dict[str, Any]]:
    """A response that compacts the conversation, then answers: its compaction item's
    added event carries content of its own, its done event (and the terminal output)
    the item whole."""
    return [
        _created(),
        _added(_compaction("enc-added"), 0),
        _event("response.compaction.compacting", item_id="cmp_1", output_index=0),
        _event("response.output_item.done", output_index=0, item=done),
        _text("Hi.", item="msg_2", out=1),
        _text_done("Hi.", item="msg_2", out=1),
        _completed(output=[done, _message_item("Hi.", "msg_2")]),
    ]


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_compaction_item_is_a_compaction_block_once_whole(
    dialect: Dialect, caplog: pytest.LogCaptureFixture
) -> None:
    # What a client that keeps no state with the provider must send back: the compacted
    # conversation, from the item whole (its done event), published once although the
    # terminal output lists it again.
    with caplog.at_level(logging.INFO, logger=LOGGER):
        message, published = await _publish(_compacted_turn(_compaction("enc-whole")), dialect)
    assert check(published) == []
    starts = block_starts(published)
    assert starts[0] == {"type": "compaction", "content": None, "encrypted_content": "enc-whole"}
    assert [b["type"] for b in starts] == ["compaction", "text"]
    assert message.text == "Hi."
    assert message.stop_reason == "end_turn"
    assert "compaction" not in caplog.text  # read, not skipped
    assert "enc-" not in caplog.text


@pytest.mark.anyio
async def test_a_compaction_item_without_its_content_is_skipped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    events = _compacted_turn(_compaction(None))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        message, published = await _publish(events)
    assert check(published) == []
    assert {b[2] for b in _blocks(published)} == {"text"}
    assert message.text == "Hi."
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2  # its done event, and the terminal output's item
    assert all("encrypted_content" in r.getMessage() for r in warnings)


@pytest.mark.anyio
async def test_a_compaction_goes_back_out_as_the_item_it_was() -> None:
    _, published = await _publish(_compacted_turn(_compaction("enc-whole")))
    frames = _through_the_responses_dialect(published, "resp_cmp")
    done = [e for e in frames if e.type == "response.output_item.done"]
    assert [e.item.type for e in done] == ["compaction", "message"]
    item = done[0].item
    assert isinstance(item, openai.types.responses.ResponseCompactionItem)
    assert item.encrypted_content == "enc-whole"
    added = [e for e in frames if e.type == "response.output_item.added"]
    assert added[0].item.type == "compaction"
    assert added[0].output_index == done[0].output_index == 0
    final = frames[-1]
    assert final.type == "response.completed"
    assert [i.type for i in final.response.output] == ["compaction", "message"]
    assert final.response.output[0].encrypted_content == "enc-whole"


# Programmatic tool calling: the model writes a program the provider runs, whose calls
# of the client's functions name it as their caller, and its output is an item of a later
# response once those calls have their outputs.
_PROGRAM = {
    "id": "cm_1",
    "type": "program",
    "call_id": "call_prog",
    "code": "text(await tools.lookup({q: 1}))",
    "fingerprint": "fp-opaque",
}
_PROGRAM_CALL = {
    "id": "fc_1",
    "type": "function_call",
    "status": "in_progress",
    "arguments": "",
    "call_id": "call_look",
    "caller": {"type": "program", "caller_id": "call_prog"},
    "name": "lookup",
}
_PROGRAM_OUTPUT = {
    "id": "cmo_1",
    "type": "program_output",
    "status": "completed",
    "call_id": "call_prog",
    "result": "42",
}


def _program_turns() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The response that writes the program and makes its call, and the one after the
    call's output: the program's output, then the answer."""
    arguments = '{"q": 1}'
    first = [
        _created(),
        _added({**_PROGRAM, "code": ""}, 0),
        _event("response.output_item.done", output_index=0, item=_PROGRAM),
        _added(_PROGRAM_CALL, 1),
        _event(
            "response.function_call_arguments.delta",
            item_id="fc_1",
            output_index=1,
            delta=arguments,
        ),
        _item_done({**_PROGRAM_CALL, "arguments": arguments}, 1),
        _completed(output=[_PROGRAM, {**_PROGRAM_CALL, "arguments": arguments}]),
    ]
    second = [
        _created(),
        _added({**_PROGRAM_OUTPUT, "result": ""}, 0),
        _event("response.output_item.done", output_index=0, item=_PROGRAM_OUTPUT),
        _text("Found it.", item="msg_2", out=1),
        _text_done("Found it.", item="msg_2", out=1),
        _completed(output=[_PROGRAM_OUTPUT, _message_item("Found it.", "msg_2")]),
    ]
    return first, second


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_program_and_its_calls_are_published_with_what_made_them(
    dialect: Dialect, caplog: pytest.LogCaptureFixture
) -> None:
    first, second = _program_turns()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        message, published = await _publish(first, dialect)
        answer, answered = await _publish(second, dialect)
    assert check(published) == []
    assert check(answered) == []
    assert caplog.text == ""  # nothing skipped
    starts = block_starts(published)
    assert starts[0] == {
        "type": "server_tool_use",
        "id": "cm_1",
        "name": "programmatic_tool_calling",
        "input": {"code": _PROGRAM["code"]},
        "item_type": "program",
    }
    assert starts[1]["content"] == _PROGRAM  # the provider's item whole, fingerprint too
    assert starts[2]["caller"] == {"type": "program", "caller_id": "call_prog"}
    [call] = reassemble_events(published).tool_calls
    assert (call.tool_use_id, call.params, call.caller) == (
        "call_look",
        {"q": 1},
        {"type": "program", "caller_id": "call_prog"},
    )
    assert message.stop_reason == "tool_use"  # the client runs the program's call
    later = block_starts(answered)
    assert [b["type"] for b in later] == [
        "server_tool_use",
        "programmatic_tool_calling_tool_result",
        "text",
    ]
    assert later[1]["content"] == _PROGRAM_OUTPUT
    assert answer.text == "Found it."


@pytest.mark.anyio
@pytest.mark.parametrize("caller", ["program", {"type": "program", "caller_id": 2**70}])
async def test_a_caller_that_cannot_be_read_is_left_out_and_the_call_kept(
    caller: object, caplog: pytest.LogCaptureFixture
) -> None:
    call = {**_PROGRAM_CALL, "caller": caller}
    events = [
        _created(),
        _added(call, 0),
        _item_done({**call, "arguments": "{}"}, 0),
        _completed(output=[{**call, "arguments": "{}"}]),
    ]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        message, published = await _publish(events)
    assert check(published) == []
    [parsed] = reassemble_events(published).tool_calls
    assert (parsed.tool_use_id, parsed.name, parsed.caller) == ("call_look", "lookup", None)
    assert message.stop_reason == "tool_use"
    assert "without its caller" in caplog.text
    assert "caller_id" not in caplog.text


@pytest.mark.anyio
async def test_a_program_and_its_calls_go_back_out_as_the_items_they_were() -> None:
    # A client that keeps no state with OpenAI sends the program, its calls with their
    # caller, and its output back as they came.
    from essessey.dialects.responses import ResponsesEncoder

    first, second = _program_turns()
    for events, items in (
        (first, [_PROGRAM, {**_PROGRAM_CALL, "arguments": '{"q": 1}', "status": "completed"}]),
        (second, [_PROGRAM_OUTPUT]),
    ):
        _, published = await _publish(events)
        encoder = ResponsesEncoder("resp_prog")
        for event in published:
            encoder.encode(event)
        encoder.finish()
        output = encoder.response()["output"]
        for written, sent in zip(output, items, strict=False):
            assert {k: v for k, v in written.items() if k != "id"} == {
                k: v for k, v in sent.items() if k != "id"
            }
    # The function call as the openai SDK reads it: its caller is the program.
    frames = _through_the_responses_dialect((await _publish(first))[1], "resp_prog")
    [done] = [
        e
        for e in frames
        if e.type == "response.output_item.done" and e.item.type == "function_call"
    ]
    assert done.item.caller is not None
    assert (done.item.caller.type, done.item.caller.caller_id) == ("program", "call_prog")


# Calls the provider runs itself although their item type is one a client may answer, and
# the outputs it makes of them as items of their own: published as server tools, never as
# calls the client must run (the turn does not stop to wait for them).
_CONTAINER = {"type": "container_reference", "container_id": "cntr_1"}
_PROVIDER_RUN = [
    (
        [{"type": "shell", "environment": _CONTAINER}],
        [
            {
                "id": "sh_1",
                "type": "shell_call",
                "status": "completed",
                "call_id": "call_sh",
                "action": {"commands": ["uname -a"], "timeout_ms": None},
                "environment": _CONTAINER,
            },
            {
                "id": "sho_1",
                "type": "shell_call_output",
                "status": "completed",
                "call_id": "call_sh",
                "output": [{"outcome": {"type": "exit", "exit_code": 0}, "stdout": "Linux\n"}],
            },
        ],
        [
            ("shell", {"action": {"commands": ["uname -a"], "timeout_ms": None}}),
            ("shell", {"call_id": "call_sh"}),
        ],
    ),
    (
        [{"type": "function", "name": "get_weather", "defer_loading": True}],
        [
            {
                "id": "tsc_1",
                "type": "tool_search_call",
                "status": "completed",
                "call_id": None,
                "execution": "server",
                "arguments": {"paths": ["get_weather"]},
            },
            {
                "id": "tso_1",
                "type": "tool_search_output",
                "status": "completed",
                "call_id": None,
                "execution": "server",
                "tools": [{"type": "function", "name": "get_weather"}],
            },
        ],
        [
            ("tool_search", {"arguments": {"paths": ["get_weather"]}}),
            ("tool_search", {"call_id": None}),
        ],
    ),
    (
        # xAI's X search: its searches are custom tool calls of tools the request did
        # not declare, which xAI runs.
        [{"type": "x_search", "allowed_x_handles": ["xai"]}],
        [
            {
                "id": "ctc_1",
                "type": "custom_tool_call",
                "status": "completed",
                "call_id": "xs_call_1",
                "name": "x_keyword_search",
                "input": '{"query":"from:xai","limit":20}',
            },
            {
                "id": "xs_2",
                "type": "x_search_call",
                "status": "completed",
                "name": "x_semantic_search",
                "arguments": '{"query":"grok"}',
            },
        ],
        [
            ("x_keyword_search", {"input": '{"query":"from:xai","limit":20}'}),
            ("x_search", {"name": "x_semantic_search", "arguments": '{"query":"grok"}'}),
        ],
    ),
]


@pytest.mark.anyio
@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "terminal-only"])
@pytest.mark.parametrize(
    ("tools", "items", "uses"), _PROVIDER_RUN, ids=["hosted-shell", "server-tool-search", "xai"]
)
async def test_calls_the_provider_runs_are_server_tools_not_the_client_s(
    tools: list[dict[str, Any]],
    items: list[dict[str, Any]],
    uses: list[tuple[str, dict[str, Any]]],
    streamed: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    created = _created()
    created["response"]["tools"] = tools
    events: list[dict[str, Any]] = [created]
    if streamed:
        for out, item in enumerate(items):
            events.append(_added({**_partial(item), "status": "in_progress"}, out))
            events.append(_event("response.output_item.done", output_index=out, item=item))
        events += [_text("Done.", item="msg_9", out=2), _text_done("Done.", item="msg_9", out=2)]
    events.append(_completed(output=[*items, _message_item("Done.", "msg_9")]))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        message, published = await _publish(events)
    assert check(published) == []
    parsed = reassemble_events(published)
    assert parsed.tool_calls == ()
    assert message.tool_calls == []
    assert parsed.stop_reason == message.stop_reason == "end_turn"
    assert parsed.text == "Done."
    starts = block_starts(published)
    assert [(b["type"], b.get("name"), b.get("input")) for b in starts[0:4:2]] == [
        ("server_tool_use", name, given) for name, given in uses
    ]
    # Each result block carries the provider's item whole: nothing of it is lost.
    assert [b["content"] for b in starts[1:4:2]] == items
    assert _warnings(caplog) == []
    # And the Responses dialect writes them back as the items they were (read as JSON:
    # xAI's own item types are not the openai SDK's).
    from essessey.dialects.responses import ResponsesEncoder

    encoder = ResponsesEncoder("resp_run")
    body = b"".join(encoder.encode(event) for event in published) + encoder.finish()
    frames = [orjson.loads(line[6:]) for line in body.split(b"\n") if line.startswith(b"data: ")]
    done = [f["item"] for f in frames if f["type"] == "response.output_item.done"]
    assert done[: len(items)] == items
    assert done[-1]["type"] == "message"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("tools", "client"),
    [
        ([{"type": "custom", "name": "write_sql"}], True),
        (
            [{"type": "function", "name": "get_weather"}, {"type": "custom", "name": "write_sql"}],
            True,
        ),
        ([], True),  # no tools listed (a gateway that leaves them out): the client's
        ([{"type": "function", "name": "get_weather"}], False),
        (
            [
                {"type": "function", "name": "get_weather"},
                {
                    "type": "namespace",
                    "name": "db",
                    "description": "The database.",
                    "tools": [{"type": "custom", "name": "write_sql"}],
                },
            ],
            True,
        ),
    ],
    ids=["declared", "declared-among-others", "none-listed", "not-declared", "in-a-namespace"],
)
async def test_a_custom_tool_call_is_the_client_s_when_its_request_declared_it(
    tools: list[dict[str, Any]], client: bool
) -> None:
    item = {
        "id": "ct_1",
        "type": "custom_tool_call",
        "status": "completed",
        "call_id": "call_c",
        "name": "write_sql",
        "input": "SELECT 1",
    }
    created = _created()
    created["response"]["tools"] = tools
    events = [
        created,
        _added(_partial(item), 0),
        _event("response.output_item.done", output_index=0, item=item),
    ]
    message, published = await _publish([*events, _completed(output=[item])])
    assert check(published) == []
    assert [c.id for c in message.tool_calls] == (["call_c"] if client else [])
    assert message.stop_reason == ("tool_use" if client else "end_turn")


@pytest.mark.anyio
async def test_tools_the_terminal_event_lists_decide_when_the_stream_listed_none() -> None:
    # A response.created without tools, then a terminal output whose tools are only the
    # provider's (xAI's X search): its custom tool call is the provider's, not the
    # client's (an empty set of declared tools is an answer too).
    _, items, _ = _PROVIDER_RUN[2]
    completed = _completed(output=[items[0], _message_item("Done.", "msg_9")])
    completed["response"]["tools"] = [{"type": "x_search"}]
    message, published = await _publish([_created(), completed])
    assert check(published) == []
    assert message.tool_calls == []
    assert message.stop_reason == "end_turn"


# A reasoning item's encrypted_content (store=false with include=["reasoning.encrypted_
# content"]): what the client sends back so the model goes on from its reasoning.
_ENCRYPTED = "gAAAAAB" + "x" * 300


@pytest.mark.anyio
@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "terminal-only"])
@pytest.mark.parametrize("summary", ["**Plan**\n\nAdd them.", ""], ids=["summary", "no-summary"])
async def test_encrypted_reasoning_is_the_thinking_block_s_signature(
    streamed: bool, summary: str, caplog: pytest.LogCaptureFixture
) -> None:
    item = {"id": "rs_1", "type": "reasoning", "summary": [], "encrypted_content": _ENCRYPTED}
    if summary:
        item["summary"] = [{"type": "summary_text", "text": summary}]
    events: list[dict[str, Any]] = [_created()]
    if streamed:
        # The item's added event carries an encrypted_content of its own, which its done
        # replaces: the whole item's is the one that goes out.
        events.append(_added({**item, "summary": [], "encrypted_content": "early"}, 0))
        if summary:
            events += [_summary(summary[:5]), _summary(summary[5:]), _summary_done(summary)]
        events.append(_event("response.output_item.done", output_index=0, item=item))
        events += [_text("4", item="msg_1", out=1), _text_done("4", item="msg_1", out=1)]
    message_item = _message_item("4", "msg_1")
    events.append(_completed(output=[{**item, "encrypted_content": "again"}, message_item]))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        _, published = await _publish(events)
    assert check(published) == []
    assert _warnings(caplog) == []
    parsed = reassemble_events(published)
    assert (parsed.thinking, parsed.text) == (summary, "4")
    starts = [
        orjson.loads(e.data)["content_block"]["type"]
        for e in published
        if e.event == "content_block_start"
    ]
    whole = _ENCRYPTED if streamed else "again"
    if summary:
        assert starts == ["thinking", "text"]
        assert parsed.signature == whole
    else:
        assert starts == ["redacted_thinking", "text"]
        [redacted] = [item for item in parsed.timeline if item.kind == "other"]
        assert redacted.payloads[0]["content_block"] == {"type": "redacted_thinking", "data": whole}
    # The Responses dialect gives the client the reasoning item back, encrypted content
    # and all, as the openai SDK reads it.
    frames = _through_the_responses_dialect(published, "resp_enc")
    [reasoning] = [i for i in frames[-1].response.output if i.type == "reasoning"]
    assert reasoning.encrypted_content == whole
    texts = [part.text for part in [*reasoning.summary, *(reasoning.content or [])]]
    assert texts == ([summary] if summary else [])


@pytest.mark.anyio
@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "terminal-only"])
async def test_a_reasoning_summary_of_several_parts_goes_back_as_one_item(streamed: bool) -> None:
    # Each summary part is a thinking block of its own (headings do not run together),
    # marked as a summary; the Responses dialect writes the item back as the provider
    # sent it: one reasoning item, its summary parts, its encrypted content once.
    parts = ["**Plan**\n\nAdd them.", "**Check**\n\nIt is 4."]
    item: dict[str, Any] = {"id": "rs_1", "type": "reasoning", "encrypted_content": _ENCRYPTED}
    item["summary"] = [{"type": "summary_text", "text": text} for text in parts]
    second = {"id": "rs_2", "type": "reasoning", "summary": [], "encrypted_content": "second"}
    second["summary"] = [{"type": "summary_text", "text": "Done."}]
    events: list[dict[str, Any]] = [_created()]
    if streamed:
        events.append(_added({**item, "summary": []}, 0))
        for n, text in enumerate(parts):
            events += [_summary(text, part=n), _summary_done(text, part=n)]
        events.append(_event("response.output_item.done", output_index=0, item=item))
        events += [_text("4", item="msg_1", out=1), _text_done("4", item="msg_1", out=1)]
        events.append(_added({**second, "summary": []}, 2))
        events += [_summary("Done.", item="rs_2", out=2), _summary_done("Done.", "rs_2", out=2)]
        events.append(_event("response.output_item.done", output_index=2, item=second))
    events.append(_completed(output=[item, _message_item("4", "msg_1"), second]))
    _, published = await _publish(events)
    assert check(published) == []
    parsed = reassemble_events(published)
    assert [i.text for i in parsed.timeline if i.kind == "thinking"] == [*parts, "Done."]
    frames = _through_the_responses_dialect(published, "resp_sum")
    output = frames[-1].response.output
    assert [i.type for i in output] == ["reasoning", "message", "reasoning"]
    first, _, last = output
    assert [p.text for p in first.summary] == parts
    assert (first.content, first.encrypted_content) == (None, _ENCRYPTED)
    assert ([p.text for p in last.summary], last.encrypted_content) == (["Done."], "second")
    # The stream has each part's own events, numbered within its item.
    added = [
        (f.item_id, f.summary_index)
        for f in frames
        if f.type == "response.reasoning_summary_part.added"
    ]
    assert added == [(first.id, 0), (first.id, 1), (last.id, 0)]


@pytest.mark.anyio
@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "terminal-only"])
async def test_each_text_part_is_a_block_of_its_own(streamed: bool) -> None:
    # A model's preamble and its answer (two message items, GPT-5's "commentary" and
    # "final_answer" phases), or two parts of one item, must not run together.
    preamble, answer = "I'll check the sources.", "Here are today's headlines."
    two_parts = {**_message_item(answer, "msg_2")}
    two_parts["content"] = [*two_parts["content"], {"type": "output_text", "text": "(1)"}]
    events: list[dict[str, Any]] = [_created()]
    if streamed:
        events += [_text(preamble, item="msg_1", out=0), _text_done(preamble, "msg_1", out=0)]
        events += [_text(answer[:7], item="msg_2", out=1), _text(answer[7:], item="msg_2", out=1)]
        events.append(_text("(1)", item="msg_2", out=1, part=1))
    events.append(_completed(output=[_message_item(preamble, "msg_1"), two_parts]))
    message, published = await _publish(events)
    assert check(published) == []
    parsed = reassemble_events(published)
    texts = [item.text for item in parsed.timeline if item.kind == "text"]
    assert texts == [preamble, answer, "(1)"]
    assert message.text == preamble + answer + "(1)"
    frames = _through_the_responses_dialect(published, "resp_parts")
    output = frames[-1].response.output
    assert [part.text for item in output for part in item.content] == texts


# -- citations --------------------------------------------------------------------------------

_CITED = "Paris is sunny today."
_URL_CITATION = {
    "type": "url_citation",
    "start_index": 0,
    "end_index": 5,
    "title": "Weather",
    "url": "https://example.com/paris",
}
_FILE_CITATION = {"type": "file_citation", "file_id": "file_1", "filename": "a.pdf", "index": 9}


def _annotation_added(annotation: dict[str, Any], n: int = 0) -> dict[str, Any]:
    """``response.output_text.annotation.added`` of the text part of item ``msg_c``."""
    return _event(
        "response.output_text.annotation.added",
        item_id="msg_c",
        output_index=0,
        content_index=0,
        annotation_index=n,
        annotation=annotation,
    )


def _cited_message_item() -> dict[str, Any]:
    item = _message_item(_CITED, "msg_c")
    item["content"][0]["annotations"] = [_URL_CITATION, _FILE_CITATION]
    return item


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "terminal-only"])
async def test_annotations_are_the_text_block_s_citations_once(
    dialect: Dialect, streamed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    events: list[dict[str, Any]] = [_created()]
    if streamed:
        events += [_text(p, item="msg_c") for p in _pieces(_CITED)]
        for n, annotation in enumerate([_URL_CITATION, _FILE_CITATION]):
            events.append(_annotation_added(annotation, n))
        events.append(_text_done(_CITED, item="msg_c"))
    # The whole item lists the annotations again: each goes out once.
    events.append(_completed(output=[_cited_message_item()]))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        message, published = await _publish(events, dialect)
    assert check(published) == []
    parsed = reassemble_events(published)
    assert parsed.text == message.text == _CITED
    assert list(parsed.citations) == [
        {
            "type": "web_search_result_location",
            "url": "https://example.com/paris",
            "title": "Weather",
            "cited_text": "Paris",
            "encrypted_index": "",
            "start_index": 0,
            "end_index": 5,
        },
        _FILE_CITATION,
    ]
    assert "annotation" not in caplog.text


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_part_s_annotations_in_its_content_part_done_are_its_citations(
    dialect: Dialect,
) -> None:
    # No annotation.added events: the first part's citation comes in its
    # content_part.done, while its block is open, and the item's done comes only after
    # the second part's block opened (where the citation could no longer go out).
    first = {"type": "output_text", "text": "Paris today.", "annotations": [_URL_CITATION]}
    second = {"type": "output_text", "text": " Bye.", "annotations": []}
    item = {**_message_item("", "msg_c"), "content": [first, second]}

    def part_done(part: dict[str, Any], n: int) -> dict[str, Any]:
        return _event(
            "response.content_part.done",
            item_id="msg_c",
            output_index=0,
            content_index=n,
            part=part,
        )

    events = [
        _created(),
        _added({**item, "content": [], "status": "in_progress"}, 0),
        _text("Paris today.", item="msg_c"),
        _text_done("Paris today.", item="msg_c"),
        part_done(first, 0),
        _text(" Bye.", item="msg_c", part=1),
        _text_done(" Bye.", item="msg_c", part=1),
        part_done(second, 1),
        _event("response.output_item.done", output_index=0, item=item),
        _completed(output=[item]),
    ]
    _, published = await _publish(events, dialect)
    assert check(published) == []
    [citation] = reassemble_events(published).citations
    assert (citation["url"], citation["cited_text"]) == (_URL_CITATION["url"], "Paris")


@pytest.mark.anyio
async def test_a_citation_of_a_part_whose_block_closed_is_left_out_not_put_on_the_next(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The first item's citation comes only in the terminal output, after the second
    # item's text began: it went out as a citation of the second item's block.
    first = _message_item("Alpha", "msg_a")
    first["content"][0]["annotations"] = [{**_URL_CITATION, "end_index": 5}]
    second = _message_item("Beta", "msg_b")
    events = [
        _created(),
        _added({**first, "content": [], "status": "in_progress"}, 0),
        _text("Alpha", item="msg_a", out=0),
        _added({**second, "content": [], "status": "in_progress"}, 1),
        _text("Beta", item="msg_b", out=1),
        _completed(output=[first, second]),
    ]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _, published = await _publish(events, "essessey")
    assert check(published) == []
    assert not reassemble_events(published).citations
    assert "citation came after its text block closed" in caplog.text


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_citation_before_its_part_s_text_goes_out_after_that_text(
    dialect: Dialect, caplog: pytest.LogCaptureFixture
) -> None:
    # annotation.added before the part's first delta was dropped (no block open), and the
    # whole copies of it that came later were taken as already published.
    events = [
        _created(),
        _annotation_added(_URL_CITATION),
        *[_text(p, item="msg_c") for p in _pieces(_CITED)],
        _text_done(_CITED, item="msg_c"),
        _completed(output=[_cited_message_item()]),
    ]
    with caplog.at_level(logging.INFO, logger=LOGGER):
        _, published = await _publish(events, dialect)
    assert check(published) == []
    parsed = reassemble_events(published)
    assert parsed.text == _CITED
    assert [c["type"] for c in parsed.citations] == ["web_search_result_location", "file_citation"]
    assert "citation" not in caplog.text


@pytest.mark.anyio
async def test_a_citation_of_a_part_that_never_gets_text_is_counted_in_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    events = [
        _created(),
        _annotation_added(_URL_CITATION),
        _completed(output=[]),
    ]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _, published = await _publish(events, "essessey")
    assert check(published) == []
    assert not reassemble_events(published).citations
    assert "1 citation(s) came before their text part's text" in caplog.text


@pytest.mark.anyio
async def test_an_anthropic_web_search_citation_reassembles_to_the_same_kind_of_record() -> None:
    from essessey.adapters import anthropic as anthropic_adapter

    citation = {
        "type": "web_search_result_location",
        "url": "https://example.com/paris",
        "title": "Weather",
        "cited_text": "Paris",
        "encrypted_index": "Eo8BCioIAhgBIiQ",
    }
    message = {
        "id": "msg_a",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 0},
    }
    events = [
        {"type": "message_start", "message": message},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "citations_delta", "citation": citation},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": _CITED},
        },
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 3},
        },
        {"type": "message_stop"},
    ]
    sink = InMemorySink()
    await anthropic_adapter.publish(Publisher(sink), events, stream_id="s")
    (found,) = reassemble_events(sink.events).citations
    assert found == citation
    assert found["type"] == "web_search_result_location"  # the OpenAI url_citation's kind


@pytest.mark.anyio
async def test_annotations_go_back_out_as_annotations_and_sources() -> None:
    from essessey.dialects.ui import UIMessageEncoder

    events = [_created(), _completed(output=[_cited_message_item()])]
    _, published = await _publish(events)
    frames = _through_the_responses_dialect(published, "resp_cited")
    added = [
        e.annotation.model_dump(exclude_none=True)
        for e in frames
        if e.type == "response.output_text.annotation.added"
    ]
    assert added == [_URL_CITATION, _FILE_CITATION]
    final = frames[-1].response.output[0].content[0]
    assert [a.model_dump(exclude_none=True) for a in final.annotations] == added
    ui = UIMessageEncoder(usage_metadata=False)
    body = b"".join(ui.encode(event) for event in published)
    sources = [
        orjson.loads(line[6:])
        for line in body.split(b"\n")
        if line.startswith(b"data: {") and b'"source-url"' in line
    ]
    assert sources == [
        {
            "type": "source-url",
            "sourceId": "1-0-s1",
            "url": _URL_CITATION["url"],
            "title": "Weather",
        }
    ]


@pytest.mark.anyio
async def test_agui_carries_a_citation_as_a_custom_event() -> None:
    from ag_ui.core import CustomEvent

    from essessey.dialects.agui import CITATION_EVENT, AGUIEncoder

    _, published = await _publish([_created(), _completed(output=[_cited_message_item()])])
    encoder = AGUIEncoder("t", "r")
    body = b"".join(encoder.encode(event) for event in published)
    customs = [
        CustomEvent.model_validate_json(line[6:])
        for line in body.split(b"\n")
        if line.startswith(b"data: {") and b'"CUSTOM"' in line
    ]
    assert [c.name for c in customs] == [CITATION_EVENT, CITATION_EVENT]
    assert customs[1].value["citation"] == _FILE_CITATION


def test_the_sdk_s_delta_objects_are_read_without_a_model_dump() -> None:
    # The one place the adapter reads a pydantic model's fields off its __dict__ (the
    # deltas' fast path): if pydantic stops keeping them there, this fails, instead of
    # every delta quietly taking the whole reader's longer way.
    from openai.types.responses import (
        ResponseFunctionCallArgumentsDeltaEvent,
        ResponseTextDeltaEvent,
    )

    from essessey.adapters import openai_responses

    text = ResponseTextDeltaEvent(
        type="response.output_text.delta",
        item_id="msg_1",
        output_index=0,
        content_index=1,
        delta="Hi",
        logprobs=[],
        sequence_number=4,
    )
    arguments = ResponseFunctionCallArgumentsDeltaEvent(
        type="response.function_call_arguments.delta",
        item_id="fc_1",
        output_index=2,
        delta='{"a"',
        sequence_number=5,
    )
    assert openai_responses._quick_delta(text) == ("message", "msg_1", 0, 1, "Hi")
    assert openai_responses._quick_delta(arguments) == ("arguments", "fc_1", 2, None, '{"a"')
    assert openai_responses._quick_delta(text.model_dump()) == ("message", "msg_1", 0, 1, "Hi")
    # A field of another type than the reader takes: the whole way, as before.
    odd = ResponseTextDeltaEvent.model_construct(**{**text.model_dump(), "output_index": True})
    assert openai_responses._quick_delta(odd) is None
    # A model whose read fields have defaults is read the whole way: an unset field is
    # in its __dict__ (its default) but not in its model_dump(exclude_unset=True).

    class Defaulted(pydantic.BaseModel):
        type: str
        delta: str
        item_id: str | None = None
        output_index: int = 0
        content_index: int = 0

    defaulted = Defaulted(type="response.output_text.delta", delta="Hi", item_id="msg_1")
    assert openai_responses._quick_delta(defaulted) is None


@pytest.mark.anyio
async def test_items_that_share_one_id_are_told_apart_by_their_output_index(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A stream that gives every item one id (the Agents SDK's, for a Chat Completions
    # model): each item added at an index of its own is an item of its own, in the stream
    # and in the terminal output.
    shared = "__fake_id__"
    first, second = _message_item("Let me look.", shared), _message_item("Both found.", shared)
    calls = [_call_item(n, id=shared, call_id=f"call_{n}", name=f"f{n}") for n in (1, 2)]
    events: list[dict[str, Any]] = [_created(), _added({**first, "content": []}, 0)]
    events += [_text("Let me look.", item=shared, out=0), _item_done(first, 0)]
    for n, item in enumerate(calls, 1):
        arguments = json.dumps({"n": n})
        events += [_added(item, n), _args(n, arguments)]
        events[-1]["item_id"] = shared
        events.append(_item_done({**item, "arguments": arguments}, n))
    events += [_added({**second, "content": []}, 3), _text("Both found.", item=shared, out=3)]
    done = [first, *({**c, "arguments": json.dumps({"n": n})} for n, c in enumerate(calls, 1))]
    events.append(_completed(output=[*done, second]))
    with caplog.at_level(logging.WARNING):
        _, published = await _publish(events)
    assert _warnings(caplog) == []
    assert check(published) == []
    parsed = reassemble_events(published)
    assert [(c.tool_use_id, c.name, c.params) for c in parsed.tool_calls] == [
        ("call_1", "f1", {"n": 1}),
        ("call_2", "f2", {"n": 2}),
    ]
    texts = [item.text for item in parsed.timeline if item.kind == "text"]
    assert texts == ["Let me look.", "Both found."]


@pytest.mark.anyio
async def test_a_namespace_and_a_phase_the_protocol_cannot_carry_are_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A call of a namespace tool's function, and messages with a phase (a preamble's
    # "commentary", the "final_answer"): the blocks have no place for either, so each is
    # named once in a log line (no content), and the call and the text still go out.
    call = {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "lookup",
        "namespace": "billing",
        "arguments": '{"id": 1}',
        "status": "completed",
    }
    first = {**_message_item("Let me look.", "msg_1"), "phase": "commentary"}
    second = {**_message_item("Found it.", "msg_2"), "phase": "final_answer"}
    events = [
        _created(),
        _added({**first, "content": []}, 0),
        _text("Let me look.", "msg_1", 0),
        _event("response.output_item.done", output_index=0, item=first),
        _added({**second, "content": []}, 1),
        _text("Found it.", "msg_2", 1),
        _event("response.output_item.done", output_index=1, item=second),
        _added({**call, "arguments": ""}, 2),
        _event("response.output_item.done", output_index=2, item=call),
        _completed(output=[first, second, call]),
    ]
    with caplog.at_level(logging.INFO, logger=LOGGER):
        message, published = await _publish(events)
    assert check(published) == []
    assert message.text == "Let me look.Found it."
    assert [(c.name, c.input) for c in message.tool_calls] == [("lookup", {"id": 1})]
    lines = [r.getMessage() for r in caplog.records if "not published" in r.getMessage()]
    assert len([line for line in lines if "namespace" in line]) == 1
    assert len([line for line in lines if "phase" in line]) == 1
    assert "billing" not in caplog.text
    assert "commentary" not in caplog.text


_MARKER = "SECRET-PAYLOAD-5b1d"
_ANY_ID = st.sampled_from(["fc_0", "fc_1", "msg_1", "rs_1", "nope", ""])
_STRAY_EVENT = st.one_of(
    st.builds(
        lambda t, i, o: (
            {"type": t, "item_id": i, "output_index": o, "content_index": 0} | {"delta": _MARKER}
        ),
        st.sampled_from(
            [
                "response.output_text.delta",
                "response.function_call_arguments.delta",
                "response.reasoning_summary_text.delta",
                "response.reasoning_text.delta",
                "response.refusal.delta",
            ]
        ),
        _ANY_ID,
        st.integers(-1, 4),
    ),
    st.builds(
        lambda t, o, kind, i: {"type": t, "output_index": o, "item": {"type": kind, "id": i}},
        st.sampled_from(["response.output_item.added", "response.output_item.done"]),
        st.integers(-1, 4),
        st.sampled_from(["message", "function_call", "reasoning", "web_search_call", "x"]),
        _ANY_ID,
    ),
    st.builds(
        lambda i: (
            {"type": "response.function_call_arguments.done", "item_id": i}
            | {"output_index": 0, "arguments": '{"' + _MARKER}
        ),
        _ANY_ID,
    ),
    st.sampled_from(
        [
            {"type": "response.completed", "response": {"status": "completed"}},
            {"type": "response.in_progress"},
            {"type": "error", "code": "server_error", "message": _MARKER},
            {"type": _MARKER},
            {"type": 7},
            [],
        ]
    ),
)


@settings(max_examples=100, deadline=None)
@given(
    base=st.one_of(
        st.sampled_from(sorted(p.name for p in FIXTURES.glob("*.json"))).map(_load),
        interleavings(max_calls=3).map(responses_events),
    ),
    data=st.data(),
    dialect=st.sampled_from(DIALECTS),
)
def test_a_mangled_stream_is_published_as_a_valid_stream(
    base: list[dict[str, Any]], data: st.DataObject, dialect: Dialect
) -> None:
    # Events lost, repeated and stray ones inserted anywhere: whatever comes of it goes
    # out as a stream every reader takes, and no payload reaches a log.
    sent = mangled(data, base, _STRAY_EVENT)

    async def published() -> list[Event]:
        return (await _publish(sent, dialect))[1]

    assert_published_quietly(published, _MARKER)
