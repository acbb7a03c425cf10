"""The Pydantic AI adapter (essessey.adapters.pydantic_ai) on the framework's own offline
test doubles (``FunctionModel`` streaming, ``TestModel``): every published turn passes the
checker, ``reassemble`` gives back what the run's own result says, approvals and client
calls resume the framework's run (through the hub, on another replica, over HTTP), a
reader that drops mid-run resumes with every event once, an error is in-band and raised,
and a cancelled run stops."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
import pytest
from anthropic import AsyncAnthropic
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.messages import (
    CompactionPart,
    FunctionToolResultEvent,
    ModelMessage,
    ModelResponse,
    NativeToolCallPart,
    NativeToolReturnPart,
    PartDeltaEvent,
    PartEndEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
    ThinkingPart,
    ThinkingPartDelta,
    ToolCallPart,
    ToolCallPartDelta,
    ToolReturnPart,
)
from pydantic_ai.models.function import DeltaToolCall
from pydantic_ai.models.test import TestModel
from starlette.applications import Starlette

from essessey import (
    Event,
    InMemoryEventStore,
    InMemorySink,
    ParsedStream,
    Publisher,
    StreamHub,
    ToolApproval,
    ToolOutput,
    check,
    reassemble_events,
)
from essessey.adapters import RunStates, stream_rounds
from essessey.adapters.pydantic_ai import (
    AgentTurns,
    agent_model_name,
    history_of,
    stream_run,
)
from essessey.dialects import dialect_routes
from essessey.dialects.chat_completions import ChatCompletionRequest
from essessey.dialects.ui import ChatRequest
from essessey.reassemble import ThinkingItem
from tests import pydantic_ai_agents as agents
from tests.adapter_views import (
    Interleaving,
    Step,
    answer_approvals,
    block_starts,
    gated_interleavings,
    interleavings,
    split_text,
    text_among,
    tool_use_blocks,
)
from tests.processes import WAIT, node_json
from tests.servers import serve

pytestmark = pytest.mark.anyio
NODE = Path(__file__).parent / "node"


def request(text: str, stream_id: str = "s1") -> ChatCompletionRequest:
    return ChatCompletionRequest(
        id=stream_id, model="m", messages=[{"role": "user", "content": text}]
    )


async def events_of(hub: StreamHub, stream_id: str) -> list[Event]:
    events, known = await hub.store.since(stream_id, None)
    assert known
    assert check(events) == []
    return events


def calls_in(messages: list[ModelMessage]) -> list[ToolCallPart]:
    return [
        part
        for message in messages
        if isinstance(message, ModelResponse)
        for part in message.parts
        if isinstance(part, ToolCallPart)
    ]


def assert_same_as_run(parsed: ParsedStream, messages: list[ModelMessage], output: str) -> None:
    """What the stream says is what the run's history and output say."""
    assert parsed.text == output
    assert [(c.tool_use_id, c.name, c.params) for c in parsed.tool_calls] == [
        (c.tool_call_id, c.tool_name, c.args_as_dict()) for c in calls_in(messages)
    ]
    returns = [
        part
        for part in agents.tool_returns(messages)
        if part.tool_call_id in {c.tool_use_id for c in parsed.tool_calls}
    ]
    assert sorted((r.tool_use_id, r.text, r.is_error) for r in parsed.tool_results) == sorted(
        (
            part.tool_call_id,
            part.model_response_str(wrap_if_error=False),
            part.outcome in ("failed", "retried"),
        )
        for part in returns
    )


async def publish_one(agent: Agent[Any, Any], prompt: str) -> tuple[list[Event], Any]:
    """The low-level path: ``run_stream_events`` into ``stream_rounds``."""
    sink = InMemorySink()
    publisher = Publisher(sink)
    model = agent_model_name(agent)
    async with (
        stream_rounds(publisher, message_id="msg_1", stream_id="s1", model=model) as rounds,
        agent.run_stream_events(prompt) as events,
    ):
        published = await stream_run(rounds, events)
    return sink.events, published


# -- one run ---------------------------------------------------------------------------------


async def test_a_call_id_an_earlier_request_used_is_published_under_a_fresh_one() -> None:
    # A model that numbers its calls per response gives the next request's call the id
    # of the last one's: published as it is, the message would hold two tool_use blocks
    # with one id, and no client could tell their results apart.
    events, published = await publish_one(agents.repeated_call_id_agent(), "go")
    assert check(events) == []
    parsed = reassemble_events(events)
    ids = [call.tool_use_id for call in parsed.tool_calls]
    assert ids[0] == "call_0"
    assert len(ids) == len(set(ids)) == 3
    assert [(r.tool_use_id, r.text) for r in parsed.tool_results] == [
        (call_id, f"result {n}") for n, call_id in enumerate(ids)
    ]
    assert [call.id for call in published.tool_calls] == ids
    assert [call.given_id for call in published.tool_calls] == ["call_0"] * 3
    assert published.results == {call_id: f"result {n}" for n, call_id in enumerate(ids)}
    assert published.output == "done"


@pytest.mark.parametrize(
    ("output", "text"),
    [
        ("lone \ud800", "lone \ufffd"),  # no UTF-8 text carries a lone surrogate
        ({"n": 2**64}, '{"n":18446744073709551616}'),  # pydantic writes the digits
    ],
)
async def test_a_tool_output_orjson_cannot_write_is_its_result(output: object, text: str) -> None:
    # A tool that returns a string holding a lone surrogate (a file name decoded with
    # surrogateescape, say) raised SerializationError out of the adapter.
    events, published = await publish_one(agents.odd_values_agent(output), "go")
    assert check(events) == []
    parsed = reassemble_events(events)
    assert [c.arguments for c in parsed.tool_calls] == ['{"n": 18446744073709551616}']
    assert [r.text for r in parsed.tool_results] == [text]
    assert published.results == {"c1": text}


async def test_streamed_text_and_thinking_with_a_lone_surrogate_go_out_cleaned() -> None:
    # A provider's "\\ud800" escape parses to a lone surrogate, which Pydantic AI's run
    # carries as it is: the turn ended with a SerializationError error event.
    from pydantic_ai.models.function import DeltaThinkingPart, FunctionModel

    async def script(messages: object, info: object) -> AsyncIterator[Any]:
        yield {0: DeltaThinkingPart(content="hmm \udfff")}
        yield "caf\ud800 ok"

    agent = Agent(FunctionModel(stream_function=script, model_name="m"))
    events, _ = await publish_one(agent, "go")
    assert check(events) == []
    assert [e.event for e in events if e.event == "error"] == []
    parsed = reassemble_events(events)
    assert parsed.thinking == "hmm \ufffd"
    assert parsed.text == "caf\ufffd ok"
    assert parsed.stop_reason == "end_turn"


async def test_thinking_parallel_calls_a_retry_and_text_are_one_message() -> None:
    events, published = await publish_one(agents.weather_agent(), "Weather in Oslo and Rome?")
    assert check(events) == []
    parsed = reassemble_events(events)
    [message] = parsed.messages
    messages = published.messages()
    assert_same_as_run(parsed, messages, published.output)
    assert published.output == "Oslo is cold, Rome is warm."
    # The thinking part and its signature, in the first round.
    [thinking] = [
        p
        for m in messages
        if isinstance(m, ModelResponse)
        for p in m.parts
        if isinstance(p, ThinkingPart)
    ]
    assert parsed.thinking == thinking.content == "Two cities, two calls."
    assert parsed.signature == thinking.signature == "sig-1"
    # The retry is the failed call's error result; the call made again works.
    results = {r.tool_use_id: (r.text, r.is_error) for r in parsed.tool_results}
    assert results["call_flaky_1"] == ("not yet, try again", True)
    assert results["call_flaky_2"] == ("worked", False)
    # Both calls of the first round before both results (the round layout).
    kinds = [
        (json.loads(e.data)["content_block"]["type"])
        for e in events
        if e.event == "content_block_start"
    ]
    assert kinds[:5] == ["thinking", "tool_use", "tool_use", "tool_result", "tool_result"]
    assert parsed.stop_reason == "end_turn"
    assert message.model == agents.MODEL_NAME == published.model
    usage = published.usage
    assert message.usage["output_tokens"] == usage.output_tokens > 0
    assert message.usage["input_tokens"] == usage.input_tokens > 0


async def test_a_test_model_run_is_reassembled_as_the_run_says() -> None:
    agent = Agent(TestModel(seed=1))

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        return a + b

    @agent.tool_plain
    def shout(word: str) -> str:
        return word.upper()

    events, published = await publish_one(agent, "go")
    assert check(events) == []
    parsed = reassemble_events(events)
    assert sorted(parsed.tool_names) == ["add", "shout"]
    assert_same_as_run(parsed, published.messages(), published.output)
    assert reassemble_events(events).messages[0].model == "test"


class City(BaseModel):
    name: str
    celsius: int


async def test_a_structured_output_is_the_output_tool_s_call_and_result() -> None:
    agent = Agent(TestModel(), output_type=City)
    events, published = await publish_one(agent, "A city?")
    assert check(events) == []
    parsed = reassemble_events(events)
    assert isinstance(published.output, City)
    [call] = parsed.tool_calls
    assert call.name == "final_result"
    assert call.params == published.output.model_dump()
    assert [(r.tool_use_id, r.text) for r in parsed.tool_results] == [
        (call.tool_use_id, "Final result processed.")
    ]


async def test_a_provider_s_native_tool_is_a_server_tool_block() -> None:
    from pydantic_ai.models.function import FunctionModel

    async def script(messages: list[ModelMessage], info: Any) -> AsyncIterator[Any]:
        if agents.requests_made(messages) == 1:
            yield {0: NativeToolCallPart("web_search", {"query": "oslo"}, tool_call_id="ws_1")}
            yield {1: NativeToolReturnPart("web_search", {"hits": 2}, tool_call_id="ws_1")}
        else:
            # No text came: Pydantic AI asked again (no tool event in between).
            yield "Two hits."

    agent = Agent(FunctionModel(stream_function=script))
    events, published = await publish_one(agent, "Search")
    assert check(events) == []
    blocks = [
        json.loads(e.data)["content_block"] for e in events if e.event == "content_block_start"
    ]
    assert blocks == [
        {"type": "server_tool_use", "id": "ws_1", "name": "web_search", "input": {"query": "oslo"}},
        {"type": "web_search_tool_result", "tool_use_id": "ws_1", "content": {"hits": 2}},
        {"type": "text"},
    ]
    assert published.output == "Two hits."


def thinking_of(events: list[Event]) -> list[tuple[str, str | None]]:
    """Each thinking block's text and signature, in order."""
    timeline = reassemble_events(events).timeline
    return [(item.text, item.signature) for item in timeline if isinstance(item, ThinkingItem)]


async def test_a_native_call_sent_again_at_its_index_is_published_once() -> None:
    # AnthropicModel sends a tool search call again, whole, at its index once its
    # arguments are normalised (a second part start and end): it went out as two
    # server_tool_use blocks under one id.
    from pydantic_ai.models.function import FunctionModel

    call = NativeToolCallPart("tool_search", {"queries": ["rate"]}, tool_call_id="srv_1")
    found = NativeToolReturnPart("tool_search", {"tools": ["rate"]}, tool_call_id="srv_1")

    async def script(messages: list[ModelMessage], info: Any) -> AsyncIterator[Any]:
        if agents.requests_made(messages) == 1:
            yield {1: call}
            yield {1: call}
            yield {2: found}
            yield {2: found}
        else:
            yield "One tool."

    events, published = await publish_one(Agent(FunctionModel(stream_function=script)), "Go")
    assert check(events) == []
    [response] = [m for m in published.messages() if isinstance(m, ModelResponse)][:1]
    assert [type(p).__name__ for p in response.parts] == [
        "NativeToolCallPart",
        "NativeToolReturnPart",
    ]
    assert block_starts(events) == [
        {
            "type": "server_tool_use",
            "id": "srv_1",
            "name": "tool_search",
            "input": {"queries": ["rate"]},
        },
        {"type": "tool_search_tool_result", "tool_use_id": "srv_1", "content": {"tools": ["rate"]}},
        {"type": "text"},
    ]


async def test_a_signature_sent_after_its_part_ended_is_its_open_block_s() -> None:
    # OpenAIResponsesModel sends a reasoning item's encrypted content as a signature
    # delta of its first part after that part ended (the item's summary parts go out as
    # one block): it was dropped, and the reasoning could not be sent back.
    from pydantic_ai.models.function import DeltaThinkingPart, FunctionModel

    async def script(messages: list[ModelMessage], info: Any) -> AsyncIterator[Any]:
        yield {0: DeltaThinkingPart(content="First, ")}
        yield {1: DeltaThinkingPart(content="then.")}
        yield {0: DeltaThinkingPart(signature="enc-1")}
        yield "Done."

    events, published = await publish_one(Agent(FunctionModel(stream_function=script)), "Go")
    assert check(events) == []
    [thinking, second] = [p for p in published.result.response.parts if isinstance(p, ThinkingPart)]  # type: ignore[union-attr]
    assert (thinking.signature, second.signature) == ("enc-1", None)
    assert thinking_of(events) == [("First, then.", "enc-1")]
    assert reassemble_events(events).text == "Done."


async def test_a_signature_after_its_block_closed_is_a_redacted_thinking_block() -> None:
    # Its thinking block cannot take it any more (text came between): the protocol's
    # other way to carry reasoning a client cannot read, as the Responses adapter does.
    from pydantic_ai.models.function import DeltaThinkingPart, FunctionModel

    async def script(messages: list[ModelMessage], info: Any) -> AsyncIterator[Any]:
        yield {0: DeltaThinkingPart(content="Think.")}
        yield "Done."
        yield {0: DeltaThinkingPart(signature="enc-1")}

    events, _ = await publish_one(Agent(FunctionModel(stream_function=script)), "Go")
    assert check(events) == []
    assert block_starts(events) == [
        {"type": "thinking"},
        {"type": "text"},
        {"type": "redacted_thinking", "data": "enc-1"},
    ]
    assert reassemble_events(events).text == "Done."


async def test_a_thinking_part_with_a_signature_and_no_text_is_a_block_of_its_own() -> None:
    # A reasoning item with encrypted content and no summary (OpenAIResponsesModel), an
    # empty thinking block with a signature (Claude's advisor): no block went out, and
    # the signature was lost.
    from pydantic_ai.models.function import DeltaThinkingPart, FunctionModel

    async def script(messages: list[ModelMessage], info: Any) -> AsyncIterator[Any]:
        yield {0: DeltaThinkingPart(signature="enc-0")}
        yield {1: DeltaThinkingPart(content="Then this.", signature="sig-1")}
        yield "Done."

    events, published = await publish_one(Agent(FunctionModel(stream_function=script)), "Go")
    assert check(events) == []
    parts = [p for p in published.result.response.parts if isinstance(p, ThinkingPart)]  # type: ignore[union-attr]
    assert [(p.content, p.signature) for p in parts] == [("", "enc-0"), ("Then this.", "sig-1")]
    assert thinking_of(events) == [
        ("", "enc-0"),
        ("Then this.", "sig-1"),
    ]
    assert [b["type"] for b in block_starts(events)] == ["thinking", "thinking", "text"]


async def test_each_signed_thinking_part_is_a_block_of_its_own() -> None:
    # Two signed parts in a row (Claude's thinking blocks, two reasoning items) ran on
    # in one block: the second's text after the first's signature, and the two
    # signatures joined (every dialect adds a block's signature deltas up).
    from pydantic_ai.models.function import DeltaThinkingPart, FunctionModel

    async def script(messages: list[ModelMessage], info: Any) -> AsyncIterator[Any]:
        yield {0: DeltaThinkingPart(content="One.", signature="sig-0")}
        yield {1: DeltaThinkingPart(content="Two.", signature="sig-1")}
        yield "Done."

    events, _ = await publish_one(Agent(FunctionModel(stream_function=script)), "Go")
    assert check(events) == []
    assert thinking_of(events) == [("One.", "sig-0"), ("Two.", "sig-1")]


# -- what only a provider's stream carries ---------------------------------------------------


async def run_on_claude(body: bytes) -> tuple[list[Event], Any]:
    """A run of AnthropicModel on the Messages API stream ``body``, over loopback."""
    with serve(agents.messages_app(body)) as url:
        async with AsyncAnthropic(base_url=url, api_key="test", max_retries=0) as client:
            return await publish_one(agents.anthropic_agent(client), "Hi")


@pytest.mark.parametrize("last", [False, True])
async def test_a_compaction_is_a_compaction_block_carried_whole(last: bool) -> None:
    # Claude compacting the conversation: the summary and what a client sends back in
    # its place went unpublished (a log line), and were lost to every client. Pydantic AI
    # sends the part again as it fills in, with no end of its own: it is whole once the
    # next part begins, or (the response's last part) once the response ends.
    compaction = {"type": "compaction", "content": "So far: hi.", "encrypted_content": "enc-1"}
    blocks = [compaction, {"type": "text", "text": "Hello."}]
    body = agents.anthropic_stream(blocks[::-1] if last else blocks)
    events, published = await run_on_claude(body)
    assert check(events) == []
    expected = [compaction, {"type": "text"}]
    assert block_starts(events) == (expected[::-1] if last else expected)
    assert reassemble_events(events).text == "Hello."
    [part] = [p for p in published.result.response.parts if isinstance(p, CompactionPart)]
    assert part.content == "So far: hi."


async def test_a_compaction_with_nothing_to_send_back_is_not_published(
    caplog: pytest.LogCaptureFixture,
) -> None:
    compaction = {"type": "compaction", "content": None, "encrypted_content": None}
    body = agents.anthropic_stream([compaction, {"type": "text", "text": "Hello."}])
    with caplog.at_level(logging.WARNING, logger="essessey.adapters.pydantic_ai"):
        events, _ = await run_on_claude(body)
    assert check(events) == []
    assert block_starts(events) == [{"type": "text"}]
    assert "compaction part with nothing to send back" in caplog.text


async def test_the_input_count_leaves_the_cache_s_tokens_out() -> None:
    # Pydantic AI's input_tokens counts the cache's reads and writes too; the protocol's
    # does not, and a client adds the three up: it read the input about twice over.
    body = agents.anthropic_stream(
        [{"type": "text", "text": "Hello."}],
        usage={
            "input_tokens": 6,
            "cache_read_input_tokens": 6289,
            "cache_creation_input_tokens": 3337,
        },
        output_tokens=12,
    )
    events, published = await run_on_claude(body)
    assert check(events) == []
    assert published.usage.input_tokens == 6 + 6289 + 3337
    [message] = reassemble_events(events).messages
    assert message.usage == {
        "input_tokens": 6,
        "cache_read_input_tokens": 6289,
        "cache_creation_input_tokens": 3337,
        "output_tokens": 12,
    }


@pytest.mark.parametrize(
    ("provider_reason", "finish_reason", "stop_reason"),
    [("max_tokens", "length", "max_tokens"), ("refusal", "content_filter", "refusal")],
)
async def test_a_cut_or_refused_answer_ends_with_its_stop_reason(
    provider_reason: str, finish_reason: str, stop_reason: str
) -> None:
    # Every run ended end_turn: a truncated or refused answer looked complete.
    body = agents.anthropic_stream(
        [{"type": "text", "text": "Part of"}], stop_reason=provider_reason
    )
    events, published = await run_on_claude(body)
    assert check(events) == []
    assert published.result.response.finish_reason == finish_reason
    parsed = reassemble_events(events)
    assert (parsed.text, parsed.stop_reason) == ("Part of", stop_reason)


async def test_claude_s_redacted_thinking_is_a_redacted_thinking_block() -> None:
    # Pydantic AI keeps it as a ThinkingPart with no text, the data as its signature
    # (id "redacted_thinking"): nothing went out, and a client replaying the turn lost
    # the model's reasoning state.
    body = agents.anthropic_stream(
        [
            {"type": "redacted_thinking", "data": "opaque-1"},
            {"type": "thinking", "thinking": "", "signature": "sig-empty"},
            {"type": "thinking", "thinking": "So.", "signature": "sig-2"},
            {"type": "text", "text": "Hello."},
        ]
    )
    events, published = await run_on_claude(body)
    assert check(events) == []
    parts = [p for p in published.result.response.parts if isinstance(p, ThinkingPart)]
    assert [(p.id, p.content, p.signature) for p in parts] == [
        ("redacted_thinking", "", "opaque-1"),
        (None, "", "sig-empty"),
        (None, "So.", "sig-2"),
    ]
    assert block_starts(events) == [
        {"type": "redacted_thinking", "data": "opaque-1"},
        {"type": "thinking"},
        {"type": "thinking"},
        {"type": "text"},
    ]
    assert thinking_of(events) == [
        ("", "sig-empty"),
        ("So.", "sig-2"),
    ]


# -- a call's name and id changed by a later delta -------------------------------------------


@pytest.mark.parametrize(
    ("deltas", "calls"),
    [
        pytest.param(
            [
                {1: DeltaToolCall(name="", json_args='{"a"', tool_call_id="call_0")},
                {1: DeltaToolCall(name="lookup", json_args=": 1}")},
            ],
            [("call_0", "lookup", {"a": 1})],
            id="named-later",
        ),
        pytest.param(
            [
                {1: DeltaToolCall(name="lookup", json_args="{", tool_call_id="call_0")},
                {2: DeltaToolCall(name="lookup", json_args="{}", tool_call_id="tmp")},
                {2: DeltaToolCall(tool_call_id="call_1")},
                {1: DeltaToolCall(json_args="}")},
            ],
            [("call_0", "lookup", {}), ("call_1", "lookup", {})],
            id="new-id-while-held",
        ),
    ],
)
async def test_a_name_or_id_a_later_delta_gives_a_call_not_out_yet_is_its_block_s(
    deltas: list[Any], calls: list[tuple[str, str, dict[str, Any]]]
) -> None:
    # A call named only by a later delta was dropped ("never got a name"); a held call
    # whose id changed went out under the first.
    events, published = await publish_one(agents.client_calls_agent(deltas), "go")
    assert check(events) == []
    assert [
        (c.tool_call_id, c.tool_name, c.args_as_dict()) for c in published.deferred.calls
    ] == calls  # type: ignore[union-attr]
    parsed = reassemble_events(events)
    assert [(c.tool_use_id, c.name, c.params) for c in parsed.tool_calls] == calls
    assert published.asked == [call_id for call_id, _, _ in calls]


async def test_a_call_whose_id_changes_after_its_block_went_out_keeps_it_and_its_result(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The block cannot change once out: it keeps its id, and the result Pydantic AI
    # gives the new id answers it (it was skipped, and the call got an error result).
    from pydantic_ai.models.function import FunctionModel

    async def script(messages: list[ModelMessage], info: Any) -> AsyncIterator[Any]:
        if agents.requests_made(messages) == 1:
            yield {0: DeltaToolCall(name="f", json_args="{}", tool_call_id="c1")}
            yield {0: DeltaToolCall(tool_call_id="c2")}
        else:
            yield "done"

    agent = Agent(FunctionModel(stream_function=script))

    @agent.tool_plain
    def f() -> str:
        return "ran"

    with caplog.at_level("WARNING", logger="essessey"):
        events, published = await publish_one(agent, "go")
    assert check(events) == []
    assert [c.tool_call_id for c in calls_in(published.messages())] == ["c2"]
    parsed = reassemble_events(events)
    assert [(c.tool_use_id, c.name) for c in parsed.tool_calls] == [("c1", "f")]
    assert [(r.tool_use_id, r.text, r.is_error) for r in parsed.tool_results] == [
        ("c1", "ran", False)
    ]
    assert parsed.text == "done"
    assert [r.getMessage() for r in caplog.records] == [
        "tool call 0 changed its name or id after its block went out; the block keeps the first"
    ]


async def test_a_plain_iterable_of_events_rounds_the_same() -> None:
    agent = agents.weather_agent()
    sink = InMemorySink()
    async with (
        stream_rounds(Publisher(sink), message_id="m", stream_id="s", model="x") as rounds,
        agent.run_stream_events("go") as events,
    ):

        async def plain() -> AsyncIterator[Any]:
            async for event in events:
                yield event

        published = await stream_run(rounds, plain())
    assert check(sink.events) == []
    assert_same_as_run(reassemble_events(sink.events), published.messages(), published.output)


async def test_an_error_a_tool_raises_is_in_band_and_raised() -> None:
    sink = InMemorySink()
    agent = agents.failing_agent()

    async def run() -> None:
        async with (
            stream_rounds(Publisher(sink), message_id="m", stream_id="s", model="x") as r,
            agent.run_stream_events("go") as events,
        ):
            await stream_run(r, events)

    with pytest.raises(RuntimeError, match="on fire"):
        await run()
    assert check(sink.events) == []
    assert sink.events[-1].event == "error"
    # Nothing of the error's text (it could carry a payload): its class only.
    assert b"on fire" not in sink.events[-1].data
    parsed = reassemble_events(sink.events)
    assert parsed.text == "Trying."
    assert parsed.error is not None


async def test_a_cancelled_run_stops_and_its_stream_ends() -> None:
    gate = anyio.Event()
    started = anyio.Event()
    closed: list[int] = []
    agent = agents.slow_agent(started, gate, closed)
    turns = AgentTurns(agent)
    async with StreamHub(on_answer=turns.on_answer) as hub:
        await hub.start("s1", turns(request("go")))
        with anyio.fail_after(WAIT):
            await started.wait()
        assert await hub.cancel("s1")
        events = await events_of(hub, "s1")
    assert reassemble_events(events).stop_reason == "cancelled"
    assert closed == [1]  # the model's stream was closed: nothing left running


# -- asking ----------------------------------------------------------------------------------


async def test_an_approval_of_a_call_published_under_a_fresh_id_resumes_the_run() -> None:
    # A model that numbers its calls per response: the second request's call_0 (which
    # needs approval) goes out under a fresh id, the answer names that id, and Pydantic
    # AI's DeferredToolResults must get the framework's own; the result goes to the
    # block the call was published as.
    from pydantic_ai import DeferredToolRequests
    from pydantic_ai.models.function import FunctionModel

    sent: list[str] = []

    async def script(messages: list[ModelMessage], info: Any) -> AsyncIterator[Any]:
        requests = sum(1 for m in messages if not isinstance(m, ModelResponse))
        if requests == 1:
            yield {
                0: DeltaToolCall(name="lookup", json_args='{"name": "ada"}', tool_call_id="call_0")
            }
        elif requests == 2:
            yield {
                0: DeltaToolCall(name="send", json_args='{"to": "ada@x"}', tool_call_id="call_0")
            }
        else:
            yield "Sent." if sent else "Not sent."

    model = FunctionModel(stream_function=script, model_name="m")
    agent = Agent(model, output_type=[str, DeferredToolRequests])  # type: ignore[arg-type]

    @agent.tool_plain
    def lookup(name: str) -> str:
        return name + "@x"

    @agent.tool_plain(requires_approval=True)
    def send(to: str) -> str:
        sent.append(to)
        return "sent to " + to

    turns = AgentTurns(agent)
    async with StreamHub(on_answer=turns.on_answer) as hub:
        await hub.start("s1", turns(request("Mail Ada")))
        await hub.wait("s1")
        waiting = await hub.waiting("s1")
        assert waiting is not None
        [asked] = waiting.requests
        assert asked.tool_use_id != "call_0"  # call_0 is the first round's
        continued = await hub.answer("s1", [ToolApproval(asked.id, approved=True)])
        assert continued.started
        await hub.wait("s1")
        parsed = reassemble_events(await events_of(hub, "s1"))
    assert sent == ["ada@x"]
    assert parsed.messages[-1].text == "Sent."
    assert [e for e in parsed.messages if e.error is not None] == []
    assert (asked.tool_use_id, "sent to ada@x") in [
        (r.tool_use_id, r.text) for r in parsed.tool_results
    ]


async def test_an_approved_call_runs_and_the_run_goes_on() -> None:
    agents.SENT.clear()
    turns = AgentTurns(agents.mail_agent())
    async with StreamHub(on_answer=turns.on_answer) as hub:
        await hub.start("s1", turns(request("Mail Ada")))
        await hub.wait("s1")
        waiting = await hub.waiting("s1")
        assert waiting is not None
        [asked] = waiting.requests
        assert asked.tool_use_id == "call_mail"
        assert asked.input == {"to": "ada@example.com"}
        first = reassemble_events(await events_of(hub, "s1"))
        assert first.stop_reason == "tool_use"
        # The call that needed no approval ran; its result is out before the question.
        assert [(r.tool_use_id, r.text) for r in first.tool_results] == [
            ("call_look", "ada@example.com")
        ]
        continued = await hub.answer("s1", [ToolApproval(asked.id, approved=True)])
        assert continued.started
        await hub.wait("s1")
        parsed = reassemble_events(await events_of(hub, "s1"))
    assert agents.SENT == [{"to": "ada@example.com"}]
    assert parsed.messages[-1].text == "Sent."
    assert parsed.stop_reason == "end_turn"
    assert ("call_mail", '{"sent":true,"to":"ada@example.com"}', False) in [
        (r.tool_use_id, r.text, r.is_error) for r in parsed.tool_results
    ]
    assert await turns.states.load(asked.id) is None  # the run went on: its state is gone


async def test_a_denied_call_is_the_framework_s_denial_with_the_reason() -> None:
    agents.SENT.clear()
    agents.DENIALS.clear()
    turns = AgentTurns(agents.mail_agent())
    async with StreamHub(on_answer=turns.on_answer) as hub:
        await hub.start("s1", turns(request("Mail Ada")))
        await hub.wait("s1")
        [asked] = (await hub.waiting("s1")).requests  # type: ignore[union-attr]
        await hub.answer("s1", [ToolApproval(asked.id, approved=False, reason="not today")])
        await hub.wait("s1")
        parsed = reassemble_events(await events_of(hub, "s1"))
    assert agents.SENT == []
    assert agents.DENIALS == ["not today"]
    assert parsed.messages[-1].text == "I did not send it."
    # The denial is the approval_response the hub recorded, not a result of its own.
    assert "call_mail" not in [r.tool_use_id for r in parsed.tool_results]


async def test_a_client_call_is_left_to_the_client_and_its_output_resumes_the_run() -> None:
    turns = AgentTurns(agents.client_tool_agent())
    async with StreamHub(on_answer=turns.on_answer) as hub:
        await hub.start("s1", turns(request("Where am I?")))
        await hub.wait("s1")
        first = reassemble_events(await events_of(hub, "s1"))
        assert first.stop_reason == "tool_use"
        assert [c.name for c in first.tool_calls] == ["locate"]
        assert first.tool_results == ()
        await hub.answer("s1", [ToolOutput("call_where", "Bergen")])
        await hub.wait("s1")
        parsed = reassemble_events(await events_of(hub, "s1"))
    assert parsed.messages[-1].text == "You are in Bergen."
    # The client's output is recorded once, by the hub.
    assert [(r.tool_use_id, r.text) for r in parsed.tool_results] == [("call_where", "Bergen")]


async def test_the_answer_resumes_the_run_on_another_replica() -> None:
    agents.SENT.clear()
    store = InMemoryEventStore()
    # Two replicas: their own agent objects and hubs, one store for streams and states.
    one = AgentTurns(agents.mail_agent(), states=RunStates(store))
    two = AgentTurns(agents.mail_agent(), states=RunStates(store))
    async with StreamHub(store, on_answer=one.on_answer) as hub_one:
        await hub_one.start("s1", one(request("Mail Ada")))
        await hub_one.wait("s1")
        async with StreamHub(store, on_answer=two.on_answer) as hub_two:
            [asked] = (await hub_two.waiting("s1")).requests  # type: ignore[union-attr]
            continued = await hub_two.answer("s1", [ToolApproval(asked.id, approved=True)])
            assert continued.started
            await hub_two.wait("s1")
            parsed = reassemble_events(await events_of(hub_two, "s1"))
    assert agents.SENT == [{"to": "ada@example.com"}]
    assert parsed.messages[-1].text == "Sent."


async def test_an_answer_without_a_kept_state_ends_in_an_error() -> None:
    store = InMemoryEventStore()
    one = AgentTurns(agents.mail_agent(), states=RunStates(store))
    two = AgentTurns(agents.mail_agent())  # its own states: not the replica's
    async with StreamHub(store, on_answer=one.on_answer) as hub_one:
        await hub_one.start("s1", one(request("Mail Ada")))
        await hub_one.wait("s1")
    async with StreamHub(store, on_answer=two.on_answer) as hub_two:
        [asked] = (await hub_two.waiting("s1")).requests  # type: ignore[union-attr]
        await hub_two.answer("s1", [ToolApproval(asked.id, approved=True)])
        await hub_two.wait("s1")
        events = await events_of(hub_two, "s1")
    assert events[-1].event == "error"


# -- reading the turn ------------------------------------------------------------------------


async def test_a_reader_that_drops_mid_run_resumes_with_every_event_once() -> None:
    gate = anyio.Event()
    turns = AgentTurns(agents.slow_agent(anyio.Event(), gate, []))
    async with StreamHub(on_answer=turns.on_answer) as hub:
        await hub.start("s1", turns(request("go")))
        read: list[Event] = []
        with anyio.fail_after(WAIT):
            async for event in hub.subscribe("s1"):
                read.append(event)
                if event.event == "content_block_delta":
                    break  # dropped in the middle of the run: the model waits
            gate.set()
            async for event in hub.subscribe("s1", read[-1].id):
                read.append(event)
        stored = await events_of(hub, "s1")
    assert [e.id for e in read] == [e.id for e in stored]
    assert reassemble_events(read).text == "first " + "".join(f"w{n} " for n in range(20))


def test_history_of_a_request_is_the_conversation_before_its_prompt() -> None:
    chat = ChatRequest(
        id="c",
        messages=[
            {"id": "1", "role": "system", "parts": [{"type": "text", "text": "Be brief."}]},
            {"id": "2", "role": "user", "parts": [{"type": "text", "text": "Hi"}]},
            {"id": "3", "role": "assistant", "parts": [{"type": "text", "text": "Hello"}]},
            {"id": "4", "role": "user", "parts": [{"type": "text", "text": "Weather?"}]},
        ],
        trigger="submit-message",
    )
    prompt, history = history_of(chat)
    assert prompt == "Weather?"
    kinds = [type(part).__name__ for message in history for part in message.parts]
    assert kinds == ["SystemPromptPart", "UserPromptPart", "TextPart"]


async def test_the_history_reaches_the_model() -> None:
    seen: list[list[ModelMessage]] = []

    async def script(messages: list[ModelMessage], info: Any) -> AsyncIterator[str]:
        seen.append(messages)
        yield "ok"

    from pydantic_ai.models.function import FunctionModel

    turns = AgentTurns(Agent(FunctionModel(stream_function=script)))
    conversation = ChatCompletionRequest(
        id="s1",
        model="m",
        messages=[
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Again"},
        ],
    )
    async with StreamHub() as hub:
        await hub.start("s1", turns(conversation))
        await hub.wait("s1")
    [messages] = seen
    assert len(messages) == 3


# -- over HTTP -------------------------------------------------------------------------------


@pytest.fixture
def weather_app() -> Iterator[str]:
    turns = AgentTurns(agents.weather_agent())
    hub = StreamHub(on_answer=turns.on_answer)
    app = Starlette(routes=list(dialect_routes(hub, turns)), lifespan=hub.lifespan)
    with serve(app, lifespan="on") as url:
        yield url


@pytest.fixture
def mail_app() -> Iterator[str]:
    turns = AgentTurns(agents.mail_agent())
    hub = StreamHub(on_answer=turns.on_answer)
    app = Starlette(routes=list(dialect_routes(hub, turns)), lifespan=hub.lifespan)
    with serve(app, lifespan="on") as url:
        yield url


def test_the_openai_sdk_reads_the_run(weather_app: str) -> None:
    client = openai.OpenAI(base_url=weather_app + "/v1", api_key="none", max_retries=0)
    stream = client.chat.completions.create(
        model="any", messages=[{"role": "user", "content": "Weather?"}], stream=True
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == "Oslo is cold, Rome is warm."
    response = client.responses.create(model="any", input="Weather?")
    assert response.output_text == "Oslo is cold, Rome is warm."


def test_an_approval_answered_on_the_protocol_s_route(mail_app: str) -> None:
    agents.SENT.clear()
    with httpx.Client(base_url=mail_app, timeout=WAIT) as http:
        first = http.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "Mail Ada"}]},
        ).json()
        stream_id = first["id"]
        assert first["choices"][0]["finish_reason"] == "tool_calls"
        body = http.get(f"/streams/{stream_id}").content
        approvals = [
            json.loads(line[6:])["content_block"]
            for line in body.split(b"\n")
            if line.startswith(b"data: ") and b'"approval_request"' in line
        ]
        [approval] = approvals
        answered = http.post(
            f"/streams/{stream_id}/answer",
            json={"answers": [{"id": approval["id"], "approved": True}]},
        )
        assert answered.status_code == 200, answered.text
        after = answered.json()["after"]
        rest = http.get(f"/streams/{stream_id}", params={"last_event_id": after}).content
    assert b"Sent." in rest
    assert agents.SENT == [{"to": "ada@example.com"}]


def run_node(script: str, *args: str) -> Any:
    return node_json(NODE / script, *args)


@pytest.mark.slow
@pytest.mark.parametrize("action", ["approve", "deny"])
def test_use_chat_approves_and_denies(node_client: Path, mail_app: str, action: str) -> None:
    agents.SENT.clear()
    seen = run_node("ui_asking.mjs", mail_app, f"chat-{action}", "send", "Mail Ada", action)
    assert seen["error"] is None
    assert seen["errors"] == []
    [assistant] = [m for m in seen["messages"] if m["role"] == "assistant"]
    text = "".join(p.get("text", "") for p in assistant["parts"] if p["type"] == "text")
    parts = {p.get("toolCallId"): p for p in assistant["parts"] if p["type"].startswith("tool-")}
    if action == "approve":
        assert text.endswith("Sent.")
        assert parts["call_mail"]["state"] == "output-available"
        assert agents.SENT == [{"to": "ada@example.com"}]
    else:
        assert text.endswith("I did not send it.")
        assert parts["call_mail"]["state"] == "output-denied"
        assert agents.SENT == []
    assert parts["call_look"]["output"] == "ada@example.com"


@pytest.mark.slow
def test_ag_ui_client_reads_the_run(node_client: Path, weather_app: str) -> None:
    seen = run_node("agui.mjs", weather_app + "/agui", "thread-1", "run-1")
    assert seen["events"][0] == "RUN_STARTED"
    assert seen["events"][-1] == "RUN_FINISHED"
    assert "TOOL_CALL_RESULT" in seen["events"]
    [answer] = [m for m in seen["messages"] if m["role"] == "assistant" and m.get("content")]
    assert answer["content"] == "Oslo is cold, Rome is warm."


# -- any split of a model's stream -----------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    text=st.text(st.characters(exclude_categories=("Cs",)), max_size=30),
    cuts=st.lists(st.integers(1, 30), max_size=6),
    calls=interleavings(max_calls=3),
    data=st.data(),
)
def test_any_split_of_text_and_interleaved_call_fragments_is_published_whole(
    text: str, cuts: list[int], calls: Interleaving, data: st.DataObject
) -> None:
    # The text's pieces anywhere among the calls' fragments, both in their order.
    pieces = split_text(text, cuts)
    steps = data.draw(text_among(pieces, calls), label="steps")
    agent = agents.scripted_client_calls_agent(steps)
    events, published = anyio.run(publish_one, agent, "go")

    assert check(events) == []
    [message] = reassemble_events(events).messages
    assert message.text == text
    assert message.stop_reason == "tool_use"
    assert [(c.tool_use_id, c.name, c.arguments) for c in message.tool_calls] == [
        (f"call_{k}", "lookup", arguments) for k, arguments in enumerate(calls.arguments)
    ]
    # Each call's fragments in its own block, each as its own delta, in the order sent.
    fragments = [[f for k2, f, _ in calls.sequence if k2 == k] for k in range(len(calls.pieces))]
    assert [p for *_, p in tool_use_blocks(events)] == fragments
    assert [(c.id, c.input) for c in published.tool_calls] == [
        (f"call_{k}", json.loads(arguments)) for k, arguments in enumerate(calls.arguments)
    ]
    # The run stopped at the client's calls: the message asks for each result.
    assert published.asked == [f"call_{k}" for k in range(len(calls.arguments))]


def test_a_call_s_fragment_after_another_call_began_goes_into_its_block() -> None:
    # Call 0 sends "{", call 1 opens (Pydantic AI ends part 1 there), then call 0 sends
    # "}": call 1's block waits until call 0's arguments are whole.
    steps: list[Step] = [(0, "{", True), (1, "{}", True), (0, "}", False)]
    events, _ = anyio.run(publish_one, agents.scripted_client_calls_agent(steps), "go")
    assert check(events) == []
    assert [(i, p) for i, _, _, p in tool_use_blocks(events)] == [(0, ["{", "}"]), (1, ["{}"])]
    assert [c.arguments for c in reassemble_events(events).tool_calls] == ["{}", "{}"]


@settings(max_examples=20, deadline=None)
@given(plan=gated_interleavings())
def test_any_parallel_calls_some_gated_answered_any_way_give_each_call_one_result(
    plan: tuple[Interleaving, list[bool], list[bool]],
) -> None:
    # Parallel calls whose fragments interleave, any of them needing approval, each
    # approval answered yes or no: every call that ran gets exactly one result, in the
    # asking message or in the continuation, a denied one the hub's record of the
    # denial; and the turn ends with the model's answer.
    calls, gated, approve = plan
    count = len(calls.arguments)
    ran: list[str] = []
    turns = AgentTurns(agents.gated_calls_agent(list(calls.sequence), gated, ran))
    parsed, results = answer_approvals(
        turns(request("go", "s")), turns.on_answer, gated, approve, answer="done"
    )
    # A denied call's answer is the hub's record of the denial (docs/pydantic_ai.md).
    ran_calls = [k for k in range(count) if not gated[k] or approve[k]]
    assert results == {f"call_{k}": [(f"f{k} ran", False)] for k in ran_calls}
    waited = parsed.waiting
    denied = {k for k in range(count) if gated[k] and not approve[k]}
    if denied:
        assert waited is not None
        assert waited.answered is not None
        refused = {
            r.tool_use_id  # type: ignore[union-attr]
            for r in waited.requests
            if not waited.answered[r.id].approved  # type: ignore[union-attr]
        }
        assert refused == {f"call_{k}" for k in denied}
    assert sorted(ran) == sorted(f"f{k}" for k in range(count) if not gated[k] or approve[k])


# -- any sequence of a run's events ----------------------------------------------------------

_IDS = ["c1", "c2", "c3"]
_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=4)
_PART = st.one_of(
    st.builds(TextPart, content=_TEXT),
    st.builds(
        ThinkingPart,
        content=_TEXT,
        signature=st.none() | st.sampled_from(["sig", "sig-2"]),
        id=st.none() | st.just("redacted_thinking"),
    ),
    st.builds(
        lambda name, call_id, args: ToolCallPart(tool_name=name, tool_call_id=call_id, args=args),
        st.sampled_from(["f", "g", ""]),
        st.sampled_from(_IDS),
        st.sampled_from(["", "{", '{"a": 1}', "}"]),
    ),
    st.builds(
        lambda call_id: NativeToolCallPart("web_search", {"q": "x"}, tool_call_id=call_id),
        st.sampled_from(["ws_1", "ws_2"]),
    ),
    st.builds(
        lambda call_id: NativeToolReturnPart("web_search", {"hits": 1}, tool_call_id=call_id),
        st.sampled_from(["ws_1", "ws_2"]),
    ),
)
_DELTA = st.one_of(
    st.builds(TextPartDelta, content_delta=_TEXT),
    st.builds(
        ThinkingPartDelta,
        content_delta=_TEXT,
        signature_delta=st.none() | st.sampled_from(["sig", "sig-2"]),
    ),
    st.builds(
        lambda args, name, call_id: ToolCallPartDelta(
            args_delta=args, tool_name_delta=name, tool_call_id=call_id
        ),
        st.sampled_from(["{", '"a"', ": 1", "}", ""]),
        st.none() | st.sampled_from(["f", "g"]),
        st.none() | st.sampled_from(_IDS),
    ),
)
_EVENT = st.one_of(
    st.builds(PartStartEvent, index=st.integers(0, 3), part=_PART),
    st.builds(PartDeltaEvent, index=st.integers(0, 3), delta=_DELTA),
    st.builds(PartEndEvent, index=st.integers(0, 3), part=_PART),
    st.builds(
        lambda call_id, content: FunctionToolResultEvent(
            part=ToolReturnPart(tool_name="f", content=content, tool_call_id=call_id)
        ),
        st.sampled_from([*_IDS, "unknown"]),
        st.sampled_from(["ok", {"x": 1}, "lone \ud800"]),
    ),
)


async def publish_events(events: list[Any]) -> list[Event]:
    """``events`` (as ``run_stream_events`` yields them, in any order) as one message."""

    async def stream() -> Any:
        for event in events:
            yield event

    sink = InMemorySink()
    async with stream_rounds(Publisher(sink), message_id="m", stream_id="s", model="m") as rounds:
        await stream_run(rounds, stream())
    return sink.events


@settings(max_examples=100, deadline=None)
@given(events=st.lists(_EVENT, max_size=16))
def test_any_sequence_of_events_publishes_a_valid_message(events: list[Any]) -> None:
    # Events in orders a run never sends (a result for a call no message made, a second
    # result for one call, a part's end after the tools ran, two parts at one index, a
    # signature or a call's new name or id at any point) are skipped with a log line, or
    # published where the protocol has a place: the message stays valid, and whole.
    published = anyio.run(publish_events, events)
    assert check(published) == []
    assert reassemble_events(published).complete


async def test_a_run_whose_history_holds_a_lone_surrogate_asks_and_resumes() -> None:
    # Pydantic AI's own dump_json refuses the run's history when a tool's output holds a
    # lone surrogate: the state kept for the answer failed, and the turn that asked ended
    # with an error.
    turns = AgentTurns(agents.undecodable_name_agent())
    async with StreamHub(on_answer=turns.on_answer) as hub:
        await hub.start("s1", turns(request("Tidy up.")))
        await hub.wait("s1")
        waiting = await hub.waiting("s1")
        assert waiting is not None
        [asked] = waiting.requests
        await hub.answer("s1", [ToolApproval(asked.id, approved=True)])
        await hub.wait("s1")
        parsed = reassemble_events(await events_of(hub, "s1"))
    assert parsed.complete
    assert parsed.text.endswith("done")
    results = {r.tool_use_id: r.text for r in parsed.tool_results}
    assert results == {"c1": "caf\ufffd.txt", "c2": "deleted x"}


async def test_a_tool_s_image_result_is_named_in_a_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The protocol's tool result is text: an image a tool returns is left out (as Pydantic
    # AI's own text of the result leaves it out), and a log line names its type.
    from pydantic_ai import BinaryContent

    agent = Agent(TestModel())

    @agent.tool_plain
    def snapshot(x: int) -> list[Any]:
        return ["a chart", BinaryContent(data=b"\x89PNG\r\n\x1a\nSECRET", media_type="image/png")]

    with caplog.at_level(logging.INFO, logger="essessey.adapters.pydantic_ai"):
        events, _ = await publish_one(agent, "go")
    assert check(events) == []
    [result] = reassemble_events(events).tool_results
    assert result.text == "a chart"
    assert "BinaryContent" in caplog.text
    assert "SECRET" not in caplog.text
