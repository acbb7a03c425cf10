"""The writing side of the JetStream store: every message it publishes (events and the
``open``, ``close`` and ``reset`` markers), each once, with the bounds kept as it goes."""

from __future__ import annotations

import asyncio
import itertools
import secrets
from typing import Final

import nats.errors
import nats.js.errors

from essessey._ids import check_token
from essessey._nats_py import direct_jetstream_publish, header_block
from essessey.event import Event
from essessey.stores.jetstream._bounds import Bounds
from essessey.stores.jetstream._context import (
    CLOSE,
    CONTROL_HEADER,
    HOLDER_HEADER,
    OPEN,
    PREV_HEADER,
    REQUEST_TIMEOUT,
    RESET,
    StoreContext,
    logger,
)

__all__ = ["Writer"]

_MSG_ID: Final = "Nats-Msg-Id"


class Writer:
    """What one JetStream store publishes, on its context, with its bounds."""

    __slots__ = ("_counter", "_ctx", "_token", "bounds", "direct")

    def __init__(self, ctx: StoreContext, bounds: Bounds) -> None:
        self._ctx = ctx
        self.bounds = bounds
        # js.publish without its layers (see _nats_py.direct_jetstream_publish); None:
        # every publish through js.publish.
        self.direct = direct_jetstream_publish(ctx.nc)
        # Msg ids: random per store, counted per publish, so no two publishes of any store
        # share one while a retry of the same publish always does.
        self._token = secrets.token_hex(12)
        self._counter = itertools.count(1)

    async def publish(
        self,
        subject: str,
        data: bytes,
        control: str | None = None,
        holder: str = "",
        prev: int | None = None,
    ) -> tuple[int, str]:
        """Publish once to JetStream, retrying with the same msg id: the sequence, and
        the epoch of the stream that stored it as far as this store knows. ``prev`` is
        the sequence of the stream id's message before it, when known (see
        ``essessey.stores.jetstream._bounds``)."""
        ctx = self._ctx
        # The epoch from before the publish: if someone else recreates the JetStream
        # stream meanwhile, the id names the older epoch and is unknown, never misplaced.
        epoch = ctx.epoch or await ctx.ensure()
        headers = {_MSG_ID: f"{self._token}-{next(self._counter)}"}
        if control is not None:
            headers[CONTROL_HEADER] = control
        if holder:
            headers[HOLDER_HEADER] = holder
        if prev is not None:
            headers[PREV_HEADER] = str(prev)
        js = ctx.js
        direct = self.direct
        block = header_block(headers) if direct is not None else b""

        async def publish(remaining: float) -> tuple[int, str]:
            timeout = min(REQUEST_TIMEOUT, max(remaining, 0.01))
            if direct is not None:
                try:
                    async with asyncio.timeout(timeout):
                        seq = await direct(subject, data, block)
                except TimeoutError:
                    raise nats.errors.TimeoutError from None  # what js.publish raises
                if seq is not None:
                    return seq, epoch
            ack = await js.publish(subject, data, timeout=timeout, headers=headers)
            return ack.seq, epoch

        async def recover(exc: Exception) -> None:
            nonlocal epoch
            if isinstance(exc, nats.js.errors.NoStreamResponseError):
                epoch = await self._recreate() or epoch

        return await ctx.retrying(publish, subject=subject, recover=recover)

    async def _recreate(self) -> str | None:
        # No stream answered: the JetStream stream was deleted, or the server is still
        # starting. Creating it is harmless in both cases (it is a no-op when it exists),
        # and a publish that succeeds after it was stored by the stream it describes.
        try:
            await self._ctx.setup()
        except Exception as exc:  # retried by the caller's loop
            logger.debug("could not create the JetStream stream: %r", exc)
            return None
        return self._ctx.epoch

    async def append(self, stream_id: str, name: str, data: bytes) -> Event:
        """Store the event ``name`` of ``stream_id`` (both checked by the caller) and
        return it with its id, purging what it takes past the bounds."""
        bounds = self.bounds
        kept = bounds.kept(stream_id) or await bounds.before_append(stream_id, name)
        seq, epoch = await self.publish(
            self._ctx.subject(stream_id, name), data, prev=kept.last_seq
        )
        await bounds.after_append(stream_id, kept, seq, len(data))
        return Event(name, data, f"{epoch}-{seq}")

    async def open(self, stream_id: str, holder: str) -> None:
        """The ``open`` marker of a turn (``holder`` names its lease's holder, or is
        empty), after the JetStream stream's epoch is read again (created when gone)."""
        check_token(stream_id, "stream id")
        ctx = self._ctx
        if await ctx.current_epoch() is None:
            await ctx.setup()
        bounds = self.bounds
        await bounds.opening(stream_id)
        seq, _ = await self.publish(
            ctx.control_subject(stream_id), b"", OPEN, holder, bounds.prev(stream_id)
        )
        bounds.marker_stored(stream_id, seq)

    async def close(self, stream_id: str) -> None:
        """The ``close`` marker: followers end once they have everything before it."""
        bounds = self.bounds
        seq, _ = await self.publish(
            self._ctx.control_subject(stream_id), b"", CLOSE, prev=bounds.prev(stream_id)
        )
        bounds.marker_stored(stream_id, seq)
        await bounds.finished(stream_id)

    async def clear(self, stream_id: str) -> None:
        """The ``reset`` marker, then every earlier message of ``stream_id`` purged."""
        ctx = self._ctx
        bounds = self.bounds
        seq, _ = await self.publish(
            ctx.control_subject(stream_id), b"", RESET, prev=bounds.prev(stream_id)
        )
        await ctx.js.purge_stream(ctx.stream, seq=seq, subject=ctx.filter(stream_id))
        bounds.marker_stored(stream_id, seq, reset=True)
        await bounds.cleared(stream_id)
