"""Admitting a client to a stream: the one set of steps every route and endpoint takes
before it serves a hub's stream, in any transport or dialect (a dialect's own routes call
:func:`admit` too: docs/dialects.md).

The steps, in order, and the refusal of each (an HTTP status and error type for a route,
a close code for a WebSocket):

===================================  ======  =========================  ==========
step                                 status  ``error.type``             close code
===================================  ======  =========================  ==========
the stream id is not one             400     ``invalid_request_error``  4400
the last event id is not one         400     ``invalid_request_error``  4400
the ``authorize`` hook said no       403     ``permission_error``       4403
the ``authorize`` hook raised        503     ``api_error``              1013
===================================  ======  =========================  ==========

The access asked of ``authorize`` is ``resume`` when a last event id is given, ``read``
otherwise, unless the route asks for another (``cancel``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from essessey._ids import is_stream_id
from essessey._public import set_public_module
from essessey.bindings._asgi import (
    CHECK_FAILED,
    SubscriptionEnd,
    check_access,
    resume_point,
    subscription_end,
)
from essessey.hub import Access, StreamHub

# What a subscription that ended (after it was admitted) tells its client, in any
# transport: one table, here beside the refusals, for the bindings and the dialects.
__all__ = ["Admission", "Refusal", "SubscriptionEnd", "admit", "subscription_end"]


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a client is not admitted: ``status`` and ``error_type`` for an HTTP answer,
    ``close_code`` for a WebSocket, and ``message`` (never the request's content)."""

    status: int
    error_type: str
    message: str
    close_code: int


@dataclass(frozen=True, slots=True)
class Admission:
    """A client admitted to ``stream_id``, resuming after ``last_event_id`` (None: from
    the start), with the ``access`` it was allowed."""

    stream_id: str
    last_event_id: str | None
    access: Access


async def admit(
    hub: StreamHub,
    connection: Any,
    stream_id: str,
    last_event_id: str | None,
    log: logging.Logger,
    *,
    access: Access | None = None,
) -> Admission | Refusal:
    """Check ``stream_id`` and the ``last_event_id`` a client gave (``""`` is none), then
    ask ``hub``'s ``authorize`` hook about ``connection`` (the request or socket)."""
    if not is_stream_id(stream_id):
        return Refusal(400, "invalid_request_error", "invalid stream id", 4400)
    try:
        resume = resume_point(last_event_id)
    except ValueError as exc:
        return Refusal(400, "invalid_request_error", str(exc), 4400)
    if access is None:
        access = "resume" if resume is not None else "read"
    allowed = await check_access(hub, connection, stream_id, access, log)
    if allowed is None:
        return Refusal(503, "api_error", CHECK_FAILED, 1013)
    if not allowed:
        return Refusal(403, "permission_error", f"not allowed to {access} this stream", 4403)
    return Admission(stream_id, resume, access)


set_public_module(__name__, globals(), __all__)
