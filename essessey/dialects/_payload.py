"""Reading a protocol event's payload for a dialect encoder: the one place that decides
what an encoder does with an event it cannot read (skipped, with a log line naming the
event type and the length, never the content)."""

from __future__ import annotations

import logging
from typing import Any

import orjson

from essessey.event import Event
from essessey.protocol import DeltaType

__all__ = ["read_payload", "text_delta"]


def read_payload(event: Event, log: logging.Logger) -> dict[str, Any] | None:
    """``event``'s JSON object, or None (logged on ``log``) when it is not one."""
    try:
        payload = orjson.loads(event.data)
    except orjson.JSONDecodeError:
        log.warning("skipped a %s event of %d bytes: not JSON", event.event, len(event.data))
        return None
    if not isinstance(payload, dict):
        log.warning("skipped a %s event: its payload is not an object", event.event)
        return None
    return payload


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
