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

import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
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
from essessey.errors import AnswerRefused, InvalidAnswer, StreamBusy, StreamNotFound
from essessey.event import Event
from essessey.hub import Access, Continuation, StreamHub, TurnProducer
from essessey.protocol.asking import (
    Answer,
    Answered,
    ApprovalRequest,
    ClientToolCall,
    Question,
    QuestionAnswer,
    ToolApproval,
    ToolOutput,
    Waiting,
)
from essessey.publisher import Publisher

__all__ = [
    "UI_MESSAGE_STREAM_HEADERS",
    "ChatRequest",
    "TurnFactory",
    "parse_chat_request",
    "ui_answers",
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
    if not isinstance(trigger, str) or trigger not in TRIGGERS:
        raise ValueError("trigger must be 'submit-message' or 'regenerate-message'")
    message_id = body.get("messageId")
    if message_id is not None and not isinstance(message_id, str):
        raise ValueError("messageId must be a string")
    return ChatRequest(str(chat_id), messages, trigger, message_id, body)


_ANSWERED_STATES: Final = frozenset({"output-available", "output-error"})
_APPROVED_STATES: Final = frozenset(
    {"approval-responded", "output-available", "output-error", "output-denied"}
)


def _tool_parts(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool parts of a UI message (``tool-<name>``, ``dynamic-tool``)."""
    parts = message.get("parts")
    if not isinstance(parts, list):
        return []
    return [
        part
        for part in parts
        if isinstance(part, dict)
        and isinstance(kind := part.get("type"), str)
        and (kind.startswith("tool-") or kind == "dynamic-tool")
    ]


def _approval(part: dict[str, Any], asked: Waiting) -> ToolApproval | None:
    """The answer a part's ``approval`` gives to one of ``asked``'s approval requests."""
    approval = part.get("approval")
    state = part.get("state")
    if not isinstance(approval, dict) or not isinstance(state, str):
        return None
    if state not in _APPROVED_STATES:
        return None
    key = approval.get("id")
    approved = approval.get("approved")
    if not isinstance(key, str) or not isinstance(approved, bool):
        return None
    if not isinstance(asked.request(key), ApprovalRequest):
        return None
    reason = approval.get("reason")
    return ToolApproval(key, approved, reason if isinstance(reason, str) else None)


def ui_answers(message: dict[str, Any], asked: Waiting) -> list[Answer]:
    """The answers a UI message (the asking assistant message, as the client sends it
    back) gives to what ``asked`` asks: an approval's ``approval`` (``approved``,
    ``reason``) once responded; a client call's output (``output-error``: its
    ``errorText``, an error); a question's (``ask_user``) output, as it is. Parts that
    answer nothing asked are left out. :class:`~essessey.InvalidAnswer` for a question
    answered with an error."""
    found: list[Answer] = []
    for part in _tool_parts(message):
        approval = _approval(part, asked)
        if approval is not None:
            found.append(approval)
            continue
        key = part.get("toolCallId")
        state = part.get("state")
        if not isinstance(key, str) or not isinstance(state, str) or state not in _ANSWERED_STATES:
            continue
        request = asked.request(key)
        failed = state == "output-error"
        if isinstance(request, ClientToolCall):
            if failed:
                error = part.get("errorText")
                found.append(ToolOutput(key, error if isinstance(error, str) else "", True))
            else:
                found.append(ToolOutput(key, part.get("output")))
        elif isinstance(request, Question):
            if failed:
                raise InvalidAnswer(f"question {key!r} is answered with an error, not a value")
            found.append(QuestionAnswer(key, part.get("output")))
    return found


def _streaming(
    hub: StreamHub,
    turn_id: str,
    last_event_id: str | None,
    options: SSEOptions,
    *,
    after: str | None = None,
    asked: Waiting | None = None,
) -> Response:
    delivery: SSEOptions = {**options}
    delivery["headers"] = {**UI_MESSAGE_STREAM_HEADERS, **(options.get("headers") or {})}
    calls = {}
    if asked is not None:
        calls = {r.id: r.tool_use_id for r in asked.requests if isinstance(r, ApprovalRequest)}
    encoder = UIMessageEncoder(message_id=turn_id, after=after, approval_calls=calls)
    resume_point = after if after is not None else last_event_id
    return stream_response(hub, turn_id, resume_point, encoder=encoder, **delivery)


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


def _announced_continuation(
    hub: StreamHub, chat_id: str, turn_id: str, go_on: Continuation
) -> Continuation:
    """``go_on``, between the marks that the chat's turn runs again and that it finished
    (a reconnect on any replica finds the continuation running)."""

    async def run(publisher: Publisher, answered: Answered) -> None:
        await hub.store.append(chat_id + _TURNS, Event(_TURN_EVENT, turn_id.encode()))
        try:
            await go_on(publisher, answered)
        finally:
            with anyio.CancelScope(shield=True):
                finished = Event(_FINISHED_EVENT, turn_id.encode())
                await hub.store.append(chat_id + _TURNS, finished)

    return run


async def _waits(hub: StreamHub, turn_id: str) -> Waiting | None:
    """What the finished turn ``turn_id`` waits for, while no answer continued it."""
    try:
        asked = await hub.waiting(turn_id)
    except StreamNotFound:
        return None
    return asked if asked is not None and not asked.continued else None


def _refusal(exc: AnswerRefused, headers: Mapping[str, str] | None) -> Response:
    """A refused answer in the routes' error shape, with the refusal's ``code``."""
    kind = "invalid_request_error"
    body = orjson.dumps(
        {"type": "error", "error": {"type": kind, "message": str(exc), "code": exc.code}}
    )
    return json_error(exc.status, kind, str(exc), headers, shape=lambda _t, _m: body)


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

    async def answer(request: Request, chat_request: ChatRequest) -> Response | None:
        """The continuation of the chat's waiting turn that the request's last message
        answers (see the module docstring); None for a request that answers nothing."""
        go_on = hub.on_answer
        messages = chat_request.messages
        if go_on is None or chat_request.trigger != "submit-message" or not messages:
            return None
        last_message = messages[-1]
        if last_message.get("role") != "assistant" or not _tool_parts(last_message):
            return None
        last = await _last_turn(hub, chat_request.id)
        if last is None:
            return None
        turn_id = last[0]
        try:
            asked = await hub.waiting(turn_id)
            answers = ui_answers(last_message, asked) if asked is not None else []
            if not answers or asked is None:
                return None
            refused = await admitted(request, chat_request.id, "answer")
            if isinstance(refused, Response):
                return refused
            marked = _announced_continuation(hub, chat_request.id, turn_id, go_on)
            continued = await hub.answer(turn_id, answers, continuation=marked)
        except StreamNotFound:
            gone = "the turn that asked is no longer kept"
            return json_error(404, "not_found_error", gone, headers)
        except AnswerRefused as exc:
            logger.info("an answer to %s was refused: %s", turn_id, exc.code)
            return _refusal(exc, headers)
        return _streaming(hub, turn_id, None, options, after=continued.after, asked=asked)

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
        answered = await answer(request, chat_request)
        if answered is not None:
            return answered
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
        if last is None:
            return Response(status_code=204, headers=headers)
        turn_id, finished = last
        if finished and not replay_finished and not hub.running(turn_id):
            # A turn that asks is not over: it waits, and a reload shows what it asks.
            asked = await _waits(hub, turn_id)
            if asked is None:
                return Response(status_code=204, headers=headers)
            return _streaming(hub, turn_id, verdict, options, asked=asked)
        return _streaming(hub, turn_id, verdict, options)

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
