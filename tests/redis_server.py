"""A real redis-server for tests: a free loopback port, a temporary directory.

The ``redis-server`` command comes from Debian's ``redis-server`` package (``.ci/run``
installs it when missing). Every server a test starts is stopped by the fixture or context
manager.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from essessey.stores.redis import RedisEventStore
from tests.processes import free_port, spawn, stop_process, wait_for_port


class RedisServer:
    """One redis-server process with its files in ``data_dir``; persistence off unless
    ``appendonly``. ``stop`` and ``start`` keep the port and the directory, so a restart
    looks to clients like the same server coming back."""

    def __init__(self, data_dir: Path, *, appendonly: bool = False) -> None:
        self.data_dir = data_dir
        self.appendonly = appendonly
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The client URL, ``redis://127.0.0.1:<port>/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        """The server process's id (it must be running)."""
        assert self.process is not None, "not started"
        return self.process.pid

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server not found: apt-get install redis-server")
        self.process = spawn(
            [
                binary,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--dir", str(self.data_dir),
                "--save", "",
                "--appendonly", "yes" if self.appendonly else "no",
                "--appendfsync", "always",
                "--protected-mode", "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_for_port(self.port, self.process, "redis-server")

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server (SIGTERM, or SIGKILL with ``kill=True``) and wait for it."""
        process, self.process = self.process, None
        stop_process(process, kill=kill)

    def restart(self) -> None:
        """Stop, then start again on the same port and directory."""
        self.stop()
        self.start()


@contextmanager
def redis_server(*, appendonly: bool = False) -> Iterator[RedisServer]:
    """A started :class:`RedisServer` in a temporary directory, stopped on exit."""
    with tempfile.TemporaryDirectory(prefix="essessey-redis-") as data:
        server = RedisServer(Path(data), appendonly=appendonly)
        server.start()
        try:
            yield server
        finally:
            server.stop()


def store_out_of_reach() -> RedisEventStore:
    """A Redis store with no Redis behind it (nothing listens on its port), which gives
    up after 0.3 s: the client makes no retries of its own, so the store's budget is the
    whole wait."""
    client = redis.Redis(port=free_port(), retry=Retry(NoBackoff(), 0))
    return RedisEventStore(client, retry_timeout=0.3)


Verdict = Literal["pass", "drop", "cut"]
"""What :class:`ReplyProxy` does with a chunk of the server's replies: let it through,
keep it from the client, or close both ends of the connection."""


class ReplyProxy:
    """A TCP proxy to redis-server on loopback that passes every request on and asks
    ``verdict(reply)`` what to do with each chunk of the server's replies: a request the
    server carried out whose reply was lost (``"cut"``), or one whose client still waits
    (``"drop"``)."""

    def __init__(self, target_port: int, verdict: Callable[[bytes], Verdict]) -> None:
        self.target_port = target_port
        self.verdict = verdict
        self.server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        """The proxy's client URL."""
        assert self.server is not None
        return f"redis://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/0"

    async def __aenter__(self) -> ReplyProxy:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, up: bool) -> None:
            try:
                while data := await src.read(65536):
                    verdict = "pass" if up else self.verdict(data)
                    if verdict == "cut":
                        writer.close()
                        up_writer.close()
                        return
                    if verdict == "pass":
                        dst.write(data)
                        await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(
            pump(reader, up_writer, True), pump(up_reader, writer, False), return_exceptions=True
        )
