"""A fake OpenAI server for the framework benchmarks' ``wire`` model: the framework talks to
it with the official client over HTTP, as an app talks to its provider, and the server runs
in a process of its own, so its CPU is not in the benchmark's ``time.process_time()``.

It answers two streamed requests, from a script of responses in a JSON file:

- ``POST /v1/responses``: the Responses API's SSE stream (``event: <type>`` and
  ``data: <json>`` per event), from ``{"responses": [[event, ...], ...]}``;
- ``POST /v1/chat/completions``: Chat Completions chunks (``data: <json>``, then
  ``data: [DONE]``), from ``{"chat": [{"chunks": [...], "usage": chunk}, ...]}``, the
  usage chunk sent last when the request's ``stream_options.include_usage`` asks for it.

Which response it streams is read from the request, not counted: the number of tool
results the request already holds (``function_call_output`` items of a Responses input,
messages of role ``tool`` in a chat), capped at the last response. Each event goes out in a
write of its own, as a provider sends them.

Run by the benchmarks as ``python benchmarks/_model_server.py --serve --port N --script
PATH`` (:func:`model_server` does it); it stops when its stdin closes (``_server.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _server import ServerProcess, run_until_stdin_closes

STARTUP_TIMEOUT = 30.0
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


def chat_script(rounds: int, deltas: int) -> dict[str, Any]:
    """A script of ``rounds`` Chat Completions calls, as a provider streams them: each
    ``deltas`` text chunks (``word0 ``, ``word1 ``, ...), every call but the last then a
    ``lookup`` tool call (id ``call_<n>``, its arguments ``{"q": "n<n>"}`` in three
    fragments), the finish reason in a chunk of its own, then the usage chunk. The
    framework benchmarks' turn (bench_langgraph.py, bench_pydantic_ai.py) on the wire."""

    def call(n: int) -> dict[str, Any]:
        base = {"id": f"chatcmpl-{n}", "object": "chat.completion.chunk", "created": 0}
        base["model"] = "gpt-bench"

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {**base, "choices": [choice]}

        chunks = [chunk({"role": "assistant", "content": "word0 "})]
        chunks += [chunk({"content": f"word{i} "}) for i in range(1, deltas)]
        if n < rounds - 1:
            function = {"name": "lookup", "arguments": '{"q": '}
            first = {"index": 0, "id": f"call_{n}", "type": "function", "function": function}
            chunks.append(chunk({"tool_calls": [first]}))
            for args in (f'"n{n}"', "}"):
                rest = {"index": 0, "function": {"arguments": args}}
                chunks.append(chunk({"tool_calls": [rest]}))
        chunks.append(chunk({}, "tool_calls" if n < rounds - 1 else "stop"))
        usage = {"prompt_tokens": 100, "completion_tokens": deltas, "total_tokens": 100 + deltas}
        return {"chunks": chunks, "usage": {**base, "choices": [], "usage": usage}}

    return {"chat": [call(n) for n in range(rounds)]}


def sse(event: dict[str, Any], *, named: bool) -> bytes:
    """One SSE message: ``data: <json>``, under ``event: <type>`` if ``named``."""
    data = f"data: {json.dumps(event, separators=(',', ':'))}\n\n"
    return (f"event: {event['type']}\n{data}" if named else data).encode()


def make_app(script: dict[str, Any]) -> Any:
    """The ASGI app that streams ``script``'s responses."""
    responses = [[sse(e, named=True) for e in events] for events in script.get("responses", [])]
    chats = [
        ([sse(c, named=False) for c in call["chunks"]], sse(call["usage"], named=False))
        for call in script.get("chat", [])
    ]

    def responses_stream(request: dict[str, Any]) -> list[bytes]:
        items = request.get("input")
        done = sum(
            isinstance(item, dict) and item.get("type") == "function_call_output"
            for item in (items if isinstance(items, list) else [])
        )
        return responses[min(done, len(responses) - 1)]

    def chat_stream(request: dict[str, Any]) -> list[bytes]:
        done = sum(m.get("role") == "tool" for m in request.get("messages", []))
        chunks, usage = chats[min(done, len(chats) - 1)]
        if (request.get("stream_options") or {}).get("include_usage"):
            return [*chunks, usage, b"data: [DONE]\n\n"]
        return [*chunks, b"data: [DONE]\n\n"]

    routes: dict[str, Any] = {
        "/v1/responses": (responses, responses_stream),
        "/v1/chat/completions": (chats, chat_stream),
    }

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        scripted, stream = routes.get(scope["path"], ([], None))
        if scope["method"] != "POST" or not scripted:
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b"no such scripted route"})
            return
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        for chunk in stream(json.loads(body)):
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return app


@contextmanager
def model_server(script: dict[str, Any]) -> Iterator[str]:
    """The server on ``script`` in a process of its own, for the block; its base URL
    (``http://127.0.0.1:<port>/v1``)."""
    fd, path = tempfile.mkstemp(prefix="model_script_", suffix=".json")
    try:
        with os.fdopen(fd, "w") as file:
            json.dump(script, file)
        server = ServerProcess(__file__, ["--script", path], startup_timeout=STARTUP_TIMEOUT)
        try:
            server.wait_until_ready()
            yield f"{server.http_url}/v1"
        finally:
            server.stop()
    finally:
        os.unlink(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", action="store_true", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--script", required=True, help="the responses, as JSON")
    args = parser.parse_args()
    script = json.loads(Path(args.script).read_text())
    return run_until_stdin_closes(make_app(script), args.port, lifespan="off")


if __name__ == "__main__":
    sys.exit(main())
