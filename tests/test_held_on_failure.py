"""What an adapter holds behind a tool call whose arguments are not whole yet (text the
model streamed after the call began) goes out when the run fails or the turn is
cancelled, before the failure ends the message: nothing the model sent is lost with it
(docs/adapters.md, "Held tool-call fragments")."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest

from essessey import (
    Event,
    InMemorySink,
    Publisher,
    StreamHub,
    TurnProducer,
    check,
    reassemble_events,
)
from essessey.adapters import openai as chat_adapter
from essessey.adapters import openai_responses as responses_adapter
from essessey.adapters import stream_rounds

pytestmark = pytest.mark.anyio

HELD = "Held text."


class Boom(Exception):
    """The model's failure in the middle of its stream."""


def _held_text(events: list[Event]) -> str:
    assert check(events) == []
    return reassemble_events(events).text


async def _cancelled(producer: TurnProducer, started: anyio.Event) -> list[Event]:
    """The turn through a hub, cancelled once the model streamed everything it will."""
    async with StreamHub() as hub:
        await hub.start("s", producer)
        with anyio.fail_after(10):
            await started.wait()
        await anyio.sleep(0.05)  # the adapter reads what the model sent
        await hub.cancel("s")
        with anyio.fail_after(10):
            await hub.wait("s")
        events, _ = await hub.store.since("s", None)
    assert reassemble_events(events).stop_reason == "cancelled"
    return events


# -- the provider adapters ----------------------------------------------------------------------


def _chat_chunks(started: anyio.Event, fail: bool) -> AsyncIterator[dict[str, Any]]:
    def chunk(delta: dict[str, Any]) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": None}
        return {"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [choice]}

    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "t"}}

    async def chunks() -> AsyncIterator[dict[str, Any]]:
        yield chunk({"tool_calls": [{**call, "function": {"name": "t", "arguments": '{"s": "a'}}]})
        yield chunk({"content": HELD})
        if fail:
            raise Boom
        started.set()
        await anyio.sleep_forever()

    return chunks()


def _responses_events(started: anyio.Event, fail: bool) -> AsyncIterator[dict[str, Any]]:
    call = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "t"}
    message = {"type": "message", "id": "msg_1", "role": "assistant", "content": []}
    script: list[dict[str, Any]] = [
        {"type": "response.created", "response": {"id": "r", "model": "m", "output": []}},
        {"type": "response.output_item.added", "output_index": 0, "item": call},
        {
            "type": "response.function_call_arguments.delta",
            "item_id": "fc_1",
            "output_index": 0,
            "delta": '{"s": "a',
        },
        {"type": "response.output_item.added", "output_index": 1, "item": message},
        {
            "type": "response.output_text.delta",
            "item_id": "msg_1",
            "output_index": 1,
            "content_index": 0,
            "delta": HELD,
        },
    ]

    async def events() -> AsyncIterator[dict[str, Any]]:
        for event in script:
            yield event
        if fail:
            raise Boom
        started.set()
        await anyio.sleep_forever()

    return events()


_PROVIDERS: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "chat": (_chat_chunks, chat_adapter.stream_round),
    "responses": (_responses_events, responses_adapter.stream_round),
}


def _provider_turn(name: str, started: anyio.Event, *, fail: bool) -> TurnProducer:
    source, stream_round = _PROVIDERS[name]

    async def produce(publisher: Publisher) -> None:
        async with stream_rounds(publisher, message_id="m1", stream_id="s", model="m") as rounds:
            await rounds.round_start()
            await stream_round(rounds, source(started, fail))

    return produce


@pytest.mark.parametrize("provider", sorted(_PROVIDERS))
async def test_a_provider_stream_that_raises_publishes_what_it_held_first(provider: str) -> None:
    sink = InMemorySink()
    with pytest.raises(Boom):
        await _provider_turn(provider, anyio.Event(), fail=True)(Publisher(sink))
    assert _held_text(sink.events) == HELD
    assert sink.events[-1].event == "error"


@pytest.mark.parametrize("provider", sorted(_PROVIDERS))
async def test_a_cancelled_provider_turn_publishes_what_it_held_first(provider: str) -> None:
    started = anyio.Event()
    events = await _cancelled(_provider_turn(provider, started, fail=False), started)
    assert _held_text(events) == HELD


# -- Pydantic AI ------------------------------------------------------------------------------


def _pydantic_agent(started: anyio.Event, *, fail: bool) -> Any:
    from pydantic_ai import Agent
    from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel

    async def stream(messages: list[Any], info: AgentInfo) -> AsyncIterator[Any]:
        yield {0: DeltaToolCall(name="t", json_args='{"s": "a', tool_call_id="c1")}
        yield HELD
        if fail:
            raise Boom
        started.set()
        await anyio.sleep_forever()

    agent = Agent(FunctionModel(stream_function=stream, model_name="fm"))

    @agent.tool_plain
    def t(s: str) -> str:
        return s

    return agent


async def test_a_pydantic_ai_run_that_fails_publishes_what_it_held_first() -> None:
    from essessey.adapters.pydantic_ai import publish_run

    agent = _pydantic_agent(anyio.Event(), fail=True)
    sink = InMemorySink()
    with pytest.raises(Boom):
        async with agent.run_stream_events("go") as events:
            await publish_run(Publisher(sink), events, message_id="m", stream_id="s", model="fm")
    assert _held_text(sink.events) == HELD


async def test_a_cancelled_pydantic_ai_turn_publishes_what_it_held_first() -> None:
    from essessey.adapters.pydantic_ai import AgentTurns
    from essessey.dialects.chat_completions import ChatCompletionRequest

    started = anyio.Event()
    turns = AgentTurns(_pydantic_agent(started, fail=False))
    request = ChatCompletionRequest(id="s", model="m", messages=[{"role": "user", "content": "go"}])
    assert _held_text(await _cancelled(turns(request), started)) == HELD


# -- LangGraph --------------------------------------------------------------------------------


def _graph(started: anyio.Event, *, fail: bool) -> Any:
    from langchain_core.language_models import BaseChatModel
    from langchain_core.language_models.chat_models import agenerate_from_stream
    from langchain_core.messages import AIMessageChunk
    from langchain_core.outputs import ChatGenerationChunk, ChatResult
    from langgraph.graph import END, START, MessagesState, StateGraph

    class Scripted(BaseChatModel):
        @property
        def _llm_type(self) -> str:
            return "scripted"

        def _generate(self, *args: Any, **kwargs: Any) -> ChatResult:
            raise NotImplementedError

        async def _agenerate(
            self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any
        ) -> ChatResult:
            return await agenerate_from_stream(self._astream(messages, stop, run_manager))

        async def _astream(
            self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any
        ) -> AsyncIterator[ChatGenerationChunk]:
            call = {"index": 0, "id": "c1", "name": "t", "args": '{"s": "a'}
            for message in (
                AIMessageChunk(content="", tool_call_chunks=[call]),  # type: ignore[list-item]
                AIMessageChunk(content=HELD),
            ):
                chunk = ChatGenerationChunk(message=message)
                if run_manager is not None:
                    await run_manager.on_llm_new_token(message.text, chunk=chunk)
                yield chunk
            if fail:
                raise Boom
            started.set()
            await anyio.sleep_forever()

    model = Scripted()

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_edge(START, "agent")
    builder.add_edge("agent", END)
    return builder.compile()


async def test_a_langgraph_run_that_fails_publishes_what_it_held_first() -> None:
    from langchain_core.messages import HumanMessage

    from essessey.adapters.langgraph import publish_run

    sink = InMemorySink()
    with pytest.raises(Boom):
        await publish_run(
            Publisher(sink),
            _graph(anyio.Event(), fail=True),
            {"messages": [HumanMessage("go")]},
            message_id="m",
            stream_id="s",
        )
    assert _held_text(sink.events) == HELD


async def test_a_cancelled_langgraph_turn_publishes_what_it_held_first() -> None:
    from langchain_core.messages import HumanMessage

    from essessey.adapters.langgraph import publish_run

    started = anyio.Event()
    graph = _graph(started, fail=False)

    async def produce(publisher: Publisher) -> None:
        await publish_run(
            publisher, graph, {"messages": [HumanMessage("go")]}, message_id="m", stream_id="s"
        )

    assert _held_text(await _cancelled(produce, started)) == HELD
