"""What the dialects read out of a protocol event's payload beyond the hooks' arguments:
the payload itself for a reader outside the hooks, a ``message_delta``'s totals and a
turn's token counts (:class:`TurnUsage`), each read one way for every dialect."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, Final

import orjson

from essessey._logsafe import log_label
from essessey.event import Event
from essessey.protocol import EventType, Unreadable, read

__all__ = [
    "QUESTION_TOOL",
    "TurnUsage",
    "answer_value",
    "call_arguments",
    "content_text",
    "message_delta_totals",
    "read_payload",
]

_COUNTED: Final = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "reasoning_tokens",
)
"""The protocol's usage keys a dialect writes (docs/protocol.md, "Usage")."""

QUESTION_TOOL: Final = "ask_user"
"""The tool a turn's question is a call of in a dialect with no idiom for questions (the AI
SDK's UI stream, Chat Completions, Responses): the call's id is the question's id, its
arguments ``{"question", "schema"?}``, its output the answer (docs/asking.md)."""


_MAX_COUNT: Final = 2**63 - 1
"""The largest count a dialect writes: sums of counts a stream gave stop there."""


class TurnUsage:
    """A turn's token counts as every dialect reads them: within a message,
    ``message_start``'s usage updated key by key by its ``message_delta``'s (a count the
    delta leaves out keeps the start's); over the turn, its messages' counts added.

    ``input_tokens`` counts the input that was neither read from nor written to a cache,
    as the protocol does; :attr:`prompt_tokens` is all of it, as OpenAI's formats and
    AG-UI count input."""

    __slots__ = ("_closed", "_open")

    def __init__(self) -> None:
        self._closed = dict.fromkeys(_COUNTED, 0)
        self._open: dict[str, int] = {}

    @classmethod
    def of(cls, events: Iterable[Event]) -> TurnUsage:
        """The counts of a whole turn's events."""
        usage = cls()
        for event in events:
            if event.event == EventType.MESSAGE_START:
                payload = read(event).payload
                message = payload.get("message") if isinstance(payload, dict) else None
                if isinstance(message, dict):
                    usage.message_start(message)
            elif event.event == EventType.MESSAGE_DELTA:
                payload = read(event).payload
                if isinstance(payload, dict):
                    usage.message_delta(payload)
        return usage

    def message_start(self, message: Mapping[str, Any]) -> None:
        """A message starts, with its ``message_start``'s message."""
        self._fold()
        self._open = _counts(message.get("usage"))

    def message_delta(self, payload: Mapping[str, Any]) -> None:
        """The message's ``message_delta`` payload."""
        self._open.update(_counts(payload.get("usage")))

    def _fold(self) -> None:
        for key, value in self._open.items():
            self._closed[key] += value
        self._open = {}

    def count(self, key: str) -> int:
        """The turn's count of ``key`` (one of the protocol's usage keys) so far, at most
        what a JSON writer takes (64 bits: each count read may be that large)."""
        return min(self._closed[key] + self._open.get(key, 0), _MAX_COUNT)

    @property
    def output_tokens(self) -> int:
        """Output tokens (reasoning included, where the provider counts it so)."""
        return self.count("output_tokens")

    @property
    def prompt_tokens(self) -> int:
        """All input tokens: uncached, read from a cache and written to one."""
        total = (
            self.count("input_tokens")
            + self.count("cache_read_input_tokens")
            + self.count("cache_creation_input_tokens")
        )
        return min(total, _MAX_COUNT)


def _counts(usage: object) -> dict[str, int]:
    if not isinstance(usage, Mapping):
        return {}
    return {key: value for key in _COUNTED if type(value := usage.get(key)) is int and value >= 0}


def read_payload(event: Event, log: logging.Logger) -> dict[str, Any] | None:
    """``event``'s JSON object (read once for every reader), or None (logged on ``log``,
    by the event's type and length) when it is not one."""
    record = read(event)
    payload = record.payload
    if isinstance(payload, dict):
        return payload
    assert isinstance(record, Unreadable)  # every readable record holds an object
    if payload is None:
        log.warning(
            "skipped a %s event of %d bytes: not JSON", log_label(event.event), len(event.data)
        )
    else:
        log.warning("skipped a %s event: %s", log_label(event.event), record.reason)
    return None


def call_arguments(parts: list[str], block: dict[str, Any]) -> str:
    """A tool call's arguments as a dialect writes them whole: its fragments, or, when
    none has any text (a tool that takes no parameters), its start's ``input`` as JSON
    (``{}``): an OpenAI client parses the arguments, and ``""`` is no JSON."""
    whole = "".join(parts)
    if whole:
        return whole
    given = block.get("input")
    return orjson.dumps(given if isinstance(given, dict) else {}).decode()


def message_delta_totals(payload: dict[str, Any]) -> tuple[str | None, int]:
    """What a ``message_delta`` adds to a dialect's end: its stop reason (None when it
    names none) and its output tokens (0 when it counts none)."""
    reason = (payload.get("delta") or {}).get("stop_reason")
    output = (payload.get("usage") or {}).get("output_tokens")
    return (
        reason if isinstance(reason, str) else None,
        output if isinstance(output, int) else 0,
    )


def content_text(content: Any) -> str | None:
    """A tool message's content as text (how a client sends a tool's output or an answer):
    a string, or its text parts joined; None for anything else."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") if isinstance(p, dict) else None for p in content]
        if all(isinstance(part, str) for part in parts):
            return "".join(part for part in parts if isinstance(part, str))
    return None


def answer_value(output: Any) -> Any:
    """An answer as a client sends it in text: JSON text decoded, any other text (or a
    value already decoded) as it is."""
    if not isinstance(output, str):
        return output
    try:
        return orjson.loads(output)
    except orjson.JSONDecodeError:
        return output
