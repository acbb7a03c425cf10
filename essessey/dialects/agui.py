"""A turn as AG-UI events, what CopilotKit, TanStack AI and ``@ag-ui/client`` read;
docs/dialects.md.

Each frame is ``data: {event}``, camelCase JSON as the AG-UI SDKs write it, without the
fields that are unset, and with the protocol event's ``id:``, so a client that dropped
resumes (AG-UI's own encoder writes no ids). The mapping:

- the turn's first ``message_start``: ``RUN_STARTED``; each model round:
  ``STEP_STARTED`` ... ``STEP_FINISHED``. A round is a protocol message, or, in a message
  that holds several (``stream_rounds``), what comes up to its tool results: a block
  after a round's results starts the next step. A message's last ``STEP_FINISHED``
  carries its ``message_delta`` (stop reason, usage) as ``rawEvent``, as the protocol
  sent it;
- a text block: ``TEXT_MESSAGE_START`` / ``_CONTENT`` / ``_END`` (role ``assistant``);
- a thinking block: ``REASONING_START``, ``REASONING_MESSAGE_START`` / ``_CONTENT`` /
  ``_END``, its signature as ``REASONING_ENCRYPTED_VALUE``, ``REASONING_END``; a
  redacted thinking block: its data as ``REASONING_ENCRYPTED_VALUE`` alone;
- a tool use: ``TOOL_CALL_START`` / ``_ARGS`` / ``_END``; a tool result:
  ``TOOL_CALL_RESULT`` at its stop, its start (``is_error`` with it) as ``rawEvent``;
- any other block (a server tool's, citations, a type this module does not know): a
  ``CUSTOM`` event ``essessey-block`` at its stop, with the block and its deltas;
- the turn's end: ``RUN_FINISHED`` with the turn's usage; an ``error`` event, or a
  cancelled turn, ``RUN_ERROR`` (code: the error's type, or ``CANCELLED``).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Unpack

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from essessey.bindings.admission import Refusal, admit
from essessey.bindings.http import json_error
from essessey.bindings.sse import SSEOptions, requested_resume_point, stream_response
from essessey.dialects._payload import encode_event, input_tokens, message_delta_totals
from essessey.dialects._routes import make_producer, read_request
from essessey.errors import StreamBusy
from essessey.event import Event
from essessey.hub import StreamHub
from essessey.protocol import BlockType, DeltaType, EventType, StopReason
from essessey.publisher import TurnProducer

__all__ = [
    "BLOCK_EVENT",
    "DEFAULT_MAX_BUFFER",
    "AGUIEncoder",
    "AGUIRunRequest",
    "AGUITurnFactory",
    "agui_routes",
    "error_object",
    "parse_run_agent_input",
    "run_stream_id",
]

logger = logging.getLogger("essessey.dialects.agui")

BLOCK_EVENT: Final = "essessey-block"
"""The name of the ``CUSTOM`` event that carries a block AG-UI has no events for."""

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


class AGUIEncoder:
    """One turn's protocol events, in order, as AG-UI events (a
    :class:`~essessey.bindings.sse.FrameEncoder`) for the run ``run_id`` of the thread
    ``thread_id``. ``max_buffer`` bounds the bytes of one block held until its stop."""

    def __init__(
        self, thread_id: str, run_id: str, *, max_buffer: int = DEFAULT_MAX_BUFFER
    ) -> None:
        if max_buffer <= 0:
            raise ValueError("max_buffer must be > 0")
        self.thread_id = thread_id
        self.run_id = run_id
        self.max_buffer = max_buffer
        self._started = False
        self._ended = False
        self._step = 0
        self._after_results = False  # the step's last block was a tool result
        self._message_id = ""
        self._blocks: dict[int, _Block] = {}
        self._stop_reason: str | None = None
        self._delta: dict[str, Any] | None = None
        self._model: str | None = None
        self._input_tokens = 0
        self._output_tokens = 0

    # -- FrameEncoder --------------------------------------------------------------------

    def encode(self, event: Event) -> bytes:
        """The AG-UI events for ``event``, the last with its ``id:``."""
        if self._ended:
            return b""
        return encode_event(event, logger, self.encode_text, self._frames)

    def encode_text(self, index: int, text: str) -> bytes | None:
        """One ``TEXT_MESSAGE_CONTENT`` of ``text`` (nothing for an empty one) for block
        ``index``; None when that is not an open text block."""
        block = self._blocks.get(index) if self._step and not self._ended else None
        if block is None or block.kind != _TEXT:
            return None
        return _TEXT_CONTENT % (block.id_json, _dumps(text)) if text else b""

    def finish(self) -> bytes:
        """``RUN_FINISHED`` if no message ended the run yet."""
        if self._ended:
            return b""
        frames = [] if self._started else self._run_started()
        return b"".join(frames + self._end())

    def fail(self, error_type: str, message: str) -> bytes:
        """``RUN_ERROR``."""
        if self._ended:
            return b""
        frames = [] if self._started else self._run_started()
        return b"".join(frames + self._error(error_type, message))

    # -- the events ----------------------------------------------------------------------

    def _run_started(self) -> list[bytes]:
        self._started = True
        return [_frame({"type": "RUN_STARTED", "threadId": self.thread_id, "runId": self.run_id})]

    def _frames(self, name: str, payload: dict[str, Any]) -> list[bytes]:
        if name == EventType.MESSAGE_START:
            return self._message_start(payload.get("message") or {})
        if name == EventType.ERROR:
            error = payload.get("error") or {}
            frames = [] if self._started else self._run_started()
            kind = str(error.get("type") or "api_error")
            return frames + self._error(kind, str(error.get("message") or ""))
        if not self._step:
            logger.warning("skipped a %s event before the turn's first message", name)
            return []
        if name == EventType.CONTENT_BLOCK_START:
            return self._block_start(int(payload["index"]), payload["content_block"])
        if name == EventType.CONTENT_BLOCK_DELTA:
            return self._block_delta(int(payload["index"]), payload["delta"])
        if name == EventType.CONTENT_BLOCK_STOP:
            return self._block_stop(int(payload["index"]))
        if name == EventType.MESSAGE_DELTA:
            self._delta = payload
            reason, output = message_delta_totals(payload)
            if reason is not None:
                self._stop_reason = reason
            self._output_tokens += output
            return []
        if name == EventType.MESSAGE_STOP:
            step: dict[str, Any] = {"type": "STEP_FINISHED", "stepName": self._step_name()}
            if self._delta is not None:
                step["rawEvent"] = self._delta
            frames = [_frame(step)]
            if self._stop_reason == StopReason.CANCELLED:
                return frames + self._error("CANCELLED", "the turn was cancelled")
            if self._stop_reason is not None and self._stop_reason != StopReason.TOOL_USE:
                return frames + self._end()
            return frames
        logger.warning("skipped an event of unknown type (%d characters)", len(name))
        return []

    def _step_name(self) -> str:
        return f"round {self._step}"

    def _message_start(self, message: dict[str, Any]) -> list[bytes]:
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
        self._input_tokens += input_tokens(message)
        return [*frames, _frame({"type": "STEP_STARTED", "stepName": self._step_name()})]

    def _block_start(self, index: int, start: dict[str, Any]) -> list[bytes]:
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

    def _block_delta(self, index: int, delta: dict[str, Any]) -> list[bytes]:
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

    def _block_stop(self, index: int) -> list[bytes]:
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
        self._ended = True
        usage: dict[str, Any] = {
            "inputTokens": self._input_tokens,
            "outputTokens": self._output_tokens,
            "totalTokens": self._input_tokens + self._output_tokens,
        }
        if self._model:
            usage["model"] = self._model
        finished: dict[str, Any] = {"type": "RUN_FINISHED", "threadId": self.thread_id}
        finished["runId"] = self.run_id
        finished["usage"] = [usage]
        return [_frame(finished)]

    def _error(self, code: str, message: str) -> list[bytes]:
        self._ended = True
        return [_frame({"type": "RUN_ERROR", "message": message, "code": code})]


# -- serving it ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AGUIRunRequest:
    """A validated ``RunAgentInput``: the hub stream its run is served from (``id``), the
    ``thread_id`` and ``run_id`` the client chose, its ``messages`` and the whole JSON
    ``body`` (``tools``, ``context``, ``state``, ``forwardedProps``), as sent."""

    id: str
    thread_id: str
    run_id: str
    messages: list[Any]
    body: dict[str, Any] = field(default_factory=dict)


AGUITurnFactory = Callable[[AGUIRunRequest], "TurnProducer | Awaitable[TurnProducer]"]
"""``turn(run) -> producer``: the agent's answer to a run, as a hub producer; a
``ValueError`` it raises is the client's 400."""

DEFAULT_MAX_BODY: Final = 4 * 1024 * 1024


def parse_run_agent_input(body: Any) -> AGUIRunRequest:
    """An :class:`AGUIRunRequest` from a parsed ``RunAgentInput`` body; ``ValueError``
    naming the first problem."""
    if not isinstance(body, dict):
        raise ValueError("the request body must be a JSON object (a RunAgentInput)")
    thread_id, run_id = body.get("threadId"), body.get("runId")
    if not isinstance(thread_id, str) or not thread_id:
        raise ValueError("threadId: a non-empty string is required")
    if not isinstance(run_id, str) or not run_id:
        raise ValueError("runId: a non-empty string is required")
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ValueError("messages: a list of message objects is required")
    return AGUIRunRequest(run_stream_id(thread_id, run_id), thread_id, run_id, messages, body)


def agui_routes(
    hub: StreamHub,
    turn: AGUITurnFactory,
    *,
    path: str = "/agui",
    max_body: int = DEFAULT_MAX_BODY,
    **options: Unpack[SSEOptions],
) -> Sequence[BaseRoute]:
    """A Starlette route serving AG-UI runs from ``hub``: ``POST {path}`` of a
    ``RunAgentInput`` (what ``@ag-ui/client``'s ``HttpAgent`` sends). A new run's turn
    (``turn(run)``) runs on the hub and streams as AG-UI events. The same run posted
    again (its ``threadId`` and ``runId``), on any replica, is served from the hub
    instead of starting anew: after its ``Last-Event-ID`` when the client sends one,
    else from its start. Errors before the stream are JSON ``RUN_ERROR`` objects (400 for
    a bad body). ``options`` go to the SSE response."""
    if max_body <= 0:
        raise ValueError("max_body must be > 0")
    headers = dict(options.get("headers") or {})

    def refuse(status: int, error_type: str, message: str) -> Response:
        return json_error(status, error_type, message, headers, shape=error_object)

    async def run(request: Request) -> Response:
        parsed = await read_request(
            request, parse_run_agent_input, limit=max_body, shape=error_object, headers=headers
        )
        if isinstance(parsed, Response):
            return parsed
        given = requested_resume_point(request)
        verdict = await admit(hub, request, parsed.id, given, logger)
        if isinstance(verdict, Refusal):
            return refuse(verdict.status, verdict.error_type, verdict.message)
        encoder = AGUIEncoder(parsed.thread_id, parsed.run_id)
        if verdict.last_event_id is None and not await hub.store.exists(parsed.id):
            try:
                producer = await make_producer(turn, parsed)
            except ValueError as exc:  # the app's own options, refused
                return refuse(400, "invalid_request_error", str(exc))
            # Posted twice at once: the second reads the first's run.
            with contextlib.suppress(StreamBusy):
                await hub.start(parsed.id, producer)
        return stream_response(
            hub,
            parsed.id,
            verdict.last_event_id,
            encoder=encoder,
            error_shape=error_object,
            **options,
        )

    return [Route(path, run, methods=["POST"])]
