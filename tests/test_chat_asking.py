"""A turn that asks, served as OpenAI Chat Completions (docs/asking.md, docs/dialects.md):
the ``openai`` SDK reads a question as a tool call of ``ask_user``, an approval request as
one of ``approve_tool_call`` (the call it gates not written), a client call as a tool
call, with ``finish_reason`` ``tool_calls``; it answers with ``tool`` messages and reads
the continuation as the new completion, streamed or not. The same answers again are the
same continuation (no second run); others are a 409, unknown tool call ids a 400."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import pytest
from starlette.applications import Starlette

from essessey import Answered, InMemorySink, Publisher, StreamHub, continue_turn, stream_turn
from essessey.bindings.sse import SSEDecoder
from essessey.dialects.chat_completions import (
    ChatCompletionRequest,
    ChatCompletionsEncoder,
    chat_completions_routes,
    completion,
)
from essessey.event import Event
from essessey.hub import TurnProducer
from tests.processes import WAIT
from tests.servers import serve

pytestmark = pytest.mark.anyio

SCHEMA = {"enum": ["C", "F"]}


def asking_turn(request: ChatCompletionRequest) -> TurnProducer:
    """Asks what the last user message names: ``client`` (``get_location``, run by the
    client), ``approval`` (of its call ``pay``), ``question`` (a unit)."""
    asks = str(request.messages[-1].get("content"))
    suffix = secrets.token_hex(4)

    async def produce(publisher: Publisher) -> None:
        async with stream_turn(
            publisher, message_id="msg_" + suffix, stream_id=request.id, model="m"
        ) as turn:
            await (await turn.text()).write("Let me see.")
            if "client" in asks:
                await turn.call_client_tool("get_location", {"precise": True})
            if "approval" in asks:
                tools = await turn.tools()
                await tools.start_call("call_lookup_" + suffix, "lookup", '{"q":"x"}')
                await tools.start_call("call_pay_" + suffix, "pay", '{"usd":5}')
                await tools.write_result("call_lookup_" + suffix, "found")
                await turn.ask_approval("call_pay_" + suffix, reason="spends money")
            if "question" in asks:
                await turn.ask("Which unit?", schema=SCHEMA)

    return produce


@dataclass
class App:
    url: str
    runs: list[str] = field(default_factory=list)


@pytest.fixture
def app() -> Iterator[App]:
    runs: list[str] = []

    async def go_on(publisher: Publisher, answered: Answered) -> None:
        runs.append(answered.stream_id)
        said: list[str] = []
        async with continue_turn(publisher, answered) as turn:
            for call, output in answered.tool_outputs():
                said.append(f"{call.name}={output.text}")
            for request, approval in answered.approvals():
                if approval.approved:
                    await turn.tool_result(request.tool_use_id, {"paid": True})
                    said.append("paid")
                else:
                    said.append(f"not paid ({approval.reason})")
            for _, answer in answered.questions():
                said.append(f"unit={json.dumps(answer.value)}")
            await (await turn.text()).write("Done: " + ", ".join(said))

    hub = StreamHub(on_answer=go_on)
    routes = list(chat_completions_routes(hub, asking_turn))
    with serve(Starlette(routes=routes, lifespan=hub.lifespan), lifespan="on") as url:
        yield App(url, runs)


def client(base: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)


@dataclass
class Read:
    """A completion as a client reads it, streamed or whole."""

    id: str
    content: str
    tool_calls: list[dict[str, Any]]
    finish_reason: str | None


async def ask(sdk: openai.AsyncOpenAI, messages: list[dict[str, Any]], stream: bool) -> Read:
    if not stream:
        whole = await sdk.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
        choice = whole.choices[0]
        calls = [
            {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}  # type: ignore[union-attr]
            for c in choice.message.tool_calls or []
        ]
        return Read(whole.id, choice.message.content or "", calls, choice.finish_reason)
    chunks = await sdk.chat.completions.create(model="m", messages=messages, stream=True)  # type: ignore[arg-type]
    content, finish, completion_id = "", None, ""
    by_index: dict[int, dict[str, Any]] = {}
    async for chunk in chunks:
        completion_id = chunk.id
        for choice in chunk.choices:
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
            for call in choice.delta.tool_calls or []:
                entry = by_index.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                entry["id"] = call.id or entry["id"]
                if call.function is not None:
                    entry["name"] += call.function.name or ""
                    entry["arguments"] += call.function.arguments or ""
    return Read(completion_id, content, [by_index[k] for k in sorted(by_index)], finish)


def answer_messages(first: Read, tools: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """The conversation that answers ``first``'s tool calls: (id, content) each."""
    assistant = {
        "role": "assistant",
        "content": first.content,
        "tool_calls": [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for c in first.tool_calls
        ],
    }
    answers = [{"role": "tool", "tool_call_id": key, "content": text} for key, text in tools]
    return [{"role": "user", "content": "x"}, assistant, *answers]


# -- the encoder ----------------------------------------------------------------------------


async def test_the_encoder_writes_requests_as_tool_calls_and_ends_with_the_asking_message() -> None:
    sink = InMemorySink()
    request = ChatCompletionRequest("chatcmpl-x", "m", [{"role": "user", "content": "approval"}])
    await asking_turn(request)(Publisher(sink))
    events = [Event(e.event, e.data, str(n + 1)) for n, e in enumerate(sink.events)]
    encoder = ChatCompletionsEncoder("chatcmpl-x")
    body = b"".join(encoder.encode(e) for e in events) + encoder.finish()
    decoder = SSEDecoder()
    datas = [m.data for m in decoder.feed(body) + decoder.close()]
    assert datas[-1] == "[DONE]"
    chunks = [json.loads(d) for d in datas[:-1]]
    calls = [c for chunk in chunks for c in chunk["choices"][0]["delta"].get("tool_calls", [])]
    assert [(c["index"], c["function"]["name"]) for c in calls] == [
        (0, "lookup"),
        (1, "approve_tool_call"),
    ]
    arguments = json.loads(calls[1]["function"]["arguments"])
    assert arguments["name"] == "pay"
    assert arguments["arguments"] == '{"usd":5}'
    assert arguments["reason"] == "spends money"
    assert arguments["tool_use_id"].startswith("call_pay_")
    assert calls[1]["id"].startswith("apr_")
    finishes = [chunk["choices"][0]["finish_reason"] for chunk in chunks]
    assert [f for f in finishes if f] == ["tool_calls"]
    whole = completion(events, "chatcmpl-x")
    message = whole["choices"][0]["message"]
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["lookup", "approve_tool_call"]
    assert whole["choices"][0]["finish_reason"] == "tool_calls"


# -- served, read and answered by the openai SDK --------------------------------------------


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
async def test_a_question_a_client_call_and_an_approval_answered_by_tool_messages(
    app: App, stream: bool
) -> None:
    async with client(app.url) as sdk:
        first = await ask(sdk, [{"role": "user", "content": "client approval question"}], stream)
        assert first.finish_reason == "tool_calls"
        assert first.content == "Let me see."
        names = [c["name"] for c in first.tool_calls]
        assert names == ["get_location", "lookup", "approve_tool_call", "ask_user"]
        location, _, approval, question = first.tool_calls
        assert json.loads(question["arguments"]) == {"question": "Which unit?", "schema": SCHEMA}
        assert json.loads(approval["arguments"])["name"] == "pay"
        answers = [
            (location["id"], "Paris"),
            (approval["id"], json.dumps({"approved": True})),
            (question["id"], '"F"'),
        ]
        second = await ask(sdk, answer_messages(first, answers), stream)
        assert second.content == 'Done: get_location=Paris, paid, unit="F"'
        assert second.finish_reason == "stop"
        assert second.tool_calls == []
        assert second.id.startswith(first.id + ".")

        again = await ask(sdk, answer_messages(first, answers), not stream)
        assert (again.id, again.content) == (second.id, second.content)
        assert len(app.runs) == 1  # one run for two answers

        answers[1] = (approval["id"], json.dumps({"approved": False, "reason": "no"}))
        with pytest.raises(openai.ConflictError) as conflict:
            await ask(sdk, answer_messages(first, answers), stream)
        assert conflict.value.code == "already_answered"


async def test_a_denial_with_a_reason_and_a_plain_text_answer(app: App) -> None:
    async with client(app.url) as sdk:
        first = await ask(sdk, [{"role": "user", "content": "approval question"}], True)
        _, approval, question = first.tool_calls
        answers = [
            (approval["id"], json.dumps({"approved": False, "reason": "too much"})),
            (question["id"], "C"),
        ]
        second = await ask(sdk, answer_messages(first, answers), True)
    assert second.content == 'Done: not paid (too much), unit="C"'


async def test_unknown_or_malformed_answers_are_400s(app: App) -> None:
    async with client(app.url) as sdk:
        first = await ask(sdk, [{"role": "user", "content": "approval question"}], False)
        _, approval, question = first.tool_calls
        with pytest.raises(openai.BadRequestError) as unknown:
            await ask(sdk, answer_messages(first, [("call_nope", "x")]), False)
        assert unknown.value.type == "invalid_request_error"
        with pytest.raises(openai.BadRequestError):  # one left unanswered
            await ask(sdk, answer_messages(first, [(question["id"], "C")]), False)
        with pytest.raises(openai.BadRequestError) as malformed:  # an approval needs JSON
            await ask(
                sdk, answer_messages(first, [(approval["id"], "yes"), (question["id"], "C")]), True
            )
        assert "approve_tool_call" in str(malformed.value)
        with pytest.raises(openai.BadRequestError) as stray:  # an answer and a stray one
            await ask(
                sdk,
                answer_messages(
                    first,
                    [
                        (approval["id"], '{"approved": true}'),
                        (question["id"], "C"),
                        ("call_nope", "x"),
                    ],
                ),
                False,
            )
        assert stray.value.code == "invalid_answer"
    assert app.runs == []


async def test_an_answer_nested_deeper_than_json_is_written_is_a_400_and_the_turn_waits(
    app: App,
) -> None:
    # A question's answer is its tool message's content, JSON-decoded: orjson reads 1,024
    # levels of nesting in that text but writes 255, so an answer nested deeper was taken,
    # and writing its record failed: the continuation ended with an error event and the
    # question was lost.
    async with client(app.url) as sdk:
        first = await ask(sdk, [{"role": "user", "content": "question"}], False)
        [question] = first.tool_calls
        deep = "[" * 300 + "]" * 300
        with pytest.raises(openai.BadRequestError) as refused:
            await ask(sdk, answer_messages(first, [(question["id"], deep)]), False)
        assert refused.value.code == "invalid_answer"
        assert app.runs == []
        # Still waiting: a good answer continues it.
        second = await ask(sdk, answer_messages(first, [(question["id"], '"C"')]), False)
    assert second.content == 'Done: unit="C"'


async def test_the_continuation_resumes_by_its_id(app: App) -> None:
    async with client(app.url) as sdk:
        first = await ask(sdk, [{"role": "user", "content": "question"}], False)
        [question] = first.tool_calls
        second = await ask(sdk, answer_messages(first, [(question["id"], "C")]), True)
    async with httpx.AsyncClient(timeout=WAIT) as http:
        again = await http.get(f"{app.url}/v1/chat/completions/{second.id}")
        opening = await http.get(f"{app.url}/v1/chat/completions/{first.id}")
    decoder = SSEDecoder()
    datas = [m.data for m in decoder.feed(again.content) + decoder.close()]
    assert datas[-1] == "[DONE]"
    chunks = [json.loads(d) for d in datas[:-1]]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert content == second.content == 'Done: unit="C"'
    decoder = SSEDecoder()
    datas = [m.data for m in decoder.feed(opening.content) + decoder.close()]
    chunks = [json.loads(d) for d in datas[:-1]]
    # The turn's first completion ends with the message that asked.
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert content == "Let me see."
