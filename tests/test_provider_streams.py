"""What real providers send that once lost data, each pinned with a small fixture of ours.

Every behaviour here was seen in a provider's real stream: an in-band error in a 200
stream (Groq's SSE ``error`` event, OpenRouter's ``error`` object in a chunk), argument
fragments of parallel calls interleaved (some OpenAI-compatible servers), a second
``message_start`` inside an open message, a message given whole in its
``message_start`` (Anthropic's programmatic tool calls), a server tool's block after a
client tool call, a first chunk that names no model (Azure), and ``delta.content`` as a
list of typed parts (Mistral). The fixtures are written here, small, by hand.
"""

from __future__ import annotations

import itertools
import json
import logging
from typing import Any

import orjson
import pytest
from anthropic.types import RawMessageStreamEvent
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from essessey import (
    InMemorySink,
    Publisher,
    check,
    reassemble_events,
)
from essessey.adapters import RoundStream, stream_rounds
from essessey.adapters import anthropic as anthropic_adapter
from essessey.adapters import openai as openai_adapter
from essessey.bindings.sse import SSEDecoder
from essessey.errors import ProviderStreamError
from essessey.event import Event
from essessey.protocol import Dialect
from tests.adapter_views import log_text as _log_text
from tests.adapter_views import payloads as _payloads
from tests.adapter_views import starts as _starts
from tests.anthropic_sdk import read_message

MARKER = "zq-secret-7781"
DIALECTS: list[Dialect] = ["essessey", "anthropic"]

# -- OpenAI chat completions: a chunk builder ---------------------------------------------


def _chunk(
    delta: dict[str, Any] | None = None,
    *,
    finish: str | None = None,
    model: str = "gpt-test",
    **extra: Any,
) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "model": model,
        "choices": choices,
        **extra,
    }


def _fragment(index: int, arguments: str, *, call_id: str | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if call_id is not None:
        entry.update(id=call_id, type="function")
        entry["function"]["name"] = f"tool_{index}"
    return entry


async def _publish_openai(
    chunks: list[Any], dialect: Dialect = "essessey"
) -> tuple[Any, list[Event]]:
    sink = InMemorySink()
    result = await openai_adapter.publish(
        Publisher(sink, dialect=dialect), chunks, message_id="msg_1", stream_id="s1"
    )
    return result, sink.events


# -- 1. an in-band provider error is an error, not a success -------------------------------

# Groq's shape: an SSE event named error, in a 200 stream, whose data is {"error": ...}.
GROQ_LIKE = (
    b'data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,'
    b'"delta":{"role":"assistant","reasoning":"thinking about it"},"finish_reason":null}]}\n\n'
    b'data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,'
    b'"delta":{"content":"partial"},"finish_reason":null}]}\n\n'
    b'event: error\ndata: {"error":{"message":"' + MARKER.encode() + b'",'
    b'"type":"invalid_request_error","code":"tool_use_failed","status_code":400}}\n\n'
)


def _sse_chunks(pieces: list[bytes]) -> list[dict[str, Any]]:
    """The chunks an SSE client hands on: each message's data as JSON, whatever its name."""
    decoder = SSEDecoder()
    messages = [m for piece in pieces for m in decoder.feed(piece)] + list(decoder.close())
    return [json.loads(m.data) for m in messages if m.data != "[DONE]"]


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_an_sse_error_event_ends_the_message_with_the_providers_error(
    dialect: Dialect, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="essessey"):
        result, events = await _publish_openai(_sse_chunks([GROQ_LIKE]), dialect)
    assert check(events) == []
    parsed = reassemble_events(events)
    assert not parsed.complete
    assert parsed.error is not None
    assert (parsed.error.type, parsed.error.message) == ("invalid_request_error", MARKER)
    assert events[-1].event == "error"
    assert "message_stop" not in [e.event for e in events]
    assert (parsed.text, parsed.thinking) == ("partial", "thinking about it")
    assert result.error == {"type": "invalid_request_error", "message": MARKER}
    assert result.stop_reason == parsed.stop_reason == "end_turn"
    # The provider's message goes to the client, never to a log.
    assert MARKER not in _log_text(caplog)
    assert "invalid_request_error" in _log_text(caplog)


@pytest.mark.anyio
async def test_the_sse_error_event_reads_the_same_at_every_split() -> None:
    _, whole = await _publish_openai(_sse_chunks([GROQ_LIKE]))
    for cut in range(1, len(GROQ_LIKE)):
        _, events = await _publish_openai(_sse_chunks([GROQ_LIKE[:cut], GROQ_LIKE[cut:]]))
        assert events == whole, cut


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_an_error_object_in_a_chunk_ends_the_message(dialect: Dialect) -> None:
    # OpenRouter's shape: the error rides in a chunk that also has choices and usage.
    usage = {"prompt_tokens": 43, "completion_tokens": 10}
    chunks = [
        _chunk({"role": "assistant", "reasoning": "We need to"}),
        _chunk({"content": ""}, finish="length"),
        _chunk({"content": ""}, error={"code": 429, "message": "Slow down"}, usage=usage),
        _chunk({"content": "never read"}),
    ]
    result, events = await _publish_openai(chunks, dialect)
    assert check(events) == []
    parsed = reassemble_events(events)
    assert parsed.error is not None
    assert not parsed.complete
    # No type given: the HTTP code names it, in the Anthropic format's words.
    assert (parsed.error.type, parsed.error.message) == ("rate_limit_error", "Slow down")
    assert parsed.stop_reason == result.stop_reason == "max_tokens"
    assert (parsed.usage["input_tokens"], parsed.usage["output_tokens"]) == (43, 10)
    assert "never read" not in parsed.text


@pytest.mark.anyio
async def test_an_error_in_a_round_raises_and_the_turn_ends_with_it() -> None:
    sink = InMemorySink()
    publisher = Publisher(sink)
    chunks = [_chunk({"content": "so far"}), {"error": {"type": "server_error", "message": "x"}}]

    async def turn() -> None:
        async with stream_rounds(publisher, message_id="m", stream_id="s", model="x") as rounds:
            await rounds.round_start()
            await openai_adapter.stream_round(rounds, chunks)

    with pytest.raises(ProviderStreamError) as caught:
        await turn()
    assert (caught.value.error_type, caught.value.message) == ("server_error", "x")
    assert check(sink.events) == []
    parsed = reassemble_events(sink.events)
    assert parsed.text == "so far"
    assert parsed.error is not None
    assert (parsed.error.type, parsed.error.message) == (
        "server_error",
        "x",
    )


# -- 2. arguments of parallel calls: never dropped, whatever the order ----------------------

ARGS = ['{"city": "Paris"}', '{"q": [1, 2], "deep": {"x": "}"}}', "{}"]


def _call_chunks(order: list[tuple[int, str]]) -> list[dict[str, Any]]:
    """One chunk per fragment, in ``order``; a call's first fragment names it."""
    seen: set[int] = set()
    chunks = []
    for call, part in order:
        first = call not in seen
        seen.add(call)
        chunks.append(
            _chunk({"tool_calls": [_fragment(call, part, call_id=f"id{call}" if first else None)]})
        )
    chunks.append(_chunk({}, finish="tool_calls"))
    return chunks


async def _assert_calls_whole(chunks: list[dict[str, Any]], args: list[str]) -> list[Event]:
    result, events = await _publish_openai(chunks)
    assert check(events) == []
    parsed = reassemble_events(events)
    assert [c.arguments for c in parsed.tool_calls] == args
    assert [c.arguments for c in result.tool_calls] == args
    assert [c.tool_use_id for c in parsed.tool_calls] == [f"id{k}" for k in range(len(args))]
    assert parsed.stop_reason == "tool_use"
    return events


def _halves(arguments: str, cut: int) -> list[str]:
    return [part for part in (arguments[:cut], arguments[cut:]) if part] or [""]


@pytest.mark.anyio
@pytest.mark.parametrize("pattern", ["sequential", "interleaved", "mixed"])
async def test_two_calls_at_every_split(pattern: str, caplog: pytest.LogCaptureFixture) -> None:
    a, b = ARGS[0], ARGS[1]
    with caplog.at_level(logging.WARNING, logger="essessey"):
        for i in range(1, len(a)):
            for j in range(1, len(b)):
                (a1, a2), (b1, b2) = _halves(a, i), _halves(b, j)
                order = {
                    "sequential": [(0, a1), (0, a2), (1, b1), (1, b2)],
                    "interleaved": [(0, a1), (1, b1), (0, a2), (1, b2)],
                    "mixed": [(0, a1), (1, b1), (1, b2), (0, a2)],
                }[pattern]
                await _assert_calls_whole(_call_chunks(order), [a, b])
    assert not caplog.records


@pytest.mark.anyio
async def test_a_sequential_call_streams_live() -> None:
    # In order, each call's block is open while its fragments arrive: the client sees
    # the arguments as they come, not all at the end.
    order = [(0, '{"city": '), (0, '"Paris"}'), (1, '{"q": '), (1, "[1]}")]
    events = await _assert_calls_whole(_call_chunks(order), ['{"city": "Paris"}', '{"q": [1]}'])
    kinds = [(p["type"], p.get("delta", {}).get("partial_json")) for p in _payloads(events)]
    blocks = [k for k in kinds if k[0].startswith("content_block")]
    assert blocks == [
        ("content_block_start", None),
        ("content_block_delta", '{"city": '),
        ("content_block_delta", '"Paris"}'),
        ("content_block_stop", None),
        ("content_block_start", None),
        ("content_block_delta", '{"q": '),
        ("content_block_delta", "[1]}"),
        ("content_block_stop", None),
    ]


@pytest.mark.anyio
async def test_text_while_a_call_is_incomplete_waits_for_it() -> None:
    order = [(0, '{"a": ')]
    chunks = _call_chunks(order)[:-1]
    chunks += [_chunk({"content": "text"}), _chunk({"tool_calls": [_fragment(0, "1}")]})]
    chunks.append(_chunk({}, finish="tool_calls"))
    result, events = await _publish_openai(chunks)
    assert check(events) == []
    parsed = reassemble_events(events)
    assert [c.arguments for c in parsed.tool_calls] == ['{"a": 1}']
    assert parsed.text == result.text == "text"
    assert [kind for _, kind in _starts(events)] == ["tool_use", "text"]


@st.composite
def _interleavings(draw: st.DrawFn) -> tuple[list[str], list[list[tuple[int, str]]]]:
    values = st.recursive(
        st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=8),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
        ),
        max_leaves=6,
    )
    objects = st.dictionaries(st.text(max_size=5), values, max_size=4)
    args = [json.dumps(obj) for obj in draw(st.lists(objects, min_size=1, max_size=4))]
    queues: list[list[tuple[int, str]]] = []
    for k, text in enumerate(args):
        cuts = sorted(draw(st.sets(st.integers(1, max(len(text) - 1, 1)), max_size=4)))
        bounds = [0, *[c for c in cuts if c < len(text)], len(text)]
        queues.append([(k, text[x:y]) for x, y in itertools.pairwise(bounds) if text[x:y]])
    # A call's first fragment comes before its others; the calls start in order.
    order: list[tuple[int, str]] = []
    started = 0
    pending = [list(q) for q in queues]
    while any(pending):
        live = [k for k in range(started) if pending[k]]
        choices = live + ([started] if started < len(args) else [])
        k = draw(st.sampled_from(choices))
        if k == started:
            started += 1
        order.append(pending[k].pop(0))
    # Several fragments may share one chunk.
    groups = []
    while order:
        size = draw(st.integers(1, 3))
        groups.append(order[:size])
        order = order[size:]
    return args, groups


@pytest.mark.anyio
@settings(max_examples=150, deadline=None)
@given(case=_interleavings())
async def test_any_interleaving_at_any_split_keeps_every_call_whole(
    case: tuple[list[str], list[list[tuple[int, str]]]],
) -> None:
    args, groups = case
    seen: set[int] = set()
    chunks = []
    for group in groups:
        fragments = []
        for call, part in group:
            fragments.append(_fragment(call, part, call_id=None if call in seen else f"id{call}"))
            seen.add(call)
        chunks.append(_chunk({"tool_calls": fragments}))
    chunks.append(_chunk({}, finish="tool_calls"))
    await _assert_calls_whole(chunks, args)


# -- 6. the first model named wins over an empty one -----------------------------------------


@pytest.mark.anyio
async def test_an_empty_model_in_the_first_chunk_is_not_the_model() -> None:
    chunks = [
        _chunk(None, model="", prompt_filter_results=[{"prompt_index": 0}]),
        _chunk({"role": "assistant", "content": "Hi"}, model="gpt-real"),
        _chunk({}, finish="stop", model="gpt-real"),
    ]
    result, events = await _publish_openai(chunks)
    assert check(events) == []
    assert _payloads(events)[0]["message"]["model"] == "gpt-real" == result.model
    assert reassemble_events(events).model == "gpt-real"


# -- 7. Mistral's content as a list of typed parts -------------------------------------------


def _mistral(parts: list[dict[str, Any]]) -> dict[str, Any]:
    return _chunk({"role": "assistant", "content": parts}, model="magistral")


def _thinking_part(text: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": [{"type": "text", "text": text}]}


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_content_parts_are_read_as_thinking_and_text(
    dialect: Dialect, caplog: pytest.LogCaptureFixture
) -> None:
    chunks = [
        _mistral([_thinking_part("Two plus two")]),
        _mistral([_thinking_part(" is four."), {"type": "text", "text": "2 + 2"}]),
        _mistral([{"type": "image_url", "image_url": MARKER}, {"type": "text", "text": " = 4"}]),
        _chunk({"content": ""}, finish="stop", model="magistral"),
    ]
    with caplog.at_level(logging.DEBUG, logger="essessey"):
        result, events = await _publish_openai(chunks, dialect)
    assert check(events) == []
    parsed = reassemble_events(events)
    assert (parsed.thinking, parsed.text) == ("Two plus two is four.", "2 + 2 = 4")
    assert (result.thinking, result.text) == (parsed.thinking, parsed.text)
    assert [kind for _, kind in _starts(events)] == ["thinking", "text"]
    assert "image_url" in _log_text(caplog)
    assert MARKER not in _log_text(caplog)


@pytest.mark.anyio
@pytest.mark.parametrize("cut", range(1, 12))
async def test_content_parts_split_anywhere_read_the_same(cut: int) -> None:
    thinking, text = "Let me add.", "Four."
    pieces = [
        *(_thinking_part(part) for part in (thinking[:cut], thinking[cut:]) if part),
        *({"type": "text", "text": part} for part in (text[: cut // 2], text[cut // 2 :]) if part),
    ]
    chunks = [_mistral([piece]) for piece in pieces] + [_chunk({}, finish="stop")]
    _, events = await _publish_openai(chunks)
    assert check(events) == []
    parsed = reassemble_events(events)
    assert (parsed.thinking, parsed.text) == (thinking, text)


# -- Anthropic Messages: 3. a message_start inside an open message ---------------------------


def _message_start(message_id: str, **message: Any) -> dict[str, Any]:
    body = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": "claude-test",
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 1},
        **message,
    }
    return {"type": "message_start", "message": body}


def _block(index: int, block: dict[str, Any], *deltas: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"type": "content_block_start", "index": index, "content_block": block},
        *({"type": "content_block_delta", "index": index, "delta": d} for d in deltas),
        {"type": "content_block_stop", "index": index},
    ]


def _tool(index: int, call_id: str, *parts: str) -> list[dict[str, Any]]:
    start = {"type": "tool_use", "id": call_id, "name": "lookup", "input": {}}
    return _block(index, start, *({"type": "input_json_delta", "partial_json": p} for p in parts))


def _end(stop_reason: str) -> list[dict[str, Any]]:
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": 9},
        },
        {"type": "message_stop"},
    ]


SPLICED = [
    _message_start("msg_a"),
    *_tool(0, "toolu_a", '{"name": "Fir')[:-1],  # cut: no stop
    _message_start("msg_b"),
    *_tool(0, "toolu_b", '{"name": ', '"Firefly"}'),
    *_end("tool_use"),
]


async def _publish_anthropic(events: list[Any], dialect: Dialect) -> tuple[Any, list[Event]]:
    sink = InMemorySink()
    result = await anthropic_adapter.publish(
        Publisher(sink, dialect=dialect), events, stream_id="s1"
    )
    return result, sink.events


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_message_start_inside_a_message_never_mixes_the_two(dialect: Dialect) -> None:
    result, events = await _publish_anthropic(SPLICED, dialect)
    assert check(events) == []
    parsed = reassemble_events(events)
    first, second = parsed.messages
    # The first message ends where the provider left it, with an error saying so.
    assert first.error is not None
    assert first.error.message == anthropic_adapter.CUT_MESSAGE
    assert [(c.tool_use_id, c.arguments) for c in first.tool_calls] == [
        ("toolu_a", '{"name": "Fir')
    ]
    assert second.complete
    assert second.stop_reason == "tool_use"
    assert [(c.tool_use_id, c.params) for c in second.tool_calls] == [
        ("toolu_b", {"name": "Firefly"})
    ]
    # The second message's blocks count from 0 again.
    assert [index for index, _ in _starts(events)] == [0, 0]
    assert result.message_id == "msg_b"
    assert result.tool_calls[0].input == {"name": "Firefly"}


@pytest.mark.anyio
async def test_a_message_start_inside_a_round_ends_the_turn() -> None:
    sink = InMemorySink()
    publisher = Publisher(sink)

    async def turn() -> None:
        async with stream_rounds(publisher, message_id="m", stream_id="s", model="x") as rounds:
            await rounds.round_start()
            await anthropic_adapter.stream_round(rounds, SPLICED)

    with pytest.raises(ProviderStreamError) as caught:
        await turn()
    assert caught.value.message == anthropic_adapter.CUT_MESSAGE
    assert check(sink.events) == []
    parsed = reassemble_events(sink.events)
    assert [c.arguments for c in parsed.tool_calls] == ['{"name": "Fir']
    assert parsed.error is not None


# -- 4. a message given whole in its message_start -------------------------------------------

GIVEN_CALL = {
    "type": "tool_use",
    "id": "toolu_given",
    "name": "rollDie",
    "input": {"player": "one"},
    "caller": {"type": "code_execution_20250825", "tool_id": "srvtoolu_1"},
}
WHOLE = [
    _message_start("msg_whole", content=[GIVEN_CALL], stop_reason="tool_use"),
    {"type": "message_stop"},
]


def test_reassembly_reads_the_snapshot_in_message_start() -> None:
    events = [Event(p["type"], orjson.dumps(p)) for p in WHOLE]
    assert check(events) == []
    parsed = reassemble_events(events)
    assert [(c.tool_use_id, c.name, c.params) for c in parsed.tool_calls] == [
        ("toolu_given", "rollDie", {"player": "one"})
    ]
    assert parsed.stop_reason == "tool_use"
    assert parsed.complete


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_message_given_whole_in_its_start_is_published(dialect: Dialect) -> None:
    result, events = await _publish_anthropic(WHOLE, dialect)
    assert check(events) == []
    parsed = reassemble_events(events)
    assert [(c.tool_use_id, c.params) for c in parsed.tool_calls] == [
        ("toolu_given", {"player": "one"})
    ]
    assert parsed.stop_reason == result.stop_reason == "tool_use"
    assert parsed.complete
    assert parsed.error is None
    assert [(c.id, c.input) for c in result.tool_calls] == [("toolu_given", {"player": "one"})]
    # The code that made the call (Anthropic's programmatic tool calling), which a client
    # sends back with it: the essessey dialect's tool_use block left it out.
    assert [c.caller for c in parsed.tool_calls] == [GIVEN_CALL["caller"]]
    if dialect == "anthropic":
        # A faithful proxy: the provider's events, stream id added.
        sent = _payloads(events)
        assert sent[0]["message"]["content"] == [GIVEN_CALL]
        assert [p["type"] for p in sent] == ["message_start", "message_stop"]


@pytest.mark.anyio
@pytest.mark.parametrize(
    "caller", [{"type": "code_execution_20250825", "tool_id": 2**70}, "code_execution"]
)
async def test_a_caller_not_writable_as_json_is_left_out_and_the_call_kept(
    caller: object, caplog: pytest.LogCaptureFixture
) -> None:
    start = {"type": "tool_use", "id": "toolu_1", "name": "rollDie", "input": {}}
    events = [
        _message_start("msg_caller"),
        *_block(0, {**start, "caller": caller}, {"type": "input_json_delta", "partial_json": "{}"}),
        *_end("tool_use"),
    ]
    with caplog.at_level(logging.WARNING):
        _, published = await _publish_anthropic(events, "essessey")
    assert check(published) == []
    [call] = reassemble_events(published).tool_calls
    assert (call.tool_use_id, call.caller) == ("toolu_1", None)
    assert "caller not writable as JSON" in caplog.text


@pytest.mark.anyio
async def test_blocks_streamed_after_a_snapshot_continue_its_indexes() -> None:
    events = [
        _message_start("msg_mixed", content=[GIVEN_CALL]),
        *_block(1, {"type": "text", "text": ""}, {"type": "text_delta", "text": "Rolled."}),
        *_end("end_turn"),
    ]
    _, published = await _publish_anthropic(events, "anthropic")
    assert check(published) == []
    # The Anthropic SDK's own accumulator reads the proxied stream to the same message.
    adapter: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
    snapshot = read_message(adapter.validate_python(payload) for payload in _payloads(published))
    assert snapshot is not None
    assert [block.type for block in snapshot.content] == ["tool_use", "text"]
    assert snapshot.content[1].text == "Rolled."  # type: ignore[union-attr]


# -- 5. a server tool after a client tool keeps its place ------------------------------------

SERVER_AFTER_CLIENT = [
    _message_start("msg_tools"),
    *_block(0, {"type": "text", "text": ""}, {"type": "text_delta", "text": "Reading."}),
    *_tool(1, "toolu_client", '{"id": 7}'),
    *_block(
        2,
        {"type": "server_tool_use", "id": "srvtoolu_9", "name": "tool_search", "input": {}},
        {"type": "input_json_delta", "partial_json": '{"query": "edit"}'},
    ),
    *_block(
        3,
        {"type": "tool_search_tool_result", "tool_use_id": "srvtoolu_9", "content": []},
    ),
    *_end("tool_use"),
]


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_server_tool_after_a_client_tool_passes_through_in_order(
    dialect: Dialect, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="essessey"):
        result, events = await _publish_anthropic(SERVER_AFTER_CLIENT, dialect)
    assert not caplog.records
    assert check(events) == []
    starts = _starts(events)
    assert starts == [
        (0, "text"),
        (1, "tool_use"),
        (2, "server_tool_use"),
        (3, "tool_search_tool_result"),
    ]
    assert [c.id for c in result.tool_calls] == ["toolu_client"]
    if dialect == "anthropic":
        # Everything but the tool_use start (rebuilt by design) is the provider's event.
        sent = [p for p in _payloads(events) if p["type"] != "ping"]
        sent[0]["message"].pop("stream_id")
        assert len(sent) == len(SERVER_AFTER_CLIENT)
        for got, want in zip(sent, SERVER_AFTER_CLIENT, strict=True):
            if want.get("content_block", {}).get("type") != "tool_use":
                assert got == want


@pytest.mark.anyio
async def test_a_server_tool_between_two_calls_of_a_round_keeps_the_results_after_all() -> None:
    sink = InMemorySink()
    publisher = Publisher(sink)
    rounds = RoundStream(publisher)
    await publisher.send_stream_preamble("m", "s", "x")
    await rounds.round_start()
    await anthropic_adapter.stream_round(
        rounds,
        [
            _message_start("msg_r"),
            *_tool(0, "toolu_1", "{}"),
            *_block(1, {"type": "server_tool_use", "id": "srv_1", "name": "s", "input": {}}),
            *_tool(2, "toolu_2", '{"b": 2}'),
            *_end("tool_use"),
        ],
    )
    await rounds.tool_result(1, "second")
    await rounds.tool_result(0, "first")
    summary = await rounds.round_end()
    await publisher.send_stream_epilogue("end_turn", 1)
    assert check(sink.events) == []
    starts = _starts(sink.events)
    assert starts == [
        (0, "tool_use"),
        (1, "server_tool_use"),
        (2, "tool_use"),
        (3, "tool_result"),
        (4, "tool_result"),
    ]
    assert [(c.tool_use_id, c.result) for c in summary.tool_calls] == [
        ("toolu_1", "first"),
        ("toolu_2", "second"),
    ]
