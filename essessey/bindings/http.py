"""What every HTTP route of essessey (and an app's own beside them) shares: one JSON error
answer, one bounded request body reader. Needs the ``server`` extra (Starlette).

- :func:`json_error` answers an error as JSON in a dialect's own error shape (the
  protocol's Anthropic shape by default, :func:`~essessey.bindings.sse.error_body`), with
  the app's headers that may go on an answer without a stream (a CORS header lets a
  cross-origin client read why it was refused).
- :func:`read_body` reads at most ``limit`` bytes, within ``BODY_TIMEOUT`` seconds: a
  larger body is refused without being read whole, so a client cannot make the server
  buffer more than the route allows, and one that trickles in (a byte now and then) is
  refused when its time is up, so it cannot hold a connection and its buffer for ever.
- :func:`read_json` parses it, refusing JSON nested deeper than it could be written back.
- :func:`store_guarded` answers a route whose store is full or out of reach with a 503 in
  the route's error shape, not a 500: the client may try again, and no traceback is
  logged for an outage the store's own warnings already report.

A refusal is a :class:`BadRequest`, whose text is written for the client and never holds
the request's content.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import anyio
import orjson

from essessey._public import missing_extra, set_public_module

try:
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import Response
except ModuleNotFoundError as exc:  # the server extra is not installed
    raise missing_extra(__name__, exc, extra="server") from None

from essessey.bindings.sse._encoder import ErrorShape
from essessey.bindings.sse._format import error_body
from essessey.bindings.sse._response import refusal_headers
from essessey.errors import StoreFull, StoreUnavailable

__all__ = [
    "BODY_TIMEOUT",
    "STORE_REFUSED",
    "BadRequest",
    "Endpoint",
    "ErrorShape",
    "json_error",
    "read_body",
    "read_json",
    "store_guarded",
    "store_refusal",
]

logger = logging.getLogger("essessey.http")

BODY_TIMEOUT: Final = 30.0
"""Seconds a request's body may take to arrive whole: 4 MiB at about 140 KB/s."""


class BadRequest(Exception):
    """A request refused before any work: answered with ``status`` and an error of
    ``error_type`` whose message is this exception's text (never the request's content)."""

    def __init__(
        self, message: str, *, status: int = 400, error_type: str = "invalid_request_error"
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type

    def answer(
        self, headers: Mapping[str, str] | None = None, *, shape: ErrorShape = error_body
    ) -> Response:
        """This refusal as the client's answer (:func:`json_error`)."""
        return json_error(self.status, self.error_type, str(self), headers, shape=shape)


def json_error(
    status: int,
    error_type: str,
    message: str,
    headers: Mapping[str, str] | None = None,
    *,
    shape: ErrorShape = error_body,
) -> Response:
    """An error answer: ``shape(error_type, message)`` as JSON with ``status``, and the
    app's ``headers`` but those describing a body."""
    return Response(
        shape(error_type, message),
        status,
        headers=refusal_headers(headers),
        media_type="application/json",
    )


async def read_body(request: Request, limit: int, *, too_large: BadRequest | None = None) -> bytes:
    """The request's body, at most ``limit`` bytes: ``too_large`` (a 400 by default) for
    a larger one (refused from its ``content-length`` before reading, or once the bytes
    pass ``limit``), a 408 for one still arriving after ``BODY_TIMEOUT`` seconds, and
    :class:`BadRequest` for a client that left before its body ended (nobody reads that
    answer, but it is not a server error to log)."""
    refusal = too_large or BadRequest(f"the request body is larger than {limit} bytes")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise refusal
    body = bytearray()
    try:
        with anyio.fail_after(BODY_TIMEOUT):
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise refusal
    except ClientDisconnect:
        raise BadRequest("the client left before the request body ended") from None
    except TimeoutError:
        late = f"the request body did not arrive within {BODY_TIMEOUT:.0f} s"
        raise BadRequest(late, status=408) from None
    return bytes(body)


async def read_json(
    request: Request, *, limit: int, empty: Any = None, too_large: BadRequest | None = None
) -> Any:
    """The request's body (:func:`read_body`) parsed as JSON; ``empty`` when there is no
    body. :class:`BadRequest` for malformed JSON, and for JSON nested deeper than it
    could be written back (over 255 levels)."""
    body = await read_body(request, limit, too_large=too_large)
    if not body.strip():
        return empty
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise BadRequest("the request body is not valid JSON") from None
    try:
        # orjson reads 1,024 levels of nesting but writes only 255, and routes write
        # parts of a body back (a token estimate, a tool's input): a body between the
        # two is the client's error, refused here before any work, not a 500 later.
        orjson.dumps(value)
    except orjson.JSONEncodeError:
        raise BadRequest("the request body is nested too deeply") from None
    return value


STORE_REFUSED: Final = (StoreFull, StoreUnavailable)
"""What a store raises when it cannot take a new turn now, or cannot be reached: the
client's 503."""

Endpoint = Callable[[Request], Awaitable[Response]]
"""A Starlette request endpoint."""


def store_refusal(exc: Exception) -> tuple[int, str, str]:
    """The status, error type and message a client gets when the store refused a turn or
    could not be reached (one of ``STORE_REFUSED``): the server is busy or its store is
    out, never a 500."""
    logger.warning("a request was refused by the store: %s", type(exc).__name__)
    if isinstance(exc, StoreFull):
        return 503, "overloaded_error", "as many turns run as the server keeps; try again later"
    return 503, "api_error", "the event store is unavailable; try again"


def store_guarded(
    endpoint: Endpoint,
    headers: Mapping[str, str] | None = None,
    *,
    shape: ErrorShape = error_body,
) -> Endpoint:
    """``endpoint``, answering a store that refuses or cannot be reached while it prepares
    its answer (``STORE_REFUSED``) as :func:`store_refusal` says, in ``shape`` with the
    app's ``headers``. What goes wrong once a stream has begun ends that stream instead
    (its reader resumes)."""

    async def guarded(request: Request) -> Response:
        try:
            return await endpoint(request)
        except STORE_REFUSED as exc:
            return json_error(*store_refusal(exc), headers, shape=shape)

    return guarded


set_public_module(__name__, globals(), __all__)
