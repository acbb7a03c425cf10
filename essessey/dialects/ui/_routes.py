"""``useChat``'s default transport served from a :class:`~essessey.StreamHub` (docs/ui.md).

- ``POST {path}``: the AI SDK's chat request (``id``, ``messages``, ``trigger``, ...). The
  app's ``turn(chat)`` gives the producer of the answer; it runs on the hub, under a
  stream id of its own (``<chat id>~<random>``), and the response streams it as UI message
  chunks. A dropped connection never stops it.
- ``GET {path}/{chat_id}/stream``: the AI SDK's reconnect. The chat's running turn,
  replayed from its start and then followed live (the SDK replaces the message it has
  with the replay, which names the same message id), or from after its ``Last-Event-ID``
  when the client sends one; 204 when the chat has no running turn, as the AI SDK's
  resume contract expects (its own server forgets the active stream when it finishes,
  and an app that saved the finished message would otherwise show it twice).
  ``replay_finished=True`` replays a finished turn too, for an app that keeps no
  messages.
- ``POST {path}/{chat_id}/stop``: cancels the chat's running turn (the SDK's ``stop()``
  only drops the connection, which a resumable stream outlives); 204, or 404 when
  nothing runs.

Which turn a chat is on is one small event per turn in the stream ``<chat id>~turns``,
and one more when it finishes, so any replica with the same store finds it. A UI stream
is delivered as every stream is (the SSE response's pings, shutdown hand-off, stalled
client timeout and bounds), each frame group with its event's ``id:``.

Bad requests get a 400 JSON error, refusals of ``authorize`` (asked with the chat id:
``read`` to start a turn, ``resume`` to reconnect, ``cancel`` to stop) a 403, a chat
whose turn is already running a 409.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Unpack

import anyio
import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from essessey._ids import MAX_ID_LENGTH, is_stream_id
from essessey.bindings.admission import Refusal, admit
from essessey.bindings.http import BadRequest, json_error, read_body
from essessey.bindings.sse import SSEOptions, requested_resume_point, stream_response
from essessey.dialects.ui._encoder import UIMessageEncoder
from essessey.errors import StreamBusy
from essessey.event import Event
from essessey.hub import Access, StreamHub, TurnProducer
from essessey.publisher import Publisher

__all__ = [
    "UI_MESSAGE_STREAM_HEADERS",
    "ChatRequest",
    "TurnFactory",
    "parse_chat_request",
    "ui_chat_routes",
]

logger = logging.getLogger("essessey.dialects.ui")

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
_FINISHED_EVENT: Final = "finished"
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


def _streaming(
    hub: StreamHub, turn_id: str, last_event_id: str | None, options: SSEOptions
) -> Response:
    delivery: SSEOptions = {**options}
    delivery["headers"] = {**UI_MESSAGE_STREAM_HEADERS, **(options.get("headers") or {})}
    encoder = UIMessageEncoder(message_id=turn_id)
    return stream_response(hub, turn_id, last_event_id, encoder=encoder, **delivery)


def _announced(hub: StreamHub, chat_id: str, turn_id: str, producer: TurnProducer) -> TurnProducer:
    """``producer``, then a mark in the chat's turns that its turn finished (on the
    replica it ran on, whichever serves the reconnect)."""

    async def run(publisher: Publisher) -> None:
        try:
            await producer(publisher)
        finally:
            # Shielded: a cancelled turn is finished too, and its mark must be written.
            with anyio.CancelScope(shield=True):
                finished = Event(_FINISHED_EVENT, turn_id.encode())
                await hub.store.append(chat_id + _TURNS, finished)

    return run


async def _last_turn(hub: StreamHub, chat_id: str) -> tuple[str, bool] | None:
    """The chat's last turn the store holds, and whether it finished."""
    events, known = await hub.store.since(chat_id + _TURNS, None)
    if not known or not events:
        return None
    last = events[-1]
    turn_id = last.data.decode()
    if not await hub.store.exists(turn_id):
        return None
    return turn_id, last.event == _FINISHED_EVENT


def ui_chat_routes(
    hub: StreamHub,
    turn: TurnFactory,
    *,
    path: str = "/api/chat",
    max_body: int = DEFAULT_MAX_BODY,
    replay_finished: bool = False,
    **options: Unpack[SSEOptions],
) -> Sequence[BaseRoute]:
    """Starlette routes for ``useChat``'s default transport at ``path`` (see the module
    docstring): ``POST {path}``, ``GET {path}/{chat_id}/stream``, ``POST
    {path}/{chat_id}/stop``. ``max_body`` bounds a chat request's bytes;
    ``replay_finished`` makes the reconnect replay a finished turn instead of a 204;
    ``options`` go to the SSE response (:class:`~essessey.bindings.sse.SSEOptions`)."""
    if max_body <= 0:
        raise ValueError("max_body must be > 0")
    headers = options.get("headers")

    async def admitted(
        request: Request, chat_id: str, access: Access, last_event_id: str | None = None
    ) -> Response | str | None:
        """The refusal's answer, or the resume point allowed."""
        verdict = await admit(hub, request, chat_id, last_event_id, logger, access=access)
        if isinstance(verdict, Refusal):
            return json_error(verdict.status, verdict.error_type, verdict.message, headers)
        return verdict.last_event_id

    async def chat(request: Request) -> Response:
        try:
            chat_request = parse_chat_request(await read_body(request, max_body))
        except BadRequest as exc:
            return exc.answer(headers)
        except ValueError as exc:
            return json_error(400, "invalid_request_error", str(exc), headers)
        refused = await admitted(request, chat_request.id, "read")
        if isinstance(refused, Response):
            return refused
        try:
            made = turn(chat_request)
            producer = made if callable(made) else await made
        except ValueError as exc:  # the app's own options, refused
            return json_error(400, "invalid_request_error", str(exc), headers)
        turn_id = f"{chat_request.id}~{secrets.token_hex(8)}"
        try:
            await hub.start(turn_id, _announced(hub, chat_request.id, turn_id, producer))
        except StreamBusy:
            message = "a turn is running on this chat"
            return json_error(409, "invalid_request_error", message, headers)
        await hub.store.append(chat_request.id + _TURNS, Event(_TURN_EVENT, turn_id.encode()))
        return _streaming(hub, turn_id, None, options)

    async def chat_in_path(
        request: Request, access: Access, last_event_id: str | None = None
    ) -> tuple[str, Response | str | None]:
        """The path's chat id, and the answer when it is bad or not allowed (else the
        resume point allowed)."""
        chat_id = request.path_params["chat_id"]
        if not _is_chat_id(chat_id):
            return chat_id, json_error(400, "invalid_request_error", "bad chat id", headers)
        return chat_id, await admitted(request, chat_id, access, last_event_id)

    async def reconnect(request: Request) -> Response:
        given = requested_resume_point(request)
        chat_id, verdict = await chat_in_path(request, "resume", given)
        if isinstance(verdict, Response):
            return verdict
        last = await _last_turn(hub, chat_id)
        if last is None or (last[1] and not replay_finished):
            return Response(status_code=204, headers=headers)
        return _streaming(hub, last[0], verdict, options)

    async def stop(request: Request) -> Response:
        chat_id, verdict = await chat_in_path(request, "cancel")
        if isinstance(verdict, Response):
            return verdict
        last = await _last_turn(hub, chat_id)
        if last is None or not await hub.cancel(last[0]):
            return json_error(404, "not_found_error", "no turn is running on this chat", headers)
        return Response(status_code=204, headers=headers)

    return [
        Route(path, chat, methods=["POST"]),
        Route(path + "/{chat_id}/stream", reconnect, methods=["GET"]),
        Route(path + "/{chat_id}/stop", stop, methods=["POST"]),
    ]
