"""Writing the WHATWG "event stream" format.

Rules, and why:
- Every line of data gets its own ``data:`` line. CR, LF and CRLF all end a line for the
  reader, so all three split here; an empty line (and a trailing one: ``"a\\n"``) becomes
  an empty ``data:`` line, which is what makes the data round-trip exactly.
- One space follows each colon. The reader drops exactly one leading space, so a value
  that itself begins with a space keeps it.
- A comment spanning lines gets a colon on every line; otherwise its second line would be
  read as a field.
- An id or event name containing CR, LF or NUL raises: it would end the line early (or,
  for an id, make the reader ignore it) and silently change what the client sees.
- ``encode`` never writes an empty ``id:``: for a browser that resets the last event id,
  and a reconnect would then start from nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

import orjson

from essessey.event import Event

__all__ = ["encode", "encode_many", "error_body", "format_message"]

_LINE_BREAK: Final = re.compile(r"\r\n|\r|\n")
_LINE_BREAK_BYTES: Final = re.compile(rb"\r\n|\r|\n")
_FORBIDDEN: Final = re.compile("[\r\n\0]")

# Event names are few; their validated "event: <name>\ndata: " prefix is cached.
_PREFIXES: dict[str, bytes] = {}
_PREFIX_CACHE_LIMIT: Final = 1024


def _check_token(kind: str, value: str) -> str:
    if _FORBIDDEN.search(value) is not None:
        raise ValueError(f"an SSE {kind} must not contain CR, LF or NUL")
    return value


def _data_lines(data: str) -> list[str]:
    return [f"data: {line}" if line else "data:" for line in _LINE_BREAK.split(data)]


def format_message(
    *,
    data: str | None = None,
    event: str | None = None,
    id: str | None = None,
    retry: int | None = None,
    comment: str | None = None,
) -> bytes:
    """Format one SSE message (fields in the order comment, id, event, retry, data).

    ``id=""`` writes a bare ``id`` field, which resets the reader's last event id; use it
    only on purpose. ``retry`` is a reconnection delay in whole milliseconds (>= 0). At
    least one of the arguments must be given.
    """
    lines: list[str] = []
    if comment is not None:
        lines.extend(f": {line}" if line else ":" for line in _LINE_BREAK.split(comment))
    if id is not None:
        _check_token("id", id)
        lines.append(f"id: {id}" if id else "id")
    if event is not None:
        lines.append(f"event: {_check_token('event name', event)}")
    if retry is not None:
        if type(retry) is not int or retry < 0:
            raise ValueError("retry must be a non-negative integer of milliseconds")
        lines.append(f"retry: {retry}")
    if data is not None:
        lines.extend(_data_lines(data))
    if not lines:
        raise ValueError("format_message needs data, event, id, retry or a comment")
    lines.append("\n")
    return "\n".join(lines).encode()


def _prefix(name: str) -> bytes:
    prefix = _PREFIXES.get(name)
    if prefix is None:
        prefix = b"event: " + _check_token("event name", name).encode() + b"\n"
        if len(_PREFIXES) < _PREFIX_CACHE_LIMIT:
            _PREFIXES[name] = prefix
    return prefix


def encode(event: Event) -> bytes:
    """Frame an :class:`~essessey.Event` as one SSE message: ``id:`` (when it has one),
    ``event:``, its data, a blank line. The data bytes are written unchanged."""
    # Unpacked in one step: each of a named tuple's fields read by name goes through a
    # descriptor.
    return encode_fields(*event)


def encode_fields(name: str, data: bytes, event_id: str | None) -> bytes:
    """:func:`encode` of the event made of ``name``, ``data`` and ``event_id``, for a
    caller that holds the three without an :class:`~essessey.Event` (a store's append)."""
    # The bytes 10 and 13 (LF, CR) as ints: an int is looked for with one memchr, where a
    # one-byte bytes needle takes the general search, several times slower per event.
    if data and not (10 in data or 13 in data):
        # Nearly every event: one line of JSON (orjson never writes a raw line break),
        # joined in one pass.
        prefix = _PREFIXES.get(name) or _prefix(name)
        if event_id:
            id_bytes = event_id.encode()
            # As the data above: UTF-8 writes CR, LF and NUL as those bytes and no other
            # character holds them, so three memchr calls find what the pattern would.
            if 10 in id_bytes or 13 in id_bytes or 0 in id_bytes:
                _check_token("id", event_id)  # raises, saying why
            return b"".join((b"id: ", id_bytes, b"\n", prefix, b"data: ", data, b"\n\n"))
        return b"".join((prefix, b"data: ", data, b"\n\n"))
    if data:
        body = b"".join(
            (b"data: " + line + b"\n") if line else b"data:\n"
            for line in _LINE_BREAK_BYTES.split(data)
        )
    else:
        body = b"data:\n"
    head = _prefix(name)
    if event_id:
        head = b"id: " + _check_token("id", event_id).encode() + b"\n" + head
    return head + body + b"\n"


def encode_many(events: Iterable[Event]) -> bytes:
    """Frame several events into one byte string, for a single write."""
    return b"".join([encode(event) for event in events])


def error_body(error_type: str, message: str) -> bytes:
    """The JSON body of an error answered before a stream starts, in the shape the SSE
    response and the hub routes answer with (docs/sse.md, "Error shapes"):
    ``{"type":"error","error":{"type":error_type,"message":message}}``. For an app's own
    routes beside them, so that a client reads every refusal alike."""
    return orjson.dumps({"type": "error", "error": {"type": error_type, "message": message}})
