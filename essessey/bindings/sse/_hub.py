"""Serving a :class:`~essessey.StreamHub` over SSE: subscribe, resume, cancel.

The resume point comes from the ``Last-Event-ID`` header (what a browser's EventSource
sends when it reconnects) or from a ``last_event_id`` query parameter (for a client that
cannot set headers: a page reload that remembers where it was). Every event carries its
``id:`` line. Errors before the first event are HTTP errors with a JSON body in the
Anthropic shape, which make an EventSource stop instead of reconnecting in a loop:

====================  ======  =====================================================
case                  status  ``error.type``
====================  ======  =====================================================
bad stream id or id   400     ``invalid_request_error``
not authorised        403     ``permission_error``
no such stream        404     ``not_found_error``
unknown last id       410     ``resume_unavailable`` (start over without an id)
too many subscribers  503     ``overloaded_error``
the hook raised       503     ``api_error`` (logged, without the exception's text)
====================  ======  =====================================================

A stream id is 1 to ``MAX_ID_LENGTH`` printable characters without whitespace, ``.``,
``*`` or ``>`` (one NATS subject token, so every backend can carry it); a last event id is
1 to ``MAX_ID_LENGTH`` printable characters. The cancel route never reads the request
body.

A subscriber that falls behind is ended without an error event: its client reconnects
with its last id and carries on.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import AsyncIterator, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from essessey._ids import MAX_ID_LENGTH, is_event_id, is_token
from essessey.bindings.sse._response import EventStreamResponse, error_body
from essessey.errors import (
    StoreUnavailable,
    StreamNotFound,
    StreamRejected,
    StreamReset,
    SubscriberLagged,
    TooManySubscribers,
    UnknownEventId,
)
from essessey.event import Event
from essessey.hub import Access, StreamHub

__all__ = ["MAX_ID_LENGTH", "cancel_response", "hub_routes", "subscription_response"]

logger = logging.getLogger("essessey.sse")

_CHECK_FAILED = "could not check access to this stream; try again later"


def _json_error(status: int, error_type: str, message: str) -> Response:
    return Response(error_body(error_type, message), status, media_type="application/json")


async def check_access(
    hub: StreamHub, request: Any, stream_id: str, access: Access, log: logging.Logger
) -> bool | None:
    """The ``authorize`` hook's answer, or None when it raised.

    A hook that raises is the app's failure, not the client's: the caller answers "try
    again later" (503, close 1013), never a 500 and never a refusal that would read as
    "your credentials are wrong". The log line names the exception's class and where it
    was raised, but not its text, which may hold the very token being checked.
    """
    try:
        return await hub.authorized(request, stream_id, access)
    except Exception as exc:
        frames = traceback.extract_tb(exc.__traceback__)
        where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        log.error(
            "the authorize hook raised %s%s (%s access to stream %s); answered try again later",
            type(exc).__name__,
            where,
            access,
            stream_id,
        )
        return None


async def _follow(
    hub: StreamHub, stream_id: str, last_event_id: str | None
) -> AsyncIterator[Event]:
    # Closed as soon as this response ends (the client left), so the hub's subscriber
    # count drops at once rather than when the garbage collector gets to it.
    events = hub.subscribe(stream_id, last_event_id)
    try:
        async for event in events:
            yield event
    except StreamNotFound as exc:
        raise StreamRejected(404, "not_found_error", f"no stream {stream_id!r}") from exc
    except UnknownEventId as exc:
        raise StreamRejected(
            410, "resume_unavailable", "the last event id is not retained; start over without it"
        ) from exc
    except TooManySubscribers as exc:
        raise StreamRejected(503, "overloaded_error", "too many subscribers") from exc
    except StreamReset as exc:
        raise StreamRejected(410, "resume_unavailable", "the stream was reset") from exc
    except (SubscriberLagged, StoreUnavailable) as exc:
        # Ending the response (not an error event) makes the client reconnect with its
        # last id, which the store still holds; an error event would read as the end of
        # the turn.
        logger.warning("ending a subscription of %s: %s", stream_id, type(exc).__name__)
        return
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()


async def subscription_response(
    hub: StreamHub, request: Request, stream_id: str, **options: Any
) -> Response:
    """An SSE response following ``stream_id`` on ``hub`` for this request, resuming
    after its ``Last-Event-ID`` header or ``last_event_id`` query parameter.

    ``options`` go to :class:`EventStreamResponse` (``ping_interval``, ``retry``, ...).
    """
    last_event_id = request.headers.get("last-event-id")
    if last_event_id is None:
        last_event_id = request.query_params.get("last_event_id")
    if last_event_id == "":
        last_event_id = None  # an empty id means "from the start", as for EventSource
    if not is_token(stream_id):
        return _json_error(400, "invalid_request_error", "invalid stream id")
    if last_event_id is not None and not is_event_id(last_event_id):
        return _json_error(400, "invalid_request_error", "invalid last event id")
    access: Access = "resume" if last_event_id is not None else "read"
    allowed = await check_access(hub, request, stream_id, access, logger)
    if allowed is None:
        return _json_error(503, "api_error", _CHECK_FAILED)
    if not allowed:
        return _json_error(403, "permission_error", f"not allowed to {access} this stream")
    return EventStreamResponse(_follow(hub, stream_id, last_event_id), **options)


async def cancel_response(hub: StreamHub, request: Request, stream_id: str) -> Response:
    """Cancel the turn running on ``stream_id`` if this request may: 200 with
    ``{"cancelled": true}``, 404 when no turn runs there, 403 when not allowed, 503 when
    the ``authorize`` hook raised. The request's body is never read."""
    if not is_token(stream_id):
        return _json_error(400, "invalid_request_error", "invalid stream id")
    allowed = await check_access(hub, request, stream_id, "cancel", logger)
    if allowed is None:
        return _json_error(503, "api_error", _CHECK_FAILED)
    if not allowed:
        return _json_error(403, "permission_error", "not allowed to cancel this stream")
    if not await hub.cancel(stream_id):
        return _json_error(404, "not_found_error", "no turn is running on this stream")
    return Response(b'{"cancelled":true}', 200, media_type="application/json")


def hub_routes(hub: StreamHub, prefix: str = "/streams", **options: Any) -> Sequence[BaseRoute]:
    """Starlette routes: ``GET {prefix}/{stream_id}`` (subscribe or resume, as SSE) and
    ``POST {prefix}/{stream_id}/cancel``. ``options`` go to the SSE response."""

    async def subscribe(request: Request) -> Response:
        return await subscription_response(
            hub, request, request.path_params["stream_id"], **options
        )

    async def cancel(request: Request) -> Response:
        return await cancel_response(hub, request, request.path_params["stream_id"])

    return [
        Route(prefix + "/{stream_id}", subscribe, methods=["GET"]),
        Route(prefix + "/{stream_id}/cancel", cancel, methods=["POST"]),
    ]
