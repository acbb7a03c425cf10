"""The app of the stalled-client and leak tests, and how to run it in a subprocess.

The app: a :class:`~essessey.StreamHub` served over SSE (``hub_routes``) and WebSocket
(``ws_route``), ``POST /turns/{stream_id}`` to start a text turn on it, and a debug
route, ``GET /debug``, reporting the process's asyncio task count, resident memory, open
file descriptors and the hub's subscribers. The debug route exists only in this test app,
never in the library.

The server runs in its own process (``uvicorn tests.load_app:app``), so what the debug
route reports is the server's alone: the test's clients, their sockets and their memory
are in another process. It is configured from the environment:

- ``LOAD_SEND_TIMEOUT`` (seconds), ``LOAD_MAX_QUEUE``, ``LOAD_PING_INTERVAL``: the SSE and
  WebSocket options of the same names;
- ``LOAD_MAX_LAG``, ``LOAD_MAX_EVENTS``: the hub's ``max_lag`` and the store's
  ``max_events_per_stream``;
- ``LOAD_SNDBUF`` (bytes): the kernel send buffer of the listening socket, which the
  accepted connections inherit. A fixed buffer also turns off the kernel's autotuning,
  which otherwise lets a connection whose client stopped reading absorb megabytes
  (up to ``net.ipv4.tcp_wmem``'s maximum, which varies by host) before the app's sends
  stall: with it the stall shows after a known, small amount, on any host.

``python -m tests.load_app --port N`` serves it with uvicorn (on a socket it makes itself,
for ``LOAD_SNDBUF``). Its log (WARNING and above, one line per record:
``LEVEL:logger:message``) goes to stderr, which :class:`LoadServer` captures in a file for
the test to read.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from essessey import InMemoryEventStore, Publisher, StopReason, StreamHub
from essessey.bindings.sse import hub_routes
from essessey.bindings.ws import ws_route
from tests.processes import free_port, stop_process, wait_for_port

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
_ROOT = str(Path(__file__).resolve().parent.parent)


def _env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def delta_text(index: int, size: int) -> str:
    """The text of delta ``index``: ``size`` characters (at least 8) that name it, so a
    client can tell a lost or repeated delta from the text alone."""
    head = f"d{index:07d}"
    return head + "x" * max(0, size - len(head))


def rss_bytes() -> int:
    """This process's resident memory, from ``/proc/self/statm`` (Linux)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE_SIZE


def make_app() -> Starlette:
    """The load app, configured from the environment (see the module docstring)."""
    options: dict[str, Any] = {
        "send_timeout": _env_float("LOAD_SEND_TIMEOUT", 1.0),
        "max_queue": _env_int("LOAD_MAX_QUEUE", 64),
        "ping_interval": _env_float("LOAD_PING_INTERVAL", 15.0),
    }
    store = InMemoryEventStore(max_events_per_stream=_env_int("LOAD_MAX_EVENTS", 100_000))
    hub = StreamHub(store, max_lag=_env_int("LOAD_MAX_LAG", 1000))
    streams: set[str] = set()

    async def start_turn(request: Request) -> Response:
        """``?deltas=N&size=S`` text deltas; ``every=K&pause=P``: sleep P s after every
        K deltas (a steady pace; P=0 only yields); ``wait_for=M``: wait (up to
        ``wait_timeout`` s) until M subscribers follow the stream before the deltas;
        ``hold=1``: after the deltas, wait until cancelled (a running stream)."""
        stream_id = request.path_params["stream_id"]
        query = request.query_params
        deltas = int(query.get("deltas", "10"))
        size = int(query.get("size", "100"))
        every = max(1, int(query.get("every", "100")))
        pause = float(query.get("pause", "0"))
        wait_for = int(query.get("wait_for", "0"))
        wait_timeout = float(query.get("wait_timeout", "30"))
        hold = query.get("hold") == "1"

        async def produce(publisher: Publisher) -> None:
            await publisher.send_stream_preamble(f"msg_{stream_id}", stream_id, "load")
            with anyio.move_on_after(wait_timeout):
                # The hub has no event for its subscriber count: polled, bounded.
                while hub.subscriber_count(stream_id) < wait_for:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            await publisher.send_content_block_start_text(0)
            for index in range(deltas):
                await publisher.send_content_block_delta_text(0, delta_text(index, size))
                if (index + 1) % every == 0:
                    await anyio.sleep(pause)
            if hold:
                await anyio.sleep_forever()
            await publisher.send_content_block_stop(0)
            await publisher.send_stream_epilogue(StopReason.END_TURN, deltas)

        streams.add(stream_id)
        await hub.start(stream_id, produce)
        return Response(status_code=202)

    async def debug(request: Request) -> Response:
        if request.query_params.get("gc") == "1":
            gc.collect()
        if request.query_params.get("names") == "1":
            return JSONResponse(sorted(task.get_name() for task in asyncio.all_tasks()))
        return JSONResponse(
            {
                "tasks": len(asyncio.all_tasks()),
                "rss": rss_bytes(),
                "fds": len(os.listdir("/proc/self/fd")),
                "subscribers": sum(hub.subscriber_count(s) for s in streams),
                "running": sum(hub.running(s) for s in streams),
            }
        )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with hub:
            yield

    routes = [
        *hub_routes(hub, **options),
        ws_route(hub, **options),
        Route("/turns/{stream_id}", start_turn, methods=["POST"]),
        Route("/debug", debug),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


class LoadServer:
    """The load app under uvicorn in a subprocess on a free loopback port, its stderr
    captured in a temporary file (not a pipe: a pipe nobody drains would block it)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (closed by stop())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def start(self) -> None:
        command = [sys.executable, "-m", "tests.load_app", "--port", str(self.port)]
        self.process = subprocess.Popen(
            command, env={**os.environ, **self.env}, cwd=_ROOT, stderr=self._log
        )
        wait_for_port(self.port, self.process, "uvicorn")

    def stop(self) -> None:
        process, self.process = self.process, None
        stop_process(process, kill=True)
        self._log.close()

    def log(self) -> str:
        """Everything the server wrote to stderr so far."""
        self._log.flush()
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def debug(self, *, collect: bool = False) -> dict[str, int]:
        """The debug route's figures (``collect``: after a ``gc.collect()``)."""
        url = f"{self.url}/debug" + ("?gc=1" if collect else "")
        with urllib.request.urlopen(url, timeout=10) as response:
            figures: dict[str, int] = json.load(response)
        return figures

    def task_names(self) -> list[str]:
        """The names of the server's asyncio tasks (to tell what a leftover task is)."""
        with urllib.request.urlopen(f"{self.url}/debug?names=1", timeout=10) as response:
            names: list[str] = json.load(response)
        return names

    def start_turn(self, stream_id: str, **query: Any) -> None:
        """``POST /turns/{stream_id}`` with ``query``; raises unless it is accepted."""
        params = "&".join(f"{key}={value}" for key, value in query.items())
        request = urllib.request.Request(
            f"{self.url}/turns/{stream_id}?{params}", data=b"", method="POST"
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            if response.status != 202:
                raise RuntimeError(f"starting {stream_id}: HTTP {response.status}")

    def cancel(self, stream_id: str) -> None:
        """Cancel the turn running on ``stream_id``."""
        request = urllib.request.Request(
            f"{self.url}/streams/{stream_id}/cancel", data=b"", method="POST"
        )
        with urllib.request.urlopen(request, timeout=10):
            pass

    def settle(self, timeout: float, *, quiet: float = 1.0) -> dict[str, int]:
        """The figures once no client is subscribed and the task count and descriptors
        have not changed for ``quiet`` seconds (a task that ends by itself a moment
        after the last stream, such as a watcher polling on a timer, is gone by then).
        Bounded: TimeoutError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        last: dict[str, int] | None = None
        since = time.monotonic()
        while True:
            figures = self.debug(collect=True)
            now = time.monotonic()
            key = ("tasks", "fds", "subscribers")
            if last is None or any(figures[k] != last[k] for k in key):
                last, since = figures, now
            elif figures["subscribers"] == 0 and now - since >= quiet:
                return figures
            if now > deadline:
                raise TimeoutError(f"the server's figures did not settle: {figures}")
            time.sleep(0.1)

    def wait_until(
        self, predicate: Callable[[dict[str, int]], bool], timeout: float, *, collect: bool = False
    ) -> dict[str, int]:
        """Poll the debug route until ``predicate(figures)`` holds (bounded: raise
        TimeoutError with the last figures after ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        while True:
            figures = self.debug(collect=collect)
            if predicate(figures):
                return figures
            if time.monotonic() > deadline:
                raise TimeoutError(f"the server's figures did not settle: {figures}")
            time.sleep(0.1)


@contextmanager
def load_server(**env: str) -> Iterator[LoadServer]:
    """A started :class:`LoadServer` with ``env`` (``LOAD_*`` settings); always stopped."""
    server = LoadServer(env)
    try:
        server.start()
        yield server
    finally:
        server.stop()


def serve(port: int) -> None:
    """Serve the load app with uvicorn on 127.0.0.1:``port`` until SIGTERM or SIGINT."""
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(levelname)s:%(name)s:%(message)s"
    )
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sndbuf = _env_int("LOAD_SNDBUF", 0)
    if sndbuf:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    listener.bind(("127.0.0.1", port))
    listener.listen(2048)
    config = uvicorn.Config(make_app(), log_level="warning", lifespan="on")
    uvicorn.Server(config).run(sockets=[listener])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Serve the load app (test only).")
    parser.add_argument("--port", type=int, required=True)
    serve(parser.parse_args().port)
