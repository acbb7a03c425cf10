"""The AI SDK's OpenAI providers (Node's ``@ai-sdk/openai`` and
``@ai-sdk/openai-compatible``, what an AI SDK app points at an OpenAI-compatible server)
read a turn from essessey's Responses and Chat Completions routes on a real uvicorn
server: every chunk passes the provider's own schema, and the app gets the turn's text,
reasoning and calls."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from essessey import Publisher
from essessey.dialects import DialectRequest
from essessey.hub import TurnProducer
from essessey.protocol import StopReason
from tests.processes import node_json
from tests.servers import serve_dialects


def turn(request: DialectRequest) -> TurnProducer:
    """Reasoning, text, a function call and a custom tool's call (a Responses API
    ``custom_tool_call``), each left to the client."""

    async def produce(p: Publisher) -> None:
        await p.send_stream_preamble("msg_1", request.id, "scripted")
        await p.send_content_block_start_thinking(0)
        await p.send_content_block_delta_thinking(0, "Two tools.")
        await p.send_content_block_stop(0)
        await p.send_content_block_start_text(1)
        await p.send_content_block_delta_text(1, "Running both.")
        await p.send_content_block_stop(1)
        await p.send_tool_use_start(2, "call_city", "weather")
        await p.send_tool_input_delta(2, '{"city": "Oslo"}')
        await p.send_content_block_stop(2)
        await p.send_tool_use_start(3, "call_sql", "write_sql", item_type="custom_tool_call")
        await p.send_tool_input_delta(3, '{"input": "SELECT 1"}')
        await p.send_content_block_stop(3)
        await p.send_stream_epilogue(StopReason.TOOL_USE, 9)

    return produce


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with serve_dialects(turn) as url:
        yield url


def read(node_client: Path, base: str, api: str) -> dict[str, Any]:
    script = node_client.with_name("openai_provider.mjs")
    result: dict[str, Any] = node_json(script, base, api, "scripted")
    return result


@pytest.mark.parametrize("api", ["responses", "chat", "compatible"])
def test_the_ai_sdk_s_openai_provider_reads_the_turn(
    node_client: Path, base_url: str, api: str
) -> None:
    result = read(node_client, base_url, api)
    assert result["errors"] == []
    assert result["text"] == "Running both."
    assert result["finishReason"] == "tool-calls"
    assert result["toolCalls"] == [
        {"id": "call_city", "name": "weather", "input": {"city": "Oslo"}},
        # Responses: the custom tool's own item, its input the text; Chat Completions has
        # no such call, so it is a function call of its input.
        {
            "id": "call_sql",
            "name": "write_sql",
            "input": "SELECT 1" if api == "responses" else {"input": "SELECT 1"},
        },
    ]
    if api == "responses":
        # The reasoning item reaches it; its text does not: the provider reads only the
        # summary parts of OpenAI's own models (docs/dialects.md).
        assert "reasoning-start" in result["parts"]
    if api == "compatible":
        # The OpenAI-compatible provider reads Chat Completions' reasoning_content.
        assert result["reasoning"] == "Two tools."
