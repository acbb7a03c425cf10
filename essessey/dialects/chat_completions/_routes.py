"""The chat completions dialect's requests and routes (see the package)."""

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

from essessey.bindings.sse import SSEOptions, stream_response, subscription_response
from essessey.dialects._routes import read_request, start_turn
from essessey.dialects.chat_completions._encoder import (
    ChatCompletionsEncoder,
    completion,
    error_object,
)
from essessey.hub import StreamHub
from essessey.publisher import TurnProducer

__all__ = [
    "ChatCompletionRequest",
    "ChatTurnFactory",
    "chat_completions_routes",
    "parse_chat_completion_request",
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
