"""One agent turn, served to every client in the format it reads: a FastAPI backend.

Run it with ``python examples/dialects_app.py [--host 127.0.0.1] [--port 8000]`` (it
needs FastAPI besides ``essessey[server]``: ``pip install fastapi``). The same producer
answers at each client's default path:

- ``POST /api/chat``: the Vercel AI SDK's ``useChat`` (the UI message stream);
- ``POST /agui``: ``@ag-ui/client``'s ``HttpAgent`` and CopilotKit (AG-UI events);
- ``POST /v1/chat/completions``: any OpenAI-compatible client, its base URL ``/v1``;
- ``POST /v1/responses``: the OpenAI Agents SDK and Codex (Responses events);
- ``GET /streams/{id}``: the protocol's own SSE (an ``EventSource``, ``essessey tail``).

Every turn runs in the hub, apart from the connection that asked for it, so each dialect
resumes a dropped stream (by ``Last-Event-ID``, and Responses by ``starting_after`` too).
For example::

    curl -sN localhost:8000/v1/chat/completions -H 'content-type: application/json' \\
        -d '{"model": "any", "messages": [{"role": "user", "content": "Hi"}], "stream": true}'

The turn here is scripted; a real app streams its model's output through the Publisher
instead (see examples/agent_loop.py and the adapters).
"""

from __future__ import annotations

import argparse

import uvicorn
from fastapi import FastAPI

from essessey import Publisher, StopReason, StreamHub, TurnProducer
from essessey.bindings.sse import hub_routes
from essessey.dialects.agui import AGUIRunRequest, agui_routes
from essessey.dialects.chat_completions import ChatCompletionRequest, chat_completions_routes
from essessey.dialects.responses import ResponsesRequest, responses_routes
from essessey.dialects.ui import ChatRequest, ui_chat_routes

ANSWER = "Hello from essessey, in whichever format you read."


def answer_on(stream_id: str) -> TurnProducer:
    """The turn's producer, on the hub stream ``stream_id``: some reasoning, then text."""

    async def produce(publisher: Publisher) -> None:
        await publisher.send_stream_preamble(f"msg_{stream_id}", stream_id, "scripted")
        await publisher.send_content_block_start_thinking(0)
        await publisher.send_content_block_delta_thinking(0, "A greeting is enough.")
        await publisher.send_content_block_stop(0)
        await publisher.send_content_block_start_text(1)
        for word in ANSWER.split(" "):
            await publisher.send_content_block_delta_text(1, word + " ")
        await publisher.send_content_block_stop(1)
        await publisher.send_stream_epilogue(StopReason.END_TURN, len(ANSWER.split(" ")))

    return produce


# Each dialect's request names the stream its turn runs on; the answer is the same.
def for_chat(chat: ChatRequest) -> TurnProducer:
    return answer_on(chat.id)


def for_completion(request: ChatCompletionRequest) -> TurnProducer:
    return answer_on(request.id)


def for_response(request: ResponsesRequest) -> TurnProducer:
    return answer_on(request.id)


def for_run(run: AGUIRunRequest) -> TurnProducer:
    return answer_on(run.id)


hub = StreamHub()
app = FastAPI(lifespan=hub.lifespan)
app.router.routes.extend(
    [
        *ui_chat_routes(hub, for_chat),
        *agui_routes(hub, for_run),
        *chat_completions_routes(hub, for_completion),
        *responses_routes(hub, for_response),
        *hub_routes(hub, "/streams"),
    ]
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    uvicorn.run(app, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
