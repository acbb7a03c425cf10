"""What the dialects read out of a protocol event's payload beyond the hooks' arguments:
the payload itself for a reader outside the hooks, a ``message_delta``'s totals and a
``message_start``'s input tokens, each read one way for every dialect."""

from __future__ import annotations

import logging
from typing import Any

from essessey.event import Event
from essessey.protocol import Unreadable, read

__all__ = ["input_tokens", "message_delta_totals", "read_payload"]


def read_payload(event: Event, log: logging.Logger) -> dict[str, Any] | None:
    """``event``'s JSON object (read once for every reader), or None (logged on ``log``,
    by the event's type and length) when it is not one."""
    record = read(event)
    payload = record.payload
    if isinstance(payload, dict):
        return payload
    assert isinstance(record, Unreadable)  # every readable record holds an object
    if payload is None:
        log.warning("skipped a %s event of %d bytes: not JSON", event.event, len(event.data))
    else:
        log.warning("skipped a %s event: %s", event.event, record.reason)
    return None


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
