"""Publish one whole agent turn and print it as the SSE bytes a browser would receive.

Run it with ``python examples/quickstart.py``. The turn has reasoning, a short answer,
one tool call with its result, and ends with ``stop_reason="tool_use"`` (the agent would
now run another round with the result).
"""

from __future__ import annotations

import asyncio
import sys

import essessey


def sse_frame(event: essessey.Event) -> bytes:
    # A minimal framer, enough for payloads that never contain a newline (orjson output
    # never does); the SSE binding has the full codec.
    return b"event: " + event.event.encode() + b"\ndata: " + event.data + b"\n\n"


async def main() -> None:
    sink = essessey.InMemorySink()
    publisher = essessey.Publisher(sink)

    async with essessey.stream_turn(
        publisher, message_id="msg_1", stream_id="conv_1", model="some-model"
    ) as turn:
        thinking = await turn.thinking()
        await thinking.write("The user wants the weather; ")
        await thinking.write("I should call the tool.")

        # Asking the turn for the next streamer closes the current block, so the
        # indexes stay right without any bookkeeping here.
        text = await turn.text()
        await text.write("Let me check ")
        await text.write("the weather.")

        tools = await turn.tools()
        await tools.start_call("call_1", "get_weather")
        await tools.write_arguments("call_1", '{"city":')
        await tools.write_arguments("call_1", '"Paris"}')
        await tools.write_result("call_1", '{"temp_c":18}')

        turn.stop_reason = essessey.StopReason.TOOL_USE
        turn.output_tokens = 42

    events = sink.events
    for event in events:
        sys.stdout.buffer.write(sse_frame(event))
    sys.stdout.flush()

    violations = essessey.check(events)
    print(f"{len(events)} events, {len(violations)} protocol violations")


if __name__ == "__main__":
    asyncio.run(main())
