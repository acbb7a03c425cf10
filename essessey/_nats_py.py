"""The one place essessey reaches into nats-py's internals (written against nats-py 2.16).

nats-py's public API is correct but costs, on the path of every event, more than the
event itself: ``publish`` is three coroutines deep, a subscription's message iterator
starts a task and an ``asyncio.wait`` per message, a JetStream push subscription's
``next_msg`` a task and a timer, ``js.publish`` a request three coroutines deep and a
dataclass per ack, and ``flush`` can overtake commands still in the client's buffer; and
whether a subscription ended cleanly or with its connection is not public at all. Each
helper here does what nats-py's own code does, from the same state, for the case that is
common; it checks first that the state it reads is there, with the types it expects, and
otherwise answers "not available", so the caller takes the public API and a different
nats-py is slower, never wrong.

tests/test_nats_internals.py (core NATS and the JetStream publish) and
tests/test_jetstream_store.py (the push subscription's queue, and publishing, either way)
run each helper on the installed nats-py against a real nats-server and fail when a fast
path is no longer taken, so an upgrade that changes these internals is seen at once.

Switch: ``ESSESSEY_NATS_INTERNALS=off`` (or ``0``, ``false``, ``no``) in the environment
when the process starts turns every fast path here off (:func:`direct_publish`,
:func:`direct_jetstream_publish`, :func:`queued_messages`,
:func:`ready_push_subscription` answer "not available", and :func:`flush_connection` is
two of nats-py's ``flush`` round trips, the first of which has the client write its
buffer). :func:`subscription_finished` and
:func:`lost_connection_error` keep reading a subscription's state either way: nats-py
has no public way to tell a subscription that ended from one whose connection closed,
and their defaults take a change for a lost connection, never for a clean end.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import logging
import os
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Final, Literal

import nats.js.errors
import orjson
from nats import errors as nats_errors
from nats.aio.client import Client as _Client
from nats.js import api
from nats.protocol.command import hpub_cmd, pub_cmd

from essessey.errors import NATSConnectionLost

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.aio.msg import Msg
    from nats.aio.subscription import Subscription

__all__ = [
    "EMPTY",
    "ENABLED",
    "DirectPublish",
    "JetStreamPublish",
    "QueuedMessages",
    "acked_sequence",
    "direct_jetstream_publish",
    "direct_publish",
    "flow_control_due",
    "flush_connection",
    "header_block",
    "lost_connection_error",
    "queued_messages",
    "ready_push_subscription",
    "reply_flow_control",
    "subscription_finished",
    "take_queued",
    "wait_queued",
]

logger = logging.getLogger("essessey.nats")

_CONNECTED: Final = _Client.CONNECTED

_SWITCH: Final = os.environ.get("ESSESSEY_NATS_INTERNALS", "on").strip().lower()
ENABLED: bool = _SWITCH not in ("off", "0", "false", "no")
"""Whether the fast paths here are taken (the environment switch, read at import)."""

DirectPublish = Callable[[str, bytes, bytes | None, str], bool]
"""``publish(subject, payload, header_block, reply) -> bool``: the command buffered and
True, or False (having done nothing) when only nats-py's ``publish`` can take it.
``reply`` is the reply subject, or ``""`` for none."""


def direct_publish(nc: Client) -> DirectPublish | None:
    """A function that buffers a PUB (or HPUB) command the way ``nc.publish`` does, when
    nothing makes the public call necessary; None when this nats-py lacks the state it
    uses.

    ``nc.publish`` appends the command to the client's pending buffer, counts it in
    ``stats`` and wakes the flusher task when its queue is empty; it suspends only when
    the buffer is over ``max_pending_size`` (it then waits for a flush). This does those
    three things in a plain call, and returns False, untouched, in every other case: not
    connected (closed, reconnecting, draining), a payload over the server's
    ``max_payload``, a buffer that would go over its limit, or no flusher task, so that
    ``nc.publish`` raises or waits as it always does. The subject must already be valid
    (the sink checks its tokens once); ``header_block`` is the encoded header section
    (``NATS/1.0\\r\\n...\\r\\n\\r\\n``) or None.
    """
    raw: Any = nc
    if not (
        ENABLED
        and isinstance(getattr(raw, "_pending", None), list)
        and isinstance(getattr(raw, "_pending_data_size", None), int)
        and isinstance(getattr(raw, "_max_pending_size", None), int)
        and isinstance(getattr(raw, "_flush_queue", None), asyncio.Queue)
        and hasattr(raw, "_flusher_task")
        and isinstance(getattr(raw, "_status", None), int)
        and isinstance(getattr(raw, "stats", None), dict)
    ):
        return None

    def publish(subject: str, payload: bytes, header_block: bytes | None, reply: str) -> bool:
        carried = len(payload) if header_block is None else len(payload) + len(header_block)
        if raw._status != _CONNECTED or carried > raw._max_payload:
            return False
        flusher = raw._flusher_task
        if flusher is None or flusher.done():
            return False  # nats-py then writes inline, and awaits the drain
        if header_block is None:
            command = pub_cmd(subject, reply, payload)
        else:
            command = hpub_cmd(subject, reply, header_block, payload)
        size = raw._pending_data_size + len(command)
        if 0 < raw._max_pending_size < size:
            return False  # nats-py forces a flush and waits for it
        raw._pending.append(command)
        raw._pending_data_size = size
        stats = raw.stats
        stats["out_msgs"] += 1
        stats["out_bytes"] += len(payload)
        flush_queue = raw._flush_queue
        if flush_queue.empty():
            # The flusher writes the whole buffer when woken; a future is what it wakes on
            # (and resolves), as in nats-py's own _flush_pending.
            flush_queue.put_nowait(asyncio.get_running_loop().create_future())
        return True

    return publish


async def flush_connection(nc: Client) -> None:
    """Wait until the server has received everything ``nc`` has published or subscribed
    so far (what ``NATSSink.flush`` and the subscribers rely on).

    ``nc.flush()`` alone does not promise that with nats-py 2.16: it writes its PING
    straight to the socket, ahead of the commands still in the client's buffer, so the
    PONG can come back before the server has read them. This first has the client's
    flusher write its buffer (which keeps order), then makes the round trip.
    """
    flush_pending: Any = getattr(nc, "_flush_pending", None) if ENABLED else None
    if flush_pending is not None and nc.is_connected:
        # nats-py's own "write the buffer now and wait for it"; without it the round trip
        # below is all there is.
        task = asyncio.current_task()
        cancelling = task.cancelling() if task is not None else 0
        await flush_pending(force_flush=True)
        if task is not None and task.cancelling() > cancelling:
            # It swallows a cancellation that arrives while it waits: hand it back, or a
            # timeout around this call would never fire.
            raise asyncio.CancelledError
    else:
        # Without it (the switch off, or another nats-py): a first round trip, whose PING
        # wakes the client's flusher, which writes the buffer before that PONG can be
        # read; the second PING then follows every buffered command.
        await nc.flush()
    await nc.flush()


def subscription_finished(sub: Subscription) -> bool:
    """Whether ``sub`` ended on purpose (unsubscribed, drained, or its message limit
    reached) rather than by its connection closing under it.

    nats-py ends a subscription's iterator the same way in every case; only its state
    tells them apart, and none of it is public, so it is read with defaults: if a later
    version renames it, a closed connection is reported as lost, never as clean.
    """
    conn: Any = getattr(sub, "_conn", None)
    if conn is None or not conn.is_closed:
        # The iterator stops with the connection open only for unsubscribe, drain or an
        # auto-unsubscribe limit.
        return True
    if getattr(sub, "_closed", False):
        return True
    max_msgs = getattr(sub, "_max_msgs", 0)
    return bool(max_msgs > 0 and getattr(sub, "_received", 0) >= max_msgs)


def lost_connection_error(sub: Subscription) -> NATSConnectionLost:
    """The error a reader raises when ``sub``'s connection closed under it, with the
    connection's last error (nats-py's public ``last_error``) as its cause."""
    conn: Any = getattr(sub, "_conn", None)
    cause = getattr(conn, "last_error", None)
    error = NATSConnectionLost(
        "the NATS connection closed before the subscription was drained or unsubscribed"
        + (f" ({cause})" if cause is not None else "")
    )
    error.__cause__ = cause if isinstance(cause, BaseException) else None
    return error


class _End:
    """What :class:`QueuedMessages` puts behind the last message once the subscription
    has ended, to wake a reader waiting on the queue."""


_END: Final = _End()


class QueuedMessages:
    """The messages of a subscription made without a callback, read straight from its
    queue: what its public iterator hands out, in the same order, with the same
    bookkeeping, at the cost of one wait per message instead of a task and an
    ``asyncio.wait``.

    nats-py's iterator waits for whichever comes first, a message or the end of the
    subscription (unsubscribe, drain, a closed connection, an auto-unsubscribe limit).
    Here the end is a marker put on the queue when the subscription ends, so a waiting
    reader wakes on either with one ``queue.get()``; the messages received before the
    end are handed out first.
    """

    __slots__ = ("_ended", "_iterator", "_queue", "_sub")

    def __init__(self, sub: Any, queue: asyncio.Queue[Any], iterator: Any, ended: Any) -> None:
        self._sub = sub
        self._queue = queue
        self._iterator = iterator
        self._ended = False
        ended.add_done_callback(self._end)

    def _end(self, _future: object) -> None:
        self._ended = True
        # A full queue (over the pending limit) is not waited on: the reader finds the
        # flag once it has taken what is queued.
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(_END)

    @property
    def ended(self) -> bool:
        """Whether the subscription has ended (messages may still be queued before the
        marker)."""
        return self._ended

    def wait(self) -> Coroutine[Any, Any, Any]:
        """The queue's ``get()``, to await when :meth:`take` found nothing: its result
        goes through :meth:`handed_out`. (A plain function returning the queue's own
        coroutine: no frame of its own on the path of every message.)"""
        return self._queue.get()

    def take(self) -> Msg | Literal[_Empty.EMPTY] | None:
        """:meth:`handed_out` of the next queued message, or ``EMPTY`` when there is none
        (then :meth:`wait`, unless :attr:`ended`)."""
        queue = self._queue
        if queue.empty():
            return EMPTY
        return self.handed_out(queue.get_nowait())

    def handed_out(self, item: Any) -> Msg | None:
        """What the iterator does for each message it hands out: mark it done (a drain
        waits for that), keep the pending byte count, and stop at an auto-unsubscribe
        limit. None for the end marker."""
        self._queue.task_done()
        if item is _END:
            return None
        sub = self._sub
        sub._pending_size -= len(item.data)
        if sub._max_msgs > 0 and sub._received >= sub._max_msgs:
            self._iterator._cancel()
        msg: Msg = item
        return msg

    async def next(self) -> Msg | None:
        """The next message, waiting for one; None once the subscription has ended and
        every message received before that has been handed out."""
        msg = self.take()
        if msg is EMPTY:
            if self._ended:
                return None
            return self.handed_out(await self._queue.get())
        return msg


class _Empty(enum.Enum):
    """What :meth:`QueuedMessages.take` returns when nothing is queued (an enum member,
    so that ``is EMPTY`` narrows the type)."""

    EMPTY = "nothing queued"


EMPTY: Final = _Empty.EMPTY


def queued_messages(sub: Subscription, messages: AsyncIterator[Msg]) -> QueuedMessages | None:
    """The :class:`QueuedMessages` of ``sub`` (whose public iterator is ``messages``), or
    None when this nats-py lacks the state they read, and every message must come
    through the iterator."""
    raw: Any = sub
    queue: object = getattr(raw, "_pending_queue", None)
    ended = getattr(messages, "_unsubscribed_future", None)
    iterates_it = getattr(messages, "_queue", None) is queue  # the queue the iterator reads
    if (
        ENABLED
        and iterates_it
        and isinstance(queue, asyncio.Queue)
        and isinstance(ended, asyncio.Future)
        and isinstance(getattr(raw, "_pending_size", None), int)
        and isinstance(getattr(raw, "_max_msgs", None), int)
        and isinstance(getattr(raw, "_received", None), int)
        and callable(getattr(messages, "_cancel", None))
    ):
        return QueuedMessages(raw, queue, messages, ended)
    return None


# -- JetStream push subscriptions -----------------------------------------------------------


def ready_push_subscription(sub: object) -> Any:
    """The core subscription under a JetStream push subscription, when this nats-py has
    the internals :func:`take_queued` and :func:`reply_flow_control` use to take the
    messages it already holds; else None, and every message comes through ``next_msg``.

    Why: ``PushSubscription.next_msg`` creates a uuid, a task and an ``asyncio.wait_for``
    for every message, even one already queued, which caps a reader at about a third of
    what the client receives. What it does besides waiting is bookkeeping that those two
    repeat; everything an ordered consumer needs beyond that (sequence tracking, gap
    detection and recreating the consumer, heartbeats, scheduling flow-control replies)
    nats-py does when a message arrives, before it is queued, so it holds whichever way
    the message is taken.
    """
    inner = getattr(sub, "_sub", None)
    queue = getattr(inner, "_pending_queue", None)
    jsi = getattr(inner, "_jsi", None)
    if (
        ENABLED
        and isinstance(queue, asyncio.Queue)
        and getattr(sub, "_pending_queue", None) is queue  # what pending_msgs counts
        and getattr(inner, "_cb", None) is None
        and isinstance(getattr(inner, "_pending_size", None), int)
        and jsi is not None
        and hasattr(jsi, "_active")
        and isinstance(getattr(jsi, "_fciseq", None), int)
        and hasattr(jsi, "_fcr")
        and callable(getattr(jsi, "get_js_delivered", None))
    ):
        return inner
    return None


def take_queued(inner: Any, nc: Client) -> Msg | None:
    """A message the push subscription whose core subscription is ``inner`` (from
    :func:`ready_push_subscription`) already holds, taken without waiting; None when
    there is none, or when the connection is closed (``next_msg`` raises then)."""
    queue = inner._pending_queue
    if queue.empty() or nc.is_closed:
        return None
    return _taken(inner, queue.get_nowait())


async def wait_queued(inner: Any) -> Msg:
    """The next message the push subscription whose core subscription is ``inner``
    receives, waiting for it in the caller's task: the caller bounds the wait (with
    ``asyncio.timeout``; a cancelled ``Queue.get`` leaves the message queued, so none is
    lost) and calls it only while the connection is open.

    ``next_msg`` waits in a task of its own (with a uuid and a ``wait_for``) so that
    closing the connection can cancel it. Here a connection that closes meanwhile is
    seen when the caller's bound runs out, so the caller keeps the bound short.
    """
    msg: Msg = await inner._pending_queue.get()
    return _taken(inner, msg)


def _taken(inner: Any, msg: Msg) -> Msg:
    # What Subscription.next_msg does with the message it takes: keep the count of bytes
    # held (the slow-consumer limit) and mark it done (a drain waits for that).
    inner._pending_size -= len(msg.data)
    inner._pending_queue.task_done()
    # What PushSubscription.next_msg adds: the consumer is active (the heartbeat check
    # recreates an inactive ordered consumer), and a flow-control reply waiting for this
    # message to be taken is sent (by the caller, see reply_flow_control).
    inner._jsi._active = True
    return msg


def flow_control_due(inner: Any) -> bool:
    """Whether nats-py has scheduled a flow-control reply on ``inner``'s consumer."""
    return bool(inner._jsi._fcr)


async def reply_flow_control(inner: Any, nc: Client) -> None:
    """Send the flow-control reply nats-py scheduled, as ``PushSubscription.next_msg``
    does once every message the client has received is taken (the server sends no more
    than its window until it has the reply)."""
    jsi = inner._jsi
    if jsi.get_js_delivered() < jsi._fciseq:
        return
    reply = jsi._fcr
    # Cleared before the publish, which may yield: a request scheduled meanwhile is then
    # kept, not overwritten.
    jsi._fcr = None
    try:
        await nc.publish(reply)
    except nats_errors.Error as exc:
        # Kept for nats-py's flow-control task (every 0.25 s) to send; a stalled
        # consumer's heartbeats also carry the request again. The message is taken all
        # the same.
        if jsi._fcr is None:
            jsi._fcr = reply
        logger.debug("flow-control reply failed: %r", exc)


# -- JetStream publishes ---------------------------------------------------------------------


def header_block(headers: dict[str, str]) -> bytes:
    """The header section nats-py's ``publish`` writes for ``headers``, byte for byte,
    for keys that are valid and values without surrounding space or line breaks (what
    the store's are: ids, numbers and marker names)."""
    lines = [f"{key}: {value}\r\n".encode() for key, value in headers.items()]
    return b"".join([b"NATS/1.0\r\n", *lines, b"\r\n"])


JetStreamPublish = Callable[[str, bytes, bytes], Coroutine[Any, Any, int | None]]
"""``publish(subject, payload, header_block) -> sequence``: a message stored by
JetStream, its stream sequence from the ack; None (having sent nothing) when only
``js.publish`` can send it. Raises what ``js.publish`` raises for the same answer; the
caller bounds the wait for the ack (``asyncio.timeout``), as ``js.publish``'s
``timeout`` does."""

# The tokens of these requests in the client's response map: "e" and a number, never
# the 26 characters (a nuid and four hex digits) of nats-py's own, so the two never meet.
_REQUEST_TOKENS: Final = itertools.count(1)
_NUID_LENGTH: Final = 22


def direct_jetstream_publish(nc: Client) -> JetStreamPublish | None:
    """A function that publishes to JetStream and returns the stored message's sequence
    as ``js.publish(...).seq`` does, on nats-py's response subscription, with one timer
    instead of its layers; None when this nats-py lacks the state it uses.

    ``js.publish`` is ``nc.request`` (three coroutines deep, a ``wait_for``) and then
    ``json.loads`` and a ``PubAck`` dataclass built by inspecting its fields, a large
    part of what an append costs the client (benchmarks/README.md, bench_nats.py, has
    the figures). This registers a future in the client's
    response map, buffers the HPUB with its reply subject as :func:`direct_publish`
    does, and reads the sequence from the ack with orjson. It sends nothing and returns
    None whenever the public call is needed: before nats-py's first request has made its
    response subscription, or when :func:`direct_publish` declines (not connected, too
    large, a full buffer).
    """
    publish = direct_publish(nc)
    raw: Any = nc
    if not (
        publish is not None
        and isinstance(getattr(raw, "_resp_map", None), dict)
        and hasattr(raw, "_resp_sub_prefix")
        and isinstance(getattr(raw, "_inbox_prefix", None), bytes | bytearray)
    ):
        return None

    async def request(subject: str, payload: bytes, headers: bytes) -> int | None:
        prefix = raw._resp_sub_prefix
        # nats-py's response callback reads the token after "<inbox prefix>.<nuid>.".
        if prefix is None or len(prefix) != len(raw._inbox_prefix) + _NUID_LENGTH + 2:
            return None
        token = f"e{next(_REQUEST_TOKENS)}"
        future: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()
        responses = raw._resp_map
        responses[token] = future
        try:
            if not publish(subject, payload, headers, prefix.decode() + token):
                return None
            msg = await future
        finally:
            # Also when the caller's bound ran out: a late ack then finds no future.
            responses.pop(token, None)
        return acked_sequence(msg)

    return request


def acked_sequence(msg: Msg) -> int:
    """The stream sequence of JetStream's ack ``msg``, or the error ``js.publish``
    raises for it."""
    headers = msg.headers
    if headers and headers.get(api.Header.STATUS) == "503":
        raise nats.js.errors.NoStreamResponseError  # nobody answered: no such stream
    ack = orjson.loads(msg.data)  # a ValueError for a body that is not JSON, as json's
    if "error" in ack:
        raise nats.js.errors.APIError.from_error(ack["error"])
    seq = ack.get("seq") if isinstance(ack, dict) else None
    if type(seq) is int:
        return seq
    return int(api.PubAck.from_response(ack).seq)  # whatever it makes of another shape
