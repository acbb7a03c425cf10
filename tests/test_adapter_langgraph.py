"""The LangGraph adapter (essessey.adapters.langgraph), offline: ReAct-style graphs
(a model node, ``ToolNode`` and ``tools_condition``) on a langchain-core chat model that
streams scripted chunks (tests/langgraph_graphs.py), and graphs that ``interrupt()``.

Every published turn passes the checker, and ``reassemble`` gives back what the graph's
final state says (the last AI message's text, the calls with their parsed arguments, the
tool messages). Through a hub: a question and approvals answered in process on another
replica (two hubs sharing one store and one checkpointer), over HTTP by the protocol's
answer route, the Chat Completions dialect (the openai SDK) and the AG-UI dialect (its
``resume``, every event validated by the ``ag-ui-protocol`` models), a turn read by the
openai SDK, a drop and resume in the middle of the run, an error and a cancel."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from decimal import Decimal
from typing import Annotated, Any

import anyio
import httpx
import openai
import pytest
from ag_ui.core import Event as AGUIEvent
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.types import Interrupt, interrupt
from pydantic import TypeAdapter
from starlette.applications import Starlette

from essessey import (
    ApprovalRequest,
    Event,
    InMemoryEventStore,
    InMemorySink,
    Publisher,
    Question,
    QuestionAnswer,
    StreamHub,
    ToolApproval,
    ToolOutput,
    check,
    reassemble_events,
)
from essessey.adapters import RunStates, stream_rounds
from essessey.adapters.langgraph import (
    AgentTurns,
    PublishedRun,
    graph_input,
    graph_stream,
    publish_run,
    request_approval,
    stream_run,
)
from essessey.bindings.sse import SSEDecoder
from essessey.dialects import dialect_routes
from essessey.dialects.agui import AGUIRunRequest
from essessey.dialects.chat_completions import ChatCompletionRequest
from essessey.dialects.ui import ChatRequest
from tests.adapter_views import (
    Interleaving,
    answer_approvals,
    block_starts,
    gated_interleavings,
    interleavings,
    split_text,
    starts,
    tool_use_blocks,
)
from tests.clients import read_sse
from tests.langgraph_graphs import (
    MODEL,
    SENT,
    ScriptedChatModel,
    add,
    after_tools,
    anthropic,
    anthropic_end,
    anthropic_text,
    anthropic_use,
    calls,
    finish,
    gated_tools,
    interleaved,
    model_graph,
    react_graph,
    reply,
    two_rounds,
    words,
)
from tests.processes import WAIT
from tests.servers import serve

pytestmark = pytest.mark.anyio

AGUI_EVENT: TypeAdapter[Any] = TypeAdapter(AGUIEvent)


def config(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


async def run_to_sink(
    graph: Any, prompt: str = "hi", thread: str = "t1", **options: Any
) -> tuple[list[Event], PublishedRun | None, BaseException | None]:
    sink = InMemorySink()
    run: PublishedRun | None = None
    error: BaseException | None = None
    try:
        run = await publish_run(
            Publisher(sink),
            graph,
            {"messages": [HumanMessage(prompt)]},
            config(thread),
            message_id="msg_1",
            stream_id="s1",
            **options,
        )
    except Exception as exc:
        error = exc
    events = [Event(e.event, e.data, str(n + 1)) for n, e in enumerate(sink.events)]
    assert check(events) == []
    return events, run, error


async def final_state(graph: Any, thread: str) -> list[BaseMessage]:
    snapshot = await graph.aget_state(config(thread))
    return list(snapshot.values["messages"])


def graph_calls(messages: list[BaseMessage]) -> list[tuple[str, str, Any]]:
    return [
        (call["id"], call["name"], call["args"])
        for message in messages
        if isinstance(message, AIMessage)
        for call in message.tool_calls
    ]


def graph_results(messages: list[BaseMessage]) -> dict[str, tuple[str, bool]]:
    return {
        message.tool_call_id: (str(message.content), message.status == "error")
        for message in messages
        if isinstance(message, ToolMessage)
    }


async def publish_parts(parts: list[Any]) -> tuple[list[Event], PublishedRun]:
    """``parts`` (stream parts as ``graph_stream`` yields them) published as one message."""

    async def stream() -> Any:
        for part in parts:
            yield part

    sink = InMemorySink()
    async with stream_rounds(Publisher(sink), message_id="msg_1", stream_id="s", model="m") as rs:
        out = await stream_run(rs, stream())
    return sink.events, out


# -- one run, one message ------------------------------------------------------------------------


async def test_reasoning_text_and_parallel_calls_are_rounds_of_one_message() -> None:
    graph = react_graph(two_rounds)
    events, run, error = await run_to_sink(graph)
    assert error is None
    assert run is not None
    parsed = reassemble_events(events)
    [message] = parsed.messages
    state = await final_state(graph, "t1")
    # What the graph's state says, the message says.
    last = state[-1]
    assert isinstance(last, AIMessage)
    assert run.text == last.text == "The sum is 5 and the sky is clear."
    assert message.text == "Let me check. " + last.text
    assert message.thinking == "I need both tools"
    assert message.signature == "sig"
    assert [(c.tool_use_id, c.name, c.params) for c in message.tool_calls] == graph_calls(state)
    assert {r.tool_use_id: (r.text, r.is_error) for r in message.tool_results} == graph_results(
        state
    )
    # Round 1: thinking, text, two calls, two results; round 2: the answer.
    assert starts(events) == [
        (0, "thinking"),
        (1, "text"),
        (2, "tool_use"),
        (3, "tool_use"),
        (4, "tool_result"),
        (5, "tool_result"),
        (6, "text"),
    ]
    assert message.stop_reason == "end_turn"
    assert message.usage == {"input_tokens": 20, "output_tokens": 10}
    assert message.model == "LangGraph"  # the graph's name, as message_start goes out first
    assert run.model == MODEL
    assert run.rounds == 2
    assert run.asked == []


async def test_interleaved_call_fragments_keep_each_call_whole() -> None:
    def respond(messages: list[BaseMessage]) -> list[AIMessageChunk]:
        if after_tools(messages):
            return reply("Done.")

        def fragment(index: int, args: str, call: tuple[str, str] | None = None) -> AIMessageChunk:
            call_id, name = call if call is not None else (None, None)
            chunk = {"index": index, "id": call_id, "name": name, "args": args}
            return AIMessageChunk(content="", tool_call_chunks=[chunk])

        return [
            fragment(0, '{"a":', ("c0", "add")),
            fragment(1, '{"ci', ("c1", "weather")),
            fragment(0, ' 1, "b": 2}'),
            fragment(1, 'ty": "Rome"}'),
            finish("tool_calls"),
        ]

    graph = react_graph(respond)
    events, run, error = await run_to_sink(graph)
    assert error is None
    assert run is not None
    message = reassemble_events(events).messages[0]
    assert [(c.tool_use_id, c.params) for c in message.tool_calls] == [
        ("c0", {"a": 1, "b": 2}),
        ("c1", {"city": "Rome"}),
    ]
    assert [r.text for r in message.tool_results] == ["3", '{"city": "Rome", "sky": "clear"}']
    assert message.text == "Done."


async def test_a_tool_that_raises_is_an_error_result_and_the_run_goes_on() -> None:
    def respond(messages: list[BaseMessage]) -> list[AIMessageChunk]:
        if results := after_tools(messages):
            return reply(f"It failed: {results[0].status}.")
        return [*calls(("call_x", "explode", {"reason": "test"})), finish("tool_calls")]

    graph = react_graph(respond)
    events, run, error = await run_to_sink(graph)
    assert error is None
    assert run is not None
    message = reassemble_events(events).messages[0]
    [result] = message.tool_results
    assert result.is_error
    assert result.text == graph_results(await final_state(graph, "t1"))["call_x"][0]
    assert "the tool failed" in result.text
    assert message.text == "It failed: error."


async def test_an_error_the_run_raises_is_an_error_event_and_the_exception() -> None:
    def respond(messages: list[BaseMessage]) -> list[AIMessageChunk]:
        if after_tools(messages):
            raise RuntimeError("the provider is down")
        return [*words("Checking. "), *calls(("c1", "add", {"a": 1, "b": 1})), finish("tool_calls")]

    events, run, error = await run_to_sink(react_graph(respond))
    assert isinstance(error, RuntimeError)
    assert run is None
    parsed = reassemble_events(events)
    assert parsed.messages[0].error is not None
    assert events[-1].event == "error"
    assert json.loads(events[-1].data)["error"]["message"] == "the turn failed: RuntimeError"
    assert "provider is down" not in events[-1].data.decode()


async def test_only_the_assistant_s_messages_of_the_chosen_nodes_are_published() -> None:
    """A node's whole AI message is a round; human and system messages a node writes,
    the LLM calls of nodes not in ``nodes`` and a ``nostream`` model are not published."""
    router = ScriptedChatModel(respond=lambda _: reply("route: answer"))
    hidden = ScriptedChatModel(respond=lambda _: reply("hidden")).with_config(tags=["nostream"])
    speaker = ScriptedChatModel(respond=lambda _: reply("Hello there."))

    async def route(state: MessagesState) -> dict[str, Any]:
        await router.ainvoke(state["messages"])
        await hidden.ainvoke(state["messages"])
        return {"messages": [SystemMessage("routed"), HumanMessage("(note)")]}

    async def speak(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await speaker.ainvoke(state["messages"]), AIMessage("Bye.")]}

    builder = StateGraph(MessagesState)
    builder.add_node("route", route)
    builder.add_node("speak", speak)
    builder.add_edge(START, "route")
    builder.add_edge("route", "speak")
    graph = builder.compile(checkpointer=InMemorySaver())
    events, run, _ = await run_to_sink(graph, nodes={"speak"})
    assert run is not None
    assert reassemble_events(events).text == "Hello there.Bye."
    assert run.rounds == 2
    events, run, _ = await run_to_sink(graph, thread="t2")
    assert reassemble_events(events).text == "route: answerHello there.Bye."


async def test_llm_calls_that_stream_at_once_are_rounds_one_after_the_other() -> None:
    first = ScriptedChatModel(respond=lambda _: reply("alpha beta gamma delta"), delay=0.01)
    second = ScriptedChatModel(respond=lambda _: reply("one two three four five"), delay=0.013)

    async def left(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await first.ainvoke(state["messages"])]}

    async def right(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await second.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("left", left)
    builder.add_node("right", right)
    builder.add_edge(START, "left")
    builder.add_edge(START, "right")  # parallel branches: their chunks interleave
    events, run, _ = await run_to_sink(builder.compile())
    assert run is not None
    assert run.rounds == 2
    assert starts(events) == [(0, "text"), (1, "text")]
    assert reassemble_events(events).text == "alpha beta gamma deltaone two three four five"


@pytest.mark.parametrize("subgraphs", [False, True])
async def test_a_subgraph_s_messages_whole_or_streamed(subgraphs: bool) -> None:
    builder = StateGraph(MessagesState)
    builder.add_node("inner", react_graph(two_rounds))
    builder.add_edge(START, "inner")
    graph = builder.compile(checkpointer=InMemorySaver())
    events, run, _ = await run_to_sink(graph, subgraphs=subgraphs)
    assert run is not None
    message = reassemble_events(events).messages[0]
    # The same message either way; streamed, its text goes out chunk by chunk.
    assert message.text == "Let me check. The sum is 5 and the sky is clear."
    assert [r.text for r in message.tool_results] == ["5", '{"city": "Oslo", "sky": "clear"}']
    deltas = [e for e in events if b"text_delta" in e.data]
    assert len(deltas) == (10 if subgraphs else 2)


async def test_the_v1_tuple_parts_read_as_the_v2_dicts() -> None:
    graph = react_graph(two_rounds)
    sink = InMemorySink()
    parts = graph.astream(
        {"messages": [HumanMessage("hi")]}, config("t9"), stream_mode=["messages", "updates"]
    )
    async with stream_rounds(Publisher(sink), message_id="m", stream_id="s", model="m") as rounds:
        run = await stream_run(rounds, parts)
    assert check(sink.events) == []
    assert run.text == "The sum is 5 and the sky is clear."
    assert reassemble_events(sink.events).messages[0].tool_results[0].text == "5"


async def test_parts_of_any_source_reasoning_content_cache_usage_and_a_cut_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """stream_run reads any async iterable of parts: here made by hand, as a provider's
    integration would give them (DeepSeek's ``reasoning_content``, OpenAI's cached tokens,
    a ``length`` finish); what it cannot read is skipped with a log line."""
    meta = {"langgraph_node": "agent", "ls_model_name": "deep-1"}

    def chunk(**fields: Any) -> dict[str, Any]:
        return {"type": "messages", "ns": (), "data": (AIMessageChunk(id="run-1", **fields), meta)}

    parts = [
        chunk(content="", additional_kwargs={"reasoning_content": "Think."}),
        chunk(content="Cut"),
        "not a part",
        {"type": "updates", "ns": (), "data": "not a mapping"},
        chunk(
            content=" off",
            response_metadata={"finish_reason": "length"},
            usage_metadata={
                "input_tokens": 100,
                "output_tokens": 7,
                "total_tokens": 107,
                "input_token_details": {"cache_read": 60},
            },
        ),
    ]

    events, run = await publish_parts(parts)
    assert check(events) == []
    message = reassemble_events(events).messages[0]
    assert (message.thinking, message.text) == ("Think.", "Cut off")
    assert message.stop_reason == "max_tokens"
    assert message.usage == {
        "input_tokens": 40,
        "cache_read_input_tokens": 60,
        "output_tokens": 7,
    }
    assert run.model == "deep-1"
    assert "Cut" not in caplog.text
    assert "no known shape" in caplog.text
    assert "not a mapping" not in caplog.text  # the reason names the type, not the value


async def test_a_tool_the_provider_ran_is_a_server_tool_block_pair() -> None:
    """langchain-core's standard blocks for a tool the provider ran itself (a web search)
    become the protocol's server_tool_use and <tool>_tool_result blocks, in their place
    among the text; one without its ids is skipped with a log line."""
    meta = {"langgraph_node": "agent"}
    search = {"type": "server_tool_call", "id": "srv_1", "name": "web_search"}
    found = {"type": "server_tool_result", "tool_call_id": "srv_1", "status": "success"}
    failed = {"type": "server_tool_result", "tool_call_id": "srv_2", "status": "error"}

    def chunk(content: Any) -> dict[str, Any]:
        return {
            "type": "messages",
            "ns": (),
            "data": (AIMessageChunk(id="run-1", content=content), meta),
        }

    parts = [
        chunk("Let me look. "),
        chunk([{**search, "args": {"query": "weather Oslo"}}]),
        chunk([{**found, "output": {"hits": [{"title": "Oslo: snow"}]}}]),
        chunk([{"type": "server_tool_call", "name": "no_id", "args": {}}]),
        chunk([{**search, "id": "srv_2", "args": {"query": "again"}}, {**failed, "output": None}]),
        chunk([{"type": "text", "text": "It snows."}]),
    ]

    events, _ = await publish_parts(parts)
    assert check(events) == []
    blocks = [
        event.json()["content_block"] for event in events if event.event == "content_block_start"
    ]
    assert [block["type"] for block in blocks] == [
        "text",
        "server_tool_use",
        "web_search_tool_result",
        "server_tool_use",
        "web_search_tool_result",
        "text",
    ]
    assert blocks[1] == {
        "type": "server_tool_use",
        "id": "srv_1",
        "name": "web_search",
        "input": {"query": "weather Oslo"},
    }
    assert blocks[2]["tool_use_id"] == "srv_1"
    assert blocks[2]["content"] == {"hits": [{"title": "Oslo: snow"}]}
    assert blocks[4] == {
        "type": "web_search_tool_result",
        "tool_use_id": "srv_2",
        "content": None,
        "is_error": True,
    }
    assert reassemble_events(events).messages[0].text == "Let me look. It snows."


async def test_interleaved_calls_without_an_end_chunk_are_all_published() -> None:
    meta = {"langgraph_node": "agent"}

    def chunk(message_id: str, text: str) -> dict[str, Any]:
        message = AIMessageChunk(id=message_id, content=text)
        return {"type": "messages", "ns": (), "data": (message, meta)}

    parts = [chunk("a", "A1 "), chunk("b", "B1 "), chunk("c", "C1 "), chunk("b", "B2 ")]

    events, run = await publish_parts(parts)
    assert check(events) == []
    assert run.rounds == 3
    assert reassemble_events(events).text == "A1 B1 B2 C1 "


# -- what the integrations stream -----------------------------------------------------------------
# Chunks as langchain-anthropic's ChatAnthropic and langchain-openai's ChatOpenAI give them
# (tests/langgraph_graphs.py), streamed by a scripted model in a graph.


async def test_a_server_tool_chatanthropic_streams_is_its_call_then_its_result() -> None:
    """ChatAnthropic streams a server tool's call as ``server_tool_call_chunk`` pieces,
    never as a whole block: the call goes out whole once its input is, before its
    result, whose block type is the provider's (an MCP call's too). Each is named as
    Anthropic names it, as the Anthropic adapter publishes it: langchain-core's
    ``remote_mcp`` is Anthropic's ``mcp_tool_use`` of its tool on its server."""
    hits = [{"type": "web_search_result", "title": "Oslo", "url": "https://example.com"}]

    def respond(messages: list[BaseMessage]) -> list[AIMessageChunk]:
        return [
            *anthropic_text(0, "Let me look."),
            *anthropic_use(1, "srvtoolu_1", "web_search", '{"query": "Oslo"}', server=True),
            anthropic(
                {
                    "type": "web_search_tool_result",
                    "tool_use_id": "srvtoolu_1",
                    "content": hits,
                    "index": 2,
                }
            ),
            anthropic(
                {
                    "type": "mcp_tool_use",
                    "id": "mcptoolu_1",
                    "name": "echo",
                    "input": {},
                    "server_name": "echo",
                    "index": 3,
                }
            ),
            anthropic(
                {"partial_json": '{"message": "hi"}', "type": "input_json_delta", "index": 3}
            ),
            anthropic(
                {
                    "type": "mcp_tool_result",
                    "tool_use_id": "mcptoolu_1",
                    "is_error": False,
                    "content": [{"type": "text", "text": "hi"}],
                    "index": 4,
                }
            ),
            *anthropic_text(5, "It snows."),
            anthropic_end("end_turn"),
        ]

    events, run, error = await run_to_sink(react_graph(respond))
    assert error is None
    assert run is not None
    blocks = block_starts(events)
    assert [block["type"] for block in blocks] == [
        "text",
        "server_tool_use",
        "web_search_tool_result",
        "mcp_tool_use",
        "mcp_tool_result",
        "text",
    ]
    assert blocks[1] == {
        "type": "server_tool_use",
        "id": "srvtoolu_1",
        "name": "web_search",
        "input": {"query": "Oslo"},
    }
    assert blocks[2] == {
        "type": "web_search_tool_result",
        "tool_use_id": "srvtoolu_1",
        "content": hits,
    }
    assert blocks[3] == {
        "type": "mcp_tool_use",
        "id": "mcptoolu_1",
        "name": "echo",
        "input": {"message": "hi"},
        "server_name": "echo",
    }
    assert blocks[4]["tool_use_id"] == "mcptoolu_1"
    assert reassemble_events(events).messages[0].text == "Let me look.It snows."
    assert run.stop_reason == "end_turn"


async def test_a_programmatic_call_keeps_its_caller_and_the_code_execution_its_name() -> None:
    """Claude's programmatic tool calling (ChatAnthropic): the code execution is published
    as Anthropic names it (langchain-core calls it ``code_interpreter``), and the client
    call its code makes keeps its ``caller``, which a client sends back with it (it was
    left out)."""
    direct = {"type": "direct"}
    by_code = {"type": "code_execution_20250825", "tool_id": "srvtoolu_1"}

    def respond(messages: list[BaseMessage]) -> list[AIMessageChunk]:
        if after_tools(messages):
            return reply("Rolled.")
        return [
            *anthropic_use(
                0, "srvtoolu_1", "code_execution", '{"code": "roll()"}', server=True, caller=direct
            ),
            *anthropic_use(1, "toolu_1", "add", '{"a": 2, "b": 3}', caller=by_code),
            anthropic_end("tool_use"),
        ]

    events, _, error = await run_to_sink(react_graph(respond))
    assert error is None
    assert check(events) == []
    blocks = block_starts(events)
    assert blocks[0] == {
        "type": "server_tool_use",
        "id": "srvtoolu_1",
        "name": "code_execution",
        "input": {"code": "roll()"},
        "caller": direct,
    }
    assert blocks[1]["caller"] == by_code
    [call, *_] = reassemble_events(events).tool_calls
    assert (call.tool_use_id, call.params, call.caller) == ("toolu_1", {"a": 2, "b": 3}, by_code)


async def test_a_streamed_server_call_goes_out_once_its_input_is_whole(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Once its input is whole JSON, while the provider runs the tool (a search takes its
    time), not when the result comes; an input that never is goes out as ``{}`` when the
    next block begins, with a log line giving its length only."""
    sink = InMemorySink()
    seen: list[list[dict[str, Any]]] = []

    def result(call_id: str, index: int) -> dict[str, Any]:
        block = {"type": "web_search_tool_result", "tool_use_id": call_id, "content": []}
        return _part(anthropic({**block, "index": index}))

    async def stream() -> Any:
        for chunk in anthropic_use(0, "srvtoolu_1", "web_search", '{"query": "x"}', server=True):
            yield _part(chunk)
        seen.append(block_starts(sink.events))  # the provider runs the search now
        yield result("srvtoolu_1", 1)
        for chunk in anthropic_use(2, "srvtoolu_2", "web_search", '{"query": "se', server=True):
            yield _part(chunk)
        yield result("srvtoolu_2", 3)
        yield _part(anthropic_end("end_turn"))

    async with stream_rounds(Publisher(sink), message_id="m", stream_id="s", model="m") as rs:
        await stream_run(rs, stream())
    assert check(sink.events) == []
    call = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search"}
    assert seen == [[{**call, "input": {"query": "x"}}]]
    assert [(b["type"], b.get("input")) for b in block_starts(sink.events)] == [
        ("server_tool_use", {"query": "x"}),
        ("web_search_tool_result", None),
        ("server_tool_use", {}),
        ("web_search_tool_result", None),
    ]
    assert "input is not a JSON object (13 characters)" in caplog.text
    assert "query" not in caplog.text


async def test_a_call_cut_off_by_max_tokens_is_not_left_to_the_client() -> None:
    """The provider's stream has the cut call's block and stops at max_tokens: so does
    the message, which does not wait for the call (LangChain hands the graph the call
    with what it could parse of its arguments; the graph did not run it)."""

    def respond(messages: list[BaseMessage]) -> list[AIMessageChunk]:
        return [
            *anthropic_text(0, "Adding."),
            *anthropic_use(1, "toolu_1", "add", '{"a": 1, "b'),
            anthropic_end("max_tokens"),
        ]

    events, run, error = await run_to_sink(model_graph(respond))
    assert error is None
    assert run is not None
    parsed = reassemble_events(events)
    [message] = parsed.messages
    assert message.stop_reason == run.stop_reason == "max_tokens"
    assert [(c.tool_use_id, c.arguments) for c in message.tool_calls] == [
        ("toolu_1", '{"a": 1, "b')
    ]
    assert message.tool_results == ()
    assert run.asked == []
    assert parsed.pending == ()


async def test_a_cut_call_in_a_message_that_asks_gets_an_error_result() -> None:
    """A message that asks ends with stop reason tool_use, which would make a cut call
    without a result the client's: it gets an error result, and only the question is
    asked."""
    question = Interrupt(value="Go on?", id="q" * 32)
    parts = [
        _part(chunk)
        for chunk in [*anthropic_use(0, "toolu_1", "add", '{"a": 1'), anthropic_end("max_tokens")]
    ]
    parts.append({"type": "updates", "ns": (), "data": {"__interrupt__": (question,)}})

    events, run = await publish_parts(parts)
    assert check(events) == []
    parsed = reassemble_events(events)
    [result] = parsed.messages[0].tool_results
    assert (result.tool_use_id, result.is_error) == ("toolu_1", True)
    assert run.asked == ["q" * 32]
    assert [type(r).__name__ for r in parsed.pending] == ["Question"]
    assert parsed.messages[0].stop_reason == "tool_use"


@pytest.mark.parametrize(
    ("reason", "metadata"),
    [
        ("pause_turn", {}),
        ("stop_sequence", {"stop_sequence": "###"}),
        ("model_context_window_exceeded", {}),
    ],
)
async def test_the_protocol_s_stop_reasons_go_out_as_they_are(
    reason: str, metadata: dict[str, Any]
) -> None:
    def respond(messages: list[BaseMessage]) -> list[AIMessageChunk]:
        return [*anthropic_text(0, "So far"), anthropic_end(reason, **metadata)]

    events, run, error = await run_to_sink(react_graph(respond))
    assert error is None
    assert run is not None
    message = reassemble_events(events).messages[0]
    assert message.stop_reason == run.stop_reason == reason
    assert message.stop_sequence == metadata.get("stop_sequence")


@pytest.mark.parametrize(
    ("reason", "stop"), [("max_output_tokens", "max_tokens"), ("content_filter", "refusal")]
)
async def test_a_responses_api_response_cut_short_says_why(reason: str, stop: str) -> None:
    """ChatOpenAI on the Responses API: the response's status and incomplete_details."""
    openai = {"model_provider": "openai", "model_name": "gpt-5"}
    end = {**openai, "status": "incomplete", "incomplete_details": {"reason": reason}}

    def respond(messages: list[BaseMessage]) -> list[AIMessageChunk]:
        text = {"type": "text", "text": "Cut", "index": 0}
        return [
            AIMessageChunk(content=[text], response_metadata=openai),
            AIMessageChunk(content=[], response_metadata=end, chunk_position="last"),
        ]

    events, run, error = await run_to_sink(react_graph(respond))
    assert error is None
    assert run is not None
    message = reassemble_events(events).messages[0]
    assert (message.text, message.stop_reason, run.stop_reason) == ("Cut", stop, stop)


@pytest.mark.parametrize("summary", [True, False], ids=["with-summary", "no-summary"])
async def test_a_responses_api_reasoning_item_s_encrypted_content_is_kept(summary: bool) -> None:
    """ChatOpenAI on the Responses API gives a reasoning item's encrypted_content at its
    end: the thinking block's signature, or a redacted_thinking block without a summary."""
    openai = {"model_provider": "openai", "model_name": "gpt-5"}

    def respond(messages: list[BaseMessage]) -> list[AIMessageChunk]:
        item: dict[str, Any] = {"type": "reasoning", "id": "rs_1", "index": 0}
        chunks = []
        if summary:
            part = {"index": 0, "type": "summary_text", "text": "Weighing it."}
            chunks.append(
                AIMessageChunk(content=[{**item, "summary": [part]}], response_metadata=openai)
            )
        done = {**item, "summary": [], "encrypted_content": "gAAAA-enc"}
        chunks.append(AIMessageChunk(content=[done], response_metadata=openai))
        chunks.append(
            AIMessageChunk(
                content=[{"type": "text", "text": "Done.", "index": 1}], response_metadata=openai
            )
        )
        end = {**openai, "status": "completed"}
        chunks.append(AIMessageChunk(content=[], response_metadata=end, chunk_position="last"))
        return chunks

    events, _, error = await run_to_sink(react_graph(respond))
    assert error is None
    message = reassemble_events(events).messages[0]
    assert message.text == "Done."
    if summary:
        assert (message.thinking, message.signature) == ("Weighing it.", "gAAAA-enc")
        assert starts(events) == [(0, "thinking"), (1, "text")]
    else:
        assert starts(events) == [(0, "redacted_thinking"), (1, "text")]
        [block] = [b for b in block_starts(events) if b["type"] == "redacted_thinking"]
        assert block["data"] == "gAAAA-enc"


async def test_a_refusal_s_stop_details_go_out_with_its_stop() -> None:
    """Anthropic's account of a refusal (``stop_details``) is the epilogue's; its
    explanation, which langchain-core also gives as a refusal block, is not the model's
    text."""
    details = {"type": "refusal", "category": "cyber", "explanation": "Refused by policy."}

    def respond(messages: list[BaseMessage]) -> list[AIMessageChunk]:
        return [anthropic_end("refusal", stop_details=details)]

    events, run, error = await run_to_sink(react_graph(respond))
    assert error is None
    assert run is not None
    message = reassemble_events(events).messages[0]
    assert message.stop_reason == "refusal"
    assert message.stop_details == details
    assert message.text == ""
    assert block_starts(events) == []


async def test_a_signed_thinking_block_without_text_keeps_its_signature() -> None:
    def respond(messages: list[BaseMessage]) -> list[AIMessageChunk]:
        return [
            anthropic({"type": "thinking", "thinking": "", "index": 0}),
            anthropic({"type": "thinking", "thinking": "", "signature": "sig-1", "index": 0}),
            *anthropic_text(1, "Four."),
            anthropic_end("end_turn"),
        ]

    events, _, error = await run_to_sink(react_graph(respond))
    assert error is None
    message = reassemble_events(events).messages[0]
    assert (message.thinking, message.signature, message.text) == ("", "sig-1", "Four.")
    assert starts(events) == [(0, "thinking"), (1, "text")]


async def test_claude_s_redacted_thinking_is_a_redacted_thinking_block(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def respond(messages: list[BaseMessage]) -> list[AIMessageChunk]:
        return [
            anthropic({"type": "redacted_thinking", "data": "opaque-1", "index": 0}),
            *anthropic_text(1, "Four."),
            anthropic_end("end_turn"),
        ]

    with caplog.at_level(logging.WARNING, logger="essessey.adapters.langgraph"):
        events, _, error = await run_to_sink(react_graph(respond))
    assert error is None
    assert [r.getMessage() for r in caplog.records] == []
    assert starts(events) == [(0, "redacted_thinking"), (1, "text")]
    [block] = [b for b in block_starts(events) if b["type"] == "redacted_thinking"]
    assert block["data"] == "opaque-1"
    assert reassemble_events(events).text == "Four."


async def test_a_compaction_is_a_compaction_block_carried_whole(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Claude compacting the conversation (ChatAnthropic gives its one compaction_delta as
    # the block, with a "text" of None), and a Responses API compaction item (ChatOpenAI
    # gives it whole): the summary and what a client sends back in its place were logged
    # and left out, lost to every client.
    claude = {"text": None, "type": "compaction", "content": "So far.", "index": 0}
    claude["encrypted_content"] = "enc-1"
    item = {"type": "compaction", "id": "cmp_1", "encrypted_content": "enc-2", "index": 1}

    def respond(messages: list[BaseMessage]) -> list[AIMessageChunk]:
        return [
            anthropic(claude),
            anthropic(item),
            *anthropic_text(2, "Four."),
            anthropic_end("end_turn"),
        ]

    with caplog.at_level(logging.WARNING, logger="essessey.adapters.langgraph"):
        events, _, error = await run_to_sink(react_graph(respond))
    assert error is None
    assert check(events) == []
    assert [r.getMessage() for r in caplog.records] == []
    assert block_starts(events) == [
        {"type": "compaction", "content": "So far.", "encrypted_content": "enc-1"},
        {"type": "compaction", "content": None, "encrypted_content": "enc-2"},
        {"type": "text"},
    ]
    assert reassemble_events(events).text == "Four."


async def test_a_stream_of_several_provider_messages_is_one_round(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """ChatAnthropic marks each message_delta last, and one Anthropic stream may hold
    several messages (a tool search, programmatic calls): all of them are the LLM call's
    round, each message's blocks closed at its end, their calls declared together."""

    def respond(messages: list[BaseMessage]) -> list[AIMessageChunk]:
        if after_tools(messages):
            return reply("Both done.")
        return [
            *anthropic_text(0, "Adding first."),
            *anthropic_use(1, "toolu_add", "add", '{"a": 2, "b": 3}'),
            anthropic_end("tool_use"),
            *anthropic_text(0, " Then the sky."),
            *anthropic_use(2, "toolu_sky", "weather", '{"city": "Oslo"}'),
            anthropic_end("tool_use", output_tokens=7),
        ]

    graph = react_graph(respond)
    with caplog.at_level(logging.WARNING, logger="essessey.adapters.langgraph"):
        events, run, error = await run_to_sink(graph)
    assert error is None
    assert run is not None
    assert [r.getMessage() for r in caplog.records if r.name.startswith("essessey")] == []
    [message] = reassemble_events(events).messages
    state = await final_state(graph, "t1")
    assert [(c.tool_use_id, c.name, c.params) for c in message.tool_calls] == graph_calls(state)
    assert {r.tool_use_id: (r.text, r.is_error) for r in message.tool_results} == graph_results(
        state
    )
    assert starts(events) == [
        (0, "text"),
        (1, "tool_use"),
        (2, "text"),
        (3, "tool_use"),
        (4, "tool_result"),
        (5, "tool_result"),
        (6, "text"),
    ]
    assert message.text == "Adding first. Then the sky.Both done."
    assert run.rounds == 2
    assert message.usage["output_tokens"] == 5 + 7 + 5


async def test_mistral_thinking_parts_through_chatopenai_are_thinking() -> None:
    def respond(messages: list[BaseMessage]) -> list[AIMessageChunk]:
        openai = {"model_provider": "openai"}
        return [
            AIMessageChunk(
                content=[{"type": "thinking", "thinking": [{"type": "text", "text": part}]}],
                response_metadata=openai,
            )
            for part in ("Two and two ", "make four.")
        ] + [AIMessageChunk(content="4.", response_metadata=openai), finish()]

    events, _, error = await run_to_sink(react_graph(respond))
    assert error is None
    message = reassemble_events(events).messages[0]
    assert (message.thinking, message.text) == ("Two and two make four.", "4.")


async def test_a_block_the_protocol_has_no_place_for_is_logged_once_per_type(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An item that needs the client (an apply_patch_call), an image, ...: a WARNING
    naming the type, once a run, never the content; a custom tool call, which
    langchain-core gives as a tool call too, is published as that."""
    openai = {"model_provider": "openai"}
    patch = {
        "type": "apply_patch_call",
        "call_id": "call_patch",
        "operation": {"type": "delete_file", "path": "secret.txt"},
        "index": 0,
    }
    custom = {
        "type": "custom_tool_call",
        "call_id": "call_sql",
        "name": "add",
        "input": "1 + 2",
        "index": 2,
    }

    def respond(messages: list[BaseMessage]) -> list[AIMessageChunk]:
        if after_tools(messages):
            return reply("Done.")
        return [
            AIMessageChunk(content=[patch], response_metadata=openai),
            AIMessageChunk(content=[{**patch, "index": 1}], response_metadata=openai),
            AIMessageChunk(
                content=[{"type": "image", "base64": "aGk=", "mime_type": "image/png"}],
                response_metadata=openai,
            ),
            AIMessageChunk(
                content=[custom],
                tool_call_chunks=[
                    {"id": "call_sql", "name": "add", "args": '{"a": 1, "b": 2}', "index": 2}
                ],
                response_metadata=openai,
            ),
            finish("tool_calls"),
        ]

    with caplog.at_level(logging.WARNING, logger="essessey.adapters.langgraph"):
        _, run, error = await run_to_sink(react_graph(respond))
    assert error is None
    assert run is not None
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.name == "essessey.adapters.langgraph" and r.levelno == logging.WARNING
    ]
    assert len(warnings) == 2
    assert "type apply_patch_call is not published" in warnings[0]
    assert "type image is not published" in warnings[1]
    assert "secret" not in caplog.text
    assert [c.id for c in run.tool_calls] == ["call_sql"]


async def test_a_new_call_id_at_an_index_in_use_is_a_call_of_its_own() -> None:
    def fragment(call_id: str, name: str, args: str) -> dict[str, Any]:
        chunk = {"index": 0, "id": call_id, "name": name, "args": args}
        return _part(AIMessageChunk(content="", tool_call_chunks=[chunk]))

    parts = [
        fragment("c1", "add", '{"a": 1, "b": 2}'),
        fragment("c2", "weather", '{"city": "Rome"}'),
        _part(
            AIMessageChunk(
                content="", response_metadata={"finish_reason": "tool_calls"}, chunk_position="last"
            )
        ),
    ]

    events, run = await publish_parts(parts)
    assert check(events) == []
    assert [(c.id, c.name, c.input) for c in run.tool_calls] == [
        ("c1", "add", {"a": 1, "b": 2}),
        ("c2", "weather", {"city": "Rome"}),
    ]
    assert run.asked == ["c1", "c2"]


def test_graph_input_is_the_conversation_or_the_last_user_message() -> None:
    request = ChatCompletionRequest(
        "chatcmpl-1",
        "m",
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Weather?"},
        ],
    )
    whole = graph_input(request)["messages"]
    assert [(type(m).__name__, m.content) for m in whole] == [
        ("SystemMessage", "Be brief."),
        ("HumanMessage", "Hi"),
        ("AIMessage", "Hello."),
        ("HumanMessage", "Weather?"),
    ]
    [last] = graph_input(request, new_thread=False)["messages"]
    assert (type(last).__name__, last.content) == ("HumanMessage", "Weather?")


# -- through the hub -----------------------------------------------------------------------


def chat(stream_id: str, text: str = "hi") -> ChatRequest:
    return ChatRequest(
        stream_id, [{"role": "user", "parts": [{"type": "text", "text": text}]}], "submit-message"
    )


def mail(messages: list[BaseMessage]) -> list[AIMessageChunk]:
    """Mails ada and adds two numbers (parallel calls), then answers."""
    if results := after_tools(messages):
        return reply(" / ".join(str(r.content) for r in results))
    return [
        *words("Sending it. "),
        *calls(
            ("call_mail", "send_email", {"to": "ada@example.com"}),
            ("call_add", "add", {"a": 1, "b": 2}),
        ),
        finish("tool_calls"),
    ]


@tool
def book(table: int) -> str:
    """Book a table, on the day the user says."""
    day = interrupt("Which day?")
    return f"booked table {table} on {day}"


@tool
def book_named(table: int, tool_call_id: Annotated[str, InjectedToolCallId]) -> str:
    """Book a table, asking the day with the call's own id."""
    day = interrupt({"question": f"Which day for table {table}?", "tool_call_id": tool_call_id})
    return f"booked table {table} on {day}"


def booking(name: str, *tables: int, adding: bool = True) -> Any:
    """Books the tables (a call each), adding two numbers beside them unless not
    ``adding``, then answers with the results."""

    def respond(messages: list[BaseMessage]) -> list[AIMessageChunk]:
        if results := after_tools(messages):
            return reply(" / ".join(str(r.content) for r in results))
        specs = [(f"call_{t}", name, {"table": t}) for t in tables]
        if adding:
            specs.insert(0, ("call_add", "add", {"a": 1, "b": 2}))
        return [*calls(*specs), finish("tool_calls")]

    return respond


async def asked(hub: StreamHub, turns: AgentTurns, stream_id: str, text: str) -> Any:
    """What the turn of ``text`` on ``stream_id`` waits for, once it stopped to ask."""
    await hub.start(stream_id, turns(chat(stream_id, text)))
    await hub.wait(stream_id)
    waiting = await hub.waiting(stream_id)
    assert waiting is not None
    return waiting


@pytest.mark.parametrize(
    ("send", "adding"),
    [(True, True), (True, False), (False, False)],
    ids=["a-task-per-call", "a-task-per-call-alone", "one-tools-task-alone"],
)
async def test_a_tool_that_asks_is_the_graph_s_call_and_its_result_follows_the_answer(
    send: bool, adding: bool
) -> None:
    # interrupt() inside a tool: the message asked the question and, for the same call,
    # an output from the client, which the answer then had to make up; the graph's own
    # result for the call was never published.
    graph = react_graph(booking("book", 8, adding=adding), tools=[add, book], send=send)
    turns = AgentTurns(graph)
    async with StreamHub(on_answer=turns.on_answer) as hub:
        [question] = (await asked(hub, turns, "b1", "Book table 8")).requests
        assert isinstance(question, Question)
        assert (question.question, question.tool_use_id) == ("Which day?", "call_8")
        assert (await hub.answer("b1", [QuestionAnswer(question.id, "Friday")])).started
        await hub.wait("b1")
        events, _ = await hub.store.since("b1", None)
    assert check(events) == []
    state = await final_state(graph, "b1")
    ran = {m.tool_call_id: m.content for m in state if isinstance(m, ToolMessage)}
    assert ran["call_8"] == "booked table 8 on Friday"
    published = {r.tool_use_id: r.text for r in reassemble_events(events).tool_results}
    assert published == ran


async def test_tools_that_name_their_call_when_they_ask_are_each_asked_for_it() -> None:
    graph = react_graph(booking("book_named", 4, 9), tools=[add, book_named], send=True)
    turns = AgentTurns(graph)
    async with StreamHub(on_answer=turns.on_answer) as hub:
        waiting = await asked(hub, turns, "b2", "Book tables 4 and 9")
        by_call = {q.tool_use_id: q for q in waiting.requests if isinstance(q, Question)}
        assert set(by_call) == {"call_4", "call_9"}
        assert by_call["call_9"].question == "Which day for table 9?"
        answers = [QuestionAnswer(by_call["call_4"].id, "Monday")]
        answers.append(QuestionAnswer(by_call["call_9"].id, "Tuesday"))
        assert (await hub.answer("b2", answers)).started
        await hub.wait("b2")
        events, _ = await hub.store.since("b2", None)
    assert check(events) == []
    published = {r.tool_use_id: r.text for r in reassemble_events(events).tool_results}
    assert published["call_4"] == "booked table 4 on Monday"
    assert published["call_9"] == "booked table 9 on Tuesday"


def pay_tool(second: str) -> Any:
    """A tool approved before it pays that asks again before it ends: a question
    (``second="question"``) or a second approval (over a limit)."""

    @tool
    def pay(amount: int, tool_call_id: Annotated[str, InjectedToolCallId]) -> str:
        """Pay an amount."""
        if not request_approval(tool_call_id, reason="pays").approved:
            return "not paid"
        if second == "question":
            account = interrupt("From which account?")
        else:
            over = request_approval(tool_call_id, reason="over the daily limit").approved
            account = "checking" if over else "nowhere"
        return f"paid {amount} from {account}"

    return pay


@pytest.mark.parametrize("second", ["question", "approval"])
async def test_an_approved_call_that_asks_again_gets_its_result_after_the_answer(
    second: str,
) -> None:
    # The continuation knew only the calls of its own rounds: the second request was
    # asked as a question of the interrupt's JSON (an approval) or of no call, and the
    # tool's result, once it returned, was dropped ("names no call of this run").
    def respond(messages: list[BaseMessage]) -> list[AIMessageChunk]:
        if results := after_tools(messages):
            return reply(str(results[-1].content))
        return [*calls(("call_pay", "pay", {"amount": 5})), finish("tool_calls")]

    graph = react_graph(respond, tools=[pay_tool(second)])
    turns = AgentTurns(graph)
    async with StreamHub(on_answer=turns.on_answer) as hub:
        [first] = (await asked(hub, turns, "p1", "pay")).requests
        assert isinstance(first, ApprovalRequest)
        assert (await hub.answer("p1", [ToolApproval(first.id, True)])).started
        await hub.wait("p1")
        waiting = await hub.waiting("p1")
        assert waiting is not None
        [again] = waiting.requests
        if second == "question":
            assert isinstance(again, Question)
            assert (again.question, again.tool_use_id) == ("From which account?", "call_pay")
            answer: Any = QuestionAnswer(again.id, "savings")
        else:
            assert isinstance(again, ApprovalRequest)
            assert (again.tool_use_id, again.name, again.input) == (
                "call_pay",
                "pay",
                {"amount": 5},
            )
            answer = ToolApproval(again.id, True)
        assert (await hub.answer("p1", [answer])).started
        await hub.wait("p1")
        events, _ = await hub.store.since("p1", None)
    assert check(events) == []
    state = await final_state(graph, "p1")
    ran = [(m.tool_call_id, m.content) for m in state if isinstance(m, ToolMessage)]
    expected = "paid 5 from " + ("savings" if second == "question" else "checking")
    assert ran == [("call_pay", expected)]
    published = [(r.tool_use_id, r.text) for r in reassemble_events(events).tool_results]
    assert published == ran


async def test_a_question_answered_on_another_replica_resumes_the_graph() -> None:
    store, saver = InMemoryEventStore(), InMemorySaver()
    # Two replicas: each its own graph object and turns, one store and one checkpointer.
    turns_a = AgentTurns(
        react_graph(lambda _: reply("Five."), checkpointer=saver, ask_node=True),
        states=RunStates(store),
    )
    graph_b = react_graph(lambda _: reply("Five."), checkpointer=saver, ask_node=True)
    turns_b = AgentTurns(graph_b, states=RunStates(store))
    async with (
        StreamHub(store, on_answer=turns_a.on_answer) as a,
        StreamHub(store, on_answer=turns_b.on_answer) as b,
    ):
        await a.start("q1", turns_a(chat("q1", "2+3?")))
        await a.wait("q1")
        waiting = await b.waiting("q1")
        assert waiting is not None
        [question] = waiting.requests
        snapshot = await graph_b.aget_state(config("q1"))
        [pending] = snapshot.interrupts
        assert question.id == pending.id  # the interrupt's own id is the request's
        assert question.question == "Is that right?"  # type: ignore[union-attr]
        assert question.schema == {"enum": ["yes", "no"]}  # type: ignore[union-attr]
        continued = await b.answer("q1", [QuestionAnswer(question.id, "yes")])
        assert continued.started
        await b.wait("q1")
        events, _ = await store.since("q1", None)
    assert check(events) == []
    first, second = reassemble_events(events).messages
    assert (first.text, first.stop_reason) == ("Five.", "tool_use")
    assert (second.text, second.stop_reason) == ("You said yes.", "end_turn")
    state = await final_state(graph_b, "q1")
    assert [m.text for m in state if isinstance(m, AIMessage)] == ["Five.", "You said yes."]
    assert await RunStates(store).load(question.id) is None  # dropped once resumed


@pytest.mark.parametrize(("approved", "sent"), [(True, True), (False, False)])
async def test_an_approval_a_tool_asks_is_the_approval_of_its_call(
    approved: bool, sent: bool
) -> None:
    SENT.clear()
    graph = react_graph(mail, send=True)
    turns = AgentTurns(graph)
    stream = f"mail-{approved}"
    async with StreamHub(on_answer=turns.on_answer) as hub:
        await hub.start(stream, turns(chat(stream)))
        await hub.wait(stream)
        waiting = await hub.waiting(stream)
        assert waiting is not None
        [request] = waiting.requests
        assert request.tool_use_id == "call_mail"  # type: ignore[union-attr]
        assert request.input == {"to": "ada@example.com"}  # type: ignore[union-attr]
        assert request.reason == "sends an email"  # type: ignore[union-attr]
        answer = ToolApproval(request.id, approved=approved, reason=None if approved else "no")
        await hub.answer(stream, [answer])
        await hub.wait(stream)
        events, _ = await hub.store.since(stream, None)
    assert check(events) == []
    assert len(SENT) == int(sent)
    first, second = reassemble_events(events).messages
    assert first.stop_reason == "tool_use"
    # One task per call: the add's result is in the asking message, the mail's after.
    assert {r.tool_use_id: r.text for r in first.tool_results} == {"call_add": "3"}
    mail_result = "sent to ada@example.com" if sent else "not sent: no"
    assert {r.tool_use_id: r.text for r in second.tool_results} == {"call_mail": mail_result}
    assert second.text == f"{mail_result} / 3"
    state = await final_state(graph, stream)
    assert graph_results(state)["call_mail"] == (mail_result, False)


async def test_a_call_the_graph_does_not_run_is_the_client_s_and_its_output_resumes() -> None:
    def respond(messages: list[BaseMessage]) -> list[AIMessageChunk]:
        if results := after_tools(messages):
            return reply(f"You are at {results[0].content}.")
        return [*calls(("call_loc", "get_location", {"precise": True})), finish("tool_calls")]

    model_graph = StateGraph(MessagesState)
    model = ScriptedChatModel(respond=respond)

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    model_graph.add_node("agent", agent)
    model_graph.add_edge(START, "agent")
    graph = model_graph.compile(checkpointer=InMemorySaver())
    turns = AgentTurns(graph)
    async with StreamHub(on_answer=turns.on_answer) as hub:
        await hub.start("loc", turns(chat("loc")))
        await hub.wait("loc")
        waiting = await hub.waiting("loc")
        assert waiting is not None
        [call] = waiting.requests
        assert (call.id, call.name) == ("call_loc", "get_location")  # type: ignore[union-attr]
        await hub.answer("loc", [ToolOutput("call_loc", "Oslo")])
        await hub.wait("loc")
        events, _ = await hub.store.since("loc", None)
    assert check(events) == []
    first, second = reassemble_events(events).messages
    assert first.stop_reason == "tool_use"
    assert second.text == "You are at Oslo."
    state = await final_state(graph, "loc")
    assert graph_results(state) == {"call_loc": ("Oslo", False)}


async def test_a_cancelled_turn_closes_the_graph_run() -> None:
    streamed: list[AIMessageChunk] = []
    two = anyio.Event()

    def on_chunk(chunk: AIMessageChunk) -> None:
        streamed.append(chunk)
        if len(streamed) == 2:
            two.set()

    graph = react_graph(
        lambda _: reply("one two three four five six seven eight"), delay=0.05, on_chunk=on_chunk
    )
    turns = AgentTurns(graph)
    async with StreamHub() as hub:
        await hub.start("c1", turns(chat("c1")))
        with anyio.fail_after(WAIT):
            await two.wait()
        assert await hub.cancel("c1")
        await hub.wait("c1")
        count = len(streamed)
        await anyio.sleep(0.2)
        # The model's stream stopped with the turn: nothing of the run goes on.
        assert len(streamed) == count < 9
        events, _ = await hub.store.since("c1", None)
    parsed = reassemble_events(events)
    assert parsed.messages[-1].stop_reason == "cancelled"
    assert check(events) == []


class _SlowSink:
    """A sink that takes its time with every event (a store far away)."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.three = anyio.Event()  # set once three events went out

    async def emit(self, event: Event) -> None:
        await anyio.sleep(0.03)
        self.events.append(event)
        if len(self.events) == 3:
            self.three.set()


async def test_a_turn_cancelled_while_it_publishes_closes_the_graph_run() -> None:
    # The sink takes longer over an event than the model over a chunk: the cancellation
    # lands while a part is being published, with the model's stream still going.
    streamed: list[AIMessageChunk] = []
    words = " ".join(f"w{n}" for n in range(60))
    graph = react_graph(lambda _: reply(words), delay=0.01, on_chunk=streamed.append)
    sink = _SlowSink()

    async def run() -> None:
        await publish_run(
            Publisher(sink),
            graph,
            {"messages": [HumanMessage("hi")]},
            config("slow"),
            message_id="m",
            stream_id="s",
        )

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(run)
        with anyio.fail_after(WAIT):
            await sink.three.wait()
        tasks.cancel_scope.cancel()
    count = len(streamed)
    await anyio.sleep(0.2)
    # The model's stream stopped with the turn: nothing of the run goes on.
    assert len(streamed) == count < 60
    assert check(sink.events) != []  # cut short: no message_stop
    # The cancellation came as the text block opened: the block's start and its first
    # delta went out together, as the publishing shields them, so no block is left empty.
    names = [event.event for event in sink.events]
    starts = [i for i, name in enumerate(names) if name == "content_block_start"]
    assert starts
    assert all(names[i + 1 : i + 2] == ["content_block_delta"] for i in starts), names


async def test_drop_and_resume_in_the_middle_of_the_run_gives_every_event_once() -> None:
    graph = react_graph(two_rounds, delay=0.01)
    turns = AgentTurns(graph)
    async with StreamHub() as hub:
        await hub.start("d1", turns(chat("d1")))
        seen: list[Event] = []
        with anyio.fail_after(WAIT):
            async for event in hub.subscribe("d1"):
                seen.append(event)
                if event.event == "content_block_start" and b"tool_result" in event.data:
                    break  # the reader drops here, mid-run
        rest: list[Event] = []
        with anyio.fail_after(WAIT):
            async for event in hub.subscribe("d1", seen[-1].id):
                rest.append(event)
        whole, _ = await hub.store.since("d1", None)
    assert [e.id for e in seen + rest] == [e.id for e in whole]
    assert len({e.id for e in whole}) == len(whole)
    assert check(seen + rest) == []
    assert reassemble_events(seen + rest).text == "Let me check. The sum is 5 and the sky is clear."


# -- over HTTP -----------------------------------------------------------------------------


@pytest.fixture
def served() -> Iterator[str]:
    """Every dialect on AgentTurns of a graph that answers, asks ``Is that right?`` and,
    when told to ``mail``, asks to approve the mail first."""

    def respond(messages: list[BaseMessage]) -> list[AIMessageChunk]:
        user = next(m for m in reversed(messages) if isinstance(m, HumanMessage))
        if "mail" in str(user.content):
            return mail(messages)
        return two_rounds(messages)

    graph = react_graph(respond, ask_node=True, send=True)
    turns = AgentTurns(graph)
    hub = StreamHub(on_answer=turns.on_answer)
    app = Starlette(routes=list(dialect_routes(hub, turns)), lifespan=hub.lifespan)
    with serve(app, lifespan="on") as url:
        yield url


def agui_events(body: bytes) -> list[dict[str, Any]]:
    decoder = SSEDecoder()
    found = [json.loads(m.data) for m in decoder.feed(body) + decoder.close()]
    for item in found:
        AGUI_EVENT.validate_python(item)
    return found


def agui_run(thread: str, run_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "threadId": thread,
        "runId": run_id,
        "messages": [{"id": "u1", "role": "user", "content": "2+3 and the weather?"}],
        "tools": [],
        "context": [],
        "state": {},
        "forwardedProps": {},
        **extra,
    }


async def test_a_question_answered_by_the_protocol_route_and_by_the_openai_sdk(
    served: str,
) -> None:
    url = served
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as sdk:
        # Chat Completions: the graph's turn, then its question as a call of ask_user.
        first = await sdk.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "2+3 and the weather?"}]
        )
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content is not None
        assert choice.message.content.endswith("The sum is 5 and the sky is clear.")
        [ask] = [c for c in choice.message.tool_calls or [] if c.function.name == "ask_user"]  # type: ignore[union-attr]
        assert json.loads(ask.function.arguments)["question"] == "Is that right?"  # type: ignore[union-attr]
        answer = [
            {"role": "user", "content": "2+3 and the weather?"},
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": ask.id, "content": "yes"},
        ]
        second = await sdk.chat.completions.create(model="m", messages=answer)  # type: ignore[arg-type]
        assert second.choices[0].message.content == "You said yes."
        assert second.choices[0].finish_reason == "stop"

        # The protocol's answer route, on a turn a Chat Completions client started.
        started = await sdk.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "again?"}]
        )
        stream_id = started.id
    async with httpx.AsyncClient(timeout=WAIT) as http:
        asked = await read_sse(http, f"{url}/streams/{stream_id}")
        assert check(asked) == []
        [pending] = reassemble_events(asked).pending
        response = await http.post(
            f"{url}/streams/{stream_id}/answer",
            json={"answers": [{"id": pending.id, "value": "no"}]},
        )
        assert response.status_code == 200, response.text
        rest = await read_sse(
            http, f"{url}/streams/{stream_id}", last_event_id=response.json()["after"]
        )
    assert check(asked + rest) == []
    assert reassemble_events(asked + rest).messages[-1].text == "You said no."


async def test_an_approval_answered_by_an_ag_ui_resume(served: str) -> None:
    SENT.clear()
    async with httpx.AsyncClient(timeout=WAIT) as http:
        body = agui_run("thread-mail", "run-1")
        body["messages"][0]["content"] = "mail ada"
        first = agui_events((await http.post(f"{served}/agui", json=body)).content)
        outcome = first[-1]["outcome"]
        assert outcome["type"] == "interrupt"
        [request] = outcome["interrupts"]
        assert request["toolCallId"] == "call_mail"
        assert request["message"] == "sends an email"
        resume = agui_run(
            "thread-mail", "run-2", resume=[{"interruptId": request["id"], "status": "resolved"}]
        )
        second = agui_events((await http.post(f"{served}/agui", json=resume)).content)
    assert SENT == [{"to": "ada@example.com"}]
    results = {e["toolCallId"]: e["content"] for e in second if e["type"] == "TOOL_CALL_RESULT"}
    assert results["call_mail"] == "sent to ada@example.com"
    text = "".join(e["delta"] for e in second if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == "sent to ada@example.com / 3"
    # After the answer the graph asks its closing question: the run ends on it.
    [question] = second[-1]["outcome"]["interrupts"]
    assert question["message"] == "Is that right?"


async def test_the_openai_sdk_reads_a_turn_as_a_stream(served: str) -> None:
    async with openai.AsyncOpenAI(base_url=f"{served}/v1", api_key="x", max_retries=0) as sdk:
        stream = await sdk.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "weather?"}], stream=True
        )
        text = ""
        async for chunk in stream:
            for choice in chunk.choices:
                text += choice.delta.content or ""
        response = await sdk.responses.create(model="m", input="weather?")
    assert text.endswith("The sum is 5 and the sky is clear.")
    outputs = [item for item in response.output if item.type == "function_call_output"]
    assert [o.output for o in outputs] == ["5", '{"city": "Oslo", "sky": "clear"}']


def test_agui_requests_run_on_their_thread() -> None:
    request = AGUIRunRequest("stream-1", "thread-1", "run-1", [], {})
    turns = AgentTurns(react_graph(two_rounds))
    assert turns.thread_id(request) == "thread-1"
    assert turns.thread_id(chat("chat-1")) == "chat-1"


def test_an_interrupt_value_becomes_a_question() -> None:
    from essessey.adapters.langgraph._run import _question

    assert _question(Interrupt("Sure?", "i1")) == ("Sure?", None)
    schema = {"type": "string"}
    assert _question(Interrupt("Sure?", "i1", response_schema=schema)) == ("Sure?", schema)
    assert _question(Interrupt({"question": "Which?", "schema": schema}, "i1")) == (
        "Which?",
        schema,
    )
    assert _question(Interrupt({"action": "book", "nights": 2}, "i1")) == (
        '{"action":"book","nights":2}',
        None,
    )


@pytest.mark.parametrize(
    ("value", "question", "schema"),
    [
        (
            {"question": "How much?", "schema": {"maximum": Decimal("9.5")}},
            "How much?",
            {"maximum": 9.5},
        ),
        (
            {"question": "Pick", "schema": {"enum": [1, 2], "x-labels": {1: "one"}}},
            "Pick",
            {"enum": [1, 2], "x-labels": {"1": "one"}},
        ),
        ({"question": "Name?", "schema": {"title": "lone \ud800"}}, "Name?", None),
        ({1: "one", 2: "two"}, '{"1":"one","2":"two"}', None),
    ],
    ids=["a-decimal-in-the-schema", "int-keys-in-the-schema", "a-lone-surrogate", "int-keys"],
)
async def test_an_interrupt_value_json_has_no_type_for_still_asks(
    value: Any, question: str, schema: Any
) -> None:
    # What LangGraph checkpoints but orjson cannot write ended the turn with a
    # SerializationError (the thread left stuck at its interrupt, nothing asked), or was
    # asked as its type's name ("dict").
    def ask(state: MessagesState) -> dict[str, Any]:
        interrupt(value)
        return {"messages": []}

    builder = StateGraph(MessagesState)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    turns = AgentTurns(builder.compile(checkpointer=InMemorySaver()))
    async with StreamHub(on_answer=turns.on_answer) as hub:
        [asked_question] = (await asked(hub, turns, "i1", "go")).requests
        events, _ = await hub.store.since("i1", None)
    assert check(events) == []
    assert isinstance(asked_question, Question)
    assert (asked_question.question, asked_question.schema) == (question, schema)


async def test_graph_stream_reads_what_stream_run_takes() -> None:
    graph = react_graph(two_rounds)
    kinds = {part["type"] async for part in graph_stream(graph, {"messages": []}, config("g"))}
    assert kinds == {"messages", "updates"}


# -- any split of a model's stream ---------------------------------------------------------------

_NODE = {"langgraph_node": "model"}


def _part(chunk: AIMessageChunk) -> dict[str, Any]:
    """``chunk`` as the ``version="v2"`` messages part ``graph_stream`` yields."""
    return {"type": "messages", "ns": (), "data": (chunk, _NODE)}


# Text the protocol carries as it is: no lone surrogate (clean() replaces one).
_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=30)


@settings(max_examples=60, deadline=None)
@given(
    text=_TEXT,
    cuts=st.lists(st.integers(1, 30), max_size=8),
    calls=interleavings(),
    chunk_id=st.sampled_from(["run-1", "lc_run--1", None]),
)
def test_any_split_of_text_and_interleaved_call_fragments_is_published_whole(
    text: str, cuts: list[int], calls: Interleaving, chunk_id: str | None
) -> None:
    pieces = split_text(text, cuts)
    chunks = [AIMessageChunk(content=piece, id=chunk_id) for piece in pieces]
    for k, piece, first in calls.sequence:
        fragment = {
            "type": "tool_call_chunk",
            "index": k,
            "id": f"call_{k}" if first else None,
            "name": f"f{k}" if first else None,
            "args": piece,
        }
        chunks.append(AIMessageChunk(content="", id=chunk_id, tool_call_chunks=[fragment]))
    last = {"finish_reason": "tool_calls", "model_name": "m"}
    chunks.append(
        AIMessageChunk(content="", id=chunk_id, response_metadata=last, chunk_position="last")
    )

    events, out = anyio.run(publish_parts, [_part(c) for c in chunks])

    assert check(events) == []
    parsed = reassemble_events(events)
    [message] = parsed.messages
    assert message.text == text
    assert message.stop_reason == "tool_use"
    first = 1 if text else 0  # the text block comes first, the calls after it
    assert tool_use_blocks(events) == [
        (first + k, f"call_{k}", f"f{k}", p) for k, p in enumerate(calls.pieces)
    ]
    assert [c.arguments for c in parsed.tool_calls] == calls.arguments
    assert [(c.id, c.input) for c in out.tool_calls] == [
        (f"call_{k}", json.loads(a)) for k, a in enumerate(calls.arguments)
    ]
    # Left to the client (no tool message followed): the message asks for each result.
    assert out.asked == [f"call_{k}" for k in range(len(calls.arguments))]


# Parts of every shape the stream could carry, well-formed or not: they are published or
# skipped with a log line, and never break the message.
_JUNK_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=6,
)


# Lone surrogates too: no UTF-8 text carries one, so each is published as U+FFFD.
_ANY_CHAR = st.characters() | st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)


@st.composite
def _chunk(draw: st.DrawFn) -> AIMessageChunk:
    fragments = draw(
        st.lists(
            st.fixed_dictionaries(
                {
                    "type": st.just("tool_call_chunk"),
                    "index": st.none() | st.integers(0, 2),
                    "id": st.none() | st.sampled_from(["c1", "c2", ""]),
                    "name": st.none() | st.sampled_from(["f", ""]),
                    "args": st.none() | st.sampled_from(["{", '"a"', "}", "{}", "x", "", "\ud800"]),
                }
            ),
            max_size=2,
        )
    )
    return AIMessageChunk(
        content=draw(
            st.text(_ANY_CHAR, max_size=8) | st.lists(st.text(max_size=4).map(_text_block))
        ),
        id=draw(st.none() | st.sampled_from(["run-1", "run-2", "lc_run--3"])),
        tool_call_chunks=fragments,
        response_metadata=draw(
            st.sampled_from([{}, {"finish_reason": "stop"}, {"finish_reason": "length"}])
        ),
        chunk_position=draw(st.sampled_from([None, "last"])),
    )


def _text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


_ANY_PART = st.one_of(
    _chunk().map(_part),
    _JUNK_VALUE,
    st.tuples(st.sampled_from(["messages", "updates", "custom"]), _JUNK_VALUE),
    st.builds(
        lambda data: {"type": "messages", "ns": (), "data": data},
        _JUNK_VALUE | st.tuples(_JUNK_VALUE, _JUNK_VALUE),
    ),
    st.builds(
        lambda text, call: _part_of(ToolMessage(text, tool_call_id=call)),
        st.text(max_size=5),
        st.sampled_from(["c1", "c2", "nope"]),
    ),
)


def _part_of(message: BaseMessage) -> dict[str, Any]:
    return {"type": "messages", "ns": (), "data": (message, _NODE)}


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(_ANY_PART, max_size=12))
def test_any_sequence_of_parts_publishes_a_valid_message(parts: list[Any]) -> None:
    events, out = anyio.run(publish_parts, parts)
    assert check(events) == []
    [message] = reassemble_events(events).messages
    assert message.complete
    # Every call the run declared is a tool_use block of the message, once.
    ids = [c.tool_use_id for c in reassemble_events(events).tool_calls]
    assert sorted(ids) == sorted(c.id for c in out.tool_calls)
    assert len(set(ids)) == len(ids)


async def test_values_orjson_cannot_write_go_out_as_their_exact_json_text() -> None:
    # Python's json module (which LangChain's integrations parse with) reads integers
    # past 64 bits and "\ud800" escapes as lone surrogates; orjson writes neither. A whole
    # message's call arguments, a server tool's input and output, a tool's output and a
    # usage count holding one raised out of the adapter and ended the turn.
    big, lone = 2**64, "x\ud800"
    message = AIMessage(
        [
            {"type": "server_tool_call", "id": "s1", "name": "web_search", "args": {"n": big}},
            {"type": "server_tool_result", "tool_call_id": "s1", "output": [lone]},
        ],
        id="run-1",
        tool_calls=[{"id": "c1", "name": "f", "args": {"n": big, "s": lone}}],
        usage_metadata={"input_tokens": big, "output_tokens": 3, "total_tokens": big},
    )
    parts = [
        _part_of(message),
        _part_of(ToolMessage([{"type": "json", "n": big}], tool_call_id="c1")),
    ]
    events, out = await publish_parts(parts)
    assert check(events) == []
    [published] = reassemble_events(events).messages
    [call] = published.tool_calls
    assert json.loads(call.arguments) == {"n": big, "s": lone}  # exact, the surrogate escaped
    [result] = published.tool_results
    assert json.loads(result.text) == [{"type": "json", "n": big}]
    starts = [
        json.loads(e.data)["content_block"] for e in events if e.event == "content_block_start"
    ]
    [server] = [b for b in starts if b["type"] == "server_tool_use"]
    assert json.loads(server["input"]) == {"n": big}  # its JSON text, where orjson fails
    # Past 64 bits: left out of the epilogue, with a warning (message_start's 0 stands).
    assert published.usage["input_tokens"] == 0
    assert published.usage["output_tokens"] == 3
    assert out.results == {"c1": result.text}


@settings(max_examples=15, deadline=None)
@given(
    plan=gated_interleavings(st.sampled_from(['{"q": "a"}', '{"q": "b\\\\"c"}', '{"q": "}{"}'])),
    send=st.booleans(),
)
def test_any_parallel_calls_some_gated_answered_any_way_give_each_call_one_result(
    plan: tuple[Interleaving, list[bool], list[bool]], send: bool
) -> None:
    # Parallel calls whose fragments interleave, any of them asking for approval from
    # inside its tool, each answered yes or no, with one Send per call (or one tools
    # task for the round, when none asks or there is one call): every call gets exactly
    # one result (the tool's output, or its denial) before the question or after, and
    # the turn ends with the model's answer.
    calls, gated, approve = plan
    count = len(calls.arguments)
    if any(gated) and count > 1:
        # One task for the round stops at its first call that asks, and loses what the
        # others did: they are the client's to answer then (docs/langgraph.md, and why).
        send = True
    ran: list[str] = []

    def respond(messages: list[BaseMessage]) -> list[AIMessageChunk]:
        return reply("done") if after_tools(messages) else interleaved(calls.sequence)

    graph = react_graph(respond, tools=gated_tools(gated, ran), send=send)
    turns = AgentTurns(graph)
    _parsed, results = answer_approvals(
        turns(chat("s")), turns.on_answer, gated, approve, answer="done"
    )
    expected = {
        f"call_{k}": [(f"f{k} ran" if not gated[k] or approve[k] else f"f{k} denied", False)]
        for k in range(count)
    }
    assert results == expected
    # A tools task that stopped to ask runs again from its start once answered: with one
    # task for the round, the calls that did not ask run again too (LangGraph's way).
    assert set(ran) == {f"f{k}" for k in range(count) if not gated[k] or approve[k]}


def test_a_round_run_in_one_tools_task_that_stops_to_ask_says_what_that_costs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # ToolNode for the whole round: the call that asks stops the task, the other call's
    # result is lost and LangGraph runs it again on resume; the protocol reads it as the
    # client's. docs/langgraph.md says so, and the warning points there.
    ran: list[str] = []
    sequence = [(0, '{"q": "a"}', True), (1, '{"q": "b"}', True)]

    def respond(messages: list[BaseMessage]) -> list[AIMessageChunk]:
        return reply("done") if after_tools(messages) else interleaved(sequence)

    graph = react_graph(respond, tools=gated_tools([False, True], ran), send=False)
    turns = AgentTurns(graph)

    async def run() -> Any:
        async with StreamHub(on_answer=turns.on_answer) as hub:
            await hub.start("s", turns(chat("s")))
            await hub.wait("s")
            return await hub.waiting("s")

    with caplog.at_level(logging.WARNING, logger="essessey.adapters.langgraph"):
        waiting = anyio.run(run)
    assert waiting is not None
    assert [type(r).__name__ for r in waiting.requests] == ["ClientToolCall", "ApprovalRequest"]
    assert "1 calls of its round have no result" in caplog.text
    assert ran == ["f0"]  # it ran, and its result was lost with the task


async def test_a_thread_config_value_no_json_writer_takes_is_not_kept_with_the_run() -> None:
    # The state kept for an answer holds the thread's config values; one past 64 bits or
    # with a lone surrogate failed the save, and the run that asked ended in an error.
    states = RunStates()
    question = Interrupt(value="Which unit?", id="q" * 32)
    parts = [
        _part_of(AIMessage("Let me ask.", id="run-1")),
        {"type": "updates", "ns": (), "data": {"__interrupt__": (question,)}},
    ]

    async def stream() -> Any:
        for part in parts:
            yield part

    configurable = {"thread_id": "t1", "big": 2**64, "odd": "a\ud800", "kept": 7}
    sink = InMemorySink()
    async with stream_rounds(Publisher(sink), message_id="m", stream_id="s", model="m") as rounds:
        out = await stream_run(
            rounds, stream(), config={"configurable": configurable}, states=states
        )
    assert check(sink.events) == []
    [asked] = out.asked
    saved = json.loads(await states.load(asked) or b"null")
    assert saved["configurable"] == {"thread_id": "t1", "kept": 7}


@pytest.mark.parametrize("subgraphs", [False, True])
async def test_a_subgraph_s_interrupt_is_asked_once(subgraphs: bool) -> None:
    # With subgraphs=True LangGraph reports a subgraph's interrupt under the subgraph's
    # updates and again under its parent's, the same Interrupt: one question.
    def ask(state: MessagesState) -> dict[str, Any]:
        value = interrupt("Continue?")
        return {"messages": [AIMessage(f"sub got {value}", id="sg")]}

    inner = StateGraph(MessagesState)
    inner.add_node("ask", ask)
    inner.add_edge(START, "ask")
    outer = StateGraph(MessagesState)
    outer.add_node("sub", inner.compile())
    outer.add_edge(START, "sub")
    graph = outer.compile(checkpointer=InMemorySaver())
    events, run, error = await run_to_sink(graph, thread=f"sub-{subgraphs}", subgraphs=subgraphs)
    assert error is None
    assert run is not None
    assert check(events) == []
    starts = [
        json.loads(e.data)["content_block"] for e in events if e.event == "content_block_start"
    ]
    assert [s["question"] for s in starts if s["type"] == "question"] == ["Continue?"]
    assert len(run.interrupts) == 1


async def test_an_answer_to_an_interrupt_another_run_replaced_ends_with_an_error() -> None:
    # Two turns on one thread: the second's interrupt replaces the first's. An answer to
    # the first's would be ignored by LangGraph (no such interrupt pending), and lost.
    def ask(state: MessagesState) -> dict[str, Any]:
        value = interrupt("Continue?")
        return {"messages": [AIMessage(f"got {value}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    graph = builder.compile(checkpointer=InMemorySaver())
    turns = AgentTurns(graph, thread_id=lambda request: "shared")
    async with StreamHub(on_answer=turns.on_answer) as hub:
        for stream_id in ("s1", "s2"):
            await hub.start(stream_id, turns(chat(stream_id, "go")))
            await hub.wait(stream_id)
        first, second = await hub.waiting("s1"), await hub.waiting("s2")
        assert first is not None
        assert second is not None
        await hub.answer("s2", [QuestionAnswer(second.requests[0].id, "from s2")])
        await hub.wait("s2")
        await hub.answer("s1", [QuestionAnswer(first.requests[0].id, "from s1")])
        await hub.wait("s1")
        events, _ = await hub.store.since("s1", None)
    assert check(events) == []
    parsed = reassemble_events(events)
    assert parsed.error is not None
    assert "LookupError" in parsed.error.message


async def test_a_removed_message_is_named_in_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    # The protocol cannot take back what went out: a RemoveMessage is said, not carried.
    from langchain_core.messages import RemoveMessage

    def draft(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage("Draft.", id="draft1")]}

    def prune(state: MessagesState) -> dict[str, Any]:
        return {"messages": [RemoveMessage(id="draft1")]}

    builder = StateGraph(MessagesState)
    builder.add_node("draft", draft)
    builder.add_node("prune", prune)
    builder.add_edge(START, "draft")
    builder.add_edge("draft", "prune")
    with caplog.at_level(logging.INFO, logger="essessey.adapters.langgraph"):
        events, _, error = await run_to_sink(builder.compile(), thread="remove")
    assert error is None
    assert check(events) == []
    assert "RemoveMessage" in caplog.text
