"""The one place essessey reaches into Starlette's internals (written against Starlette
1.10; the wrappers it reads have been there since 0.29).

A body chunk may be written straight to the server's transport only when nothing
between the app and the server would change it (see ``essessey.bindings._uvicorn``). On
every route of a Starlette or FastAPI app, Starlette wraps ``send`` twice in closures that
only note that the response started: its exception handling
(``starlette._exception_handler``) and its error middleware
(``ServerErrorMiddleware``). No public API tells such a wrapper from a middleware's that
rewrites the body (GZip), so :func:`unwrap_send` recognises these two by their code
objects, found in Starlette's own functions, and follows their closures to the send they
wrap. Any other wrapper means "unknown": the caller goes through ASGI.

Switch: ``ESSESSEY_STARLETTE_INTERNALS=off`` (or ``0``, ``false``, ``no``) in the
environment when the process starts takes every wrapper for unknown, so no body chunk
skips a wrapper. tests/test_server_reach.py fails loudly when a Starlette release changes
these wrappers (a direct write no longer found under a plain route).
"""

from __future__ import annotations

import os
import types
from collections.abc import Iterable, Iterator
from typing import Any, Final

__all__ = ["ENABLED", "unwrap_send"]

_SWITCH: Final = os.environ.get("ESSESSEY_STARLETTE_INTERNALS", "on").strip().lower()
ENABLED: bool = _SWITCH not in ("off", "0", "false", "no")
"""Whether Starlette's wrappers are recognised (the environment switch, read at import)."""


def _inner_codes(code: types.CodeType, name: str) -> Iterator[types.CodeType]:
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            if const.co_name == name:
                yield const
            yield from _inner_codes(const, name)


def _observing_wrappers() -> frozenset[types.CodeType]:
    """The code of Starlette's own ``send`` wrappers that only note that the response
    started, so that a body chunk that skips them changes nothing."""
    try:
        from starlette import _exception_handler
        from starlette.middleware.errors import ServerErrorMiddleware
    except ImportError:
        return frozenset()
    wrappers: Iterable[types.CodeType] = (
        *_inner_codes(_exception_handler.wrap_app_handling_exceptions.__code__, "sender"),
        *_inner_codes(ServerErrorMiddleware.__call__.__code__, "_send"),
    )
    return frozenset(code for code in wrappers if "send" in code.co_freevars)


_OBSERVING_WRAPPERS: Final = _observing_wrappers()
_MAX_WRAPPERS: Final = 16


def unwrap_send(send: Any) -> Any:
    """The send under Starlette's observing wrappers around ``send`` (``send`` itself
    when it is not one); None when another wrapper is in the way, which may change the
    body, or when the switch is off and ``send`` is wrapped."""
    for _ in range(_MAX_WRAPPERS):
        if getattr(send, "__self__", None) is not None:
            return send  # a bound method: the server's own send, or a middleware's
        code = getattr(send, "__code__", None)
        if not ENABLED or code not in _OBSERVING_WRAPPERS:
            return None
        closure = send.__closure__
        send = closure[code.co_freevars.index("send")].cell_contents
    return None
