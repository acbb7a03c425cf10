"""Stream an agent's turn from a FastAPI route as Server-Sent Events.

Run it with ``python examples/fastapi_sse.py [--port 8000]``, then watch the stream with
``curl -N http://127.0.0.1:8000/turn`` or, in a browser console,
``new EventSource("/turn").addEventListener("content_block_delta", e => console.log(e.data))``.

The turn is scripted (reasoning, a short answer, one tool call and its result); a real
app would feed the streamers from a model's output instead.
"""

from __future__ import annotations

import argparse
import asyncio

from fastapi import FastAPI

import essessey
from essessey.bindings.sse import EventStreamResponse

PAUSE = 0.05
"""Seconds between chunks, so the stream reads like a model typing."""

app = FastAPI()


async def scripted_turn(publisher: essessey.Publisher) -> None:
    async with essessey.stream_turn(
        publisher, message_id="msg_1", stream_id="conv_1", model="scripted-model"
    ) as turn:
        thinking = await turn.thinking()
        for chunk in ("The user asks about the weather; ", "I should call the tool."):
            await thinking.write(chunk)
            await asyncio.sleep(PAUSE)

        # Asking the turn for the next streamer closes the current block, so the
        # block indexes stay right without any bookkeeping here.
        text = await turn.text()
        for chunk in ("Let me check ", "the weather ", "in Paris."):
            await text.write(chunk)
            await asyncio.sleep(PAUSE)

        tools = await turn.tools()
        await tools.start_call("call_1", "get_weather")
        await tools.write_arguments("call_1", '{"city": "Paris"}')
        await asyncio.sleep(PAUSE)
        await tools.write_result("call_1", '{"temp_c": 18, "sky": "clear"}')

        turn.stop_reason = essessey.StopReason.TOOL_USE
        turn.output_tokens = 24


@app.get("/turn")
async def turn() -> EventStreamResponse:
    # The response starts the producer when the client connects and cancels it if the
    # client leaves; dialect="anthropic" would make the stream readable by Anthropic SDKs.
    return EventStreamResponse(scripted_turn)


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description="Serve a scripted turn at GET /turn.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    uvicorn.run(app, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
