"""OpenAI Responses served from the hub: the ``openai`` SDK reads the scripted turn (every
event validated as a ``ResponseStreamEvent``), a reader that dropped resumes with
``responses.retrieve(id, stream=True, starting_after=N)``, and this project's own
Responses adapter reads the served stream back into the same turn."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import openai
import orjson
import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter
from starlette.applications import Starlette

from essessey import (
    Event,
    InMemoryEventStore,
    InMemorySink,
    Publisher,
    StreamHub,
    reassemble_events,
    stream_turn,
)
from essessey.adapters import openai_responses
from essessey.bindings.sse import SSEDecoder
from essessey.dialects.responses import ResponsesEncoder, ResponsesRequest, responses_routes
from essessey.hub import TurnProducer
from tests.processes import WAIT
from tests.scripted_turn import ANSWER, THINKING, scripted_turn
from tests.servers import serve

pytestmark = pytest.mark.anyio

STREAM_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def answer(request: ResponsesRequest) -> TurnProducer:
    delay = float(request.body.get("delay_ms", 0)) / 1000
    return scripted_turn(request.id, delay=delay, fail=bool(request.body.get("fail")))


@pytest.fixture
def base_url() -> Iterator[str]:
    hub = StreamHub()

    app = Starlette(routes=list(responses_routes(hub, answer)), lifespan=hub.lifespan)
    with serve(app, lifespan="on") as url:
        yield url


def client(base: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)


async def scripted_events(*, fail: bool = False) -> list[Event]:
    sink = InMemorySink()
    await scripted_turn("resp", fail=fail)(Publisher(sink))
    return [Event(e.event, e.data, str(n + 1)) for n, e in enumerate(sink.events)]


def events_of(body: bytes) -> list[dict[str, Any]]:
    decoder = SSEDecoder()
    messages = decoder.feed(body) + decoder.close()
    out = []
    for message in messages:
        data = json.loads(message.data)
        assert message.event == data["type"]
        out.append(data)
    return out


def normalized(event: Any) -> dict[str, Any]:
    """``event`` as a dict, without the time each request's encoder stamps."""
    dumped: dict[str, Any] = event.model_dump()
    if "response" in dumped:
        dumped["response"].pop("created_at")
    return dumped


# -- the encoder ----------------------------------------------------------------------------


async def test_every_event_validates_and_numbers_count_up_from_zero() -> None:
    encoder = ResponsesEncoder("resp_1", created_at=5)
    body = b"".join(encoder.encode(e) for e in await scripted_events()) + encoder.finish()
    events = events_of(body)
    for event in events:
        STREAM_EVENT.validate_python(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    thinking = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    assert (text, thinking) == (ANSWER, THINKING)
    final = events[-1]["response"]
    assert [item["type"] for item in final["output"]] == [
        "reasoning",
        "message",
        "function_call",
        "function_call",
        "function_call_output",
        "function_call_output",
        "message",
    ]
    outputs = [item for item in final["output"] if item["type"] == "function_call_output"]
    assert [(o["call_id"], o["output"], o.get("is_error")) for o in outputs] == [
        ("call_paris", '{"temp_c":18}', None),
        ("call_oslo", "station offline", True),
    ]
    assert final["usage"]["output_tokens"] == 28
    assert [i["output_index"] for i in events if i["type"] == "response.output_item.done"] == list(
        range(7)
    )


def frames_of(body: bytes) -> list[tuple[str, int]]:
    """Each frame's ``id:`` and sequence number."""
    decoder = SSEDecoder()
    return [(m.id or "", json.loads(m.data)["sequence_number"]) for m in decoder.feed(body)]


async def test_starting_after_gives_every_later_frame_once_under_the_same_id(
    base_url: str,
) -> None:
    # Frames of one event carry <id>:1, <id>:2, ..., <id>; a resume by starting_after that
    # left some of an event's frames out numbered the rest from 1, so a reconnect with
    # the Last-Event-ID of one of them got a frame it had again.
    async with httpx.AsyncClient(base_url=base_url, timeout=WAIT) as http:
        created = await http.post(
            "/v1/responses", json={"model": "scripted", "input": "Weather?", "background": True}
        )
        response_id = created.json()["id"]
        params = {"stream": "true"}
        every = frames_of((await http.get(f"/v1/responses/{response_id}", params=params)).content)
        assert [number for _, number in every] == list(range(len(every)))
        for n in range(len(every)):
            params = {"stream": "true", "starting_after": str(n)}
            got = await http.get(f"/v1/responses/{response_id}", params=params)
            rest = frames_of(got.content)
            assert rest == every[n + 1 :], n
            if rest:
                # Dropped after the first frame: the reconnect goes on after it.
                headers = {"Last-Event-ID": rest[0][0]}
                again = await http.get(
                    f"/v1/responses/{response_id}", params=params, headers=headers
                )
                assert frames_of(again.content) == every[n + 2 :], n


async def test_a_resume_by_starting_after_in_a_pause_gets_its_headers_at_once() -> None:
    # The frames up to starting_after are left out, so the headers waited for a later
    # event (or the keep-alive, 15 s by default): a client's or a proxy's read timeout
    # answered for them.
    release = anyio.Event()

    def held(request: ResponsesRequest) -> TurnProducer:
        async def produce(publisher: Publisher) -> None:
            async with stream_turn(
                publisher, message_id="msg_1", stream_id=request.id, model="m"
            ) as turn:
                text = await turn.text()
                await text.write("before ")
                await release.wait()
                await text.write("after")

        return produce

    hub = StreamHub()
    routes = responses_routes(hub, held, ping_interval=60.0)
    with serve(Starlette(routes=list(routes), lifespan=hub.lifespan), lifespan="on") as url:
        async with httpx.AsyncClient(base_url=url, timeout=WAIT) as http:
            created = await http.post(
                "/v1/responses", json={"model": "m", "input": "go", "background": True}
            )
            response_id = created.json()["id"]
            # created, in_progress, the item's and the part's added, "before ": 0-4.
            params = {"stream": "true", "starting_after": "4"}
            with anyio.fail_after(WAIT):
                async with http.stream(
                    "GET", f"/v1/responses/{response_id}", params=params
                ) as response:
                    # The turn is held after what starting_after covers: no event came.
                    assert response.status_code == 200
                    release.set()
                    body = b"".join([chunk async for chunk in response.aiter_raw()])
    numbers = [number for _, number in frames_of(body)]
    assert numbers[0] == 5
    assert numbers == list(range(5, 5 + len(numbers)))


async def test_a_response_partly_evicted_is_refused_not_served_as_a_later_message() -> None:
    # Two messages in one turn, the store bounded so the first (the response) loses its
    # start: from the oldest whole message, the second's frames read as the response's.
    def two_messages(request: ResponsesRequest) -> TurnProducer:
        async def produce(publisher: Publisher) -> None:
            for n in (1, 2):
                async with stream_turn(
                    publisher, message_id=f"msg_{n}", stream_id=request.id, model="m"
                ) as turn:
                    text = await turn.text()
                    for k in range(40):
                        await text.write(f"{n}.{k} ")

        return produce

    hub = StreamHub(InMemoryEventStore(max_events_per_stream=60))
    routes = responses_routes(hub, two_messages)
    with serve(Starlette(routes=list(routes), lifespan=hub.lifespan), lifespan="on") as url:
        async with httpx.AsyncClient(base_url=url, timeout=WAIT) as http:
            created = await http.post("/v1/responses", json={"model": "m", "input": "go"})
            assert (created.status_code, created.json()["error"]["type"]) == (
                410,
                "response_evicted",
            )
            response_id = created.json()["error"]["message"].split("'")[1]
            path = f"/v1/responses/{response_id}"
            resumed = await http.get(path, params={"stream": "true", "starting_after": "30"})
            assert (resumed.status_code, resumed.json()["error"]["type"]) == (
                410,
                "resume_unavailable",
            )
            for params in ({"stream": "true"}, {}):
                read = await http.get(path, params=params)
                assert (read.status_code, read.json()["error"]["type"]) == (
                    410,
                    "response_evicted",
                )


@pytest.mark.parametrize("quick", [True, False], ids=["encode_text", "encode"])
def test_text_past_max_buffer_still_streams_and_its_done_events_hold_what_fit(
    quick: bool, caplog: pytest.LogCaptureFixture
) -> None:
    encoder = ResponsesEncoder("resp_b", created_at=5, max_buffer=10)
    body = encoder.encode(Event("message_start", b'{"type":"message_start","message":{}}'))
    body += encoder.encode(
        Event(
            "content_block_start",
            b'{"type":"content_block_start","index":0,"content_block":{"type":"text"}}',
        )
    )
    for text in ("abcdef", "ghijkl", "mnopqr"):
        if quick:
            frame = encoder.encode_text(0, text, orjson.dumps(text))
            assert frame is not None
        else:
            delta = {"type": "text_delta", "text": text}
            data = {"type": "content_block_delta", "index": 0, "delta": delta}
            frame = encoder.encode(Event("content_block_delta", json.dumps(data).encode()))
        body += frame
    body += encoder.encode(Event("content_block_stop", b'{"type":"content_block_stop","index":0}'))
    events = events_of(body)
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert deltas == ["abcdef", "ghijkl", "mnopqr"]  # every delta goes out
    done = [e for e in events if e["type"] == "response.output_text.done"]
    assert [e["text"] for e in done] == ["abcdef"]  # what fit in max_buffer
    warnings = [r for r in caplog.records if "passed 10 bytes" in r.getMessage()]
    assert len(warnings) == 1
    assert "ghijkl" not in caplog.text  # lengths and types in the log, never the text


async def test_an_error_is_an_error_event_then_response_failed() -> None:
    encoder = ResponsesEncoder("resp_3")
    body = b"".join(encoder.encode(e) for e in await scripted_events(fail=True))
    body += encoder.finish()
    events = events_of(body)
    for event in events:
        STREAM_EVENT.validate_python(event)
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2]["message"] == "the provider is overloaded"


# -- served, read by the openai SDK ----------------------------------------------------------


async def test_the_sdk_reads_the_stream_and_its_final_response(base_url: str) -> None:
    async with client(base_url) as sdk:
        stream = await sdk.responses.create(model="scripted", input="Weather?", stream=True)
        events = [event async for event in stream]
        async with sdk.responses.stream(model="scripted", input="Weather?") as helper:
            async for _ in helper:
                pass
            final = await helper.get_final_response()
    assert events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert final.output_text == ANSWER
    calls = [item for item in final.output if item.type == "function_call"]
    assert [(c.call_id, json.loads(c.arguments)) for c in calls] == [
        ("call_paris", {"city": "Paris"}),
        ("call_oslo", {"city": "Oslo"}),
    ]


async def test_the_openai_sdk_cancels_a_background_response(base_url: str) -> None:
    # POST /v1/responses/{id}/cancel, the SDK's responses.cancel, was a text 404.
    async with client(base_url) as sdk:
        started = await sdk.responses.create(
            model="scripted", input="Weather?", background=True, extra_body={"delay_ms": 200}
        )
        assert started.status == "in_progress"
        cancelled = await sdk.responses.cancel(started.id)
        stored = await sdk.responses.retrieve(started.id)
        with pytest.raises(openai.NotFoundError):
            await sdk.responses.cancel("resp_none")
    assert cancelled.id == started.id
    assert cancelled.status == stored.status == "cancelled"


async def test_a_dropped_stream_resumes_with_starting_after_exactly_once(base_url: str) -> None:
    async with client(base_url) as sdk:
        stream = await sdk.responses.create(
            model="scripted",
            input="Weather?",
            stream=True,
            background=True,
            extra_body={"delay_ms": 20},
        )
        seen = []
        async for event in stream:
            seen.append(event)
            if len(seen) == 9:
                break  # the client drops mid-turn
        await stream.close()
        response_id = seen[0].response.id  # type: ignore[union-attr]
        rest = await sdk.responses.retrieve(
            response_id, stream=True, starting_after=seen[-1].sequence_number
        )
        tail = [event async for event in rest]
        replay = await sdk.responses.retrieve(response_id, stream=True)
        every = [event async for event in replay]
        stored = await sdk.responses.retrieve(response_id)
    numbers = [e.sequence_number for e in seen + tail]
    assert numbers == list(range(len(every)))
    assert [normalized(e) for e in seen + tail] == [normalized(e) for e in every]
    assert stored.status == "completed"
    assert stored.output_text == ANSWER


async def test_background_answers_at_once_in_progress(base_url: str) -> None:
    async with httpx.AsyncClient(timeout=WAIT) as http:
        body = {"model": "m", "input": "x", "background": True, "delay_ms": 50}
        started = await http.post(f"{base_url}/v1/responses", json=body)
        assert started.status_code == 200, started.text
        assert started.json()["status"] == "in_progress"
        response_id = started.json()["id"]
        streamed = await http.get(
            f"{base_url}/v1/responses/{response_id}", params={"stream": "true"}
        )
    assert events_of(streamed.content)[-1]["type"] == "response.completed"


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/v1/responses", b"{not json", 400, "not valid JSON"),
        ("/v1/responses", b'{"input": "x"}', 400, "model"),
        ("/v1/responses", b'{"model": "m"}', 400, "input"),
        ("/v1/responses", b'{"model": "m", "input": "x", "stream": 1}', 400, "stream"),
    ],
)
async def test_bad_requests_get_openai_s_error_shape(
    base_url: str, path: str, body: bytes, status: int, message: str
) -> None:
    async with httpx.AsyncClient(timeout=WAIT) as http:
        response = await http.post(f"{base_url}{path}", content=body)
    assert response.status_code == status, response.text
    assert message in response.json()["error"]["message"]


async def test_retrieving_an_unknown_response_or_number_is_refused(base_url: str) -> None:
    async with httpx.AsyncClient(timeout=WAIT) as http:
        missing = await http.get(f"{base_url}/v1/responses/resp_none")
        missing_stream = await http.get(
            f"{base_url}/v1/responses/resp_none", params={"stream": "true"}
        )
        bad = await http.get(
            f"{base_url}/v1/responses/resp_none", params={"stream": "true", "starting_after": "x"}
        )
    assert missing.status_code == missing_stream.status_code == 404
    assert missing_stream.json()["error"]["type"] == "not_found_error"
    assert bad.status_code == 400


# -- read back by this project's own adapter ------------------------------------------------


async def test_the_responses_adapter_reads_the_served_stream_back(base_url: str) -> None:
    async with client(base_url) as sdk:
        stream = await sdk.responses.create(model="scripted", input="Weather?", stream=True)
        sink = InMemorySink()
        await openai_responses.publish(
            Publisher(sink), stream, message_id="msg_back", stream_id="back"
        )
    back = reassemble_events(sink.events)
    original = reassemble_events(await scripted_events())
    assert back.text == original.text == ANSWER
    assert back.thinking == original.thinking
    assert [(c.tool_use_id, c.name, c.params) for c in back.tool_calls] == [
        (c.tool_use_id, c.name, c.params) for c in original.tool_calls
    ]


def _text_left_open(text: str) -> list[Event]:
    """A message whose text block is left open: the stream ends (or fails) there."""
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m"}
    message |= {"content": [], "stop_reason": None, "usage": {"input_tokens": 1}}
    payloads: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"message": message}),
        ("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": text}}),
    ]
    return [
        Event(name, orjson.dumps({"type": name, **p}), str(n))
        for n, (name, p) in enumerate(payloads, 1)
    ]


@pytest.mark.parametrize("fails", [False, True], ids=["ended", "failed"])
def test_a_stream_cut_inside_its_message_finishes_its_items_first(fails: bool) -> None:
    # The openai SDK's accumulator refuses a response that completes with an item still
    # open, and a failed response's output must hold what its items got.
    encoder = ResponsesEncoder("resp_cut")
    body = b"".join(encoder.encode(e) for e in _text_left_open("Partial ans"))
    if fails:
        error = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
        body += encoder.encode(Event("error", orjson.dumps(error), "4"))
    body += encoder.finish()
    events = events_of(body)
    for item in events:
        STREAM_EVENT.validate_python(item)
    kinds = [e["type"] for e in events]
    last = "response.failed" if fails else "response.completed"
    assert kinds[-1] == last
    done = kinds.index("response.output_item.done")
    assert kinds.index("response.output_text.done") < done < kinds.index(last)
    [item] = events[-1]["response"]["output"]
    assert item["content"][0]["text"] == "Partial ans"
