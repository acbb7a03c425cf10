"""Coverage-guided fuzzing of the reassembler and the protocol checker with atheris.

Run: ``python fuzz/fuzz_reassemble.py -max_total_time=60`` (see fuzz/README.md).

Each input becomes a sequence of events: a name (mostly the protocol's) and a payload,
either raw bytes or a JSON object built from the input out of the protocol's keys and
words (random bytes alone rarely parse as JSON, so coverage would stop at the parser).
The property: :func:`essessey.check` returns a list of violations and
:class:`essessey.reassemble.Reassembler` reads every event and gives a result, whatever the input;
any exception is a finding. Log output is silenced (it costs time and says nothing
here; tests/test_fuzz.py checks what the warnings contain).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import atheris

with atheris.instrument_imports():
    import orjson

    from essessey import Event, check
    from essessey.protocol import EventType
    from essessey.reassemble import Reassembler

NAMES = [*sorted(EventType.ALL), "", "message", "custom"]
KEYS = [
    "type", "index", "content_block", "delta", "message", "usage", "error", "id", "name",
    "input", "tool_use_id", "is_error", "text", "thinking", "signature", "partial_json",
    "stop_reason", "stop_sequence", "request_id", "model", "stream_id", "output_tokens",
]  # fmt: skip
WORDS = [
    *sorted(EventType.ALL), "text", "thinking", "tool_use", "tool_result",
    "redacted_thinking", "text_delta", "thinking_delta", "signature_delta",
    "input_json_delta", "json_partial", "citations_delta", "end_turn", "toolu_1",
    "toolu_2", "", "{", '{"a":', "}", "[1,", "2]",
]  # fmt: skip
BIG = [2**63 - 1, 2**64 - 1, -(2**63), 2**53 + 1]


def value(fdp: atheris.FuzzedDataProvider, depth: int) -> Any:
    kind = fdp.ConsumeIntInRange(0, 8 if depth < 4 else 5)
    if kind == 0:
        return None
    if kind == 1:
        return fdp.ConsumeBool()
    if kind == 2:
        return fdp.ConsumeIntInRange(-2, 5)
    if kind == 3:
        return fdp.PickValueInList(BIG)
    if kind in (4, 5):
        return fdp.PickValueInList(WORDS) if kind == 4 else fdp.ConsumeUnicodeNoSurrogates(8)
    if kind == 8:
        return [value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 3))]
    return obj(fdp, depth + 1)


def obj(fdp: atheris.FuzzedDataProvider, depth: int) -> dict[str, Any]:
    return {
        fdp.PickValueInList(KEYS): value(fdp, depth) for _ in range(fdp.ConsumeIntInRange(0, 5))
    }


def events_of(data: bytes) -> list[Event]:
    fdp = atheris.FuzzedDataProvider(data)
    events = []
    for _ in range(fdp.ConsumeIntInRange(0, 24)):
        if fdp.ConsumeIntInRange(0, 15) == 0:
            name = fdp.ConsumeUnicodeNoSurrogates(8)
        else:
            name = fdp.PickValueInList(NAMES)
        if fdp.ConsumeIntInRange(0, 7) == 0:
            payload = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 2048))
        else:
            body = obj(fdp, 0)
            if fdp.ConsumeBool():
                body = {"type": name, **body}
            payload = orjson.dumps(body)
        events.append(Event(name, payload))
    return events


def test_one_input(data: bytes) -> None:
    events = events_of(data)
    found = check(events)
    if not isinstance(found, list):
        raise AssertionError("check did not return a list")
    reassembler = Reassembler()
    for event in events:
        reassembler.feed(event)
    reassembler.result()


def main() -> None:
    logging.getLogger("essessey").setLevel(logging.CRITICAL)
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
