"""The per-stream-id bounds of :class:`~essessey.stores.jetstream.JetStreamEventStore`: how
many events and bytes one stream id keeps, how many stream ids the store keeps, and that a
running turn's stream is never dropped to make room.

JetStream limits messages per JetStream stream or per *subject*, and here a subject is one
event name of one stream id, so neither bounds a stream id. The store keeps these bounds
itself, as the in-memory and Redis stores do:

- **A stream id's events** (``max_events_per_stream``, ``max_bytes_per_stream``). The
  writer knows, per stream id it writes, the sequence and size of each retained event
  (:class:`Kept`, read again from the server with a headers-only consumer when another
  process wrote since). An append that takes the stream id past a bound purges its oldest
  messages (``purge`` with the stream id's filter and the first sequence to keep), in the
  same call, so a reader never sees more than the bounds. A stream id under its bounds
  (most turns) costs no request beyond the publish.
- **Which id is known after a trim.** The in-memory store resumes from the id of the last
  event it evicted (everything after it is still there). A JetStream reader cannot see an
  evicted message, so every message carries the sequence of the stream id's message
  before it (the header ``Essessey-Prev``): the first message a reader finds after an id
  whose own message is gone says whether nothing was between them.
- **The stream ids** (``max_streams``). The KV bucket ``<stream>_STREAMS`` has one key per
  stream id (a hash, as the leases' keys), its value ``r:<id>`` while a turn runs it and
  ``f:<id>`` once finished; every turn's start and end and every new stream id writes it,
  so the bucket's stream holds them in the order they were last updated. A new stream id
  past ``max_streams`` drops the finished one updated longest ago (its messages purged,
  its key removed); when every one is running, :class:`~essessey.StoreFull`. A running
  stream is never dropped to make room. The bucket's TTL is ``max_age``, the messages'.

Updated, for ``max_streams``, means a turn started or ended on it, or it was written outside
a turn: an append outside a turn to another stream id than the one the store wrote last
writes the bucket. Appends inside a turn do not (they would double every append's cost,
and a running stream is never dropped anyway).
Two processes that admit new stream ids at the same moment may each drop one finished
stream id, or keep one more than ``max_streams`` until the next admission. A stream id
written by two processes at once without a turn (no lease) keeps its bounds as the writer
last refreshed them, never tighter.
"""

from __future__ import annotations

from array import array
from collections.abc import Awaitable
from typing import Final

import nats.js.errors
from nats.js import api
from nats.js.kv import KeyValue

from essessey.errors import JetStreamUnavailable, StoreFull, StreamReset
from essessey.protocol import EventType
from essessey.stores.jetstream._context import (
    CONTROL_EVENT,
    CONTROL_HEADER,
    RESET,
    StoreContext,
    logger,
    stream_key,
)
from essessey.stores.jetstream._reader import Reader

__all__ = ["EVENT_OVERHEAD", "Bounds", "Kept"]

_SIZE_HEADER: Final = "Nats-Msg-Size"  # what a headers-only consumer says of each body

EVENT_OVERHEAD: Final = 180
"""Bytes an event counts against ``max_bytes_per_stream`` beyond its data: the in-memory
store's figure (see ``essessey.stores``), so one budget means the same on every store."""

_READ_IDLE: Final = 1.0  # seconds without a message before a read asks the consumer
_READ_STALLS: Final = 30
"""Idle waits in a row, the consumer not caught up, after which a read of a stream id's
bounds gives up (the server out of reach, or its consumer lost and not recreated)."""

_RUNNING: Final = b"r:"
_FINISHED: Final = b"f:"

_MAX_KEPT: Final = 1024
"""Stream ids whose retained events a store remembers; one forgotten is read again from
the server when it is next written."""


class Kept:
    """What one stream id retains, as its writer knows it: the sequence and counted size
    of each event, oldest first (two integer arrays: nothing the collector tracks)."""

    __slots__ = (
        "admitted",
        "bytes",
        "cleared_running",
        "costs",
        "head",
        "last_seq",
        "running",
        "seqs",
    )

    def __init__(self) -> None:
        self.seqs = array("q")
        self.costs = array("q")
        self.head = 0  # the index of the oldest retained event in the arrays
        self.bytes = 0
        self.last_seq = 0  # the stream id's last message (events and markers)
        self.running = False  # a turn of this process runs it
        self.admitted = False  # its key in the bucket is known to exist
        self.cleared_running = False  # cleared while running: only a new message restarts it

    def __len__(self) -> int:
        return len(self.seqs) - self.head

    def add(self, seq: int, cost: int) -> None:
        self.seqs.append(seq)
        self.costs.append(cost)
        self.bytes += cost
        self.last_seq = seq

    def reset(self) -> None:
        """A new life (after a ``reset`` marker): nothing of the old one counts."""
        del self.seqs[:]
        del self.costs[:]
        self.head = self.bytes = 0

    def trim(self, max_events: int, max_bytes: int) -> int:
        """Drop the oldest events past the bounds (the newest always stays); the sequence
        of the first event kept when any was dropped, else 0."""
        seqs, costs = self.seqs, self.costs
        dropped = False
        while len(self) > 1 and (len(self) > max_events or self.bytes > max_bytes):
            self.bytes -= costs[self.head]
            self.head += 1
            dropped = True
        if not dropped:
            return 0
        first = seqs[self.head]
        if self.head > len(seqs) // 2:  # compact now and then, not per event
            del seqs[: self.head]
            del costs[: self.head]
            self.head = 0
        return first


class Bounds:
    """The bounds of one JetStream store (see the module docstring), on its context."""

    def __init__(
        self,
        ctx: StoreContext,
        *,
        max_events_per_stream: int,
        max_bytes_per_stream: int,
        max_streams: int,
        max_age: float,
    ) -> None:
        self._ctx = ctx
        self._max_events = max_events_per_stream
        self._max_bytes = max_bytes_per_stream
        self._max_streams = max_streams
        self._max_age = max_age
        self._kv: KeyValue | None = None
        self._kept: dict[str, Kept] = {}
        self._touched: str | None = None  # the stream id whose key this store wrote last

    @property
    def bucket(self) -> str:
        """The name of the KV bucket of the stream ids."""
        return self._ctx.bucket("STREAMS")

    async def setup(self) -> None:
        """Create the bucket (or find it)."""
        self._kv = await self._ctx.open_bucket(self.bucket, self._max_age)

    async def _bucket(self) -> KeyValue:
        kv = self._kv
        if kv is None:
            await self._ctx.ensure()  # which sets the buckets up with the stream
            kv = self._kv or await self._ctx.open_bucket(self.bucket, self._max_age)
            self._kv = kv
        return kv

    # -- a stream id's events ----------------------------------------------------------------

    def kept(self, stream_id: str) -> Kept | None:
        """What this store knows ``stream_id`` retains, when it is ready to be appended to
        without a request (the hot path)."""
        kept = self._kept.get(stream_id)
        if kept is None or not kept.admitted or kept.cleared_running:
            return None
        if not kept.running and stream_id != self._touched:
            return None  # outside a turn: the bucket is told it was updated
        return kept

    async def before_append(self, stream_id: str, name: str) -> Kept:
        """:meth:`kept`, made ready: read from the server, admitted to the bucket (which
        may drop another stream id or raise StoreFull), or StreamReset for the tail of a
        message whose running stream was cleared."""
        kept = self._kept.get(stream_id)
        if kept is not None and kept.cleared_running:
            if name != EventType.MESSAGE_START:
                raise StreamReset(
                    f"stream {stream_id!r} was cleared while its turn ran; only a new "
                    "message may start it again"
                )
            kept.cleared_running = False
        if kept is None:
            kept = await self._load(stream_id)
        if not kept.admitted or (not kept.running and stream_id != self._touched):
            await self._admit(stream_id, kept, running=kept.running)
        return kept

    async def after_append(self, stream_id: str, kept: Kept, seq: int, size: int) -> None:
        """Count the event stored at ``seq`` and purge what it takes past the bounds."""
        kept.add(seq, size + EVENT_OVERHEAD)
        ctx = self._ctx
        first = kept.trim(self._max_events, self._max_bytes)
        if first:
            await ctx.retrying(
                lambda _: ctx.js.purge_stream(ctx.stream, seq=first, subject=ctx.filter(stream_id))
            )

    def marker_stored(self, stream_id: str, seq: int, reset: bool = False) -> None:
        """A marker of ``stream_id`` was stored at ``seq``."""
        kept = self._kept.get(stream_id)
        if kept is not None:
            kept.last_seq = seq
            if reset:
                kept.reset()

    def prev(self, stream_id: str) -> int | None:
        """The sequence of the stream id's last message, when this store knows it."""
        kept = self._kept.get(stream_id)
        return kept.last_seq if kept is not None else None

    async def _load(self, stream_id: str) -> Kept:
        """What ``stream_id`` retains, read from the server: its events' sequences and
        sizes through a headers-only consumer (nothing when it has no message)."""
        kept = Kept()
        last_seq = await self._last_seq(stream_id)
        if last_seq:
            await self._read(stream_id, kept, last_seq)
        self._remember(stream_id, kept)
        return kept

    async def _last_seq(self, stream_id: str) -> int:
        """The sequence of the stream id's last message on the server (0: none)."""
        ctx = self._ctx
        try:
            last = await ctx.retrying(
                lambda _: ctx.js.get_last_msg(ctx.stream, ctx.filter(stream_id))
            )
        except nats.js.errors.NotFoundError:
            return 0
        return last.seq or 0

    async def _read(self, stream_id: str, kept: Kept, until: int) -> None:
        ctx = self._ctx
        reader = Reader(ctx, stream_id, await ctx.ensure(), headers_only=True)
        try:
            if await reader.open(None) == 0:
                return
            control_at = len(reader.prefix)
            idle = 0
            while reader.seq < until:
                msg = await reader.next(_READ_IDLE)
                if msg is None:
                    if await reader.caught_up():
                        break  # purged under the read: what was read is what is kept
                    idle += 1
                    if idle > _READ_STALLS:
                        raise JetStreamUnavailable(f"reading the bounds of {stream_id!r} stalled")
                    continue
                idle = 0
                headers = msg.headers or {}
                if msg.subject[control_at:] == CONTROL_EVENT:
                    if headers.get(CONTROL_HEADER) == RESET:
                        kept.reset()
                    kept.last_seq = reader.seq
                    continue
                size = headers.get(_SIZE_HEADER, "0")
                kept.add(reader.seq, (int(size) if size.isdigit() else 0) + EVENT_OVERHEAD)
                if reader.pending == 0:
                    break
        finally:
            await reader.close()
        kept.last_seq = max(kept.last_seq, until)

    def _remember(self, stream_id: str, kept: Kept) -> None:
        known = self._kept
        known.pop(stream_id, None)
        known[stream_id] = kept
        while len(known) > _MAX_KEPT:
            # The oldest one no turn of this store is writing (those stay).
            oldest = next((sid for sid, k in known.items() if not k.running), None)
            if oldest is None:
                break
            del known[oldest]

    # -- a turn ------------------------------------------------------------------------------

    async def opening(self, stream_id: str) -> None:
        """A turn of this store starts on ``stream_id``: its events read again when another
        process wrote it since, then admitted as running (StoreFull when it cannot be)."""
        kept = self._kept.get(stream_id)
        if kept is not None and await self._last_seq(stream_id) != kept.last_seq:
            kept = None
        if kept is None:
            kept = await self._load(stream_id)
        else:
            self._remember(stream_id, kept)
        kept.cleared_running = False
        await self._admit(stream_id, kept, running=True)
        kept.running = True

    async def finished(self, stream_id: str) -> None:
        """The turn on ``stream_id`` ended (its close marker is stored)."""
        kept = self._kept.get(stream_id)
        if kept is not None:
            kept.running = False
        kv = await self._bucket()
        await self._ctx.retrying(
            lambda _: kv.put(stream_key(stream_id), _FINISHED + stream_id.encode())
        )
        self._touched = stream_id

    async def cleared(self, stream_id: str) -> None:
        """``stream_id`` was cleared: its key leaves the bucket, and a turn of this store
        that was running it may go on only with a new message."""
        kept = self._kept.get(stream_id)
        if kept is not None:
            kept.reset()
            kept.admitted = False
            if kept.running:
                kept.cleared_running = True
                kept.running = False
        await self._remove_key(stream_id)

    # -- the stream ids ----------------------------------------------------------------------

    async def _admit(self, stream_id: str, kept: Kept, *, running: bool) -> None:
        """Write ``stream_id``'s key (running or finished); a new one past ``max_streams``
        first drops the finished stream id updated longest ago."""
        retrying = self._ctx.retrying
        kv = await self._bucket()
        key = stream_key(stream_id)
        value = (_RUNNING if running else _FINISHED) + stream_id.encode()
        try:
            revision = await retrying(lambda _: kv.create(key, value))
        except nats.js.errors.KeyWrongLastSequenceError:
            await retrying(lambda _: kv.put(key, value))  # known: updated
            self._touched = stream_id
        else:
            status = await retrying(lambda _: kv.status())
            excess = status.values - self._max_streams
            if excess > 0:
                try:
                    await self._make_room(stream_id, excess, revision)
                except StoreFull:
                    await self._remove_key(stream_id)
                    raise
        kept.admitted = True
        self._touched = stream_id

    async def _make_room(self, new_id: str, excess: int, revision: int) -> None:
        """Drop ``excess`` finished stream ids, updated longest ago first. Without enough
        of them, the excess is the running ones started last: ``new_id`` (its key written
        at ``revision``) stays when fewer than ``max_streams`` running keys were written
        before it (starts at the same moment all count each other's keys, and would
        otherwise all refuse, room or not)."""
        ctx = self._ctx
        kv_stream = f"KV_{self.bucket}"
        subjects = f"$KV.{self.bucket}.>"
        seq = 1

        def next_key(_: float) -> Awaitable[api.RawStreamMsg]:
            return ctx.js.get_msg(kv_stream, seq, subject=subjects, next=True)

        earlier = 0  # running keys written before new_id's
        while excess > 0:
            try:
                msg = await ctx.retrying(next_key)
            except nats.js.errors.NotFoundError:
                if earlier < self._max_streams:
                    return
                raise StoreFull(
                    f"the store holds {self._max_streams} streams whose turns are running; "
                    "no other can start until one ends"
                ) from None
            seq = (msg.seq or seq) + 1
            value = msg.data or b""
            if not value.startswith(_FINISHED):
                if value.startswith(_RUNNING) and seq - 1 < revision:
                    earlier += 1
                continue
            victim = value[len(_FINISHED) :].decode()
            if victim == new_id:
                continue
            await self._drop(victim)
            excess -= 1

    async def _drop(self, stream_id: str) -> None:
        ctx = self._ctx
        await ctx.retrying(lambda _: ctx.js.purge_stream(ctx.stream, subject=ctx.filter(stream_id)))
        await self._remove_key(stream_id)
        self._kept.pop(stream_id, None)
        logger.debug("dropped stream %s (over max_streams)", stream_id)

    async def _remove_key(self, stream_id: str) -> None:
        ctx = self._ctx
        subject = f"$KV.{self.bucket}.{stream_key(stream_id)}"
        await self._bucket()
        await ctx.retrying(lambda _: ctx.js.purge_stream(f"KV_{self.bucket}", subject=subject))
