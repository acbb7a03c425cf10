"""The conformance suite (essessey.testing) on every store essessey ships: the in-memory
store, JetStream and Redis answer the same calls the same way, so a hub, a binding or an
app can swap one for another.

A backend's own behaviour beyond this (its retries, its wire layout) is tested beside it:
tests/test_store.py, tests/test_jetstream_store.py, tests/test_redis_store.py.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import nats as nats_py
import pytest

from essessey import InMemoryEventStore
from essessey.stores.jetstream import JetStreamEventStore
from essessey.stores.redis import RedisEventStore
from essessey.testing import LEASES, PER_STREAM, EventStoreConformance
from tests.nats_server import NatsServer, nats_server
from tests.redis_server import RedisServer, redis_server

_names = itertools.count(1)


@pytest.fixture(scope="module")
def nats_for_suite() -> Iterator[NatsServer]:
    with nats_server() as server:
        yield server


@pytest.fixture(scope="module")
def redis_for_suite() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


def _retained(bounds: dict[str, Any]) -> dict[str, Any]:
    """The suite's ``retain`` as the store's own name for it."""
    retain = bounds.pop("retain", None)
    if retain is not None:
        bounds["max_events_per_stream"] = retain
    return bounds


class TestInMemoryStore(EventStoreConformance):
    features = frozenset({PER_STREAM})

    @asynccontextmanager
    async def open_store(self, **bounds: Any) -> AsyncIterator[InMemoryEventStore]:
        yield InMemoryEventStore(**_retained(bounds))


class TestJetStreamStore(EventStoreConformance):
    features = frozenset({PER_STREAM, LEASES})

    @pytest.fixture(autouse=True)
    def _server(self, nats_for_suite: NatsServer) -> None:
        self.server = nats_for_suite

    @asynccontextmanager
    async def open_store(self, **bounds: Any) -> AsyncIterator[JetStreamEventStore]:
        n = bounds.pop("name", None) or next(_names)
        nc = await nats_py.connect(self.server.url, allow_reconnect=False)
        try:
            yield await JetStreamEventStore.connect(
                nc, stream=f"CONF{n}", prefix=f"conf{n}", **_retained(bounds)
            )
        finally:
            await nc.close()


class TestRedisStore(EventStoreConformance):
    features = frozenset({PER_STREAM, LEASES})

    @pytest.fixture(autouse=True)
    def _server(self, redis_for_suite: RedisServer) -> None:
        self.server = redis_for_suite

    @asynccontextmanager
    async def open_store(self, **bounds: Any) -> AsyncIterator[RedisEventStore]:
        n = bounds.pop("name", None) or next(_names)
        bounds.setdefault("heartbeat", 0.5)
        async with RedisEventStore.from_url(
            self.server.url, prefix=f"conf{n}", **_retained(bounds)
        ) as store:
            yield store
