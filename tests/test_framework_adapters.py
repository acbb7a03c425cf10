"""The three framework adapters have one shape: the same names, the same AgentTurns
contract (a turn factory for every dialect, ``states``, ``on_answer``), so nothing is
learnt twice; and Pydantic AI's publish_run, the whole-message entry point."""

from __future__ import annotations

import importlib
import inspect

import pytest
from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel

import essessey
from essessey import InMemorySink, Publisher
from essessey.adapters import RunStates
from essessey.adapters.pydantic_ai import publish_run
from tests.pydantic_ai_agents import mail_agent

MODULES = [
    "essessey.adapters.pydantic_ai",
    "essessey.adapters.openai_agents",
    "essessey.adapters.langgraph",
]
SHARED = {"AgentTurns", "PublishedRun", "publish_run", "stream_run"}


@pytest.mark.parametrize("name", MODULES)
def test_every_framework_adapter_has_the_same_entry_points(name: str) -> None:
    module = importlib.import_module(name)
    assert set(module.__all__) >= SHARED
    for shared in SHARED:
        assert getattr(module, shared).__module__ == name, shared
    turns = module.AgentTurns
    first, *_ = inspect.signature(turns).parameters.values()
    options = inspect.signature(turns).parameters
    assert first.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD  # the agent, or the graph
    assert options["states"].kind is inspect.Parameter.KEYWORD_ONLY
    assert options["states"].default is None
    assert inspect.iscoroutinefunction(turns.on_answer)
    assert list(inspect.signature(turns.on_answer).parameters) == [
        "self",
        "publisher",
        "answered",
    ]
    assert callable(turns.__call__)
    for shared in ("stream_run", "publish_run"):
        assert inspect.iscoroutinefunction(getattr(module, shared)), shared


@pytest.mark.anyio
async def test_pydantic_ai_publish_run_writes_one_whole_message() -> None:
    agent = Agent(TestModel(custom_output_text="Hello there"))
    sink = InMemorySink()
    async with agent.run_stream_events("hi") as events:
        published = await publish_run(
            Publisher(sink), events, message_id="msg_1", stream_id="s1", model="test"
        )
    assert essessey.check(sink.events) == []
    parsed = essessey.reassemble_events(sink.events)
    assert parsed.text == published.output == "Hello there"
    assert parsed.stop_reason == "end_turn"


@pytest.mark.anyio
async def test_pydantic_ai_publish_run_keeps_a_run_that_asks() -> None:
    states = RunStates()
    sink = InMemorySink()
    async with mail_agent().run_stream_events("mail ada") as events:
        published = await publish_run(
            Publisher(sink),
            events,
            message_id="msg_1",
            stream_id="s1",
            model="test",
            states=states,
        )
    assert essessey.check(sink.events) == []
    assert essessey.reassemble_events(sink.events).stop_reason == "tool_use"
    assert published.asked
    assert await states.load(published.asked[0]) is not None
