"""A text delta takes each dialect's quick path (its frame written from a template, not
through the general dispatch and a dict): the bytes must be what the general path would
write, orjson's encoding of the dialect's object with its keys in order, for any text."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from essessey import Event, InMemorySink, Publisher, StopReason
from essessey.bindings.sse import EventStreamResponse, FrameEncoder

# The fast path's capability, not exported: what this test checks is that each dialect has it.
from essessey.bindings.sse._encoder import TextDeltaEncoder
from essessey.dialects.agui import AGUIEncoder
from essessey.dialects.base import DialectEncoder
from essessey.dialects.chat_completions import ChatCompletionsEncoder
from essessey.dialects.responses import ResponsesEncoder
from essessey.dialects.ui import UIMessageEncoder
from tests.processes import WAIT
from tests.servers import serve

ENCODERS: dict[str, Callable[[], FrameEncoder]] = {
    "ui": lambda: UIMessageEncoder(message_id="turn"),
    "agui": lambda: AGUIEncoder("thread", "run"),
    "chat_completions": lambda: ChatCompletionsEncoder("chatcmpl-1", created=1),
    "responses": lambda: ResponsesEncoder("resp_1", created_at=1),
}


def opening() -> list[Event]:
    return [
        Event("message_start", orjson.dumps({"type": "message_start", "message": {"id": "m"}})),
        Event(
            "content_block_start",
            orjson.dumps(
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}
            ),
        ),
    ]


def canonical(text: str) -> bytes:
    """A text delta as a Publisher writes it."""
    return orjson.dumps(
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": text},
        }
    )


def expected(dialect: str, text: str, n: int) -> tuple[str | None, dict[str, Any]]:
    """The event name and the object the general path writes for the ``n``-th delta."""
    if dialect == "ui":
        return None, {"type": "text-delta", "id": "1-0", "delta": text}
    if dialect == "agui":
        return None, {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m-0", "delta": text}
    if dialect == "chat_completions":
        return None, {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "essessey",
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
        }
    return "response.output_text.delta", {
        "type": "response.output_text.delta",
        "sequence_number": 4 + n,
        "item_id": "msg_resp_1_0",
        "output_index": 0,
        "content_index": 0,
        "delta": text,
        "logprobs": [],
    }


@pytest.mark.parametrize("dialect", ENCODERS)
@settings(max_examples=200, deadline=None)
@given(texts=st.lists(st.text(), min_size=1, max_size=5))
def test_a_text_delta_s_frame_is_what_the_general_path_writes(
    dialect: str, texts: list[str]
) -> None:
    encoder = ENCODERS[dialect]()
    for event in opening():
        encoder.encode(event)
    for n, text in enumerate(texts):
        frame = encoder.encode(Event("content_block_delta", canonical(text), f"1-{n}"))
        if dialect == "agui" and not text:
            assert frame == b""  # AG-UI refuses an empty delta
            continue
        name, body = expected(dialect, text, n)
        head = f"id: 1-{n}\n" + (f"event: {name}\n" if name else "")
        assert frame == head.encode() + b"data: " + orjson.dumps(body) + b"\n\n"
        assert json.loads(frame.split(b"data: ", 1)[1]) == body


@pytest.mark.parametrize("dialect", ENCODERS)
@settings(max_examples=100, deadline=None)
@given(texts=st.lists(st.text(), max_size=6))
def test_a_batch_of_text_deltas_is_written_as_one_by_one(dialect: str, texts: list[str]) -> None:
    batched, single = ENCODERS[dialect](), ENCODERS[dialect]()
    for event in opening():
        batched.encode(event)
        single.encode(event)
    assert isinstance(batched, TextDeltaEncoder)
    one_by_one = b"".join(single.encode(Event("content_block_delta", canonical(t))) for t in texts)
    assert b"".join(batched.encode_text(0, t, orjson.dumps(t)) or b"" for t in texts) == one_by_one
    assert batched.encode_text(7, "x", b'"x"') is None  # no such block: each event on its own
    # Both carry on alike afterwards (a Responses batch counted its sequence numbers).
    after = Event("content_block_delta", canonical("next"))
    assert batched.encode(after) == single.encode(after)


@pytest.mark.parametrize("dialect", ENCODERS)
@settings(max_examples=100, deadline=None)
@given(texts=st.lists(st.text(), max_size=6))
def test_a_text_given_as_text_is_written_as_its_event(dialect: str, texts: list[str]) -> None:
    given_text, read = ENCODERS[dialect](), ENCODERS[dialect]()
    for event in opening():
        given_text.encode(event)
        read.encode(event)
    assert isinstance(given_text, TextDeltaEncoder)
    for text in texts:
        event = Event("content_block_delta", canonical(text))
        assert given_text.encode_text(0, text, orjson.dumps(text)) == read.encode(event)
    assert given_text.encode_text(3, "x", b'"x"') is None


@pytest.mark.parametrize("dialect", ENCODERS)
@settings(max_examples=100, deadline=None)
@given(texts=st.lists(st.text(), max_size=6))
def test_a_stored_text_delta_given_by_its_fields_is_written_as_its_event(
    dialect: str, texts: list[str]
) -> None:
    # What a dialect's response writes for a delta a hub hands over (its id included).
    given_fields, read = ENCODERS[dialect](), ENCODERS[dialect]()
    for event in opening():
        given_fields.encode(event)
        read.encode(event)
    assert isinstance(given_fields, DialectEncoder)
    for n, text in enumerate(texts):
        event = Event("content_block_delta", canonical(text), f"e-{n}")
        assert given_fields.encode_text_delta(
            0, text, orjson.dumps(text), b"e-%d" % n
        ) == read.encode(event)
    assert given_fields.encode_text_delta(3, "x", b'"x"', b"e-9") is None  # no such block


@pytest.mark.parametrize("dialect", ENCODERS)
def test_a_stored_text_delta_goes_through_encode_where_the_fields_would_skip_a_rule(
    dialect: str,
) -> None:
    encoder, twin = ENCODERS[dialect](), ENCODERS[dialect]()
    assert isinstance(encoder, DialectEncoder)
    assert isinstance(twin, DialectEncoder)
    for event in opening():
        encoder.encode(event)
        twin.encode(event)
    # A continuation still reading up to its ``after``: the fields are refused, and the
    # events go through encode, which writes nothing of them.
    encoder.start_after("e-5")
    twin.start_after("e-5")
    for event_id in ("e-1", "e-5"):
        assert encoder.encode_text_delta(0, "x", b'"x"', event_id.encode()) is None
        event = Event("content_block_delta", canonical("x"), event_id)
        assert encoder.encode(event) == twin.encode(event) == b""
    # Reached: from here on the response writes what the events' encoding writes.
    for n, text in enumerate(["y", "z"], 6):
        event = Event("content_block_delta", canonical(text), f"e-{n}")
        given = encoder.encode_text_delta(0, text, orjson.dumps(text), b"e-%d" % n)
        assert (encoder.encode(event) if given is None else given) == twin.encode(event)


@pytest.mark.parametrize("dialect", ENCODERS)
@pytest.mark.parametrize("bad", [b"e\n1", b"e\r1", b"e\x001"])
def test_a_stored_text_delta_with_an_id_that_would_break_its_frame_raises(
    dialect: str, bad: bytes
) -> None:
    encoder = ENCODERS[dialect]()
    assert isinstance(encoder, DialectEncoder)
    for event in opening():
        encoder.encode(event)
    with pytest.raises(ValueError, match="CR, LF or NUL"):
        encoder.encode_text_delta(0, "x", b'"x"', bad)


def test_a_subclass_with_an_encode_of_its_own_gets_stored_text_deltas_through_it() -> None:
    class Counting(UIMessageEncoder):
        def encode(self, event: Event) -> bytes:
            return super().encode(event)

    encoder = Counting(message_id="turn")
    for event in opening():
        encoder.encode(event)
    assert encoder.encode_text_delta(0, "x", b'"x"', b"e-1") is None  # so the event goes to encode
    assert encoder.encode(Event("content_block_delta", canonical("x"), "e-1"))


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", ENCODERS)
async def test_a_producer_s_response_in_a_dialect_is_its_events_encoded(dialect: str) -> None:
    # Through a real server: the Publisher hands each text delta's text to the
    # response's sink, and a batch whole; the body is what encoding the events gives.
    sink = InMemorySink()
    await produce(Publisher(sink))
    expected_encoder = ENCODERS[dialect]()
    expected = b"".join(expected_encoder.encode(e) for e in sink.events)
    expected += expected_encoder.finish()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await EventStreamResponse(produce, encoder=ENCODERS[dialect]())(scope, receive, send)

    with serve(app) as url:
        async with httpx.AsyncClient(timeout=WAIT) as http:
            body = (await http.get(url)).content
    assert body == expected


async def produce(publisher: Publisher) -> None:
    await publisher.send_stream_preamble("m", "s", "model")
    await publisher.send_content_block_start_text(0)
    for word in ("one ", "two ", "", 'quote " and \\ and \u00e9 '):
        await publisher.send_content_block_delta_text(0, word)
    await publisher.send_content_block_deltas_text(0, ["three ", "four"])
    await publisher.send_content_block_stop(0)
    await publisher.send_stream_epilogue(StopReason.END_TURN, 6)
