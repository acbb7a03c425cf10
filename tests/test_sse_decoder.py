"""The SSE decoder against the WHATWG "interpreting an event stream" rules.

Every table case is decoded whole, one byte at a time, split at every position, and
(for short inputs) split at every pair of positions: the chunking must never change the
messages, the last event id or the retry value.
"""

from __future__ import annotations

import re
import sys
import tracemalloc
from collections.abc import Iterator, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from essessey import Event
from essessey.bindings.sse import SSEDecoder, SSEMessage, encode, encode_many, format_message
from essessey.errors import SSEDecodeError

FIXTURES = Path(__file__).parent / "fixtures"
BOM = b"\xef\xbb\xbf"

Outcome = tuple[list[SSEMessage], str, int | None]


def M(data: str, event: str = "message", id: str = "") -> SSEMessage:
    """A message as the decoder should dispatch it (argument order: data first)."""
    return SSEMessage(event, data, id)


def chunkings(raw: bytes) -> Iterator[list[bytes]]:
    """Every way of feeding ``raw`` the tests try: whole, byte by byte, every cut, and
    every pair of cuts for short inputs (empty chunks included at the ends)."""
    yield [raw]
    yield [raw[i : i + 1] for i in range(len(raw))]
    yield [b"", *(raw[i : i + 1] for i in range(len(raw))), b""]
    for i in range(len(raw) + 1):
        yield [raw[:i], raw[i:]]
    if len(raw) <= 48:
        for i in range(1, len(raw)):
            for j in range(i + 1, len(raw)):
                yield [raw[:i], raw[i:j], raw[j:]]


def decode(chunks: Sequence[bytes], last_event_id: str = "", **limits: int) -> Outcome:
    """Feed ``chunks`` to a fresh decoder, close it, and return what it produced."""
    decoder = SSEDecoder(last_event_id, **limits)
    messages: list[SSEMessage] = []
    for chunk in chunks:
        messages.extend(decoder.feed(chunk))
    messages.extend(decoder.close())
    return messages, decoder.last_event_id, decoder.retry


def assert_decodes(
    raw: bytes,
    messages: list[SSEMessage],
    last_event_id: str = "",
    retry: int | None = None,
    *,
    start_id: str = "",
    **limits: int,
) -> None:
    """``raw`` decodes to exactly this outcome however it is split into chunks."""
    expected = (messages, last_event_id, retry)
    for chunks in chunkings(raw):
        assert decode(chunks, start_id, **limits) == expected, chunks


def assert_raises_at_every_split(raw: bytes, **limits: int) -> None:
    """Decoding ``raw`` raises SSEDecodeError, from ``feed``, however it is split."""
    for chunks in chunkings(raw):
        # The error must come from feed, before the end of the stream: a limit
        # protects memory while the bytes arrive, not after.
        with pytest.raises(SSEDecodeError):
            _feed_all(SSEDecoder("", **limits), chunks)


def _feed_all(decoder: SSEDecoder, chunks: Sequence[bytes]) -> None:
    for chunk in chunks:
        decoder.feed(chunk)


# (case name, stream bytes, messages, last event id, retry)
CASES: list[tuple[str, bytes, list[SSEMessage], str, int | None]] = [
    # --- the byte order mark
    ("bom stripped", BOM + b"data: a\n\n", [M("a")], "", None),
    ("bom alone", BOM, [], "", None),
    ("bom then blank line", BOM + b"\ndata: a\n\n", [M("a")], "", None),
    ("bom then comment", BOM + b": hi\ndata: a\n\n", [M("a")], "", None),
    # Only one BOM is stripped: a second one starts the field name "\ufeffdata".
    ("second bom is text", BOM + BOM + b"data: a\n\ndata: b\n\n", [M("b")], "", None),
    ("bom after a line is text", b"\n" + BOM + b"data: a\n\ndata: b\n\n", [M("b")], "", None),
    ("bom inside data kept", b"data: " + BOM + b"a\n\n", [M("\ufeffa")], "", None),
    ("bom as whole data kept", b"data:" + BOM + b"\n\n", [M("\ufeff")], "", None),
    ("half a bom is not a bom", b"\xef\xbbdata: a\n\ndata: b\n\n", [M("b")], "", None),
    ("bom without a line", BOM + b"data: a", [], "", None),
    # --- line ends
    ("lf", b"data: a\n\n", [M("a")], "", None),
    ("crlf", b"data: a\r\n\r\n", [M("a")], "", None),
    ("cr", b"data: a\r\r", [M("a")], "", None),
    ("lf cr", b"data: a\n\r", [M("a")], "", None),
    ("cr crlf", b"data: a\r\r\n", [M("a")], "", None),
    ("crlf lf", b"data: a\r\n\n", [M("a")], "", None),
    ("lf crlf", b"data: a\n\r\n", [M("a")], "", None),
    ("cr lf is one line end", b"data: a\r\ndata: b\r\n\r\n", [M("a\nb")], "", None),
    ("lf cr is two line ends", b"data: a\n\rdata: b\n\n", [M("a"), M("b")], "", None),
    ("cr cr lf lf", b"data: a\r\r\n\ndata: b\n\n", [M("a"), M("b")], "", None),
    (
        "mixed line ends in one event",
        b"data: a\rdata: b\r\ndata: c\ndata: d\r\r\n",
        [M("a\nb\nc\nd")],
        "",
        None,
    ),
    (
        "mixed line ends between events",
        b"data: a\r\rdata: b\r\n\r\ndata: c\n\n",
        [M("a"), M("b"), M("c")],
        "",
        None,
    ),
    ("many blank lines", b"\n\r\n\r\n\rdata: a\n\n\n\r\ndata: b\n\n", [M("a"), M("b")], "", None),
    (
        "unicode separators are not line ends",
        "data: a\u2028b\u2029c\x85d\x0ce\x0bf\x1cg\x1dh\x1ei\n\n".encode(),
        [M("a\u2028b\u2029c\x85d\x0ce\x0bf\x1cg\x1dh\x1ei")],
        "",
        None,
    ),
    (
        "u+2028 does not split a field",
        "data: a\u2028data: b\n\n".encode(),
        [M("a\u2028data: b")],
        "",
        None,
    ),
    ("nul kept in data", b"data: a\x00b\n\n", [M("a\x00b")], "", None),
    # --- comments
    ("comment ignored", b": hello\ndata: a\n\n", [M("a")], "", None),
    ("bare colon comment", b":\ndata: a\n\n", [M("a")], "", None),
    ("comment between data lines", b"data: a\n: x\ndata: b\n\n", [M("a\nb")], "", None),
    ("comment alone dispatches nothing", b": only a comment\n\n", [], "", None),
    ("comment looking like a field", b":data: x\n:id: 9\n:retry: 5\n\n", [], "", None),
    ("comment cannot hold a line end", b": x\rdata: a\n\n", [M("a")], "", None),
    # --- fields
    ("field without colon", b"data\n\n", [M("")], "", None),
    ("two bare data lines", b"data\ndata\n\n", [M("\n")], "", None),
    ("no space after colon", b"data:a\n\n", [M("a")], "", None),
    ("one space after colon dropped", b"data: a\n\n", [M("a")], "", None),
    ("second space kept", b"data:  a\n\n", [M(" a")], "", None),
    ("trailing spaces kept", b"data: a  \n\n", [M("a  ")], "", None),
    ("tab after colon kept", b"data:\ta\n\n", [M("\ta")], "", None),
    ("value splits at first colon", b"data: a: b:c\n\n", [M("a: b:c")], "", None),
    ("space before colon is part of name", b"data : a\n\n", [], "", None),
    ("field names are case-sensitive", b"Data: a\nDATA: b\n\n", [], "", None),
    ("leading space in name", b" data: a\n\n", [], "", None),
    ("unknown field ignored", b"foo: bar\ndata: a\nbaz\n\n", [M("a")], "", None),
    ("unknown field alone", b"foo: bar\n\n", [], "", None),
    ("multi-line data", b"data: a\ndata: b\ndata: c\n\n", [M("a\nb\nc")], "", None),
    ("empty data line in the middle", b"data: a\ndata:\ndata: b\n\n", [M("a\n\nb")], "", None),
    ("empty data line alone", b"data:\n\n", [M("")], "", None),
    ("data with only a space", b"data: \n\n", [M("")], "", None),
    ("only one trailing lf removed", b"data: a\ndata:\n\n", [M("a\n")], "", None),
    ("two empty data lines", b"data:\ndata:\n\n", [M("\n")], "", None),
    ("non-ascii data", "data: é😀€ü\n\n".encode(), [M("é😀€ü")], "", None),
    # --- event type
    ("event type", b"event: add\ndata: 1\n\n", [M("1", "add")], "", None),
    ("event type after data", b"data: 1\nevent: add\n\n", [M("1", "add")], "", None),
    ("last event field wins", b"event: a\nevent: b\ndata: 1\n\n", [M("1", "b")], "", None),
    ("empty event type is message", b"event:\ndata: 1\n\n", [M("1")], "", None),
    ("bare event is message", b"event\ndata: 1\n\n", [M("1")], "", None),
    ("event type keeps a second space", b"event:  x\ndata: 1\n\n", [M("1", " x")], "", None),
    ("non-ascii event type", "event: été\ndata: 1\n\n".encode(), [M("1", "été")], "", None),
    (
        "event type resets after dispatch",
        b"event: add\ndata: 1\n\ndata: 2\n\n",
        [M("1", "add"), M("2")],
        "",
        None,
    ),
    ("event without data not dispatched", b"event: add\n\n", [], "", None),
    (
        "event type resets even when nothing is dispatched",
        b"event: add\n\ndata: 1\n\n",
        [M("1")],
        "",
        None,
    ),
    # --- id
    ("id", b"id: 1\ndata: a\n\n", [M("a", id="1")], "1", None),
    ("id after data in the same event", b"data: a\nid: 1\n\n", [M("a", id="1")], "1", None),
    ("id persists", b"id: 1\ndata: a\n\ndata: b\n\n", [M("a", id="1"), M("b", id="1")], "1", None),
    (
        "id changes",
        b"id: 1\ndata: a\n\nid: 2\ndata: b\n\n",
        [M("a", id="1"), M("b", id="2")],
        "2",
        None,
    ),
    (
        "id with nul ignored",
        b"id: 1\ndata: a\n\nid: 2\x003\ndata: b\n\n",
        [M("a", id="1"), M("b", id="1")],
        "1",
        None,
    ),
    ("id with only nul ignored", b"id: 1\nid: \x00\ndata: a\n\n", [M("a", id="1")], "1", None),
    (
        "bare id resets",
        b"id: 1\ndata: a\n\nid\ndata: b\n\n",
        [M("a", id="1"), M("b")],
        "",
        None,
    ),
    ("empty id resets", b"id: 1\ndata: a\n\nid:\ndata: b\n\n", [M("a", id="1"), M("b")], "", None),
    ("id of one space resets", b"id: 1\n\nid: \ndata: b\n\n", [M("b")], "", None),
    ("id without data sets last id", b"id: 7\n\n", [], "7", None),
    (
        "id without data applies to later events",
        b"id: 7\n\ndata: a\n\n",
        [M("a", id="7")],
        "7",
        None,
    ),
    ("id keeps a second space", b"id:  x \ndata: a\n\n", [M("a", id=" x ")], " x ", None),
    ("id may hold a colon", b"id: a:b\ndata: a\n\n", [M("a", id="a:b")], "a:b", None),
    ("non-ascii id", "id: ü-1\ndata: a\n\n".encode(), [M("a", id="ü-1")], "ü-1", None),
    ("last id field wins", b"id: 1\nid: 2\ndata: a\n\n", [M("a", id="2")], "2", None),
    (
        "id of an unterminated event never takes effect",
        b"id: 1\ndata: a\n\nid: 2\ndata: b\n",
        [M("a", id="1")],
        "1",
        None,
    ),
    # --- retry
    ("retry", b"retry: 1500\n", [], "", 1500),
    ("retry without space", b"retry:1500\n", [], "", 1500),
    ("retry zero", b"retry: 0\n", [], "", 0),
    ("retry leading zeros", b"retry: 007\n", [], "", 7),
    ("retry does not dispatch", b"retry: 10\n\n", [], "", 10),
    ("retry with data", b"retry: 10\ndata: a\n\n", [M("a")], "", 10),
    ("retry latest wins", b"retry: 10\nretry: 20\n", [], "", 20),
    ("retry not digits", b"retry: 10a\n", [], "", None),
    ("retry negative", b"retry: -1\n", [], "", None),
    ("retry plus sign", b"retry: +1\n", [], "", None),
    ("retry extra space", b"retry:  5\n", [], "", None),
    ("retry trailing space", b"retry: 5 \n", [], "", None),
    ("retry empty", b"retry:\n", [], "", None),
    ("retry bare", b"retry\n", [], "", None),
    ("retry decimal", b"retry: 1.5\n", [], "", None),
    ("retry underscore", b"retry: 1_000\n", [], "", None),
    ("retry superscript digit", "retry: ²\n".encode(), [], "", None),
    ("retry fullwidth digit", "retry: \uff15\n".encode(), [], "", None),
    ("retry arabic-indic digit", "retry: ٣\n".encode(), [], "", None),
    ("invalid retry keeps the previous", b"retry: 10\nretry: x\nretry:\n", [], "", 10),
    ("retry in an unterminated event still applies", b"retry: 10\ndata: a\n", [], "", 10),
    ("retry on an unterminated line is not read", b"retry: 10", [], "", None),
    # --- end of stream
    ("unterminated event discarded", b"data: a\n\ndata: b\n", [M("a")], "", None),
    ("unterminated line discarded", b"data: a\n\ndata: b", [M("a")], "", None),
    ("only an unterminated line", b"data: a", [], "", None),
    ("event ended by a cr line only", b"data: a\r", [], "", None),
    ("empty stream", b"", [], "", None),
    # --- UTF-8
    ("invalid byte replaced", b"data: a\xffb\n\n", [M("a\ufffdb")], "", None),
    ("truncated sequence before line end", b"data: \xe2\x82\n\n", [M("\ufffd")], "", None),
    ("truncated sequence at colon", b"data\xe2\x82: a\ndata: b\n\n", [M("b")], "", None),
    ("encoded surrogate replaced", b"data: \xed\xa0\x80\n\n", [M("\ufffd" * 3)], "", None),
    ("overlong encoding replaced", b"data: \xc0\xaf\n\n", [M("\ufffd\ufffd")], "", None),
    ("invalid bytes in event type", b"event: x\xff\ndata: a\n\n", [M("a", "x\ufffd")], "", None),
    ("invalid bytes in id", b"id: 1\xff\ndata: a\n\n", [M("a", id="1\ufffd")], "1\ufffd", None),
    ("four-byte characters", "data: 😀😀\n\n".encode(), [M("😀😀")], "", None),
    # --- the standard's own examples
    (
        "spec: three data lines",
        b"data: YHOO\ndata: +2\ndata: 10\n\n",
        [M("YHOO\n+2\n10")],
        "",
        None,
    ),
    (
        "spec: four blocks",
        b": test stream\n\ndata: first event\nid: 1\n\ndata:second event\nid\n\n"
        b"data:  third event\n\n",
        [M("first event", id="1"), M("second event"), M(" third event")],
        "",
        None,
    ),
    ("spec: data blocks", b"data\n\ndata\ndata\n\ndata:", [M(""), M("\n")], "", None),
    ("spec: space optional", b"data:test\n\ndata: test\n\n", [M("test"), M("test")], "", None),
]


@pytest.mark.parametrize(
    ("raw", "messages", "last_event_id", "retry"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_stream_decodes_the_same_at_every_split(
    raw: bytes, messages: list[SSEMessage], last_event_id: str, retry: int | None
) -> None:
    assert_decodes(raw, messages, last_event_id, retry)


# --- chunk boundaries, observed call by call


def test_cr_at_the_end_of_a_chunk_ends_the_line_at_once() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"\r") == [M("a")]


def test_lf_after_a_cr_that_ended_a_chunk_is_swallowed() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"\n") == []  # the rest of a CRLF, not a blank line
    assert decoder.feed(b"\n") == [M("a")]


def test_only_one_lf_is_swallowed_after_a_chunk_final_cr() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"\n\n") == [M("a")]


def test_empty_chunks_do_not_end_a_pending_crlf() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"") == []
    assert decoder.feed(b"\n") == []
    assert decoder.feed(b"\n") == [M("a")]


def test_a_blank_line_dispatches_without_waiting_for_more() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\n") == []
    assert decoder.feed(b"\n") == [M("a")]
    assert decoder.feed(b"data: b\n\nda") == [M("b")]


def test_a_bom_split_across_chunks_is_stripped() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"\xef") == []
    assert decoder.feed(b"\xbb") == []
    assert decoder.feed(b"\xbfdata: a\n\n") == [M("a")]


def test_a_character_split_across_chunks_decodes_whole() -> None:
    raw = "data: 😀\n\n".encode()
    decoder = SSEDecoder()
    messages: list[SSEMessage] = []
    for byte in raw:
        messages.extend(decoder.feed(bytes([byte])))
    assert messages == [M("😀")]


def test_bytearray_and_memoryview_chunks_are_accepted() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(bytearray(b"event: x\ndata: a")) == []
    assert decoder.feed(memoryview(b"\n\n")) == [M("a", "x")]


# --- ids and the starting point


def test_the_starting_last_event_id_is_carried() -> None:
    assert_decodes(b"data: a\n\n", [M("a", id="5")], "5", start_id="5")


def test_the_starting_last_event_id_is_replaced_by_the_stream() -> None:
    assert_decodes(
        b"data: a\n\nid: 6\ndata: b\n\n", [M("a", id="5"), M("b", id="6")], "6", start_id="5"
    )


def test_the_starting_last_event_id_can_be_reset_by_the_stream() -> None:
    assert_decodes(b"id\n\ndata: a\n\n", [M("a")], "", start_id="5")


def test_the_starting_last_event_id_survives_an_unterminated_event() -> None:
    assert_decodes(b"id: 6\ndata: a\n", [], "5", start_id="5")


def test_last_event_id_is_updated_at_the_blank_line() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"id: 1\ndata: a\n") == []
    assert decoder.last_event_id == ""
    assert decoder.feed(b"\n") == [M("a", id="1")]
    assert decoder.last_event_id == "1"


@pytest.mark.parametrize("bad", ["a\x00", "a\r", "a\n", "\n"])
def test_a_starting_id_no_stream_could_set_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="CR, LF or NUL"):
        SSEDecoder(bad)


# --- retry


def test_retry_applies_as_soon_as_its_line_ends() -> None:
    decoder = SSEDecoder()
    assert decoder.retry is None
    decoder.feed(b"retry: 250\n")
    assert decoder.retry == 250


def test_a_retry_with_more_digits_than_python_parses_is_ignored() -> None:
    limit = sys.get_int_max_str_digits()
    if limit == 0:
        pytest.skip("the interpreter parses integers of any length")
    raw = b"retry: 10\nretry: " + b"9" * (limit + 1) + b"\n"
    assert decode([raw]) == ([], "", 10)


def test_a_long_retry_of_leading_zeros_is_read() -> None:
    assert decode([b"retry: " + b"0" * 10_000 + b"42\n"]) == ([], "", 42)


# --- limits


def test_a_line_at_the_limit_is_accepted() -> None:
    # "data: 0123" is 10 bytes; the line end does not count.
    assert_decodes(b"data: 0123\r\n\r\n", [M("0123")], max_line_length=10)


def test_a_line_over_the_limit_raises() -> None:
    assert_raises_at_every_split(b"data: 01234\n\n", max_line_length=10)


def test_a_comment_over_the_limit_raises() -> None:
    assert_raises_at_every_split(b": 0123456789\n", max_line_length=10)


def test_a_line_that_never_ends_raises_as_its_bytes_arrive() -> None:
    assert_raises_at_every_split(b"x" * 11, max_line_length=10)
    decoder = SSEDecoder(max_line_length=10)
    for _ in range(10):
        assert decoder.feed(b"x") == []
    with pytest.raises(SSEDecodeError, match="max_line_length"):
        decoder.feed(b"x")


def test_a_long_line_after_short_lines_in_one_chunk_raises() -> None:
    decoder = SSEDecoder(max_line_length=10)
    with pytest.raises(SSEDecodeError, match=r"max_line_length \(10 bytes\)"):
        decoder.feed(b"data: a\n\n" + b"data: " + b"x" * 100 + b"\n\n")


def test_the_line_limit_counts_bytes() -> None:
    # Eight characters, ten bytes.
    assert_raises_at_every_split("data: éé\n\n".encode(), max_line_length=9)
    assert_decodes("data: éé\n\n".encode(), [M("éé")], max_line_length=10)


def test_an_event_at_the_size_limit_is_accepted() -> None:
    # The data buffer is "12345\n123\n": ten bytes.
    assert_decodes(b"data: 12345\ndata: 123\n\n", [M("12345\n123")], max_event_size=10)


def test_an_event_over_the_size_limit_raises() -> None:
    assert_raises_at_every_split(b"data: 12345\ndata: 1234\n\n", max_event_size=10)
    decoder = SSEDecoder(max_event_size=10)
    with pytest.raises(SSEDecodeError, match=r"max_event_size \(10 bytes\)"):
        decoder.feed(b"data: 12345\ndata: 1234\n")  # raised before the blank line


@pytest.mark.parametrize("lines", [63, 64, 65, 129, 200])
def test_an_event_of_many_data_lines_decodes_the_same_at_every_split(lines: int) -> None:
    values = [f"v{i}" for i in range(lines)]
    raw = b"".join(b"data: %s\n" % value.encode() for value in values) + b"\ndata: next\n\n"
    assert_decodes(raw, [M("\n".join(values)), M("next")])
    assert_decodes(b"data\n" * lines + b"\n", [M("\n" * (lines - 1))])


def test_many_short_data_lines_cost_about_their_bytes() -> None:
    # Each line held as an object of its own would cost about 40 bytes more than its
    # three: the event's limit bounds what the decoder holds, not only what it counts.
    limit = 1 << 20
    decoder = SSEDecoder(max_event_size=limit)
    chunk = b"data:ab\n" * 8192

    def feed_past_the_limit() -> None:
        for _ in range(limit // len(chunk) * 4):
            decoder.feed(chunk)

    tracemalloc.start()
    try:
        with pytest.raises(SSEDecodeError, match="max_event_size"):
            feed_past_the_limit()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * limit, peak


def test_the_event_size_limit_is_per_event() -> None:
    raw = b"data: 12345678\n\n" * 5
    assert_decodes(raw, [M("12345678")] * 5, max_event_size=10)


def test_a_decoder_that_failed_keeps_failing() -> None:
    decoder = SSEDecoder(max_line_length=4)
    with pytest.raises(SSEDecodeError):
        decoder.feed(b"data: a\n")
    with pytest.raises(SSEDecodeError, match="stopped earlier"):
        decoder.feed(b"\n")


@pytest.mark.parametrize("limit", [0, -1])
@pytest.mark.parametrize("name", ["max_line_length", "max_event_size"])
def test_a_limit_must_be_positive(name: str, limit: int) -> None:
    options: dict[str, Any] = {name: limit}
    with pytest.raises(ValueError, match=name):
        SSEDecoder(**options)


def test_the_default_limits_allow_a_large_one_line_event() -> None:
    data = "x" * (4 << 20)
    assert decode([f"data: {data}\n\n".encode()]) == ([M(data)], "", None)


# --- the end of the stream


def test_close_returns_nothing_and_feed_after_close_raises() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\n\ndata: b\n") == [M("a")]
    assert decoder.close() == []
    assert decoder.close() == []
    with pytest.raises(ValueError, match="after close"):
        decoder.feed(b"\n")
    with pytest.raises(ValueError, match="after close"):
        decoder.feed(b"")


# --- the message type


def test_a_message_is_immutable_and_has_no_dict() -> None:
    message = M("a", "x", "1")
    assert (message.event, message.data, message.id) == ("x", "a", "1")
    with pytest.raises(AttributeError):
        message.data = "b"  # type: ignore[misc]
    assert not hasattr(message, "__dict__")


# --- the writer's output, and the fixtures


@pytest.mark.parametrize(
    "name", ["seed000_messages.sse", "seed002_text.sse", "seed002_tool.sse", "seed004_turn.sse"]
)
def test_fixture_transcripts_decode_into_their_frames(name: str) -> None:
    raw = (FIXTURES / name).read_bytes()
    expected = []
    # What follows the last blank line never ended (some of the seed transcripts stop
    # right after their last data line) and must be discarded.
    *frames, _unterminated = raw.decode().split("\n\n")
    for frame in frames:
        if not frame.strip("\n"):
            continue
        fields = dict(line.split(": ", 1) for line in frame.strip("\n").split("\n"))
        expected.append(M(fields["data"], fields["event"]))
    assert len(expected) >= 3
    for chunks in ([raw], [raw[i : i + 7] for i in range(0, len(raw), 7)]):
        assert decode(chunks) == (expected, "", None)


# --- properties

# Any character but a lone surrogate (which UTF-8 cannot carry), with line ends and the
# characters that look like them over-represented.
CHARACTERS = st.characters(exclude_categories=["Cs"])
TRICKY = st.sampled_from(
    ["\r", "\n", "\r\n", "\n\r", "\u2028", "\x85", "\x0c", "\x0b", "\ufeff", ":", " ", "\x00"]
)
TEXT = st.lists(st.one_of(st.text(CHARACTERS, max_size=6), TRICKY), max_size=6).map("".join)
TOKEN = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\r\n\x00"), max_size=8)
LINE_BREAKS = re.compile(r"\r\n|\r|\n")


@st.composite
def writer_items(draw: st.DrawFn) -> tuple[bytes, SSEMessage | None, str | None, int | None]:
    """One piece of a stream as the writer frames it, and what a reader must see: the
    message (its id is filled in later, as ids persist), the id set, the retry set."""
    if draw(st.booleans()):
        text = draw(TEXT)
        event = Event(draw(TOKEN), text.encode(), draw(st.none() | TOKEN))
        # The reader reads every line end as LF; encode writes no id line for "".
        message = SSEMessage(event.event or "message", LINE_BREAKS.sub("\n", text), "")
        return encode(event), message, event.id or None, None
    data = draw(st.none() | TEXT)
    name = draw(st.none() | TOKEN)
    event_id = draw(st.none() | TOKEN)
    retry = draw(st.none() | st.integers(min_value=0, max_value=10**12))
    comment = draw(st.none() | TEXT)
    if (data, name, event_id, retry, comment) == (None, None, None, None, None):
        comment = ""
    raw = format_message(data=data, event=name, id=event_id, retry=retry, comment=comment)
    if data is None:
        return raw, None, event_id, retry
    return raw, SSEMessage(name or "message", LINE_BREAKS.sub("\n", data), ""), event_id, retry


@st.composite
def cuts(draw: st.DrawFn, raw: bytes) -> list[bytes]:
    """``raw`` cut at random positions."""
    points = sorted(draw(st.lists(st.integers(0, len(raw)), max_size=12)))
    edges = [0, *points, len(raw)]
    return [raw[a:b] for a, b in pairwise(edges)]


@settings(max_examples=200, deadline=None)
@given(items=st.lists(writer_items(), max_size=8), bom=st.booleans(), data=st.data())
def test_whatever_the_writer_frames_decodes_back_exactly(
    items: list[tuple[bytes, SSEMessage | None, str | None, int | None]],
    bom: bool,
    data: st.DataObject,
) -> None:
    raw = (BOM if bom else b"") + b"".join(item[0] for item in items)
    expected: list[SSEMessage] = []
    last_id = ""
    retry: int | None = None
    for _, message, new_id, new_retry in items:
        if new_id is not None:
            last_id = new_id
        if new_retry is not None:
            retry = new_retry
        if message is not None:
            expected.append(message._replace(id=last_id))
    assert decode(data.draw(cuts(raw))) == (expected, last_id, retry)


def reference_decode(raw: bytes) -> Outcome:
    """The standard's algorithm, written as plainly as it reads: decode first, then
    walk the characters. Slow, and independent of the decoder's byte-level design."""
    text = raw.decode("utf-8", "replace").removeprefix("\ufeff")
    lines: list[str] = []
    current: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char in "\r\n":
            lines.append("".join(current))
            current = []
            if char == "\r" and text[i + 1 : i + 2] == "\n":
                i += 1
        else:
            current.append(char)
        i += 1
    # What is left in ``current`` never ended: the end of the stream discards it.
    messages: list[SSEMessage] = []
    data, event_type, id_buffer, last_id = "", "", "", ""
    retry: int | None = None
    for line in lines:
        if line == "":
            last_id = id_buffer
            if data == "":
                event_type = ""
                continue
            messages.append(SSEMessage(event_type or "message", data.removesuffix("\n"), last_id))
            data, event_type = "", ""
            continue
        if line.startswith(":"):
            continue
        if ":" in line:
            field, value = line.split(":", 1)
            value = value.removeprefix(" ")
        else:
            field, value = line, ""
        if field == "event":
            event_type = value
        elif field == "data":
            data += value + "\n"
        elif field == "id":
            if "\x00" not in value:
                id_buffer = value
        elif field == "retry" and value and all(c in "0123456789" for c in value):
            retry = int(value)
    return messages, last_id, retry


def limit_hit(raw: bytes, max_line: int, max_event: int) -> bool:
    """Whether ``raw`` has a line (complete or not) longer than ``max_line`` bytes, or
    an event whose data buffer passes ``max_event`` bytes."""
    if BOM.startswith(raw):
        return False  # a BOM, or what could still have become one: not a line
    pieces = re.split(rb"\r\n|\r|\n", raw.removeprefix(BOM))
    if any(len(piece) > max_line for piece in pieces):
        return True
    size = 0
    for line in pieces[:-1]:  # the last piece never ended, so it is never processed
        field, _, value = line.partition(b":")
        if not line:
            size = 0
        elif field == b"data":
            size += len(value.removeprefix(b" ")) + 1
            if size > max_event:
                return True
    return False


# Bytes biased towards what matters: line ends, field names, colons, spaces, BOM bytes,
# NUL, digits and broken UTF-8.
SOUP_PIECES = st.sampled_from(
    [
        b"\r", b"\n", b"\r\n", b":", b" ", b"data", b"event", b"id", b"retry", b"\x00",
        b"\xef", b"\xbb", b"\xbf", BOM, b"\xe2\x82", b"\xff", b"7", b"42", b"x", "é".encode(),
    ]
)  # fmt: skip
SOUP = st.lists(st.one_of(SOUP_PIECES, st.binary(max_size=4)), max_size=40).map(b"".join)


@settings(max_examples=200, deadline=None)
@given(raw=SOUP, data=st.data())
def test_byte_soup_decodes_like_the_reference_at_any_split(raw: bytes, data: st.DataObject) -> None:
    expected = reference_decode(raw)
    assert decode([raw]) == expected
    assert decode(data.draw(cuts(raw))) == expected
    assert decode([raw[i : i + 1] for i in range(len(raw))]) == expected


@settings(max_examples=200, deadline=None)
@given(
    raw=st.one_of(SOUP, st.binary(max_size=200)),
    max_line=st.integers(1, 24),
    max_event=st.integers(1, 24),
    data=st.data(),
)
def test_byte_soup_with_small_limits_only_ever_raises_a_decode_error(
    raw: bytes, max_line: int, max_event: int, data: st.DataObject
) -> None:
    limits = {"max_line_length": max_line, "max_event_size": max_event}
    outcomes: list[Outcome | None] = []
    for chunks in ([raw], data.draw(cuts(raw)), [raw[i : i + 1] for i in range(len(raw))]):
        try:
            outcomes.append(decode(chunks, "", **limits))
        except SSEDecodeError:
            outcomes.append(None)
    expected = None if limit_hit(raw, max_line, max_event) else reference_decode(raw)
    assert outcomes == [expected] * 3


def test_encode_many_output_decodes_to_the_events() -> None:
    events = [
        Event("content_block_delta", b'{"a":1}', "1"),
        Event("ping", b"{}"),
        Event("x", b"line one\nline two\r\nline three\r", "3"),
    ]
    raw = encode_many(events)
    expected = [
        M('{"a":1}', "content_block_delta", "1"),
        M("{}", "ping", "1"),
        M("line one\nline two\nline three\n", "x", "3"),
    ]
    assert_decodes(raw, expected, "3")
