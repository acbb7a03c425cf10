"""Coverage-guided fuzzing of the SSE decoder with atheris (libFuzzer).

Run: ``python fuzz/fuzz_sse_decoder.py -max_total_time=60`` (see fuzz/README.md).

Each input is split into a header (the decoder's limits, the chunk sizes) and a body,
the stream's bytes. The body is decoded whole and in the chunks the header gives; the
property is the decoder's contract: only ``SSEDecodeError`` (a limit) may be raised, both
decodings hit a limit or neither does, and when neither does they produce the same
messages, last event id and retry. Anything else raises, and libFuzzer saves the input.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    from essessey.bindings.sse import SSEDecoder
    from essessey.errors import SSEDecodeError


def decode(chunks: list[bytes], limits: dict[str, int]) -> tuple[object, ...] | None:
    decoder = SSEDecoder(**limits)
    messages = []
    try:
        for chunk in chunks:
            messages.extend(decoder.feed(chunk))
    except SSEDecodeError:
        return None
    messages.extend(decoder.close())
    return messages, decoder.last_event_id, decoder.retry


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    limits: dict[str, int] = {}
    if fdp.ConsumeBool():
        limits = {
            "max_line_length": fdp.ConsumeIntInRange(1, 128),
            "max_event_size": fdp.ConsumeIntInRange(1, 128),
        }
    sizes = [fdp.ConsumeIntInRange(0, 16) for _ in range(fdp.ConsumeIntInRange(0, 16))]
    body = fdp.ConsumeBytes(fdp.remaining_bytes())
    chunks: list[bytes] = []
    at = 0
    for size in sizes:
        chunks.append(body[at : at + size])
        at += size
    chunks.append(body[at:])
    whole = decode([body], limits)
    split = decode(chunks, limits)
    if whole != split:
        raise AssertionError(f"chunking changed the outcome: {whole!r} != {split!r}")


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
