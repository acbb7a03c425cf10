"""Smoke tests of the examples: each one runs as documented and streams a valid turn."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import httpx
import pytest

import essessey
from essessey.bindings.sse import SSEDecoder
from tests.servers import serve

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load_example(name: str) -> ModuleType:
    # examples/ is not a package: load the file the way `python examples/<name>` would
    # see it, without running its __main__ block.
    path = EXAMPLES / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quickstart_prints_a_valid_turn() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.startswith("event: message_start\ndata: ")
    assert "event: content_block_delta\n" in result.stdout
    assert result.stdout.rstrip().endswith("0 protocol violations")


@pytest.mark.anyio
async def test_fastapi_example_streams_a_valid_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    example = load_example("fastapi_sse")
    # The pacing is for people watching, not for tests.
    monkeypatch.setattr(example, "PAUSE", 0)

    with serve(example.app) as base_url:
        async with (
            httpx.AsyncClient(base_url=base_url, timeout=30) as client,
            client.stream("GET", "/turn") as response,
        ):
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            decoder = SSEDecoder()
            messages = []
            async for chunk in response.aiter_bytes():
                messages.extend(decoder.feed(chunk))
            messages.extend(decoder.close())

    events = [essessey.Event(m.event, m.data.encode()) for m in messages]
    assert essessey.check(events) == []
    names = [event.event for event in events]
    assert names[0] == "message_start"
    assert names[-1] == "message_stop"

    blocks = [e.json()["content_block"]["type"] for e in events if e.event == "content_block_start"]
    assert blocks == ["thinking", "text", "tool_use", "tool_result"]

    parsed = essessey.reassemble_events(events)
    assert parsed.complete
    assert parsed.thinking == "The user asks about the weather; I should call the tool."
    assert parsed.text == "Let me check the weather in Paris."
    assert [(call.name, call.params) for call in parsed.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert [result.text for result in parsed.tool_results] == ['{"temp_c": 18, "sky": "clear"}']
    assert parsed.stop_reason == "tool_use"
