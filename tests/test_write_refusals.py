"""Write-side refusals emit nothing partial: a value that cannot be written is refused
before its block opens, a refused request changes nothing, a refused epilogue still ends
the stream, and the stream passes ``check`` after every refusal."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from essessey import (
    InMemorySink,
    ProtocolError,
    Publisher,
    SerializationError,
    check,
    reassemble_events,
    stream_turn,
)
from essessey.adapters import ToolCallRequest, stream_rounds

pytestmark = pytest.mark.anyio

LONE = "\ud800"


def _names(sink: InMemorySink) -> list[str]:
    return [event.event for event in sink.events]


async def _refused_in_turn(
    write: Callable[[Any], Awaitable[Any]], error: type[Exception]
) -> InMemorySink:
    """Run a turn whose body makes one refused write (caught), then a good one: what was
    emitted by the refused write is nothing, and the stream ends whole."""
    sink = InMemorySink()
    async with stream_turn(Publisher(sink), message_id="m", stream_id="s", model="x") as turn:
        before = list(sink.events)
        with pytest.raises(error):
            await write(turn)
        assert sink.events == before
        await (await turn.text()).write("after")
    assert check(sink.events) == []
    assert reassemble_events(sink.events).text == "after"
    return sink


@pytest.mark.parametrize("chunk", [LONE, 5, None, b"x"])
async def test_a_first_chunk_that_cannot_be_written_opens_no_block(chunk: Any) -> None:
    async def write(turn: Any) -> None:
        await (await turn.text()).write(chunk)

    await _refused_in_turn(write, SerializationError)


async def test_a_thinking_block_s_refused_signature_opens_no_block() -> None:
    async def write(turn: Any) -> None:
        await (await turn.thinking()).write_signature(LONE)

    await _refused_in_turn(write, SerializationError)


async def test_a_call_whose_arguments_cannot_be_written_opens_no_block() -> None:
    async def start(turn: Any) -> None:
        await (await turn.tools()).start_call("c1", "f", '{"a":"' + LONE + '"}')

    async def client(turn: Any) -> None:
        await turn.call_client_tool("f", '{"a":"' + LONE + '"}')

    await _refused_in_turn(start, SerializationError)
    await _refused_in_turn(client, SerializationError)


async def test_a_result_that_cannot_be_written_emits_nothing_not_even_the_call_s_end() -> None:
    sink = InMemorySink()
    async with stream_turn(Publisher(sink), message_id="m", stream_id="s", model="x") as turn:
        tools = await turn.tools()
        await tools.start_call("c1", "f", "{}")
        before = list(sink.events)
        with pytest.raises(SerializationError):
            await tools.write_result("c1", LONE)
        assert sink.events == before
        await tools.write_result("c1", "done")
    assert check(sink.events) == []
    [result] = reassemble_events(sink.events).tool_results
    assert result.text == "done"


async def test_publisher_whole_blocks_refuse_before_they_open() -> None:
    sink = InMemorySink()
    publisher = Publisher(sink)
    await publisher.send_message_start("m", "s", "x")
    with pytest.raises(SerializationError):
        await publisher.send_tool_use_block(0, "t1", "f", LONE)
    with pytest.raises(SerializationError):
        await publisher.send_tool_result_block(0, "t1", LONE)
    assert _names(sink) == ["message_start"]


@pytest.mark.parametrize(
    ("setting", "value"),
    [("usage", {"x": "1"}), ("stop_reason", 5), ("output_tokens", True)],
)
async def test_a_refused_epilogue_still_ends_the_stream(setting: str, value: Any) -> None:
    sink = InMemorySink()

    async def run() -> None:
        async with stream_turn(Publisher(sink), message_id="m", stream_id="s", model="x") as turn:
            await (await turn.text()).write("hi")
            setattr(turn, setting, value)

    with pytest.raises((TypeError, SerializationError)):
        await run()
    assert check(sink.events) == []
    assert _names(sink)[-1] == "error"


async def test_a_refused_epilogue_of_rounds_still_ends_the_stream() -> None:
    sink = InMemorySink()

    async def run() -> None:
        publisher = Publisher(sink)
        async with stream_rounds(publisher, message_id="m", stream_id="s", model="x") as rounds:
            rounds.output_tokens = "many"  # type: ignore[assignment]

    with pytest.raises(TypeError):
        await run()
    assert check(sink.events) == []
    assert _names(sink)[-1] == "error"


@pytest.mark.parametrize(
    "ask",
    [
        lambda turn: turn.ask_approval("c1", expires_in=-1),
        lambda turn: turn.ask_approval("c1", expires_in=math.inf),
        lambda turn: turn.ask_approval("c1", expires_in=1e300),
        lambda turn: turn.ask_approval("nobody"),
        lambda turn: turn.ask("Which?", schema={1: 2}),
        lambda turn: turn.ask(LONE),
    ],
)
async def test_a_refused_request_defers_no_call(ask: Callable[[Any], Awaitable[Any]]) -> None:
    # Asking defers the round's calls (they wait for the client): a request refused must
    # leave them as they were, answered with an error result when the message ends.
    sink = InMemorySink()
    async with stream_turn(Publisher(sink), message_id="m", stream_id="s", model="x") as turn:
        await (await turn.tools()).start_call("c1", "f", "{}")
        with pytest.raises((ValueError, ProtocolError, SerializationError)):
            await ask(turn)
    assert check(sink.events) == []
    parsed = reassemble_events(sink.events)
    assert [(r.tool_use_id, r.is_error) for r in parsed.tool_results] == [("c1", True)]


@pytest.mark.parametrize(
    "call",
    [
        lambda p: p.send_message_start(None, "s", "x"),
        lambda p: p.send_message_start("m", "s", "x", input_tokens=True),
        lambda p: p.send_message_start("m", "s", "x", input_tokens=math.nan),
        lambda p: p.send_message_delta(5, 0),
        lambda p: p.send_message_delta("end_turn", None),
        lambda p: p.publish(5, {}),
        lambda p: p.publish("custom" + LONE, {}),
        lambda p: p.send_tool_use_start(0, "", "f"),
    ],
)
async def test_message_fields_of_the_wrong_type_are_refused(
    call: Callable[[Publisher], Awaitable[None]],
) -> None:
    sink = InMemorySink()
    with pytest.raises((TypeError, ValueError)):
        await call(Publisher(sink))
    assert sink.events == []


async def test_round_calls_refused_emit_nothing() -> None:
    sink = InMemorySink()
    async with stream_rounds(Publisher(sink), message_id="m", stream_id="s", model="x") as rounds:
        await rounds.round_start()
        before = list(sink.events)
        with pytest.raises(SerializationError):
            await rounds.delta(reasoning="thinking", signature=LONE)
        with pytest.raises(SerializationError):
            await rounds.tool_call_start(0, ToolCallRequest("c1", "f", arguments=LONE))
        assert sink.events == before
        await rounds.delta(text="ok")
        await rounds.round_end()
    assert check(sink.events) == []
    assert reassemble_events(sink.events).text == "ok"
