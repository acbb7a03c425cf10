"""One connection's write side: how an event's frame reaches the socket, for the SSE
response and the WebSocket endpoint alike.

A binding frames each event and hands the frame to its :class:`Line`, in the producer's
(or the subscription's) own task:

- :meth:`Line.offer`: the frame is taken without waiting, or refused. On a free line at
  a model's pace (a token every few tens of milliseconds) it is written straight to the
  server's transport when the binding has a way to (its :class:`Wire`'s ``direct``): no
  ASGI send, no task switch. While a send is in progress, or in a burst (one event right
  after another, a replay), it is held, and goes out joined with the others in the next
  send. A caller that would make a refused frame for nothing (an event offered in a
  store's append, which comes through the source when refused) hands :meth:`Line.take`
  the event and the way to frame it: framed only when the line takes it.
- :meth:`Line.write`: what the line refused. The frame goes through the server (an ASGI
  send) when the line is free, or is held, waiting for room when ``max_queue`` frames are
  held already: a slow client slows whoever writes instead of growing memory.
- :meth:`Line.finish`: whatever is held goes out, then the binding's end.

Whoever holds the send writes what was held before it lets go, so frames keep their
order. :meth:`Line.run` (one task per connection) writes what is held when nobody else
will, sends the keep-alive after ``ping_interval`` of quiet, sends the first bytes when
they are due before any event (``start_within``) and ends the connection when the server
shuts down (:meth:`Line.stop`): after the send in progress, so a frame goes out whole or
not at all, and what is held is dropped (a resuming client gets it again). The deadlines
(the keep-alive, a send stalled past ``send_timeout``) are kept by the event loop's line
watch (``essessey.bindings._asgi.watch_line``), which calls :meth:`Line.check`: no timer
is set per send.

What differs between the bindings is their :class:`Wire`: how the first bytes start the
answer, how held frames join, how the connection ends and what a stall aborts.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from typing import Final, Protocol, TypeVar

import anyio
import anyio.lowlevel

from essessey import metrics
from essessey.metrics import totals

__all__ = ["Line", "LineEnded", "Wire"]

logger = logging.getLogger("essessey.bindings")
_T = TypeVar("_T")

BURST: Final = 0.0005
"""Seconds after a send within which the next frame is taken for part of a burst: it is
held for the next send instead of going out in a send of its own."""

STOP_SEND_GRACE: Final = 2.0
"""Seconds a send in progress when the server begins to shut down may still take before it
counts as stalled: a client that reads too slowly to take one frame in that time must not
hold the shutdown up for the rest of ``send_timeout``."""


class LineEnded(BaseException):
    """The line has ended (the client left, a send stalled, the server shuts down): its
    writer is being cancelled, and nothing more is written. A BaseException, as a
    cancellation is: a producer's ``except Exception`` must not take it for a failure of
    its own and try to publish an error into a closed connection."""


class Wire(Protocol):
    """How one binding's frames reach its client (private to the bindings)."""

    direct: Callable[[bytes], bool] | None
    """Writes one frame straight to the server's transport now and returns True, or
    returns False having written nothing (then it goes through :meth:`send`); None
    where the server offers no such way."""

    async def send(self, frames: list[bytes], *, start: bool, more: bool) -> None:
        """Send ``frames`` in order, joined where the transport allows: ``start`` for the
        answer's first bytes (an SSE response's headers go with them), ``more=False``
        for its last. Raises OSError when the client is gone."""
        ...

    def stalled(self) -> None:
        """A send stalled past its timeout: abort what can be (never raises)."""
        ...


class Line:
    """One connection's writes, in the writer's own send when the line is free, held and
    joined otherwise; see the module docstring."""

    __slots__ = (
        "_burst_until",
        "_cancel",
        "_direct",
        "_ended",
        "_flusher_wake",
        "_held",
        "_held_bytes",
        "_idle",
        "_kind",
        "_log",
        "_max_batch_bytes",
        "_max_queue",
        "_paced",
        "_ping",
        "_ping_due",
        "_ping_interval",
        "_room",
        "_send_timeout",
        "_shutdown_tail",
        "_start_due",
        "_start_within",
        "_started",
        "_stop_due",
        "_stopping",
        "_wire",
        "last_sent",
        "opened",
        "send_began",
        "sending",
        "stalled",
    )

    def __init__(
        self,
        wire: Wire,
        cancel: Callable[[], object],
        *,
        kind: str,
        log: logging.Logger,
        ping: bytes,
        ping_interval: float,
        send_timeout: float | None,
        max_queue: int,
        max_batch_bytes: int,
        shutdown_tail: bytes = b"",
        started: bool = False,
        start_within: float | None = None,
    ) -> None:
        self._wire = wire
        self._cancel = cancel
        self._kind = kind  # the metrics' transport label
        self._log = log  # the binding's logger, which the app configures
        self._direct = wire.direct
        self._ping = ping
        self._ping_interval = ping_interval or math.inf
        self._send_timeout = send_timeout if send_timeout is not None else math.inf
        self._max_queue = max_queue
        self._max_batch_bytes = max_batch_bytes
        self._start_within = start_within
        self._shutdown_tail = shutdown_tail
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._room: anyio.Event | None = None  # set when held frames went out
        self._idle: anyio.Event | None = None  # set when a send ends
        self._flusher_wake: anyio.Event | None = None
        self._ping_due = False
        self._start_due = False
        self.sending = False
        self._started = started
        self._ended = False
        self._stopping = False
        self._stop_due = math.inf  # when a send in progress at the shutdown counts as stalled
        # The direct way while a frame may take it (started, not stopping, not ended),
        # else None: the one thing the paced path asks. Kept by _pace at each change.
        self._paced: Callable[[bytes], bool] | None = None
        self._pace()
        self.stalled = False
        self.send_began = 0.0
        self.last_sent = self.opened = time.monotonic()  # the keep-alive counts from here
        self._burst_until = 0.0  # the first frame goes out at once

    @property
    def started(self) -> bool:
        """Whether the answer's first bytes went out."""
        return self._started

    @property
    def ended(self) -> bool:
        """Whether the line has ended: nothing more is written."""
        return self._ended

    @property
    def stopping(self) -> bool:
        """Whether the server is shutting down (see :meth:`stop`)."""
        return self._stopping

    def _pace(self) -> None:
        """Keep ``_paced`` to its rule; called wherever started, stopping or ended change."""
        direct = self._direct
        self._paced = direct if self._started and not self._stopping and not self._ended else None

    def end_quietly(self) -> None:
        """End the line without writing anything more: the binding answers by itself (an
        error or an empty answer before anything was sent)."""
        self._ended = True
        self._pace()

    @property
    def busy(self) -> bool:
        """Whether anything went out, is going out or waits to."""
        return self._started or self.sending or bool(self._held)

    # -- the writer's side ---------------------------------------------------------------

    def take(self, frame_of: Callable[[_T], bytes], item: _T) -> bytes | None:
        """Frame ``item`` with ``frame_of`` and take the frame, as :meth:`offer` would,
        when the line takes a frame now; None, having framed nothing, when it would
        refuse one. For a caller that must not make a frame the line then refuses (a
        store's hand-over: a refused event comes through the source, and a dialect's
        encoder keeps state). Returns the frame taken (``b""``: ``frame_of`` made none,
        nothing taken). What ``frame_of`` raises propagates, nothing taken. Raises
        :class:`LineEnded` once the line has ended."""
        # offer's rule, decided before the frame is made: the two are written apart so
        # that each path asks the clock once and makes no call more; they must agree
        # (tests/test_line.py checks every state).
        if self._ended:
            raise LineEnded
        held = self._held
        if self.sending or held:
            if len(held) >= self._max_queue:
                return None
            frame = frame_of(item)
        else:
            now = time.monotonic()
            if now > self._burst_until:
                paced = self._paced
                if paced is None:
                    return None  # no direct way now, and not part of a burst
                # The paced path, one frame on a free line: written straight to the
                # transport (held when it is full).
                frame = frame_of(item)
                if not frame:
                    return frame
                if paced(frame):
                    self.last_sent = now
                    self._burst_until = now + BURST
                    return frame
            else:
                frame = frame_of(item)  # a burst: held for the next send
        if frame:
            self._hold(frame)
        return frame

    def offer(self, frame: bytes) -> bool:
        """Take ``frame`` without waiting, or refuse it (False, having done nothing: the
        caller then writes it with :meth:`write`). On a free line, at a model's pace, it is
        written now, straight to the transport; while a send is in progress, in a burst,
        or when the transport is full, it is held for the next send (the transport's slow
        client then paces the sends of what is held). Refused when the line has no direct
        way to the transport, the answer has not started, the server is stopping, or
        ``max_queue`` frames are held already. Raises :class:`LineEnded` once the line
        has ended."""
        paced = self._paced
        if paced is not None and not self.sending and not self._held:
            # The paced path, one frame on a free line: written straight to the transport.
            now = time.monotonic()
            if now > self._burst_until and paced(frame):
                self.last_sent = now
                self._burst_until = now + BURST
                return True
        if self._ended:
            raise LineEnded
        held = self._held
        if not self.sending and not held:
            if paced is None and time.monotonic() > self._burst_until:
                return False  # no direct way now, and not part of a burst
        elif len(held) >= self._max_queue:
            return False
        self._hold(frame)  # a burst, a send in progress, or a full transport
        return True

    def _hold(self, frame: bytes) -> None:
        self._held.append(frame)
        self._held_bytes += len(frame)
        if not self.sending:
            self._wake_flusher()

    async def write(self, frame: bytes) -> None:
        """Send ``frame`` now, or hold it while another send is in progress (waiting
        for room when ``max_queue`` frames are held already)."""
        if not (self.sending or self._held or self._ended or self._stopping) and self._started:
            # One frame and a free line: the send itself, nothing more.
            self.sending = True
            self.send_began = time.monotonic()
            try:
                await self._wire.send([frame], start=False, more=True)
            except OSError:
                logger.debug("the client went away during a send")
                self._end()
                raise LineEnded from None
            finally:
                self._sent()
            if self._held and not self._ended:
                await self._drain()  # what another task held meanwhile
            return
        if self._ended:
            raise LineEnded
        if self.sending or self._held:
            while len(self._held) >= self._max_queue:
                room = self._room
                if room is None:
                    room = self._room = anyio.Event()
                await room.wait()
                if self._ended:
                    raise LineEnded
            self._held.append(frame)
            self._held_bytes += len(frame)
            if not self.sending:
                await self._drain()
            return
        await self._send_all([frame])

    async def finish(self, tail: bytes) -> None:
        """End the answer with ``tail`` once everything held went out (nothing when the
        line has ended or the server is stopping: :meth:`run` ends it then)."""
        while self.sending:
            idle = self._idle
            if idle is None:
                idle = self._idle = anyio.Event()
            await idle.wait()
        if self._ended:
            return
        if self._held:
            await self._drain()
        if self._ended or self._stopping:
            return
        self.sending = True  # the flusher must not write after the answer's end
        try:
            await self._send_frames([tail], more=False)
        finally:
            self.sending = False

    # -- sending -------------------------------------------------------------------------

    async def _drain(self) -> None:
        held = self._held
        frames = held[:]
        held.clear()
        self._held_bytes = 0
        await self._send_all(frames)

    async def _send_all(self, frames: list[bytes]) -> None:
        """Send ``frames``, then whatever was held meanwhile, holding the line throughout."""
        self.sending = True
        try:
            while True:
                if self._stopping:
                    return  # run() ends the answer
                await self._send_frames(frames, more=True)
                held = self._held
                room = self._room
                if room is not None:
                    self._room = None
                    room.set()
                if not held or self._ended:
                    return
                limit = self._max_batch_bytes
                if self._held_bytes <= limit:
                    frames = held[:]
                    held.clear()
                    self._held_bytes = 0
                else:
                    # A batch at a time, so one write stays bounded; with a turn of the
                    # loop between two, so that a long replay (a snapshot's large deltas)
                    # does not hold up the other connections' sends until it is all out.
                    size = count = 0
                    while size < limit:
                        size += len(held[count])
                        count += 1
                    frames = held[:count]
                    del held[:count]
                    self._held_bytes -= size
                    await anyio.lowlevel.checkpoint()
                    if self._ended:
                        return
        finally:
            self._sent()

    async def _send_frames(self, frames: list[bytes], *, more: bool) -> None:
        self.send_began = time.monotonic()
        start = not self._started
        if start:
            self._started = True
            self._pace()
            if any(frames):
                metrics.first_event(self._kind, time.monotonic() - self.opened)
        try:
            await self._wire.send(frames, start=start, more=more)
        except OSError:
            logger.debug("the client went away during a send")
            self._end()
            raise LineEnded from None
        if not more:
            self._ended = True
            self._pace()

    def _sent(self) -> None:
        """A send ended: the line is free."""
        self.sending = False
        self.last_sent = now = time.monotonic()
        self._burst_until = now + BURST
        room = self._room
        if room is not None:
            self._room = None
            room.set()
        idle = self._idle
        if idle is not None:
            self._idle = None
            idle.set()
        if self._stopping:
            self._wake_flusher()

    def _end(self) -> None:
        self._ended = True
        self._pace()
        self._cancel()  # the connection's body and helpers end
        room = self._room
        if room is not None:
            self._room = None
            room.set()

    def _wake_flusher(self) -> None:
        wake = self._flusher_wake
        if wake is not None:
            self._flusher_wake = None
            wake.set()

    # -- the line's own task -------------------------------------------------------------

    async def run(self) -> None:
        """Write what is held when nobody else will; keep the connection alive; send the
        first bytes when due; end the answer when the server shuts down."""
        while not self._ended:
            if self._stopping and not self.sending:
                # Held frames are dropped: the client resumes from the last one it got
                # whole, and a slow client must not hold the shutdown up.
                self._held.clear()
                with contextlib.suppress(LineEnded):
                    await self._send_frames([self._shutdown_tail], more=False)
                self._end()
                return
            try:
                if self._held and not self.sending:
                    gather = self._burst_until - time.monotonic()
                    if gather > 0:
                        # A burst: what the writer sends for the rest of its window joins
                        # this send, instead of a wake-up and a send per frame.
                        await anyio.sleep(gather)
                        if self._ended or self.sending or not self._held:
                            continue
                    await self._drain()
                    continue
                # The line watch keeps the deadlines: it calls check(), which wakes this.
                if self._start_due and not self.sending:
                    # No frame yet, and the first bytes are due: a proxy waiting for
                    # them would time the request out.
                    self._start_due = False
                    if not self._started:
                        await self._send_all([])
                    continue
                if self._ping_due and not self.sending:
                    self._ping_due = False
                    await self._send_all([self._ping])
                    continue
            except LineEnded:
                return
            wake = self._flusher_wake = anyio.Event()
            await wake.wait()

    def check(self, now: float) -> float | None:
        """The line watch's look at this line (see ``essessey.bindings._asgi``): end a
        send stalled past ``send_timeout``, ask for the keep-alive after
        ``ping_interval`` of quiet; the time of the next deadline, or None once the line
        has ended."""
        if self._ended:
            return None
        if self.sending:
            timeout = self._send_timeout
            if now - self.send_began > timeout or now > self._stop_due:
                totals.stalled += 1
                self._log.warning(
                    "a %ssend stalled for more than %.1f s%s; ending the %s",
                    "WebSocket " if self._kind == "websocket" else "",
                    min(timeout, now - self.send_began),
                    " while the server shuts down" if now > self._stop_due else "",
                    "subscription" if self._kind == "websocket" else "response",
                )
                self.stalled = True
                self._wire.stalled()
                self._end()
                return None
            return min(self.send_began + timeout, self._stop_due)
        ping = self._ping_interval
        start_due = math.inf
        if not self._started and self._start_within is not None:
            start_due = self.opened + self._start_within
            if now >= start_due:
                self._start_due = True
                self._wake_flusher()
                start_due = math.inf
        if now - self.last_sent >= ping:
            # Quiet for ping_interval: a keep-alive keeps proxies from closing it.
            self._ping_due = True
            self._wake_flusher()
            return min(now + ping, start_due)
        return min(self.last_sent + ping, start_due)

    def stop(self) -> None:
        """The server is shutting down: end after the send in progress (a frame goes
        out whole or not at all), which counts as stalled once it has taken
        ``STOP_SEND_GRACE`` more seconds."""
        if not self._stopping:
            self._stop_due = time.monotonic() + STOP_SEND_GRACE
        self._stopping = True
        self._pace()
        self._wake_flusher()
