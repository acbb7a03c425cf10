"""The chat completions dialect's requests and routes (see the package)."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Unpack

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from essessey._ids import is_event_id
from essessey.bindings.admission import Refusal, admit
from essessey.bindings.http import json_error, store_guarded
from essessey.bindings.sse import (
    SSEOptions,
    requested_resume_point,
    stream_response,
    subscription_response,
)
from essessey.dialects._payload import answer_value, content_text
from essessey.dialects._routes import (
    WholeBuilds,
    answered_stream,
    other_methods,
    read_request,
    start_turn,
)
from essessey.dialects.chat_completions._encoder import (
    APPROVAL_TOOL,
    ChatCompletionsEncoder,
    completion,
    error_object,
)
from essessey.errors import AnswerRefused, InvalidAnswer, ProviderStreamError, StreamNotFound
from essessey.event import Event
from essessey.hub import StreamHub
from essessey.protocol.asking import (
    Answer,
    ApprovalRequest,
    Question,
    QuestionAnswer,
    ToolApproval,
    ToolOutput,
    Waiting,
)
from essessey.publisher import TurnProducer

__all__ = [
    "ChatCompletionRequest",
    "ChatTurnFactory",
    "answering_messages",
    "chat_completions_routes",
    "parse_chat_completion_request",
    "split_completion_id",
    "tool_message_answers",
]

logger = logging.getLogger("essessey.dialects.chat_completions")


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
        role = item.get("role") if isinstance(item, dict) else None
        if not isinstance(role, str) or role not in _ROLES:
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


# -- answers (docs/asking.md) --------------------------------------------------------------


def answering_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``tool`` messages that end ``messages`` after an assistant message with
    ``tool_calls``: what a request answering a turn that asks sends (empty for any
    other request)."""
    count = 0
    for message in reversed(messages):
        if message.get("role") != "tool":
            break
        count += 1
    if count == 0 or count == len(messages):
        return []
    before = messages[-count - 1]
    if before.get("role") != "assistant" or not before.get("tool_calls"):
        return []
    return messages[-count:]


def listed_calls(messages: list[dict[str, Any]], answering: int) -> set[str]:
    """The ids of the tool calls of the assistant message before the last ``answering``
    messages (the ``tool`` messages :func:`answering_messages` found)."""
    calls = messages[-answering - 1].get("tool_calls") if answering < len(messages) else None
    if not isinstance(calls, list):
        return set()
    return {c["id"] for c in calls if isinstance(c, dict) and isinstance(c.get("id"), str)}


def tool_message_answers(
    tool_messages: list[dict[str, Any]],
    asked: Waiting | None,
    *,
    listed: Collection[str] = (),
) -> list[Answer]:
    """The answers ``tool`` messages give to what ``asked`` asks: for a question
    (``ask_user``) its content, JSON-decoded when it is JSON; for an approval request
    (``approve_tool_call``) ``{"approved": bool, "reason"?: str}``; for a client call its
    content, as text. A message for a call of ``listed`` (the calls the completion named,
    :func:`listed_calls`) that ``asked`` does not ask is left out: the completion lists
    every call of its rounds, those the turn ran itself too, and an OpenAI client sends a
    ``tool`` message for each. :class:`~essessey.InvalidAnswer` for a message without
    what it needs."""
    found: list[Answer] = []
    for n, message in enumerate(tool_messages):
        key = message.get("tool_call_id")
        text = content_text(message.get("content"))
        if not isinstance(key, str) or text is None:
            raise InvalidAnswer(f"tool message {n}: tool_call_id and a text content are required")
        request = asked.request(key) if asked is not None else None
        if request is None and key in listed:
            continue  # a call the turn ran itself (its result is in the stream)
        if isinstance(request, Question):
            found.append(QuestionAnswer(key, answer_value(text)))
        elif isinstance(request, ApprovalRequest):
            given = answer_value(text)
            approved = given.get("approved") if isinstance(given, dict) else None
            reason = given.get("reason") if isinstance(given, dict) else None
            if not isinstance(approved, bool) or not (reason is None or isinstance(reason, str)):
                raise InvalidAnswer(
                    f"tool message {n} answers an {APPROVAL_TOOL} call: its content is JSON "
                    '{"approved": true|false, "reason"?: "..."}'
                )
            found.append(ToolApproval(key, approved, reason))
        else:
            found.append(ToolOutput(key, text))
    return found


def split_completion_id(completion_id: str) -> tuple[str, str | None]:
    """The stream and the event a completion id names: a continuation's is ``<stream
    id>.<event id>`` (it follows that event), a turn's first the stream id alone."""
    stream_id, dot, after = completion_id.partition(".")
    return stream_id, (after if dot else None)


def _refusal(exc: AnswerRefused, headers: dict[str, str]) -> Response:
    kind = "invalid_request_error" if exc.status == 400 else "conflict_error"
    body = {"message": str(exc), "type": kind, "param": None, "code": exc.code}
    data = orjson.dumps({"error": body})
    return json_error(exc.status, kind, str(exc), headers, shape=lambda _t, _m: data)


def _whole(
    events: list[Event], completion_id: str, model: str, headers: dict[str, str]
) -> Response:
    """The answer to a request without ``stream``: the completion, or (the turn failed)
    its error as OpenAI answers one, with a 500 the client does not retry (a retry
    would run the turn again)."""
    try:
        whole = completion(events, completion_id, model=model)
    except ProviderStreamError as exc:
        no_retry = {**headers, "x-should-retry": "false"}
        return json_error(500, exc.error_type, exc.message, no_retry, shape=error_object)
    return Response(orjson.dumps(whole), headers=headers, media_type="application/json")


def _refused(verdict: Refusal, headers: dict[str, str]) -> Response:
    """An admission's refusal, in OpenAI's error shape."""
    return json_error(
        verdict.status, verdict.error_type, verdict.message, headers, shape=error_object
    )


def _wants_json(request: Request) -> bool:
    """Whether a read of a completion asks for it whole (its ``Accept`` names JSON and
    not SSE, it resumes nothing and names no option of the stream's), as the openai
    SDK's ``retrieve`` does. The SDK sends ``Accept: application/json`` with every
    request, a stream it reads too: ``include_usage`` asks for the stream."""
    accept = request.headers.get("accept", "")
    return (
        "application/json" in accept
        and "text/event-stream" not in accept
        and "include_usage" not in request.query_params
        and requested_resume_point(request) is None
    )


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

    A turn that asks (docs/asking.md) is answered, when the hub has an ``on_answer``
    continuation, by a ``POST`` whose messages end with the assistant's tool calls and a
    ``tool`` message for each: the hub finds the stream that asked
    (:meth:`~essessey.StreamHub.asking_stream`), takes the answers and the continuation
    is the new completion (id ``<stream id>.<event id>``), streamed or not as asked. The
    same answers again serve the same continuation; other answers to what was answered
    are a 409, tool call ids no kept stream asked a 400.

    Errors are OpenAI's error objects (400 for a bad body). ``options`` go to the SSE
    response (:class:`~essessey.bindings.sse.SSEOptions`)."""
    if max_body <= 0:
        raise ValueError("max_body must be > 0")
    headers = dict(options.get("headers") or {})
    whole_builds = WholeBuilds()

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
        answered = await answer(request, parsed)
        if answered is not None:
            return answered
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
            async with whole_builds():
                events, _ = await hub.store.since(completion_id, None)
                return _whole(events, completion_id, parsed.model, {**headers, **location})
        encoder = ChatCompletionsEncoder(
            completion_id, model=parsed.model, include_usage=parsed.include_usage
        )
        delivery: SSEOptions = {**options, "headers": {**headers, **location}}
        return stream_response(
            hub, completion_id, None, encoder=encoder, error_shape=error_object, **delivery
        )

    async def answer(request: Request, parsed: ChatCompletionRequest) -> Response | None:
        """The continuation of the turn the request's ``tool`` messages answer (see
        above); None for any other request."""
        tool_messages = answering_messages(parsed.messages) if hub.on_answer else []
        if not tool_messages:
            return None
        keys = [m["tool_call_id"] for m in tool_messages if isinstance(m.get("tool_call_id"), str)]
        found = await answered_stream(hub, request, keys, logger)
        if found is None:
            unknown = "no stream kept waits for these tool calls"
            return json_error(400, "invalid_request_error", unknown, headers, shape=error_object)
        if isinstance(found, Refusal):
            return _refused(found, headers)
        stream_id = found.admission.stream_id
        try:
            listed = listed_calls(parsed.messages, len(tool_messages))
            answers = tool_message_answers(tool_messages, found.asked, listed=listed)
            continued = await hub.answer(stream_id, answers)
        except StreamNotFound:
            gone = "the stream that asked is no longer kept"
            return json_error(404, "not_found_error", gone, headers, shape=error_object)
        except AnswerRefused as exc:
            logger.info("an answer to %s was refused: %s", stream_id, exc.code)
            return _refusal(exc, headers)
        after = continued.after
        completion_id = stream_id if after is None else f"{stream_id}.{after}"
        location = {"location": f"{path}/{completion_id}"}
        if not parsed.stream:
            await hub.wait(stream_id)
            events, _ = await hub.store.since(stream_id, after)
            return _whole(events, completion_id, parsed.model, {**headers, **location})
        encoder = ChatCompletionsEncoder(
            completion_id, model=parsed.model, include_usage=parsed.include_usage, after=after
        )
        delivery: SSEOptions = {**options, "headers": {**headers, **location}}
        return stream_response(
            hub, stream_id, after, encoder=encoder, error_shape=error_object, **delivery
        )

    async def resume(request: Request) -> Response:
        completion_id = request.path_params["completion_id"]
        stream_id, after = split_completion_id(completion_id)
        if after is not None and not is_event_id(after):
            # What follows the dot is an event id, checked as a Last-Event-ID is.
            invalid = "invalid completion id"
            return json_error(400, "invalid_request_error", invalid, headers, shape=error_object)
        if _wants_json(request):
            # The openai SDK's retrieve: the whole completion, as a request without
            # stream gets it.
            verdict = await admit(hub, request, stream_id, None, logger)
            if isinstance(verdict, Refusal):
                return _refused(verdict, headers)
            await hub.wait(stream_id)
            async with whole_builds():
                events, known = await hub.store.since(stream_id, after)
                if not known:
                    # No such completion (or continuation) is kept: the stream's answers.
                    missing = "no such completion is kept"
                    return json_error(404, "not_found_error", missing, headers, shape=error_object)
                return _whole(events, completion_id, "essessey", headers)
        encoder = ChatCompletionsEncoder(
            completion_id,
            include_usage=request.query_params.get("include_usage") == "true",
            after=after,
        )
        if after is None:
            return await subscription_response(
                hub, request, completion_id, encoder=encoder, shape=error_object, **options
            )
        # A continuation: read from the event it follows, unless the client resumes.
        verdict = await admit(hub, request, stream_id, requested_resume_point(request), logger)
        if isinstance(verdict, Refusal):
            return _refused(verdict, headers)
        resume = verdict.last_event_id or after
        return stream_response(
            hub, stream_id, resume, encoder=encoder, error_shape=error_object, **options
        )

    return [
        Route(path, store_guarded(create, headers, shape=error_object), methods=["POST"]),
        other_methods(path, ["POST"], headers, error_object),
        Route(
            path + "/{completion_id}",
            store_guarded(resume, headers, shape=error_object),
            methods=["GET"],
        ),
        other_methods(path + "/{completion_id}", ["GET"], headers, error_object),
    ]
