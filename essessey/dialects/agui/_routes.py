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
from essessey.bindings.http import json_error, store_guarded
from essessey.bindings.sse import SSEOptions, requested_resume_point, stream_response
from essessey.dialects._payload import answer_value, content_text
from essessey.dialects._routes import (
    answered_stream,
    make_producer,
    other_methods,
    read_request,
)
from essessey.dialects.agui._encoder import (
    AGUIEncoder,
    error_object,
    run_stream_id,
)
from essessey.errors import AnswerExpired, AnswerRefused, InvalidAnswer, StreamBusy, StreamNotFound
from essessey.hub import StreamHub
from essessey.protocol.asking import (
    Answer,
    ApprovalRequest,
    ClientToolCall,
    Question,
    QuestionAnswer,
    ToolApproval,
    ToolOutput,
    Waiting,
)
from essessey.publisher import TurnProducer

__all__ = [
    "AGUIRunRequest",
    "AGUITurnFactory",
    "ResumeEntry",
    "agui_routes",
    "answering_tool_messages",
    "parse_resume",
    "parse_run_agent_input",
    "resume_answers",
]

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
    try:
        stream_id = run_stream_id(thread_id, run_id)
    except TypeError:  # a lone surrogate, which a body orjson parsed never holds
        raise ValueError("threadId and runId: text is required") from None
    return AGUIRunRequest(stream_id, thread_id, run_id, messages, body)


# -- answers (docs/asking.md) --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResumeEntry:
    """One entry of a ``RunAgentInput``'s ``resume``: the answer to the interrupt
    ``interrupt_id``, ``resolved`` (with its ``payload``) or ``cancelled``."""

    interrupt_id: str
    status: str
    payload: Any = None


_STATUSES: Final = frozenset({"resolved", "cancelled"})


def parse_resume(body: dict[str, Any]) -> list[ResumeEntry]:
    """The ``resume`` entries of a ``RunAgentInput`` (none when it has no ``resume``);
    ``ValueError`` naming the first entry that is not one (never its payload)."""
    items = body.get("resume")
    if items is None:
        return []
    if not isinstance(items, list):
        raise ValueError("resume: a list of resume entries is required")
    found: list[ResumeEntry] = []
    for n, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"resume.{n}: an object is required")
        key, status = item.get("interruptId"), item.get("status")
        if not isinstance(key, str) or not key:
            raise ValueError(f"resume.{n}.interruptId: a non-empty string is required")
        if not isinstance(status, str) or status not in _STATUSES:
            raise ValueError(f'resume.{n}.status: "resolved" or "cancelled" is required')
        found.append(ResumeEntry(key, status, item.get("payload")))
    return found


def answering_tool_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """The ``tool`` messages that end ``messages``: the outputs of the client's tools a
    run may answer a turn with (empty when the last message is not a tool message)."""
    found: list[dict[str, Any]] = []
    for message in reversed(messages):
        if message.get("role") != "tool":
            break
        found.append(message)
    found.reverse()
    return found


def _approval(n: int, entry: ResumeEntry) -> ToolApproval:
    """A resume entry's answer to an approval request (see :func:`resume_answers`)."""
    key, payload = entry.interrupt_id, entry.payload
    if entry.status == "cancelled":
        return ToolApproval(key, False)
    if payload is None:
        return ToolApproval(key, True)
    if isinstance(payload, bool):
        return ToolApproval(key, payload)
    approved = payload.get("approved") if isinstance(payload, dict) else None
    reason = payload.get("reason") if isinstance(payload, dict) else None
    if not isinstance(approved, bool) or not (reason is None or isinstance(reason, str)):
        raise InvalidAnswer(
            f"resume.{n} answers an approval: its payload is "
            '{"approved": true|false, "reason"?: "..."} (or none, to approve)'
        )
    return ToolApproval(key, approved, reason)


def resume_answers(
    entries: Sequence[ResumeEntry], tool_messages: Sequence[dict[str, Any]], asked: Waiting | None
) -> list[Answer]:
    """The answers a run gives to what ``asked`` asks (docs/dialects.md, AG-UI):

    - a resume entry for an approval's interrupt: ``resolved`` approves, unless its
      payload is ``{"approved": false, "reason"?: str}`` (or ``false``); ``cancelled``
      denies;
    - for a question's interrupt: ``resolved``, its payload is the answer; ``cancelled``,
      the answer is None;
    - for a client call (named by its tool call id): ``resolved``, the payload is its
      output; ``cancelled``, an error output;
    - a ``tool`` message for a client call the stream waits for: its content, JSON-decoded
      when it is JSON, an error output when the message has an ``error`` (other tool
      messages are the thread's history, not answers).

    :class:`~essessey.InvalidAnswer` for an entry that answers nothing ``asked`` asks, or
    without what it needs (its content never echoed)."""
    found: list[Answer] = []
    answered: set[str] = set()
    for n, entry in enumerate(entries):
        key = entry.interrupt_id
        request = asked.request(key) if asked is not None else None
        answered.add(key)
        if isinstance(request, ApprovalRequest):
            found.append(_approval(n, entry))
        elif isinstance(request, Question):
            value = entry.payload if entry.status == "resolved" else None
            found.append(QuestionAnswer(key, value))
        elif isinstance(request, ClientToolCall):
            if entry.status == "resolved":
                found.append(ToolOutput(key, entry.payload))
            else:
                found.append(ToolOutput(key, "cancelled by the user", is_error=True))
        else:
            raise InvalidAnswer(f"resume.{n}: the stream does not wait for interrupt {key!r}")
    calls = {
        request.id
        for request in (asked.requests if asked is not None else ())
        if isinstance(request, ClientToolCall)
    }
    for message in tool_messages:
        call = message.get("toolCallId")
        if not isinstance(call, str) or call not in calls or call in answered:
            continue
        text = content_text(message.get("content"))
        error = message.get("error")
        if text is None:
            raise InvalidAnswer(f"the tool message for {call!r} needs a text content")
        answered.add(call)
        if isinstance(error, str):
            found.append(ToolOutput(call, answer_value(text) if text else error, is_error=True))
        else:
            found.append(ToolOutput(call, answer_value(text)))
    return found


def _abandoned(entries: Sequence[ResumeEntry], answers: Sequence[Answer]) -> bool:
    """Whether a run only cancels interrupts (it gives no client call's output)."""
    cancels = bool(entries) and all(entry.status == "cancelled" for entry in entries)
    return cancels and not any(isinstance(answer, ToolOutput) for answer in answers)


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
    a bad body). ``options`` go to the SSE response.

    A turn that asks (docs/asking.md) ends its run with an interrupt outcome (or, asking
    only for client calls, with the calls pending). With ``StreamHub(on_answer=...)``, a
    run whose ``resume`` answers those interrupts, or whose messages end with ``tool``
    messages for those calls, continues the turn: the hub finds the stream that asked
    (:meth:`~essessey.StreamHub.asking_stream`), takes the answers
    (:func:`resume_answers`, :meth:`~essessey.StreamHub.answer`) and this run streams the
    continuation, from ``RUN_STARTED`` to ``RUN_FINISHED``. The same answers again (a
    retried run, with its ``Last-Event-ID`` or not) get the same continuation; a refused
    answer is a ``RUN_ERROR`` object with its status and ``code`` (400 ``invalid_answer``,
    409 ``already_answered``, ``not_waiting``, ``answer_expired``), an interrupt no kept
    stream asked a 400. Tool messages no kept stream waits for are history: the run goes
    to ``turn`` as any other; so does a run whose every resume entry is ``cancelled``
    and whose interrupts have expired."""
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
        if hub.on_answer is not None:
            answered = await answer(request, parsed)
            if answered is not None:
                return answered
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

    async def answer(request: Request, parsed: AGUIRunRequest) -> Response | None:
        """The continuation of the turn the run's resume entries or tool messages answer
        (see above); None for any other run."""
        try:
            entries = parse_resume(parsed.body)
        except ValueError as exc:
            return refuse(400, "invalid_request_error", str(exc))
        tool_messages = answering_tool_messages(parsed.messages)
        keys = [entry.interrupt_id for entry in entries]
        keys += [m["toolCallId"] for m in tool_messages if isinstance(m.get("toolCallId"), str)]
        given = requested_resume_point(request)
        found = await answered_stream(hub, request, keys, logger, last_event_id=given)
        if found is None:
            if not entries:
                return None  # tool messages of the thread's history: a run as any other
            unknown = "no stream kept waits for these interrupts"
            return refuse(400, "invalid_answer", unknown)
        if isinstance(found, Refusal):
            return refuse(found.status, found.error_type, found.message)
        stream_id, asked = found.admission.stream_id, found.asked
        answers: list[Answer] = []
        try:
            answers = resume_answers(entries, tool_messages, asked)
            if not entries and not answers:
                return None  # the tool messages answer nothing it waits for
            continued = await hub.answer(stream_id, answers)
        except StreamNotFound:
            return refuse(404, "not_found_error", "the stream that asked is no longer kept")
        except AnswerRefused as exc:
            if isinstance(exc, AnswerExpired) and _abandoned(entries, answers):
                return None  # abandoned: the thread goes on with a run as any other
            logger.info("an answer to %s was refused: %s", stream_id, exc.code)
            return refuse(exc.status, exc.code, str(exc))
        calls = [r.id for r in asked.requests if isinstance(r, ClientToolCall)]
        after = continued.after
        encoder = AGUIEncoder(parsed.thread_id, parsed.run_id, after=after, answered_calls=calls)
        return stream_response(
            hub,
            stream_id,
            found.admission.last_event_id or after,
            encoder=encoder,
            error_shape=error_object,
            **options,
        )

    return [
        Route(path, store_guarded(run, headers, shape=error_object), methods=["POST"]),
        other_methods(path, ["POST"], headers, error_object),
    ]
