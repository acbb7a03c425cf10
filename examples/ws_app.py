"""A turn over a WebSocket that survives a dropped connection and a page reload.

Run it with ``python examples/ws_app.py [--port 8000]`` and open http://127.0.0.1:8000/.
"Start a turn" asks the server for a turn and reads it over a WebSocket, one JSON frame
per event (``{"id": ..., "event": ..., "data": {...}}``). "Drop the connection" closes the
socket: the page reconnects with ``?last_event_id=`` and gets the rest, exactly once.
Reloading the page does the same, because the page keeps the text so far and the last
event id in sessionStorage. The turn runs in the hub, not in a connection, so neither
stops it. How the page reacts to each close code is in docs/websocket.md.

The routes:

- ``POST /streams`` starts a scripted turn and answers ``{"stream_id": ..., "token": ...}``;
  it also sets the token as a cookie scoped to that stream's path, for the page;
- ``/streams/{stream_id}/ws`` (WebSocket) serves it, resuming after ``?last_event_id=``;
- ``GET /`` is the page.

A stream id is not a secret, so every stream gets its own token, and the ``authorize``
hook checks it on reading and resuming: as ``Authorization: Bearer <token>`` from a
client that can set headers, or as the cookie a browser sends with its WebSocket
handshake (a browser's ``WebSocket`` cannot set headers, and a token in the URL would end
up in uvicorn's log, which prints every WebSocket path with its query string). A Python
client::

    import asyncio, httpx, websockets
    from essessey.bindings.ws import WebSocketSource

    async def main():
        created = httpx.post("http://127.0.0.1:8000/streams").json()
        url = f"ws://127.0.0.1:8000/streams/{created['stream_id']}/ws"
        auth = {"Authorization": f"Bearer {created['token']}"}
        async with websockets.connect(url, additional_headers=auth) as socket:
            async for event in WebSocketSource(socket):
                print(event.id, event.event, event.data.decode())

    asyncio.run(main())
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.requests import HTTPConnection, Request
from starlette.responses import HTMLResponse, JSONResponse
from starlette.routing import Route

import essessey
from essessey.bindings.ws import ws_route

PAUSE = 0.15
"""Seconds between words, so there is time to drop the connection in the middle."""

REPLY = (
    "Each event of this turn travels as one WebSocket frame that carries its id. When the "
    "connection drops, the page opens a new socket with the id of the last event it "
    "received, and the server replays what came after it, then follows the turn live. "
    "Drop the connection or reload the page now: no word is lost and none is repeated, "
    "because the turn runs in the hub on the server, apart from any connection."
)

TOKEN_AGE = 600
"""Seconds a stream's token (and its cookie) lives: as long as the store keeps the
stream after its last event (its ``max_age`` below)."""

MAX_TOKENS = 10_000
"""Tokens kept, newest last: the store keeps at most this many streams too."""

_tokens: OrderedDict[str, str] = OrderedDict()


def cookie_name(stream_id: str) -> str:
    return f"token_{stream_id}"


def _connection_token(connection: HTTPConnection, stream_id: str) -> str:
    scheme, _, credentials = connection.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and credentials:
        return credentials
    return connection.cookies.get(cookie_name(stream_id), "")


def authorize(connection: Any, stream_id: str, access: essessey.Access) -> bool:
    """Whoever holds the stream's token may read and resume it. ``connection`` is the
    Starlette ``WebSocket`` being served (an ``HTTPConnection``, like a ``Request``)."""
    expected = _tokens.get(stream_id)
    return expected is not None and secrets.compare_digest(
        _connection_token(connection, stream_id), expected
    )


hub = essessey.StreamHub(essessey.InMemoryEventStore(max_age=TOKEN_AGE), authorize=authorize)


def scripted_turn(stream_id: str) -> essessey.TurnProducer:
    async def produce(publisher: essessey.Publisher) -> None:
        async with essessey.stream_turn(
            publisher, message_id=f"msg_{stream_id}", stream_id=stream_id, model="scripted-model"
        ) as turn:
            text = await turn.text()
            words = REPLY.split(" ")
            for n, word in enumerate(words):
                await text.write(word if n == len(words) - 1 else word + " ")
                await asyncio.sleep(PAUSE)
            turn.output_tokens = len(words)

    return produce


async def start_stream(request: Request) -> JSONResponse:
    # A real app would authenticate the user here and run a model on their prompt.
    stream_id = f"turn_{secrets.token_hex(8)}"
    token = secrets.token_urlsafe(24)
    _tokens[stream_id] = token
    while len(_tokens) > MAX_TOKENS:
        _tokens.popitem(last=False)
    await hub.start(stream_id, scripted_turn(stream_id))
    response = JSONResponse({"stream_id": stream_id, "token": token}, status_code=201)
    # Sent by the browser with the WebSocket handshake to this stream's path only;
    # SameSite keeps other sites' pages from opening the socket with it.
    response.set_cookie(
        cookie_name(stream_id),
        token,
        max_age=TOKEN_AGE,
        path=f"/streams/{stream_id}",
        httponly=True,
        samesite="strict",
    )
    return response


async def page(request: Request) -> HTMLResponse:
    return HTMLResponse(PAGE)


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    # The hub lives as long as the app: turns run as its tasks. Leaving it lets the turns
    # still running finish (up to shutdown_grace, 20 s), then cancels the rest (each ends
    # with stop reason "cancelled").
    async with hub:
        yield


app = Starlette(
    routes=[
        Route("/", page),
        Route("/streams", start_stream, methods=["POST"]),
        # A ping frame after 15 s without an event keeps proxies from closing the socket.
        ws_route(hub, "/streams/{stream_id}/ws", ping_interval=15.0),
    ],
    lifespan=lifespan,
)

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>essessey: a turn over a WebSocket</title>
<link rel="icon" href="data:,">
<style>
  body { font: 16px/1.5 system-ui, sans-serif; max-width: 42rem; margin: 2rem auto; }
  #text { white-space: pre-wrap; min-height: 6rem; border: 1px solid #ccc; padding: 1rem; }
  #status { color: #666; }
</style>
</head>
<body>
<h1>A turn over a WebSocket</h1>
<p>
  <button id="start">Start a turn</button>
  <button id="drop" disabled>Drop the connection</button>
  <span id="status"></span>
</p>
<div id="text"></div>
<script>
"use strict";
const KEY = "essessey-ws";
const GIVE_UP = [4400, 4403, 4404, 1011];  // bad request, not allowed, no such stream, failed
const textBox = document.getElementById("text");
const statusLine = document.getElementById("status");
const dropButton = document.getElementById("drop");
let socket = null;
let retries = 0;

function load() { return JSON.parse(sessionStorage.getItem(KEY) || "null"); }
function save(state) { sessionStorage.setItem(KEY, JSON.stringify(state)); }

function finish(state, why) {
  state.done = true;
  save(state);
  dropButton.disabled = true;
  statusLine.textContent = why;
}

function follow(state) {
  textBox.textContent = state.text;
  statusLine.textContent = state.lastEventId ? "resuming" : "connecting";
  const params = new URLSearchParams();
  if (state.lastEventId) params.set("last_event_id", state.lastEventId);
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  // The token goes as the cookie POST /streams set: never in the URL.
  const ws = new WebSocket(`${scheme}://${location.host}/streams/${state.streamId}/ws?${params}`);
  socket = ws;
  ws.onopen = () => { statusLine.textContent = "streaming"; dropButton.disabled = false; };
  ws.onmessage = (message) => {
    const frame = JSON.parse(message.data);  // {"id": ..., "event": ..., "data": {...}}
    retries = 0;
    if (frame.event === "content_block_delta" && frame.data.delta.type === "text_delta") {
      state.text += frame.data.delta.text;
      textBox.textContent = state.text;
    } else if (frame.event === "message_delta") {
      state.stopReason = frame.data.delta.stop_reason;
    } else if (frame.event === "message_stop") {
      state.ended = `done (${state.stopReason})`;
    } else if (frame.event === "error") {
      state.ended = "failed: " + frame.data.error.message;
    }
    if (frame.id) state.lastEventId = frame.id;  // keep-alive pings have no id
    save(state);  // the text and the id it goes with, together
  };
  ws.onclose = (close) => {
    if (socket === ws) socket = null;
    dropButton.disabled = true;
    if (state.ended || close.code === 1000) {
      finish(state, state.ended || "done");  // the turn ended: do not reconnect
    } else if (close.code === 4410) {
      // The last id is no longer retained: start over without it (the server replays
      // the turn from the oldest message it still holds whole).
      Object.assign(state, {text: "", lastEventId: ""});
      follow(state);
    } else if (GIVE_UP.includes(close.code)) {
      finish(state, `unavailable (close code ${close.code}: ${close.reason})`);
    } else {
      // Dropped (1006), going away (1001), try again later (1013), closed by us: come
      // back with the last id, a little later each time.
      const delay = Math.min(500 * 2 ** retries++, 8000);
      statusLine.textContent = `reconnecting in ${delay} ms`;
      setTimeout(() => follow(state), delay);
    }
  };
}

document.getElementById("start").addEventListener("click", async () => {
  if (socket) { const old = socket; socket = null; old.onclose = null; old.close(); }
  const response = await fetch("/streams", {method: "POST"});
  const created = await response.json();
  const state = {streamId: created.stream_id, text: "", lastEventId: ""};
  save(state);
  follow(state);
});

dropButton.addEventListener("click", () => { if (socket) socket.close(); });

const saved = load();
if (saved && !saved.done) follow(saved);
else if (saved) { textBox.textContent = saved.text; statusLine.textContent = "done"; }
</script>
</body>
</html>
"""


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description="Serve turns over a WebSocket, and a page.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    uvicorn.run(app, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
