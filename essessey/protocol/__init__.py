"""The protocol's vocabulary: event names, block types, delta types, stop reasons, and
the two dialects' payload shapes; and :func:`read`, which gives an event's typed record
(:mod:`essessey.protocol.records`), parsed once however many readers read it.

Block types, delta types and stop reasons are open sets. The names here are plain
strings, not a closed enum, so a producer may send a block type this module has never
heard of and a consumer can still name it and pass it on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal, TypeAlias

import orjson

from essessey._public import set_public_module
from essessey.errors import SerializationError
from essessey.protocol.records import (
    BlockStart,
    BlockStop,
    Delta,
    ErrorRecord,
    MessageDelta,
    MessageStart,
    MessageStop,
    OtherEvent,
    Ping,
    Record,
    Unreadable,
    read,
)

__all__ = [
    "ANTHROPIC",
    "DELTA_FOR_BLOCK",
    "DIALECTS",
    "ESSESSEY",
    "TEXT_DELTA_PAYLOAD",
    "BlockStart",
    "BlockStop",
    "BlockType",
    "Delta",
    "DeltaType",
    "Dialect",
    "ErrorRecord",
    "EventType",
    "GivenBlock",
    "MessageDelta",
    "MessageStart",
    "MessageStop",
    "OtherEvent",
    "Ping",
    "Record",
    "StopReason",
    "Unreadable",
    "answer_block_start",
    "approval_request_block_start",
    "approval_response_block_start",
    "delta_template",
    "given_blocks",
    "question_block_start",
    "read",
    "result_text",
    "text_block_start",
    "thinking_block_start",
    "thinking_delta_field",
    "tool_result_block_start",
    "tool_use_block_start",
]

Dialect: TypeAlias = Literal["essessey", "anthropic"]
"""Which payload shapes a Publisher writes; see docs/protocol.md for the differences."""

ESSESSEY: Final = "essessey"
ANTHROPIC: Final = "anthropic"
DIALECTS: Final[frozenset[str]] = frozenset({ESSESSEY, ANTHROPIC})


class EventType:
    """The protocol's event names. Every payload repeats its event name in ``type``."""

    MESSAGE_START: Final = "message_start"
    PING: Final = "ping"
    CONTENT_BLOCK_START: Final = "content_block_start"
    CONTENT_BLOCK_DELTA: Final = "content_block_delta"
    CONTENT_BLOCK_STOP: Final = "content_block_stop"
    MESSAGE_DELTA: Final = "message_delta"
    MESSAGE_STOP: Final = "message_stop"
    ERROR: Final = "error"

    ALL: Final[frozenset[str]] = frozenset(
        {
            MESSAGE_START,
            PING,
            CONTENT_BLOCK_START,
            CONTENT_BLOCK_DELTA,
            CONTENT_BLOCK_STOP,
            MESSAGE_DELTA,
            MESSAGE_STOP,
            ERROR,
        }
    )


class BlockType:
    """Content block types this library knows; others pass through untouched."""

    TEXT: Final = "text"
    THINKING: Final = "thinking"
    TOOL_USE: Final = "tool_use"
    TOOL_RESULT: Final = "tool_result"
    APPROVAL_REQUEST: Final = "approval_request"
    """The turn asks its client to approve a tool call of the message before it runs."""
    QUESTION: Final = "question"
    """The turn asks its client a question (with an optional JSON schema for the answer)."""
    APPROVAL_RESPONSE: Final = "approval_response"
    """The client's approval or denial, first in the message that continues the turn."""
    ANSWER: Final = "answer"
    """The client's answer to a question, first in the message that continues the turn."""

    REQUESTS: Final[frozenset[str]] = frozenset({APPROVAL_REQUEST, QUESTION})
    """The blocks that ask; their message ends with stop reason ``tool_use``."""
    RESPONSES: Final[frozenset[str]] = frozenset({APPROVAL_RESPONSE, ANSWER})
    """The blocks that record an answer; they carry everything in their start."""


class DeltaType:
    """Delta types this library knows; others pass through untouched."""

    TEXT: Final = "text_delta"
    THINKING: Final = "thinking_delta"
    SIGNATURE: Final = "signature_delta"
    INPUT_JSON: Final = "input_json_delta"
    TOOL_RESULT: Final = "json_partial"

    KNOWN: Final[frozenset[str]] = frozenset({TEXT, THINKING, SIGNATURE, INPUT_JSON, TOOL_RESULT})
    """Every delta type above: the ones whose block and field the protocol fixes."""


def delta_template(delta_type: str, field: str) -> bytes:
    """A ``content_block_delta`` payload as orjson writes it (key order included), with
    the block's index left as ``%d`` and the delta's JSON value as ``%b``:
    ``delta_template(DeltaType.TEXT, "text") % (index, orjson.dumps(text))``."""
    return b'{"type":"content_block_delta","index":%%d,"delta":{"type":"%s","%s":%%b}}' % (
        delta_type.encode(),
        field.encode(),
    )


TEXT_DELTA_PAYLOAD: Final = delta_template(DeltaType.TEXT, "text")
"""A text delta's payload, to fill with its index and its text's JSON (orjson's): the
bytes every maker of a text delta writes, so that equal deltas are equal bytes."""


def text_delta_head(index: int) -> bytes:
    """``TEXT_DELTA_PAYLOAD`` up to its text, for block ``index``:
    ``text_delta_head(index) + text_json + TEXT_DELTA_TAIL`` is
    ``TEXT_DELTA_PAYLOAD % (index, text_json)``."""
    return TEXT_DELTA_PAYLOAD.partition(b"%b")[0] % index


TEXT_DELTA_HEADS: Final[dict[int, bytes]] = {index: text_delta_head(index) for index in range(256)}
"""``text_delta_head`` of the first block indexes (a turn's), made once: a text delta's
payload with no format parsed (a text delta is nearly every event of a turn); a
``KeyError`` for any other index."""
TEXT_DELTA_TAIL: Final = TEXT_DELTA_PAYLOAD.partition(b"%b")[2]
"""``TEXT_DELTA_PAYLOAD`` after its text (see ``TEXT_DELTA_HEADS``)."""


class StopReason:
    """Why a message ended. An open set: ``stop_sequence`` and others pass through."""

    END_TURN: Final = "end_turn"
    TOOL_USE: Final = "tool_use"
    """The message waits for its client: tool results, approvals, answers
    (docs/asking.md)."""
    MAX_TOKENS: Final = "max_tokens"
    STOP_SEQUENCE: Final = "stop_sequence"
    PAUSE_TURN: Final = "pause_turn"
    """A long turn paused by the provider (its server tools): send it back to go on."""
    REFUSAL: Final = "refusal"
    """The provider declined to go on (a safety classifier, a content filter)."""
    MODEL_CONTEXT_WINDOW_EXCEEDED: Final = "model_context_window_exceeded"
    """The model's context window filled up before the answer ended."""
    CANCELLED: Final = "cancelled"
    """essessey's own: the turn was cancelled (``StreamHub.cancel``) before it finished."""


DELTA_FOR_BLOCK: Final[dict[str, frozenset[str]]] = {
    BlockType.TEXT: frozenset({DeltaType.TEXT}),
    BlockType.THINKING: frozenset({DeltaType.THINKING, DeltaType.SIGNATURE}),
    BlockType.TOOL_USE: frozenset({DeltaType.INPUT_JSON}),
    BlockType.TOOL_RESULT: frozenset({DeltaType.TOOL_RESULT}),
    BlockType.APPROVAL_REQUEST: frozenset(),
    BlockType.QUESTION: frozenset(),
    BlockType.APPROVAL_RESPONSE: frozenset(),
    BlockType.ANSWER: frozenset(),
}
"""For each known block type, the known delta types it accepts. A delta type that is not
known anywhere is accepted by every block (the set is open)."""


def text_block_start(dialect: Dialect) -> dict[str, Any]:
    """The ``content_block`` of a text block's start event."""
    if dialect == ANTHROPIC:
        # The Anthropic SDK appends this object to its snapshot and then does
        # ``text += delta``: it needs the empty string to be there.
        return {"type": BlockType.TEXT, "text": ""}
    return {"type": BlockType.TEXT}


def thinking_block_start(dialect: Dialect) -> dict[str, Any]:
    """The ``content_block`` of a thinking block's start event."""
    if dialect == ANTHROPIC:
        return {"type": BlockType.THINKING, "thinking": ""}
    return {"type": BlockType.THINKING}


GivenBlock: TypeAlias = tuple[dict[str, Any], list[dict[str, Any]]]
"""A block a ``message_start`` holds, as the ``content_block`` of its start and the
deltas that stream it (see :func:`given_blocks`)."""


def given_blocks(content: list[Any]) -> list[GivenBlock | None]:
    """The blocks a ``message_start``'s ``message.content`` already holds, each as the
    start and the deltas that stream it, at its index in ``content``.

    Anthropic's programmatic tool calls send the message whole in its start (its content,
    its stop reason), then ``message_stop``; the Anthropic SDK reads that message as the
    snapshot it accumulates into, so these are the message's first blocks, at indexes
    0..n-1. A text or thinking block is started empty and its text (a thinking block's
    signature after it) comes as deltas, in the Anthropic format; a tool use's input as
    one ``input_json_delta``; any other block is whole at its start. None for an entry
    that is no block (not an object with a ``type`` string).
    """
    blocks: list[GivenBlock | None] = []
    for block in content:
        if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
            blocks.append(None)
            continue
        block_type = block["type"]
        deltas: list[dict[str, Any]] = []
        if block_type in (BlockType.TEXT, BlockType.THINKING):
            field_name = "text" if block_type == BlockType.TEXT else "thinking"
            delta_type = DeltaType.TEXT if block_type == BlockType.TEXT else DeltaType.THINKING
            start = {**block, field_name: ""}
            start.pop("signature", None)
            given = block.get(field_name)
            if isinstance(given, str) and given:
                deltas.append({"type": delta_type, field_name: given})
            signature = block.get("signature")
            if block_type == BlockType.THINKING and isinstance(signature, str) and signature:
                deltas.append({"type": DeltaType.SIGNATURE, "signature": signature})
        elif block_type == BlockType.TOOL_USE and (arguments := _input_json(block)) is not None:
            # Its input as a fragment, as a tool call's streams (the start's is empty).
            start = {**block, "input": {}}
            if arguments != "{}":
                deltas.append({"type": DeltaType.INPUT_JSON, "partial_json": arguments})
        else:
            start = dict(block)
        blocks.append((start, deltas))
    return blocks


def _input_json(block: Mapping[str, Any]) -> str | None:
    """A tool use's input as JSON text; None when it is not an object JSON can write."""
    given = block.get("input")
    if not isinstance(given, Mapping):
        return None
    try:
        return orjson.dumps(dict(given)).decode()
    except TypeError:
        return None


def thinking_delta_field(dialect: Dialect) -> str:
    """The field of a ``thinking_delta`` that carries the reasoning text."""
    return "thinking" if dialect == ANTHROPIC else "text"


def tool_use_block_start(
    tool_use_id: str,
    name: str,
    *,
    item_type: str | None = None,
    caller: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``content_block`` of a tool use block: the input always starts empty and
    arrives in ``input_json_delta`` events. ``item_type`` is the provider's own type for
    a call that is not a plain function call (a Responses API ``custom_tool_call``,
    ``shell_call``, ...), so that a dialect can write it back as what it was. ``caller``
    is what made the call when the model did not make it itself, as the provider names
    it: the code a provider's tool runs (Anthropic's programmatic tool calls,
    ``{"type": "code_execution_20250825", "tool_id"}``; the Responses API's
    ``{"type": "program", "caller_id"}``), which a client sends back with the call."""
    block: dict[str, Any] = {"type": BlockType.TOOL_USE, "id": tool_use_id, "name": name}
    block["input"] = {}
    if item_type is not None:
        block["item_type"] = item_type
    if caller is not None:
        block["caller"] = dict(caller)
    return block


def _unix_time(value: object) -> int:
    """``value`` as a request's ``expires_at``: whole Unix seconds, not before 1970."""
    if type(value) is not int or value < 0:
        raise ValueError("expires_at must be whole Unix seconds (an int >= 0)")
    return value


def approval_request_block_start(
    request_id: str, tool_use_id: str, *, reason: str | None = None, expires_at: int | None = None
) -> dict[str, Any]:
    """The ``content_block`` of an approval request for the message's call
    ``tool_use_id``: ``reason`` is shown to whoever approves, ``expires_at`` (Unix
    seconds) is when answers stop being taken."""
    block: dict[str, Any] = {
        "type": BlockType.APPROVAL_REQUEST,
        "id": request_id,
        "tool_use_id": tool_use_id,
    }
    if reason is not None:
        block["reason"] = reason
    if expires_at is not None:
        block["expires_at"] = _unix_time(expires_at)
    return block


def question_block_start(
    request_id: str,
    question: str,
    *,
    schema: Mapping[str, Any] | None = None,
    expires_at: int | None = None,
    tool_use_id: str | None = None,
) -> dict[str, Any]:
    """The ``content_block`` of a question: ``schema`` (a JSON schema) says what an answer
    looks like, ``expires_at`` (Unix seconds) when answers stop being taken,
    ``tool_use_id`` the call of the message whose run asks it (its result comes after
    the answer, in the message that continues the turn)."""
    block: dict[str, Any] = {"type": BlockType.QUESTION, "id": request_id, "question": question}
    if tool_use_id is not None:
        block["tool_use_id"] = tool_use_id
    if schema is not None:
        block["schema"] = dict(schema)
    if expires_at is not None:
        block["expires_at"] = _unix_time(expires_at)
    return block


def approval_response_block_start(
    request_id: str, approved: bool, *, reason: str | None = None
) -> dict[str, Any]:
    """The ``content_block`` recording the answer to approval request ``request_id``."""
    block: dict[str, Any] = {
        "type": BlockType.APPROVAL_RESPONSE,
        "request_id": request_id,
        "approved": approved,
    }
    if reason is not None:
        block["reason"] = reason
    return block


def answer_block_start(request_id: str, value: Any) -> dict[str, Any]:
    """The ``content_block`` recording the answer ``value`` (any JSON) to question
    ``request_id``."""
    return {"type": BlockType.ANSWER, "request_id": request_id, "value": value}


def result_text(result: object) -> str:
    """The text a tool result is published as (its ``json_partial`` deltas): a string as
    it is, anything else as JSON.

    Raises :class:`~essessey.SerializationError` for a value JSON cannot represent.
    """
    if isinstance(result, str):
        return result
    try:
        return orjson.dumps(result).decode()
    except TypeError as exc:
        raise SerializationError(f"tool result is not JSON-serialisable: {exc}") from exc


def tool_result_block_start(tool_use_id: str, *, is_error: bool = False) -> dict[str, Any]:
    """The ``content_block`` of a tool result block; ``is_error`` appears only when true."""
    if is_error:
        return {"type": BlockType.TOOL_RESULT, "tool_use_id": tool_use_id, "is_error": True}
    return {"type": BlockType.TOOL_RESULT, "tool_use_id": tool_use_id}


set_public_module(__name__, globals(), __all__)
