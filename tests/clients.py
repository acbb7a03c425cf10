"""The clients tests read a turn with (one SSE connection or one WebSocket connection, to
the turn's end or its first ``limit`` events) and the helpers of tests that read a store
or a hub in-process; every wait is bounded by ``WAIT``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
from websockets.asyncio.client import connect as ws_connect

from essessey import Event
from essessey.bindings.sse import connect
from essessey.bindings.ws import WebSocketSource
from tests.processes import WAIT


async def read_sse(
    http: httpx.AsyncClient, url: str, *, limit: int | None = None, **options: Any
) -> list[Event]:
    """The events of one SSE connection (a GET of ``url``; ``options`` go to
    :func:`essessey.bindings.sse.connect`: ``last_event_id``, ``params``, ``headers``):
    to the end, or the first ``limit``."""
    events: list[Event] = []
    with anyio.fail_after(WAIT):
        async with connect(http, "GET", url, **options) as stream:
            async for event in stream:
                events.append(event)
                if limit is not None and len(events) >= limit:
                    break
    return events


async def read_ws(
    url: str, *, limit: int | None = None, close_code: int | None = None
) -> list[Event]:
    """The events of one WebSocket connection, keep-alive pings left out: to the end,
    or the first ``limit``; with ``close_code``, the connection must have ended with it."""
    events: list[Event] = []
    with anyio.fail_after(WAIT):
        async with ws_connect(url) as socket:
            source = WebSocketSource(socket)
            async for event in source:
                if event.id is None:
                    continue  # a keep-alive ping frame, not an event of the turn
                events.append(event)
                if limit is not None and len(events) >= limit:
                    break
    if close_code is not None:
        assert source.close_code == close_code
    return events


# -- stores and hubs, read in-process -----------------------------------------------------


async def collect(events: AsyncIterator[Event], into: list[Event]) -> None:
    """Append every event of ``events`` to ``into`` (a task reading a follow)."""
    async for event in events:
        into.append(event)
