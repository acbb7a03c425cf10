"""Serve an OpenAI-compatible model's stream as essessey SSE; a scripted model included.

Run it with ``python examples/openai_proxy.py [--port 8000] [--upstream URL] [--model
NAME] [--no-tools]`` (``essessey[server,client]`` is all it needs). Then::

    curl -N 'localhost:8000/turn?prompt=Weather+in+Paris%3F'
    curl -N 'localhost:8000/turn?prompt=Hello&dialect=anthropic'

One server, two parts:

- ``POST /v1/chat/completions`` is a scripted OpenAI-compatible model, streaming only:
  ``text/event-stream`` with one ``data: {chunk}`` per ``ChatCompletionChunk``, then
  ``data: [DONE]``. It reasons (``reasoning_content``, as DeepSeek and vLLM send it),
  says a sentence, calls the ``search`` tool when the request offers it (the arguments
  in fragments) and finishes with ``finish_reason`` ``tool_calls`` (``stop`` without
  tools), then sends a usage chunk when ``stream_options.include_usage`` asks for one.
  It is the default upstream, so the proxy works with nothing else running.
- ``GET /turn?prompt=...`` is the proxy: it asks the upstream for a streamed completion
  of the prompt and publishes the chunks as one message with
  ``essessey.adapters.openai.publish`` in an ``EventStreamResponse``, in the essessey
  dialect (``&dialect=anthropic`` for Anthropic SDKs). A client that leaves cancels the
  turn, which closes the upstream request, so the model stops too.

``--upstream`` points the proxy at a real OpenAI-compatible server, ``--model`` names
the model to ask for, and ``OPENAI_API_KEY`` (when set) is sent as the bearer token::

    python examples/openai_proxy.py --upstream http://localhost:11434/v1 --model qwen3  # Ollama
    python examples/openai_proxy.py --upstream http://localhost:8001/v1 --model NAME    # vLLM

The proxy offers the model one tool (``search``) and never runs it: a call ends the
message with stop reason ``tool_use`` (examples/fastapi_app.py runs an agent's tools).
``--no-tools`` leaves it out, for models that refuse requests with tools.

Why the upstream is read with httpx and ``SSEDecoder`` rather than the ``openai`` SDK:
the example then runs with ``essessey[server,client]`` alone, the code shows what
travels on the wire (one JSON chunk per ``data:`` line, ``[DONE]`` at the end), and
every upstream failure is told apart and mapped by status below. The adapter takes the
SDK's stream just as well, when the SDK is a dependency of the app anyway::

    client = openai.AsyncOpenAI(base_url=upstream, api_key=...)
    chunks = await client.chat.completions.create(model=..., messages=..., stream=True)
    await openai_adapter.publish(publisher, chunks, message_id=..., stream_id=...)

Errors. Until the upstream's first chunk has arrived nothing has been sent, so a failure
is an HTTP error with a JSON body in the Anthropic shape (``{"type": "error", "error":
{"type": ..., "message": ...}}``), which ``essessey.bindings.sse.connect`` raises as a
``StreamHTTPError``:

==========================================================  ======  ====================
case                                                        status  ``error.type``
==========================================================  ======  ====================
no ``prompt``, or an unknown ``dialect``                    400     invalid_request_error
the upstream answers 429                                    429     rate_limit_error
the upstream answers 503 or 529                             503     overloaded_error
the upstream is unreachable, answers another non-2xx        502     api_error
status, answers something else than an event stream, or
fails before its first chunk
==========================================================  ======  ====================

Once the first chunk is out the status is 200, and a failure (an ``{"error": ...}``
chunk, a dropped connection, a stream that ends without ``[DONE]``) ends the stream with
an ``error`` event (``api_error``). The upstream's own error text is logged by status and
kind only, and never passed on.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, asynccontextmanager
from typing import Any, NamedTuple

import httpx
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

import essessey
from essessey.adapters import openai as openai_adapter
from essessey.bindings.sse import EventStreamResponse, SSEDecoder, format_message

logger = logging.getLogger("openai_proxy")

PAUSE = 0.02
"""Seconds between the scripted model's chunks, so it streams like a model. Tests set
it to 0."""

DEFAULT_MODEL = "scripted-model"

MAX_PROMPT = 10_000
"""The longest prompt, in characters, the proxy passes on."""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    }
]

# -- the scripted upstream: POST /v1/chat/completions ------------------------------------


def _pieces(text: str, size: int) -> list[str]:
    return [text[n : n + size] for n in range(0, len(text), size)]


def scripted_chunks(
    prompt: str, *, model: str, tools: bool, include_usage: bool
) -> list[dict[str, Any]]:
    """A whole streamed response to ``prompt``, as ``ChatCompletionChunk`` dicts."""
    head: dict[str, Any] = {
        "id": f"chatcmpl-{secrets.token_hex(12)}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": "fp_scripted",
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {**head, "choices": [choice], **({"usage": None} if include_usage else {})}

    reasoning = f"The user asks: {prompt!r}. " + (
        "A search will answer that." if tools else "There is no tool to look it up."
    )
    text = "Let me search for that." if tools else "I cannot look that up without a tool."
    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"reasoning_content": piece}) for piece in _pieces(reasoning, 16)]
    chunks += [chunk({"content": piece}) for piece in _pieces(text, 8)]
    if tools:
        arguments = orjson.dumps({"query": prompt}).decode()
        call = {
            "index": 0,
            "id": f"call_{secrets.token_hex(8)}",
            "type": "function",
            "function": {"name": "search", "arguments": ""},
        }
        chunks.append(chunk({"tool_calls": [call]}))
        chunks += [
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
            for piece in _pieces(arguments, 10)
        ]
    chunks.append(chunk({}, "tool_calls" if tools else "stop"))
    if include_usage:
        reasoning_tokens = len(reasoning.split())
        completion_tokens = reasoning_tokens + len(text.split()) + (8 if tools else 0)
        prompt_tokens = 20 + len(prompt.split())
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
        }
        chunks.append({**head, "choices": [], "usage": usage})
    return chunks


def _openai_error(status: int, message: str) -> JSONResponse:
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": None}
    return JSONResponse({"error": error}, status_code=status)


def _last_user_text(messages: list[Any]) -> str | None:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):  # content parts: keep the text ones
                return "".join(
                    part.get("text", "")
                    for part in content
                    if isinstance(part, dict) and part.get("type") == "text"
                )
    return None


async def chat_completions(request: Request) -> Response:
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        return _openai_error(400, "the body is not JSON")
    if not isinstance(body, dict):
        return _openai_error(400, "the body is not a JSON object")
    messages = body.get("messages")
    prompt = _last_user_text(messages) if isinstance(messages, list) else None
    if prompt is None:
        return _openai_error(400, "messages must hold a user message")
    if body.get("stream") is not True:
        return _openai_error(400, "this scripted model only streams: set stream to true")
    model = body.get("model")
    options = body.get("stream_options")
    chunks = scripted_chunks(
        prompt,
        model=model if isinstance(model, str) and model else DEFAULT_MODEL,
        tools=any(
            isinstance(tool, dict) and tool.get("function", {}).get("name") == "search"
            for tool in body.get("tools") or ()
        ),
        include_usage=isinstance(options, dict) and options.get("include_usage") is True,
    )

    async def stream() -> AsyncIterator[bytes]:
        for chunk in chunks:
            await asyncio.sleep(PAUSE)
            yield format_message(data=orjson.dumps(chunk).decode())
        yield format_message(data="[DONE]")

    return StreamingResponse(
        stream(), media_type="text/event-stream", headers={"cache-control": "no-cache"}
    )


# -- the proxy: GET /turn ----------------------------------------------------------------


class UpstreamError(Exception):
    """The upstream's stream failed: an error chunk, or an end without ``[DONE]``."""


async def read_chunks(response: httpx.Response) -> AsyncGenerator[Any, None]:
    """The chunks of a chat-completions stream: each ``data:`` line's JSON, until
    ``[DONE]``."""
    decoder = SSEDecoder()
    async for piece in response.aiter_bytes():
        for message in decoder.feed(piece):
            if message.data == "[DONE]":
                return
            try:
                chunk = orjson.loads(message.data)
            except orjson.JSONDecodeError:
                logger.warning("skipping a chunk that is not JSON (%d bytes)", len(message.data))
                continue
            if isinstance(chunk, dict) and "error" in chunk:
                # Some servers report a failure in the stream, as a chunk of its own.
                raise UpstreamError("the upstream sent an error chunk")
            yield chunk
    raise UpstreamError("the upstream stream ended before [DONE]")


async def _prepend(first: Any, rest: AsyncIterator[Any]) -> AsyncGenerator[Any, None]:
    yield first
    async for chunk in rest:
        yield chunk


def _rejection(response: httpx.Response) -> essessey.StreamRejected | None:
    """Why the upstream's answer cannot be streamed, as the HTTP error to answer with."""
    status = response.status_code
    if status == 429:
        return essessey.StreamRejected(429, "rate_limit_error", "the upstream is rate limited")
    if status in (503, 529):
        return essessey.StreamRejected(503, "overloaded_error", "the upstream is overloaded")
    if not 200 <= status < 300:
        return essessey.StreamRejected(502, "api_error", f"the upstream answered HTTP {status}")
    if not response.headers.get("content-type", "").startswith("text/event-stream"):
        return essessey.StreamRejected(
            502, "api_error", "the upstream did not answer with an event stream"
        )
    return None


class Settings(NamedTuple):
    upstream: str | None  # None: this server's own scripted model
    model: str
    tools: bool
    api_key: str | None


def proxy_turn(
    http: httpx.AsyncClient, upstream: str, settings: Settings, prompt: str, stream_id: str
) -> essessey.TurnProducer:
    async def produce(publisher: essessey.Publisher) -> None:
        body: dict[str, Any] = {
            "model": settings.model,
            "messages": [{"role": "user", "content": prompt}],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if settings.tools:
            body["tools"] = TOOLS
        headers = {"authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
        request = http.build_request(
            "POST", f"{upstream}/chat/completions", json=body, headers=headers
        )
        try:
            response = await http.send(request, stream=True)
        except httpx.HTTPError as exc:
            logger.warning("the upstream is unreachable: %s", type(exc).__name__)
            raise essessey.StreamRejected(502, "api_error", "the upstream is unreachable") from exc
        try:
            rejection = _rejection(response)
            if rejection is not None:
                logger.warning("the upstream answered HTTP %d", response.status_code)
                raise rejection
            async with aclosing(read_chunks(response)) as chunks:
                # Nothing has gone out yet: a failure before the first chunk can still be
                # an HTTP error. publish() opens the message on the first chunk.
                try:
                    first = await anext(chunks)
                except (StopAsyncIteration, UpstreamError, httpx.HTTPError) as exc:
                    logger.warning("the upstream failed before its first chunk: %r", exc)
                    raise essessey.StreamRejected(
                        502, "api_error", "the upstream failed before its first chunk"
                    ) from exc
                async with aclosing(_prepend(first, chunks)) as all_chunks:
                    await openai_adapter.publish(
                        publisher, all_chunks, message_id=f"msg_{stream_id}", stream_id=stream_id
                    )
        finally:
            await response.aclose()

    return produce


def _error(status: int, message: str) -> JSONResponse:
    error = {"type": "invalid_request_error", "message": message}
    return JSONResponse({"type": "error", "error": error}, status_code=status)


async def turn(request: Request) -> Response:
    prompt = request.query_params.get("prompt", "")
    if not prompt.strip() or len(prompt) > MAX_PROMPT:
        return _error(400, f"prompt must hold 1 to {MAX_PROMPT} characters")
    dialect = request.query_params.get("dialect", "essessey")
    if dialect not in ("essessey", "anthropic"):
        return _error(400, "dialect must be essessey or anthropic")
    settings: Settings = request.app.state.settings
    # By default the upstream is this very server, at the address the request came in on.
    upstream = settings.upstream or str(request.base_url).rstrip("/") + "/v1"
    stream_id = f"turn_{secrets.token_hex(8)}"
    producer = proxy_turn(request.app.state.http, upstream, settings, prompt, stream_id)
    return EventStreamResponse(
        producer, dialect="anthropic" if dialect == "anthropic" else "essessey"
    )


def create_app(
    upstream: str | None = None,
    model: str = DEFAULT_MODEL,
    *,
    tools: bool = True,
    api_key: str | None = None,
) -> Starlette:
    """The app; ``upstream`` is the base URL of an OpenAI-compatible API (``.../v1``),
    None for the scripted model this app serves itself."""
    settings = Settings(
        upstream=upstream.rstrip("/") if upstream else None,
        model=model,
        tools=tools,
        api_key=api_key if api_key is not None else os.environ.get("OPENAI_API_KEY"),
    )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # One client (and connection pool) for every request to the upstream. A model
        # may think a while before its first token: a generous read timeout.
        async with httpx.AsyncClient(timeout=httpx.Timeout(120.0, connect=5.0)) as http:
            app.state.http = http
            yield

    app = Starlette(
        routes=[
            Route("/turn", turn, methods=["GET"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        ],
        lifespan=lifespan,
    )
    app.state.settings = settings
    return app


app = create_app()


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(
        description="Serve an OpenAI-compatible model's stream as essessey SSE at GET /turn."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--upstream",
        help="base URL of an OpenAI-compatible API, e.g. http://localhost:11434/v1 "
        "(default: this server's scripted model)",
    )
    parser.add_argument("--model", default=DEFAULT_MODEL, help="the model to ask the upstream for")
    parser.add_argument("--no-tools", action="store_true", help="offer the model no tool")
    args = parser.parse_args()
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    uvicorn.run(
        create_app(args.upstream, args.model, tools=not args.no_tools),
        host=args.host,
        port=args.port,
    )


if __name__ == "__main__":
    main()
