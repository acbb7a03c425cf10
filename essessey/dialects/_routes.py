"""What the dialects' routes share: reading a request into the dialect's own request
object, and starting the turn that answers it, each refusal in the dialect's own error
shape (a bad body, a refusal of ``authorize``, options the app refuses: 400, 403, 503)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response

from essessey.bindings.admission import Refusal, admit
from essessey.bindings.http import BadRequest, json_error, read_json
from essessey.bindings.sse import ErrorShape
from essessey.hub import StreamHub
from essessey.publisher import TurnProducer

__all__ = ["make_producer", "read_request", "start_turn"]

_Request = TypeVar("_Request")


async def read_request(
    request: Request,
    parse: Callable[[Any], _Request],
    *,
    limit: int,
    shape: ErrorShape,
    headers: Mapping[str, str],
) -> _Request | Response:
    """The request's body (at most ``limit`` bytes of JSON) as ``parse`` makes it, or the
    400 answer: a body that is not JSON, too large, or that ``parse`` refuses with
    ``ValueError``."""
    try:
        return parse(await read_json(request, limit=limit))
    except BadRequest as exc:
        return exc.answer(headers, shape=shape)
    except ValueError as exc:
        return json_error(400, "invalid_request_error", str(exc), headers, shape=shape)


async def make_producer(
    turn: Callable[[_Request], TurnProducer | Awaitable[TurnProducer]], parsed: _Request
) -> TurnProducer:
    """``turn(parsed)``, awaited when the app's factory is async; its ``ValueError``
    (options the app refuses) passes to the caller, whose client gets a 400."""
    made = turn(parsed)
    return made if callable(made) else await made


async def start_turn(
    hub: StreamHub,
    request: Request,
    stream_id: str,
    turn: Callable[[_Request], TurnProducer | Awaitable[TurnProducer]],
    parsed: _Request,
    *,
    shape: ErrorShape,
    headers: Mapping[str, str],
    log: logging.Logger,
) -> Response | None:
    """Start the turn answering ``parsed`` on ``stream_id``, once ``authorize`` allows
    it (asked for ``read`` access): None when it started, else the refusal's answer."""
    verdict = await admit(hub, request, stream_id, None, log)
    if isinstance(verdict, Refusal):
        return json_error(verdict.status, verdict.error_type, verdict.message, headers, shape=shape)
    try:
        producer = await make_producer(turn, parsed)
    except ValueError as exc:  # the app's own options, refused
        return json_error(400, "invalid_request_error", str(exc), headers, shape=shape)
    await hub.start(stream_id, producer)
    return None
