"""What a wire dialect is to the SSE response: an encoder of protocol events into its own
frames (docs/dialects.md).

A dialect (the AI SDK's UI message stream, AG-UI, OpenAI's Chat Completions or Responses
events) reads the same turn as the protocol's own SSE, in frames of its own. The SSE
response delivers any of them the same way (pings, the shutdown hand-off, the stalled
client timeout, the byte bounds); all a dialect supplies is a :class:`FrameEncoder`.

Why each rule:

- An encoder is stateful and serves one response: a dialect's frame often depends on
  what came before (which message is open, a tool call's index).
- The frames an event becomes end with that event's ``id:`` (when it has one), and only
  the last one carries it: a client that lost the connection part-way through an event's
  frames resumes from the event before, so it is sent whole again rather than cut.
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
    "data_frame",
    "id_line",
    "with_id",
]


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
        """The frames for ``event`` (``b""`` when it writes none), the last of them with
        the event's ``id:`` when it has one."""
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

    def encode_text(self, index: int, text: str) -> bytes | None:
        """The frames of one text delta of ``text`` for block ``index`` (no id), as
        :meth:`encode` would write its event; None, having done nothing, when that is not
        an open text block (the event then goes through :meth:`encode`)."""
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
    """``frames`` (whole SSE messages) joined, the last one given the ``id:`` line of
    ``event_id`` when there is one; ``b""`` for no frames. ValueError for an id holding a
    line break or NUL."""
    if not frames:
        return b""
    last = frames[-1]
    if event_id:
        last = id_line(event_id) + last
    if len(frames) == 1:
        return last
    frames[-1] = last
    return b"".join(frames)


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
