"""The turn every benchmark publishes: a preamble, one text block of chunks, an epilogue.

Built the same way everywhere, so the rivals of each benchmark, and the benchmarks
themselves, stream the same events.
"""

from __future__ import annotations

import asyncio

import essessey


def make_chunks(deltas: int) -> list[str]:
    """``deltas`` text chunks of about 20 characters: what a model streams per token
    batch. Built before timing, so no variant pays for making its input."""
    return [f"chunk {i:06d} of text " for i in range(deltas)]


async def publish_turn(
    publisher: essessey.Publisher,
    chunks: list[str],
    gate: asyncio.Event | None = None,
    *,
    batched: bool = False,
) -> None:
    """``message_start``, ``ping``, a text block of the chunks, ``message_delta`` and
    ``message_stop``; when ``gate`` is given, the rest waits for it after the ping. With
    ``batched`` the chunks go out in one ``send_content_block_deltas_text`` call (the
    path for many events ready at once): the same events."""
    await publisher.send_stream_preamble("msg_bench", "stream_bench", "bench-model")
    if gate is not None:
        await gate.wait()
    await publisher.send_content_block_start_text(0)
    if batched:
        await publisher.send_content_block_deltas_text(0, chunks)
    else:
        send_delta = publisher.send_content_block_delta_text
        for chunk in chunks:
            await send_delta(0, chunk)
    await publisher.send_content_block_stop(0)
    await publisher.send_stream_epilogue(essessey.StopReason.END_TURN, len(chunks))


async def recorded_turn(chunks: list[str]) -> list[essessey.Event]:
    """The turn's events as the Publisher builds them, for rivals that send (or encode)
    exactly those bytes, so every variant streams the same events."""
    sink = essessey.InMemorySink()
    await publish_turn(essessey.Publisher(sink), chunks)
    return sink.events
