"""What publishing a Pydantic AI run costs: the framework's own ``run_stream_events``
consumed to nothing, beside the same run through ``essessey.adapters.pydantic_ai.AgentTurns``
into a ``StreamHub`` (in-memory store; stored only, and stored and read to its end by a
subscriber), and through Pydantic AI's own ``VercelAIEventStream`` (what ``VercelAIAdapter``
streams to ``useChat``) encoded to SSE strings and dropped.

Run ``python benchmarks/bench_pydantic_ai.py [--turns 200] [--rounds 3] [--deltas 40]
[--batch 10] [--models function,wire] [--json [PATH]]``. Each turn is one run of
``--rounds`` model requests: every response streams ``--deltas`` text deltas, and every
one but the last calls a ``lookup`` tool (its arguments in three fragments; the tool's
result the next request's input). The model comes two ways (``--models`` picks some; both
by default), each measured on every path:

- ``function``: Pydantic AI's ``FunctionModel`` streaming the response from a Python
  function, the run with no model cost at all: the floor, where a path's share is largest;
- ``wire``: Pydantic AI's ``OpenAIChatModel`` on the official ``AsyncOpenAI`` client,
  streaming the same requests as Chat Completions chunks over HTTP from a fake server
  (``_model_server.py``) that runs in a process of its own, so that its CPU is not
  counted: the run as an app pays for it, the client's request, SSE decoding and parsing
  included. The finish reason and the usage come in chunks of their own, as a provider
  sends them; the adapter publishes the same events as on ``function``.

The paths run the same turns in one process, in batches taking turns (``_sidebyside.py``).
The figures are CPU time (``time.process_time()``) per turn and per event (the framework's
stream events for the framework alone, the events each path stores or encodes otherwise),
and the ratio path / framework per turn: each path's turn includes the framework's, so a
ratio of 1.15 means the path adds 15% to the framework's own CPU.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _frameworks import compare_closing, run_models, turn_args, turn_parser
from _model_server import chat_script
from _sidebyside import hub_paths, plain

MODELS = ("function", "wire")
"""The ways the benchmark gives the agent a model (``--models``)."""


def make_agent(rounds: int, deltas: int) -> Any:
    """The agent on a ``FunctionModel`` that streams ``deltas`` words per request and
    calls ``lookup`` (its arguments in three fragments) in every request but the last."""
    from pydantic_ai.messages import ModelMessage, ModelRequest
    from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel

    words = [f"word{i} " for i in range(deltas)]

    async def model(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
        n = sum(1 for message in messages if isinstance(message, ModelRequest)) - 1
        for word in words:
            yield word
        if n < rounds - 1:
            yield {1: DeltaToolCall("lookup", '{"q": ', tool_call_id=f"call_{n}")}
            for fragment in (f'"n{n}"', "}"):
                yield {1: DeltaToolCall(json_args=fragment)}

    return agent_on(FunctionModel(stream_function=model, model_name="bench"))


def agent_on(model: Any) -> Any:
    """The benchmark's agent (one ``lookup`` tool) on ``model``."""
    from pydantic_ai import Agent

    agent = Agent(model)

    @agent.tool_plain
    def lookup(q: str) -> str:
        """Look something up."""
        return f"found {q}"

    return agent


async def framework(agent: Any, turn: int) -> int:
    """The framework's run, its events consumed to nothing; how many there were."""
    count = 0
    async with agent.run_stream_events("go") as events:
        async for _ in events:
            count += 1
    return count


def producer(agent: Any) -> Callable[[str], Any]:
    """The turn of ``AgentTurns(agent)`` for a Chat Completions request, on a stream."""
    from essessey.adapters.pydantic_ai import AgentTurns
    from essessey.dialects.chat_completions import ChatCompletionRequest

    turns = AgentTurns(agent)

    def turn(stream_id: str) -> Any:
        messages = [{"role": "user", "content": "go"}]
        return turns(ChatCompletionRequest(id=stream_id, model="m", messages=messages))

    return turn


async def vercel(agent: Any, turn: int) -> int:
    """The run through Pydantic AI's own Vercel AI event stream, encoded and dropped."""
    from pydantic_ai.ui.vercel_ai import VercelAIEventStream

    stream: Any = VercelAIEventStream(sdk_version=6)
    count = 0
    async with agent.run_stream_events("go") as events:
        async for _ in stream.encode_stream(stream.transform_stream(events)):
            count += 1
    return count


async def measure(args: argparse.Namespace, model: str, url: str | None) -> list[dict[str, Any]]:
    """The paths' rows on the ``model`` way (``url``: the model server's, for ``wire``)."""
    client = None
    if model == "wire":
        from openai import AsyncOpenAI
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider

        client = AsyncOpenAI(base_url=url, api_key="bench", max_retries=0)
        provider = OpenAIProvider(openai_client=client)
        agent = agent_on(OpenAIChatModel("gpt-bench", provider=provider))
    else:
        agent = make_agent(args.rounds, args.deltas)
    paths = [
        plain("pydantic-ai run_stream_events", lambda n: framework(agent, n)),
        *hub_paths("essessey AgentTurns", producer(agent)),
        plain("pydantic-ai VercelAIEventStream", lambda n: vercel(agent, n)),
    ]
    return await compare_closing(paths, args, client)


def main() -> None:
    parser = turn_parser(__doc__, rounds="model requests", deltas="text deltas", models=MODELS)
    args = turn_args(parser)
    run_models(
        args,
        chat_script,
        measure,
        benchmark=__file__,
        title=f"{args.rounds} model requests of {args.deltas} text deltas per turn",
    )


if __name__ == "__main__":
    main()
