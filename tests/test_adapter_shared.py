"""What every provider adapter shares: the stream_round guard, and (for the two OpenAI
adapters) one behaviour for interleaved tool-call fragments."""

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import anyio
import pytest
from hypothesis import given, settings

from essessey import Event, InMemorySink, Publisher, RoundOrderError, check, reassemble_events
from essessey.adapters import RoundStream
from essessey.adapters import anthropic as anthropic_adapter
from essessey.adapters import openai as openai_adapter
from essessey.adapters import openai_responses as responses_adapter
from tests.adapter_views import Interleaving, chat_chunks, interleavings, responses_events

StreamRound = Callable[[RoundStream, Any], Awaitable[Any]]

# Each adapter's stream_round, and a first item of its stream that would publish content.
ADAPTERS: dict[str, tuple[StreamRound, dict[str, Any]]] = {
    "openai": (
        openai_adapter.stream_round,
        {"model": "m", "choices": [{"index": 0, "delta": {"content": "hi"}}]},
    ),
    "openai_responses": (
        responses_adapter.stream_round,
        {
            "type": "response.output_text.delta",
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "delta": "hi",
        },
    ),
    "anthropic": (
        anthropic_adapter.stream_round,
        {
            "type": "message_start",
            "message": {"id": "msg_1", "model": "m", "role": "assistant", "content": []},
        },
    ),
}


class _Source:
    """A provider stream that counts what was read of it, as a sync or async iterable."""

    def __init__(self, first: dict[str, Any], *, asynchronous: bool) -> None:
        self.items = [first, first]
        self.read = 0
        self.asynchronous = asynchronous

    def sync(self) -> Iterator[dict[str, Any]]:
        for item in self.items:
            self.read += 1
            yield item

    async def aio(self) -> AsyncIterator[dict[str, Any]]:
        for item in self.items:
            self.read += 1
            yield item

    def stream(self) -> Any:
        return self.aio() if self.asynchronous else self.sync()


@pytest.mark.anyio
@pytest.mark.parametrize("asynchronous", [False, True])
@pytest.mark.parametrize("state", ["never_started", "ended"])
@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
async def test_stream_round_refuses_outside_a_round_before_reading(
    adapter: str, state: str, asynchronous: bool
) -> None:
    stream_round, first = ADAPTERS[adapter]
    sink = InMemorySink()
    rounds = RoundStream(Publisher(sink))
    if state == "ended":
        await rounds.round_start()
        await rounds.round_end()
    source = _Source(first, asynchronous=asynchronous)
    with pytest.raises(RoundOrderError, match="stream_round needs a started round"):
        await stream_round(rounds, source.stream())
    # Refused before the stream was touched: a network stream cannot be read twice.
    assert source.read == 0
    assert sink.events == []
    assert not rounds.in_round


async def _content_blocks(
    publish: Callable[..., Awaitable[Any]], items: list[dict[str, Any]]
) -> list[tuple[str, bytes]]:
    sink = InMemorySink()
    await publish(Publisher(sink), items, message_id="msg_x", stream_id="s")
    events: list[Event] = sink.events
    assert check(events) == []
    return [(e.event, e.data) for e in events if e.event.startswith("content_block_")]


@settings(max_examples=60, deadline=None)
@given(calls=interleavings())
def test_both_openai_adapters_publish_an_interleaving_alike(calls: Interleaving) -> None:
    async def both() -> tuple[list[tuple[str, bytes]], list[tuple[str, bytes]]]:
        chat = await _content_blocks(openai_adapter.publish, chat_chunks(calls))
        responses = await _content_blocks(responses_adapter.publish, responses_events(calls))
        return chat, responses

    chat, responses = anyio.run(both)
    # The same calls interleaved the same way: the same blocks, byte for byte.
    assert chat == responses


def _one_call(adapter: str, call_id: str) -> list[dict[str, Any]]:
    """One model response that calls ``f`` with ``{}`` under ``call_id``."""
    if adapter == "openai":
        call = {"index": 0, "id": call_id, "type": "function"}
        call["function"] = {"name": "f", "arguments": "{}"}
        return [
            {"model": "m", "choices": [{"index": 0, "delta": {"tool_calls": [call]}}]},
            {"model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        ]
    item = {"id": "fc_1", "type": "function_call", "call_id": call_id, "name": "f"}
    added, done = {**item, "arguments": ""}, {**item, "arguments": "{}"}
    return [
        {"type": "response.output_item.added", "output_index": 0, "item": added},
        {
            "type": "response.function_call_arguments.delta",
            "output_index": 0,
            "item_id": "fc_1",
            "delta": "{}",
        },
        {"type": "response.output_item.done", "output_index": 0, "item": done},
        {
            "type": "response.completed",
            "response": {"id": "resp_1", "model": "m", "status": "completed", "output": []},
        },
    ]


@pytest.mark.anyio
@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("adapter", ["openai", "openai_responses"])
async def test_a_call_id_an_earlier_round_used_gets_a_fresh_one(adapter: str, strict: bool) -> None:
    # A provider (or a model server) that numbers its calls per response repeats an id
    # in the next round of the message: published as it is, the message would hold two
    # tool_use blocks with one id, and no client could tell their results apart.
    stream_round = ADAPTERS[adapter][0]
    sink = InMemorySink()
    publisher = Publisher(sink, strict=strict)
    await publisher.send_stream_preamble("msg_1", "s", "m")
    rounds = RoundStream(publisher)
    published = []
    for n in range(3):
        await rounds.round_start()
        streamed = await stream_round(rounds, _one_call(adapter, "call_0"))
        [call] = streamed.tool_calls
        assert call.given_id == "call_0"  # the provider's id, beside the one published
        published.append(call.id)
        await rounds.tool_result(0, f"result {n}")
        await rounds.round_end()
    await publisher.send_stream_epilogue("end_turn", 1)
    assert published[0] == "call_0"
    assert len(set(published)) == 3
    assert check(sink.events) == []
    results = reassemble_events(sink.events).tool_results
    assert [(r.tool_use_id, r.text) for r in results] == [
        (call_id, f"result {n}") for n, call_id in enumerate(published)
    ]
