"""The responses dialect's requests and routes (see the package)."""

from __future__ import annotations

import logging
import secrets
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
from essessey.dialects._routes import read_request, start_turn
from essessey.dialects.responses._encoder import (
    ResponsesEncoder,
    error_object,
)
from essessey.hub import StreamHub
from essessey.publisher import TurnProducer

__all__ = [
    "ResponsesRequest",
    "ResponsesTurnFactory",
    "parse_responses_request",
    "responses_routes",
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
