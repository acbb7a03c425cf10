"""The SSE writer: ``format_message``, ``encode`` and ``encode_many`` follow the WHATWG
event stream format, and what they write reads back as what they were given."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from essessey import Event
from essessey.bindings.sse import SSEDecoder, SSEMessage, encode, encode_many, format_message

SEED_TURN = Path(__file__).parent / "fixtures" / "seed004_turn.sse"


def read_back(raw: bytes) -> list[SSEMessage]:
    """Decode ``raw`` as a browser would, one byte at a time."""
    decoder = SSEDecoder()
    messages: list[SSEMessage] = []
    for i in range(len(raw)):
        messages.extend(decoder.feed(raw[i : i + 1]))
    messages.extend(decoder.close())
    return messages


# --- data lines


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ("a", b"data: a\n\n"),
        ("a\nb", b"data: a\ndata: b\n\n"),
        ("a\rb", b"data: a\ndata: b\n\n"),
        ("a\r\nb", b"data: a\ndata: b\n\n"),
        ("a\n\rb", b"data: a\ndata:\ndata: b\n\n"),
        ("a\r\rb", b"data: a\ndata:\ndata: b\n\n"),
        ("a\nb\rc\r\nd", b"data: a\ndata: b\ndata: c\ndata: d\n\n"),
        ("", b"data:\n\n"),
        ("a\n", b"data: a\ndata:\n\n"),
        ("\n", b"data:\ndata:\n\n"),
        ("a\n\nb", b"data: a\ndata:\ndata: b\n\n"),
        (" a", b"data:  a\n\n"),
        ("  a ", b"data:   a \n\n"),
        ("a: b", b"data: a: b\n\n"),
        ("a\u2028b\x85c\x0cd", "data: a\u2028b\x85c\x0cd\n\n".encode()),
        ("é😀", "data: é😀\n\n".encode()),
    ],
)
def test_every_line_of_data_gets_its_own_data_line(data: str, expected: bytes) -> None:
    assert format_message(data=data) == expected


@pytest.mark.parametrize("data", ["a\n", "\n", "\n\n", " a", "  ", "x\ny\n\nz", "", "a:b", "\x00"])
def test_data_reads_back_exactly(data: str) -> None:
    assert read_back(format_message(data=data)) == [SSEMessage("message", data, "")]


def test_cr_and_crlf_in_data_read_back_as_lf() -> None:
    assert read_back(format_message(data="a\rb\r\nc")) == [SSEMessage("message", "a\nb\nc", "")]


# --- comments


@pytest.mark.parametrize(
    ("comment", "expected"),
    [
        ("keep-alive", b": keep-alive\n\n"),
        ("", b":\n\n"),
        ("a\nb", b": a\n: b\n\n"),
        ("a\rb\r\nc", b": a\n: b\n: c\n\n"),
        ("a\n", b": a\n:\n\n"),
        ("data: x", b": data: x\n\n"),
    ],
)
def test_a_comment_gets_a_colon_on_every_line(comment: str, expected: bytes) -> None:
    assert format_message(comment=comment) == expected


def test_a_multi_line_comment_dispatches_nothing() -> None:
    assert read_back(format_message(comment="one\ndata: two\rid: 3")) == []


# --- id, event, retry and field order


def test_fields_are_written_in_a_fixed_order() -> None:
    raw = format_message(data="d", event="e", id="7", retry=100, comment="c")
    assert raw == b": c\nid: 7\nevent: e\nretry: 100\ndata: d\n\n"


def test_an_empty_id_writes_a_bare_id_field_that_resets() -> None:
    assert format_message(id="") == b"id\n\n"
    decoder = SSEDecoder("5")
    decoder.feed(format_message(id=""))
    assert decoder.last_event_id == ""


def test_id_event_and_retry_read_back() -> None:
    raw = format_message(data="d", event=" spaced", id=" 7", retry=0)
    decoder = SSEDecoder()
    assert decoder.feed(raw) == [SSEMessage(" spaced", "d", " 7")]
    assert decoder.last_event_id == " 7"
    assert decoder.retry == 0


@pytest.mark.parametrize("char", ["\r", "\n", "\x00"])
@pytest.mark.parametrize("field", ["id", "event"])
@pytest.mark.parametrize("where", ["{}x", "x{}", "x{}y"])
def test_an_id_or_event_with_cr_lf_or_nul_raises(field: str, char: str, where: str) -> None:
    fields: dict[str, Any] = {field: where.format(char)}
    with pytest.raises(ValueError, match="CR, LF or NUL"):
        format_message(data="d", **fields)


@pytest.mark.parametrize("retry", [0, 1, 3000, 2**40])
def test_retry_accepts_non_negative_integers(retry: int) -> None:
    assert format_message(retry=retry) == f"retry: {retry}\n\n".encode()


@pytest.mark.parametrize("retry", [True, False, 1.0, 1.5, -1, "5", b"5"])
def test_retry_refuses_anything_else(retry: object) -> None:
    with pytest.raises(ValueError, match="retry"):
        format_message(retry=retry)  # type: ignore[arg-type]


def test_format_message_needs_something_to_write() -> None:
    with pytest.raises(ValueError, match="needs"):
        format_message()


# --- encode


def test_encode_frames_an_event() -> None:
    event = Event("content_block_stop", b'{"type":"content_block_stop","index":0}')
    assert encode(event) == (
        b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
    )


def test_encode_writes_the_id_first() -> None:
    assert encode(Event("ping", b"{}", "17")) == b"id: 17\nevent: ping\ndata: {}\n\n"


@pytest.mark.parametrize("event_id", ["", None])
def test_encode_never_writes_an_empty_id(event_id: str | None) -> None:
    raw = encode(Event("ping", b"{}", event_id))
    assert raw == b"event: ping\ndata: {}\n\n"
    decoder = SSEDecoder("5")
    assert decoder.feed(raw) == [SSEMessage("ping", "{}", "5")]  # the resume point holds


@pytest.mark.parametrize(
    "data",
    [
        b'{"text":"caf\xc3\xa9 \xf0\x9f\x98\x80"}',
        b"\xff\xfe not UTF-8",
        b"\x00\x01",
        b" leading space",
        b"tab\tand \\u2028 escaped",
        "raw \u2028 separator".encode(),
    ],
)
def test_encode_writes_the_data_bytes_unchanged(data: bytes) -> None:
    assert encode(Event("x", data)) == b"event: x\ndata: " + data + b"\n\n"


@pytest.mark.parametrize(
    ("data", "lines"),
    [
        (b"a\nb", b"data: a\ndata: b\n"),
        (b"a\rb", b"data: a\ndata: b\n"),
        (b"a\r\nb", b"data: a\ndata: b\n"),
        (b"a\n", b"data: a\ndata:\n"),
        (b"a\n\nb", b"data: a\ndata:\ndata: b\n"),
    ],
)
def test_encode_splits_data_holding_line_breaks(data: bytes, lines: bytes) -> None:
    assert encode(Event("x", data)) == b"event: x\n" + lines + b"\n"


@pytest.mark.parametrize(
    ("data", "text"),
    [(b"", ""), (b"a\n", "a\n"), (b"\n", "\n"), (b" a", " a"), (b"a\r\nb\rc", "a\nb\nc")],
)
def test_encode_output_reads_back(data: bytes, text: str) -> None:
    assert read_back(encode(Event("x", data, "1"))) == [SSEMessage("x", text, "1")]


@pytest.mark.parametrize("char", ["\r", "\n", "\x00"])
def test_encode_refuses_an_id_or_event_with_cr_lf_or_nul(char: str) -> None:
    with pytest.raises(ValueError, match="CR, LF or NUL"):
        encode(Event("x", b"{}", f"1{char}"))
    with pytest.raises(ValueError, match="CR, LF or NUL"):
        encode(Event(f"x{char}", b"{}"))
    # A refused name is not remembered as valid.
    with pytest.raises(ValueError, match="CR, LF or NUL"):
        encode(Event(f"x{char}", b"{}"))


@given(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30))
def test_encode_refuses_exactly_the_ids_with_cr_lf_or_nul(event_id: str) -> None:
    # Any character at all, line separators and other controls included: only CR, LF and
    # NUL break an id line.
    if any(char in event_id for char in "\r\n\x00"):
        with pytest.raises(ValueError, match="CR, LF or NUL"):
            encode(Event("x", b"{}", event_id))
    else:
        frame = encode(Event("x", b"{}", event_id))
        assert frame == b"id: " + event_id.encode() + b"\nevent: x\ndata: {}\n\n"


def test_encode_is_right_for_more_event_names_than_it_caches() -> None:
    for n in range(3000):
        assert encode(Event(f"name{n}", b"{}")) == f"event: name{n}\ndata: {{}}\n\n".encode()


# --- the seed transcript and encode_many


def seed_events() -> list[Event]:
    """The events of fixtures/seed004_turn.sse: each frame is ``event: X\\ndata: Y\\n\\n``."""
    events = []
    for frame in SEED_TURN.read_bytes().split(b"\n\n")[:-1]:
        event_line, data_line = frame.split(b"\n")
        events.append(
            Event(event_line.removeprefix(b"event: ").decode(), data_line.removeprefix(b"data: "))
        )
    return events


def test_encoding_the_seed_events_gives_the_seed_transcript() -> None:
    events = seed_events()
    assert len(events) == 16
    assert b"".join(encode(event) for event in events) == SEED_TURN.read_bytes()


def test_encode_many_equals_the_concatenation() -> None:
    events = [*seed_events(), Event("x", b"a\nb", "9"), Event("y", b"", "")]
    assert encode_many(events) == b"".join(encode(event) for event in events)
    assert encode_many(iter(events)) == encode_many(events)
    assert encode_many([]) == b""
    assert encode_many(seed_events()) == SEED_TURN.read_bytes()
