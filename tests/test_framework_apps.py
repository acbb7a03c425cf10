"""examples/openai_agents_app.py and examples/langgraph_app.py served by real uvicorn: the
agent's turn asks to approve its ``send_email`` call (the Agents SDK's ``needs_approval``, an
``interrupt()`` in the graph's tool); approved through the AI SDK's UI stream (useChat's
second POST) and AG-UI's ``resume``, denied through Chat Completions (the openai SDK's tool
messages), and each example run as a script. The two apps do the same, each on its
framework, so each test runs on both."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from essessey import check, reassemble_events
from essessey.bindings.sse import SSEDecoder
from tests.processes import WAIT, free_port, node_json, stop_process, wait_for_port
from tests.servers import serve
from tests.test_examples import EXAMPLES, load_example

pytestmark = pytest.mark.anyio
NODE = Path(__file__).parent / "node"
APPS = ["openai_agents_app", "langgraph_app"]


@pytest.fixture(params=APPS)
def app(request: pytest.FixtureRequest) -> Iterator[tuple[Any, str]]:
    example = load_example(request.param)
    with serve(example.app, lifespan="on") as url:
        yield example, url


def sse_data(body: bytes) -> list[dict[str, Any]]:
    decoder = SSEDecoder()
    events = decoder.feed(body) + decoder.close()
    return [json.loads(e.data) for e in events if e.data and e.data not in ("[DONE]", b"[DONE]")]


async def test_use_chat_approves_and_the_mail_is_sent(app: tuple[Any, str]) -> None:
    example, url = app
    example.OUTBOX.clear()
    chat_id = example.__name__ + "-chat-1"
    user = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "mail ada@example.com"}]}
    async with httpx.AsyncClient(timeout=WAIT) as http:
        first = await http.post(f"{url}/api/chat", json={"id": chat_id, "messages": [user]})
        assert first.status_code == 200
        chunks = sse_data(first.content)
        [request] = [c for c in chunks if c["type"] == "tool-approval-request"]
        [call] = [c for c in chunks if c["type"] == "tool-input-available"]
        assert call["toolName"] == "send_email"
        assert call["input"] == {"to": "ada@example.com", "subject": "Hello"}
        assert example.OUTBOX == []
        assistant = {
            "id": "a1",
            "role": "assistant",
            "parts": [
                {"type": "text", "text": "I drafted a mail to ada@example.com."},
                {
                    "type": "tool-send_email",
                    "toolCallId": call["toolCallId"],
                    "state": "approval-responded",
                    "input": call["input"],
                    "approval": {"id": request["approvalId"], "approved": True},
                },
            ],
        }
        second = await http.post(
            f"{url}/api/chat", json={"id": chat_id, "messages": [user, assistant]}
        )
        assert second.status_code == 200
        said = sse_data(second.content)
    # The chat's turn runs on a stream of its own, which the chat's turn log names.
    turns, _ = await example.hub.store.since(chat_id + "~turns", None)
    events, _ = await example.hub.store.since(turns[-1].data.decode(), None)
    assert example.OUTBOX == ["ada@example.com"]
    outputs = [c for c in said if c["type"] == "tool-output-available"]
    assert [o["output"] for o in outputs] == ["sent to ada@example.com"]
    assert "Sent." in "".join(c.get("delta", "") for c in said if c["type"] == "text-delta")
    assert check(events) == []
    first_message, continuation = reassemble_events(events).messages
    assert first_message.text == "I drafted a mail to ada@example.com."
    assert continuation.text == "Sent."
    if example.__name__ == "example_langgraph_app":
        # The graph's own state says the same: its thread is the chat's id.
        snapshot = await example.graph.aget_state({"configurable": {"thread_id": chat_id}})
        assert snapshot.values["messages"][-1].content == "Sent."


async def test_chat_completions_denies_and_nothing_is_sent(app: tuple[Any, str]) -> None:
    example, url = app
    example.OUTBOX.clear()
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as sdk:
        messages: list[Any] = [{"role": "user", "content": "mail bob@example.com"}]
        first = await sdk.chat.completions.create(model="m", messages=messages)
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls"
        [approve] = choice.message.tool_calls or []
        assert approve.function.name == "approve_tool_call"  # type: ignore[union-attr]
        messages += [
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": approve.id, "content": '{"approved": false}'},
        ]
        second = await sdk.chat.completions.create(model="m", messages=messages)
    assert second.choices[0].message.content == "I did not send it."
    assert example.OUTBOX == []


async def test_ag_ui_resumes_the_approval(app: tuple[Any, str]) -> None:
    example, url = app
    example.OUTBOX.clear()
    body: dict[str, Any] = {
        "threadId": "thread-1",
        "runId": "run-1",
        "messages": [{"id": "u1", "role": "user", "content": "mail eve@example.com"}],
        "tools": [],
        "context": [],
        "state": {},
        "forwardedProps": {},
    }
    async with httpx.AsyncClient(timeout=WAIT) as http:
        first = sse_data((await http.post(f"{url}/agui", json=body)).content)
        [interrupt] = first[-1]["outcome"]["interrupts"]
        if example.__name__ == "example_langgraph_app":
            # The reason request_approval gives (the Agents example gives none).
            assert interrupt["message"] == "sends an email on your behalf"
        resume = {
            **body,
            "runId": "run-2",
            "resume": [{"interruptId": interrupt["id"], "status": "resolved"}],
        }
        second = sse_data((await http.post(f"{url}/agui", json=resume)).content)
    assert example.OUTBOX == ["eve@example.com"]
    text = "".join(e["delta"] for e in second if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == "Sent."


@pytest.mark.slow  # the example as a server process of its own
@pytest.mark.parametrize("name", APPS)
def test_the_example_runs_as_a_script(name: str) -> None:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(EXAMPLES / f"{name}.py"), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for_port(port, process, f"examples/{name}.py")
        reply = httpx.post(
            f"http://127.0.0.1:{port}/v1/responses",
            json={"model": "m", "input": "mail eve@example.com"},
            timeout=WAIT,
        )
        assert reply.status_code == 200
        kinds = [item["type"] for item in reply.json()["output"]]
        assert kinds == ["message", "mcp_approval_request"]
    finally:
        stop_process(process)


@pytest.mark.slow
@pytest.mark.parametrize("action", ["approve", "deny"])
def test_the_ai_sdk_s_own_chat_approves_and_denies(
    node_client: Path, app: tuple[Any, str], action: str
) -> None:
    """The AI SDK's ``Chat`` (what ``useChat`` runs; tests/node/ui_asking.mjs) answers the
    approval with ``addToolApprovalResponse`` and reads the same message go on."""
    example, url = app
    example.OUTBOX.clear()
    chat_id = f"{example.__name__}-{action}"
    result = node_json(NODE / "ui_asking.mjs", url, chat_id, "send", "mail ada@x.io", action)
    assert (result["status"], result["error"], result["errors"]) == ("ready", None, [])
    _, answer = result["messages"]  # one assistant message, continued
    [call] = [p for p in answer["parts"] if p["type"] == "tool-send_email"]
    texts = [p["text"] for p in answer["parts"] if p["type"] == "text"]
    if action == "approve":
        assert call["state"] == "output-available"
        assert call["output"] == "sent to ada@x.io"
        assert texts[-1] == "Sent."
        assert example.OUTBOX == ["ada@x.io"]
    else:
        assert call["state"] == "output-denied"
        assert texts[-1] == "I did not send it."
        assert example.OUTBOX == []
