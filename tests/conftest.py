"""Shared pytest configuration for the essessey test suite."""

import fcntl
import os
import shutil
import subprocess
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

import essessey.stores._memory
from tests.nats_server import NatsServer, nats_server
from tests.redis_server import RedisServer, redis_server


@pytest.fixture
def anyio_backend() -> str:
    # essessey runs on asyncio only (trio is not supported): anyio's pytest plugin
    # would otherwise run every async test on each backend it finds installed.
    return "asyncio"


@pytest.fixture
def nats() -> Iterator[NatsServer]:
    """A real nats-server with JetStream, on a free port, stopped after the test."""
    with nats_server() as server:
        yield server


def _shared_broker(
    request: pytest.FixtureRequest, *, appendonly: bool
) -> Iterator[NatsServer | RedisServer]:
    if request.param == "nats":
        yield request.getfixturevalue("nats")
    else:
        with redis_server(appendonly=appendonly) as server:
            yield server


@pytest.fixture(params=["nats", "redis"])
def broker(request: pytest.FixtureRequest) -> Iterator[NatsServer | RedisServer]:
    """The store replicas share, a test on each: a nats-server with JetStream (file
    storage), or a redis-server (persistence off)."""
    yield from _shared_broker(request, appendonly=False)


@pytest.fixture(params=["nats", "redis"])
def durable_broker(request: pytest.FixtureRequest) -> Iterator[NatsServer | RedisServer]:
    """:func:`broker`, its data surviving a restart: redis-server with ``appendonly
    yes`` (``appendfsync always``); nats-server's file storage does already."""
    yield from _shared_broker(request, appendonly=True)


class Clock:
    """A monotonic clock the test moves by hand, seen by the store module only."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The in-memory store's clock, moved by hand (``clock.now += seconds``)."""
    fake = Clock()
    # Only the in-memory store module's name ``time`` is replaced: the event loop keeps real time.
    monkeypatch.setattr(
        essessey.stores._memory, "time", types.SimpleNamespace(monotonic=fake.monotonic)
    )
    return fake


NODE_DIR = Path(__file__).parent / "node"
"""The AI SDK's client for the tests (tests/node: its packages from the lockfile)."""


@pytest.fixture(scope="session")
def node_client() -> Path:
    """The Node client script, its packages installed from the lockfile when missing."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        # As the browser tests: skipped on a machine without Node, never in CI.
        if os.environ.get("CI"):
            pytest.fail("these tests need Node and npm (.ci/run installs them)")
        pytest.skip("Node and npm are not installed")
    # Under pytest-xdist two workers may get here at once: one installs, the other waits.
    with open(NODE_DIR / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (NODE_DIR / "node_modules" / "ai").is_dir():
            subprocess.run(
                ["npm", "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, check=True, timeout=300
            )
    return NODE_DIR / "chat.mjs"
