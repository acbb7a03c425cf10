"""The Anthropic adapter: provider streams proxied as they came, re-indexed across rounds."""

import itertools
import json
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Final

import anyio
import orjson
import pytest
from anthropic.types import RawMessageStreamEvent
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from essessey import Event, InMemorySink, Publisher, RoundOrderError, check, reassemble_events
from essessey.adapters import stream_rounds
from essessey.adapters.anthropic import (
    INCOMPLETE_MESSAGE,
    ProviderStreamError,
    StreamedMessage,
    publish,
    stream_round,
)
from essessey.protocol import Dialect
from tests.adapter_views import assert_published_quietly, mangled
from tests.adapter_views import payloads as _payloads
from tests.anthropic_sdk import read_message
from tests.anthropic_sdk import stream_events as sdk_stream_events

FIXTURES = Path(__file__).parent / "fixtures" / "anthropic"
COMPLETE = ["text_only", "thinking_text_tool", "two_parallel_tools", "server_tool"]
COMPLETE += ["redacted_thinking", "weather_answer"]
DIALECTS: list[Dialect] = ["essessey", "anthropic"]
MARKER = "SECRET-PAYLOAD-a91c"
EVENT_ADAPTER: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)


def _load(name: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = json.loads((FIXTURES / f"{name}.json").read_text())
    return events


def _make(dialect: Dialect) -> tuple[Publisher, InMemorySink]:
    sink = InMemorySink()
    return Publisher(sink, dialect=dialect), sink


def _with_stream_id(events: list[dict[str, Any]], stream_id: str) -> list[dict[str, Any]]:
    expected = [dict(event) for event in events]
    expected[0] = {**expected[0], "message": {**expected[0]["message"], "stream_id": stream_id}}
    return expected


def _sdk_objects(events: list[dict[str, Any]]) -> list[Any]:
    # The SDK has no model for ping and error (its stream skips one and raises on the
    # other): those stay dicts, as they would in a mixed recording.
    return [
        event if event["type"] in ("ping", "error") else EVENT_ADAPTER.validate_python(event)
        for event in events
    ]


async def _aiter(events: list[Any]) -> AsyncIterator[Any]:
    for event in events:
        await anyio.lowlevel.checkpoint()
        yield event


# -- the fixtures are what the API streams --------------------------------------------------


@pytest.mark.parametrize("name", [*COMPLETE, "overloaded_error"])
def test_fixtures_are_valid_provider_events(name: str) -> None:
    events = _load(name)
    assert events[0]["type"] == "message_start"
    for event in events:
        if event["type"] in ("ping", "error"):
            continue
        model = EVENT_ADAPTER.validate_python(event)
        # A dump of only the fields that were set gives back the provider's JSON exactly,
        # which is what the adapter relies on for SDK objects.
        assert model.model_dump(mode="json", by_alias=True, exclude_unset=True) == event


def test_a_dump_with_defaults_would_add_keys_the_provider_did_not_send() -> None:
    start = {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    dumped = EVENT_ADAPTER.validate_python(start).model_dump(mode="json")
    assert dumped["content_block"]["citations"] is None


# -- one message, published as it came --------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("name", COMPLETE)
async def test_anthropic_dialect_gives_back_the_provider_stream(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    events = _load(name)
    publisher, sink = _make("anthropic")
    with caplog.at_level(logging.WARNING, logger="essessey"):
        result = await publish(publisher, events, stream_id="conv_7")
    assert _payloads(sink.events) == _with_stream_id(events, "conv_7")
    assert check(sink.events) == []
    assert caplog.records == []
    assert result.message_id == events[0]["message"]["id"]
    assert result.error is None


@pytest.mark.anyio
async def test_the_result_has_the_message_content() -> None:
    events = _load("thinking_text_tool")
    publisher, _ = _make("anthropic")
    result = await publish(publisher, events, stream_id="conv_1")
    assert isinstance(result, StreamedMessage)
    assert result.model == "claude-sonnet-4-5-20250929"
    assert result.text == "I'll check the current weather in Paris for you."
    assert result.thinking.startswith("The user wants the weather in Paris. ")
    assert result.signature == events[6]["delta"]["signature"]
    [call] = result.tool_calls
    assert (call.id, call.name) == ("toolu_01A09q90qw90lq917835lq9", "get_weather")
    assert call.arguments == '{"city": "Paris", "unit": "celsius"}'
    assert call.input == {"city": "Paris", "unit": "celsius"}
    assert result.stop_reason == "tool_use"
    assert result.stop_sequence is None
    assert result.usage["input_tokens"] == 412
    assert result.usage["output_tokens"] == 141
    # The content is what the SDK puts together from the provider's own stream: what a
    # next request sends back, thinking signature included.
    snapshot = read_message([Event(e["type"], orjson.dumps(e)) for e in events])
    sdk_content = [block.model_dump(mode="json", exclude_none=True) for block in snapshot.content]
    assert result.content == sdk_content


@pytest.mark.anyio
async def test_server_tool_content_keeps_citations_and_input() -> None:
    publisher, _ = _make("anthropic")
    result = await publish(publisher, _load("server_tool"), stream_id="conv_1")
    types = [block["type"] for block in result.content]
    assert types == ["text", "server_tool_use", "web_search_tool_result", "text", "text", "text"]
    assert result.content[1]["input"] == {"query": "Paris weather today"}
    [citation] = result.content[4]["citations"]
    assert citation["url"] == "https://weather.example.com/paris"
    assert result.tool_calls == []
    assert result.usage["output_tokens"] == 212


@pytest.mark.anyio
async def test_the_anthropic_sdk_reads_the_published_message() -> None:
    publisher, sink = _make("anthropic")
    await publish(publisher, _load("two_parallel_tools"), stream_id="conv_1")
    message = read_message(sink.events)
    thinking, text, paris, oslo = message.content
    assert (
        thinking.thinking
        == "Two cities, two independent lookups: call get_weather for both at once."
    )
    assert thinking.signature == _load("two_parallel_tools")[6]["delta"]["signature"]
    assert text.text == "Let me check both cities at the same time."
    assert (paris.id, paris.input) == ("toolu_01T1x1fJ34qAmk2tNTrN7Up6", {"city": "Paris"})
    assert (oslo.name, oslo.input) == ("get_weather", {"city": "Oslo"})
    assert message.stop_reason == "tool_use"
    assert message.usage.output_tokens == 163


@pytest.mark.anyio
@pytest.mark.parametrize("name", COMPLETE)
async def test_essessey_dialect_keeps_the_content(name: str) -> None:
    events = _load(name)
    publisher, sink = _make("essessey")
    result = await publish(publisher, events, stream_id="conv_1")
    assert check(sink.events) == []
    parsed = reassemble_events(sink.events)
    assert parsed.complete
    assert parsed.stream_id == "conv_1"
    assert parsed.message_id == events[0]["message"]["id"]
    assert (parsed.text, parsed.thinking) == (result.text, result.thinking)
    assert parsed.signature == result.signature
    assert [(c.tool_use_id, c.params) for c in parsed.tool_calls] == [
        (c.id, c.input) for c in result.tool_calls
    ]
    assert parsed.stop_reason == events[-2]["delta"]["stop_reason"]
    assert parsed.usage["output_tokens"] == events[-2]["usage"]["output_tokens"]
    start = _payloads(sink.events)[0]["message"]
    assert list(start) == [
        "id",
        "stream_id",
        "type",
        "role",
        "content",
        "model",
        "stop_reason",
        "stop_sequence",
        "usage",
    ]


# -- any input form, the same output ---------------------------------------------------------


async def _published(dialect: Dialect, events: Any) -> list[Event]:
    publisher, sink = _make(dialect)
    await publish(publisher, events, stream_id="conv_1")
    return sink.events


def _parsed(events: list[Event]) -> list[tuple[str, Any]]:
    # An SDK object dumps its fields in declaration order, not the provider's: the same
    # JSON, other bytes.
    return [(event.event, orjson.loads(event.data)) for event in events]


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("name", COMPLETE)
async def test_sdk_objects_and_async_iterables_give_the_same_output(
    name: str, dialect: Dialect
) -> None:
    events = _load(name)
    expected = await _published(dialect, events)
    assert await _published(dialect, _aiter(events)) == expected
    assert await _published(dialect, iter(events)) == expected
    expected_json = _parsed(expected)
    assert _parsed(await _published(dialect, _sdk_objects(events))) == expected_json
    assert _parsed(await _published(dialect, _aiter(_sdk_objects(events)))) == expected_json


@pytest.mark.anyio
async def test_a_message_stream_s_own_events_are_read_too(caplog: pytest.LogCaptureFixture) -> None:
    # What iterating the SDK's MessageStream yields: the raw events (stops carrying the
    # block or message put together so far) plus derived text/thinking/input_json events.
    events = _load("thinking_text_tool")
    # What the SDK's stream yields (its ping and error stay dicts, as in a recording).
    _, stream_events = sdk_stream_events(_sdk_objects(events), recording=True)
    assert {type(e).__name__ for e in stream_events} >= {"TextEvent", "ParsedMessageStopEvent"}
    with caplog.at_level(logging.WARNING, logger="essessey"):
        output = await _published("anthropic", stream_events)
    assert _parsed(output) == _parsed(await _published("anthropic", events))
    assert caplog.records == []


# -- several rounds in one message --------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_two_rounds_and_their_results_form_one_stream(dialect: Dialect) -> None:
    publisher, sink = _make(dialect)
    async with stream_rounds(
        publisher, message_id="msg_turn", stream_id="conv_1", model="agent", input_tokens=655
    ) as rounds:
        await rounds.round_start()
        first = await stream_round(rounds, _load("two_parallel_tools"))
        assert [c.input for c in first.tool_calls] == [{"city": "Paris"}, {"city": "Oslo"}]
        await rounds.tool_result(1, {"temp_c": 4, "sky": "rain"})
        await rounds.tool_result(0, {"temp_c": 18, "sky": "sun"})
        await rounds.round_end()
        await rounds.round_start()
        second = await stream_round(rounds, _aiter(_load("weather_answer")))
        await rounds.round_end()
    events = sink.events
    assert check(events) == []
    starts = [
        (p["index"], p["content_block"]["type"])
        for p in _payloads(events)
        if p["type"] == "content_block_start"
    ]
    assert starts == [
        (0, "thinking"),
        (1, "text"),
        (2, "tool_use"),
        (3, "tool_use"),
        (4, "tool_result"),
        (5, "tool_result"),
        (6, "text"),
    ]
    parsed = reassemble_events(events)
    assert parsed.text == first.text + second.text
    assert parsed.thinking == first.thinking
    assert [(e.call.name, e.call.params, e.result) for e in parsed.executions] == [
        ("get_weather", {"city": "Paris"}, '{"temp_c":18,"sky":"sun"}'),
        ("get_weather", {"city": "Oslo"}, '{"temp_c":4,"sky":"rain"}'),
    ]
    # The epilogue reports the turn: its last round's stop, its rounds' token counts.
    assert parsed.stop_reason == "end_turn"
    assert parsed.usage["output_tokens"] == 163 + 24
    # The providers' pings came through; their frame events did not.
    names = [e.event for e in events]
    assert names.count("message_start") == 1
    assert names.count("ping") == 1 + 3 + 1
    if dialect == "anthropic":
        message = read_message(events)
        assert [b.type for b in message.content][-3:] == ["tool_result", "tool_result", "text"]
        assert message.content[6].text == second.text


@pytest.mark.anyio
async def test_stream_round_needs_a_started_round() -> None:
    publisher, _ = _make("essessey")
    async with stream_rounds(publisher, message_id="m", stream_id="s", model="x") as rounds:
        with pytest.raises(RoundOrderError):
            await stream_round(rounds, _load("text_only"))


@pytest.mark.anyio
async def test_a_provider_error_in_a_round_raises_and_ends_the_stream() -> None:
    publisher, sink = _make("anthropic")

    async def turn() -> None:
        async with stream_rounds(publisher, message_id="m", stream_id="s", model="x") as rounds:
            await rounds.round_start()
            await stream_round(rounds, _load("overloaded_error"))

    with pytest.raises(ProviderStreamError) as caught:
        await turn()
    assert (caught.value.error_type, caught.value.message) == ("overloaded_error", "Overloaded")
    assert "Overloaded" not in str(caught.value)
    # The provider's own type and message reach the client, as the provider sent them.
    assert _payloads(sink.events)[-1]["error"] == {
        "type": "overloaded_error",
        "message": "Overloaded",
    }
    assert check(sink.events) == []


# -- failures -------------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_provider_error_event_is_published_and_publish_returns(dialect: Dialect) -> None:
    events = _load("overloaded_error")
    publisher, sink = _make(dialect)
    result = await publish(publisher, events, stream_id="conv_1")
    assert result.stop_reason is None
    assert result.error == {"type": "overloaded_error", "message": "Overloaded"}
    assert result.text == "Sure, here is"
    payloads = _payloads(sink.events)
    assert payloads[-1] == events[-1]
    if dialect == "anthropic":
        assert payloads == _with_stream_id(events, "conv_1")
    assert check(sink.events) == []
    parsed = reassemble_events(sink.events)
    assert parsed.error is not None
    assert parsed.error.type == "overloaded_error"
    assert not parsed.complete


@pytest.mark.anyio
async def test_a_stream_cut_short_ends_with_an_error_event() -> None:
    events = _load("two_parallel_tools")[:-6]
    publisher, sink = _make("anthropic")
    result = await publish(publisher, events, stream_id="conv_1")
    assert result.error == {"type": "api_error", "message": INCOMPLETE_MESSAGE}
    assert result.stop_reason is None
    assert sink.events[-1].event == "error"
    assert check(sink.events) == []


def _raising(events: list[dict[str, Any]], after: int) -> Iterator[dict[str, Any]]:
    yield from events[:after]
    raise ConnectionResetError(MARKER)


async def _araising(events: list[dict[str, Any]], after: int) -> AsyncIterator[dict[str, Any]]:
    for event in events[:after]:
        yield event
    raise ConnectionResetError(MARKER)


@pytest.mark.anyio
@pytest.mark.parametrize("asynchronous", [False, True])
async def test_an_iterable_that_raises_gets_an_error_event_and_the_exception(
    asynchronous: bool,
) -> None:
    events = _load("thinking_text_tool")
    source = _araising(events, 12) if asynchronous else _raising(events, 12)
    publisher, sink = _make("anthropic")
    with pytest.raises(ConnectionResetError):
        await publish(publisher, source, stream_id="conv_1")
    last = _payloads(sink.events)[-1]
    assert last == {
        "type": "error",
        "error": {
            "type": "api_error",
            "message": "the provider stream failed: ConnectionResetError",
        },
    }
    assert not any(MARKER.encode() in e.data for e in sink.events)
    assert check(sink.events) == []


@pytest.mark.anyio
async def test_an_iterable_that_raises_after_the_message_gets_no_error_event() -> None:
    events = _load("text_only")
    publisher, sink = _make("anthropic")
    with pytest.raises(ConnectionResetError):
        await publish(publisher, _raising(events, len(events)), stream_id="conv_1")
    assert sink.events[-1].event == "message_stop"


# -- malformed and out-of-turn events: skipped, with a warning and no content --------------------


def _junk() -> list[tuple[int, Any]]:
    """(position in text_only, event) pairs, each one something to skip."""
    text = {"type": "text_delta", "text": MARKER}
    return [
        (0, {"type": "content_block_delta", "index": 0, "delta": text}),  # before message_start
        (1, 42),
        (1, [MARKER]),
        (1, {"text": MARKER}),
        (1, {"type": MARKER}),
        (1, {"type": "message_start", "message": {"id": "msg_2", "model": 7}}),
        (3, {"type": "content_block_start", "index": "1", "content_block": {"type": "text"}}),
        (3, {"type": "content_block_start", "index": 1, "content_block": {"type": "text"}}),
        (3, {"type": "content_block_start", "index": 1, "content_block": [MARKER]}),
        (3, {"type": "content_block_delta", "index": 5, "delta": text}),
        (3, {"type": "content_block_delta", "index": "0", "delta": text}),
        (3, {"type": "content_block_delta", "index": 0, "delta": MARKER}),
        (3, {"type": "content_block_delta", "index": 0, "delta": {"type": 7, "text": MARKER}}),
        (
            3,
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": 7}},
        ),
        (
            3,
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "thinking_delta", "thinking": MARKER},
            },
        ),
        (
            3,
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": MARKER},
            },
        ),
        (3, {"type": "content_block_stop", "index": 3}),
        (3, {"type": "message_stop"}),
        (
            8,
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        (8, {"type": "content_block_stop", "index": "0"}),
        (8, {"type": "message_delta", "delta": MARKER, "usage": {}}),
        (8, {"type": "message_delta", "delta": {"stop_reason": 5}, "usage": {}}),
        (10, {"type": "content_block_delta", "index": 0, "delta": text}),  # after message_stop
        (10, {"type": "error", "error": {"type": "api_error", "message": MARKER}}),
    ]


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_malformed_events_are_skipped_with_a_warning_without_content(
    dialect: Dialect, caplog: pytest.LogCaptureFixture
) -> None:
    clean = _load("text_only")
    clean[4] = {**clean[4], "delta": {"type": "text_delta", "text": MARKER}}
    events: list[Any] = list(clean)
    for position, event in sorted(_junk(), key=lambda pair: -pair[0]):
        events.insert(position, event)
    expected = await _published(dialect, clean)
    publisher, sink = _make(dialect)
    with caplog.at_level(logging.DEBUG, logger="essessey"):
        result = await publish(publisher, events, stream_id="conv_1")
    assert sink.events == expected
    assert result.text.startswith(MARKER)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == len(_junk())
    assert all("skipping provider event #" in r.getMessage() for r in warnings)
    assert not [r for r in caplog.records if MARKER in r.getMessage()]


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", ["essessey", "anthropic"])
async def test_a_text_block_after_the_round_s_tool_calls_goes_out_in_order(
    dialect: Dialect, caplog: pytest.LogCaptureFixture
) -> None:
    events = _load("thinking_text_tool")
    late = [
        {"type": "content_block_start", "index": 3, "content_block": {"type": "text", "text": ""}},
        {
            "type": "content_block_delta",
            "index": 3,
            "delta": {"type": "text_delta", "text": MARKER},
        },
        {"type": "content_block_stop", "index": 3},
    ]
    events[-2:-2] = late
    publisher, sink = _make(dialect)
    with caplog.at_level(logging.DEBUG, logger="essessey"):
        result = await publish(publisher, events, stream_id="conv_1")
    assert check(sink.events) == []
    assert result.text.endswith(MARKER)
    assert reassemble_events(sink.events).text == result.text
    starts = [p["content_block"]["type"] for p in _payloads(sink.events) if "content_block" in p]
    # The provider's order: the text after the tool call is a block of its own after it.
    assert starts == ["thinking", "text", "tool_use", "text"]
    assert not [r for r in caplog.records if MARKER in r.getMessage()]


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_call_whose_id_repeats_an_earlier_call_s_goes_out_under_a_fresh_id(
    dialect: Dialect, caplog: pytest.LogCaptureFixture
) -> None:
    events = _load("two_parallel_tools")
    first_id = events[12]["content_block"]["id"]
    events[18] = {**events[18], "content_block": {**events[18]["content_block"], "id": first_id}}
    publisher, sink = _make(dialect)
    with caplog.at_level(logging.WARNING, logger="essessey"):
        result = await publish(publisher, events, stream_id="conv_1")
    assert check(sink.events) == []
    # Both calls, each input whole: the second under an id of its own.
    assert [c.input for c in result.tool_calls] == [{"city": "Paris"}, {"city": "Oslo"}]
    ids = [c.id for c in result.tool_calls]
    assert ids[0] == first_id
    assert ids[1] != first_id
    assert ids[1].startswith("toolu_")
    assert [c.given_id for c in result.tool_calls] == [first_id, first_id]
    assert [b["id"] for b in result.content if b["type"] == "tool_use"] == ids
    starts = [p["content_block"] for p in _payloads(sink.events) if "content_block" in p]
    assert [b["id"] for b in starts if b["type"] == "tool_use"] == ids
    reassembled = reassemble_events(sink.events)
    assert [(c.tool_use_id, c.params) for c in reassembled.tool_calls] == [
        (c.id, c.input) for c in result.tool_calls
    ]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["tool_use block 3 repeats an earlier call's id; using a generated id"]


@pytest.mark.anyio
async def test_a_call_reusing_an_earlier_round_s_id_gets_a_fresh_one_and_its_result() -> None:
    first = _load("two_parallel_tools")
    second = _load("two_parallel_tools")
    publisher, sink = _make("essessey")
    async with stream_rounds(
        publisher, message_id="msg_1", stream_id="conv_1", model="claude"
    ) as rounds:
        await rounds.round_start()
        one = await stream_round(rounds, first)
        for i in range(len(one.tool_calls)):
            await rounds.tool_result(i, f"result {i}")
        await rounds.round_end()
        await rounds.round_start()
        two = await stream_round(rounds, second)  # the same two ids again
        for i in range(len(two.tool_calls)):
            await rounds.tool_result(i, f"again {i}")
        await rounds.round_end()
    assert check(sink.events) == []
    ids = [c.id for c in one.tool_calls + two.tool_calls]
    assert len(set(ids)) == 4
    assert [c.input for c in two.tool_calls] == [{"city": "Paris"}, {"city": "Oslo"}]
    reassembled = reassemble_events(sink.events)
    answered = {r.tool_use_id: r.text for r in reassembled.tool_results}
    assert answered == {
        ids[0]: "result 0",
        ids[1]: "result 1",
        ids[2]: "again 0",
        ids[3]: "again 1",
    }


def _four_blocks() -> list[list[dict[str, Any]]]:
    """A thinking block, a text block, a tool call and a text block, each whole."""
    return [
        _block(
            0,
            {"type": "thinking", "thinking": "", "signature": ""},
            {"type": "thinking_delta", "thinking": "Think "},
            {"type": "thinking_delta", "thinking": "twice."},
            {"type": "signature_delta", "signature": "sig"},
        ),
        _block(1, {"type": "text", "text": ""}, {"type": "text_delta", "text": MARKER}),
        _block(
            2,
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}},
            {"type": "input_json_delta", "partial_json": '{"city": '},
            {"type": "input_json_delta", "partial_json": '"Paris"}'},
        ),
        _block(3, {"type": "text", "text": ""}, {"type": "text_delta", "text": "Done."}),
    ]


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize(
    "lost", [lost for n in range(1, 4) for lost in itertools.combinations(range(3), n)]
)
async def test_a_lost_block_stop_closes_the_block_where_the_next_one_begins(
    dialect: Dialect, lost: tuple[int, ...], caplog: pytest.LogCaptureFixture
) -> None:
    blocks = _four_blocks()
    clean = _message(*blocks)
    cut = _message(*(block[:-1] if i in lost else block for i, block in enumerate(blocks)))
    expected = await _published(dialect, clean)
    publisher, sink = _make(dialect)
    with caplog.at_level(logging.WARNING, logger="essessey"):
        result = await publish(publisher, cut, stream_id="conv_1")
    # What the provider's SDK reads from such a stream: every block whole.
    assert sink.events == expected
    assert result.text == MARKER + "Done."
    assert [c.input for c in result.tool_calls] == [{"city": "Paris"}]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"provider block {i} got no content_block_stop; closed where block {i + 1} began"
        for i in lost
    ]
    assert not [r for r in caplog.records if MARKER in r.getMessage()]


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_stray_start_inside_a_block_is_skipped_and_the_block_goes_on(
    dialect: Dialect, caplog: pytest.LogCaptureFixture
) -> None:
    blocks = _four_blocks()
    clean = _message(*blocks)
    stray = {"type": "content_block_start", "index": 7, "content_block": {"type": "text"}}
    events = list(clean)
    events.insert(events.index(blocks[0][1]) + 1, stray)  # between block 0's deltas
    events.insert(events.index(blocks[2][1]), dict(stray, index=8))  # before block 2's first
    expected = await _published(dialect, clean)
    publisher, sink = _make(dialect)
    with caplog.at_level(logging.WARNING, logger="essessey"):
        await publish(publisher, events, stream_id="conv_1")
    assert sink.events == expected
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "skipping provider event #3 (content_block_start): block 7 starts while block 0 is open",
        "skipping provider event #11 (content_block_start): block 8 starts while block 2 is open",
    ]


@pytest.mark.anyio
async def test_a_start_before_the_open_block_s_stop_goes_out_after_it() -> None:
    blocks = _four_blocks()
    clean = _message(*blocks)
    early = list(clean)
    start = blocks[2][0]
    early.remove(start)
    early.insert(early.index(blocks[1][-1]), start)  # block 2's start before block 1's stop
    expected = await _published("essessey", clean)
    publisher, sink = _make("essessey")
    await publish(publisher, early, stream_id="conv_1")
    assert sink.events == expected


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_call_started_just_before_the_message_ends_is_kept(dialect: Dialect) -> None:
    blocks = _four_blocks()
    call = {"type": "tool_use", "id": "toolu_9", "name": "get_weather", "input": {"city": "Oslo"}}
    # Block 1's stop lost, then a call whose start carries its input, then the message's
    # end: no stop for either.
    events = _message(blocks[0], blocks[1][:-1], [{"type": "content_block_start", "index": 2}])
    events[-3]["content_block"] = call
    publisher, sink = _make(dialect)
    result = await publish(publisher, events, stream_id="conv_1")
    assert check(sink.events) == []
    assert result.text == MARKER
    assert [(c.id, c.input) for c in result.tool_calls] == [("toolu_9", {"city": "Oslo"})]
    parsed = reassemble_events(sink.events)
    assert parsed.complete
    assert [(c.tool_use_id, c.params) for c in parsed.tool_calls] == [("toolu_9", {"city": "Oslo"})]


@pytest.mark.anyio
async def test_empty_blocks_are_dropped_and_later_blocks_renumbered() -> None:
    events = _load("text_only")
    empty = [
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "thinking", "thinking": "", "signature": ""},
        },
        {"type": "ping"},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "thinking_delta", "thinking": ""},
        },
        {"type": "content_block_stop", "index": 0},
    ]
    for event in events[2:8]:
        if "index" in event:
            event["index"] = 1
    events[2:2] = empty
    publisher, sink = _make("anthropic")
    await publish(publisher, events, stream_id="conv_1")
    payloads = _payloads(sink.events)
    assert [p["type"] for p in payloads[:4]] == [
        "message_start",
        "ping",
        "ping",
        "content_block_start",
    ]
    assert {p.get("index") for p in payloads if "index" in p} == {0}
    assert check(sink.events) == []


@pytest.mark.anyio
async def test_a_block_left_open_at_message_delta_is_closed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    events = [e for e in _load("text_only") if e["type"] != "content_block_stop"]
    publisher, sink = _make("anthropic")
    with caplog.at_level(logging.WARNING, logger="essessey"):
        result = await publish(publisher, events, stream_id="conv_1")
    assert check(sink.events) == []
    assert result.stop_reason == "end_turn"
    assert [e.event for e in sink.events][-3:] == [
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert any("still open" in r.getMessage() for r in caplog.records)


@pytest.mark.anyio
async def test_input_given_in_a_tool_use_start_is_kept() -> None:
    events = _load("thinking_text_tool")
    events[12] = {
        **events[12],
        "content_block": {**events[12]["content_block"], "input": {"city": "Lyon"}},
    }
    del events[13:17]
    publisher, sink = _make("anthropic")
    result = await publish(publisher, events, stream_id="conv_1")
    assert result.tool_calls[0].input == {"city": "Lyon"}
    assert read_message(sink.events).content[2].input == {"city": "Lyon"}


def _message(*blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A provider message around ``blocks`` (each a block's start, deltas and stop)."""
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x"}
    message |= {"content": [], "stop_reason": None, "stop_sequence": None}
    message["usage"] = {"input_tokens": 5, "output_tokens": 1}
    end = {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}}
    end["usage"] = {"output_tokens": 3}
    events: list[dict[str, Any]] = [{"type": "message_start", "message": message}]
    for block in blocks:
        events += block
    return [*events, end, {"type": "message_stop"}]


def _block(index: int, start: dict[str, Any], *deltas: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"type": "content_block_start", "index": index, "content_block": start},
        *({"type": "content_block_delta", "index": index, "delta": d} for d in deltas),
        {"type": "content_block_stop", "index": index},
    ]


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_content_a_block_s_start_carries_is_its_first_content(dialect: Dialect) -> None:
    # An Anthropic-compatible server may send a block's content in its start, as the
    # SDK's accumulator keeps it: the text's start went missing, and a thinking block
    # that came whole in its start (no deltas) was not published at all.
    citation = {"type": "web_search_result_location", "url": "https://a.example/"}
    citation |= {"title": "A", "cited_text": "Hello", "encrypted_index": "x"}
    events = _message(
        _block(0, {"type": "thinking", "thinking": "Hmm.", "signature": "c2ln"}),
        _block(
            1,
            {"type": "text", "text": "Hello", "citations": [citation]},
            {"type": "text_delta", "text": " world"},
        ),
    )
    publisher, sink = _make(dialect)
    result = await publish(publisher, events, stream_id="conv_1")
    assert check(sink.events) == []
    parsed = reassemble_events(sink.events)
    assert (parsed.thinking, parsed.signature, parsed.text) == ("Hmm.", "c2ln", "Hello world")
    assert list(parsed.citations) == [citation]
    assert (result.thinking, result.text) == ("Hmm.", "Hello world")


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_tool_use_start_s_input_gives_way_to_its_deltas(dialect: Dialect) -> None:
    # The start's input was kept as a first fragment and the deltas appended to it:
    # '{"a":1}{"b": 2}', arguments no client could parse. The SDK takes the deltas.
    start = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}}
    events = _message(_block(0, start, {"type": "input_json_delta", "partial_json": '{"b": 2}'}))
    publisher, sink = _make(dialect)
    result = await publish(publisher, events, stream_id="conv_1")
    assert check(sink.events) == []
    [call] = reassemble_events(sink.events).tool_calls
    assert call.arguments == '{"b": 2}'
    assert result.tool_calls[0].input == {"b": 2}


@pytest.mark.anyio
async def test_a_text_block_with_citations_and_no_text_is_dropped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    citation = {"type": "web_search_result_location", "url": "https://a.example/"}
    events = _message(
        _block(0, {"type": "text", "text": ""}, {"type": "citations_delta", "citation": citation})
    )
    publisher, sink = _make("essessey")
    with caplog.at_level(logging.WARNING, logger="essessey.adapters.anthropic"):
        await publish(publisher, events, stream_id="conv_1")
    assert check(sink.events) == []
    assert "the 1 delta(s) it held are not published" in caplog.text


# -- property: any content, cut into any deltas, comes out whole --------------------------------

_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=8,
)


def _cuts(draw: st.DrawFn, value: str) -> list[str]:
    points = sorted(draw(st.sets(st.integers(0, len(value)), max_size=6)))
    bounds = [0, *points, len(value)]
    return [value[a:b] for a, b in itertools.pairwise(bounds)]


@st.composite
def _provider_stream(draw: st.DrawFn) -> tuple[list[dict[str, Any]], str, str, list[Any]]:
    thinking, text = draw(_text), draw(_text)
    inputs = draw(st.lists(st.dictionaries(_text, _json, max_size=3), max_size=2))
    events: list[dict[str, Any]] = [_load("text_only")[0]]
    index = 0

    def block(start: dict[str, Any], kind: str, field: str, value: str) -> None:
        nonlocal index
        events.append({"type": "content_block_start", "index": index, "content_block": start})
        for chunk in _cuts(draw, value):
            if draw(st.booleans()):
                events.append({"type": "ping"})
            delta = {"type": kind, field: chunk}
            events.append({"type": "content_block_delta", "index": index, "delta": delta})
        events.append({"type": "content_block_stop", "index": index})
        index += 1

    if thinking:
        block(
            {"type": "thinking", "thinking": "", "signature": ""},
            "thinking_delta",
            "thinking",
            thinking,
        )
    if text:
        block({"type": "text", "text": ""}, "text_delta", "text", text)
    for n, value in enumerate(inputs):
        start = {"type": "tool_use", "id": f"toolu_{n}", "name": "f", "input": {}}
        block(start, "input_json_delta", "partial_json", orjson.dumps(value).decode())
    reason = "tool_use" if inputs else "end_turn"
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": None},
            "usage": {"output_tokens": 3},
        }
    )
    events.append({"type": "message_stop"})
    return events, thinking, text, inputs


@settings(max_examples=100, deadline=None)
@given(stream=_provider_stream(), dialect=st.sampled_from(DIALECTS))
def test_any_cut_of_the_content_comes_out_whole(
    stream: tuple[list[dict[str, Any]], str, str, list[Any]], dialect: Dialect
) -> None:
    events, thinking, text, inputs = stream

    async def main() -> None:
        publisher, sink = _make(dialect)
        result = await publish(publisher, events, stream_id="conv_1")
        assert (result.thinking, result.text) == (thinking, text)
        assert [c.input for c in result.tool_calls] == inputs
        assert check(sink.events) == []
        parsed = reassemble_events(sink.events)
        assert (parsed.thinking, parsed.text) == (thinking, text)
        assert [c.params for c in parsed.tool_calls] == inputs
        if dialect == "anthropic":
            assert _payloads(sink.events) == _with_stream_id(events, "conv_1")

    anyio.run(main)


@settings(max_examples=100, deadline=None)
@given(stream=_provider_stream(), dialect=st.sampled_from(DIALECTS), data=st.data())
def test_any_lost_block_stops_leave_the_content_whole(
    stream: tuple[list[dict[str, Any]], str, str, list[Any]], dialect: Dialect, data: st.DataObject
) -> None:
    events, thinking, text, inputs = stream
    stops = [i for i, event in enumerate(events) if event["type"] == "content_block_stop"]
    lost = data.draw(st.sets(st.sampled_from(stops)) if stops else st.just(set()))
    kept = [event for i, event in enumerate(events) if i not in lost]

    async def main() -> None:
        publisher, sink = _make(dialect)
        result = await publish(publisher, kept, stream_id="conv_1")
        assert (result.thinking, result.text) == (thinking, text)
        assert [c.input for c in result.tool_calls] == inputs
        assert check(sink.events) == []
        parsed = reassemble_events(sink.events)
        assert parsed.complete
        assert (parsed.thinking, parsed.text) == (thinking, text)
        assert [c.params for c in parsed.tool_calls] == inputs

    anyio.run(main)


_STRAY: Final = st.one_of(
    st.builds(
        lambda i, t: {"type": "content_block_start", "index": i, "content_block": {"type": t}},
        st.integers(-1, 6),
        st.sampled_from(["text", "thinking", "tool_use", "redacted_thinking"]),
    ),
    st.builds(
        lambda i: {
            "type": "content_block_delta",
            "index": i,
            "delta": {"type": "text_delta", "text": MARKER},
        },
        st.integers(-1, 6),
    ),
    st.builds(lambda i: {"type": "content_block_stop", "index": i}, st.integers(-1, 6)),
    st.just({"type": "ping"}),
    st.just({"type": "message_stop"}),
    st.just({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {}}),
)


@settings(max_examples=100, deadline=None)
@given(stream=_provider_stream(), dialect=st.sampled_from(DIALECTS), data=st.data())
def test_a_mangled_stream_is_published_as_a_valid_stream(
    stream: tuple[list[dict[str, Any]], str, str, list[Any]], dialect: Dialect, data: st.DataObject
) -> None:
    # Events lost, repeated and stray ones inserted anywhere after message_start: whatever
    # comes of it goes out as a stream every reader takes, and payload never reaches a log.
    events = stream[0]
    sent = [events[0], *mangled(data, events[1:], _STRAY)]

    async def published() -> list[Event]:
        publisher, sink = _make(dialect)
        await publish(publisher, sent, stream_id="conv_1")
        return sink.events

    assert_published_quietly(published, MARKER)


@pytest.mark.anyio
async def test_a_ping_after_the_message_stop_is_skipped_with_a_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # What the published stream ends with must read as its end: a provider's ping after
    # the stop (none sends one; the fuzzer did) is not passed on.
    publisher, sink = _make("anthropic")
    events = [*_load("two_parallel_tools"), {"type": "ping"}]
    with caplog.at_level(logging.WARNING, logger="essessey.adapters.anthropic"):
        await publish(publisher, events, stream_id="conv_1")
    assert sink.events[-1].event == "message_stop"
    assert check(sink.events) == []
    assert "(ping): the message already ended" in caplog.text


_TWO_DELTAS: list[dict[str, Any]] = [
    {
        "type": "message_start",
        "message": {
            "id": "msg_2d",
            "type": "message",
            "role": "assistant",
            "model": "claude-x",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 50, "output_tokens": 1},
        },
    },
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
    {"type": "content_block_stop", "index": 0},
    {
        "type": "message_delta",
        "delta": {"stop_reason": None, "stop_sequence": None},
        "usage": {"output_tokens": 10},
    },
    {"type": "ping"},
    {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {"output_tokens": 42, "cache_read_input_tokens": 7},
    },
    {"type": "message_stop"},
]


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_second_message_delta_joins_the_first_as_the_sdk_reads_them(
    dialect: Dialect,
) -> None:
    # A compatible server's usage-only message_delta, then the one with the stop reason:
    # the SDK's accumulator overwrites the stop, and each count, with the later one's.
    sdk_message, _ = sdk_stream_events(_TWO_DELTAS)
    publisher, sink = _make(dialect)
    result = await publish(publisher, _TWO_DELTAS, stream_id="s")
    assert check(sink.events) == []
    names = [event.event for event in sink.events]
    assert names.count("message_delta") == 1
    assert names[-2:] == ["message_delta", "message_stop"]
    rebuilt = reassemble_events(sink.events)
    assert result.stop_reason == rebuilt.stop_reason == sdk_message.stop_reason == "end_turn"
    assert result.usage["output_tokens"] == sdk_message.usage.output_tokens == 42
    assert rebuilt.usage["output_tokens"] == 42
    assert rebuilt.usage["cache_read_input_tokens"] == 7
    if dialect == "anthropic":
        assert read_message(sink.events).stop_reason == "end_turn"


@pytest.mark.anyio
async def test_a_held_stop_goes_out_before_a_provider_error() -> None:
    # What was read before the failure is published: the stop, then the error.
    events = [*_TWO_DELTAS[:5], {"type": "error", "error": {"type": "overloaded_error"}}]
    publisher, sink = _make("essessey")
    await publish(publisher, events, stream_id="s")
    names = [event.event for event in sink.events]
    assert names[-2:] == ["message_delta", "error"]
    assert check(sink.events) == []


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_compaction_block_s_delta_fills_the_result_s_block(dialect: Dialect) -> None:
    # The compaction's summary comes in its compaction_delta: the result's content (what
    # the next request sends back) holds it, as the SDK's beta accumulator sets it.
    events: list[dict[str, Any]] = [
        _TWO_DELTAS[0],
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "compaction", "content": None, "encrypted_content": None},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {
                "type": "compaction_delta",
                "content": "Summary of the chat",
                "encrypted_content": "ENC123",
            },
        },
        {"type": "content_block_stop", "index": 0},
        *[{**e, "index": 1} if "index" in e else e for e in _TWO_DELTAS[1:4]],
        _TWO_DELTAS[6],
        _TWO_DELTAS[7],
    ]
    publisher, sink = _make(dialect)
    result = await publish(publisher, events, stream_id="s")
    assert check(sink.events) == []
    assert result.content[0] == {
        "type": "compaction",
        "content": "Summary of the chat",
        "encrypted_content": "ENC123",
    }
    assert result.text == "Hi"


@pytest.mark.anyio
async def test_a_fallback_block_names_the_model_that_served_the_response() -> None:
    fallback = {
        "type": "fallback",
        "from": {"model": "claude-x"},
        "to": {"model": "claude-y"},
        "trigger": {"type": "refusal"},
    }
    events: list[dict[str, Any]] = [
        _TWO_DELTAS[0],
        {"type": "content_block_start", "index": 0, "content_block": fallback},
        {"type": "content_block_stop", "index": 0},
        *[{**e, "index": 1} if "index" in e else e for e in _TWO_DELTAS[1:4]],
        _TWO_DELTAS[6],
        _TWO_DELTAS[7],
    ]
    publisher, sink = _make("anthropic")
    result = await publish(publisher, events, stream_id="s")
    assert check(sink.events) == []
    # As the SDK's beta accumulator (fallbacks are a beta) names it.
    assert result.model == "claude-y"


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_held_stop_no_writer_takes_is_skipped_and_the_cut_stream_ends(
    dialect: Dialect,
) -> None:
    # A count past 64 bits in the message_delta, and the stream cut before message_stop:
    # the stop is refused when it would go out (logged), and the message ends with the
    # cut stream's error, as a delta refused at its own event did.
    events = [*_TWO_DELTAS[:4]]
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 2**64},
        }
    )
    publisher, sink = _make(dialect)
    await publish(publisher, events, stream_id="s")
    assert check(sink.events) == []
    assert [event.event for event in sink.events][-1] == "error"


def _counted_message(n: int) -> list[dict[str, Any]]:
    """A provider message whose input count is in its start only (the Messages API's
    usual split: message_delta carries the output count)."""
    text = _block(0, {"type": "text", "text": ""}, {"type": "text_delta", "text": f"Round {n}."})
    events = _message(text)
    events[0]["message"]["usage"] = {
        "input_tokens": 10,
        "cache_read_input_tokens": 4,
        "output_tokens": 1,
    }
    events[-2]["usage"] = {"output_tokens": 20}
    return events


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_turn_s_usage_sums_its_rounds_input_counts_given_in_their_starts(
    dialect: Dialect,
) -> None:
    publisher, sink = _make(dialect)
    async with stream_rounds(publisher, message_id="m", stream_id="s", model="claude-x") as rounds:
        for n in (1, 2):
            await rounds.round_start()
            await stream_round(rounds, _counted_message(n))
            await rounds.round_end()
    assert check(sink.events) == []
    usage = reassemble_events(sink.events).usage
    assert (usage["input_tokens"], usage["cache_read_input_tokens"]) == (20, 8)
    assert usage["output_tokens"] == 40


@pytest.mark.anyio
@pytest.mark.parametrize("given", [None, []])
async def test_a_text_start_s_citations_go_out_as_they_came_in_the_anthropic_dialect(
    given: Any,
) -> None:
    # A start whose citations hold nothing has nothing to move into deltas: null stays
    # null (the SDK reads TextBlock.citations as None from the provider, and must from us).
    start = {"type": "text", "text": "", "citations": given}
    events = _message(_block(0, start, {"type": "text_delta", "text": "Hi"}))
    publisher, sink = _make("anthropic")
    await publish(publisher, events, stream_id="s")
    [started] = [p for p in _payloads(sink.events) if p["type"] == "content_block_start"]
    assert started["content_block"] == start
    assert read_message(sink.events).content[0].citations == given
