"""Processes for tests and benchmarks: a free loopback port, waiting for a server to
listen, stopping it, a Node client's run, and the one bound on a test's waits.

The one home of these helpers: tests/servers.py (uvicorn), tests/nats_server.py and
tests/redis_server.py build on them, and so do the benchmarks (benchmarks/_server.py
puts the checkout on their path).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Final

WAIT: Final = 30.0
"""Seconds any one wait of a test may take (a read, a reply, a condition to hold): a bound
that only a failing test reaches, so the same one serves every test."""

WAIT_MS: Final = int(WAIT * 1000)
"""The same bound in milliseconds, as Playwright takes it."""

STARTUP_TIMEOUT = 15.0


@functools.cache
def _node_websocket_flags() -> tuple[str, ...]:
    """What makes Node's built-in WebSocket global: nothing from Node 22, a flag before."""
    probe = "process.exit(typeof WebSocket === 'function' ? 0 : 1)"
    has_it = subprocess.run(["node", "-e", probe], timeout=WAIT, check=False).returncode == 0
    return () if has_it else ("--experimental-websocket",)


def node_json(script: Any, *args: str, stdin: str | None = None, websocket: bool = False) -> Any:
    """What the Node client ``script`` (tests/node) printed as JSON, run with ``args``
    (and ``stdin`` on its standard input; ``websocket`` for a script that needs the
    browser's WebSocket); raises with what it wrote to stderr if it fails, or if it takes
    longer than WAIT."""
    flags = _node_websocket_flags() if websocket else ()
    done = subprocess.run(
        ["node", *flags, str(script), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"{script} exited with {done.returncode}: {done.stderr}")
    return json.loads(done.stdout)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, process: subprocess.Popen[bytes], what: str) -> None:
    """Wait until ``process`` accepts connections on ``port``; raise if it exits first or
    does not listen within STARTUP_TIMEOUT seconds."""
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not start listening")


def stop_process(process: subprocess.Popen[bytes] | None, *, kill: bool = False) -> None:
    """Stop ``process`` (SIGTERM, or SIGKILL with ``kill=True``) and wait for it, killing
    it if it does not exit within STARTUP_TIMEOUT seconds; then kill what is left of the
    process group :func:`spawn` gave it (a server's worker processes, which a SIGKILL of
    their parent would orphan)."""
    if process is None:
        return
    try:
        if process.poll() is not None:
            return
        if kill:
            process.kill()
        else:
            process.terminate()
        try:
            process.wait(timeout=STARTUP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=STARTUP_TIMEOUT)
    finally:
        _kill_group(process)


_GROUP_LEADERS: set[int] = set()
"""The pids :func:`spawn` started in a process group of their own, still to be reaped."""


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    if process.pid in _GROUP_LEADERS:
        _GROUP_LEADERS.discard(process.pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)


def _die_with_parent() -> None:
    # Linux: the child gets SIGTERM when the process that started it dies, even by
    # SIGKILL, so a killed test run or benchmark leaves no server behind.
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def spawn(command: list[str], **options: Any) -> subprocess.Popen[bytes]:
    """Start ``command`` as a child that dies with this process (on Linux), in a process
    group of its own, which :func:`stop_process` kills whole."""
    if sys.platform == "linux":
        options.setdefault("preexec_fn", _die_with_parent)
    options.setdefault("start_new_session", True)
    process = subprocess.Popen(command, **options)
    if options["start_new_session"]:
        _GROUP_LEADERS.add(process.pid)
    return process
