"""Real servers for tests: uvicorn on a free loopback port, stopped when the test ends."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

STARTUP_TIMEOUT = 15.0


@contextmanager
def serve(app: Any, **config: Any) -> Iterator[str]:
    """Run ``app`` under uvicorn in a thread on 127.0.0.1 (a port the OS picks) and yield
    its base URL; the server is stopped, and its thread joined, on exit."""
    config.setdefault("log_level", "warning")
    config.setdefault("lifespan", "off")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, **config))
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
        server.should_exit = True
        thread.join(timeout=STARTUP_TIMEOUT)
