"""A real browser reads the stream: headless Chromium opens it with ``EventSource``.

Debian's ``chromium`` package provides the browser (``.ci/run`` installs it); Playwright
drives it and never downloads one. Without the browser the test is skipped, except in CI,
where it must run.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

from essessey import Event, InMemorySink, Publisher, stream_turn
from essessey.bindings.sse import EventStreamResponse
from tests.browser import CHROMIUM, CHROMIUM_ARGS, skip_module_without_chromium
from tests.processes import WAIT_MS
from tests.servers import serve

pytestmark = pytest.mark.anyio


skip_module_without_chromium()

PROTOCOL_EVENTS = [
    "message_start",
    "ping",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
    "error",
]

PAGE = """<!doctype html>
<html>
<head><meta charset="utf-8"><title>essessey SSE</title></head>
<body>
<script>
window.received = [];
window.done = false;
window.failures = 0;
const source = new EventSource("/stream");
for (const name of %(names)s) {
  source.addEventListener(name, (event) => {
    window.received.push({event: event.type, data: event.data, lastEventId: event.lastEventId});
    if (event.type === "message_stop") {
      source.close();  // otherwise EventSource reconnects when the stream ends
      window.done = true;
    }
  });
}
source.onerror = () => { window.failures += 1; };
</script>
</body>
</html>
"""


async def turn(publisher: Publisher) -> None:
    async with stream_turn(publisher, message_id="msg_b", stream_id="st_b", model="m") as t:
        thinking = await t.thinking()
        await thinking.write("Planning the answer.")
        text = await t.text()
        await text.write("Hello, ")
        await text.write("browser! Ünïcödé, emoji 🎉,\nand a second line.")
        tools = await t.tools()
        await tools.start_call("toolu_b", "lookup", '{"q": "sse"}')
        await tools.write_result("toolu_b", '{"hits": 3}')
        t.stop_reason = "tool_use"
        t.output_tokens = 9


async def turn_events() -> list[Event]:
    sink = InMemorySink()
    await turn(Publisher(sink))
    # Ids as an event store gives them: opaque, increasing.
    return [event.with_id(f"epoch1-{i:04d}") for i, event in enumerate(sink.events)]


async def test_a_browser_event_source_receives_every_event_in_order() -> None:
    from playwright.async_api import async_playwright

    events = await turn_events()

    async def page(request: Request) -> HTMLResponse:
        return HTMLResponse(PAGE % {"names": orjson.dumps(PROTOCOL_EVENTS).decode()})

    async def source() -> AsyncIterator[Event]:
        for event in events:
            yield event

    async def stream(request: Request) -> EventStreamResponse:
        return EventStreamResponse(source(), ping_interval=0.5)

    app = Starlette(routes=[Route("/", page), Route("/stream", stream)])
    with serve(app) as base:
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(
                executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
            )
            try:
                tab = await browser.new_page()
                await tab.goto(base + "/", timeout=WAIT_MS)
                await tab.wait_for_function("window.done === true", timeout=WAIT_MS)
                received: list[dict[str, Any]] = await tab.evaluate("window.received")
                failures: int = await tab.evaluate("window.failures")
            finally:
                await browser.close()

    assert received == [
        {"event": e.event, "data": e.data.decode(), "lastEventId": e.id} for e in events
    ]
    assert failures == 0  # no error, no reconnect
    # The turn really covered every kind of block.
    blocks = [
        orjson.loads(e.data)["content_block"]["type"]
        for e in events
        if e.event == "content_block_start"
    ]
    assert blocks == ["thinking", "text", "tool_use", "tool_result"]
