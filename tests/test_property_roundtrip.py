"""Property: any turn published through the streamers, in either dialect, keeps every
protocol rule and reassembles to exactly what was written."""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from essessey import InMemorySink, Publisher, check, reassemble_events
from essessey.reassemble import TextItem, ThinkingItem
from essessey.streamers import NO_RESULT_TEXT, stream_turn

# Any character but a lone surrogate (which is not valid UTF-8 and cannot be sent).
CHARACTERS = st.characters(exclude_categories=["Cs"])
TRICKY = st.sampled_from(["", "\n", "\r\n", "\r", "\x00", '"', "\\", "\u2028", "😀"])
CHUNK = st.one_of(st.text(CHARACTERS, max_size=12), TRICKY)
CHUNKS = st.lists(CHUNK, max_size=5)

JSON_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(CHARACTERS, max_size=10),
)
JSON_VALUE = st.recursive(
    JSON_LEAF,
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.text(CHARACTERS, max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)


@dataclass(frozen=True)
class Call:
    """One generated tool call: the arguments as written (in fragments) and its result."""

    tool_use_id: str
    name: str
    params: dict[str, Any]
    fragments: tuple[str, ...]
    result: str | None  # None: the round closes without one
    is_error: bool

    @property
    def arguments(self) -> str:
        return "".join(self.fragments)


@dataclass(frozen=True)
class Segment:
    """One streamer of the turn: thinking, text, or a round of tool calls."""

    kind: str
    chunks: tuple[str, ...] = ()
    signature: str = ""
    calls: tuple[Call, ...] = ()
    result_order: tuple[int, ...] = ()


@st.composite
def calls(draw: st.DrawFn, first_id: int) -> tuple[Call, ...]:
    made: list[Call] = []
    for number in range(draw(st.integers(min_value=0, max_value=3))):
        params = draw(st.dictionaries(st.text(CHARACTERS, max_size=6), JSON_VALUE, max_size=4))
        text = json.dumps(params, ensure_ascii=draw(st.booleans()))
        cuts = sorted(draw(st.lists(st.integers(min_value=0, max_value=len(text)), max_size=6)))
        bounds = [0, *cuts, len(text)]
        fragments = tuple(text[a:b] for a, b in pairwise(bounds))
        made.append(
            Call(
                tool_use_id=f"call_{first_id + number}",
                name=draw(st.text(CHARACTERS, min_size=1, max_size=10)),  # a call needs a name
                params=params,
                fragments=fragments,
                result=draw(st.none() | st.text(CHARACTERS, max_size=20)),
                is_error=draw(st.booleans()),
            )
        )
    return tuple(made)


@st.composite
def turns(draw: st.DrawFn) -> tuple[Segment, ...]:
    segments: list[Segment] = []
    next_id = 0
    for _ in range(draw(st.integers(min_value=0, max_value=6))):
        kind = draw(st.sampled_from(["thinking", "text", "tools"]))
        if kind == "tools":
            round_calls = draw(calls(next_id))
            next_id += len(round_calls)
            order = tuple(draw(st.permutations(range(len(round_calls)))))
            segments.append(Segment("tools", calls=round_calls, result_order=order))
        elif kind == "thinking":
            signature = draw(st.one_of(st.just(""), st.text(CHARACTERS, max_size=8)))
            segments.append(Segment("thinking", tuple(draw(CHUNKS)), signature))
        else:
            segments.append(Segment("text", tuple(draw(CHUNKS))))
    return tuple(segments)


async def publish(segments: tuple[Segment, ...], dialect: Any) -> InMemorySink:
    sink = InMemorySink()
    publisher = Publisher(sink, dialect=dialect)
    async with stream_turn(publisher, message_id="msg", stream_id="conv", model="m") as turn:
        for segment in segments:
            if segment.kind == "thinking":
                thinking = await turn.thinking()
                for chunk in segment.chunks:
                    await thinking.write(chunk)
                await thinking.write_signature(segment.signature)
            elif segment.kind == "text":
                text = await turn.text()
                for chunk in segment.chunks:
                    await text.write(chunk)
            else:
                tools = await turn.tools()
                for call in segment.calls:
                    await tools.start_call(call.tool_use_id, call.name)
                    for fragment in call.fragments:
                        await tools.write_arguments(call.tool_use_id, fragment)
                for position in segment.result_order:
                    call = segment.calls[position]
                    if call.result is not None:
                        await tools.write_result(
                            call.tool_use_id, call.result, is_error=call.is_error
                        )
        turn.stop_reason = "tool_use" if any(s.calls for s in segments) else "end_turn"
    return sink


def _expected_result(call: Call) -> tuple[str, bool]:
    if call.result is None:
        return NO_RESULT_TEXT, True  # what closing the round sends in its place
    return call.result, call.is_error


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", ["essessey", "anthropic"])
@settings(
    max_examples=200,
    deadline=None,
    # anyio_backend is a constant; sharing it between examples is harmless.
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(segments=turns())
async def test_published_turns_reassemble_to_what_was_written(
    dialect: str, segments: tuple[Segment, ...]
) -> None:
    events = (await publish(segments, dialect)).events
    assert check(events) == []

    parsed = reassemble_events(events)
    text_segments = [s for s in segments if s.kind == "text"]
    thinking_segments = [s for s in segments if s.kind == "thinking"]
    all_calls = [call for s in segments for call in s.calls]

    assert parsed.text == "".join(chunk for s in text_segments for chunk in s.chunks)
    assert parsed.thinking == "".join(chunk for s in thinking_segments for chunk in s.chunks)
    signatures = [s.signature for s in thinking_segments if s.signature]
    assert parsed.signature == (signatures[-1] if signatures else None)

    assert [(c.tool_use_id, c.name, c.arguments, c.params) for c in parsed.tool_calls] == [
        (call.tool_use_id, call.name, call.arguments, call.params) for call in all_calls
    ]
    assert all(c.parse_error is None and c.closed for c in parsed.tool_calls)
    assert [(x.call.tool_use_id, x.result, x.is_error) for x in parsed.executions] == [
        (call.tool_use_id, *_expected_result(call)) for call in all_calls
    ]

    # Each streamer that wrote something is one block, hence one timeline item.
    texts = [item.text for item in parsed.timeline if isinstance(item, TextItem)]
    assert texts == ["".join(s.chunks) for s in text_segments if "".join(s.chunks)]
    thoughts = [item.text for item in parsed.timeline if isinstance(item, ThinkingItem)]
    assert thoughts == [
        "".join(s.chunks) for s in thinking_segments if "".join(s.chunks) or s.signature
    ]

    assert parsed.complete is True
    assert parsed.error is None
    assert parsed.message_id == "msg"
    assert parsed.stream_id == "conv"
    assert parsed.stop_reason == ("tool_use" if all_calls else "end_turn")
    assert len(parsed.messages) == 1
