"""Clients that never loop and never see phantom events: an EventSource (Node's
``eventsource`` package and headless Chromium) stops once a finished turn has been read,
and httpx-sse reads exactly the turn's events, keep-alives and the retry hint included."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from httpx_sse import connect_sse

from essessey.demo import create_app
from tests.browser import CHROMIUM, CHROMIUM_ARGS, MISSING
from tests.processes import WAIT, node_json
from tests.servers import serve

DELTAS = 12
PING = 0.04  # the demo's keep-alive interval, in seconds: shorter than a paced turn's pause


@pytest.fixture
def demo() -> Iterator[str]:
    with serve(create_app(ping_interval=PING), lifespan="on") as url:
        yield url


def finished_turn(base: str, delay_ms: int = 0) -> tuple[str, list[tuple[str, str]]]:
    """A turn started on the demo and read to its end: its id and (event, id) pairs."""
    started = httpx.post(base + "/streams", json={"deltas": DELTAS, "delay_ms": delay_ms})
    stream_id = started.json()["stream_id"]
    with (
        httpx.Client(timeout=WAIT) as http,
        connect_sse(http, "GET", f"{base}/streams/{stream_id}") as source,
    ):
        events = [(sse.event, sse.id) for sse in source.iter_sse()]
    return stream_id, events


def test_node_eventsource_stops_after_a_finished_turn(node_client: Path, demo: str) -> None:
    stream_id, events = finished_turn(demo)
    result = node_json(node_client.parent / "eventsource.mjs", f"{demo}/streams/{stream_id}")
    # Read once, then its reconnect (with the last id) got 204 and it closed for good.
    assert (result["opens"], result["readyState"]) == (1, 2)
    assert [(e["event"], e["id"]) for e in result["events"]] == events


@pytest.mark.anyio
async def test_chromium_event_source_stops_after_a_finished_turn(demo: str) -> None:
    if MISSING:
        pytest.skip("Chromium is not installed")
    from playwright.async_api import async_playwright

    stream_id, events = finished_turn(demo)
    script = """url => new Promise(resolve => {
      const source = new EventSource(url);
      const got = []; let opens = 0;
      source.onopen = () => { opens += 1; };
      for (const name of ["message_start", "ping", "content_block_start",
          "content_block_delta", "content_block_stop", "message_delta", "message_stop"])
        source.addEventListener(name, e => got.push([e.type, e.lastEventId]));
      const started = Date.now();
      const look = () => {
        if (source.readyState === 2 || Date.now() - started > 10000)
          resolve({opens, got, readyState: source.readyState});
        else setTimeout(look, 20);
      };
      look();
    })"""
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            tab = await browser.new_page()
            await tab.goto(demo + "/", timeout=WAIT * 1000)
            result = await tab.evaluate(script, f"/streams/{stream_id}")
        finally:
            await browser.close()
    assert (result["opens"], result["readyState"]) == (1, 2)
    assert [tuple(pair) for pair in result["got"]] == events


def test_httpx_sse_sees_exactly_the_turns_events(demo: str) -> None:
    # Paced, so keep-alives (every PING s) come between the events; the retry hint is in
    # the first event's block. httpx-sse dispatches an empty event for a blank line
    # after a field-only block: there is none.
    stream_id, events = finished_turn(demo, delay_ms=60)
    names = [name for name, _ in events]
    assert names[0] == "message_start"
    assert names[-1] == "message_stop"
    assert all(name and event_id for name, event_id in events)  # no empty "message"
    assert names.count("content_block_delta") >= DELTAS
    # A resume from the middle: the rest, exactly.
    middle = events[len(events) // 2][1]
    with (
        httpx.Client(timeout=WAIT) as http,
        connect_sse(
            http, "GET", f"{demo}/streams/{stream_id}", headers={"Last-Event-ID": middle}
        ) as source,
    ):
        rest = [(sse.event, sse.id) for sse in source.iter_sse()]
    assert rest == events[len(events) // 2 + 1 :]
