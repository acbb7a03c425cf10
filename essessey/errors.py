"""The exceptions essessey raises, every one of them, in one place (the bindings' too:
they are defined here, not in the modules that raise them). Import them from the top
level, ``essessey.StreamBusy``, which is also the name their ``repr`` and tracebacks give.

Every exception derives from :class:`EssesseyError`, so an application can catch the
library's failures without catching its own. Wrapping code adds context with
``add_note`` instead of re-raising a new type, so ``except ProtocolError`` keeps working
however deep the failure happened.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from essessey._logsafe import log_label

__all__ = [
    "AnswerConflict",
    "AnswerExpired",
    "AnswerRefused",
    "EssesseyError",
    "InvalidAnswer",
    "JetStreamUnavailable",
    "LeaseLost",
    "MessagesNotRetained",
    "NATSConnectionLost",
    "NotWaiting",
    "ProtocolError",
    "ProviderStreamError",
    "RedisUnavailable",
    "RoundOrderError",
    "SSEDecodeError",
    "SerializationError",
    "StoreFull",
    "StoreUnavailable",
    "StreamBusy",
    "StreamHTTPError",
    "StreamInterrupted",
    "StreamNotFound",
    "StreamRejected",
    "StreamReset",
    "SubscriberLagged",
    "TooManySubscribers",
    "UnknownEventId",
    "WebSocketClosed",
]


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken rule: where (0-based event position), which event, which rule, what.

    Imported from :mod:`essessey.check`, whose checker reports it; defined here because
    :class:`ProtocolError` carries it."""

    position: int
    event: str
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"#{self.position} {self.event}: [{self.rule}] {self.detail}"


class EssesseyError(Exception):
    """Base class of every exception the library raises on purpose."""


class ProtocolError(EssesseyError):
    """An event would break a rule of the protocol; nothing was emitted.

    Raised by a strict :class:`~essessey.Publisher` and by the streamers when a call
    comes out of order. ``violations`` lists what the checker found.
    """

    def __init__(self, message: str, violations: Sequence[Violation] = ()) -> None:
        super().__init__(message)
        self.violations: tuple[Violation, ...] = tuple(violations)


class RoundOrderError(ProtocolError):
    """A :class:`~essessey.adapters.RoundStream` call came out of order (a tool call
    started out of turn, a result for an unknown call, reasoning after the round's tool
    calls); nothing was emitted and the round is unchanged."""


class ProviderStreamError(EssesseyError):
    """A provider's stream failed: it sent an ``error`` event, or ended before
    ``message_stop`` (raised by :func:`essessey.adapters.anthropic.stream_round`).

    ``error_type`` and ``message`` are the provider's (``api_error`` and a fixed message
    for a stream cut short); ``request_id`` is the provider's request id when it sent
    one. The string form names the type only, never the message.
    """

    def __init__(self, error_type: str, message: str, request_id: str | None = None) -> None:
        super().__init__(f"the provider stream failed with {log_label(error_type)}")
        self.error_type = error_type
        self.message = message
        self.request_id = request_id


class SerializationError(EssesseyError, TypeError):
    """A payload could not be serialised to JSON; nothing was emitted."""


class SSEDecodeError(EssesseyError, ValueError):
    """An SSE stream broke a configured limit (line length, event size); decoding stops.

    Only limits raise: malformed lines are handled the way the WHATWG algorithm says
    (ignored), never by an exception.
    """


class StreamRejected(EssesseyError):
    """Raised by a producer (or a source) before its first event to refuse a stream.

    The SSE response answers with ``status`` and a JSON body in the Anthropic error shape,
    ``{"type": "error", "error": {"type": error_type, "message": message}}``, instead of
    an event stream.
    """

    def __init__(self, status: int, error_type: str, message: str) -> None:
        super().__init__(f"{status} {error_type}: {message}")
        self.status = status
        self.error_type = error_type
        self.message = message


class StreamInterrupted(EssesseyError):
    """Raised by a source of an SSE response to end it early, its turn not over: the
    store went out of reach, or the subscriber fell behind.

    The response ends its body with nothing more (no error event, no dialect's end, never
    ``empty_status``), so the client reconnects with its last event id and resumes.
    """


class StreamHTTPError(EssesseyError):
    """A server answered a stream request with a non-2xx status or a non-SSE body.

    ``error_type`` and ``message`` are read from either error shape seen in the wild:
    ``{"type": "error", "error": {"type": ..., "message": ...}}`` and
    ``{"message": ..., "error": "token_revoked"}``; ``body`` keeps the parsed JSON (or the
    text, when the body is not JSON).
    """

    def __init__(
        self,
        status: int,
        error_type: str | None,
        message: str | None,
        body: object,
        *,
        content_type: str | None = None,
    ) -> None:
        super().__init__(f"HTTP {status}: {error_type or 'error'}: {message or ''}".rstrip(": "))
        self.status = status
        self.error_type = error_type
        self.message = message
        self.body = body
        self.content_type = content_type


class StreamNotFound(EssesseyError, LookupError):
    """No stream with this id is retained (never started, cleared, or expired)."""


class UnknownEventId(EssesseyError):
    """A last event id the store cannot resume from without a gap: evicted, never seen,
    or from before the stream was reset (another epoch). Resume from the start instead."""


class MessagesNotRetained(EssesseyError):
    """A reader without a last event id asked for a stream none of whose messages is
    retained whole (the oldest were evicted, the rest is a message's tail) and on which
    no new message will start: its turn ended. Half a message is never given instead;
    the client has nothing to show from this stream and starts a new turn."""


class SubscriberLagged(EssesseyError):
    """A subscriber fell too far behind the stream's head and was ended; it resumes by
    the id of the last event it received."""


class StreamReset(EssesseyError):
    """The stream was cleared while a subscriber was following it."""


class StreamBusy(EssesseyError):
    """A turn is already running on this stream id (in this hub, or on another replica
    that holds the stream's lease in a shared store)."""


class AnswerRefused(EssesseyError):
    """An answer to a turn that asks was refused; nothing was written. ``status`` is the
    HTTP status a route answers with (400 for a bad answer, 409 for one that comes at the
    wrong time), ``code`` a short machine-readable name."""

    status = 409
    code = "answer_refused"


class NotWaiting(AnswerRefused):
    """The stream does not wait for an answer: its last message asks nothing, or its turn
    is still running."""

    code = "not_waiting"


class InvalidAnswer(AnswerRefused):
    """The answer names a request the stream does not wait for, leaves one of its requests
    unanswered, or answers one in the wrong kind (an output for an approval, say)."""

    status = 400
    code = "invalid_answer"


class AnswerConflict(AnswerRefused):
    """The requests were answered already, differently: the first answer stands."""

    code = "already_answered"


class AnswerExpired(AnswerRefused):
    """A request's ``expires_at`` has passed: answers are no longer taken."""

    code = "answer_expired"


class LeaseLost(EssesseyError):
    """This replica's turn no longer holds its stream's lease (it was not renewed in
    time, and the turn was ended or started again elsewhere): nothing more of it is
    written."""


class TooManySubscribers(EssesseyError):
    """The stream already has its maximum number of subscribers."""


class StoreFull(EssesseyError):
    """The event store holds as many streams as it may, and every one of them has a turn
    running: no other turn can start until one ends (the demo answers 503)."""


class StoreUnavailable(EssesseyError):
    """The event store cannot be reached right now (a broker down past its retry budget).

    A subscription that hits it ends without an error event, so a client reconnects by
    its last id once the store is back; a producer that hits it fails its turn.
    """


class JetStreamUnavailable(StoreUnavailable):
    """JetStream did not store an event (or marker) within ``publish_timeout`` seconds,
    or the NATS connection is closed. The cause is chained (``__cause__``)."""


class RedisUnavailable(StoreUnavailable):
    """Redis did not answer within ``retry_timeout`` seconds. The cause is chained."""


class NATSConnectionLost(EssesseyError):
    """The NATS connection closed while a :class:`~essessey.bindings.nats.NATSSource` was
    reading, before its subscription was drained or unsubscribed: events may be missing,
    so this is never a clean end. ``__cause__`` is nats-py's error (``UnexpectedEOF``, an
    ``OSError``) when the client recorded one."""


class WebSocketClosed(EssesseyError):
    """A WebSocket closed abnormally: a close code other than 1000 (normal) and 1001
    (going away), or the connection dropped without a close frame (1006).

    ``code`` and ``reason`` are the close frame's, so a caller can decide whether to
    reconnect (with the last event id it received) or to give up.
    """

    def __init__(self, code: int, reason: str = "") -> None:
        super().__init__(f"WebSocket closed with code {code}" + (f": {reason}" if reason else ""))
        self.code = code
        self.reason = reason
