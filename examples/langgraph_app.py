"""A LangGraph agent served to every client through the hub, its ``interrupt()`` included.

Run it with ``python examples/langgraph_app.py [--host 127.0.0.1] [--port 8000]`` (it needs
``essessey[server,langgraph]`` and FastAPI). One graph, five ways in: ``useChat``
(``POST /api/chat``, resumable), AG-UI (``POST /agui``), OpenAI Chat Completions and
Responses (``/v1/chat/completions``, ``/v1/responses``) and the protocol's own SSE
(``/streams/{id}``, its resume and ``POST /streams/{id}/answer``).

The graph is LangGraph's ReAct loop: a model node, ``ToolNode`` and ``tools_condition``.
The model drafts a mail to the address in the message and calls ``send_email``, a tool
that asks before it sends (``request_approval``, an ``interrupt()`` naming its call): the
run stops, and the turn asks the client to approve the call (Approve / Deny in
``useChat``, an ``mcp_approval_request`` in Responses, an interrupt in AG-UI). The answer,
through any of them, resumes the graph's thread with ``Command(resume=...)``: the tool
sends the mail (or not) and the model says so.

The model is scripted so the app runs offline: :class:`OfflineModel` is a langchain-core
chat model that streams its chunks (text, then a tool call's arguments) as a provider's
integration does; put ``init_chat_model("openai:gpt-5")`` in its place and nothing else
changes. The thread's state is the checkpointer's (``InMemorySaver`` here): for replicas,
give every replica a checkpointer they share (``langgraph-checkpoint-postgres``,
``langgraph-checkpoint-redis``), and the hub and the run states one store:
``store = RedisEventStore(...)``, ``turns = AgentTurns(graph, states=RunStates(store))``,
``StreamHub(store, ...)``.
"""

from __future__ import annotations

import argparse
import json
import re
import secrets
from collections.abc import AsyncIterator, Sequence
from typing import Annotated, Any

from fastapi import FastAPI
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from essessey import StreamHub
from essessey.adapters.langgraph import AgentTurns, request_approval
from essessey.dialects import dialect_routes

OUTBOX: list[str] = []
"""The addresses this app has mailed (its tool's effect, for the tests to see)."""

_ADDRESS = re.compile(r"[\w.+-]+@[\w-]+\.[\w.]+")


@tool
def send_email(to: str, subject: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> str:
    """Send an email (the user approves it first)."""
    if not request_approval(tool_call_id, reason="sends an email on your behalf").approved:
        return "not sent: the user said no"
    OUTBOX.append(to)
    return f"sent to {to}"


class OfflineModel(BaseChatModel):
    """A scripted chat model: a new message makes it call ``send_email``; the tool's
    result makes it say what happened. Its chunks stream as a provider's would."""

    def reply(self, messages: list[BaseMessage]) -> list[AIMessageChunk]:
        last = messages[-1]
        if isinstance(last, ToolMessage):
            text = "Sent." if str(last.content).startswith("sent to") else "I did not send it."
            return [AIMessageChunk(content=text)]
        found = _ADDRESS.search(str(last.content))
        to = found.group(0) if found else "team@example.com"
        arguments = json.dumps({"to": to, "subject": "Hello"})
        call = {"index": 0, "id": "call_" + secrets.token_hex(8), "name": "send_email"}
        return [
            AIMessageChunk(content="I drafted a mail "),
            AIMessageChunk(content=f"to {to}."),
            AIMessageChunk(content="", tool_call_chunks=[{**call, "args": arguments[:10]}]),
            AIMessageChunk(content="", tool_call_chunks=[{"index": 0, "args": arguments[10:]}]),
        ]

    @property
    def _llm_type(self) -> str:
        return "offline"

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        whole = AIMessageChunk(content="")
        for chunk in self.reply(messages):
            whole += chunk
        message = AIMessage(content=whole.content, tool_calls=whole.tool_calls)
        return ChatResult(generations=[ChatGeneration(message=message)])

    async def _astream(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> AsyncIterator[ChatGenerationChunk]:
        run_manager = kwargs.get("run_manager")
        for chunk in self.reply(messages):
            generation = ChatGenerationChunk(message=chunk)
            if run_manager is not None:
                await run_manager.on_llm_new_token(chunk.text, chunk=generation)
            yield generation

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> OfflineModel:  # type: ignore[override]
        return self


model = OfflineModel().bind_tools([send_email])


async def agent(state: MessagesState) -> dict[str, Any]:
    """The model node."""
    return {"messages": [await model.ainvoke(state["messages"])]}


builder = StateGraph(MessagesState)
builder.add_node("agent", agent)
builder.add_node("tools", ToolNode([send_email]))
builder.add_edge(START, "agent")
builder.add_conditional_edges("agent", tools_condition)
builder.add_edge("tools", "agent")
graph = builder.compile(checkpointer=InMemorySaver())

turns = AgentTurns(graph)
hub = StreamHub(on_answer=turns.on_answer)
app = FastAPI(lifespan=hub.lifespan)
app.router.routes.extend(dialect_routes(hub, turns))


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    uvicorn.run(app, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
