"""The test harness's uvicorn server (tests/servers.py) copies two of uvicorn's own steps to
skip their fixed waits: ``Server.main_loop`` (a tick every 0.1 s) and, with nothing open,
``Server.shutdown`` (a 0.1 s sleep for connections to close). These tests fail when
uvicorn changes either, so the copies are read again instead of drifting from what users
run."""

from __future__ import annotations

import inspect

import uvicorn


def test_uvicorns_main_loop_is_the_tick_the_harness_copies() -> None:
    source = inspect.getsource(uvicorn.Server.main_loop)
    assert "await self.on_tick(counter)" in source
    assert "await asyncio.sleep(0.1)" in source
    assert "counter % 864000" in source


def test_uvicorns_shutdown_has_only_the_steps_the_harness_copies() -> None:
    source = inspect.getsource(uvicorn.Server.shutdown)
    lines = [
        line.strip()
        for line in source.splitlines()[1:]
        if line.strip() and not line.strip().startswith("#")
    ]
    assert lines == [
        'logger.info("Shutting down")',
        "for server in self.servers:",
        "server.close()",
        "for sock in sockets or []:",
        "sock.close()  # pragma: full coverage",
        "for connection in list(self.server_state.connections):",
        "connection.shutdown()",
        "await asyncio.sleep(0.1)",
        "try:",
        "async with asyncio.timeout(self.config.timeout_graceful_shutdown):",
        "await self._wait_tasks_to_complete()",
        "except TimeoutError:",
        "logger.error(",
        '"Cancel %s running task(s), timeout graceful shutdown exceeded",',
        "len(self.server_state.tasks),",
        ")",
        "for t in self.server_state.tasks:",
        't.cancel(msg="Task cancelled, timeout graceful shutdown exceeded")',
        "if not self.force_exit:",
        "await self.lifespan.shutdown()",
    ], "uvicorn's Server.shutdown changed: read tests/servers.py's copy of it again"
