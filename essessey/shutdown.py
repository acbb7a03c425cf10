"""Server shutdown: open streams end with a reconnect hint instead of holding the server up.

Why this exists: on SIGTERM or SIGINT uvicorn stops accepting connections, marks the
responses in flight not keep-alive, and then waits for every running response to finish
(forever, unless ``timeout_graceful_shutdown`` is set) before it runs the lifespan
shutdown. Nothing tells a streaming response, so one open SSE stream holds the process
up, and the hub, left in the lifespan, is never reached. So:

- There is one signal, "the server is shutting down", per event loop. Every open
  :class:`~essessey.bindings.sse.EventStreamResponse` and WebSocket subscription on the
  loop waits on it: an SSE response then sends a ``retry:`` hint and ends, a WebSocket
  closes with 1012, and the clients reconnect with their last event id (on another
  replica, with a shared store). Per loop, not per process: two servers in one process
  (a test suite, a server per thread) shut down apart, and a server started after
  another has stopped starts clean. A process-wide flag nothing resets would end every
  later stream at once.
- It fires on :func:`begin_shutdown`, the portable way: any server integration or app
  calls it from its own shutdown hook, before the server waits for its responses.
- Or when uvicorn's shutdown is detected, best effort. uvicorn (the ``uvicorn`` command,
  ``Server.run()`` and ``Server.serve()``, gunicorn's ``UvicornWorker``) installs its
  SIGTERM/SIGINT handler as a bound method of its ``Server``, whose ``should_exit`` turns
  true on the signal. One watcher task per loop, shared by all open streams, reads
  ``signal.getsignal(...).__self__.should_exit`` every ``interval`` seconds (0.25 by
  default), and only while at least one stream is open: it starts with the first and
  stops after the last, so an idle server polls nothing. The handler is looked up again on
  every poll, so a server that has stopped (uvicorn puts the previous handler back) is
  never seen again. Limits: only a server on the main thread is found (signal handlers
  belong to it; uvicorn in another thread installs none), nothing is found when another
  handler replaced uvicorn's, it lags by up to ``interval``, and it needs asyncio (as
  uvicorn does). uvicorn is never imported: the handler is read by duck typing.
- Or on the signal itself: with the first open stream, a handler is put before the
  server's own SIGTERM and SIGINT handlers (on the main thread, where a server that stops
  on a signal installs its handler: uvicorn, granian's workers); it fires the shutdown of
  every loop with open streams, then runs the server's handler. A signal Python does not
  handle (its default action, or ignored) is left alone. hypercorn's workers learn of the
  shutdown from their parent process, not from a signal: with hypercorn, call
  :func:`begin_shutdown` from the ``shutdown_trigger`` of ``hypercorn.asyncio.serve``
  (docs/servers.md), as anywhere the server tells the app nothing.
- Once fired, the signal stays fired for the life of the loop: a stream opened afterwards
  ends at once, and its client reconnects elsewhere.
- :func:`detect_uvicorn_shutdown` turns detection off (or tunes its interval), process
  wide: for an app whose streams must run to their end (bound the wait with uvicorn's
  ``timeout_graceful_shutdown``), or one that calls :func:`begin_shutdown` itself.
- A long-lived response of the app's own learns of the shutdown as the bindings do:
  :func:`on_shutdown` registers a callback (what the SSE response and the WebSocket
  endpoint use: no task per connection), :func:`wait_for_shutdown` waits for it, and
  :func:`shutting_down` asks.

Everything here runs on the event loop's thread, on asyncio (or uvloop), as essessey does.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any, Final

import anyio

from essessey._logsafe import log_failure

__all__ = [
    "begin_shutdown",
    "detect_uvicorn_shutdown",
    "on_shutdown",
    "shutting_down",
    "wait_for_shutdown",
]

logger = logging.getLogger("essessey.shutdown")

DEFAULT_INTERVAL: Final = 0.25
"""Seconds between two looks at uvicorn's ``should_exit``."""

_SIGNALS: Final = tuple(
    sig for sig in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGINT", None)) if sig
)


class _Settings:
    detect: bool = True
    interval: float = DEFAULT_INTERVAL


class _LoopState:
    """The shutdown signal of one event loop and the streams waiting on it."""

    __slots__ = ("fired", "waiters", "watcher")

    def __init__(self) -> None:
        self.fired = False
        self.waiters: set[Callable[[], None]] = set()
        self.watcher: asyncio.Task[None] | None = None


_states: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = (
    weakref.WeakKeyDictionary()
)


def _state_of(loop: asyncio.AbstractEventLoop) -> _LoopState:
    state = _states.get(loop)
    if state is None:
        state = _states[loop] = _LoopState()
    return state


def _fire(state: _LoopState) -> None:
    if not state.fired:
        state.fired = True
        if state.waiters:
            logger.info("the server is shutting down; ending %d open stream(s)", len(state.waiters))
    for waiter in list(state.waiters):
        try:
            waiter()
        except Exception as exc:
            log_failure(logger, exc, "a shutdown callback failed")


def _server_is_exiting() -> bool:
    """Whether the object a SIGTERM/SIGINT handler is bound to (uvicorn's ``Server``)
    says it should exit."""
    for sig in _SIGNALS:
        try:
            handler = signal.getsignal(sig)
        except (ValueError, OSError):  # pragma: no cover - a platform without it
            continue
        while isinstance(handler, _Chained):
            handler = handler.previous  # the server's own, behind essessey's
        server = getattr(handler, "__self__", None)
        if server is not None and getattr(server, "should_exit", False) is True:
            return True
    return False


async def _watch(state: _LoopState) -> None:
    try:
        while state.waiters and not state.fired and _Settings.detect:
            if _server_is_exiting():
                _fire(state)
                return
            await asyncio.sleep(_Settings.interval)
            _chain_signal_handlers()
    finally:
        state.watcher = None


_HAND_OVER: Final = 1.0
"""Seconds the streams may take to end (their last event, the retry hint, a WebSocket's
close) before the server's own signal handler runs."""


class _Chained:
    """A signal handler put before the server's own: it fires the shutdown of every loop
    with open streams, and runs ``previous`` (the server's handler, which stops it) once
    those streams have ended, or after ``_HAND_OVER`` seconds: a server that closes its
    connections at once on the signal (granian) would otherwise cut a stream before its
    retry hint or close frame went out. With no stream open, or for Python's own Ctrl-C
    handler (which raises where it runs), ``previous`` runs at once."""

    __slots__ = ("previous",)

    def __init__(self, previous: Callable[[int, FrameType | None], Any]) -> None:
        self.previous = previous

    def __call__(self, signum: int, frame: FrameType | None) -> Any:
        waiting = [
            (loop, state)
            for loop, state in list(_states.items())
            if _Settings.detect and state.waiters and not state.fired and not loop.is_closed()
        ]
        if not waiting or self.previous is signal.default_int_handler:
            for loop, state in waiting:
                loop.call_soon_threadsafe(_fire, state)
            return self.previous(signum, frame)
        # From a signal handler, maybe mid-way through the loop's own code: the loop
        # ends its streams at its next turn, in its own thread, then hands the signal on.
        loop, state = waiting[0]
        for other, other_state in waiting[1:]:
            other.call_soon_threadsafe(_fire, other_state)
        loop.call_soon_threadsafe(self._hand_over, loop, state, signum)
        return None

    def _hand_over(self, loop: asyncio.AbstractEventLoop, state: _LoopState, signum: int) -> None:
        _fire(state)
        deadline = loop.time() + _HAND_OVER

        def then() -> None:
            if state.waiters and loop.time() < deadline:
                loop.call_later(0.01, then)  # a stream is still sending its end
                return
            self.previous(signum, None)

        then()


def _chain_signal_handlers() -> None:
    """Put a handler before the server's own SIGTERM and SIGINT handlers, on the main
    thread (the only one that may), so that open streams learn of a signal-driven
    shutdown at once on servers that tell the app nothing before they wait for its
    responses (granian) and on uvicorn without the poll's lag. A signal without a handler
    of Python's (the default action, or ignored) is left alone: nothing stops gracefully
    on it. A server that installs its handler again later is chained again at the
    watcher's next look (every ``interval``), not at every stream: reading the handlers
    costs more than the rest of a stream's start."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in _SIGNALS:
        try:
            previous = signal.getsignal(sig)
        except (ValueError, OSError):  # pragma: no cover - a platform without it
            continue
        if not callable(previous) or isinstance(previous, _Chained):
            continue
        try:
            signal.signal(sig, _Chained(previous))
        except (ValueError, OSError):  # pragma: no cover - not allowed here
            continue


def _ensure_watcher(state: _LoopState, loop: asyncio.AbstractEventLoop) -> None:
    if state.watcher is None and _Settings.detect:
        _chain_signal_handlers()
        # A task of the loop, not of any one stream: it outlives the stream that started
        # it, and ends by itself once no stream is open (the loop holds it meanwhile).
        state.watcher = loop.create_task(_watch(state), name="essessey-shutdown-watcher")


def begin_shutdown(loop: asyncio.AbstractEventLoop | None = None) -> None:
    """Tell every open stream on ``loop`` (the running loop when None) that the server is
    shutting down: SSE responses send their ``retry:`` hint and end, WebSocket
    subscriptions close with 1012, and streams opened later end at once.

    Call it before the server waits for its open responses (uvicorn's own shutdown is
    detected without it). With ``loop``, it may be called from another thread.
    """
    if loop is None:
        _fire(_state_of(asyncio.get_running_loop()))
        return
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if loop is running:
        _fire(_state_of(loop))
    else:
        loop.call_soon_threadsafe(lambda: _fire(_state_of(loop)))


def shutting_down() -> bool:
    """Whether the server of the running event loop is shutting down: :func:`begin_shutdown`
    was called, or uvicorn's shutdown is detected (when detection is on)."""
    state = _state_of(asyncio.get_running_loop())
    # While streams are open their watcher looks every interval (detection lags by up to
    # that anyway); reading the handlers is slow (signal.getsignal tries, and fails, to
    # make an enum of a bound method), too slow for every stream that opens.
    if not state.fired and _Settings.detect and state.watcher is None and _server_is_exiting():
        _fire(state)
    return state.fired


async def wait_for_shutdown() -> None:
    """Return once the server of the running event loop is shutting down (at once when it
    already is). A long-lived response of an app's own can wait on it; one that would
    rather not keep a task waiting registers a callback with :func:`on_shutdown`."""
    shutdown = anyio.Event()
    forget = on_shutdown(shutdown.set)
    try:
        await shutdown.wait()
    finally:
        forget()


def on_shutdown(callback: Callable[[], None]) -> Callable[[], None]:
    """Call ``callback`` once the server of the running event loop shuts down (at once,
    before returning, when it already is); returns the function that cancels the call
    (safe to call more than once, and after the callback ran).

    The callback runs in the loop's thread, from whatever fired the shutdown, and must
    not block or raise (an exception is logged and the other callbacks still run): set
    an event, cancel a scope. The SSE response and the WebSocket endpoint use it instead
    of a task per connection waiting on :func:`wait_for_shutdown`, which is built on it.
    """
    loop = asyncio.get_running_loop()
    state = _state_of(loop)
    if state.fired:
        callback()
        return _nothing
    state.waiters.add(callback)
    _ensure_watcher(state, loop)
    return lambda: state.waiters.discard(callback)


def _nothing() -> None:
    pass


def detect_uvicorn_shutdown(enabled: bool = True, *, interval: float = DEFAULT_INTERVAL) -> None:
    """Turn the detection of uvicorn's shutdown on (the default) or off, for the whole
    process, and set how often it looks (seconds, > 0). With it off, only
    :func:`begin_shutdown` ends the open streams."""
    if not interval > 0:
        raise ValueError("interval must be > 0")
    _Settings.detect = enabled
    _Settings.interval = interval
