"""OpenAI Chat Completions served from the hub: the ``openai`` SDK reads the scripted
turn (streamed, through the ``stream()`` helper, and whole), a dropped reader resumes by
``Last-Event-ID``, and this project's own OpenAI adapter reads the served stream back
into the same turn."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk
from starlette.applications import Starlette

from essessey import Event, InMemorySink, Publisher, StreamHub, reassemble_events
from essessey.adapters import openai as openai_adapter
from essessey.bindings.sse import SSEDecoder
from essessey.dialects.chat_completions import (
    ChatCompletionRequest,
    ChatCompletionsEncoder,
    chat_completions_routes,
)
from essessey.hub import TurnProducer
from essessey.protocol import StopReason
from tests.processes import WAIT
from tests.scripted_turn import ANSWER, THINKING, scripted_turn
from tests.servers import serve

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "Weather in Paris and Oslo?"}]


def asks_then_goes_on(stream_id: str) -> TurnProducer:
    """A message whose call is the client's (no result), then another message: what a
    provider that runs several messages in one stream gives (Anthropic's tool search)."""

    async def produce(p: Publisher) -> None:
        await p.send_stream_preamble("msg_1", stream_id, "scripted", input_tokens=10)
        await p.send_content_block_start_text(0)
        await p.send_content_block_delta_text(0, "Looking it up.")
        await p.send_content_block_stop(0)
        await p.send_tool_use_block(1, "call_find", "find", {"q": "Oslo"})
        await p.send_stream_epilogue(StopReason.TOOL_USE, 5)
        await p.send_stream_preamble("msg_2", stream_id, "scripted", input_tokens=20)
        await p.send_content_block_start_text(0)
        await p.send_content_block_delta_text(0, " Found it.")
        await p.send_content_block_stop(0)
        await p.send_stream_epilogue(StopReason.END_TURN, 3)

    return produce


def answer(request: ChatCompletionRequest) -> TurnProducer:
    if request.body.get("asks_then_goes_on"):
        return asks_then_goes_on(request.id)
    delay = float(request.body.get("delay_ms", 0)) / 1000
    if request.body.get("bad_option"):
        raise ValueError("bad_option is not one the app takes")
    return scripted_turn(request.id, delay=delay, fail=bool(request.body.get("fail")))


@pytest.fixture
def base_url() -> Iterator[str]:
    hub = StreamHub()

    app = Starlette(routes=list(chat_completions_routes(hub, answer)), lifespan=hub.lifespan)
    with serve(app, lifespan="on") as url:
        yield url


def client(base: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)


async def scripted_events() -> list[Event]:
    sink = InMemorySink()
    await scripted_turn("chat")(Publisher(sink))
    return [Event(e.event, e.data, str(n + 1)) for n, e in enumerate(sink.events)]


def chunks_of(body: bytes) -> list[dict[str, Any]]:
    decoder = SSEDecoder()
    messages = decoder.feed(body) + decoder.close()
    datas = [m.data for m in messages]
    assert datas[-1] == "[DONE]"
    return [json.loads(d) for d in datas[:-1]]


# -- the encoder ----------------------------------------------------------------------------


async def test_the_encoder_writes_the_turn_as_chunks_with_the_protocol_s_ids() -> None:
    events = await scripted_events()
    encoder = ChatCompletionsEncoder("chatcmpl-1", include_usage=True, created=7)
    frames = [encoder.encode(e) for e in events]
    body = b"".join(frames) + encoder.finish()
    chunks = chunks_of(body)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["id"] == "chatcmpl-1" and c["created"] == 7 for c in chunks)
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    reasoning = "".join(
        c["choices"][0]["delta"].get("reasoning_content", "") for c in chunks if c["choices"]
    )
    assert (content, reasoning) == (ANSWER, THINKING)
    calls = [
        call
        for c in chunks
        if c["choices"]
        for call in c["choices"][0]["delta"].get("tool_calls", [])
    ]
    # A round's calls are held until its approvals are known (docs/dialects.md): each
    # call's first entry carries the arguments that had come.
    assert calls[0] == {
        "index": 0,
        "id": "call_paris",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
    }
    args: dict[int, str] = {}
    for call in calls:
        args[call["index"]] = args.get(call["index"], "") + call["function"]["arguments"]
    assert {i: json.loads(a) for i, a in args.items()} == {
        0: {"city": "Paris"},
        1: {"city": "Oslo"},
    }
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert [f for f in finishes if f] == ["stop"]  # the tool round's stop is not the end
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 28
    # Every event that wrote a frame ends its frames with its own id.
    for event, frame in zip(events, frames, strict=True):
        if frame:
            last = frame.rstrip(b"\n").split(b"\n\n")[-1]
            assert last.startswith(b"id: " + event.id.encode() + b"\n"), frame  # type: ignore[union-attr]


async def test_an_error_event_is_the_in_band_error_object_then_done() -> None:
    sink = InMemorySink()
    await scripted_turn("chat", fail=True)(Publisher(sink))
    encoder = ChatCompletionsEncoder("chatcmpl-2")
    body = b"".join(encoder.encode(e) for e in sink.events) + encoder.finish()
    chunks = chunks_of(body)
    assert chunks[-1] == {
        "error": {
            "message": "the provider is overloaded",
            "type": "overloaded_error",
            "param": None,
            "code": None,
        }
    }
    assert body.count(b"[DONE]") == 1


async def test_a_stream_cut_inside_a_call_with_no_arguments_gives_it_its_input() -> None:
    # The call's block never stopped, and none of its arguments came: "" is no JSON a
    # client can parse; its start's input ({}) is what its stop would have written.
    sink = InMemorySink()
    publisher = Publisher(sink)
    await publisher.send_stream_preamble("m1", "s", "m")
    await publisher.send_tool_use_block(0, "call_1", "weather", {"city": "Paris"})
    await publisher.send_tool_use_start(1, "call_2", "now")
    encoder = ChatCompletionsEncoder("chatcmpl-3")
    body = b"".join(encoder.encode(e) for e in sink.events) + encoder.finish()
    state = ChatCompletionStreamState()
    for chunk in chunks_of(body):
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    calls = state.current_completion_snapshot.choices[0].message.tool_calls or []
    assert [(c.id, c.function.arguments) for c in calls] == [
        ("call_1", '{"city":"Paris"}'),
        ("call_2", "{}"),
    ]


async def test_unreadable_events_are_skipped_with_a_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    encoder = ChatCompletionsEncoder("chatcmpl-3")
    assert encoder.encode(Event("content_block_delta", b"{not json")) == b""
    assert encoder.encode(Event("message_start", b"[1]")) == b""
    assert encoder.encode(Event("content_block_start", b'{"index": "x"}')) == b""
    assert "not JSON" in caplog.text
    assert "not an object" in caplog.text
    assert "{not json" not in caplog.text


async def test_a_block_with_no_place_is_logged_without_its_type_s_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A block's type comes from the network: a log line names it only if it is a word.
    encoder = ChatCompletionsEncoder("chatcmpl-4")
    start = {"type": "content_block_start", "index": 0, "content_block": {"type": "Secret Type"}}
    with caplog.at_level(logging.DEBUG, logger="essessey"):
        encoder.encode(Event("message_start", json.dumps({"message": {"id": "m"}}).encode()))
        encoder.encode(Event("content_block_start", json.dumps(start).encode()))
    assert "has no place in a chat completion" in caplog.text
    assert "Secret Type" not in caplog.text


# -- served, read by the openai SDK ----------------------------------------------------------


async def test_the_sdk_reads_the_stream_whole(base_url: str) -> None:
    async with client(base_url) as sdk:
        stream = await sdk.chat.completions.create(
            model="scripted",
            messages=MESSAGES,  # type: ignore[arg-type]
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ANSWER
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 28
    assert chunks[0].id.startswith("chatcmpl-")


async def test_the_stream_helper_gives_the_final_message(base_url: str) -> None:
    async with (
        client(base_url) as sdk,
        sdk.chat.completions.stream(
            model="scripted",
            messages=MESSAGES,  # type: ignore[arg-type]
            stream_options={"include_usage": True},
        ) as stream,
    ):
        async for _ in stream:
            pass
        final = await stream.get_final_completion()
    choice = final.choices[0]
    assert choice.message.content == ANSWER
    assert choice.finish_reason == "stop"
    calls = choice.message.tool_calls or []
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("call_paris", "get_weather", {"city": "Paris"}),
        ("call_oslo", "get_weather", {"city": "Oslo"}),
    ]
    assert final.usage is not None
    assert final.usage.completion_tokens == 28


async def test_a_request_without_stream_gets_the_whole_completion(base_url: str) -> None:
    async with client(base_url) as sdk:
        whole = await sdk.chat.completions.create(
            model="scripted",
            messages=MESSAGES,  # type: ignore[arg-type]
        )
    assert whole.object == "chat.completion"
    assert whole.choices[0].message.content == ANSWER
    assert [c.function.name for c in whole.choices[0].message.tool_calls or []] == [
        "get_weather",
        "get_weather",
    ]
    assert whole.usage is not None
    assert whole.usage.completion_tokens == 28


async def test_an_error_in_the_turn_raises_the_sdk_s_api_error(base_url: str) -> None:
    async with client(base_url) as sdk:
        stream = await sdk.chat.completions.create(
            model="scripted",
            messages=MESSAGES,  # type: ignore[arg-type]
            stream=True,
            extra_body={"fail": True},
        )
        with pytest.raises(openai.APIError, match="the provider is overloaded"):
            async for _ in stream:
                pass


@pytest.mark.parametrize(
    "turn", [{}, {"asks_then_goes_on": True}], ids=["two-rounds", "asks-then-goes-on"]
)
async def test_a_request_without_stream_gets_what_the_stream_ends_with(
    base_url: str, turn: dict[str, Any]
) -> None:
    async with client(base_url) as sdk:
        streamed = await sdk.chat.completions.create(
            model="scripted",
            messages=MESSAGES,  # type: ignore[arg-type]
            stream=True,
            stream_options={"include_usage": True},
            extra_body=turn,
        )
        state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
        async for chunk in streamed:
            state.handle_chunk(chunk)
        read = state.current_completion_snapshot
        whole = await sdk.chat.completions.create(
            model="scripted",
            messages=MESSAGES,  # type: ignore[arg-type]
            extra_body=turn,
        )
    views = []
    for ended in (read, whole):
        [choice] = ended.choices
        message = choice.message
        calls = [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []]
        reasoning = getattr(message, "reasoning_content", None)  # an extra field of the SDK's
        usage = ended.usage.model_dump() if ended.usage else None
        views.append((message.content, reasoning, calls, choice.finish_reason, usage))
    if turn:  # the message that asks ends the completion, in both
        assert views[0][:4] == (
            "Looking it up.",
            None,
            [("call_find", "find", '{"q":"Oslo"}')],
            "tool_calls",
        )
    else:
        assert views[0][0] == ANSWER
        assert views[0][3] == "stop"
    assert views[1] == views[0]


async def test_the_sdk_s_retrieve_gets_the_whole_completion(base_url: str) -> None:
    # GET of a completion asking for JSON (the openai SDK's retrieve) is answered whole,
    # as a request without stream is; an SSE reader of the same URL gets the stream.
    async with client(base_url) as sdk:
        whole = await sdk.chat.completions.create(
            model="scripted",
            messages=MESSAGES,  # type: ignore[arg-type]
        )
        retrieved = await sdk.chat.completions.retrieve(whole.id)
    assert isinstance(retrieved, openai.types.chat.ChatCompletion)
    assert retrieved.model_dump(include={"id", "choices", "usage"}) == whole.model_dump(
        include={"id", "choices", "usage"}
    )
    async with httpx.AsyncClient(timeout=WAIT) as http:
        streamed = await http.get(f"{base_url}/v1/chat/completions/{whole.id}")
        # The SDK's Accept on a streamed read, which names the stream's option.
        asked = await http.get(
            f"{base_url}/v1/chat/completions/{whole.id}?include_usage=true",
            headers={"accept": "application/json"},
        )
    assert streamed.headers["content-type"].startswith("text/event-stream")
    assert asked.headers["content-type"].startswith("text/event-stream")
    assert b'"usage":{' in asked.content


async def test_a_request_without_stream_for_a_turn_that_failed_gets_the_error(
    base_url: str,
) -> None:
    async with client(base_url) as sdk:
        with pytest.raises(
            openai.InternalServerError, match="the provider is overloaded"
        ) as raised:
            await sdk.chat.completions.create(
                model="scripted",
                messages=MESSAGES,  # type: ignore[arg-type]
                extra_body={"fail": True},
            )
    # No completion of a failed turn, and no retry: a retry would run the turn again.
    assert raised.value.status_code == 500
    assert raised.value.response.headers["x-should-retry"] == "false"
    assert raised.value.code is None
    assert isinstance(raised.value.body, dict)
    assert raised.value.body["type"] == "overloaded_error"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b"[]", "must be a JSON object"),
        (b'{"messages": []}', "model"),
        (b'{"model": "m", "messages": []}', "messages"),
        (b'{"model": "m", "messages": [{"content": "x"}]}', "messages.0"),
        (b'{"model": "m", "messages": [{"role": "user"}], "stream": "yes"}', "stream"),
        (b'{"model": "m", "messages": [{"role": "user"}], "bad_option": 1}', "bad_option"),
    ],
)
async def test_bad_bodies_get_a_400_in_openai_s_error_shape(
    base_url: str, body: bytes, message: str
) -> None:
    async with httpx.AsyncClient(timeout=WAIT) as http:
        response = await http.post(f"{base_url}/v1/chat/completions", content=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert message in error["message"]
    assert set(error) == {"message", "type", "param", "code"}


def without_created(data: str) -> Any:
    """A chunk's JSON without ``created``: each reader's stream stamps its own time."""
    if data == "[DONE]":
        return data
    chunk = json.loads(data)
    chunk.pop("created", None)
    return chunk


# -- resume ----------------------------------------------------------------------------------


async def test_a_dropped_reader_resumes_after_its_last_id_exactly_once(base_url: str) -> None:
    request = {"model": "scripted", "messages": MESSAGES, "stream": True, "delay_ms": 20}
    async with httpx.AsyncClient(timeout=WAIT) as http:
        async with http.stream("POST", f"{base_url}/v1/chat/completions", json=request) as first:
            location = first.headers["location"]
            decoder = SSEDecoder()
            seen: list[Any] = []
            async for piece in first.aiter_bytes():
                seen += decoder.feed(piece)
                if sum(1 for m in seen if m.id) >= 6:
                    break  # the client drops mid-turn
        last_id = [m.id for m in seen if m.id][-1]
        # Frames after the last id the client holds whole are sent again: cut there.
        upto = max(i for i, m in enumerate(seen) if m.id == last_id)
        before = [m.data for m in seen[: upto + 1]]
        rest = await http.get(f"{base_url}{location}", headers={"last-event-id": last_id})
        assert rest.status_code == 200, rest.text
        whole = await http.get(f"{base_url}{location}")
    resumed = before + [m.data for m in SSEDecoder().feed(rest.content)]
    full = [m.data for m in SSEDecoder().feed(whole.content)]
    assert [without_created(d) for d in resumed] == [without_created(d) for d in full]
    assert resumed[-1] == "[DONE]"


async def test_an_unknown_last_id_is_a_410_in_openai_s_shape(base_url: str) -> None:
    request = {"model": "scripted", "messages": MESSAGES, "stream": True}
    async with httpx.AsyncClient(timeout=WAIT) as http:
        first = await http.post(f"{base_url}/v1/chat/completions", json=request)
        location = first.headers["location"]
        gone = await http.get(f"{base_url}{location}", headers={"last-event-id": "999999-0"})
        missing = await http.get(f"{base_url}/v1/chat/completions/chatcmpl-none")
    assert gone.status_code == 410, gone.text
    assert gone.json()["error"]["type"] == "resume_unavailable"
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "not_found_error"


# -- read back by this project's own adapter ------------------------------------------------


async def test_the_openai_adapter_reads_the_served_stream_back_into_the_turn(
    base_url: str,
) -> None:
    async with client(base_url) as sdk:
        stream = await sdk.chat.completions.create(
            model="scripted",
            messages=MESSAGES,  # type: ignore[arg-type]
            stream=True,
            stream_options={"include_usage": True},
        )
        sink = InMemorySink()
        await openai_adapter.publish(
            Publisher(sink), stream, message_id="msg_back", stream_id="back"
        )
    back = reassemble_events(sink.events)
    original = reassemble_events(await scripted_events())
    assert back.text == original.text == ANSWER
    assert back.thinking == original.thinking
    assert [(c.tool_use_id, c.name, c.params) for c in back.tool_calls] == [
        (c.tool_use_id, c.name, c.params) for c in original.tool_calls
    ]
    # One completion holds every round: with the first round's tool calls in it, the
    # adapter reads its "stop" as a tool stop, as it does any completion with calls.
    assert back.stop_reason == "tool_use"
