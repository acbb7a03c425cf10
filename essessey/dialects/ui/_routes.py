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
- ``{path}/ws``: the same requests as frames of the AI SDK's ``WebSocketChatTransport``,
  many over one connection (``essessey.dialects.ui._websocket``).

What each request does, whichever transport carries it, is written once, in
``essessey.dialects.ui._chats``.

Which turn a chat is on is one small event per turn in the stream ``<chat id>~turns``,
and one more when it finishes, so any replica with the same store finds it. A UI stream
is delivered as every stream is (the SSE response's pings, shutdown hand-off, stalled
client timeout and bounds), each frame group with its event's ``id:``.

A turn that asks (docs/asking.md) ends waiting; the reconnect replays it while it waits
(the client shows its requests again). The chat request whose last message, the asking
assistant message, carries the client's answers (tool parts in state
``approval-responded``, or ``output-available`` / ``output-error`` for a client call or an
``ask_user`` question, as ``addToolApprovalResponse`` and ``addToolOutput`` leave them)
answers the chat's waiting turn (:meth:`~essessey.StreamHub.answer`, the hub's
``on_answer`` continuing it) and streams the continuation as the rest of the same UI
message; a request that answers nothing starts a turn as any other.

Bad requests get a 400 JSON error, refusals of ``authorize`` (asked with the chat id:
``read`` to start a turn, ``resume`` to reconnect, ``cancel`` to stop, and ``answer``
too for a request that answers) a 403, a chat whose turn is already running a 409; a
refused answer its :class:`~essessey.AnswerRefused` status (400 or 409, with its
``code``), an answer to a turn no longer kept a 404.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final, Unpack

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from essessey.bindings.http import BadRequest, json_error, read_json, store_guarded
from essessey.bindings.sse import SSEOptions, error_body, requested_resume_point, stream_response
from essessey.dialects._routes import other_methods
from essessey.dialects.ui._chats import (
    Chats,
    Failure,
    Plan,
    TurnFactory,
    chat_request,
)
from essessey.dialects.ui._websocket import DEFAULT_SEND_TIMEOUT, ui_chat_websocket_route
from essessey.hub import StreamHub

__all__ = ["UI_MESSAGE_STREAM_HEADERS", "ui_chat_routes"]

UI_MESSAGE_STREAM_HEADERS: Final = {
    "cache-control": "no-cache",
    "connection": "keep-alive",
    "x-vercel-ai-ui-message-stream": "v1",
    "x-accel-buffering": "no",
}
"""The headers of a UI message stream response (besides its ``text/event-stream`` type)."""

DEFAULT_MAX_BODY: Final = 4 * 1024 * 1024


def _failed(failure: Failure, headers: Mapping[str, str] | None) -> Response:
    """A failure in the routes' error shape (a refused answer's with its ``code``)."""
    if failure.code is None:
        return json_error(failure.status, failure.error_type, failure.message, headers)
    error = {"type": failure.error_type, "message": failure.message, "code": failure.code}
    body = orjson.dumps({"type": "error", "error": error})
    return json_error(
        failure.status, failure.error_type, failure.message, headers, shape=lambda _t, _m: body
    )


def _streaming(hub: StreamHub, plan: Plan, options: SSEOptions) -> Response:
    delivery: SSEOptions = {**options}
    delivery["headers"] = {**UI_MESSAGE_STREAM_HEADERS, **(options.get("headers") or {})}
    return stream_response(hub, plan.turn_id, plan.resume_point, encoder=plan.encoder(), **delivery)


def ui_chat_routes(
    hub: StreamHub,
    turn: TurnFactory,
    *,
    path: str = "/api/chat",
    max_body: int = DEFAULT_MAX_BODY,
    replay_finished: bool = False,
    websocket: bool = True,
    **options: Unpack[SSEOptions],
) -> Sequence[BaseRoute]:
    """Starlette routes for ``useChat``'s default transport at ``path`` (see the module
    docstring): ``POST {path}``, ``GET {path}/{chat_id}/stream``, ``POST
    {path}/{chat_id}/stop``, and (``websocket``) the WebSocket transport's endpoint at
    ``{path}/ws``. ``max_body`` bounds a chat request's bytes; ``replay_finished``
    makes the reconnect replay a finished turn instead of a 204; ``options`` go to the
    SSE response (:class:`~essessey.bindings.sse.SSEOptions`)."""
    if max_body <= 0:
        raise ValueError("max_body must be > 0")
    headers = options.get("headers")
    chats = Chats(hub, turn, replay_finished=replay_finished)

    def answer(outcome: Plan | Failure) -> Response:
        if isinstance(outcome, Failure):
            return _failed(outcome, headers)
        return _streaming(hub, outcome, options)

    async def chat(request: Request) -> Response:
        try:
            body = await read_json(request, limit=max_body)
        except BadRequest as exc:
            return exc.answer(headers)
        try:
            sent = chat_request(body, dict(request.headers))
        except ValueError as exc:
            return json_error(400, "invalid_request_error", str(exc), headers)
        return answer(await chats.send(request, sent))

    async def reconnect(request: Request) -> Response:
        chat_id = request.path_params["chat_id"]
        outcome = await chats.reconnect(request, chat_id, requested_resume_point(request))
        if outcome is None:
            return Response(status_code=204, headers=headers)
        return answer(outcome)

    async def stop(request: Request) -> Response:
        failure = await chats.stop(request, request.path_params["chat_id"])
        if failure is not None:
            return _failed(failure, headers)
        return Response(status_code=204, headers=headers)

    routes: list[BaseRoute] = [
        Route(path, store_guarded(chat, headers), methods=["POST"]),
        other_methods(path, ["POST"], headers, error_body),
        Route(path + "/{chat_id}/stream", store_guarded(reconnect, headers), methods=["GET"]),
        other_methods(path + "/{chat_id}/stream", ["GET"], headers, error_body),
        Route(path + "/{chat_id}/stop", store_guarded(stop, headers), methods=["POST"]),
        other_methods(path + "/{chat_id}/stop", ["POST"], headers, error_body),
    ]
    if websocket:
        # A frame's send is bounded as an SSE response's is (None: the endpoint's own).
        timeout = options.get("send_timeout") or DEFAULT_SEND_TIMEOUT
        endpoint = ui_chat_websocket_route(
            chats, path=path + "/ws", max_body=max_body, send_timeout=timeout
        )
        routes.append(endpoint)
    return routes
