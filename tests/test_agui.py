"""AG-UI served from the hub: every event the encoder writes validates against the
``ag-ui-protocol`` package's own models, a run posted again resumes by ``Last-Event-ID``
exactly once, and ``@ag-ui/client``'s ``HttpAgent`` (Node, tests/node) reads a whole run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from ag_ui.core import Event as AGUIEvent
from pydantic import TypeAdapter
from starlette.applications import Starlette

from essessey import Event, InMemorySink, Publisher, StreamHub
from essessey.adapters import stream_rounds
from essessey.bindings.sse import SSEDecoder
from essessey.dialects.agui import (
    BLOCK_EVENT,
    AGUIEncoder,
    AGUIRunRequest,
    agui_routes,
    run_stream_id,
)
from essessey.hub import TurnProducer
from tests.processes import WAIT, node_json
from tests.scripted_turn import ANSWER, THINKING, scripted_turn
from tests.servers import serve

pytestmark = pytest.mark.anyio

AGUI_EVENT: TypeAdapter[Any] = TypeAdapter(AGUIEvent)
NODE = Path(__file__).parent / "node"


def reasoning_turn(stream_id: str) -> TurnProducer:
    """Reasoning a client cannot read (a redacted block), then signed reasoning."""

    async def produce(publisher: Publisher) -> None:
        async with stream_rounds(
            publisher, message_id="m_r", stream_id=stream_id, model="m"
        ) as rounds:
            await rounds.round_start()
            await rounds.block_start({"type": "redacted_thinking", "data": "opaque-1"})
            await rounds.block_stop()
            await rounds.delta(reasoning="Two and two.", signature="sig-1")
            await rounds.delta(text="Four.")
            await rounds.round_end()

    return produce


def answer(run: AGUIRunRequest) -> TurnProducer:
    if run.body.get("runId") == "run-reasoning":
        return reasoning_turn(run.id)
    props = run.body.get("forwardedProps") or {}
    if props.get("bad_option"):
        raise ValueError("bad_option is not one the app takes")
    delay = float(props.get("delay_ms", 0)) / 1000
    return scripted_turn(run.id, delay=delay, fail=bool(props.get("fail")))


@pytest.fixture
def base_url() -> Iterator[str]:
    hub = StreamHub()

    app = Starlette(routes=list(agui_routes(hub, answer)), lifespan=hub.lifespan)
    with serve(app, lifespan="on") as url:
        yield url


def run_input(run_id: str, **props: Any) -> dict[str, Any]:
    return {
        "threadId": "thread-1",
        "runId": run_id,
        "messages": [{"id": "u1", "role": "user", "content": "Weather?"}],
        "tools": [],
        "context": [],
        "state": {},
        "forwardedProps": props,
    }


def events_of(body: bytes) -> list[dict[str, Any]]:
    decoder = SSEDecoder()
    return [json.loads(m.data) for m in decoder.feed(body) + decoder.close()]


def encoded(events: list[Event]) -> list[dict[str, Any]]:
    encoder = AGUIEncoder("thread-1", "run-1")
    return events_of(b"".join(encoder.encode(e) for e in events) + encoder.finish())


async def scripted_events(*, fail: bool = False) -> list[Event]:
    sink = InMemorySink()
    await scripted_turn("run", fail=fail)(Publisher(sink))
    return [Event(e.event, e.data, str(n + 1)) for n, e in enumerate(sink.events)]


def event(name: str, **payload: Any) -> Event:
    return Event(name, orjson.dumps({"type": name, **payload}))


# -- the encoder ----------------------------------------------------------------------------


async def test_every_event_validates_and_the_run_reads_whole() -> None:
    written = encoded(await scripted_events())
    for item in written:
        AGUI_EVENT.validate_python(item)
    kinds = [e["type"] for e in written]
    assert kinds[0] == "RUN_STARTED"
    assert kinds[-1] == "RUN_FINISHED"
    assert kinds.count("STEP_STARTED") == kinds.count("STEP_FINISHED") == 2
    text = "".join(e["delta"] for e in written if e["type"] == "TEXT_MESSAGE_CONTENT")
    reasoning = "".join(e["delta"] for e in written if e["type"] == "REASONING_MESSAGE_CONTENT")
    assert (text, reasoning) == (ANSWER, THINKING)
    args: dict[str, str] = {}
    for e in written:
        if e["type"] == "TOOL_CALL_ARGS":
            args[e["toolCallId"]] = args.get(e["toolCallId"], "") + e["delta"]
    assert {k: json.loads(v) for k, v in args.items()} == {
        "call_paris": {"city": "Paris"},
        "call_oslo": {"city": "Oslo"},
    }
    results = [e for e in written if e["type"] == "TOOL_CALL_RESULT"]
    assert [(r["toolCallId"], r["content"], r["rawEvent"].get("is_error")) for r in results] == [
        ("call_paris", '{"temp_c":18}', None),
        ("call_oslo", "station offline", True),
    ]
    steps = [e for e in written if e["type"] == "STEP_FINISHED"]
    assert [s["rawEvent"]["delta"]["stop_reason"] for s in steps] == ["tool_use", "end_turn"]
    assert written[-1]["usage"] == [
        {"inputTokens": 0, "outputTokens": 28, "totalTokens": 28, "model": "scripted"}
    ]
    # camelCase throughout, as the AG-UI SDKs write it.
    assert not [key for e in written for key in e if "_" in key]


async def test_a_signature_a_redacted_block_and_an_unknown_one_lose_nothing() -> None:
    events = [
        event("message_start", message={"id": "m1", "model": "x", "usage": {"input_tokens": 3}}),
        event("content_block_start", index=0, content_block={"type": "thinking"}),
        event("content_block_delta", index=0, delta={"type": "thinking_delta", "text": "hm"}),
        event("content_block_delta", index=0, delta={"type": "signature_delta", "signature": "s1"}),
        event("content_block_stop", index=0),
        event(
            "content_block_start", index=1, content_block={"type": "redacted_thinking", "data": "d"}
        ),
        event("content_block_stop", index=1),
        event("content_block_start", index=2, content_block={"type": "web_search", "q": 1}),
        event("content_block_delta", index=2, delta={"type": "citations_delta", "n": 2}),
        event("content_block_stop", index=2),
        event("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 4}),
        event("message_stop"),
    ]
    written = encoded(events)
    for item in written:
        AGUI_EVENT.validate_python(item)
    encrypted = [e for e in written if e["type"] == "REASONING_ENCRYPTED_VALUE"]
    assert [(e["entityId"], e["encryptedValue"]) for e in encrypted] == [
        ("m1-0", "s1"),
        ("m1-1", "d"),
    ]
    custom = [e for e in written if e["type"] == "CUSTOM"]
    assert custom == [
        {
            "type": "CUSTOM",
            "name": BLOCK_EVENT,
            "value": {
                "block": {"type": "web_search", "q": 1},
                "deltas": [{"type": "citations_delta", "n": 2}],
            },
        }
    ]
    assert written[-1]["usage"][0]["inputTokens"] == 3


async def test_an_error_and_a_cancel_end_the_run_with_run_error() -> None:
    failed = encoded(await scripted_events(fail=True))
    assert failed[-1] == {
        "type": "RUN_ERROR",
        "message": "the provider is overloaded",
        "code": "overloaded_error",
    }
    cancelled = encoded(
        [
            event("message_start", message={"id": "m1"}),
            event("message_delta", delta={"stop_reason": "cancelled"}),
            event("message_stop"),
        ]
    )
    assert cancelled[-1]["type"] == "RUN_ERROR"
    assert cancelled[-1]["code"] == "CANCELLED"
    for item in failed + cancelled:
        AGUI_EVENT.validate_python(item)


async def test_unreadable_events_are_skipped_with_a_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    encoder = AGUIEncoder("t", "r")
    assert encoder.encode(Event("message_start", b"{secret")) == b""
    assert encoder.encode(Event("content_block_delta", b'{"index": 0}')) == b""
    assert "not JSON" in caplog.text
    assert "secret" not in caplog.text


def test_a_run_s_stream_id_is_the_same_for_the_same_run_and_valid_for_any_ids() -> None:
    assert run_stream_id("t", "r") == run_stream_id("t", "r")
    assert run_stream_id("t", "r") != run_stream_id("t", "r2")
    assert run_stream_id("a b.c", "x>y*").startswith("agui-")


# -- served ----------------------------------------------------------------------------------


async def test_a_posted_run_streams_with_ids_and_resumes_exactly_once(base_url: str) -> None:
    body = run_input("run-resume", delay_ms=20)
    async with httpx.AsyncClient(timeout=WAIT) as http:
        async with http.stream("POST", f"{base_url}/agui", json=body) as first:
            assert first.status_code == 200
            decoder = SSEDecoder()
            seen: list[Any] = []
            async for piece in first.aiter_bytes():
                seen += decoder.feed(piece)
                if sum(1 for m in seen if m.id) >= 8:
                    break  # the client drops mid-run
        last_id = [m.id for m in seen if m.id][-1]
        upto = max(i for i, m in enumerate(seen) if m.id == last_id)
        rest = await http.post(f"{base_url}/agui", json=body, headers={"last-event-id": last_id})
        again = await http.post(f"{base_url}/agui", json=body)  # no id: the run from its start
    resumed = [json.loads(m.data) for m in seen[: upto + 1]] + events_of(rest.content)
    whole = events_of(again.content)
    assert resumed == whole
    assert whole[-1]["type"] == "RUN_FINISHED"
    assert [e["type"] for e in whole].count("RUN_STARTED") == 1  # one run, not two turns


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b'{"runId": "r", "messages": []}', "threadId"),
        (b'{"threadId": "t", "messages": []}', "runId"),
        (b'{"threadId": "t", "runId": "r", "messages": "x"}', "messages"),
        (
            b'{"threadId": "t", "runId": "r", "messages": [], "forwardedProps": {"bad_option": 1}}',
            "bad_option",
        ),
    ],
)
async def test_bad_bodies_get_a_400_run_error(base_url: str, body: bytes, message: str) -> None:
    async with httpx.AsyncClient(timeout=WAIT) as http:
        response = await http.post(f"{base_url}/agui", content=body)
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["type"] == "RUN_ERROR"
    assert message in error["message"]


async def test_an_unknown_last_id_is_a_410(base_url: str) -> None:
    async with httpx.AsyncClient(timeout=WAIT) as http:
        body = run_input("run-410")
        await http.post(f"{base_url}/agui", json=body)
        gone = await http.post(f"{base_url}/agui", json=body, headers={"last-event-id": "9-9"})
    assert gone.status_code == 410, gone.text
    assert gone.json()["code"] == "resume_unavailable"


def test_http_agent_reads_a_whole_run(node_client: Path, base_url: str) -> None:
    result = node_json(NODE / "agui.mjs", f"{base_url}/agui", "thread-node", "run-node")
    assert result["events"][0] == "RUN_STARTED"
    assert result["events"][-1] == "RUN_FINISHED"
    assistant = [m for m in result["messages"] if m["role"] == "assistant"]
    assert "".join(m.get("content") or "" for m in assistant) == ANSWER
    calls = [c for m in assistant for c in m.get("toolCalls") or []]
    assert [(c["id"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("call_paris", {"city": "Paris"}),
        ("call_oslo", {"city": "Oslo"}),
    ]
    tools = [m for m in result["messages"] if m["role"] == "tool"]
    assert [(m["toolCallId"], m["content"]) for m in tools] == [
        ("call_paris", '{"temp_c":18}'),
        ("call_oslo", "station offline"),
    ]


def test_http_agent_keeps_the_reasoning_a_client_must_send_back(
    node_client: Path, base_url: str
) -> None:
    # A redacted block's data and a thinking block's signature are each their reasoning
    # message's encryptedValue: what a client sends back for the model to go on.
    result = node_json(NODE / "agui.mjs", f"{base_url}/agui", "thread-r", "run-reasoning")
    reasoning = [m for m in result["messages"] if m["role"] == "reasoning"]
    assert [(m.get("content"), m.get("encryptedValue")) for m in reasoning] == [
        ("", "opaque-1"),
        ("Two and two.", "sig-1"),
    ]
    assistant = [m for m in result["messages"] if m["role"] == "assistant"]
    assert "".join(m.get("content") or "" for m in assistant) == "Four."


def _open_message(*blocks: tuple[dict[str, Any], list[dict[str, Any]]]) -> list[Event]:
    """A message's start and its blocks (start, deltas), the last one left open: the
    stream ends there, as one whose producer returned inside its message does."""
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m"}
    message |= {"content": [], "stop_reason": None, "usage": {"input_tokens": 1}}
    events = [event("message_start", message=message)]
    for index, (start, deltas) in enumerate(blocks):
        events.append(event("content_block_start", index=index, content_block=start))
        events += [event("content_block_delta", index=index, delta=d) for d in deltas]
        if index < len(blocks) - 1:
            events.append(event("content_block_stop", index=index))
    return events


def test_a_stream_that_ends_inside_its_message_ends_its_blocks_and_step_first() -> None:
    # @ag-ui/client refuses RUN_FINISHED while a step is active, and drops the run.
    written = encoded(
        _open_message(
            ({"type": "text", "text": ""}, [{"type": "text_delta", "text": "Hello"}]),
        )
    )
    for item in written:
        AGUI_EVENT.validate_python(item)
    assert [e["type"] for e in written] == [
        "RUN_STARTED",
        "STEP_STARTED",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "STEP_FINISHED",
        "RUN_FINISHED",
    ]


def test_a_call_with_no_argument_fragments_has_json_arguments() -> None:
    # A tool that takes no parameters: the client's arguments are "{}", not "".
    call = {"type": "tool_use", "id": "call_1", "name": "now", "input": {}}
    written = encoded(
        [
            *_open_message(({"type": "tool_use", **call}, [])),
            event("content_block_stop", index=0),
        ]
    )
    args = [e for e in written if e["type"] == "TOOL_CALL_ARGS"]
    assert [(e["toolCallId"], e["delta"]) for e in args] == [("call_1", "{}")]
    kinds = [e["type"] for e in written]
    assert kinds.index("TOOL_CALL_ARGS") < kinds.index("TOOL_CALL_END")
