"""The UI message stream encoding of a turn, chunk by chunk (the Node tests check the same
with the AI SDK's own client: tests/test_ui_node.py)."""

from __future__ import annotations

import logging

import orjson
import pytest

from essessey import Event, InMemorySink, Publisher, StopReason, stream_turn
from essessey.dialects.ui import DONE, UIMessageEncoder


async def agent_turn(*, dialect: str = "essessey") -> list[Event]:
    """Two rounds: thinking, text, two parallel tool calls and their results (one an
    error), then a final text."""
    sink = InMemorySink()
    p = Publisher(sink, dialect=dialect)  # type: ignore[arg-type]
    await p.send_stream_preamble("msg_1", "chat-1", "m")
    await p.send_content_block_start_thinking(0)
    await p.send_content_block_delta_thinking(0, "Two cities.")
    await p.send_signature_delta(0, "sig")
    await p.send_content_block_stop(0)
    await p.send_content_block_start_text(1)
    await p.send_content_block_delta_text(1, "Let me ")
    await p.send_content_block_delta_text(1, "check.")
    await p.send_content_block_stop(1)
    await p.send_tool_use_start(2, "call_1", "get_weather")
    await p.send_tool_input_delta(2, '{"city":')
    await p.send_tool_input_delta(2, '"Paris"}')
    await p.send_content_block_stop(2)
    await p.send_tool_use_block(3, "call_2", "get_weather", {"city": "Oslo"})
    await p.send_tool_result_block(4, "call_1", '{"temp_c":18}')
    await p.send_tool_result_block(5, "call_2", "station offline", is_error=True)
    await p.send_stream_epilogue(StopReason.TOOL_USE, 10)
    await p.send_stream_preamble("msg_2", "chat-1", "m")
    await p.send_content_block_start_text(0)
    await p.send_content_block_delta_text(0, "Sunny in Paris.")
    await p.send_content_block_stop(0)
    await p.send_stream_epilogue(StopReason.END_TURN, 4)
    return sink.events


def encode(events: list[Event], *, usage_metadata: bool = False) -> list[object]:
    # The finish's usage metadata is tested on its own (test_dialect_usage.py).
    encoder = UIMessageEncoder(usage_metadata=usage_metadata)
    body = b"".join(line for event in events for line in encoder.feed(event)) + encoder.close()
    assert body.endswith(DONE)
    lines = body[: -len(DONE)].split(b"\n\n")
    assert lines[-1] == b""
    return [orjson.loads(line.removeprefix(b"data: ")) for line in lines[:-1]]


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", ["essessey", "anthropic"])
async def test_a_two_round_turn_is_one_message_of_two_steps(dialect: str) -> None:
    assert encode(await agent_turn(dialect=dialect)) == [
        {"type": "start", "messageId": "msg_1"},
        {"type": "start-step"},
        {"type": "reasoning-start", "id": "1-0"},
        {"type": "reasoning-delta", "id": "1-0", "delta": "Two cities."},
        {
            "type": "reasoning-end",
            "id": "1-0",
            "providerMetadata": {"essessey": {"signature": "sig"}},
        },
        {"type": "text-start", "id": "1-1"},
        {"type": "text-delta", "id": "1-1", "delta": "Let me "},
        {"type": "text-delta", "id": "1-1", "delta": "check."},
        {"type": "text-end", "id": "1-1"},
        {"type": "tool-input-start", "toolCallId": "call_1", "toolName": "get_weather"},
        {"type": "tool-input-delta", "toolCallId": "call_1", "inputTextDelta": '{"city":'},
        {"type": "tool-input-delta", "toolCallId": "call_1", "inputTextDelta": '"Paris"}'},
        {
            "type": "tool-input-available",
            "toolCallId": "call_1",
            "toolName": "get_weather",
            "input": {"city": "Paris"},
        },
        {"type": "tool-input-start", "toolCallId": "call_2", "toolName": "get_weather"},
        {"type": "tool-input-delta", "toolCallId": "call_2", "inputTextDelta": '{"city":"Oslo"}'},
        {
            "type": "tool-input-available",
            "toolCallId": "call_2",
            "toolName": "get_weather",
            "input": {"city": "Oslo"},
        },
        {"type": "tool-output-available", "toolCallId": "call_1", "output": {"temp_c": 18}},
        {"type": "tool-output-error", "toolCallId": "call_2", "errorText": "station offline"},
        {"type": "finish-step"},
        {"type": "start-step"},
        {"type": "text-start", "id": "2-0"},
        {"type": "text-delta", "id": "2-0", "delta": "Sunny in Paris."},
        {"type": "text-end", "id": "2-0"},
        {"type": "finish-step"},
        {"type": "finish", "finishReason": "stop"},
    ]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("stop_reason", "last"),
    [
        (StopReason.END_TURN, {"type": "finish", "finishReason": "stop"}),
        (StopReason.TOOL_USE, {"type": "finish", "finishReason": "tool-calls"}),
        (StopReason.MAX_TOKENS, {"type": "finish", "finishReason": "length"}),
        ("pause_turn", {"type": "finish", "finishReason": "other"}),
        (StopReason.CANCELLED, {"type": "abort"}),
    ],
)
async def test_the_stop_reason_becomes_the_finish(stop_reason: str, last: object) -> None:
    sink = InMemorySink()
    p = Publisher(sink)
    await p.send_stream_preamble("msg_1", "s", "m")
    await p.send_content_block_start_text(0)
    await p.send_content_block_delta_text(0, "hi")
    await p.send_content_block_stop(0)
    await p.send_stream_epilogue(stop_reason, 1)
    assert encode(sink.events)[-1] == last


@pytest.mark.anyio
async def test_an_error_event_ends_the_stream_with_its_message() -> None:
    sink = InMemorySink()
    p = Publisher(sink)
    await p.send_stream_preamble("msg_1", "s", "m")
    await p.send_content_block_start_text(0)
    await p.send_content_block_delta_text(0, "hal")
    await p.send_error("overloaded_error", "the provider is overloaded")
    chunks = encode(sink.events)
    assert chunks[-1] == {"type": "error", "errorText": "the provider is overloaded"}
    assert {"type": "finish"} not in chunks  # the client reads nothing after the error


def test_bad_input_is_skipped_with_a_reason_and_no_content(
    caplog: pytest.LogCaptureFixture,
) -> None:
    encoder = UIMessageEncoder()
    secret = "do-not-log-me"
    with caplog.at_level(logging.WARNING, logger="essessey.dialects.ui"):
        assert encoder.feed(Event("content_block_delta", secret.encode())) == []
        assert encoder.feed(Event("content_block_delta", b'{"index":0}')) == []  # no message
        encoder.feed(Event("message_start", b'{"type":"message_start","message":{"id":"m"}}'))
        delta = b'{"type":"content_block_delta","index":7,"delta":{"type":"text_delta","text":"x"}}'
        assert encoder.feed(Event("content_block_delta", delta)) == []  # no such block
    assert len(caplog.records) == 3
    assert secret not in caplog.text


def test_an_unknown_block_is_a_custom_chunk_and_an_oversized_one_is_left_out() -> None:
    encoder = UIMessageEncoder(max_buffer=64)
    events = [
        Event("message_start", b'{"type":"message_start","message":{"id":"m"}}'),
        Event("content_block_start", b'{"index":0,"content_block":{"type":"citation","n":1}}'),
        Event("content_block_delta", b'{"index":0,"delta":{"type":"cite_delta","q":"a"}}'),
        Event("content_block_stop", b'{"index":0}'),
        Event("content_block_start", b'{"index":1,"content_block":{"type":"citation"}}'),
        Event("content_block_delta", b'{"index":1,"delta":{"type":"x","q":"' + b"a" * 80 + b'"}}'),
        Event("content_block_stop", b'{"index":1}'),
    ]
    lines = [line for event in events for line in encoder.feed(event)]
    parts = [orjson.loads(line.removeprefix(b"data: ")) for line in lines]
    assert parts[2:] == [
        {
            "type": "custom",
            "kind": "essessey.citation",
            "providerMetadata": {
                "essessey": {
                    "id": "1-0-citation",
                    "block": {"type": "citation", "n": 1},
                    "deltas": [{"type": "cite_delta", "q": "a"}],
                }
            },
        }
    ]


def test_for_the_6x_line_an_unknown_block_is_a_data_part() -> None:
    encoder = UIMessageEncoder(custom_chunks=False)
    events = [
        Event("message_start", b'{"type":"message_start","message":{"id":"m"}}'),
        Event("content_block_start", b'{"index":0,"content_block":{"type":"citation","n":1}}'),
        Event("content_block_stop", b'{"index":0}'),
    ]
    lines = [line for event in events for line in encoder.feed(event)]
    assert orjson.loads(lines[-1].removeprefix(b"data: ")) == {
        "type": "data-essessey-block",
        "id": "1-0-citation",
        "data": {"block": {"type": "citation", "n": 1}, "deltas": []},
    }


def _last_step_parts(chunks: list[object]) -> tuple[set[str], set[str]]:
    """The tool calls whose parts open in the message's last step, and those of earlier
    steps (a part is placed where its ``tool-input-start`` comes)."""
    earlier: set[str] = set()
    last: set[str] = set()
    for chunk in chunks:
        assert isinstance(chunk, dict)
        if chunk["type"] == "start-step":
            earlier |= last
            last = set()
        elif chunk["type"] == "tool-input-start":
            last.add(chunk["toolCallId"])
    return last, earlier


@pytest.mark.anyio
@pytest.mark.parametrize(
    "asks",
    [
        ["approval", "question"],
        ["question", "approval"],
        ["call_question", "question"],
    ],
)
async def test_what_one_message_asks_after_a_call_it_ran_stays_in_one_step(
    asks: list[str],
) -> None:
    # The AI SDK's clients send a message's answers once every part of its last step
    # is answered: a request in an earlier step would go unanswered, and the route
    # refuses an answer that leaves one out.
    sink = InMemorySink()
    async with stream_turn(Publisher(sink), message_id="m1", stream_id="s", model="m") as turn:
        tools = await turn.tools()
        await tools.start_call("call_lookup", "lookup", '{"q":"x"}')
        await tools.start_call("call_pay", "pay", '{"usd":5}')
        await tools.write_result("call_lookup", "found")
        for n, kind in enumerate(asks):
            if kind == "approval":
                await turn.ask_approval("call_pay", request_id="apr_1")
            elif kind == "call_question":
                await turn.ask("Which card?", request_id=f"q_{n}", tool_use_id="call_pay")
            else:
                await turn.ask("Which unit?", request_id=f"q_{n}")
    last, earlier = _last_step_parts(encode(sink.events))
    assert earlier == set()  # one step: the call that ran is with what the message asks
    assert {"call_lookup", "call_pay"} <= last


@pytest.mark.anyio
async def test_the_next_round_after_a_call_it_ran_is_a_step_of_its_own() -> None:
    sink = InMemorySink()
    async with stream_turn(Publisher(sink), message_id="m1", stream_id="s", model="m") as turn:
        tools = await turn.tools()
        await tools.start_call("call_lookup", "lookup", '{"q":"x"}')
        await tools.write_result("call_lookup", "found")
        tools = await turn.tools()
        await tools.start_call("call_pay", "pay", '{"usd":5}')
        await turn.ask_approval("call_pay", request_id="apr_1")
    last, earlier = _last_step_parts(encode(sink.events))
    assert (earlier, last) == ({"call_lookup"}, {"call_pay"})


@pytest.mark.anyio
async def test_a_client_call_and_a_question_after_a_call_it_ran_share_the_last_step() -> None:
    sink = InMemorySink()
    async with stream_turn(Publisher(sink), message_id="m1", stream_id="s", model="m") as turn:
        tools = await turn.tools()
        await tools.start_call("call_lookup", "lookup", '{"q":"x"}')
        await tools.write_result("call_lookup", "found")
        await turn.call_client_tool("get_location", {}, tool_use_id="call_where")
        await turn.ask("Which unit?", request_id="q_1")
    last, earlier = _last_step_parts(encode(sink.events))
    assert (earlier, last) == ({"call_lookup"}, {"call_where", "q_1"})


def _cut(chunks: list[object]) -> list[object]:
    assert all(isinstance(chunk, dict) for chunk in chunks)
    return [chunk["type"] for chunk in chunks]  # type: ignore[index]


@pytest.mark.anyio
async def test_a_stream_cut_inside_a_block_ends_its_part_before_the_finish() -> None:
    # A text part left streaming, a tool result never written, a signature never sent:
    # each part ends as its block's stop would have ended it.
    sink = InMemorySink()
    p = Publisher(sink)
    await p.send_stream_preamble("m1", "s", "m")
    await p.send_content_block_start_thinking(0)
    await p.send_content_block_delta_thinking(0, "Hmm.")
    await p.send_signature_delta(0, "sig")
    thinking = encode(sink.events)
    assert _cut(thinking)[-4:] == ["reasoning-delta", "reasoning-end", "finish-step", "finish"]
    assert thinking[-3] == {  # the signature goes out with the part's end
        "type": "reasoning-end",
        "id": "1-0",
        "providerMetadata": {"essessey": {"signature": "sig"}},
    }
    await p.send_content_block_stop(0)
    await p.send_tool_use_block(1, "call_1", "weather", {"city": "Paris"})
    await p.send_tool_result_start(2, "call_1")
    await p.send_tool_result_delta(2, "18")
    chunks = encode(sink.events)
    assert _cut(chunks)[-3:] == ["tool-output-available", "finish-step", "finish"]
    assert chunks[-3] == {"type": "tool-output-available", "toolCallId": "call_1", "output": 18}


@pytest.mark.anyio
async def test_a_message_cut_after_one_that_stopped_has_no_finish_reason_of_its_own() -> None:
    # The first message stopped for its tool call; the second never said why it
    # stopped: the turn's finish reason is not the first message's.
    sink = InMemorySink()
    p = Publisher(sink)
    await p.send_stream_preamble("m1", "s", "m")
    await p.send_tool_use_block(0, "call_1", "weather", {"city": "Paris"})
    await p.send_tool_result_block(1, "call_1", "18")
    await p.send_stream_epilogue(StopReason.TOOL_USE, 5)
    await p.send_stream_preamble("m2", "s", "m")
    await p.send_content_block_start_text(0)
    await p.send_content_block_delta_text(0, "It is 18 and")
    chunks = encode(sink.events)
    assert chunks[-1] == {"type": "finish"}
    assert _cut(chunks)[-4:] == ["text-delta", "text-end", "finish-step", "finish"]
