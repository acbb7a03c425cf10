"""A message given whole in its ``message_start`` (Anthropic's programmatic tool calls:
its content and stop reason in the start, then ``message_stop``) reaches every dialect's
client whole: with the ``anthropic`` payload dialect the provider's start is passed on as
it came, and each dialect writes it as the ``essessey`` payload dialect's events (a block
each, then the stop reason) would be written, frame for frame."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest

from essessey import Event, InMemorySink, Publisher, StreamHub
from essessey.adapters.anthropic import publish
from essessey.bindings.sse import FrameEncoder
from essessey.dialects import DialectRequest
from essessey.dialects.agui import AGUIEncoder
from essessey.dialects.chat_completions import ChatCompletionsEncoder
from essessey.dialects.responses import ResponsesEncoder
from essessey.dialects.ui import UIMessageEncoder
from essessey.hub import TurnProducer
from essessey.protocol import Dialect
from tests.servers import serve_dialects

pytestmark = pytest.mark.anyio

CALL = {
    "type": "tool_use",
    "id": "toolu_given",
    "name": "rollDie",
    "input": {"player": "one"},
    "caller": {"type": "code_execution_20250825", "tool_id": "srvtoolu_1"},
}
THINKING = {"type": "thinking", "thinking": "A roll.", "signature": "sig-1"}
TEXT = {"type": "text", "text": "Rolling."}


def whole(content: list[dict[str, Any]], stop_reason: str = "tool_use") -> list[dict[str, Any]]:
    message: dict[str, Any] = {"id": "msg_whole", "type": "message", "role": "assistant"}
    message.update(model="claude-test", content=content, stop_reason=stop_reason)
    message.update(stop_sequence=None, usage={"input_tokens": 9, "output_tokens": 4})
    return [{"type": "message_start", "message": message}, {"type": "message_stop"}]


# The given message, then blocks streamed after it at the next indexes and the message's
# own end (which wins over the start's stop reason).
FOLLOWED = [
    whole([THINKING, CALL], stop_reason="tool_use")[0],
    {"type": "content_block_start", "index": 2, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 2, "delta": {"type": "text_delta", "text": "Done."}},
    {"type": "content_block_stop", "index": 2},
    {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {"output_tokens": 7},
    },
    {"type": "message_stop"},
]

STREAMS = {
    "call": whole([CALL]),
    "thinking, text and a call": whole([THINKING, TEXT, CALL]),
    "followed by blocks of its own": FOLLOWED,
}

ENCODERS: dict[str, Callable[[], FrameEncoder]] = {
    "ui": lambda: UIMessageEncoder(message_id="m"),
    "agui": lambda: AGUIEncoder("thread", "run"),
    "chat": lambda: ChatCompletionsEncoder("chatcmpl-1", created=1),
    "responses": lambda: ResponsesEncoder("resp_1", created_at=1),
}


async def published(stream: list[dict[str, Any]], dialect: Dialect) -> list[Event]:
    sink = InMemorySink()
    await publish(Publisher(sink, dialect=dialect), stream, stream_id="s")
    return sink.events


def written(encoder: FrameEncoder, events: list[Event]) -> bytes:
    return b"".join(encoder.encode(event) for event in events) + encoder.finish()


@pytest.mark.parametrize("stream", STREAMS)
@pytest.mark.parametrize("name", ENCODERS)
async def test_every_dialect_writes_the_given_message_as_its_own_events(
    stream: str, name: str
) -> None:
    given = await published(STREAMS[stream], "anthropic")
    assert any(b'"content":[{' in e.data for e in given)  # passed on as it came
    own = await published(STREAMS[stream], "essessey")
    assert written(ENCODERS[name](), given) == written(ENCODERS[name](), own)


def turn(request: DialectRequest) -> TurnProducer:
    async def produce(publisher: Publisher) -> None:
        await publish(publisher, whole([TEXT, CALL]), stream_id=request.id)

    return produce


@pytest.fixture
def sdk() -> Iterator[openai.AsyncOpenAI]:
    with serve_dialects(turn, StreamHub(dialect="anthropic")) as url:
        yield openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)


async def test_openai_clients_read_the_call_and_the_stop_reason(sdk: openai.AsyncOpenAI) -> None:
    messages: Any = [{"role": "user", "content": "Roll."}]
    async with sdk:
        completion = await sdk.chat.completions.create(model="m", messages=messages)
        response = await sdk.responses.create(model="m", input="Roll.")
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Rolling."
    calls = choice.message.tool_calls or []
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("toolu_given", "rollDie", {"player": "one"})
    ]
    assert response.output_text == "Rolling."
    [call] = [item for item in response.output if item.type == "function_call"]
    assert (call.call_id, call.name, json.loads(call.arguments)) == (
        "toolu_given",
        "rollDie",
        {"player": "one"},
    )


@pytest.mark.parametrize("name", ENCODERS)
async def test_a_given_block_no_dialect_can_write_is_skipped_not_the_message(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A call that names no id: the rest of the message is written, its text and its end.
    nameless = {"type": "tool_use", "name": "x", "input": {}}
    given = await published(whole([nameless, TEXT], stop_reason="end_turn"), "anthropic")
    body = written(ENCODERS[name](), given)
    assert b"Rolling." in body
    assert b"toolu" not in body
    finished = {
        "ui": b'"finishReason":"stop"',
        "agui": b'"RUN_FINISHED"',
        "chat": b'"finish_reason":"stop"',
        "responses": b'"status":"completed"',
    }
    assert finished[name] in body
