"""The official ``anthropic`` SDK reads an anthropic-dialect stream from EventStreamResponse.

The SDK POSTs to ``{base_url}/v1/messages``; the app below answers there, and the model
name in the request picks the turn it streams.
"""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

from essessey import (
    ApprovalRequest,
    ClientToolCall,
    Publisher,
    Question,
    StreamRejected,
    Turn,
    TurnProducer,
    stream_turn,
)
from essessey.bindings.sse import EventStreamResponse
from tests.servers import serve

pytestmark = pytest.mark.anyio

THINKING = ["The user wants the weather ", "in Paris; ", "a tool call is needed."]
SIGNATURE = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"
TEXT = ["Let me ", "check the ", "weather for you. ", "Ünïcödé and\nnewlines survive."]
TOOL_ID = "toolu_01A09q90qw90lq917835lq9"
TOOL_NAME = "get_weather"
TOOL_INPUT: dict[str, Any] = {"location": "Paris, FR", "unit": "celsius", "days": [1, 2]}
# The arguments arrive in fragments cut mid-token, as a model streams them.
TOOL_INPUT_FRAGMENTS = ['{"location": "Par', 'is, FR", "un', 'it": "celsius", "days": [1, ', "2]}"]
RESULT_TEXT = '{"temp_c": 21}'


async def thinking_and_text(turn: Turn) -> None:
    thinking = await turn.thinking()
    for chunk in THINKING:
        await thinking.write(chunk)
    await thinking.write_signature(SIGNATURE)
    text = await turn.text()
    for chunk in TEXT:
        await text.write(chunk)


async def tool_call_turn(publisher: Publisher) -> None:
    """Thinking, text and a tool call, ending with stop_reason tool_use: what the API sends
    when the model wants a tool run by the caller (no tool_result in the message)."""
    async with stream_turn(
        publisher, message_id="msg_sdk_1", stream_id="st_sdk", model="claude-test", input_tokens=25
    ) as turn:
        await thinking_and_text(turn)
        await turn.close_current()
        index = turn.next_index
        await publisher.send_tool_use_start(index, TOOL_ID, TOOL_NAME)
        for fragment in TOOL_INPUT_FRAGMENTS:
            await publisher.send_tool_input_delta(index, fragment)
        await publisher.send_content_block_stop(index)
        turn.stop_reason = "tool_use"
        turn.output_tokens = 87


async def tool_result_turn(publisher: Publisher) -> None:
    """The same, with the server-side tool's result streamed as a tool_result block."""
    async with stream_turn(
        publisher, message_id="msg_sdk_2", stream_id="st_sdk", model="claude-test"
    ) as turn:
        await thinking_and_text(turn)
        tools = await turn.tools()
        await tools.start_call(TOOL_ID, TOOL_NAME, TOOL_INPUT_FRAGMENTS[0])
        for fragment in TOOL_INPUT_FRAGMENTS[1:]:
            await tools.write_arguments(TOOL_ID, fragment)
        await tools.write_result(TOOL_ID, RESULT_TEXT)
        turn.stop_reason = "tool_use"
        turn.output_tokens = 90


async def rejected(publisher: Publisher) -> None:
    raise StreamRejected(429, "rate_limit_error", "Number of requests has exceeded your rate limit")


async def overloaded_mid_stream(publisher: Publisher) -> None:
    await publisher.send_stream_preamble("msg_sdk_3", "st_sdk", "claude-test")
    await publisher.send_content_block_start_text(0)
    await publisher.send_content_block_delta_text(0, "Partial")
    await publisher.send_error("overloaded_error", "Overloaded")


async def asking_turn(publisher: Publisher) -> None:
    """A message that asks (docs/asking.md): a client-side call, an approval of another
    call, a question; the stop reason says it waits."""
    async with stream_turn(
        publisher, message_id="msg_sdk_4", stream_id="st_sdk", model="claude-test"
    ) as turn:
        await (await turn.text()).write("Two things first.")
        tools = await turn.tools()
        await tools.start_call("call_pay", "pay", '{"usd": 5}')
        await turn.ask_approval("call_pay", reason="spends money", request_id="apr_1")
        await turn.call_client_tool("get_location", {}, tool_use_id="call_loc")
        await turn.ask("Which unit?", schema={"enum": ["C", "F"]}, request_id="q_1")


async def continuation_turn(publisher: Publisher) -> None:
    """What the hub writes when the answers come, then the app's rest, as one message."""
    asked = [
        ApprovalRequest("apr_1", "call_pay", "pay", {"usd": 5}),
        ClientToolCall("call_loc", "get_location", {}),
        Question("q_1", "Which unit?"),
    ]
    assert publisher.checker is not None
    publisher.checker.expect_answers(asked)  # asked by the message of the other request
    await publisher.send_stream_preamble("msg_sdk_5", "st_sdk", "claude-test")
    await publisher.send_approval_response(0, "apr_1", True)
    await publisher.send_tool_result_block(1, "call_loc", '{"city":"Oslo"}')
    await publisher.send_answer(2, "q_1", "C")
    await publisher.send_tool_result_block(3, "call_pay", '{"paid":true}')
    await publisher.send_content_block_start_text(4)
    await publisher.send_content_block_delta_text(4, "Paid; 3 C in Oslo.")
    await publisher.send_content_block_stop(4)
    await publisher.send_stream_epilogue("end_turn", 12)


PRODUCERS: dict[str, TurnProducer] = {
    "asking": asking_turn,
    "continuation": continuation_turn,
    "tool-call": tool_call_turn,
    "tool-result": tool_result_turn,
    "rejected": rejected,
    "overloaded": overloaded_mid_stream,
}
requests_seen: list[tuple[str, dict[str, Any]]] = []


async def messages(request: Request) -> EventStreamResponse:
    body: dict[str, Any] = await request.json()
    requests_seen.append((request.url.path, body))
    return EventStreamResponse(PRODUCERS[body["model"]], dialect="anthropic")


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    app = Starlette(routes=[Route("/v1/messages", messages, methods=["POST"])])
    with serve(app) as base:
        yield base


@pytest.fixture
async def client(base_url: str) -> AsyncIterator[anthropic.AsyncAnthropic]:
    sdk = anthropic.AsyncAnthropic(base_url=base_url, api_key="test", max_retries=0, timeout=10)
    async with sdk:
        yield sdk


def stream(client: anthropic.AsyncAnthropic, model: str) -> Any:
    return client.messages.stream(
        model=model,
        max_tokens=1024,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
    )


async def test_the_sdk_accumulates_thinking_text_and_tool_input(
    client: anthropic.AsyncAnthropic,
) -> None:
    requests_seen.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not even a warning from the SDK's models
        async with stream(client, "tool-call") as events:
            message = await events.get_final_message()

    path, body = requests_seen[-1]
    assert path == "/v1/messages"
    assert body["stream"] is True

    assert message.id == "msg_sdk_1"
    assert message.model == "claude-test"
    assert message.role == "assistant"
    assert message.stop_reason == "tool_use"
    assert message.usage.input_tokens == 25
    assert message.usage.output_tokens == 87
    assert [block.type for block in message.content] == ["thinking", "text", "tool_use"]
    thinking, text, tool_use = message.content
    assert thinking.type == "thinking"
    assert thinking.thinking == "".join(THINKING)
    assert thinking.signature == SIGNATURE
    assert text.type == "text"
    assert text.text == "".join(TEXT)
    assert tool_use.type == "tool_use"
    assert tool_use.id == TOOL_ID
    assert tool_use.name == TOOL_NAME
    assert tool_use.input == TOOL_INPUT


async def test_the_sdk_text_stream_yields_the_text_deltas(
    client: anthropic.AsyncAnthropic,
) -> None:
    async with stream(client, "tool-call") as events:
        chunks = [chunk async for chunk in events.text_stream]
        message = await events.get_final_message()
    assert chunks == TEXT
    assert message.content[1].type == "text"
    assert message.content[1].text == "".join(TEXT)


async def test_the_sdk_tolerates_a_tool_result_block(client: anthropic.AsyncAnthropic) -> None:
    # The Messages API never streams this block type. The SDK keeps it as a loosely built
    # block (type and tool_use_id, but the result text of its json_partial deltas is
    # dropped: an unknown delta type is skipped) and everything else is intact.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        async with stream(client, "tool-result") as events:
            message = await events.get_final_message()

    assert [block.type for block in message.content] == [
        "thinking",
        "text",
        "tool_use",
        "tool_result",
    ]
    thinking, text, tool_use, tool_result = message.content
    assert thinking.type == "thinking"
    assert thinking.thinking == "".join(THINKING)
    assert thinking.signature == SIGNATURE
    assert text.type == "text"
    assert text.text == "".join(TEXT)
    assert tool_use.type == "tool_use"
    assert tool_use.input == TOOL_INPUT
    assert getattr(tool_result, "tool_use_id", None) == TOOL_ID
    assert message.stop_reason == "tool_use"


async def test_a_rejected_stream_is_the_sdk_s_typed_error(
    client: anthropic.AsyncAnthropic,
) -> None:
    with pytest.raises(anthropic.RateLimitError) as caught:
        async with stream(client, "rejected") as events:
            await events.get_final_message()
    assert caught.value.status_code == 429
    assert caught.value.body == {
        "type": "error",
        "error": {
            "type": "rate_limit_error",
            "message": "Number of requests has exceeded your rate limit",
        },
    }


async def test_an_error_event_mid_stream_raises_in_the_sdk(
    client: anthropic.AsyncAnthropic,
) -> None:
    with pytest.raises(anthropic.APIStatusError) as caught:
        async with stream(client, "overloaded") as events:
            await events.get_final_message()
    assert "Overloaded" in str(caught.value)
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
    }


def test_the_sdk_internals_the_tests_read_with_are_there() -> None:
    # tests/anthropic_sdk.py reads events in hand with the SDK's own accumulator, which
    # lives under private names; this says which one moved when a release moves one.
    import importlib

    from tests.anthropic_sdk import INTERNALS

    missing = [
        f"{module}.{name}"
        for name, module in INTERNALS.items()
        if not callable(getattr(importlib.import_module(module), name, None))
    ]
    assert missing == [], f"the Anthropic SDK moved {missing}: update tests/anthropic_sdk.py"


async def test_the_sdk_reads_a_message_that_asks_and_its_continuation(
    client: anthropic.AsyncAnthropic,
) -> None:
    # The client call is exactly the Anthropic format's tool_use; the approval request,
    # the question and the answers' records are blocks the SDK keeps as they came.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        async with stream(client, "asking") as events:
            asked = await events.get_final_message()
        async with stream(client, "continuation") as events:
            continued = await events.get_final_message()
    assert asked.stop_reason == "tool_use"
    kinds = [block.type for block in asked.content]
    assert kinds == ["text", "tool_use", "approval_request", "tool_use", "question"]
    call = asked.content[3]
    assert (call.id, call.name, call.input) == ("call_loc", "get_location", {})
    assert asked.content[2].model_dump()["tool_use_id"] == "call_pay"
    assert asked.content[4].model_dump()["question"] == "Which unit?"
    assert continued.stop_reason == "end_turn"
    assert [block.type for block in continued.content] == [
        "approval_response",
        "tool_result",
        "answer",
        "tool_result",
        "text",
    ]
    assert continued.content[4].text == "Paid; 3 C in Oslo."
