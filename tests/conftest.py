"""Shared pytest configuration for the essessey test suite."""

import fcntl
import json
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
        wanted = json.loads((NODE_DIR / "package.json").read_text())["dependencies"]
        if not all((NODE_DIR / "node_modules" / name).is_dir() for name in wanted):
            subprocess.run(
                ["npm", "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, check=True, timeout=300
            )
    return NODE_DIR / "chat.mjs"


# -- the quick run ----------------------------------------------------------------------
#
# `pytest -m "not slow"` leaves out what needs a browser, Node, a broker, a server process
# or many generated examples: the run a change is tried with while it is being made
# (README, "Running the tests"). The full run (the Quick start command, CI) runs all.

SLOW_MODULES = frozenset(
    {
        # headless Chromium
        "test_demo_browser",
        "test_pages_browser",
        "test_sse_browser",
        "test_ws_browser",
        "test_no_loops",
        # Node's AI SDK client and its OpenAI provider
        "test_ui_node",
        "test_ai_sdk_openai_node",
        # brokers (nats-server, redis-server), outages and replicas
        "test_broker_outage",
        "test_jetstream_store",
        "test_nats_binding",
        "test_nats_internals",
        "test_redis_store",
        "test_replicas",
        "test_snapshot_stores",
        "test_store_conformance",
        "test_docs",  # the docs run against a demo server and a nats-server
        # servers and apps as processes, signals, load
        "test_servers",
        "test_demo",
        "test_examples",
        "test_examples_apps",
        "test_shutdown",
        "test_chaos",
        "test_leaks",
        "test_stalled_clients",
        "test_benchmarks",
        # fuzzing and long property runs
        "test_fuzz",
        "test_property_roundtrip",
    }
)
"""Test files that are slow as a whole."""

SLOW_FIXTURES = frozenset({"nats", "broker", "durable_broker", "node_client"})
"""Fixtures that make the test using them slow wherever it is (a broker, Node)."""


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    # The quick run would deselect every test of these files: not importing them saves
    # each worker their imports and the rewriting of their asserts.
    if collection_path.stem in SLOW_MODULES and _is_quick_run(config):
        return True
    return None


def _is_quick_run(config: pytest.Config) -> bool:
    """Whether the run is ``-m "not slow"``, the quick run, as the README writes it."""
    return " ".join(str(config.getoption("markexpr", "")).split()) == "not slow"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        module = item.nodeid.partition("::")[0].rpartition("/")[2].removesuffix(".py")
        fixtures = set(getattr(item, "fixturenames", ()))
        if module in SLOW_MODULES or fixtures & SLOW_FIXTURES:
            item.add_marker(pytest.mark.slow)
