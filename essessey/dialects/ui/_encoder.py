"""A turn's protocol events written as the AI SDK's UI message stream (see docs/ui.md).

One turn is one assistant UI message: ``start`` (with the first message's id, so a
replay of the same turn names the same message and the client replaces it instead of
adding a second), then one step per model round (``start-step`` ... ``finish-step``), as
the AI SDK's own ``streamText`` writes it, then ``finish`` and ``data: [DONE]``. A round
is a protocol message, or, in a message that holds several (``stream_rounds``), what
comes up to its tool results: a block after a round's results opens the next step.
Inside a step:

- a text block is ``text-start`` / ``text-delta`` / ``text-end``, a thinking block
  ``reasoning-start`` / ``reasoning-delta`` / ``reasoning-end``, its signature in the
  ``reasoning-end``'s ``providerMetadata.essessey.signature`` (the part keeps it, and the
  client sends it back with the message);
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

A turn that asks (docs/asking.md, docs/ui.md "Approvals, client tools and questions"):

- an ``approval_request`` block is a ``tool-approval-request`` chunk naming the call it
  gates (the part goes to ``approval-requested``); a client call (a tool use with no
  result in its message) is a tool call like any other, which the client runs; a
  ``question`` is a call of the tool ``ask_user`` (``tool-input-start`` then
  ``tool-input-available`` with ``{"question", "schema"?}``), whose output is the answer;
- the continuation is the same UI message: the message after one that asked opens its
  step only at its first block that is not a record of an answer, so the records and the
  approved calls' results update the parts where they are, as ``streamText`` writes them:
  an ``approval_response`` is a ``tool-approval-response`` chunk, and when denied a
  ``tool-output-denied`` for its call (whose later ``tool_result``, if any, is left out:
  the part stays denied); an ``answer`` is the question's ``tool-output-available``; a
  client call's result is its ``tool-output-available`` (``tool-output-error``), as any.
  Written again to the client that sent them, these change nothing; a client call's
  output is not (``after``: the client has it as it sent it).
- ``after`` makes the encoder write the continuation alone, as the answer to the POST
  that answered: the events up to ``after`` (the asking message's last) are read, not
  written, and what follows starts with ``start`` again, under the same message id.

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
from collections.abc import Mapping
from typing import Any, Final

import orjson

from essessey._logsafe import log_label
from essessey.dialects._payload import QUESTION_TOOL, TurnUsage, read_payload
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
_NAME: Final = re.compile(r"[^A-Za-z0-9_-]")
_RECORDS: Final = frozenset({BlockType.TOOL_RESULT, BlockType.APPROVAL_RESPONSE, BlockType.ANSWER})
"""Blocks that may open a continuation before its step: the answers' records, results."""
_REQUESTS: Final = frozenset({BlockType.APPROVAL_REQUEST, BlockType.QUESTION})


def frame(chunk: dict[str, Any]) -> bytes:
    """One UI message chunk as its SSE line."""
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


class _Block:
    __slots__ = ("content", "held", "id", "id_json", "kind", "signature", "size", "skipped")

    def __init__(self, kind: str, block_id: str, content: dict[str, Any]) -> None:
        self.kind = kind
        self.id = block_id
        self.id_json = orjson.dumps(block_id)  # for the frames spliced without a dict
        self.content = content
        self.held: list[Any] = []  # fragments (tool input, result) or deltas (unknown)
        self.size = 0
        self.skipped = False
        self.signature: str | None = None  # a thinking block's, sent whole


class UIMessageEncoder(DialectEncoder):
    """Turns the protocol events of one turn, in order, into UI message stream lines.

    Call :meth:`feed` with each event and write what it returns; :meth:`close` returns
    the end (``finish`` or ``abort``, then ``[DONE]``) once the events have ended. An
    encoder serves one turn. It is a :class:`~essessey.bindings.sse.FrameEncoder` too
    (:meth:`encode`, :meth:`finish`, :meth:`fail`), so the SSE response delivers it.

    ``after`` (an event id, the asking message's last) makes it write the turn's
    continuation alone: the events up to it are read (fed through :meth:`encode`, as the
    SSE response's resume does), not written. ``approval_calls`` maps approval request
    ids to the calls they gate, for a denial whose request the encoder did not read.
    """

    log = logger
    outside_message = "skipped a %s event outside a message"
    # A payload laid out otherwise raises one of these in a hook (others are bugs).
    unreadable = (KeyError, TypeError, ValueError, RecursionError)

    def __init__(
        self,
        *,
        message_id: str | None = None,
        max_buffer: int = DEFAULT_MAX_BUFFER,
        usage_metadata: bool = True,
        custom_chunks: bool = True,
        after: str | None = None,
        approval_calls: Mapping[str, str] | None = None,
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
        self._started = False  # ``start`` written
        self._in_step = False
        self._after_results = False  # the step's last block was a tool result
        self._blocks: dict[int, _Block] = {}
        self._stop_reason: str | None = None
        self.ended = False
        """Whether an ``error`` chunk ended the stream (the client reads nothing after)."""
        # A turn that asks: the step of the message after an asking one opens at its
        # first block that is not an answer's record.
        self._step_open = False
        self._message_asks = False  # the open message has a request block
        self._calls: set[str] = set()  # the open message's calls without a result
        # The open message's calls whose input went out: name and input.
        self._inputs: dict[str, tuple[str, Any]] = {}
        self._client_calls: set[str] = set()  # those of the last message that asked
        self._sent: set[str] = set()  # client calls whose output the client sent
        self._asked = False  # the last message that ended asked something
        self._message_reason: str | None = None  # the open message's stop reason
        self._approval_calls: dict[str, str] = dict(approval_calls or {})
        self._denied: set[str] = set()  # calls whose approval was denied
        self.start_after(after)

    def read_before(self, event: Event) -> None:
        """An event up to ``after``: read as the turn's UI message would be, nothing
        written."""
        DialectEncoder.encode(self, event)

    def reached_after(self) -> None:
        """From here on the continuation is written as the turn's UI message, from its
        ``start``."""
        self._started = False
        self._sent = self._client_calls
        self._in_step = self._step_open = self._after_results = False
        self._blocks.clear()
        self._stop_reason = None

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
            logger.warning("skipped a %s event: %s", log_label(event.event), type(exc).__name__)
            return []

    def encode_text(self, index: int, text: str, text_json: bytes) -> bytes | None:
        """One ``text-delta`` chunk of ``text`` for block ``index``; None when that is
        not an open text block."""
        block = self._blocks.get(index) if self._in_step and not self.ended else None
        if block is None or block.kind != _TEXT:
            return None
        return _TEXT_DELTA % (block.id_json, text_json)

    def finish(self) -> bytes:
        """:meth:`close`."""
        return self.close()

    def fail(self, error_type: str, message: str) -> bytes:
        """An ``error`` chunk with ``message``, then ``[DONE]``."""
        self.ended = True
        self._in_step = self._step_open = False
        return frame({"type": "error", "errorText": message}) + DONE

    def close(self) -> bytes:
        """The stream's end: ``finish`` with the mapped finish reason (``abort`` for a
        cancelled turn), then ``[DONE]``; only ``[DONE]`` after an error."""
        out: list[bytes] = []
        if not self.ended:
            # A stream that ended inside its message: its open parts end first, as each
            # block's stop would have ended it (the client leaves an unended part
            # streaming, and a tool result or a signature goes out only at its end).
            for index in sorted(self._blocks):
                out += self.on_block_stop(index)
        if self._step_open:
            out.append(frame({"type": "finish-step"}))
        self._in_step = self._step_open = False
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

    def _usage_fields(self) -> dict[str, Any]:
        """The turn's counts in the AI SDK's usage fields (``LanguageModelUsage``)."""
        counts = self._usage
        prompt, output = counts.prompt_tokens, counts.output_tokens
        reasoning = counts.count("reasoning_tokens")
        return {
            "inputTokens": prompt,
            "inputTokenDetails": {
                "noCacheTokens": counts.count("input_tokens"),
                "cacheReadTokens": counts.count("cache_read_input_tokens"),
                "cacheWriteTokens": counts.count("cache_creation_input_tokens"),
            },
            "outputTokens": output,
            "outputTokenDetails": {
                "textTokens": max(output - reasoning, 0),
                "reasoningTokens": reasoning,
            },
            "totalTokens": prompt + output,
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
        self._in_step = self._step_open = False
        return [frame({"type": "error", "errorText": str(message or "the turn failed")})]

    def on_message_delta(self, payload: dict[str, Any]) -> list[bytes]:
        """Nothing yet: the stop reason goes into ``finish``."""
        delta = payload.get("delta")
        reason = delta.get("stop_reason") if isinstance(delta, dict) else None
        if isinstance(reason, str):
            self._stop_reason = self._message_reason = reason
        self._usage.message_delta(payload)
        return []

    def on_message_stop(self) -> list[bytes]:
        """``finish-step`` (after its ``start-step``, for a continuation with nothing but
        records: every message is a step, and a client that sends once the last step's
        calls are all answered finds none to send again)."""
        out = [] if self._step_open else [frame({"type": "start-step"})]
        self._asked = self._message_reason == StopReason.TOOL_USE and bool(
            self._message_asks or self._calls
        )
        if self._asked:
            self._client_calls = self._calls - set(self._approval_calls.values())
        self._in_step = self._step_open = False
        self._blocks.clear()
        return [*out, frame({"type": "finish-step"})]

    def _message_start(self, payload: dict[str, Any]) -> list[bytes]:
        message = payload.get("message")
        if isinstance(message, dict):
            self._usage.message_start(message)
        out: list[bytes] = []
        if self._step_open:  # a message that never stopped: its step ends here
            out.append(frame({"type": "finish-step"}))
        # The turn's finish reason is its last message's: one that never says its own
        # has none (an earlier message's would read as this one's).
        self._stop_reason = None
        if not self._started:
            self._started = True
            if self.message_id is None:
                message = payload.get("message")
                message_id = message.get("id") if isinstance(message, dict) else None
                self.message_id = str(message_id) if message_id else f"turn-{id(self):x}"
            out.append(frame({"type": "start", "messageId": self.message_id}))
        self._step += 1
        self._in_step = True
        self._after_results = False
        self._blocks.clear()
        self._message_asks = False
        self._calls = set()
        self._inputs = {}
        # The continuation of a turn that asked: its records update the parts they
        # answer, in the step that asked; its own step opens at its first other block.
        self._step_open = not self._asked
        self._asked = False
        self._message_reason = None
        if self._step_open:
            out.append(frame({"type": "start-step"}))
        return out

    def on_block_start(self, index: int, content: dict[str, Any]) -> list[bytes]:
        """The part's start chunk; a new step after a round's tool results."""
        kind = content.get("type")
        out: list[bytes] = []
        if kind in _RECORDS:
            self._after_results = self._step_open
        elif not self._step_open:
            self._step_open = True
            self._after_results = False
            out.append(frame({"type": "start-step"}))
        elif self._after_results and not (kind in _REQUESTS or self._message_asks):
            # The next model round of the same message: a step of its own. Not what the
            # message asks (a request, or a client's call after one): the AI SDK's
            # clients answer the last step's parts together, so every part the message
            # asks about stays in one step.
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
            self._calls.add(block.id)
            chunk = {"type": "tool-input-start", "toolCallId": block.id}
            chunk["toolName"] = str(content["name"])
            return [frame(chunk)]
        if kind == BlockType.TOOL_RESULT:
            self._calls.discard(str(content["tool_use_id"]))
        elif kind in _REQUESTS:
            self._message_asks = True
        if kind == BlockType.QUESTION:
            # A call of the question tool, whose output is the answer.
            block = _Block(kind, str(content["id"]), content)
            self._blocks[index] = block
            return [
                frame(
                    {"type": "tool-input-start", "toolCallId": block.id, "toolName": QUESTION_TOOL}
                )
            ]
        self._blocks[index] = _Block(str(kind), block_id, content)
        return []  # a tool result, a request, a record, an unknown block: whole at its stop

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
                # Whole, the last one kept (docs/protocol.md): on the part at its end.
                block.signature = str(delta["signature"])
                return []
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
            end: dict[str, Any] = {"type": "reasoning-end", "id": block.id}
            if block.signature is not None:
                # The reasoning part's providerMetadata, which the client sends back with
                # the message (convertToModelMessages: the part's providerOptions).
                end["providerMetadata"] = {"essessey": {"signature": block.signature}}
            return [frame(end)]
        if block.skipped:
            return []
        if block.kind == BlockType.TOOL_USE:
            return [self._tool_input(block)]
        if block.kind == BlockType.TOOL_RESULT:
            call_id = str(block.content["tool_use_id"])
            if call_id in self._denied:
                return []  # the app's record of a denied call: the part stays denied
            if call_id in self._sent:
                # The record of the output the client sent: the client has it as it
                # was (the record holds it as text, which may read back otherwise).
                self._sent.discard(call_id)
                return []
            return [self._tool_output(block)]
        asking = self._asking(block)
        if asking is not None:
            return asking
        kind = _NAME.sub("_", block.kind)
        data = {"block": block.content, "deltas": block.held}
        if self.custom_chunks:
            metadata = {"essessey": {"id": f"{block.id}-{kind}", **data}}
            custom = {"type": "custom", "kind": f"essessey.{kind}", "providerMetadata": metadata}
            return [frame(custom)]
        return [frame({"type": _DATA_PART, "id": f"{block.id}-{kind}", "data": data})]

    def _asking(self, block: _Block) -> list[bytes] | None:
        """The chunks of a request or a record of its answer; None for another block."""
        content = block.content
        if block.kind == BlockType.APPROVAL_REQUEST:
            request_id, call_id = str(content["id"]), str(content["tool_use_id"])
            self._approval_calls[request_id] = call_id
            chunk: dict[str, Any] = {"type": "tool-approval-request", "approvalId": request_id}
            chunk["toolCallId"] = call_id
            reason = content.get("reason")
            if isinstance(reason, str):
                chunk["reason"] = reason
            return [frame(chunk)]
        if block.kind == BlockType.QUESTION:
            tool_input: dict[str, Any] = {"question": str(content.get("question", ""))}
            schema = content.get("schema")
            if isinstance(schema, dict):
                tool_input["schema"] = schema
            chunk = {"type": "tool-input-available", "toolCallId": block.id}
            chunk.update(toolName=QUESTION_TOOL, input=tool_input)
            return [*self._run_here(content.get("tool_use_id")), frame(chunk)]
        if block.kind == BlockType.APPROVAL_RESPONSE:
            request_id = str(content["request_id"])
            approved = content.get("approved") is True
            chunk = {"type": "tool-approval-response", "approvalId": request_id}
            chunk["approved"] = approved
            reason = content.get("reason")
            if isinstance(reason, str):
                chunk["reason"] = reason
            out = [frame(chunk)]
            gated = self._approval_calls.get(request_id)
            if not approved:
                if gated is None:
                    logger.warning("a denied approval names a request this stream did not show")
                else:
                    self._denied.add(gated)
                    out.append(frame({"type": "tool-output-denied", "toolCallId": gated}))
            return out
        if block.kind == BlockType.ANSWER:
            chunk = {"type": "tool-output-available", "toolCallId": str(content["request_id"])}
            chunk["output"] = content.get("value")
            return [frame(chunk)]
        return None

    def _run_here(self, call_id: object) -> list[bytes]:
        """The call a question is asked by: the server runs it, not the client. Its part
        is written again as executed by the server (``providerExecuted``), so that a
        client waiting for every call's output (``lastAssistantMessageIsCompleteWith
        ToolCalls``) waits for the question's answer alone."""
        call = self._inputs.get(call_id) if isinstance(call_id, str) else None
        if call is None:
            return []
        self._calls.discard(str(call_id))
        chunk: dict[str, Any] = {"type": "tool-input-available", "toolCallId": call_id}
        chunk.update(toolName=call[0], input=call[1], providerExecuted=True)
        return [frame(chunk)]

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
        self._inputs[block.id] = (name, tool_input)
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
