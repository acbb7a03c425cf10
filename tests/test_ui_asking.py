"""A turn that asks, served as the AI SDK's UI message stream (docs/ui.md, "Approvals,
client tools and questions"): the asking turn ends on a ``tool-approval-request`` or a
call the client runs (a question is a call of ``ask_user``); the chat request that
carries the answers (tool parts ``approval-responded``, ``output-available``) continues
the turn, and its stream is the rest of the same assistant message. Over a real uvicorn
server, with the AI SDK's own ``Chat`` (Node, tests/node/ui_asking.mjs) and its chunk
schema."""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from starlette.applications import Starlette

from essessey import Answered, Event, Publisher, StreamHub, continue_turn, stream_turn
from essessey.dialects.ui import DONE, ChatRequest, UIMessageEncoder, ui_chat_routes
from essessey.hub import TurnProducer
from tests.processes import WAIT, node_json
from tests.servers import serve

NODE = Path(__file__).parent / "node"
SCHEMA = {"enum": ["C", "F"]}


def user_text(chat: ChatRequest) -> str:
    users = [m for m in chat.messages if m.get("role") == "user"]
    parts = users[-1].get("parts", []) if users else []
    return "".join(p.get("text", "") for p in parts if p.get("type") == "text")


def asking_turn(chat: ChatRequest) -> TurnProducer:
    """Asks what the last user message names: ``approval`` (of its call ``pay``, after a
    ``lookup`` it ran), ``client`` (``get_location``, run by the client), ``question``
    (a unit); anything else is answered at once."""
    asks = user_text(chat)
    suffix = secrets.token_hex(4)

    async def produce(publisher: Publisher) -> None:
        async with stream_turn(
            publisher, message_id="msg_" + suffix, stream_id=chat.id, model="m"
        ) as turn:
            await (await turn.text()).write("Let me see.")
            if "client" in asks:
                await turn.call_client_tool(
                    "get_location", {"precise": True}, tool_use_id="call_loc_" + suffix
                )
            if "approval" in asks:
                tools = await turn.tools()
                await tools.start_call("call_lookup_" + suffix, "lookup", '{"q":"x"}')
                await tools.start_call("call_pay_" + suffix, "pay", '{"usd":5}')
                await tools.write_result("call_lookup_" + suffix, '{"found":true}')
                await turn.ask_approval(
                    "call_pay_" + suffix, reason="spends money", request_id="apr_" + suffix
                )
            if "question" in asks:
                await turn.ask("Which unit?", schema=SCHEMA, request_id="q_" + suffix)

    return produce


async def go_on(publisher: Publisher, answered: Answered, runs: list[str]) -> None:
    runs.append(answered.stream_id)
    said: list[str] = []
    async with continue_turn(publisher, answered) as turn:
        for call, output in answered.tool_outputs():
            said.append(f"{call.name}={output.text}{' (error)' if output.is_error else ''}")
        for request, approval in answered.approvals():
            if approval.approved:
                await turn.tool_result(request.tool_use_id, {"paid": True})
                said.append("paid")
            else:
                # The model's record of the denial: the UI part stays denied.
                await turn.tool_result(request.tool_use_id, "denied", is_error=True)
                said.append(f"not paid ({approval.reason})")
        for _, answer in answered.questions():
            said.append(f"unit={json.dumps(answer.value)}")
        await (await turn.text()).write("Done: " + ", ".join(said))


@dataclass
class App:
    url: str
    runs: list[str] = field(default_factory=list)


@pytest.fixture
def app() -> Iterator[App]:
    runs: list[str] = []

    async def continuation(publisher: Publisher, answered: Answered) -> None:
        await go_on(publisher, answered, runs)

    hub = StreamHub(on_answer=continuation)
    routes = list(ui_chat_routes(hub, asking_turn))
    with serve(Starlette(routes=routes, lifespan=hub.lifespan), lifespan="on") as url:
        yield App(url, runs)


# -- the wire, read as the chunks -------------------------------------------------------------


def chunks_of(body: bytes) -> list[dict[str, Any]]:
    assert body.endswith(DONE)
    return [
        json.loads(line.removeprefix(b"data: "))
        for message in body.split(b"\n\n")
        for line in message.split(b"\n")
        if line.startswith(b"data: {")
    ]


def user(text: str) -> dict[str, Any]:
    return {"id": "u1", "role": "user", "parts": [{"type": "text", "text": text}]}


def post(url: str, chat_id: str, messages: list[dict[str, Any]]) -> httpx.Response:
    body = {"id": chat_id, "messages": messages, "trigger": "submit-message"}
    if messages[-1]["role"] == "assistant":
        body["messageId"] = messages[-1]["id"]
    return httpx.post(url + "/api/chat", json=body, timeout=WAIT)


def ask(url: str, chat_id: str, text: str) -> tuple[str, list[dict[str, Any]]]:
    """The first request: the assistant message's id and its chunks."""
    response = post(url, chat_id, [user(text)])
    assert response.status_code == 200
    chunks = chunks_of(response.content)
    assert chunks[0]["type"] == "start"
    return chunks[0]["messageId"], chunks


def of_type(chunks: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [c for c in chunks if c["type"] == kind]


def asking_message(message_id: str, chunks: list[dict[str, Any]], **states: Any) -> Any:
    """The assistant message the client sends back, its tool parts as the answers left
    them: ``states`` maps a call id to the part's new fields."""
    parts: list[dict[str, Any]] = [{"type": "step-start"}]
    for chunk in of_type(chunks, "tool-input-available"):
        part = {
            "type": "tool-" + chunk["toolName"],
            "toolCallId": chunk["toolCallId"],
            "state": "input-available",
            "input": chunk["input"],
        }
        for output in of_type(chunks, "tool-output-available"):
            if output["toolCallId"] == chunk["toolCallId"]:
                part.update(state="output-available", output=output["output"])
        for request in of_type(chunks, "tool-approval-request"):
            if request["toolCallId"] == chunk["toolCallId"]:
                part.update(state="approval-requested", approval={"id": request["approvalId"]})
        part.update(states.get(chunk["toolCallId"], {}))
        parts.append(part)
    return {"id": message_id, "role": "assistant", "parts": parts}


def approved(chunks: list[dict[str, Any]], yes: bool, reason: str | None = None) -> Any:
    (request,) = of_type(chunks, "tool-approval-request")
    approval = {"id": request["approvalId"], "approved": yes}
    if reason is not None:
        approval["reason"] = reason
    return {request["toolCallId"]: {"state": "approval-responded", "approval": approval}}


def validate(chunks: list[dict[str, Any]]) -> None:
    """Every chunk passes the AI SDK's own chunk schema."""
    assert node_json(NODE / "validate.mjs", stdin=json.dumps(chunks)) == [None] * len(chunks)


def test_an_approval_is_asked_and_the_approved_call_continues_the_message(
    node_client: Path, app: App
) -> None:
    message_id, first = ask(app.url, "chat-a", "approval please")
    assert message_id.startswith("chat-a~")
    (request,) = of_type(first, "tool-approval-request")
    assert request["approvalId"].startswith("apr_")
    assert request["toolCallId"].startswith("call_pay_")
    assert request["reason"] == "spends money"
    # As streamText ends a step that asks: the call's part, its approval request, the end.
    kinds = [c["type"] for c in first]
    assert kinds[-3:] == ["tool-approval-request", "finish-step", "finish"]
    pay = [c for c in first if c.get("toolCallId") == request["toolCallId"]]
    assert [c["type"] for c in pay][-2:] == ["tool-input-available", "tool-approval-request"]
    assert first[-1]["finishReason"] == "tool-calls"
    answer = asking_message(message_id, first, **approved(first, True))
    response = post(app.url, "chat-a", [user("approval please"), answer])
    assert response.status_code == 200
    assert response.headers["x-vercel-ai-ui-message-stream"] == "v1"
    rest = chunks_of(response.content)
    call = request["toolCallId"]
    assert [c["type"] for c in rest] == [
        "start",
        "tool-approval-response",
        "tool-output-available",
        "start-step",
        "text-start",
        "text-delta",
        "text-end",
        "finish-step",
        "finish",
    ]
    # The same UI message: the client updates the part it has and goes on.
    assert rest[0] == {"type": "start", "messageId": message_id}
    assert rest[1] == {
        "type": "tool-approval-response",
        "approvalId": request["approvalId"],
        "approved": True,
    }
    assert rest[2] == {
        "type": "tool-output-available",
        "toolCallId": call,
        "output": {"paid": True},
    }
    assert rest[5]["delta"] == "Done: paid"
    assert rest[-1]["finishReason"] == "stop"
    assert app.runs == [message_id]
    validate(first + rest)


def test_a_denied_call_ends_denied(node_client: Path, app: App) -> None:
    message_id, first = ask(app.url, "chat-d", "approval please")
    answer = asking_message(message_id, first, **approved(first, False, "too expensive"))
    rest = chunks_of(post(app.url, "chat-d", [user("approval please"), answer]).content)
    (request,) = of_type(first, "tool-approval-request")
    call = request["toolCallId"]
    assert rest[1:3] == [
        {
            "type": "tool-approval-response",
            "approvalId": request["approvalId"],
            "approved": False,
            "reason": "too expensive",
        },
        {"type": "tool-output-denied", "toolCallId": call},
    ]
    # The continuation's error result for the denied call (the model's record) is left
    # out: the part stays denied.
    assert not [
        c
        for c in rest
        if c.get("toolCallId") == call
        and c["type"].startswith("tool-output-")
        and c["type"] != "tool-output-denied"
    ]
    assert (
        "".join(c["delta"] for c in of_type(rest, "text-delta")) == "Done: not paid (too expensive)"
    )
    validate(rest)


def test_a_question_is_a_call_of_ask_user_and_its_output_the_answer(
    node_client: Path, app: App
) -> None:
    message_id, first = ask(app.url, "chat-q", "question")
    (call,) = of_type(first, "tool-input-available")
    assert call["toolName"] == "ask_user"
    assert call["toolCallId"].startswith("q_")
    assert call["input"] == {"question": "Which unit?", "schema": SCHEMA}
    (start,) = of_type(first, "tool-input-start")
    assert start == {
        "type": "tool-input-start",
        "toolCallId": call["toolCallId"],
        "toolName": "ask_user",
    }
    answered = {call["toolCallId"]: {"state": "output-available", "output": "C"}}
    answer = asking_message(message_id, first, **answered)
    rest = chunks_of(post(app.url, "chat-q", [user("question"), answer]).content)
    assert rest[1] == {
        "type": "tool-output-available",
        "toolCallId": call["toolCallId"],
        "output": "C",
    }
    assert "".join(c["delta"] for c in of_type(rest, "text-delta")) == 'Done: unit="C"'
    validate(first + rest)


def test_a_question_answered_with_an_error_output_is_answered_with_null(app: App) -> None:
    # useChat's addToolOutput({state: 'output-error'}) for ask_user (the user dismissed
    # it): a 400, and the turn waited on with the part stuck; AG-UI's cancelled is null.
    message_id, first = ask(app.url, "chat-qe", "question")
    (call,) = of_type(first, "tool-input-available")
    dismissed = {call["toolCallId"]: {"state": "output-error", "errorText": "dismissed"}}
    answer = asking_message(message_id, first, **dismissed)
    rest = chunks_of(post(app.url, "chat-qe", [user("question"), answer]).content)
    assert "".join(c["delta"] for c in of_type(rest, "text-delta")) == "Done: unit=null"


def test_an_approval_that_is_no_boolean_is_refused_not_a_new_turn(app: App) -> None:
    # It was read as answering nothing: the user's message ran again as a new turn, and
    # the right answer after it started yet another.
    message_id, first = ask(app.url, "chat-ab", "approval please")
    [(call, part)] = approved(first, True).items()
    part["approval"]["approved"] = "yes"
    answer = asking_message(message_id, first, **{call: part})
    refused = post(app.url, "chat-ab", [user("approval please"), answer])
    assert refused.status_code == 400
    assert "needs a boolean approved" in refused.json()["error"]["message"]
    assert app.runs == []
    right = asking_message(message_id, first, **approved(first, True))
    assert post(app.url, "chat-ab", [user("approval please"), right]).status_code == 200
    assert app.runs == [message_id]


def test_a_client_call_answered_with_an_error(node_client: Path, app: App) -> None:
    message_id, first = ask(app.url, "chat-e", "client")
    (call,) = of_type(first, "tool-input-available")
    assert call["toolName"] == "get_location"
    assert not of_type(first, "tool-output-available")
    failed = {call["toolCallId"]: {"state": "output-error", "errorText": "no GPS"}}
    answer = asking_message(message_id, first, **failed)
    rest = chunks_of(post(app.url, "chat-e", [user("client"), answer]).content)
    # The client has the output as it sent it: the record of it is not sent back.
    assert not [c for c in rest if c.get("toolCallId") == call["toolCallId"]]
    assert [c["type"] for c in rest[:3]] == ["start", "start-step", "text-start"]
    assert (
        "".join(c["delta"] for c in of_type(rest, "text-delta"))
        == "Done: get_location=no GPS (error)"
    )
    validate(rest)


def test_the_same_answer_again_streams_the_same_continuation(app: App) -> None:
    message_id, first = ask(app.url, "chat-r", "approval please")
    messages = [user("approval please"), asking_message(message_id, first, **approved(first, True))]
    once = post(app.url, "chat-r", messages)
    again = post(app.url, "chat-r", messages)
    assert once.status_code == again.status_code == 200
    assert chunks_of(once.content) == chunks_of(again.content)
    assert app.runs == [message_id]  # continued once


def test_refused_answers_are_json_errors(app: App) -> None:
    message_id, first = ask(app.url, "chat-x", "approval and client")
    # The client call left unanswered: 400, nothing written.
    partial = asking_message(message_id, first, **approved(first, True))
    response = post(app.url, "chat-x", [user("approval and client"), partial])
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_answer"
    assert response.json()["error"]["type"] == "invalid_request_error"
    call = next(
        c["toolCallId"]
        for c in of_type(first, "tool-input-available")
        if c["toolName"] == "get_location"
    )
    both = {**approved(first, True), call: {"state": "output-available", "output": {"lat": 1}}}
    answer = asking_message(message_id, first, **both)
    assert post(app.url, "chat-x", [user("approval and client"), answer]).status_code == 200
    # Answered already, differently: 409.
    other = {**approved(first, False), call: {"state": "output-available", "output": {"lat": 1}}}
    conflict = post(app.url, "chat-x", [user("x"), asking_message(message_id, first, **other)])
    assert conflict.status_code == 409
    assert conflict.json()["error"]["code"] == "already_answered"  # AnswerConflict
    assert app.runs == [message_id]


def test_a_request_that_answers_nothing_starts_a_turn(app: App) -> None:
    message_id, first = ask(app.url, "chat-n", "approval please")
    # The user writes instead of answering: a new turn, on a stream of its own.
    other, _ = ask(app.url, "chat-n", "never mind")
    assert other != message_id
    # The asking message sent back unanswered answers nothing either.
    again = post(app.url, "chat-n", [user("approval please"), asking_message(message_id, first)])
    assert again.status_code == 200
    assert chunks_of(again.content)[0]["messageId"] not in (message_id, other)
    assert app.runs == []


def test_a_reconnect_while_the_turn_waits_shows_what_it_asks(app: App) -> None:
    message_id, first = ask(app.url, "chat-w", "approval please")
    reconnect = httpx.get(app.url + "/api/chat/chat-w/stream", timeout=WAIT)
    assert reconnect.status_code == 200
    assert chunks_of(reconnect.content) == first  # the same message, asking
    answer = asking_message(message_id, first, **approved(first, True))
    rest = chunks_of(post(app.url, "chat-w", [user("approval please"), answer]).content)
    replay = httpx.get(app.url + "/api/chat/chat-w/stream", timeout=WAIT)
    # Continued and finished: nothing to resume, as for any finished turn.
    assert replay.status_code == 204
    assert rest[-1]["finishReason"] == "stop"


def test_a_replay_of_the_continued_turn_is_one_message(node_client: Path) -> None:
    async def continuation(publisher: Publisher, answered: Answered) -> None:
        await go_on(publisher, answered, [])

    hub = StreamHub(on_answer=continuation)
    routes = list(ui_chat_routes(hub, asking_turn, replay_finished=True))
    with serve(Starlette(routes=routes, lifespan=hub.lifespan), lifespan="on") as url:
        message_id, first = ask(url, "chat-p", "approval please")
        answer = asking_message(message_id, first, **approved(first, False, "no"))
        rest = chunks_of(post(url, "chat-p", [user("approval please"), answer]).content)
        replay = chunks_of(httpx.get(url + "/api/chat/chat-p/stream", timeout=WAIT).content)
        # The AI SDK's Chat, reloaded with the user's message only, rebuilds it whole.
        shown = run_node_chat(url, "chat-p", [user("approval please")])
    assert replay == first[:-1] + rest[1:-1] + [replay[-1]]
    assert replay[-1]["finishReason"] == "stop"
    (message,) = shown["messages"][1:]
    assert message["id"] == message_id
    parts = parts_of(message)
    assert [p["type"] for p in parts] == [
        "step-start",
        "text",
        "tool-lookup",
        "tool-pay",
        "step-start",
        "text",
    ]
    assert parts[3]["state"] == "output-denied"
    assert parts[3]["approval"]["approved"] is False
    assert parts[5]["text"] == "Done: not paid (no)"


def test_a_reconnect_while_the_continuation_runs_replays_the_whole_message() -> None:
    async def slow(publisher: Publisher, answered: Answered) -> None:
        await anyio.sleep(0.5)
        await go_on(publisher, answered, [])

    hub = StreamHub(on_answer=slow)
    routes = list(ui_chat_routes(hub, asking_turn))
    with serve(Starlette(routes=routes, lifespan=hub.lifespan), lifespan="on") as url:
        message_id, first = ask(url, "chat-s", "approval please")
        answer = asking_message(message_id, first, **approved(first, True))
        body = {"id": "chat-s", "messages": [user("approval please"), answer]}
        with httpx.stream("POST", url + "/api/chat", json=body, timeout=WAIT) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    break  # the continuation is under way
            # Any replica finds it running: the chat's turns say so.
            replay = chunks_of(httpx.get(url + "/api/chat/chat-s/stream", timeout=WAIT).content)
        after = httpx.get(url + "/api/chat/chat-s/stream", timeout=WAIT)
    assert [c["type"] for c in replay].count("start") == 1
    assert of_type(replay, "tool-approval-request") == of_type(first, "tool-approval-request")
    assert "".join(c["delta"] for c in of_type(replay, "text-delta")).endswith("Done: paid")
    assert after.status_code == 204


def run_node_chat(base: str, chat_id: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """tests/node/chat.mjs's reconnect (the AI SDK's resumeStream) of ``chat_id``."""
    done = subprocess.run(
        ["node", str(NODE / "chat.mjs"), base, "resume", chat_id, json.dumps(messages)],
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    assert (result["status"], result["errors"]) == ("ready", [])
    return result


def test_an_answer_asks_authorize_for_answer_access_with_the_chat_id() -> None:
    asked: list[tuple[str, str]] = []

    def authorize(request: object, chat_id: str, access: str) -> bool:
        asked.append((chat_id, access))
        return access != "answer" or chat_id == "mine"

    async def continuation(publisher: Publisher, answered: Answered) -> None:
        await go_on(publisher, answered, [])

    hub = StreamHub(authorize=authorize, on_answer=continuation)
    app = Starlette(routes=list(ui_chat_routes(hub, asking_turn)), lifespan=hub.lifespan)
    with serve(app, lifespan="on") as url:
        statuses = []
        for chat_id in ("theirs", "mine"):
            message_id, first = ask(url, chat_id, "approval please")
            answer = asking_message(message_id, first, **approved(first, True))
            statuses.append(post(url, chat_id, [user("approval please"), answer]).status_code)
    assert statuses == [403, 200]
    assert asked == [
        ("theirs", "read"),
        ("theirs", "read"),
        ("theirs", "answer"),
        ("mine", "read"),
        ("mine", "read"),
        ("mine", "answer"),
    ]


def test_the_encoder_writes_a_continuation_alone_with_the_calls_it_is_given() -> None:
    head = b'{"type":"message_start","message":{"id":"m2"}}'
    events = [
        Event("message_start", head),
        Event(
            "content_block_start",
            b'{"index":0,"content_block":{"type":"approval_response","request_id":"apr_1","approved":false}}',
        ),
        Event("content_block_stop", b'{"index":0}'),
        Event("message_delta", b'{"delta":{"stop_reason":"end_turn"}}'),
        Event("message_stop", b"{}"),
    ]
    encoder = UIMessageEncoder(
        message_id="turn", approval_calls={"apr_1": "call_1"}, usage_metadata=False
    )
    body = b"".join(line for event in events for line in encoder.feed(event)) + encoder.close()
    assert chunks_of(body) == [
        {"type": "start", "messageId": "turn"},
        {"type": "start-step"},
        {"type": "tool-approval-response", "approvalId": "apr_1", "approved": False},
        {"type": "tool-output-denied", "toolCallId": "call_1"},
        {"type": "finish-step"},
        {"type": "finish", "finishReason": "stop"},
    ]


# -- the AI SDK's own Chat ----------------------------------------------------------------------


TRANSPORTS = ["http", "ws"]
"""useChat's two chat transports: DefaultChatTransport (HTTP and SSE) and
WebSocketChatTransport (one WebSocket)."""


def run_chat(
    base: str, chat_id: str, mode: str, arg: Any, action: str, transport: str = "http"
) -> dict[str, Any]:
    given = arg if isinstance(arg, str) else json.dumps(arg)
    script = NODE / "ui_asking.mjs"
    ws = transport == "ws"
    result: dict[str, Any] = node_json(
        script, base, chat_id, mode, given, action, transport, websocket=ws
    )
    return result


def parts_of(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The parts the app renders, without the SDK's bookkeeping fields."""
    keep = ("type", "text", "state", "input", "output", "errorText", "approval")
    return [{k: part[k] for k in keep if part.get(k) is not None} for part in message["parts"]]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_use_chat_approves_and_the_message_goes_on(
    node_client: Path, app: App, transport: str
) -> None:
    result = run_chat(
        app.url, "node-a-" + transport, "send", "approval please", "approve", transport
    )
    assert (result["status"], result["error"], result["errors"]) == ("ready", None, [])
    assert [f["finishReason"] for f in result["finishes"]] == ["tool-calls", "stop"]
    user_message, answer = result["messages"]  # one assistant message, continued
    assert user_message["role"] == "user"
    asked = result["asked"]
    assert asked["id"] == answer["id"]
    approval = next(p["approval"] for p in parts_of(asked) if "approval" in p)
    assert parts_of(asked)[-1] == {
        "type": "tool-pay",
        "state": "approval-requested",
        "input": {"usd": 5},
        "approval": {"id": approval["id"], "requestReason": "spends money"},
    }
    assert parts_of(answer) == [
        {"type": "step-start"},
        {"type": "text", "text": "Let me see.", "state": "done"},
        {
            "type": "tool-lookup",
            "state": "output-available",
            "input": {"q": "x"},
            "output": {"found": True},
        },
        {
            "type": "tool-pay",
            "state": "output-available",
            "input": {"usd": 5},
            "output": {"paid": True},
            "approval": {**approval, "approved": True},
        },
        {"type": "step-start"},
        {"type": "text", "text": "Done: paid", "state": "done"},
    ]
    first, second = result["requests"]
    assert (first["status"], second["status"]) == (200, 200)
    assert second["messageId"] == answer["id"]
    assert second["last"]["tools"][-1]["state"] == "approval-responded"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_use_chat_denies_and_the_call_ends_denied(
    node_client: Path, app: App, transport: str
) -> None:
    result = run_chat(app.url, "node-d-" + transport, "send", "approval please", "deny", transport)
    assert (result["status"], result["errors"]) == ("ready", [])
    assert [f["finishReason"] for f in result["finishes"]] == ["tool-calls", "stop"]
    _, answer = result["messages"]
    parts = parts_of(answer)
    assert parts[3]["type"] == "tool-pay"
    assert parts[3]["state"] == "output-denied"
    assert parts[3]["approval"]["approved"] is False
    assert parts[3]["approval"]["reason"] == "too expensive"
    assert parts[4:] == [
        {"type": "step-start"},
        {"type": "text", "text": "Done: not paid (too expensive)", "state": "done"},
    ]
    assert len(result["requests"]) == 2  # nothing sent again


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(
    ("text", "tool", "output", "said"),
    [
        ("client", "tool-get_location", {"lat": 59.9}, 'get_location={"lat":59.9}'),
        ("question", "tool-ask_user", "C", 'unit="C"'),
    ],
)
def test_use_chat_runs_a_client_tool_and_the_message_goes_on(
    node_client: Path, app: App, text: str, tool: str, output: Any, said: str, transport: str
) -> None:
    result = run_chat(app.url, f"node-{text}-{transport}", "send", text, "answer", transport)
    assert (result["status"], result["errors"]) == ("ready", [])
    assert [f["finishReason"] for f in result["finishes"]] == ["tool-calls", "stop"]
    _, answer = result["messages"]
    parts = parts_of(answer)
    assert parts[:2] == [
        {"type": "step-start"},
        {"type": "text", "text": "Let me see.", "state": "done"},
    ]
    assert parts[2]["type"] == tool
    assert (parts[2]["state"], parts[2]["output"]) == ("output-available", output)
    assert parts[3:] == [
        {"type": "step-start"},
        {"type": "text", "text": "Done: " + said, "state": "done"},
    ]
    assert [r["status"] for r in result["requests"]] == [200, 200]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_use_chat_reloads_a_waiting_turn_and_answers_it(
    node_client: Path, app: App, transport: str
) -> None:
    chat_id = "node-w-" + transport
    first = run_chat(app.url, chat_id, "send", "approval please", "none", transport)
    assert [f["finishReason"] for f in first["finishes"]] == ["tool-calls"]
    saved = first["messages"][:1]  # the app saved the user's message only
    result = run_chat(app.url, chat_id, "resume", saved, "approve", transport)
    assert (result["status"], result["errors"]) == ("ready", [])
    # The reconnect showed the request again, in the same message, which the answer
    # continued.
    assert [r["method"] for r in result["requests"]] == ["GET", "POST"]
    assert parts_of(result["asked"])[-1]["state"] == "approval-requested"
    assert [m["id"] for m in result["messages"]] == [
        saved[0]["id"],
        first["messages"][1]["id"],
    ]
    assert parts_of(result["messages"][1])[-1] == {
        "type": "text",
        "text": "Done: paid",
        "state": "done",
    }
