"""What a provider adapter saw while it published one message."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

__all__ = ["PublishedMessage", "PublishedToolCall", "parse_arguments"]


def parse_arguments(arguments: str) -> Any:
    """Tool call arguments as a value: ``{}`` when blank (a call without parameters),
    None when the text is not JSON (the caller keeps the text)."""
    if not arguments.strip():
        return {}
    try:
        return orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return None


@dataclass(slots=True)
class PublishedToolCall:
    """One tool call the model made: its id, tool name and arguments.

    ``arguments`` is the JSON text as streamed; ``input`` is that text parsed (``{}``
    when it was empty), or None when it was not valid JSON (``arguments`` still has it).
    ``given_id`` is the id the provider or framework gave the call (None when it gave
    none): ``id`` differs from it when the call repeated an id an earlier call of the
    message had, and went out under a fresh one.
    """

    id: str
    name: str
    arguments: str
    input: Any
    given_id: str | None = None


@dataclass(slots=True)
class PublishedMessage:
    """What an adapter's ``publish`` returns: the message's content as it went out.

    ``usage`` holds the token counts the provider reported (empty when it sent none).
    ``error`` is the provider's error object (``type`` and ``message``) when one ended
    the message; it is then not complete.
    """

    message_id: str
    model: str
    text: str = ""
    thinking: str = ""
    tool_calls: list[PublishedToolCall] = field(default_factory=list)
    stop_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    error: dict[str, Any] | None = None
