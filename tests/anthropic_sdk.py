"""The Anthropic SDK's own reading of a stream, for tests that hold the events already.

The SDK's public way to read a stream is ``client.messages.stream(...)`` over HTTP
(tests/test_sse_anthropic_sdk.py and tests/test_demo.py use it). For events already in
hand, the only way is what its ``MessageStream`` runs on each event inside:
``accumulate_event`` and ``build_events`` (``anthropic.lib.streaming._messages``) and
``construct_type_unchecked`` (``anthropic._models``), private names of the SDK. They are
imported here and nowhere else, when a test first asks for them, so a test module that
uses them still collects without the SDK; and
``tests/test_sse_anthropic_sdk.py::test_the_sdk_internals_the_tests_read_with_are_there``
fails, naming what moved, when a release of the SDK moves them.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

import orjson

from essessey import Event

INTERNALS = {
    "accumulate_event": "anthropic.lib.streaming._messages",
    "build_events": "anthropic.lib.streaming._messages",
    "construct_type_unchecked": "anthropic._models",
}


@functools.cache
def internals() -> SimpleNamespace:
    """The SDK functions above, by name (ImportError or AttributeError if one moved)."""
    return SimpleNamespace(
        **{
            name: getattr(importlib.import_module(module), name)
            for name, module in INTERNALS.items()
        }
    )


def _typed(payload: Any) -> Any:
    from anthropic.types import RawMessageStreamEvent

    if not isinstance(payload, dict):
        return payload  # an SDK event object already
    return internals().construct_type_unchecked(type_=RawMessageStreamEvent, value=payload)


def stream_events(items: Iterable[Any], *, recording: bool = False) -> tuple[Any, list[Any]]:
    """What the SDK's ``MessageStream`` makes of these events (essessey Events, their
    payloads as dicts, or SDK event objects): the message it accumulates, and the events
    it yields. Pings are skipped, as the SDK's stream skips them; with ``recording``, a
    ping or error payload is yielded as it is, where it came, as a recording of the
    stream's events would hold it beside the SDK's own."""
    sdk = internals()
    snapshot: Any = None
    json_bufs: dict[int, bytes] = {}
    yielded: list[Any] = []
    for item in items:
        payload = orjson.loads(item.data) if isinstance(item, Event) else item
        if isinstance(payload, dict) and payload.get("type") in ("ping", "error"):
            if recording:
                yielded.append(payload)
                continue
            if payload["type"] == "ping":
                continue
        snapshot = sdk.accumulate_event(
            event=payload, current_snapshot=snapshot, json_bufs=json_bufs
        )
        yielded.extend(sdk.build_events(event=_typed(payload), message_snapshot=snapshot))
    return snapshot, yielded


def read_message(items: Iterable[Any]) -> Any:
    """The message the SDK's ``MessageStream`` accumulates from these events."""
    message, _ = stream_events(items)
    return message
