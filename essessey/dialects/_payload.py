"""Reading a protocol event for a dialect encoder: the one place that decides what an
encoder does with an event it cannot read (skipped, with a log line naming the event type
and the length, never the content), and the one ``encode`` every dialect's encoder runs
(:func:`encode_event`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final, cast

from essessey.bindings.sse import id_line, with_id
from essessey.event import Event
from essessey.protocol import Delta, DeltaType, EventType, Unreadable, read

__all__ = [
    "UNREADABLE",
    "encode_event",
    "input_tokens",
    "message_delta_totals",
    "read_payload",
    "text_delta",
]

UNREADABLE: Final[tuple[type[Exception], ...]] = (
    KeyError,
    TypeError,
    ValueError,
    AttributeError,
)
"""What a dialect's dispatch raises on a payload that is not laid out as the protocol
says: the event is skipped with a log line."""


def read_payload(event: Event, log: logging.Logger) -> dict[str, Any] | None:
    """``event``'s JSON object, or None (logged on ``log``) when it is not one."""
    record = read(event)
    payload = record.payload
    if not isinstance(payload, dict):
        _log_unreadable(event, cast(Unreadable, record), log)
        return None
    return payload


def _log_unreadable(event: Event, record: Unreadable, log: logging.Logger) -> None:
    if record.payload is None:
        log.warning("skipped a %s event of %d bytes: not JSON", event.event, len(event.data))
    else:
        log.warning("skipped a %s event: %s", event.event, record.reason)


def text_delta(payload: dict[str, Any]) -> tuple[int, str] | None:
    """The block index and the text of a ``content_block_delta`` payload that is a text
    delta; None for any other. Most of a turn's events are text deltas: an encoder
    writes them with its ``encode_text``, the rest through its general dispatch."""
    delta = payload.get("delta")
    if delta.__class__ is not dict or delta.get("type") != DeltaType.TEXT:
        return None
    index, text = payload.get("index"), delta.get("text")
    if index.__class__ is not int or text.__class__ is not str:
        return None
    return index, text


def message_delta_totals(payload: dict[str, Any]) -> tuple[str | None, int]:
    """What a ``message_delta`` adds to a dialect's end: its stop reason (None when it
    names none) and its output tokens (0 when it counts none)."""
    reason = (payload.get("delta") or {}).get("stop_reason")
    output = (payload.get("usage") or {}).get("output_tokens")
    return (
        reason if isinstance(reason, str) else None,
        output if isinstance(output, int) else 0,
    )


def input_tokens(message: dict[str, Any]) -> int:
    """The input tokens a ``message_start``'s message counts (0 when none)."""
    prompt = (message.get("usage") or {}).get("input_tokens")
    return prompt if isinstance(prompt, int) else 0


def encode_event(
    event: Event,
    log: logging.Logger,
    encode_text: Callable[[int, str], bytes | None],
    frames: Callable[[str, dict[str, Any]], list[bytes]],
    *,
    unreadable: tuple[type[Exception], ...] = UNREADABLE,
) -> bytes:
    """An encoder's ``encode``: nothing for a ping or a payload that is not a JSON
    object; a text delta through ``encode_text`` when it takes it (an open text block),
    any other event through ``frames(name, payload)``; the last frame with the event's
    ``id:``. An event whose dispatch raises one of ``unreadable`` is skipped, logged by
    its type and the exception's class."""
    if event.event == EventType.PING:
        return b""
    record = read(event)
    if record.__class__ is Delta:
        delta = record
        text = delta.text
        if delta.delta_type == DeltaType.TEXT and text is not None:
            frame = encode_text(delta.index, text)
            if frame is not None:
                return id_line(event.id) + frame if event.id and frame else frame
    payload = record.payload
    if not isinstance(payload, dict):
        _log_unreadable(event, cast(Unreadable, record), log)
        return b""
    try:
        return with_id(frames(event.event, payload), event.id)
    except unreadable as exc:
        log.warning("skipped a %s event: %s", event.event, type(exc).__name__)
        return b""
