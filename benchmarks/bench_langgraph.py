"""What publishing a LangGraph run costs: the graph's own ``astream`` consumed to nothing,
beside the same run through ``essessey.adapters.langgraph.AgentTurns`` into a
``StreamHub`` (in-memory store; stored only, and stored and read to its end by a
subscriber).

Run ``python benchmarks/bench_langgraph.py [--turns 200] [--rounds 3] [--deltas 40]
[--batch 10] [--checkpointer] [--models parsed,replayed,wire] [--json [PATH]]``. Each turn
is one run of a ReAct graph (a model node, ``ToolNode`` and ``tools_condition``) of
``--rounds`` LLM calls: every call streams ``--deltas`` text chunks, and every one but the
last calls a tool (its arguments in three fragments; the tool's result the next call's
input). The model comes three ways (``--models`` picks some; all by default), each
measured on every path:

- ``parsed``: a langchain-core chat model that reads each scripted chunk from its JSON
  text (``AIMessageChunk.model_validate_json``), about what a provider's integration does
  with each chunk of its stream: the graph's run as it costs with a model behind a wire
  (the connection itself left out);
- ``replayed``: the same model handing out copies of chunks built once, the graph's run
  with no model cost at all: the floor, where the adapter's share is largest;
- ``wire``: ``langchain_openai.ChatOpenAI`` (the tool bound, ``stream_usage``) on the
  official OpenAI client, streaming the same calls as Chat Completions chunks over HTTP
  from a fake server (``_model_server.py``) that runs in a process of its own, so that its
  CPU is not counted: the graph's run as an app pays for it, the client's request, SSE
  decoding and parsing included. The finish reason and the usage come in chunks of their
  own, as a provider sends them, so the graph alone streams a part more per call than with
  the scripted model; the adapter publishes the same events.

``--checkpointer``
compiles the graph with an ``InMemorySaver`` (a thread per turn), as a graph that
interrupts needs.

The paths run the same turns in one process, in batches taking turns (``_sidebyside.py``).
The graph's own path reads ``astream`` with the modes the adapter reads
(``messages`` and ``updates``, ``version="v2"``). The figures are CPU time
(``time.process_time()``) per turn and per event (LangGraph's stream parts for the graph
alone, the protocol events published for the adapter), and the ratio adapter / graph per
turn: the adapter's turn includes the graph's, so a ratio of 1.15 means the adapter adds
15% to the graph's own CPU.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _frameworks import compare_closing, run_models, turn_args, turn_parser
from _model_server import chat_script
from _sidebyside import hub_paths, plain


def make_graph(rounds: int, deltas: int, *, checkpointer: bool, parsed: bool) -> Any:
    """The ReAct graph on a model that streams the same chunks on every run: parsed from
    their JSON text, or copies of the chunks themselves."""
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult

    def call(n: int) -> list[AIMessageChunk]:
        chunks = [AIMessageChunk(content=f"word{i} ") for i in range(deltas)]
        if n < rounds - 1:
            first = {"index": 0, "id": f"call_{n}", "name": "lookup", "args": '{"q": '}
            chunks.append(AIMessageChunk(content="", tool_call_chunks=[first]))
            for args in (f'"n{n}"', "}"):
                rest = {"index": 0, "id": None, "name": None, "args": args}
                chunks.append(AIMessageChunk(content="", tool_call_chunks=[rest]))
        chunks.append(
            AIMessageChunk(
                content="",
                response_metadata={"finish_reason": "stop", "model_name": "bench"},
                usage_metadata={"input_tokens": 100, "output_tokens": deltas, "total_tokens": 0},
            )
        )
        return chunks

    script = [call(n) for n in range(rounds)]
    texts = [[chunk.model_dump_json() for chunk in chunks] for chunks in script]

    class Replay(BaseChatModel):
        """Streams the script's call for the run's next LLM call."""

        def chunks(self, messages: list[BaseMessage]) -> list[AIMessageChunk]:
            done = min(sum(isinstance(m, ToolMessage) for m in messages), rounds - 1)
            if parsed:
                return [AIMessageChunk.model_validate_json(text) for text in texts[done]]
            # Copies: LangChain gives the chunks ids and positions as they stream.
            return [chunk.model_copy() for chunk in script[done]]

        @property
        def _llm_type(self) -> str:
            return "replay"

        def _generate(self, messages: list[BaseMessage], *a: Any, **k: Any) -> ChatResult:
            whole = AIMessageChunk(content="")
            for chunk in self.chunks(messages):
                whole += chunk
            message = AIMessage(content=whole.content, tool_calls=whole.tool_calls)
            return ChatResult(generations=[ChatGeneration(message=message)])

        async def _astream(
            self, messages: list[BaseMessage], *a: Any, **k: Any
        ) -> AsyncIterator[ChatGenerationChunk]:
            run_manager = k.get("run_manager")
            for chunk in self.chunks(messages):
                generation = ChatGenerationChunk(message=chunk)
                if run_manager is not None:
                    await run_manager.on_llm_new_token(chunk.text, chunk=generation)
                yield generation

        def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
            return self

    return graph_on(Replay(), lookup_tool(), checkpointer=checkpointer)


def lookup_tool() -> Any:
    """The graph's one tool."""
    from langchain_core.tools import tool

    @tool
    def lookup(q: str) -> str:
        """Look something up."""
        return f"found {q}"

    return lookup


def graph_on(model: Any, lookup: Any, *, checkpointer: bool) -> Any:
    """The ReAct graph: ``model`` (its tools bound) as the agent node, ``lookup`` run by a
    ``ToolNode``."""
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([lookup]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=InMemorySaver() if checkpointer else None)


async def graph_turn(graph: Any, n: int) -> int:
    from langchain_core.messages import HumanMessage

    from essessey.adapters.langgraph import graph_stream

    config = {"configurable": {"thread_id": f"graph_{n}"}}
    count = 0
    async for _ in graph_stream(graph, {"messages": [HumanMessage("go")]}, config):
        count += 1
    return count


def producer(graph: Any) -> Callable[[str], Any]:
    """The turn of ``AgentTurns(graph)`` for a Responses request, on a stream (the
    request's id names the thread: a new one each turn)."""
    from essessey.adapters.langgraph import AgentTurns
    from essessey.dialects.responses import ResponsesRequest

    turns = AgentTurns(graph)
    return lambda stream_id: turns(ResponsesRequest(stream_id, "m", "go"))


async def measure(args: argparse.Namespace, model: str, url: str | None) -> list[dict[str, Any]]:
    """The paths' rows on the ``model`` way (``url``: the model server's, for ``wire``)."""
    llm = None
    if model == "wire":
        from langchain_openai import ChatOpenAI

        llm = ChatOpenAI(
            model="gpt-bench",
            base_url=url,
            api_key="bench",
            streaming=True,
            stream_usage=True,
            max_retries=0,
        )
        lookup = lookup_tool()
        graph = graph_on(llm.bind_tools([lookup]), lookup, checkpointer=args.checkpointer)
    else:
        parsed = model == "parsed"
        graph = make_graph(args.rounds, args.deltas, checkpointer=args.checkpointer, parsed=parsed)
    paths = [
        plain("LangGraph astream", lambda n: graph_turn(graph, n)),
        *hub_paths("essessey AgentTurns", producer(graph)),
    ]
    return await compare_closing(paths, args, llm.root_async_client if llm else None)


def main() -> None:
    parser = turn_parser(__doc__, rounds="LLM calls", deltas="text chunks")
    parser.add_argument(
        "--checkpointer", action="store_true", help="compile the graph with an InMemorySaver"
    )
    args = turn_args(parser)
    saver = ", InMemorySaver" if args.checkpointer else ""
    run_models(
        args,
        chat_script,
        measure,
        benchmark=__file__,
        title=f"{args.rounds} LLM calls of {args.deltas} text chunks per turn{saver}",
        checkpointer=args.checkpointer,
    )


if __name__ == "__main__":
    main()
