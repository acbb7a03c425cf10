"""Shared pytest configuration for the essessey test suite."""

from collections.abc import Iterator

import pytest

from tests.nats_server import NatsServer, nats_server


@pytest.fixture
def anyio_backend() -> str:
    # The library is asyncio-first; running every async test on trio too would
    # double the suite without exercising anything the core depends on.
    return "asyncio"


@pytest.fixture
def nats() -> Iterator[NatsServer]:
    """A real nats-server with JetStream, on a free port, stopped after the test."""
    with nats_server() as server:
        yield server
