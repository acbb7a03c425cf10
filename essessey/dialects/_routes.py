"""What the dialects' routes share: reading a request into the dialect's own request
object, and starting the turn that answers it, each refusal in the dialect's own error
shape (a bad body, a refusal of ``authorize``, options the app refuses: 400, 403, 503). A
store that cannot take another turn, or cannot be reached, is each route's
``store_guarded`` (essessey.bindings.http): 503."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from essessey.bindings.admission import Admission, Refusal, admit
from essessey.bindings.http import BadRequest, json_error, read_json
from essessey.bindings.sse import ErrorShape
from essessey.errors import StreamNotFound
from essessey.hub import StreamHub
from essessey.protocol.asking import Waiting
from essessey.publisher import TurnProducer

__all__ = [
    "MAX_ANSWER_IDS_LOOKED_UP",
    "MAX_ASKING_LOOKED_AT",
    "WHOLE_BUILDS_AT_ONCE",
    "Asking",
    "WholeBuilds",
    "answered_stream",
    "make_producer",
    "other_methods",
    "read_request",
    "start_turn",
]

logger = logging.getLogger("essessey.dialects")

MAX_ASKING_LOOKED_AT: Final = 256
"""The turns that asked an answer's ids that :func:`answered_stream` looks at, the latest
first."""

MAX_ANSWER_IDS_LOOKED_UP: Final = 1024
"""The distinct request ids of one answer that :func:`answered_stream` looks up, those
given last: each is a read of the store, and a body may repeat one or name thousands."""

WHOLE_BUILDS_AT_ONCE: Final = 4
"""Whole answers (a request without ``stream``, a retrieve) a dialect's routes build from
a stream's log at once: each holds the stream's events while it builds, so a crowd of
small requests for one long turn would hold its log once per request."""

_METHODS: Final = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


class WholeBuilds:
    """The gate of a dialect's routes around reading a stream whole and building its
    answer: at most :data:`WHOLE_BUILDS_AT_ONCE` at a time, the rest wait their turn."""

    __slots__ = ("_gate",)

    def __init__(self) -> None:
        # Made on first use, in the event loop that serves the routes.
        self._gate: anyio.Semaphore | None = None

    def __call__(self) -> anyio.Semaphore:
        gate = self._gate
        if gate is None:
            gate = self._gate = anyio.Semaphore(WHOLE_BUILDS_AT_ONCE)
        return gate


_Request = TypeVar("_Request")


def other_methods(
    path: str, allowed: Sequence[str], headers: Mapping[str, str] | None, shape: ErrorShape
) -> Route:
    """The route of the methods ``path`` does not take: a 405 in the dialect's error
    shape, with its ``Allow`` header (Starlette's own 405 is text, which a dialect's
    client cannot read as its error)."""
    taken = {*allowed, "HEAD"} if "GET" in allowed else set(allowed)
    allow = ", ".join(sorted(taken))

    async def refuse(request: Request) -> Response:
        message = f"{request.method} is not allowed here; use {allow}"
        refused = json_error(405, "invalid_request_error", message, headers, shape=shape)
        refused.headers["Allow"] = allow
        return refused

    return Route(path, refuse, methods=[m for m in _METHODS if m not in taken])


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
    await hub.start(stream_id, producer)  # a refusing store: the route's store_guarded
    return None


@dataclass(frozen=True, slots=True)
class Asking:
    """The stream an answer is for: the client admitted to it (``answer`` access, its
    resume point checked) and what its turn asked, read once."""

    admission: Admission
    asked: Waiting


async def answered_stream(
    hub: StreamHub,
    connection: Any,
    request_ids: Sequence[str],
    log: logging.Logger,
    *,
    last_event_id: str | None = None,
) -> Asking | Refusal | None:
    """The stream whose turn the answers to ``request_ids`` are for, when a dialect's
    answers name only the requests (Chat Completions' ``tool`` messages, AG-UI's
    interrupts): of the streams that asked any of them (:meth:`StreamHub.asking_streams`),
    those ``connection`` may answer (``authorize``, ``answer`` access, resuming after
    ``last_event_id``), then the one whose turn still waits, the one that asked every
    request answered when several do; else the latest that was answered already (the
    same answers again get its continuation again). None when no kept stream asked any
    of them that ``connection`` may answer (a stream the hook refuses it counts as none:
    the answer must not tell a stranger that another owner's turn waits for these ids);
    the refusal of :func:`admit` when it failed for them all (a bad ``last_event_id``, a
    hook that raised), or a 409 when several turns wait for the same answers.

    A model's call ids are not unique across turns (``functions.get_weather:0``), so
    the answers of one turn never go to another that asked the same ids."""
    candidates: dict[str, None] = {}
    # Each id once, by its last place in the answers: the latest are the turn's own.
    distinct = list(dict.fromkeys(reversed(request_ids)))[:MAX_ANSWER_IDS_LOOKED_UP]
    for request_id in reversed(distinct):
        candidates.update(dict.fromkeys(await hub.asking_streams(request_id)))
    given = set(request_ids)
    # The latest turns that asked: an id every turn reuses has asked in many, and each
    # looked at is read from the store.
    candidates = dict.fromkeys(list(candidates)[:MAX_ASKING_LOOKED_AT])
    waiting: list[tuple[Asking, bool]] = []  # and whether it asked every id given
    answered: list[Asking] = []
    refused: Refusal | None = None
    for stream_id in candidates:
        try:
            asked = await hub.waiting(stream_id)
        except StreamNotFound:
            continue
        if asked is None:
            continue
        ids = {request.id for request in asked.requests}
        if not ids & given:
            continue
        verdict = await admit(hub, connection, stream_id, last_event_id, log, access="answer")
        if isinstance(verdict, Refusal):
            if verdict.status != 403:
                refused = refused or verdict
            # A stream the hook keeps from this client is not told apart from none: the
            # answer would say that some other owner's turn waits for these ids.
            continue
        if asked.continued:
            answered.append(Asking(verdict, asked))
        else:
            waiting.append((Asking(verdict, asked), ids <= given))
    if len(waiting) > 1:
        waiting = [entry for entry in waiting if entry[1]]
    if len(waiting) > 1:
        message = (
            "several turns wait for requests of these ids; answer through the stream's own route"
        )
        return Refusal(409, "invalid_request_error", message, 4409)
    if waiting:
        return waiting[0][0]
    if answered:
        return answered[0]
    return refused
