"""useChat's chat transport, the AI SDK's own (Node's ``ai`` package, tests/node), against
essessey's UI message stream routes on a real uvicorn server."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from essessey import Event, StreamHub
from essessey.dialects.ui import DONE, UIMessageEncoder
from tests.processes import WAIT, node_json
from tests.scripted_turn import SIGNATURE, THINKING
from tests.servers import serve
from tests.ui_app import create_app

"""Seconds a Node client may take before the test fails."""


@pytest.fixture
def base_url() -> Iterator[str]:
    with serve(create_app(), lifespan="on") as url:
        yield url


def chat(script: Path, base: str, mode: str, chat_id: str, arg: Any) -> dict[str, Any]:
    result: dict[str, Any] = node_json(script, base, mode, chat_id, json.dumps(arg))
    return result


def parts_of(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The parts the app renders, without the SDK's bookkeeping fields."""
    keep = ("type", "text", "state", "toolCallId", "input", "output", "errorText")
    return [{k: part[k] for k in keep if k in part} for part in message["parts"]]


WHOLE_TURN = [
    {"type": "step-start"},
    {"type": "reasoning", "text": "Two cities, two calls.", "state": "done"},
    {"type": "text", "text": "Let me check both.", "state": "done"},
    {
        "type": "tool-get_weather",
        "toolCallId": "call_paris",
        "state": "output-available",
        "input": {"city": "Paris"},
        "output": {"temp_c": 18},
    },
    {
        "type": "tool-get_weather",
        "toolCallId": "call_oslo",
        "state": "output-error",
        "input": {"city": "Oslo"},
        "errorText": "station offline",
    },
    {"type": "step-start"},
    {"type": "text", "text": "Paris is 18 degrees.", "state": "done"},
]


def test_use_chat_receives_the_whole_turn(node_client: Path, base_url: str) -> None:
    result = chat(node_client, base_url, "send", "chat-1", {})
    assert (result["status"], result["error"], result["errors"]) == ("ready", None, [])
    assert result["finishes"] == [
        {"isAbort": False, "isDisconnect": False, "isError": False, "finishReason": "stop"}
    ]
    user, answer = result["messages"]
    assert user["role"] == "user"
    assert answer["role"] == "assistant"
    assert answer["id"].startswith("chat-1~")
    assert parts_of(answer) == WHOLE_TURN
    # The reasoning's signature stays on its part, and goes back to a model with it.
    signed = {"essessey": {"signature": SIGNATURE}}
    assert answer["parts"][1]["providerMetadata"] == signed
    reasoning = result["modelMessages"][1]["content"][0]
    assert reasoning == {"type": "reasoning", "text": THINKING, "providerOptions": signed}
    # The finish's token counts reach the app as the message's metadata.
    usage = answer["metadata"]["usage"]
    # The shape of ai's own LanguageModelUsage.
    assert set(usage) == {
        "inputTokens",
        "inputTokenDetails",
        "outputTokens",
        "outputTokenDetails",
        "totalTokens",
    }
    assert set(usage["inputTokenDetails"]) == {
        "noCacheTokens",
        "cacheReadTokens",
        "cacheWriteTokens",
    }
    assert set(usage["outputTokenDetails"]) == {"textTokens", "reasoningTokens"}
    assert usage["totalTokens"] == usage["inputTokens"] + usage["outputTokens"] > 0


def test_a_reconnect_mid_turn_ends_with_the_same_message(node_client: Path, base_url: str) -> None:
    body = {"id": "chat-2", "messages": [{"id": "u1", "role": "user", "parts": []}]}
    body["trigger"] = "submit-message"
    body["delay_ms"] = 150
    body["hold_for_resume"] = True  # the turn waits for Node's resume before its second round
    message_id = None
    with httpx.stream("POST", base_url + "/api/chat", json=body, timeout=WAIT) as response:
        assert response.status_code == 200
        assert response.headers["x-vercel-ai-ui-message-stream"] == "v1"
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[len("data: ") :])
            if chunk["type"] == "start":
                message_id = chunk["messageId"]
            if chunk["type"] == "text-delta":
                break  # the connection drops mid-turn; the turn goes on
    assert message_id is not None
    persisted = [
        {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi"}]},
        {
            "id": message_id,
            "role": "assistant",
            "parts": [
                {"type": "step-start"},
                {"type": "text", "text": "Let ", "state": "streaming"},
            ],
        },
    ]
    result = chat(node_client, base_url, "resume", "chat-2", persisted)
    assert (result["status"], result["errors"]) == ("ready", [])
    assert [m["id"] for m in result["messages"]] == ["u1", message_id]  # replaced, not added
    assert parts_of(result["messages"][1]) == WHOLE_TURN
    assert result["finishes"][0]["finishReason"] == "stop"
    # Finished now: the reconnect is a 204, as the AI SDK's resume contract has it, so a
    # reload shows the message the app saved, once, and the SDK adds nothing.
    assert httpx.get(base_url + "/api/chat/chat-2/stream", timeout=WAIT).status_code == 204
    saved = [persisted[0], result["messages"][1]]
    again = chat(node_client, base_url, "resume", "chat-2", saved)
    assert (again["status"], again["finishes"]) == ("ready", [])
    assert again["messages"] == saved


def test_replay_finished_gives_a_finished_turn_again(node_client: Path) -> None:
    with serve(create_app(replay_finished=True), lifespan="on") as url:
        sent = chat(node_client, url, "send", "chat-r", {})
        persisted = [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}]
        again = chat(node_client, url, "resume", "chat-r", persisted)
    assert parts_of(sent["messages"][1]) == WHOLE_TURN
    assert parts_of(again["messages"][1]) == WHOLE_TURN
    assert len(again["messages"]) == 2


def test_a_chat_without_a_turn_resumes_nothing(node_client: Path, base_url: str) -> None:
    assert httpx.get(base_url + "/api/chat/nobody/stream").status_code == 204
    persisted = [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}]
    result = chat(node_client, base_url, "resume", "nobody", persisted)
    assert (result["status"], result["finishes"], result["messages"]) == ("ready", [], persisted)


def test_a_head_of_the_stream_route_answers_at_once(base_url: str) -> None:
    body = {"id": "chat-h", "messages": [{"id": "u1", "role": "user", "parts": []}]}
    body["trigger"] = "submit-message"
    # Two seconds between deltas: the turn outlasts what the test does, which ends it.
    body["delay_ms"] = 2000
    with httpx.stream("POST", base_url + "/api/chat", json=body, timeout=WAIT) as response:
        for line in response.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["type"] == "text-delta":
                break  # the turn is under way, and goes on
    head = httpx.head(base_url + "/api/chat/chat-h/stream", timeout=WAIT)
    # The turn still runs when the HEAD has its answer: it did not wait for the turn.
    stop = httpx.post(base_url + "/api/chat/chat-h/stop", timeout=WAIT)
    nobody = httpx.head(base_url + "/api/chat/nobody/stream", timeout=WAIT)
    assert (head.status_code, head.content) == (200, b"")
    assert head.headers["content-type"].startswith("text/event-stream")
    assert head.headers["x-vercel-ai-ui-message-stream"] == "v1"
    assert stop.status_code == 204
    assert nobody.status_code == 204


def test_a_provider_error_reaches_use_chat_as_an_error(node_client: Path, base_url: str) -> None:
    result = chat(node_client, base_url, "send", "chat-3", {"fail": True})
    assert result["status"] == "error"
    assert result["error"] == "the provider is overloaded"
    assert result["finishes"][0]["isError"] is True
    texts = [p for p in result["messages"][1]["parts"] if p["type"] == "text"]
    assert texts[0]["text"] == "Let me check both."


def test_a_cancelled_turn_ends_as_an_abort(node_client: Path, base_url: str) -> None:
    client = subprocess.Popen(
        ["node", str(node_client), base_url, "send", "chat-4", json.dumps({"delay_ms": 300})],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(int(WAIT / 0.05)):  # until the turn runs: 404 before
            stopped = httpx.post(base_url + "/api/chat/chat-4/stop")
            if stopped.status_code == 204:
                break
            assert stopped.status_code == 404
            assert client.poll() is None, "the client ended before the turn ran"
            time.sleep(0.05)
        else:
            pytest.fail("the turn never ran")
        out, _ = client.communicate(timeout=WAIT)
    finally:
        client.kill()
    result = json.loads(out)
    assert (result["status"], result["errors"]) == ("ready", [])
    assert result["finishes"] == [
        {"isAbort": False, "isDisconnect": False, "isError": False, "finishReason": None}
    ]
    assert httpx.post(base_url + "/api/chat/chat-4/stop").status_code == 404  # ended


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b'{"messages":[]}',
        b'{"id":"a b","messages":[]}',
        b'{"id":"c"}',
        b'{"id":"c","messages":[{"role":"robot"}]}',
        b'{"id":"c","messages":[],"trigger":"x"}',
    ],
)
def test_a_bad_chat_request_is_a_400_with_a_json_error(base_url: str, body: bytes) -> None:
    response = httpx.post(base_url + "/api/chat", content=body)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_use_chat_with_default_options_works_against_the_demo(node_client: Path) -> None:
    from essessey.demo import create_app as demo_app

    with serve(demo_app(), lifespan="on") as url:
        result = chat(node_client, url, "send", "demo-chat", {"deltas": 20, "delay_ms": 0})
        bad = httpx.post(url + "/api/chat", json={"id": "c", "messages": [], "delay_ms": -1})
    assert (result["status"], result["errors"]) == ("ready", [])
    assert result["finishes"][0]["finishReason"] == "stop"
    kinds = [part["type"] for part in result["messages"][1]["parts"]]
    # The demo's turn: thinking, text, two parallel calls and their results, the answer.
    # A step per model round, as streamText writes it, though the demo's two rounds are
    # one protocol message.
    assert kinds == [
        "step-start",
        "reasoning",
        "text",
        "tool-get_weather",
        "tool-get_weather",
        "step-start",
        "text",
    ]
    tools = [p for p in result["messages"][1]["parts"] if p["type"].startswith("tool-")]
    assert all(p["state"] in ("output-available", "output-error") for p in tools)
    assert bad.status_code == 400
    assert "delay_ms" in bad.json()["error"]["message"]


def every_kind_of_chunk() -> list[dict[str, Any]]:
    """The chunks of turns that use every part the encoder writes."""
    head = b'{"type":"message_start","message":{"id":"m"}}'
    events = [
        Event("message_start", head),
        Event(
            "content_block_start",
            b'{"index":0,"content_block":{"type":"tool_use","id":"c","name":"t","input":{}}}',
        ),
        Event(
            "content_block_delta",
            b'{"index":0,"delta":{"type":"input_json_delta","partial_json":"{nope"}}',
        ),
        Event("content_block_stop", b'{"index":0}'),
        Event("content_block_start", b'{"index":1,"content_block":{"type":"citation","n":1}}'),
        Event("content_block_stop", b'{"index":1}'),
        Event(
            "content_block_start",
            b'{"index":2,"content_block":{"type":"tool_result","tool_use_id":"c"}}',
        ),
        Event(
            "content_block_delta",
            b'{"index":2,"delta":{"type":"json_partial","text":"plain text"}}',
        ),
        Event("content_block_stop", b'{"index":2}'),
        Event("message_stop", b"{}"),
    ]
    chunks: list[dict[str, Any]] = []
    for reason in ("end_turn", "tool_use", "max_tokens", "refusal", "pause_turn", "cancelled"):
        encoder = UIMessageEncoder()
        ending = Event("message_delta", b'{"delta":{"stop_reason":"%s"}}' % reason.encode())
        lines = [line for e in [*events[:-1], ending, events[-1]] for line in encoder.feed(e)]
        lines.append(encoder.close().removesuffix(DONE))
        for line in b"".join(lines).split(b"\n\n")[:-1]:
            chunks.append(json.loads(line.removeprefix(b"data: ")))
    failing = UIMessageEncoder()
    failing.feed(Event("message_start", head))
    (error,) = failing.feed(Event("error", b'{"error":{"type":"api_error","message":"x"}}'))
    chunks.append(json.loads(error.removeprefix(b"data: ")))
    return chunks


def test_the_ai_sdks_schema_accepts_every_chunk_the_encoder_writes(node_client: Path) -> None:
    chunks = every_kind_of_chunk()
    kinds = {chunk["type"] for chunk in chunks}
    assert {"tool-input-error", "custom", "tool-output-available", "abort"} <= kinds
    assert {"error", "finish"} <= kinds
    controls = [{"type": "bogus"}, {"type": "finish", "finishReason": "unknown"}]
    verdicts = node_json(
        node_client.parent / "validate.mjs", stdin=json.dumps([*chunks, *controls])
    )
    assert verdicts[: len(chunks)] == [None] * len(chunks)
    assert all(verdict is not None for verdict in verdicts[len(chunks) :])  # it can refuse


def test_the_authorize_hook_is_asked_with_the_chat_id_for_each_route() -> None:
    asked: list[tuple[str, str]] = []

    def authorize(request: object, chat_id: str, access: str) -> bool:
        asked.append((chat_id, access))
        return chat_id == "mine"

    body = {"messages": [], "trigger": "submit-message"}
    with serve(create_app(StreamHub(authorize=authorize)), lifespan="on") as url:
        for chat_id, status in (("theirs", 403), ("mine", 200)):
            assert httpx.post(url + "/api/chat", json={**body, "id": chat_id}).status_code == status
        assert httpx.get(url + "/api/chat/theirs/stream").status_code == 403
        assert httpx.post(url + "/api/chat/theirs/stop").status_code == 403
        forbidden = httpx.post(url + "/api/chat", json={**body, "id": "theirs"})
    assert forbidden.json()["error"]["type"] == "permission_error"
    assert asked[:4] == [
        ("theirs", "read"),
        ("mine", "read"),
        ("theirs", "resume"),
        ("theirs", "cancel"),
    ]
