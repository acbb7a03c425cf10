"""A turn as OpenAI Chat Completions chunks, the stream every OpenAI-compatible client
reads (the ``openai`` SDKs, LangChain's ChatOpenAI, Open WebUI, LiteLLM); docs/dialects.md.

Each frame is ``data: {chat.completion.chunk}`` and the stream ends with
``data: [DONE]``. The mapping:

- the turn's first ``message_start``: the first chunk, ``delta.role`` ``assistant``;
- a text delta: ``delta.content``; a thinking delta: ``delta.reasoning_content`` (what
  vLLM, DeepSeek and LiteLLM write); a thinking signature has no field and is left out;
- a tool use: ``delta.tool_calls`` with its ``index`` (counted over the whole turn, so
  the calls of two rounds never merge), ``id``, ``function.name``, then one chunk per
  argument fragment;
- the stop of a message that does not stop for a tool: ``finish_reason`` (``stop``,
  ``length``, ``tool_calls``, ``content_filter``); a turn that ends on a tool stop gets
  ``tool_calls`` at its end;
- usage, when asked for (``stream_options.include_usage``): one last chunk with empty
  ``choices`` and the turn's ``prompt_tokens`` and ``completion_tokens``;
- an ``error`` event: the in-band ``{"error": {...}}`` object OpenAI-compatible servers
  send, then ``[DONE]``.

Left out, because Chat Completions has no place for them in the model's output: tool
results (a turn that runs tools and answers again reads as the rounds' output, one after
another), server tool blocks and any block type this module does not know (logged once
per block at debug level), citations.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Unpack

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from essessey.bindings.sse import SSEOptions, stream_response, subscription_response
from essessey.dialects._payload import encode_event, input_tokens, message_delta_totals
from essessey.dialects._routes import read_request, start_turn
from essessey.event import Event
from essessey.hub import StreamHub
from essessey.protocol import BlockType, DeltaType, EventType, StopReason
from essessey.publisher import TurnProducer
from essessey.reassemble import reassemble_events

__all__ = [
    "DONE",
    "FINISH_REASONS",
    "ChatCompletionRequest",
    "ChatCompletionsEncoder",
    "ChatTurnFactory",
    "chat_completions_routes",
    "completion",
    "error_object",
    "parse_chat_completion_request",
]

logger = logging.getLogger("essessey.dialects.chat_completions")

DONE: Final = b"data: [DONE]\n\n"
"""The frame that ends a Chat Completions stream."""

FINISH_REASONS: Final[dict[str, str]] = {
    StopReason.END_TURN: "stop",
    StopReason.STOP_SEQUENCE: "stop",
    StopReason.TOOL_USE: "tool_calls",
    StopReason.MAX_TOKENS: "length",
    StopReason.CANCELLED: "stop",
    "refusal": "content_filter",
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


class ChatCompletionsEncoder:
    """One turn's protocol events, in order, as ``chat.completion.chunk`` frames (a
    :class:`~essessey.bindings.sse.FrameEncoder`). ``completion_id`` names the chunks
    (``chatcmpl-...``), ``model`` fills their ``model`` until the turn's first message
    names one; ``include_usage`` adds the usage chunk at the end."""

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
        self._ended = False  # an error was written: nothing more is
        self._prompt_tokens = 0
        self._completion_tokens = 0
        self._content_head: bytes | None = None  # a content chunk up to its text

    # -- FrameEncoder --------------------------------------------------------------------

    def encode(self, event: Event) -> bytes:
        """The chunks for ``event``, the last with its ``id:``."""
        if self._ended:
            return b""
        return encode_event(event, logger, self.encode_text, self._chunks)

    def encode_text(self, index: int, text: str) -> bytes | None:
        """One content chunk of ``text`` for block ``index``; None when that is not an
        open text block."""
        if self._ended or self._blocks.get(index, _NO_BLOCK)[0] != _TEXT:
            return None
        return self._content_frame(_dumps(text))

    def finish(self) -> bytes:
        """The finish reason (if no message gave it yet), the usage chunk when asked
        for, then ``[DONE]``."""
        out: list[bytes] = []
        if not self._ended:
            if not self._finished and self._stop_reason is not None:
                out.append(self._finish_chunk())
            if self.include_usage:
                out.append(self._usage_chunk())
        out.append(DONE)
        self._ended = True
        return b"".join(out)

    def fail(self, error_type: str, message: str) -> bytes:
        """The in-band error object, then ``[DONE]``."""
        self._ended = True
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

    def _chunks(self, name: str, payload: dict[str, Any]) -> list[bytes]:
        if name == EventType.MESSAGE_START:
            return self._message_start(payload.get("message") or {})
        if name == EventType.CONTENT_BLOCK_START:
            return self._block_start(int(payload["index"]), payload["content_block"])
        if name == EventType.CONTENT_BLOCK_DELTA:
            return self._block_delta(int(payload["index"]), payload["delta"])
        if name == EventType.CONTENT_BLOCK_STOP:
            self._blocks.pop(int(payload["index"]), None)
            return []
        if name == EventType.MESSAGE_DELTA:
            reason, output = message_delta_totals(payload)
            if reason is not None:
                self._stop_reason = reason
            self._completion_tokens += output
            return []
        if name == EventType.MESSAGE_STOP:
            if self._stop_reason is not None and self._stop_reason != StopReason.TOOL_USE:
                return [self._finish_chunk()]
            return []
        if name == EventType.ERROR:
            error = payload.get("error") or {}
            self._ended = True
            body = error_object(
                str(error.get("type") or "api_error"), str(error.get("message") or "")
            )
            return [b"data: " + body + b"\n\n"]  # [DONE] follows, from finish()
        logger.warning("skipped an event of unknown type (%d characters)", len(name))
        return []

    def _message_start(self, message: dict[str, Any]) -> list[bytes]:
        self._blocks.clear()
        self._stop_reason = None
        self._prompt_tokens += input_tokens(message)
        if self._started:
            return []  # the next round of the same turn: one completion
        self._started = True
        model = message.get("model")
        if isinstance(model, str) and model:
            self.model = model
            self._content_head = None
        return [self._chunk({"role": "assistant", "content": ""})]

    def _block_start(self, index: int, block: dict[str, Any]) -> list[bytes]:
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

    def _block_delta(self, index: int, delta: dict[str, Any]) -> list[bytes]:
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
                "usage": {
                    "prompt_tokens": self._prompt_tokens,
                    "completion_tokens": self._completion_tokens,
                    "total_tokens": self._prompt_tokens + self._completion_tokens,
                },
            }
        )


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
    prompt = turn.usage.get("input_tokens", 0)
    output = turn.usage.get("output_tokens", 0)
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
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": output,
            "total_tokens": prompt + output,
        },
    }


# -- serving it ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChatCompletionRequest:
    """A validated Chat Completions request: the completion's ``id`` (``chatcmpl-...``,
    the hub stream its turn runs on), its ``model``, ``messages`` (as sent),
    whether it asks for a ``stream`` and for the usage chunk (``include_usage``), and the
    whole JSON ``body`` (``tools``, ``temperature`` and the app's own options)."""

    id: str
    model: str
    messages: list[dict[str, Any]]
    stream: bool = False
    include_usage: bool = False
    body: dict[str, Any] = field(default_factory=dict)


ChatTurnFactory = Callable[[ChatCompletionRequest], "TurnProducer | Awaitable[TurnProducer]"]
"""``turn(request) -> producer``: the answer to a request, as a hub producer; a
``ValueError`` it raises is the client's 400."""

_ROLES: Final = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
DEFAULT_MAX_BODY: Final = 4 * 1024 * 1024


def parse_chat_completion_request(body: Any, completion_id: str) -> ChatCompletionRequest:
    """A :class:`ChatCompletionRequest` for ``completion_id`` from a parsed JSON body;
    ``ValueError`` naming the first problem."""
    if not isinstance(body, dict):
        raise ValueError("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ValueError("model: a non-empty string is required")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages: a non-empty list is required")
    for n, item in enumerate(messages):
        if not isinstance(item, dict) or item.get("role") not in _ROLES:
            raise ValueError(f"messages.{n}: an object with a role is required")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise ValueError("stream: must be a boolean")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise ValueError("stream_options: must be an object")
        include_usage = options.get("include_usage", False) is True
    return ChatCompletionRequest(completion_id, model, messages, stream, include_usage, body)


def chat_completions_routes(
    hub: StreamHub,
    turn: ChatTurnFactory,
    *,
    path: str = "/v1/chat/completions",
    max_body: int = DEFAULT_MAX_BODY,
    **options: Unpack[SSEOptions],
) -> Sequence[BaseRoute]:
    """Starlette routes serving Chat Completions from ``hub`` at ``path``:

    - ``POST {path}``: the request's turn (``turn(request)``) runs on the hub under a
      stream id of its own (the completion's id, ``chatcmpl-...``, also in the
      ``location`` header); with ``"stream": true`` the answer streams as chunks, else
      it is the whole ``chat.completion`` once the turn ended.
    - ``GET {path}/{completion_id}``: the stream again, resumed after its
      ``Last-Event-ID`` on any replica (``?include_usage=true`` for the usage chunk).

    Errors are OpenAI's error objects (400 for a bad body). ``options`` go to the SSE
    response (:class:`~essessey.bindings.sse.SSEOptions`)."""
    if max_body <= 0:
        raise ValueError("max_body must be > 0")
    headers = dict(options.get("headers") or {})

    async def create(request: Request) -> Response:
        completion_id = f"chatcmpl-{secrets.token_hex(12)}"
        parsed = await read_request(
            request,
            lambda body: parse_chat_completion_request(body, completion_id),
            limit=max_body,
            shape=error_object,
            headers=headers,
        )
        if isinstance(parsed, Response):
            return parsed
        refused = await start_turn(
            hub,
            request,
            completion_id,
            turn,
            parsed,
            shape=error_object,
            headers=headers,
            log=logger,
        )
        if refused is not None:
            return refused
        location = {"location": f"{path}/{completion_id}"}
        if not parsed.stream:
            await hub.wait(completion_id)
            events, _ = await hub.store.since(completion_id, None)
            whole = completion(events, completion_id, model=parsed.model)
            return Response(
                orjson.dumps(whole),
                headers={**headers, **location},
                media_type="application/json",
            )
        encoder = ChatCompletionsEncoder(
            completion_id, model=parsed.model, include_usage=parsed.include_usage
        )
        delivery: SSEOptions = {**options, "headers": {**headers, **location}}
        return stream_response(
            hub, completion_id, None, encoder=encoder, error_shape=error_object, **delivery
        )

    async def resume(request: Request) -> Response:
        completion_id = request.path_params["completion_id"]
        encoder = ChatCompletionsEncoder(
            completion_id, include_usage=request.query_params.get("include_usage") == "true"
        )
        return await subscription_response(
            hub, request, completion_id, encoder=encoder, shape=error_object, **options
        )

    return [
        Route(path, create, methods=["POST"]),
        Route(path + "/{completion_id}", resume, methods=["GET"]),
    ]
