"""A turn that compacts the conversation (Anthropic's ``compaction`` block, streamed with
its ``encrypted_content`` in a ``compaction_delta``) reaches an OpenAI Responses client
as the ``compaction`` item it sends back in the conversation's place, streamed and whole,
as the ``openai`` SDK reads it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai.types.responses import ResponseCompactionItem

from essessey import InMemorySink, Publisher
from essessey.adapters.anthropic import publish
from essessey.dialects import DialectRequest
from essessey.dialects.responses import ResponsesEncoder
from essessey.hub import TurnProducer
from tests.servers import serve_dialects

pytestmark = pytest.mark.anyio


def _stream(compactions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An Anthropic stream: each compaction block (its start, then its delta), then text."""
    start: dict[str, Any] = {"type": "message", "role": "assistant", "content": []}
    start.update(id="msg_c", model="m", usage={"input_tokens": 5, "output_tokens": 1})
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    for index, delta in enumerate(compactions):
        block = {"type": "compaction", "content": None, "encrypted_content": None}
        events += [
            {"type": "content_block_start", "index": index, "content_block": block},
            {"type": "content_block_delta", "index": index, "delta": delta},
            {"type": "content_block_stop", "index": index},
        ]
    text = len(compactions)
    events += [
        {"type": "content_block_start", "index": text, "content_block": {"type": "text"}},
        {
            "type": "content_block_delta",
            "index": text,
            "delta": {"type": "text_delta", "text": "Hello."},
        },
        {"type": "content_block_stop", "index": text},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 3},
        },
        {"type": "message_stop"},
    ]
    return events


COMPACTION = {"type": "compaction_delta", "content": "Summary.", "encrypted_content": "enc-1"}


def turn(request: DialectRequest) -> TurnProducer:
    async def produce(publisher: Publisher) -> None:
        await publish(publisher, _stream([COMPACTION]), stream_id=request.id)

    return produce


@pytest.fixture
def sdk() -> Iterator[openai.AsyncOpenAI]:
    with serve_dialects(turn) as url:
        yield openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)


async def test_responses_gives_the_compaction_item_streamed_and_whole(
    sdk: openai.AsyncOpenAI,
) -> None:
    async with sdk:
        async with sdk.responses.stream(model="m", input="Go on.") as stream:
            done = [e.item async for e in stream if e.type == "response.output_item.done"]
            final = await stream.get_final_response()
        whole = await sdk.responses.create(model="m", input="Go on.")
    assert [item.type for item in done] == ["compaction", "message"]
    for response in (final, whole):
        assert [item.type for item in response.output] == ["compaction", "message"]
        compaction = response.output[0]
        assert isinstance(compaction, ResponseCompactionItem)
        assert compaction.encrypted_content == "enc-1"
        assert compaction.id.startswith("cmp_")
        assert response.output_text == "Hello."


async def test_a_compaction_with_nothing_to_send_back_is_written_as_any_other_block() -> None:
    sink = InMemorySink()
    empty = {"type": "compaction_delta", "content": "Summary.", "encrypted_content": None}
    await publish(Publisher(sink), _stream([COMPACTION, empty]), stream_id="s")
    encoder = ResponsesEncoder("resp_c")
    body = b"".join(encoder.encode(event) for event in sink.events) + encoder.finish()
    output = encoder.response()["output"]
    assert [item["type"] for item in output] == ["compaction", "essessey_block", "message"]
    assert output[0]["encrypted_content"] == "enc-1"
    assert output[1]["block"]["type"] == "compaction"
    assert output[1]["deltas"] == [empty]
    assert body.count(b"event: response.output_item.done\n") == 3
