"""The protocol checker: a state machine that reads events in order and reports every
rule they break.

The rules (docs/protocol.md, "Block indexes" and "Strict mode", says them for users):

1. Block indexes count up from the first block's index, one per block, per message.
2. A text or thinking block opens on its first non-empty chunk: closing one that carried
   nothing is a violation, because a client would render a blank card for it.
3. One block is open at a time; a delta or stop names the open block.
4. A thinking block closes before a text block opens (named apart from rule 3 because
   overlapping them makes a client render reasoning into the answer).
5. Parallel tool calls in one round: all tool_use blocks before all tool_result blocks.

And the message frame: ``message_start`` first (``ping`` anywhere), deltas match their
block's type, nothing after ``message_stop`` (or an ``error``) but a new
``message_start``, a tool_result names an earlier tool_use, a stream does not end inside
a message. And for turns that ask (docs/asking.md): an ``approval_request`` names a
tool_use of its message that has no result there, a request's id is used once, a message
that asks ends with stop reason ``tool_use``, and an ``approval_response`` or ``answer``
names a request asked earlier, once. Unknown events, block types and delta types pass: the
sets are open.

A strict :class:`~essessey.Publisher` runs the same machine before each event and
refuses the event when it would break a rule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final, TypeAlias

from essessey._public import set_public_module
from essessey.errors import Violation
from essessey.event import Event
from essessey.protocol import (
    DELTA_FOR_BLOCK,
    BlockType,
    DeltaType,
    EventType,
    StopReason,
    Unreadable,
    read,
)
from essessey.protocol.asking import PendingRequest

__all__ = ["ProtocolChecker", "Rule", "Violation", "check"]


_MAX_DETAIL: Final = 200
"""The most characters of a violation's detail kept: what it quotes of the stream is cut."""


class Rule:
    """The names of the rules a :class:`Violation` can report."""

    PAYLOAD: Final = "payload"
    MESSAGE_START_FIRST: Final = "message-start-first"
    AFTER_MESSAGE_STOP: Final = "after-message-stop"
    NESTED_MESSAGE: Final = "nested-message"
    INDEX_SEQUENCE: Final = "index-sequence"
    EMPTY_BLOCK: Final = "empty-block"
    ONE_OPEN_BLOCK: Final = "one-open-block"
    THINKING_BEFORE_TEXT: Final = "thinking-before-text"
    TOOLS_BEFORE_RESULTS: Final = "tools-before-results"
    BLOCK_NOT_OPEN: Final = "block-not-open"
    DELTA_TYPE: Final = "delta-type"
    UNCLOSED_BLOCK: Final = "unclosed-block"
    TOOL_RESULT_UNKNOWN_USE: Final = "tool-result-unknown-use"
    DUPLICATE_TOOL_USE: Final = "duplicate-tool-use"
    DUPLICATE_TOOL_RESULT: Final = "duplicate-tool-result"
    APPROVAL_UNKNOWN_CALL: Final = "approval-unknown-call"
    DUPLICATE_REQUEST: Final = "duplicate-request"
    ASKING_STOP_REASON: Final = "asking-stop-reason"
    ANSWER_UNKNOWN_REQUEST: Final = "answer-unknown-request"
    DUPLICATE_ANSWER: Final = "duplicate-answer"
    INCOMPLETE: Final = "incomplete"


_CONTENT_FIELDS: Final = ("text", "thinking", "signature", "partial_json")

_NO_BLOCK: Final = -1

_Violate: TypeAlias = Callable[[str, str], None]


class ProtocolChecker:
    """The incremental checker: feed events in order, get the violations of each.

    :meth:`validate` looks without changing state (what a strict Publisher needs before
    it emits); :meth:`feed` validates and then moves on, the way a reader of a recorded
    stream does. After a violation, ``feed`` still updates its state as best it can so
    that one mistake is reported once, not at every later event.
    """

    __slots__ = (
        "_answered",
        "_asks",
        "_ended",
        "_in_message",
        "_in_results",
        "_message_uses",
        "_next_index",
        "_open_has_content",
        "_open_index",
        "_open_type",
        "_position",
        "_replied",
        "_requests",
        "_round_uses",
        "_text_index",
        "_tool_uses",
    )

    def __init__(self) -> None:
        self._position = 0
        self._in_message = False
        self._ended = False
        self._next_index: int | None = None
        self._open_index = _NO_BLOCK
        self._open_type = ""
        self._open_has_content = False
        # The open block's index while a text delta may go to it, else None: the one
        # comparison of accept_text_delta, kept wherever the open block changes.
        self._text_index: int | None = None
        self._tool_uses: set[str] = set()
        self._answered: set[str] = set()
        self._round_uses: set[str] = set()
        self._in_results = False
        self._message_uses: set[str] = set()  # this message's tool_use ids
        self._asks = False  # this message has asked something
        self._requests: set[str] = set()  # every request id asked in the stream
        self._replied: set[str] = set()  # the requests with a recorded answer

    @property
    def position(self) -> int:
        """How many events have been fed."""
        return self._position

    @property
    def in_message(self) -> bool:
        """Whether a message is open (started, not yet stopped)."""
        return self._in_message

    @property
    def open_block(self) -> tuple[int, str] | None:
        """The open block's index and type, or None."""
        if self._open_index == _NO_BLOCK:
            return None
        return self._open_index, self._open_type

    def knows_tool_use(self, tool_use_id: str) -> bool:
        """Whether a tool_use block with this id was fed (in any message of the stream),
        or named by :meth:`expect_answers`: a block with it again would break
        ``duplicate-tool-use``."""
        return tool_use_id in self._tool_uses

    def expect_answers(self, requests: Iterable[PendingRequest]) -> None:
        """Take ``requests``, asked by an earlier message of the stream that this checker
        did not read, as asked: the message that continues the turn may then record
        their answers (the hub calls this for an answer's continuation)."""
        for request in requests:
            self._requests.add(request.id)
            # The call it is about (a call's question's too): its result may follow.
            call = request.tool_use_id
            if call is not None:
                self._tool_uses.add(call)

    def validate(self, event: str, payload: Any) -> list[Violation]:
        """The violations ``event`` would cause now, without recording it."""
        return self._step(event, payload, commit=False)

    def feed(self, event: str, payload: Any) -> list[Violation]:
        """Record ``event`` (its name and parsed payload) and return its violations."""
        return self._step(event, payload, commit=True)

    def accept(self, event: str, payload: Any) -> list[Violation]:
        """Record ``event`` only if it breaks no rule; return its violations either way.

        One pass instead of :meth:`validate` then :meth:`feed`: this is the strict
        Publisher's path, run before every event it emits.
        """
        return self._step(event, payload, commit=None)

    def accept_delta(self, index: int, delta_type: str, has_content: bool) -> bool:
        """Record a delta the caller built itself, if it plainly keeps the rules.

        The fast path of a strict Publisher: a delta for the open block, of a type that
        block accepts, is recorded and True returned. Anything else returns False and
        records nothing; the caller then goes through :meth:`accept` to learn why.
        """
        if self._in_message and index == self._open_index and index >= 0:
            allowed = DELTA_FOR_BLOCK.get(self._open_type)
            if allowed is None or delta_type in allowed:
                if has_content:
                    self._open_has_content = True
                self._position += 1
                return True
        return False

    def accept_text_delta(self, index: int, has_content: bool) -> bool:
        """:meth:`accept_delta` for a text delta, the most frequent event of a turn: one
        comparison on its fast path."""
        if index == self._text_index:
            if has_content:
                self._open_has_content = True
            self._position += 1
            return True
        return False

    def accept_deltas(self, index: int, delta_type: str, count: int, has_content: bool) -> bool:
        """:meth:`accept_delta` for ``count`` deltas of one type at once: all recorded
        and True, or none and False."""
        if count and self._in_message and index == self._open_index and index >= 0:
            allowed = DELTA_FOR_BLOCK.get(self._open_type)
            if allowed is None or delta_type in allowed:
                if has_content:
                    self._open_has_content = True
                self._position += count
                return True
        return False

    def feed_event(self, event: Event) -> list[Violation]:
        """Record an :class:`Event`, parsing its payload; bad JSON is a violation."""
        record = read(event)
        if isinstance(record, Unreadable):
            if record.payload is None and event.event == EventType.PING and not event.data:
                # A keep-alive with no data at all (an SSE ping frame's own shape): the
                # readers take it, so the checker does.
                self._position += 1
                return []
            if record.payload is None:  # not JSON at all
                position = self._position
                self._position += 1
                return [Violation(position, event.event, Rule.PAYLOAD, record.reason)]
            return self._step(event.event, record.payload, commit=True)
        name = event.event
        if name in ("", "message"):
            # An SSE frame without an ``event:`` line: the payload names itself, as the
            # reassembler reads it.
            named = record.payload.get("type")
            if isinstance(named, str) and named in EventType.ALL:
                name = named
        return self._step(name, record.payload, commit=True)

    def finish(self) -> list[Violation]:
        """The violations of ending the stream here: a message left open."""
        if self._in_message:
            return [
                Violation(
                    self._position,
                    "(end)",
                    Rule.INCOMPLETE,
                    "the stream ended before message_stop",
                )
            ]
        return []

    # One function with a branch per event keeps the hot path (a text delta) to a few
    # dict lookups, which matters because a strict Publisher runs it for every event.
    def _step(self, name: str, payload: Any, *, commit: bool | None) -> list[Violation]:
        # commit: True records always, False never, None only when no rule is broken.
        # Every branch finds its violations before it changes any state, which is what
        # makes the last mode possible in one pass.
        position = self._position
        found: list[Violation] = []

        def violate(rule: str, detail: str) -> None:
            if len(detail) > _MAX_DETAIL:
                # A detail may quote a value the stream gave (an id, a type): bounded.
                detail = detail[:_MAX_DETAIL] + f"... ({len(detail)} characters)"
            found.append(Violation(position, name, rule, detail))

        if name not in EventType.ALL:
            if _records(commit, found):
                self._position += 1
            return found
        if not isinstance(payload, dict):
            violate(Rule.PAYLOAD, "payload is not a JSON object")
            if _records(commit, found):
                self._position += 1
            return found
        if payload.get("type") != name:
            violate(Rule.PAYLOAD, f"payload type {payload.get('type')!r} is not {name!r}")

        if name == EventType.CONTENT_BLOCK_DELTA:
            self._delta(payload, violate, found, commit)
        elif name == EventType.CONTENT_BLOCK_START:
            self._block_start(payload, violate, found, commit)
        elif name == EventType.CONTENT_BLOCK_STOP:
            self._block_stop(payload, violate, found, commit)
        elif name == EventType.MESSAGE_START:
            if not isinstance(payload.get("message"), dict):
                violate(Rule.PAYLOAD, "message_start has no message object")
            if self._in_message:
                violate(Rule.NESTED_MESSAGE, "message_start while a message is open")
            if _records(commit, found):
                self._in_message = True
                self._next_index = None
                self._close_block()
                self._round_uses = set()
                self._in_results = False
                self._message_uses = set()
                self._asks = False
        elif name == EventType.MESSAGE_DELTA or name == EventType.MESSAGE_STOP:
            delta = payload.get("delta")
            if name == EventType.MESSAGE_DELTA and not isinstance(delta, dict):
                violate(Rule.PAYLOAD, "message_delta has no delta object")
            elif (
                name == EventType.MESSAGE_DELTA
                and self._asks
                and isinstance(delta, dict)
                and delta.get("stop_reason") != StopReason.TOOL_USE
            ):
                violate(
                    Rule.ASKING_STOP_REASON,
                    f"a message that asks ends with stop reason tool_use, not "
                    f"{delta.get('stop_reason')!r}",
                )
            if self._require_message(violate) and self._open_index != _NO_BLOCK:
                violate(Rule.UNCLOSED_BLOCK, f"block {self._open_index} is still open")
            if _records(commit, found) and name == EventType.MESSAGE_STOP:
                self._end_message()
        elif name == EventType.ERROR:
            error = payload.get("error")
            if not (
                isinstance(error, dict)
                and isinstance(error.get("type"), str)
                and isinstance(error.get("message"), str)
            ):
                violate(Rule.PAYLOAD, "error needs an error object with type and message")
            # An error ends the message it interrupts: clients stop waiting for it.
            if _records(commit, found):
                self._end_message()
        # ping: allowed anywhere, nothing to check beyond its type.

        if _records(commit, found):
            self._position += 1
        return found

    def _end_message(self) -> None:
        self._ended = self._ended or self._in_message
        self._in_message = False
        self._close_block()

    def _close_block(self) -> None:
        """No block is open: nor may a text delta go anywhere."""
        self._open_index = _NO_BLOCK
        self._text_index = None

    def _require_message(self, violate: _Violate) -> bool:
        if self._in_message:
            return True
        if self._ended:
            violate(Rule.AFTER_MESSAGE_STOP, "event after the message ended, before message_start")
        else:
            violate(Rule.MESSAGE_START_FIRST, "event before message_start")
        return False

    def _block_start(
        self,
        payload: dict[str, Any],
        violate: _Violate,
        found: list[Violation],
        commit: bool | None,
    ) -> None:
        index = payload.get("index")
        block = payload.get("content_block")
        if type(index) is not int or index < 0 or not isinstance(block, dict):
            violate(Rule.PAYLOAD, "content_block_start needs an index and a content_block")
            return
        block_type = block.get("type")
        if not isinstance(block_type, str):
            violate(Rule.PAYLOAD, "content_block has no type")
            return
        if not self._require_message(violate):
            return
        if self._open_index != _NO_BLOCK:
            if self._open_type == BlockType.THINKING and block_type == BlockType.TEXT:
                violate(
                    Rule.THINKING_BEFORE_TEXT,
                    f"text block {index} opened while thinking block {self._open_index} is open",
                )
            else:
                violate(
                    Rule.ONE_OPEN_BLOCK,
                    f"block {index} opened while block {self._open_index} is open",
                )
        expected = self._next_index
        if expected is not None and index != expected:
            violate(Rule.INDEX_SEQUENCE, f"block index {index}, expected {expected}")

        tool_id: Any = None
        if block_type == BlockType.TOOL_USE:
            tool_id = block.get("id")
            if not isinstance(tool_id, str) or not isinstance(block.get("name"), str):
                violate(Rule.PAYLOAD, "tool_use block needs a string id and name")
                tool_id = None
            else:
                if tool_id in self._tool_uses:
                    violate(Rule.DUPLICATE_TOOL_USE, f"tool_use id {tool_id!r} was used before")
                owed = self._round_uses - self._answered
                if self._in_results and owed:
                    violate(
                        Rule.TOOLS_BEFORE_RESULTS,
                        f"tool_use opened while {len(owed)} result(s) of the round are owed",
                    )
        elif block_type == BlockType.TOOL_RESULT:
            tool_id = block.get("tool_use_id")
            if not isinstance(tool_id, str):
                violate(Rule.PAYLOAD, "tool_result block needs a string tool_use_id")
                tool_id = None
            elif tool_id not in self._tool_uses:
                violate(Rule.TOOL_RESULT_UNKNOWN_USE, f"no earlier tool_use has id {tool_id!r}")
            elif tool_id in self._answered:
                violate(Rule.DUPLICATE_TOOL_RESULT, f"tool_use {tool_id!r} already has a result")
        elif block_type in BlockType.REQUESTS:
            tool_id = self._request(block, block_type, violate)
        elif block_type in BlockType.RESPONSES:
            tool_id = block.get("request_id")
            if not isinstance(tool_id, str):
                violate(Rule.PAYLOAD, f"{block_type} block needs a string request_id")
                tool_id = None
            elif tool_id not in self._requests:
                violate(Rule.ANSWER_UNKNOWN_REQUEST, f"no earlier request has id {tool_id!r}")
            elif tool_id in self._replied:
                violate(Rule.DUPLICATE_ANSWER, f"request {tool_id!r} already has an answer")

        if not _records(commit, found):
            return
        self._open_index = index
        self._open_type = block_type
        self._open_has_content = False
        allowed = DELTA_FOR_BLOCK.get(block_type)
        takes_text = allowed is None or DeltaType.TEXT in allowed
        self._text_index = index if self._in_message and index >= 0 and takes_text else None
        self._next_index = index + 1
        if block_type == BlockType.TOOL_USE:
            if self._in_results:
                self._round_uses = set()
                self._in_results = False
            if tool_id is not None:
                self._round_uses.add(tool_id)
                self._tool_uses.add(tool_id)
                self._message_uses.add(tool_id)
        elif block_type in BlockType.REQUESTS:
            self._asks = True
            if tool_id is not None:
                self._requests.add(tool_id)
        elif block_type in BlockType.RESPONSES:
            if tool_id is not None:
                self._replied.add(tool_id)
        elif block_type == BlockType.TOOL_RESULT:
            self._in_results = True
            if tool_id is not None:
                self._answered.add(tool_id)
        elif self._in_results:
            # Any other block after the results ends the round.
            self._round_uses = set()
            self._in_results = False

    def _request(self, block: dict[str, Any], block_type: str, violate: _Violate) -> str | None:
        """The id of an approval request or question, once its fields are checked."""
        request_id = block.get("id")
        if not isinstance(request_id, str) or not request_id:
            violate(Rule.PAYLOAD, f"{block_type} block needs a string id")
            return None
        if request_id in self._requests or request_id in self._tool_uses:
            violate(Rule.DUPLICATE_REQUEST, f"request id {request_id!r} was used before")
        call = block.get("tool_use_id")
        if block_type == BlockType.QUESTION:
            if not isinstance(block.get("question"), str):
                violate(Rule.PAYLOAD, "question block needs a string question")
            if call is None:
                return request_id  # the turn's own question, not a call's
        if not isinstance(call, str):
            violate(Rule.PAYLOAD, f"{block_type} block needs a string tool_use_id")
        elif call in self._answered or not (call in self._message_uses or call in self._tool_uses):
            # A call of this message, or an earlier one still without its result (one
            # approved that asks again before it ends, in the message that continues).
            violate(
                Rule.APPROVAL_UNKNOWN_CALL,
                f"no tool_use {call!r} without a result in this stream",
            )
        return request_id

    def _delta(
        self,
        payload: dict[str, Any],
        violate: _Violate,
        found: list[Violation],
        commit: bool | None,
    ) -> None:
        index = payload.get("index")
        delta = payload.get("delta")
        # A negative index must be refused here: it would otherwise match _NO_BLOCK and
        # pass as "the open block" when no block is open.
        if type(index) is not int or index < 0 or not isinstance(delta, dict):
            violate(Rule.PAYLOAD, "content_block_delta needs an index and a delta")
            return
        if not self._require_message(violate):
            return
        if index != self._open_index:
            violate(Rule.BLOCK_NOT_OPEN, f"delta for block {index}, which is not open")
            return
        delta_type = delta.get("type")
        allowed = DELTA_FOR_BLOCK.get(self._open_type)
        known = isinstance(delta_type, str) and delta_type in DeltaType.KNOWN
        if allowed is not None and known and delta_type not in allowed:
            violate(
                Rule.DELTA_TYPE,
                f"{delta_type} does not belong in a {self._open_type} block",
            )
        if _records(commit, found) and not self._open_has_content:
            for field in _CONTENT_FIELDS:
                value = delta.get(field)
                if isinstance(value, str) and value:
                    self._open_has_content = True
                    break

    def _block_stop(
        self,
        payload: dict[str, Any],
        violate: _Violate,
        found: list[Violation],
        commit: bool | None,
    ) -> None:
        index = payload.get("index")
        if type(index) is not int or index < 0:
            violate(Rule.PAYLOAD, "content_block_stop needs an index")
            return
        if not self._require_message(violate):
            return
        if index != self._open_index:
            violate(Rule.BLOCK_NOT_OPEN, f"stop for block {index}, which is not open")
            return
        if self._open_type in (BlockType.TEXT, BlockType.THINKING) and not self._open_has_content:
            violate(Rule.EMPTY_BLOCK, f"{self._open_type} block {index} closed with no content")
        if _records(commit, found):
            self._close_block()


def _records(commit: bool | None, found: list[Violation]) -> bool:
    """Whether a step changes the checker's state: always (``commit=True``, reading a
    stream), never (``False``, asking what an event would break), or only when it broke
    no rule (``None``, a strict Publisher, which emits nothing it refuses)."""
    return commit is True or (commit is None and not found)


def check(events: Iterable[Event]) -> list[Violation]:
    """Check a whole recorded stream (one or several messages); return every violation,
    in order. An empty list means the stream keeps every rule."""
    checker = ProtocolChecker()
    found: list[Violation] = []
    for event in events:
        found.extend(checker.feed_event(event))
    found.extend(checker.finish())
    return found


# Violation is defined beside ProtocolError, which carries it (a lower layer); its public
# home is here, with the checker that reports it.
set_public_module(__name__, globals(), ["Violation"])
