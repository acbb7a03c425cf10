"""The agui dialect's requests and routes (see the package)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Unpack

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from essessey.bindings.admission import Refusal, admit
from essessey.bindings.http import json_error
from essessey.bindings.sse import SSEOptions, requested_resume_point, stream_response
from essessey.dialects._routes import make_producer, read_request
from essessey.dialects.agui._encoder import (
    AGUIEncoder,
    error_object,
    run_stream_id,
)
from essessey.errors import StreamBusy
from essessey.hub import StreamHub
from essessey.publisher import TurnProducer

__all__ = ["AGUIRunRequest", "AGUITurnFactory", "agui_routes", "parse_run_agent_input"]

logger = logging.getLogger("essessey.dialects.agui")


@dataclass(frozen=True, slots=True)
class AGUIRunRequest:
    """A validated ``RunAgentInput``: the hub stream its run is served from (``id``), the
    ``thread_id`` and ``run_id`` the client chose, its ``messages`` and the whole JSON
    ``body`` (``tools``, ``context``, ``state``, ``forwardedProps``), as sent."""

    id: str
    thread_id: str
    run_id: str
    messages: list[Any]
    body: dict[str, Any] = field(default_factory=dict)


AGUITurnFactory = Callable[[AGUIRunRequest], "TurnProducer | Awaitable[TurnProducer]"]
"""``turn(run) -> producer``: the agent's answer to a run, as a hub producer; a
``ValueError`` it raises is the client's 400."""

DEFAULT_MAX_BODY: Final = 4 * 1024 * 1024


def parse_run_agent_input(body: Any) -> AGUIRunRequest:
    """An :class:`AGUIRunRequest` from a parsed ``RunAgentInput`` body; ``ValueError``
    naming the first problem."""
    if not isinstance(body, dict):
        raise ValueError("the request body must be a JSON object (a RunAgentInput)")
    thread_id, run_id = body.get("threadId"), body.get("runId")
    if not isinstance(thread_id, str) or not thread_id:
        raise ValueError("threadId: a non-empty string is required")
    if not isinstance(run_id, str) or not run_id:
        raise ValueError("runId: a non-empty string is required")
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ValueError("messages: a list of message objects is required")
    return AGUIRunRequest(run_stream_id(thread_id, run_id), thread_id, run_id, messages, body)


def agui_routes(
    hub: StreamHub,
    turn: AGUITurnFactory,
    *,
    path: str = "/agui",
    max_body: int = DEFAULT_MAX_BODY,
    **options: Unpack[SSEOptions],
) -> Sequence[BaseRoute]:
    """A Starlette route serving AG-UI runs from ``hub``: ``POST {path}`` of a
    ``RunAgentInput`` (what ``@ag-ui/client``'s ``HttpAgent`` sends). A new run's turn
    (``turn(run)``) runs on the hub and streams as AG-UI events. The same run posted
    again (its ``threadId`` and ``runId``), on any replica, is served from the hub
    instead of starting anew: after its ``Last-Event-ID`` when the client sends one,
    else from its start. Errors before the stream are JSON ``RUN_ERROR`` objects (400 for
    a bad body). ``options`` go to the SSE response."""
    if max_body <= 0:
        raise ValueError("max_body must be > 0")
    headers = dict(options.get("headers") or {})

    def refuse(status: int, error_type: str, message: str) -> Response:
        return json_error(status, error_type, message, headers, shape=error_object)

    async def run(request: Request) -> Response:
        parsed = await read_request(
            request, parse_run_agent_input, limit=max_body, shape=error_object, headers=headers
        )
        if isinstance(parsed, Response):
            return parsed
        given = requested_resume_point(request)
        verdict = await admit(hub, request, parsed.id, given, logger)
        if isinstance(verdict, Refusal):
            return refuse(verdict.status, verdict.error_type, verdict.message)
        encoder = AGUIEncoder(parsed.thread_id, parsed.run_id)
        if verdict.last_event_id is None and not await hub.store.exists(parsed.id):
            try:
                producer = await make_producer(turn, parsed)
            except ValueError as exc:  # the app's own options, refused
                return refuse(400, "invalid_request_error", str(exc))
            # Posted twice at once: the second reads the first's run.
            with contextlib.suppress(StreamBusy):
                await hub.start(parsed.id, producer)
        return stream_response(
            hub,
            parsed.id,
            verdict.last_event_id,
            encoder=encoder,
            error_shape=error_object,
            **options,
        )

    return [Route(path, run, methods=["POST"])]
