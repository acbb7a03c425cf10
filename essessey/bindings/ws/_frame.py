"""The WebSocket envelope: one JSON text frame per event.

``{"id": "<id>", "event": "<name>", "data": <payload>}``: the payload is inlined as JSON,
not as a string, by splicing the bytes the Publisher already serialised (parsing and
re-serialising them would double the cost of every event). ``id`` is left out when the
event has none.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from essessey.event import Event, new_event

__all__ = ["MAX_FRAME_SIZE", "decode_frame", "encode_frame"]

MAX_FRAME_SIZE: Final = 16 << 20
"""The largest frame :func:`decode_frame` accepts by default: 16 Mi characters for a text
frame, 16 MiB for a binary one (like the SSE limits)."""

# Event names are few; their encoded ``"event":"<name>","data":`` part is cached.
_NAME_PARTS: dict[str, bytes] = {}
_NAME_CACHE_LIMIT: Final = 1024


def _name_part(name: str) -> bytes:
    part = _NAME_PARTS.get(name)
    if part is None:
        part = b'"event":' + orjson.dumps(name) + b',"data":'
        if len(_NAME_PARTS) < _NAME_CACHE_LIMIT:
            _NAME_PARTS[name] = part
    return part


def encode_frame(event: Event) -> str:
    """The text of the frame carrying ``event``. Its data must be JSON text (what a
    Publisher writes); an empty payload raises ValueError, as it would make the frame
    invalid JSON."""
    return frame_bytes(event).decode()


def frame_bytes(event: Event) -> bytes:
    """:func:`encode_frame` as UTF-8 bytes, what goes on the wire."""
    return frame_fields(*event)


def frame_fields(name: str, data: bytes, event_id: str | None) -> bytes:
    """:func:`frame_bytes` of the event made of ``name``, ``data`` and ``event_id``, for
    a caller that holds the three without an :class:`~essessey.Event` (a store's
    append)."""
    if not data:
        raise ValueError("an event's data must be JSON text to travel in a WebSocket frame")
    if event_id:
        # One join, not four concatenations: a hub's every event carries an id.
        return b"".join((b'{"id":', orjson.dumps(event_id), b",", _name_part(name), data, b"}"))
    return b"{" + _name_part(name) + data + b"}"


def decode_frame(text: str | bytes, *, max_size: int = MAX_FRAME_SIZE) -> Event:
    """The event a frame carries; ValueError (naming what is wrong, never the content)
    when the frame is too large, not JSON, not in the envelope's shape, or has data
    nested too deeply to be written back as JSON."""
    if len(text) > max_size:
        # len() of a str counts characters; of bytes, bytes. Either bounds the parse.
        unit = "bytes" if isinstance(text, bytes | bytearray) else "characters"
        raise ValueError(f"frame of {len(text)} {unit} is over the {max_size} limit")
    try:
        envelope: Any = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"frame is not JSON ({exc.msg})") from None
    if not isinstance(envelope, dict):
        raise ValueError("frame is not a JSON object")
    name = envelope.get("event")
    if not isinstance(name, str) or not name:
        raise ValueError("frame has no event name")
    if "data" not in envelope:
        raise ValueError("frame has no data")
    event_id = envelope.get("id")
    if event_id is not None and not isinstance(event_id, str):
        raise ValueError("frame id is not a string")
    try:
        data = orjson.dumps(envelope["data"])
    except orjson.JSONEncodeError:
        # orjson reads 1024 levels of nesting but writes only 255: a frame between the
        # two parses, and its data cannot be carried on.
        raise ValueError("frame data is nested too deeply") from None
    return new_event(Event, (name, data, event_id or None))
