"""The steps of a ``useChat`` request, whichever transport carries it (docs/ui.md).

The AI SDK's chat transports ask the same three things: send a chat request (a new turn,
or the answers to the turn that waits), reconnect to the chat's turn, stop it. Over HTTP
they are routes (``_routes``), over a WebSocket request frames (``_websocket``); both ask
:class:`Chats`, which answers with what to stream (a :class:`Plan`) or why not (a
:class:`Failure`, an HTTP status with the error's type and message).

Which turn a chat is on is one small event per turn in the stream ``<chat id>~turns``,
and one more when it finishes, so any replica with the same store finds it.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
import orjson

from essessey._ids import MAX_ID_LENGTH, is_stream_id
from essessey.bindings.admission import Refusal, admit
from essessey.dialects.ui._encoder import UIMessageEncoder
from essessey.errors import AnswerRefused, InvalidAnswer, StreamBusy, StreamNotFound
from essessey.event import Event
from essessey.hub import Access, Continuation, StreamHub, TurnProducer
from essessey.protocol.asking import (
    Answer,
    Answered,
    ApprovalRequest,
    ClientToolCall,
    Question,
    QuestionAnswer,
    ToolApproval,
    ToolOutput,
    Waiting,
)
from essessey.publisher import Publisher

__all__ = [
    "ChatRequest",
    "Chats",
    "Failure",
    "Plan",
    "TurnFactory",
    "chat_request",
    "is_chat_id",
    "parse_chat_request",
    "ui_answers",
]

logger = logging.getLogger("essessey.dialects.ui")

TRIGGERS: Final = frozenset({"submit-message", "regenerate-message"})
_TURNS: Final = "~turns"
_TURN_EVENT: Final = "turn"
_FINISHED_EVENT: Final = "finished"
# The key a chat's new turn starts under (StreamHub.exclusive).
_STARTING: Final = "~start"
_TURN_BYTES: Final = 8  # of randomness in a turn's stream id, "<chat id>~<hex>"
_MAX_CHAT_ID: Final = MAX_ID_LENGTH - max(len(_TURNS), len(_STARTING), 1 + 2 * _TURN_BYTES)


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A validated chat request of the AI SDK: the chat's ``id``, its ``messages`` (UI
    messages as sent), the ``trigger``, the ``message_id`` to regenerate (if any), the
    whole JSON ``body`` (where an app's own options travel) and the request's
    ``headers``, names in lower case (over the WebSocket transport, its request frame's)."""

    id: str
    messages: list[dict[str, Any]]
    trigger: str
    message_id: str | None = None
    body: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


TurnFactory = Callable[[ChatRequest], "TurnProducer | Awaitable[TurnProducer]"]
"""``turn(chat) -> producer``: the answer to a chat request, as a hub producer; a
``ValueError`` it raises (options of the app's own that are wrong) is the client's 400."""


def is_chat_id(value: object) -> bool:
    """A chat id leaves room for the suffixes of its streams (``~turns``, ``~start``, a
    turn's ``~<16 hex digits>``)."""
    return isinstance(value, str) and len(value) <= _MAX_CHAT_ID and is_stream_id(value)


def chat_request(body: object, headers: dict[str, str] | None = None) -> ChatRequest:
    """A :class:`ChatRequest` from a request's decoded JSON; ``ValueError`` saying what is
    wrong."""
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    chat_id = body.get("id")
    if not is_chat_id(chat_id):
        raise ValueError(
            f"id must be 1 to {_MAX_CHAT_ID} printable characters without whitespace, "
            "'.', '*' or '>'"
        )
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and m.get("role") in ("user", "assistant", "system") for m in messages
    ):
        raise ValueError("messages must be a list of UI messages, each with a role")
    trigger = body.get("trigger", "submit-message")
    if not isinstance(trigger, str) or trigger not in TRIGGERS:
        raise ValueError("trigger must be 'submit-message' or 'regenerate-message'")
    message_id = body.get("messageId")
    if message_id is not None and not isinstance(message_id, str):
        raise ValueError("messageId must be a string")
    return ChatRequest(str(chat_id), messages, trigger, message_id, body, headers or {})


def parse_chat_request(raw: bytes) -> ChatRequest:
    """A :class:`ChatRequest` from a request body; ``ValueError`` saying what is wrong."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise ValueError("the body is not JSON") from None
    return chat_request(body)


_ANSWERED_STATES: Final = frozenset({"output-available", "output-error"})
_APPROVED_STATES: Final = frozenset(
    {"approval-responded", "output-available", "output-error", "output-denied"}
)


def _tool_parts(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool parts of a UI message (``tool-<name>``, ``dynamic-tool``)."""
    parts = message.get("parts")
    if not isinstance(parts, list):
        return []
    return [
        part
        for part in parts
        if isinstance(part, dict)
        and isinstance(kind := part.get("type"), str)
        and (kind.startswith("tool-") or kind == "dynamic-tool")
    ]


def _approval(part: dict[str, Any], asked: Waiting) -> ToolApproval | None:
    """The answer a part's ``approval`` gives to one of ``asked``'s approval requests."""
    approval = part.get("approval")
    state = part.get("state")
    if not isinstance(approval, dict) or not isinstance(state, str):
        return None
    if state not in _APPROVED_STATES:
        return None
    key = approval.get("id")
    if not isinstance(key, str) or not isinstance(asked.request(key), ApprovalRequest):
        return None
    approved = approval.get("approved")
    if not isinstance(approved, bool):
        # It answers the request, wrongly: refused, never read as answering nothing
        # (which would run the user's message again as a new turn).
        raise InvalidAnswer(f"the approval {key!r} needs a boolean approved")
    reason = approval.get("reason")
    return ToolApproval(key, approved, reason if isinstance(reason, str) else None)


def ui_answers(message: dict[str, Any], asked: Waiting) -> list[Answer]:
    """The answers a UI message (the asking assistant message, as the client sends it
    back) gives to what ``asked`` asks: an approval's ``approval`` (``approved``,
    ``reason``) once responded; a client call's output (``output-error``: its
    ``errorText``, an error); a question's (``ask_user``) output, as it is (``null`` for
    an ``output-error``). Parts that answer nothing asked are left out.
    :class:`~essessey.InvalidAnswer` for an approval of a request asked whose
    ``approved`` is not a boolean."""
    found: list[Answer] = []
    for part in _tool_parts(message):
        approval = _approval(part, asked)
        if approval is not None:
            found.append(approval)
            continue
        key = part.get("toolCallId")
        state = part.get("state")
        if not isinstance(key, str) or not isinstance(state, str) or state not in _ANSWERED_STATES:
            continue
        request = asked.request(key)
        failed = state == "output-error"
        if isinstance(request, ClientToolCall):
            if failed:
                error = part.get("errorText")
                found.append(ToolOutput(key, error if isinstance(error, str) else "", True))
            else:
                found.append(ToolOutput(key, part.get("output")))
        elif isinstance(request, Question):
            # An error output (the user dismissed the question, a client's generic tool
            # handler failed) answers it with no value, as AG-UI's cancelled does.
            found.append(QuestionAnswer(key, None if failed else part.get("output")))
    return found


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a chat request is not served: an HTTP ``status``, the error's ``error_type``
    and ``message`` (never the request's content), and a refused answer's ``code``."""

    status: int
    error_type: str
    message: str
    code: str | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    """What a chat request streams: the turn ``turn_id`` after ``last_event_id`` (None:
    from its start); for a continuation, the id it goes on ``after`` and what the turn
    ``asked``."""

    turn_id: str
    last_event_id: str | None = None
    after: str | None = None
    asked: Waiting | None = None

    @property
    def resume_point(self) -> str | None:
        """The id the stream is read after: a continuation's ``after``, else the client's."""
        return self.after if self.after is not None else self.last_event_id

    def encoder(self) -> UIMessageEncoder:
        """The turn's UI message encoder: one per stream, named after the turn."""
        calls = {}
        if self.asked is not None:
            calls = {
                r.id: r.tool_use_id for r in self.asked.requests if isinstance(r, ApprovalRequest)
            }
        return UIMessageEncoder(message_id=self.turn_id, after=self.after, approval_calls=calls)


def _announced(hub: StreamHub, chat_id: str, turn_id: str, producer: TurnProducer) -> TurnProducer:
    """``producer``, then a mark in the chat's turns that its turn finished (on the
    replica it ran on, whichever serves the reconnect)."""

    async def run(publisher: Publisher) -> None:
        try:
            await producer(publisher)
        finally:
            # Shielded: a cancelled turn is finished too, and its mark must be written.
            with anyio.CancelScope(shield=True):
                finished = Event(_FINISHED_EVENT, turn_id.encode())
                await hub.record(chat_id + _TURNS, finished)

    return run


def _announced_continuation(
    hub: StreamHub, chat_id: str, turn_id: str, go_on: Continuation
) -> Continuation:
    """``go_on``, between the marks that the chat's turn runs again and that it finished
    (a reconnect on any replica finds the continuation running)."""

    async def run(publisher: Publisher, answered: Answered) -> None:
        await hub.record(chat_id + _TURNS, Event(_TURN_EVENT, turn_id.encode()))
        try:
            await go_on(publisher, answered)
        finally:
            with anyio.CancelScope(shield=True):
                finished = Event(_FINISHED_EVENT, turn_id.encode())
                await hub.record(chat_id + _TURNS, finished)

    return run


class Chats:
    """The chats of one hub: a request sent, a reconnect, a stop, each admitted as the
    hub's ``authorize`` hook says (asked with the chat id and ``connection``, the HTTP
    request or the WebSocket)."""

    def __init__(self, hub: StreamHub, turn: TurnFactory, *, replay_finished: bool) -> None:
        self.hub = hub
        self.turn = turn
        self.replay_finished = replay_finished

    async def _admitted(
        self, connection: Any, chat_id: str, access: Access, last_event_id: str | None = None
    ) -> Failure | str | None:
        """The refusal, or the resume point allowed."""
        verdict = await admit(self.hub, connection, chat_id, last_event_id, logger, access=access)
        if isinstance(verdict, Refusal):
            return Failure(verdict.status, verdict.error_type, verdict.message)
        return verdict.last_event_id

    async def _last_turn(self, chat_id: str) -> tuple[str, bool] | None:
        """The chat's last turn the store holds, and whether it finished."""
        store = self.hub.store
        events, known = await store.since(chat_id + _TURNS, None)
        if not known or not events:
            return None
        last = events[-1]
        turn_id = last.data.decode()
        if not await store.exists(turn_id):
            return None
        return turn_id, last.event == _FINISHED_EVENT

    async def _waits(self, turn_id: str) -> Waiting | None:
        """What the finished turn ``turn_id`` waits for, while no answer continued it."""
        try:
            asked = await self.hub.waiting(turn_id)
        except StreamNotFound:
            return None
        return asked if asked is not None and not asked.continued else None

    async def _answer(self, connection: Any, request: ChatRequest) -> Plan | Failure | None:
        """The continuation of the chat's waiting turn that the request's last message
        answers; None for a request that answers nothing."""
        hub = self.hub
        go_on = hub.on_answer
        messages = request.messages
        if go_on is None or request.trigger != "submit-message" or not messages:
            return None
        last_message = messages[-1]
        if last_message.get("role") != "assistant" or not _tool_parts(last_message):
            return None
        last = await self._last_turn(request.id)
        if last is None:
            return None
        turn_id = last[0]
        try:
            asked = await hub.waiting(turn_id)
            answers = ui_answers(last_message, asked) if asked is not None else []
            if not answers or asked is None:
                return None
            refused = await self._admitted(connection, request.id, "answer")
            if isinstance(refused, Failure):
                return refused
            marked = _announced_continuation(hub, request.id, turn_id, go_on)
            continued = await hub.answer(turn_id, answers, continuation=marked)
        except StreamNotFound:
            return Failure(404, "not_found_error", "the turn that asked is no longer kept")
        except AnswerRefused as exc:
            logger.info("an answer to %s was refused: %s", turn_id, exc.code)
            return Failure(exc.status, "invalid_request_error", str(exc), exc.code)
        return Plan(turn_id, after=continued.after, asked=asked)

    async def send(self, connection: Any, request: ChatRequest) -> Plan | Failure:
        """A chat request: the continuation it answers, or a new turn on the hub (under
        a stream id of its own, ``<chat id>~<random>``); refused (409) while the chat's
        turn runs, on this replica or, with a shared store, another."""
        refused = await self._admitted(connection, request.id, "read")
        if isinstance(refused, Failure):
            return refused
        answered = await self._answer(connection, request)
        if answered is not None:
            return answered
        busy = Failure(409, "invalid_request_error", "a turn is running on this chat")
        try:
            # Checked and started under the chat's hold, so that of two requests reaching
            # two replicas at once (a double click, a retry through the balancer) one
            # starts a turn; once started, the turn's own lease answers for it.
            async with self.hub.exclusive(request.id + _STARTING):
                last = await self._last_turn(request.id)
                # A finished turn may run again: an answer continues it.
                if last is not None and await self.hub.running_anywhere(last[0]):
                    return busy
                return await self._start(request)
        except StreamBusy:
            return busy  # another request for the chat is starting its turn

    async def _start(self, request: ChatRequest) -> Plan | Failure:
        """A new turn answering ``request``, under a stream id of its own."""
        try:
            made = self.turn(request)
            producer = made if callable(made) else await made
        except ValueError as exc:  # the app's own options, refused
            return Failure(400, "invalid_request_error", str(exc))
        hub = self.hub
        turn_id = f"{request.id}~{secrets.token_hex(_TURN_BYTES)}"
        # The chat's mark first: a turn the store then refuses is one the reconnect does
        # not find (its stream does not exist). A refusing store is each transport's
        # 503 (store_guarded, and the WebSocket endpoint's own catch).
        await hub.record(request.id + _TURNS, Event(_TURN_EVENT, turn_id.encode()))
        await hub.start(turn_id, _announced(hub, request.id, turn_id, producer))
        return Plan(turn_id)

    async def reconnect(
        self, connection: Any, chat_id: str, last_event_id: str | None
    ) -> Plan | Failure | None:
        """The chat's turn to replay (after ``last_event_id``) and follow; None when there
        is none to resume: no turn, or one that finished (unless ``replay_finished``) and
        waits for nothing."""
        if not is_chat_id(chat_id):
            return Failure(400, "invalid_request_error", "bad chat id")
        verdict = await self._admitted(connection, chat_id, "resume", last_event_id)
        if isinstance(verdict, Failure):
            return verdict
        last = await self._last_turn(chat_id)
        if last is None:
            return None
        turn_id, finished = last
        if finished and not self.replay_finished and not self.hub.running(turn_id):
            # A turn that asks is not over: it waits, and a reload shows what it asks.
            asked = await self._waits(turn_id)
            if asked is None:
                return None
            return Plan(turn_id, verdict, asked=asked)
        return Plan(turn_id, verdict)

    async def stop(self, connection: Any, chat_id: str) -> Failure | None:
        """Cancel the chat's running turn; the failure when it may not, or none runs."""
        if not is_chat_id(chat_id):
            return Failure(400, "invalid_request_error", "bad chat id")
        verdict = await self._admitted(connection, chat_id, "cancel")
        if isinstance(verdict, Failure):
            return verdict
        last = await self._last_turn(chat_id)
        if last is None or not await self.hub.cancel(last[0]):
            return Failure(404, "not_found_error", "no turn is running on this chat")
        return None
