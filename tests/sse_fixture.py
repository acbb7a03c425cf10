"""Read the tests' ``.sse`` fixture files: ``event:``/``data:`` line pairs separated by
blank lines. A stand-in for the real SSE decoder, which it does not try to be."""

from __future__ import annotations

from pathlib import Path

from essessey import Event

FIXTURES = Path(__file__).parent / "fixtures"


def parse_sse(text: str) -> list[Event]:
    """Split ``text`` into events: one per blank-line-separated frame."""
    events: list[Event] = []
    for frame in text.split("\n\n"):
        name = ""
        data: list[str] = []
        for line in frame.splitlines():
            if line.startswith("event:"):
                name = line[len("event:") :].strip()
            elif line.startswith("data:"):
                data.append(line[len("data:") :].removeprefix(" "))
        if name or data:
            events.append(Event(name, "\n".join(data).encode()))
    return events


def load_fixture(name: str) -> list[Event]:
    """The events of ``tests/fixtures/<name>``."""
    return parse_sse((FIXTURES / name).read_text(encoding="utf-8"))
