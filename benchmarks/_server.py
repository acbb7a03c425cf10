"""The server side of the end-to-end benchmarks: one uvicorn process, always stopped.

Each benchmark runs itself with ``--serve --port N`` as the server process. The parent
stops it by closing its stdin, which its death does too, so a crashed benchmark never
leaves a server behind.
"""

from __future__ import annotations

import cProfile
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Literal

import uvicorn

# The checkout, so that the benchmarks share the tests' process helpers (a free port, the
# nats-server and redis-server they start) instead of copies of them.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.nats_server import NatsServer, nats_server
from tests.processes import free_port, spawn
from tests.redis_server import redis_server

__all__ = [
    "NatsServer",
    "ServerProcess",
    "free_port",
    "nats_server",
    "redis_server",
    "run_until_stdin_closes",
]

STOP_TIMEOUT = 10.0


def run_until_stdin_closes(
    app: Any,
    port: int,
    *,
    lifespan: Literal["on", "off", "auto"],
    profile_path: str | None = None,
) -> int:
    """Serve ``app`` on 127.0.0.1:port until stdin closes (optionally under cProfile)."""
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", lifespan=lifespan
    )
    server = uvicorn.Server(config)

    def stop_when_stdin_closes() -> None:
        sys.stdin.buffer.read()
        server.should_exit = True

    threading.Thread(target=stop_when_stdin_closes, daemon=True).start()
    profiler = cProfile.Profile() if profile_path else None
    if profiler is not None:
        profiler.enable()
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        if profiler is not None and profile_path:
            profiler.disable()
            profiler.dump_stats(profile_path)
    return 0


class ServerProcess:
    """``python <script> --serve --port N <args>`` started, waited for, always stopped."""

    def __init__(self, script: str, args: list[str], *, startup_timeout: float) -> None:
        self.port = free_port()
        self.startup_timeout = startup_timeout
        command = [sys.executable, os.path.abspath(script), "--serve", "--port", str(self.port)]
        self.process = spawn([*command, *args], stdin=subprocess.PIPE)

    @property
    def http_url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        """``ws://127.0.0.1:<port>``."""
        return f"ws://127.0.0.1:{self.port}"

    def wait_until_ready(self) -> None:
        """Wait until the server accepts connections; raise if it exits or times out."""
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with status {self.process.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1.0):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("the server did not accept connections in time") from None
                time.sleep(0.05)

    def stop(self) -> None:
        """Close its stdin and wait; kill it if it does not exit in STOP_TIMEOUT seconds."""
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
