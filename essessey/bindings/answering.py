"""Taking an answer over HTTP: the route through which a client answers what a stream
asks (docs/asking.md), for the protocol's SSE and WebSocket clients alike.

``POST {prefix}/{stream_id}/answer`` with ``{"answers": [...]}`` (see
``essessey.protocol.asking.parse_answers``) continues the stream's turn through
:meth:`~essessey.StreamHub.answer` and answers ``200`` with
``{"stream_id", "after", "started"}``: the client then reads the continuation by
resuming the stream after ``after`` (an EventSource with ``?last_event_id=``, a
WebSocket with its ``last_event_id`` query parameter). The same answer sent again is a
200 with ``"started": false`` and the same ``after``. Refusals, in the Anthropic error
shape:

=========================================  ======  ===========================
case                                       status  ``error.type``
=========================================  ======  ===========================
bad body, unknown request, one left out    400     ``invalid_request_error``
not authorised (access ``"answer"``)       403     ``permission_error``
no such stream                             404     ``not_found_error``
asks nothing, answered otherwise, expired  409     ``conflict_error``
=========================================  ======  ===========================
"""

from __future__ import annotations

import logging
from typing import Any, Final

import orjson

from essessey._public import missing_extra, set_public_module

try:
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route
except ModuleNotFoundError as exc:  # the server extra is not installed
    raise missing_extra(__name__, exc, extra="server") from None

from essessey.bindings.admission import Refusal, admit
from essessey.bindings.http import BadRequest, json_error, read_json
from essessey.errors import AnswerRefused, StreamNotFound
from essessey.hub import StreamHub
from essessey.protocol.asking import parse_answers

__all__ = ["MAX_ANSWER_BODY", "answer_response", "answer_route"]

logger = logging.getLogger("essessey.bindings")

MAX_ANSWER_BODY: Final = 1024 * 1024
"""Bytes of an answer's body taken (a client tool's output can be large)."""


def _error_type(refusal: AnswerRefused) -> str:
    return "invalid_request_error" if refusal.status == 400 else "conflict_error"


async def answer_response(hub: StreamHub, request: Request, stream_id: str) -> Response:
    """Answer what ``stream_id`` asks with the request's JSON body (see the module)."""
    admitted = await admit(hub, request, stream_id, None, logger, access="answer")
    if isinstance(admitted, Refusal):
        return json_error(admitted.status, admitted.error_type, admitted.message)
    try:
        answers = parse_answers(await read_json(request, limit=MAX_ANSWER_BODY))
        continued = await hub.answer(stream_id, answers)
    except BadRequest as exc:
        return exc.answer()
    except StreamNotFound:
        return json_error(404, "not_found_error", f"no stream {stream_id!r}")
    except AnswerRefused as exc:
        logger.info("an answer to %s was refused: %s", stream_id, exc.code)
        return json_error(exc.status, _error_type(exc), str(exc))
    body: dict[str, Any] = {"stream_id": continued.stream_id, "after": continued.after}
    body["started"] = continued.started
    return Response(orjson.dumps(body), 200, media_type="application/json")


def answer_route(hub: StreamHub, path: str = "/streams/{stream_id}/answer") -> Route:
    """The answer route alone, for an app that serves its streams with ``ws_route`` and
    not ``hub_routes`` (which has it): ``path`` must have ``{stream_id}``."""
    if "{stream_id}" not in path:
        raise ValueError("the answer route's path needs {stream_id}")

    async def answer(request: Request) -> Response:
        return await answer_response(hub, request, request.path_params["stream_id"])

    return Route(path, answer, methods=["POST"])


set_public_module(__name__, globals(), __all__)
