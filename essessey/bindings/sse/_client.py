"""Reading an SSE stream back into events: :class:`SSESource` over any async byte iterator,
and :func:`connect`, which opens one with an ``httpx.AsyncClient``.

Why it is shaped this way:
- A Source must never make a broken transport look like the end of a stream (docs/sse.md,
  "Reading a stream back"), so an exception from the byte iterator propagates unchanged;
  only the bytes running out ends the iteration.
- The status and the content type are checked before a single byte is decoded: an error
  answered as JSON (or HTML from a proxy) would otherwise decode as a stream without
  events and end "cleanly". The error body is read only up to a cap, because the server
  that sent it is by definition not behaving as expected.
- httpx is imported only for type checking and inside :func:`connect`, so the SSE binding
  (and the core) import without the ``client`` extra.
"""

from __future__ import annotations

import codecs
import contextlib
import logging
import zlib
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator
from typing import TYPE_CHECKING, Any, Final

import orjson

from essessey.bindings.sse._decoder import SSEDecoder
from essessey.bindings.sse._inflate import Inflater, inflatable
from essessey.errors import StreamHTTPError
from essessey.event import Event

if TYPE_CHECKING:
    import httpx

__all__ = ["MAX_ERROR_BODY", "SSEEventStream", "SSESource", "connect"]

logger = logging.getLogger("essessey.sse")

MAX_ERROR_BODY: Final = 64 * 1024
"""How many bytes of an error answer :func:`connect` reads, at most."""

_MAX_ERROR_MESSAGE: Final = 1024
_EVENT_STREAM: Final = "text/event-stream"
_PIECE: Final = 64 * 1024  # the most a decoded chunk hands the decoder at once
# Two adjacent line-terminator bytes, other than the CRLF pair, always mean an empty line
# ("\r\n\n" holds "\n\n", "\n\r\n" holds "\n\r", "\r\r\n" holds "\r\r").
_BLANK_LINE_PAIRS: Final = (b"\n\n", b"\r\r", b"\n\r")


def _last_blank_line_end(data: bytes) -> int:
    """The offset just past the last empty line in ``data``, or -1 when it holds none."""
    start = max(data.rfind(pair) for pair in _BLANK_LINE_PAIRS)
    if start < 0:
        return -1
    end = start + 2
    # A CR followed by LF is one line ending; the LF belongs to the empty line.
    if data[start + 1] == 0x0D and end < len(data) and data[end] == 0x0A:
        end += 1
    return end


class _PendingCounter:
    """Counts the bytes received since the last empty line: what the decoder will throw
    away if the stream ends now. It only looks at line endings, so it costs a few reverse
    scans per chunk and never needs the decoder's internals."""

    __slots__ = ("carry", "pending")

    def __init__(self) -> None:
        # The stream starts at the beginning of a line, as if after a line ending.
        self.carry = b"\n"
        self.pending = 0

    def feed(self, chunk: bytes) -> None:
        end = _last_blank_line_end(chunk)
        if end >= 0:
            self.pending = len(chunk) - end
        else:
            # An empty line may straddle the chunk boundary (or be one a CR ended at the
            # end of the last chunk, whose LF arrives now).
            edge = self.carry + chunk[:2]
            end = _last_blank_line_end(edge)
            if end >= 0:
                self.pending = len(chunk) - (end - len(self.carry))
            else:
                self.pending += len(chunk)
        self.carry = (self.carry + chunk[-2:])[-2:]


def _to_event(event: str, data: str, event_id: str) -> Event:
    return Event(event, data.encode("utf-8"), event_id or None)


class SSESource:
    """The events of an SSE byte stream, as an async iterable of :class:`~essessey.Event`.

    ``byte_iterator`` is any async iterable of bytes (``httpx.Response.aiter_bytes()``,
    a socket reader, a generator). Iteration ends when the bytes end; an unterminated last
    event is discarded, as the WHATWG algorithm says, with a warning giving its size. An
    exception from ``byte_iterator`` propagates as it is, and an SSE limit exceeded raises
    :class:`~essessey.errors.SSEDecodeError`. ``last_event_id`` and ``retry`` follow the
    stream, so a caller can reconnect where it stopped. A source can be iterated once.
    """

    __slots__ = ("_bytes", "_decoder", "_events", "_last_event_id")

    def __init__(
        self,
        byte_iterator: AsyncIterable[bytes],
        *,
        last_event_id: str = "",
        max_line_length: int | None = None,
        max_event_size: int | None = None,
    ) -> None:
        limits: dict[str, int] = {}
        if max_line_length is not None:
            limits["max_line_length"] = max_line_length
        if max_event_size is not None:
            limits["max_event_size"] = max_event_size
        self._decoder = SSEDecoder(last_event_id, **limits)
        self._bytes = byte_iterator
        self._events: AsyncGenerator[Event, None] | None = None
        self._last_event_id = last_event_id

    @property
    def last_event_id(self) -> str:
        """The id of the last event handed out ("" when none): the ``Last-Event-ID`` to
        send on reconnecting, so that no event is skipped and none is repeated."""
        return self._last_event_id

    @property
    def retry(self) -> int | None:
        """The reconnection delay the stream asked for, in milliseconds, or None."""
        return self._decoder.retry

    def __aiter__(self) -> AsyncIterator[Event]:
        if self._events is not None:
            raise RuntimeError("an SSESource can be iterated only once")
        self._events = self._iterate()
        return self._events

    async def aclose(self) -> None:
        """Stop reading and close the byte iterator (when it has an ``aclose``)."""
        if self._events is not None:
            await self._events.aclose()
        # A generator never started skips its ``finally``: close the bytes here too.
        await _aclose(self._bytes)

    async def _iterate(self) -> AsyncGenerator[Event, None]:
        decoder = self._decoder
        counter = _PendingCounter()
        chunks = aiter(self._bytes)
        try:
            async for chunk in chunks:
                if not chunk:
                    continue
                counter.feed(chunk)
                for message in decoder.feed(chunk):
                    # The decoder has read the whole chunk, maybe past events not yet
                    # handed out; resuming from its id would skip them.
                    self._last_event_id = message.id
                    yield _to_event(message.event, message.data, message.id)
                # An id-only event (no data) moves the resume point without a message.
                self._last_event_id = decoder.last_event_id
            # Bytes after the last blank line are an event cut short only when they began
            # one (a keep-alive's comment lines do not).
            cut = decoder.pending > 0
            final = decoder.close()
            for message in final:
                self._last_event_id = message.id
                yield _to_event(message.event, message.data, message.id)
            if cut and counter.pending and not final:
                # The size only: the bytes are model output.
                logger.warning(
                    "SSE stream ended inside an event; discarded %d bytes after the last "
                    "blank line",
                    counter.pending,
                )
        finally:
            await _aclose(chunks)


async def _aclose(iterable: object) -> None:
    # An async generator left at a yield is closed now, not when the garbage collector
    # gets to it; any other iterable owns its own end.
    if isinstance(iterable, AsyncGenerator):
        await iterable.aclose()


class SSEEventStream:
    """The events of one response opened by :func:`connect`: an async iterable of
    :class:`~essessey.Event`, with the ``response`` (status, headers) at hand and the
    stream's ``last_event_id`` and ``retry`` for a reconnect."""

    __slots__ = ("_source", "response")

    def __init__(self, response: httpx.Response, source: SSESource) -> None:
        self.response = response
        self._source = source

    @property
    def last_event_id(self) -> str:
        """The id of the last event handed out ("" when none), for ``Last-Event-ID``."""
        return self._source.last_event_id

    @property
    def retry(self) -> int | None:
        """The reconnection delay the stream asked for, in milliseconds, or None."""
        return self._source.retry

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._source.__aiter__()

    async def aclose(self) -> None:
        """Stop reading the stream."""
        await self._source.aclose()


@contextlib.asynccontextmanager
async def connect(
    client: httpx.AsyncClient,
    method: str,
    url: httpx.URL | str,
    *,
    last_event_id: str | None = None,
    max_error_body: int = MAX_ERROR_BODY,
    max_line_length: int | None = None,
    max_event_size: int | None = None,
    **kwargs: Any,
) -> AsyncIterator[SSEEventStream]:
    """Open an SSE stream with ``client`` and yield its :class:`SSEEventStream`.

    Sends ``Accept: text/event-stream``, ``Cache-Control: no-cache`` and
    ``Accept-Encoding: identity`` (unless ``headers`` in ``kwargs`` set them: a stream
    compressed is held back by its compressor, and a small compressed body can inflate
    to gigabytes) and ``Last-Event-ID`` when ``last_event_id`` is given; other
    ``kwargs`` go to ``client.stream``; redirects are followed, as EventSource follows
    them (``follow_redirects=False`` in ``kwargs`` to refuse them). A non-2xx answer, a
    204 (no content: the spec's "do not reconnect"), or a 2xx one that is not
    ``text/event-stream`` raises :class:`~essessey.errors.StreamHTTPError` after reading at
    most ``max_error_body`` bytes of the body. The id is sent as UTF-8, as the spec writes
    it. The response is closed when the block exits.
    """
    import httpx

    if last_event_id and any(char in last_event_id for char in "\r\n\0"):
        # No stream can set such an id, and it would break the header line.
        raise ValueError("a last event id cannot contain CR, LF or NUL")
    if last_event_id and last_event_id != last_event_id.strip(" \t"):
        # A stream can set one (the spec strips one space after the colon), but no header
        # value can carry it: HTTP trims a value's surrounding whitespace.
        raise ValueError("a last event id with leading or trailing whitespace cannot be sent")
    kwargs.setdefault("follow_redirects", True)
    headers = httpx.Headers(kwargs.pop("headers", None))
    headers.setdefault("Accept", _EVENT_STREAM)
    headers.setdefault("Cache-Control", "no-cache")
    headers.setdefault("Accept-Encoding", "identity")
    if last_event_id:
        # As UTF-8 bytes: httpx writes a str value as ASCII, and an id a stream set may
        # hold any character.
        raw = [(k, v) for k, v in headers.raw if k.lower() != b"last-event-id"]
        headers = httpx.Headers([*raw, (b"Last-Event-ID", last_event_id.encode())])
    async with client.stream(method, url, headers=headers, **kwargs) as response:
        content_type = response.headers.get("content-type")
        status = response.status_code
        if not 200 <= status < 300 or status == 204 or not _is_event_stream(content_type):
            raise await _http_error(response, content_type, max_error_body)
        source = SSESource(
            _body(response),
            last_event_id=last_event_id or "",
            max_line_length=max_line_length,
            max_event_size=max_event_size,
        )
        stream = SSEEventStream(response, source)
        try:
            yield stream
        finally:
            await stream.aclose()


async def _body(response: httpx.Response) -> AsyncIterator[bytes]:
    """The response's body decoded, in pieces of at most ``_PIECE`` bytes: gzip and
    deflate (what a server sends uninvited) inflated a piece at a time, however far a
    network read inflates; other codings through httpx's decoders."""
    import httpx

    codings = [
        coding.strip().lower()
        for coding in response.headers.get_list("content-encoding", split_commas=True)
    ]
    codings = [coding for coding in codings if coding and coding != "identity"]
    if not codings or not inflatable(codings):
        async for chunk in _bounded(response.aiter_bytes()):
            yield chunk
        return
    inflater = Inflater(codings, _PIECE)
    try:
        async for raw in response.aiter_raw():
            for piece in inflater.feed(raw):
                yield piece
        for piece in inflater.flush():
            yield piece
    except zlib.error as exc:
        # What httpx raises for a body its codings cannot decode.
        raise httpx.DecodingError(str(exc), request=response.request) from None


async def _bounded(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``chunks`` in pieces of at most ``_PIECE`` bytes, none held back: a compressed
    body the server sent anyway inflates a network read many times over, and the
    decoder makes every event of a chunk at once."""
    async for chunk in chunks:
        if len(chunk) <= _PIECE:
            yield chunk
        else:
            for start in range(0, len(chunk), _PIECE):
                yield chunk[start : start + _PIECE]


def _is_event_stream(content_type: str | None) -> bool:
    if content_type is None:
        return False
    return content_type.partition(";")[0].strip().lower() == _EVENT_STREAM


async def _http_error(
    response: httpx.Response, content_type: str | None, limit: int
) -> StreamHTTPError:
    raw = await _read_bounded(response, limit)
    body: object
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = _decode_text(raw, response.charset_encoding)
    error_type, message = _error_fields(body)
    if message is None and not isinstance(body, dict):
        text = body if isinstance(body, str) else _decode_text(raw, response.charset_encoding)
        message = _truncate(text.strip()) or None
    if message is None and 200 <= response.status_code < 300:
        message = f"expected {_EVENT_STREAM}, got {content_type or 'no content type'}"
    logger.debug(
        "SSE request answered %d (%s), %d body bytes read",
        response.status_code,
        content_type,
        len(raw),
    )
    return StreamHTTPError(
        response.status_code, error_type, message, body, content_type=content_type
    )


async def _read_bounded(response: httpx.Response, limit: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    async for chunk in _body(response):
        parts.append(chunk)
        size += len(chunk)
        if size >= limit:
            # The rest is never read: closing the response drops the connection.
            break
    return b"".join(parts)[:limit]


def _decode_text(raw: bytes, charset: str | None) -> str:
    encoding = "utf-8"
    if charset:
        with contextlib.suppress(LookupError):  # an unknown charset: assume UTF-8
            encoding = codecs.lookup(charset).name
    return raw.decode(encoding, errors="replace")


def _error_fields(body: object) -> tuple[str | None, str | None]:
    """``(error_type, message)`` from either error shape seen in the wild:
    ``{"type": "error", "error": {"type": ..., "message": ...}}`` and
    ``{"message": ..., "error": "token_revoked"}``."""
    if not isinstance(body, dict):
        return None, None
    error_type: str | None = None
    message: str | None = None
    error = body.get("error")
    if isinstance(error, dict):
        error_type = _string(error.get("type"))
        message = _string(error.get("message"))
    elif isinstance(error, str):
        error_type = error
    if message is None:
        message = _string(body.get("message"))
    return error_type, message


def _string(value: object) -> str | None:
    return _truncate(value) if isinstance(value, str) else None


def _truncate(text: str) -> str:
    if len(text) <= _MAX_ERROR_MESSAGE:
        return text
    return text[:_MAX_ERROR_MESSAGE] + "…"
