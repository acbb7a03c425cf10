"""An agent loop: model rounds and tool calls published as one message.

Run it with ``python examples/agent_loop.py``. The "model" is scripted: each round is a
list of OpenAI chat-completions chunks, as any OpenAI-compatible server streams them
(swap ``scripted_model`` for ``await client.chat.completions.create(..., stream=True)``
to use a real one). The tools are ordinary async Python functions; a round's calls run
concurrently and finish in any order. ``RoundStream`` puts every block at its index, so
the output passes the checker and reassembles to the calls and their results.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import essessey
from essessey.adapters import PublishedToolCall, stream_rounds
from essessey.adapters import openai as openai_adapter

# -- the tools: plain async functions ----------------------------------------------------

FORECASTS = {"Paris": ("sunny", 21), "Oslo": ("snow", -3)}


async def get_weather(city: str) -> dict[str, Any]:
    """Look the city up (slowly, so the calls overlap and finish out of order)."""
    await asyncio.sleep(0.05 if city == "Paris" else 0.01)
    sky, celsius = FORECASTS[city]
    return {"city": city, "sky": sky, "celsius": celsius}


async def convert(celsius: float) -> dict[str, Any]:
    """Celsius to Fahrenheit."""
    return {"fahrenheit": round(celsius * 9 / 5 + 32, 1)}


TOOLS: dict[str, Callable[..., Awaitable[dict[str, Any]]]] = {
    "get_weather": get_weather,
    "convert": convert,
}

# -- the scripted model: one list of chunks per round -------------------------------------


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1_764_460_800,
        "model": "scripted-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _call(index: int, call_id: str, name: str, arguments: str) -> list[dict[str, Any]]:
    # The name comes first, the arguments after in fragments, as servers send them.
    head = {"index": index, "id": call_id, "type": "function", "function": {"name": name}}
    half = len(arguments) // 2
    return [
        _chunk({"tool_calls": [head]}),
        _chunk({"tool_calls": [{"index": index, "function": {"arguments": arguments[:half]}}]}),
        _chunk({"tool_calls": [{"index": index, "function": {"arguments": arguments[half:]}}]}),
    ]


SCRIPT: list[list[dict[str, Any]]] = [
    [
        _chunk({"role": "assistant", "reasoning_content": "Two cities: "}),
        _chunk({"reasoning_content": "call the weather tool for both at once."}),
        _chunk({"content": "Checking Paris and Oslo."}),
        *_call(0, "call_paris", "get_weather", '{"city": "Paris"}'),
        *_call(1, "call_oslo", "get_weather", '{"city": "Oslo"}'),
        _chunk({}, "tool_calls"),
    ],
    [
        _chunk({"reasoning_content": "Oslo is below zero; give Fahrenheit too."}),
        *_call(0, "call_convert", "convert", '{"celsius": -3}'),
        _chunk({}, "tool_calls"),
    ],
    [
        _chunk({"content": "Paris: sunny, 21 °C. "}),
        _chunk({"content": "Oslo: snow, -3 °C (26.6 °F)."}),
        _chunk({}, "stop"),
        {**_chunk({}), "choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 40}},
    ],
]

FINAL_ANSWER = "Paris: sunny, 21 °C. Oslo: snow, -3 °C (26.6 °F)."


async def scripted_model(round_number: int) -> AsyncIterator[dict[str, Any]]:
    """Stream one round's chunks, as a network stream would."""
    for chunk in SCRIPT[round_number]:
        await asyncio.sleep(0)
        yield chunk


# -- the loop -----------------------------------------------------------------------------


async def run_tool(name: str, arguments: Any) -> tuple[object, bool]:
    """Run one tool; a failure becomes an error result the model (and client) can read."""
    try:
        return await TOOLS[name](**arguments), False
    except Exception as exc:
        return {"error": type(exc).__name__}, True


async def agent_turn(publisher: essessey.Publisher) -> None:
    """Run rounds until the model stops asking for tools."""
    async with stream_rounds(
        publisher, message_id="msg_1", stream_id="conv_1", model="scripted-model"
    ) as rounds:
        for round_number in range(len(SCRIPT)):
            await rounds.round_start()
            seen = await openai_adapter.stream_round(rounds, scripted_model(round_number))
            rounds.stop_reason = seen.stop_reason
            rounds.output_tokens += seen.usage.get("output_tokens", 0)

            async def answer(i: int, call: PublishedToolCall) -> None:
                result, failed = await run_tool(call.name, call.input)
                await rounds.tool_result(i, result, is_error=failed)

            # The round's calls run concurrently; RoundStream publishes the results in
            # call order whatever order they finish in.
            async with asyncio.TaskGroup() as tasks:
                for i, call in enumerate(seen.tool_calls):
                    tasks.create_task(answer(i, call))
            await rounds.round_end()
            if not seen.tool_calls:
                break


async def main() -> list[essessey.Event]:
    sink = essessey.InMemorySink()
    await agent_turn(essessey.Publisher(sink))
    return sink.events


if __name__ == "__main__":
    events = asyncio.run(main())
    parsed = essessey.reassemble_events(events)
    for execution in parsed.executions:
        print(f"{execution.call.name}({json.dumps(execution.call.params)}) -> {execution.result}")
    print(f"answer: {parsed.text}")
    print(f"{len(events)} events, {len(essessey.check(events))} protocol violations")
