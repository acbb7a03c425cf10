"""A tool call whose arguments never came (a tool that takes no parameters: Anthropic
streams its ``tool_use`` with ``input: {}`` and no fragment, or one empty fragment) reaches
an OpenAI client with arguments it can parse, ``{}``, in Chat Completions and Responses,
streamed or whole, as the ``openai`` SDK reads them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState

from essessey import Publisher
from essessey.dialects import DialectRequest
from essessey.hub import TurnProducer
from essessey.protocol import StopReason
from tests.servers import serve_dialects

pytestmark = pytest.mark.anyio


def turn(request: DialectRequest) -> TurnProducer:
    """Two calls without arguments (one with no fragment, one with an empty one), then
    one with arguments, each left to the client."""

    async def produce(p: Publisher) -> None:
        await p.send_stream_preamble("msg_1", request.id, "scripted")
        await p.send_tool_use_start(0, "call_now", "now")
        await p.send_content_block_stop(0)
        await p.send_tool_use_start(1, "call_today", "today")
        await p.send_tool_input_delta(1, "")
        await p.send_content_block_stop(1)
        await p.send_tool_use_start(2, "call_city", "weather")
        await p.send_tool_input_delta(2, '{"city":"Oslo"}')
        await p.send_content_block_stop(2)
        await p.send_stream_epilogue(StopReason.TOOL_USE, 3)

    return produce


EXPECTED = [("call_now", {}), ("call_today", {}), ("call_city", {"city": "Oslo"})]


@pytest.fixture
def sdk() -> Iterator[openai.AsyncOpenAI]:
    with serve_dialects(turn) as url:
        yield openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)


def parsed(calls: list[tuple[str, str]]) -> list[tuple[str, Any]]:
    return [(call_id, json.loads(arguments)) for call_id, arguments in calls]


async def test_chat_completions_streamed_and_whole(sdk: openai.AsyncOpenAI) -> None:
    messages: Any = [{"role": "user", "content": "When?"}]
    async with sdk:
        stream = await sdk.chat.completions.create(model="m", messages=messages, stream=True)
        state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
        async for chunk in stream:
            state.handle_chunk(chunk)
        whole = await sdk.chat.completions.create(model="m", messages=messages)
    for completion in (state.current_completion_snapshot, whole):
        calls = completion.choices[0].message.tool_calls or []
        assert parsed([(c.id, c.function.arguments) for c in calls]) == EXPECTED


async def test_responses_streamed_and_whole(sdk: openai.AsyncOpenAI) -> None:
    async with sdk:
        async with sdk.responses.stream(model="m", input="When?") as stream:
            added: dict[str, str] = {}
            async for event in stream:
                if event.type == "response.function_call_arguments.delta":
                    added[event.item_id] = added.get(event.item_id, "") + event.delta
            final = await stream.get_final_response()
        whole = await sdk.responses.create(model="m", input="When?")
    for response in (final, whole):
        calls = [(i.call_id, i.arguments) for i in response.output if i.type == "function_call"]
        assert parsed(calls) == EXPECTED
    # A client that adds the deltas up gets the same.
    assert [json.loads(text) for text in added.values()] == [args for _, args in EXPECTED]
