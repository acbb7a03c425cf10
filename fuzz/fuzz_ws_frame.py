"""Coverage-guided fuzzing of the WebSocket frame decoder with atheris.

Run: ``python fuzz/fuzz_ws_frame.py -max_total_time=60 -dict=fuzz/protocol.dict`` (see
fuzz/README.md).

Each input is decoded as a binary frame, and as a text frame (its bytes read as UTF-8,
invalid ones kept as lone surrogates, which a ``str`` can hold). The property is
:func:`decode_frame`'s contract: an event whose payload is JSON, or ``ValueError``;
any other exception is a finding.
"""

from __future__ import annotations

import sys

import atheris
import orjson

with atheris.instrument_imports():
    from essessey.bindings.ws import decode_frame


def test_one_input(data: bytes) -> None:
    for frame in (data, data.decode("utf-8", "surrogateescape")):
        try:
            event = decode_frame(frame, max_size=4096)
        except ValueError:
            continue
        if not (isinstance(event.event, str) and event.event):
            raise AssertionError("an event without a name")
        orjson.loads(event.data)


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
