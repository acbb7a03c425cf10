"""A question a call's run asks (``Turn.ask(..., tool_use_id=)``: a tool that needs its
user's answer before it can end), in every dialect: the call is the app's, not the
client's, so no dialect hands it to the client to run; the question is asked as any
question is. (The hub's side, the answer and the call's result after it, is in
tests/test_asking.py; LangGraph's tools that ask, in tests/test_adapter_langgraph.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from ag_ui.core import RunFinishedEvent

from essessey import (
    Answered,
    InMemorySink,
    Publisher,
    StreamHub,
    ToolApproval,
    check,
    continue_turn,
    stream_turn,
)
from essessey.bindings.sse import SSEDecoder
from essessey.dialects.agui import AGUIEncoder
from essessey.dialects.chat_completions import ChatCompletionsEncoder
from essessey.dialects.responses import ResponsesEncoder
from essessey.dialects.ui import UIMessageEncoder
from essessey.event import Event
from tests.processes import node_json

pytestmark = pytest.mark.anyio


async def _asking_events() -> list[Event]:
    """A round of two calls: ``lookup`` ran (its result there), ``book`` asks a question
    before it can end."""
    sink = InMemorySink()
    async with stream_turn(Publisher(sink), message_id="m1", stream_id="s", model="m") as turn:
        tools = await turn.tools()
        await tools.start_call("call_lookup", "lookup", '{"q":"x"}')
        await tools.start_call("call_book", "book", '{"table":8}')
        await tools.write_result("call_lookup", "found")
        await turn.ask("Which day?", request_id="q_1", tool_use_id="call_book")
    return [Event(e.event, e.data, str(n)) for n, e in enumerate(sink.events, 1)]


def _datas(encoder: Any, events: list[Event]) -> list[dict[str, Any]]:
    body = b"".join(encoder.encode(event) for event in events) + encoder.finish()
    decoder = SSEDecoder()
    return [json.loads(m.data) for m in decoder.feed(body) + decoder.close() if m.data != "[DONE]"]


async def test_chat_completions_asks_the_question_and_not_the_call() -> None:
    chunks = _datas(ChatCompletionsEncoder("chatcmpl-x"), await _asking_events())
    calls = [
        call["function"]["name"]
        for chunk in chunks
        for choice in chunk.get("choices", ())
        for call in choice["delta"].get("tool_calls") or ()
        if call.get("function", {}).get("name")
    ]
    # The call that ran is written with its result; the one that asks is not the client's.
    assert calls == ["lookup", "ask_user"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


async def test_responses_asks_the_question_and_not_the_call() -> None:
    events = _datas(ResponsesEncoder("resp_x"), await _asking_events())
    [final] = [e for e in events if e["type"] == "response.completed"]
    calls = [
        item["name"] for item in final["response"]["output"] if item["type"] == "function_call"
    ]
    assert calls == ["lookup", "ask_user"]


async def test_agui_interrupt_names_the_call_that_asks() -> None:
    events = _datas(AGUIEncoder("t", "r"), await _asking_events())
    finished = RunFinishedEvent.model_validate(events[-1])
    outcome = finished.model_dump(by_alias=True, exclude_none=True)["outcome"]
    [interrupt] = outcome["interrupts"]
    assert interrupt["id"] == "q_1"
    assert interrupt["toolCallId"] == "call_book"
    assert "pendingToolCallIds" not in outcome


async def test_the_ui_stream_marks_the_call_run_by_the_server(node_client: Path) -> None:
    # The AI SDK's lastAssistantMessageIsCompleteWithToolCalls leaves calls the server
    # runs (providerExecuted) out: the question's answer alone completes the message.
    chunks = _datas(UIMessageEncoder(message_id="m1"), await _asking_events())
    book = [c for c in chunks if c.get("toolCallId") == "call_book"]
    assert book[-1] == {
        "type": "tool-input-available",
        "toolCallId": "call_book",
        "toolName": "book",
        "input": {"table": 8},
        "providerExecuted": True,
    }
    steps = [c["type"] for c in chunks if c["type"] in ("start-step", "finish-step")]
    assert steps == ["start-step", "finish-step"]  # the question is in the call's step
    # The AI SDK's own reading: the message is complete once the question is answered.
    script = node_client.parent / "ui_complete.mjs"
    read = node_json(script, "ask_user", stdin=json.dumps(chunks))
    assert read == {
        "before": False,
        "after": True,
        "parts": [
            ["tool-lookup", "output-available", False],
            ["tool-book", "input-available", True],
            ["tool-ask_user", "output-available", False],  # as addToolOutput left it
        ],
    }


async def _asked_twice_events() -> list[Event]:
    """A call approved, then asking to be approved again in the message that continues
    (a tool over a limit), as a stream the hub keeps."""

    async def produce(publisher: Publisher) -> None:
        async with stream_turn(publisher, message_id="m1", stream_id="s", model="m") as turn:
            tools = await turn.tools()
            await tools.start_call("call_pay", "pay", '{"amount":5}')
            await turn.ask_approval("call_pay", request_id="apr_1")

    async def go_on(publisher: Publisher, answered: Answered) -> None:
        async with continue_turn(publisher, answered) as turn:
            await turn.ask_approval("call_pay", reason="over the limit", request_id="apr_2")

    async with StreamHub(on_answer=go_on) as hub:
        await hub.start("s", produce)
        await hub.wait("s")
        await hub.answer("s", [ToolApproval("apr_1", True)])
        await hub.wait("s")
        waiting = await hub.waiting("s")
        events, _ = await hub.store.since("s", None)
    assert waiting is not None
    assert [(r.id, r.tool_use_id, r.name) for r in waiting.requests] == [
        ("apr_2", "call_pay", "pay")
    ]
    assert check(events) == []
    return events


async def test_a_second_approval_of_an_earlier_call_names_it_in_every_openai_dialect() -> None:
    # The encoders knew only the message's own calls: the second approval went out
    # with an empty name and arguments.
    events = await _asked_twice_events()
    chunks = _datas(ChatCompletionsEncoder("chatcmpl-x"), events)
    approvals = [
        json.loads(call["function"]["arguments"])
        for chunk in chunks
        for choice in chunk.get("choices", ())
        for call in choice["delta"].get("tool_calls") or ()
        if call.get("function", {}).get("name") == "approve_tool_call"
    ]
    assert [(a["name"], a["arguments"]) for a in approvals][-1] == ("pay", '{"amount":5}')
    items = _datas(ResponsesEncoder("resp_x"), events)
    requests = [e["item"] for e in items if e["type"] == "response.output_item.done"]
    asked = [(i["name"], i["arguments"]) for i in requests if i["type"] == "mcp_approval_request"]
    assert asked[-1] == ("pay", '{"amount":5}')
