"""Reassemble a stream of protocol events into what the turn said: the answer text, the
reasoning, each tool call with its parsed arguments and its result, and a timeline of
the blocks in the order they arrived.

It reads both dialects (``essessey`` and ``anthropic``) and what real providers send:
pings anywhere, keys in any order, an empty first tool input fragment, a transcript
that starts after its ``message_start``. Malformed input never raises: an event that
cannot be read is skipped with one ``WARNING`` on the ``essessey.reassemble`` logger
naming the reason and the event's position (0-based, counting every event fed), never
its content.

:class:`Reassembler` is the incremental core (feed events one at a time, take a
snapshot whenever needed); :func:`reassemble` and :func:`reassemble_events` run it over
a whole :data:`~essessey.event.Source` or iterable.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Final, Literal, TypeAlias

import orjson

from essessey._logsafe import log_label
from essessey.event import Event, Source
from essessey.protocol import BlockType, DeltaType, EventType, Unreadable, read
from essessey.protocol.asking import AskReader, PendingRequest, Waiting

__all__ = [
    "Fragment",
    "ItemKind",
    "OtherItem",
    "ParsedError",
    "ParsedMessage",
    "ParsedStream",
    "ParsedToolCall",
    "ParsedToolResult",
    "Reassembler",
    "TextItem",
    "ThinkingItem",
    "TimelineItem",
    "ToolExecution",
    "ToolResultItem",
    "ToolUseItem",
    "reassemble",
    "reassemble_events",
]

logger = logging.getLogger("essessey.reassemble")

ItemKind: TypeAlias = Literal["thinking", "text", "tool_use", "tool_result", "other"]
"""The kinds of :data:`TimelineItem`."""

_KIND_OF_BLOCK: Final[dict[str, ItemKind]] = {
    BlockType.THINKING: "thinking",
    BlockType.TEXT: "text",
    BlockType.TOOL_USE: "tool_use",
    BlockType.TOOL_RESULT: "tool_result",
}

# For each known block type, the delta types that carry its content and the field each
# one keeps it in. A thinking delta has two spellings: ``text`` (essessey) and
# ``thinking`` (anthropic).
_CONTENT_DELTAS: Final[dict[str, dict[str, tuple[str, ...]]]] = {
    BlockType.TEXT: {DeltaType.TEXT: ("text",)},
    BlockType.THINKING: {
        DeltaType.THINKING: ("thinking", "text"),
        DeltaType.SIGNATURE: ("signature",),
    },
    BlockType.TOOL_USE: {DeltaType.INPUT_JSON: ("partial_json",)},
    BlockType.TOOL_RESULT: {DeltaType.TOOL_RESULT: ("text",)},
}
# What an event name logged as it is looks like (the protocol's names all do).

# -- the records a reassembly produces ---------------------------------------------


@dataclass(frozen=True, slots=True)
class ParsedToolCall:
    """One tool call: who it calls, its arguments as sent, and those parsed as JSON.

    ``params`` is the parsed arguments, or None when they are not valid JSON, in which
    case ``parse_error`` says why (position and reason, never the text). A call whose
    input arrived in no fragment takes the ``input`` of its block start (normally
    ``{}``; one nested too deeply to write back as text leaves ``arguments`` empty and
    ``params`` None, with the reason). ``closed`` is False for a block that never got
    its ``content_block_stop``.
    """

    tool_use_id: str
    name: str
    arguments: str
    params: Any
    parse_error: str | None
    message: int
    index: int
    closed: bool = True
    item_type: str | None = None
    """The provider's own type for a call that is not a plain function call (a Responses
    API ``custom_tool_call``, ``shell_call``, ...), from its block's ``item_type``."""
    caller: dict[str, Any] | None = None
    """What made the call when the model did not (the code of a provider's programmatic
    tool calling, as the provider names it), from its block's ``caller``."""


@dataclass(frozen=True, slots=True)
class ParsedToolResult:
    """One tool result block: the call it answers, its text, and whether it failed."""

    tool_use_id: str
    text: str
    is_error: bool
    message: int
    index: int
    closed: bool = True


@dataclass(frozen=True, slots=True)
class ToolExecution:
    """A tool call and the result that answered it; ``result`` is None when none came."""

    call: ParsedToolCall
    result: str | None
    is_error: bool = False


@dataclass(frozen=True, slots=True)
class ParsedError:
    """An ``error`` event: its type, message and, when the producer sent one, request id."""

    type: str
    message: str
    request_id: str | None = None


@dataclass(frozen=True, slots=True)
class ThinkingItem:
    """Reasoning from consecutive deltas of one thinking block."""

    kind: ClassVar[Literal["thinking"]] = "thinking"
    message: int
    index: int
    text: str
    signature: str | None = None


@dataclass(frozen=True, slots=True)
class TextItem:
    """Answer text from consecutive deltas of one text block."""

    kind: ClassVar[Literal["text"]] = "text"
    message: int
    index: int
    text: str


@dataclass(frozen=True, slots=True)
class ToolUseItem:
    """Where a tool call appeared in the stream."""

    kind: ClassVar[Literal["tool_use"]] = "tool_use"
    message: int
    index: int
    call: ParsedToolCall


@dataclass(frozen=True, slots=True)
class ToolResultItem:
    """Where a tool result appeared in the stream."""

    kind: ClassVar[Literal["tool_result"]] = "tool_result"
    message: int
    index: int
    result: ParsedToolResult


@dataclass(frozen=True, slots=True)
class OtherItem:
    """Something this module does not interpret, kept so nothing is lost.

    An unknown event (one item per event), the events of a block of an unknown type, or
    a run of deltas of an unknown type inside a known block. ``event`` names the event
    that began the item, ``payloads`` are the parsed payloads in stream order, and
    ``message`` is None outside any message.
    """

    kind: ClassVar[Literal["other"]] = "other"
    message: int | None
    index: int | None
    event: str
    block_type: str | None
    payloads: tuple[dict[str, Any], ...]


TimelineItem: TypeAlias = ThinkingItem | TextItem | ToolUseItem | ToolResultItem | OtherItem
"""One entry of a timeline; ``item.kind`` tells which."""


@dataclass(frozen=True, slots=True)
class Fragment:
    """What one fed event added: what a live view needs to render as the stream goes.

    ``event`` is the event's name and ``text`` the content it appended: ``""`` for a
    stop, a signature, or a start that carries no content. ``tool_use_id`` is set on
    tool blocks, ``name`` on tool_use blocks, ``is_error`` on failed tool results. An
    unknown delta type in a known block comes as ``kind="other"``.
    """

    kind: ItemKind
    event: str
    message: int
    index: int
    text: str = ""
    block_type: str | None = None
    tool_use_id: str | None = None
    name: str | None = None
    is_error: bool = False


@dataclass(frozen=True, slots=True)
class _Summary:
    """The fields a message and a whole stream share."""

    text: str = ""
    thinking: str = ""
    signature: str | None = None
    tool_calls: tuple[ParsedToolCall, ...] = ()
    tool_results: tuple[ParsedToolResult, ...] = ()
    executions: tuple[ToolExecution, ...] = ()
    tool_names: tuple[str, ...] = ()
    timeline: tuple[TimelineItem, ...] = ()
    stream_id: str | None = None
    message_id: str | None = None
    model: str | None = None
    stop_reason: str | None = None
    stop_sequence: str | None = None
    stop_details: Mapping[str, Any] | None = None
    usage: Mapping[str, Any] = field(default_factory=dict)
    citations: tuple[Mapping[str, Any], ...] = ()
    error: ParsedError | None = None
    complete: bool = False


@dataclass(frozen=True, slots=True)
class ParsedMessage(_Summary):
    """One message of a stream (``message_start`` to ``message_stop``), reassembled.

    - ``text`` / ``thinking``: every text / thinking block's content, concatenated in
      stream order with no separator, as a provider splits one text over blocks (the
      rounds of an agent loop are blocks too: read them apart from ``timeline``'s
      ``TextItem`` entries).
    - ``signature``: the signature of the last thinking block that carried one (a
      block's signature is its last ``signature_delta``: they replace, not append).
    - ``tool_calls`` / ``tool_results``: in stream order. ``executions``: one per call,
      matched by ``tool_use_id`` to the first later result naming it in this message.
    - ``tool_names``: the called tools' names, each once, in order of first call.
    - ``usage``: ``message_start``'s usage updated key by key by ``message_delta``'s.
    - ``stop_details``: the ``message_delta``'s ``stop_details`` (the provider's account
      of its stop, such as a refusal's category), when it gave one.
    - ``citations``: its text blocks' citations (``citations_delta``), in order.
    - ``error``: the ``error`` event that ended this message, if one did.
    - ``complete``: ``message_stop`` arrived and no error ended the message first.
    - ``implicit``: the events came without a ``message_start`` (a transcript that
      starts mid-message); the message's ids and model are then None.
    """

    implicit: bool = False


@dataclass(frozen=True, slots=True)
class ParsedStream(_Summary):
    """A whole stream reassembled: every message, plus a summary across them.

    ``messages`` keeps each message apart. The summary fields read:

    - ``text``, ``thinking``: the messages' ``text`` / ``thinking`` concatenated in
      order, no separator. ``tool_calls``, ``tool_results``: all messages', in order.
    - ``executions``: calls matched to results across the whole stream (a result in a
      later message still answers an earlier call), first unanswered call first.
    - ``tool_names``: each called tool once, in order of first call.
    - ``timeline``: every item in stream order, including unknown events outside any
      message (``message=None``).
    - ``signature``, ``stream_id``, ``message_id``, ``model``: from the last message
      that has one.
    - ``stop_reason``, ``stop_sequence``, ``stop_details``: the last message's (None if it
      did not say).
    - ``usage``: the messages' usages added key by key (integer counts are summed,
      nested objects are added the same way, any other value is the last one seen).
    - ``error``: the last ``error`` event in the stream, inside a message or not.
    - ``complete``: there is at least one message, the last one saw its
      ``message_stop``, and no ``error`` event came after that.
    """

    messages: tuple[ParsedMessage, ...] = ()
    pending: tuple[PendingRequest, ...] = ()
    """What the stream waits for from its client, when its last message that asks was
    not continued yet (docs/asking.md): approval requests, client calls, questions."""
    waiting: Waiting | None = None
    """The stream's last message that asked, its requests and, once a message continued
    it, the answers that message recorded; None when no message asked."""


# -- internal state -------------------------------------------------------------------


class _Block:
    """A content block of a message while it is read."""

    __slots__ = (
        "arguments",
        "caller",
        "closed",
        "index",
        "initial_input",
        "is_error",
        "item_type",
        "kind",
        "message",
        "name",
        "params",
        "parse_error",
        "parts",
        "signature",
        "tool_use_id",
        "type",
    )

    def __init__(self, message: int, index: int, block_type: str, kind: ItemKind) -> None:
        self.message = message
        self.index = index
        self.type = block_type
        self.kind: ItemKind = kind
        self.closed = False
        # Fragments are appended and joined once, at the block's stop: linear in size.
        self.parts: list[str] = []
        # A signature is not streamed in pieces: each signature_delta replaces the last,
        # as the Anthropic SDK reads it.
        self.signature: str | None = None
        self.tool_use_id: str | None = None
        self.name: str | None = None
        self.initial_input: Any = None
        self.item_type: str | None = None
        self.caller: dict[str, Any] | None = None
        self.is_error = False
        self.arguments: str | None = None
        self.params: Any = None
        self.parse_error: str | None = None

    def close(self) -> None:
        self.closed = True
        self.settle()

    def settle(self) -> None:
        """Assemble (and for a call, parse) a tool block's content, once: at its stop,
        or when its message ends with the block still open."""
        if self.kind == "tool_use" and self.arguments is None:
            self.arguments, self.params, self.parse_error = self._assemble_input()
            self.parts = []
        elif self.kind == "tool_result" and len(self.parts) > 1:
            self.parts = ["".join(self.parts)]

    def _assemble_input(self) -> tuple[str, Any, str | None]:
        arguments = "".join(self.parts)
        if not arguments:
            initial = self.initial_input if isinstance(self.initial_input, dict) else {}
            if not initial:
                return "", initial, None
            text = _write_input(initial)
            if text is None:
                return "", None, "the block's input is nested too deeply to write as JSON"
            return text, initial, None
        params, error = _parse_arguments(arguments)
        return arguments, params, error

    def call(self) -> ParsedToolCall:
        if self.arguments is not None:
            arguments, params, error = self.arguments, self.params, self.parse_error
        else:
            arguments, params, error = self._assemble_input()
        return ParsedToolCall(
            self.tool_use_id or "",
            self.name or "",
            arguments,
            params,
            error,
            self.message,
            self.index,
            self.closed,
            self.item_type,
            self.caller,
        )

    def result(self) -> ParsedToolResult:
        return ParsedToolResult(
            self.tool_use_id or "",
            "".join(self.parts),
            self.is_error,
            self.message,
            self.index,
            self.closed,
        )


class _Run:
    """A timeline item while it is read: consecutive events of one block (or one
    unknown event)."""

    __slots__ = ("block", "block_type", "event", "index", "kind", "message", "parts", "payloads")

    def __init__(
        self,
        kind: ItemKind,
        message: int | None,
        index: int | None,
        *,
        block: _Block | None = None,
        event: str = "",
        block_type: str | None = None,
    ) -> None:
        self.kind: ItemKind = kind
        self.message = message
        self.index = index
        self.block = block
        self.event = event
        self.block_type = block_type
        self.parts: list[str] = []
        self.payloads: list[dict[str, Any]] = []

    def item(
        self, calls: dict[int, ParsedToolCall], results: dict[int, ParsedToolResult]
    ) -> TimelineItem:
        block = self.block
        message = self.message if self.message is not None else -1
        index = self.index if self.index is not None else -1
        if self.kind == "text":
            return TextItem(message, index, "".join(self.parts))
        if self.kind == "thinking":
            signature = block.signature if block is not None else None
            return ThinkingItem(message, index, "".join(self.parts), signature)
        if self.kind == "tool_use" and block is not None:
            return ToolUseItem(message, index, calls[id(block)])
        if self.kind == "tool_result" and block is not None:
            return ToolResultItem(message, index, results[id(block)])
        return OtherItem(
            self.message, self.index, self.event, self.block_type, tuple(self.payloads)
        )


class _Message:
    """A message while it is read."""

    __slots__ = (
        "blocks",
        "citations",
        "error",
        "implicit",
        "message_id",
        "model",
        "number",
        "runs",
        "stop_details",
        "stop_reason",
        "stop_sequence",
        "stopped",
        "stream_id",
        "usage",
    )

    def __init__(self, number: int, *, implicit: bool) -> None:
        self.number = number
        self.implicit = implicit
        self.message_id: str | None = None
        self.stream_id: str | None = None
        self.model: str | None = None
        self.stop_reason: str | None = None
        self.stop_sequence: str | None = None
        self.stop_details: dict[str, Any] | None = None
        self.usage: dict[str, Any] = {}
        self.citations: list[dict[str, Any]] = []
        self.error: ParsedError | None = None
        self.stopped = False
        self.blocks: dict[int, _Block] = {}
        self.runs: list[_Run] = []


class _Skip(Exception):
    """An event cannot be read; the message is the reason (never payload content)."""


# -- the reassembler ---------------------------------------------------------------


class Reassembler:
    """Reads protocol events one at a time and builds a :class:`ParsedStream`.

    :meth:`feed` costs time proportional to the event's size (tool input fragments are
    collected and joined once, when their block stops). :meth:`result` is a snapshot
    that may be taken at any point, costing time proportional to the stream so far; a
    live view should use what :meth:`feed` returns instead of a snapshot per event.
    """

    __slots__ = (
        "_asks",
        "_current",
        "_error_after_stop",
        "_messages",
        "_position",
        "_stream_error",
        "_timeline",
    )

    def __init__(self) -> None:
        self._position = 0
        self._asks = AskReader()
        self._messages: list[_Message] = []
        self._current: _Message | None = None
        self._timeline: list[_Run] = []
        self._stream_error: ParsedError | None = None
        # An error outside any message, since the last message ended: the stream
        # cannot be complete then, whatever that message said.
        self._error_after_stop = False

    @property
    def position(self) -> int:
        """How many events have been fed."""
        return self._position

    def feed(self, event: Event) -> Fragment | None:
        """Read one event; return what it added to a content block, if anything.

        Never raises on malformed input: an unreadable event is skipped with a WARNING.
        """
        position = self._position
        self._position += 1
        self._asks.feed(event)
        name = event.event
        if name == EventType.PING:
            return None  # keep-alive: may carry no data at all
        record = read(event)
        payload = record.payload
        if not isinstance(payload, dict):
            assert isinstance(record, Unreadable)
            _warn(position, name, record.reason, event if payload is None else None)
            return None
        if name not in EventType.ALL and name in ("", "message"):
            # An SSE frame without an ``event:`` line: the payload names itself.
            named = payload.get("type")
            if isinstance(named, str) and named in EventType.ALL:
                name = named
        try:
            return self._dispatch(position, name, payload)
        except _Skip as skip:
            _warn(position, name, str(skip))
            return None

    def result(self) -> ParsedStream:
        """A snapshot of everything read so far (open blocks as far as they got)."""
        calls: dict[int, ParsedToolCall] = {}
        results: dict[int, ParsedToolResult] = {}
        for message in self._messages:
            for block in message.blocks.values():
                if block.kind == "tool_use":
                    calls[id(block)] = block.call()
                elif block.kind == "tool_result":
                    results[id(block)] = block.result()
        items: dict[int, TimelineItem] = {
            id(run): run.item(calls, results) for run in self._timeline
        }
        parsed = tuple(self._message_result(message, items) for message in self._messages)
        timeline = tuple(items[id(run)] for run in self._timeline)
        result = _stream_result(parsed, timeline, self._stream_error, self._error_after_stop)
        asked = self._asks.waiting()
        if asked is None:
            return result
        pending = () if asked.continued else asked.requests
        return replace(result, waiting=asked, pending=pending)

    # -- dispatch ----------------------------------------------------------------------

    def _dispatch(self, position: int, name: str, payload: dict[str, Any]) -> Fragment | None:
        if name == EventType.CONTENT_BLOCK_DELTA:
            return self._delta(position, payload)
        if name == EventType.CONTENT_BLOCK_START:
            return self._block_start(position, payload)
        if name == EventType.CONTENT_BLOCK_STOP:
            return self._block_stop(position, payload)
        if name == EventType.MESSAGE_START:
            self._message_start(position, payload)
        elif name == EventType.MESSAGE_DELTA:
            self._message_delta(position, payload)
        elif name == EventType.MESSAGE_STOP:
            self._message_stop()
        elif name == EventType.ERROR:
            self._error(payload)
        else:
            current = self._current
            run = _Run("other", current.number if current else None, None, event=name)
            run.payloads.append(payload)
            self._add_run(run)
        return None

    def _message_start(self, position: int, payload: dict[str, Any]) -> None:
        message = payload.get("message")
        if not isinstance(message, dict):
            raise _Skip("message_start has no message object")
        ids = {key: message.get(key) for key in ("id", "stream_id", "model")}
        for key, value in ids.items():
            if value is not None and not isinstance(value, str):
                raise _Skip(f"message.{key} is a {type(value).__name__}, not a string")
        usage = message.get("usage")
        if usage is not None and not isinstance(usage, dict):
            raise _Skip("message.usage is not an object")
        if self._current is not None:
            logger.warning("event #%d message_start: the previous message never stopped", position)
        started = self._open_message(implicit=False)
        started.message_id = ids["id"]
        started.stream_id = ids["stream_id"]
        started.model = ids["model"]
        if usage:
            started.usage.update(usage)
        # The message may come whole in its start (Anthropic's programmatic tool calls:
        # content and stop reason given, then message_stop). Read as the Anthropic
        # SDK's accumulator reads it: the start's message is the snapshot.
        content = message.get("content")
        if isinstance(content, list):
            for k, block in enumerate(content):
                start = {"type": EventType.CONTENT_BLOCK_START, "index": k, "content_block": block}
                try:
                    self._block_start(position, start)
                    self._block_stop(position, {"type": EventType.CONTENT_BLOCK_STOP, "index": k})
                except _Skip as skip:
                    _warn(position, EventType.MESSAGE_START, f"message.content[{k}]: {skip}")
        for key in ("stop_reason", "stop_sequence"):
            value = message.get(key)
            if isinstance(value, str):
                setattr(started, key, value)

    def _message_delta(self, position: int, payload: dict[str, Any]) -> None:
        delta = payload.get("delta")
        if not isinstance(delta, dict):
            raise _Skip("message_delta has no delta object")
        for key in ("stop_reason", "stop_sequence"):
            value = delta.get(key)
            if value is not None and not isinstance(value, str):
                raise _Skip(f"delta.{key} is a {type(value).__name__}, not a string")
        usage = payload.get("usage")
        if usage is not None and not isinstance(usage, dict):
            raise _Skip("usage is not an object")
        message = self._require_message(position, EventType.MESSAGE_DELTA)
        if "stop_reason" in delta:
            message.stop_reason = delta["stop_reason"]
        if "stop_sequence" in delta:
            message.stop_sequence = delta["stop_sequence"]
        details = delta.get("stop_details")
        if isinstance(details, dict):
            message.stop_details = details
        if usage:
            message.usage.update(usage)

    def _message_stop(self) -> None:
        message = self._current
        if message is None:
            raise _Skip("message_stop with no message open")
        self._end_message(message)
        message.stopped = True

    def _error(self, payload: dict[str, Any]) -> None:
        error = payload.get("error")
        if not isinstance(error, dict):
            raise _Skip("error has no error object")
        error_type, message_text = error.get("type"), error.get("message")
        if not isinstance(error_type, str) or not isinstance(message_text, str):
            raise _Skip("error.type and error.message must be strings")
        request_id = payload.get("request_id", error.get("request_id"))
        if request_id is not None and not isinstance(request_id, str):
            raise _Skip(f"request_id is a {type(request_id).__name__}, not a string")
        parsed = ParsedError(error_type, message_text, request_id)
        self._stream_error = parsed
        message = self._current
        if message is not None:
            # An error ends the message it interrupts, as the checker sees it.
            message.error = parsed
            self._end_message(message)
        elif self._messages:
            self._error_after_stop = True

    def _block_start(self, position: int, payload: dict[str, Any]) -> Fragment | None:
        index = _index_of(payload)
        block_data = payload.get("content_block")
        if not isinstance(block_data, dict):
            raise _Skip("content_block_start has no content_block object")
        block_type = block_data.get("type")
        if not isinstance(block_type, str):
            raise _Skip("content_block has no string type")
        kind = _KIND_OF_BLOCK.get(block_type, "other")
        block = _Block(-1, index, block_type, kind)
        initial = ""
        if kind == "tool_use":
            tool_use_id, name = block_data.get("id"), block_data.get("name")
            if not isinstance(tool_use_id, str) or not isinstance(name, str):
                raise _Skip("tool_use block needs a string id and name")
            block.tool_use_id, block.name = tool_use_id, name
            block.initial_input = block_data.get("input")
            item_type = block_data.get("item_type")
            block.item_type = item_type if isinstance(item_type, str) else None
            caller = block_data.get("caller")
            block.caller = caller if isinstance(caller, dict) else None
        elif kind == "tool_result":
            tool_use_id = block_data.get("tool_use_id")
            is_error = block_data.get("is_error", False)
            if not isinstance(tool_use_id, str):
                raise _Skip("tool_result block needs a string tool_use_id")
            if not isinstance(is_error, bool):
                raise _Skip(f"is_error is a {type(is_error).__name__}, not a boolean")
            block.tool_use_id, block.is_error = tool_use_id, is_error
        elif kind in ("text", "thinking"):
            # The anthropic dialect starts these blocks with an empty field; a provider
            # may put content there, and its SDK keeps it, so do we.
            given = block_data.get(block_type)
            if given is not None and not isinstance(given, str):
                raise _Skip(f"content_block.{block_type} is not a string")
            initial = given or ""
            signature = block_data.get("signature")
            if signature is not None and not isinstance(signature, str):
                raise _Skip("content_block.signature is not a string")
            if kind == "thinking" and signature:
                block.signature = signature
        message = self._require_message(position, EventType.CONTENT_BLOCK_START)
        if index in message.blocks:
            raise _Skip(f"block {index} was already started in this message")
        block.message = message.number
        message.blocks[index] = block
        run = _Run(kind, message.number, index, block=block, block_type=block_type)
        if initial:
            run.parts.append(initial)
        if kind == "other":
            run.event = EventType.CONTENT_BLOCK_START
            run.payloads.append(payload)
        self._add_run(run)
        return _fragment(block, EventType.CONTENT_BLOCK_START, initial)

    def _delta(self, position: int, payload: dict[str, Any]) -> Fragment | None:
        index = _index_of(payload)
        delta = payload.get("delta")
        if not isinstance(delta, dict):
            raise _Skip("content_block_delta has no delta object")
        delta_type = delta.get("type")
        if not isinstance(delta_type, str):
            raise _Skip("delta has no string type")
        block = self._open_block(position, index, "delta")
        if block.kind == "other":
            self._extend_other(block, payload, EventType.CONTENT_BLOCK_DELTA)
            return _fragment(block, EventType.CONTENT_BLOCK_DELTA, "")
        fields = _CONTENT_DELTAS[block.type].get(delta_type)
        citation = delta.get("citation") if delta_type == "citations_delta" else None
        if isinstance(citation, dict) and block.kind == "text":
            # A text block's citation (the Anthropic format's, and what the Responses
            # adapter makes of an annotation): kept with the message, and, as any
            # delta without text, in the timeline.
            self._messages[block.message].citations.append(citation)
        if fields is None:
            if delta_type in DeltaType.KNOWN:
                raise _Skip(f"{delta_type} does not belong in a {block.type} block")
            self._extend_other(block, payload, EventType.CONTENT_BLOCK_DELTA)
            return Fragment(
                "other", EventType.CONTENT_BLOCK_DELTA, block.message, block.index, "", block.type
            )
        text = _first_string(delta, fields)
        if text is None:
            raise _Skip(f"{delta_type} has no string {' or '.join(fields)} field")
        if delta_type == DeltaType.SIGNATURE:
            block.signature = text
            self._run_for(block)
            return _fragment(block, EventType.CONTENT_BLOCK_DELTA, "")
        run = self._run_for(block)
        # Text and reasoning live in their timeline items; tool blocks keep their own
        # parts, because a call's input is one value however its deltas were split.
        if block.kind in ("text", "thinking"):
            run.parts.append(text)
        else:
            block.parts.append(text)
        return _fragment(block, EventType.CONTENT_BLOCK_DELTA, text)

    def _block_stop(self, position: int, payload: dict[str, Any]) -> Fragment | None:
        index = _index_of(payload)
        block = self._open_block(position, index, "stop")
        block.close()
        if block.kind == "other":
            self._extend_other(block, payload, EventType.CONTENT_BLOCK_STOP)
        return _fragment(block, EventType.CONTENT_BLOCK_STOP, "")

    # -- helpers -----------------------------------------------------------------------

    def _open_message(self, *, implicit: bool) -> _Message:
        if self._current is not None:
            self._end_message(self._current)
        message = _Message(len(self._messages), implicit=implicit)
        self._error_after_stop = False
        self._messages.append(message)
        self._current = message
        return message

    def _end_message(self, message: _Message) -> None:
        # Blocks left open are assembled as they are, so their calls still parse.
        for block in message.blocks.values():
            if not block.closed:
                block.settle()
        self._current = None

    def _require_message(self, position: int, name: str) -> _Message:
        if self._current is not None:
            return self._current
        logger.warning(
            "event #%d %s: no message is open; reading it into an implicit message",
            position,
            name,
        )
        return self._open_message(implicit=True)

    def _open_block(self, position: int, index: int, what: str) -> _Block:
        message = self._current
        if message is None:
            raise _Skip(f"{what} for block {index} with no message open")
        block = message.blocks.get(index)
        if block is None:
            raise _Skip(f"{what} for block {index}, which was never started")
        if block.closed:
            raise _Skip(f"{what} for block {index}, which is already stopped")
        return block

    def _add_run(self, run: _Run) -> None:
        self._timeline.append(run)
        if run.message is not None:
            self._messages[run.message].runs.append(run)

    def _run_for(self, block: _Block) -> _Run:
        """The timeline item a delta of ``block`` extends: the last one, if it is the
        block's; a new one when something else came in between."""
        runs = self._messages[block.message].runs
        if runs and runs[-1].block is block and runs[-1].kind == block.kind:
            return runs[-1]
        run = _Run(block.kind, block.message, block.index, block=block, block_type=block.type)
        self._add_run(run)
        return run

    def _extend_other(self, block: _Block, payload: dict[str, Any], event: str) -> None:
        runs = self._messages[block.message].runs
        last = runs[-1] if runs else None
        if last is None or last.block is not block or last.kind != "other":
            last = _Run(
                "other", block.message, block.index, block=block, event=event, block_type=block.type
            )
            self._add_run(last)
        last.payloads.append(payload)

    def _message_result(self, message: _Message, items: dict[int, TimelineItem]) -> ParsedMessage:
        timeline = tuple(items[id(run)] for run in message.runs)
        calls, results, executions = _tools(timeline)
        return ParsedMessage(
            text="".join(item.text for item in timeline if isinstance(item, TextItem)),
            thinking="".join(item.text for item in timeline if isinstance(item, ThinkingItem)),
            signature=_last_signature(message),
            tool_calls=calls,
            tool_results=results,
            executions=executions,
            tool_names=_names(calls),
            timeline=timeline,
            stream_id=message.stream_id,
            message_id=message.message_id,
            model=message.model,
            stop_reason=message.stop_reason,
            stop_sequence=message.stop_sequence,
            stop_details=message.stop_details,
            usage=dict(message.usage),
            citations=tuple(message.citations),
            error=message.error,
            complete=message.stopped and message.error is None,
            implicit=message.implicit,
        )


# -- running it --------------------------------------------------------------------


async def reassemble(source: Source) -> ParsedStream:
    """Read a whole :data:`~essessey.event.Source` and reassemble it.

    A transport failure raised by the source propagates; malformed events do not raise.
    """
    reassembler = Reassembler()
    async for event in source:
        reassembler.feed(event)
    return reassembler.result()


def reassemble_events(events: Iterable[Event]) -> ParsedStream:
    """Reassemble a recorded stream (a list of events, an ``InMemorySink``'s events)."""
    reassembler = Reassembler()
    for event in events:
        reassembler.feed(event)
    return reassembler.result()


# -- small pure helpers ----------------------------------------------------------------


def _warn(position: int, name: str, reason: str, event: Event | None = None) -> None:
    # Names, positions, reasons and sizes only: payload content never reaches a log.
    name = log_label(name)
    if event is not None:
        logger.warning(
            "skipping event #%d %s (%d bytes): %s", position, name, len(event.data), reason
        )
    else:
        logger.warning("skipping event #%d %s: %s", position, name, reason)


def _index_of(payload: dict[str, Any]) -> int:
    index = payload.get("index")
    if type(index) is not int or index < 0:
        raise _Skip("index is missing or not a non-negative integer")
    return index


def _first_string(delta: dict[str, Any], fields: tuple[str, ...]) -> str | None:
    for name in fields:
        value = delta.get(name)
        if isinstance(value, str):
            return value
    return None


def _fragment(block: _Block, event: str, text: str) -> Fragment:
    return Fragment(
        block.kind,
        event,
        block.message,
        block.index,
        text,
        block.type,
        block.tool_use_id,
        block.name,
        block.is_error,
    )


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _write_input(value: dict[str, Any]) -> str | None:
    """A block start's input as JSON text, or None when it is nested too deeply.

    orjson parses 1024 levels of nesting but writes only 255, so an input it parsed may
    be one it cannot write; the standard library's writer then takes it (up to Python's
    recursion limit).
    """
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        pass
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except RecursionError:
        return None


def _parse_arguments(arguments: str) -> tuple[Any, str | None]:
    """Parse a tool call's arguments: the value and None, or None and why not.

    The standard library's parser keeps integers of any size exact (orjson would turn
    a large one into a float); arguments are small next to the stream, so its speed is
    no concern. NaN and Infinity are refused, as JSON does.
    """
    try:
        return json.loads(arguments, parse_constant=_reject_constant), None
    except json.JSONDecodeError as exc:
        return None, f"{exc.msg} at char {exc.pos}"
    except (ValueError, RecursionError) as exc:
        return None, str(exc) if isinstance(exc, ValueError) else "nested too deeply"


def _tools(
    timeline: Iterable[TimelineItem],
) -> tuple[tuple[ParsedToolCall, ...], tuple[ParsedToolResult, ...], tuple[ToolExecution, ...]]:
    """The calls and results of a timeline, and each call paired with the first later
    result naming its ``tool_use_id`` (the earliest unanswered call of that id first)."""
    calls: list[ParsedToolCall] = []
    results: list[ParsedToolResult] = []
    pending: dict[str, deque[ParsedToolCall]] = {}
    answers: dict[int, ParsedToolResult] = {}
    seen: set[int] = set()
    for item in timeline:
        # A block split into several items (its deltas interleaved) is still one record.
        if isinstance(item, ToolUseItem) and id(item.call) not in seen:
            seen.add(id(item.call))
            calls.append(item.call)
            pending.setdefault(item.call.tool_use_id, deque()).append(item.call)
        elif isinstance(item, ToolResultItem) and id(item.result) not in seen:
            seen.add(id(item.result))
            results.append(item.result)
            waiting = pending.get(item.result.tool_use_id)
            if waiting:
                answers[id(waiting.popleft())] = item.result
    executions: list[ToolExecution] = []
    for call in calls:
        result = answers.get(id(call))
        if result is None:
            executions.append(ToolExecution(call, None, False))
        else:
            executions.append(ToolExecution(call, result.text, result.is_error))
    return tuple(calls), tuple(results), tuple(executions)


def _names(calls: Iterable[ParsedToolCall]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(call.name for call in calls))


def _last_signature(message: _Message) -> str | None:
    signature: str | None = None
    for run in message.runs:
        block = run.block
        if block is not None and block.kind == "thinking":
            signature = block.signature or signature
    return signature


def _add_usage(total: dict[str, Any], usage: Mapping[str, Any]) -> None:
    for key, value in usage.items():
        previous = total.get(key)
        if _is_count(value) and _is_count(previous):
            total[key] = previous + value
        elif isinstance(value, Mapping):
            nested: dict[str, Any] = dict(previous) if isinstance(previous, Mapping) else {}
            _add_usage(nested, value)
            total[key] = nested
        else:
            total[key] = value


def _is_count(value: Any) -> bool:
    return type(value) is int


def _last(values: Iterable[str | None]) -> str | None:
    found: str | None = None
    for value in values:
        if value is not None:
            found = value
    return found


def _stream_result(
    messages: tuple[ParsedMessage, ...],
    timeline: tuple[TimelineItem, ...],
    last_error: ParsedError | None,
    error_after_stop: bool,
) -> ParsedStream:
    calls, results, executions = _tools(timeline)
    usage: dict[str, Any] = {}
    for message in messages:
        _add_usage(usage, message.usage)
    last = messages[-1] if messages else None
    return ParsedStream(
        text="".join(message.text for message in messages),
        thinking="".join(message.thinking for message in messages),
        signature=_last(message.signature for message in messages),
        tool_calls=calls,
        tool_results=results,
        executions=executions,
        tool_names=_names(calls),
        timeline=timeline,
        stream_id=_last(message.stream_id for message in messages),
        message_id=_last(message.message_id for message in messages),
        model=_last(message.model for message in messages),
        stop_reason=last.stop_reason if last else None,
        stop_sequence=last.stop_sequence if last else None,
        stop_details=last.stop_details if last else None,
        usage=usage,
        citations=tuple(c for message in messages for c in message.citations),
        error=last_error,
        complete=last is not None and last.complete and not error_after_stop,
        messages=messages,
    )
