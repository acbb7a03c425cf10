"""The demo serves its scripted turn in every dialect, at the paths each dialect's clients
use by default: the openai SDK reads Chat Completions and Responses from its /v1, an
AG-UI run is a POST /agui, any stream reads again as each dialect, and no bad body gets a
500."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from essessey.bindings.sse import SSEDecoder
from essessey.demo import create_app
from tests.processes import WAIT
from tests.servers import serve

pytestmark = pytest.mark.anyio

HI = [{"role": "user", "content": "Weather in Paris and Tokyo?"}]


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with serve(create_app(), lifespan="on") as url:
        yield url


def sdk(base: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)


async def test_chat_completions_streamed_and_whole(base_url: str) -> None:
    async with sdk(base_url) as client:
        async with client.chat.completions.stream(
            model="demo",
            messages=HI,  # type: ignore[arg-type]
            extra_body={"deltas": 5},
        ) as stream:
            async for _ in stream:
                pass
            final = await stream.get_final_completion()
        whole = await client.chat.completions.create(
            model="demo",
            messages=HI,  # type: ignore[arg-type]
            extra_body={"deltas": 5},
        )
    for completion in (final, whole):
        message = completion.choices[0].message
        assert message.content
        cities = [json.loads(c.function.arguments)["city"] for c in message.tool_calls or []]
        assert cities == ["Paris", "Tokyo"]
    assert whole.object == "chat.completion"


async def test_responses_in_the_background_resume_after_a_sequence_number(
    base_url: str,
) -> None:
    async with sdk(base_url) as client:
        stream = await client.responses.create(
            model="demo",
            input="Weather?",
            stream=True,
            background=True,
            extra_body={"deltas": 20, "delay_ms": 10},
        )
        first = []
        async for event in stream:
            first.append(event)
            if len(first) == 6:
                break
        await stream.close()
        response_id = first[0].response.id  # type: ignore[union-attr]
        rest = await client.responses.retrieve(
            response_id, stream=True, starting_after=first[-1].sequence_number
        )
        tail = [event async for event in rest]
    numbers = [e.sequence_number for e in first + tail]
    assert numbers == list(range(len(numbers)))
    assert tail[-1].type == "response.completed"


async def test_an_agui_run_streams_to_run_finished(base_url: str) -> None:
    run = {
        "threadId": "t",
        "runId": "r",
        "messages": [],
        "tools": [],
        "context": [],
        "state": {},
        "forwardedProps": {"deltas": 5},
    }
    async with httpx.AsyncClient(timeout=WAIT) as http:
        response = await http.post(f"{base_url}/agui", json=run)
    decoder = SSEDecoder()
    kinds = [json.loads(m.data)["type"] for m in decoder.feed(response.content) + decoder.close()]
    assert (kinds[0], kinds[-1]) == ("RUN_STARTED", "RUN_FINISHED")
    assert kinds.count("TOOL_CALL_RESULT") == 2


@pytest.mark.parametrize(
    ("dialect", "end"),
    [
        ("ui", b"data: [DONE]"),
        ("agui", b'"RUN_FINISHED"'),
        ("chat-completions", b"data: [DONE]"),
        ("responses", b"response.completed"),
    ],
)
async def test_a_stream_reads_again_in_each_dialect(
    base_url: str, dialect: str, end: bytes
) -> None:
    async with httpx.AsyncClient(timeout=WAIT) as http:
        started = await http.post(f"{base_url}/streams", json={"deltas": 5})
        stream_id = started.json()["stream_id"]
        again = await http.get(f"{base_url}/streams/{stream_id}/as/{dialect}")
        page = await http.get(f"{base_url}/")
    assert again.status_code == 200, again.text
    assert end in again.content.rstrip().rsplit(b"\n\n", 1)[-1]
    assert f'data-dialect="{dialect}"' in page.text  # the page links the turn in it


async def test_an_unknown_dialect_is_a_404(base_url: str) -> None:
    async with httpx.AsyncClient(timeout=WAIT) as http:
        started = await http.post(f"{base_url}/streams", json={"deltas": 5})
        stream_id = started.json()["stream_id"]
        response = await http.get(f"{base_url}/streams/{stream_id}/as/klingon")
    assert response.status_code == 404
    assert "known: ui, agui, chat-completions, responses" in response.json()["error"]["message"]


BAD_BODIES = [
    b"",
    b"{not json",
    b"[]",
    b"null",
    b'"text"',
    b'{"model": 1}',
    b'{"model": "m", "messages": {}, "input": 5}',
    b'{"threadId": [], "runId": {}, "messages": null}',
    # Valid for each dialect but for the demo's own option, out of range.
    b'{"model": "m", "messages": [{"role": "user"}], "input": "x", "deltas": -1, '
    b'"threadId": "t", "runId": "bad-deltas", "forwardedProps": {"deltas": -1}}',
    b"[" * 300 + b"]" * 300,
]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses", "/agui"])
@pytest.mark.parametrize("body", BAD_BODIES)
async def test_bad_bodies_are_a_400_in_the_dialect_s_shape(
    base_url: str, path: str, body: bytes
) -> None:
    async with httpx.AsyncClient(timeout=WAIT) as http:
        response = await http.post(
            f"{base_url}{path}", content=body, headers={"content-type": "application/json"}
        )
    assert response.status_code == 400, response.text
    error = response.json()
    if path == "/agui":
        assert error["type"] == "RUN_ERROR"
        assert error["message"]
    else:
        assert set(error["error"]) == {"message", "type", "param", "code"}


# -- the scenarios that ask, answered in a dialect --------------------------------------


async def test_the_approval_scenario_over_responses(base_url: str) -> None:
    async with sdk(base_url) as client:
        first = await client.responses.create(
            model="demo", input="Weather?", extra_body={"scenario": "approval"}
        )
        requests = [item for item in first.output if item.type == "mcp_approval_request"]
        assert [json.loads(r.arguments)["city"] for r in requests] == ["Paris", "Tokyo"]
        assert not [item for item in first.output if item.type == "function_call"]
        answers = [
            {"type": "mcp_approval_response", "approval_request_id": r.id, "approve": ok}
            for r, ok in zip(requests, (True, False), strict=True)
        ]
        second = await client.responses.create(
            model="demo",
            previous_response_id=first.id,
            input=answers,  # type: ignore[arg-type]
        )
    assert second.status == "completed"
    assert "Paris has light rain at 18 °C." in second.output_text
    assert "You declined the lookup for Tokyo" in second.output_text


async def test_the_client_tool_scenario_over_chat_completions(base_url: str) -> None:
    async with sdk(base_url) as client:
        first = await client.chat.completions.create(
            model="demo",
            messages=HI,  # type: ignore[arg-type]
            extra_body={"scenario": "client_tool"},
        )
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls"
        [call] = choice.message.tool_calls or []
        assert call.function.name == "get_location"
        second = await client.chat.completions.create(
            model="demo",
            messages=[
                *HI,
                choice.message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": '{"city": "Tokyo"}'},
            ],  # type: ignore[list-item]
        )
    content = second.choices[0].message.content
    assert content == "You are in Tokyo. Tokyo has clear skies at 24 °C."


async def test_the_approval_scenario_over_agui(base_url: str) -> None:
    def run(run_id: str, **extra: object) -> dict[str, object]:
        body: dict[str, object] = {
            "threadId": "t-ask",
            "runId": run_id,
            "messages": [],
            "tools": [],
            "context": [],
            "state": {},
            "forwardedProps": {"scenario": "approval"},
        }
        return {**body, **extra}

    def events(response: httpx.Response) -> list[dict[str, object]]:
        decoder = SSEDecoder()
        return [json.loads(m.data) for m in decoder.feed(response.content) + decoder.close()]

    async with httpx.AsyncClient(timeout=WAIT) as http:
        first = events(await http.post(f"{base_url}/agui", json=run("r1")))
        outcome = first[-1]["outcome"]
        assert isinstance(outcome, dict)
        assert outcome["type"] == "interrupt"
        interrupts = outcome["interrupts"]
        assert [i["reason"] for i in interrupts] == ["tool_approval", "tool_approval"]
        resume = [
            {"interruptId": interrupts[0]["id"], "status": "resolved"},
            {"interruptId": interrupts[1]["id"], "status": "cancelled"},
        ]
        second = events(await http.post(f"{base_url}/agui", json=run("r2", resume=resume)))
    assert (second[0]["type"], second[-1]["type"]) == ("RUN_STARTED", "RUN_FINISHED")
    text = "".join(str(e["delta"]) for e in second if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert "Paris has light rain at 18 °C." in text
    assert "You declined the lookup for Tokyo" in text


def test_the_approval_scenario_over_the_ui_stream(base_url: str) -> None:
    from tests.test_ui_asking import asking_message, chunks_of, of_type, user

    body = {"id": "demo-ask", "messages": [user("Weather?")], "trigger": "submit-message"}
    body["scenario"] = "approval"
    first = chunks_of(httpx.post(f"{base_url}/api/chat", json=body, timeout=WAIT).content)
    message_id = first[0]["messageId"]
    requests = of_type(first, "tool-approval-request")
    assert len(requests) == 2
    paris, tokyo = (r["toolCallId"] for r in requests)
    states = {
        r["toolCallId"]: {
            "state": "approval-responded",
            "approval": {"id": r["approvalId"], "approved": r["toolCallId"] == paris},
        }
        for r in requests
    }
    answer = {
        "id": "demo-ask",
        "messages": [user("Weather?"), asking_message(message_id, first, **states)],
        "trigger": "submit-message",
        "messageId": message_id,
    }
    second = chunks_of(httpx.post(f"{base_url}/api/chat", json=answer, timeout=WAIT).content)
    assert second[0] == {"type": "start", "messageId": message_id}
    assert [c["toolCallId"] for c in of_type(second, "tool-output-available")] == [paris]
    assert [c["toolCallId"] for c in of_type(second, "tool-output-denied")] == [tokyo]
    text = "".join(c["delta"] for c in of_type(second, "text-delta"))
    assert "You declined the lookup for Tokyo" in text
