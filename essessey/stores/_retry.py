"""The one retry loop of the stores that replicas share (Redis, JetStream): a request
that failed on the connection is made again, with a growing pause, until the store's
time budget is spent, and then the broker counts as unavailable. It also remembers when
the store last had trouble reaching its broker (see :meth:`RetryPolicy.settled_for`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

__all__ = ["RetryPolicy"]

_T = TypeVar("_T")

_FIRST_DELAY: Final = 0.05
"""Seconds before the first retry: a reconnect that is already under way often ends
sooner than a longer pause."""

_MAX_DELAY: Final = 1.0
"""The longest pause between two attempts: a broker that comes back is used within it."""


class RetryPolicy:
    """How one store retries: for ``timeout`` seconds, what ``retryable(exc)`` accepts
    (it may raise instead, to end the retries with another error), then the error
    ``unavailable(label)`` makes. ``broker`` names the broker in the log lines, which go
    to ``logger`` at debug level and never carry a request's content."""

    __slots__ = ("_broker", "_logger", "_retryable", "_troubled_at", "_unavailable", "timeout")

    def __init__(
        self,
        timeout: float,
        *,
        broker: str,
        retryable: Callable[[Exception], bool],
        unavailable: Callable[[str | None], Exception],
        logger: logging.Logger,
    ) -> None:
        self.timeout = timeout
        self._broker = broker
        self._retryable = retryable
        self._unavailable = unavailable
        self._logger = logger
        # A store that just started knows nothing of what its broker went through before:
        # it counts as the last trouble.
        self._troubled_at = time.monotonic()

    def note_trouble(self) -> None:
        """The broker could not be reached just now (a failed request, a lost
        connection): :meth:`settled_for` counts from here."""
        self._troubled_at = time.monotonic()

    def settled_for(self, seconds: float) -> bool:
        """Whether the broker has been reachable, as far as this store saw, for the last
        ``seconds`` (and the store has been running that long).

        What a lease that ran out means hangs on it: while the broker was away nobody
        could renew a lease, so one that ran out then says nothing about its holder, who
        renews it as soon as the broker is back; only a store that has seen the broker
        work for a whole ``running_ttl`` may take a lapsed lease for a dead holder's."""
        return time.monotonic() - self._troubled_at >= seconds

    async def run(
        self,
        request: Callable[[float], Awaitable[_T]],
        *,
        label: str | None = None,
        recover: Callable[[Exception], Awaitable[None]] | None = None,
    ) -> _T:
        """``await request(remaining)``, made again after each retryable failure until
        ``timeout`` seconds have passed; then the policy's unavailable error, raised from
        the last failure.

        ``remaining`` is what is left of the budget (a request may bound its own timeout
        by it); ``label`` names what the request is about (a subject), for the log line
        and the error, and is only formatted on a failure (a request is often on the hot
        path); ``recover(exc)`` runs before each new attempt."""
        deadline = time.monotonic() + self.timeout
        delay = _FIRST_DELAY
        while True:
            try:
                return await request(deadline - time.monotonic())
            except Exception as exc:
                if not self._retryable(exc):
                    raise
                self._troubled_at = time.monotonic()
                if deadline - time.monotonic() <= 0:
                    raise self._unavailable(label) from exc
                self._logger.debug(
                    "a %s request%s failed (%r); retrying",
                    self._broker,
                    "" if label is None else f" on {label}",
                    exc,
                )
                if recover is not None:
                    await recover(exc)
                await asyncio.sleep(min(delay, max(deadline - time.monotonic(), 0.0)))
                delay = min(delay * 2, _MAX_DELAY)
