"""Reading an event: one typed record per protocol event, parsed from its bytes once.

Many readers look at the same event on its way: the hub (to learn a turn's stop reason),
the checker, the reassembler, the snapshot compactor, the CLI's renderer and each dialect's
encoder. :func:`read` gives each of them the same record, and parses the event's JSON only
the first time any of them asks: the records of recent events are kept in a bounded memo
keyed by the event's bytes (a bytes object caches its hash, so a second look is one dict
lookup). The text delta a hub has just stored is not parsed at all by the dialect that
takes it in the append: the store hands its index and text over, from which the dialect's
response writes it, or notes them (:func:`published_text`) where the event must go through
the encoder's ``encode``, and a reader of those very bytes gets its record from the note.
A record, and the ``payload`` it carries, are shared by every reader: never change them.

Bad input never raises: a payload that is not JSON, not an object, or not laid out as the
protocol says gives :class:`Unreadable` with a reason (type names and lengths, never the
content), which the reader logs with its own logger and skips.
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple, TypeAlias

import orjson

from essessey.event import Event

__all__ = [
    "MEMO_SIZE",
    "BlockStart",
    "BlockStop",
    "Delta",
    "ErrorRecord",
    "MessageDelta",
    "MessageStart",
    "MessageStop",
    "OtherEvent",
    "Ping",
    "Record",
    "Unreadable",
    "published_text",
    "read",
    "reads",
]

MEMO_SIZE: Final = 256
"""How many records of recent events are kept. The readers of one event (the subscribers a
store wakes for it, the hub's own note) read it within a turn of the event loop or two, so
a short memo serves them; a longer one keeps its records alive past the garbage collector's
young generations, which costs every allocation more than the parses it saves. An event
read again after it left the memo is parsed again (the same record, at the cost of a
parse)."""


class MessageStart(NamedTuple):
    """``message_start``: a message opens."""

    message_id: str | None
    stream_id: str | None
    model: str | None
    input_tokens: int
    payload: dict[str, Any]

    @property
    def name(self) -> str:
        """The event's name: "message_start"."""
        return "message_start"

    @property
    def message(self) -> dict[str, Any]:
        """The raw ``message`` object."""
        message: dict[str, Any] = self.payload["message"]
        return message


class Ping(NamedTuple):
    """``ping``: a keep-alive, allowed anywhere."""

    payload: dict[str, Any]

    @property
    def name(self) -> str:
        """The event's name: "ping"."""
        return "ping"


class BlockStart(NamedTuple):
    """``content_block_start``: a block opens at ``index``."""

    index: int  # type: ignore[assignment]  # the block's index, not tuple.index
    block_type: str
    payload: dict[str, Any]

    @property
    def name(self) -> str:
        """The event's name: "content_block_start"."""
        return "content_block_start"

    @property
    def block(self) -> dict[str, Any]:
        """The raw ``content_block`` object."""
        block: dict[str, Any] = self.payload["content_block"]
        return block

    @property
    def tool_use_id(self) -> str | None:
        """A tool_use block's ``id``, or a tool_result block's ``tool_use_id``."""
        block = self.block
        value = block.get("id") if self.block_type == "tool_use" else block.get("tool_use_id")
        return value if isinstance(value, str) else None

    @property
    def tool_name(self) -> str | None:
        """A tool_use block's tool ``name``."""
        value = self.block.get("name")
        return value if isinstance(value, str) else None

    @property
    def is_error(self) -> bool:
        """Whether a tool_result block says its tool failed."""
        return self.block.get("is_error") is True


class Delta(NamedTuple):
    """``content_block_delta``: more content for the block at ``index``. ``text`` is the
    delta's content whichever field carries it (``text``, ``thinking``, ``signature``,
    ``partial_json``), None for a delta type that has none of them."""

    index: int  # type: ignore[assignment]  # the block's index, not tuple.index
    delta_type: str
    text: str | None
    payload: dict[str, Any]

    @property
    def name(self) -> str:
        """The event's name: "content_block_delta"."""
        return "content_block_delta"

    @property
    def delta(self) -> dict[str, Any]:
        """The raw ``delta`` object."""
        delta: dict[str, Any] = self.payload["delta"]
        return delta


class BlockStop(NamedTuple):
    """``content_block_stop``: the block at ``index`` closes."""

    index: int  # type: ignore[assignment]  # the block's index, not tuple.index
    payload: dict[str, Any]

    @property
    def name(self) -> str:
        """The event's name: "content_block_stop"."""
        return "content_block_stop"


class MessageDelta(NamedTuple):
    """``message_delta``: why the message stopped, and its usage."""

    stop_reason: str | None
    stop_sequence: str | None
    output_tokens: int
    payload: dict[str, Any]

    @property
    def name(self) -> str:
        """The event's name: "message_delta"."""
        return "message_delta"

    @property
    def usage(self) -> dict[str, Any]:
        """The raw ``usage`` object (empty when there is none)."""
        usage = self.payload.get("usage")
        return usage if isinstance(usage, dict) else {}


class MessageStop(NamedTuple):
    """``message_stop``: the message ends."""

    payload: dict[str, Any]

    @property
    def name(self) -> str:
        """The event's name: "message_stop"."""
        return "message_stop"


class ErrorRecord(NamedTuple):
    """``error``: the stream failed."""

    error_type: str
    message: str
    request_id: str | None
    payload: dict[str, Any]

    @property
    def name(self) -> str:
        """The event's name: "error"."""
        return "error"


class OtherEvent(NamedTuple):
    """An event the protocol does not name (a custom event): its name and payload."""

    name: str
    payload: dict[str, Any]


class Unreadable(NamedTuple):
    """An event that could not be read, and why (no content: types and lengths); with
    its parsed JSON when it was JSON (a checker reports what is wrong with it), else None."""

    name: str
    reason: str
    payload: Any = None


Record: TypeAlias = (
    MessageStart
    | Ping
    | BlockStart
    | Delta
    | BlockStop
    | MessageDelta
    | MessageStop
    | ErrorRecord
    | OtherEvent
    | Unreadable
)
"""What :func:`read` gives for an event."""

_OTHER_CONTENT_FIELDS: Final = ("thinking", "partial_json", "signature")
"""Where a delta's content is when it is not in ``text``."""
_new: Final = tuple.__new__
_DELTA_NAME: Final = "content_block_delta"
_TEXT: Final = "text_delta"

_memo: dict[bytes, Record] = {}
_ring: list[bytes | None] = [None] * MEMO_SIZE


class _Cursor:
    """Where the next key goes in the ring."""

    __slots__ = ("position",)

    def __init__(self) -> None:
        self.position = 0


_cursor: Final = _Cursor()


class _Reads:
    """How many events :func:`read` parsed (memo misses) in this process."""

    __slots__ = ("parsed",)

    def __init__(self) -> None:
        self.parsed = 0


reads: Final = _Reads()
"""``reads.parsed``: how many times :func:`read` parsed an event's JSON in this process
(what a benchmark or a test divides by the events delivered)."""


_published: tuple[bytes, int, str] | None = None
"""The text delta this process stored last, as (its payload's bytes, its block's index,
its text): one tuple, so a reader in another thread never sees one delta's bytes with
another's text."""


def published_text(data: bytes, index: int, text: str) -> None:
    """Note that ``data`` is the payload of a text delta of ``text`` for block ``index``,
    made in this process and about to reach its readers: until the next note, a reader
    of an event with these very bytes gets its record without a parse (the hub's stored
    text deltas, taken by each dialect that follows the turn).

    Cheaper than putting the record in the memo, whose upkeep costs more than building a
    text delta's record from what its maker already holds. ``data`` must be what
    ``content_block_delta`` text deltas are made of (the Publisher's bytes for ``text``
    at ``index``): the record is built from ``index`` and ``text``, not read from it.
    """
    global _published
    _published = (data, index, text)


def read(event: Event) -> Record:
    """``event`` as its record, parsed once per process while it is recent (see the module
    docstring); never raises."""
    data = event.data
    published = _published
    if published is not None and published[0] is data and event.event == _DELTA_NAME:
        # The same bytes object the note names, so the same delta: no parse, no memo.
        index, text = published[1], published[2]
        payload = {"type": _DELTA_NAME, "index": index, "delta": {"type": _TEXT, "text": text}}
        return _new(Delta, (index, _TEXT, text, payload))
    record = _memo.get(data)
    if record is not None and record.name == event.event:
        return record
    record = _parse(event)
    if data not in _memo:
        # A ring of the keys in the order they came: the oldest goes, its readers long
        # done. (Deleting a dict's first key again and again would make finding the next
        # first key slower and slower.)
        oldest = _ring[_cursor.position]
        if oldest is not None:
            # Absent when two threads missed on equal bytes at once and both put them in
            # the ring: the earlier of their slots took them out.
            _memo.pop(oldest, None)
        _ring[_cursor.position] = data
        _cursor.position = (_cursor.position + 1) % MEMO_SIZE
    _memo[data] = record
    return record


def _parse(event: Event) -> Record:
    reads.parsed += 1
    name, data = event.event, event.data
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        return Unreadable(name, f"data is not valid JSON (error at char {exc.pos})")
    if not isinstance(payload, dict):
        kind = type(payload).__name__
        return Unreadable(name, f"payload is a JSON {kind}, not an object", payload)
    try:
        return _record(name, payload)
    except (KeyError, TypeError, AttributeError) as exc:
        reason = f"payload is not laid out as the protocol says ({type(exc).__name__})"
        return Unreadable(name, reason, payload)


def _index(payload: dict[str, Any]) -> int:
    index = payload["index"]
    if index.__class__ is not int:
        raise TypeError("index")
    return int(index)


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _record(name: str, payload: dict[str, Any]) -> Record:
    if name == "content_block_delta":
        # Most events of a turn: inline, and built as the tuple it is (no argument parsing).
        delta = payload["delta"]
        delta_type = delta["type"]
        index = payload["index"]
        if index.__class__ is not int or delta_type.__class__ is not str:
            raise TypeError("index or delta type")
        text = delta.get("text")
        if text.__class__ is not str:
            text = None
            for field in _OTHER_CONTENT_FIELDS:
                value = delta.get(field)
                if value.__class__ is str:
                    text = value
                    break
        return _new(Delta, (index, delta_type, text, payload))
    if name == "content_block_start":
        block_type = payload["content_block"]["type"]
        if not isinstance(block_type, str):
            raise TypeError("block type")
        return BlockStart(_index(payload), block_type, payload)
    if name == "content_block_stop":
        return BlockStop(_index(payload), payload)
    if name == "message_start":
        message = payload["message"]
        usage = message.get("usage")
        prompt = usage.get("input_tokens") if isinstance(usage, dict) else None
        return MessageStart(
            _str_or_none(message.get("id")),
            _str_or_none(message.get("stream_id")),
            _str_or_none(message.get("model")),
            prompt if isinstance(prompt, int) else 0,
            payload,
        )
    if name == "message_delta":
        delta = payload.get("delta") or {}
        usage = payload.get("usage") or {}
        output = usage.get("output_tokens")
        return MessageDelta(
            _str_or_none(delta.get("stop_reason")),
            _str_or_none(delta.get("stop_sequence")),
            output if isinstance(output, int) else 0,
            payload,
        )
    if name == "message_stop":
        return MessageStop(payload)
    if name == "ping":
        return Ping(payload)
    if name == "error":
        error = payload["error"]
        error_type, message = error["type"], error["message"]
        if not (isinstance(error_type, str) and isinstance(message, str)):
            raise TypeError("error type or message")
        return ErrorRecord(error_type, message, _str_or_none(payload.get("request_id")), payload)
    return OtherEvent(name, payload)
