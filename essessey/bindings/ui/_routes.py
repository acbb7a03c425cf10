"""``useChat``'s default transport served from a :class:`~essessey.StreamHub` (docs/ui.md).

- ``POST {path}``: the AI SDK's chat request (``id``, ``messages``, ``trigger``, ...). The
  app's ``turn(chat)`` gives the producer of the answer; it runs on the hub, under a
  stream id of its own (``<chat id>~<random>``), and the response streams it as UI message
  chunks. A dropped connection never stops it.
- ``GET {path}/{chat_id}/stream``: the AI SDK's reconnect. The chat's last turn, running
  or finished, replayed from its start and then followed live (the SDK replaces the
  message it has with the replay, which names the same message id); 204 when the chat has
  no turn the store still holds.
- ``POST {path}/{chat_id}/stop``: cancels the chat's running turn (the SDK's ``stop()``
  only drops the connection, which a resumable stream outlives); 204, or 404 when
  nothing runs.

Which turn a chat is on is one small event per turn in the stream ``<chat id>~turns``, so
any replica with the same store finds it. Bad requests get a 400 JSON error, refusals of
``authorize`` (asked with the chat id: ``read`` to start a turn, ``resume`` to
reconnect, ``cancel`` to stop) a 403, a chat whose turn is already running a 409.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from essessey._ids import MAX_ID_LENGTH, is_stream_id
from essessey.bindings._asgi import CHECK_FAILED, check_access
from essessey.bindings.sse._writer import error_body
from essessey.bindings.ui._encoder import UIMessageEncoder, frame
from essessey.errors import EssesseyError, StreamBusy
from essessey.event import Event
from essessey.hub import Access, StreamHub, TurnProducer

__all__ = [
    "UI_MESSAGE_STREAM_HEADERS",
    "ChatRequest",
    "TurnFactory",
    "parse_chat_request",
    "ui_chat_routes",
]

logger = logging.getLogger("essessey.bindings.ui")

UI_MESSAGE_STREAM_HEADERS: Final = {
    "cache-control": "no-cache",
    "connection": "keep-alive",
    "x-vercel-ai-ui-message-stream": "v1",
    "x-accel-buffering": "no",
}
"""The headers of a UI message stream response (besides its ``text/event-stream`` type)."""

TRIGGERS: Final = frozenset({"submit-message", "regenerate-message"})
DEFAULT_MAX_BODY: Final = 4 * 1024 * 1024
_TURNS: Final = "~turns"
_TURN_EVENT: Final = "turn"
_MAX_CHAT_ID: Final = MAX_ID_LENGTH - len(_TURNS)


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A validated chat request of the AI SDK: the chat's ``id``, its ``messages`` (UI
    messages as sent), the ``trigger``, the ``message_id`` to regenerate (if any), and the
    whole JSON ``body`` (where an app's own options travel)."""

    id: str
    messages: list[dict[str, Any]]
    trigger: str
    message_id: str | None = None
    body: dict[str, Any] = field(default_factory=dict)


TurnFactory = Callable[[ChatRequest], "TurnProducer | Awaitable[TurnProducer]"]
"""``turn(chat) -> producer``: the answer to a chat request, as a hub producer; a
``ValueError`` it raises (options of the app's own that are wrong) is the client's 400."""


class _BadRequest(Exception):
    pass


def _json_error(status: int, error_type: str, message: str) -> Response:
    return Response(error_body(error_type, message), status, media_type="application/json")


def _is_chat_id(value: object) -> bool:
    """A chat id leaves room for the suffixes of its streams (``~turns``, ``~<random>``)."""
    return isinstance(value, str) and len(value) <= _MAX_CHAT_ID and is_stream_id(value)


def parse_chat_request(raw: bytes) -> ChatRequest:
    """A :class:`ChatRequest` from a request body; ``ValueError`` saying what is wrong."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise ValueError("the body is not JSON") from None
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    chat_id = body.get("id")
    if not _is_chat_id(chat_id):
        raise ValueError(
            f"id must be 1 to {_MAX_CHAT_ID} printable characters without whitespace, "
            "'.', '*' or '>'"
        )
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and m.get("role") in ("user", "assistant", "system") for m in messages
    ):
        raise ValueError("messages must be a list of UI messages, each with a role")
    trigger = body.get("trigger", "submit-message")
    if trigger not in TRIGGERS:
        raise ValueError("trigger must be 'submit-message' or 'regenerate-message'")
    message_id = body.get("messageId")
    if message_id is not None and not isinstance(message_id, str):
        raise ValueError("messageId must be a string")
    return ChatRequest(str(chat_id), messages, trigger, message_id, body)


async def _read_body(request: Request, limit: int) -> bytes:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise _BadRequest(f"the body is larger than {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _BadRequest(f"the body is larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def _ui_stream(hub: StreamHub, turn_id: str) -> AsyncIterator[bytes]:
    encoder = UIMessageEncoder(message_id=turn_id)
    events = hub.subscribe(turn_id)
    try:
        async for event in events:
            lines = encoder.feed(event)
            if lines:
                yield b"".join(lines)
            if encoder.ended:
                break
    except EssesseyError as exc:  # lagged, reset: the client may reconnect
        logger.info("a UI stream of %s ended early (%s)", turn_id, type(exc).__name__)
        yield frame({"type": "error", "errorText": "the stream was interrupted; reconnect"})
        return
    finally:
        await events.aclose()
    yield encoder.close()


def _streaming(hub: StreamHub, turn_id: str) -> Response:
    return StreamingResponse(
        _ui_stream(hub, turn_id), media_type="text/event-stream", headers=UI_MESSAGE_STREAM_HEADERS
    )


async def _last_turn(hub: StreamHub, chat_id: str) -> str | None:
    events, known = await hub.store.since(chat_id + _TURNS, None)
    if not known or not events:
        return None
    turn_id = events[-1].data.decode()
    return turn_id if await hub.store.exists(turn_id) else None


def ui_chat_routes(
    hub: StreamHub,
    turn: TurnFactory,
    *,
    path: str = "/api/chat",
    max_body: int = DEFAULT_MAX_BODY,
) -> Sequence[BaseRoute]:
    """Starlette routes for ``useChat``'s default transport at ``path`` (see the module
    docstring): ``POST {path}``, ``GET {path}/{chat_id}/stream``, ``POST
    {path}/{chat_id}/stop``. ``max_body`` bounds a chat request's bytes."""
    if max_body <= 0:
        raise ValueError("max_body must be > 0")

    async def allowed(request: Request, chat_id: str, access: Access) -> Response | None:
        verdict = await check_access(hub, request, chat_id, access, logger)
        if verdict is None:
            return _json_error(503, "api_error", CHECK_FAILED)
        if not verdict:
            return _json_error(403, "permission_error", "not allowed")
        return None

    async def chat(request: Request) -> Response:
        try:
            chat_request = parse_chat_request(await _read_body(request, max_body))
        except (ValueError, _BadRequest) as exc:
            return _json_error(400, "invalid_request_error", str(exc))
        except ClientDisconnect:
            return Response(status_code=400)
        refused = await allowed(request, chat_request.id, "read")
        if refused is not None:
            return refused
        try:
            made = turn(chat_request)
            producer = made if callable(made) else await made
        except ValueError as exc:  # the app's own options, refused
            return _json_error(400, "invalid_request_error", str(exc))
        turn_id = f"{chat_request.id}~{secrets.token_hex(8)}"
        try:
            await hub.start(turn_id, producer)
        except StreamBusy:
            return _json_error(409, "invalid_request_error", "a turn is running on this chat")
        await hub.store.append(chat_request.id + _TURNS, Event(_TURN_EVENT, turn_id.encode()))
        return _streaming(hub, turn_id)

    async def chat_in_path(request: Request, access: Access) -> tuple[str, Response | None]:
        """The path's chat id, and the answer when it is bad or not allowed."""
        chat_id = request.path_params["chat_id"]
        if not _is_chat_id(chat_id):
            return chat_id, _json_error(400, "invalid_request_error", "bad chat id")
        return chat_id, await allowed(request, chat_id, access)

    async def reconnect(request: Request) -> Response:
        chat_id, refused = await chat_in_path(request, "resume")
        if refused is not None:
            return refused
        turn_id = await _last_turn(hub, chat_id)
        if turn_id is None:
            return Response(status_code=204)
        return _streaming(hub, turn_id)

    async def stop(request: Request) -> Response:
        chat_id, refused = await chat_in_path(request, "cancel")
        if refused is not None:
            return refused
        turn_id = await _last_turn(hub, chat_id)
        if turn_id is None or not await hub.cancel(turn_id):
            return _json_error(404, "not_found_error", "no turn is running on this chat")
        return Response(status_code=204)

    return [
        Route(path, chat, methods=["POST"]),
        Route(path + "/{chat_id}/stream", reconnect, methods=["GET"]),
        Route(path + "/{chat_id}/stop", stop, methods=["POST"]),
    ]
