"""examples/pydantic_ai_app.py: the few-lines app, over a real server: useChat's request
asks for the approval, the answer on the protocol's route and through useChat's own next
request resumes the run, and the script starts with --port."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from essessey import Event, check, reassemble_events
from essessey.bindings.sse import SSEDecoder
from tests.processes import WAIT
from tests.servers import serve
from tests.test_examples import load_example
from tests.test_examples_apps import run_script


@pytest.fixture(scope="module")
def example() -> ModuleType:
    return load_example("pydantic_ai_app")


@pytest.fixture
def url(example: ModuleType) -> Iterator[str]:
    example.OUTBOX.clear()
    with serve(example.app, lifespan="on") as base:
        yield base


def chunks_of(body: bytes) -> list[dict[str, Any]]:
    return [
        json.loads(line.removeprefix(b"data: "))
        for line in body.split(b"\n")
        if line.startswith(b"data: {")
    ]


def user(text: str) -> dict[str, Any]:
    return {"id": "u1", "role": "user", "parts": [{"type": "text", "text": text}]}


def protocol_events(http: httpx.Client, stream_id: str) -> list[Any]:
    decoder = SSEDecoder()
    body = http.get(f"/streams/{stream_id}").content
    events = [
        Event(m.event, m.data.encode(), m.id or None)
        for m in decoder.feed(body)
        if m.event != "message"
    ]
    assert check(events) == []
    return events


def test_use_chat_asks_and_the_protocol_s_answer_sends_the_mail(
    example: ModuleType, url: str
) -> None:
    with httpx.Client(base_url=url, timeout=WAIT) as http:
        first = http.post(
            "/api/chat",
            json={
                "id": "chat-1",
                "messages": [user("Mail ada@example.com")],
                "trigger": "submit-message",
            },
        )
        chunks = chunks_of(first.content)
        [asked] = [c for c in chunks if c["type"] == "tool-approval-request"]
        assert asked["toolCallId"] == "call_send"
        outputs = [c for c in chunks if c["type"] == "tool-output-available"]
        assert [c["output"] for c in outputs] == [{"city": "Oslo", "celsius": 4}]
        assert example.OUTBOX == []
        # The UI stream's message id is the hub stream of the chat's turn.
        stream_id = chunks[0]["messageId"]
        answer = http.post(
            f"/streams/{stream_id}/answer",
            json={"answers": [{"id": asked["approvalId"], "approved": True}]},
        )
        assert answer.status_code == 200, answer.text
        parsed = reassemble_events(protocol_events(http, stream_id))
    assert example.OUTBOX == [{"to": "ada@example.com"}]
    assert [m.text for m in parsed.messages] == ["I drafted a mail to ada@example.com.", "Sent."]


def test_use_chat_s_own_answer_denies(example: ModuleType, url: str) -> None:
    with httpx.Client(base_url=url, timeout=WAIT) as http:
        first = http.post(
            "/api/chat",
            json={
                "id": "chat-2",
                "messages": [user("Mail bob@example.com")],
                "trigger": "submit-message",
            },
        )
        chunks = chunks_of(first.content)
        message_id = chunks[0]["messageId"]
        [asked] = [c for c in chunks if c["type"] == "tool-approval-request"]
        calls = [c for c in chunks if c["type"] == "tool-input-available"]
        parts: list[dict[str, Any]] = [{"type": "step-start"}]
        for call in calls:
            part = {
                "type": "tool-" + call["toolName"],
                "toolCallId": call["toolCallId"],
                "state": "input-available",
                "input": call["input"],
            }
            if call["toolCallId"] == asked["toolCallId"]:
                part["state"] = "approval-responded"
                part["approval"] = {"id": asked["approvalId"], "approved": False}
            parts.append(part)
        assistant = {"id": message_id, "role": "assistant", "parts": parts}
        rest = http.post(
            "/api/chat",
            json={
                "id": "chat-2",
                "messages": [user("Mail bob@example.com"), assistant],
                "trigger": "submit-message",
                "messageId": message_id,
            },
        )
        kinds = [c["type"] for c in chunks_of(rest.content)]
        assert "tool-output-denied" in kinds
        text = "".join(c["delta"] for c in chunks_of(rest.content) if c["type"] == "text-delta")
        assert text == "I did not send it."
        protocol_events(http, message_id)
    assert example.OUTBOX == []


@pytest.mark.slow  # the example as a server process of its own
def test_the_app_runs_as_a_script() -> None:
    with run_script("pydantic_ai_app") as base, httpx.Client(base_url=base, timeout=WAIT) as http:
        reply = http.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "Mail a@b.co"}]},
        ).json()
    assert reply["choices"][0]["message"]["content"] == "I drafted a mail to a@b.co."
    assert reply["choices"][0]["finish_reason"] == "tool_calls"


# -- against Pydantic AI's own VercelAIAdapter (docs/pydantic_ai.md) ---------------------------

ROOT = Path(__file__).resolve().parent.parent
_INTEGRATION_IMPORTS = re.compile(r"^from (fastapi|starlette|essessey|pydantic_ai\.ui)\b")
LINES = {"essessey": 8, "VercelAIAdapter": 8}
"""The lines a user writes for the app each way, as docs/pydantic_ai.md gives them."""


def integration_lines(path: Path) -> int:
    """The imports of the web framework and the integration, and the code between the
    integration markers, blank lines and comments left out."""
    count = 0
    inside = False
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped == "# integration: begin":
            inside = True
        elif stripped == "# integration: end":
            inside = False
        elif _INTEGRATION_IMPORTS.match(stripped) or (
            inside and stripped and not stripped.startswith("#")
        ):
            count += 1
    return count


def test_the_lines_a_user_writes_are_the_docs_count() -> None:
    assert integration_lines(ROOT / "examples" / "pydantic_ai_app.py") == LINES["essessey"]
    vercel = ROOT / "tests" / "pydantic_ai_vercel_app.py"
    assert integration_lines(vercel) == LINES["VercelAIAdapter"]
    docs = (ROOT / "docs" / "pydantic_ai.md").read_text()
    assert f"| lines you write | {LINES['essessey']} | {LINES['VercelAIAdapter']} |" in docs


def test_the_vercel_ai_adapter_app_asks_too() -> None:
    from tests import pydantic_ai_vercel_app

    body = {
        "trigger": "submit-message",
        "id": "chat-v",
        "messages": [user("Mail ada@example.com")],
    }
    with (
        serve(pydantic_ai_vercel_app.app) as base,
        httpx.Client(base_url=base, timeout=WAIT) as http,
    ):
        chunks = chunks_of(http.post("/api/chat", json=body).content)
        # What it does not serve: the reconnect useChat's resume asks for.
        assert http.get("/api/chat/chat-v/stream").status_code in (404, 405)
    [asked] = [c for c in chunks if c["type"] == "tool-approval-request"]
    assert asked["toolCallId"] == "call_send"
