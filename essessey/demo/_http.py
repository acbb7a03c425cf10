"""Reading a bounded JSON body and answering errors in the Anthropic shape."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from essessey.bindings.sse._response import error_body


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
