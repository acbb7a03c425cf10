"""The demo page in a real browser: headless Chromium runs a turn, drops the connection,
reloads the page, switches transport, and must end up showing exactly the script.

Debian's ``chromium`` package provides the browser (``.ci/run`` installs it); Playwright
drives it and never downloads one. Without the browser the tests are skipped, except in
CI, where they must run. The first test saves a screenshot of the finished page; set
``ESSESSEY_DEMO_SCREENSHOT`` to a path to keep a copy there (that is how
``docs/img/demo.png`` is made).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from essessey import Event, check, reassemble_events
from essessey.bindings.sse import connect
from essessey.demo import DEFAULT_DELTAS, DemoScript, create_app, scenario_script
from tests.browser import CHROMIUM, CHROMIUM_ARGS, skip_module_without_chromium
from tests.processes import WAIT_MS
from tests.servers import serve

pytestmark = pytest.mark.anyio

DELTAS = 100
DELAY_MS = 20  # the answer alone takes 2 s: time to drop, reconnect and reload in it
ANSWER_INDEX = 6  # thinking 0, text 1, two tool_use 2-3, two tool_result 4-5, answer 6
MAX_SCREENSHOT = 300 * 1024

skip_module_without_chromium()


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    with serve(create_app(ping_interval=1.0), lifespan="on") as url:
        yield url


@asynccontextmanager
async def browser_page(base: str) -> AsyncIterator[Any]:
    """A fresh headless Chromium tab on the demo page, closed on exit."""
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            page = await browser.new_page(viewport={"width": 900, "height": 700})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            await page.goto(base + "/", timeout=WAIT_MS)
            yield page
        finally:
            await browser.close()
    assert errors == [], errors


async def start_turn(page: Any, *, transport: str, scenario: str = "agent") -> None:
    await page.select_option("#scenario", scenario)
    await page.select_option("#transport", transport)
    await page.fill("#deltas", str(DELTAS))
    await page.fill("#delay", str(DELAY_MS))
    await page.click("#start")


async def wait_for_answer(page: Any, length: int) -> None:
    """Until the final answer block shows at least ``length`` characters."""
    await page.wait_for_function(
        """([index, length]) => {
            const state = window.demoState;
            return state !== null && state.blocks.some(
                (b) => b.index === index && b.type === "text" && b.text.length >= length);
        }""",
        arg=[ANSWER_INDEX, length],
        timeout=WAIT_MS,
    )


async def wait_until_streaming(page: Any) -> None:
    await page.wait_for_function(
        "['streaming', 'done'].includes(document.getElementById('status').dataset.state)",
        timeout=WAIT_MS,
    )


async def wait_until_done(page: Any) -> None:
    await page.wait_for_function(
        "document.getElementById('status').dataset.state === 'done'", timeout=WAIT_MS
    )


async def server_events(base: str, stream_id: str) -> list[Event]:
    """The whole stream as the server keeps it (a fresh SSE read after the turn)."""
    async with (
        httpx.AsyncClient(timeout=10) as http,
        connect(http, "GET", f"{base}/streams/{stream_id}") as stream,
    ):
        return [event async for event in stream]


async def assert_rendered(page: Any, base: str, script: DemoScript) -> dict[str, Any]:
    """The page shows exactly the script, and applied every event of the stream once."""
    state: dict[str, Any] = await page.evaluate("window.demoState")
    answer = await page.text_content("#answer")
    assert answer == script.final_text
    texts = await page.eval_on_selector_all(
        ".text-block", "blocks => blocks.map(b => b.textContent)"
    )
    assert texts == [script.intro_text, script.final_text]
    thinking = await page.text_content(".thinking .thinking-text")
    assert thinking == script.thinking_text
    assert await page.eval_on_selector(".thinking", "d => d.open") is False  # collapsed
    cards = await page.eval_on_selector_all(
        ".tool-card",
        """cards => cards.map(card => ({
            id: card.dataset.toolUseId,
            state: card.dataset.state,
            name: card.querySelector('.tool-name').textContent,
            input: JSON.parse(card.querySelector('.tool-input').textContent),
            result: card.querySelector('.tool-result').textContent,
            isError: card.querySelector('.tool-result').classList.contains('is-error'),
        }))""",
    )
    assert cards == [
        {
            "id": step.tool_use_id,
            "state": "error" if step.is_error else "done",
            "name": step.name,
            "input": dict(step.arguments),
            "result": step.result,
            "isError": step.is_error,
        }
        for step in script.tools
    ]
    assert await page.get_attribute("#status", "data-stop-reason") == "end_turn"
    events = await server_events(base, state["streamId"])
    assert check(events) == []
    assert reassemble_events(events).text == script.text
    # Every event applied exactly once, however many connections it took.
    assert state["events"] == len(events)
    assert state["lastEventId"] == events[-1].id
    return state


async def test_the_page_resumes_after_a_drop_and_a_reload_without_repeating_text(
    base: str, tmp_path: Path
) -> None:
    script = scenario_script(DELTAS)
    async with browser_page(base) as page:
        requests: list[str] = []
        page.on("request", lambda request: requests.append(request.url))
        await start_turn(page, transport="sse")
        await wait_for_answer(page, 20)
        await page.click("#drop")
        assert await page.get_attribute("#status", "data-state") == "dropped"
        await wait_until_streaming(page)
        await wait_for_answer(page, 120)
        await page.reload()
        await wait_until_done(page)
        state = await assert_rendered(page, base, script)
        resumed = [url for url in requests if "last_event_id=" in url]
        assert len(resumed) >= 2, requests  # after the drop, and after the reload
        assert state["connections"] >= 3
        # Reloading a finished turn shows it again, without connecting.
        await page.reload()
        await page.wait_for_function(
            "document.getElementById('status').dataset.state === 'done'", timeout=WAIT_MS
        )
        assert await page.text_content("#answer") == script.final_text
        assert await page.input_value("#deltas") == str(DELTAS)  # the form is restored too

        # The screenshot: a turn with the default answer, unpaced.
        await page.fill("#deltas", str(DEFAULT_DELTAS))
        await page.fill("#delay", "0")
        await page.click("#start")
        await page.wait_for_function(
            """(previous) => window.demoState.streamId !== previous
                && document.getElementById('status').dataset.state === 'done'""",
            arg=state["streamId"],
            timeout=WAIT_MS,
        )
        await assert_rendered(page, base, scenario_script())
        shot = tmp_path / "demo.png"
        await page.screenshot(path=str(shot), full_page=True)
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(data) < MAX_SCREENSHOT, len(data)
    keep = os.environ.get("ESSESSEY_DEMO_SCREENSHOT")
    if keep:
        shutil.copyfile(shot, keep)


async def test_the_websocket_transport_resumes_and_switches_to_sse_mid_turn(
    base: str,
) -> None:
    script = scenario_script(DELTAS)
    async with browser_page(base) as page:
        requests: list[str] = []
        page.on("websocket", lambda socket: requests.append(socket.url))
        page.on("request", lambda request: requests.append(request.url))
        await start_turn(page, transport="ws")
        await wait_for_answer(page, 20)
        await page.click("#drop")
        await wait_until_streaming(page)
        await wait_for_answer(page, 100)
        await page.select_option("#transport", "sse")  # mid-turn: resumes over SSE
        await wait_until_done(page)
        state = await assert_rendered(page, base, script)
        assert state["transport"] == "sse"
        assert any("/ws?last_event_id=" in url for url in requests), requests
        assert any("/ws?" in url and "last_event_id" not in url for url in requests)
        switched = [u for u in requests if "/ws" not in u and "last_event_id=" in u]
        assert switched, requests
        assert state["connections"] >= 3


async def test_a_failed_tool_is_shown_as_an_error(base: str) -> None:
    script = scenario_script(DELTAS, "tool_error")
    async with browser_page(base) as page:
        await page.fill("#delay", "0")
        await page.select_option("#scenario", "tool_error")
        await page.fill("#deltas", str(DELTAS))
        await page.click("#start")
        await wait_until_done(page)
        await assert_rendered(page, base, script)
        failed = page.locator(
            f'.tool-card[data-tool-use-id="{script.tools[1].tool_use_id}"] .tool-result'
        )
        assert await failed.get_attribute("class") == "tool-result is-error"


async def test_the_dialect_links_open_the_turn_in_each_dialect(base: str) -> None:
    async with browser_page(base) as page:
        await page.fill("#delay", "0")
        await page.fill("#deltas", str(DELTAS))
        await page.click("#start")
        await wait_until_done(page)
        stream_id = await page.evaluate("window.demoState.streamId")
        # Each link, fetched by the page itself: the same turn, to its dialect's end.
        ends = await page.evaluate(
            """async () => {
                const out = {};
                for (const link of document.querySelectorAll("#dialects a")) {
                    const body = await (await fetch(link.href)).text();
                    out[link.dataset.dialect] = [new URL(link.href).pathname,
                                                 body.trim().split("\\n\\n").pop()];
                }
                return out;
            }"""
        )
    assert ends["sse"][0] == f"/streams/{stream_id}"
    assert "message_stop" in ends["sse"][1]
    assert ends["ui"][1].endswith("\ndata: [DONE]")  # after its id line
    assert '"RUN_FINISHED"' in ends["agui"][1]
    assert ends["chat-completions"][1].endswith("\ndata: [DONE]")
    assert "response.completed" in ends["responses"][1]
    for dialect in ("ui", "agui", "chat-completions", "responses"):
        assert ends[dialect][0] == f"/streams/{stream_id}/as/{dialect}"


# -- a turn that asks ----------------------------------------------------------------------


async def wait_for_state(page: Any, state: str) -> None:
    await page.wait_for_function(
        f"document.getElementById('status').dataset.state === {state!r}", timeout=WAIT_MS
    )


@pytest.mark.parametrize("transport", ["sse", "ws"])
async def test_approve_one_call_deny_the_other_and_reload_while_waiting(
    base: str, transport: str
) -> None:
    async with browser_page(base) as page:
        await start_turn(page, transport=transport, scenario="approval")
        await wait_for_state(page, "waiting")
        cards = page.locator(".request-card[data-kind=approval]")
        assert await cards.count() == 2
        assert "get_weather" in (await cards.nth(0).text_content() or "")
        # A reload while the turn waits shows the question again, buttons and all.
        await page.reload()
        await wait_for_state(page, "waiting")
        assert await page.locator(".request-card[data-state=pending] button.approve").count() == 2
        await page.locator(".request-card button.approve").first.click()
        await page.locator(".request-card button.deny").last.click()
        await wait_until_done(page)
        states = await page.eval_on_selector_all(
            ".request-card", "cards => cards.map(c => c.dataset.state)"
        )
        assert states == ["approved", "denied"]
        tools = await page.eval_on_selector_all(
            ".tool-card", "cards => cards.map(c => c.dataset.state)"
        )
        assert tools == ["done", "denied"]
        answer = await page.text_content("#answer")
        assert answer is not None
        assert "Paris has light rain at 18 °C." in answer
        assert "You declined the lookup for Tokyo" in answer
        state: dict[str, Any] = await page.evaluate("window.demoState")
    events = await server_events(base, state["streamId"])  # both messages, the turn over
    assert check(events) == []
    assert state["lastEventId"] == events[-1].id
    assert state["events"] == len(events)  # every event applied once, over the reload
    assert len(reassemble_events(events).messages) == 2


async def test_the_client_tool_is_answered_from_the_page(base: str) -> None:
    async with browser_page(base) as page:
        await start_turn(page, transport="sse", scenario="client_tool")
        await wait_for_state(page, "waiting")
        await page.click(".request-card[data-kind=client_tool] button.share-location")
        await wait_until_done(page)
        answer = await page.text_content("#answer")
    assert answer == "You are in Tokyo. Tokyo has clear skies at 24 °C."
