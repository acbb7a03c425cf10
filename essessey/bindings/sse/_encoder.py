"""What a wire dialect is to the SSE response: an encoder of protocol events into its own
frames (docs/dialects.md).

A dialect (the AI SDK's UI message stream, AG-UI, OpenAI's Chat Completions or Responses
events) reads the same turn as the protocol's own SSE, in frames of its own. The SSE
response delivers any of them the same way (pings, the shutdown hand-off, the stalled
client timeout, the byte bounds); all a dialect supplies is a :class:`FrameEncoder`.

Why each rule:

- An encoder is stateful and serves one response: a dialect's frame often depends on
  what came before (which message is open, a tool call's index).
- Every frame an event becomes carries an ``id:`` (when the event has one): the last the
  event's own id, each one before it ``<event id>:<n>``, its place among the event's
  frames (:func:`frame_id`). A client that lost the connection part-way through an
  event's frames resumes by the last id it got and is sent exactly the frames after it:
  the hub re-encodes that event and skips the ``n`` it had.
- The ids are the protocol's own, whatever cursor the dialect also has, so a dialect
  resumes with ``Last-Event-ID`` on any replica like the protocol's SSE does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeAlias, runtime_checkable

from essessey.bindings.sse._format import encode, error_body
from essessey.event import Event
from essessey.protocol import EventType

__all__ = [
    "ErrorShape",
    "FrameEncoder",
    "ProtocolFrames",
    "TextDeltaEncoder",
    "TextDeltaFrames",
    "data_frame",
    "id_line",
    "with_id",
]

_MAX_FRAMES: int = 9999
"""The most frames one event may become with ids of their own (ids stay short)."""


def frame_id(event_id: str, place: int) -> str:
    """The id of frame ``place`` (1-based) of an event that becomes several frames, the
    last excepted, which carries ``event_id`` itself."""
    return f"{event_id}:{place}"


def split_frame_id(value: str) -> tuple[str, int]:
    """``(event id, n)`` for the id of a frame that is not an event's last
    (``<event id>:<n>``, see :func:`frame_id`), else ``(value, 0)``."""
    event_id, sep, place = value.rpartition(":")
    if (
        not sep
        or not event_id
        or not place.isascii()
        or not place.isdigit()
        or place[0] == "0"
        or len(place) > len(str(_MAX_FRAMES))
    ):
        return value, 0
    return event_id, int(place)


def _forbidden_in(value: bytes) -> bool:
    """Whether ``value`` holds CR, LF or NUL, each of which would end an SSE line early."""
    # The bytes as ints: an int is looked for with one memchr, a one-byte bytes needle
    # with the general search, several times slower (and an id is checked per event).
    return 10 in value or 13 in value or 0 in value


ErrorShape: TypeAlias = Callable[[str, str], bytes]
"""``shape(error_type, message) -> body``: the JSON a dialect answers an error with
before a stream starts (``error_body``, the protocol's, by default)."""


@runtime_checkable
class FrameEncoder(Protocol):
    """One response's protocol events, in order, as a dialect's SSE frames."""

    def encode(self, event: Event) -> bytes:
        """The frames for ``event`` (``b""`` when it writes none), each with an ``id:``
        when the event has one (:func:`with_id`)."""
        ...

    def finish(self) -> bytes:
        """The frames that end a stream whose events all came (a dialect's own end, such
        as ``data: [DONE]``); ``b""`` for none."""
        ...

    def fail(self, error_type: str, message: str) -> bytes:
        """The frames that tell the client the stream failed after it started, its end
        included (:meth:`finish` is not called after it)."""
        ...


@runtime_checkable
class TextDeltaEncoder(FrameEncoder, Protocol):
    """An encoder that writes a text delta from its text, without the event: a
    Publisher's text deltas, one by one or batched (an
    :class:`~essessey.event.EventBatch` with ``texts``), then skip decoding the event
    each would be read from. Detected once per response, on the encoder's class."""

    def encode_text(self, index: int, text: str, text_json: bytes) -> bytes | None:
        """The frames of one text delta of ``text`` (``text_json``: as JSON, orjson's)
        for block ``index`` (no id), as
        :meth:`encode` would write its event; None, having done nothing, when that is not
        an open text block (the event then goes through :meth:`encode`)."""
        ...


@runtime_checkable
class TextDeltaFrames(Protocol):
    """An encoder that writes a stored text delta, id included, from its fields: a hub's
    store hands a Publisher's text delta over to a dialect's response so (private to the
    bindings and the dialects' base; detected once per response)."""

    def encode_text_delta(
        self, index: int, text: str, text_json: bytes, event_id: bytes
    ) -> bytes | None:
        """What ``encode`` writes for the text delta of ``text`` (``text_json`` as JSON)
        for block ``index`` with id ``event_id`` (its ASCII bytes); None, having done
        nothing, when the event must go through ``encode``."""
        ...


class ProtocolFrames:
    """The protocol's own SSE: each event as one message, named by its type."""

    __slots__ = ()

    def encode(self, event: Event) -> bytes:
        """``encode(event)`` of ``essessey.bindings.sse``."""
        return encode(event)

    def finish(self) -> bytes:
        """Nothing: the protocol's turn ends with its own events."""
        return b""

    def fail(self, error_type: str, message: str) -> bytes:
        """An ``error`` event with the error's type and message."""
        return encode(Event(EventType.ERROR, error_body(error_type, message)))


def id_line(event_id: str) -> bytes:
    """``id: <event_id>`` and its line end, to go before an event's last frame.
    ValueError for an id holding CR, LF or NUL."""
    id_bytes = event_id.encode()
    # Inline, as in _forbidden_in: this runs for every event a dialect writes.
    if 10 in id_bytes or 13 in id_bytes or 0 in id_bytes:
        raise ValueError("an SSE id must not contain CR, LF or NUL")
    return b"id: " + id_bytes + b"\n"


def with_id(frames: list[bytes], event_id: str | None) -> bytes:
    """``frames`` (whole SSE messages) joined, each given an ``id:`` line when
    ``event_id`` is given: the last ``event_id``, each one before it its
    :func:`frame_id`; ``b""`` for no frames. ValueError for an id holding a line break or
    NUL, or for more than 9,999 frames."""
    if not frames:
        return b""
    if not event_id:
        return frames[0] if len(frames) == 1 else b"".join(frames)
    last = id_line(event_id) + frames[-1]
    if len(frames) == 1:
        return last
    if len(frames) > _MAX_FRAMES:
        raise ValueError(f"an event of more than {_MAX_FRAMES} frames")
    head = event_id.encode()
    return b"".join(
        [b"id: %s:%d\n%s" % (head, place, frame) for place, frame in enumerate(frames[:-1], 1)]
        + [last]
    )


def data_frame(data: bytes, *, id: str | None = None, event: str | None = None) -> bytes:
    """One SSE message whose data is one line of JSON (``data`` as orjson writes it):
    ``id:`` and ``event:`` first when given. ValueError when any of them holds a line
    break or NUL, which would end the message early."""
    head = b""
    if id:
        id_bytes = id.encode()
        if _forbidden_in(id_bytes):
            raise ValueError("an SSE id must not contain CR, LF or NUL")
        head = b"id: " + id_bytes + b"\n"
    if event is not None:
        name = event.encode()
        if _forbidden_in(name):
            raise ValueError("an SSE event name must not contain CR, LF or NUL")
        head += b"event: " + name + b"\n"
    if 10 in data or 13 in data:
        raise ValueError("a data frame's data must be one line")
    return head + b"data: " + data + b"\n\n"
