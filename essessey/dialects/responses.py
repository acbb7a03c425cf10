"""A turn as OpenAI Responses stream events, what the OpenAI Agents SDK and Codex read;
docs/dialects.md.

Each frame is ``event: <type>`` and ``data: {...}`` with the event's ``sequence_number``
(0, 1, 2, ... over the response). The mapping:

- the turn's first ``message_start``: ``response.created`` then ``response.in_progress``,
  the response ``in_progress`` with no output yet;
- a thinking block: a ``reasoning`` output item, ``response.reasoning_text.delta`` per
  delta and ``.done``; its signature (or a redacted block's data) is the item's
  ``encrypted_content``;
- a text block: a ``message`` output item with one ``output_text`` part:
  ``response.output_text.delta`` per delta, then ``.done``, the part's and the item's
  ``done``;
- a tool use: a ``function_call`` item, ``response.function_call_arguments.delta`` per
  fragment, then ``.done`` with the arguments whole;
- a tool result: a ``function_call_output`` item, added and done whole at its stop;
- any other block: one ``response.output_item.done`` of type ``essessey_block`` holding
  the block and its deltas, so nothing the turn carried is lost;
- the turn's end: ``response.completed`` with the whole response (output items and
  usage); ``response.incomplete`` for ``max_tokens`` (reason ``max_output_tokens``) and
  for a cancelled turn (status ``cancelled``); an ``error`` event becomes ``error`` then
  ``response.failed``.

Every output item of every model round is in one response, in order: ``output_index``
counts over the turn. Resume: by ``Last-Event-ID`` (the protocol's ids) or, as OpenAI
serves a background response, by ``starting_after`` a sequence number.
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

from essessey.bindings.admission import Refusal, admit
from essessey.bindings.http import json_error
from essessey.bindings.sse import SSEOptions, stream_response, subscription_response
from essessey.dialects._payload import encode_event, input_tokens, message_delta_totals
from essessey.dialects._routes import read_request, start_turn
from essessey.event import Event
from essessey.hub import StreamHub
from essessey.protocol import BlockType, DeltaType, EventType, StopReason
from essessey.publisher import TurnProducer

__all__ = [
    "DEFAULT_MAX_BUFFER",
    "ResponsesEncoder",
    "ResponsesRequest",
    "ResponsesTurnFactory",
    "error_object",
    "parse_responses_request",
    "responses_routes",
]

logger = logging.getLogger("essessey.dialects.responses")

DEFAULT_MAX_BUFFER: Final = 16 * 1024 * 1024
"""Bytes of one output item's content held until its stop (the ``done`` events repeat it
whole)."""


_TEXT_DELTA: Final = (
    b"event: response.output_text.delta\n"
    b'data: {"type":"response.output_text.delta","sequence_number":%%d,"item_id":%b,'
    b'"output_index":%d,"content_index":0,"delta":%%b,"logprobs":[]}\n\n'
)
"""A text delta's event, as ``_emit`` writes it: filled once per text item with its id
and index (``_Item.text_frame``), then per delta with its number and text."""
# The quick path's names, module globals rather than class attributes looked up per call.
_dumps: Final = orjson.dumps


def error_object(error_type: str, message: str) -> bytes:
    """The JSON of an error as OpenAI answers one (``{"error": {...}}``)."""
    return orjson.dumps(
        {"error": {"message": message, "type": error_type, "param": None, "code": None}}
    )


class _Item:
    __slots__ = (
        "block",
        "deltas",
        "id",
        "id_json",
        "kind",
        "output_index",
        "parts",
        "signature",
        "size",
        "text_frame",
    )

    def __init__(self, kind: str, item_id: str, output_index: int, block: dict[str, Any]) -> None:
        self.kind = kind
        self.id = item_id
        self.id_json = orjson.dumps(item_id)  # for the frames spliced without a dict
        self.output_index = output_index
        self.block = block
        self.parts: list[str] = []
        self.deltas: list[dict[str, Any]] = []
        self.signature: str | None = None
        self.size = 0
        # A text item's delta frame, all but the number and the text filled in.
        self.text_frame = (
            _TEXT_DELTA % (self.id_json, output_index) if kind == BlockType.TEXT else None
        )


class ResponsesEncoder:
    """One turn's protocol events, in order, as Responses stream events (a
    :class:`~essessey.bindings.sse.FrameEncoder`).

    ``response_id`` names the response (``resp_...``), ``model`` fills its ``model``
    until the turn's first message names one. ``starting_after`` drops the events up to
    that sequence number (they are counted, not written): a resume the way OpenAI serves
    one. ``max_buffer`` bounds the bytes of one item held for its ``done`` events.
    """

    def __init__(
        self,
        response_id: str,
        *,
        model: str = "essessey",
        starting_after: int | None = None,
        created_at: int | None = None,
        max_buffer: int = DEFAULT_MAX_BUFFER,
    ) -> None:
        if max_buffer <= 0:
            raise ValueError("max_buffer must be > 0")
        self.response_id = response_id
        self.model = model
        self.starting_after = -1 if starting_after is None else starting_after
        self.created_at = int(time.time()) if created_at is None else created_at
        self.max_buffer = max_buffer
        self.sequence_number = 0
        """The sequence number the next event gets."""
        self._started = False
        self._ended = False
        self._items: dict[int, _Item] = {}  # open blocks, by block index
        self._output: list[dict[str, Any]] = []  # done items, for the final response
        self._next_output = 0
        self._stop_reason: str | None = None
        self._input_tokens = 0
        self._output_tokens = 0
        self._final: dict[str, Any] = {}

    # -- FrameEncoder --------------------------------------------------------------------

    def encode(self, event: Event) -> bytes:
        """The events for ``event``, the last with its ``id:``."""
        if self._ended:
            return b""
        return encode_event(event, logger, self.encode_text, self._frames)

    def encode_text(self, index: int, text: str) -> bytes | None:
        """One ``response.output_text.delta`` of ``text`` for block ``index`` (nothing up
        to ``starting_after``); None when that is not an open text block."""
        item = None if self._ended else self._items.get(index)
        if item is None or (frame := item.text_frame) is None:
            return None
        size = item.size + len(text)
        if size <= self.max_buffer:
            # _hold's common case, inline: this runs once per token.
            item.size = size
            item.parts.append(text)
        else:
            self._hold(item, text)
        number = self.sequence_number
        self.sequence_number = number + 1
        if number <= self.starting_after:
            return b""
        return frame % (number, _dumps(text))

    def finish(self) -> bytes:
        """The response's end if no message ended it yet."""
        if self._ended:
            return b""
        frames = []
        if not self._started:
            frames += self._start({})
        frames += self._end()
        return b"".join(frames)

    def fail(self, error_type: str, message: str) -> bytes:
        """``error`` then ``response.failed``."""
        if self._ended:
            return b""
        frames = [] if self._started else self._start({})
        return b"".join(frames + self._failed(error_type, message))

    def response(self) -> dict[str, Any]:
        """The response as the events so far make it: ``completed`` (or how it ended)
        with every output item and the usage once the turn ended, ``in_progress``
        before. What a request without ``stream`` is answered with."""
        if not self._ended:
            return self._response("in_progress")
        return self._final

    # -- writing -------------------------------------------------------------------------

    def _emit(self, kind: str, body: dict[str, Any]) -> list[bytes]:
        number = self.sequence_number
        self.sequence_number += 1
        if number <= self.starting_after:
            return []
        data = orjson.dumps({"type": kind, "sequence_number": number, **body})
        return [b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"]

    def _response(self, status: str, **extra: Any) -> dict[str, Any]:
        usage = {
            "input_tokens": self._input_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": self._output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self._input_tokens + self._output_tokens,
        }
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.model,
            "output": list(self._output) if status != "in_progress" else [],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "error": None,
            "incomplete_details": None,
            "usage": usage if status != "in_progress" else None,
            **extra,
        }

    # -- the events ----------------------------------------------------------------------

    def _frames(self, name: str, payload: dict[str, Any]) -> list[bytes]:
        if name == EventType.MESSAGE_START:
            return self._start(payload.get("message") or {})
        if name == EventType.ERROR:
            error = payload.get("error") or {}
            frames = [] if self._started else self._start({})
            kind = str(error.get("type") or "api_error")
            return frames + self._failed(kind, str(error.get("message") or ""))
        if not self._started:
            logger.warning("skipped a %s event before the turn's first message", name)
            return []
        if name == EventType.CONTENT_BLOCK_START:
            return self._block_start(int(payload["index"]), payload["content_block"])
        if name == EventType.CONTENT_BLOCK_DELTA:
            return self._block_delta(int(payload["index"]), payload["delta"])
        if name == EventType.CONTENT_BLOCK_STOP:
            return self._block_stop(int(payload["index"]))
        if name == EventType.MESSAGE_DELTA:
            reason, output = message_delta_totals(payload)
            if reason is not None:
                self._stop_reason = reason
            self._output_tokens += output
            return []
        if name == EventType.MESSAGE_STOP:
            if self._stop_reason is not None and self._stop_reason != StopReason.TOOL_USE:
                return self._end()
            return []
        logger.warning("skipped an event of unknown type (%d characters)", len(name))
        return []

    def _start(self, message: dict[str, Any]) -> list[bytes]:
        self._items.clear()
        self._stop_reason = None
        self._input_tokens += input_tokens(message)
        if self._started:
            return []  # the next round of the same turn: one response
        self._started = True
        model = message.get("model")
        if isinstance(model, str) and model:
            self.model = model
        response = self._response("in_progress")
        return self._emit("response.created", {"response": response}) + self._emit(
            "response.in_progress", {"response": response}
        )

    def _open(self, kind: str, prefix: str, index: int, block: dict[str, Any]) -> _Item:
        output_index = self._next_output
        self._next_output += 1
        item = _Item(kind, f"{prefix}_{self.response_id}_{output_index}", output_index, block)
        self._items[index] = item
        return item

    def _block_start(self, index: int, block: dict[str, Any]) -> list[bytes]:
        kind = str(block.get("type"))
        if kind == BlockType.TEXT:
            item = self._open(kind, "msg", index, block)
            added: dict[str, Any] = {"id": item.id, "type": "message", "role": "assistant"}
            added.update(status="in_progress", content=[])
            part = {"type": "output_text", "text": "", "annotations": []}
            return self._emit(
                "response.output_item.added", {"output_index": item.output_index, "item": added}
            ) + self._emit("response.content_part.added", self._at(item, part=part))
        if kind in (BlockType.THINKING, "redacted_thinking"):
            item = self._open(kind, "rs", index, block)
            if kind == "redacted_thinking":
                item.signature = str(block.get("data", ""))
            reasoning = {"id": item.id, "type": "reasoning", "summary": []}
            return self._emit(
                "response.output_item.added",
                {"output_index": item.output_index, "item": reasoning},
            )
        if kind == BlockType.TOOL_USE:
            item = self._open(kind, "fc", index, block)
            call = self._call_item(item, "", "in_progress")
            return self._emit(
                "response.output_item.added", {"output_index": item.output_index, "item": call}
            )
        self._open(kind, "item", index, block)  # a tool result or another block: at its stop
        return []

    def _at(self, item: _Item, **body: Any) -> dict[str, Any]:
        return {"item_id": item.id, "output_index": item.output_index, "content_index": 0, **body}

    def _hold(self, item: _Item, text: str) -> bool:
        size = item.size = item.size + len(text)
        if size > self.max_buffer:
            if size - len(text) <= self.max_buffer:
                logger.warning(
                    "a %s block passed %d bytes; its done events hold what came before",
                    item.kind,
                    self.max_buffer,
                )
            return False
        item.parts.append(text)
        return True

    def _block_delta(self, index: int, delta: dict[str, Any]) -> list[bytes]:
        item = self._items.get(index)
        if item is None:
            logger.warning("skipped a delta for block %d, which is not open", index)
            return []
        kind = delta.get("type")
        if item.kind == BlockType.TEXT and kind == DeltaType.TEXT:
            text = str(delta["text"])
            self._hold(item, text)
            return self._emit("response.output_text.delta", self._at(item, delta=text, logprobs=[]))
        if item.kind == BlockType.THINKING and kind == DeltaType.THINKING:
            text = str(delta.get("thinking", delta.get("text")))  # the two dialects
            self._hold(item, text)
            return self._emit("response.reasoning_text.delta", self._at(item, delta=text))
        if item.kind == BlockType.THINKING and kind == DeltaType.SIGNATURE:
            item.signature = (item.signature or "") + str(delta["signature"])
            return []
        if item.kind == BlockType.TOOL_USE and kind == DeltaType.INPUT_JSON:
            fragment = str(delta["partial_json"])
            self._hold(item, fragment)
            body = {"item_id": item.id, "output_index": item.output_index, "delta": fragment}
            return self._emit("response.function_call_arguments.delta", body)
        if item.kind == BlockType.TOOL_RESULT and kind == DeltaType.TOOL_RESULT:
            self._hold(item, str(delta["text"]))
            return []
        if len(orjson.dumps(delta)) + item.size <= self.max_buffer:
            item.deltas.append(delta)
        return []

    def _call_item(self, item: _Item, arguments: str, status: str) -> dict[str, Any]:
        return {
            "id": item.id,
            "type": "function_call",
            "call_id": str(item.block["id"]),
            "name": str(item.block["name"]),
            "arguments": arguments,
            "status": status,
        }

    def _done(self, item: _Item, body: dict[str, Any]) -> list[bytes]:
        self._output.append(body)
        return self._emit(
            "response.output_item.done", {"output_index": item.output_index, "item": body}
        )

    def _block_stop(self, index: int) -> list[bytes]:
        item = self._items.pop(index, None)
        if item is None:
            logger.warning("skipped the stop of block %d, which is not open", index)
            return []
        whole = "".join(item.parts)
        if item.kind == BlockType.TEXT:
            part = {"type": "output_text", "text": whole, "annotations": []}
            message: dict[str, Any] = {"id": item.id, "type": "message", "role": "assistant"}
            message.update(status="completed", content=[part])
            return (
                self._emit("response.output_text.done", self._at(item, text=whole, logprobs=[]))
                + self._emit("response.content_part.done", self._at(item, part=part))
                + self._done(item, message)
            )
        if item.kind in (BlockType.THINKING, "redacted_thinking"):
            reasoning: dict[str, Any] = {"id": item.id, "type": "reasoning", "summary": []}
            reasoning["content"] = [{"type": "reasoning_text", "text": whole}]
            if item.signature is not None:
                reasoning["encrypted_content"] = item.signature
            frames = []
            if item.kind == BlockType.THINKING:
                frames = self._emit("response.reasoning_text.done", self._at(item, text=whole))
            return frames + self._done(item, reasoning)
        if item.kind == BlockType.TOOL_USE:
            call = self._call_item(item, whole, "completed")
            body = {"item_id": item.id, "output_index": item.output_index, "arguments": whole}
            body["name"] = call["name"]
            return self._emit("response.function_call_arguments.done", body) + self._done(
                item, call
            )
        if item.kind == BlockType.TOOL_RESULT:
            output: dict[str, Any] = {
                "id": item.id,
                "type": "function_call_output",
                "call_id": str(item.block["tool_use_id"]),
                "output": whole,
                "status": "completed",
            }
            if item.block.get("is_error"):
                output["is_error"] = True  # Responses has no field for it: kept as sent
            return self._emit(
                "response.output_item.added", {"output_index": item.output_index, "item": output}
            ) + self._done(item, output)
        other: dict[str, Any] = {"id": item.id, "type": "essessey_block", "block": item.block}
        other["deltas"] = item.deltas
        return self._done(item, other)

    def _end(self) -> list[bytes]:
        self._ended = True
        reason = self._stop_reason
        if reason == StopReason.MAX_TOKENS:
            details = {"reason": "max_output_tokens"}
            self._final = self._response("incomplete", incomplete_details=details)
            return self._emit("response.incomplete", {"response": self._final})
        if reason == StopReason.CANCELLED:
            self._final = self._response("cancelled")
            return self._emit("response.incomplete", {"response": self._final})
        self._final = self._response("completed")
        return self._emit("response.completed", {"response": self._final})

    def _failed(self, error_type: str, message: str) -> list[bytes]:
        self._ended = True
        error = {"code": error_type, "message": message, "param": None}
        failure = {"code": "server_error", "message": message}
        self._final = self._response("failed", error=failure)
        return self._emit("error", error) + self._emit("response.failed", {"response": self._final})


# -- serving it ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResponsesRequest:
    """A validated Responses request: the response's ``id`` (``resp_...``, the hub
    stream its turn runs on), its ``model``, ``input`` (a string or a list of
    input items, as sent), whether it asks for a ``stream`` and to run in the
    ``background``, and the whole JSON ``body`` (``tools``, ``instructions``, the app's
    own options)."""

    id: str
    model: str
    input: str | list[Any]
    stream: bool = False
    background: bool = False
    body: dict[str, Any] = field(default_factory=dict)


ResponsesTurnFactory = Callable[[ResponsesRequest], "TurnProducer | Awaitable[TurnProducer]"]
"""``turn(request) -> producer``: the answer to a request, as a hub producer; a
``ValueError`` it raises is the client's 400."""

DEFAULT_MAX_BODY: Final = 4 * 1024 * 1024


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ValueError(f"{name}: must be a boolean")
    return value


def parse_responses_request(body: Any, response_id: str) -> ResponsesRequest:
    """A :class:`ResponsesRequest` for ``response_id`` from a parsed JSON body;
    ``ValueError`` naming the first problem."""
    if not isinstance(body, dict):
        raise ValueError("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ValueError("model: a non-empty string is required")
    given = body.get("input")
    if not isinstance(given, (str, list)) or not given:
        raise ValueError("input: a non-empty string or list of items is required")
    stream, background = _flag(body, "stream"), _flag(body, "background")
    return ResponsesRequest(response_id, model, given, stream, background, body)


def _sequence_number(value: str | None) -> int | None:
    if value is None:
        return None
    if not value.isdigit() or len(value) > 18:
        raise ValueError("starting_after: must be a sequence number (a whole number >= 0)")
    return int(value)


def responses_routes(
    hub: StreamHub,
    turn: ResponsesTurnFactory,
    *,
    path: str = "/v1/responses",
    max_body: int = DEFAULT_MAX_BODY,
    **options: Unpack[SSEOptions],
) -> Sequence[BaseRoute]:
    """Starlette routes serving Responses from ``hub`` at ``path``:

    - ``POST {path}``: the request's turn (``turn(request)``) runs on the hub under the
      response's id (``resp_...``); with ``"stream": true`` its events stream, else the
      answer is the whole response once the turn ended (with ``"background": true``, at
      once, ``in_progress``: poll or stream it with the GET).
    - ``GET {path}/{response_id}``: the response as it stands; with ``?stream=true`` its
      events, after ``starting_after`` (a sequence number) or the ``Last-Event-ID``, on
      any replica, as OpenAI serves a background response.

    Every response is resumable, background or not. Errors are OpenAI's error objects.
    ``options`` go to the SSE response (:class:`~essessey.bindings.sse.SSEOptions`)."""
    if max_body <= 0:
        raise ValueError("max_body must be > 0")
    headers = dict(options.get("headers") or {})

    def refuse(status: int, error_type: str, message: str) -> Response:
        return json_error(status, error_type, message, headers, shape=error_object)

    async def whole(response_id: str, model: str) -> Response:
        events, _ = await hub.store.since(response_id, None)
        encoder = ResponsesEncoder(response_id, model=model)
        for event in events:
            encoder.encode(event)
        return Response(
            orjson.dumps(encoder.response()), headers=headers, media_type="application/json"
        )

    async def create(request: Request) -> Response:
        response_id = f"resp_{secrets.token_hex(12)}"
        parsed = await read_request(
            request,
            lambda body: parse_responses_request(body, response_id),
            limit=max_body,
            shape=error_object,
            headers=headers,
        )
        if isinstance(parsed, Response):
            return parsed
        refused = await start_turn(
            hub, request, response_id, turn, parsed, shape=error_object, headers=headers, log=logger
        )
        if refused is not None:
            return refused
        if parsed.stream:
            encoder = ResponsesEncoder(response_id, model=parsed.model)
            return stream_response(
                hub, response_id, None, encoder=encoder, error_shape=error_object, **options
            )
        if not parsed.background:
            await hub.wait(response_id)
        return await whole(response_id, parsed.model)

    async def retrieve(request: Request) -> Response:
        response_id = request.path_params["response_id"]
        try:
            starting_after = _sequence_number(request.query_params.get("starting_after"))
        except ValueError as exc:
            return refuse(400, "invalid_request_error", str(exc))
        if request.query_params.get("stream") != "true":
            verdict = await admit(hub, request, response_id, None, logger)
            if isinstance(verdict, Refusal):
                return refuse(verdict.status, verdict.error_type, verdict.message)
            if not await hub.store.exists(response_id):
                return refuse(404, "not_found_error", f"no response {response_id!r}")
            return await whole(response_id, "essessey")
        encoder = ResponsesEncoder(response_id, starting_after=starting_after)
        return await subscription_response(
            hub, request, response_id, encoder=encoder, shape=error_object, **options
        )

    return [
        Route(path, create, methods=["POST"]),
        Route(path + "/{response_id}", retrieve, methods=["GET"]),
    ]
