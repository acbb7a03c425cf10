"""The agui dialect's encoder: the protocol's events as its frames (see the package)."""

from __future__ import annotations

import hashlib
import logging
from typing import Any, Final

import orjson

from essessey.dialects._payload import TurnUsage, message_delta_totals
from essessey.dialects.base import DialectEncoder
from essessey.protocol import BlockType, DeltaType, StopReason

__all__ = [
    "BLOCK_EVENT",
    "CITATION_EVENT",
    "DEFAULT_MAX_BUFFER",
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

_REDACTED: Final = "redacted_thinking"
_TEXT_CONTENT: Final = b'data: {"type":"TEXT_MESSAGE_CONTENT","messageId":%b,"delta":%b}\n\n'
"""A text delta's frame, as :func:`_frame` writes it, with its id and text filled in."""
# The quick path's names, module globals rather than class attributes looked up per call.
_TEXT: Final = BlockType.TEXT
_dumps: Final = orjson.dumps


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
    ``thread_id``. ``max_buffer`` bounds the bytes of one block held until its stop."""

    log = logger

    def __init__(
        self, thread_id: str, run_id: str, *, max_buffer: int = DEFAULT_MAX_BUFFER
    ) -> None:
        if max_buffer <= 0:
            raise ValueError("max_buffer must be > 0")
        self.thread_id = thread_id
        self.run_id = run_id
        self.max_buffer = max_buffer
        self._started = False
        self.ended = False
        self._step = 0
        self._after_results = False  # the step's last block was a tool result
        self._message_id = ""
        self._blocks: dict[int, _Block] = {}
        self._stop_reason: str | None = None
        self._delta: dict[str, Any] | None = None
        self._model: str | None = None
        self._usage = TurnUsage()

    # -- FrameEncoder --------------------------------------------------------------------

    def encode_text(self, index: int, text: str) -> bytes | None:
        """One ``TEXT_MESSAGE_CONTENT`` of ``text`` (nothing for an empty one) for block
        ``index``; None when that is not an open text block."""
        block = self._blocks.get(index) if self._step and not self.ended else None
        if block is None or block.kind != _TEXT:
            return None
        return _TEXT_CONTENT % (block.id_json, _dumps(text)) if text else b""

    def finish(self) -> bytes:
        """``RUN_FINISHED`` if no message ended the run yet."""
        if self.ended:
            return b""
        frames = [] if self._started else self._run_started()
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
        """``STEP_FINISHED``, then the run's end unless the turn goes on (tool use)."""
        step: dict[str, Any] = {"type": "STEP_FINISHED", "stepName": self._step_name()}
        if self._delta is not None:
            step["rawEvent"] = self._delta
        frames = [_frame(step)]
        if self._stop_reason == StopReason.CANCELLED:
            return frames + self._error("CANCELLED", "the turn was cancelled")
        if self._stop_reason is not None and self._stop_reason != StopReason.TOOL_USE:
            return frames + self._end()
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
        message_id = message.get("id")
        self._message_id = str(message_id) if message_id else f"{self.run_id}-{self._step}"
        model = message.get("model")
        if isinstance(model, str) and model:
            self._model = model
        self._usage.message_start(message)
        return [*frames, _frame({"type": "STEP_STARTED", "stepName": self._step_name()})]

    def on_block_start(self, index: int, start: dict[str, Any]) -> list[bytes]:
        """The block's start event, by its kind."""
        kind = str(start.get("type"))
        out: list[bytes] = []
        if kind == BlockType.TOOL_RESULT:
            self._after_results = True
        elif self._after_results:
            # The next model round of the same message: a step of its own.
            self._after_results = False
            out.append(_frame({"type": "STEP_FINISHED", "stepName": self._step_name()}))
            self._step += 1
            out.append(_frame({"type": "STEP_STARTED", "stepName": self._step_name()}))
        return out + self._open_block(index, kind, start)

    def _open_block(self, index: int, kind: str, start: dict[str, Any]) -> list[bytes]:
        block_id = f"{self._message_id}-{index}"
        if kind == BlockType.TOOL_USE:
            block_id = str(start["id"])
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
            return [_frame({"type": "REASONING_START", "messageId": block.id})]
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
            block.signature = (block.signature or "") + str(delta["signature"])
            return []
        if block.kind == BlockType.TOOL_USE and kind == DeltaType.INPUT_JSON:
            fragment = str(delta["partial_json"])
            if not fragment:
                return []
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
            return [_frame({"type": "TOOL_CALL_END", "toolCallId": block.id})]
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

    def _end(self) -> list[bytes]:
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
        return [_frame(finished)]

    def _error(self, code: str, message: str) -> list[bytes]:
        self.ended = True
        return [_frame({"type": "RUN_ERROR", "message": message, "code": code})]


# -- serving it ---------------------------------------------------------------------------
