"""The base every wire dialect's encoder is built on: one reading of each event and one
dispatch, to a hook per kind of event (docs/dialects.md, "Writing a dialect").

A dialect supplies what its frames say, nothing else:

- a hook per kind of event, each returning the frames (whole SSE messages) it becomes:
  :meth:`~DialectEncoder.on_message_start`, :meth:`~DialectEncoder.on_block_start`,
  :meth:`~DialectEncoder.encode_text` (a text delta of an open text block: most events of
  a turn), :meth:`~DialectEncoder.on_delta` (any other delta),
  :meth:`~DialectEncoder.on_block_stop`, :meth:`~DialectEncoder.on_message_delta` (the
  end's stop reason and usage), :meth:`~DialectEncoder.on_message_stop`,
  :meth:`~DialectEncoder.on_error`, and :meth:`~DialectEncoder.on_other` for an event the
  protocol does not name (where events a dialect learns later, such as a turn's
  questions and their answers, arrive until they get hooks of their own);
- ``finish()`` and ``fail()``, the stream's end (see
  :class:`~essessey.bindings.sse.FrameEncoder`).

What the base does, once for every dialect, and why:

- each event is read once (:func:`essessey.protocol.read`, shared with every other reader
  of it); a ping writes nothing; an event that is not a JSON object is skipped with a log
  line naming its type and length, never its content;
- every frame of an event carries an ``id:`` (``with_id``: the last the event's, each
  before it ``<event id>:<n>``), so a client that lost the connection part-way through an
  event's frames resumes after the last frame it got, with nothing twice;
- a hook that finds the payload not laid out as the protocol says raises one of
  ``unreadable`` (KeyError, TypeError, ValueError, AttributeError by default): the event
  is skipped, logged by its type and the exception's class;
- events of a message before the dialect's first message (``in_message`` False) are
  skipped with a log line, except a message's start and an error;
- a message given whole in its start (its ``content`` and ``stop_reason``, as
  Anthropic's programmatic tool calls send it and the ``anthropic`` payload dialect
  passes it on) is written as its own events would be: each block's start, deltas and
  stop (:func:`essessey.protocol.given_blocks`), and the stop reason at its stop;
- an encoder that has ended (``ended``) writes nothing more.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, ClassVar, Final

import orjson

from essessey._logsafe import log_label
from essessey._public import set_public_module
from essessey.bindings.sse import id_line, with_id
from essessey.dialects._payload import read_payload
from essessey.event import Event
from essessey.protocol import Delta, DeltaType, EventType, given_blocks, read

__all__ = ["UNREADABLE", "DialectEncoder"]

UNREADABLE: Final[tuple[type[Exception], ...]] = (
    KeyError,
    TypeError,
    ValueError,
    AttributeError,
    RecursionError,  # a value nested past what str() or a JSON writer goes into
)
"""What a hook raises on a payload that is not laid out as the protocol says: the event
is skipped with a log line."""

_TEXT: Final = DeltaType.TEXT


class DialectEncoder:
    """One response's protocol events, in order, as a dialect's frames: subclass it and
    write the hooks (the module docstring says what the base does for every dialect).

    ``log`` is the dialect's logger; ``outside_message`` the log line for an event of a
    message that came before the first message. A subclass sets ``ended`` once its
    stream has ended (an error), and says in :meth:`in_message` whether a message is
    open. Hooks return the frames an event becomes, in order (an empty list for none).
    """

    log: ClassVar[logging.Logger] = logging.getLogger("essessey.dialects")
    outside_message: ClassVar[str] = "skipped a %s event before the turn's first message"
    unreadable: ClassVar[tuple[type[Exception], ...]] = UNREADABLE
    """The exceptions of a hook that skip its event (``()``: none, they propagate)."""

    ended: bool = False
    # Whether an event after the end (a message after one that ended the response) was
    # logged: what the dialect cannot write is said once, never dropped unsaid.
    _said_ended: bool = False
    # How many events came outside a message: logged at the 1st, 2nd, 4th, 8th, ...,
    # so a stream read from the middle of a long message (a resume point a client made
    # up) writes a few lines, not one per event.
    _outside: int = 0
    # The end a message's start gave (see _given), written at its stop unless a
    # message_delta comes first.
    _given_end: dict[str, Any] | None = None
    after: str | None = None
    """While not None: an event id up to which events are read (:meth:`read_before`),
    not written (:meth:`start_after`)."""

    # -- continuing after an event (docs/asking.md) -----------------------------------------

    def start_after(self, after: str | None) -> None:
        """Write nothing for the events up to ``after`` (an event id: the message that
        asked, whose continuation this response is), only read them with
        :meth:`read_before`; :meth:`reached_after` then, and from the next event on the
        usual frames. None: write everything."""
        self.after = after
        if after is not None:
            self.encode = self._before_after  # type: ignore[method-assign]

    def _before_after(self, event: Event) -> bytes:
        if self.after is None:
            # Reached already, called through a reference taken before: the usual frames.
            return type(self).encode(self, event)
        self.read_before(event)
        if event.id == self.after:
            self.after = None
            del self.encode  # the class's from here on
            self.reached_after()
        return b""

    def read_before(self, event: Event) -> None:
        """An event up to ``after``, read and not written (nothing by default)."""

    def reached_after(self) -> None:
        """The event ``after`` was read: what comes next is written (nothing by
        default)."""

    # -- the one dispatch ----------------------------------------------------------------

    def encode(self, event: Event) -> bytes:
        """The frames for ``event``, each with its ``id:`` (``b""`` for none)."""
        if self.ended or event.event == EventType.PING:
            if self.ended and not self._said_ended and event.event != EventType.PING:
                self._said_ended = True
                self.log.info(
                    "skipped a %s event and the rest: the response has ended",
                    log_label(event.event),
                )
            return b""
        record = read(event)
        if record.__class__ is Delta:
            delta: Delta = record
            text = delta.text
            if delta.delta_type == _TEXT and text is not None:
                frame = self.encode_text(delta.index, text, orjson.dumps(text))
                if frame is not None:
                    return id_line(event.id) + frame if event.id and frame else frame
        payload = read_payload(event, self.log)  # the record's, logged when unreadable
        if payload is None:
            return b""
        try:
            return with_id(self.frames(event.event, payload), event.id)
        except self.unreadable as exc:
            self.log.warning("skipped a %s event: %s", log_label(event.event), type(exc).__name__)
            return b""

    def encode_text_delta(
        self, index: int, text: str, text_json: bytes, event_id: bytes
    ) -> bytes | None:
        """What :meth:`encode` writes for a text delta of ``text`` (``text_json``: as
        JSON, orjson's) for block ``index`` with id ``event_id`` (the id's ASCII bytes),
        from those fields instead of the event (a hub hands a Publisher's stored delta to
        a dialect's response so, its record unread); None, having done nothing, when the
        event must go through :meth:`encode` instead (not an open text block, a response
        that has ended or still reads up to its ``after``, a subclass with an ``encode``
        of its own). ValueError for an id holding CR, LF or NUL."""
        if self.ended or self.after is not None or type(self).encode is not _ENCODE:
            return None
        frame = self.encode_text(index, text, text_json)
        if not frame:
            return frame
        # id_line's rule and line, for an id given as bytes, written out: a call and a
        # join fewer on nearly every event a hub hands over.
        if 10 in event_id or 13 in event_id or 0 in event_id:
            raise ValueError("an SSE id must not contain CR, LF or NUL")
        return b"id: %b\n%b" % (event_id, frame)

    def frames(self, name: str, payload: dict[str, Any]) -> list[bytes]:
        """The frames of the event ``name`` with its parsed ``payload``, by its hook; no
        ``id:`` (what :meth:`encode` and a dialect's own readers build on)."""
        hook = _HOOKS.get(name)
        if hook is None:
            return self.on_other(name, payload)
        if name != EventType.MESSAGE_START and name != EventType.ERROR and not self.in_message():
            count = self._outside = self._outside + 1
            if count & (count - 1) == 0:
                self.log.warning(self.outside_message + " (%d so far)", name, count)
            return []
        return hook(self, payload)

    # -- what a dialect supplies -----------------------------------------------------------

    def in_message(self) -> bool:
        """Whether the dialect has seen its first message (events of a message before it
        are skipped). True by default."""
        return True

    def encode_text(self, index: int, text: str, text_json: bytes) -> bytes | None:
        """The frames of one text delta of ``text`` for block ``index`` (no ``id:``);
        ``text_json`` is ``text`` as JSON (orjson's), ready to splice into a frame. None
        when that is not an open text block (the event then goes to :meth:`on_delta`).
        The hot path: most events of a turn are text deltas."""
        return None

    def on_message_start(self, message: dict[str, Any], payload: dict[str, Any]) -> list[bytes]:
        """A message opens (``message`` is its raw object, ``{}`` when it has none)."""
        return []

    def on_block_start(self, index: int, block: dict[str, Any]) -> list[bytes]:
        """The block at ``index`` opens (``block``: its ``content_block``)."""
        return []

    def on_delta(self, index: int, delta: dict[str, Any]) -> list[bytes]:
        """A delta for the block at ``index`` that :meth:`encode_text` did not take."""
        return []

    def on_block_stop(self, index: int) -> list[bytes]:
        """The block at ``index`` closes."""
        return []

    def on_message_delta(self, payload: dict[str, Any]) -> list[bytes]:
        """The message's stop reason and usage (read them with
        ``essessey.dialects._payload.message_delta_totals`` or from ``payload``)."""
        return []

    def on_message_stop(self) -> list[bytes]:
        """The message ends."""
        return []

    def on_error(self, error: dict[str, Any]) -> list[bytes]:
        """The turn failed (``error``: its raw ``error`` object, ``{}`` when it has none)."""
        return []

    def on_other(self, name: str, payload: dict[str, Any]) -> list[bytes]:
        """An event the protocol does not name. Skipped with a log line by default; the
        place for events a dialect learns to carry before they get hooks of their own."""
        self.log.warning("skipped an event of unknown type (%d characters)", len(name))
        return []


def _object(payload: dict[str, Any], key: str) -> dict[str, Any]:
    """The object ``payload[key]``: a hook is given a dict where the protocol has one,
    never another value (``TypeError`` skips the event)."""
    value = payload[key]
    if not isinstance(value, dict):
        raise TypeError(f"{key} is not an object")
    return value


def _message_start(encoder: DialectEncoder, payload: dict[str, Any]) -> list[bytes]:
    message = payload.get("message")
    message = message if isinstance(message, dict) else {}
    frames = encoder.on_message_start(message, payload)
    encoder._given_end = None
    content = message.get("content")
    if isinstance(content, list) and content:
        frames += _given(encoder, message, content)
    return frames


def _given(encoder: DialectEncoder, message: dict[str, Any], content: list[Any]) -> list[bytes]:
    """A message given whole in its start (Anthropic's programmatic tool calls, in the
    ``anthropic`` payload dialect, which passes the provider's start on as it came): its
    blocks written as their own events would be, and its stop reason kept for the end,
    which then comes with no ``message_delta``."""
    frames: list[bytes] = []
    for index, given in enumerate(given_blocks(content)):
        if given is None:
            encoder.log.warning("skipped block %d of a message's start: it has no type", index)
            continue
        start, deltas = given
        try:
            # Each as the event of its own would be: one a hook cannot read is skipped,
            # not the message's start with it.
            block = encoder.on_block_start(index, start)
            for delta in deltas:
                text = delta.get("text") if delta["type"] == _TEXT else None
                frame = (
                    None if text is None else encoder.encode_text(index, text, orjson.dumps(text))
                )
                block += [frame] if frame is not None else encoder.on_delta(index, delta)
            block += encoder.on_block_stop(index)
        except encoder.unreadable as exc:
            encoder.log.warning(
                "skipped block %d of a message's start: %s", index, type(exc).__name__
            )
            continue
        frames += block
    stop_reason = message.get("stop_reason")
    if isinstance(stop_reason, str):
        delta = {"stop_reason": stop_reason, "stop_sequence": message.get("stop_sequence")}
        end: dict[str, Any] = {"type": EventType.MESSAGE_DELTA, "delta": delta}
        usage = message.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("output_tokens"), int):
            end["usage"] = {"output_tokens": usage["output_tokens"]}
        encoder._given_end = end
    return frames


def _block_start(encoder: DialectEncoder, payload: dict[str, Any]) -> list[bytes]:
    return encoder.on_block_start(int(payload["index"]), _object(payload, "content_block"))


def _delta(encoder: DialectEncoder, payload: dict[str, Any]) -> list[bytes]:
    return encoder.on_delta(int(payload["index"]), _object(payload, "delta"))


def _block_stop(encoder: DialectEncoder, payload: dict[str, Any]) -> list[bytes]:
    return encoder.on_block_stop(int(payload["index"]))


def _message_delta(encoder: DialectEncoder, payload: dict[str, Any]) -> list[bytes]:
    encoder._given_end = None  # the message's own end, after what its start gave
    return encoder.on_message_delta(payload)


def _message_stop(encoder: DialectEncoder, payload: dict[str, Any]) -> list[bytes]:
    given, encoder._given_end = encoder._given_end, None
    if given is not None:
        return encoder.on_message_delta(given) + encoder.on_message_stop()
    return encoder.on_message_stop()


def _error(encoder: DialectEncoder, payload: dict[str, Any]) -> list[bytes]:
    error = payload.get("error")
    return encoder.on_error(error if isinstance(error, dict) else {})


_HOOKS: Final[dict[str, Callable[[DialectEncoder, dict[str, Any]], list[bytes]]]] = {
    EventType.MESSAGE_START: _message_start,
    EventType.CONTENT_BLOCK_START: _block_start,
    EventType.CONTENT_BLOCK_DELTA: _delta,
    EventType.CONTENT_BLOCK_STOP: _block_stop,
    EventType.MESSAGE_DELTA: _message_delta,
    EventType.MESSAGE_STOP: _message_stop,
    EventType.ERROR: _error,
}
"""Each protocol event's hook, with what it takes out of the payload: the one dispatch."""

_ENCODE: Final = DialectEncoder.encode
"""The base's ``encode``: a subclass with its own gets every event through it, text
deltas handed over by a hub included (see ``encode_text_delta``)."""


set_public_module(__name__, globals(), __all__)
