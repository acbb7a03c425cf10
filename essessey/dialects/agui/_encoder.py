"""The agui dialect's encoder: the protocol's events as its frames (see the package)."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Collection
from datetime import UTC, datetime
from typing import Any, Final

import orjson

from essessey.dialects._payload import TurnUsage, call_arguments, message_delta_totals
from essessey.dialects.base import DialectEncoder
from essessey.protocol import BlockType, DeltaType, StopReason

__all__ = [
    "APPROVAL_REASON",
    "APPROVAL_SCHEMA",
    "BLOCK_EVENT",
    "CITATION_EVENT",
    "DEFAULT_MAX_BUFFER",
    "QUESTION_REASON",
    "AGUIEncoder",
    "error_object",
    "run_stream_id",
]

logger = logging.getLogger("essessey.dialects.agui")

BLOCK_EVENT: Final = "essessey-block"
"""The name of the ``CUSTOM`` event that carries a block AG-UI has no events for."""

CITATION_EVENT: Final = "essessey-citation"
"""The name of the ``CUSTOM`` event that carries a text message's citation
(``{"messageId", "citation"}``): AG-UI has no event for one."""

DEFAULT_MAX_BUFFER: Final = 16 * 1024 * 1024
"""Bytes of one block held until its stop (a tool result, a block carried whole)."""

APPROVAL_REASON: Final = "tool_approval"
"""The ``reason`` of the interrupt an approval request is (its ``toolCallId``: the call it
gates)."""

QUESTION_REASON: Final = "question"
"""The ``reason`` of the interrupt a question is (its ``message``: the question)."""

APPROVAL_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {"approved": {"type": "boolean"}, "reason": {"type": "string"}},
    "required": ["approved"],
}
"""The ``responseSchema`` of an approval's interrupt: the payload of a ``resolved`` resume
entry that answers it (a ``resolved`` entry without a payload approves)."""

_QUIET: Final = "quiet"  # a block written as nothing: a request (an interrupt), a record
_RECORDS: Final = frozenset({BlockType.APPROVAL_RESPONSE, BlockType.ANSWER})

_REDACTED: Final = "redacted_thinking"
_TEXT_CONTENT: Final = b'data: {"type":"TEXT_MESSAGE_CONTENT","messageId":%b,"delta":%b}\n\n'
"""A text delta's frame, as :func:`_frame` writes it, with its id and text filled in."""
# The quick path's names, module globals rather than class attributes looked up per call.
_TEXT: Final = BlockType.TEXT


def error_object(error_type: str, message: str) -> bytes:
    """The JSON of an error answered before a stream: ``{"type": "RUN_ERROR", "message",
    "code"}``, the event an AG-UI client reads for a failed run."""
    return orjson.dumps({"type": "RUN_ERROR", "message": message, "code": error_type})


def run_stream_id(thread_id: str, run_id: str) -> str:
    """The hub stream a run is served from: the same for the same thread and run on
    every replica (so a run posted again resumes it), whatever characters the ids hold."""
    digest = hashlib.sha256(orjson.dumps([thread_id, run_id])).hexdigest()[:32]
    return f"agui-{digest}"


def _frame(event: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(event) + b"\n\n"


def _iso(seconds: Any) -> str | None:
    """A request's ``expires_at`` (seconds since the epoch) as AG-UI's ISO 8601 text."""
    if type(seconds) is not int:
        return None
    try:
        moment = datetime.fromtimestamp(seconds, UTC)
    except (OverflowError, OSError, ValueError):
        return None
    return moment.isoformat().replace("+00:00", "Z")


def _interrupt(kind: str, block: dict[str, Any]) -> dict[str, Any]:
    """The AG-UI ``Interrupt`` of an ``approval_request`` or ``question`` block."""
    interrupt: dict[str, Any] = {"id": str(block["id"])}
    if kind == BlockType.APPROVAL_REQUEST:
        interrupt["reason"] = APPROVAL_REASON
        interrupt["toolCallId"] = str(block["tool_use_id"])
        reason = block.get("reason")
        if isinstance(reason, str) and reason:
            interrupt["message"] = reason
        interrupt["responseSchema"] = APPROVAL_SCHEMA
    else:
        interrupt["reason"] = QUESTION_REASON
        if isinstance(block.get("tool_use_id"), str):
            interrupt["toolCallId"] = block["tool_use_id"]
        interrupt["message"] = str(block.get("question", ""))
        schema = block.get("schema")
        if isinstance(schema, dict):
            interrupt["responseSchema"] = schema
    expires_at = _iso(block.get("expires_at"))
    if expires_at is not None:
        interrupt["expiresAt"] = expires_at
    return interrupt


class _Block:
    __slots__ = ("deltas", "id", "id_json", "kind", "parts", "signature", "size", "start")

    def __init__(self, kind: str, block_id: str, start: dict[str, Any]) -> None:
        self.kind = kind
        self.id = block_id
        self.id_json = orjson.dumps(block_id)  # for the frames spliced without a dict
        self.start = start
        self.parts: list[str] = []
        self.deltas: list[Any] = []
        self.signature: str | None = None
        self.size = 0


_USAGE_DETAILS: Final = (
    ("cache_read_input_tokens", "cachedInputTokens"),
    ("cache_creation_input_tokens", "cacheWriteInputTokens"),
    ("reasoning_tokens", "reasoningTokens"),
)
"""The protocol's usage keys AG-UI's ``TokenUsage`` has a field for, and the field."""


class AGUIEncoder(DialectEncoder):
    """One turn's protocol events, in order, as AG-UI events (a
    :class:`~essessey.bindings.sse.FrameEncoder`) for the run ``run_id`` of the thread
    ``thread_id``. ``max_buffer`` bounds the bytes of one block held until its stop.

    A message that asks (docs/asking.md) ends the run: its approval requests and
    questions are the interrupts of ``RUN_FINISHED``'s ``outcome`` (``{"type":
    "interrupt"}``), written as nothing else; a message that asks only for client calls
    (its tool calls without a result) ends it with ``{"type": "success",
    "pendingToolCallIds": [...]}``. ``after`` makes it the run that continues the turn
    after that event (the asking message's last): the events up to it are not written,
    nor the records of the answers that open the continuation (``approval_response`` and
    ``answer`` blocks, and the results of the client calls ``answered_calls``, which the
    client sent)."""

    log = logger

    def __init__(
        self,
        thread_id: str,
        run_id: str,
        *,
        max_buffer: int = DEFAULT_MAX_BUFFER,
        after: str | None = None,
        answered_calls: Collection[str] = (),
    ) -> None:
        if max_buffer <= 0:
            raise ValueError("max_buffer must be > 0")
        self.thread_id = thread_id
        self.run_id = run_id
        self.max_buffer = max_buffer
        self._started = False
        self.ended = False
        self._step = 0
        self._in_step = False  # a STEP_STARTED not yet finished
        self._after_results = False  # the step's last block was a tool result
        self._message_id = ""
        self._blocks: dict[int, _Block] = {}
        self._stop_reason: str | None = None
        self._delta: dict[str, Any] | None = None
        self._model: str | None = None
        self._usage = TurnUsage()
        # The message's tool calls, their results, its interrupts and the calls they gate.
        self._calls: list[str] = []
        self._results: set[str] = set()
        self._interrupts: list[dict[str, Any]] = []
        self._gated: set[str] = set()
        self._records = frozenset(answered_calls)  # client calls answered (first message)
        self._messages = 0
        self.start_after(after)

    # -- FrameEncoder --------------------------------------------------------------------

    def encode_text(self, index: int, text: str, text_json: bytes) -> bytes | None:
        """One ``TEXT_MESSAGE_CONTENT`` of ``text`` (nothing for an empty one) for block
        ``index``; None when that is not an open text block."""
        block = self._blocks.get(index) if self._step and not self.ended else None
        if block is None or block.kind != _TEXT:
            return None
        return _TEXT_CONTENT % (block.id_json, text_json) if text else b""

    def finish(self) -> bytes:
        """``RUN_FINISHED`` if no message ended the run yet: after the ends of the blocks
        and the step still open (a stream that ended inside its message), which the
        client requires before the run's end."""
        if self.ended:
            return b""
        frames = [] if self._started else self._run_started()
        for index in sorted(self._blocks):
            frames += self.on_block_stop(index)
        if self._in_step:
            self._in_step = False
            frames.append(_frame({"type": "STEP_FINISHED", "stepName": self._step_name()}))
        return b"".join(frames + self._end())

    def fail(self, error_type: str, message: str) -> bytes:
        """``RUN_ERROR``."""
        if self.ended:
            return b""
        frames = [] if self._started else self._run_started()
        return b"".join(frames + self._error(error_type, message))

    # -- the events ----------------------------------------------------------------------

    def _run_started(self) -> list[bytes]:
        self._started = True
        return [_frame({"type": "RUN_STARTED", "threadId": self.thread_id, "runId": self.run_id})]

    # -- the hooks (essessey.dialects.base) -------------------------------------------------

    def in_message(self) -> bool:
        """Whether a message has started a step."""
        return bool(self._step)

    def on_error(self, error: Any) -> list[bytes]:
        """``RUN_ERROR`` (after ``RUN_STARTED`` when nothing started the run yet)."""
        frames = [] if self._started else self._run_started()
        kind = str(error.get("type") or "api_error")
        return frames + self._error(kind, str(error.get("message") or ""))

    def on_message_delta(self, payload: dict[str, Any]) -> list[bytes]:
        """Nothing yet: the stop reason and usage go into the step's and run's end."""
        self._delta = payload
        reason, _ = message_delta_totals(payload)
        if reason is not None:
            self._stop_reason = reason
        self._usage.message_delta(payload)
        return []

    def on_message_stop(self) -> list[bytes]:
        """``STEP_FINISHED``, then the run's end unless the turn goes on (tool use, every
        call with its result); a message that asks ends the run with its outcome."""
        step: dict[str, Any] = {"type": "STEP_FINISHED", "stepName": self._step_name()}
        self._in_step = False
        if self._delta is not None:
            step["rawEvent"] = self._delta
        frames = [_frame(step)]
        if self._stop_reason == StopReason.CANCELLED:
            return frames + self._error("CANCELLED", "the turn was cancelled")
        if self._stop_reason is not None and self._stop_reason != StopReason.TOOL_USE:
            return frames + self._end()
        if self._stop_reason == StopReason.TOOL_USE:
            if self._interrupts:
                outcome = {"type": "interrupt", "interrupts": self._interrupts}
                return frames + self._end(outcome)
            gated, results = self._gated, self._results
            pending = [c for c in self._calls if c not in results and c not in gated]
            if pending:
                return frames + self._end({"type": "success", "pendingToolCallIds": pending})
        return frames

    def _step_name(self) -> str:
        return f"round {self._step}"

    def on_message_start(self, message: dict[str, Any], payload: dict[str, Any]) -> list[bytes]:
        """``STEP_STARTED`` (after ``RUN_STARTED`` for the turn's first message)."""
        frames = [] if self._started else self._run_started()
        self._step += 1
        self._after_results = False
        self._blocks.clear()
        self._stop_reason = None
        self._delta = None
        self._calls = []
        self._results = set()
        self._interrupts = []
        self._gated = set()
        self._messages += 1
        if self._messages > 1:
            self._records = frozenset()  # records open the continuation's first message
        message_id = message.get("id")
        self._message_id = str(message_id) if message_id else f"{self.run_id}-{self._step}"
        model = message.get("model")
        if isinstance(model, str) and model:
            self._model = model
        self._usage.message_start(message)
        self._in_step = True
        return [*frames, _frame({"type": "STEP_STARTED", "stepName": self._step_name()})]

    def on_block_start(self, index: int, start: dict[str, Any]) -> list[bytes]:
        """The block's start event, by its kind."""
        kind = str(start.get("type"))
        quiet = self._quiet(kind, start)
        if quiet:
            self._blocks[index] = _Block(_QUIET, f"{self._message_id}-{index}", start)
            return []
        out: list[bytes] = []
        if kind == BlockType.TOOL_RESULT:
            self._after_results = True
            self._results.add(str(start.get("tool_use_id")))
        elif self._after_results:
            # The next model round of the same message: a step of its own.
            self._after_results = False
            out.append(_frame({"type": "STEP_FINISHED", "stepName": self._step_name()}))
            self._step += 1
            out.append(_frame({"type": "STEP_STARTED", "stepName": self._step_name()}))
        return out + self._open_block(index, kind, start)

    def _quiet(self, kind: str, start: dict[str, Any]) -> bool:
        """Whether the block is written as nothing: a request (kept as an interrupt), the
        record of an answer the client sent."""
        if kind == BlockType.APPROVAL_REQUEST or kind == BlockType.QUESTION:
            interrupt = _interrupt(kind, start)
            self._interrupts.append(interrupt)
            if "toolCallId" in interrupt:  # an approval's call, or a call's question
                self._gated.add(interrupt["toolCallId"])
            return True
        if kind in _RECORDS:
            return True
        return kind == BlockType.TOOL_RESULT and str(start.get("tool_use_id")) in self._records

    def _open_block(self, index: int, kind: str, start: dict[str, Any]) -> list[bytes]:
        block_id = f"{self._message_id}-{index}"
        if kind == BlockType.TOOL_USE:
            block_id = str(start["id"])
            self._calls.append(block_id)
        block = self._blocks[index] = _Block(kind, block_id, start)
        if kind == BlockType.TEXT:
            return [
                _frame({"type": "TEXT_MESSAGE_START", "messageId": block.id, "role": "assistant"})
            ]
        if kind == BlockType.THINKING:
            return [
                _frame({"type": "REASONING_START", "messageId": block.id}),
                _frame(
                    {"type": "REASONING_MESSAGE_START", "messageId": block.id, "role": "reasoning"}
                ),
            ]
        if kind == _REDACTED:
            # A reasoning message with no content: AG-UI clients keep an encrypted value
            # only on a message they have, and this one is what the client sends back.
            return [
                _frame({"type": "REASONING_START", "messageId": block.id}),
                _frame(
                    {"type": "REASONING_MESSAGE_START", "messageId": block.id, "role": "reasoning"}
                ),
                _frame({"type": "REASONING_MESSAGE_END", "messageId": block.id}),
            ]
        if kind == BlockType.TOOL_USE:
            call = {"type": "TOOL_CALL_START", "toolCallId": block.id}
            call["toolCallName"] = str(start["name"])
            call["parentMessageId"] = self._message_id
            return [_frame(call)]
        return []  # a tool result or a block carried whole: at its stop

    def _hold(self, block: _Block, item: Any, size: int) -> None:
        block.size += size
        if block.size > self.max_buffer:
            if block.size - size <= self.max_buffer:
                logger.warning(
                    "a %s block passed %d bytes; what came after is left out",
                    block.kind,
                    self.max_buffer,
                )
            return
        if isinstance(item, str):
            block.parts.append(item)
        else:
            block.deltas.append(item)

    def on_delta(self, index: int, delta: dict[str, Any]) -> list[bytes]:
        """A delta the quick path did not take: reasoning, tool arguments, held content."""
        block = self._blocks.get(index)
        if block is None:
            logger.warning("skipped a delta for block %d, which is not open", index)
            return []
        kind = delta.get("type")
        if block.kind == _QUIET:
            return []
        if block.kind == BlockType.TEXT and kind == DeltaType.TEXT:
            text = str(delta["text"])
            if not text:
                return []  # AG-UI refuses an empty delta
            return [_frame({"type": "TEXT_MESSAGE_CONTENT", "messageId": block.id, "delta": text})]
        if block.kind == BlockType.THINKING and kind == DeltaType.THINKING:
            text = str(delta.get("thinking", delta.get("text")))  # the two dialects
            if not text:
                return []
            event = {"type": "REASONING_MESSAGE_CONTENT", "messageId": block.id, "delta": text}
            return [_frame(event)]
        if block.kind == BlockType.THINKING and kind == DeltaType.SIGNATURE:
            # A signature is sent whole: each signature_delta replaces the one before
            # (docs/protocol.md), as the reassembler and Anthropic's SDK read it.
            block.signature = str(delta["signature"])
            return []
        if block.kind == BlockType.TOOL_USE and kind == DeltaType.INPUT_JSON:
            fragment = str(delta["partial_json"])
            if not fragment:
                return []
            block.parts.append(fragment)  # that the call has arguments (see on_block_stop)
            return [_frame({"type": "TOOL_CALL_ARGS", "toolCallId": block.id, "delta": fragment})]
        if block.kind == BlockType.TOOL_RESULT and kind == DeltaType.TOOL_RESULT:
            text = str(delta["text"])
            self._hold(block, text, len(text))
            return []
        if block.kind == BlockType.TEXT and kind == "citations_delta":
            value = {"messageId": block.id, "citation": delta.get("citation")}
            return [_frame({"type": "CUSTOM", "name": CITATION_EVENT, "value": value})]
        self._hold(block, delta, len(orjson.dumps(delta)))
        return []

    def _encrypted(self, block: _Block, value: str) -> bytes:
        return _frame(
            {
                "type": "REASONING_ENCRYPTED_VALUE",
                "subtype": "message",
                "entityId": block.id,
                "encryptedValue": value,
            }
        )

    def on_block_stop(self, index: int) -> list[bytes]:
        """The block's end event; a held block written whole."""
        block = self._blocks.pop(index, None)
        if block is None:
            logger.warning("skipped the stop of block %d, which is not open", index)
            return []
        if block.kind == _QUIET:
            return []
        if block.kind == BlockType.TEXT:
            return [_frame({"type": "TEXT_MESSAGE_END", "messageId": block.id})]
        if block.kind == BlockType.THINKING:
            frames = [_frame({"type": "REASONING_MESSAGE_END", "messageId": block.id})]
            if block.signature is not None:
                frames.append(self._encrypted(block, block.signature))
            return [*frames, _frame({"type": "REASONING_END", "messageId": block.id})]
        if block.kind == _REDACTED:
            frames = [self._encrypted(block, str(block.start.get("data", "")))]
            return [*frames, _frame({"type": "REASONING_END", "messageId": block.id})]
        if block.kind == BlockType.TOOL_USE:
            end = _frame({"type": "TOOL_CALL_END", "toolCallId": block.id})
            if block.parts:
                return [end]
            # No fragment came (a tool that takes no parameters): its start's input, so
            # that the client's arguments are JSON ("{}"), not "".
            arguments = call_arguments([], block.start)
            args = {"type": "TOOL_CALL_ARGS", "toolCallId": block.id, "delta": arguments}
            return [_frame(args), end]
        if block.kind == BlockType.TOOL_RESULT:
            call_id = str(block.start["tool_use_id"])
            result = {
                "type": "TOOL_CALL_RESULT",
                "messageId": f"{call_id}-result",
                "toolCallId": call_id,
                "content": "".join(block.parts),
                "role": "tool",
                "rawEvent": block.start,  # is_error, which AG-UI has no field for
            }
            return [_frame(result)]
        value = {"block": block.start, "deltas": block.deltas}
        return [_frame({"type": "CUSTOM", "name": BLOCK_EVENT, "value": value})]

    def _end(self, outcome: dict[str, Any] | None = None) -> list[bytes]:
        self.ended = True
        counts = self._usage
        prompt, output = counts.prompt_tokens, counts.output_tokens
        usage: dict[str, Any] = {
            "inputTokens": prompt,
            "outputTokens": output,
            "totalTokens": prompt + output,
        }
        # AG-UI's optional counts, where the turn has them.
        for key, name in _USAGE_DETAILS:
            if value := counts.count(key):
                usage[name] = value
        if self._model:
            usage["model"] = self._model
        finished: dict[str, Any] = {"type": "RUN_FINISHED", "threadId": self.thread_id}
        finished["runId"] = self.run_id
        finished["usage"] = [usage]
        if outcome is not None:
            finished["outcome"] = outcome
        return [_frame(finished)]

    def _error(self, code: str, message: str) -> list[bytes]:
        self.ended = True
        return [_frame({"type": "RUN_ERROR", "message": message, "code": code})]


# -- serving it ---------------------------------------------------------------------------
