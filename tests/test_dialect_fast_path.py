"""A text delta takes each dialect's quick path (its frame written from a template, not
through the general dispatch and a dict): the bytes must be what the general path would
write, orjson's encoding of the dialect's object with its keys in order, for any text."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from essessey import Event
from essessey.bindings.sse import FrameEncoder, TextBatchEncoder
from essessey.bindings.ui import UIMessageEncoder
from essessey.dialects.agui import AGUIEncoder
from essessey.dialects.chat_completions import ChatCompletionsEncoder
from essessey.dialects.responses import ResponsesEncoder

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
    assert isinstance(batched, TextBatchEncoder)
    one_by_one = b"".join(single.encode(Event("content_block_delta", canonical(t))) for t in texts)
    assert batched.encode_texts(0, texts) == one_by_one
    assert batched.encode_texts(7, texts) is None  # no such block: each event on its own
    # Both carry on alike afterwards (a Responses batch counted its sequence numbers).
    after = Event("content_block_delta", canonical("next"))
    assert batched.encode(after) == single.encode(after)
