"""Real servers for tests: uvicorn on a free loopback port, stopped when the test ends."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette

from essessey import StreamHub
from essessey.dialects import dialect_routes
from tests.processes import STARTUP_TIMEOUT, free_port, spawn, stop_process, wait_for_port


class _TestServer(uvicorn.Server):
    """uvicorn's server, stopped without two fixed waits every test serving an app would
    add to its time: its main loop is woken by :meth:`stop` rather than finding
    ``should_exit`` at its next 0.1 s tick, and its shutdown, which sleeps 0.1 s for the
    open connections to close before it waits for them, goes straight on when none is
    open. The ticks' work and any shutdown with a connection or task left are uvicorn's
    own."""

    _wake: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None

    async def main_loop(self) -> None:
        wake = asyncio.Event()
        self._wake = (asyncio.get_running_loop(), wake)
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 1) % 864000
            with suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), 0.1)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if sockets or self.server_state.connections or self.server_state.tasks:
            await super().shutdown(sockets)
            return
        # uvicorn's steps, less the sleep for connections to close: there are none.
        logging.getLogger("uvicorn.error").info("Shutting down")
        for server in self.servers:
            server.close()
        if not self.force_exit:
            await self.lifespan.shutdown()

    def stop(self) -> None:
        """Set ``should_exit`` and wake the main loop (from any thread)."""
        self.should_exit = True
        if self._wake is not None:
            loop, wake = self._wake
            with suppress(RuntimeError):  # its loop has closed: the server has stopped
                loop.call_soon_threadsafe(wake.set)


@contextmanager
def serve(app: Any, **config: Any) -> Iterator[str]:
    """Run ``app`` under uvicorn in a thread on 127.0.0.1 (a port the OS picks) and yield
    its base URL; the server is stopped, and its thread joined, on exit."""
    config.setdefault("log_level", "warning")
    config.setdefault("lifespan", "off")
    # uvicorn's defaults pick httptools and uvloop when installed (the server extra has
    # them); the in-process servers stay on h11 and asyncio unless a test asks, so a test
    # meets the same server whatever is installed. Subprocess servers use the defaults.
    config.setdefault("http", "h11")
    config.setdefault("loop", "asyncio")
    server = _TestServer(uvicorn.Config(app, host="127.0.0.1", port=0, **config))
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
        thread.join(timeout=STARTUP_TIMEOUT)
        # Every server a test starts, it stops: one still running (a turn its shutdown
        # waits for) would outlive the test.
        if thread.is_alive():
            raise RuntimeError(f"uvicorn did not stop within {STARTUP_TIMEOUT} s")


class ServerProcess:
    """A uvicorn server in its own process (a "replica"), on a free loopback port."""

    def __init__(self, app: str, env: dict[str, str] | None = None) -> None:
        self.app = app
        self.env = env or {}
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The base URL, ``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """The command line: the ``uvicorn`` command serving ``app`` on the port."""
        return [
            sys.executable,
            "-m",
            "uvicorn",
            self.app,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--log-level",
            "warning",
        ]

    def start(self) -> None:
        """Start uvicorn and wait until the port accepts connections."""
        self.spawn()
        self.wait_ready()

    def spawn(self) -> None:
        """Start uvicorn, without waiting for it (see :meth:`wait_ready`)."""
        env = {**os.environ, **self.env}
        self.process = spawn(self.command(), env=env, cwd=_ROOT)

    def wait_ready(self) -> None:
        """Wait until the spawned server accepts connections; stop it if it never does."""
        assert self.process is not None, "spawn() first"
        try:
            wait_for_port(self.port, self.process, "uvicorn")
        except RuntimeError:
            self.stop(kill=True)
            raise

    def stop(self, *, kill: bool = False) -> None:
        """Stop it: SIGTERM (graceful) or SIGKILL (a crash), then wait."""
        process, self.process = self.process, None
        stop_process(process, kill=kill)


@contextmanager
def serve_dialects(turn: Any, hub: Any = None) -> Iterator[str]:
    """Serve the turns of ``turn`` (a dialect request's producer) in every wire dialect
    (``dialect_routes``) through ``hub`` (a default ``StreamHub`` when None) and yield the
    base URL."""
    hub = StreamHub() if hub is None else hub
    app = Starlette(routes=list(dialect_routes(hub, turn)), lifespan=hub.lifespan)
    with serve(app, lifespan="on") as url:
        yield url


@contextmanager
def serve_processes(
    app: str, count: int, env: dict[str, str] | None = None
) -> Iterator[tuple[ServerProcess, ...]]:
    """``count`` replicas of ``app``, each in its own uvicorn process, started side by
    side (each start is mostly imports: in parallel they cost one); all stopped on exit."""
    servers = tuple(ServerProcess(app, env) for _ in range(count))
    try:
        for server in servers:
            server.spawn()
        for server in servers:
            server.wait_ready()
        yield servers
    finally:
        for server in servers:
            server.stop(kill=True)


_ROOT = str(Path(__file__).resolve().parent.parent)
