"""One reading of any dialect's request (conversation, user_text) and one call that serves a
turn factory to every dialect (dialect_routes), against real uvicorn and real clients."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import openai
import pytest
from starlette.applications import Starlette

import essessey
from essessey.dialects import (
    ConversationMessage,
    DialectRequest,
    conversation,
    dialect_routes,
    user_text,
)
from essessey.dialects.agui import AGUIRunRequest
from essessey.dialects.chat_completions import ChatCompletionRequest
from essessey.dialects.responses import ResponsesRequest
from essessey.dialects.ui import ChatRequest
from tests.servers import serve

pytestmark = pytest.mark.anyio

SAID = [
    ConversationMessage("system", "Be brief."),
    ConversationMessage("user", "Hi"),
    ConversationMessage("assistant", "Hello!"),
    ConversationMessage("user", "What is 2+2?"),
]


def ui() -> ChatRequest:
    messages: list[dict[str, Any]] = [
        {"id": "s", "role": "system", "parts": [{"type": "text", "text": "Be brief."}]},
        {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "Hi"}]},
        {
            "id": "a1",
            "role": "assistant",
            "parts": [
                {"type": "step-start"},
                {"type": "reasoning", "text": "greet"},
                {"type": "text", "text": "Hello"},
                {"type": "tool-lookup", "toolCallId": "c1", "state": "output-available"},
                {"type": "text", "text": "!"},
            ],
        },
        {
            "id": "u2",
            "role": "user",
            "parts": [{"type": "text", "text": "What is "}, {"type": "text", "text": "2+2?"}],
        },
    ]
    return ChatRequest("chat1", messages, "submit-message")


def agui() -> AGUIRunRequest:
    messages = [
        {"id": "1", "role": "developer", "content": "Be brief."},
        {"id": "2", "role": "user", "content": "Hi"},
        {"id": "3", "role": "assistant", "content": "Hello!", "toolCalls": []},
        {"id": "4", "role": "tool", "content": "42", "toolCallId": "c1"},
        {"id": "5", "role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]},
    ]
    return AGUIRunRequest("run1", "t1", "r1", messages)


def chat() -> ChatCompletionRequest:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        {"role": "assistant", "content": "Hello!"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is 2+2?"},
                {"type": "image_url", "image_url": {"url": "data:,"}},
            ],
        },
    ]
    return ChatCompletionRequest("chatcmpl-1", "m", messages)


def responses() -> ResponsesRequest:
    items: list[Any] = [
        {"role": "user", "content": "Hi"},
        {"type": "reasoning", "summary": []},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Hello!"}],
        },
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
        {"role": "user", "content": [{"type": "input_text", "text": "What is 2+2?"}]},
    ]
    return ResponsesRequest("resp_1", "m", items, body={"instructions": "Be brief."})


@pytest.mark.parametrize("make", [ui, agui, chat, responses])
def test_every_dialect_reads_as_the_same_conversation(make: Any) -> None:
    request = make()
    assert conversation(request) == SAID
    assert user_text(request) == "What is 2+2?"


def test_a_responses_string_input_is_the_user_s_message() -> None:
    request = ResponsesRequest("resp_1", "m", "Hello there")
    assert conversation(request) == [ConversationMessage("user", "Hello there")]
    assert user_text(request) == "Hello there"


def test_bad_messages_are_skipped_with_a_reason_never_their_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    messages: list[Any] = [
        "a secret string",
        {"role": 7, "content": "a secret"},
        {"role": "narrator", "content": "a secret"},
        {"role": "user", "content": {"not": "a list"}},
        {"role": "user", "content": [{"type": "text", "text": 5}, "x", {"type": "text"}]},
    ]
    with caplog.at_level(logging.WARNING, logger="essessey.dialects"):
        assert conversation(ChatCompletionRequest("chatcmpl-1", "m", messages)) == []
    assert user_text(AGUIRunRequest("r", "t", "r", messages)) == ""
    assert len(caplog.records) >= 3
    assert "secret" not in caplog.text


def echo(request: DialectRequest) -> essessey.TurnProducer:
    """A turn that says back the user's last words and how many messages it read."""
    said = f"{user_text(request)} ({len(conversation(request))})"

    async def produce(publisher: essessey.Publisher) -> None:
        async with essessey.stream_turn(
            publisher, message_id="msg_echo", stream_id=request.id, model="echo"
        ) as turn:
            await (await turn.text()).write(said)

    return produce


async def test_dialect_routes_serve_one_factory_to_every_client() -> None:
    hub = essessey.StreamHub()
    app = Starlette(routes=list(dialect_routes(hub, echo)), lifespan=hub.lifespan)
    with serve(app, lifespan="on") as base:
        # Closed within the test's own loop: a client left to the garbage collector
        # closes its connections on whatever loop runs then, or on a closed one.
        async with openai.AsyncOpenAI(base_url=base + "/v1", api_key="none") as client:
            completion = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "one"}]
            )
            assert completion.choices[0].message.content == "one (1)"
            response = await client.responses.create(
                model="m", input="two", instructions="Be brief."
            )
            assert response.output_text == "two (2)"
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            body = {
                "id": "chat1",
                "trigger": "submit-message",
                "messages": [{"id": "u", "role": "user", "parts": [{"type": "text", "text": "3"}]}],
            }
            reply = await http.post("/api/chat", json=body)
            deltas = [
                json.loads(line[6:])
                for line in reply.text.splitlines()
                if line.startswith("data: {")
            ]
            text = "".join(d["delta"] for d in deltas if d["type"] == "text-delta")
            assert text == "3 (1)"
            run = {
                "threadId": "t1",
                "runId": "r1",
                "messages": [{"id": "m1", "role": "user", "content": "four"}],
                "tools": [],
                "context": [],
                "state": {},
                "forwardedProps": {},
            }
            reply = await http.post("/agui", json=run, headers={"accept": "text/event-stream"})
            events = [
                json.loads(line[6:])
                for line in reply.text.splitlines()
                if line.startswith("data: ")
            ]
            agui_text = "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
            assert agui_text == "four (1)"
            assert events[-1]["type"] == "RUN_FINISHED"
            # The protocol's own SSE serves the same hub: the Chat Completions turn, read
            # back whole by its id.
            stored = await http.get(f"/streams/{completion.id}")
            assert stored.status_code == 200
            assert "one (1)" in "".join(
                json.loads(line[6:]).get("delta", {}).get("text", "")
                for line in stored.text.splitlines()
                if line.startswith("data: {")
            )


async def test_a_field_of_the_wrong_json_type_is_a_400_on_every_route() -> None:
    # A list or an object where a name was expected (a role, a trigger, a resume status,
    # a part's type) was looked up in a set of names: TypeError, a 500.

    async def never(publisher: essessey.Publisher, answered: Any) -> None:
        raise AssertionError("no answer here is valid")

    hub = essessey.StreamHub(on_answer=never)  # AG-UI reads resume entries with one
    app = Starlette(routes=list(dialect_routes(hub, echo)), lifespan=hub.lifespan)
    user = {"id": "u", "role": "user", "parts": [{"type": "text", "text": "hi"}]}
    bodies = {
        "/api/chat": {"id": "chat1", "trigger": ["x"], "messages": [user]},
        "/v1/chat/completions": {"model": "m", "messages": [{"role": ["user"]}]},
        "/agui": {
            "threadId": "t",
            "runId": "r",
            "messages": [],
            "resume": [{"interruptId": "i", "status": {"x": 1}}],
        },
    }
    with serve(app, lifespan="on") as base:
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            for path, body in bodies.items():
                reply = await http.post(path, json=body)
                assert reply.status_code == 400, (path, reply.status_code)
            # A content part whose type is not a name is no text, not a failure.
            body = {"model": "m", "messages": [{"role": "user", "content": [{"type": [1]}]}]}
            reply = await http.post("/v1/chat/completions", json=body)
            assert reply.status_code == 200
            assert reply.json()["choices"][0]["message"]["content"] == " (0)"
