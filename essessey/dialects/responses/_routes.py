"""The responses dialect's requests and routes (see the package)."""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Unpack

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from essessey._ids import is_event_id, is_first_event_id
from essessey.bindings.admission import Refusal, admit
from essessey.bindings.http import BadRequest, json_error, read_body, store_guarded
from essessey.bindings.sse import (
    SSEOptions,
    requested_resume_point,
    stream_response,
    subscription_response,
)
from essessey.dialects._payload import answer_value
from essessey.dialects._routes import WholeBuilds, other_methods, read_request, start_turn
from essessey.dialects.responses._encoder import (
    ResponsesEncoder,
    error_object,
)
from essessey.errors import AnswerRefused, InvalidAnswer, StreamNotFound
from essessey.event import Event
from essessey.hub import StreamHub
from essessey.protocol.asking import (
    Answer,
    ApprovalRequest,
    ClientToolCall,
    Question,
    QuestionAnswer,
    ToolApproval,
    ToolOutput,
    Waiting,
)
from essessey.publisher import TurnProducer

__all__ = [
    "ResponsesRequest",
    "ResponsesTurnFactory",
    "answers_of",
    "continuation_id",
    "parse_responses_request",
    "responses_routes",
    "split_response_id",
]

logger = logging.getLogger("essessey.dialects.responses")


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


# -- answers (docs/asking.md) --------------------------------------------------------------


def continuation_id(stream_id: str, after: str | None) -> str:
    """The id of the response that continues ``stream_id`` after its event ``after``
    (``<stream id>.<event id>``; a stream id holds no ``.``): the response an answer is
    served as, which ``GET`` retrieves and resumes, and a later answer's
    ``previous_response_id``."""
    return stream_id if after is None else f"{stream_id}.{after}"


def split_response_id(response_id: str) -> tuple[str, str | None]:
    """The stream and the event a response id names (:func:`continuation_id`): the
    stream alone for the turn's first response."""
    stream_id, dot, after = response_id.partition(".")
    return stream_id, (after if dot else None)


def _is_answer(item: Any) -> bool:
    if not isinstance(item, dict):
        return False
    kind = item.get("type")
    if kind == "mcp_approval_response":
        return True
    return isinstance(kind, str) and kind.endswith("_call_output") and "call_id" in item


def answers_of(items: Sequence[Any], asked: Waiting | None) -> list[Answer]:
    """The answers an answering request's ``input`` items give to what ``asked`` asks:
    an ``mcp_approval_response`` (``approval_request_id``, ``approve``, ``reason``) an
    approval; a ``function_call_output`` (or another ``*_call_output``: ``call_id``,
    ``output``) a client call's output, or a question's answer when its ``call_id`` is
    a question's id (the output JSON-decoded when it is JSON).
    :class:`~essessey.InvalidAnswer` for an item without what it needs."""
    found: list[Answer] = []
    for n, item in enumerate(items):
        if item.get("type") == "mcp_approval_response":
            key, approve = item.get("approval_request_id"), item.get("approve")
            reason = item.get("reason")
            if not isinstance(key, str) or not isinstance(approve, bool):
                raise InvalidAnswer(
                    f"input.{n}: approval_request_id (a string) and approve (a boolean) "
                    "are required"
                )
            request = asked.request(key) if asked is not None else None
            if isinstance(request, ClientToolCall):
                # A provider's own approval request, passed on as a client call.
                output = {"approve": approve, "reason": reason} if reason else {"approve": approve}
                found.append(ToolOutput(key, output))
                continue
            found.append(ToolApproval(key, approve, reason if isinstance(reason, str) else None))
            continue
        key, output = item.get("call_id"), item.get("output")
        if not isinstance(key, str) or output is None:
            raise InvalidAnswer(f"input.{n}: call_id and output are required")
        request = asked.request(key) if asked is not None else None
        if request is None and asked is not None and key in asked.ran:
            continue  # a call the turn ran itself (its output is in the response)
        if isinstance(request, Question):
            found.append(QuestionAnswer(key, answer_value(output)))
        elif isinstance(request, ApprovalRequest):
            raise InvalidAnswer(
                f"input.{n}: {key!r} is an approval request; an mcp_approval_response answers it"
            )
        else:
            found.append(ToolOutput(key, output))
    return found


def _refusal(error_type: str, message: str, code: str) -> bytes:
    body = {"message": message, "type": error_type, "param": None, "code": code}
    return orjson.dumps({"error": body})


def _sequence_number(value: str | None) -> int | None:
    if value is None:
        return None
    # ASCII digits only: str.isdigit takes '²' (which int() refuses) and other scripts'.
    if not (value.isascii() and value.isdigit()) or len(value) > 18:
        raise ValueError("starting_after: must be a sequence number (a whole number >= 0)")
    return int(value)


_CANCEL_BODY: Final = 1024  # a cancel's body means nothing: a small one is taken

_SEQUENCE_NUMBER: Final = re.compile(rb'"sequence_number":(\d+)')


def _start_evicted(events: Sequence[Event]) -> bool:
    """Whether a stream read from its oldest retained event (``events``) no longer holds
    its first: the response whose id is the stream's, its first message, is then gone in
    part. Told by the stores' ids; another store's ids count as the start."""
    return bool(events) and is_first_event_id(events[0].id) is False


def _sequenced_before(last: int) -> Callable[[bytes], bool]:
    """Whether a frame is one of the events up to sequence number ``last``: a resume by
    ``starting_after`` leaves them out (the frames keep their ids)."""

    def before(frame: bytes) -> bool:
        found = _SEQUENCE_NUMBER.search(frame)
        return found is not None and int(found[1]) <= last

    return before


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
    - ``POST {path}/{response_id}/cancel``: its turn stopped (``authorize``'s ``cancel``
      access), answered with the response as it then stands (``cancelled``), as the
      openai SDK's ``responses.cancel`` reads it.

    A method a path does not take is a 405 in OpenAI's error shape.

    A turn that asks (docs/asking.md) is answered, when the hub has an ``on_answer``
    continuation, by a ``POST`` with ``previous_response_id`` (the asking response's
    id) whose ``input`` holds ``function_call_output`` and ``mcp_approval_response``
    items: the hub takes the answers (:meth:`~essessey.StreamHub.answer`) and the
    continuation is the new response (its id ``<stream id>.<event id>``, see
    :func:`continuation_id`), streamed or not as asked. The same answers again serve the
    same continuation; other answers to what was answered are a 409, answers to
    requests not asked a 400, an unknown response a 404.

    Every response is resumable, background or not. Errors are OpenAI's error objects.
    ``options`` go to the SSE response (:class:`~essessey.bindings.sse.SSEOptions`)."""
    if max_body <= 0:
        raise ValueError("max_body must be > 0")
    headers = dict(options.get("headers") or {})
    whole_builds = WholeBuilds()

    def refuse(status: int, error_type: str, message: str) -> Response:
        return json_error(status, error_type, message, headers, shape=error_object)

    def evicted(response_id: str) -> Response:
        message = f"the store no longer holds response {response_id!r} from its start"
        return refuse(410, "response_evicted", message)

    async def whole(response_id: str, model: str) -> Response | None:
        """The response as it stands; None when the stream does not hold the event a
        continuation's id names (a 410 when it no longer holds the response's start)."""
        stream_id, after = split_response_id(response_id)
        async with whole_builds():
            events, _ = await hub.store.since(stream_id, None)
            if after is not None and not any(event.id == after for event in events):
                return None
            if after is None and _start_evicted(events):
                return evicted(response_id)
            encoder = ResponsesEncoder(response_id, model=model, after=after)
            for event in events:
                encoder.encode(event)
            return Response(
                orjson.dumps(encoder.response()), headers=headers, media_type="application/json"
            )

    async def answer(request: Request, parsed: ResponsesRequest) -> Response | None:
        """The continuation of the response ``previous_response_id`` names, when the
        request answers what it asks (see above); None for any other request."""
        previous = parsed.body.get("previous_response_id")
        given = parsed.input
        if hub.on_answer is None or not isinstance(previous, str) or isinstance(given, str):
            return None
        items = [item for item in given if _is_answer(item)]
        if not items:
            return None
        if len(items) != len(given):
            message = "input: a request answering a response holds only its answers"
            return refuse(400, "invalid_request_error", message)
        stream_id, _ = split_response_id(previous)
        verdict = await admit(hub, request, stream_id, None, logger, access="answer")
        if isinstance(verdict, Refusal):
            return refuse(verdict.status, verdict.error_type, verdict.message)
        try:
            asked = await hub.waiting(stream_id)
            continued = await hub.answer(stream_id, answers_of(items, asked))
        except StreamNotFound:
            return refuse(404, "not_found_error", f"no response {previous!r}")
        except AnswerRefused as exc:
            logger.info("an answer to %s was refused: %s", stream_id, exc.code)
            kind = "invalid_request_error" if exc.status == 400 else "conflict_error"
            body = _refusal(kind, str(exc), exc.code)
            return json_error(exc.status, kind, str(exc), headers, shape=lambda _t, _m: body)
        after = continued.after
        response_id = continuation_id(stream_id, after)
        if parsed.stream:
            encoder = ResponsesEncoder(response_id, model=parsed.model, after=after)
            return stream_response(
                hub, stream_id, after, encoder=encoder, error_shape=error_object, **options
            )
        if not parsed.background:
            await hub.wait(stream_id)
        served = await whole(response_id, parsed.model)
        return served or refuse(404, "not_found_error", f"no response {response_id!r}")

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
        answered = await answer(request, parsed)
        if answered is not None:
            return answered
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
        served = await whole(response_id, parsed.model)
        return served or refuse(404, "not_found_error", f"no response {response_id!r}")

    async def retrieve(request: Request) -> Response:
        response_id = request.path_params["response_id"]
        stream_id, after = split_response_id(response_id)
        if after is not None and not is_event_id(after):
            # What follows the dot is an event id, checked as a Last-Event-ID is.
            return refuse(400, "invalid_request_error", "invalid response id")
        try:
            starting_after = _sequence_number(request.query_params.get("starting_after"))
        except ValueError as exc:
            return refuse(400, "invalid_request_error", str(exc))
        if request.query_params.get("stream") != "true":
            verdict = await admit(hub, request, stream_id, None, logger)
            if isinstance(verdict, Refusal):
                return refuse(verdict.status, verdict.error_type, verdict.message)
            served = None
            if await hub.store.exists(stream_id):
                served = await whole(response_id, "essessey")
            return served or refuse(404, "not_found_error", f"no response {response_id!r}")
        before = None if starting_after is None else _sequenced_before(starting_after)
        if after is None:
            events, _ = await hub.store.since(stream_id, None)
            if _start_evicted(events):
                # The response is the stream's first message, partly evicted: from the
                # oldest message still whole, another message would read as its frames.
                if starting_after is not None or requested_resume_point(request) is not None:
                    return refuse(410, "resume_unavailable", "the resume point is not retained")
                return evicted(response_id)
            return await subscription_response(
                hub,
                request,
                response_id,
                encoder=ResponsesEncoder(response_id),
                shape=error_object,
                frames_before=before,
                **options,
            )
        # A continuation: read from the event it follows, unless the client resumes.
        verdict = await admit(hub, request, stream_id, requested_resume_point(request), logger)
        if isinstance(verdict, Refusal):
            return refuse(verdict.status, verdict.error_type, verdict.message)
        encoder = ResponsesEncoder(response_id, after=after)
        resume = verdict.last_event_id or after
        return stream_response(
            hub,
            stream_id,
            resume,
            encoder=encoder,
            error_shape=error_object,
            frames_before=before,
            **options,
        )

    async def cancel(request: Request) -> Response:
        """OpenAI's cancel of a response: its turn stopped (the stream's message ends
        ``cancelled``), answered with the response as it then stands."""
        response_id = request.path_params["response_id"]
        stream_id, _ = split_response_id(response_id)
        verdict = await admit(hub, request, stream_id, None, logger, access="cancel")
        if isinstance(verdict, Refusal):
            return refuse(verdict.status, verdict.error_type, verdict.message)
        try:
            await read_body(request, _CANCEL_BODY)  # nothing in it is read
        except BadRequest as exc:
            return exc.answer(headers, shape=error_object)
        if await hub.store.exists(stream_id):
            await hub.cancel(stream_id)  # nothing to stop once its turn is over
            served = await whole(response_id, "essessey")
            if served is not None:
                return served
        return refuse(404, "not_found_error", f"no response {response_id!r}")

    return [
        Route(path, store_guarded(create, headers, shape=error_object), methods=["POST"]),
        other_methods(path, ["POST"], headers, error_object),
        Route(
            path + "/{response_id}",
            store_guarded(retrieve, headers, shape=error_object),
            methods=["GET"],
        ),
        other_methods(path + "/{response_id}", ["GET"], headers, error_object),
        Route(
            path + "/{response_id}/cancel",
            store_guarded(cancel, headers, shape=error_object),
            methods=["POST"],
        ),
        other_methods(path + "/{response_id}/cancel", ["POST"], headers, error_object),
    ]
