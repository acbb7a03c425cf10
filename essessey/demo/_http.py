"""Reading a bounded JSON body, bounding request headers, and answering errors in the
Anthropic shape."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from essessey.bindings.sse import error_body


class BadRequest(Exception):
    """A request the demo refuses: answered with ``status`` and an error of
    ``error_type`` whose message is this exception's text (never the request's content)."""

    def __init__(
        self, message: str, *, status: int = 400, error_type: str = "invalid_request_error"
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type


def json_error(status: int, error_type: str, message: str, **headers: str) -> Response:
    """``{"type": "error", "error": {"type": ..., "message": ...}}`` with ``status``."""
    return Response(
        error_body(error_type, message), status, headers=headers, media_type="application/json"
    )


def bad_request_response(exc: BadRequest, **headers: str) -> Response:
    """The response to a refused request."""
    return json_error(exc.status, exc.error_type, str(exc), **headers)


async def read_json(
    request: Request,
    *,
    limit: int,
    empty: Any = None,
    too_large: BadRequest | None = None,
) -> Any:
    """The request's body parsed as JSON; ``empty`` when there is no body.

    Reads at most ``limit`` bytes: a larger body raises ``too_large`` (a 400 by
    default) without being read whole, so a client cannot make the server buffer more.
    Malformed JSON raises a 400, as does JSON nested deeper than it could be written back
    (over 255 levels), and so does a client that leaves before its body ends
    (nobody reads that answer, but it is not a server error to log).
    """
    refusal = too_large or BadRequest(f"the request body is larger than {limit} bytes")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise refusal
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise refusal
    except ClientDisconnect:
        raise BadRequest("the client left before the request body ended") from None
    if not body.strip():
        return empty
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise BadRequest("the request body is not valid JSON") from None
    try:
        # orjson reads 1,024 levels of nesting but writes only 255, and the routes write
        # parts of a body back (the token estimate, a tool's input): a body between the
        # two is the client's error, refused here before any work, not a 500 later.
        orjson.dumps(value)
    except orjson.JSONEncodeError:
        raise BadRequest("the request body is nested too deeply") from None
    return value


MAX_HEADER_BYTES = 16 * 1024
"""The most a request's headers may hold (names, values and their separators)."""


class HeaderLimit:
    """Refuses a request whose headers hold more than ``max_bytes``: 431 with a
    ``request_too_large`` error, or, for a WebSocket, a close before the accept (uvicorn
    answers 403).

    uvicorn's h11 parser bounds only a request that is still incomplete: headers that
    arrive in one segment are read whole, however large, and httptools has
    no bound. The app can only refuse them once read; a header-read timeout (against
    slowloris) is not the app's to set: see docs/reliability.md. ``send`` is passed on
    unwrapped, so the bindings' direct writes stay open.
    """

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_HEADER_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            size = sum(len(name) + len(value) + 4 for name, value in scope["headers"])
            if size > self.max_bytes:
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008})
                    return
                message = f"the request headers are larger than {self.max_bytes} bytes"
                response = json_error(431, "request_too_large", message)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
