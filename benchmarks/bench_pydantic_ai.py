"""What publishing a Pydantic AI run costs: the framework's own ``run_stream_events``
consumed to nothing, beside the same run through ``essessey.adapters.pydantic_ai.AgentTurns``
into a ``StreamHub`` (in-memory store, every turn read to its end by a subscriber), and
through Pydantic AI's own ``VercelAIEventStream`` (what ``VercelAIAdapter`` streams to
``useChat``) encoded to SSE strings and dropped.

Run ``python benchmarks/bench_pydantic_ai.py [--turns 200] [--rounds 3] [--deltas 40]
[--json [PATH]]``. Each turn is one run of ``--rounds`` model requests on Pydantic AI's
``FunctionModel``: every response streams ``--deltas`` text deltas, and every one but the
last calls a tool (whose result the next request carries).

The three paths run the same turns, one after the other, in one process (a turn of each
first, untimed). The figures are CPU time (``time.process_time()``) per turn and per
event (the framework's stream events for the framework alone, the events each path
publishes otherwise), and the ratio path / framework per turn: each path's turn includes
the framework's, so a ratio of 1.15 means the path adds 15% to the framework's own CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _cli import add_json_option, json_only, write_json


def make_agent(rounds: int, deltas: int) -> Any:
    """An agent whose model streams ``deltas`` words per request and calls ``lookup`` in
    every request but the last."""
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelRequest
    from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel

    words = [f"word{i} " for i in range(deltas)]

    async def model(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
        n = sum(1 for message in messages if isinstance(message, ModelRequest))
        for word in words:
            yield word
        if n < rounds:
            yield {1: DeltaToolCall("lookup", f'{{"q": "n{n}"}}', tool_call_id=f"call_{n}")}

    agent = Agent(FunctionModel(stream_function=model, model_name="bench"))

    @agent.tool_plain
    def lookup(q: str) -> str:
        return f"found {q}"

    return agent


async def framework(agent: Any, turn: int) -> int:
    """The framework's run, its events consumed to nothing; how many there were."""
    count = 0
    async with agent.run_stream_events("go") as events:
        async for _ in events:
            count += 1
    return count


def adapter_path() -> tuple[Callable[[Any, int], Awaitable[int]], Callable[[], Awaitable[None]]]:
    from essessey import StreamHub
    from essessey.adapters.pydantic_ai import AgentTurns
    from essessey.dialects.chat_completions import ChatCompletionRequest

    hub = StreamHub()
    entered: list[bool] = []

    async def run(agent: Any, turn: int) -> int:
        if not entered:
            await hub.__aenter__()
            entered.append(True)
        stream_id = f"s{turn}-{time.monotonic_ns()}"
        request = ChatCompletionRequest(
            id=stream_id, model="m", messages=[{"role": "user", "content": "go"}]
        )
        await hub.start(stream_id, AgentTurns(agent)(request))
        count = 0
        async for _ in hub.subscribe(stream_id):
            count += 1
        return count

    async def close() -> None:
        if entered:
            await hub.__aexit__(None, None, None)

    return run, close


async def vercel(agent: Any, turn: int) -> int:
    """The run through Pydantic AI's own Vercel AI event stream, encoded and dropped."""
    from pydantic_ai.ui.vercel_ai import VercelAIEventStream

    stream: Any = VercelAIEventStream(sdk_version=6)
    count = 0
    async with agent.run_stream_events("go") as events:
        async for _ in stream.encode_stream(stream.transform_stream(events)):
            count += 1
    return count


async def measure(
    name: str, run: Callable[[Any, int], Awaitable[int]], agent: Any, turns: int
) -> dict[str, Any]:
    await run(agent, -1)  # untimed: imports, first-use caches
    gc.collect()
    events = 0
    start = time.process_time()
    for turn in range(turns):
        events += await run(agent, turn)
    cpu = time.process_time() - start
    return {
        "path": name,
        "turns": turns,
        "events_per_turn": events / turns,
        "cpu_us_per_turn": cpu / turns * 1e6,
        "cpu_us_per_event": cpu / events * 1e6 if events else 0.0,
    }


async def run_all(args: argparse.Namespace) -> list[dict[str, Any]]:
    agent = make_agent(args.rounds, args.deltas)
    adapter, close = adapter_path()
    try:
        rows = [
            await measure("pydantic-ai run_stream_events", framework, agent, args.turns),
            await measure("essessey AgentTurns -> hub", adapter, agent, args.turns),
            await measure("pydantic-ai VercelAIEventStream", vercel, agent, args.turns),
        ]
    finally:
        await close()
    base = rows[0]["cpu_us_per_turn"]
    for row in rows:
        row["ratio_to_framework"] = row["cpu_us_per_turn"] / base if base else 0.0
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=200, help="runs per path (default 200)")
    parser.add_argument("--rounds", type=int, default=3, help="model requests per run")
    parser.add_argument("--deltas", type=int, default=40, help="text deltas per request")
    add_json_option(parser)
    args = parser.parse_args(argv)
    if args.turns < 1 or args.rounds < 1 or args.deltas < 1:
        parser.error("--turns, --rounds and --deltas must be at least 1")
    rows = asyncio.run(run_all(args))
    if args.json is not None:
        figures = {"turns": args.turns, "rounds": args.rounds, "deltas": args.deltas, "rows": rows}
        write_json(args.json, figures, __file__, argv)
        if json_only(args.json):
            return 0
    print(f"{'path':34} {'events/turn':>11} {'CPU us/turn':>12} {'CPU us/event':>13} {'ratio':>6}")
    for row in rows:
        print(
            f"{row['path']:34} {row['events_per_turn']:11.1f} {row['cpu_us_per_turn']:12.0f}"
            f" {row['cpu_us_per_event']:13.1f} {row['ratio_to_framework']:6.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
