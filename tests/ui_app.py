"""The app tests/test_ui_node.py serves: a hub and the AI SDK chat routes, answering each
chat with a scripted agent turn (two rounds, reasoning, two parallel tool calls)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio
from starlette.applications import Starlette

from essessey import Publisher, StopReason, StreamHub
from essessey.bindings.ui import ChatRequest, ui_chat_routes
from essessey.hub import TurnProducer


def agent_turn(chat: ChatRequest) -> TurnProducer:
    """The answer to ``chat``: its body's ``delay_ms`` paces the deltas, ``fail`` ends the
    first round with a provider error."""
    delay = float(chat.body.get("delay_ms", 0)) / 1000
    fail = bool(chat.body.get("fail"))

    async def produce(p: Publisher) -> None:
        await p.send_stream_preamble("msg_round1", chat.id, "scripted")
        await p.send_content_block_start_thinking(0)
        await p.send_content_block_delta_thinking(0, "Two cities, two calls.")
        await p.send_content_block_stop(0)
        await p.send_content_block_start_text(1)
        for word in ("Let ", "me ", "check ", "both."):
            await p.send_content_block_delta_text(1, word)
            await anyio.sleep(delay)
        await p.send_content_block_stop(1)
        if fail:
            await p.send_error("overloaded_error", "the provider is overloaded")
            return
        await p.send_tool_use_start(2, "call_paris", "get_weather")
        await p.send_tool_input_delta(2, '{"city":')
        await p.send_tool_input_delta(2, '"Paris"}')
        await p.send_content_block_stop(2)
        await p.send_tool_use_block(3, "call_oslo", "get_weather", {"city": "Oslo"})
        await anyio.sleep(delay)
        await p.send_tool_result_block(4, "call_paris", '{"temp_c":18}')
        await p.send_tool_result_block(5, "call_oslo", "station offline", is_error=True)
        await p.send_stream_epilogue(StopReason.TOOL_USE, 20)
        await p.send_stream_preamble("msg_round2", chat.id, "scripted")
        await p.send_content_block_start_text(0)
        for word in ("Paris ", "is ", "18 ", "degrees."):
            await anyio.sleep(delay)
            await p.send_content_block_delta_text(0, word)
        await p.send_content_block_stop(0)
        await p.send_stream_epilogue(StopReason.END_TURN, 8)

    return produce


def create_app(hub: StreamHub | None = None) -> Starlette:
    """The chat routes at the AI SDK's default paths, on ``hub`` (a new in-memory one)."""
    the_hub = hub or StreamHub()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with the_hub:
            yield

    app = Starlette(routes=list(ui_chat_routes(the_hub, agent_turn)), lifespan=lifespan)
    app.state.hub = the_hub
    return app
