"""``useChat`` over one WebSocket: the AI SDK's ``WebSocketChatTransport`` served from a
:class:`~essessey.StreamHub` (docs/ui.md, "Over a WebSocket").

The transport keeps one connection and carries a chat's requests over it, each named by
the ``requestId`` the client gives it. The client's frames:

- ``send`` (``id``, ``trigger``, ``messageId``, ``messages``, ``headers``, ``body``): the
  chat request that ``POST {path}`` takes over HTTP, answered the same way: a new turn,
  or the continuation of the turn that asked when its last message carries the answers.
  The app's ``turn(chat)`` sees the frame's ``body`` merged with the chat's fields, as
  over HTTP, and its ``headers``.
- ``resume`` (``id``, ``lastSequence``?): the reconnect of ``GET {path}/{chat_id}/stream``:
  the chat's turn replayed from its start and followed live (the client replaces the
  message it has), or ``no-active`` when there is none to resume. With ``lastSequence``
  the chunks up to it are left out (the replay numbers them the same way).
- ``abort``: that request's chunks stop. The turn goes on, as it does when an HTTP
  stream is dropped; ``POST {path}/{chat_id}/stop`` stops it.

The server's frames, each naming its request: ``start`` (the stream begins), ``chunk``
(``sequence`` from 0, and the UI message chunk: what the SSE route writes as one
``data:`` line), ``end``, ``no-active``, and ``error`` (``errorText``: a refusal, a
bad request, or a stream that ended before its turn did: the client may resume it).

Why it is shaped this way:
- A request is refused in its own ``error`` frame, and the connection stays: it carries
  the chat's other requests. A frame that names no request, or is not JSON, closes the
  connection (4400): the client is not this transport's. A frame over ``max_body``
  bytes closes it with 1009.
- The ``authorize`` hook is asked with the WebSocket, whose handshake carries what a
  browser can set (cookies, the URL's query, the subprotocols): a browser's WebSocket
  sends no headers of the app's own, and the frames' ``headers`` come after the
  connection was allowed. They reach the app's ``turn`` in ``ChatRequest.headers``.
- At most ``max_requests`` requests stream at once on a connection; more are refused.
  Frames go out one at a time; a send that stalls past ``send_timeout`` closes the
  connection (1013), and a reader that falls behind the hub's ``max_lag`` gets an
  ``error`` for its request and resumes.
- When the server shuts down, the connection closes with 1012, "service restart": the
  client's requests fail and ``resumeStream`` reads the turns again, on any replica.
"""

from __future__ import annotations

import contextlib
import json
import logging
from typing import Any, Final

import anyio
import anyio.abc
import anyio.lowlevel
import orjson
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from essessey._logsafe import raised_at
from essessey.bindings.admission import subscription_end
from essessey.bindings.http import STORE_REFUSED, store_refusal
from essessey.bindings.ws import stall_guard
from essessey.dialects.ui._chats import Chats, Failure, Plan, chat_request
from essessey.errors import SubscriberLagged
from essessey.shutdown import on_shutdown

__all__ = ["ui_chat_websocket_route"]

logger = logging.getLogger("essessey.dialects.ui")

DEFAULT_MAX_REQUESTS: Final = 16
"""Requests one connection may have streaming at once."""
DEFAULT_SEND_TIMEOUT: Final = 30.0
"""Seconds one frame may take to go out before the connection is closed."""

MAX_REQUEST_ID: Final = 256
"""The longest ``requestId`` taken (the AI SDK's are 16 characters): it is written back
in every frame of its request."""

_TURN_EVERY: Final = 4
"""Chunks a stream sends before it lets the event loop's other tasks run: uvicorn's send
never waits, so a replay would be written into a connection the client dropped (asyncio
logging every write past its fifth) until a turn of the loop lets the loss be seen; then
the next send fails and the requests end."""
_BAD_FRAME: Final = 4400
_TOO_BIG: Final = 1009
_TRY_AGAIN_LATER: Final = 1013
_SERVICE_RESTART: Final = 1012
_CLOSE_TIMEOUT: Final = 5.0


def _ended(exc: Exception, turn_id: str) -> str:
    """What the client is told of a stream that ended with ``exc`` (logged here): one
    of the hub's documented ends as a WebSocket client is told it, anything else as the
    server's failure."""
    end = subscription_end(exc)
    if end is not None:
        logger.info("a WebSocket chat stream of %s ended: %s", turn_id, type(exc).__name__)
        return end.reason
    # The class and where it was raised, not its text (which may hold the turn's content).
    logger.error(
        "a WebSocket chat stream of %s failed: %s%s", turn_id, type(exc).__name__, raised_at(exc)
    )
    return "the server failed; resume later"


def _utf8(text: str) -> bool:
    """Whether ``text`` can be written back (it holds no lone surrogate, which the JSON
    escape ``\\ud800`` gives and no UTF-8 carries)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _parse(data: bytes) -> tuple[object, str | None]:
    """A client frame, and why its request is refused when it cannot be served as it is:
    JSON that orjson refuses though the JSON grammar allows it (a lone surrogate's
    escape, a number past a double) or nests deeper than it writes back. The frame is
    then read by the standard library, only for its ``requestId``. (None, None) for bytes
    that are no JSON at all."""
    try:
        frame = orjson.loads(data)
    except orjson.JSONDecodeError:
        try:
            return json.loads(data), "the request is JSON this server does not read"
        except (ValueError, RecursionError):
            return None, None
    try:
        orjson.dumps(frame)
    except orjson.JSONEncodeError:
        return frame, "the request is nested too deeply"
    return frame, None


def _frame(kind: bytes, request_id: bytes, rest: bytes = b"") -> str:
    """A server frame: its ``type``, ``requestId`` (JSON, escaped) and other fields."""
    return (b'{"type":"' + kind + b'","requestId":' + request_id + rest + b"}").decode()


def _chunks(frames: bytes) -> list[bytes]:
    """The UI message chunks of an encoder's SSE frames: each frame's last line, ``data:
    <json>``, after its ``id:`` (``[DONE]`` is the SSE stream's end, which a WebSocket
    request's ``end`` frame says instead)."""
    chunks = []
    for frame in frames.split(b"\n\n"):
        line = frame.rpartition(b"\n")[2]
        if line.startswith(b"data: {"):  # a chunk is a JSON object; orjson writes no newline
            chunks.append(line[6:])
    return chunks


def _sequence(value: object) -> int:
    """A resume's ``lastSequence``: -1 when absent (everything is sent)."""
    if value is None:
        return -1
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ValueError("lastSequence must be a non-negative integer")


def _headers(value: object) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValueError("headers must be an object of strings")
    return {k.lower(): v for k, v in value.items()}


class _Connection:
    """One WebSocket's requests: read its frames, stream each request in a task of its
    own, write their frames one at a time."""

    def __init__(
        self,
        chats: Chats,
        websocket: WebSocket,
        *,
        max_body: int,
        max_requests: int,
        send_timeout: float,
    ) -> None:
        self.chats = chats
        self.websocket = websocket
        self.max_body = max_body
        self.max_requests = max_requests
        self.send_timeout = send_timeout
        self.running: dict[str, anyio.CancelScope] = {}
        # Not a checkpoint when free: a frame costs no turn of the event loop of its own,
        # so a reader keeps up with a turn published in bursts.
        self.sending = anyio.Lock(fast_acquire=True)
        self.close_code: int | None = None
        self.close_reason = ""
        self.tasks: anyio.abc.TaskGroup | None = None  # the requests' tasks, while served
        # Made now, in the request's own task (see stall_guard).
        self.abort_if_stalled = stall_guard(send_timeout)

    def end(self, code: int, reason: str) -> None:
        """Close the connection with ``code`` once its tasks have stopped."""
        if self.close_code is None:
            self.close_code = code
            self.close_reason = reason
        self._stop()

    def _stop(self) -> None:
        """Stop the connection's tasks (its reader and its requests' streams)."""
        if self.tasks is not None:
            self.tasks.cancel_scope.cancel()

    async def send(self, text: str) -> None:
        """Write one frame; a client that left (whatever the server says of it) or a
        send stalled past ``send_timeout`` ends the connection, and the caller with it."""
        async with self.sending:
            try:
                with anyio.move_on_after(self.send_timeout) as waited:
                    await self.websocket.send_text(text)
                left = False
            except Exception as exc:
                # Each server says it its own way (a disconnect, a closed connection, a
                # send after the close): the client is gone, and the requests end.
                logger.debug("a WebSocket chat client left: %s", type(exc).__name__)
                self._stop()  # no close frame: there is nobody to send it to
                left = True
        if not left:
            if not waited.cancelled_caught:
                return
            logger.warning("a WebSocket chat frame stalled past %.0f s", self.send_timeout)
            if self.abort_if_stalled():
                self._stop()  # reset: a close frame would wait behind the unread frames
            else:
                self.end(_TRY_AGAIN_LATER, "a send stalled")
        # Stopped: the task group's own cancellation stops the caller here (one raised by
        # hand would not be the group's, and would escape it).
        await anyio.lowlevel.checkpoint()

    async def serve(self) -> None:
        async with anyio.create_task_group() as tasks:
            self.tasks = tasks
            forget = on_shutdown(lambda: self.end(_SERVICE_RESTART, "the server is shutting down"))
            try:
                await self._read()
            finally:
                forget()
            tasks.cancel_scope.cancel()  # the client left: its requests' streams stop
        self.tasks = None
        if self.close_code is not None:
            # Suppressed: the client may have closed it first (each server says so its
            # own way, as for a send).
            with (
                anyio.move_on_after(_CLOSE_TIMEOUT),
                anyio.CancelScope(shield=True),
                contextlib.suppress(Exception),
            ):
                await self.websocket.close(self.close_code, self.close_reason)

    async def _read(self) -> None:
        websocket = self.websocket
        while True:
            try:
                message = await websocket.receive()
            except (WebSocketDisconnect, RuntimeError):
                return
            if message["type"] == "websocket.disconnect":
                return
            raw = message.get("text")
            data = raw.encode() if raw is not None else message.get("bytes") or b""
            if len(data) > self.max_body:
                logger.info("a WebSocket chat frame of %d bytes was refused", len(data))
                self.end(_TOO_BIG, "frame too large")
                return
            frame, refused = _parse(data)
            request_id = frame.get("requestId") if isinstance(frame, dict) else None
            kind = frame.get("type") if isinstance(frame, dict) else None
            if (
                not isinstance(request_id, str)
                or len(request_id) > MAX_REQUEST_ID
                or not _utf8(request_id)
                or kind not in ("send", "resume", "abort")
            ):
                logger.info("a WebSocket chat frame that is no request (%d bytes)", len(data))
                self.end(_BAD_FRAME, "not a chat request frame")
                return
            assert isinstance(frame, dict)
            if refused is not None:
                # Over HTTP the request's own 400: here its own error, the rest go on.
                await self._refuse(orjson.dumps(request_id), refused)
                continue
            await self._take(kind, request_id, frame)

    async def _take(self, kind: str, request_id: str, frame: dict[str, Any]) -> None:
        """Start the request's stream, or refuse it: in the reader's own send, so a
        client that sends refused frames faster than it reads is slowed by its reads
        (and ended by ``send_timeout``), never answered by a task each."""
        rid = orjson.dumps(request_id)
        if kind == "abort":
            scope = self.running.pop(request_id, None)
            if scope is not None:
                scope.cancel()
            return
        if request_id in self.running:
            await self._refuse(rid, "a request with this requestId is streaming")
            return
        if len(self.running) >= self.max_requests:
            message = f"more than {self.max_requests} requests at once on this connection"
            await self._refuse(rid, message)
            return
        scope = anyio.CancelScope()
        self.running[request_id] = scope
        assert self.tasks is not None  # frames are read only while the connection is served
        self.tasks.start_soon(self._request, scope, request_id, rid, kind, frame)

    async def _refuse(self, rid: bytes, message: str) -> None:
        await self.send(_frame(b"error", rid, b',"errorText":' + orjson.dumps(message)))

    async def _request(
        self,
        scope: anyio.CancelScope,
        request_id: str,
        rid: bytes,
        kind: str,
        frame: dict[str, Any],
    ) -> None:
        try:
            with scope:
                await self._answer(rid, kind, frame)
        finally:
            if self.running.get(request_id) is scope:
                del self.running[request_id]

    async def _answer(self, rid: bytes, kind: str, frame: dict[str, Any]) -> None:
        chats = self.chats
        after = -1
        outcome: Plan | Failure | None
        try:
            # Shielded: an abort (or the client leaving) while a turn is being started
            # must not leave it started by half; what it started the reconnect finds.
            with anyio.CancelScope(shield=True):
                if kind == "send":
                    body = frame.get("body", {})
                    if not isinstance(body, dict):
                        raise ValueError("body must be an object")
                    merged = {**body}
                    for name in ("id", "messages", "trigger", "messageId"):
                        if name in frame:
                            merged[name] = frame[name]
                    sent = chat_request(merged, _headers(frame.get("headers", {})))
                    outcome = await chats.send(self.websocket, sent)
                else:
                    after = _sequence(frame.get("lastSequence"))
                    chat_id = frame.get("id")
                    if not isinstance(chat_id, str):
                        raise ValueError("id must be a string")
                    outcome = await chats.reconnect(self.websocket, chat_id, None)
        except ValueError as exc:
            await self._refuse(rid, str(exc))
            return
        except STORE_REFUSED as exc:  # what the HTTP routes answer with a 503
            await self._refuse(rid, store_refusal(exc)[2])
            return
        except Exception as exc:
            # The app's turn factory failed: over HTTP one request's 500,
            # here one request's error; the connection's other requests go on.
            await self._refuse(rid, _ended(exc, "a new turn"))
            return
        if outcome is None:
            await self.send(_frame(b"no-active", rid))
        elif isinstance(outcome, Failure):
            await self._refuse(rid, outcome.message)
        else:
            await self._stream(rid, outcome, after)

    async def _stream(self, rid: bytes, plan: Plan, after: int) -> None:
        """The plan's turn as ``chunk`` frames numbered from 0 (those up to ``after`` left
        out), then ``end``; an ``error`` when the stream ends before its turn does."""
        encoder = plan.encoder()
        resume = plan.resume_point
        sequence = 0

        async def send_chunks(frames: bytes) -> None:
            nonlocal sequence
            for chunk in _chunks(frames):
                if sequence > after:
                    rest = b',"sequence":' + str(sequence).encode() + b',"chunk":' + chunk
                    await self.send(_frame(b"chunk", rid, rest))
                    if not sequence % _TURN_EVERY:
                        await anyio.lowlevel.checkpoint()  # a long replay lets others run
                sequence += 1

        hub = self.chats.hub
        prime = encoder.encode if resume is not None else None
        started = False
        while True:
            try:
                subscription = await hub.open(plan.turn_id, resume, snapshot=False, prime=prime)
                if not started:
                    started = True
                    await self.send(_frame(b"start", rid))
                async for event in subscription:
                    await send_chunks(encoder.encode(event))
                    if event.id:
                        resume = event.id
            except SubscriberLagged:
                # Fallen behind a turn published in a burst: read on after the last
                # event sent, from the store, as a client resuming by id would.
                prime = None
                continue
            except Exception as exc:
                await self._refuse(rid, _ended(exc, plan.turn_id))
                return
            break
        await send_chunks(encoder.finish())
        await self.send(_frame(b"end", rid))


def ui_chat_websocket_route(
    chats: Chats,
    *,
    path: str,
    max_body: int,
    max_requests: int = DEFAULT_MAX_REQUESTS,
    send_timeout: float = DEFAULT_SEND_TIMEOUT,
) -> WebSocketRoute:
    """The WebSocket endpoint of ``WebSocketChatTransport`` at ``path``, for the chats
    of ``chats`` (see the module docstring)."""
    if max_requests < 1:
        raise ValueError("max_requests must be >= 1")
    if send_timeout <= 0:
        raise ValueError("send_timeout must be > 0")

    async def endpoint(websocket: WebSocket) -> None:
        await websocket.accept()
        connection = _Connection(
            chats,
            websocket,
            max_body=max_body,
            max_requests=max_requests,
            send_timeout=send_timeout,
        )
        await connection.serve()

    return WebSocketRoute(path, endpoint)
