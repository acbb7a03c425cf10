"""The one place essessey reaches into uvicorn's internals (written against uvicorn 0.55,
with h11, httptools, and websockets' sans-I/O implementation).

ASGI gives an app three things it cannot do through ``send``: abort a connection whose
client stopped reading (:func:`connection_aborter`), end one whose client is gone without
a word (:func:`limit_unacknowledged`), and write a response body's chunk or
a WebSocket frame without the server's per-message work (:func:`body_writer`,
:func:`frame_writer`). uvicorn has no public API for either, so both find the connection
the way uvicorn runs an app: the current task is its ``run_asgi``, whose ``self`` (the
request's cycle) holds the connection's ``transport``. Everything here is duck typed
(uvicorn is never imported) and checked before it is used; anything unexpected (another
server, a middleware that wraps ``send``) means "not found", and the bindings go through
ASGI as any app does.

Switch: ``ESSESSEY_UVICORN_INTERNALS=off`` (or ``0``, ``false``, ``no``) in the
environment when the process starts makes every function here answer "not found": every
byte goes through ASGI and a stalled connection is left to uvicorn. For a uvicorn release
the tests flag, or to rule these paths out while debugging. tests/test_server_reach.py
fails loudly, under every HTTP and WebSocket implementation uvicorn is run with in the
tests, when one of these stops being found.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

from essessey.bindings._starlette import unwrap_send

__all__ = [
    "ENABLED",
    "BodyWriter",
    "FrameWriter",
    "body_writer",
    "connection_aborter",
    "frame_writer",
    "limit_unacknowledged",
]

logger = logging.getLogger("essessey.bindings")

_SWITCH: Final = os.environ.get("ESSESSEY_UVICORN_INTERNALS", "on").strip().lower()
ENABLED: bool = _SWITCH not in ("off", "0", "false", "no")
"""Whether uvicorn's internals are reached for (the environment switch, read at import)."""


def _current_cycle() -> Any:
    """uvicorn's cycle (its per-request object) for the current task, or None (always
    None with the switch off)."""
    if not ENABLED:
        return None
    task = asyncio.current_task()
    frame = getattr(task.get_coro() if task is not None else None, "cr_frame", None)
    return frame.f_locals.get("self") if frame is not None else None


def _transport_of(cycle: Any) -> Any:
    transport = getattr(cycle, "transport", None)
    if all(
        callable(getattr(transport, name, None))
        for name in ("abort", "write", "is_closing", "get_write_buffer_size")
    ):
        return transport
    return None


def connection_aborter() -> Callable[[], bool]:
    """A function that aborts the server's connection of the current request, when it
    still holds bytes the client has not taken; it returns whether it did.

    Call it from the request's own task (where the ASGI app was called), before the
    connection could stall; call what it returns when a send stalled past its timeout.

    ASGI has no way to say "abort". uvicorn closes the transport when the app returns,
    and an asyncio transport closes gracefully: it waits for its buffer to drain, which a
    client that stopped reading never lets happen, so the socket, its kernel buffers and
    the unsent bytes would stay until that client leaves. Under another server the function
    does nothing. Nothing is aborted while the
    buffer is empty: such a connection closes by itself (and with HTTP/2 it may carry
    other streams).
    """
    transport = _transport_of(_current_cycle())
    if transport is None:
        return _no_abort
    abort = transport.abort
    buffered = transport.get_write_buffer_size

    def abort_if_stalled() -> bool:
        if not buffered():
            return False
        logger.debug("aborting the stalled connection (%d bytes unsent)", buffered())
        extra = getattr(transport, "get_extra_info", None)
        sock = extra("socket") if callable(extra) else None
        if sock is not None:
            # A reset, not a FIN (SO_LINGER on, 0 s): closed with bytes unsent, the
            # socket would otherwise stay in the kernel, buffers and all, for minutes,
            # probing a receive window that never opens.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        abort()
        return True

    return abort_if_stalled


def _no_abort() -> bool:
    return False


# How much longer than a response's send_timeout the kernel waits for an acknowledgment:
# a send that stalls (a client that stopped reading) is the response's to report and
# reset, with its warning, before the kernel ends the connection without one.
_AFTER_SEND_TIMEOUT: Final = 5.0


def limit_unacknowledged(send_timeout: float | None) -> int | None:
    """Have the kernel end the current request's connection once bytes it sent stay
    unacknowledged for a few seconds past ``send_timeout`` (``TCP_USER_TIMEOUT``, where
    the platform has it); the limit it set, in milliseconds, or None.

    A client whose network went away without a word (a laptop closed, Wi-Fi gone: no
    FIN, no reset) still takes writes: the kernel buffers them and retransmits for about
    fifteen minutes before it gives up, and a stream with a ping every few seconds never
    fills the buffer that would stall a send. With the limit, the connection fails after
    that long without an acknowledgment, the server reports the disconnect, and the
    response ends as for a client that left. A live client acknowledges what it gets, so
    a slow one is not cut. Call it from the request's own task.
    """
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    if send_timeout is None or option is None:
        return None
    transport = _transport_of(_current_cycle())
    extra = getattr(transport, "get_extra_info", None)
    sock = extra("socket") if callable(extra) else None
    if sock is None:
        return None
    milliseconds = round((send_timeout + _AFTER_SEND_TIMEOUT) * 1000)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, option, milliseconds)
        set_to: int = sock.getsockopt(socket.IPPROTO_TCP, option)
    except (OSError, ValueError):
        # Not a TCP socket (a Unix one), the option refused, or (uvloop's socket, its
        # descriptor -1) the client gone already: its disconnect ends the response.
        return None
    return set_to


# -- writing a body's chunks straight to the transport -------------------------------


def _sends_to(send: Any, cycle: Any) -> bool:
    """Whether ``send`` is ``cycle``'s own send, under nothing but Starlette's observing
    wrappers."""
    inner = unwrap_send(send)
    return getattr(inner, "__self__", None) is cycle and getattr(inner, "__name__", None) == "send"


_FLOW_LIMIT: Final = 64 * 1024
"""Bytes the transport may already hold for a direct write to go ahead (asyncio's own
high-water mark): above it, the write goes through ASGI, whose send waits for the client."""


class BodyWriter:
    """Writes an HTTP/1.1 chunked response body's chunks straight to uvicorn's
    transport: what the server's ``send`` would write, byte for byte, without its
    per-message work (for h11, most of what a send costs).

    :meth:`write` does it only while it is safe: the response started, chunked, not
    ended, the transport open and not holding more than asyncio's high-water mark. When
    it returns False nothing was written, and the caller sends the chunk through ASGI
    (whose send waits for a slow client, so the flow control and the stalled-send watch
    stay ASGI's).
    """

    __slots__ = ("_buffered", "_chunked", "_closing", "_cycle", "_write")

    def __init__(self, cycle: Any, transport: Any) -> None:
        self._cycle = cycle
        # The transport's methods, bound once: three lookups fewer per chunk.
        self._buffered: Callable[[], int] = transport.get_write_buffer_size
        self._closing: Callable[[], bool] = transport.is_closing
        self._write: Callable[[bytes], object] = transport.write
        self._chunked: bool | None = None  # known once the response has started

    def _is_chunked(self) -> bool:
        cycle = self._cycle
        if not getattr(cycle, "response_started", False):
            return False  # not yet: asked again on the next write
        # httptools: uvicorn frames the body itself and says how.
        chunked = getattr(cycle, "chunked_encoding", None)
        if chunked is None:
            # h11: a response without a length to an HTTP/1.1 peer is chunked (the
            # caller has checked that the response has neither length nor encoding).
            version = getattr(getattr(cycle, "conn", None), "their_http_version", None)
            chunked = version == b"1.1"
        self._chunked = chunked is True
        return self._chunked

    def write(self, chunk: bytes) -> bool:
        """Write ``chunk`` as one chunk of the body now; False, having written nothing,
        when it must go through ASGI instead."""
        if not chunk:
            return True  # an empty chunk would end a chunked body; ASGI writes nothing
        if not (self._chunked or (self._chunked is None and self._is_chunked())):
            return False
        # A client gone closes the transport (uvicorn's connection_lost), so is_closing()
        # covers it; the body's end is the cycle's.
        if self._buffered() > _FLOW_LIMIT or self._closing() or self._cycle.response_complete:
            return False
        self._write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
        return True


def body_writer(
    send: Any, method: str, status: int, headers: Iterable[tuple[bytes, bytes]]
) -> BodyWriter | None:
    """A :class:`BodyWriter` for the current request's response, or None when the
    chunks must go through ASGI: another server, a ``send`` wrapped by a middleware that
    may change the body (anything but Starlette's own observing wrappers), a HEAD
    request, a status without a body, or a response that sets its own length or
    encoding. Call it from the request's own task, before the response starts."""
    if method == "HEAD" or status < 200 or status in (204, 304):
        return None
    for name, _ in headers:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            return None
    cycle = _current_cycle()
    transport = _transport_of(cycle)
    if (
        transport is None
        or not isinstance(getattr(cycle, "response_started", None), bool)
        or not isinstance(getattr(cycle, "response_complete", None), bool)
        or not _sends_to(send, cycle)
    ):
        return None
    return BodyWriter(cycle, transport)


# -- writing a WebSocket's text frames straight to the transport ----------------------


class FrameWriter:
    """Writes WebSocket text frames straight to uvicorn's transport: the frame its
    ``send`` would write (a server's frames are not masked), without the per-message work
    of its protocol object.

    Only on uvicorn's websockets-sansio implementation (its default) and only when no
    extension was negotiated (permessage-deflate would have to compress the frame). As
    :class:`BodyWriter`, :meth:`write` returns False, having written nothing, whenever
    the frame must go through ASGI: the connection no longer open (either side closing),
    the transport closing or holding more than asyncio's high-water mark.
    """

    __slots__ = ("_conn", "_cycle", "_open", "_transport")

    def __init__(self, cycle: Any, conn: Any, transport: Any) -> None:
        self._cycle = cycle
        self._conn = conn
        self._transport = transport
        self._open = conn.state  # the state's OPEN, read while it is open (no import)

    def _writable(self) -> bool:
        transport = self._transport
        return not (
            transport.get_write_buffer_size() > _FLOW_LIMIT
            or transport.is_closing()
            or self._conn.state is not self._open
            or self._cycle.close_sent
        )

    def write(self, payload: bytes) -> bool:
        """Write ``payload`` (UTF-8 text) as one text frame now; False when it must go
        through ASGI instead."""
        if not self._writable():
            return False
        self._transport.write(_text_head(len(payload)) + payload)
        return True

    def write_joined(self, payloads: Sequence[bytes]) -> bool:
        """Write each of ``payloads`` as a text frame, all in one write to the transport
        now; False, having written none, when they must go through ASGI instead."""
        if not self._writable():
            return False
        self._transport.write(b"".join([_text_head(len(p)) + p for p in payloads]))
        return True


def _text_head(size: int) -> bytes:
    """The head of an unmasked text frame of ``size`` bytes (a server's frames are not
    masked)."""
    if size < 126:
        return _TEXT_HEADS[size]
    if size < 65536:
        return b"\x81\x7e" + size.to_bytes(2, "big")
    return b"\x81\x7f" + size.to_bytes(8, "big")


_TEXT_HEADS: Final = tuple(bytes((0x81, size)) for size in range(126))


def frame_writer() -> FrameWriter | None:
    """A :class:`FrameWriter` for the current WebSocket connection, or None when frames
    must go through ASGI (another server or implementation, an extension negotiated, the
    handshake not done). Call it from the connection's own task, after the accept."""
    cycle = _current_cycle()
    transport = _transport_of(cycle)
    conn = getattr(cycle, "conn", None)
    state = getattr(conn, "state", None)
    if (
        transport is None
        # websockets' own protocol object (uvicorn's websockets-sansio), nothing else
        or not type(conn).__module__.startswith("websockets.")
        or getattr(state, "name", None) != "OPEN"
        or getattr(conn, "extensions", None) != []
        or getattr(cycle, "handshake_complete", None) is not True
        or getattr(cycle, "close_sent", None) is not False
    ):
        return None
    return FrameWriter(cycle, conn, transport)
