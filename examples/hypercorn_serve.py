"""Serving an essessey app with hypercorn so that a shutdown hands its readers over.

hypercorn tells an app nothing when it is asked to stop: it waits a few seconds for the
open responses, then cuts them. Run it from Python instead of its command, and call
``begin_shutdown`` from its ``shutdown_trigger``: every open SSE stream then sends its
``retry:`` hint and ends, every WebSocket closes with 1012, and their clients resume
elsewhere with their last event id (docs/servers.md).

    python examples/hypercorn_serve.py 127.0.0.1:8000
"""

from __future__ import annotations

import asyncio
import signal
import sys

from hypercorn.asyncio import serve
from hypercorn.config import Config

from essessey.demo import create_app
from essessey.shutdown import begin_shutdown


async def main(bind: str) -> None:
    config = Config()
    config.bind = [bind]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def shutdown_trigger() -> None:
        await stop.wait()
        # Before hypercorn waits for the open responses: they end at once, whole.
        begin_shutdown()

    await serve(create_app(), config, shutdown_trigger=shutdown_trigger)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:8000"))
