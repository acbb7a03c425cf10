"""What publishing an OpenAI Agents SDK run costs: the SDK's own streamed run consumed to
nothing, beside the same run through ``essessey.adapters.openai_agents.AgentTurns`` into a
``StreamHub`` (in-memory store; stored only, and stored and read to its end by a
subscriber).

Run ``python benchmarks/bench_openai_agents.py [--turns 200] [--rounds 3] [--deltas 40]
[--batch 10] [--models parsed,replayed,wire] [--json [PATH]]``. Each turn is one run of
``--rounds`` model responses: every response streams ``--deltas`` text deltas, and every
one but the last calls a tool (its output the next round's input).

The model comes three ways (``--models`` picks some; all by default), each measured on
every path:

- ``parsed``: each event is read from its JSON text (``model_validate_json``), as a
  provider's client reads a Responses stream: the SDK's own run as it costs with a model
  behind a wire (the connection itself left out);
- ``replayed``: the events are built once and handed out again, the SDK's run with no
  model cost at all: the floor, where the adapter's share is largest;
- ``wire``: the SDK's ``OpenAIResponsesModel`` on the official ``AsyncOpenAI`` client,
  streaming the same events over HTTP from a fake Responses server (``_model_server.py``)
  that runs in a process of its own, so that its CPU is not counted: the SDK's run as an
  app pays for it, the client's request, SSE decoding and parsing included.

The paths run the same turns in one process, in batches taking turns (``_sidebyside.py``):
the SDK's run alone, and through ``AgentTurns`` into a hub, stored only and stored and read
by a subscriber. The figures are CPU time (``time.process_time()``) per turn and per event (the
SDK's stream events for the SDK alone, the protocol events published for the adapter), and
the ratio adapter / SDK per turn: the adapter's turn includes the SDK's, so a ratio of
1.15 means the adapter adds 15% to the SDK's own CPU.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _frameworks import compare_closing, run_models, turn_args, turn_parser
from _sidebyside import hub_paths, plain


def scripts(rounds: int, deltas: int) -> list[list[Any]]:
    """The events of each model response of one run."""
    from openai.types.responses import (
        ResponseCompletedEvent,
        ResponseCreatedEvent,
        ResponseFunctionCallArgumentsDeltaEvent,
        ResponseOutputItemAddedEvent,
        ResponseOutputItemDoneEvent,
        ResponseTextDeltaEvent,
    )

    out: list[list[Any]] = []
    for n in range(rounds):
        seq = iter(range(10_000))
        base: dict[str, Any] = {
            "id": f"resp_{n}",
            "object": "response",
            "created_at": 0,
            "model": "gpt-bench",
            "tool_choice": "auto",
            "tools": [],
            "parallel_tool_calls": True,
        }
        events: list[Any] = [
            ResponseCreatedEvent.model_validate(
                {
                    "type": "response.created",
                    "sequence_number": next(seq),
                    "response": {**base, "status": "in_progress", "output": []},
                }
            )
        ]
        text = "".join(f"word{i} " for i in range(deltas))
        message = {"type": "message", "id": f"m{n}", "role": "assistant", "status": "completed"}
        part = {"type": "output_text", "text": text, "annotations": []}
        added = dict(message, status="in_progress", content=[])
        events.append(
            ResponseOutputItemAddedEvent.model_validate(
                {"type": "response.output_item.added", "sequence_number": next(seq)}
                | {"output_index": 0, "item": added}
            )
        )
        for i in range(deltas):
            events.append(
                ResponseTextDeltaEvent.model_validate(
                    {"type": "response.output_text.delta", "sequence_number": next(seq)}
                    | {"item_id": f"m{n}", "output_index": 0, "content_index": 0}
                    | {"delta": f"word{i} ", "logprobs": []}
                )
            )
        whole = dict(message, content=[part])
        events.append(
            ResponseOutputItemDoneEvent.model_validate(
                {"type": "response.output_item.done", "sequence_number": next(seq)}
                | {"output_index": 0, "item": whole}
            )
        )
        output: list[Any] = [whole]
        if n < rounds - 1:
            call = {"type": "function_call", "id": f"fc{n}", "call_id": f"call_{n}"}
            call |= {"name": "lookup", "arguments": "", "status": "in_progress"}
            events.append(
                ResponseOutputItemAddedEvent.model_validate(
                    {"type": "response.output_item.added", "sequence_number": next(seq)}
                    | {"output_index": 1, "item": call}
                )
            )
            for fragment in ('{"q": ', f'"n{n}"', "}"):
                events.append(
                    ResponseFunctionCallArgumentsDeltaEvent.model_validate(
                        {"type": "response.function_call_arguments.delta"}
                        | {"sequence_number": next(seq), "item_id": f"fc{n}"}
                        | {"output_index": 1, "delta": fragment}
                    )
                )
            done = dict(call, arguments=f'{{"q": "n{n}"}}', status="completed")
            events.append(
                ResponseOutputItemDoneEvent.model_validate(
                    {"type": "response.output_item.done", "sequence_number": next(seq)}
                    | {"output_index": 1, "item": done}
                )
            )
            output.append(done)
        usage = {
            "input_tokens": 100,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": deltas,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 100 + deltas,
        }
        events.append(
            ResponseCompletedEvent.model_validate(
                {"type": "response.completed", "sequence_number": next(seq)}
                | {"response": {**base, "status": "completed", "output": output, "usage": usage}}
            )
        )
        out.append(events)
    return out


def responses_script(rounds: int, deltas: int) -> dict[str, Any]:
    """The model server's script: the responses' events as JSON values."""
    events = scripts(rounds, deltas)
    return {"responses": [[e.model_dump(mode="json") for e in r] for r in events]}


def make_agent(responses: list[list[Any]], *, parsed: bool) -> Any:
    """The agent on a model that hands out ``responses``' events in order, a run after a
    run: parsed from their JSON text, or the objects themselves."""
    from agents.models.interface import Model

    class Replay(Model):
        """Hands out the responses' events in order, a run after a run: parsed from
        their JSON text, or the objects themselves."""

        def __init__(self) -> None:
            self.n = 0
            self.texts = [[(type(e), e.model_dump_json()) for e in r] for r in responses]

        async def get_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

        async def stream_response(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            n = self.n % len(responses)
            self.n += 1
            if parsed:
                for cls, text in self.texts[n]:
                    yield cls.model_validate_json(text)
            else:
                for event in responses[n]:
                    yield event

    return agent_on(Replay())


def agent_on(model: Any) -> Any:
    """The benchmark's agent (one ``lookup`` tool) on ``model``, tracing disabled."""
    from agents import Agent, function_tool, set_tracing_disabled

    set_tracing_disabled(True)

    @function_tool
    def lookup(q: str) -> str:
        """Look something up."""
        return f"found {q}"

    return Agent(name="bench", model=model, tools=[lookup])


async def sdk_turn(agent: Any) -> int:
    from agents import Runner

    result = Runner.run_streamed(agent, "go")
    count = 0
    async for _ in result.stream_events():
        count += 1
    return count


def producer(agent: Any) -> Callable[[str], Any]:
    """The turn of ``AgentTurns(agent)`` for a Responses request, on a stream."""
    from essessey.adapters.openai_agents import AgentTurns
    from essessey.dialects.responses import ResponsesRequest

    turns = AgentTurns(agent)
    return lambda stream_id: turns(ResponsesRequest(stream_id, "m", "go"))


def glue_producer(agent: Any) -> Callable[[str], Any]:
    """The same run published by the least glue a user could write for this turn: each
    text delta, call, argument fragment and tool output straight to a ``RoundStream``,
    reading only the fields it needs and checking nothing. Not an adapter (it knows the
    benchmark's turn: text, then function calls, then their outputs); the floor of what
    publishing the turn into a hub costs, beside which the adapter's own share shows."""
    import secrets
    from dataclasses import replace

    from agents import Runner
    from agents.items import ToolCallOutputItem
    from agents.stream_events import RawResponsesStreamEvent, RunItemStreamEvent
    from openai.types.responses import (
        ResponseCompletedEvent,
        ResponseFunctionCallArgumentsDeltaEvent,
        ResponseOutputItemAddedEvent,
        ResponseOutputItemDoneEvent,
        ResponseTextDeltaEvent,
    )

    from essessey.adapters.rounds import ToolCallRequest, stream_rounds

    def producer(stream_id: str) -> Any:
        async def produce(publisher: Any) -> None:
            result = Runner.run_streamed(agent, [{"role": "user", "content": "go"}])
            message_id = "msg_" + secrets.token_hex(12)
            async with stream_rounds(
                publisher, message_id=message_id, stream_id=stream_id, model="gpt-bench"
            ) as rounds:
                calls: list[ToolCallRequest] = []
                slots: dict[int, int] = {}  # output index -> call slot
                results = 0
                async for event in result.stream_events():
                    if type(event) is RawResponsesStreamEvent:
                        data: Any = event.data
                        kind = type(data)
                        if kind is ResponseTextDeltaEvent:
                            await rounds.delta(text=data.delta)
                        elif kind is ResponseFunctionCallArgumentsDeltaEvent:
                            await rounds.tool_call_delta(slots[data.output_index], data.delta)
                        elif kind is ResponseOutputItemAddedEvent:
                            if not rounds.in_round:
                                await rounds.round_start()
                            if data.item.type == "function_call":
                                slots[data.output_index] = len(calls)
                                calls.append(ToolCallRequest(data.item.call_id, data.item.name))
                                await rounds.tool_call_start(len(calls) - 1, calls[-1])
                        elif kind is ResponseOutputItemDoneEvent:
                            if data.item.type == "function_call":
                                slot = slots[data.output_index]
                                calls[slot] = replace(calls[slot], arguments=data.item.arguments)
                        elif kind is ResponseCompletedEvent:
                            rounds.output_tokens += data.response.usage.output_tokens
                            await rounds.assistant_message(calls)
                            if not calls:
                                await rounds.round_end()
                    elif (
                        type(event) is RunItemStreamEvent and type(event.item) is ToolCallOutputItem
                    ):
                        await rounds.tool_result(results, str(event.item.output))
                        results += 1
                        if results == len(calls):
                            await rounds.round_end()
                            calls, slots, results = [], {}, 0

        return produce

    return producer


async def measure(args: argparse.Namespace, model: str, url: str | None) -> list[dict[str, Any]]:
    """The paths' rows on the ``model`` way (``url``: the model server's, for ``wire``)."""
    client = None
    if model == "wire":
        from agents import OpenAIResponsesModel
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=url, api_key="bench", max_retries=0)
        agent = agent_on(OpenAIResponsesModel(model="gpt-bench", openai_client=client))
    else:
        agent = make_agent(scripts(args.rounds, args.deltas), parsed=model == "parsed")
    paths = [
        plain("Agents SDK run_streamed", lambda n: sdk_turn(agent)),
        *hub_paths("essessey AgentTurns", producer(agent)),
        hub_paths("hand-written glue", glue_producer(agent))[0],
    ]
    return await compare_closing(paths, args, client)


def main() -> None:
    args = turn_args(turn_parser(__doc__, rounds="model responses", deltas="text deltas"))
    run_models(
        args,
        responses_script,
        measure,
        benchmark=__file__,
        title=f"{args.rounds} responses of {args.deltas} text deltas per turn",
    )


if __name__ == "__main__":
    main()
