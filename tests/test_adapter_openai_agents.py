"""The OpenAI Agents SDK adapter (essessey.adapters.openai_agents), offline: an Agents SDK
``Model`` of the tests' own streams scripted Responses events (tests/openai_agents_models.py).

Every published turn passes the checker, and ``reassemble`` gives back what the SDK's own
result says (final output, the calls with their arguments and the outputs it ran). Through
a hub: approvals answered in process on another replica (two hubs, one store), over HTTP by
the protocol's answer route and by the openai SDK (the Responses dialect), the turn read by
the openai SDK's Responses and Chat Completions clients, a drop and resume in the middle of
the run, an error and a cancel."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
import pytest
from agents import (
    Agent,
    FunctionTool,
    HostedMCPTool,
    RunConfig,
    Runner,
    ShellTool,
    WebSearchTool,
    function_tool,
    set_tracing_disabled,
)
from agents.exceptions import ModelBehaviorError
from agents.items import ToolCallItem, ToolCallOutputItem
from agents.result import RunResultBase
from agents.stream_events import (
    AgentUpdatedStreamEvent,
    RawResponsesStreamEvent,
    RunItemStreamEvent,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette

from essessey import (
    Event,
    InMemoryEventStore,
    InMemorySink,
    Publisher,
    StreamHub,
    ToolApproval,
    check,
    reassemble_events,
)
from essessey.adapters import RunStates
from essessey.adapters.openai_agents import AgentTurns, PublishedRun, agent_input, publish_run
from essessey.dialects import dialect_routes
from essessey.dialects.ui import ChatRequest
from essessey.errors import ProviderStreamError
from tests.adapter_views import (
    Interleaving,
    Step,
    answer_approvals,
    gated_interleavings,
    interleavings,
    split_text,
    starts,
    text_among,
    tool_use_blocks,
)
from tests.clients import read_sse
from tests.openai_agents_models import MODEL_NAME, Pause, Response, ScriptedResponses, call
from tests.processes import WAIT, node_json
from tests.servers import serve

pytestmark = pytest.mark.anyio

set_tracing_disabled(True)


# -- agents and tools ------------------------------------------------------------------------


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@function_tool
def get_time(city: str) -> dict[str, str]:
    """The time in a city."""
    return {"city": city, "time": "12:00"}


@function_tool
def broken(city: str) -> str:
    """A tool that fails."""
    raise RuntimeError("the weather service is down")


@function_tool(failure_error_function=None)
def fatal(city: str) -> str:
    """A tool whose failure ends the run."""
    raise RuntimeError("fatal")


SENT: list[str] = []


@function_tool(needs_approval=True)
def send_email(to: str) -> str:
    """Send an email (asks first)."""
    SENT.append(to)
    return f"sent to {to}"


def weather_script() -> list[list[Any]]:
    """Reasoning and two parallel calls (fragments interleaved), then the answer."""
    return [
        Response()
        .reasoning("Two cities, ", "two calls.")
        .text("Let me look.")
        .calls(
            call("call_w", "get_weather", '{"city":"Oslo"}', pieces=3),
            call("call_t", "get_time", '{"city":"Rome"}', pieces=2),
        )
        .done(),
        Response(usage=(30, 7)).text("Oslo is ", "sunny; ", "it is noon in Rome.").done(),
    ]


def agent_of(scripts: list[list[Any]], **options: Any) -> tuple[Agent[Any], ScriptedResponses]:
    model = ScriptedResponses(scripts)
    options.setdefault("tools", [get_weather, get_time])
    return Agent(name="assistant", model=model, **options), model


async def run_to_sink(
    agent: Agent[Any], prompt: str = "hi", **options: Any
) -> tuple[list[Event], PublishedRun | None, RunResultBase, BaseException | None]:
    sink = InMemorySink()
    result = Runner.run_streamed(agent, prompt, **options)
    run: PublishedRun | None = None
    error: BaseException | None = None
    try:
        run = await publish_run(Publisher(sink), result, message_id="msg_1", stream_id="s1")
    except Exception as exc:
        error = exc
    events = [Event(e.event, e.data, str(n + 1)) for n, e in enumerate(sink.events)]
    assert check(events) == []
    return events, run, result, error


def sdk_calls(result: RunResultBase) -> list[tuple[str, str, Any]]:
    found = []
    for item in result.new_items:
        if isinstance(item, ToolCallItem):
            raw = item.raw_item
            assert not isinstance(raw, dict)
            found.append((item.call_id, item.tool_name, json.loads(raw.arguments)))  # type: ignore[union-attr]
    return found


def sdk_outputs(result: RunResultBase) -> dict[str, str]:
    found = {}
    for item in result.new_items:
        if isinstance(item, ToolCallOutputItem):
            payload: Any = item.to_input_item()
            found[payload["call_id"]] = payload["output"]
    return found


def published_calls(events: list[Event]) -> tuple[list[tuple[str, str, Any]], dict[str, str]]:
    parsed = reassemble_events(events)
    calls = [(c.tool_use_id, c.name, c.params) for c in parsed.tool_calls]
    results = {r.tool_use_id: r.text for r in parsed.tool_results}
    return calls, results


# -- the publisher ---------------------------------------------------------------------------


async def test_reasoning_text_and_parallel_calls_are_rounds_of_one_message() -> None:
    agent, _ = agent_of(weather_script())
    events, run, result, error = await run_to_sink(agent)
    assert error is None
    assert run is not None
    parsed = reassemble_events(events)
    [message] = parsed.messages
    assert message.model == MODEL_NAME
    assert message.stop_reason == "end_turn"
    assert parsed.thinking == "Two cities, two calls."
    assert result.final_output == "Oslo is sunny; it is noon in Rome."
    assert parsed.text == "Let me look." + result.final_output
    assert run.output == result.final_output
    calls, results = published_calls(events)
    assert (
        calls
        == sdk_calls(result)
        == [
            ("call_w", "get_weather", {"city": "Oslo"}),
            ("call_t", "get_time", {"city": "Rome"}),
        ]
    )
    assert results == sdk_outputs(result)
    assert results["call_w"] == "sunny in Oslo"
    # The layout: round 1's thinking, text, both calls, then both results; round 2's text.
    assert [kind for _, kind in starts(events)] == [
        "thinking",
        "text",
        "tool_use",
        "tool_use",
        "tool_result",
        "tool_result",
        "text",
    ]
    # Usage: both responses' completed usage, summed (OpenAI's input less the cached).
    assert message.usage["output_tokens"] == 12
    assert message.usage["input_tokens"] == 40 - 4
    assert message.usage["cache_read_input_tokens"] == 4
    assert run.usage["reasoning_tokens"] == 2
    assert len(run.responses) == 2
    assert run.agents == ["assistant"]


async def test_a_tool_that_raises_gives_the_sdk_s_error_output_and_the_run_goes_on() -> None:
    scripts = [
        Response().calls(call("call_b", "broken", '{"city":"Oslo"}')).done(),
        Response().text("The service is down.").done(),
    ]
    agent, _ = agent_of(scripts, tools=[broken])
    events, _run, result, error = await run_to_sink(agent)
    assert error is None
    _, results = published_calls(events)
    assert results == sdk_outputs(result)
    assert "error" in results["call_b"].lower()
    assert reassemble_events(events).messages[0].stop_reason == "end_turn"


async def test_a_tool_error_that_ends_the_run_is_an_error_event_and_the_exception() -> None:
    scripts = [Response().text("Trying.").calls(call("call_f", "fatal", '{"city":"x"}')).done()]
    agent, _ = agent_of(scripts, tools=[fatal])
    events, run, result, error = await run_to_sink(agent)
    assert run is None
    assert error is not None
    assert "fatal" in str(error)
    parsed = reassemble_events(events)
    assert parsed.error is not None
    assert parsed.text == "Trying."
    assert result.is_complete


async def test_a_model_that_fails_mid_response_is_an_error_event_and_the_exception() -> None:
    events_of_response = Response().text("Half an ans", "wer").done()
    scripts = [[*events_of_response[:4], ConnectionError("the provider went away")]]
    agent, _ = agent_of(scripts)
    events, _run, result, error = await run_to_sink(agent)
    assert isinstance(error, ConnectionError)
    parsed = reassemble_events(events)
    assert parsed.error is not None
    assert parsed.error.type == "api_error"
    # What the SDK had queued before the model raised it drops: the error is what comes.
    assert not parsed.messages[0].complete
    assert result.is_complete


async def test_a_failed_response_is_the_provider_s_error() -> None:
    response = Response()
    failed = response._response("failed", [])
    failed["error"] = {"code": "server_error", "message": "overloaded"}
    response._add("response.failed", response=failed)
    agent, _ = agent_of([response.events])
    events, _, result, error = await run_to_sink(agent)
    assert isinstance(error, ProviderStreamError)
    parsed = reassemble_events(events)
    assert parsed.error is not None
    assert (parsed.error.type, parsed.error.message) == ("server_error", "overloaded")
    assert result.is_complete


async def test_a_handoff_is_a_call_whose_result_names_the_new_agent() -> None:
    model = ScriptedResponses(
        [
            Response()
            .text("Passing you on.")
            .calls(call("call_h", "transfer_to_billing", "{}"))
            .done(),
            Response(model="gpt-billing").text("Billing here: ", "paid.").done(),
        ]
    )
    billing = Agent(name="billing", model=model, handoff_description="Payments")
    triage = Agent(name="triage", model=model, handoffs=[billing])
    events, run, result, error = await run_to_sink(triage)
    assert error is None
    assert run is not None
    assert run.agents == ["triage", "billing"]
    assert result.last_agent.name == "billing"
    parsed = reassemble_events(events)
    [(call_id, name, params)] = [(c.tool_use_id, c.name, c.params) for c in parsed.tool_calls]
    assert (call_id, name, params) == ("call_h", "transfer_to_billing", {})
    [handoff_result] = parsed.tool_results
    assert json.loads(handoff_result.text) == {"assistant": "billing"}
    assert parsed.text == "Passing you on.Billing here: paid."
    assert result.final_output == "Billing here: paid."
    assert parsed.messages[0].model == MODEL_NAME  # the first response's model


async def test_a_hosted_web_search_is_a_server_tool_block_of_its_round() -> None:
    agent, _ = agent_of(
        [Response().web_search("essessey").text("Found it.").done()], tools=[WebSearchTool()]
    )
    events, run, result, error = await run_to_sink(agent)
    assert error is None
    assert run is not None
    assert [kind for _, kind in starts(events)] == [
        "server_tool_use",
        "web_search_tool_result",
        "text",
    ]
    assert reassemble_events(events).text == result.final_output == "Found it."


async def test_a_shell_the_provider_ran_is_a_server_tool_and_its_output_goes_out_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    agent, _ = agent_of(
        [Response().hosted_shell("call_sh", "ls", "a.txt\n").text("One file.").done()],
        tools=[ShellTool(environment={"type": "container_auto"})],
    )
    with caplog.at_level("WARNING", logger="essessey"):
        events, run, result, error = await run_to_sink(agent)
    assert error is None
    assert run is not None
    assert [r.getMessage() for r in caplog.records if r.name.startswith("essessey")] == []
    # The SDK made an output item of the provider's shell output, as of a call it ran.
    assert "call_sh" in sdk_outputs(result)
    assert [kind for _, kind in starts(events)] == [
        "server_tool_use",
        "shell_tool_result",
        "server_tool_use",
        "shell_tool_result",
        "text",
    ]
    assert not reassemble_events(events).tool_calls
    assert run.results == {}


_MCP_REQUEST = {
    "type": "mcp_approval_request",
    "id": "mcpr_1",
    "server_label": "wiki",
    "name": "ask",
    "arguments": '{"q":"essessey"}',
}
_MCP_CALL = {
    "type": "mcp_call",
    "id": "mcp_1",
    "server_label": "wiki",
    "name": "ask",
    "arguments": '{"q":"essessey"}',
    "output": "A streaming library.",
    "approval_request_id": "mcpr_1",
    "status": "completed",
}


def mcp_tool(**options: Any) -> HostedMCPTool:
    config: Any = {"type": "mcp", "server_label": "wiki", "server_url": "https://wiki.example"}
    return HostedMCPTool(tool_config={**config, "require_approval": "always"}, **options)


@pytest.mark.parametrize("approve", [True, False], ids=["approved", "denied"])
async def test_a_hosted_mcp_call_the_app_s_callback_answers_is_answered_in_the_message(
    approve: bool, caplog: pytest.LogCaptureFixture
) -> None:
    # The SDK asks on_approval_request and sends its answer to the model: that answer is
    # the result of the call the request gates.
    asked: list[str] = []

    def on_approval(request: Any) -> Any:
        asked.append(request.data.name)
        return {"approve": approve} if approve else {"approve": False, "reason": "not now"}

    scripts = [Response().item(_MCP_REQUEST).done(), Response().text("Done.").done()]
    if approve:
        scripts[1] = Response().item(_MCP_CALL).text("It streams.").done()
    agent, _ = agent_of(scripts, tools=[mcp_tool(on_approval_request=on_approval)])
    with caplog.at_level("WARNING", logger="essessey"):
        events, run, _, error = await run_to_sink(agent)
    assert error is None
    assert run is not None
    assert asked == ["ask"]
    assert [r.getMessage() for r in caplog.records if r.name.startswith("essessey")] == []
    [call] = reassemble_events(events).tool_calls
    assert (call.name, call.params) == ("ask", {"q": "essessey"})
    [result] = reassemble_events(events).tool_results
    assert result.tool_use_id == call.tool_use_id
    answer = json.loads(result.text)
    assert (answer["approval_request_id"], answer["approve"]) == ("mcpr_1", approve)
    assert result.is_error is (not approve)
    if approve:  # the provider ran it: a server tool of the next round
        assert ("server_tool_use" in [kind for _, kind in starts(events)]) is True


@pytest.mark.parametrize("approve", [True, False], ids=["approved", "denied"])
async def test_a_hosted_mcp_call_the_sdk_stops_for_is_asked_and_the_answer_resumes_it(
    approve: bool, caplog: pytest.LogCaptureFixture
) -> None:
    then = Response().item(_MCP_CALL).text("It streams.") if approve else Response().text("No.")
    model = ScriptedResponses([Response().item(_MCP_REQUEST).done(), then.done()])
    turns = AgentTurns(Agent(name="a", model=model, tools=[mcp_tool()]))
    with caplog.at_level("WARNING", logger="essessey"):
        async with StreamHub(on_answer=turns.on_answer) as hub:
            await hub.start("s_mcp", turns(chat("s_mcp")))
            await hub.wait("s_mcp")
            waiting = await hub.waiting("s_mcp")
            assert waiting is not None
            [request] = waiting.requests
            assert request.tool_use_id == "mcpr_1_call"  # type: ignore[union-attr]
            await hub.answer("s_mcp", [ToolApproval(request.id, approved=approve)])
            await hub.wait("s_mcp")
            events, _ = await hub.store.since("s_mcp", None)
    assert [r.getMessage() for r in caplog.records if r.name.startswith("essessey")] == []
    assert check(events) == []
    first, second = reassemble_events(events).messages
    assert first.stop_reason == "tool_use"
    # The answer the SDK sent the model is the gated call's result.
    [result] = second.tool_results
    assert result.tool_use_id == "mcpr_1_call"
    assert json.loads(result.text)["approve"] is approve
    assert result.is_error is (not approve)
    assert second.text == ("It streams." if approve else "No.")
    assert second.stop_reason == "end_turn"


def _chat_body(*deltas: dict[str, Any], finish: str) -> bytes:
    """A Chat Completions stream's body: a chunk per delta, the finish, the usage."""
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    chunks = [
        {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        for delta in deltas
    ]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    usage = {"prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29}
    chunks.append({**base, "choices": [], "usage": usage})
    lines = [b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in chunks]
    return b"".join(lines) + b"data: [DONE]\n\n"


@pytest.fixture
def chat_server() -> Iterator[tuple[str, list[bytes]]]:
    """A Chat Completions endpoint on loopback: each request gets the next body the test
    queued."""
    from starlette.requests import Request
    from starlette.responses import Response as HTTPResponse
    from starlette.routing import Route

    bodies: list[bytes] = []

    async def completions(request: Request) -> HTTPResponse:
        await request.body()
        return HTTPResponse(bodies.pop(0), media_type="text/event-stream")

    app = Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])
    with serve(app) as url:
        yield url, bodies


async def test_parallel_calls_of_a_chat_completions_model_are_calls_of_their_own(
    chat_server: tuple[str, list[bytes]], caplog: pytest.LogCaptureFixture
) -> None:
    # The SDK gives every item of a Chat Completions stream one id; the output indexes
    # tell them apart.
    from agents import OpenAIChatCompletionsModel

    url, bodies = chat_server

    def fragment(index: int, arguments: str, **start: str) -> dict[str, Any]:
        call: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
        if start:
            call.update(id=start["id"], type="function")
            call["function"]["name"] = start["name"]
        return {"tool_calls": [call]}

    bodies.append(
        _chat_body(
            {"role": "assistant", "content": "Let me look."},
            fragment(0, "", id="call_w", name="get_weather"),
            fragment(0, '{"city":'),
            fragment(0, '"Oslo"}'),
            fragment(1, "", id="call_t", name="get_time"),
            fragment(1, '{"city":"Rome"}'),
            finish="tool_calls",
        )
    )
    bodies.append(_chat_body({"role": "assistant", "content": "Sunny, noon."}, finish="stop"))
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as client:
        model = OpenAIChatCompletionsModel(model="m", openai_client=client)
        agent = Agent(name="assistant", model=model, tools=[get_weather, get_time])
        with caplog.at_level("WARNING", logger="essessey"):
            events, _, result, error = await run_to_sink(agent)
    assert error is None
    assert [r.message for r in caplog.records if r.name.startswith("essessey")] == []
    calls, results = published_calls(events)
    assert (
        calls
        == sdk_calls(result)
        == [
            ("call_w", "get_weather", {"city": "Oslo"}),
            ("call_t", "get_time", {"city": "Rome"}),
        ]
    )
    assert results == sdk_outputs(result)
    assert set(results) == {"call_w", "call_t"}
    assert reassemble_events(events).text == "Let me look.Sunny, noon."


async def test_a_continuation_without_its_state_is_an_error_in_band() -> None:
    model = ScriptedResponses(approval_scripts())
    states = RunStates()
    turns = AgentTurns(mail_agent(model), states=states)
    async with StreamHub(on_answer=turns.on_answer) as hub:
        await hub.start("s5", turns(chat("s5")))
        await hub.wait("s5")
        waiting = await hub.waiting("s5")
        assert waiting is not None
        [request] = waiting.requests
        await states.drop(request.id)  # gone (the store's retention, say)
        await hub.answer("s5", [ToolApproval(request.id, approved=True)])
        await hub.wait("s5")
        events, _ = await hub.store.since("s5", None)
    parsed = reassemble_events(events)
    assert parsed.error is not None
    assert "LookupError" in parsed.error.message


async def test_agent_input_is_the_conversation_as_responses_messages() -> None:
    chat = ChatRequest(
        "c1",
        [
            {"role": "system", "parts": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "parts": [{"type": "text", "text": "Hi"}]},
            {"role": "assistant", "parts": [{"type": "text", "text": "Hello."}]},
            {"role": "user", "parts": [{"type": "text", "text": "Weather?"}]},
        ],
        "submit-message",
    )
    assert agent_input(chat) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Weather?"},
    ]


# -- through the hub -----------------------------------------------------------------------


def chat(stream_id: str, text: str = "hi") -> ChatRequest:
    return ChatRequest(
        stream_id, [{"role": "user", "parts": [{"type": "text", "text": text}]}], "submit-message"
    )


def approval_scripts(to: str = "ada@example.com") -> list[list[Any]]:
    """A gated call before a plain one, then (once answered) the answer."""
    return [
        Response()
        .text("Sending it.")
        .calls(
            call("call_mail", "send_email", json.dumps({"to": to})),
            call("call_w", "get_weather", '{"city":"Oslo"}'),
        )
        .done(),
        Response().text("All done.").done(),
    ]


def mail_agent(model: ScriptedResponses) -> Agent[Any]:
    return Agent(name="mailer", model=model, tools=[send_email, get_weather])


async def test_an_approval_answered_on_another_replica_resumes_the_sdk_run() -> None:
    SENT.clear()
    store = InMemoryEventStore()
    model = ScriptedResponses(approval_scripts())
    # Two replicas: each its own agent object and turns, sharing the store.
    turns_a = AgentTurns(mail_agent(model), states=RunStates(store))
    turns_b = AgentTurns(mail_agent(model), states=RunStates(store))
    async with (
        StreamHub(store, on_answer=turns_a.on_answer) as a,
        StreamHub(store, on_answer=turns_b.on_answer) as b,
    ):
        await a.start("s1", turns_a(chat("s1")))
        await a.wait("s1")
        waiting = await b.waiting("s1")
        assert waiting is not None
        [request] = waiting.requests
        assert request.tool_use_id == "call_mail"  # type: ignore[union-attr]
        assert SENT == []
        continued = await b.answer("s1", [ToolApproval(request.id, approved=True)])
        assert continued.started
        await b.wait("s1")
        events, _ = await store.since("s1", None)
    assert check(events) == []
    assert SENT == ["ada@example.com"]
    parsed = reassemble_events(events)
    first, second = parsed.messages
    assert first.stop_reason == "tool_use"
    # The plain call's result went out in the asking message; the gated one's after.
    assert {r.tool_use_id: r.text for r in first.tool_results} == {"call_w": "sunny in Oslo"}
    assert {r.tool_use_id: r.text for r in second.tool_results} == {
        "call_mail": "sent to ada@example.com"
    }
    assert second.text == "All done."
    assert second.stop_reason == "end_turn"
    assert parsed.pending == ()
    assert await RunStates(store).load(request.id) is None  # dropped once resumed


async def test_a_denied_approval_is_the_sdk_s_rejection_and_the_tool_never_runs() -> None:
    SENT.clear()
    model = ScriptedResponses(approval_scripts())
    turns = AgentTurns(mail_agent(model))
    async with StreamHub(on_answer=turns.on_answer) as hub:
        await hub.start("s2", turns(chat("s2")))
        await hub.wait("s2")
        waiting = await hub.waiting("s2")
        assert waiting is not None
        [request] = waiting.requests
        await hub.answer("s2", [ToolApproval(request.id, approved=False, reason="not now")])
        await hub.wait("s2")
        events, _ = await hub.store.since("s2", None)
    assert check(events) == []
    assert SENT == []
    second = reassemble_events(events).messages[1]
    [result] = second.tool_results
    assert (result.tool_use_id, result.text, result.is_error) == ("call_mail", "not now", True)
    assert second.text == "All done."


async def test_two_gated_calls_of_one_round_answered_one_yes_one_no() -> None:
    SENT.clear()
    model = ScriptedResponses(
        [
            Response()
            .calls(
                call("call_a", "send_email", '{"to":"a@example.com"}'),
                call("call_b", "send_email", '{"to":"b@example.com"}'),
            )
            .done(),
            Response().text("One sent.").done(),
        ]
    )
    turns = AgentTurns(mail_agent(model), approval_reason=lambda item: f"{item.name} asks")
    async with StreamHub(on_answer=turns.on_answer) as hub:
        await hub.start("s6", turns(chat("s6")))
        await hub.wait("s6")
        waiting = await hub.waiting("s6")
        assert waiting is not None
        first, second = waiting.requests
        assert [first.reason, second.reason] == ["send_email asks"] * 2  # type: ignore[union-attr]
        answers = [ToolApproval(first.id, approved=True), ToolApproval(second.id, approved=False)]
        await hub.answer("s6", answers)
        await hub.wait("s6")
        events, _ = await hub.store.since("s6", None)
    assert check(events) == []
    assert SENT == ["a@example.com"]
    continued = reassemble_events(events).messages[1]
    results = {r.tool_use_id: (r.text, r.is_error) for r in continued.tool_results}
    assert results["call_a"] == ("sent to a@example.com", False)
    assert results["call_b"][1] is True
    assert continued.text == "One sent."


async def test_a_cancelled_turn_cancels_the_sdk_run() -> None:
    started, never = anyio.Event(), anyio.Event()
    cancelled: list[bool] = []

    @function_tool
    async def slow() -> str:
        """Waits forever."""
        started.set()
        try:
            await never.wait()
        except BaseException:
            cancelled.append(True)
            raise
        return "never"

    model = ScriptedResponses([Response().text("Working.").calls(call("c1", "slow", "{}")).done()])
    agent = Agent(name="a", model=model, tools=[slow])
    turns = AgentTurns(agent)
    async with StreamHub() as hub:
        await hub.start("s3", turns(chat("s3")))
        with anyio.fail_after(WAIT):
            await started.wait()
        assert await hub.cancel("s3")
        await hub.wait("s3")
        events, _ = await hub.store.since("s3", None)
    assert cancelled == [True]
    parsed = reassemble_events(events)
    assert parsed.messages[-1].stop_reason == "cancelled"
    assert check(events) == []


async def test_drop_and_resume_in_the_middle_of_the_run_gives_every_event_once() -> None:
    gate = anyio.Event()

    async def wait_for_gate() -> None:
        await gate.wait()

    first = (
        Response()
        .text("Let me ", "look.")
        .calls(call("call_w", "get_weather", '{"city":"Oslo"}'))
        .done()
    )
    second = Response().text("It is ", "sunny.").done()
    model = ScriptedResponses([first, [*second[:3], Pause(wait_for_gate), *second[3:]]])
    agent, _ = agent_of([])
    agent = Agent(name="a", model=model, tools=[get_weather])
    turns = AgentTurns(agent)
    async with StreamHub() as hub:
        await hub.start("s4", turns(chat("s4")))
        seen: list[Event] = []
        with anyio.fail_after(WAIT):
            async for event in hub.subscribe("s4"):
                seen.append(event)
                if event.event == "content_block_start" and b"tool_result" in event.data:
                    break  # the reader drops here, mid-run
        gate.set()
        rest = []
        with anyio.fail_after(WAIT):
            async for event in hub.subscribe("s4", seen[-1].id):
                rest.append(event)
        whole, _ = await hub.store.since("s4", None)
    assert [e.id for e in seen + rest] == [e.id for e in whole]
    assert check(seen + rest) == []
    assert reassemble_events(seen + rest).text == "Let me look.It is sunny."


# -- over HTTP -------------------------------------------------------------------------------


@pytest.fixture
def served() -> Iterator[tuple[str, list[ScriptedResponses]]]:
    """An app of AgentTurns on every dialect; each request's agent plays the scripts the
    test put in ``models`` (one model per turn, in order)."""
    models: list[ScriptedResponses] = []
    agent = Agent(name="mailer", tools=[send_email, get_weather, get_time])

    # One agent, its model given per run by the run config (the model the test queued).
    turns = AgentTurns(agent, run_config=RunConfig())

    def factory(request: Any) -> Any:
        turns.run_config = RunConfig(model=models[0])
        return turns(request)

    async def on_answer(publisher: Publisher, answered: Any) -> None:
        turns.run_config = RunConfig(model=models[0])
        await turns.on_answer(publisher, answered)

    hub = StreamHub(on_answer=on_answer)
    app = Starlette(routes=list(dialect_routes(hub, factory)), lifespan=hub.lifespan)
    with serve(app, lifespan="on") as url:
        yield url, models


async def test_the_openai_sdk_reads_a_turn_as_responses_and_as_chat_completions(
    served: tuple[str, list[ScriptedResponses]],
) -> None:
    url, models = served
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as sdk:
        models[:] = [ScriptedResponses(weather_script())]
        response = await sdk.responses.create(model="m", input="weather?")
        assert response.output_text == "Let me look.Oslo is sunny; it is noon in Rome."
        calls = [item for item in response.output if item.type == "function_call"]
        assert [(c.call_id, c.name, json.loads(c.arguments)) for c in calls] == [
            ("call_w", "get_weather", {"city": "Oslo"}),
            ("call_t", "get_time", {"city": "Rome"}),
        ]
        outputs = [item for item in response.output if item.type == "function_call_output"]
        assert [o.output for o in outputs] == [
            "sunny in Oslo",
            str({"city": "Rome", "time": "12:00"}),
        ]

        models[:] = [ScriptedResponses(weather_script())]
        stream = await sdk.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "weather?"}], stream=True
        )
        text = "".join(
            [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
        )
        assert text.endswith("it is noon in Rome.")


async def test_approvals_over_http_the_protocol_route_and_the_responses_dialect(
    served: tuple[str, list[ScriptedResponses]],
) -> None:
    url, models = served
    SENT.clear()
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as sdk:
        # The Responses dialect: denied by an mcp_approval_response.
        models[:] = [ScriptedResponses(approval_scripts("bob@example.com"))]
        first = await sdk.responses.create(model="m", input="mail bob")
        [request] = [item for item in first.output if item.type == "mcp_approval_request"]
        assert request.name == "send_email"
        deny = {
            "type": "mcp_approval_response",
            "approval_request_id": request.id,
            "approve": False,
        }
        second = await sdk.responses.create(model="m", previous_response_id=first.id, input=[deny])
        assert second.output_text == "All done."
        assert SENT == []

        # The protocol's answer route, on a turn a Chat Completions client started.
        models[:] = [ScriptedResponses(approval_scripts("ada@example.com"))]
        completion = await sdk.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "mail ada"}]
        )
        stream_id = completion.id
    async with httpx.AsyncClient(timeout=WAIT) as http:
        asked = await read_sse(http, f"{url}/streams/{stream_id}")
        assert check(asked) == []
        [pending] = reassemble_events(asked).pending
        answer = await http.post(
            f"{url}/streams/{stream_id}/answer",
            json={"answers": [{"id": pending.id, "approved": True}]},
        )
        assert answer.status_code == 200, answer.text
        after = answer.json()["after"]
        rest = await read_sse(http, f"{url}/streams/{stream_id}", last_event_id=after)
    assert SENT == ["ada@example.com"]
    assert check(asked + rest) == []
    continuation = reassemble_events(asked + rest).messages[-1]
    assert continuation.text == "All done."
    assert {r.tool_use_id: r.text for r in continuation.tool_results} == {
        "call_mail": "sent to ada@example.com"
    }


@pytest.mark.slow
def test_the_ag_ui_client_reads_a_turn(
    node_client: Path, served: tuple[str, list[ScriptedResponses]]
) -> None:
    url, models = served
    models[:] = [ScriptedResponses(weather_script())]
    seen = node_json(node_client.parent / "agui.mjs", f"{url}/agui", "thread-1", "run-1")
    assert seen["events"][0] == "RUN_STARTED"
    assert seen["events"][-1] == "RUN_FINISHED"
    assert seen["events"].count("TOOL_CALL_RESULT") == 2
    text = "".join(m.get("content") or "" for m in seen["messages"] if m["role"] == "assistant")
    assert text.endswith("it is noon in Rome.")
    results = {m["toolCallId"]: m["content"] for m in seen["messages"] if m["role"] == "tool"}
    assert results["call_w"] == "sunny in Oslo"


# -- any interleaving, any number of rounds --------------------------------------------------


async def _echo_arguments(context: Any, arguments: str) -> str:
    return f"read {len(json.loads(arguments))} fields"


ANY_OBJECT_TOOLS = [
    FunctionTool(
        name=f"f{k}",
        description="Takes any object.",
        params_json_schema={"type": "object"},
        on_invoke_tool=_echo_arguments,
        strict_json_schema=False,
    )
    for k in range(3)
]


@st.composite
def model_rounds(draw: st.DrawFn) -> list[tuple[list[Step], Interleaving]]:
    """One to three responses, each its text's pieces placed anywhere among its parallel
    calls' interleaved fragments (the last response text alone)."""
    count = draw(st.integers(1, 3))
    out = []
    for n in range(count):
        text = draw(st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=20))
        pieces = split_text(text, draw(st.lists(st.integers(1, 20), max_size=4)))
        calls = draw(interleavings(max_calls=3)) if n < count - 1 else Interleaving([], [], [])
        steps = draw(text_among(pieces, calls))
        out.append((steps, calls))
    return out


@settings(max_examples=40, deadline=None)
@given(responses=model_rounds(), numbered=st.booleans())
def test_any_interleaving_of_text_and_calls_over_rounds_is_published_whole(
    responses: list[tuple[list[Step], Interleaving]], numbered: bool
) -> None:
    # numbered: the model numbers its calls per response (call_0 in every round), so a
    # later round repeats an earlier round's id. The SDK runs such a call once when it is
    # the same invocation, and fails the run when it is another.
    scripts = []
    for n, (steps, calls) in enumerate(responses):
        ids = [f"call_{k}" if numbered else f"call_{n}_{k}" for k in range(len(calls.arguments))]
        whole = [(ids[k], f"f{k}", a) for k, a in enumerate(calls.arguments)]
        scripts.append(Response().mixed(steps, whole).done())
    agent, model = agent_of(scripts, tools=ANY_OBJECT_TOOLS)
    events, run, result, error = anyio.run(run_to_sink, agent)  # checks the stream
    played = responses[: model.calls]
    text = "".join(s for steps, _ in played for s in steps if isinstance(s, str))
    parsed = reassemble_events(events)
    [message] = parsed.messages
    calls = parsed.tool_calls
    assert len({c.tool_use_id for c in calls}) == len(calls)
    if error is not None:
        # The SDK refuses the response that reuses an id for another call once it is
        # whole, and stops its stream there: what came before it went out.
        assert numbered
        assert isinstance(error, ModelBehaviorError)
        assert events[-1].event == "error"
        assert not message.complete
        assert text.startswith(parsed.text)
        return
    assert parsed.text == text
    # Each call's fragments in its own block, as sent.
    sent = [
        [f for k2, f, _ in calls_.sequence if k2 == k]
        for _, calls_ in played
        for k in range(len(calls_.pieces))
    ]
    assert [p for *_, p in tool_use_blocks(events)] == sent
    assert message.complete
    assert message.stop_reason == "end_turn"
    assert run is not None
    assert run.output == result.final_output
    # Every call the SDK ran, in order, with its arguments; a call that repeats one is
    # published too (under a fresh id), the SDK's output for that invocation its result.
    given = [c.given_id for response in run.responses for c in response.tool_calls]
    assert [c.tool_use_id for c in calls] == [c.id for r in run.responses for c in r.tool_calls]
    ran = [
        (c.name, c.params)
        for i, (c, g) in enumerate(zip(calls, given, strict=True))
        if g not in given[:i]
    ]
    assert ran == [(name, params) for _, name, params in sdk_calls(result)]
    if not numbered:
        assert [c.tool_use_id for c in calls] == given
    outputs = sdk_outputs(result)
    results = {r.tool_use_id: r.text for r in parsed.tool_results}
    assert [results[c.tool_use_id] for c in calls] == [outputs[g] for g in given]


async def test_a_call_that_repeats_an_earlier_one_gets_its_output_as_result() -> None:
    # A model that numbers its calls per response sends call_0 again, the same tool with
    # the same input: the SDK takes it for the invocation it ran and ends the run there.
    scripts = [
        Response().text("Looking.").calls(call("call_0", "f0", '{"a": 1}')).done(),
        Response().text("Again.").calls(call("call_0", "f0", '{"a": 1}')).done(),
        Response().text("Unplayed.").done(),
    ]
    agent, model = agent_of(scripts, tools=ANY_OBJECT_TOOLS)
    events, run, result, error = await run_to_sink(agent)
    assert error is None
    assert model.calls == 2
    assert run is not None
    assert result.final_output == "Again."
    [message] = reassemble_events(events).messages
    assert message.stop_reason == "end_turn"
    first, second = message.tool_calls
    assert first.tool_use_id == "call_0" != second.tool_use_id  # a fresh id
    assert [c.given_id for r in run.responses for c in r.tool_calls] == ["call_0", "call_0"]
    results = {r.tool_use_id: (r.text, r.is_error) for r in message.tool_results}
    assert results == {
        "call_0": ("read 1 fields", False),
        second.tool_use_id: ("read 1 fields", False),
    }


@pytest.mark.parametrize(
    ("output", "text"),
    [("lone \ud800", "lone \ufffd"), ({"n": 2**64}, "{'n': 18446744073709551616}")],
)
async def test_a_tool_output_orjson_cannot_write_is_its_result(output: object, text: str) -> None:
    # A tool that returns a string holding a lone surrogate (a file name decoded with
    # surrogateescape, say) raised SerializationError out of the adapter. (The SDK hands
    # the model a dict's str().)

    async def odd(context: Any, arguments: str) -> object:
        return output

    tool = FunctionTool(
        name="odd",
        description="Returns what it was made to.",
        params_json_schema={"type": "object"},
        on_invoke_tool=odd,
        strict_json_schema=False,
    )
    scripts = [
        Response().calls(call("call_1", "odd", '{"n": 18446744073709551616}')).done(),
        Response().text("done").done(),
    ]
    agent, _ = agent_of(scripts, tools=[tool])
    events, run, _, error = await run_to_sink(agent)  # checks the stream
    assert error is None
    parsed = reassemble_events(events)
    assert [c.arguments for c in parsed.tool_calls] == ['{"n": 18446744073709551616}']
    assert [r.text for r in parsed.tool_results] == [text]
    assert run is not None
    assert run.results == {"call_1": text}


@settings(max_examples=20, deadline=None)
@given(plan=gated_interleavings())
def test_any_parallel_calls_some_gated_answered_any_way_give_each_call_one_result(
    plan: tuple[Interleaving, list[bool], list[bool]],
) -> None:
    # Parallel calls whose fragments interleave, any of them needing approval, each
    # approval answered yes or no: every call gets exactly one result, in the asking
    # message (a call that ran) or in the continuation (a gated one: its output, or the
    # SDK's rejection), and the turn ends with the model's answer.
    calls, gated, approve = plan
    count = len(calls.arguments)
    ran: list[str] = []

    def tool(k: int) -> FunctionTool:
        async def invoke(context: Any, arguments: str) -> str:
            ran.append(f"f{k}")
            return f"f{k} ran"

        return FunctionTool(
            name=f"f{k}",
            description="Any object.",
            params_json_schema={"type": "object"},
            on_invoke_tool=invoke,
            strict_json_schema=False,
            needs_approval=gated[k],
        )

    whole = [(f"call_{k}", f"f{k}", a) for k, a in enumerate(calls.arguments)]
    model = ScriptedResponses(
        [Response().mixed(list(calls.sequence), whole).done(), Response().text("done").done()]
    )
    agent = Agent(name="a", model=model, tools=[tool(k) for k in range(count)])
    turns = AgentTurns(agent)
    _parsed, results = answer_approvals(
        turns(chat("s")), turns.on_answer, gated, approve, answer="done"
    )
    expected = {}
    for k in range(count):
        if not gated[k] or approve[k]:
            expected[f"call_{k}"] = [(f"f{k} ran", False)]
    assert {key: value for key, value in results.items() if key in expected} == expected
    denied = [f"call_{k}" for k in range(count) if gated[k] and not approve[k]]
    assert all(len(results[key]) == 1 and results[key][0][1] for key in denied)
    assert sorted(results) == [f"call_{k}" for k in range(count)]
    assert sorted(ran) == sorted(f"f{k}" for k in range(count) if not gated[k] or approve[k])


# -- any sequence of a run's stream events ---------------------------------------------------


class _Replayed:
    """A finished run's stream events handed out again, with what ``publish_run`` reads
    of a ``RunResultStreaming`` once they end (nothing asked, the run complete)."""

    def __init__(self, events: list[Any]) -> None:
        self.events = events
        self.interruptions: list[Any] = []
        self.final_output = "done"
        self.is_complete = True
        self.run_loop_task = None

    async def stream_events(self) -> Any:
        for event in self.events:
            yield event

    def cancel(self) -> None:
        pass


_AGENT = Agent(name="a")


def _output(call_id: str, output: Any) -> RunItemStreamEvent:
    raw = {"type": "function_call_output", "call_id": call_id, "output": output}
    item = ToolCallOutputItem(agent=_AGENT, raw_item=raw, output=output)  # type: ignore[arg-type]
    return RunItemStreamEvent(name="tool_output", item=item)


@st.composite
def _run_events(draw: st.DrawFn) -> list[Any]:
    """Responses (text, calls) with events dropped or swapped, outputs for calls known
    or not, agent switches: in orders a run does not send, too."""
    found: list[Any] = []
    for n in range(draw(st.integers(0, 3))):
        response = Response()
        if draw(st.booleans()):
            response.text(*draw(st.lists(st.text(max_size=5), max_size=3)))
        ids = [
            draw(st.sampled_from([f"c{n}{k}", "c00", ""])) for k in range(draw(st.integers(0, 2)))
        ]
        if ids:
            response.calls(*[(call_id, "t", ['{"a"', ": 1}"]) for call_id in ids])
        raw = [
            RawResponsesStreamEvent(data=e)
            for e in (response.done() if draw(st.integers(0, 5)) else response.events)
        ]
        for _ in range(draw(st.integers(0, 2))):
            if raw:
                i, j = draw(st.integers(0, len(raw) - 1)), draw(st.integers(0, len(raw) - 1))
                if draw(st.booleans()):
                    raw[i], raw[j] = raw[j], raw[i]
                else:
                    del raw[i]
        found += raw
        for k in range(draw(st.integers(0, 3))):
            call_id = draw(st.sampled_from([f"c{n}{k}", "c00", "unknown"]))
            found.append(_output(call_id, draw(st.sampled_from(["ok", {"x": 1}, None]))))
        if draw(st.integers(0, 4)) == 0:
            found.append(AgentUpdatedStreamEvent(new_agent=_AGENT))
    return found


@settings(max_examples=60, deadline=None)
@given(events=_run_events())
def test_any_sequence_of_stream_events_publishes_a_valid_stream(events: list[Any]) -> None:
    async def run() -> list[Event]:
        sink = InMemorySink()
        with contextlib.suppress(ProviderStreamError):  # a response cut short: in band
            await publish_run(Publisher(sink), _Replayed(events), message_id="m", stream_id="s")  # type: ignore[arg-type]
        return sink.events

    published = anyio.run(run)
    assert check(published) == []
    assert published[-1].event in ("message_stop", "error")
