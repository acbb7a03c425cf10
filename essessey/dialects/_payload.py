"""Reading a protocol event's payload for a dialect encoder: the one place that decides
what an encoder does with an event it cannot read (skipped, with a log line naming the
event type and the length, never the content)."""

from __future__ import annotations

import logging
from typing import Any

import orjson

from essessey.event import Event

__all__ = ["read_payload"]


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
