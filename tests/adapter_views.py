"""Views of a published stream that the adapter tests read their asserts from."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from essessey import Event


def payloads(events: list[Event]) -> list[dict[str, Any]]:
    """Each event's payload, parsed."""
    return [orjson.loads(event.data) for event in events]


def blocks(events: list[Event]) -> list[tuple[str, int, str]]:
    """(event, index, block type) of every content block event, to read the layout."""
    types: dict[int, str] = {}
    found = []
    for event in events:
        if event.event.startswith("content_block_"):
            payload = orjson.loads(event.data)
            if event.event == "content_block_start":
                types[payload["index"]] = payload["content_block"]["type"]
            found.append((event.event, payload["index"], types[payload["index"]]))
    return found


def starts(events: list[Event]) -> list[tuple[int, str]]:
    """(index, block type) of each block start, in order."""
    return [(index, kind) for name, index, kind in blocks(events) if name.endswith("start")]


def log_text(caplog: pytest.LogCaptureFixture) -> str:
    """Every captured log message, one per line (to look for content that leaked)."""
    return "\n".join(record.getMessage() for record in caplog.records)
