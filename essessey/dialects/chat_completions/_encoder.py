"""The chat completions dialect's encoder: the protocol's events as its frames (see the package)."""

from __future__ import annotations

import logging
import time
from typing import Any, Final

import orjson

from essessey.dialects._payload import TurnUsage, message_delta_totals
from essessey.dialects.base import DialectEncoder
from essessey.event import Event
from essessey.protocol import BlockType, DeltaType, StopReason
from essessey.reassemble import reassemble_events

__all__ = ["DONE", "FINISH_REASONS", "ChatCompletionsEncoder", "completion", "error_object"]

logger = logging.getLogger("essessey.dialects.chat_completions")

DONE: Final = b"data: [DONE]\n\n"
"""The frame that ends a Chat Completions stream."""

FINISH_REASONS: Final[dict[str, str]] = {
    StopReason.END_TURN: "stop",
    StopReason.STOP_SEQUENCE: "stop",
    StopReason.TOOL_USE: "tool_calls",
    StopReason.MAX_TOKENS: "length",
    StopReason.MODEL_CONTEXT_WINDOW_EXCEEDED: "length",
    StopReason.PAUSE_TURN: "stop",
    StopReason.CANCELLED: "stop",
    StopReason.REFUSAL: "content_filter",
}
"""Stop reasons and the ``finish_reason`` each maps to; any other is ``stop``."""


_NO_BLOCK: Final = ("", -1)
# The quick path's names, module globals rather than class attributes looked up per call.
_TEXT: Final = BlockType.TEXT
_dumps: Final = orjson.dumps


def error_object(error_type: str, message: str) -> bytes:
    """The JSON of an error as OpenAI answers one: ``{"error": {"message", "type",
    "param", "code"}}`` (for a refusal before a stream and in-band after it)."""
    return orjson.dumps(
        {"error": {"message": message, "type": error_type, "param": None, "code": None}}
    )


def _frame(chunk: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


class ChatCompletionsEncoder(DialectEncoder):
    """One turn's protocol events, in order, as ``chat.completion.chunk`` frames (a
    :class:`~essessey.bindings.sse.FrameEncoder`). ``completion_id`` names the chunks
    (``chatcmpl-...``), ``model`` fills their ``model`` until the turn's first message
    names one; ``include_usage`` adds the usage chunk at the end."""

    log = logger

    def __init__(
        self,
        completion_id: str,
        *,
        model: str = "essessey",
        include_usage: bool = False,
        created: int | None = None,
    ) -> None:
        self.completion_id = completion_id
        self.model = model
        self.include_usage = include_usage
        self.created = int(time.time()) if created is None else created
        self._started = False
        self._blocks: dict[int, tuple[str, int]] = {}  # block index: (type, tool call index)
        self._calls = 0
        self._stop_reason: str | None = None
        self._finished = False  # a finish_reason was written
        self.ended = False  # an error was written: nothing more is
        self._usage = TurnUsage()
        self._content_head: bytes | None = None  # a content chunk up to its text

    # -- FrameEncoder --------------------------------------------------------------------

    def encode_text(self, index: int, text: str) -> bytes | None:
        """One content chunk of ``text`` for block ``index``; None when that is not an
        open text block."""
        if self.ended or self._blocks.get(index, _NO_BLOCK)[0] != _TEXT:
            return None
        return self._content_frame(_dumps(text))

    def finish(self) -> bytes:
        """The finish reason (if no message gave it yet), the usage chunk when asked
        for, then ``[DONE]``."""
        out: list[bytes] = []
        if not self.ended:
            if not self._finished and self._stop_reason is not None:
                out.append(self._finish_chunk())
            if self.include_usage:
                out.append(self._usage_chunk())
        out.append(DONE)
        self.ended = True
        return b"".join(out)

    def fail(self, error_type: str, message: str) -> bytes:
        """The in-band error object, then ``[DONE]``."""
        self.ended = True
        return b"data: " + error_object(error_type, message) + b"\n\n" + DONE

    # -- the events ----------------------------------------------------------------------

    def _content_frame(self, token: bytes) -> bytes:
        """``_chunk({"content": text})``, given the text as JSON (``token``)."""
        head = self._content_head
        if head is None:
            head = self._content_head = (
                self._chunk({"content": ""}).split(b'"content":""', 1)[0] + b'"content":'
            )
        return head + token + b'},"finish_reason":null}]}\n\n'

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        return _frame(
            {
                "id": self.completion_id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            }
        )

    # -- the hooks (essessey.dialects.base) -------------------------------------------------

    def on_block_stop(self, index: int) -> list[bytes]:
        """Nothing: a chunk has no end of a part."""
        self._blocks.pop(index, None)
        return []

    def on_message_delta(self, payload: dict[str, Any]) -> list[bytes]:
        """Nothing yet: the finish reason and usage go into the last chunks."""
        reason, _ = message_delta_totals(payload)
        if reason is not None:
            self._stop_reason = reason
        self._usage.message_delta(payload)
        return []

    def on_message_stop(self) -> list[bytes]:
        """The finish reason, unless the turn goes on (tool use)."""
        if self._stop_reason is not None and self._stop_reason != StopReason.TOOL_USE:
            return [self._finish_chunk()]
        return []

    def on_error(self, error: Any) -> list[bytes]:
        """The in-band error object (``[DONE]`` follows, from :meth:`finish`)."""
        self.ended = True
        body = error_object(str(error.get("type") or "api_error"), str(error.get("message") or ""))
        return [b"data: " + body + b"\n\n"]

    def on_message_start(self, message: dict[str, Any], payload: dict[str, Any]) -> list[bytes]:
        """The first chunk (the assistant's role), for the turn's first message only."""
        self._blocks.clear()
        self._stop_reason = None
        self._usage.message_start(message)
        if self._started:
            return []  # the next round of the same turn: one completion
        self._started = True
        model = message.get("model")
        if isinstance(model, str) and model:
            self.model = model
            self._content_head = None
        return [self._chunk({"role": "assistant", "content": ""})]

    def on_block_start(self, index: int, block: dict[str, Any]) -> list[bytes]:
        """A tool call's first chunk; nothing for a text or reasoning block."""
        kind = str(block.get("type"))
        if kind != BlockType.TOOL_USE:
            self._blocks[index] = (kind, -1)
            if kind not in (BlockType.TEXT, BlockType.THINKING):
                logger.debug("a %s block has no place in a chat completion", kind[:64])
            return []
        call = self._calls
        self._calls += 1
        self._blocks[index] = (kind, call)
        tool_call = {
            "index": call,
            "id": str(block["id"]),
            "type": "function",
            "function": {"name": str(block["name"]), "arguments": ""},
        }
        return [self._chunk({"tool_calls": [tool_call]})]

    def on_delta(self, index: int, delta: dict[str, Any]) -> list[bytes]:
        """A content, reasoning or tool-arguments chunk."""
        kind, call = self._blocks.get(index, ("", -1))
        delta_type = delta.get("type")
        if kind == BlockType.TEXT and delta_type == DeltaType.TEXT:
            return [self._chunk({"content": str(delta["text"])})]
        if kind == BlockType.THINKING and delta_type == DeltaType.THINKING:
            text = delta.get("thinking", delta.get("text"))  # the two dialects
            return [self._chunk({"reasoning_content": str(text)})]
        if kind == BlockType.TOOL_USE and delta_type == DeltaType.INPUT_JSON:
            fragment = {"index": call, "function": {"arguments": str(delta["partial_json"])}}
            return [self._chunk({"tool_calls": [fragment]})]
        return []  # a signature, a tool result, a block without a place here

    def _finish_chunk(self) -> bytes:
        self._finished = True
        reason = FINISH_REASONS.get(self._stop_reason or "", "stop")
        return self._chunk({}, reason)

    def _usage_chunk(self) -> bytes:
        return _frame(
            {
                "id": self.completion_id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": openai_usage(self._usage),
            }
        )


def openai_usage(usage: TurnUsage) -> dict[str, Any]:
    """A turn's counts as a Chat Completions ``usage`` (docs/protocol.md, "Usage"): all
    input as ``prompt_tokens``, the cache reads among them as
    ``prompt_tokens_details.cached_tokens``, reasoning as
    ``completion_tokens_details.reasoning_tokens``."""
    prompt, output = usage.prompt_tokens, usage.output_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": output,
        "total_tokens": prompt + output,
        "prompt_tokens_details": {"cached_tokens": usage.count("cache_read_input_tokens")},
        "completion_tokens_details": {"reasoning_tokens": usage.count("reasoning_tokens")},
    }


def completion(
    events: list[Event], completion_id: str, *, model: str = "essessey", created: int | None = None
) -> dict[str, Any]:
    """A whole turn as one ``chat.completion`` object (for a request without
    ``stream``): the turn's text, reasoning and tool calls, its finish reason and usage,
    with the same omissions as the stream."""
    turn = reassemble_events(events)
    message: dict[str, Any] = {"role": "assistant", "content": turn.text or None}
    if turn.thinking:
        message["reasoning_content"] = turn.thinking
    if turn.tool_calls:
        message["tool_calls"] = [
            {
                "id": call.tool_use_id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in turn.tool_calls
        ]
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()) if created is None else created,
        "model": turn.model or model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": FINISH_REASONS.get(turn.stop_reason or "", "stop"),
            }
        ],
        "usage": openai_usage(TurnUsage.of(events)),
    }


# -- serving it ---------------------------------------------------------------------------
