"""The reader of the JetStream store: one ordered push consumer on a stream id's subjects,
with the accounting ``since``, ``follow`` and the bounds' reads need."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Final

import anyio
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import api
from nats.js.client import JetStreamContext

from essessey._nats_py import (
    flow_control_due,
    ready_push_subscription,
    reply_flow_control,
    take_queued,
    wait_queued,
)
from essessey.errors import StreamReset
from essessey.event import Event
from essessey.stores.jetstream._context import (
    TRANSIENT,
    StoreContext,
    closed_error,
    epoch_of,
    logger,
    reconnects,
)

__all__ = ["Reader", "ack_fields", "position"]

# The reply subject of a JetStream message (``Msg.Metadata._from_reply`` reads the same
# layouts): 9 tokens, ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>``,
# or 11 and more, ``$JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<delivered>.<sseq>.
# <cseq>.<ts>.<pending>[.<random>...]``. The positions of the consumer name, the stream
# sequence and num_pending in each.
_ACK_V1: Final = (3, 5, 8)
_ACK_V2: Final = (5, 7, 10)


def ack_fields(reply: str) -> tuple[str, int, int] | None:
    """The consumer name, stream sequence and ``num_pending`` in the reply subject of a
    JetStream message, or None when it is not laid out as expected (the caller then asks
    ``msg.metadata``).

    ``msg.metadata`` builds two dataclasses and a ``datetime`` for every message, of which
    a reader needs these three fields: this reads them from the same tokens, accepting the
    layouts nats-py accepts (9 tokens, or 11 and more), and only ASCII digits as numbers.
    """
    tokens = reply.split(".")
    count = len(tokens)
    if count == 9:
        at_consumer, at_seq, at_pending = _ACK_V1
    elif count >= 11:
        at_consumer, at_seq, at_pending = _ACK_V2
    else:
        return None
    if tokens[0] != "$JS" or tokens[1] != "ACK":
        return None
    seq_text = tokens[at_seq]
    pending_text = tokens[at_pending]
    if not (
        seq_text.isdigit()
        and seq_text.isascii()
        and pending_text.isdigit()
        and pending_text.isascii()
    ):
        return None
    return tokens[at_consumer], int(seq_text), int(pending_text)


def position(msg: Msg) -> tuple[str, int, int]:
    """The consumer name, stream sequence and ``num_pending`` of a JetStream message: from
    its reply subject, else from ``msg.metadata`` (which raises for a message that is not
    one)."""
    fields = ack_fields(msg.reply) if msg.reply else None
    if fields is not None:
        return fields
    meta = msg.metadata
    return meta.consumer, meta.sequence.stream, meta.num_pending


_RECONNECT_LOOK: Final = 0.25
"""Seconds a waiting follower may go without looking whether its connection reconnected."""


class Reader:
    """One ordered push consumer on a stream id's subjects, with the accounting that
    ``since`` and ``follow`` need: the stream sequence of the last message, how many are
    pending after it, and whether messages were removed ahead of it."""

    __slots__ = (
        "backlog",
        "consumer",
        "count",
        "ctx",
        "epoch",
        "headers_only",
        "pending",
        "prefix",
        "queued",
        "ready",
        "reconnects",
        "removed",
        "seq",
        "stream_id",
        "sub",
        "total",
    )

    def __init__(
        self, ctx: StoreContext, stream_id: str, epoch: str, headers_only: bool = False
    ) -> None:
        self.ctx = ctx
        self.headers_only = headers_only
        self.stream_id = stream_id
        self.epoch = epoch
        self.prefix = f"{ctx.prefix}.{stream_id}."
        self.sub: JetStreamContext.PushSubscription | None = None
        # Its core subscription, when the messages it holds can be taken without waiting
        # (see _nats_py.ready_push_subscription); None: through next_msg only.
        self.ready: Any = None
        self.consumer = ""
        self.backlog = 0  # messages pending when the consumer was created
        self.count = 0  # messages delivered (each once)
        self.seq = 0  # stream sequence of the last message delivered
        self.pending = 0  # num_pending of the last message delivered
        self.queued = 0  # messages received after it, not yet taken
        self.total = 0  # count + pending: drops only when messages ahead are removed
        self.removed = False
        self.reconnects = 0  # the connection's reconnect count when the consumer was made

    def event(self, name: str, msg: Msg) -> Event:
        """The event ``msg`` (named ``name``) carries, with the id of its sequence."""
        return Event(name, msg.data, f"{self.epoch}-{self.seq}")

    async def open(self, start: int | None) -> int:
        """Create the consumer from ``start`` (its first message is the one at ``start``
        or after), or from the stream id's first message; the backlog it found.
        Retried as the store's requests are (a consumer left by a failed attempt is
        ephemeral: the server drops it once nothing listens to it)."""
        return await self.ctx.retrying(lambda _: self._open(start))

    async def _open(self, start: int | None) -> int:
        ctx = self.ctx
        js = ctx.js
        config = api.ConsumerConfig(
            deliver_subject=ctx.nc.new_inbox(),
            filter_subject=f"{self.prefix}>",
            deliver_policy=(
                api.DeliverPolicy.ALL if start is None else api.DeliverPolicy.BY_START_SEQUENCE
            ),
            opt_start_seq=start,
            # What nats-py sets for an ordered consumer.
            ack_policy=api.AckPolicy.NONE,
            max_deliver=1,
            ack_wait=22 * 3600,
            flow_control=True,
            idle_heartbeat=ctx.heartbeat,
            num_replicas=1,
            mem_storage=True,
            headers_only=self.headers_only or None,
        )
        self.reconnects = reconnects(ctx.nc)
        info = await js.add_consumer(ctx.stream, config)
        self.consumer = info.name
        # After a reopen the count goes on: what is pending now is the backlog from here.
        self.backlog = self.total = self.count + (info.num_pending or 0)
        # nats-py may recreate an ordered consumer from the stream's first sequence
        # (missed heartbeats before any message): anything before the start is skipped.
        self.seq = 0 if start is None else start - 1
        self.sub = await js.subscribe_bind(ctx.stream, config, info.name, ordered_consumer=True)
        self.ready = ready_push_subscription(self.sub)
        if self.ready is None:
            logger.debug("nats-py internals not as expected: reading through next_msg only")
        return self.backlog

    @property
    def lag(self) -> int:
        """Messages waiting beyond the backlog the consumer started with, at least.

        What waits after the last message is what this client holds and has not taken
        (``queued``) plus what the server has not sent yet; ``num_pending`` counted both
        when the server sent the message, so the larger of the two is a lower bound. The
        server pushes a flow-control window ahead of the reader and then waits for it, so
        a reader that falls behind sees ``num_pending`` grow with the appends."""
        return max(self.pending, self.queued) - max(0, self.backlog - self.count)

    async def next(self, idle: float) -> Msg | None:
        """The next message (never one already delivered), or None after ``idle``
        seconds without one."""
        deadline = time.monotonic() + idle
        while True:
            sub = self.sub
            assert sub is not None
            ready = self.ready
            nc = self.ctx.nc
            msg = None if ready is None else take_queued(ready, nc)
            if msg is None:
                if reconnects(nc) != self.reconnects:
                    await self._reopen()
                    continue
                wait = min(deadline - time.monotonic(), _RECONNECT_LOOK)
                if wait <= 0:
                    return None
                if nc.is_closed:
                    raise closed_error()
                if ready is not None:
                    # A caught-up follower waits here for every message: on the queue,
                    # in this task, where next_msg would start one per message.
                    try:
                        async with asyncio.timeout(wait):
                            msg = await wait_queued(ready)
                    except TimeoutError:
                        continue
                else:
                    try:
                        msg = await sub.next_msg(wait)
                    except nats.errors.TimeoutError:
                        continue
                    except nats.errors.ConnectionClosedError as exc:
                        raise closed_error() from exc
            if ready is not None and flow_control_due(ready):
                await reply_flow_control(ready, nc)
            consumer, seq, pending = position(msg)
            if seq <= self.seq:
                continue
            if consumer != self.consumer:
                # The ordered consumer was recreated (a gap, missed heartbeats, a server
                # restart). If the JetStream stream was recreated too, these messages are
                # from another life.
                await self._check_epoch()
                self.consumer = consumer
            self.seq = seq
            self.count += 1
            self.pending = pending
            self.queued = sub.pending_msgs
            total = self.count + pending
            self.removed = total < self.total
            self.total = total
            return msg

    async def _reopen(self) -> None:
        """The connection came back: a new consumer from the next message. A server that
        restarted has lost this ephemeral consumer, and nats-py's ordered consumer would
        notice only after missing its heartbeats (two to four of them: 10-20 s with the
        default heartbeat), a pause every live reader would sit through."""
        logger.debug("the NATS connection came back; recreating the follower's consumer")
        old, self.sub = self.sub, None
        if old is not None:
            try:
                await old.unsubscribe()
            except nats.errors.Error as exc:
                logger.debug("unsubscribe failed: %r", exc)
        await self.open(self.seq + 1)
        await self._check_epoch()

    async def _check_epoch(self) -> None:
        ctx = self.ctx
        for attempt in range(5):
            try:
                info = await ctx.js.stream_info(ctx.stream)
            except nats.js.errors.NotFoundError:
                break
            except TRANSIENT:
                await asyncio.sleep(0.2 * (attempt + 1))
                continue
            if epoch_of(info) == self.epoch:
                return
            break
        # Deleted, recreated, or it cannot be told: deliver nothing that may be from
        # another life of the JetStream stream.
        raise StreamReset(f"the JetStream stream of {self.stream_id!r} was deleted or recreated")

    async def caught_up(self) -> bool:
        """Whether the consumer has nothing left to deliver (asked of the server)."""
        sub = self.sub
        assert sub is not None
        try:
            info = await sub.consumer_info()
        except (*TRANSIENT, nats.js.errors.NotFoundError):
            # Not found: a server that restarted lost the ephemeral consumer, which the
            # reader recreates once the connection is back. Cannot be told yet, as while
            # the server is out of reach.
            return False
        return (info.num_pending or 0) == 0 and sub.pending_msgs == 0

    async def close(self) -> None:
        """Unsubscribe (the server drops the ephemeral consumer), even when cancelled."""
        sub, self.sub = self.sub, None
        if sub is None:
            return
        with anyio.CancelScope(shield=True):
            try:
                await sub.unsubscribe()
            except nats.errors.Error as exc:  # closed connection, already unsubscribed
                logger.debug("unsubscribe failed: %r", exc)
