"""A compiled LangGraph graph served to every dialect through a hub: :class:`AgentTurns`."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any, cast

import orjson
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.types import Command

from essessey._ids import new_message_id
from essessey.adapters._run_state import RunStates
from essessey.adapters.langgraph._run import Graph, graph_stream, publish_run, stream_run
from essessey.adapters.rounds import continue_rounds
from essessey.dialects import DialectRequest, conversation, user_text
from essessey.dialects.agui import AGUIRunRequest
from essessey.hub import TurnProducer
from essessey.protocol.asking import Answered
from essessey.publisher import Publisher

__all__ = ["AgentTurns", "graph_input"]


def _as_message(role: str, text: str) -> AnyMessage:
    if role == "system":
        return SystemMessage(text)
    if role == "assistant":
        return AIMessage(text)
    return HumanMessage(text)


def graph_input(request: DialectRequest, *, new_thread: bool = True) -> dict[str, Any]:
    """A run's input from any dialect's request, for a graph whose state has a
    ``messages`` key (``MessagesState``, ``create_react_agent``): every message's text
    (:func:`essessey.dialects.conversation`) as LangChain messages when ``new_thread``,
    else only what the user said last (the checkpointer's thread has the rest)."""
    if new_thread:
        messages = [_as_message(m.role, m.text) for m in conversation(request)]
    else:
        messages = [HumanMessage(user_text(request))]
    return {"messages": messages}


def _thread_id(request: DialectRequest) -> str:
    # AG-UI names its thread; the other dialects' request id names the conversation
    # (useChat's chat id) or the request itself (OpenAI's completions and responses).
    return request.thread_id if isinstance(request, AGUIRunRequest) else request.id


class AgentTurns:
    """A compiled LangGraph graph served to every dialect through a hub, interrupts
    included.

    ``turns = AgentTurns(graph)`` is the turn factory of
    :func:`essessey.dialects.dialect_routes` and ``turns.on_answer`` the hub's
    continuation (``StreamHub(on_answer=turns.on_answer)``). Each request runs the graph on
    the thread ``thread_id(request)`` names (default: AG-UI's ``threadId``, else the
    request's id: ``useChat``'s chat id) with ``config`` (its ``configurable`` gets the
    ``thread_id``). The input is ``input(request, new_thread)`` (default
    :func:`graph_input`): a thread the checkpointer already has gets the user's last
    message, a new one (or a graph without a checkpointer) the whole conversation.

    A run that stops at ``interrupt()`` (or leaves calls to the client) keeps only the
    thread's config and the interrupt ids in ``states``; the graph's state is its
    checkpointer's, so replicas need a checkpointer they share. The answer resumes the
    thread with ``Command(resume={interrupt id: value})`` (an approval's value is
    ``{"approved": bool, "reason": str | None}``, what :func:`request_approval` reads) and
    a client's tool outputs as ``ToolMessage`` s. ``model`` is the name ``message_start``
    carries (default: the graph's name); ``nodes`` as in :func:`stream_run`; ``options``
    go to every ``astream`` (``context``, ``subgraphs``, ``durability``).
    """

    def __init__(
        self,
        graph: Graph,
        *,
        states: RunStates | None = None,
        config: RunnableConfig | None = None,
        model: str | None = None,
        thread_id: Callable[[DialectRequest], str] | None = None,
        input: Callable[[DialectRequest, bool], Any] | None = None,
        nodes: Collection[str] | None = None,
        **options: Any,
    ) -> None:
        self.graph = graph
        self.states = states if states is not None else RunStates()
        self.config: RunnableConfig = config if config is not None else {}
        self.model = model or graph.name
        self.thread_id = thread_id if thread_id is not None else _thread_id
        self.input = input if input is not None else _default_input
        self.nodes = nodes
        self.options = options

    def config_for(self, configurable: Mapping[str, Any]) -> RunnableConfig:
        """``config`` with ``configurable`` added to its own (the thread's id, ...)."""
        config = cast(RunnableConfig, dict(self.config))
        config["configurable"] = {**(self.config.get("configurable") or {}), **configurable}
        return config

    async def _new_thread(self, config: RunnableConfig) -> bool:
        checkpointer = self.graph.checkpointer
        if not isinstance(checkpointer, BaseCheckpointSaver):
            return True
        snapshot = await self.graph.aget_state(config)
        return not snapshot.values

    def __call__(self, request: DialectRequest) -> TurnProducer:
        """The producer of the graph's turn for ``request`` (served on ``request.id``)."""
        config = self.config_for({"thread_id": self.thread_id(request)})
        stream_id = request.id

        async def produce(publisher: Publisher) -> None:
            run_input = self.input(request, await self._new_thread(config))
            await publish_run(
                publisher,
                self.graph,
                run_input,
                config,
                message_id=new_message_id(),
                stream_id=stream_id,
                model=self.model,
                states=self.states,
                nodes=self.nodes,
                **self.options,
            )

        return produce

    async def on_answer(self, publisher: Publisher, answered: Answered) -> None:
        """The hub's continuation: resume the thread that asked with the answers."""
        async with continue_rounds(publisher, answered) as rounds:
            saved = await self.states.load_answered(answered)
            state = orjson.loads(saved)
            config = self.config_for(state["configurable"])
            interrupts: Mapping[str, str] = state["interrupts"]
            resume: dict[str, Any] = {}
            for request, approval in answered.approvals():
                resume[_interrupt(interrupts, request.id)] = {
                    "approved": approval.approved,
                    "reason": approval.reason,
                }
            for question, answer in answered.questions():
                resume[_interrupt(interrupts, question.id)] = answer.value
            outputs: list[BaseMessage] = [
                ToolMessage(
                    output.text,
                    tool_call_id=call.id,
                    name=call.name,
                    status="error" if output.is_error else "success",
                )
                for call, output in answered.tool_outputs()
            ]
            if resume:
                # Another run of the same thread may have replaced the interrupts asked:
                # LangGraph ignores a resume of an id no longer pending, and the answer
                # would be lost without a word.
                snapshot = await self.graph.aget_state(config)
                pending = {item.id for item in snapshot.interrupts}
                for task in snapshot.tasks:
                    pending.update(item.id for item in task.interrupts)
                if not pending & resume.keys():
                    raise LookupError(
                        "the interrupts answered are no longer pending on their thread"
                    )
            # With interrupts pending, the graph is paused in a node and runs the round's
            # other calls itself when it resumes; without, they were the client's to run.
            run_input: Any = Command(resume=resume) if resume else {"messages": outputs}
            await stream_run(
                rounds,
                graph_stream(self.graph, run_input, config, **self.options),
                config=config,
                states=self.states,
                answered=answered,
                nodes=self.nodes,
            )
            await self.states.drop(RunStates.key_of(answered))


def _interrupt(interrupts: Mapping[str, str], request_id: str) -> str:
    found = interrupts.get(request_id)
    if found is None:
        raise LookupError("an answered request is not one the graph's run waits for")
    return found


def _default_input(request: DialectRequest, new_thread: bool) -> dict[str, Any]:
    return graph_input(request, new_thread=new_thread)
