"""A FastAPI chat backend: start an agent turn, then read it over SSE or a WebSocket.

Run it with ``python examples/fastapi_app.py [--host 127.0.0.1] [--port 8000]`` (it
needs FastAPI besides ``essessey[server]``: ``pip install fastapi``). Then::

    curl -s -X POST localhost:8000/chat -H 'content-type: application/json' \\
        -d '{"prompt": "Weather in Paris and Oslo?"}'      # {"stream_id":"chat_..."}
    curl -N localhost:8000/chat/$STREAM_ID                  # the turn, as SSE
    curl -N -H "Last-Event-ID: $ID" localhost:8000/chat/$STREAM_ID   # the rest after $ID
    curl -s -X POST localhost:8000/chat/$STREAM_ID/cancel   # {"cancelled":true}

The routes (FastAPI lists them at http://127.0.0.1:8000/docs):

- ``POST /chat`` with ``{"prompt": "..."}`` starts a turn in the hub and answers
  ``201 {"stream_id": ...}``. A body that is not that object gets a ``400`` in the
  Anthropic error shape (``{"type": "error", "error": {"type":
  "invalid_request_error", ...}}``), the shape every other error of this app has.
- ``GET /chat/{stream_id}`` serves the turn as SSE, resuming after the ``Last-Event-ID``
  header (what an ``EventSource`` sends when it reconnects) or ``?last_event_id=``.
- ``GET /chat/{stream_id}/ws`` serves it over a WebSocket, one JSON frame per event,
  resuming after ``?last_event_id=``.
- ``POST /chat/{stream_id}/cancel`` stops the turn; it ends with stop reason
  ``cancelled``. A reader that disconnects stops nothing: the turn runs in the hub.

The routes wrap the library's ``subscription_response``, ``cancel_response`` and
``websocket_subscription`` (what ``hub_routes`` and ``ws_route`` mount for Starlette) in
FastAPI routes, so they take the hub from the app's state and show up in the OpenAPI
schema. Anyone who knows a stream id may read and cancel it here; a real app passes an
``authorize`` hook to the hub (examples/resume_app.py gives every stream a token).

The turn is an agent loop over an OpenAI-format model. The model is scripted: it reads
the conversation (``messages``, in the chat-completions format) and streams
chat-completions chunks, as any OpenAI-compatible server does. First it reasons and
calls ``get_weather`` twice at once; the two calls run as async functions,
concurrently; their results go back into ``messages``, and the model answers from them.
For a real model, replace ``scripted_model(messages)`` with
``await client.chat.completions.create(model=..., messages=messages, tools=...,
stream=True)``; nothing else changes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.requests import HTTPConnection
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

import essessey
from essessey.adapters import PublishedToolCall, RoundStream, stream_rounds
from essessey.adapters import openai as openai_adapter
from essessey.bindings.sse import cancel_response, subscription_response
from essessey.bindings.ws import websocket_subscription

PAUSE = 0.03
"""Seconds between the model's chunks (and the unit of the tools' latency), so the
stream reads like a model at work. Tests set it to 0."""

MAX_ROUNDS = 4
"""Model rounds a turn may take before it stops, whatever the model asks for."""

MODEL = "scripted-model"

# -- the tools: plain async functions ----------------------------------------------------

FORECASTS = {"Paris": ("sunny", 21), "Oslo": ("snow", -3)}


async def get_weather(city: str) -> dict[str, Any]:
    """Look the city up; Paris answers slower, so the calls finish out of order."""
    await asyncio.sleep(PAUSE * (4 if city == "Paris" else 1))
    sky, celsius = FORECASTS[city]
    return {"city": city, "sky": sky, "celsius": celsius}


TOOLS: dict[str, Callable[..., Awaitable[dict[str, Any]]]] = {"get_weather": get_weather}


async def run_tool(call: PublishedToolCall) -> tuple[object, bool]:
    """Run one call; a failure (unknown tool, bad arguments) is an error result."""
    try:
        if not isinstance(call.input, dict):
            raise TypeError("the arguments are not a JSON object")
        return await TOOLS[call.name](**call.input), False
    except Exception as exc:
        return {"error": type(exc).__name__}, True


# -- the scripted model: chat-completions chunks -----------------------------------------


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion.chunk",
        "created": 1_764_460_800,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


def _tool_call(index: int, call_id: str, name: str, arguments: str) -> list[dict[str, Any]]:
    # The name first, then the arguments in fragments, as servers send them.
    head = {"index": index, "id": call_id, "type": "function", "function": {"name": name}}
    half = len(arguments) // 2
    return [
        _chunk({"tool_calls": [head]}),
        _chunk({"tool_calls": [{"index": index, "function": {"arguments": arguments[:half]}}]}),
        _chunk({"tool_calls": [{"index": index, "function": {"arguments": arguments[half:]}}]}),
    ]


def _script(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if messages[-1]["role"] == "user":
        question = messages[-1]["content"]
        return [
            _chunk({"role": "assistant", "reasoning_content": f"The user asks: {question!r}. "}),
            _chunk({"reasoning_content": "Check both cities at once."}),
            _chunk({"content": "Checking Paris "}),
            _chunk({"content": "and Oslo."}),
            *_tool_call(0, "call_paris", "get_weather", '{"city": "Paris"}'),
            *_tool_call(1, "call_oslo", "get_weather", '{"city": "Oslo"}'),
            _chunk({}, "tool_calls"),
        ]
    # The tools have answered: say what they found, a sentence at a time.
    sentences = []
    for message in messages:
        if message["role"] == "tool":
            found = json.loads(message["content"])
            if "error" in found:
                sentences.append("One lookup failed.")
            else:
                sentences.append(f"{found['city']}: {found['sky']}, {found['celsius']} °C.")
    return [
        *(_chunk({"content": (" " if n else "") + s}) for n, s in enumerate(sentences)),
        _chunk({}, "stop"),
        {**_chunk({}), "choices": [], "usage": {"prompt_tokens": 60, "completion_tokens": 25}},
    ]


async def scripted_model(messages: list[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    """Stream the model's answer to ``messages``, a chunk at a time."""
    for chunk in _script(messages):
        await asyncio.sleep(PAUSE)
        yield chunk


# -- the turn: an agent loop published as one message ------------------------------------


async def answer(rounds: RoundStream, i: int, call: PublishedToolCall) -> object:
    """Run call ``i`` and publish its result: at once if every earlier result is out,
    else when they are."""
    result, failed = await run_tool(call)
    await rounds.tool_result(i, result, is_error=failed)
    return result


def agent_turn(stream_id: str, prompt: str) -> essessey.TurnProducer:
    async def produce(publisher: essessey.Publisher) -> None:
        messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
        async with stream_rounds(
            publisher, message_id=f"msg_{stream_id}", stream_id=stream_id, model=MODEL
        ) as rounds:
            for _ in range(MAX_ROUNDS):
                await rounds.round_start()
                seen = await openai_adapter.stream_round(rounds, scripted_model(messages))
                rounds.stop_reason = seen.stop_reason
                rounds.output_tokens += seen.usage.get("output_tokens", 0)
                if not seen.tool_calls:
                    await rounds.round_end()
                    break
                messages.append(
                    {
                        "role": "assistant",
                        "content": seen.text or None,
                        "tool_calls": [
                            {
                                "id": call.id,
                                "type": "function",
                                "function": {"name": call.name, "arguments": call.arguments},
                            }
                            for call in seen.tool_calls
                        ],
                    }
                )
                # The calls run concurrently; RoundStream publishes their results in
                # call order, whatever order they finish in.
                async with asyncio.TaskGroup() as tasks:
                    running = [
                        tasks.create_task(answer(rounds, i, call))
                        for i, call in enumerate(seen.tool_calls)
                    ]
                await rounds.round_end()
                messages.extend(
                    {"role": "tool", "tool_call_id": call.id, "content": json.dumps(task.result())}
                    for call, task in zip(seen.tool_calls, running, strict=True)
                )

    return produce


# -- the app -----------------------------------------------------------------------------


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # Turns run as tasks of the hub, apart from any request. Leaving it (at shutdown)
    # lets the turns still running finish (up to shutdown_grace, 20 s), then cancels the
    # rest; each ends with stop reason "cancelled".
    async with essessey.StreamHub(essessey.InMemoryEventStore(max_age=600)) as hub:
        app.state.hub = hub
        yield


app = FastAPI(title="essessey chat", lifespan=lifespan)


def get_hub(connection: HTTPConnection) -> essessey.StreamHub:
    hub: essessey.StreamHub = connection.app.state.hub
    return hub


Hub = Annotated[essessey.StreamHub, Depends(get_hub)]


@app.exception_handler(RequestValidationError)
async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    # The first problem, by where it is ("body.prompt") and what pydantic says of it;
    # never the value sent.
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first.get("loc", ()))
    error = {"type": "invalid_request_error", "message": f"{where}: {first.get('msg')}"}
    return JSONResponse({"type": "error", "error": error}, status_code=400)


class ChatRequest(BaseModel):
    prompt: str = Field(min_length=1, max_length=10_000)


class ChatStarted(BaseModel):
    stream_id: str


@app.post("/chat", status_code=201)
async def start_chat(body: ChatRequest, hub: Hub) -> ChatStarted:
    stream_id = f"chat_{secrets.token_hex(8)}"
    await hub.start(stream_id, agent_turn(stream_id, body.prompt))
    return ChatStarted(stream_id=stream_id)


@app.get("/chat/{stream_id}")
async def read_chat(stream_id: str, request: Request, hub: Hub) -> Response:
    # Last-Event-ID (or ?last_event_id=) resumes; retry=1000 tells an EventSource to
    # reconnect a second after a drop. Errors before the first event are JSON (404, 410).
    return await subscription_response(hub, request, stream_id, retry=1000)


@app.websocket("/chat/{stream_id}/ws")
async def read_chat_ws(websocket: WebSocket, stream_id: str, hub: Hub) -> None:
    # Accepts the socket, sends a frame per event, closes with 1000 when the turn ends
    # (or with a code saying why not: see docs/websocket.md).
    await websocket_subscription(hub, websocket, stream_id)


@app.post("/chat/{stream_id}/cancel")
async def cancel_chat(stream_id: str, request: Request, hub: Hub) -> Response:
    return await cancel_response(hub, request, stream_id)


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description="Serve agent turns over SSE and WebSockets.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    uvicorn.run(app, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
