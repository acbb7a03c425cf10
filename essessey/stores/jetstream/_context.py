"""What every part of the JetStream store shares: the connection, the retry policy, the
names of subjects, headers and buckets, and the JetStream stream's epoch.

The store (``_store``), its writer (``_writer``), reader (``_reader``), bounds
(``_bounds``) and leases (``_leases``) each hold one :class:`StoreContext` and use only its
public names, so none of them reaches into another.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from typing import Final, Literal, TypeVar

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import api
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue

from essessey.errors import JetStreamUnavailable
from essessey.stores._retry import RetryPolicy

__all__ = [
    "CLOSE",
    "CONTROL_EVENT",
    "CONTROL_HEADER",
    "HOLDER_HEADER",
    "OPEN",
    "PREV_HEADER",
    "REQUEST_TIMEOUT",
    "RESET",
    "TRANSIENT",
    "StoreContext",
    "closed_error",
    "epoch_of",
    "is_retryable",
    "logger",
    "reconnects",
    "stream_key",
]

logger = logging.getLogger("essessey.stores.jetstream")

CONTROL_EVENT: Final = "__control"
"""The last subject token of a stream id's markers; reserved, never an event name."""

CONTROL_HEADER: Final = "Essessey-Control"
"""The header of a marker: ``open``, ``close`` or ``reset``."""

OPEN: Final = "open"
CLOSE: Final = "close"
RESET: Final = "reset"

PREV_HEADER: Final = "Essessey-Prev"
"""The header of every message the store writes: the stream sequence of the message of the
same stream id before it (0 for the first)."""

HOLDER_HEADER: Final = "Essessey-Holder"
"""The header of a claimed turn's open marker: who holds it."""

REQUEST_TIMEOUT: Final = 5.0
"""Seconds one JetStream request may take; a retry follows within the store's budget."""

_RETRYABLE: Final = (
    nats.errors.TimeoutError,  # includes FlushTimeoutError
    nats.errors.NoRespondersError,
    nats.js.errors.NoStreamResponseError,
    nats.errors.ConnectionClosedError,  # retried only while the client may reconnect
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
    nats.js.errors.ServiceUnavailableError,
)

TRANSIENT: Final = (*_RETRYABLE, nats.js.errors.ServerError)
"""What a request that is not retried may fail with while the server comes back: the
caller logs it and tries later."""

_T = TypeVar("_T")


_CONSUMER_LIMIT: Final = 10026
"""JetStream's error code for a request that would pass its limit of consumers: after a
stall the server holds the ephemeral consumers of readers that have gone until they lapse,
so the request may succeed when made again."""


def is_retryable(exc: Exception) -> bool:
    """Whether a request that failed with ``exc`` may succeed when made again."""
    if isinstance(exc, _RETRYABLE):
        return True
    if not isinstance(exc, nats.js.errors.APIError):
        return False
    # Some APIError subclasses (the KV ones) are made without a code.
    return getattr(exc, "code", None) == 503 or getattr(exc, "err_code", None) == _CONSUMER_LIMIT


def closed_error() -> JetStreamUnavailable:
    """The error for a closed connection: it is closed for good, and what a caller meets
    is the store being unavailable, not nats-py's own error."""
    return JetStreamUnavailable("the NATS connection is closed")


def epoch_of(info: api.StreamInfo) -> str:
    """The epoch of a JetStream stream: from its creation time, so a stream deleted and
    created again under the same name gets another one."""
    created = info.created
    if created is None:
        raise RuntimeError("the nats-server does not report stream creation times (need 2.2+)")
    text = f"{info.config.name}|{created.isoformat()}"
    return hashlib.blake2b(text.encode(), digest_size=5).hexdigest()


def stream_key(stream_id: str) -> str:
    """The KV key of a stream id (a hash: stream ids may hold characters keys may not)."""
    return hashlib.blake2b(stream_id.encode(), digest_size=16).hexdigest()


class StoreContext:
    """The connection of one JetStream store (``nc`` and its JetStream context ``js``),
    its retry policy (:meth:`retrying`), its subject names and its JetStream stream's
    epoch as the store last read it.

    ``setup`` is the store's own (it creates the JetStream stream and the KV buckets, and
    sets :attr:`epoch`); :meth:`ensure` runs it once, for whichever part needs the stream
    first.
    """

    __slots__ = (
        "_reconnects",
        "_retry",
        "_setup",
        "_setup_lock",
        "epoch",
        "heartbeat",
        "js",
        "nc",
        "prefix",
        "publish_timeout",
        "storage",
        "stream",
    )

    def __init__(
        self,
        nc: Client,
        *,
        stream: str,
        prefix: str,
        storage: Literal["file", "memory"],
        publish_timeout: float,
        heartbeat: float,
        setup: Callable[[], Awaitable[None]],
    ) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream(timeout=REQUEST_TIMEOUT)
        self.stream = stream
        self.prefix = prefix
        self.storage: Literal["file", "memory"] = storage
        self.publish_timeout = publish_timeout
        self.heartbeat = heartbeat
        self.epoch: str | None = None
        self._setup = setup
        self._setup_lock = asyncio.Lock()
        self._retry = RetryPolicy(
            publish_timeout,
            broker="JetStream",
            retryable=self._retryable,
            unavailable=self._unavailable,
            logger=logger,
        )
        self._reconnects = nc.stats["reconnects"]

    # -- names -------------------------------------------------------------------------------

    def subject(self, stream_id: str, name: str) -> str:
        """The subject of the event ``name`` of ``stream_id``."""
        return f"{self.prefix}.{stream_id}.{name}"

    def filter(self, stream_id: str) -> str:
        """The subject filter of everything of ``stream_id``: its events and markers."""
        return f"{self.prefix}.{stream_id}.>"

    def control_subject(self, stream_id: str) -> str:
        """The subject of ``stream_id``'s markers."""
        return f"{self.prefix}.{stream_id}.{CONTROL_EVENT}"

    def cancel_subject(self, stream_id: str) -> str:
        """The core NATS subject of requests to cancel ``stream_id``'s turn: outside the
        JetStream stream's subjects, so never stored."""
        return f"_essessey_cancel.{self.prefix}.{stream_id}"

    def bucket(self, kind: str) -> str:
        """The name of the store's KV bucket ``kind`` (``STREAMS``, ``LEASES``)."""
        return f"{self.stream}_{kind}"

    # -- the stream --------------------------------------------------------------------------

    async def ensure(self) -> str:
        """The epoch, after the store's setup when it has not run yet."""
        epoch = self.epoch
        if epoch is None:
            async with self._setup_lock:
                if self.epoch is None:
                    await self._setup()
                epoch = self.epoch
                assert epoch is not None
        return epoch

    async def setup(self) -> None:
        """The store's setup, again (the JetStream stream may have been deleted)."""
        await self._setup()

    async def current_epoch(self) -> str | None:
        """The epoch of the JetStream stream now (None when it does not exist); also
        refreshes the one appends use."""
        await self.ensure()
        try:
            info = await self.retrying(lambda _: self.js.stream_info(self.stream))
        except nats.js.errors.NotFoundError:
            return None
        epoch = epoch_of(info)
        self.epoch = epoch
        return epoch

    async def open_bucket(self, name: str, ttl: float) -> KeyValue:
        """The KV bucket ``name`` (one value per key, entries kept ``ttl`` seconds),
        created when missing, on the store's storage."""
        js = self.js
        try:
            return await js.key_value(name)
        except nats.js.errors.BucketNotFoundError:
            storage = api.StorageType.FILE if self.storage == "file" else api.StorageType.MEMORY
            return await js.create_key_value(bucket=name, ttl=ttl, history=1, storage=storage)

    # -- retries -----------------------------------------------------------------------------

    async def retrying(
        self,
        request: Callable[[float], Awaitable[_T]],
        *,
        subject: str | None = None,
        recover: Callable[[Exception], Awaitable[None]] | None = None,
    ) -> _T:
        """``await request(remaining)``, made again after a transient failure (the server
        restarting, the connection reconnecting) until ``publish_timeout`` seconds have
        passed; then :class:`JetStreamUnavailable`. ``subject`` names the subject of a
        publish, for the messages (built only on failure: publishing is the hot path).

        ``remaining`` is what is left of that budget (a request may bound its own timeout
        by it); ``recover(exc)`` runs before each new attempt."""
        return await self._retry.run(request, label=subject, recover=recover)

    def settled_for(self, seconds: float) -> bool:
        """Whether JetStream has been reachable, as far as this store saw, for the last
        ``seconds`` (see :meth:`RetryPolicy.settled_for`): no request of the store's
        failed, and the connection has not been away or reconnected since (a follower
        that only waits makes no request to fail)."""
        reconnects = self.nc.stats["reconnects"]
        if reconnects != self._reconnects or not self.nc.is_connected:
            self._reconnects = reconnects
            self._retry.note_trouble()
        return self._retry.settled_for(seconds)

    def _retryable(self, exc: Exception) -> bool:
        if not is_retryable(exc):
            return False
        if self.nc.is_closed:
            raise closed_error() from exc
        return True

    def _unavailable(self, subject: str | None) -> JetStreamUnavailable:
        failed = (
            "JetStream did not answer"
            if subject is None
            else f"JetStream did not store a message on {subject!r}"
        )
        return JetStreamUnavailable(f"{failed} within {self.publish_timeout} s")


def reconnects(nc: Client) -> int:
    """How often ``nc`` has reconnected (nats-py's public ``stats``)."""
    return int(nc.stats.get("reconnects", 0))
