"""Views of a published stream that the adapter tests read their asserts from, the
interleaved tool calls the adapters' tests feed them, and a turn's approvals answered."""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import orjson
import pytest
from hypothesis import strategies as st

from essessey import Event, StreamHub, ToolApproval, TurnProducer, check, reassemble_events
from essessey.hub import Continuation
from tests.captured_logs import captured_logs


def mangled(data: st.DataObject, items: list[Any], stray: st.SearchStrategy[Any]) -> list[Any]:
    """``items`` with some lost, some repeated and strays (``stray`` draws each) put
    before some: a stream a faulty server or proxy could send."""
    out: list[Any] = []
    for item in items:
        action = data.draw(st.sampled_from(["keep", "keep", "keep", "drop", "twice", "stray"]))
        if action == "stray":
            out.append(data.draw(stray))
        if action != "drop":
            out.append(item)
        if action == "twice":
            out.append(item)
    return out


def assert_published_quietly(publish: Callable[[], Awaitable[list[Event]]], marker: str) -> None:
    """Run ``publish`` (it returns the events an adapter published): they pass ``check``,
    the reassembler reads them, and no log line on the way carries ``marker`` (payload)."""
    with captured_logs() as records:
        events = anyio.run(publish)
    assert check(events) == []
    reassemble_events(events)
    assert not [r for r in records if marker in r.getMessage()]


def payloads(events: list[Event]) -> list[dict[str, Any]]:
    """Each event's payload, parsed."""
    return [orjson.loads(event.data) for event in events]


def block_starts(events: list[Event]) -> list[dict[str, Any]]:
    """Each block's start object (its ``content_block``), in order."""
    return [
        orjson.loads(e.data)["content_block"] for e in events if e.event == "content_block_start"
    ]


def blocks(events: list[Event]) -> list[tuple[str, int, str]]:
    """(event, index, block type) of every content block event, to read the layout."""
    types: dict[int, str] = {}
    found = []
    for event in events:
        if event.event.startswith("content_block_"):
            payload = orjson.loads(event.data)
            if event.event == "content_block_start":
                types[payload["index"]] = payload["content_block"]["type"]
            found.append((event.event, payload["index"], types[payload["index"]]))
    return found


def starts(events: list[Event]) -> list[tuple[int, str]]:
    """(index, block type) of each block start, in order."""
    return [(index, kind) for name, index, kind in blocks(events) if name.endswith("start")]


def log_text(caplog: pytest.LogCaptureFixture) -> str:
    """Every captured log message, one per line (to look for content that leaked)."""
    return "\n".join(record.getMessage() for record in caplog.records)


def tool_use_blocks(events: list[Event]) -> list[tuple[int, str, str, list[str]]]:
    """(index, id, name, its input_json_delta fragments in order) of every tool_use block."""
    found: dict[int, tuple[int, str, str, list[str]]] = {}
    for event in events:
        payload = orjson.loads(event.data)
        if event.event == "content_block_start" and payload["content_block"]["type"] == "tool_use":
            block = payload["content_block"]
            found[payload["index"]] = (payload["index"], block["id"], block["name"], [])
        elif event.event == "content_block_delta" and payload["index"] in found:
            found[payload["index"]][3].append(payload["delta"]["partial_json"])
    return list(found.values())


# -- interleaved parallel tool calls ------------------------------------------------------

# Whole JSON objects with nothing after their last brace, so no proper prefix of one is
# whole JSON: a call's block may only close at its last fragment. Braces inside strings
# and escapes test that nothing counts them naively.
CALL_ARGUMENTS = (
    "{}",
    '{"city": "São Paulo", "unit": "celsius"}',
    '{"q": "naïve \\"quote\\"", "n": [1, 2.5, null]}',
    '{"deep": {"a": {"b": []}}, "s": "}{]["}',
)


ANY_ARGUMENTS: st.SearchStrategy[str] = st.sampled_from(CALL_ARGUMENTS)


@dataclass(frozen=True)
class Interleaving:
    """Parallel tool calls whose fragments arrive in turns.

    Call ``k`` (numbered by first appearance) has the arguments ``arguments[k]``, sent
    as the fragments ``pieces[k]``; ``sequence`` is the order they arrive in, each
    ``(k, fragment, first)`` with ``first`` true for the call's first fragment.
    """

    arguments: list[str]
    pieces: list[list[str]]
    sequence: list[tuple[int, str, bool]]


def split_text(text: str, cuts: list[int]) -> list[str]:
    """``text`` cut at the positions ``cuts`` names (those inside it), in order."""
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(text)}), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


@st.composite
def interleavings(
    draw: st.DrawFn,
    max_calls: int = 4,
    arguments: st.SearchStrategy[str] = ANY_ARGUMENTS,
) -> Interleaving:
    """N calls' arguments (``arguments`` draws each), each cut into non-empty fragments,
    arriving in any order (each call's own fragments in their order)."""
    texts = draw(st.lists(arguments, min_size=1, max_size=max_calls))
    pieces = [split_text(t, draw(st.lists(st.integers(1, 60), max_size=8))) for t in texts]
    labels = draw(st.permutations([k for k, parts in enumerate(pieces) for _ in parts]))
    # Renumber by first appearance: the order the calls' blocks open in.
    order = list(dict.fromkeys(labels))
    number = {old: new for new, old in enumerate(order)}
    pieces = [pieces[old] for old in order]
    sent = [0] * len(pieces)
    sequence = []
    for old in labels:
        k = number[old]
        sequence.append((k, pieces[k][sent[k]], sent[k] == 0))
        sent[k] += 1
    return Interleaving([texts[old] for old in order], pieces, sequence)


Step = str | tuple[int, str, bool]
"""A piece of text, or a call's fragment as :class:`Interleaving` sends it."""


@st.composite
def text_among(draw: st.DrawFn, pieces: list[str], calls: Interleaving) -> list[Step]:
    """The text's ``pieces`` placed anywhere among ``calls``' fragments, both kept in
    their order."""
    n = len(pieces)
    places = sorted(draw(st.lists(st.integers(0, len(calls.sequence)), min_size=n, max_size=n)))
    steps: list[Step] = []
    waiting = list(zip(places, pieces, strict=True))
    for at, fragment in enumerate([*calls.sequence, None]):
        while waiting and waiting[0][0] == at:
            steps.append(waiting.pop(0)[1])
        if fragment is not None:
            steps.append(fragment)
    return steps


def assert_each_call_whole(calls: Interleaving, message: Any, events: list[Event]) -> None:
    """Assert that ``calls``, published as one message (ids ``call_k``, names ``fk``),
    came out right: a valid stream in which every call's block carries its own fragments,
    each as its own delta in the order sent, however they were interleaved, and each
    call's arguments whole. ``message`` is what the adapter's ``publish`` returned."""
    # Not a test module, so pytest does not rewrite these asserts: each says what it saw.
    violations = check(events)
    assert violations == [], violations
    blocks = tool_use_blocks(events)
    assert blocks == [(k, f"call_{k}", f"f{k}", p) for k, p in enumerate(calls.pieces)], blocks
    parsed = reassemble_events(events)
    arguments = [c.arguments for c in parsed.tool_calls]
    assert arguments == calls.arguments, arguments
    returned = [(c.id, c.input) for c in message.tool_calls]
    assert returned == [(f"call_{k}", orjson.loads(a)) for k, a in enumerate(calls.arguments)]
    assert parsed.stop_reason == "tool_use", parsed.stop_reason
    assert parsed.complete


def chat_chunks(calls: Interleaving) -> list[dict[str, Any]]:
    """``calls`` as chat-completions chunks: one fragment a chunk, keyed by ``index``; a
    call's first fragment names it (id ``call_k``, name ``fk``)."""
    chunks: list[dict[str, Any]] = []
    for k, piece, first in calls.sequence:
        call: dict[str, Any] = {"index": k, "function": {"arguments": piece}}
        if first:
            call.update(id=f"call_{k}", type="function")
            call["function"]["name"] = f"f{k}"
        chunks.append({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    return [{"model": "test-model", **chunk} for chunk in chunks]


def responses_events(calls: Interleaving) -> list[dict[str, Any]]:
    """``calls`` as Responses API events, valid for the SDK: a call's item is added at its
    first fragment (``output_index`` ``k``, call id ``call_k``, name ``fk``), its done
    events come after every fragment, then ``response.completed``."""
    response = {
        "id": "resp_t",
        "object": "response",
        "created_at": 1,
        "model": "test-model",
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {**response, "status": "in_progress"}}
    ]

    def item(k: int, arguments: str, status: str) -> dict[str, Any]:
        return {
            "id": f"fc_{k}",
            "type": "function_call",
            "call_id": f"call_{k}",
            "name": f"f{k}",
            "arguments": arguments,
            "status": status,
        }

    for k, piece, first in calls.sequence:
        if first:
            added = {"output_index": k, "item": item(k, "", "in_progress")}
            events.append({"type": "response.output_item.added", **added})
        delta = {"item_id": f"fc_{k}", "output_index": k, "delta": piece}
        events.append({"type": "response.function_call_arguments.delta", **delta})
    for k, arguments in enumerate(calls.arguments):
        done = {"item_id": f"fc_{k}", "output_index": k, "arguments": arguments}
        events.append({"type": "response.function_call_arguments.done", **done})
        finished = {"output_index": k, "item": item(k, arguments, "completed")}
        events.append({"type": "response.output_item.done", **finished})
    events.append({"type": "response.completed", "response": {**response, "status": "completed"}})
    return [{**event, "sequence_number": n} for n, event in enumerate(events)]


# -- approvals ----------------------------------------------------------------------------


@st.composite
def gated_interleavings(
    draw: st.DrawFn, arguments: st.SearchStrategy[str] = ANY_ARGUMENTS
) -> tuple[Interleaving, list[bool], list[bool]]:
    """Interleaved parallel calls (up to three), which of them need approval, and the
    answer each would get."""
    calls = draw(interleavings(max_calls=3, arguments=arguments))
    count = len(calls.arguments)
    gated = draw(st.lists(st.booleans(), min_size=count, max_size=count), label="gated")
    approve = draw(st.lists(st.booleans(), min_size=count, max_size=count), label="yes")
    return calls, gated, approve


def answer_approvals(
    producer: TurnProducer,
    on_answer: Continuation,
    gated: list[bool],
    approve: list[bool],
    *,
    answer: str,
) -> tuple[Any, dict[str, list[tuple[str, bool]]]]:
    """Run ``producer``'s turn on a hub; when ``gated`` has any, the turn must ask to
    approve exactly the calls ``call_k`` gated, each answered ``approve[k]``, and the
    continuation is waited for. The stream must then be valid and complete, ending with
    the model's ``answer`` (stop reason ``end_turn``). The stream read, and each call's
    results (text, is_error) in order."""

    async def run() -> list[Event]:
        async with StreamHub(on_answer=on_answer) as hub:
            await hub.start("s", producer)
            await hub.wait("s")
            waiting = await hub.waiting("s")
            if not any(gated):
                assert waiting is None, waiting
            else:
                assert waiting is not None
                asked = {r.tool_use_id: r.id for r in waiting.requests}  # type: ignore[union-attr]
                gates = [f"call_{k}" for k, gate in enumerate(gated) if gate]
                assert sorted(asked) == gates, asked
                answers = [
                    ToolApproval(asked[f"call_{k}"], approve[k])
                    for k, gate in enumerate(gated)
                    if gate
                ]
                await hub.answer("s", answers)
                await hub.wait("s")
            events, _ = await hub.store.since("s", None)
            return events

    events = anyio.run(run)
    violations = check(events)
    assert violations == [], violations
    parsed = reassemble_events(events)
    assert parsed.complete
    assert parsed.messages[-1].stop_reason == "end_turn", parsed.messages[-1].stop_reason
    assert parsed.text.endswith(answer), parsed.text
    results: dict[str, list[tuple[str, bool]]] = {}
    for result in parsed.tool_results:
        results.setdefault(result.tool_use_id, []).append((result.text, result.is_error))
    return parsed, results
