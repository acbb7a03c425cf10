"""An agent loop: model rounds and tool calls published as one message.

Run it with ``python examples/agent_loop.py``. The "model" is scripted: each round is a
list of OpenAI chat-completions chunks, as any OpenAI-compatible server streams them
(swap ``scripted_model`` for ``await client.chat.completions.create(..., stream=True)``
to use a real one). With ``--api responses`` the same rounds are OpenAI Responses API
events instead (a real one: ``await client.responses.create(..., stream=True)``),
published by ``essessey.adapters.openai_responses``. The tools are ordinary async Python
functions; a round's calls run concurrently and finish in any order. ``RoundStream``
puts every block at its index, so the output passes the checker and reassembles to the
calls and their results.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import essessey
from essessey.adapters import PublishedToolCall, openai_responses, stream_rounds
from essessey.adapters import openai as openai_adapter
from essessey.reassemble import TextItem, ToolUseItem

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


FIRST_ROUND_TEXT = "Checking Paris and Oslo."

SCRIPT: list[list[dict[str, Any]]] = [
    [
        _chunk({"role": "assistant", "reasoning_content": "Two cities: "}),
        _chunk({"reasoning_content": "call the weather tool for both at once."}),
        _chunk({"content": FIRST_ROUND_TEXT}),
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

# -- the same rounds as Responses API events ----------------------------------------------


def _response(status: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1_764_460_800,
        "status": status,
        "model": "scripted-model",
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        **extra,
    }


def _reasoning(index: int, pieces: list[str]) -> list[dict[str, Any]]:
    item = {"id": f"rs_{index}", "type": "reasoning", "summary": []}
    return [
        {"type": "response.output_item.added", "output_index": index, "item": item},
        *(
            {
                "type": "response.reasoning_summary_text.delta",
                "item_id": item["id"],
                "output_index": index,
                "summary_index": 0,
                "delta": piece,
            }
            for piece in pieces
        ),
    ]


def _message(index: int, pieces: list[str]) -> list[dict[str, Any]]:
    item = {
        "id": f"msg_{index}",
        "type": "message",
        "role": "assistant",
        "status": "in_progress",
        "content": [],
    }
    return [
        {"type": "response.output_item.added", "output_index": index, "item": item},
        *(
            {
                "type": "response.output_text.delta",
                "item_id": item["id"],
                "output_index": index,
                "content_index": 0,
                "delta": piece,
                "logprobs": [],
            }
            for piece in pieces
        ),
    ]


def _function_call(index: int, call_id: str, name: str, arguments: str) -> list[dict[str, Any]]:
    # Announced with its name, then the arguments in fragments, then whole.
    item = {
        "id": f"fc_{index}",
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": "",
    }
    half = len(arguments) // 2
    fields = {"item_id": item["id"], "output_index": index}
    return [
        {"type": "response.output_item.added", "output_index": index, "item": item},
        {"type": "response.function_call_arguments.delta", **fields, "delta": arguments[:half]},
        {"type": "response.function_call_arguments.delta", **fields, "delta": arguments[half:]},
        {"type": "response.function_call_arguments.done", **fields, "arguments": arguments},
    ]


def _round(
    *items: list[dict[str, Any]], usage: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    events = [
        {"type": "response.created", "response": _response("in_progress")},
        *(event for item in items for event in item),
        {"type": "response.completed", "response": _response("completed", usage=usage)},
    ]
    return [{**event, "sequence_number": n} for n, event in enumerate(events)]


RESPONSES_SCRIPT: list[list[dict[str, Any]]] = [
    _round(
        _reasoning(0, ["Two cities: ", "call the weather tool for both at once."]),
        _message(1, [FIRST_ROUND_TEXT]),
        _function_call(2, "call_paris", "get_weather", '{"city": "Paris"}'),
        _function_call(3, "call_oslo", "get_weather", '{"city": "Oslo"}'),
    ),
    _round(
        _reasoning(0, ["Oslo is below zero; give Fahrenheit too."]),
        _function_call(1, "call_convert", "convert", '{"celsius": -3}'),
    ),
    _round(
        _message(0, ["Paris: sunny, 21 °C. ", "Oslo: snow, -3 °C (26.6 °F)."]),
        usage={
            "input_tokens": 50,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": 40,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 90,
        },
    ),
]

APIS = ("chat", "responses")


async def scripted_model(round_number: int, api: str = "chat") -> AsyncIterator[dict[str, Any]]:
    """Stream one round's chunks (or Responses API events), as a network stream would."""
    script = RESPONSES_SCRIPT if api == "responses" else SCRIPT
    for chunk in script[round_number]:
        await asyncio.sleep(0)
        yield chunk


# -- the loop -----------------------------------------------------------------------------


async def run_tool(name: str, arguments: Any) -> tuple[object, bool]:
    """Run one tool; a failure becomes an error result the model (and client) can read."""
    try:
        return await TOOLS[name](**arguments), False
    except Exception as exc:
        return {"error": type(exc).__name__}, True


async def agent_turn(publisher: essessey.Publisher, api: str = "chat") -> None:
    """Run rounds until the model stops asking for tools.

    ``api`` is ``"chat"`` (chat-completions chunks) or ``"responses"`` (Responses API
    events); both adapters' ``stream_round`` return what the loop needs.
    """
    async with stream_rounds(
        publisher, message_id="msg_1", stream_id="conv_1", model="scripted-model"
    ) as rounds:
        for round_number in range(len(SCRIPT)):
            await rounds.round_start()
            model = scripted_model(round_number, api)
            seen: openai_adapter.StreamedRound | openai_responses.StreamedResponse
            if api == "responses":
                seen = await openai_responses.stream_round(rounds, model)
            else:
                seen = await openai_adapter.stream_round(rounds, model)
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


async def main(api: str = "chat") -> list[essessey.Event]:
    sink = essessey.InMemorySink()
    await agent_turn(essessey.Publisher(sink), api)
    return sink.events


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--api",
        choices=APIS,
        default="chat",
        help="what the scripted model streams: chat-completions chunks (the default) "
        "or Responses API events",
    )
    events = asyncio.run(main(parser.parse_args().api))
    parsed = essessey.reassemble_events(events)
    # The turn in order, a line each: what the model said in a round, each call with its
    # result, and the last round's text as the answer (parsed.text would run the rounds'
    # texts together: "...Oslo.Paris: ...").
    results = {execution.call.tool_use_id: execution for execution in parsed.executions}
    texts = [item for item in parsed.timeline if isinstance(item, TextItem)]
    for item in parsed.timeline:
        if isinstance(item, TextItem):
            print(f"{'answer' if item is texts[-1] else 'model'}: {item.text}")
        elif isinstance(item, ToolUseItem):
            call = item.call
            print(f"{call.name}({json.dumps(call.params)}) -> {results[call.tool_use_id].result}")
    print(f"{len(events)} events, {len(essessey.check(events))} protocol violations")
