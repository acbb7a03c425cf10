"""RoundStream: the agent-round index layout, attacked call by call."""

import asyncio
import logging
import random
from typing import Any

import anyio
import anyio.lowlevel
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from essessey import Event, InMemorySink, Publisher, RoundOrderError, check, reassemble_events
from essessey.adapters import RoundStream, ToolCallRequest, result_text, stream_rounds
from essessey.protocol import Dialect
from essessey.streamers import NO_RESULT_TEXT

MARKER = "SECRET-PAYLOAD-51c9"
DIALECTS: list[Dialect] = ["essessey", "anthropic"]


def _layout(events: list[Event]) -> list[tuple[str, int, str]]:
    """(event, index, block type) of every block start, so a test reads the layout."""
    starts = []
    for event in events:
        if event.event == "content_block_start":
            payload = orjson.loads(event.data)
            starts.append((event.event, payload["index"], payload["content_block"]["type"]))
    return starts


async def _opened(dialect: Dialect = "essessey") -> tuple[RoundStream, InMemorySink]:
    sink = InMemorySink()
    return await _opened_on(sink, dialect), sink


async def _opened_on(sink: Any, dialect: Dialect = "essessey") -> RoundStream:
    publisher = Publisher(sink, dialect=dialect)
    await publisher.send_stream_preamble("msg_1", "conv_1", "m")
    return RoundStream(publisher)


async def _finish(rounds: RoundStream) -> None:
    await rounds.publisher.send_stream_epilogue("end_turn", 0)


def _call(n: int, args: str = "{}") -> ToolCallRequest:
    return ToolCallRequest(f"toolu_{n}", f"tool_{n}", args)


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_layout_text_two_parallel_calls_then_second_round(dialect: Dialect) -> None:
    rounds, sink = await _opened(dialect)
    await rounds.round_start()
    await rounds.delta(reasoning="think")
    await rounds.delta(text="I will look")
    await rounds.assistant_message([_call(0, '{"q":1}'), _call(1, '{"q":2}')])
    await rounds.tool_call_start(0, _call(0, '{"q":1}'))
    await rounds.tool_call_start(1, _call(1, '{"q":2}'))
    await rounds.tool_result(1, "second")
    await rounds.tool_result(0, "first")
    first = await rounds.round_end()
    await rounds.round_start()
    await rounds.delta(text="Done.")
    second = await rounds.round_end()
    await _finish(rounds)

    assert _layout(sink.events) == [
        ("content_block_start", 0, "thinking"),
        ("content_block_start", 1, "text"),
        ("content_block_start", 2, "tool_use"),
        ("content_block_start", 3, "tool_use"),
        ("content_block_start", 4, "tool_result"),
        ("content_block_start", 5, "tool_result"),
        ("content_block_start", 6, "text"),
    ]
    assert check(sink.events) == []
    assert (first.start_index, first.end_index, second.start_index, second.end_index) == (
        0,
        6,
        6,
        7,
    )
    parsed = reassemble_events(sink.events)
    assert parsed.text == "I will lookDone."
    assert parsed.thinking == "think"
    assert [(e.call.tool_use_id, e.call.params, e.result) for e in parsed.executions] == [
        ("toolu_0", {"q": 1}, "first"),
        ("toolu_1", {"q": 2}, "second"),
    ]
    assert [c.result for c in first.tool_calls] == ["first", "second"]


@pytest.mark.anyio
async def test_results_wait_for_earlier_results() -> None:
    rounds, sink = await _opened()
    await rounds.round_start()
    calls = [_call(i) for i in range(3)]
    await rounds.assistant_message(calls)
    for i, call in enumerate(calls):
        await rounds.tool_call_start(i, call)
    before = len(sink.events)
    await rounds.tool_result(2, "c")
    await rounds.tool_result(1, "b")
    # Blocks 4 and 5 cannot go out before block 3.
    assert len(sink.events) == before
    await rounds.tool_result(0, "a")
    results = [
        orjson.loads(e.data)
        for e in sink.events
        if e.event == "content_block_start" and b"tool_result" in e.data
    ]
    assert [(r["index"], r["content_block"]["tool_use_id"]) for r in results] == [
        (3, "toolu_0"),
        (4, "toolu_1"),
        (5, "toolu_2"),
    ]
    await rounds.round_end()
    await _finish(rounds)
    assert check(sink.events) == []


@pytest.mark.anyio
async def test_reasoning_after_text_opens_a_new_thinking_block() -> None:
    rounds, sink = await _opened()
    await rounds.round_start()
    await rounds.delta(text="a")
    await rounds.delta(reasoning="b")
    await rounds.delta(text="c", reasoning="d")
    summary = await rounds.round_end()
    await _finish(rounds)
    kinds = [kind for _, _, kind in _layout(sink.events)]
    # b and d are reasoning in a row (d comes before c in one delta): one block.
    assert kinds == ["text", "thinking", "text"]
    assert (summary.text, summary.thinking) == ("ac", "bd")
    assert check(sink.events) == []


@pytest.mark.anyio
async def test_streamed_calls_with_argument_deltas() -> None:
    rounds, sink = await _opened()
    await rounds.round_start()
    await rounds.delta(text="x")
    await rounds.tool_call_start(0, ToolCallRequest("a", "f"))
    await rounds.tool_call_delta(0, '{"k"')
    await rounds.tool_call_delta(0, ":1}")
    await rounds.tool_call_start(1, ToolCallRequest("b", "g", "{}"))
    await rounds.assistant_message([ToolCallRequest("a", "f"), ToolCallRequest("b", "g")])
    # The loop announces the calls again when it runs them: nothing is sent twice.
    count = len(sink.events)
    await rounds.tool_call_start(0, ToolCallRequest("a", "f"))
    await rounds.tool_call_start(1, ToolCallRequest("b", "g"))
    assert len(sink.events) == count
    await rounds.tool_result(0, {"v": 1})
    await rounds.tool_result(1, [1, 2])
    summary = await rounds.round_end()
    await _finish(rounds)
    assert check(sink.events) == []
    assert [c.arguments for c in summary.tool_calls] == ['{"k":1}', "{}"]
    assert [c.result for c in summary.tool_calls] == ['{"v":1}', "[1,2]"]


@pytest.mark.anyio
async def test_declared_calls_never_started_go_out_before_results() -> None:
    rounds, sink = await _opened()
    await rounds.round_start()
    await rounds.assistant_message([_call(0, '{"a":1}'), _call(1)])
    await rounds.tool_result(0, "r")
    assert [k for _, _, k in _layout(sink.events)] == ["tool_use", "tool_use", "tool_result"]
    await rounds.round_end()
    await _finish(rounds)
    assert check(sink.events) == []
    assert reassemble_events(sink.events).tool_calls[0].params == {"a": 1}


@pytest.mark.anyio
async def test_missing_results_become_error_results(caplog: pytest.LogCaptureFixture) -> None:
    rounds, sink = await _opened()
    await rounds.round_start()
    await rounds.assistant_message([_call(0), _call(1), _call(2)])
    await rounds.tool_result(1, "only this one")
    with caplog.at_level(logging.WARNING, logger="essessey"):
        summary = await rounds.round_end()
    await _finish(rounds)
    assert check(sink.events) == []
    assert [(c.result, c.is_error) for c in summary.tool_calls] == [
        (NO_RESULT_TEXT, True),
        ("only this one", False),
        (NO_RESULT_TEXT, True),
    ]
    assert summary.end_index == 6
    assert sum("got no result" in r.getMessage() for r in caplog.records) == 2
    parsed = reassemble_events(sink.events)
    assert [r.is_error for r in parsed.tool_results] == [True, False, True]


@pytest.mark.anyio
async def test_failed_tool_result_is_an_error_result() -> None:
    rounds, sink = await _opened()
    await rounds.round_start()
    await rounds.assistant_message([_call(0)])
    await rounds.tool_result(0, {"error": "boom"}, is_error=True)
    await rounds.round_end()
    await _finish(rounds)
    result = reassemble_events(sink.events).tool_results[0]
    assert (result.is_error, result.text) == (True, '{"error":"boom"}')


@pytest.mark.anyio
async def test_round_without_calls_and_empty_round() -> None:
    rounds, sink = await _opened()
    await rounds.round_start()
    empty = await rounds.round_end()
    await rounds.round_start()
    await rounds.assistant_message([])
    await rounds.delta(text="")  # an empty chunk opens nothing
    plain = await rounds.round_end()
    await _finish(rounds)
    assert (empty.start_index, empty.end_index, plain.end_index) == (0, 0, 0)
    assert _layout(sink.events) == []
    assert check(sink.events) == []
    assert rounds.rounds == 2


@pytest.mark.anyio
async def test_pass_through_blocks_take_an_index() -> None:
    rounds, sink = await _opened("anthropic")
    await rounds.round_start()
    await rounds.delta(reasoning="r")
    await rounds.block_start({"type": "redacted_thinking", "data": "opaque"})
    await rounds.block_stop()
    await rounds.delta(text="t")
    await rounds.round_end()
    await _finish(rounds)
    assert [(i, k) for _, i, k in _layout(sink.events)] == [
        (0, "thinking"),
        (1, "redacted_thinking"),
        (2, "text"),
    ]
    assert check(sink.events) == []
    start = orjson.loads(sink.events[5].data)
    assert list(start) == ["type", "index", "content_block"]


@pytest.mark.anyio
async def test_signature_goes_to_the_thinking_block() -> None:
    rounds, sink = await _opened("anthropic")
    await rounds.round_start()
    await rounds.delta(reasoning="r", signature="sig")
    await rounds.delta(text="t")
    summary = await rounds.round_end()
    await _finish(rounds)
    assert summary.signature == "sig"
    assert reassemble_events(sink.events).signature == "sig"
    assert check(sink.events) == []


# -- out of order: a typed error, nothing emitted, the round unchanged ----------------------


async def _refused(rounds: RoundStream, sink: InMemorySink, call: Any) -> None:
    before = list(sink.events)
    index = rounds.next_index
    with pytest.raises(RoundOrderError):
        await call
    assert sink.events == before
    assert rounds.next_index == index


@pytest.mark.anyio
async def test_out_of_order_calls_raise_and_emit_nothing() -> None:
    rounds, sink = await _opened()
    await _refused(rounds, sink, rounds.delta(text="no round"))
    await _refused(rounds, sink, rounds.round_end())
    await rounds.round_start()
    await _refused(rounds, sink, rounds.round_start())
    await _refused(rounds, sink, rounds.delta(signature="no thinking block"))
    await rounds.delta(text="hello")
    await _refused(rounds, sink, rounds.tool_call_start(1, _call(1)))
    await _refused(rounds, sink, rounds.tool_call_start(0, ToolCallRequest("", "f")))
    await _refused(rounds, sink, rounds.tool_call_start(0, ToolCallRequest("x", "")))
    await _refused(rounds, sink, rounds.tool_call_delta(0, "{}"))
    await _refused(rounds, sink, rounds.tool_result(0, "no calls declared"))
    await _refused(rounds, sink, rounds.block_delta({"type": "x"}))
    await _refused(rounds, sink, rounds.block_stop())
    await rounds.tool_call_start(0, _call(0))
    await _refused(rounds, sink, rounds.tool_call_start(1, _call(0)))  # id reused
    await _refused(rounds, sink, rounds.tool_call_delta(1, "{}"))
    await _refused(rounds, sink, rounds.assistant_message([_call(5)]))  # not what streamed
    await _refused(rounds, sink, rounds.assistant_message([]))  # fewer than streamed
    await _refused(rounds, sink, rounds.assistant_message([_call(0), _call(1), _call(1)]))
    await rounds.assistant_message([_call(0), _call(1)])
    await _refused(rounds, sink, rounds.assistant_message([_call(0), _call(1)]))
    await _refused(rounds, sink, rounds.delta(text="text after the model's output"))
    await _refused(rounds, sink, rounds.delta(reasoning="reasoning after the model's output"))
    await _refused(rounds, sink, rounds.block_start({"type": "server_tool_use"}))
    await _refused(rounds, sink, rounds.tool_call_start(1, _call(7)))  # not the declared one
    await _refused(rounds, sink, rounds.tool_result(2, "out of range"))
    await _refused(rounds, sink, rounds.tool_result(-1, "out of range"))
    await rounds.tool_result(1, "b")
    await _refused(rounds, sink, rounds.tool_result(1, "again"))
    await rounds.tool_result(0, "a")
    await _refused(rounds, sink, rounds.tool_result(0, "again"))
    await _refused(rounds, sink, rounds.tool_call_start(2, _call(2)))  # results began
    await rounds.round_end()
    await _finish(rounds)
    assert check(sink.events) == []


@pytest.mark.anyio
async def test_unserialisable_result_raises_and_emits_nothing() -> None:
    rounds, sink = await _opened()
    await rounds.round_start()
    await rounds.assistant_message([_call(0)])
    before = list(sink.events)
    with pytest.raises(TypeError):
        await rounds.tool_result(0, object())
    assert sink.events == before
    await rounds.tool_result(0, "ok")
    await rounds.round_end()


def test_result_text() -> None:
    assert result_text("as is") == "as is"
    assert result_text({"a": [1, None]}) == '{"a":[1,null]}'


# -- concurrency ---------------------------------------------------------------------------


@pytest.mark.anyio
async def test_tools_finishing_in_any_order_from_concurrent_tasks() -> None:
    rounds, sink = await _opened()
    rng = random.Random(7)
    await rounds.round_start()
    calls = [_call(i, orjson.dumps({"n": i}).decode()) for i in range(8)]
    await rounds.assistant_message(calls)
    delays = [rng.random() / 50 for _ in calls]

    async def run(i: int) -> None:
        await rounds.tool_call_start(i, calls[i])
        await anyio.sleep(delays[i])
        await rounds.tool_result(i, {"n": i * i})

    # Starts must come in order; results are left to finish in any order.
    async with anyio.create_task_group() as tg:
        for i in range(len(calls)):
            await rounds.tool_call_start(i, calls[i])
            tg.start_soon(run, i)
    summary = await rounds.round_end()
    await _finish(rounds)
    assert check(sink.events) == []
    assert [c.result for c in summary.tool_calls] == [f'{{"n":{i * i}}}' for i in range(8)]
    indexes = [i for _, i, k in _layout(sink.events) if k == "tool_result"]
    assert indexes == list(range(8, 16))


class _PausingSink:
    """Records events; every emit gives the loop a turn first, as a store across a network
    does, so concurrent callers of one RoundStream really meet inside it."""

    def __init__(self, gate: anyio.Event | None = None) -> None:
        self.events: list[Event] = []
        self.gate = gate

    async def emit(self, event: Event) -> None:
        await anyio.lowlevel.checkpoint()
        if self.gate is not None:
            await self.gate.wait()
        self.events.append(event)


@pytest.mark.anyio
async def test_reasoning_and_text_from_concurrent_tasks_keep_every_block_whole() -> None:
    sink = _PausingSink()
    rounds = await _opened_on(sink)
    await rounds.round_start()

    async def write(kind: str, n: int) -> None:
        for k in range(12):
            chunk = f"<{kind}{n}.{k}>"
            if kind == "text":
                await rounds.delta(text=chunk)
            else:
                await rounds.delta(reasoning=chunk)

    # Text and reasoning alternate between tasks: each switch closes one block and opens
    # the next (several events, a pause at each), which only a held lock keeps whole.
    async with anyio.create_task_group() as tg:
        for n in range(3):
            tg.start_soon(write, "text", n)
            tg.start_soon(write, "think", n)
    summary = await rounds.round_end()
    await _finish(rounds)
    assert check(sink.events) == []
    text_chunks = sorted(summary.text.replace(">", ">\n").split())
    think_chunks = sorted(summary.thinking.replace(">", ">\n").split())
    assert text_chunks == sorted(f"<text{n}.{k}>" for n in range(3) for k in range(12))
    assert think_chunks == sorted(f"<think{n}.{k}>" for n in range(3) for k in range(12))
    # What the summary says is what the stream carries.
    parsed = reassemble_events(sink.events)
    assert (parsed.text, parsed.thinking) == (summary.text, summary.thinking)


@pytest.mark.anyio
@pytest.mark.parametrize("handed", [False, True])
async def test_a_caller_cancelled_while_it_waits_for_the_round_leaves_it_to_the_next(
    handed: bool,
) -> None:
    sink = _PausingSink()
    rounds = await _opened_on(sink)
    await rounds.round_start()
    held = anyio.Event()
    sink.gate = held  # from here on every emit waits until the test lets it go
    order: list[str] = []
    waiter: asyncio.Task[None] | None = None

    async def delta(name: str) -> None:
        await rounds.delta(text=name)
        order.append(name)
        if handed and name == "first":
            # In the step that handed the round on: the next caller is cancelled after
            # it was handed the round and before it ran, and must hand it on in turn.
            assert waiter is not None
            waiter.cancel()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(delta, "first")  # takes the round, then waits in the sink
            await anyio.sleep(0.01)
            waiter = asyncio.ensure_future(delta("cancelled"))  # waits for the round
            await anyio.sleep(0.01)
            if not handed:
                waiter.cancel()
                await anyio.sleep(0.01)
            tg.start_soon(delta, "last")
            await anyio.sleep(0.01)
            assert order == []
            held.set()
        with pytest.raises(asyncio.CancelledError):
            await waiter
    assert order == ["first", "last"]
    await rounds.round_end()
    await _finish(rounds)
    assert check(sink.events) == []
    assert reassemble_events(sink.events).text == "firstlast"


# -- stream_rounds --------------------------------------------------------------------------


@pytest.mark.anyio
async def test_stream_rounds_ends_an_open_round_and_sends_the_epilogue() -> None:
    sink = InMemorySink()
    publisher = Publisher(sink)
    async with stream_rounds(publisher, message_id="m", stream_id="s", model="x") as rounds:
        await rounds.round_start()
        await rounds.assistant_message([_call(0)])
        rounds.stop_reason = "tool_use"
        rounds.output_tokens = 9
    assert check(sink.events) == []
    parsed = reassemble_events(sink.events)
    assert parsed.complete
    assert parsed.stop_reason == "tool_use"
    assert parsed.tool_results[0].is_error


@pytest.mark.anyio
async def test_stream_rounds_sends_an_error_event_and_reraises() -> None:
    sink = InMemorySink()
    publisher = Publisher(sink)

    async def failing_turn() -> None:
        async with stream_rounds(publisher, message_id="m", stream_id="s", model="x") as rounds:
            await rounds.round_start()
            await rounds.delta(text=MARKER)
            raise KeyError(MARKER)

    with pytest.raises(KeyError):
        await failing_turn()
    assert sink.events[-1].event == "error"
    assert MARKER.encode() not in sink.events[-1].data
    assert check(sink.events) == []


# -- property: any sequence of rounds keeps the layout --------------------------------------

_chunk = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=0, max_size=6)
_round = st.fixed_dictionaries(
    {
        "deltas": st.lists(st.tuples(st.sampled_from(["text", "reasoning"]), _chunk), max_size=8),
        "calls": st.integers(min_value=0, max_value=4),
        "streamed": st.booleans(),
        "order": st.randoms(use_true_random=False),
        "missing": st.sets(st.integers(min_value=0, max_value=3), max_size=2),
    }
)


@settings(max_examples=150, deadline=None)
@given(plan=st.lists(_round, min_size=1, max_size=4), dialect=st.sampled_from(DIALECTS))
def test_any_rounds_keep_the_layout(plan: list[dict[str, Any]], dialect: Dialect) -> None:
    async def main() -> None:
        rounds, sink = await _opened(dialect)
        expected_text: list[str] = []
        expected_thinking: list[str] = []
        expected_results: list[tuple[str, str, bool]] = []
        n_calls = 0
        for number, spec in enumerate(plan):
            await rounds.round_start()
            base_before = rounds.next_index
            for kind, chunk in spec["deltas"]:
                await rounds.delta(**{kind: chunk})
                (expected_text if kind == "text" else expected_thinking).append(chunk)
            calls = [
                ToolCallRequest(f"t{number}_{i}", "f", orjson.dumps({"i": i}).decode())
                for i in range(spec["calls"])
            ]
            if spec["streamed"]:
                for i, call in enumerate(calls):
                    await rounds.tool_call_start(i, ToolCallRequest(call.id, call.name))
                    await rounds.tool_call_delta(i, call.arguments)
            await rounds.assistant_message(calls)
            order = list(range(len(calls)))
            spec["order"].shuffle(order)
            for i in order:
                if i not in spec["missing"]:
                    await rounds.tool_result(i, f"r{number}_{i}")
            summary = await rounds.round_end()
            assert summary.start_index == base_before
            content_blocks = summary.end_index - summary.start_index - 2 * len(calls)
            assert content_blocks >= 0
            for i, call in enumerate(calls):
                missing = i in spec["missing"]
                result = NO_RESULT_TEXT if missing else f"r{number}_{i}"
                expected_results.append((call.id, result, missing))
            n_calls += len(calls)
        await _finish(rounds)
        assert check(sink.events) == []
        parsed = reassemble_events(sink.events)
        assert parsed.text == "".join(expected_text)
        assert parsed.thinking == "".join(expected_thinking)
        assert [(e.call.tool_use_id, e.result, e.is_error) for e in parsed.executions] == (
            expected_results
        )
        assert len(parsed.tool_calls) == n_calls

    anyio.run(main)
