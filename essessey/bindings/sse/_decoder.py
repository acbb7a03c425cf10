"""Reading the WHATWG "event stream" format, incrementally.

This follows "Interpreting an event stream" in the HTML standard (section 9.2.6) to the
letter. Rules, and why:
- The stream is split into lines on the bytes, then decoded as UTF-8 with U+FFFD for
  invalid sequences. CR, LF and ":" are ASCII bytes, which never occur inside a
  multi-byte UTF-8 sequence, so cutting at them never splits a character and gives
  exactly what decoding first would; a character split across chunks waits, undecoded,
  in the partial line until its line is complete. Working on bytes is also what lets
  the limits count bytes, and it leaves comments and ignored fields undecoded.
- One leading BOM (EF BB BF) is dropped, only at the very start of the stream, and it
  is recognised even when its bytes arrive in different chunks: the UTF-8 decode the
  standard names strips exactly one. A second BOM is text (here, part of a field name).
- A line ends at CRLF, at LF, or at a CR not followed by LF, and at nothing else:
  U+2028, U+0085, form feed and vertical tab are ordinary characters (so no
  ``str.splitlines``). A CR that ends a chunk ends its line at once, so an event is not
  held back waiting for the next chunk; an LF that then begins the next chunk is the
  rest of that CRLF and is swallowed.
- A line starting with ":" is a comment. Otherwise the field name runs to the first
  colon and the value follows it, minus exactly one leading space (so a value can keep
  a space of its own); a line without a colon is a field name with an empty value.
  Field names are compared exactly, with no case folding; unknown fields are ignored.
- ``data`` appends its value and an LF to the data buffer; ``event`` sets the event
  type; ``id`` sets the last event id buffer unless the value holds a NUL (a NUL could
  not be sent back in a ``Last-Event-ID`` header), and a bare ``id`` resets it to "";
  ``retry`` sets the reconnection time only when its value is all ASCII digits
  (``bytes.isdigit`` is ASCII-only, unlike ``str.isdigit``, which accepts "²").
- Only a blank line dispatches. The last event id becomes the buffer's value first,
  whether or not a message follows, and it persists across events. If the data buffer
  is empty nothing is dispatched (an ``event:`` or ``id:`` alone fires no message);
  otherwise one trailing LF is removed and a message goes out with the event type, or
  "message" when none was given. The data and event type buffers are then emptied.
- At the end of the stream an unterminated event is discarded: without its blank line
  it may be cut short, and a partial event must not pass for a whole one.
- Limits: a line longer than ``max_line_length`` or an event whose data buffer grows
  past ``max_event_size`` raises :class:`~essessey.errors.SSEDecodeError`. The partial
  line is measured as bytes arrive, so a server that never sends a line end cannot make
  the decoder hold more than the limit.
"""

from __future__ import annotations

import re
from contextlib import suppress
from typing import Final, NamedTuple, NoReturn

from essessey.errors import SSEDecodeError

__all__ = ["SSEDecoder", "SSEMessage"]

_BOM: Final = b"\xef\xbb\xbf"
_LINE_END: Final = re.compile(rb"\r\n|\r|\n")
_CR: Final = 0x0D
_LF: Final = 0x0A

_SPILL_AFTER: Final = 64
"""Data lines of an event held apart before they are joined into one buffer."""

# Event names are few; their decoded form is cached. Only short names are kept, so the
# cache stays small whatever a server sends.
_NAMES: dict[bytes, str] = {b"": "message"}
_NAME_CACHE_LIMIT: Final = 1024
_NAME_CACHE_MAX_BYTES: Final = 128


def _event_name(raw: bytes) -> str:
    name = raw.decode("utf-8", "replace")
    if len(raw) <= _NAME_CACHE_MAX_BYTES and len(_NAMES) < _NAME_CACHE_LIMIT:
        _NAMES[raw] = name
    return name


class SSEMessage(NamedTuple):
    """One dispatched message: its event type, its data, and the last event id.

    ``event`` is ``"message"`` when the event had no ``event`` field. ``id`` is the last
    event id when the message was dispatched ("" when none was ever set); it is not
    necessarily from this message's own fields, because an id persists across events.
    A named tuple, like :class:`~essessey.Event`: one is built per message.
    """

    event: str
    data: str
    id: str


class SSEDecoder:
    """Incremental decoder for the WHATWG event stream format.

    Feed it the body's bytes as they arrive, in chunks of any size; how the bytes are
    split never changes the messages. Call :meth:`close` at the end of the stream.

    ``last_event_id`` is the resume point to start from (the ``Last-Event-ID`` sent on
    reconnecting): messages carry it until the stream sets another. It cannot contain
    CR, LF or NUL, which no stream could have set.

    Limits, in bytes (a limit <= 0 raises ``ValueError``):
    ``max_line_length`` (default 16 MiB) bounds one line, the partial line included;
    ``max_event_size`` (default 16 MiB) bounds one event's data buffer. The line limit
    defaults as high as the event limit because the writer puts a whole JSON payload
    on one ``data:`` line: a lower one would reject events that the size limit allows.
    Exceeding either raises :class:`~essessey.errors.SSEDecodeError` and stops the
    decoder (messages completed earlier in the same chunk are not returned); every
    later :meth:`feed` raises it again.
    """

    __slots__ = (
        "_at_start",
        "_closed",
        "_data",
        "_data_size",
        "_error",
        "_event_type",
        "_id_buffer",
        "_last_event_id",
        "_max_event_size",
        "_max_line_length",
        "_partial",
        "_retry",
        "_skip_lf",
        "_spill",
    )

    def __init__(
        self,
        last_event_id: str = "",
        *,
        max_line_length: int = 16 << 20,
        max_event_size: int = 16 << 20,
    ) -> None:
        if max_line_length <= 0:
            raise ValueError("max_line_length must be a positive number of bytes")
        if max_event_size <= 0:
            raise ValueError("max_event_size must be a positive number of bytes")
        if "\0" in last_event_id or "\r" in last_event_id or "\n" in last_event_id:
            raise ValueError("a last event id cannot contain CR, LF or NUL")
        self._max_line_length = max_line_length
        self._max_event_size = max_event_size
        # The standard starts a fresh stream's id buffer at "", but a reconnecting
        # browser keeps its last event id: starting from the given one does the same,
        # so the first messages after a resume still carry the resume point.
        self._last_event_id = last_event_id
        self._id_buffer = last_event_id
        self._event_type = b""
        self._data: list[bytes] = []
        self._data_size = 0
        # An event's earlier data lines joined, once it has many: a line held as a bytes
        # object of its own costs about 40 bytes more than its length, which many short
        # lines would multiply past max_event_size.
        self._spill = bytearray()
        self._retry: int | None = None
        # The unterminated line so far. A bytearray, not a list of chunks: a line that
        # drips in a byte at a time must cost its length, not 40 bytes per chunk.
        self._partial = bytearray()
        self._skip_lf = False
        self._at_start = True
        self._closed = False
        self._error: str | None = None

    @property
    def last_event_id(self) -> str:
        """The last event id, as of the last blank line ("" when none was set).

        An id takes effect at the blank line that ends its event, as in a browser: a
        stream cut in the middle of an event resumes from the one before.
        """
        return self._last_event_id

    @property
    def retry(self) -> int | None:
        """The reconnection time the stream asked for, in milliseconds (None: not set)."""
        return self._retry

    @property
    def pending(self) -> int:
        """The bytes of an event begun and not dispatched yet (its data so far and an
        unterminated line): what :meth:`close` would discard now. Comment lines (a
        keep-alive's ``: ping``) leave nothing pending."""
        return self._data_size + len(self._partial)

    def feed(self, chunk: bytes | bytearray | memoryview) -> list[SSEMessage]:
        """Decode the next bytes of the stream; return the messages they complete.

        Raises :class:`~essessey.errors.SSEDecodeError` when a limit is exceeded and
        ``ValueError`` after :meth:`close`.
        """
        if self._closed:
            raise ValueError("SSEDecoder.feed() called after close()")
        if self._error is not None:
            raise SSEDecodeError(f"the SSE decoder stopped earlier: {self._error}")
        if not chunk:
            return []
        if type(chunk) is not bytes:
            chunk = bytes(chunk)  # bytearray and memoryview lines could not be dict keys
        if self._skip_lf:
            self._skip_lf = False
            if chunk[0] == _LF:
                chunk = chunk[1:]
                if not chunk:
                    return []
        if self._at_start:
            head = bytes(self._partial) + chunk
            if len(head) < len(_BOM) and _BOM.startswith(head):
                # Maybe the start of a BOM: wait for the bytes that decide.
                self._partial = bytearray(head)
                return []
            self._at_start = False
            self._partial = bytearray()
            chunk = head[len(_BOM) :] if head.startswith(_BOM) else head
            if not chunk:
                return []

        cut = max(chunk.rfind(b"\n"), chunk.rfind(b"\r")) + 1
        if not cut:
            self._partial += chunk
            if len(self._partial) > self._max_line_length:
                self._fail(f"a line is longer than max_line_length ({self._max_line_length} bytes)")
            return []
        if self._partial:
            self._partial += memoryview(chunk)[:cut]
            region = bytes(self._partial)
        else:
            region = chunk[:cut] if cut < len(chunk) else chunk
        if cut < len(chunk):
            self._partial = bytearray(memoryview(chunk)[cut:])
        else:
            self._partial = bytearray()
            # A CR ending the chunk ended its line; an LF starting the next chunk
            # completes that CRLF and must not count as a blank line.
            self._skip_lf = chunk[-1] == _CR
        limit = self._max_line_length
        if len(region) > limit or len(self._partial) > limit:
            self._check_line_lengths(region)

        # _CR is an int: found with one memchr (see _writer.encode).
        lines = _LINE_END.split(region) if _CR in region else region.split(b"\n")
        lines.pop()  # the region ends with a line end: after it comes an empty piece
        return self._process(lines)

    def close(self) -> list[SSEMessage]:
        """End the stream: discard an unterminated event and stop accepting bytes.

        Returns the messages the end completes, which is always none: only a blank line
        dispatches, and :meth:`feed` has handled every complete line. It returns a list
        anyway so that the end of a stream can be handled like any chunk.
        """
        self._closed = True
        self._partial = bytearray()
        self._data = []
        self._data_size = 0
        self._spill = bytearray()
        self._event_type = b""
        return []

    def _fail(self, reason: str) -> NoReturn:
        self._error = reason
        self._partial = bytearray()
        self._data = []
        self._data_size = 0
        self._spill = bytearray()
        raise SSEDecodeError(reason)

    def _check_line_lengths(self, region: bytes) -> None:
        # Only reached when a chunk (with the partial line before it) is longer than
        # the limit, which with the default limits and network-sized chunks is never.
        limit = self._max_line_length
        if len(self._partial) > limit or any(len(line) > limit for line in _LINE_END.split(region)):
            self._fail(f"a line is longer than max_line_length ({limit} bytes)")

    def _process(self, lines: list[bytes]) -> list[SSEMessage]:
        messages: list[SSEMessage] = []
        append = messages.append
        names = _NAMES
        data = self._data
        data_size = self._data_size
        max_event_size = self._max_event_size
        event_type = self._event_type
        id_buffer = self._id_buffer
        last_event_id = self._last_event_id
        for line in lines:
            if not line:
                last_event_id = id_buffer
                if data_size:
                    name = names.get(event_type)
                    if name is None:
                        name = _event_name(event_type)
                    joined: bytes | bytearray = b"\n".join(data)
                    if self._spill:
                        if data:
                            self._spill += b"\n"
                            self._spill += joined
                        joined, self._spill = self._spill, bytearray()
                    append(SSEMessage(name, joined.decode("utf-8", "replace"), id_buffer))
                    data = []
                    data_size = 0
                event_type = b""
                continue
            # A comment (a line starting with ":") has the empty field name, which
            # matches no field below and so is ignored, as it must be.
            field, _, value = line.partition(b":")
            if value[:1] == b" ":
                value = value[1:]
            if field == b"data":
                data.append(value)
                data_size += len(value) + 1
                if data_size > max_event_size:
                    self._fail(
                        f"an event's data is larger than max_event_size ({max_event_size} bytes)"
                    )
                if len(data) == _SPILL_AFTER:
                    if self._spill:
                        self._spill += b"\n"
                    self._spill += b"\n".join(data)
                    data = []
            elif field == b"event":
                event_type = value
            elif field == b"id":
                if b"\0" not in value:
                    id_buffer = value.decode("utf-8", "replace")
            elif field == b"retry" and value.isdigit():
                # Leading zeros are stripped because Python's int-from-string limit
                # (4300 digits by default, a guard against quadratic conversion) counts
                # them; more significant digits than that make no usable delay: ignored.
                with suppress(ValueError):
                    self._retry = int(value.lstrip(b"0") or b"0")
        self._data = data
        self._data_size = data_size
        self._event_type = event_type
        self._id_buffer = id_buffer
        self._last_event_id = last_event_id
        return messages
