"""One scripted agent turn, the one every dialect's tests serve: two model rounds,
signed reasoning, two parallel tool calls with their results, the answer."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

from essessey import Publisher, StopReason
from essessey.hub import TurnProducer

ANSWER = "Let me check both.Paris is 18 degrees."
"""The turn's text, both rounds'."""
THINKING = "Two cities, two calls."
SIGNATURE = "sig-two-cities"
"""The reasoning's signature, which a client sends back with it."""


def scripted_turn(
    stream_id: str,
    *,
    delay: float = 0.0,
    fail: bool = False,
    hold: Callable[[], Awaitable[None]] | None = None,
) -> TurnProducer:
    """Two rounds: reasoning, text, two parallel tool calls (one streamed in fragments)
    and their results (one an error), then the answer. ``delay`` seconds pace the deltas;
    ``fail`` ends the first round with a provider error; ``hold()`` is awaited before the
    second round (a test that resumes mid-turn keeps the turn running until it has)."""

    async def produce(p: Publisher) -> None:
        await p.send_stream_preamble("msg_round1", stream_id, "scripted")
        await p.send_content_block_start_thinking(0)
        await p.send_content_block_delta_thinking(0, "Two cities, two calls.")
        await p.send_signature_delta(0, SIGNATURE)
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
        if hold is not None:
            await hold()
        await p.send_stream_preamble("msg_round2", stream_id, "scripted")
        await p.send_content_block_start_text(0)
        for word in ("Paris ", "is ", "18 ", "degrees."):
            await anyio.sleep(delay)
            await p.send_content_block_delta_text(0, word)
        await p.send_content_block_stop(0)
        await p.send_stream_epilogue(StopReason.END_TURN, 8)

    return produce
