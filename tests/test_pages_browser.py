"""No 404 for the icon: the demo's page and the example apps' pages, loaded in headless
Chromium, leave the server no request it answers 404, ``/favicon.ico`` included.

A browser asks every site for ``/favicon.ico`` unless the page names its icon; the first
test shows this Chromium does, so the others would see that 404 if a page lost its icon.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

from essessey.demo import create_app
from tests.browser import CHROMIUM, CHROMIUM_ARGS, skip_module_without_chromium
from tests.processes import WAIT, WAIT_MS
from tests.servers import serve
from tests.test_examples import load_example

pytestmark = pytest.mark.anyio


skip_module_without_chromium()


class RequestLog:
    """ASGI middleware that records each HTTP request's path and response status."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[tuple[str, int]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def record(message: Any) -> None:
            if message["type"] == "http.response.start":
                self.seen.append((scope["path"], message["status"]))
            await send(message)

        await self.app(scope, receive, record)

    async def wait_for(self, path: str) -> int:
        """The status of the first request for ``path``, waiting for it (bounded)."""
        with anyio.fail_after(WAIT):
            while True:
                for seen, status in self.seen:
                    if seen == path:
                        return status
                await anyio.sleep(0.02)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # module-wide: one browser serves the module's tests


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield launched
        finally:
            await launched.close()


async def load(browser: Any, base: str) -> Any:
    """Open the app's page in a fresh context (no cached icon), wait until it has loaded
    and the network is quiet, and return the icons it names."""
    context = await browser.new_context()
    try:
        tab = await context.new_page()
        await tab.goto(base + "/", timeout=WAIT_MS)
        await tab.wait_for_load_state("networkidle", timeout=WAIT_MS)
        return await tab.evaluate(
            "[...document.querySelectorAll('link[rel~=icon]')].map(l => l.getAttribute('href'))"
        )
    finally:
        await context.close()


async def test_this_browser_asks_for_the_favicon_of_a_page_that_names_none(browser: Any) -> None:
    async def page(request: Request) -> HTMLResponse:
        return HTMLResponse("<!doctype html><title>no icon</title><p>hello")

    log = RequestLog(Starlette(routes=[Route("/", page)]))
    with serve(log) as base:
        assert await load(browser, base) == []
        assert await log.wait_for("/favicon.ico") == 404


async def test_the_demo_page_gets_its_icon_and_no_404(browser: Any) -> None:
    log = RequestLog(create_app(ping_interval=1.0))
    with serve(log, lifespan="on") as base:
        assert await load(browser, base) == ["/favicon.ico"]
        assert await log.wait_for("/favicon.ico") == 200
    assert [entry for entry in log.seen if entry[1] >= 400] == []


EXAMPLE_APPS: dict[str, Callable[[], Any]] = {
    "resume_app": lambda: load_example("resume_app").app,
    "ws_app": lambda: load_example("ws_app").app,
}


@pytest.mark.parametrize("name", sorted(EXAMPLE_APPS))
async def test_an_example_page_names_its_icon_and_gets_no_404(browser: Any, name: str) -> None:
    log = RequestLog(EXAMPLE_APPS[name]())
    with serve(log, lifespan="on") as base:
        # An empty icon of its own: the browser asks the server for none.
        assert await load(browser, base) == ["data:,"]
        assert log.seen[0] == ("/", 200)
    assert [entry for entry in log.seen if entry[1] >= 400] == []
