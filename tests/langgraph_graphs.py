"""LangGraph graphs for the adapter's tests, on a chat model of langchain-core's that
streams what a script says: text, reasoning blocks, tool call chunks, usage.

:class:`ScriptedChatModel` is a ``BaseChatModel`` (the class every LangChain chat model
is): ``respond(messages)`` gives the chunks of each call, ``bind_tools`` keeps them, and
``_astream`` streams them, so LangGraph's ``messages`` mode sees the chunks a provider's
integration would give it. No network, no keys.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Annotated, Any

import anyio
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import ToolCallWithContext
from langgraph.types import Send, interrupt

from essessey.adapters.langgraph import request_approval

MODEL = "scripted-1"
Respond = Callable[[list[BaseMessage]], list[AIMessageChunk]]


class ScriptedChatModel(BaseChatModel):
    """A chat model whose every call streams ``respond(messages)``'s chunks, one at a
    time (``delay`` seconds apart, each shown to ``on_chunk`` as it goes)."""

    respond: Respond
    delay: float = 0.0
    on_chunk: Callable[[AIMessageChunk], None] | None = None

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        whole = AIMessageChunk(content="")
        for chunk in self.respond(messages):
            whole = whole + chunk
        message = AIMessage(
            content=whole.content,
            tool_calls=whole.tool_calls,
            response_metadata=whole.response_metadata,
            usage_metadata=whole.usage_metadata,
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        for chunk in self.respond(messages):
            if self.delay:
                await anyio.sleep(self.delay)
            if self.on_chunk is not None:
                self.on_chunk(chunk)
            generation = ChatGenerationChunk(message=chunk)
            if run_manager is not None:
                await run_manager.on_llm_new_token(chunk.text, chunk=generation)
            yield generation

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:  # type: ignore[override]
        return self


# -- chunks ------------------------------------------------------------------------------


def words(text: str) -> Iterator[AIMessageChunk]:
    """``text`` as one chunk per word (the spaces kept)."""
    parts = text.split(" ")
    for n, part in enumerate(parts):
        yield AIMessageChunk(content=part + (" " if n < len(parts) - 1 else ""))


def thinking(text: str, signature: str = "sig") -> list[AIMessageChunk]:
    """Reasoning as Anthropic's integration streams it: thinking blocks, then the
    signature, read through ``content_blocks`` with ``model_provider="anthropic"``."""
    meta = {"model_provider": "anthropic"}
    return [
        AIMessageChunk(
            content=[{"type": "thinking", "thinking": str(part.content), "index": 0}],
            response_metadata=meta,
        )
        for part in words(text)
    ] + [
        AIMessageChunk(
            content=[{"type": "thinking", "thinking": "", "signature": signature, "index": 0}],
            response_metadata=meta,
        )
    ]


def calls(*specs: tuple[str, str, dict[str, Any]], split: int = 2) -> list[AIMessageChunk]:
    """Tool calls as tool call chunks by index: (id, name, args) each, the arguments'
    JSON in ``split`` fragments; the first fragment carries the id and name."""
    chunks = []
    for index, (call_id, name, args) in enumerate(specs):
        text = json.dumps(args)
        size = max(1, -(-len(text) // split))
        pieces = [text[i : i + size] for i in range(0, len(text), size)] or [""]
        for n, piece in enumerate(pieces):
            chunks.append(
                AIMessageChunk(
                    content="",
                    tool_call_chunks=[
                        {
                            "index": index,
                            "id": call_id if n == 0 else None,
                            "name": name if n == 0 else None,
                            "args": piece,
                        }
                    ],
                )
            )
    return chunks


def finish(
    reason: str = "stop", *, input_tokens: int = 10, output_tokens: int = 5
) -> AIMessageChunk:
    """The last chunk of a call: its finish reason, model name and usage."""
    return AIMessageChunk(
        content="",
        response_metadata={"finish_reason": reason, "model_name": MODEL},
        usage_metadata={
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
        },
    )


# What langchain-anthropic's ChatAnthropic streams (its default output version, tools
# bound): Anthropic's content blocks with their index, read through content_blocks.
ANTHROPIC: dict[str, Any] = {"model_provider": "anthropic"}


def anthropic(*blocks: dict[str, Any]) -> AIMessageChunk:
    """A ChatAnthropic chunk holding ``blocks`` (each with its ``index``)."""
    return AIMessageChunk(content=list(blocks), response_metadata=dict(ANTHROPIC))


def anthropic_text(index: int, text: str) -> list[AIMessageChunk]:
    """A text block, one chunk per word."""
    return [
        anthropic({"type": "text", "text": str(part.content), "index": index})
        for part in words(text)
    ]


def anthropic_use(
    index: int,
    call_id: str,
    name: str,
    arguments: str,
    *,
    server: bool = False,
    caller: dict[str, Any] | None = None,
) -> list[AIMessageChunk]:
    """A tool_use block (``server``: a server_tool_use block) as ChatAnthropic streams it:
    its start with an empty input (and the ``caller`` of a programmatic call), then its
    input JSON in two pieces. A client call's chunks carry the tool call chunks too; a
    server call's only its blocks, which langchain-core reads as
    ``server_tool_call_chunk`` s."""
    start: dict[str, Any] = {
        "id": call_id,
        "input": {},
        "name": name,
        "type": "server_tool_use" if server else "tool_use",
        "index": index,
    }
    if caller is not None:
        start["caller"] = caller
    half = len(arguments) // 2
    chunks = [
        AIMessageChunk(
            content=[start],
            tool_call_chunks=[]
            if server
            else [{"id": call_id, "name": name, "args": "", "index": index}],
            response_metadata=dict(ANTHROPIC),
        )
    ]
    for piece in ("", arguments[:half], arguments[half:]):
        delta = {"partial_json": piece, "type": "input_json_delta", "index": index}
        chunks.append(
            AIMessageChunk(
                content=[delta],
                tool_call_chunks=[]
                if server
                else [{"id": None, "name": None, "args": piece, "index": index}],
                response_metadata=dict(ANTHROPIC),
            )
        )
    return chunks


def anthropic_end(stop_reason: str, *, output_tokens: int = 5, **metadata: Any) -> AIMessageChunk:
    """ChatAnthropic's chunk of a ``message_delta``: the stop reason (and ``metadata``:
    ``stop_sequence``, ``stop_details``) and usage, at ``chunk_position="last"`` (it marks
    every message_delta with a stop reason so)."""
    return AIMessageChunk(
        content=[],
        response_metadata={"stop_reason": stop_reason, "stop_sequence": None, **metadata}
        | ANTHROPIC,
        usage_metadata={
            "input_tokens": 10,
            "output_tokens": output_tokens,
            "total_tokens": 10 + output_tokens,
        },
        chunk_position="last",
    )


def after_tools(messages: list[BaseMessage]) -> list[ToolMessage]:
    """The tool messages since the last AI message."""
    found: list[ToolMessage] = []
    for message in reversed(messages):
        if not isinstance(message, ToolMessage):
            break
        found.append(message)
    return list(reversed(found))


# -- tools ------------------------------------------------------------------------------


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool
def weather(city: str) -> dict[str, Any]:
    """The weather in a city."""
    return {"city": city, "sky": "clear"}


@tool
def explode(reason: str) -> str:
    """A tool that fails."""
    raise ValueError("the tool failed: " + reason)


SENT: list[dict[str, Any]] = []


@tool
def send_email(to: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> str:
    """Send an email, once a person approved it."""
    decision = request_approval(tool_call_id, reason="sends an email")
    if not decision.approved:
        return f"not sent: {decision.reason or 'denied'}"
    SENT.append({"to": to})
    return f"sent to {to}"


TOOLS = [add, weather, explode, send_email]


# -- graphs ------------------------------------------------------------------------------


def react_graph(
    respond: Respond,
    *,
    checkpointer: Any = None,
    delay: float = 0.0,
    on_chunk: Callable[[AIMessageChunk], None] | None = None,
    tools: Sequence[Any] = TOOLS,
    ask_node: bool = False,
    send: bool = False,
) -> Any:
    """A ReAct graph: ``agent`` (the model) and ``tools`` (``ToolNode``, errors as error
    messages) in a loop, routed by ``tools_condition`` (one ``tools`` task runs all the
    round's calls) or, with ``send``, one ``Send`` per call (as ``create_react_agent``
    does: a call that interrupts leaves the others' results kept). ``ask_node``: after the
    answer, ``confirm`` asks a question with ``interrupt()`` and writes what it got as an
    AI message."""
    model = ScriptedChatModel(respond=respond, delay=delay, on_chunk=on_chunk).bind_tools(
        list(tools)
    )

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    def confirm(state: MessagesState) -> dict[str, Any]:
        answer = interrupt({"question": "Is that right?", "schema": {"enum": ["yes", "no"]}})
        return {"messages": [AIMessage(f"You said {answer}.")]}

    def route(state: MessagesState) -> Any:
        last = state["messages"][-1]
        if not (isinstance(last, AIMessage) and last.tool_calls):
            return "confirm" if ask_node else END
        if not send:
            return "tools"
        return [
            Send(
                "tools",
                ToolCallWithContext(__type="tool_call_with_context", tool_call=call, state=state),
            )
            for call in last.tool_calls
        ]

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode(list(tools), handle_tool_errors=True))
    builder.add_edge(START, "agent")
    if ask_node:
        builder.add_node("confirm", confirm)
        builder.add_edge("confirm", END)
    builder.add_conditional_edges("agent", route, ["tools", "confirm" if ask_node else END])
    builder.add_edge("tools", "agent")
    return builder.compile(
        checkpointer=checkpointer if checkpointer is not None else InMemorySaver()
    )


def model_graph(respond: Respond) -> Any:
    """One node, ``agent``, that calls the model once: calls it makes are left to the
    client."""
    model = ScriptedChatModel(respond=respond).bind_tools(TOOLS)

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_edge(START, "agent")
    builder.add_edge("agent", END)
    return builder.compile(checkpointer=InMemorySaver())


def reply(text: str) -> list[AIMessageChunk]:
    """A call that answers ``text``, word by word."""
    return [*words(text), finish()]


def two_rounds(messages: list[BaseMessage]) -> list[AIMessageChunk]:
    """Reasoning and two parallel calls (``add`` and ``weather``), then an answer that
    uses their results."""
    results = after_tools(messages)
    if not results:
        return [
            *thinking("I need both tools"),
            AIMessageChunk(
                content=[{"type": "text", "text": "Let me check. ", "index": 1}],
                response_metadata={"model_provider": "anthropic"},
            ),
            *calls(("call_add", "add", {"a": 2, "b": 3}), ("call_w", "weather", {"city": "Oslo"})),
            finish("tool_calls"),
        ]
    return reply(f"The sum is {results[0].text} and the sky is clear.")


def gated_tools(gated: Sequence[bool], ran: list[str]) -> list[Any]:
    """Tools ``f0``, ``f1``, ... taking ``q``; ``f<k>`` asks for approval first when
    ``gated[k]`` (a denial is its result). ``ran`` gets each tool that ran to its end."""

    def make(k: int) -> Any:
        def run(q: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> str:
            if gated[k]:
                decision = request_approval(tool_call_id)
                if not decision.approved:
                    return f"f{k} denied"
            ran.append(f"f{k}")
            return f"f{k} ran"

        return tool(f"f{k}", description=f"Tool {k}.")(run)

    return [make(k) for k in range(len(gated))]


def interleaved(sequence: Sequence[tuple[int, str, bool]]) -> list[AIMessageChunk]:
    """Parallel calls whose fragments arrive in ``sequence``'s order (``(k, fragment,
    first)``: call ``k`` is ``call_k`` of tool ``f<k>``), then the end of the call."""
    chunks = [
        AIMessageChunk(
            content="",
            tool_call_chunks=[
                {
                    "type": "tool_call_chunk",
                    "index": k,
                    "id": f"call_{k}" if first else None,
                    "name": f"f{k}" if first else None,
                    "args": fragment,
                }
            ],
        )
        for k, fragment, first in sequence
    ]
    return [*chunks, finish("tool_calls")]
