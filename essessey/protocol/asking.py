"""Turns that ask: what a stream waits for, and the answers that continue it.

A message asks by ending with stop reason ``tool_use`` after blocks that say what it
waits for (docs/asking.md):

- a ``tool_use`` block with no ``tool_result`` in its message: a call the client runs
  (:class:`ClientToolCall`, answered by a :class:`ToolOutput`), exactly the Anthropic
  format's idiom;
- an ``approval_request`` block naming one of the message's calls: the producer runs the
  call once it is approved (:class:`ApprovalRequest`, answered by a :class:`ToolApproval`);
- a ``question`` block (:class:`Question`, answered by a :class:`QuestionAnswer`).

The answer continues the turn as a new message on the same stream, whose first blocks
record it: an ``approval_response`` or ``answer`` block per request, a ``tool_result`` per
client call. The record is what makes an answer count once: a second answer finds it and
is either the same (nothing more happens) or refused. :class:`AskReader` reads all of this
from a stream's events, for the hub (which takes answers) and for ``reassemble``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import orjson

from essessey._public import set_public_module
from essessey.errors import (
    AnswerConflict,
    AnswerExpired,
    InvalidAnswer,
    NotWaiting,
    SerializationError,
)
from essessey.event import Event
from essessey.protocol import (
    BlockStart,
    BlockStop,
    BlockType,
    Delta,
    ErrorRecord,
    MessageDelta,
    MessageStart,
    StopReason,
    answer_block_start,
    approval_response_block_start,
    read,
    result_text,
)

__all__ = [
    "Answer",
    "Answered",
    "ApprovalRequest",
    "AskReader",
    "ClientToolCall",
    "PendingRequest",
    "Question",
    "QuestionAnswer",
    "ToolApproval",
    "ToolOutput",
    "Waiting",
    "match_answers",
    "parse_answers",
    "waiting",
]

logger = logging.getLogger("essessey.protocol.asking")


# -- what a turn asks ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """The turn asks to approve its call ``tool_use_id`` (``name`` with ``input``, the
    arguments parsed; ``arguments`` as sent) before it runs it."""

    id: str
    tool_use_id: str
    name: str
    input: Any
    arguments: str = ""
    reason: str | None = None
    expires_at: int | None = None


@dataclass(frozen=True, slots=True)
class ClientToolCall:
    """A call the client runs: the turn waits for its output. ``id`` is the call's
    ``tool_use_id``; ``item_type`` the provider's own kind of call, if any."""

    id: str
    name: str
    input: Any
    arguments: str = ""
    item_type: str | None = None
    expires_at: None = None  # a client call is taken as long as its stream is kept

    @property
    def tool_use_id(self) -> str:
        """The call's id (the same as :attr:`id`)."""
        return self.id


@dataclass(frozen=True, slots=True)
class Question:
    """The turn asks its client ``question``; ``schema`` (a JSON schema) says what an
    answer looks like."""

    id: str
    question: str
    schema: Mapping[str, Any] | None = None
    expires_at: int | None = None
    tool_use_id: str | None = None
    """The call of the message whose run asks it (not the client's to run; its result
    comes after the answer), or None for a question of the turn's own."""


PendingRequest: TypeAlias = ApprovalRequest | ClientToolCall | Question
"""One thing a waiting stream asks."""


# -- the answers -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolApproval:
    """The answer to an :class:`ApprovalRequest`: approved or denied, with an optional
    reason from whoever decided."""

    request_id: str
    approved: bool
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """The answer to a :class:`ClientToolCall`: what the client's tool gave (any JSON;
    ``is_error`` when it failed)."""

    tool_use_id: str
    output: Any
    is_error: bool = False

    @property
    def request_id(self) -> str:
        """The call's id, which the request is known by."""
        return self.tool_use_id

    @property
    def text(self) -> str:
        """The output as the ``tool_result`` block carries it: a string as it is, any
        other value as JSON."""
        return result_text(self.output)


@dataclass(frozen=True, slots=True)
class QuestionAnswer:
    """The answer to a :class:`Question` (any JSON)."""

    request_id: str
    value: Any


Answer: TypeAlias = ToolApproval | ToolOutput | QuestionAnswer
"""One answer to one :data:`PendingRequest`."""

_KIND: dict[type[Any], type[Any]] = {
    ApprovalRequest: ToolApproval,
    ClientToolCall: ToolOutput,
    Question: QuestionAnswer,
}


@dataclass(frozen=True, slots=True)
class Waiting:
    """What a stream waits for: the requests of its last message that asks
    (``message_id``, written by ``model``), and, once a message continued it, the answers
    that message recorded (``answered``; None while it still waits)."""

    message_id: str | None
    model: str | None
    requests: tuple[PendingRequest, ...]
    answered: Mapping[str, Answer] | None = None
    last_event_id: str | None = None
    """The id of the asking message's last event: where a reader of the continuation
    resumes from."""
    continued: bool = False
    """Whether a message came after the asking one (``answered`` is None while that
    message has recorded no answer yet: it is being written, or it went on without)."""
    ran: frozenset[str] = frozenset()
    """The calls of the asking message that have their result in it (the turn ran them):
    a client that answers every call it was shown answers these too, which asks nothing."""

    @property
    def recorded(self) -> bool:
        """Whether the message that continued the stream recorded an answer to every
        request: while it is being written (on another replica, say), it may have
        recorded some or none yet."""
        answered = self.answered
        return answered is not None and all(r.id in answered for r in self.requests)

    def request(self, request_id: str) -> PendingRequest | None:
        """The request ``request_id``, or None."""
        for request in self.requests:
            if request.id == request_id:
                return request
        return None


@dataclass(frozen=True)
class Answered:
    """What a continuation gets: the stream, the requests and their answers, and where
    its own message stands (the hub wrote its ``message_start`` and the answers' records;
    its blocks start at ``next_index``)."""

    stream_id: str
    message_id: str
    model: str
    next_index: int
    requests: tuple[PendingRequest, ...]
    answers: Mapping[str, Answer] = field(default_factory=dict)

    def approvals(self) -> list[tuple[ApprovalRequest, ToolApproval]]:
        """Each approval request with its answer, in the order asked."""
        return [
            (r, a)
            for r in self.requests
            if isinstance(r, ApprovalRequest) and isinstance(a := self.answers[r.id], ToolApproval)
        ]

    def tool_outputs(self) -> list[tuple[ClientToolCall, ToolOutput]]:
        """Each client call with the output the client gave, in the order asked."""
        return [
            (r, a)
            for r in self.requests
            if isinstance(r, ClientToolCall) and isinstance(a := self.answers[r.id], ToolOutput)
        ]

    def questions(self) -> list[tuple[Question, QuestionAnswer]]:
        """Each question with its answer, in the order asked."""
        return [
            (r, a)
            for r in self.requests
            if isinstance(r, Question) and isinstance(a := self.answers[r.id], QuestionAnswer)
        ]


# -- reading a stream ------------------------------------------------------------------------


def _parsed(arguments: str) -> Any:
    if not arguments:
        return {}
    try:
        return orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return None


def _text(value: object) -> str:
    """A block's id or name as the reader keys it: the string, or ``""`` for anything
    else (a value the checker refuses; ``str()`` of a deeply nested one would recurse
    past Python's limit)."""
    return value if isinstance(value, str) else ""


def _int_or_none(value: Any) -> int | None:
    return value if type(value) is int else None


class _Message:
    __slots__ = (
        "answers",
        "approvals",
        "calls",
        "id",
        "last_event_id",
        "model",
        "order",
        "partial",
        "questions",
        "results",
        "results_ended",
        "stop_reason",
    )

    def __init__(self, message_id: str | None, model: str | None) -> None:
        self.id = message_id
        self.model = model
        self.calls: dict[str, tuple[str, str | None]] = {}  # id -> (name, item_type)
        self.partial: dict[str, list[str]] = {}  # a call's arguments, as they came
        self.results: dict[str, tuple[list[str], bool]] = {}  # tool_use_id -> (text, error)
        # The results whose block has stopped: whole. A result being written (its text
        # still to come, on another replica, say) is no record of an answer yet.
        self.results_ended: set[str] = set()
        self.approvals: dict[str, dict[str, Any]] = {}
        self.questions: dict[str, dict[str, Any]] = {}
        self.answers: dict[str, Answer] = {}  # the records of an answer, by request id
        self.order: list[tuple[str, str]] = []  # (kind, id) of each request, as asked
        self.stop_reason: str | None = None
        self.last_event_id: str | None = None

    def requests(self, earlier: Mapping[str, _Message] | None = None) -> tuple[PendingRequest, ...]:
        """What the message asks; ``earlier``: the stream's calls by id, the message
        each is in (an approval may name an earlier message's call still running)."""
        # The calls an approval gates and those whose run asks a question: not the
        # client's to run.
        approved_calls = {block["tool_use_id"] for block in self.approvals.values()}
        approved_calls.update(
            block["tool_use_id"]
            for block in self.questions.values()
            if isinstance(block.get("tool_use_id"), str)
        )
        found: list[PendingRequest] = []
        for kind, key in self.order:
            if kind == BlockType.TOOL_USE:
                if key in self.results or key in approved_calls:
                    continue
                name, item_type = self.calls[key]
                arguments = "".join(self.partial.get(key, ()))
                found.append(ClientToolCall(key, name, _parsed(arguments), arguments, item_type))
            elif kind == BlockType.APPROVAL_REQUEST:
                block = self.approvals[key]
                call = block["tool_use_id"]
                owner = self if call in self.calls or earlier is None else earlier.get(call, self)
                name, _ = owner.calls.get(call, ("", None))
                arguments = "".join(owner.partial.get(call, ()))
                reason = block.get("reason")
                found.append(
                    ApprovalRequest(
                        key,
                        call,
                        name,
                        _parsed(arguments),
                        arguments,
                        reason if isinstance(reason, str) else None,
                        _int_or_none(block.get("expires_at")),
                    )
                )
            else:
                block = self.questions[key]
                schema = block.get("schema")
                call = block.get("tool_use_id")
                found.append(
                    Question(
                        key,
                        _text(block.get("question")),
                        schema if isinstance(schema, dict) else None,
                        _int_or_none(block.get("expires_at")),
                        call if isinstance(call, str) else None,
                    )
                )
        return tuple(found)


class AskReader:
    """Reads a stream's events, in order, for what it waits for (:meth:`waiting`).

    Feed it every event (or use :func:`waiting`); events it cannot read are skipped, as
    every reader of the protocol skips them.
    """

    __slots__ = ("_asking", "_blocks", "_calls_of", "_continued", "_current", "_last_id")

    def __init__(self) -> None:
        self._current: _Message | None = None
        self._asking: _Message | None = None  # the last message that ended asking
        self._continued: _Message | None = None  # the first message after it
        self._blocks: dict[int, tuple[str, str]] = {}  # open block index -> (type, key)
        self._calls_of: dict[str, _Message] = {}  # each call of the stream: its message
        self._last_id: str | None = None

    def feed(self, event: Event) -> None:
        """Read one more event."""
        record = read(event)
        message = self._current
        if isinstance(record, MessageStart):
            message = self._current = _Message(record.message_id, record.model)
            self._blocks.clear()
            if self._asking is not None and self._continued is None:
                self._continued = message
        elif message is None:
            return
        elif isinstance(record, BlockStart):
            self._block_start(message, record)
        elif isinstance(record, Delta):
            open_block = self._blocks.get(record.index)
            if open_block is None or record.text is None:
                return
            kind, key = open_block
            if kind == BlockType.TOOL_USE:
                message.partial.setdefault(key, []).append(record.text)
            elif kind == BlockType.TOOL_RESULT and key in message.results:
                message.results[key][0].append(record.text)
        elif isinstance(record, BlockStop):
            closed = self._blocks.pop(record.index, None)
            if closed is not None and closed[0] == BlockType.TOOL_RESULT:
                message.results_ended.add(closed[1])
        elif isinstance(record, MessageDelta):
            message.stop_reason = record.stop_reason
        elif isinstance(record, ErrorRecord):
            self._current = None  # an error ends the message: it asks nothing
        elif record.name == "message_stop":
            self._current = None
            if message.stop_reason == StopReason.TOOL_USE and (message.order or message.calls):
                message.last_event_id = event.id
                if message.requests(self._calls_of):
                    self._asking, self._continued = message, None
        self._last_id = event.id

    def _block_start(self, message: _Message, record: BlockStart) -> None:
        block = record.block
        kind = record.block_type
        key = ""
        if kind == BlockType.TOOL_USE:
            key = _text(block.get("id"))
            item_type = block.get("item_type")
            message.calls[key] = (
                _text(block.get("name")),
                item_type if isinstance(item_type, str) else None,
            )
            self._calls_of[key] = message
            message.order.append((kind, key))
        elif kind == BlockType.TOOL_RESULT:
            key = _text(block.get("tool_use_id"))
            message.results[key] = ([], block.get("is_error") is True)
        elif kind == BlockType.APPROVAL_REQUEST:
            key = _text(block.get("id"))
            if isinstance(block.get("tool_use_id"), str):
                message.approvals[key] = block
                message.order.append((kind, key))
        elif kind == BlockType.QUESTION:
            key = _text(block.get("id"))
            message.questions[key] = block
            message.order.append((kind, key))
        elif kind == BlockType.APPROVAL_RESPONSE:
            key = _text(block.get("request_id"))
            reason = block.get("reason")
            message.answers[key] = ToolApproval(
                key, block.get("approved") is True, reason if isinstance(reason, str) else None
            )
        elif kind == BlockType.ANSWER:
            key = _text(block.get("request_id"))
            message.answers[key] = QuestionAnswer(key, block.get("value"))
        self._blocks[record.index] = (kind, key)

    def waiting(self) -> Waiting | None:
        """What the stream waits for, or None when no message of it asked anything. A
        stream whose asking message was continued gives the continuation's record of
        the answers in :attr:`Waiting.answered`."""
        asking = self._asking
        if asking is None:
            return None
        requests = asking.requests(self._calls_of)
        answered: dict[str, Answer] | None = None
        continued = self._continued
        if continued is not None:
            # The records of the answers: the continuation's results of other calls (an
            # approved call, run) are its own output, not an answer.
            asked = {request.id for request in requests}
            answered = {key: a for key, a in continued.answers.items() if key in asked}
            for call, (parts, is_error) in continued.results.items():
                if call in asked and call in continued.results_ended:
                    answered[call] = ToolOutput(call, "".join(parts), is_error)
        return Waiting(
            asking.id,
            asking.model,
            requests,
            answered or None,
            asking.last_event_id,
            continued is not None,
            frozenset(call for call in asking.calls if call in asking.results),
        )


def waiting(events: Iterable[Event]) -> Waiting | None:
    """What the stream of ``events`` waits for (see :meth:`AskReader.waiting`)."""
    reader = AskReader()
    for event in events:
        reader.feed(event)
    return reader.waiting()


# -- taking an answer ----------------------------------------------------------------------


def parse_answers(body: Any) -> list[Answer]:
    """The answers of a JSON body ``{"answers": [...]}`` (or the list alone), each
    ``{"id", "approved", "reason"?}`` for an approval, ``{"id", "output", "is_error"?}``
    for a client call, ``{"id", "value"}`` for a question (docs/asking.md).
    :class:`~essessey.InvalidAnswer` saying what is wrong (never echoing the content)."""
    items = body.get("answers") if isinstance(body, dict) else body
    if not isinstance(items, list) or not items:
        raise InvalidAnswer('the body needs "answers": a non-empty list')
    found: list[Answer] = []
    for position, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("id"), str) or not item["id"]:
            raise InvalidAnswer(f"answer {position} needs a string id")
        key: str = item["id"]
        kinds = [name for name in ("approved", "output", "value") if name in item]
        if len(kinds) != 1:
            raise InvalidAnswer(f"answer {position} needs exactly one of approved, output, value")
        if kinds[0] == "approved":
            reason = item.get("reason")
            if not isinstance(item["approved"], bool) or not (
                reason is None or isinstance(reason, str)
            ):
                raise InvalidAnswer(f"answer {position}: approved is a boolean, reason a string")
            found.append(ToolApproval(key, item["approved"], reason))
        elif kinds[0] == "output":
            is_error = item.get("is_error", False)
            if not isinstance(is_error, bool):
                raise InvalidAnswer(f"answer {position}: is_error is a boolean")
            found.append(ToolOutput(key, item["output"], is_error))
        else:
            found.append(QuestionAnswer(key, item["value"]))
    return found


def match_answers(
    waiting: Waiting, answers: Sequence[Answer], *, now: float | None = None
) -> dict[str, Answer]:
    """The answers by request id, once they answer exactly what ``waiting`` asks.

    Raises :class:`~essessey.InvalidAnswer` for an answer to a request not asked, a
    request left unanswered, two answers to one request or an answer of the wrong kind;
    :class:`~essessey.AnswerExpired` when a request's ``expires_at`` has passed;
    :class:`~essessey.AnswerConflict` when the stream was continued with other answers,
    :class:`~essessey.NotWaiting` when it went on without any.
    When it was continued with these same answers, returns them all the same: the caller
    then has nothing to start (``waiting.answered`` is not None).
    """
    given: dict[str, Answer] = {}
    for answer in answers:
        if not isinstance(answer, ToolApproval | ToolOutput | QuestionAnswer):
            raise InvalidAnswer(f"{type(answer).__name__} is not an answer")
        key = answer.request_id
        if key in given:
            raise InvalidAnswer(f"request {key!r} is answered twice")
        request = waiting.request(key)
        if request is None:
            raise InvalidAnswer(f"the stream does not wait for a request {key!r}")
        if not isinstance(answer, _KIND[type(request)]):
            raise InvalidAnswer(
                f"request {key!r} is a {type(request).__name__}; "
                f"a {_KIND[type(request)].__name__} answers it, not a {type(answer).__name__}"
            )
        if not _recordable(answer):
            raise InvalidAnswer(
                f"the answer to {key!r} cannot be written as JSON (nested too deeply, an "
                "integer past 64 bits, a lone surrogate, or not JSON at all)"
            )
        given[key] = answer
    missing = [request.id for request in waiting.requests if request.id not in given]
    if missing:
        raise InvalidAnswer(f"{len(missing)} request(s) left unanswered: {', '.join(missing)}")
    if waiting.continued and waiting.answered is None:
        raise NotWaiting("the stream went on after its question without an answer")
    if waiting.answered is not None:
        if not _same(given, waiting.answered):
            raise AnswerConflict("these requests were answered already, differently")
        return given
    moment = time.time() if now is None else now
    for request in waiting.requests:
        if request.expires_at is not None and moment > request.expires_at:
            raise AnswerExpired(f"request {request.id!r} expired at {request.expires_at}")
    return given


def _recordable(answer: Answer) -> bool:
    """Whether the record of ``answer`` (the block its continuation writes first) can be
    written: refused here, it is the client's error; found when the record is written,
    the question would be lost to an error event."""
    block: Any
    if isinstance(answer, QuestionAnswer):
        block = answer_block_start(answer.request_id, answer.value)
    elif isinstance(answer, ToolApproval):
        block = approval_response_block_start(
            answer.request_id, answer.approved, reason=answer.reason
        )
    else:
        try:
            block = answer.text
        except SerializationError:
            return False
    try:
        # At the depth of the event's content_block.
        orjson.dumps({"content_block": block})
    except TypeError:  # orjson's JSONEncodeError
        return False
    return True


def _same(given: Mapping[str, Answer], recorded: Mapping[str, Answer]) -> bool:
    if given.keys() != recorded.keys():
        return False
    for key, answer in given.items():
        other = recorded[key]
        if isinstance(answer, ToolOutput):
            # The record holds the output's text, the form it was written in.
            if not (
                isinstance(other, ToolOutput)
                and other.text == answer.text
                and other.is_error == answer.is_error
            ):
                return False
        elif isinstance(answer, QuestionAnswer):
            if not (isinstance(other, QuestionAnswer) and _same_json(answer.value, other.value)):
                return False
        elif answer != other:
            return False
    return True


def _same_json(value: Any, other: Any) -> bool:
    """Whether two JSON values are the same answer: as JSON compares them, where Python's
    ``==`` takes ``true`` for ``1`` and ``false`` for ``0`` (inside lists and objects
    too). Numbers compare by value (``1`` and ``1.0`` are one JSON number)."""
    if isinstance(value, bool) or isinstance(other, bool):
        return value is other
    if isinstance(value, dict):
        return (
            isinstance(other, dict)
            and value.keys() == other.keys()
            and all(_same_json(item, other[key]) for key, item in value.items())
        )
    if isinstance(value, list | tuple):
        return (
            isinstance(other, list | tuple)
            and len(value) == len(other)
            and all(_same_json(a, b) for a, b in zip(value, other, strict=True))
        )
    if isinstance(other, dict | list | tuple):
        return False
    return bool(value == other)


set_public_module(__name__, globals(), __all__)
