"""The one retry loop of the stores that replicas share (Redis, JetStream): a request
that failed on the connection is made again, with a growing pause, until the store's
time budget is spent, and then the broker counts as unavailable."""

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

    __slots__ = ("_broker", "_logger", "_retryable", "_unavailable", "timeout")

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
