"""A real browser reads the stream: headless Chromium opens the hub's WebSocket endpoint
with its own ``WebSocket``, then resumes by ``?last_event_id=``.

Debian's ``chromium`` package provides the browser (``.ci/run`` installs it); Playwright
drives it and never downloads one. Without the browser the test is skipped, except in CI,
where it must run.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from essessey import Event, InMemoryEventStore, Publisher, StreamHub, check, stream_turn
from essessey.bindings.ws import ws_route
from tests.browser import CHROMIUM, CHROMIUM_ARGS, skip_module_without_chromium
from tests.processes import WAIT_MS
from tests.servers import serve

pytestmark = pytest.mark.anyio


skip_module_without_chromium()

PAGE = """<!doctype html>
<html>
<head><meta charset="utf-8"><title>essessey WebSocket</title></head>
<body>
<script>
// read(query) opens the stream, collects every frame (JSON.parse'd) and resolves when
// message_stop arrives (closing the socket) or the server closes first.
window.read = (query) => new Promise((resolve) => {
  const received = [];
  const errors = [];
  const socket = new WebSocket(`ws://${location.host}/streams/st_b/ws${query}`);
  socket.onmessage = (message) => {
    const frame = JSON.parse(message.data);
    received.push(frame);
    if (frame.event === "message_stop") socket.close(1000, "done");
  };
  socket.onerror = () => errors.push("error");
  socket.onclose = (close) => resolve(
    {received, errors, code: close.code, reason: close.reason, clean: close.wasClean}
  );
});
</script>
</body>
</html>
"""


async def turn(publisher: Publisher) -> None:
    async with stream_turn(publisher, message_id="msg_b", stream_id="st_b", model="m") as t:
        thinking = await t.thinking()
        await thinking.write("Planning the answer.")
        text = await t.text()
        for chunk in ("Hello, ", "browser! Ünïcödé, emoji 🎉,", "\nand a second line."):
            await text.write(chunk)
            await anyio.sleep(0.01)  # live events, not only a replay
        tools = await t.tools()
        await tools.start_call("toolu_b", "lookup", '{"q": "ws"}')
        await tools.write_result("toolu_b", '{"hits": 3}')
        t.stop_reason = "tool_use"
        t.output_tokens = 9


def as_frame(event: Event) -> dict[str, Any]:
    return {"id": event.id, "event": event.event, "data": orjson.loads(event.data)}


async def test_a_browser_websocket_receives_every_event_in_order_and_resumes() -> None:
    from playwright.async_api import async_playwright

    hub = StreamHub(InMemoryEventStore())

    async def page(request: Request) -> HTMLResponse:
        return HTMLResponse(PAGE)

    async def start(request: Request) -> Response:
        await hub.start("st_b", turn)
        return Response(status_code=202)

    async def published(request: Request) -> Response:
        # Read inside the server's event loop, once the turn has ended.
        with anyio.fail_after(WAIT_MS / 1000):
            await hub.wait("st_b")
        events, _ = await hub.store.since("st_b", None)
        body = [[event.event, event.data.decode(), event.id] for event in events]
        return Response(orjson.dumps(body), media_type="application/json")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with hub:
            yield

    app = Starlette(
        routes=[
            Route("/", page),
            Route("/start", start, methods=["POST"]),
            Route("/published", published),
            ws_route(hub),
        ],
        lifespan=lifespan,
    )
    with serve(app, lifespan="on") as base:
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(
                executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
            )
            try:
                tab = await browser.new_page()
                await tab.goto(base + "/", timeout=WAIT_MS)
                started = await tab.evaluate(
                    "fetch('/start', {method: 'POST'}).then(r => r.status)"
                )
                assert started == 202
                whole: dict[str, Any] = await tab.evaluate("window.read('')")
                body = await tab.evaluate("fetch('/published').then(r => r.json())")
                events = [Event(name, data.encode(), event_id) for name, data, event_id in body]
                resume_query = f"?last_event_id={events[4].id}"
                rest: dict[str, Any] = await tab.evaluate(f"window.read({resume_query!r})")
                missing: dict[str, Any] = await tab.evaluate("window.read('?last_event_id=x')")
            finally:
                await browser.close()

    assert check(events) == []
    assert whole["received"] == [as_frame(event) for event in events]
    assert all(frame["id"] for frame in whole["received"])
    assert whole["errors"] == []
    assert whole["code"] == 1000
    assert whole["clean"]
    assert rest["received"] == [as_frame(event) for event in events[5:]]
    assert rest["errors"] == []
    # A close code and its reason reach the page's script (a refused handshake would not).
    assert missing["received"] == []
    assert missing["code"] == 4410
    assert missing["reason"] == "last event id not retained; start over"
    blocks = [
        orjson.loads(e.data)["content_block"]["type"]
        for e in events
        if e.event == "content_block_start"
    ]
    assert blocks == ["thinking", "text", "tool_use", "tool_result"]
