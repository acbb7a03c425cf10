"""The rules on a request's headers the server may not enforce itself: their size, and
one ``Host`` (the bounded body and the error answers are ``essessey.bindings.http``'s)."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from essessey.bindings.http import json_error

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


class HostCheck:
    """Refuses an HTTP/1.1 request without a ``Host`` header or with more than one: 400
    with an ``invalid_request_error``, or, for a WebSocket, a close before the accept
    (uvicorn answers 403).

    RFC 9112 (section 3.2) has the server answer such a request with 400; uvicorn's h11
    parser does, its httptools one lets both through, so the app checks what it is
    handed. An HTTP/1.0 request may lack the header. ``send`` is passed on unwrapped, so
    the bindings' direct writes stay open.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and scope.get("http_version") == "1.1":
            hosts = sum(1 for name, _ in scope["headers"] if name == b"host")
            if hosts != 1:
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008})
                    return
                if hosts:
                    message = f"{hosts} Host headers; a request has one"
                else:
                    message = "no Host header; an HTTP/1.1 request has one"
                response = json_error(400, "invalid_request_error", message)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
