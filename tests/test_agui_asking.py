"""A turn that asks, served as AG-UI (docs/asking.md, docs/dialects.md): the run ends
with ``RUN_FINISHED``'s interrupt outcome (an approval request, a question) or with its
client calls pending; a run whose ``resume`` entries (or ``tool`` messages) answer them
streams the continuation as a run of its own. Every event validates against the
``ag-ui-protocol`` package's models; ``@ag-ui/client``'s ``HttpAgent`` (Node,
tests/node/agui_asking.mjs) reads the interrupt, resumes and answers a frontend tool."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest
from ag_ui.core import Event as AGUIEvent
from pydantic import TypeAdapter
from starlette.applications import Starlette

from essessey import Answered, Publisher, StreamHub, continue_turn, stream_turn
from essessey.bindings.sse import SSEDecoder
from essessey.dialects.agui import (
    APPROVAL_REASON,
    APPROVAL_SCHEMA,
    QUESTION_REASON,
    AGUIEncoder,
    AGUIRunRequest,
    agui_routes,
)
from essessey.event import Event
from essessey.hub import TurnProducer
from tests.processes import WAIT, node_json
from tests.servers import serve

pytestmark = pytest.mark.anyio

AGUI_EVENT: TypeAdapter[Any] = TypeAdapter(AGUIEvent)
NODE = Path(__file__).parent / "node"
SCHEMA = {"enum": ["C", "F"]}


def asking_turn(run: AGUIRunRequest) -> TurnProducer:
    """Asks what the last user message names: ``client`` (``get_location``, run by the
    client), ``approval`` (of its call ``pay``, after a ``lookup`` it ran), ``question``
    (a unit); anything else is answered at once."""
    users = [m for m in run.messages if m.get("role") == "user"]
    asks = str(users[-1].get("content")) if users else ""
    suffix = secrets.token_hex(4)

    async def produce(publisher: Publisher) -> None:
        async with stream_turn(
            publisher, message_id="msg_" + suffix, stream_id=run.id, model="m"
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
                await tools.write_result("call_lookup_" + suffix, "found")
                await turn.ask_approval("call_pay_" + suffix, reason="spends money")
            if "question" in asks:
                await turn.ask("Which unit?", schema=SCHEMA)
            if "hurry" in asks:
                await turn.ask("Now?", expires_in=0.01)

    return produce


@dataclass
class App:
    url: str
    runs: list[str] = field(default_factory=list)


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
                await turn.tool_result(request.tool_use_id, "denied", is_error=True)
                said.append(f"not paid ({approval.reason})")
        for _, answer in answered.questions():
            said.append(f"unit={json.dumps(answer.value)}")
        if any(answer.value == "again" for _, answer in answered.questions()):
            await turn.ask("Which unit, really?", schema=SCHEMA)
            return
        await (await turn.text()).write("Done: " + ", ".join(said))


@pytest.fixture
def app() -> Iterator[App]:
    runs: list[str] = []

    async def continuation(publisher: Publisher, answered: Answered) -> None:
        await go_on(publisher, answered, runs)

    hub = StreamHub(on_answer=continuation)
    routes = list(agui_routes(hub, asking_turn))
    with serve(Starlette(routes=routes, lifespan=hub.lifespan), lifespan="on") as url:
        yield App(url, runs)


def run_input(
    thread: str, run_id: str, messages: list[dict[str, Any]], **extra: Any
) -> dict[str, Any]:
    return {
        "threadId": thread,
        "runId": run_id,
        "messages": messages,
        "tools": [],
        "context": [],
        "state": {},
        "forwardedProps": {},
        **extra,
    }


def events_of(body: bytes) -> list[dict[str, Any]]:
    decoder = SSEDecoder()
    found = [json.loads(m.data) for m in decoder.feed(body) + decoder.close()]
    for item in found:
        AGUI_EVENT.validate_python(item)  # every event, as the protocol's models read it
    return found


def text_of(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")


async def post(http: httpx.AsyncClient, url: str, body: dict[str, Any], **kw: Any) -> Any:
    return await http.post(f"{url}/agui", json=body, **kw)


async def asked(http: httpx.AsyncClient, url: str, thread: str, what: str) -> list[dict[str, Any]]:
    """The events of a first run asking ``what``."""
    user = [{"id": "u1", "role": "user", "content": what}]
    response = await post(http, url, run_input(thread, "run-1", user))
    assert response.status_code == 200, response.text
    return events_of(response.content)


# -- the run that asks --------------------------------------------------------------------


async def test_an_approval_ends_the_run_with_an_interrupt(app: App) -> None:
    async with httpx.AsyncClient(timeout=WAIT) as http:
        events = await asked(http, app.url, "t-approval", "approval")
    assert events[0]["type"] == "RUN_STARTED"
    finished = events[-1]
    assert finished["type"] == "RUN_FINISHED"
    assert finished["runId"] == "run-1"
    [interrupt] = finished["outcome"]["interrupts"]
    assert finished["outcome"]["type"] == "interrupt"
    assert interrupt["id"].startswith("apr_")
    assert interrupt["reason"] == APPROVAL_REASON
    assert interrupt["toolCallId"].startswith("call_pay_")
    assert interrupt["message"] == "spends money"
    assert interrupt["responseSchema"] == APPROVAL_SCHEMA
    assert interrupt["expiresAt"].endswith("Z")
    # The gated call streams as a tool call, without a result; the lookup has its own.
    starts = [e["toolCallId"] for e in events if e["type"] == "TOOL_CALL_START"]
    results = [e["toolCallId"] for e in events if e["type"] == "TOOL_CALL_RESULT"]
    assert [s.split("_")[1] for s in starts] == ["lookup", "pay"]
    assert [r.split("_")[1] for r in results] == ["lookup"]
    assert not [e for e in events if e["type"] == "CUSTOM"]  # the request is the interrupt


async def test_a_question_is_an_interrupt_with_its_schema(app: App) -> None:
    async with httpx.AsyncClient(timeout=WAIT) as http:
        events = await asked(http, app.url, "t-question", "question")
    [interrupt] = events[-1]["outcome"]["interrupts"]
    assert interrupt["id"].startswith("q_")
    assert interrupt["reason"] == QUESTION_REASON
    assert interrupt["message"] == "Which unit?"
    assert interrupt["responseSchema"] == SCHEMA
    assert "toolCallId" not in interrupt


async def test_a_client_call_ends_the_run_with_it_pending(app: App) -> None:
    async with httpx.AsyncClient(timeout=WAIT) as http:
        events = await asked(http, app.url, "t-client", "client")
    [call] = [e["toolCallId"] for e in events if e["type"] == "TOOL_CALL_START"]
    assert events[-1]["outcome"] == {"type": "success", "pendingToolCallIds": [call]}


# -- the run that answers -----------------------------------------------------------------


def resume_run(thread: str, run_id: str, entries: list[dict[str, Any]]) -> dict[str, Any]:
    messages = [{"id": "u1", "role": "user", "content": "approval"}]
    return run_input(thread, run_id, messages, resume=entries)


@pytest.mark.parametrize(
    ("status", "payload", "said", "result_error"),
    [
        ("resolved", None, "paid", False),
        ("resolved", {"approved": True}, "paid", False),
        ("resolved", {"approved": False, "reason": "too much"}, "not paid (too much)", True),
        ("cancelled", None, "not paid (None)", True),
    ],
)
async def test_a_resume_answers_the_approval_and_streams_the_continuation(
    app: App, status: str, payload: Any, said: str, result_error: bool
) -> None:
    thread = f"t-{secrets.token_hex(4)}"
    async with httpx.AsyncClient(timeout=WAIT) as http:
        first = await asked(http, app.url, thread, "approval")
        [interrupt] = first[-1]["outcome"]["interrupts"]
        entry: dict[str, Any] = {"interruptId": interrupt["id"], "status": status}
        if payload is not None:
            entry["payload"] = payload
        response = await post(http, app.url, resume_run(thread, "run-2", [entry]))
        assert response.status_code == 200, response.text
        events = events_of(response.content)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "RUN_STARTED"
    assert events[0]["runId"] == "run-2"
    assert kinds[-1] == "RUN_FINISHED"
    assert "outcome" not in events[-1]
    assert kinds.count("RUN_STARTED") == kinds.count("RUN_FINISHED") == 1
    # The earlier message's gated call gets its result; the record of the answer is not
    # written (the client sent it).
    [result] = [e for e in events if e["type"] == "TOOL_CALL_RESULT"]
    assert result["toolCallId"] == interrupt["toolCallId"]
    assert (result["rawEvent"].get("is_error") is True) == result_error
    assert not [e for e in events if e["type"] == "CUSTOM"]
    assert text_of(events) == f"Done: {said}"
    assert len(app.runs) == 1


@pytest.mark.parametrize(
    ("status", "payload", "said"),
    [
        ("resolved", "F", 'unit="F"'),
        ("resolved", {"unit": "C"}, 'unit={"unit": "C"}'),
        ("cancelled", None, "unit=null"),
    ],
)
async def test_a_resume_answers_the_question(
    app: App, status: str, payload: Any, said: str
) -> None:
    thread = f"t-{secrets.token_hex(4)}"
    async with httpx.AsyncClient(timeout=WAIT) as http:
        first = await asked(http, app.url, thread, "question")
        [interrupt] = first[-1]["outcome"]["interrupts"]
        entry = {"interruptId": interrupt["id"], "status": status, "payload": payload}
        response = await post(http, app.url, resume_run(thread, "run-2", [entry]))
        assert response.status_code == 200, response.text
        events = events_of(response.content)
    assert text_of(events) == f"Done: {said}"


async def test_a_tool_message_answers_a_client_call(app: App) -> None:
    thread = f"t-{secrets.token_hex(4)}"
    async with httpx.AsyncClient(timeout=WAIT) as http:
        first = await asked(http, app.url, thread, "client")
        [call] = first[-1]["outcome"]["pendingToolCallIds"]
        messages = [
            {"id": "u1", "role": "user", "content": "client"},
            {
                "id": "a1",
                "role": "assistant",
                "toolCalls": [
                    {
                        "id": call,
                        "type": "function",
                        "function": {"name": "get_location", "arguments": "{}"},
                    }
                ],
            },
            {"id": "t1", "role": "tool", "toolCallId": call, "content": '{"lat": 1}'},
        ]
        response = await post(http, app.url, run_input(thread, "run-2", messages))
        assert response.status_code == 200, response.text
        events = events_of(response.content)
    assert text_of(events) == 'Done: get_location={"lat":1}'
    # The client's own output is not written back to it as a second tool message.
    assert not [e for e in events if e["type"] == "TOOL_CALL_RESULT"]
    assert events[-1]["type"] == "RUN_FINISHED"
    assert "outcome" not in events[-1]


async def test_everything_at_once_interrupts_and_a_tool_message(app: App) -> None:
    thread = f"t-{secrets.token_hex(4)}"
    async with httpx.AsyncClient(timeout=WAIT) as http:
        first = await asked(http, app.url, thread, "client approval question")
        outcome = first[-1]["outcome"]
        assert outcome["type"] == "interrupt"
        approval, question = outcome["interrupts"]
        starts = [e["toolCallId"] for e in first if e["type"] == "TOOL_CALL_START"]
        [call] = [s for s in starts if s.startswith("call_loc_")]
        messages = [
            {"id": "u1", "role": "user", "content": "everything"},
            {"id": "t1", "role": "tool", "toolCallId": call, "content": "Oslo"},
        ]
        entries = [
            {"interruptId": approval["id"], "status": "resolved"},
            {"interruptId": question["id"], "status": "resolved", "payload": "C"},
        ]
        body = run_input(thread, "run-2", messages, resume=entries)
        response = await post(http, app.url, body)
        assert response.status_code == 200, response.text
        events = events_of(response.content)
    assert text_of(events) == 'Done: get_location=Oslo, paid, unit="C"'


async def test_a_continuation_that_asks_again_ends_its_run_on_an_interrupt(app: App) -> None:
    thread = f"t-{secrets.token_hex(4)}"
    async with httpx.AsyncClient(timeout=WAIT) as http:
        first = await asked(http, app.url, thread, "question")
        [interrupt] = first[-1]["outcome"]["interrupts"]
        entry = {"interruptId": interrupt["id"], "status": "resolved", "payload": "again"}
        second = events_of((await post(http, app.url, resume_run(thread, "r2", [entry]))).content)
        [again] = second[-1]["outcome"]["interrupts"]
        assert again["message"] == "Which unit, really?"
        assert again["id"] != interrupt["id"]
        entry = {"interruptId": again["id"], "status": "resolved", "payload": "F"}
        third = events_of((await post(http, app.url, resume_run(thread, "r3", [entry]))).content)
    assert [e["type"] for e in second].count("RUN_STARTED") == 1
    assert second[0]["runId"] == "r2"
    assert third[0]["runId"] == "r3"
    assert text_of(third) == 'Done: unit="F"'
    assert "outcome" not in third[-1]
    assert len(app.runs) == 2


# -- exactly once, and the refusals -------------------------------------------------------


async def test_a_retried_resume_is_the_same_continuation_once(app: App) -> None:
    thread = f"t-{secrets.token_hex(4)}"
    async with httpx.AsyncClient(timeout=WAIT) as http:
        first = await asked(http, app.url, thread, "approval")
        [interrupt] = first[-1]["outcome"]["interrupts"]
        body = resume_run(thread, "run-2", [{"interruptId": interrupt["id"], "status": "resolved"}])
        once = await post(http, app.url, body)
        again = await post(http, app.url, body)
        decoder = SSEDecoder()
        messages = decoder.feed(once.content) + decoder.close()
        ids = [m.id for m in messages if m.id]
        middle = ids[len(ids) // 2]
        rest = await post(http, app.url, body, headers={"last-event-id": middle})
        # The first run, read again, still ends at its interrupt.
        user = [{"id": "u1", "role": "user", "content": "approval"}]
        reread = await post(http, app.url, run_input(thread, "run-1", user))
    assert events_of(again.content) == events_of(once.content)
    upto = max(i for i, m in enumerate(messages) if m.id == middle)
    resumed = [json.loads(m.data) for m in messages[: upto + 1]] + events_of(rest.content)
    assert resumed == events_of(once.content)
    assert len(app.runs) == 1
    assert events_of(reread.content) == first


async def test_refusals_are_run_error_objects(app: App) -> None:
    thread = f"t-{secrets.token_hex(4)}"
    async with httpx.AsyncClient(timeout=WAIT) as http:
        first = await asked(http, app.url, thread, "approval question")
        approval, question = first[-1]["outcome"]["interrupts"]
        yes = {"interruptId": approval["id"], "status": "resolved"}
        unit = {"interruptId": question["id"], "status": "resolved", "payload": "C"}
        missing = await post(http, app.url, resume_run(thread, "r2", [yes]))
        bad = {**yes, "payload": {"approved": "yes", "secret": "s3cr3t"}}
        malformed = await post(http, app.url, resume_run(thread, "r2", [bad, unit]))
        shape = await post(http, app.url, resume_run(thread, "r2", [{"status": "resolved"}]))
        unknown = {"interruptId": "apr_nope", "status": "resolved"}
        nobody = await post(http, app.url, resume_run(thread, "r2", [unknown]))
        taken = await post(http, app.url, resume_run(thread, "r2", [yes, unit]))
        assert taken.status_code == 200, taken.text
        other = {**unit, "payload": "F"}
        conflict = await post(http, app.url, resume_run(thread, "r3", [yes, other]))
    for response, status, code in [
        (missing, 400, "invalid_answer"),
        (malformed, 400, "invalid_answer"),
        (shape, 400, "invalid_request_error"),
        (nobody, 400, "invalid_answer"),
        (conflict, 409, "already_answered"),
    ]:
        assert response.status_code == status, response.text
        error = response.json()
        assert error["type"] == "RUN_ERROR"
        assert error["code"] == code
        assert "s3cr3t" not in error["message"]
    assert len(app.runs) == 1


async def test_cancelling_an_expired_interrupt_is_a_run_as_any_other(app: App) -> None:
    thread = f"t-{secrets.token_hex(4)}"
    async with httpx.AsyncClient(timeout=WAIT) as http:
        first = await asked(http, app.url, thread, "hurry")
        [interrupt] = first[-1]["outcome"]["interrupts"]
        # Answers are refused once the clock is past expiresAt (whole seconds): wait for it.
        expires_at = datetime.fromisoformat(interrupt["expiresAt"]).timestamp()
        await anyio.sleep(max(expires_at - time.time() + 0.05, 0))
        resolved = {"interruptId": interrupt["id"], "status": "resolved", "payload": "yes"}
        late = await post(http, app.url, resume_run(thread, "r2", [resolved]))
        cancelled = {"interruptId": interrupt["id"], "status": "cancelled"}
        user = [{"id": "u2", "role": "user", "content": "hello"}]
        body = run_input(thread, "r3", user, resume=[cancelled])
        response = await post(http, app.url, body)
    assert late.status_code == 409, late.text
    assert late.json()["code"] == "answer_expired"
    events = events_of(response.content)
    assert events[0]["runId"] == "r3"
    assert text_of(events) == "Let me see."
    assert app.runs == []


async def test_tool_messages_no_stream_asked_for_are_a_run_as_any_other(app: App) -> None:
    messages = [
        {"id": "u1", "role": "user", "content": "hello"},
        {"id": "t1", "role": "tool", "toolCallId": "call_from_before", "content": "x"},
    ]
    async with httpx.AsyncClient(timeout=WAIT) as http:
        response = await post(http, app.url, run_input("t-history", "run-1", messages))
    events = events_of(response.content)
    assert text_of(events) == "Let me see."
    assert "outcome" not in events[-1]
    assert app.runs == []


# -- the encoder ---------------------------------------------------------------------------


def event(name: str, event_id: str, **payload: Any) -> Event:
    return Event(name, orjson.dumps({"type": name, **payload}), event_id)


def test_the_encoder_skips_up_to_after_and_the_records_of_answers() -> None:
    asking = [
        event("message_start", "1", message={"id": "m1", "model": "x"}),
        event(
            "content_block_start",
            "2",
            index=0,
            content_block={"type": "tool_use", "id": "c1", "name": "f", "input": {}},
        ),
        event("content_block_stop", "3", index=0),
        event("message_delta", "4", delta={"stop_reason": "tool_use"}),
        event("message_stop", "5"),
    ]
    continuation = [
        event("message_start", "6", message={"id": "m2", "model": "x"}),
        event(
            "content_block_start",
            "7",
            index=0,
            content_block={"type": "tool_result", "tool_use_id": "c1"},
        ),
        event("content_block_delta", "8", index=0, delta={"type": "text_delta", "text": "o"}),
        event("content_block_stop", "9", index=0),
        event("content_block_start", "10", index=1, content_block={"type": "text"}),
        event("content_block_delta", "11", index=1, delta={"type": "text_delta", "text": "hi"}),
        event("content_block_stop", "12", index=1),
        event("message_delta", "13", delta={"stop_reason": "end_turn"}),
        event("message_stop", "14"),
    ]
    first = AGUIEncoder("t", "r1")
    written = events_of(b"".join(first.encode(e) for e in asking + continuation) + first.finish())
    assert written[-1]["outcome"] == {"type": "success", "pendingToolCallIds": ["c1"]}
    assert text_of(written) == ""  # the continuation is another run's
    then = AGUIEncoder("t", "r2", after="5", answered_calls=["c1"])
    written = events_of(b"".join(then.encode(e) for e in asking + continuation) + then.finish())
    assert [e["type"] for e in written] == [
        "RUN_STARTED",
        "STEP_STARTED",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "STEP_FINISHED",
        "RUN_FINISHED",
    ]
    assert written[0]["runId"] == "r2"


# -- @ag-ui/client ------------------------------------------------------------------------


def http_agent(url: str, *args: str) -> dict[str, Any]:
    result: dict[str, Any] = node_json(NODE / "agui_asking.mjs", f"{url}/agui", *args)
    return result


@pytest.mark.parametrize(
    ("decision", "said", "approved"),
    [
        ("approve", "paid", True),
        ("deny", "not paid (no thanks)", False),
        ("cancel", "not paid (None)", False),
    ],
)
def test_http_agent_resumes_an_interrupt(
    node_client: Path, app: App, decision: str, said: str, approved: bool
) -> None:
    result = http_agent(app.url, f"thread-{decision}", "approval", decision)
    first, second = result["runs"]
    assert first["events"][0] == "RUN_STARTED"
    assert first["events"][-1] == "RUN_FINISHED"
    assert first["outcome"] == "interrupt"
    [interrupt] = first["interrupts"]
    assert interrupt["reason"] == APPROVAL_REASON
    assert first["pendingInterrupts"] == [interrupt["id"]]
    assert second["events"][0] == "RUN_STARTED"
    assert second["events"][-1] == "RUN_FINISHED"
    assert second["outcome"] == "success"
    assert second["pendingInterrupts"] == []
    messages = result["messages"]
    # The gated call's result lands right after the assistant message that made it.
    tools = [m for m in messages if m["role"] == "tool"]
    pay = [m for m in tools if m["toolCallId"] == interrupt["toolCallId"]]
    assert len(pay) == 1
    assert (pay[0]["content"] == '{"paid":true}') == approved
    assistant = [m for m in messages if m["role"] == "assistant"]
    assert "".join(m.get("content") or "" for m in assistant) == f"Let me see.Done: {said}"


def test_http_agent_answers_a_frontend_tool_with_a_tool_message(
    node_client: Path, app: App
) -> None:
    result = http_agent(app.url, "thread-frontend", "client", "answer")
    first, second = result["runs"]
    assert first["outcome"] == "success"
    [call] = first["pendingToolCallIds"]
    assert call.startswith("call_loc_")
    assert second["outcome"] == "success"
    assert second["pendingToolCallIds"] == []
    tools = [m for m in result["messages"] if m["role"] == "tool"]
    assert [(m["toolCallId"], m["content"]) for m in tools] == [(call, '{"lat":59.9}')]
    assistant = [m for m in result["messages"] if m["role"] == "assistant"]
    said = "".join(m.get("content") or "" for m in assistant)
    assert said == 'Let me see.Done: get_location={"lat":59.9}'
