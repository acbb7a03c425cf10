"""Fuzzing the readers: whatever a peer or a provider sends, nothing crashes.

The contract, target by target:

- The SSE decoder (and :class:`SSESource` over it): random bytes and valid streams cut
  anywhere, in chunks of any size and type. Only :class:`SSEDecodeError` (a limit) may be
  raised; the chunking never changes what comes out; a valid stream round-trips exactly;
  a stream cut inside an event never yields part of it.
- WebSocket frames: :func:`decode_frame` on random and mutated frames returns an event or
  raises ``ValueError``, nothing else; a real server sending random frames to
  :class:`WebSocketSource` gets exactly the valid ones, the others skipped with a warning
  that holds none of their content.
- :class:`Reassembler` and :func:`check` on random event sequences: never an exception;
  one warning per event that cannot be read, without its content.
- The provider adapters on random and mutated chunks: nothing raised but what their
  docstrings name, and what they publish keeps every protocol rule.

The budget comes from the environment (see tests/fuzz_settings.py): a few dozen examples
per target in CI, ``ESSESSEY_FUZZ_EXAMPLES=20000 pytest tests/test_fuzz.py -q`` for a
long run. Every failure names the seed that replays it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import accumulate, pairwise
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket
from websockets.asyncio.client import connect

from essessey import Event, InMemorySink, Publisher, check, reassemble_events
from essessey.adapters import anthropic as anthropic_adapter
from essessey.adapters import openai as openai_adapter
from essessey.adapters import openai_responses as responses_adapter
from essessey.bindings.sse import SSEDecoder, SSEMessage, SSESource, encode
from essessey.bindings.ws import WebSocketSource, decode_frame, encode_frame
from essessey.check import ProtocolChecker, Violation
from essessey.dialects import conversation
from essessey.dialects.agui import (
    AGUIEncoder,
    answering_tool_messages,
    parse_resume,
    parse_run_agent_input,
    resume_answers,
)
from essessey.dialects.chat_completions import (
    ChatCompletionsEncoder,
    answering_messages,
    parse_chat_completion_request,
    tool_message_answers,
)
from essessey.dialects.responses import ResponsesEncoder, answers_of, parse_responses_request
from essessey.dialects.ui import UIMessageEncoder, parse_chat_request, ui_answers
from essessey.errors import AnswerRefused, SSEDecodeError
from essessey.protocol import DIALECTS, BlockType, DeltaType, EventType
from essessey.protocol.asking import (
    ApprovalRequest,
    ClientToolCall,
    Question,
    Waiting,
    match_answers,
    parse_answers,
    waiting,
)
from essessey.reassemble import ParsedStream, Reassembler
from essessey.snapshot import compact
from tests.adapter_views import block_starts
from tests.captured_logs import captured_logs
from tests.fuzz_settings import fuzz
from tests.servers import serve
from tests.test_sse_decoder import BOM, SOUP, limit_hit, reference_decode

# Put into content (text, reasoning, arguments, data): it must never reach a log line.
# Upper case and a dash: no reader mistakes it for an identifier it may log as a name.
MARKER = "ZQX-SECRET-QXZ"

LINE_BREAKS = re.compile(rb"\r\n|\r|\n")
CHARACTERS = st.characters(exclude_categories=["Cs"])
SECRET = st.one_of(
    st.text(CHARACTERS, max_size=10),
    st.just(MARKER),
    st.tuples(st.text(CHARACTERS, max_size=4), st.text(CHARACTERS, max_size=4)).map(
        lambda pair: pair[0] + MARKER + pair[1]
    ),
)
# A token the SSE writer accepts as an event name or id: no CR, LF or NUL.
TOKEN = st.text(
    st.characters(exclude_categories=["Cs"], exclude_characters="\r\n\x00"), max_size=10
)
BIG_INTS = st.sampled_from([2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30])
JSON_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    BIG_INTS,
    st.floats(allow_nan=False, allow_infinity=False),
    SECRET,
)
JSON_VALUE = st.recursive(
    JSON_LEAF,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(CHARACTERS, max_size=6), children)
    ),
    max_leaves=10,
)


def nested(depth: int, kind: str = "list") -> Any:
    """A value nested ``depth`` levels deep, built without recursion."""
    value: Any = MARKER
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value}
    return value


# A value a JSON parser can hand over that orjson cannot write back: nested deeper than
# the 255 levels it writes (BIG_INTS and SURROGATE_TEXT are the other kinds).
DEEP = st.builds(nested, st.integers(200, 1100), st.sampled_from(["list", "dict"]))
# Text with a lone surrogate: what Python's json module makes of a "\\ud800" escape.
SURROGATE_TEXT = st.tuples(SECRET, st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)).map(
    lambda pair: pair[0] + pair[1]
)
ANY_VALUE = st.one_of(JSON_VALUE, JSON_VALUE, JSON_VALUE, DEEP, SURROGATE_TEXT)


@dataclass(frozen=True)
class Raw:
    """JSON text spliced into a payload as it is: what no Python value serialises to."""

    text: str


RAW_JSON = st.one_of(
    st.integers(200, 1100).map(lambda d: Raw("[" * d + "]" * d)),
    st.integers(200, 1100).map(lambda d: Raw('{"k":' * d + "1" + "}" * d)),
    st.sampled_from(
        [Raw("1" + "0" * 400), Raw("1e400"), Raw("-0"), Raw("NaN"), Raw('"\\ud800"'), Raw("")]
    ),
)


def to_json(value: Any) -> str:
    """``value`` as JSON text, :class:`Raw` parts spliced in, big integers exact."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        parts = (json.dumps(str(k)) + ":" + to_json(v) for k, v in value.items())
        return "{" + ",".join(parts) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(map(to_json, value)) + "]"
    return json.dumps(value, ensure_ascii=False)


def assert_no_content(records: Sequence[logging.LogRecord]) -> None:
    for record in records:
        line = record.getMessage()
        assert MARKER not in line, f"{record.name} {record.levelname} logged content: {line!r}"


def warnings_of(records: Sequence[logging.LogRecord]) -> list[logging.LogRecord]:
    return [record for record in records if record.levelno >= logging.WARNING]


# == 1. The SSE decoder =====================================================================

Chunk = bytes | bytearray | memoryview


@st.composite
def rechunked(draw: st.DrawFn, raw: bytes, *, types: bool = True) -> list[Chunk]:
    """``raw`` cut at random points (empty chunks included), each chunk a random type."""
    points = sorted(draw(st.lists(st.integers(0, len(raw)), max_size=24)))
    pieces = [raw[a:b] for a, b in pairwise([0, *points, len(raw)])]
    if not types:
        return list(pieces)
    kinds = draw(
        st.lists(
            st.sampled_from([bytes, bytearray, memoryview]),
            min_size=len(pieces),
            max_size=len(pieces),
        )
    )
    return [kind(piece) for kind, piece in zip(kinds, pieces, strict=True)]


def chunkings(raw: bytes, data: st.DataObject, *, types: bool = True) -> list[list[Chunk]]:
    """Whole, a byte at a time, and two random cuts."""
    return [
        [raw],
        [raw[i : i + 1] for i in range(len(raw))],
        data.draw(rechunked(raw, types=types)),
        data.draw(rechunked(raw, types=types)),
    ]


@dataclass
class Decoded:
    """What a decoder produced: its messages, its state at the end, and whether a limit
    stopped it (the messages are then those completed before)."""

    messages: list[SSEMessage]
    last_event_id: str
    retry: int | None
    failed: bool


def run_decoder(chunks: Sequence[Chunk], start_id: str, limits: dict[str, int]) -> Decoded:
    decoder = SSEDecoder(start_id, **limits)
    messages: list[SSEMessage] = []
    try:
        for chunk in chunks:
            messages.extend(decoder.feed(chunk))
    except SSEDecodeError:
        # A decoder that hit a limit stays stopped.
        with pytest.raises(SSEDecodeError):
            decoder.feed(b"data: x\n\n")
        decoder.close()
        return Decoded(messages, decoder.last_event_id, decoder.retry, True)
    messages.extend(decoder.close())
    with pytest.raises(ValueError, match="after close"):
        decoder.feed(b"\n")
    return Decoded(messages, decoder.last_event_id, decoder.retry, False)


LIMITS = st.one_of(
    st.just({}),
    st.fixed_dictionaries(
        {"max_line_length": st.integers(1, 80), "max_event_size": st.integers(1, 80)}
    ),
)


def hits_a_limit(raw: bytes, limits: dict[str, int]) -> bool:
    return bool(limits) and limit_hit(raw, limits["max_line_length"], limits["max_event_size"])


SSE_PIECES = st.sampled_from(
    [
        b"data:", b"data: ", b"event:", b"event: ", b"id:", b"id: ", b"retry:", b"retry: ",
        b":", b": keep-alive", b"\r", b"\n", b"\r\n", b"\n\r", b"\r\r", b"\n\n", b"\x00",
        BOM, b"\xef\xbb", b"\xff\xfe", b"\xc3", b"\xe2\x82\xac", b"\xf0\x9f\x98",
        b"\xed\xa0\x80", b"42", b"9" * 30, b" ", MARKER.encode(),
    ]
)  # fmt: skip
ANY_BYTES = st.one_of(
    st.binary(max_size=1024),
    SOUP,
    st.lists(
        st.one_of(SSE_PIECES, st.binary(max_size=8), st.text(max_size=8).map(str.encode)),
        max_size=150,
    ).map(b"".join),
)


@fuzz()
@given(raw=ANY_BYTES, limits=LIMITS, data=st.data())
def test_sse_any_bytes_in_any_chunks_decode_the_same_or_hit_a_limit(
    raw: bytes, limits: dict[str, int], data: st.DataObject
) -> None:
    whole = reference_decode(raw)
    failed = hits_a_limit(raw, limits)
    for chunks in chunkings(raw, data):
        decoded = run_decoder(chunks, "", limits)
        assert decoded.failed == failed, chunks
        if failed:
            # What came out before the limit stopped it is what a decoder without
            # limits gives first: nothing invented, nothing out of order.
            assert decoded.messages == whole[0][: len(decoded.messages)]
        else:
            assert (decoded.messages, decoded.last_event_id, decoded.retry) == whole


@dataclass(frozen=True)
class SSEStream:
    """A stream as the writer frames it, and what a reader must see of any prefix."""

    raw: bytes
    start_id: str
    # Per event: where its bytes end, and the message it must decode to.
    ends: tuple[int, ...]
    messages: tuple[SSEMessage, ...]

    def expected(self, cut: int) -> tuple[list[SSEMessage], str]:
        """The messages of the events wholly inside ``raw[:cut]``, and the last id."""
        done = [m for end, m in zip(self.ends, self.messages, strict=True) if end <= cut]
        return done, done[-1].id if done else self.start_id


EVENT_DATA = st.one_of(
    JSON_VALUE.map(lambda value: to_json(value).encode()),
    st.binary(max_size=48),
    st.lists(st.one_of(SECRET, st.sampled_from(["\r", "\n", "\r\n", "\x00", "\ufeff"]))).map(
        lambda parts: "".join(parts).encode()
    ),
)
EVENT_NAMES = st.one_of(st.sampled_from(sorted(EventType.ALL)), TOKEN)


@st.composite
def sse_streams(draw: st.DrawFn) -> SSEStream:
    start_id = draw(TOKEN)
    pieces: list[bytes] = [BOM] if draw(st.booleans()) else []
    kinds: list[SSEMessage | None] = [None] * len(pieces)
    last_id = start_id
    for _ in range(draw(st.integers(0, 8))):
        if draw(st.integers(0, 4)) == 0:
            # What a server sends between events: a comment, a retry, a bare blank line.
            pieces.append(draw(st.sampled_from([b": ping\n\n", b"retry: 1000\n\n", b"\n"])))
            kinds.append(None)
            continue
        event = Event(draw(EVENT_NAMES), draw(EVENT_DATA), draw(st.none() | TOKEN))
        if event.id:
            last_id = event.id
        text = LINE_BREAKS.sub(b"\n", event.data).decode("utf-8", "replace")
        pieces.append(encode(event))
        kinds.append(SSEMessage(event.event or "message", text, last_id))
    ends = list(accumulate(map(len, pieces)))
    events = [(end, m) for end, m in zip(ends, kinds, strict=True) if m is not None]
    return SSEStream(
        b"".join(pieces),
        start_id,
        tuple(end for end, _ in events),
        tuple(m for _, m in events),
    )


@st.composite
def cut_points(draw: st.DrawFn, stream: SSEStream) -> int:
    """Anywhere, the end, or next to an event's end (where an off-by-one would show)."""
    near = [max(0, min(len(stream.raw), end + d)) for end in stream.ends for d in (-1, 0, 1)]
    return draw(
        st.one_of(
            st.integers(0, len(stream.raw)),
            st.just(len(stream.raw)),
            st.sampled_from(near) if near else st.just(0),
        )
    )


@fuzz()
@given(stream=sse_streams(), limits=LIMITS, data=st.data())
def test_sse_a_written_stream_cut_anywhere_yields_exactly_its_whole_events(
    stream: SSEStream, limits: dict[str, int], data: st.DataObject
) -> None:
    cut = data.draw(cut_points(stream))
    raw = stream.raw[:cut]
    messages, last_id = stream.expected(cut)
    failed = hits_a_limit(raw, limits)
    for chunks in chunkings(raw, data):
        decoded = run_decoder(chunks, stream.start_id, limits)
        assert decoded.failed == failed
        if failed:
            assert decoded.messages == messages[: len(decoded.messages)]
        else:
            # Exactly the whole events: none cut short, none lost, none changed.
            assert decoded.messages == messages
            assert decoded.last_event_id == last_id
            assert decoded.retry == (1000 if b"retry: 1000\n" in raw else None)


@fuzz()
@given(
    stream=sse_streams(),
    limits=LIMITS,
    fails_after=st.none() | st.integers(0, 6),
    data=st.data(),
)
def test_sse_source_over_random_chunks_yields_the_whole_events(
    stream: SSEStream, limits: dict[str, int], fails_after: int | None, data: st.DataObject
) -> None:
    cut = data.draw(cut_points(stream))
    chunks = [bytes(c) for c in data.draw(rechunked(stream.raw[:cut], types=False))]
    if fails_after is not None and fails_after >= len(chunks):
        fails_after = None
    sent = chunks if fails_after is None else chunks[:fails_after]
    raw = b"".join(sent)
    messages, last_id = stream.expected(len(raw))

    class TransportDropped(Exception):
        pass

    async def body() -> AsyncIterator[bytes]:
        for chunk in sent:
            await asyncio.sleep(0)
            yield chunk
        if fails_after is not None:
            raise TransportDropped(MARKER)

    source = SSESource(body(), last_event_id=stream.start_id, **limits)
    received: list[Event] = []

    async def read() -> None:
        async for event in source:
            received.append(event)

    expected = [Event(m.event, m.data.encode(), m.id or None) for m in messages]
    with captured_logs() as records:
        if hits_a_limit(raw, limits):
            with pytest.raises(SSEDecodeError):
                asyncio.run(read())
        elif fails_after is not None:
            # A transport failure is never made to look like the end of the stream.
            with pytest.raises(TransportDropped):
                asyncio.run(read())
            assert received == expected
        else:
            asyncio.run(read())
            assert received == expected
            assert source.last_event_id == last_id
    assert_no_content(records)
    assert all(record.name == "essessey.sse" for record in records)
    assert received == expected[: len(received)]


@fuzz()
@given(raw=ANY_BYTES, limits=LIMITS, data=st.data())
def test_sse_source_over_random_bytes_yields_what_the_decoder_reads(
    raw: bytes, limits: dict[str, int], data: st.DataObject
) -> None:
    chunks = [bytes(c) for c in data.draw(rechunked(raw, types=False))]

    async def body() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    source = SSESource(body(), **limits)
    received: list[Event] = []

    async def read() -> None:
        async for event in source:
            received.append(event)

    messages, last_id, retry = reference_decode(raw)
    expected = [Event(m.event, m.data.encode(), m.id or None) for m in messages]
    with captured_logs() as records:
        if hits_a_limit(raw, limits):
            with pytest.raises(SSEDecodeError):
                asyncio.run(read())
            assert received == expected[: len(received)]
        else:
            asyncio.run(read())
            assert received == expected
            assert source.last_event_id == last_id
            assert source.retry == retry
    assert_no_content(records)


# == 2. WebSocket frames ====================================================================

FRAME_TEXT = st.one_of(
    st.text(max_size=200),  # lone surrogates included: a str can hold them
    st.text(CHARACTERS, max_size=200),
    st.binary(max_size=200),
    JSON_VALUE.map(to_json),
    JSON_VALUE.map(lambda v: to_json(v).encode()),
)


def _decode_or_refuse(frame: str | bytes, **limit: int) -> Event | None:
    """The frame's event, or None when :func:`decode_frame` refused it with a reason
    that names none of its content. Any other exception fails the test."""
    refusal: ValueError | None = None
    try:
        return decode_frame(frame, **limit)
    except ValueError as exc:
        refusal = exc
    assert MARKER not in str(refusal)
    return None


@fuzz()
@given(frame=FRAME_TEXT, max_size=st.none() | st.integers(1, 300))
def test_ws_decode_frame_on_anything_returns_an_event_or_raises_value_error(
    frame: str | bytes, max_size: int | None
) -> None:
    limit = {} if max_size is None else {"max_size": max_size}
    event = _decode_or_refuse(frame, **limit)
    if event is None:
        return
    assert isinstance(event.event, str)
    assert event.event
    assert event.id is None or (isinstance(event.id, str) and event.id)
    orjson.loads(event.data)  # the payload is JSON text
    assert max_size is None or len(frame) <= max_size


# Each envelope key: absent, or a value of the right type, or of a wrong one.
_ABSENT = object()
ENVELOPE_EVENT = st.one_of(
    st.sampled_from(sorted(EventType.ALL)),
    st.text(CHARACTERS, min_size=1, max_size=12),
    st.sampled_from(["a\nb", "a\rb", "a\r\nb", "\x00", "ping\x00", "\n", "x" * 300]),
    st.just(""),
    JSON_LEAF,
    JSON_VALUE,
    st.just(_ABSENT),
)
ENVELOPE_ID = st.one_of(
    st.just(_ABSENT),
    st.none(),
    st.text(CHARACTERS, max_size=12),
    st.sampled_from(["1\n2", "\r", "\x00", "9" * 500]),
    BIG_INTS,
    JSON_LEAF,
    JSON_VALUE,
)
ENVELOPE_DATA = st.one_of(JSON_VALUE, JSON_VALUE, RAW_JSON, st.just(_ABSENT))


@st.composite
def envelopes(draw: st.DrawFn) -> dict[str, Any]:
    envelope: dict[str, Any] = {}
    for key, values in (("id", ENVELOPE_ID), ("event", ENVELOPE_EVENT), ("data", ENVELOPE_DATA)):
        value = draw(values)
        if value is not _ABSENT:
            envelope[key] = value
    for key, value in draw(st.dictionaries(st.text(CHARACTERS, max_size=6), JSON_VALUE)).items():
        envelope.setdefault(key, value)
    keys = draw(st.permutations(list(envelope)))
    return {key: envelope[key] for key in keys}


def expected_frame(text: str) -> Event | None:
    """What :func:`decode_frame` must make of ``text``, by the envelope's rules."""
    try:
        envelope = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(envelope, dict) or "data" not in envelope:
        return None
    name, event_id = envelope.get("event"), envelope.get("id")
    if not isinstance(name, str) or not name:
        return None
    if event_id is not None and not isinstance(event_id, str):
        return None
    try:
        data = orjson.dumps(envelope["data"])
    except orjson.JSONEncodeError:
        return None  # nested deeper than a payload can be written
    return Event(name, data, event_id or None)


@fuzz()
@given(envelope=envelopes(), as_bytes=st.booleans(), spaced=st.booleans())
def test_ws_decode_frame_on_mutated_envelopes_follows_the_envelope_rules(
    envelope: dict[str, Any], as_bytes: bool, spaced: bool
) -> None:
    text = to_json(envelope)
    if spaced:
        text = f" \n{text}\t "
    frame: str | bytes = text.encode("utf-8", "surrogatepass") if as_bytes else text
    expected = expected_frame(text)
    event = _decode_or_refuse(frame)
    assert event == expected
    if expected is not None and "data" in envelope and not isinstance(envelope["data"], Raw):
        try:
            exact = orjson.dumps(envelope["data"])
        except orjson.JSONEncodeError:
            return  # integers past 64 bits: orjson reads them as floats
        assert event.data == exact


# -- a real server sending random frames ----------------------------------------------------


@dataclass(frozen=True)
class Frame:
    """One frame the server sends, text or binary."""

    payload: str | bytes
    valid: bool = False  # written by encode_frame: it must come out

    def send(self, websocket: WebSocket) -> Any:
        if isinstance(self.payload, bytes):
            return websocket.send_bytes(self.payload)
        return websocket.send_text(self.payload)


WS_MAX_FRAME = 2048
WS_BAD_TEXT = st.one_of(
    st.text(CHARACTERS, max_size=80).map(lambda t: t + MARKER),
    envelopes().map(to_json).map(lambda t: t + " " + MARKER) | envelopes().map(to_json),
    st.just('{"event":"x","data":"' + MARKER * 200 + '"}'),  # over the frame limit
    st.just('{"event":"x","data":' + "[" * 300 + '"' + MARKER + '"' + "]" * 300 + "}"),
    st.just('{"id":7,"event":"x","data":"' + MARKER + '"}'),
)


@st.composite
def ws_frames(draw: st.DrawFn) -> Frame:
    if draw(st.integers(0, 2)) == 0:
        event = Event(
            draw(st.text(CHARACTERS, min_size=1, max_size=12)),
            orjson.dumps(draw(JSON_VALUE.filter(_writable))),
            draw(st.none() | st.text(CHARACTERS, min_size=1, max_size=12)),
        )
        text = encode_frame(event)
        return Frame(text.encode() if draw(st.booleans()) else text, valid=True)
    text = draw(WS_BAD_TEXT)
    kind = draw(st.sampled_from(["text", "bytes", "broken-utf8"]))
    if kind == "text":
        return Frame(text)
    raw = text.encode()
    return Frame(raw if kind == "bytes" else b"\xff" + raw + b"\xc3")


def _writable(value: Any) -> bool:
    try:
        orjson.dumps(value)
    except orjson.JSONEncodeError:
        return False
    return True


_WS_SCRIPTS: dict[str, list[Frame]] = {}


async def _send_script(websocket: WebSocket) -> None:
    await websocket.accept()
    for frame in _WS_SCRIPTS.pop(websocket.path_params["key"]):
        await frame.send(websocket)
    await websocket.close()


@pytest.fixture(scope="module")
def frame_server() -> Iterator[str]:
    app = Starlette(routes=[WebSocketRoute("/frames/{key}", _send_script)])
    with serve(app) as base:
        yield base.replace("http://", "ws://")


@fuzz(weight=0.1)
@given(frames=st.lists(ws_frames(), min_size=1, max_size=80))
def test_ws_source_reads_the_valid_frames_a_server_sends_and_skips_the_rest(
    frame_server: str, frames: list[Frame]
) -> None:
    key = f"k{len(_WS_SCRIPTS)}-{id(frames)}"
    _WS_SCRIPTS[key] = frames
    expected: list[Event] = []
    refused = 0
    for frame in frames:
        try:
            expected.append(decode_frame(frame.payload, max_size=WS_MAX_FRAME))
        except ValueError:
            assert not frame.valid
            refused += 1

    async def read() -> tuple[list[Event], WebSocketSource]:
        async with connect(f"{frame_server}/frames/{key}", max_size=None) as websocket:
            source = WebSocketSource(websocket, max_frame_size=WS_MAX_FRAME)
            return [event async for event in source], source

    with captured_logs() as records:
        received, source = asyncio.run(asyncio.wait_for(read(), 30))
    assert received == expected
    assert source.close_code == 1000
    ids = [event.id for event in expected if event.id is not None]
    assert source.last_event_id == (ids[-1] if ids else None)
    skipped = [r for r in records if r.name == "essessey.ws" and r.levelno == logging.WARNING]
    assert len(skipped) == refused
    assert_no_content(records)


# == 3. Reassembling and checking random sequences ==================================

INDEX = st.one_of(
    st.integers(0, 3),
    st.integers(0, 3),
    st.integers(-2, -1),
    BIG_INTS,
    st.floats(),
    st.booleans(),
    st.sampled_from(["0", "1", None, [0], {"i": 0}]),
)
WRONG = st.one_of(JSON_LEAF, JSON_VALUE, RAW_JSON)
BLOCK_TYPES = st.one_of(
    st.sampled_from(
        [
            BlockType.TEXT,
            BlockType.THINKING,
            BlockType.TOOL_USE,
            BlockType.TOOL_RESULT,
            "redacted_thinking",
            "server_tool_use",
            MARKER,
        ]
    ),
    JSON_LEAF,
)
DELTA_TYPES = st.one_of(
    st.sampled_from(
        [
            DeltaType.TEXT,
            DeltaType.THINKING,
            DeltaType.SIGNATURE,
            DeltaType.INPUT_JSON,
            DeltaType.TOOL_RESULT,
            "citations_delta",
            MARKER,
        ]
    ),
    JSON_LEAF,
)
MAYBE_WRONG_TEXT = st.one_of(SECRET, SECRET, SECRET, WRONG)
CONTENT_BLOCK = st.fixed_dictionaries(
    {"type": BLOCK_TYPES},
    optional={
        "id": MAYBE_WRONG_TEXT,
        "name": MAYBE_WRONG_TEXT,
        "input": st.one_of(st.dictionaries(st.text(max_size=4), JSON_VALUE), WRONG),
        "tool_use_id": MAYBE_WRONG_TEXT,
        "is_error": st.one_of(st.booleans(), WRONG),
        "text": MAYBE_WRONG_TEXT,
        "thinking": MAYBE_WRONG_TEXT,
        "signature": MAYBE_WRONG_TEXT,
        "summary": st.one_of(st.booleans(), WRONG),
    },
)
DELTA = st.fixed_dictionaries(
    {"type": DELTA_TYPES},
    optional={
        "text": MAYBE_WRONG_TEXT,
        "thinking": MAYBE_WRONG_TEXT,
        "signature": MAYBE_WRONG_TEXT,
        "partial_json": MAYBE_WRONG_TEXT,
        "citation": WRONG,
        "stop_reason": MAYBE_WRONG_TEXT,
        "stop_sequence": MAYBE_WRONG_TEXT,
    },
)
USAGE = st.one_of(
    st.dictionaries(
        st.sampled_from(["input_tokens", "output_tokens", "cache_read_input_tokens", "x"]),
        st.one_of(st.integers(0, 10**6), BIG_INTS, WRONG, st.dictionaries(st.text(), JSON_LEAF)),
    ),
    WRONG,
)
MESSAGE = st.fixed_dictionaries(
    {},
    optional={
        "id": MAYBE_WRONG_TEXT,
        "stream_id": MAYBE_WRONG_TEXT,
        "model": MAYBE_WRONG_TEXT,
        "usage": USAGE,
        # A message given whole in its start (Anthropic's programmatic tool calls): its
        # blocks, each shaped like one or not, and its stop reason.
        "content": st.one_of(WRONG, st.lists(st.one_of(CONTENT_BLOCK, WRONG), max_size=4)),
        "stop_reason": MAYBE_WRONG_TEXT,
    },
)
ERROR = st.fixed_dictionaries(
    {}, optional={"type": MAYBE_WRONG_TEXT, "message": MAYBE_WRONG_TEXT, "request_id": WRONG}
)


@st.composite
def random_payloads(draw: st.DrawFn, name: str) -> Any:
    """A payload for event ``name``: shaped like one, with fields missing or mistyped."""
    payload: dict[str, Any] = {"type": draw(st.one_of(st.just(name), st.just(name), WRONG))}
    fields = {
        "index": INDEX,
        "content_block": st.one_of(CONTENT_BLOCK, CONTENT_BLOCK, WRONG),
        "delta": st.one_of(DELTA, DELTA, WRONG, st.lists(JSON_LEAF)),
        "message": st.one_of(MESSAGE, MESSAGE, WRONG),
        "usage": USAGE,
        "error": st.one_of(ERROR, ERROR, WRONG),
        "request_id": MAYBE_WRONG_TEXT,
    }
    for key in draw(st.lists(st.sampled_from(sorted(fields)), unique=True, max_size=4)):
        payload[key] = draw(fields[key])
    return payload


EVENT_NAME = st.one_of(
    st.sampled_from(sorted(EventType.ALL)),
    st.sampled_from(sorted(EventType.ALL)),
    st.sampled_from(["", "message", "custom", "Message_Start", "content_block_start "]),
    st.text(CHARACTERS, max_size=12),
)


@st.composite
def random_events(draw: st.DrawFn) -> Event:
    name = draw(EVENT_NAME)
    form = draw(st.integers(0, 9))
    if form == 0:
        data = draw(st.binary(max_size=40))  # broken JSON, broken UTF-8
    elif form == 1:
        data = to_json(draw(st.one_of(JSON_VALUE, RAW_JSON))).encode("utf-8", "surrogatepass")
    elif form == 2:
        whole = to_json(draw(random_payloads(name)))
        data = whole[: draw(st.integers(0, len(whole)))].encode("utf-8", "surrogatepass")
    else:
        data = to_json(draw(random_payloads(name))).encode("utf-8", "surrogatepass")
    return Event(name, data, draw(st.none() | TOKEN))


def payload_event(payload: dict[str, Any]) -> Event:
    return Event(payload["type"], orjson.dumps(payload))


@st.composite
def valid_messages(draw: st.DrawFn, number: int) -> tuple[list[Event], str]:
    """A message that keeps every rule, in either dialect's spelling; and its text."""
    thinking_field = draw(st.sampled_from(["text", "thinking"]))
    events = [
        payload_event(
            {
                "type": "message_start",
                "message": {
                    "id": f"msg_{number}",
                    "stream_id": "s",
                    "model": "m",
                    "usage": {"input_tokens": 3},
                },
            }
        )
    ]
    text: list[str] = []
    index = draw(st.integers(0, 2))

    def block(start: dict[str, Any], deltas: list[dict[str, Any]]) -> None:
        nonlocal index
        events.append(
            payload_event({"type": "content_block_start", "index": index, "content_block": start})
        )
        for delta in deltas:
            events.append(
                payload_event({"type": "content_block_delta", "index": index, "delta": delta})
            )
            if draw(st.integers(0, 5)) == 0:
                events.append(payload_event({"type": "ping"}))
        events.append(payload_event({"type": "content_block_stop", "index": index}))
        index += 1

    non_empty = st.lists(SECRET.filter(bool), min_size=1, max_size=3)
    if draw(st.booleans()):
        parts = draw(non_empty)
        deltas = [{"type": DeltaType.THINKING, thinking_field: p} for p in parts]
        block({"type": "thinking"}, [*deltas, {"type": DeltaType.SIGNATURE, "signature": "sig"}])
    summaries = draw(st.integers(0, 3))  # a reasoning summary's parts, the last one signed
    for n in range(summaries):
        signed = [{"type": DeltaType.SIGNATURE, "signature": "sig"}] if n == summaries - 1 else []
        part = [{"type": DeltaType.THINKING, thinking_field: draw(SECRET.filter(bool))}]
        block({"type": "thinking", "summary": True}, [*part, *signed])
    if draw(st.booleans()):
        parts = draw(non_empty)
        text.extend(parts)
        block({"type": "text"}, [{"type": DeltaType.TEXT, "text": p} for p in parts])
    calls = [f"toolu_{number}_{k}" for k in range(draw(st.integers(0, 2)))]
    for call in calls:
        arguments = json.dumps({"q": draw(SECRET)})
        cut = draw(st.integers(0, len(arguments)))
        fragments = [arguments[:cut], arguments[cut:]]
        block(
            {"type": "tool_use", "id": call, "name": "lookup", "input": {}},
            [{"type": DeltaType.INPUT_JSON, "partial_json": f} for f in fragments],
        )
    for call in calls:
        block(
            {"type": "tool_result", "tool_use_id": call},
            [{"type": DeltaType.TOOL_RESULT, "text": draw(SECRET)}],
        )
    if draw(st.booleans()):
        block({"type": "redacted_thinking", "data": MARKER}, [])
    events.append(
        payload_event(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 5},
            }
        )
    )
    events.append(payload_event({"type": "message_stop"}))
    return events, "".join(text)


@st.composite
def shuffled_streams(draw: st.DrawFn) -> list[Event]:
    """Valid messages taken apart: interleaved, reordered, cut, repeated, sprinkled with
    random events."""
    messages = [draw(valid_messages(n))[0] for n in range(draw(st.integers(1, 3)))]
    # Interleave the messages, each one's events in order.
    queues = [list(m) for m in messages]
    stream: list[Event] = []
    while any(queues):
        queue = draw(st.sampled_from([q for q in queues if q]))
        stream.append(queue.pop(0))
    for _ in range(draw(st.integers(0, 6))):
        if not stream:
            break
        i = draw(st.integers(0, len(stream) - 1))
        j = draw(st.integers(0, len(stream) - 1))
        action = draw(st.sampled_from(["swap", "drop", "repeat", "insert"]))
        if action == "swap":
            stream[i], stream[j] = stream[j], stream[i]
        elif action == "drop":
            del stream[i]
        elif action == "repeat":
            stream.insert(j, stream[i])
        else:
            stream.insert(i, draw(random_events()))
    return stream


EVENT_SEQUENCES = st.one_of(
    st.lists(random_events(), max_size=30),
    shuffled_streams(),
    st.tuples(shuffled_streams(), st.lists(random_events(), max_size=8)).map(
        lambda pair: pair[0] + pair[1]
    ),
)


def _unreadable(event: Event) -> bool:
    """Whether the reassembler cannot read ``event`` at all: its data is not a JSON
    object (a ping is read without its data)."""
    if event.event == EventType.PING:
        return False
    try:
        return not isinstance(orjson.loads(event.data), dict)
    except orjson.JSONDecodeError:
        return True


@fuzz()
@given(events=EVENT_SEQUENCES, snapshots=st.sets(st.integers(0, 40), max_size=3))
def test_reassembler_reads_any_sequence_without_raising(
    events: list[Event], snapshots: set[int]
) -> None:
    reassembler = Reassembler()
    with captured_logs("essessey.reassemble") as records:
        for position, event in enumerate(events):
            before = len(records)
            reassembler.feed(event)
            logged = warnings_of(records[before:])
            # At most a skip, and a note that an implicit message was opened.
            assert len(logged) <= 2
            for record in logged:
                assert f"#{position} " in record.getMessage()
            if _unreadable(event):
                assert len(logged) == 1
            if position in snapshots:
                assert isinstance(reassembler.result(), ParsedStream)
        parsed = reassembler.result()
    assert_no_content(records)
    assert reassembler.position == len(events)
    assert isinstance(parsed.text, str)
    for call in parsed.tool_calls:
        assert isinstance(call.arguments, str)
        assert call.parse_error is None or call.params is None


# Each dialect's encoder, as a route makes it for a subscriber.
RESPONSES_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
DIALECT_ENCODERS: dict[str, Callable[[], Any]] = {
    "ui": lambda: UIMessageEncoder(message_id="turn"),
    "agui": lambda: AGUIEncoder("thread", "run"),
    "chat_completions": lambda: ChatCompletionsEncoder("chatcmpl-1", created=1),
    "responses": lambda: ResponsesEncoder("resp_1", created_at=1),
}


@fuzz()
@given(
    events=EVENT_SEQUENCES,
    dialect=st.sampled_from(sorted(DIALECT_ENCODERS)),
    fails=st.booleans(),
)
def test_dialect_encoders_write_any_sequence_without_raising(
    events: list[Event], dialect: str, fails: bool
) -> None:
    # What a store holds may come from a producer that wrote it without a checker, or
    # from another version: an encoder skips what it cannot read (a line each, without
    # its content) and still ends its stream.
    encoder = DIALECT_ENCODERS[dialect]()
    with captured_logs() as records:
        written = [encoder.encode(event) for event in events]
        written.append(encoder.fail("api_error", "x") if fails else encoder.finish())
    assert all(isinstance(frame, bytes) for frame in written)
    assert_no_content(records)


@fuzz()
@given(events=EVENT_SEQUENCES)
def test_the_hub_s_readers_take_any_sequence_without_raising(events: list[Event]) -> None:
    # What the hub reads of a stored stream on every answer (what it waits for) and for a
    # late reader (its snapshot): never an exception, and the snapshot keeps every event
    # that is not a delta merged into another.
    with captured_logs() as records:
        waiting(events)
        compacted = compact(events)
    assert_no_content(records)
    kept = [e for e in events if e.event != EventType.CONTENT_BLOCK_DELTA]
    assert [e for e in compacted if e.event != EventType.CONTENT_BLOCK_DELTA] == kept


@fuzz()
@given(events=EVENT_SEQUENCES)
def test_check_returns_violations_for_any_sequence_and_never_raises(events: list[Event]) -> None:
    found = check(events)
    assert isinstance(found, list)
    assert all(isinstance(v, Violation) for v in found)
    assert all(0 <= v.position <= len(events) for v in found)
    assert [v.position for v in found] == sorted(v.position for v in found)
    # The incremental checker's three modes agree with each other on the same input, and
    # take payloads from Python's json module too (integers of any size kept exact,
    # NaN and Infinity read as floats).
    for loads in (orjson.loads, json.loads):
        checker = ProtocolChecker()
        for event in events:
            try:
                payload = loads(event.data)
            except (ValueError, RecursionError):  # not JSON, bad UTF-8, too deep
                continue
            looked = checker.validate(event.event, payload)
            assert checker.accept(event.event, payload) == looked
            if looked:
                checker.feed(event.event, payload)
        assert isinstance(checker.finish(), list)


@fuzz()
@given(count=st.integers(1, 3), data=st.data())
def test_valid_messages_pass_check_and_reassemble_quietly(count: int, data: st.DataObject) -> None:
    events: list[Event] = []
    text: list[str] = []
    for n in range(count):
        message, message_text = data.draw(valid_messages(n))
        events.extend(message)
        text.append(message_text)
    assert check(events) == []
    reassembler = Reassembler()
    with captured_logs("essessey.reassemble") as records:
        for event in events:
            reassembler.feed(event)
    assert records == []
    parsed = reassembler.result()
    assert parsed.text == "".join(text)
    assert parsed.complete


@fuzz()
@given(data=st.data())
def test_the_responses_dialect_writes_a_summary_back_as_the_items_it_came_as(
    data: st.DataObject,
) -> None:
    # Adjacent summary blocks, the last one signed, are one reasoning item's summary
    # parts; every frame is one the openai SDK reads.
    events = data.draw(valid_messages(0))[0]
    expected: list[tuple[list[str], str]] = []
    parts: dict[int, list[str]] = {}
    summary: list[str] = []
    for event in events:
        payload = orjson.loads(event.data)
        if event.event == "content_block_start":
            if payload["content_block"].get("summary") is True:
                parts[payload["index"]] = []
        elif event.event == "content_block_delta" and payload["index"] in parts:
            delta = payload["delta"]
            if delta["type"] == DeltaType.THINKING:
                parts[payload["index"]].append(delta.get("text", delta.get("thinking")))
            else:
                summary_text = "".join(parts.pop(payload["index"]))
                expected.append(([*summary, summary_text], delta["signature"]))
                summary = []
        elif event.event == "content_block_stop" and payload["index"] in parts:
            summary.append("".join(parts.pop(payload["index"])))
    encoder = ResponsesEncoder("resp_1", created_at=1)
    body = b"".join(encoder.encode(event) for event in events) + encoder.finish()
    frames = [
        RESPONSES_EVENT.validate_json(line[6:])
        for line in body.split(b"\n")
        if line.startswith(b"data: {")
    ]
    output = frames[-1].response.output
    written = [
        ([part.text for part in item.summary], item.encrypted_content)
        for item in output
        if item.type == "reasoning" and item.summary
    ]
    assert written == expected


# == 4. The provider adapters ======================================================


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return
    for key, child in items:
        yield (*prefix, key)
        if len(prefix) < 6:
            yield from _paths(child, (*prefix, key))


def _copy(value: Any, depth: int = 8) -> Any:
    """A copy of the top ``depth`` levels of ``value`` (what :func:`mutated` changes);
    deeper parts are shared, so values nested past the recursion limit copy too."""
    if depth == 0:
        return value
    if isinstance(value, dict):
        return {key: _copy(child, depth - 1) for key, child in value.items()}
    if isinstance(value, list):
        return [_copy(child, depth - 1) for child in value]
    return value


@st.composite
def mutated(draw: st.DrawFn, value: Any, *, max_mutations: int = 3) -> Any:
    """``value`` with a few of its fields replaced by random values, or deleted."""
    value = _copy(value)
    for _ in range(draw(st.integers(0, max_mutations))):
        paths = list(_paths(value))
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = value
        for key in path[:-1]:
            parent = parent[key]
        if draw(st.integers(0, 3)) == 0:
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(ANY_VALUE)
    return value


class Dumpable:
    """An SDK-like object: read through ``model_dump``, which may fail or return junk."""

    def __init__(self, value: Any, fails: bool) -> None:
        self.value = value
        self.fails = fails

    def model_dump(self, **options: Any) -> Any:
        if self.fails:
            raise RuntimeError(MARKER)
        return _copy(self.value)


NOT_MAPPINGS = st.one_of(
    JSON_LEAF,
    st.lists(JSON_LEAF, max_size=3),
    st.builds(Dumpable, JSON_VALUE, st.booleans()),
)


@st.composite
def streams_of(draw: st.DrawFn, items: list[Any]) -> list[Any]:
    """A provider's stream taken apart: items mutated, dropped, repeated, swapped, or
    replaced by what is not a mapping; some mappings behind ``model_dump``."""
    stream = [draw(mutated(item)) if draw(st.integers(0, 3)) == 0 else item for item in items]
    for _ in range(draw(st.integers(0, 4))):
        if not stream:
            break
        i = draw(st.integers(0, len(stream) - 1))
        j = draw(st.integers(0, len(stream) - 1))
        action = draw(st.sampled_from(["swap", "drop", "repeat", "junk", "object"]))
        if action == "swap":
            stream[i], stream[j] = stream[j], stream[i]
        elif action == "drop":
            del stream[i]
        elif action == "repeat":
            stream.insert(j, _copy(stream[i]))
        elif action == "junk":
            stream.insert(i, draw(NOT_MAPPINGS))
        else:
            stream[i] = Dumpable(stream[i], fails=False)
    return stream


# What a provider's JSON, parsed by Python's json module, may hold that orjson will not
# write: a lone surrogate (from a "\\ud800" escape) and counts past 64 bits.
PROVIDER_TEXT = st.one_of(SECRET, SECRET, SECRET, SURROGATE_TEXT)
COUNT = st.one_of(st.integers(0, 10**6), st.integers(0, 10**6), BIG_INTS)


class Broken(Exception):
    """What a provider's stream raises when its transport fails."""


async def _raising(items: list[Any], after: int) -> AsyncIterator[Any]:
    for item in items[:after]:
        yield item
    raise Broken(MARKER)


def _publish(
    run: Callable[[Publisher, Any], Any], items: list[Any], dialect: str, fails_after: int | None
) -> tuple[list[Event], list[logging.LogRecord], Any]:
    """Run an adapter's ``publish`` into a strict Publisher: the events, the logs, and
    what it returned (or the exception it raised)."""
    sink = InMemorySink()
    publisher = Publisher(sink, dialect=dialect, strict=True)  # type: ignore[arg-type]
    source: Any = items if fails_after is None else _raising(items, fails_after)
    with captured_logs() as records:
        try:
            outcome: Any = asyncio.run(run(publisher, source))
        except Broken as exc:
            outcome = exc
    return sink.events, records, outcome


def _openai_chunks(draw: st.DrawFn) -> list[Any]:
    chunks: list[Any] = []

    def chunk(delta: dict[str, Any], **fields: Any) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": None}
        choice.update(fields.pop("choice", {}))
        return {"id": "chatcmpl-1", "model": "gpt-x", "choices": [choice], **fields}

    calls = draw(st.integers(0, 3))
    for kind in draw(
        st.lists(
            st.sampled_from(
                ["text", "reasoning", "refusal", "call", "legacy", "other", "none", "cited"]
            ),
            max_size=14,
        )
    ):
        if kind == "text":
            chunks.append(chunk({"role": "assistant", "content": draw(PROVIDER_TEXT)}))
        elif kind == "cited":
            source = {"url": MARKER, "title": draw(PROVIDER_TEXT), "content": MARKER}
            source |= {"start_index": draw(COUNT), "end_index": draw(COUNT)}
            given = draw(
                st.sampled_from(
                    [{"type": "url_citation", "url_citation": source}, {"type": MARKER}]
                )
            )
            chunks.append(chunk({"content": draw(PROVIDER_TEXT), "annotations": [given]}))
        elif kind == "reasoning":
            key = draw(st.sampled_from(["reasoning_content", "reasoning", "reasoning_details"]))
            if key == "reasoning_details":
                detail = draw(
                    st.sampled_from(
                        [
                            {"type": "reasoning.text", "text": draw(PROVIDER_TEXT)},
                            {"type": "reasoning.text", "signature": draw(PROVIDER_TEXT)},
                            {"type": "reasoning.summary", "summary": draw(PROVIDER_TEXT)},
                            {"type": "reasoning.encrypted", "data": MARKER},
                            {"type": MARKER},
                        ]
                    )
                )
                chunks.append(chunk({key: [detail]}))
            else:
                chunks.append(chunk({key: draw(PROVIDER_TEXT)}))
        elif kind == "refusal":
            chunks.append(chunk({"refusal": draw(PROVIDER_TEXT)}))
        elif kind == "call" and calls:
            k = draw(st.integers(0, calls - 1))
            call: dict[str, Any] = {"function": {"arguments": draw(PROVIDER_TEXT)}}
            if draw(st.booleans()):
                call["index"] = k
            if draw(st.booleans()):
                call["id"] = draw(st.sampled_from([f"call_{k}", "", "call_0", MARKER]))
            if draw(st.booleans()):
                call["function"]["name"] = draw(st.sampled_from(["lookup", "", MARKER]))
            call["type"] = "function"
            chunks.append(chunk({"tool_calls": [call]}))
        elif kind == "legacy":
            chunks.append(chunk({"function_call": {"name": "f", "arguments": draw(PROVIDER_TEXT)}}))
        elif kind == "other":
            chunks.append(
                chunk({}, choice={"index": draw(st.integers(1, 2)), "delta": {"content": MARKER}})
            )
        else:
            chunks.append(chunk({}))
    finish = draw(st.sampled_from(["stop", "length", "tool_calls", "content_filter", MARKER]))
    chunks.append(chunk({}, choice={"finish_reason": finish}))
    usage = {
        "prompt_tokens": draw(COUNT),
        "completion_tokens": draw(COUNT),
        "prompt_tokens_details": {"cached_tokens": draw(COUNT)},
        "completion_tokens_details": {"reasoning_tokens": draw(COUNT)},
    }
    chunks.append({"id": "chatcmpl-1", "model": "gpt-x", "choices": [], "usage": usage})
    return chunks


@st.composite
def openai_streams(draw: st.DrawFn) -> list[Any]:
    return draw(streams_of(_openai_chunks(draw)))


def assert_published_stream_keeps_the_rules(events: list[Event]) -> None:
    assert check(events) == []
    assert events, "publish always sends something"
    assert events[-1].event in (EventType.MESSAGE_STOP, EventType.ERROR)


@fuzz()
@given(
    chunks=openai_streams(),
    dialect=st.sampled_from(sorted(DIALECTS)),
    fails_after=st.none() | st.integers(0, 8),
)
def test_openai_adapter_publishes_a_valid_stream_from_any_chunks(
    chunks: list[Any], dialect: str, fails_after: int | None
) -> None:
    def run(publisher: Publisher, source: Any) -> Any:
        return openai_adapter.publish(publisher, source, message_id="msg_1", stream_id="s_1")

    events, records, outcome = _publish(run, chunks, dialect, fails_after)
    assert_no_content(records)
    assert_published_stream_keeps_the_rules(events)
    if isinstance(outcome, Broken):
        # The iterable's failure propagates, after an error event that names its class.
        assert events[-1].event == EventType.ERROR
        assert MARKER.encode() not in events[-1].data
    elif outcome.error is not None:
        # No chunk it read gave a finish_reason (one that did may have been skipped as
        # unreadable) and a call's arguments are not whole JSON: the stream was cut short.
        assert outcome.error == {"type": "api_error", "message": openai_adapter.CUT_STREAM}
        assert any(call.input is None for call in outcome.tool_calls)
        assert events[-1].event == EventType.ERROR
    else:
        assert isinstance(outcome, openai_adapter.PublishedMessage)
        assert events[-1].event == EventType.MESSAGE_STOP


def _anthropic_events(draw: st.DrawFn) -> list[Any]:
    events: list[Any] = [
        {
            "type": "message_start",
            "message": {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": "claude-x",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 5, "output_tokens": 1},
            },
        }
    ]
    kinds = st.sampled_from(["text", "thinking", "tool_use", "server_tool_use", "redacted"])
    for index, kind in enumerate(draw(st.lists(kinds, max_size=5))):
        deltas: list[dict[str, Any]] = []
        if kind == "text":
            start: dict[str, Any] = {"type": "text", "text": ""}
            for part in draw(st.lists(PROVIDER_TEXT, max_size=3)):
                deltas.append({"type": "text_delta", "text": part})
            if draw(st.booleans()):
                citation = {"type": "char_location", "cited_text": MARKER}
                deltas.insert(0, {"type": "citations_delta", "citation": citation})
        elif kind == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            for part in draw(st.lists(PROVIDER_TEXT, max_size=3)):
                deltas.append({"type": "thinking_delta", "thinking": part})
            deltas.append({"type": "signature_delta", "signature": "c2ln"})
        elif kind in ("tool_use", "server_tool_use"):
            start = {"type": kind, "id": f"toolu_{index}", "name": "lookup", "input": {}}
            arguments = json.dumps({"q": draw(PROVIDER_TEXT)}, ensure_ascii=False)
            cut = draw(st.integers(0, len(arguments)))
            for fragment in ("", arguments[:cut], arguments[cut:]):
                deltas.append({"type": "input_json_delta", "partial_json": fragment})
        else:
            start = {"type": "redacted_thinking", "data": MARKER}
        events.append({"type": "content_block_start", "index": index, "content_block": start})
        for delta in deltas:
            events.append({"type": "content_block_delta", "index": index, "delta": delta})
            if draw(st.integers(0, 6)) == 0:
                events.append({"type": "ping"})
        events.append({"type": "content_block_stop", "index": index})
    if draw(st.integers(0, 5)) == 0:
        error = {"type": draw(st.sampled_from(["overloaded_error", MARKER])), "message": MARKER}
        events.append({"type": "error", "error": error, "request_id": "req_1"})
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": draw(COUNT)},
        }
    )
    events.append({"type": "message_stop"})
    if draw(st.integers(0, 4)) == 0:
        events.append({"type": draw(st.sampled_from(["text", "citation", MARKER]))})
    return events


@st.composite
def anthropic_streams(draw: st.DrawFn) -> list[Any]:
    return draw(streams_of(_anthropic_events(draw)))


@fuzz()
@given(
    events=anthropic_streams(),
    dialect=st.sampled_from(sorted(DIALECTS)),
    fails_after=st.none() | st.integers(0, 8),
)
def test_anthropic_adapter_publishes_a_valid_stream_from_any_events(
    events: list[Any], dialect: str, fails_after: int | None
) -> None:
    def run(publisher: Publisher, source: Any) -> Any:
        return anthropic_adapter.publish(publisher, source, stream_id="s_1")

    published, records, outcome = _publish(run, events, dialect, fails_after)
    assert_no_content(records)
    assert_published_stream_keeps_the_rules(published)
    if isinstance(outcome, Broken):
        assert published[-1].event in (EventType.ERROR, EventType.MESSAGE_STOP)
    else:
        assert isinstance(outcome, anthropic_adapter.StreamedMessage)
        # An error (the provider's, or the stream cut short) is published and returned.
        assert (outcome.error is not None) == (published[-1].event == EventType.ERROR)


def _responses_item_events(draw: st.DrawFn, n: int) -> list[dict[str, Any]]:
    """The events of output item ``n``: added, its deltas and dones, then done."""
    kind = draw(
        st.sampled_from(
            [
                *("message", "reasoning", "function_call", "web_search_call"),
                *("custom_tool_call", "mcp_approval_request", MARKER),
                *("mcp_call", "code_interpreter_call", "shell_call", "tool_search_call"),
                *("shell_call_output", "tool_search_output", "x_search_call"),
            ]
        )
    )
    item_id = draw(st.sampled_from([f"it_{n}", "it_0", MARKER]))
    where = {"item_id": item_id, "output_index": n}
    if draw(st.integers(0, 5)) == 0:
        del where["output_index"]
    events: list[dict[str, Any]] = []
    item: dict[str, Any] = {"type": kind, "id": item_id}
    if kind == "message":
        item.update(role="assistant", content=[])
        texts = draw(st.lists(PROVIDER_TEXT, max_size=3))
        for part in texts:
            delta = draw(st.sampled_from(["output_text", "refusal"]))
            index = draw(st.integers(0, 1))
            events.append(
                {"type": f"response.{delta}.delta", **where, "content_index": index, "delta": part}
            )
        if draw(st.booleans()):
            annotation = {"type": "url_citation", "url": MARKER, "title": MARKER}
            annotation |= {"start_index": draw(COUNT), "end_index": draw(COUNT)}
            events.append(
                {"type": "response.output_text.annotation.added", **where, "content_index": 0}
                | {"annotation_index": 0, "annotation": annotation}
            )
        whole = draw(st.sampled_from(["".join(texts), MARKER]))
        if draw(st.booleans()):
            events.append(
                {"type": "response.output_text.done", **where, "content_index": 0, "text": whole}
            )
        if draw(st.booleans()):
            part = {"type": "output_text", "text": whole, "annotations": []}
            events.append(
                {"type": "response.content_part.done", **where, "content_index": 0, "part": part}
            )
        done = dict(item, content=[{"type": "output_text", "text": whole, "annotations": []}])
    elif kind == "reasoning":
        item["summary"] = []
        texts = draw(st.lists(PROVIDER_TEXT, max_size=3))
        for part in texts:
            delta, field = draw(
                st.sampled_from(
                    [
                        ("reasoning_summary_text", "summary_index"),
                        ("reasoning_text", "content_index"),
                    ]
                )
            )
            events.append({"type": f"response.{delta}.delta", **where, field: 0, "delta": part})
        if draw(st.booleans()):
            part = {"type": "summary_text", "text": "".join(texts)}
            events.append(
                {"type": "response.reasoning_summary_part.done", **where, "summary_index": 0}
                | {"part": part}
            )
        done = dict(item, summary=[{"type": "summary_text", "text": "".join(texts)}])
    elif kind in ("function_call", "custom_tool_call", "mcp_approval_request"):
        call_id = draw(st.sampled_from([f"call_{n}", "call_0", "", None]))
        name = draw(st.sampled_from(["lookup", "", None, MARKER]))
        item.update(call_id=call_id, name=name, arguments="")
        if kind == "custom_tool_call":
            item["input"] = ""
        arguments = json.dumps({"q": draw(PROVIDER_TEXT)}, ensure_ascii=False)
        cuts = sorted(draw(st.lists(st.integers(0, len(arguments)), max_size=3)))
        pieces = [arguments[a:b] for a, b in pairwise([0, *cuts, len(arguments)])]
        if kind == "function_call":
            for piece in pieces:
                events.append(
                    {"type": "response.function_call_arguments.delta", **where, "delta": piece}
                )
            whole = draw(st.sampled_from([arguments, arguments[:-1], "{}", MARKER]))
            if draw(st.booleans()):
                events.append(
                    {"type": "response.function_call_arguments.done", **where, "arguments": whole}
                )
        else:
            whole = arguments
        done = dict(item, arguments=whole, input=whole)
    else:
        if kind == "web_search_call":
            events.append({"type": "response.web_search_call.searching", **where})
            item["action"] = {"type": "search", "query": MARKER}
        elif kind == "mcp_call":
            item.update(server_label="s", name="lookup", arguments=draw(PROVIDER_TEXT))
            delta = {"type": "response.mcp_call_arguments.delta", **where, "delta": MARKER}
            events.append(delta)
        elif kind == "code_interpreter_call":
            item.update(code=draw(PROVIDER_TEXT), container_id="c")
            delta = {"type": "response.code_interpreter_call_code.delta", **where}
            events.append(delta | {"delta": MARKER})
        elif kind == "shell_call":
            item.update(call_id=f"call_{n}", action={"commands": [draw(PROVIDER_TEXT)]})
            environment = draw(st.sampled_from([None, "local", "container_auto", MARKER]))
            if environment is not None:
                item["environment"] = {"type": environment}
        elif kind in ("shell_call_output", "tool_search_output"):
            item.update(call_id=f"call_{n}", output=draw(ANY_VALUE))
        elif kind == "x_search_call":
            item.update(name="x_keyword_search", arguments=draw(PROVIDER_TEXT))
        else:
            item.update(call_id=f"call_{n}", arguments=draw(ANY_VALUE))
            item["execution"] = draw(st.sampled_from(["client", "server", MARKER]))
        done = dict(item, status="completed")
    added = (
        []
        if kind == "mcp_approval_request"
        else [{"type": "response.output_item.added", "output_index": n, "item": item}]
    )
    finished = {"type": "response.output_item.done", "output_index": n, "item": done}
    return [*added, *events, *([finished] if draw(st.integers(0, 4)) else [])]


def _responses_events(draw: st.DrawFn) -> list[Any]:
    response = {"id": "resp_1", "object": "response", "model": "gpt-x", "output": []}
    # The tools the request declared, echoed: which custom tool calls are the client's.
    response["tools"] = draw(
        st.sampled_from([[], [{"type": "custom", "name": "lookup"}], [{"type": "x_search"}]])
        | st.builds(lambda value: [value], ANY_VALUE)
    )
    events: list[Any] = [{"type": "response.created", "response": response}]
    # Each item's events in their order, the items' interleaved.
    queues = [_responses_item_events(draw, n) for n in range(draw(st.integers(0, 4)))]
    while any(queues):
        live = [q for q in queues if q]
        events.append(draw(st.sampled_from(live)).pop(0))
    status = draw(st.sampled_from(["completed", "incomplete", "failed", "error", "cut"]))
    usage = {"input_tokens": draw(COUNT), "output_tokens": draw(COUNT)}
    usage |= {"input_tokens_details": {"cached_tokens": draw(COUNT)}}
    if status == "error":
        events.append({"type": "error", "code": MARKER, "message": MARKER})
    elif status != "cut":
        ended = {**response, "status": status, "usage": usage}
        if status == "incomplete":
            ended["incomplete_details"] = {
                "reason": draw(st.sampled_from(["max_output_tokens", MARKER]))
            }
        if status == "failed":
            ended["error"] = {"code": "server_error", "message": MARKER}
        events.append({"type": f"response.{status}", "response": ended})
    if draw(st.integers(0, 4)) == 0:
        events.append({"type": "response.output_text.delta", "delta": MARKER, "output_index": 0})
    return [{**event, "sequence_number": n} for n, event in enumerate(events)]


@st.composite
def responses_streams(draw: st.DrawFn) -> list[Any]:
    return draw(streams_of(_responses_events(draw)))


@fuzz()
@given(
    events=responses_streams(),
    dialect=st.sampled_from(sorted(DIALECTS)),
    fails_after=st.none() | st.integers(0, 8),
)
def test_responses_adapter_publishes_a_valid_stream_from_any_events(
    events: list[Any], dialect: str, fails_after: int | None
) -> None:
    def run(publisher: Publisher, source: Any) -> Any:
        return responses_adapter.publish(publisher, source, message_id="msg_1", stream_id="s_1")

    published, records, outcome = _publish(run, events, dialect, fails_after)
    assert_no_content(records)
    assert_published_stream_keeps_the_rules(published)
    if isinstance(outcome, Broken):
        assert published[-1].event == EventType.ERROR
        assert MARKER.encode() not in published[-1].data
    else:
        assert isinstance(outcome, responses_adapter.PublishedResponse)
        # A failure (the provider's, or the stream cut short) is published and returned.
        assert (outcome.error is not None) == (published[-1].event == EventType.ERROR)


# == Dialect requests ===========================================================================
#
# What a client posts to a dialect's route: parsed (ValueError names what is wrong), read
# as a conversation, and read for answers (InvalidAnswer names what is wrong). Nothing else
# may be raised: anything else would be a 500 for a request the client got wrong.

_ASKED = Waiting(
    "msg_1",
    "m",
    (
        ApprovalRequest("apr_1", "call_1", "pay", {}),
        ClientToolCall("call_2", "get_location", {}),
        Question("q_1", "Which unit?"),
    ),
)
_PART = st.sampled_from(
    [{"type": "text", "text": "hi"}, {"type": "input_text", "text": "hi"}, {"type": "image"}]
)
_UI_BODY = {
    "id": "chat_1",
    "trigger": "submit-message",
    "messages": [
        {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi"}]},
        {
            "id": "a1",
            "role": "assistant",
            "parts": [
                {"type": "tool-pay", "toolCallId": "call_1", "state": "approval-responded"}
                | {"approval": {"id": "apr_1", "approved": False, "reason": "no"}},
                {"type": "tool-get_location", "toolCallId": "call_2"}
                | {"state": "output-available", "output": {"lat": 1}},
                {"type": "dynamic-tool", "toolCallId": "q_1", "state": "output-error"}
                | {"errorText": "x"},
            ],
        },
    ],
}
_AGUI_BODY = {
    "threadId": "t1",
    "runId": "r1",
    "messages": [
        {"id": "1", "role": "user", "content": "hi"},
        {"id": "2", "role": "tool", "toolCallId": "call_2", "content": '{"lat": 1}'},
    ],
    "resume": [
        {"interruptId": "apr_1", "status": "resolved", "payload": {"approved": True}},
        {"interruptId": "q_1", "status": "cancelled"},
    ],
}
_CHAT_BODY = {
    "model": "m",
    "stream": True,
    "stream_options": {"include_usage": True},
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "q_1"}]},
        {"role": "tool", "tool_call_id": "q_1", "content": '"C"'},
        {"role": "tool", "tool_call_id": "apr_1", "content": '{"approved": true}'},
    ],
}
_ANSWERS_BODY = {
    "answers": [
        {"id": "apr_1", "approved": False, "reason": "no"},
        {"id": "call_2", "output": {"lat": 1}, "is_error": False},
        {"id": "q_1", "value": "C"},
    ]
}
_RESPONSES_BODY = {
    "model": "m",
    "instructions": "be brief",
    "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "mcp_approval_response", "approval_request_id": "apr_1", "approve": True},
        {"type": "function_call_output", "call_id": "q_1", "output": '"C"'},
    ],
}


@st.composite
def request_bodies(draw: st.DrawFn) -> Any:
    """A dialect request's body: one of each dialect's, mutated, or any JSON."""
    if draw(st.integers(0, 5)) == 0:
        return draw(JSON_VALUE)
    body = draw(st.sampled_from([_UI_BODY, _AGUI_BODY, _CHAT_BODY, _RESPONSES_BODY, _ANSWERS_BODY]))
    return draw(mutated(body, max_mutations=draw(st.integers(0, 6))))


def _answered(read: Callable[[], list[Any]]) -> None:
    """The answers ``read`` finds, matched as ``StreamHub.answer`` matches them."""
    with contextlib.suppress(AnswerRefused):
        match_answers(_ASKED, read())


def _read_as_every_dialect(body: Any) -> None:
    """``body`` read as each dialect's route reads it, as far as it gets."""
    _answered(partial(parse_answers, body))  # the protocol's own answer route
    asked: Waiting | None
    for asked in (_ASKED, None):
        try:
            chat = parse_chat_request(orjson.dumps(body))
        except (ValueError, TypeError):  # TypeError: orjson refuses the value to dump
            pass
        else:
            conversation(chat)
            if asked is not None and chat.messages:
                _answered(partial(ui_answers, chat.messages[-1], _ASKED))
        try:
            run = parse_run_agent_input(body)
            entries = parse_resume(run.body)
        except ValueError:
            pass
        else:
            conversation(run)
            tool_messages = answering_tool_messages(run.messages)
            _answered(partial(resume_answers, entries, tool_messages, asked))
        try:
            completion = parse_chat_completion_request(body, "chatcmpl-1")
        except ValueError:
            pass
        else:
            conversation(completion)
            answering = answering_messages(completion.messages)
            _answered(partial(tool_message_answers, answering, asked))
        try:
            response = parse_responses_request(body, "resp_1")
        except ValueError:
            pass
        else:
            conversation(response)
            items = response.input if isinstance(response.input, list) else []
            given = [item for item in items if isinstance(item, dict)]
            _answered(partial(answers_of, given, asked))


@fuzz()
@given(body=request_bodies())
def test_dialect_requests_are_read_or_refused_with_the_documented_errors(body: Any) -> None:
    with captured_logs() as records:
        _read_as_every_dialect(body)
    assert_no_content(records)


# == 5. Regressions: what the fuzzing found =====================================================


def test_ws_decode_frame_refuses_data_nested_deeper_than_it_can_write() -> None:
    # orjson parses 1024 levels but writes 255: the frame parsed, then re-serialising its
    # data raised orjson's JSONEncodeError (a TypeError), which WebSocketSource does not
    # catch, so one such frame ended the whole stream.
    for depth in (255, 256, 1000):
        frame = '{"event":"x","data":' + "[" * depth + "]" * depth + "}"
        with pytest.raises(ValueError, match="nested too deeply"):
            decode_frame(frame)
    assert decode_frame('{"event":"x","data":' + "[" * 254 + "]" * 254 + "}").event == "x"


def test_reassembler_reads_a_tool_input_nested_deeper_than_orjson_writes() -> None:
    # A tool_use start whose input is nested 300 levels (valid JSON: orjson parses up to
    # 1024) made the reassembler raise orjson's JSONEncodeError at the block's stop, when
    # it wrote the input back out as the call's arguments.
    for depth, writable in ((300, True), (1000, False)):
        deep = "[" * depth + "]" * depth
        events = [
            payload_event({"type": "message_start", "message": {"id": "m"}}),
            Event(
                "content_block_start",
                b'{"type":"content_block_start","index":0,"content_block":'
                b'{"type":"tool_use","id":"t","name":"n","input":{"a":' + deep.encode() + b"}}}",
            ),
            payload_event({"type": "content_block_stop", "index": 0}),
            payload_event({"type": "message_stop"}),
        ]
        reassembler = Reassembler()
        for event in events:
            reassembler.feed(event)
        (call,) = reassembler.result().tool_calls
        if writable:
            assert call.params == {"a": json.loads(deep)}
            assert json.loads(call.arguments) == call.params
            assert call.parse_error is None
        else:
            # Past what the standard library writes too: no text, and the reason why.
            assert (call.arguments, call.params) == ("", None)
            assert call.parse_error == "the block's input is nested too deeply to write as JSON"


ANTHROPIC_START = {
    "type": "message_start",
    "message": {"id": "msg_1", "model": "claude-x", "usage": {"input_tokens": 1}},
}
ANTHROPIC_END = [
    {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {"output_tokens": 2},
    },
    {"type": "message_stop"},
]


def _anthropic_publish(events: list[Any], dialect: str) -> tuple[list[Event], Any, list[str]]:
    def run(publisher: Publisher, source: Any) -> Any:
        return anthropic_adapter.publish(publisher, source, stream_id="s_1")

    published, records, outcome = _publish(run, events, dialect, None)
    assert_no_content(records)
    assert check(published) == []
    return published, outcome, [r.getMessage() for r in warnings_of(records)]


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
@pytest.mark.parametrize("index", [MARKER, [MARKER], {"k": MARKER}, None, 1.5])
def test_anthropic_adapter_does_not_log_a_stop_index_that_is_not_an_integer(
    index: Any, dialect: str
) -> None:
    # A content_block_stop whose index was not an integer was logged with repr(index):
    # the provider's value, whatever it held, reached a WARNING.
    events = [
        ANTHROPIC_START,
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "a"}},
        {"type": "content_block_stop", "index": index},
        {"type": "content_block_stop", "index": 0},
        *ANTHROPIC_END,
    ]
    _, outcome, warned = _anthropic_publish(events, dialect)
    assert outcome.text == "a"
    shown = f"<{type(index).__name__}>" if not isinstance(index, str) else f"<{len(index)} chars>"
    assert warned == [
        f"skipping provider event #3 (content_block_stop): stop for block {shown}, "
        "but the open block is 0"
    ]


def _text_block(index: int, *parts: str) -> list[dict[str, Any]]:
    return [
        {"type": "content_block_start", "index": index, "content_block": {"type": "text"}},
        *(
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "text_delta", "text": p},
            }
            for p in parts
        ),
        {"type": "content_block_stop", "index": index},
    ]


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_anthropic_adapter_skips_values_orjson_cannot_write(dialect: str) -> None:
    # Values Python's json module reads but orjson will not write ended the turn: a
    # tool_use input nested 300 levels raised orjson's JSONEncodeError, a passed-through
    # block holding one raised SerializationError, and a text chunk with a lone surrogate
    # opened its block, could not fill it, and left it open empty, so every later event
    # was refused and the message ended in an error.
    tool = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"q": nested(300)}}
    other = {"type": "redacted_thinking", "data": nested(300)}
    events = [
        ANTHROPIC_START,
        *_text_block(0, MARKER + "\ud800"),
        *_text_block(1, "a"),
        {"type": "content_block_start", "index": 2, "content_block": other},
        {"type": "content_block_stop", "index": 2},
        {"type": "content_block_start", "index": 3, "content_block": tool},
        {"type": "content_block_stop", "index": 3},
        *ANTHROPIC_END,
    ]
    published, outcome, warned = _anthropic_publish(events, dialect)
    assert outcome.error is None
    assert (outcome.text, outcome.tool_calls) == ("a", [])
    assert published[-1].event == EventType.MESSAGE_STOP
    assert warned == [
        "skipping provider event #2 (content_block_delta): text_delta for block 0 holds a "
        "lone surrogate",
        "skipping provider event #7 (content_block_start): refused (SerializationError)",
        "skipping provider event #9 (content_block_start): tool_use block 3 has an input not "
        "writable as JSON",
    ]


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_anthropic_adapter_drops_a_count_past_64_bits(dialect: str) -> None:
    # A usage count past 64 bits made message_delta fail with SerializationError, which
    # ended the whole turn.
    events = [
        ANTHROPIC_START,
        *_text_block(0, "a"),
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 2**64, "cache_read_input_tokens": 3},
        },
        {"type": "message_stop"},
    ]
    published, outcome, _ = _anthropic_publish(events, dialect)
    assert outcome.text == "a"
    assert "output_tokens" not in outcome.usage
    if dialect == "essessey":
        # The dialect's own frame events carry the counts that fit.
        assert outcome.error is None
        assert outcome.usage["cache_read_input_tokens"] == 3
        assert published[-1].event == EventType.MESSAGE_STOP
    else:
        # The provider's payloads go out as they are: one that cannot be written is
        # skipped, and a stream left without its end says so in an error event.
        assert outcome.error is not None
        assert published[-1].event == EventType.ERROR


def _openai_chunk(delta: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"model": "gpt-x", "choices": [{"index": 0, "delta": delta}], **fields}


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_openai_adapter_skips_a_chunk_orjson_cannot_write(dialect: str) -> None:
    # A lone surrogate in the text (Python's json module makes one of a "\ud800" escape)
    # or a count past 64 bits was read as valid; publishing it then raised
    # SerializationError and ended the turn (for the count, at the epilogue, which left
    # the stream open with no error event).
    chunks = [
        _openai_chunk({"content": "a"}),
        _openai_chunk({"content": MARKER + "\ud800"}),
        _openai_chunk({"reasoning": "\udc00"}),
        {
            "model": "gpt-x",
            "choices": [{"index": 0, "delta": {"content": "b"}, "finish_reason": "stop"}],
        },
        {"choices": [], "usage": {"prompt_tokens": 2**64, "completion_tokens": 1}},
        {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2**63}},
    ]

    def run(publisher: Publisher, source: Any) -> Any:
        return openai_adapter.publish(publisher, source, message_id="m", stream_id="s")

    published, records, outcome = _publish(run, chunks, dialect, None)
    assert_no_content(records)
    assert check(published) == []
    assert published[-1].event == EventType.MESSAGE_STOP
    assert (outcome.text, outcome.thinking, outcome.usage) == ("ab", "", {})
    assert [r.getMessage() for r in warnings_of(records)] == [
        "skipping chat completion chunk 1: choices[0].delta.content holds a lone surrogate",
        "skipping chat completion chunk 2: choices[0].delta.reasoning holds a lone surrogate",
        "skipping chat completion chunk 4: usage.prompt_tokens does not fit in 64 bits",
        "skipping chat completion chunk 5: usage.completion_tokens does not fit in 64 bits",
    ]


class _FailsOnce:
    """A sink whose ``emit`` fails once, at the first event named ``name``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.failed = False
        self.events: list[Event] = []

    async def emit(self, event: Event) -> None:
        if event.event == self.name and not self.failed:
            self.failed = True
            raise ConnectionResetError("the connection dropped")
        self.events.append(event)


def test_openai_adapter_ends_the_stream_with_an_error_when_the_epilogue_fails() -> None:
    # The epilogue (message_delta, message_stop) went out after the try that turns a
    # failure into an error event: a failure there left the stream open, with neither
    # message_stop nor an error event, and clients waiting for its end.
    sink = _FailsOnce(EventType.MESSAGE_DELTA)
    chunks = [_openai_chunk({"content": "a"})]
    with pytest.raises(ConnectionResetError):
        asyncio.run(openai_adapter.publish(Publisher(sink), chunks, message_id="m", stream_id="s"))
    assert sink.events[-1].event == EventType.ERROR
    assert check(sink.events) == []


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_anthropic_adapter_publishes_a_provider_error_orjson_cannot_write(dialect: str) -> None:
    # A provider error event holding a lone surrogate (or, passed through in the anthropic
    # dialect, any value orjson cannot write) made publish() raise SerializationError,
    # where it promises to publish the error and return.
    error = {"type": "overloaded_error\ud800", "message": MARKER + "\udc00", "at": nested(300)}
    events = [ANTHROPIC_START, *_text_block(0, "a"), {"type": "error", "error": error}]
    events[-1]["request_id"] = "req_\ud800"
    published, outcome, _ = _anthropic_publish(events, dialect)
    assert outcome.error == {"type": "overloaded_error\ufffd", "message": MARKER + "\ufffd"}
    assert outcome.text == "a"
    assert orjson.loads(published[-1].data) == {"type": "error", "error": outcome.error}


def _responses(*events: dict[str, Any], status: str = "completed") -> list[dict[str, Any]]:
    response = {"id": "resp_1", "object": "response", "model": "gpt-x", "output": []}
    ended: dict[str, Any] = {**response, "status": status}
    if status == "incomplete":
        ended["incomplete_details"] = {"reason": "max_output_tokens"}
    return [
        {"type": "response.created", "response": response},
        *events,
        {"type": f"response.{status}", "response": ended},
    ]


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_responses_adapter_skips_a_citation_or_hosted_item_orjson_cannot_write(
    dialect: str,
) -> None:
    # An annotation or a hosted tool's item goes out whole (a citations_delta, a result
    # block's content): one holding a count past 64 bits, a lone surrogate or nesting
    # past what orjson writes was read as valid, and publishing it raised
    # SerializationError out of publish.
    deep: Any = MARKER
    for _ in range(254):
        deep = [deep]
    message = {"type": "message", "id": "m", "role": "assistant", "content": []}
    where = {"item_id": "m", "output_index": 0, "content_index": 0}
    citation = {"type": "url_citation", "url": MARKER, "start_index": 0}
    events = _responses(
        {"type": "response.output_item.added", "output_index": 0, "item": message},
        {"type": "response.output_text.delta", **where, "delta": "cited"},
        *(
            {"type": "response.output_text.annotation.added", **where, "annotation_index": n}
            | {"annotation": {**citation, "end_index": end}}
            for n, end in enumerate([2**64, MARKER + "\ud800", deep, 5])
        ),
        *(
            {"type": "response.output_item.done", "output_index": 1 + n}
            | {"item": {"type": "web_search_call", "id": f"ws_{n}", "action": action}}
            for n, action in enumerate([{"query": 2**64}, {"query": deep}, {"query": "q"}])
        ),
    )

    def run(publisher: Publisher, source: Any) -> Any:
        return responses_adapter.publish(publisher, source, message_id="m", stream_id="s")

    published, records, _ = _publish(run, events, dialect, None)
    assert_no_content(records)
    assert check(published) == []
    assert published[-1].event == EventType.MESSAGE_STOP
    parsed = reassemble_events(published)
    assert parsed.text == "cited"
    [citation_out] = parsed.messages[0].citations
    assert citation_out["end_index"] == 5
    starts = block_starts(published)
    assert [b["id"] for b in starts if b["type"] == "server_tool_use"] == ["ws_2"]
    skipped = [r.getMessage() for r in warnings_of(records)]
    assert len(skipped) == 5
    assert all("cannot be written as JSON" in line for line in skipped)


def test_responses_adapter_asks_for_an_mcp_approval_in_a_response_cut_short() -> None:
    # A response whose output ran out (incomplete) after an MCP approval request: the
    # message asked and ended with stop reason max_tokens, which the checker refuses (a
    # message that asks ends with tool_use), so publish raised ProtocolError.
    request = {"type": "mcp_approval_request", "id": "mcpr_1", "name": "lookup"}
    request["arguments"] = '{"q": 1}'
    events = _responses(
        {"type": "response.output_item.done", "output_index": 0, "item": request},
        status="incomplete",
    )

    def run(publisher: Publisher, source: Any) -> Any:
        return responses_adapter.publish(publisher, source, message_id="m", stream_id="s")

    published, _, outcome = _publish(run, events, "anthropic", None)
    assert check(published) == []
    parsed = reassemble_events(published)
    assert parsed.stop_reason == outcome.stop_reason == "tool_use"
    assert outcome.incomplete_reason == "max_output_tokens"
    assert [r.id for r in parsed.pending] == ["mcpr_1"]


@pytest.mark.parametrize("dialect", sorted(DIALECT_ENCODERS))
def test_dialect_encoders_skip_a_payload_whose_object_is_another_value(dialect: str) -> None:
    # A block start whose content_block, a delta whose delta, or a message_delta whose
    # delta was null or a number reached the hooks, which read it as an object: the UI
    # encoder's AttributeError ended the response.
    def event(name: str, **fields: Any) -> Event:
        return Event(name, orjson.dumps({"type": name, **fields}))

    events = [
        event("message_start", message={"id": "m", "model": "m", "usage": {}}),
        event("content_block_start", index=0, content_block=None),
        event("content_block_start", index=0, content_block={"type": "text"}),
        event("content_block_delta", index=0, delta=5),
        event("content_block_delta", index=0, delta={"type": "text_delta", "text": "hi"}),
        event("content_block_stop", index=0),
        event("message_delta", delta=None, usage={"output_tokens": 1}),
        event("message_stop"),
    ]
    encoder = DIALECT_ENCODERS[dialect]()
    with captured_logs() as records:
        written = b"".join(encoder.encode(e) for e in events) + encoder.finish()
    assert b"hi" in written
    skipped = [r.getMessage() for r in warnings_of(records)]
    assert skipped[:2] == [
        "skipped a content_block_start event: TypeError",
        "skipped a content_block_delta event: TypeError",
    ]
