"""A turn's protocol events written as the AI SDK's UI message stream (see docs/ui.md).

One turn is one assistant UI message: ``start`` (with the first message's id, so a
replay of the same turn names the same message and the client replaces it instead of
adding a second), then one step per model round (``start-step`` ... ``finish-step``), as
the AI SDK's own ``streamText`` writes it, then ``finish`` and ``data: [DONE]``. A round
is a protocol message, or, in a message that holds several (``stream_rounds``), what
comes up to its tool results: a block after a round's results opens the next step.
Inside a step:

- a text block is ``text-start`` / ``text-delta`` / ``text-end``, a thinking block
  ``reasoning-start`` / ``reasoning-delta`` / ``reasoning-end`` (a signature has no UI
  part and is left out);
- a tool use is ``tool-input-start``, a ``tool-input-delta`` per fragment, and at its stop
  ``tool-input-available`` with the parsed input (``tool-input-error`` when the fragments
  are not JSON);
- a tool result is written whole at its stop: ``tool-output-available`` with its text
  parsed as JSON (the text itself when it is not), ``tool-output-error`` when
  ``is_error``;
- a block of a type this module does not know is one ``custom`` chunk at its stop (the
  AI SDK 7's chunk for what has no chunk of its own; ``kind`` ``essessey.<block type>``,
  the block and its deltas in ``providerMetadata.essessey``), or a ``data-essessey-block``
  part with ``custom_chunks=False`` (the 6.x line has no ``custom`` chunk); past
  ``max_buffer`` bytes it is skipped with a log line.

The turn's end: ``finish`` with the last stop reason mapped (``end_turn`` and
``stop_sequence`` to ``stop``, ``tool_use`` to ``tool-calls``, ``max_tokens`` to
``length``, anything else to ``other``); a cancelled turn ends with ``abort``, as the AI
SDK's own server ends one; an ``error`` event becomes an ``error`` chunk with its message.

Read-side rules: a payload that is not JSON, or an event out of place, is skipped with a
log line naming the event type and its length, never its content.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Final

import orjson

from essessey.dialects._payload import TurnUsage, read_payload
from essessey.dialects.base import DialectEncoder
from essessey.event import Event
from essessey.protocol import BlockType, DeltaType, EventType, StopReason

__all__ = ["DONE", "FINISH_REASONS", "UIMessageEncoder", "frame"]

logger = logging.getLogger("essessey.dialects.ui")

DONE: Final = b"data: [DONE]\n\n"
"""The line that ends a UI message stream."""

FINISH_REASONS: Final[dict[str, str]] = {
    StopReason.END_TURN: "stop",
    StopReason.STOP_SEQUENCE: "stop",
    StopReason.TOOL_USE: "tool-calls",
    StopReason.MAX_TOKENS: "length",
    StopReason.MODEL_CONTEXT_WINDOW_EXCEEDED: "length",
    StopReason.REFUSAL: "content-filter",
}
"""Stop reasons and the AI SDK finish reasons they map to; any other is ``other``."""

DEFAULT_MAX_BUFFER: Final = 16 * 1024 * 1024
"""Bytes of one tool call's input, tool result or unknown block held until its stop."""

_DATA_PART: Final = "data-essessey-block"
_TEXT_DELTA: Final = b'data: {"type":"text-delta","id":%b,"delta":%b}\n\n'
"""A text delta's chunk, as :func:`frame` writes it, with its id and text filled in."""
# The quick path's names, module globals rather than class attributes looked up per call.
_TEXT: Final = BlockType.TEXT
_dumps: Final = orjson.dumps
_NAME: Final = re.compile(r"[^A-Za-z0-9_-]")


def frame(chunk: dict[str, Any]) -> bytes:
    """One UI message chunk as its SSE line."""
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


class _Block:
    __slots__ = ("content", "held", "id", "id_json", "kind", "size", "skipped")

    def __init__(self, kind: str, block_id: str, content: dict[str, Any]) -> None:
        self.kind = kind
        self.id = block_id
        self.id_json = orjson.dumps(block_id)  # for the frames spliced without a dict
        self.content = content
        self.held: list[Any] = []  # fragments (tool input, result) or deltas (unknown)
        self.size = 0
        self.skipped = False


class UIMessageEncoder(DialectEncoder):
    """Turns the protocol events of one turn, in order, into UI message stream lines.

    Call :meth:`feed` with each event and write what it returns; :meth:`close` returns
    the end (``finish`` or ``abort``, then ``[DONE]``) once the events have ended. An
    encoder serves one turn. It is a :class:`~essessey.bindings.sse.FrameEncoder` too
    (:meth:`encode`, :meth:`finish`, :meth:`fail`), so the SSE response delivers it.
    """

    log = logger
    outside_message = "skipped a %s event outside a message"
    # A payload laid out otherwise raises one of these in a hook (others are bugs).
    unreadable = (KeyError, TypeError, ValueError)

    def __init__(
        self,
        *,
        message_id: str | None = None,
        max_buffer: int = DEFAULT_MAX_BUFFER,
        usage_metadata: bool = True,
        custom_chunks: bool = True,
    ) -> None:
        if max_buffer <= 0:
            raise ValueError("max_buffer must be > 0")
        self.max_buffer = max_buffer
        self.usage_metadata = usage_metadata
        """Whether ``finish`` carries the turn's token counts as its ``messageMetadata``
        (``{"usage": {...}}``, the AI SDK's usage fields): off for an app whose message
        metadata schema has no room for them."""
        self._usage = TurnUsage()
        self._sources = 0  # source-url parts written
        self.custom_chunks = custom_chunks
        """Whether a block of a type with no chunk of its own is a ``custom`` chunk (the AI
        SDK 7) or, False, a ``data-essessey-block`` part (the 6.x line)."""
        # The UI message's id: given, else the first protocol message's. A replay must
        # name the same one, or the client shows the turn twice.
        self.message_id = message_id
        self._step = 0  # protocol messages seen
        self._in_step = False
        self._after_results = False  # the step's last block was a tool result
        self._blocks: dict[int, _Block] = {}
        self._stop_reason: str | None = None
        self.ended = False
        """Whether an ``error`` chunk ended the stream (the client reads nothing after)."""

    def feed(self, event: Event) -> list[bytes]:
        """The lines for ``event`` (none for a ping, a signature, a skipped event)."""
        if self.ended or event.event == EventType.PING:
            return []
        payload = read_payload(event, logger)
        if payload is None:
            return []
        try:
            return self.frames(event.event, payload)
        except self.unreadable as exc:
            logger.warning("skipped a %s event: %s", event.event, type(exc).__name__)
            return []

    def encode_text(self, index: int, text: str) -> bytes | None:
        """One ``text-delta`` chunk of ``text`` for block ``index``; None when that is
        not an open text block."""
        block = self._blocks.get(index) if self._in_step and not self.ended else None
        if block is None or block.kind != _TEXT:
            return None
        return _TEXT_DELTA % (block.id_json, _dumps(text))

    def finish(self) -> bytes:
        """:meth:`close`."""
        return self.close()

    def fail(self, error_type: str, message: str) -> bytes:
        """An ``error`` chunk with ``message``, then ``[DONE]``."""
        self.ended = True
        self._in_step = False
        return frame({"type": "error", "errorText": message}) + DONE

    def close(self) -> bytes:
        """The stream's end: ``finish`` with the mapped finish reason (``abort`` for a
        cancelled turn), then ``[DONE]``; only ``[DONE]`` after an error."""
        out: list[bytes] = []
        if self._in_step:
            out.append(frame({"type": "finish-step"}))
            self._in_step = False
        if not self.ended:
            if self._stop_reason == StopReason.CANCELLED:
                out.append(frame({"type": "abort"}))
            else:
                chunk: dict[str, Any] = {"type": "finish"}
                if self._stop_reason is not None:
                    chunk["finishReason"] = FINISH_REASONS.get(self._stop_reason, "other")
                if self.usage_metadata:
                    chunk["messageMetadata"] = {"usage": self._usage_fields()}
                out.append(frame(chunk))
        out.append(DONE)
        self.ended = True
        return b"".join(out)

    def _usage_fields(self) -> dict[str, int]:
        """The turn's counts in the AI SDK's usage fields (``LanguageModelUsage``)."""
        counts = self._usage
        prompt, output = counts.prompt_tokens, counts.output_tokens
        return {
            "inputTokens": prompt,
            "outputTokens": output,
            "totalTokens": prompt + output,
            "reasoningTokens": counts.count("reasoning_tokens"),
            "cachedInputTokens": counts.count("cache_read_input_tokens"),
        }

    # -- the events ------------------------------------------------------------------------

    # -- the hooks (essessey.dialects.base) -------------------------------------------------

    def in_message(self) -> bool:
        """Whether a protocol message is open (its step started)."""
        return self._in_step

    def on_message_start(self, message: dict[str, Any], payload: dict[str, Any]) -> list[bytes]:
        """``start`` for the turn's first message, then ``start-step``."""
        return self._message_start(payload)

    def on_error(self, error: Any) -> list[bytes]:
        """An ``error`` chunk; nothing more follows but ``[DONE]``."""
        message = error.get("message") if isinstance(error, dict) else None
        self.ended = True
        self._in_step = False
        return [frame({"type": "error", "errorText": str(message or "the turn failed")})]

    def on_message_delta(self, payload: dict[str, Any]) -> list[bytes]:
        """Nothing yet: the stop reason goes into ``finish``."""
        reason = payload.get("delta", {}).get("stop_reason")
        if isinstance(reason, str):
            self._stop_reason = reason
        self._usage.message_delta(payload)
        return []

    def on_message_stop(self) -> list[bytes]:
        """``finish-step``."""
        self._in_step = False
        self._blocks.clear()
        return [frame({"type": "finish-step"})]

    def _message_start(self, payload: dict[str, Any]) -> list[bytes]:
        message = payload.get("message")
        if isinstance(message, dict):
            self._usage.message_start(message)
        out: list[bytes] = []
        if self._in_step:  # a message that never stopped: its step ends here
            out.append(frame({"type": "finish-step"}))
        if self._step == 0:
            if self.message_id is None:
                message = payload.get("message")
                message_id = message.get("id") if isinstance(message, dict) else None
                self.message_id = str(message_id) if message_id else f"turn-{id(self):x}"
            out.append(frame({"type": "start", "messageId": self.message_id}))
        self._step += 1
        self._in_step = True
        self._after_results = False
        self._blocks.clear()
        out.append(frame({"type": "start-step"}))
        return out

    def on_block_start(self, index: int, content: dict[str, Any]) -> list[bytes]:
        """The part's start chunk; a new step after a round's tool results."""
        kind = content.get("type")
        out: list[bytes] = []
        if kind == BlockType.TOOL_RESULT:
            self._after_results = True
        elif self._after_results:
            # The next model round of the same message: a step of its own.
            self._after_results = False
            out += [frame({"type": "finish-step"}), frame({"type": "start-step"})]
        return out + self._open_block(index, kind, content)

    def _open_block(self, index: int, kind: object, content: dict[str, Any]) -> list[bytes]:
        block_id = f"{self._step}-{index}"
        if kind == BlockType.TEXT:
            self._blocks[index] = _Block(kind, block_id, content)
            return [frame({"type": "text-start", "id": block_id})]
        if kind == BlockType.THINKING:
            self._blocks[index] = _Block(kind, block_id, content)
            return [frame({"type": "reasoning-start", "id": block_id})]
        if kind == BlockType.TOOL_USE:
            block = _Block(kind, str(content["id"]), content)
            self._blocks[index] = block
            chunk = {"type": "tool-input-start", "toolCallId": block.id}
            chunk["toolName"] = str(content["name"])
            return [frame(chunk)]
        self._blocks[index] = _Block(str(kind), block_id, content)
        return []  # a tool result or an unknown block: written whole at its stop

    def _hold(self, block: _Block, item: Any, size: int) -> None:
        if block.skipped:
            return
        block.size += size
        if block.size > self.max_buffer:
            block.skipped = True
            block.held.clear()
            logger.warning(
                "a %s block passed %d bytes; it is left out of the UI message",
                block.kind,
                self.max_buffer,
            )
            return
        block.held.append(item)

    def on_delta(self, index: int, delta: dict[str, Any]) -> list[bytes]:
        """A delta the quick path did not take: reasoning, tool input, held content."""
        block = self._blocks.get(index)
        if block is None:
            logger.warning("skipped a delta for block %d, which is not open", index)
            return []
        kind = delta.get("type")
        if block.kind == BlockType.TEXT and kind == DeltaType.TEXT:
            return [frame({"type": "text-delta", "id": block.id, "delta": str(delta["text"])})]
        if block.kind == BlockType.TEXT and kind == "citations_delta":
            # A citation with a URL is the AI SDK's source: a source-url part.
            citation = delta.get("citation")
            url = citation.get("url") if isinstance(citation, dict) else None
            if isinstance(url, str) and url:
                self._sources += 1
                source = {"type": "source-url", "sourceId": f"{block.id}-s{self._sources}"}
                source["url"] = url
                title = citation.get("title") if isinstance(citation, dict) else None
                if isinstance(title, str):
                    source["title"] = title
                return [frame(source)]
            return []
        if block.kind == BlockType.THINKING:
            if kind == DeltaType.SIGNATURE:
                return []  # no UI part carries it
            text = delta.get("thinking", delta.get("text"))  # the two dialects
            return [frame({"type": "reasoning-delta", "id": block.id, "delta": str(text)})]
        if block.kind == BlockType.TOOL_USE and kind == DeltaType.INPUT_JSON:
            fragment = str(delta["partial_json"])
            self._hold(block, fragment, len(fragment))
            chunk = {"type": "tool-input-delta", "toolCallId": block.id}
            chunk["inputTextDelta"] = fragment
            return [frame(chunk)]
        if block.kind == BlockType.TOOL_RESULT and kind == DeltaType.TOOL_RESULT:
            text = str(delta["text"])
            self._hold(block, text, len(text))
            return []
        self._hold(block, delta, len(orjson.dumps(delta)))
        return []

    def on_block_stop(self, index: int) -> list[bytes]:
        """The part's end chunk; a tool result or an unknown block written whole."""
        block = self._blocks.pop(index, None)
        if block is None:
            logger.warning("skipped the stop of block %d, which is not open", index)
            return []
        if block.kind == BlockType.TEXT:
            return [frame({"type": "text-end", "id": block.id})]
        if block.kind == BlockType.THINKING:
            return [frame({"type": "reasoning-end", "id": block.id})]
        if block.skipped:
            return []
        if block.kind == BlockType.TOOL_USE:
            return [self._tool_input(block)]
        if block.kind == BlockType.TOOL_RESULT:
            return [self._tool_output(block)]
        kind = _NAME.sub("_", block.kind)
        data = {"block": block.content, "deltas": block.held}
        if self.custom_chunks:
            metadata = {"essessey": {"id": f"{block.id}-{kind}", **data}}
            custom = {"type": "custom", "kind": f"essessey.{kind}", "providerMetadata": metadata}
            return [frame(custom)]
        return [frame({"type": _DATA_PART, "id": f"{block.id}-{kind}", "data": data})]

    def _tool_input(self, block: _Block) -> bytes:
        text = "".join(block.held)
        name = str(block.content["name"])
        try:
            tool_input = orjson.loads(text) if text else block.content.get("input", {})
        except orjson.JSONDecodeError:
            return frame(
                {
                    "type": "tool-input-error",
                    "toolCallId": block.id,
                    "toolName": name,
                    "input": text,
                    "errorText": "the tool input is not valid JSON",
                }
            )
        return frame(
            {
                "type": "tool-input-available",
                "toolCallId": block.id,
                "toolName": name,
                "input": tool_input,
            }
        )

    def _tool_output(self, block: _Block) -> bytes:
        text = "".join(block.held)
        call_id = str(block.content["tool_use_id"])
        if block.content.get("is_error"):
            return frame({"type": "tool-output-error", "toolCallId": call_id, "errorText": text})
        try:
            output: Any = orjson.loads(text)
        except orjson.JSONDecodeError:
            output = text
        return frame({"type": "tool-output-available", "toolCallId": call_id, "output": output})
