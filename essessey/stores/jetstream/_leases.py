"""Turn leases for :class:`~essessey.stores.jetstream.JetStreamEventStore`: a turn runs on one
replica at a time, stops from any, and ends with an error event when its replica dies.

A lease is a key of the KV bucket ``<stream>_LEASES`` (a hash of the stream id: stream ids
may hold characters KV keys may not), created by the claim (so only one holder wins it),
updated with its last revision by each renewal and deleted by the release. The bucket's
TTL is ``running_ttl``: a lease not renewed for that long is gone. A holder checks its own
lease locally before each write: it counts as held until ``running_ttl`` after the
renewal request was *sent* (the server wrote it later, so it expires later), less a margin;
past that, the write renews first and raises :class:`~essessey.LeaseLost` when it cannot.

The open marker of a claimed turn carries the header ``Essessey-Holder``. A claim, or a
follower that has waited a while, that finds the stream id's last marker an open one with
a holder but no lease in the bucket, takes the lease itself (one replica wins), ends the
message with an error event when one is open, closes the stream, and lets the lease go.

A request to cancel is a core NATS message on ``_essessey_cancel.<prefix>.<sid>``
(outside the JetStream stream's subjects, so never stored); the holder's hub subscribes to
it while its turn runs, and the asker waits for the stream's close marker, which core
subscribers of the control subject see as JetStream stores it.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import anyio
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js.kv import KeyValue

from essessey.errors import LeaseLost, StreamBusy
from essessey.protocol import EventType
from essessey.stores.jetstream._context import (
    CLOSE,
    CONTROL_EVENT,
    CONTROL_HEADER,
    HOLDER_HEADER,
    OPEN,
    RESET,
    StoreContext,
    logger,
    stream_key,
)
from essessey.stores.jetstream._writer import Writer

__all__ = ["ABANDONED", "Leases"]

_MARGIN: Final = 0.2
"""Of ``running_ttl``: how early a holder stops trusting its lease without renewing."""

_CANCEL_RESEND: Final = 1.0

ABANDONED: Final = (
    b'{"type":"error","error":{"type":"api_error",'
    b'"message":"the replica running the turn stopped"}}'
)


@dataclass(slots=True)
class _Held:
    holder: str
    revision: int
    valid_until: float  # time.monotonic()


class Leases:
    """The lease side of one JetStream store (see the module docstring): leases of
    ``running_ttl`` seconds, on its context, opening and closing turns through its
    writer."""

    def __init__(self, ctx: StoreContext, writer: Writer, running_ttl: float) -> None:
        self._ctx = ctx
        self._writer = writer
        self._running_ttl = running_ttl
        self._kv: KeyValue | None = None
        self._held: dict[str, _Held] = {}
        self._reaper = f"reaper-{secrets.token_hex(6)}"

    @property
    def bucket(self) -> str:
        """The name of the KV bucket of the leases."""
        return self._ctx.bucket("LEASES")

    async def setup(self) -> None:
        """Create the bucket (or find it)."""
        self._kv = await self._ctx.open_bucket(self.bucket, self._running_ttl)

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            await self._ctx.ensure()  # which sets the buckets up with the stream
            if self._kv is None:
                await self.setup()
        assert self._kv is not None
        return self._kv

    # -- the holder ------------------------------------------------------------------------

    async def claim(self, stream_id: str, holder: str) -> None:
        """Take the lease of ``stream_id`` for ``holder``, end an abandoned turn there,
        and open the stream; StreamBusy while another holder's lease runs."""
        kv = await self._bucket()
        key = stream_key(stream_id)
        sent = time.monotonic()
        try:
            revision = await self._ctx.retrying(lambda _: kv.create(key, holder.encode()))
        except nats.js.errors.KeyWrongLastSequenceError:
            try:
                entry = await kv.get(key)
            except nats.js.errors.KeyNotFoundError:
                raise StreamBusy(f"a turn is starting on stream {stream_id!r} elsewhere") from None
            if entry.value != holder.encode() or entry.revision is None:
                raise StreamBusy(
                    f"a turn is running on stream {stream_id!r} on another replica"
                ) from None
            revision = entry.revision
        self._held[stream_id] = _Held(holder, revision, sent + self._running_ttl)
        try:
            if await self._claimed_and_open(stream_id):
                if not self._ctx.settled_for(self._running_ttl):
                    raise StreamBusy(
                        f"the lease of the turn on stream {stream_id!r} lapsed while "
                        "JetStream was out of reach; its replica may take it back"
                    )
                await self._finish_abandoned(stream_id)
                await self._writer.close(stream_id)
            await self._writer.open(stream_id, holder)
        except BaseException:
            await self.release(stream_id, holder, close=False)
            raise

    async def check(self, stream_id: str, holder: str) -> None:
        """Before a write: the lease is ``holder``'s (renewed first when it may be
        about to run out), or LeaseLost."""
        held = self._held.get(stream_id)
        if held is None or held.holder != holder:
            raise LeaseLost(f"stream {stream_id!r}: this turn no longer holds the stream")
        about_to_end = time.monotonic() > held.valid_until - _MARGIN * self._running_ttl
        if about_to_end and not await self.renew(stream_id, holder):
            raise LeaseLost(f"stream {stream_id!r}: this turn no longer holds the stream")

    async def renew(self, stream_id: str, holder: str) -> bool:
        """Renew ``holder``'s lease; False (and forgotten) when it is lost."""
        held = self._held.get(stream_id)
        if held is None or (holder and held.holder != holder):
            return False
        kv = await self._bucket()
        key = stream_key(stream_id)
        sent = time.monotonic()
        try:
            revision = await self._ctx.retrying(
                lambda _: kv.update(key, held.holder.encode(), last=held.revision)
            )
        except nats.js.errors.KeyWrongLastSequenceError:
            # Another renewal of this store's got there first (the keeper's and a write's
            # check may overlap): still ours if the key still names us.
            try:
                entry = await kv.get(key)
            except nats.js.errors.KeyNotFoundError:
                return await self._take_back(stream_id, held)
            if entry.value != held.holder.encode() or entry.revision is None:
                self._held.pop(stream_id, None)
                return False
            # When that renewal was written is not known here: it sets the deadline.
            held.revision = max(held.revision, entry.revision)
            return True
        except nats.js.errors.KeyNotFoundError:
            return await self._take_back(stream_id, held)
        held.revision = max(held.revision, revision)
        held.valid_until = max(held.valid_until, sent + self._running_ttl)
        return True

    async def _take_back(self, stream_id: str, held: _Held) -> bool:
        """The lease lapsed unrenewed (JetStream was out of reach, or this replica
        stalled): take it again when nobody holds it and the stream's last marker is
        still this turn's open one, so nobody wrote there meanwhile (a claimer or a
        follower ending it holds the lease while it writes). False, and forgotten,
        otherwise."""
        kv = await self._bucket()
        key = stream_key(stream_id)
        sent = time.monotonic()
        try:
            revision = await self._ctx.retrying(lambda _: kv.create(key, held.holder.encode()))
        except nats.js.errors.KeyWrongLastSequenceError:
            # Someone took it: this store's own other take-back (the keeper's and a
            # write's may race), or another holder.
            try:
                entry = await kv.get(key)
            except nats.js.errors.KeyNotFoundError:
                entry = None
            if entry is None or entry.value != held.holder.encode() or entry.revision is None:
                self._held.pop(stream_id, None)
                return False
            held.revision = max(held.revision, entry.revision)
            return True
        if not await self._opened_by(stream_id, held.holder):
            self._held.pop(stream_id, None)
            await _let_go(kv, stream_id, revision)
            return False
        held.revision = revision
        held.valid_until = sent + self._running_ttl
        logger.warning("the lease of %s lapsed with nobody else holding it; taken back", stream_id)
        return True

    async def release(self, stream_id: str, holder: str, *, close: bool = True) -> bool:
        """Close the stream and let the lease go; False when ``holder`` does not hold it."""
        held = self._held.get(stream_id)
        if held is None or held.holder != holder:
            return False
        if close:
            await self._writer.close(stream_id)
        del self._held[stream_id]
        await _let_go(await self._bucket(), stream_id, held.revision)
        return True

    async def held(self, stream_id: str) -> bool:
        """Whether any holder's lease of ``stream_id`` is alive (the bucket's entries
        lapse ``running_ttl`` after their last renewal)."""
        kv = await self._bucket()
        key = stream_key(stream_id)
        try:
            await self._ctx.retrying(lambda _: kv.get(key))
        except nats.js.errors.KeyNotFoundError:  # never held, let go, deleted or lapsed
            return False
        return True

    async def watch_cancel(
        self, stream_id: str, on_cancel: Callable[[], None]
    ) -> Callable[[], None]:
        """Call ``on_cancel()`` when another replica asks to cancel the turn; call what
        this returns to stop."""

        async def handle(msg: Msg) -> None:
            on_cancel()

        nc = self._ctx.nc
        sub = await nc.subscribe(self._ctx.cancel_subject(stream_id), cb=handle)

        def unwatch() -> None:
            task = asyncio.get_running_loop().create_task(sub.unsubscribe())
            task.add_done_callback(_retrieve)

        return unwatch

    # -- anyone ----------------------------------------------------------------------------

    async def request_cancel(self, stream_id: str, wait: float) -> bool:
        """Ask the holder of ``stream_id``'s lease to cancel its turn; True once the
        stream closed (within ``wait`` seconds), False when no lease is held."""
        kv = await self._bucket()
        try:
            await self._ctx.retrying(lambda _: kv.get(stream_key(stream_id)))
        except nats.js.errors.KeyNotFoundError:
            return False
        closed = anyio.Event()

        async def marker(msg: Msg) -> None:
            headers = msg.headers or {}
            if headers.get(CONTROL_HEADER) in (CLOSE, RESET):
                closed.set()

        nc = self._ctx.nc
        sub = await nc.subscribe(self._ctx.control_subject(stream_id), cb=marker)
        try:
            with anyio.move_on_after(wait):
                while not closed.is_set():
                    await nc.publish(self._ctx.cancel_subject(stream_id), b"")
                    with anyio.move_on_after(_CANCEL_RESEND):
                        await closed.wait()
                    if not closed.is_set():
                        try:
                            await kv.get(stream_key(stream_id))
                        except nats.js.errors.KeyNotFoundError:
                            return True  # released: its close went by before we listened
            if closed.is_set():
                return True
        finally:
            await sub.unsubscribe()
        logger.warning("the turn on %s did not end within %.1f s of the cancel", stream_id, wait)
        return False

    async def end_if_abandoned(self, stream_id: str) -> None:
        """From a follower that waited: end the turn of ``stream_id`` if its holder's
        lease ran out with the stream open (one replica does it), and this store has
        seen JetStream answer for a whole ``running_ttl`` (before that, the holder may
        be alive, about to take its lease back after an outage)."""
        if not self._ctx.settled_for(self._running_ttl):
            return
        if not await self._claimed_and_open(stream_id):
            return
        kv = await self._bucket()
        key = stream_key(stream_id)
        try:
            await kv.get(key)
            return  # held: alive
        except nats.js.errors.KeyNotFoundError:
            pass
        try:
            revision = await kv.create(key, self._reaper.encode())
        except nats.js.errors.KeyWrongLastSequenceError:
            return  # someone else is ending it, or a new turn claimed it
        try:
            if await self._claimed_and_open(stream_id):
                await self._finish_abandoned(stream_id)
                await self._writer.close(stream_id)
        finally:
            await _let_go(kv, stream_id, revision)

    async def _claimed_and_open(self, stream_id: str) -> bool:
        """Whether the stream's last marker opened a claimed turn."""
        return bool(await self._open_holder(stream_id))

    async def _opened_by(self, stream_id: str, holder: str) -> bool:
        """Whether the stream's last marker opened ``holder``'s turn."""
        return await self._open_holder(stream_id) == holder

    async def _open_holder(self, stream_id: str) -> str | None:
        """The holder named by the stream's last marker when it opened a claimed turn."""
        ctx = self._ctx
        try:
            last = await ctx.js.get_last_msg(ctx.stream, ctx.control_subject(stream_id))
        except nats.js.errors.NotFoundError:
            return None
        headers = last.headers or {}
        if headers.get(CONTROL_HEADER) != OPEN:
            return None
        return headers.get(HOLDER_HEADER) or None

    async def _finish_abandoned(self, stream_id: str) -> None:
        ctx = self._ctx
        last = await ctx.js.get_last_msg(ctx.stream, ctx.filter(stream_id))
        name = (last.subject or "").rpartition(".")[2]
        if name not in (EventType.MESSAGE_STOP, EventType.ERROR, CONTROL_EVENT):
            await self._writer.append(stream_id, EventType.ERROR, ABANDONED)
        logger.warning("the turn on %s lost its replica; ended it with an error", stream_id)


async def _let_go(kv: KeyValue, stream_id: str, revision: int) -> None:
    """Delete the lease of ``stream_id`` at ``revision``: whoever wrote it last lets it
    go. One that expired meanwhile is gone either way; any other failure is logged, and
    the bucket's TTL removes the key."""
    try:
        await kv.delete(stream_key(stream_id), last=revision)
    except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.KeyNotFoundError):
        pass
    except nats.errors.Error as exc:
        logger.debug("could not delete the lease of %s: %r", stream_id, exc)


def _retrieve(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.debug("unsubscribe failed: %r", task.exception())
