"""A turn that asks, served as OpenAI Responses (docs/asking.md, docs/dialects.md): the
``openai`` SDK reads an approval request as an ``mcp_approval_request`` (the call it gates
not written), a question as a ``function_call`` of ``ask_user``, a client call as a
``function_call``; it answers with ``previous_response_id`` and ``mcp_approval_response``
/ ``function_call_output`` items, and reads the continuation as the new response, streamed
or not. The same answer again is the same continuation (no second run); another is a 409,
unknown ids a 400, an unknown response a 404."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter
from starlette.applications import Starlette

from essessey import Answered, InMemorySink, Publisher, StreamHub, continue_turn, stream_turn
from essessey.adapters import openai_responses
from essessey.dialects.responses import ResponsesEncoder, ResponsesRequest, responses_routes
from essessey.event import Event
from essessey.hub import TurnProducer
from tests.processes import WAIT
from tests.servers import serve

pytestmark = pytest.mark.anyio

STREAM_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
SCHEMA = {"enum": ["C", "F"]}


def provider_events(approval_id: str) -> list[dict[str, Any]]:
    """A provider's Responses stream that asks to approve an MCP call (as OpenAI sends
    one for an MCP server with ``require_approval``)."""
    response = {"id": "resp_provider", "object": "response", "created_at": 1, "model": "gpt"}
    response.update(parallel_tool_calls=True, tool_choice="auto", tools=[])
    item = {"type": "mcp_approval_request", "id": approval_id, "server_label": "deepwiki"}
    item.update(name="pay", arguments='{"usd":5}')
    return [
        {
            "type": "response.created",
            "sequence_number": 0,
            "response": dict(response, status="in_progress", output=[]),
        },
        {
            "type": "response.output_item.added",
            "sequence_number": 1,
            "output_index": 0,
            "item": item,
        },
        {
            "type": "response.output_item.done",
            "sequence_number": 2,
            "output_index": 0,
            "item": item,
        },
        {
            "type": "response.completed",
            "sequence_number": 3,
            "response": dict(response, status="completed", output=[item]),
        },
    ]


def asking_turn(request: ResponsesRequest) -> TurnProducer:
    """Asks what ``input`` names: ``approval`` (of its call ``pay``), or ``question`` (a
    unit) and ``client`` (``get_location``, run by the client); ``proxied``: a provider's
    MCP approval request, through the Responses adapter."""
    asks = str(request.input)
    suffix = secrets.token_hex(4)
    if asks == "proxied":

        async def proxied(publisher: Publisher) -> None:
            events = provider_events("mcpr_" + suffix)
            await openai_responses.publish(
                publisher, events, message_id="msg_" + suffix, stream_id=request.id
            )

        return proxied

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
            for request, approval in answered.approvals():
                if approval.approved:
                    await turn.tool_result(request.tool_use_id, {"paid": True})
                    said.append("paid")
                else:
                    said.append(f"not paid ({approval.reason})")
            for _, answer in answered.questions():
                said.append(f"unit={json.dumps(answer.value)}")
            for call, output in answered.tool_outputs():
                said.append(f"{call.name}={output.text}")
            await (await turn.text()).write("Done: " + ", ".join(said))

    hub = StreamHub(on_answer=go_on)
    served = Starlette(routes=list(responses_routes(hub, asking_turn)), lifespan=hub.lifespan)
    with serve(served, lifespan="on") as url:
        yield App(url, runs)


def client(base: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)


async def streamed(sdk: openai.AsyncOpenAI, **request: Any) -> tuple[Any, list[Any]]:
    """The final response of a streamed request, and its events, each validated."""
    stream = await sdk.responses.create(model="m", stream=True, **request)
    events = [event async for event in stream]
    for event in events:
        STREAM_EVENT.validate_python(event.model_dump())
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created"
    assert events[-1].type == "response.completed"
    return events[-1].response, events


async def answered_stream(sdk: openai.AsyncOpenAI, previous: str, items: list[Any]) -> Any:
    final, _ = await streamed(sdk, previous_response_id=previous, input=items)
    return final


def items_of(response: Any, kind: str) -> list[Any]:
    return [item for item in response.output if item.type == kind]


# -- the encoder ----------------------------------------------------------------------------


async def test_a_gated_call_is_an_mcp_approval_request_and_not_a_function_call() -> None:
    sink = InMemorySink()
    await asking_turn(ResponsesRequest("resp_x", "m", "approval question client"))(Publisher(sink))
    events = [Event(e.event, e.data, str(n + 1)) for n, e in enumerate(sink.events)]
    encoder = ResponsesEncoder("resp_x", created_at=1)
    body = b"".join(encoder.encode(e) for e in events) + encoder.finish()
    final = encoder.response()
    assert final["status"] == "completed"
    kinds = [item["type"] for item in final["output"]]
    assert kinds == [
        "message",
        "function_call",  # the client call
        "function_call",  # lookup, run by the turn
        "function_call_output",  # lookup's
        "mcp_approval_request",  # pay, not written as a call
        "function_call",  # the question
    ]
    location, lookup, question = items_of_dicts(final, "function_call")
    assert lookup["name"] == "lookup"
    [approval] = items_of_dicts(final, "mcp_approval_request")
    assert (approval["name"], approval["arguments"], approval["server_label"]) == (
        "pay",
        '{"usd":5}',
        "essessey",
    )
    assert approval["id"].startswith("apr_")
    assert question["name"] == "ask_user"
    assert question["call_id"].startswith("q_")
    assert json.loads(question["arguments"]) == {"question": "Which unit?", "schema": SCHEMA}
    assert location["name"] == "get_location"
    assert b"call_pay_" not in body.split(b"mcp_approval_request")[0]  # never as a call
    numbers = [
        json.loads(line[6:])["output_index"]
        for line in body.split(b"\n")
        if line.startswith(b"data: ") and b'"response.output_item.done"' in line
    ]
    assert numbers == list(range(6))


def items_of_dicts(response: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [item for item in response["output"] if item["type"] == kind]


# -- served, read and answered by the openai SDK --------------------------------------------


async def test_an_approval_streamed_then_approved_continues_once(app: App) -> None:
    async with client(app.url) as sdk:
        first, _ = await streamed(sdk, input="approval")
        assert first.status == "completed"
        [request] = items_of(first, "mcp_approval_request")
        assert (request.name, request.arguments, request.server_label) == (
            "pay",
            '{"usd":5}',
            "essessey",
        )
        calls = items_of(first, "function_call")
        assert [c.name for c in calls] == ["lookup"]  # the gated call is not one
        approve = [
            {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}
        ]
        second, events = await streamed(sdk, previous_response_id=first.id, input=approve)
        assert second.id.startswith(first.id + ".")
        assert second.output_text == "Done: paid"
        # The continuation's own result of the approved call; no record of the answer.
        [result] = items_of(second, "function_call_output")
        assert result.call_id.startswith("call_pay_")
        assert json.loads(result.output) == {"paid": True}
        assert [item.type for item in second.output] == ["function_call_output", "message"]
        assert events[0].response.id == second.id  # type: ignore[union-attr]

        again = await answered_stream(sdk, first.id, approve)
        assert (again.id, again.output_text) == (second.id, second.output_text)
        again_whole = await sdk.responses.create(
            model="m", previous_response_id=first.id, input=approve
        )
        assert (again_whole.id, again_whole.output_text) == (second.id, "Done: paid")
        assert app.runs == [first.id]  # one run for three answers

        deny = [dict(approve[0], approve=False)]
        with pytest.raises(openai.ConflictError) as conflict:
            await sdk.responses.create(model="m", previous_response_id=first.id, input=deny)
        assert conflict.value.status_code == 409
        assert conflict.value.code == "already_answered"

        retrieved = await sdk.responses.retrieve(second.id)
        assert retrieved.output_text == "Done: paid"
        resumed = await sdk.responses.retrieve(second.id, stream=True, starting_after=2)
        tail = [event async for event in resumed]
        assert tail[0].sequence_number == 3
        assert tail[-1].type == "response.completed"
        original = await sdk.responses.retrieve(first.id)
        assert [item.type for item in original.output] == [item.type for item in first.output]


async def test_an_approval_denied_with_a_reason_not_streamed(app: App) -> None:
    async with client(app.url) as sdk:
        first = await sdk.responses.create(model="m", input="approval")
        assert first.status == "completed"
        [request] = items_of(first, "mcp_approval_request")
        deny = {
            "type": "mcp_approval_response",
            "approval_request_id": request.id,
            "approve": False,
            "reason": "too much",
        }
        second = await sdk.responses.create(model="m", previous_response_id=first.id, input=[deny])
    assert second.status == "completed"
    assert second.output_text == "Done: not paid (too much)"
    assert items_of(second, "function_call_output") == []


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
async def test_a_question_and_a_client_call_answered_by_function_call_outputs(
    app: App, stream: bool
) -> None:
    async with client(app.url) as sdk:
        if stream:
            first, _ = await streamed(sdk, input="question client")
        else:
            first = await sdk.responses.create(model="m", input="question client")
        location, question = items_of(first, "function_call")
        assert question.name == "ask_user"
        assert json.loads(question.arguments) == {"question": "Which unit?", "schema": SCHEMA}
        assert location.name == "get_location"
        assert json.loads(location.arguments) == {"precise": True}
        answers = [
            {"type": "function_call_output", "call_id": question.call_id, "output": '"C"'},
            {"type": "function_call_output", "call_id": location.call_id, "output": "Paris"},
        ]
        if stream:
            second = await answered_stream(sdk, first.id, answers)
        else:
            second = await sdk.responses.create(
                model="m", previous_response_id=first.id, input=answers
            )
    assert second.output_text == 'Done: unit="C", get_location=Paris'
    # The client's outputs are what it sent: not written back as output items.
    assert [item.type for item in second.output] == ["message"]
    assert app.runs == [first.id]


async def test_an_answer_to_every_function_call_skips_those_the_turn_ran(app: App) -> None:
    # A client that answers each function_call it was shown answers the one the turn
    # ran itself too (its function_call_output is in the response): that was a 400.
    async with client(app.url) as sdk:
        first = await sdk.responses.create(model="m", input="approval question client")
        answers: list[dict[str, Any]] = [
            {"type": "function_call_output", "call_id": call.call_id, "output": '"C"'}
            for call in items_of(first, "function_call")
        ]
        [approval] = items_of(first, "mcp_approval_request")
        answers.append(
            {"type": "mcp_approval_response", "approval_request_id": approval.id, "approve": True}
        )
        second = await sdk.responses.create(model="m", previous_response_id=first.id, input=answers)
    assert second.status == "completed"
    assert app.runs == [first.id]


async def test_a_plain_text_answer_to_a_question_is_the_text(app: App) -> None:
    async with client(app.url) as sdk:
        first = await sdk.responses.create(model="m", input="question")
        [question] = items_of(first, "function_call")
        answer = {"type": "function_call_output", "call_id": question.call_id, "output": "C"}
        second = await sdk.responses.create(
            model="m", previous_response_id=first.id, input=[answer]
        )
    assert second.output_text == 'Done: unit="C"'


async def test_unknown_ids_a_400_an_unknown_response_a_404(app: App) -> None:
    async with client(app.url) as sdk:
        first = await sdk.responses.create(model="m", input="question")
        [question] = items_of(first, "function_call")
        wrong = {"type": "function_call_output", "call_id": "q_nope", "output": "C"}
        with pytest.raises(openai.BadRequestError) as unknown:
            await sdk.responses.create(model="m", previous_response_id=first.id, input=[wrong])
        assert unknown.value.code == "invalid_answer"
        right = {"type": "function_call_output", "call_id": question.call_id, "output": "C"}
        with pytest.raises(openai.BadRequestError):  # an answer and a stray one
            await sdk.responses.create(
                model="m", previous_response_id=first.id, input=[right, wrong]
            )
        with pytest.raises(openai.BadRequestError):  # an approval for a question
            await sdk.responses.create(
                model="m",
                previous_response_id=first.id,
                input=[
                    {
                        "type": "mcp_approval_response",
                        "approval_request_id": question.call_id,
                        "approve": True,
                    }
                ],
            )
        with pytest.raises(openai.NotFoundError):
            await sdk.responses.create(model="m", previous_response_id="resp_none", input=[right])
    assert app.runs == []
    async with httpx.AsyncClient(timeout=WAIT) as http:
        mixed = await http.post(
            f"{app.url}/v1/responses",
            json={
                "model": "m",
                "previous_response_id": first.id,
                "input": [right, {"role": "user", "content": "and?"}],
            },
        )
    assert mixed.status_code == 400
    assert mixed.json()["error"]["type"] == "invalid_request_error"


async def test_a_continuation_that_asks_again_is_answered_by_its_own_id(app: App) -> None:
    """The continuation's id is the next answer's ``previous_response_id``."""
    async with client(app.url) as sdk:
        first = await sdk.responses.create(model="m", input="client")
        [call] = items_of(first, "function_call")
        answer = {"type": "function_call_output", "call_id": call.call_id, "output": "Oslo"}
        second = await sdk.responses.create(
            model="m", previous_response_id=first.id, input=[answer]
        )
        retrieved = await sdk.responses.retrieve(second.id)
    assert second.output_text == "Done: get_location=Oslo"
    assert retrieved.id == second.id
    assert retrieved.output_text == second.output_text


async def test_a_provider_s_mcp_approval_request_is_answered_through_the_dialect(app: App) -> None:
    """A proxied provider's ``mcp_approval_request`` (essessey.adapters.openai_responses)
    goes out as one, and an ``mcp_approval_response`` naming it continues the turn."""
    async with client(app.url) as sdk:
        first, _ = await streamed(sdk, input="proxied")
        [request] = items_of(first, "mcp_approval_request")
        assert request.id.startswith("mcpr_")
        assert (request.name, request.arguments) == ("pay", '{"usd":5}')
        assert items_of(first, "function_call") == []
        approve = {"type": "mcp_approval_response", "approval_request_id": request.id}
        second = await answered_stream(sdk, first.id, [dict(approve, approve=True)])
    assert second.output_text == "Done: paid"
    [result] = items_of(second, "function_call_output")
    assert result.call_id == request.id + "_call"
