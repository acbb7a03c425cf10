"""Serving a :class:`~essessey.StreamHub` over SSE: subscribe, resume, cancel.

The resume point comes from the ``Last-Event-ID`` header (what a browser's EventSource
sends when it reconnects) or from a ``last_event_id`` query parameter (for a client that
cannot set headers: a page reload that remembers where it was). Every event carries its
``id:`` line. Errors before the first event are HTTP errors with a JSON body in the
Anthropic shape, which make an EventSource stop instead of reconnecting in a loop:

====================  ======  =====================================================
case                  status  ``error.type``
====================  ======  =====================================================
bad stream id or id   400     ``invalid_request_error``
not authorised        403     ``permission_error``
no such stream        404     ``not_found_error``
unknown last id       410     ``resume_unavailable`` (start over without an id)
too many subscribers  503     ``overloaded_error``
the hook raised       503     ``api_error`` (logged, without the exception's text)
====================  ======  =====================================================

A stream id is 1 to ``MAX_ID_LENGTH`` printable characters without whitespace, ``.``,
``*`` or ``>`` (one NATS subject token, so every backend can carry it); a last event id is
1 to ``MAX_ID_LENGTH`` printable characters. The cancel route ignores the request body
(it takes up to 1 KiB of it and leaves a larger one unread).

A subscriber that falls behind is ended without an error event: its client reconnects
with its last id and carries on. A ``HEAD`` answers the status a ``GET`` starts with (the
table's), asked of the store without subscribing (see docs/resume.md).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from typing import Unpack, cast

import anyio
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from essessey.bindings._asgi import SubscriptionCount, subscription_end
from essessey.bindings.admission import Refusal, admit
from essessey.bindings.answering import answer_response
from essessey.bindings.http import json_error, store_guarded
from essessey.bindings.sse._encoder import (
    ErrorShape,
    FrameEncoder,
    TextDeltaFrames,
    frame_id,
    id_line,
    split_frame_id,
)
from essessey.bindings.sse._format import error_body
from essessey.bindings.sse._response import (
    RESUME_HEADERS_WITHIN,
    EventStreamResponse,
    SSEOptions,
)
from essessey.errors import StreamInterrupted, StreamNotFound, StreamRejected, UnknownEventId
from essessey.event import Event
from essessey.hub import StreamHub
from essessey.stores import Taker

__all__ = [
    "HubSubscription",
    "cancel_response",
    "hub_routes",
    "requested_resume_point",
    "stream_response",
    "subscription_response",
]

logger = logging.getLogger("essessey.sse")

_CANCEL_BODY_LIMIT = 1024
"""Bytes of a cancel request's body taken (and ignored); a larger one is left unread."""
_CANCEL_BODY_WAIT = 1.0
"""Seconds a cancel's small body is waited for, once the turn is cancelled."""


class _RestOfEvent(Event):
    """The frames of an event after those a client resuming mid-event had, already
    encoded (``data``): what a resume by a frame's id starts with."""

    __slots__ = ()


class _HubFrames:
    """A dialect's encoder on a hub stream. The frames of the stream's end (``finish()``,
    ``fail()``) get ids too, numbered on from the last event's frames (``<id>:<n>``). On
    a resume by a frame's id, the rest of that event's frames (a :class:`_RestOfEvent`)
    go out as they are, and end frames the client had (``end_skip``) are left out."""

    __slots__ = ("_encoder", "_last_id", "_last_out", "_text_delta", "end_skip")

    def __init__(self, encoder: FrameEncoder) -> None:
        self._encoder = encoder
        self._text_delta: Callable[[int, str, bytes, bytes], bytes | None] | None = (
            cast(TextDeltaFrames, encoder).encode_text_delta
            if issubclass(type(encoder), TextDeltaFrames)
            else None
        )
        self._last_id: str | bytes | None = None
        # The last event's frames, counted only at the end: this runs for every event.
        self._last_out = b""
        self.end_skip = 0

    def encode(self, event: Event) -> bytes:
        if type(event) is _RestOfEvent:
            return event.data
        out = self._encoder.encode(event)
        if event.id is not None and out:
            self._last_id, self._last_out = event.id, out
        return out

    def encode_text_delta(
        self, index: int, text: str, text_json: bytes, event_id: bytes
    ) -> bytes | None:
        """:meth:`encode` of a stored text delta from its fields (see
        ``TextDeltaFrames``), when the encoder writes one so."""
        text_delta = self._text_delta
        if text_delta is None:
            return None
        out = text_delta(index, text, text_json, event_id)
        if out:
            # Its id as given (bytes): made a string only at the end, if at all.
            self._last_id, self._last_out = event_id, out
        return out

    def resumed_in(self, event_id: str, encoded: bytes) -> None:
        """The resume went on from ``event_id``, whose frames are ``encoded``."""
        self._last_id, self._last_out = event_id, encoded

    def finish(self) -> bytes:
        return self._end(self._encoder.finish())

    def fail(self, error_type: str, message: str) -> bytes:
        return self._end(self._encoder.fail(error_type, message))

    def _end(self, tail: bytes) -> bytes:
        frames = _frames(tail)
        last = self._last_id
        if isinstance(last, bytes):
            last = last.decode()
        if last is not None:
            first = self._last_out.count(b"\n\n") + 1
            frames = [
                id_line(frame_id(last, place)) + frame for place, frame in enumerate(frames, first)
            ]
        skip, self.end_skip = self.end_skip, 0
        return b"".join(frames[skip:])


class _SkippingHubFrames(_HubFrames):
    """A dialect's encoder on a hub stream that resumes after a point of the dialect's
    own count (Responses' ``starting_after``): the frames ``before`` says come before it
    are left out, their ids numbered as ever (a later resume by a frame's id finds the
    same frame); once one is kept, every later one is."""

    __slots__ = ("_before",)

    def __init__(self, encoder: FrameEncoder, before: Callable[[bytes], bool]) -> None:
        super().__init__(encoder)
        self._before: Callable[[bytes], bool] | None = before

    def encode(self, event: Event) -> bytes:
        return self._kept(super().encode(event))

    def encode_text_delta(
        self, index: int, text: str, text_json: bytes, event_id: bytes
    ) -> bytes | None:
        out = super().encode_text_delta(index, text, text_json, event_id)
        return None if out is None else self._kept(out)

    def _end(self, tail: bytes) -> bytes:
        return self._kept(super()._end(tail))

    def _kept(self, out: bytes) -> bytes:
        before = self._before
        if before is None or not out:
            return out
        frames = _frames(out)
        for place, frame in enumerate(frames):
            if not before(frame):
                self._before = None
                return b"".join(frames[place:])
        return b""


def _frames(encoded: bytes) -> list[bytes]:
    """Whole SSE messages joined, apart again: each ends with a blank line, which no
    message holds inside (its data lines are JSON, without line breaks)."""
    return [message + b"\n\n" for message in encoded.split(b"\n\n")[:-1]]


class HubSubscription:
    """A response's source: the hub's events for one stream, after ``last_event_id``.

    The response hands it its own delivery (:meth:`deliver_to`) before reading, so a live
    event can reach the connection in the turn's append, without waking the response's
    task. With a ``primer`` (the response's dialect encoder) a resume reads the stream
    from its start and feeds the events up to the last id to the primer, yielding none of
    them: a dialect's frames depend on what came before (docs/dialects.md). Only the
    protocol's own frames (no primer) start with the hub's snapshot (``snapshot_after``):
    a dialect counts its own events (Responses' sequence numbers), which a resume must
    count again the same way."""

    __slots__ = (
        "_frames",
        "_hub",
        "_last_event_id",
        "_primer",
        "_skip",
        "_stream_id",
        "_taker",
    )

    def __init__(
        self,
        hub: StreamHub,
        stream_id: str,
        last_event_id: str | None,
        primer: FrameEncoder | None = None,
        *,
        skip: int = 0,
        frames: _HubFrames | None = None,
    ) -> None:
        self._hub = hub
        self._frames = frames  # the response's encoder, told where a resume went on
        self._stream_id = stream_id
        self._last_event_id = last_event_id
        self._primer = primer
        # With a primer: how many frames of the event ``last_event_id`` the client had
        # (a resume by a frame's id); 0 when it had the event whole.
        self._skip = skip
        self._taker: Taker | None = None

    def deliver_to(self, taker: Taker) -> None:
        """Offer live events to ``taker`` (see ``Subscription.deliver_live``)."""
        self._taker = taker

    def __aiter__(self) -> AsyncIterator[Event]:
        primer = self._primer
        return _follow(
            self._hub,
            self._stream_id,
            self._last_event_id,
            self._taker,
            prime=primer.encode if primer is not None else None,
            skip=self._skip,
            frames=self._frames,
        )


async def _follow(
    hub: StreamHub,
    stream_id: str,
    last_event_id: str | None,
    taker: Taker | None,
    *,
    prime: Callable[[Event], bytes] | None,
    skip: int = 0,
    frames: _HubFrames | None = None,
) -> AsyncIterator[Event]:
    # Opened here, in the response's task: a refusal is raised before the first event,
    # and answered as an HTTP error. A dialect's resume (``prime``) reads the stream once:
    # the events up to the id go to its encoder, the rest are yielded. Only the
    # protocol's own frames start with a snapshot: a dialect counts its own events
    # (Responses' sequence numbers), which a resume must count again the same way.
    count = SubscriptionCount("sse", last_event_id is not None)
    error: Exception | None = None
    events: AsyncGenerator[Event, None] | None = None
    try:
        rest = b""
        encoded = [b""]  # the frames of the event resumed in, encoded again
        if prime is not None and last_event_id is not None and frames is not None:
            # A dialect's resume: the event resumed in is encoded again, as it was (mid-
            # event, the frames the client had are left out; at the stream's end, the
            # end frames number on from its frames).
            encode = prime

            def prime_keeping(event: Event) -> bytes:
                encoded[0] = encode(event)
                return encoded[0]

            prime = prime_keeping
        subscription = await hub.open(stream_id, last_event_id, snapshot=prime is None, prime=prime)
        if frames is not None and last_event_id is not None and prime is not None:
            within = _frames(encoded[0])
            if skip and skip >= len(within):
                # Past the event's frames: one of the stream's end frames, which follow
                # its last event only.
                if not within or subscription.head:
                    raise UnknownEventId("no such frame of that event")  # never sent
                frames.end_skip = skip - len(within)
            if skip:
                rest = b"".join(within[skip:])
            frames.resumed_in(last_event_id, encoded[0])
        if taker is not None:
            subscription.deliver_live(taker)
        if rest:
            count.started()
            yield _RestOfEvent("", rest)
        # Closed as soon as this response ends (the client left), so the hub's
        # subscriber count drops at once rather than when the collector gets to it.
        events = aiter(subscription)
        async for event in events:
            count.started()
            yield event
    except Exception as exc:
        error = exc
        end = subscription_end(exc)
        if end is None:
            raise
        if end.status is None:
            # Cut short, the turn not over: the client must come back with its last id,
            # so never the answer of a finished turn (a 204, or a dialect's end).
            logger.warning("ending a subscription of %s: %s", stream_id, type(exc).__name__)
            raise StreamInterrupted(f"{type(exc).__name__}; reconnect with the last id") from exc
        message = end.message or f"no stream {stream_id!r}"
        raise StreamRejected(end.status, end.error_type, message) from exc
    finally:
        count.ended(error)
        if events is not None:
            await events.aclose()


def requested_resume_point(request: Request) -> str | None:
    """The last event id a request asks to resume after: its ``Last-Event-ID`` header
    (what an EventSource sends when it reconnects), else its ``last_event_id`` query
    parameter (for a client that cannot set headers), else None."""
    given = request.headers.get("last-event-id")
    if given is None:
        given = request.query_params.get("last_event_id")
    return given


async def subscription_response(
    hub: StreamHub,
    request: Request,
    stream_id: str,
    *,
    encoder: FrameEncoder | None = None,
    shape: ErrorShape = error_body,
    frames_before: Callable[[bytes], bool] | None = None,
    **options: Unpack[SSEOptions],
) -> Response:
    """An SSE response following ``stream_id`` on ``hub`` for this request, resuming
    after its ``Last-Event-ID`` header or ``last_event_id`` query parameter.

    ``encoder`` writes it in another dialect (:class:`FrameEncoder`; the protocol's own
    SSE when None), ``shape`` writes the JSON of a refusal in that dialect's error shape.
    ``options`` go to :class:`EventStreamResponse`: ``headers``, ``ping_interval``,
    ``retry``, ``send_timeout``, ``max_queue``, ``max_batch_bytes``, ``shutdown_retry``
    (:class:`SSEOptions`). A resume with nothing more to send, its turn over, is a 204.
    ``frames_before`` as in :func:`stream_response`.
    """
    headers = options.get("headers")
    admitted = await admit(hub, request, stream_id, requested_resume_point(request), logger)
    if isinstance(admitted, Refusal):
        return json_error(
            admitted.status, admitted.error_type, admitted.message, headers, shape=shape
        )
    last_event_id = admitted.last_event_id
    if request.method == "HEAD":
        asked = last_event_id
        if asked is not None and encoder is not None:
            asked = split_frame_id(asked)[0]
        refusal = await _head_refusal(hub, stream_id, asked, headers, shape)
        if refusal is not None:
            return refusal
    return stream_response(
        hub,
        stream_id,
        last_event_id,
        encoder=encoder,
        error_shape=shape,
        frames_before=frames_before,
        **options,
    )


def stream_response(
    hub: StreamHub,
    stream_id: str,
    last_event_id: str | None,
    *,
    encoder: FrameEncoder | None = None,
    error_shape: ErrorShape = error_body,
    frames_before: Callable[[bytes], bool] | None = None,
    **options: Unpack[SSEOptions],
) -> EventStreamResponse:
    """The SSE response of a client already admitted (the checks of
    :func:`subscription_response` done): ``stream_id`` on ``hub`` after
    ``last_event_id``, in ``encoder``'s dialect, its errors before the first event in
    ``error_shape``. For a dialect's route that starts the turn it then streams.

    ``frames_before`` makes it a resume by the dialect's own count (Responses'
    ``starting_after``): the encoder's frames it says come before the resume point are
    left out (their ids kept in place), up to the first it does not."""
    if frames_before is not None and encoder is None:
        raise ValueError("frames_before needs a dialect's encoder")
    # A resume with nothing more to send, its turn over: 204, so an EventSource that
    # reconnects after the end stops instead of looping.
    empty_status = 204 if last_event_id is not None else None
    if last_event_id is not None or frames_before is not None:
        # A resume may land in a pause of its turn: its headers must not wait for the
        # next event, or a proxy's idle timeout answers for it.
        options.setdefault("headers_within", RESUME_HEADERS_WITHIN)
    skip = 0
    if last_event_id is not None and encoder is not None:
        # A dialect's frame in the middle of an event has an id of its own: the resume
        # goes on from there (``with_id``).
        last_event_id, skip = split_frame_id(last_event_id)
    frames: _HubFrames | None = None
    if encoder is not None:
        frames = (
            _HubFrames(encoder)
            if frames_before is None
            else _SkippingHubFrames(encoder, frames_before)
        )
    source = HubSubscription(hub, stream_id, last_event_id, encoder, skip=skip, frames=frames)
    return EventStreamResponse(
        source, empty_status=empty_status, encoder=frames, error_shape=error_shape, **options
    )


async def _head_refusal(
    hub: StreamHub,
    stream_id: str,
    last_event_id: str | None,
    headers: Mapping[str, str] | None,
    shape: ErrorShape,
) -> Response | None:
    """For a HEAD, the error a GET would answer before its first event (no such stream,
    a last id not retained), or None when a GET would stream. Asked of the store
    without subscribing, so a HEAD never waits for a live event; a GET's 204 (a finished
    turn with nothing after the id) is not told apart, and answers 200."""
    store = hub.store
    try:
        if not await store.exists(stream_id):
            raise StreamNotFound(stream_id)
        if last_event_id is not None and not (await store.since(stream_id, last_event_id))[1]:
            raise UnknownEventId(last_event_id)
    except Exception as exc:
        end = subscription_end(exc)
        if end is None:
            raise  # a failure of the server, as for a GET
        if end.status is None:
            # The store is out for now (a GET would end at once, to be made again).
            logger.warning("a HEAD of %s: %s", stream_id, type(exc).__name__)
            message = "the event store is unavailable; try again"
            return json_error(503, "api_error", message, headers, shape=shape)
        message = end.message or f"no stream {stream_id!r}"
        return json_error(end.status, end.error_type, message, headers, shape=shape)
    return None


async def cancel_response(hub: StreamHub, request: Request, stream_id: str) -> Response:
    """Cancel the turn running on ``stream_id`` if this request may: 200 with
    ``{"cancelled": true}``, 404 when no turn runs there, 403 when not allowed, 503 when
    the ``authorize`` hook raised. The request's body means nothing: up to 1 KiB of it is
    taken (waited for a second at most, after the cancel), a larger one left unread."""
    admitted = await admit(hub, request, stream_id, None, logger, access="cancel")
    if isinstance(admitted, Refusal):
        return json_error(admitted.status, admitted.error_type, admitted.message)
    # The cancel first: a body that never comes must not hold it.
    cancelled = await hub.cancel(stream_id)
    await _take_small_body(request)
    if not cancelled:
        return json_error(404, "not_found_error", "no turn is running on this stream")
    return Response(b'{"cancelled":true}', 200, media_type="application/json")


async def _take_small_body(request: Request) -> None:
    """Take a cancel request's body when it is small (it means nothing): an HTTP/2 server
    may fail the whole connection when a stream it has answered still sends its body's end
    (hypercorn does). A body announced larger, or that grows past the limit, is left
    unread: the answer never waits for a client's upload."""
    declared = request.headers.get("content-length")
    if declared is not None and not (
        declared.isascii() and declared.isdigit() and int(declared) <= _CANCEL_BODY_LIMIT
    ):
        return
    taken = 0
    # A body announced and never sent (or trickling) is waited for a moment, not for ever.
    with contextlib.suppress(ClientDisconnect), anyio.move_on_after(_CANCEL_BODY_WAIT):
        async for chunk in request.stream():
            taken += len(chunk)
            if taken > _CANCEL_BODY_LIMIT:
                return


def hub_routes(
    hub: StreamHub, prefix: str = "/streams", **options: Unpack[SSEOptions]
) -> Sequence[BaseRoute]:
    """Starlette routes: ``GET {prefix}/{stream_id}`` (subscribe or resume, as SSE),
    ``POST {prefix}/{stream_id}/cancel`` and ``POST {prefix}/{stream_id}/answer``
    (answer what the stream asks: ``essessey.bindings.answering``). ``options`` go to the
    SSE response, as :func:`subscription_response` takes them. A store that cannot be
    reached while a route prepares its answer is a 503 (``store_guarded``)."""
    headers = options.get("headers")

    async def subscribe(request: Request) -> Response:
        return await subscription_response(
            hub, request, request.path_params["stream_id"], **options
        )

    async def cancel(request: Request) -> Response:
        return await cancel_response(hub, request, request.path_params["stream_id"])

    async def answer(request: Request) -> Response:
        return await answer_response(hub, request, request.path_params["stream_id"])

    return [
        Route(prefix + "/{stream_id}", store_guarded(subscribe, headers), methods=["GET"]),
        Route(prefix + "/{stream_id}/cancel", store_guarded(cancel, headers), methods=["POST"]),
        Route(prefix + "/{stream_id}/answer", store_guarded(answer, headers), methods=["POST"]),
    ]
