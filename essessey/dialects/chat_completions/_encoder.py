"""The chat completions dialect's encoder: the protocol's events as its frames (see the package)."""

from __future__ import annotations

import logging
import time
from typing import Any, Final

import orjson

from essessey._logsafe import log_label
from essessey.dialects._payload import (
    QUESTION_TOOL,
    TurnUsage,
    call_arguments,
    message_delta_totals,
)
from essessey.dialects.base import DialectEncoder
from essessey.errors import ProviderStreamError
from essessey.event import Event
from essessey.protocol import BlockType, DeltaType, StopReason

__all__ = [
    "APPROVAL_TOOL",
    "DONE",
    "FINISH_REASONS",
    "MAX_HELD",
    "ChatCompletionsEncoder",
    "completion",
    "error_object",
]

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


APPROVAL_TOOL: Final = "approve_tool_call"
"""The reserved function an approval request is a tool call of: its id is the request's,
its arguments ``{"tool_use_id", "name", "arguments", "reason"?}`` (the call it gates, whose
own tool call is not written); a ``tool`` message with content ``{"approved": bool,
"reason"?: str}`` answers it (docs/dialects.md)."""

MAX_HELD: Final = 16 * 1024 * 1024
"""Characters of a call's arguments held until its round's approvals are known; a call
that passes it goes out at once, with its round's calls before it."""

_QUIET: Final = "quiet"  # a block that writes nothing at all (a request, a record)
_GATED: Final = "gated"  # a call an approval request holds back

_NO_BLOCK: Final = ("", -1)
# The quick path's names, module globals rather than class attributes looked up per call.
_TEXT: Final = BlockType.TEXT


def error_object(error_type: str, message: str) -> bytes:
    """The JSON of an error as OpenAI answers one: ``{"error": {"message", "type",
    "param", "code"}}`` (for a refusal before a stream and in-band after it)."""
    return orjson.dumps(
        {"error": {"message": message, "type": error_type, "param": None, "code": None}}
    )


def _frame(chunk: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


class _Held:
    """A call held until its round's approvals are known."""

    __slots__ = ("block", "closed", "index", "parts", "size")

    def __init__(self, index: int, block: dict[str, Any]) -> None:
        self.index = index
        self.block = block
        self.parts: list[str] = []
        self.size = 0
        self.closed = False


class ChatCompletionsEncoder(DialectEncoder):
    """One turn's protocol events, in order, as ``chat.completion.chunk`` frames (a
    :class:`~essessey.bindings.sse.FrameEncoder`). ``completion_id`` names the chunks
    (``chatcmpl-...``), ``model`` fills their ``model`` until the turn's first message
    names one; ``include_usage`` adds the usage chunk at the end.

    A turn that asks (docs/asking.md): a question is a tool call of ``ask_user``, an
    approval request one of ``approve_tool_call`` (:data:`APPROVAL_TOOL`), and the call
    it gates is not written (a client would run it): a round's calls are held until the
    block after them that is none of a call, a result and an approval request (or the
    message's end), then written in one chunk, each whole. The message that asks ends the completion
    (``finish_reason`` ``tool_calls``). ``after`` makes it the completion that continues
    the turn after that event (the asking message's last): the events up to it are not
    written. ``collect`` keeps the tool calls written, whole, in :attr:`tool_calls` (for
    :func:`completion`)."""

    log = logger

    def __init__(
        self,
        completion_id: str,
        *,
        model: str = "essessey",
        include_usage: bool = False,
        created: int | None = None,
        collect: bool = False,
        after: str | None = None,
    ) -> None:
        self.completion_id = completion_id
        self.model = model
        self.include_usage = include_usage
        self.created = int(time.time()) if created is None else created
        self._started = False
        self._blocks: dict[int, tuple[str, int]] = {}  # block index: (type, tool call index)
        self._calls_written = 0
        self._stop_reason: str | None = None
        self._finished = False  # a finish_reason was written
        self.ended = False  # an error was written: nothing more is
        self._usage = TurnUsage()
        self._content_head: bytes | None = None  # a content chunk up to its text
        self._asked = False  # a message asked: the completion ended with it
        # The message's calls held until their round's approvals are known, and its
        # approval requests (blocks), in order; the calls those gate.
        self._queue: list[_Held | dict[str, Any]] = []
        self._held: dict[int, _Held] = {}  # the open held calls, by block index
        self._gated: set[str] = set()
        self._calls: dict[str, _Held] = {}  # the message's calls, by id
        # The last message's calls left without a result: a message that continues it
        # may ask to approve one again (a call let run that asks before it ends).
        self._earlier: dict[str, _Held] = {}
        self._results: set[str] = set()
        # The calls written while open with no arguments yet, by block index: at their
        # stop, if none came, their start's input.
        self._argless: dict[int, dict[str, Any]] = {}
        self._asks = False  # the message asks for an approval or an answer
        self.tool_calls: list[dict[str, Any]] | None = [] if collect else None
        """The tool calls written, whole (with ``collect``)."""
        self.start_after(after)

    # -- FrameEncoder --------------------------------------------------------------------

    def encode_text(self, index: int, text: str, text_json: bytes) -> bytes | None:
        """One content chunk of ``text`` for block ``index``; None when that is not an
        open text block."""
        if self.ended or self._blocks.get(index, _NO_BLOCK)[0] != _TEXT:
            return None
        return self._content_frame(text_json)

    def finish(self) -> bytes:
        """The finish reason (if no message gave it yet), the usage chunk when asked
        for, then ``[DONE]``."""
        out: list[bytes] = []
        if not self.ended:
            out += self._release()
            # A stream that ended inside its message: a call none of whose arguments
            # came has its start's input, as its block's stop would have given it.
            for index in sorted(self._argless):
                out += self.on_block_stop(index)
        if not self.ended or self._asked:
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
        """Nothing: a chunk has no end of a part (a held call is written later)."""
        held = self._held.pop(index, None)
        if held is not None:
            held.closed = True
        _, call = self._blocks.pop(index, _NO_BLOCK)
        block = self._argless.pop(index, None)
        if block is None:
            return []
        # A call written before any of its arguments came, and none came.
        return [self._arguments_chunk(call, call_arguments([], block))]

    def on_message_delta(self, payload: dict[str, Any]) -> list[bytes]:
        """The calls held (the message ends); the finish reason and usage go into the
        last chunks."""
        reason, _ = message_delta_totals(payload)
        if reason is not None:
            self._stop_reason = reason
        self._usage.message_delta(payload)
        return self._release()

    def on_message_stop(self) -> list[bytes]:
        """The finish reason, unless the turn goes on (tool use, the message asking
        nothing: its calls have their results); a message that asks ends the
        completion."""
        frames = self._release()
        reason = self._stop_reason
        if reason is None:
            return frames
        if reason != StopReason.TOOL_USE:
            return [*frames, self._finish_chunk()]
        if self._asks or any(call not in self._results for call in self._calls):
            frames.append(self._finish_chunk())
            self._asked = self.ended = True  # what follows is another completion's
        return frames

    def on_error(self, error: Any) -> list[bytes]:
        """The in-band error object (``[DONE]`` follows, from :meth:`finish`)."""
        frames = self._release()
        self.ended = True
        body = error_object(str(error.get("type") or "api_error"), str(error.get("message") or ""))
        return [*frames, b"data: " + body + b"\n\n"]

    def on_message_start(self, message: dict[str, Any], payload: dict[str, Any]) -> list[bytes]:
        """The first chunk (the assistant's role), for the turn's first message only."""
        frames = self._release()
        self._blocks.clear()
        self._held.clear()
        self._argless.clear()
        self._earlier = {k: v for k, v in self._calls.items() if k not in self._results}
        self._calls.clear()
        self._results.clear()
        self._gated.clear()
        self._asks = False
        self._stop_reason = None
        self._usage.message_start(message)
        if self._started:
            return frames  # the next round of the same turn: one completion
        self._started = True
        model = message.get("model")
        if isinstance(model, str) and model:
            self.model = model
            self._content_head = None
        return [self._chunk({"role": "assistant", "content": ""})]

    def on_block_start(self, index: int, block: dict[str, Any]) -> list[bytes]:
        """Nothing yet for a tool call (held, see the class) or a text or reasoning
        block; a question's tool call."""
        kind = str(block.get("type"))
        if kind == BlockType.TOOL_USE:
            held = _Held(index, block)
            self._held[index] = held
            self._calls[str(block["id"])] = held
            self._queue.append(held)
            return []
        if kind == BlockType.APPROVAL_REQUEST:
            self._blocks[index] = (_QUIET, -1)
            self._asks = True
            self._queue.append(block)
            self._gated.add(str(block["tool_use_id"]))
            return []
        if kind == BlockType.TOOL_RESULT:
            self._blocks[index] = (kind, -1)  # not written; its calls stay held
            self._results.add(str(block.get("tool_use_id")))
            return []
        if kind == BlockType.QUESTION and isinstance(block.get("tool_use_id"), str):
            # A call's question: the app runs that call, not the client.
            self._gated.add(block["tool_use_id"])
        calls = self._released()
        self._blocks[index] = (kind, -1)
        if kind == BlockType.QUESTION:
            self._blocks[index] = (_QUIET, -1)
            self._asks = True
            fields: dict[str, Any] = {"question": str(block.get("question", ""))}
            schema = block.get("schema")
            if isinstance(schema, dict):
                fields["schema"] = schema
            calls.append(self._call(str(block["id"]), QUESTION_TOOL, _json(fields)))
        elif kind not in (BlockType.TEXT, BlockType.THINKING):
            logger.debug("a %s block has no place in a chat completion", log_label(kind))
        return self._calls_chunk(calls)

    def _calls_chunk(self, calls: list[dict[str, Any]]) -> list[bytes]:
        return [self._chunk({"tool_calls": calls})] if calls else []

    def _call(self, call_id: str, name: str, arguments: str) -> dict[str, Any]:
        """A tool call's first entry (with its arguments so far)."""
        call = self._calls_written
        self._calls_written += 1
        tool_call = {
            "index": call,
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        if self.tool_calls is not None:
            function = {"name": name, "arguments": arguments}
            self.tool_calls.append({"id": call_id, "type": "function", "function": function})
        return tool_call

    def _release(self) -> list[bytes]:
        """The chunk of the held calls and approval requests (see :meth:`_released`)."""
        return self._calls_chunk(self._released())

    def _released(self) -> list[dict[str, Any]]:
        """The held calls and approval requests, in order, as the entries of one chunk:
        each call not gated by an approval request as its tool call with its arguments
        so far, each approval request as a call of ``approve_tool_call``."""
        if not self._queue:
            return []
        queue, self._queue = self._queue, []
        calls: list[dict[str, Any]] = []
        for entry in queue:
            if isinstance(entry, dict):
                calls.append(self._approval(entry))
                continue
            open_block = self._held.pop(entry.index, None) is not None
            block = entry.block
            if str(block["id"]) in self._gated:
                if open_block:
                    self._blocks[entry.index] = (_GATED, -1)
                continue
            call = self._calls_written
            name = str(block["name"])
            if open_block:
                arguments = "".join(entry.parts)
                self._blocks[entry.index] = (BlockType.TOOL_USE, call)
                if not arguments:
                    self._argless[entry.index] = block  # its arguments may still come
            else:
                arguments = call_arguments(entry.parts, block)
            calls.append(self._call(str(block["id"]), name, arguments))
        return calls

    def _approval(self, block: dict[str, Any]) -> dict[str, Any]:
        call_id = str(block["tool_use_id"])
        call = self._calls.get(call_id) or self._earlier.get(call_id)
        fields: dict[str, Any] = {"tool_use_id": call_id}
        fields["name"] = str(call.block.get("name", "")) if call is not None else ""
        fields["arguments"] = call_arguments(call.parts, call.block) if call is not None else ""
        reason = block.get("reason")
        if isinstance(reason, str):
            fields["reason"] = reason
        return self._call(str(block["id"]), APPROVAL_TOOL, _json(fields))

    def on_delta(self, index: int, delta: dict[str, Any]) -> list[bytes]:
        """A content, reasoning or tool-arguments chunk (a held call's arguments are
        kept for its chunk)."""
        held = self._held.get(index)
        if held is not None and delta.get("type") == DeltaType.INPUT_JSON:
            fragment = str(delta["partial_json"])
            if held.size + len(fragment) <= MAX_HELD:
                held.size += len(fragment)
                held.parts.append(fragment)
                return []
            frames = self._release()  # too large to hold: the round goes out now
            return frames + self.on_delta(index, delta)
        kind, call = self._blocks.get(index, ("", -1))
        delta_type = delta.get("type")
        if kind == BlockType.TEXT and delta_type == DeltaType.TEXT:
            return [self._chunk({"content": str(delta["text"])})]
        if kind == BlockType.THINKING and delta_type == DeltaType.THINKING:
            text = delta.get("thinking", delta.get("text"))  # the two dialects
            return [self._chunk({"reasoning_content": str(text)})]
        if kind == BlockType.TOOL_USE and delta_type == DeltaType.INPUT_JSON:
            text = str(delta["partial_json"])
            if text:
                self._argless.pop(index, None)
            return [self._arguments_chunk(call, text)]
        return []  # a signature, a tool result, a block without a place here

    def _arguments_chunk(self, call: int, text: str) -> bytes:
        """A chunk of call ``call``'s arguments."""
        if self.tool_calls is not None:
            self.tool_calls[call]["function"]["arguments"] += text
        return self._chunk({"tool_calls": [{"index": call, "function": {"arguments": text}}]})

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


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


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
    ``stream``): what a client that reads the stream ends with, chunk by chunk (the same
    text, reasoning, tool calls, finish reason and usage; a message that asks ends it).

    Raises :class:`~essessey.ProviderStreamError` with the error's type and message when
    the stream would carry an error object (the turn failed): a failed turn has no
    completion to answer.
    """
    encoder = ChatCompletionsEncoder(
        completion_id, model=model, include_usage=True, created=created, collect=True
    )
    frames = b"".join([*(encoder.encode(event) for event in events), encoder.finish()])
    content: list[str] = []
    reasoning: list[str] = []
    finish_reason = "stop"
    usage: Any = None
    named = model
    for line in frames.split(b"\n"):
        if not line.startswith(b"data: {"):
            continue  # an id, a blank line, [DONE]
        chunk = orjson.loads(line[6:])
        error = chunk.get("error")
        if isinstance(error, dict):
            raise ProviderStreamError(str(error.get("type")), str(error.get("message")))
        named = chunk["model"]
        usage = chunk.get("usage") or usage
        for choice in chunk["choices"]:
            delta = choice["delta"]
            content.append(delta.get("content") or "")
            reasoning.append(delta.get("reasoning_content") or "")
            finish_reason = choice["finish_reason"] or finish_reason
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if any(reasoning):
        message["reasoning_content"] = "".join(reasoning)
    if encoder.tool_calls:
        message["tool_calls"] = encoder.tool_calls
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": encoder.created,
        "model": named,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": usage if usage is not None else openai_usage(TurnUsage()),
    }


# -- serving it ---------------------------------------------------------------------------
